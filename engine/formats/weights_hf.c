/* weights_hf.c — a Hugging Face checkpoint directory as a weights source.
 *
 * The directory holds config.json (LlamaConfig), the weights as
 * model.safetensors or as shards listed by model.safetensors.index.json
 * ("weight_map": tensor name -> shard file), and tokenizer.json (plus an
 * optional tokenizer_config.json). Everything the model will ask for is
 * checked at open: the config's values (the bounds sd_model_config_from_gguf
 * applies), every shard's header (safetensors.c, the reference rules), the
 * index's file names (plain names inside the directory) and that every
 * tensor the index lists is in its shard, no tensor in two shards, and every
 * tensor the model needs present with its shape and a dtype of F32, F16 or
 * BF16. So a bad checkpoint fails at open with one clear line, never in the
 * middle of a load. The tokenizer is built on request (tokenizer_hf.c).
 *
 * Names: callers use GGUF names (weights.h); this source maps them to HF
 * names (token_embd -> model.embed_tokens, blk.N.attn_q ->
 * model.layers.N.self_attn.q_proj, ...). HF stores a weight as [out][in]
 * row-major, the same bytes as GGUF's ne = [in, out], so rows are rows.
 * RoPE: HF Llama rotates pairs (x[i], x[i + hd/2]) ("rotate half"), the
 * engine (like GGUF) adjacent pairs (x[2i], x[2i+1]); llama.cpp's converter
 * permutes the rows of q_proj and k_proj within each head to switch. A read
 * here applies the inverse mapping row by row: engine row h*hd + 2i + s is
 * HF row h*hd + s*hd/2 + i. It stays inside a head, so the head-aligned row
 * ranges a tensor-parallel rank reads stay the same set of rows in both
 * layouts, and only those rows' pages of the mapped shards are touched.
 *
 * Rejected: converting the checkpoint to GGUF on the fly (a second copy of a
 * 70B model), and reading config values lazily (a bad value would surface
 * mid-load). Only the llama architecture; rope scaling none, linear, llama3. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "specd/safetensors.h"
#include "tokenizer_impl.h"
#include "weights_impl.h"

/* The bounds on a config are the GGUF reader's (SD_MODEL_MAX_*, model_config.h). */

#define MAX_CONFIG_BYTES    (16u << 20)  /* config.json, tokenizer_config.json, the index */
#define MAX_TOKENIZER_BYTES (256u << 20) /* tokenizer.json (Llama 3: 9 MB) */

typedef struct hf_shard {
    char *file;         /* name inside the directory, owned */
    sd_safetensors *st; /* owned */
} hf_shard;

typedef struct hf_source {
    char *dir;
    sd_model_config cfg;
    int64_t bos_id, eos_id, eot_id, pad_id; /* config.json; -1 when absent */
    int n_shards;
    hf_shard *shards;
} hf_source;

/* How the rows of a tensor are ordered relative to the engine's. */
typedef enum row_order { ROWS_SAME, ROWS_ROPE_HALF } row_order;

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

/* ----------------------------------------------------------------- config */

static const cJSON *field(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* An integer key in [1, max]; SD_ERR_NOT_FOUND when absent or null and not required. */
static sd_status get_int(const cJSON *cfg, const char *key, bool required, int64_t max, int32_t *out) {
    const cJSON *j = field(cfg, key);
    if (!j || cJSON_IsNull(j)) {
        if (!required) return SD_ERR_NOT_FOUND;
        SD_ERROR("weights: config.json lacks %s", key);
        return SD_ERR_FORMAT;
    }
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d >= 1.0) || d > (double)max || d != floor(d)) {
        SD_ERROR("weights: config.json %s must be an integer in 1..%lld", key, (long long)max);
        return SD_ERR_FORMAT;
    }
    *out = (int32_t)d;
    return SD_OK;
}

/* A positive finite number; SD_ERR_NOT_FOUND when absent or null. */
static sd_status get_pos_float(const cJSON *obj, const char *where, const char *key, float *out) {
    const cJSON *j = field(obj, key);
    if (!j || cJSON_IsNull(j)) return SD_ERR_NOT_FOUND;
    float f = cJSON_IsNumber(j) ? (float)j->valuedouble : NAN;
    if (!isfinite(f) || f <= 0.0f) {
        SD_ERROR("weights: %s %s must be a positive number", where, key);
        return SD_ERR_FORMAT;
    }
    *out = f;
    return SD_OK;
}

