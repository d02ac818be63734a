/* weights_hf.c — a Hugging Face checkpoint directory as a weights source.
 *
 * The directory holds config.json (read by weights_hf_config.c: Llama,
 * Mistral, Qwen2, Qwen3, Gemma 3 text, Phi-3), the weights as
 * model.safetensors or as shards listed by model.safetensors.index.json
 * ("weight_map": tensor name -> shard file), and tokenizer.json (plus an
 * optional tokenizer_config.json). Everything the model will ask for is
 * checked at open: the config's values (the bounds sd_model_config_from_gguf
 * applies), every shard's header (safetensors.c, the reference rules), the
 * index's file names (plain names inside the directory) and that every
 * tensor the index lists is in its shard, no tensor in two shards, and every
 * tensor the architecture needs (sd_model_config_tensors, the list the GGUF
 * reader checks too) present with its shape and a dtype of F32, F16 or
 * BF16. So a bad checkpoint fails at open with one clear line naming the
 * missing tensor, never in the middle of a load. The tokenizer is built on
 * request (tokenizer_hf.c).
 *
 * Names: callers use GGUF names (weights.h); this source maps them to HF
 * names (sd_weights_hf_name: token_embd -> model.embed_tokens, blk.N.attn_q
 * -> model.layers.N.self_attn.q_proj, Gemma's ffn_norm ->
 * pre_feedforward_layernorm, Phi-3's ffn_up -> gate_up_proj, ...). HF
 * stores a weight as [out][in] row-major, the same bytes as GGUF's ne =
 * [in, out], so rows are rows. Two layouts differ in value, as llama.cpp's
 * converter changes them:
 *   - RoPE of llama (and Mistral): HF rotates pairs (x[i], x[i + hd/2])
 *     ("rotate half"), the engine's llama adjacent pairs (x[2i], x[2i+1]);
 *     the converter permutes the rows of q_proj and k_proj within each head.
 *     A read here applies the inverse mapping row by row: engine row
 *     h*hd + 2i + s is HF row h*hd + s*hd/2 + i. It stays inside a head, so
 *     the head-aligned row ranges a tensor-parallel rank reads stay the same
 *     set of rows in both layouts, and only those rows' pages of the mapped
 *     shards are touched. Qwen, Gemma and Phi-3 run NeoX RoPE on HF's rows
 *     as they are.
 *   - Gemma 3's norms (Gemma3RMSNorm: x * (1 + w)): HF stores w, GGUF 1 + w;
 *     a read adds 1 (exact in f32 for any w a norm holds).
 *
 * Rejected: converting the checkpoint to GGUF on the fly (a second copy of a
 * 70B model), and reading config values lazily (a bad value would surface
 * mid-load). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "specd/safetensors.h"
#include "tokenizer_impl.h"
#include "weights_hf_impl.h"
#include "weights_impl.h"

#define MAX_CONFIG_BYTES    (16u << 20)  /* config.json, tokenizer_config.json, the index */
#define MAX_TOKENIZER_BYTES (256u << 20) /* tokenizer.json (Llama 3: 9 MB) */

typedef struct hf_shard {
    char *file;         /* name inside the directory, owned */
    sd_safetensors *st; /* owned */
} hf_shard;

typedef struct hf_source {
    char *dir;
    sd_model_config cfg;    /* meta.cfg */
    const char *class_name; /* static: meta.class_name */
    sd_hf_meta meta;
    int n_shards;
    hf_shard *shards;
    /* Gemma3ForConditionalGeneration: what stands for "model." and for
     * "lm_head.weight" in its text model's names (find_text_prefix) */
    const char *text_prefix, *text_head;
} hf_source;

/* ------------------------------------------------------------------ files */

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    if (n > PATH_MAX) return NULL;
    char *p = malloc(n);
    if (!p) return NULL;
    size_t dl = strlen(dir);
    memcpy(p, dir, dl);
    p[dl] = '/';
    memcpy(p + dl + 1, name, strlen(name) + 1);
    return p;
}

static bool file_exists(const char *dir, const char *name) {
    char *p = join_path(dir, name);
    struct stat sb;
    bool ok = p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return ok;
}

/* Reads dir/name (at most cap bytes) into a NUL-terminated buffer the caller
 * frees. SD_ERR_NOT_FOUND when the file does not exist. */
static sd_status read_text(const char *dir, const char *name, size_t cap, char **out, size_t *len) {
    *out = NULL;
    char *path = join_path(dir, name);
    if (!path) return SD_ERR_RANGE;
    FILE *f = fopen(path, "rb");
    if (!f) {
        sd_status s = errno == ENOENT ? SD_ERR_NOT_FOUND : SD_ERR_IO;
        if (s == SD_ERR_IO) SD_ERROR("weights: cannot open %s: %s", path, strerror(errno));
        free(path);
        return s;
    }
    struct stat sb;
    sd_status s = SD_OK;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        SD_ERROR("weights: %s is not a regular file", path);
        s = SD_ERR_IO;
    } else if ((uint64_t)sb.st_size > cap) {
        SD_ERROR("weights: %s is %lld bytes, over the %zu-byte limit for it", path, (long long)sb.st_size, cap);
        s = SD_ERR_FORMAT;
    }
    char *buf = s == SD_OK ? malloc((size_t)sb.st_size + 1) : NULL;
    if (s == SD_OK && !buf) s = SD_ERR_NOMEM;
    if (s == SD_OK && fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        SD_ERROR("weights: cannot read %s", path);
        s = SD_ERR_IO;
    }
    fclose(f);
    free(path);
    if (s != SD_OK) {
        free(buf);
        return s;
    }
    buf[sb.st_size] = '\0';
    *out = buf;
    *len = (size_t)sb.st_size;
    return SD_OK;
}

/* Parses dir/name as JSON (caller frees with cJSON_Delete). */
static sd_status read_json(const char *dir, const char *name, size_t cap, cJSON **out) {
    char *text = NULL;
    size_t len = 0;
    sd_status s = read_text(dir, name, cap, &text, &len);
    if (s != SD_OK) return s;
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*out) {
        SD_ERROR("weights: %s/%s is not valid JSON", dir, name);
        return SD_ERR_FORMAT;
    }
    return SD_OK;
}