/* A token id (or the first / last of a list of them); -1 when absent. */
static sd_status get_token_id(const cJSON *cfg, const char *key, bool last, int64_t *out) {
    const cJSON *j = field(cfg, key);
    *out = -1;
    if (cJSON_IsArray(j)) {
        int n = cJSON_GetArraySize(j);
        j = n ? cJSON_GetArrayItem(j, last ? n - 1 : 0) : NULL;
    }
    if (!j || cJSON_IsNull(j)) return SD_OK;
    double d = cJSON_IsNumber(j) ? j->valuedouble : -1.0;
    if (!(d >= 0.0) || d >= SD_MODEL_MAX_VOCAB || d != floor(d)) {
        SD_ERROR("weights: config.json %s is not a token id", key);
        return SD_ERR_FORMAT;
    }
    *out = (int64_t)d;
    return SD_OK;
}

/* config.json's rope_scaling object (rope_type, or the older type). */
static sd_status hf_rope_type(const void *src, char *out, size_t n) {
    const cJSON *rs = field(src, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return SD_ERR_NOT_FOUND;
    const cJSON *type = field(rs, "rope_type");
    if (!type) type = field(rs, "type");
    if (!cJSON_IsObject(rs) || !cJSON_IsString(type)) {
        SD_ERROR("weights: config.json rope_scaling must be null or an object with rope_type");
        return SD_ERR_FORMAT;
    }
    snprintf(out, n, "%s", type->valuestring);
    return SD_OK;
}

static sd_status hf_rope_number(const void *src, sd_rope_key key, double *out) {
    const cJSON *rs = field(src, "rope_scaling");
    static const char *const names[] = {"factor", "low_freq_factor", "high_freq_factor"};
    if (key == SD_ROPE_ORIG_CTX) {
        int32_t v;
        sd_status s = get_int(rs, "original_max_position_embeddings", false, SD_MODEL_MAX_CTX, &v);
        if (s == SD_OK) *out = v;
        return s;
    }
    if ((int)key < 0 || (size_t)key >= sizeof names / sizeof names[0]) return SD_ERR_INVALID_ARG;
    float f;
    sd_status s = get_pos_float(rs, "rope_scaling", names[key], &f);
    if (s == SD_OK) *out = f;
    return s;
}

/* A boolean key that must be false (or absent) for a plain Llama. */
static sd_status require_false(const cJSON *cfg, const char *key) {
    const cJSON *j = field(cfg, key);
    if (cJSON_IsTrue(j)) {
        SD_ERROR("weights: config.json %s = true is not supported (plain Llama only)", key);
        return SD_ERR_UNSUPPORTED;
    }
    return SD_OK;
}

static sd_status parse_config(const cJSON *j, hf_source *src) {
    sd_model_config c;
    memset(&c, 0, sizeof c);
    if (!cJSON_IsObject(j)) {
        SD_ERROR("weights: config.json is not an object");
        return SD_ERR_FORMAT;
    }
    const cJSON *mt = field(j, "model_type");
    if (mt && !(cJSON_IsString(mt) && strcmp(mt->valuestring, "llama") == 0)) {
        SD_ERROR("weights: model_type '%.32s' is not supported (only llama)",
                 cJSON_IsString(mt) ? mt->valuestring : "?");
        return SD_ERR_UNSUPPORTED;
    }
    if (!mt) {
        const cJSON *arch = field(j, "architectures");
        const cJSON *a0 = cJSON_IsArray(arch) ? arch->child : NULL;
        if (!cJSON_IsString(a0) || strcmp(a0->valuestring, "LlamaForCausalLM") != 0) {
            SD_ERROR("weights: config.json names neither model_type llama nor LlamaForCausalLM");
            return SD_ERR_UNSUPPORTED;
        }
    }
    snprintf(c.arch, sizeof c.arch, "llama");
    const cJSON *act = field(j, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        SD_ERROR("weights: hidden_act '%.32s' is not supported (silu)", cJSON_IsString(act) ? act->valuestring : "?");
        return SD_ERR_UNSUPPORTED;
    }
    SD_TRY(require_false(j, "attention_bias"));
    SD_TRY(require_false(j, "mlp_bias"));
    SD_TRY(get_int(j, "hidden_size", true, SD_MODEL_MAX_EMBD, &c.n_embd));
    SD_TRY(get_int(j, "num_hidden_layers", true, SD_MODEL_MAX_LAYERS, &c.n_layers));
    SD_TRY(get_int(j, "intermediate_size", true, SD_MODEL_MAX_FF, &c.n_ff));
    SD_TRY(get_int(j, "num_attention_heads", true, SD_MODEL_MAX_HEADS, &c.n_heads));
    SD_TRY(get_int(j, "vocab_size", true, SD_MODEL_MAX_VOCAB, &c.n_vocab));
    sd_status s = get_int(j, "num_key_value_heads", false, SD_MODEL_MAX_HEADS, &c.n_kv_heads);
    if (s == SD_ERR_NOT_FOUND)
        c.n_kv_heads = c.n_heads;
    else
        SD_TRY(s);
    if (c.n_heads % c.n_kv_heads != 0) {
        SD_ERROR("weights: num_attention_heads %d is not a multiple of num_key_value_heads %d", (int)c.n_heads,
                 (int)c.n_kv_heads);
        return SD_ERR_FORMAT;
    }
    s = get_int(j, "max_position_embeddings", false, SD_MODEL_MAX_CTX, &c.n_ctx_train);
    if (s == SD_ERR_NOT_FOUND)
        c.n_ctx_train = 2048; /* LlamaConfig's default */
    else
        SD_TRY(s);
    c.head_dim = c.n_embd / c.n_heads;
    int32_t hd = 0;
    s = get_int(j, "head_dim", false, SD_MODEL_MAX_HEAD_DIM, &hd);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    if (c.n_heads * c.head_dim != c.n_embd || (hd && hd != c.head_dim)) {
        SD_ERROR("weights: hidden_size %d != num_attention_heads %d * head_dim %d (odd head sizes are not supported)",
                 (int)c.n_embd, (int)c.n_heads, (int)(hd ? hd : c.head_dim));
        return SD_ERR_UNSUPPORTED;
    }
    if (c.head_dim % 2 != 0 || c.head_dim > SD_MODEL_MAX_HEAD_DIM) {
        SD_ERROR("weights: head_dim %d must be even and <= %d", (int)c.head_dim, SD_MODEL_MAX_HEAD_DIM);
        return SD_ERR_FORMAT;
    }
    c.rms_eps = 1e-6f; /* LlamaConfig's default */
    s = get_pos_float(j, "config.json", "rms_norm_eps", &c.rms_eps);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    if (c.rms_eps >= 1.0f) {
        SD_ERROR("weights: rms_norm_eps %g is not plausible", (double)c.rms_eps);
        return SD_ERR_FORMAT;
    }
    c.rope_base = 10000.0f;
    s = get_pos_float(j, "config.json", "rope_theta", &c.rope_base);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    sd_rope_source rope = {.where = "weights: config.json",
                           .type_none = "default",
                           .type = hf_rope_type,
                           .number = hf_rope_number,
                           .src = j};
    SD_TRY(sd_model_config_rope_scaling(&rope, &c));
    c.embd_scale = 1.0f; /* plain Llama: nothing an architecture adds (model_config.h) */
    c.attn_scale = 1.0f / sqrtf((float)c.head_dim);
    c.rope_base_swa = c.rope_base;
    const cJSON *tie = field(j, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie)) {
        SD_ERROR("weights: config.json tie_word_embeddings is not a boolean");
        return SD_ERR_FORMAT;
    }
    c.tied_output = cJSON_IsTrue(tie);
    SD_TRY(get_token_id(j, "bos_token_id", false, &src->bos_id));
    SD_TRY(get_token_id(j, "eos_token_id", false, &src->eos_id));
    const cJSON *eos = field(j, "eos_token_id");
    src->eot_id = -1;
    if (cJSON_IsArray(eos) && cJSON_GetArraySize(eos) > 1) SD_TRY(get_token_id(j, "eos_token_id", true, &src->eot_id));
    SD_TRY(get_token_id(j, "pad_token_id", false, &src->pad_id));
    src->cfg = c;
    return SD_OK;
}

/* ------------------------------------------------------------------ names */

bool sd_weights_hf_name(const char *gguf, int32_t n_layers, char *out, size_t cap, bool *rope_rows) {
    static const struct {
        const char *gguf, *hf;
    } globals[] = {
        {"token_embd.weight", "model.embed_tokens.weight"},
        {"output_norm.weight", "model.norm.weight"},
        {"output.weight", "lm_head.weight"},
    };
    static const struct {
        const char *part, *hf;
        bool rope;
    } parts[] = {
        {"attn_norm", "input_layernorm", false},    {"attn_q", "self_attn.q_proj", true},
        {"attn_k", "self_attn.k_proj", true},       {"attn_v", "self_attn.v_proj", false},
        {"attn_output", "self_attn.o_proj", false}, {"ffn_norm", "post_attention_layernorm", false},
        {"ffn_gate", "mlp.gate_proj", false},       {"ffn_up", "mlp.up_proj", false},
        {"ffn_down", "mlp.down_proj", false},
    };
    *rope_rows = false;
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strcmp(gguf, globals[i].gguf) == 0) return (size_t)snprintf(out, cap, "%s", globals[i].hf) < cap;
    if (strncmp(gguf, "blk.", 4) != 0) return false;
    const char *p = gguf + 4;
    int64_t layer = 0;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] != '.')) return false;
    while (*p >= '0' && *p <= '9' && layer < SD_MODEL_MAX_LAYERS) layer = layer * 10 + (*p++ - '0');
    if (*p != '.' || layer >= n_layers) return false;
    p++;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t n = strlen(parts[i].part);
        if (strncmp(p, parts[i].part, n) == 0 && strcmp(p + n, ".weight") == 0) {
            *rope_rows = parts[i].rope;
            return (size_t)snprintf(out, cap, "model.layers.%lld.%s.weight", (long long)layer, parts[i].hf) < cap;
        }
    }
    return false;
}