static const cJSON *field(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* ------------------------------------------------------------------ names */

/* Maps a GGUF tensor name to this source's HF name in out; false for a name
 * it does not have (rope_freqs, output when tied, layers past the end). */
static bool hf_name(const hf_source *s, const char *name, char *out, size_t cap, sd_weights_hf_layout *how) {
    how->rope_rows = how->plus_one = false;
    if (s->cfg.tied_output && strcmp(name, "output.weight") == 0) return false;
    if (!sd_weights_hf_name(s->cfg.arch_id, name, s->cfg.n_layers, out, cap, how)) return false;
    if (!s->text_prefix) return true;
    /* a multimodal checkpoint's text model: model.X -> prefix X, lm_head -> its head */
    char plain[128];
    if ((size_t)snprintf(plain, sizeof plain, "%s", out) >= sizeof plain) return false;
    if (strcmp(plain, "lm_head.weight") == 0) return (size_t)snprintf(out, cap, "%s", s->text_head) < cap;
    if (strncmp(plain, "model.", 6) != 0) return false;
    return (size_t)snprintf(out, cap, "%s%s", s->text_prefix, plain + 6) < cap;
}

static const sd_safetensors_tensor *lookup(const hf_source *s, const char *hf) {
    for (int i = 0; i < s->n_shards; i++) {
        const sd_safetensors_tensor *t = sd_safetensors_find(s->shards[i].st, hf);
        if (t) return t;
    }
    return NULL;
}

/* The tensor behind GGUF name, or NULL. */
static const sd_safetensors_tensor *find_mapped(const hf_source *s, const char *name, sd_weights_hf_layout *how) {
    char hf[128];
    return hf_name(s, name, hf, sizeof hf, how) ? lookup(s, hf) : NULL;
}

/* One tensor the model reads (sd_model_config_tensors): present under its
 * HF name, F32/F16/BF16, the config's shape. */
static sd_status check_tensor(const sd_model_tensor *w, void *ctx) {
    const hf_source *s = ctx;
    char hf[128];
    sd_weights_hf_layout how;
    if (!hf_name(s, w->name, hf, sizeof hf, &how)) {
        SD_ERROR("weights: %s: %s has no Hugging Face name for %s", s->dir, s->class_name, w->name);
        return SD_ERR_INTERNAL;
    }
    const sd_safetensors_tensor *t = lookup(s, hf);
    if (!t) {
        if (strcmp(w->name, "output.weight") == 0)
            SD_ERROR("weights: %s: lm_head.weight is missing and tie_word_embeddings is false", s->dir);
        else
            SD_ERROR("weights: %s: tensor %s is missing (%s needs it)", s->dir, hf, s->class_name);
        return SD_ERR_FORMAT;
    }
    sd_dtype dt;
    if (!sd_safetensors_dtype_to_sd(t->dtype, &dt)) {
        SD_ERROR("weights: %s: tensor %s is %s (only F32, F16 and BF16 are supported)", s->dir, hf,
                 sd_safetensors_dtype_name(t->dtype));
        return SD_ERR_UNSUPPORTED;
    }
    bool ok = w->n_dims == 2 ? t->n_dims == 2 && t->shape[0] == w->ne1 && t->shape[1] == w->ne0
                             : t->n_dims == 1 && t->shape[0] == w->ne0;
    if (!ok) {
        char got[96] = "";
        size_t at = 0;
        for (uint32_t d = 0; d < t->n_dims && at < sizeof got; d++)
            at += (size_t)snprintf(got + at, sizeof got - at, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
        if (w->n_dims == 2)
            SD_ERROR("weights: %s: tensor %s has shape [%s], expected [%llu, %llu]", s->dir, hf, got,
                     (unsigned long long)w->ne1, (unsigned long long)w->ne0);
        else
            SD_ERROR("weights: %s: tensor %s has shape [%s], expected [%llu]", s->dir, hf, got,
                     (unsigned long long)w->ne0);
        return SD_ERR_FORMAT;
    }
    return SD_OK;
}

/* ----------------------------------------------------------------- shards */

/* A shard name from the index must be a plain file name in the directory. */
static bool plain_file_name(const char *n) {
    size_t len = strlen(n);
    return len > 0 && len < 256 && !strchr(n, '/') && strcmp(n, ".") != 0 && strcmp(n, "..") != 0;
}

static sd_status open_shard(hf_source *s, const char *file) {
    for (int i = 0; i < s->n_shards; i++)
        if (strcmp(s->shards[i].file, file) == 0) return SD_OK;
    hf_shard *sh = realloc(s->shards, (size_t)(s->n_shards + 1) * sizeof *sh);
    if (!sh) return SD_ERR_NOMEM;
    s->shards = sh;
    hf_shard *n = &s->shards[s->n_shards];
    memset(n, 0, sizeof *n);
    n->file = strdup(file);
    char *path = join_path(s->dir, file);
    char err[256] = "";
    sd_status st = n->file && path ? sd_safetensors_open(path, &n->st, err, sizeof err) : SD_ERR_NOMEM;
    if (st != SD_OK && err[0]) SD_ERROR("weights: %s: %s", path, err);
    free(path);
    s->n_shards++; /* counted even when it failed, so close frees the name */
    return st;
}

/* Opens the shards named by model.safetensors.index.json and checks that
 * each listed tensor is in its shard. */
static sd_status open_index(hf_source *s) {
    cJSON *idx = NULL;
    SD_TRY(read_json(s->dir, "model.safetensors.index.json", MAX_CONFIG_BYTES, &idx));
    const cJSON *map = field(idx, "weight_map");
    sd_status st = SD_OK;
    if (!cJSON_IsObject(map) || !map->child) {
        SD_ERROR("weights: %s/model.safetensors.index.json has no weight_map object", s->dir);
        st = SD_ERR_FORMAT;
    }
    for (const cJSON *e = st == SD_OK ? map->child : NULL; e && st == SD_OK; e = e->next) {
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring)) {
            SD_ERROR("weights: %s/model.safetensors.index.json: '%.64s' maps to something that is not a file name in "
                     "the directory",
                     s->dir, e->string);
            st = SD_ERR_FORMAT;
            break;
        }
        st = open_shard(s, e->valuestring);
        const hf_shard *sh = NULL;
        for (int i = 0; st == SD_OK && i < s->n_shards; i++)
            if (strcmp(s->shards[i].file, e->valuestring) == 0) sh = &s->shards[i];
        if (st == SD_OK && (!sh || !sd_safetensors_find(sh->st, e->string))) {
            SD_ERROR("weights: %s: the index puts %.64s in %s, which has no such tensor", s->dir, e->string,
                     e->valuestring);
            st = SD_ERR_FORMAT;
        }
    }
    cJSON_Delete(idx);
    return st;
}

/* No tensor name in two shards (the lookup would silently pick one). */
static sd_status check_unique_across_shards(const hf_source *s) {
    for (int i = 0; i < s->n_shards; i++)
        for (int64_t k = 0; k < sd_safetensors_n_tensors(s->shards[i].st); k++) {
            const char *name = sd_safetensors_tensor_at(s->shards[i].st, k)->name;
            for (int j = i + 1; j < s->n_shards; j++)
                if (sd_safetensors_find(s->shards[j].st, name)) {
                    SD_ERROR("weights: %s: tensor %.64s is in both %s and %s", s->dir, name, s->shards[i].file,
                             s->shards[j].file);
                    return SD_ERR_FORMAT;
                }
        }
    return SD_OK;
}

/* ------------------------------------------------------------------- ops */

static void hf_close(void *ctx) {
    hf_source *s = ctx;
    for (int i = 0; i < s->n_shards; i++) {
        sd_safetensors_close(&s->shards[i].st);
        free(s->shards[i].file);
    }
    free(s->shards);
    free(s->dir);
    free(s);
}

static sd_status hf_config(void *ctx, sd_model_config *cfg) {
    *cfg = ((hf_source *)ctx)->cfg;
    return SD_OK;
}

/* tokenizer_config.json's text for a special token: a string or {"content": ...}. */
static const char *special_text(const cJSON *tc, const char *key) {
    const cJSON *j = field(tc, key);
    if (cJSON_IsObject(j)) j = field(j, "content");
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static sd_status hf_tokenizer(void *ctx, sd_tok **out) {
    hf_source *s = ctx;
    char *json = NULL;
    size_t len = 0;
    sd_status st = read_text(s->dir, "tokenizer.json", MAX_TOKENIZER_BYTES, &json, &len);
    if (st == SD_ERR_NOT_FOUND) {
        SD_ERROR("weights: %s has no tokenizer.json", s->dir);
        return SD_ERR_NOT_FOUND;
    }
    SD_TRY(st);
    cJSON *tc = NULL;
    st = read_json(s->dir, "tokenizer_config.json", MAX_CONFIG_BYTES, &tc);
    if (st == SD_ERR_NOT_FOUND) st = SD_OK;
    sd_tok_hf_ids ids = sd_tok_hf_ids_default();
    ids.bos = s->meta.bos_id;
    ids.eos = s->meta.eos_id;
    ids.eot = s->meta.eot_id;
    ids.pad = s->meta.pad_id;
    ids.n_vocab = s->cfg.n_vocab;
    if (tc) {
        ids.bos_text = special_text(tc, "bos_token");
        ids.eos_text = special_text(tc, "eos_token");
        ids.pad_text = special_text(tc, "pad_token");
        const cJSON *ab = field(tc, "add_bos_token");
        if (cJSON_IsBool(ab)) ids.add_bos = cJSON_IsTrue(ab);
    }
    if (st == SD_OK) st = sd_tok_from_hf_json(json, len, &ids, out);
    if (st != SD_OK) SD_ERROR("weights: %s/tokenizer.json: cannot build the tokenizer (%s)", s->dir, sd_status_str(st));
    cJSON_Delete(tc);
    free(json);
    return st;
}

static bool hf_find(void *ctx, const char *name, sd_weights_tensor *info) {
    sd_weights_hf_layout how;
    const sd_safetensors_tensor *t = find_mapped(ctx, name, &how);
    sd_dtype dt;
    if (!t || t->n_dims < 1 || t->n_dims > 2 || !sd_safetensors_dtype_to_sd(t->dtype, &dt)) return false;
    info->type = dt;
    info->n_dims = t->n_dims;
    info->ne[0] = (int64_t)t->shape[t->n_dims - 1];
    info->ne[1] = t->n_dims == 2 ? (int64_t)t->shape[0] : 1;
    return true;
}

/* The HF row behind engine row `row` of a tensor laid out as how says:
 * rotate-half rows -> adjacent-pair rows, inside each head. */
static int64_t source_row(const hf_source *s, const sd_weights_hf_layout *how, int64_t row) {
    if (!how->rope_rows) return row;
    int64_t hd = s->cfg.head_dim, half = hd / 2, j = row % hd;
    return row - j + (j % 2) * half + j / 2;
}

static sd_status hf_read(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                         float *dst) {
    const hf_source *s = ctx;
    sd_weights_hf_layout how;
    const sd_safetensors_tensor *t = find_mapped(s, name, &how);
    sd_dtype dt;
    if (!t || !sd_safetensors_dtype_to_sd(t->dtype, &dt)) return SD_ERR_INTERNAL; /* weights.c checked find() */
    int64_t ne0 = (int64_t)t->shape[t->n_dims - 1];
    if (!how.rope_rows) {
        SD_TRY(sd_weights_read_rows(dt, t->data, ne0, row0, n_rows, col0, n_cols, dst));
    } else {
        for (int64_t r = 0; r < n_rows; r++)
            SD_TRY(sd_weights_read_rows(dt, t->data, ne0, source_row(s, &how, row0 + r), 1, col0, n_cols,
                                        dst + (size_t)r * (size_t)n_cols));
    }
    if (how.plus_one) /* Gemma3RMSNorm scales by 1 + w, as llama.cpp's converter stores it */
        for (size_t i = 0; i < (size_t)n_rows * (size_t)n_cols; i++) dst[i] += 1.0f;
    return SD_OK;
}

/* hf_read's rows, as stored (F32, F16, BF16: elements, no blocks). A Gemma
 * norm is not stored as the engine's values: SD_ERR_UNSUPPORTED, and the
 * caller reads it as f32 (norms are read so anyway). */
static sd_status hf_read_stored(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                                void *dst) {
    const hf_source *s = ctx;
    sd_weights_hf_layout how;
    const sd_safetensors_tensor *t = find_mapped(s, name, &how);
    sd_dtype dt;
    size_t be, bb;
    if (!t || !sd_safetensors_dtype_to_sd(t->dtype, &dt) || !sd_dtype_block(dt, &be, &bb)) return SD_ERR_INTERNAL;
    if (how.plus_one) return SD_ERR_UNSUPPORTED;
    int64_t ne0 = (int64_t)t->shape[t->n_dims - 1];
    if (!how.rope_rows) return sd_weights_copy_rows(dt, t->data, ne0, row0, n_rows, col0, n_cols, dst);
    size_t out_bytes = (size_t)(n_cols / (int64_t)be) * bb;
    for (int64_t r = 0; r < n_rows; r++)
        SD_TRY(sd_weights_copy_rows(dt, t->data, ne0, source_row(s, &how, row0 + r), 1, col0, n_cols,
                                    (unsigned char *)dst + (size_t)r * out_bytes));
    return SD_OK;
}

/* Gemma3ForConditionalGeneration keeps its text model under one of two
 * prefixes: language_model.model.* with language_model.lm_head (the
 * published checkpoints), or model.language_model.* with lm_head (as
 * transformers 4.52 and later save it). The one holding the embedding is
 * used; the other tensors (vision tower, projector) are counted and left
 * unread. */
static sd_status find_text_prefix(hf_source *s) {
    static const char *const layouts[][2] = {{"language_model.model.", "language_model.lm_head.weight"},
                                             {"model.language_model.", "lm_head.weight"}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0] && !s->text_prefix; i++) {
        char embd[96];
        snprintf(embd, sizeof embd, "%sembed_tokens.weight", layouts[i][0]);
        if (lookup(s, embd)) s->text_prefix = layouts[i][0], s->text_head = layouts[i][1];
    }
    if (!s->text_prefix) {
        SD_ERROR("weights: %s: Gemma3ForConditionalGeneration without its text model's embedding (looked for "
                 "language_model.model.embed_tokens.weight and model.language_model.embed_tokens.weight)",
                 s->dir);
        return SD_ERR_FORMAT;
    }
    int64_t other = 0;
    const size_t plen = strlen(s->text_prefix);
    for (int i = 0; i < s->n_shards; i++)
        for (int64_t k = 0; k < sd_safetensors_n_tensors(s->shards[i].st); k++) {
            const char *name = sd_safetensors_tensor_at(s->shards[i].st, k)->name;
            other += strncmp(name, s->text_prefix, plen) != 0 && strcmp(name, s->text_head) != 0;
        }
    SD_INFO("weights: %s: the text model of a multimodal Gemma 3 (%s*); %lld other tensors (vision tower, "
            "projector) are not read: image inputs are not served",
            s->dir, s->text_prefix, (long long)other);
    return SD_OK;
}