/* Maps a GGUF tensor name to this source's HF name in out; false for a name
 * it does not have (rope_freqs, output when tied, layers past the end). */
static bool hf_name(const hf_source *s, const char *name, char *out, size_t cap, row_order *order) {
    bool rope_rows;
    *order = ROWS_SAME;
    if (s->cfg.tied_output && strcmp(name, "output.weight") == 0) return false;
    if (!sd_weights_hf_name(name, s->cfg.n_layers, out, cap, &rope_rows)) return false;
    *order = rope_rows ? ROWS_ROPE_HALF : ROWS_SAME;
    return true;
}

static const sd_safetensors_tensor *lookup(const hf_source *s, const char *hf) {
    for (int i = 0; i < s->n_shards; i++) {
        const sd_safetensors_tensor *t = sd_safetensors_find(s->shards[i].st, hf);
        if (t) return t;
    }
    return NULL;
}

/* The tensor behind GGUF name, or NULL. */
static const sd_safetensors_tensor *find_mapped(const hf_source *s, const char *name, row_order *order) {
    char hf[128];
    return hf_name(s, name, hf, sizeof hf, order) ? lookup(s, hf) : NULL;
}

/* Every tensor the model reads: present, F32/F16/BF16, the config's shape. */
static sd_status check_tensors(const hf_source *s) {
    const sd_model_config *c = &s->cfg;
    int64_t e = c->n_embd, v = c->n_vocab, f = c->n_ff;
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim;
    struct want {
        char name[64];
        int64_t rows, cols; /* rows 0: 1-D */
    } globals[3] = {{"token_embd.weight", v, e}, {"output_norm.weight", 0, e}, {"output.weight", v, e}};
    const struct {
        const char *part;
        int64_t rows, cols;
    } parts[] = {
        {"attn_norm", 0, e}, {"attn_q", qd, e},  {"attn_k", kd, e}, {"attn_v", kd, e},  {"attn_output", e, qd},
        {"ffn_norm", 0, e},  {"ffn_gate", f, e}, {"ffn_up", f, e},  {"ffn_down", e, f},
    };
    int64_t n_parts = (int64_t)(sizeof parts / sizeof parts[0]);
    for (int64_t i = -3; i < (int64_t)c->n_layers * n_parts; i++) {
        struct want w;
        if (i < 0) {
            w = globals[i + 3];
            if (i == -1 && c->tied_output) continue;
        } else {
            int64_t l = i / n_parts, k = i % n_parts;
            snprintf(w.name, sizeof w.name, "blk.%lld.%s.weight", (long long)l, parts[k].part);
            w.rows = parts[k].rows;
            w.cols = parts[k].cols;
        }
        char hf[128];
        row_order order;
        if (!hf_name(s, w.name, hf, sizeof hf, &order)) return SD_ERR_INTERNAL;
        const sd_safetensors_tensor *t = lookup(s, hf);
        if (!t) {
            if (i == -1)
                SD_ERROR("weights: %s: lm_head.weight is missing and tie_word_embeddings is false", s->dir);
            else
                SD_ERROR("weights: %s: tensor %s is missing", s->dir, hf);
            return SD_ERR_FORMAT;
        }
        sd_dtype dt;
        if (!sd_safetensors_dtype_to_sd(t->dtype, &dt)) {
            SD_ERROR("weights: %s: tensor %s is %s (only F32, F16 and BF16 are supported)", s->dir, hf,
                     sd_safetensors_dtype_name(t->dtype));
            return SD_ERR_UNSUPPORTED;
        }
        bool ok = w.rows ? t->n_dims == 2 && t->shape[0] == (uint64_t)w.rows && t->shape[1] == (uint64_t)w.cols
                         : t->n_dims == 1 && t->shape[0] == (uint64_t)w.cols;
        if (!ok) {
            char got[96] = "";
            size_t at = 0;
            for (uint32_t d = 0; d < t->n_dims && at < sizeof got; d++)
                at += (size_t)snprintf(got + at, sizeof got - at, "%s%llu", d ? ", " : "",
                                       (unsigned long long)t->shape[d]);
            if (w.rows)
                SD_ERROR("weights: %s: tensor %s has shape [%s], expected [%lld, %lld]", s->dir, hf, got,
                         (long long)w.rows, (long long)w.cols);
            else
                SD_ERROR("weights: %s: tensor %s has shape [%s], expected [%lld]", s->dir, hf, got, (long long)w.cols);
            return SD_ERR_FORMAT;
        }
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
    ids.bos = s->bos_id;
    ids.eos = s->eos_id;
    ids.eot = s->eot_id;
    ids.pad = s->pad_id;
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
    row_order order;
    const sd_safetensors_tensor *t = find_mapped(ctx, name, &order);
    sd_dtype dt;
    if (!t || t->n_dims < 1 || t->n_dims > 2 || !sd_safetensors_dtype_to_sd(t->dtype, &dt)) return false;
    info->type = dt;
    info->n_dims = t->n_dims;
    info->ne[0] = (int64_t)t->shape[t->n_dims - 1];
    info->ne[1] = t->n_dims == 2 ? (int64_t)t->shape[0] : 1;
    return true;
}

static sd_status hf_read(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                         float *dst) {
    const hf_source *s = ctx;
    row_order order;
    const sd_safetensors_tensor *t = find_mapped(s, name, &order);
    sd_dtype dt;
    if (!t || !sd_safetensors_dtype_to_sd(t->dtype, &dt)) return SD_ERR_INTERNAL; /* weights.c checked find() */
    int64_t ne0 = (int64_t)t->shape[t->n_dims - 1];
    if (order == ROWS_SAME) return sd_weights_read_rows(dt, t->data, ne0, row0, n_rows, col0, n_cols, dst);
    /* rotate-half rows -> adjacent-pair rows, inside each head */
    int64_t hd = s->cfg.head_dim, half = hd / 2;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t row = row0 + r, j = row % hd;
        int64_t src_row = row - j + (j % 2) * half + j / 2;
        SD_TRY(sd_weights_read_rows(dt, t->data, ne0, src_row, 1, col0, n_cols, dst + (size_t)r * (size_t)n_cols));
    }
    return SD_OK;
}