static const sd_weights_ops hf_ops = {
    .format = "safetensors",
    .close = hf_close,
    .config = hf_config,
    .tokenizer = hf_tokenizer,
    .find = hf_find,
    .read = hf_read,
    .read_stored = hf_read_stored,
};

static sd_status open_source(hf_source *s) {
    cJSON *cfg = NULL;
    sd_status st = read_json(s->dir, "config.json", MAX_CONFIG_BYTES, &cfg);
    if (st == SD_ERR_NOT_FOUND) {
        SD_ERROR("weights: %s has no config.json (not a Hugging Face checkpoint directory?)", s->dir);
        return SD_ERR_NOT_FOUND;
    }
    SD_TRY(st);
    st = sd_hf_config_parse(cfg, &s->meta);
    cJSON_Delete(cfg);
    if (st != SD_OK) {
        SD_ERROR("weights: %s/config.json is not a supported config", s->dir);
        return st;
    }
    s->cfg = s->meta.cfg;
    s->class_name = s->meta.class_name;
    if (file_exists(s->dir, "model.safetensors.index.json")) {
        SD_TRY(open_index(s));
    } else if (file_exists(s->dir, "model.safetensors")) {
        SD_TRY(open_shard(s, "model.safetensors"));
    } else {
        SD_ERROR("weights: %s has neither model.safetensors nor model.safetensors.index.json", s->dir);
        return SD_ERR_NOT_FOUND;
    }
    SD_TRY(check_unique_across_shards(s));
    if (s->meta.text_of_multimodal) SD_TRY(find_text_prefix(s));
    return sd_model_config_tensors(&s->cfg, check_tensor, s);
}

sd_status sd_weights_hf_open(const char *dir, sd_weights **out) {
    *out = NULL;
    sd_weights *w = calloc(1, sizeof *w);
    hf_source *s = calloc(1, sizeof *s);
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "dir/" and "dir" name the same checkpoint */
    char *d = s ? strndup(dir, len) : NULL;
    if (!w || !s || !d) {
        free(w);
        free(s);
        free(d);
        return SD_ERR_NOMEM;
    }
    s->dir = d;
    sd_status st = open_source(s);
    if (st != SD_OK) {
        hf_close(s);
        free(w);
        return st;
    }
    w->ops = &hf_ops;
    w->ctx = s;
    SD_INFO("weights: %s: Hugging Face %s checkpoint, %d safetensors file%s, %d layers, vocab %d", s->dir,
            s->class_name, s->n_shards, s->n_shards == 1 ? "" : "s", (int)s->cfg.n_layers, (int)s->cfg.n_vocab);
    *out = w;
    return SD_OK;
}