/* hf_read's rows, as stored (F32, F16, BF16: elements, no blocks). */
static sd_status hf_read_stored(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                                void *dst) {
    const hf_source *s = ctx;
    row_order order;
    const sd_safetensors_tensor *t = find_mapped(s, name, &order);
    sd_dtype dt;
    size_t be, bb;
    if (!t || !sd_safetensors_dtype_to_sd(t->dtype, &dt) || !sd_dtype_block(dt, &be, &bb)) return SD_ERR_INTERNAL;
    int64_t ne0 = (int64_t)t->shape[t->n_dims - 1];
    if (order == ROWS_SAME) return sd_weights_copy_rows(dt, t->data, ne0, row0, n_rows, col0, n_cols, dst);
    int64_t hd = s->cfg.head_dim, half = hd / 2;
    size_t out_bytes = (size_t)(n_cols / (int64_t)be) * bb;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t row = row0 + r, j = row % hd;
        int64_t src_row = row - j + (j % 2) * half + j / 2;
        SD_TRY(sd_weights_copy_rows(dt, t->data, ne0, src_row, 1, col0, n_cols,
                                    (unsigned char *)dst + (size_t)r * out_bytes));
    }
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
    st = parse_config(cfg, s);
    cJSON_Delete(cfg);
    if (st != SD_OK) {
        SD_ERROR("weights: %s/config.json is not a supported Llama config", s->dir);
        return st;
    }
    if (file_exists(s->dir, "model.safetensors.index.json")) {
        SD_TRY(open_index(s));
    } else if (file_exists(s->dir, "model.safetensors")) {
        SD_TRY(open_shard(s, "model.safetensors"));
    } else {
        SD_ERROR("weights: %s has neither model.safetensors nor model.safetensors.index.json", s->dir);
        return SD_ERR_NOT_FOUND;
    }
    SD_TRY(check_unique_across_shards(s));
    return check_tensors(s);
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
    SD_INFO("weights: %s: Hugging Face llama checkpoint, %d safetensors file%s, %d layers, vocab %d", s->dir,
            s->n_shards, s->n_shards == 1 ? "" : "s", (int)s->cfg.n_layers, (int)s->cfg.n_vocab);
    *out = w;
    return SD_OK;
}
