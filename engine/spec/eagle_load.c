/* eagle_load.c — reading an EAGLE-3 head (eagle.h): config.json, then
 * model.safetensors, every tensor checked against the config and the
 * config against the target before anything is used. Matrices are then
 * packed (pack_all): quantized to Q8_0 by default, a bit over half the
 * bytes a draft streams from an F16 head, on the CPU backend's integer dot
 * kernels; or kept as the file stores them (sd_eagle_params.weights);
 * q/k/v and gate/up stacked. Norms as f32.
 *
 * What the format means was read from SGLang's llama_eagle3.py (the
 * published layout: LlamaForCausalLMEagle3, "midlayer." tensors, d2t as
 * offsets loaded as hot_token_id = d2t + arange, t2d skipped,
 * set_eagle3_layers_to_capture adding 1 to the config's ids because it
 * captures before a layer runs) and from vLLM's / speculators' eagle3 code
 * (transformer_layer_config, "layers.0." tensors, norm_before_residual, the
 * config's ids used as-is as the layers captured before they run). Every
 * weight lives on the host. */
#include "eagle_impl.h"

#include "specd/gguf.h"
#include "specd/safetensors.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX_BYTES (1u << 20)

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(CONFIG_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf || n > CONFIG_MAX_BYTES) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* An integer field of obj (or of fallback when obj lacks it): dflt when
 * absent; false when present and not an integer in [lo, hi]. */
static bool json_int(const cJSON *obj, const cJSON *fallback, const char *key, int32_t dflt, int32_t lo, int32_t hi,
                     int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v && fallback) v = cJSON_GetObjectItemCaseSensitive(fallback, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return dflt >= lo && dflt <= hi;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble || v->valuedouble < lo ||
        v->valuedouble > hi) {
        SD_ERROR("eagle: config.json: %s is not an integer in [%d, %d]", key, (int)lo, (int)hi);
        return false;
    }
    *out = (int32_t)v->valuedouble;
    return true;
}

static double json_num(const cJSON *obj, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* The layout: published (midlayer.) or speculators (layers.0.); *cfg the
 * object holding the layer's settings. */
static sd_status detect_layout(const cJSON *root, bool *speculators, const cJSON **cfg) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "speculators_model_type");
    if (cJSON_IsString(kind) && strcmp(kind->valuestring, "eagle3") == 0) {
        *speculators = true;
        *cfg = cJSON_GetObjectItemCaseSensitive(root, "transformer_layer_config");
        if (!cJSON_IsObject(*cfg)) {
            SD_ERROR("eagle: config.json: a speculators eagle3 config without transformer_layer_config");
            return SD_ERR_FORMAT;
        }
        return SD_OK;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures"), *a;
    cJSON_ArrayForEach(a, arch) {
        if (cJSON_IsString(a) && strcmp(a->valuestring, "LlamaForCausalLMEagle3") == 0) {
            *speculators = false;
            *cfg = root;
            return SD_OK;
        }
    }
    SD_ERROR("eagle: config.json is neither a published EAGLE-3 head (architectures [\"LlamaForCausalLMEagle3\"]) "
             "nor a speculators eagle3 one (speculators_model_type \"eagle3\")");
    return SD_ERR_FORMAT;
}

void sd_eagle_default_layers(int32_t n_layers, int32_t *ids) {
    const int32_t dflt[SD_EAGLE_N_AUX] = {1, n_layers / 2 - 1, n_layers - 4}; /* inputs of 2, L/2, L-3 */
    for (int i = 0; i < SD_EAGLE_N_AUX; i++) ids[i] = dflt[i] < 0 ? 0 : dflt[i];
}

/* The aux layer ids as capture ids (output of layer id), or the default. */
static sd_status read_layer_ids(const cJSON *root, bool speculators, const sd_eagle_target *t, int32_t *ids) {
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(root, "eagle_config");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(ec, "eagle_aux_hidden_state_layer_ids");
    if (!arr) arr = cJSON_GetObjectItemCaseSensitive(root, "eagle_aux_hidden_state_layer_ids");
    if (!arr || cJSON_IsNull(arr)) {
        sd_eagle_default_layers(t->n_layers, ids);
        return SD_OK;
    }
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != SD_EAGLE_N_AUX) {
        SD_ERROR("eagle: config.json: eagle_aux_hidden_state_layer_ids must list %d layers", SD_EAGLE_N_AUX);
        return SD_ERR_FORMAT;
    }
    for (int i = 0; i < SD_EAGLE_N_AUX; i++) {
        const cJSON *v = cJSON_GetArrayItem(arr, i);
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1e9;
        int64_t id = (int64_t)d - (speculators ? 1 : 0); /* speculators: captured before layer d runs */
        if (d != (double)(int64_t)d || id < 0 || id >= t->n_layers) {
            SD_ERROR("eagle: config.json: aux layer id %g is outside the target's %d layers (%s convention: "
                     "%s)",
                     d, (int)t->n_layers, speculators ? "speculators" : "published",
                     speculators ? "id j = the input of layer j, j in [1, L]" : "id j = the output of layer j");
            return SD_ERR_RANGE;
        }
        ids[i] = (int32_t)id;
    }
    return SD_OK;
}

/* The shape and RoPE settings; the hidden size and vocabulary checked
 * against the target. */
static sd_status read_config(sd_eagle_head *h, const cJSON *root, const cJSON *cfg, bool speculators,
                             const sd_eagle_target *t) {
    int32_t nl = 1, V = 0;
    if (!json_int(cfg, NULL, "hidden_size", 0, 1, 1 << 16, &h->H) ||
        !json_int(cfg, NULL, "intermediate_size", 0, 1, 1 << 20, &h->n_ff) ||
        !json_int(cfg, NULL, "num_attention_heads", 0, 1, 1024, &h->n_heads) ||
        !json_int(cfg, NULL, "num_key_value_heads", h->n_heads, 1, h->n_heads, &h->n_kv_heads) ||
        !json_int(cfg, NULL, "head_dim", h->H / h->n_heads, 2, 1024, &h->head_dim) ||
        !json_int(cfg, NULL, "num_hidden_layers", 1, 1, 1, &nl) ||
        !json_int(cfg, root, "vocab_size", 0, 1, INT32_MAX, &V) ||
        !json_int(root, cfg, "draft_vocab_size", V, 1, V, &h->draft_vocab) ||
        !json_int(root, cfg, "target_hidden_size", h->H, 1, 1 << 16, &h->Ht)) {
        SD_ERROR("eagle: config.json lacks a field of the head's shape, or one is out of range (one decoder layer, "
                 "draft_vocab_size <= vocab_size)");
        return SD_ERR_FORMAT;
    }
    if (h->head_dim % 2 || h->n_heads % h->n_kv_heads) {
        SD_ERROR("eagle: config.json: head_dim %d must be even and %d heads a multiple of %d KV heads",
                 (int)h->head_dim, (int)h->n_heads, (int)h->n_kv_heads);
        return SD_ERR_FORMAT;
    }
    if (h->Ht != t->hidden_size) {
        SD_ERROR("eagle: the head reads target hidden states of size %d, the target's hidden size is %d", (int)h->Ht,
                 (int)t->hidden_size);
        return SD_ERR_UNSUPPORTED;
    }
    if (V != t->n_vocab) {
        SD_ERROR("eagle: the head's vocabulary has %d ids, the target's %d: not a head for this target", (int)V,
                 (int)t->n_vocab);
        return SD_ERR_UNSUPPORTED;
    }
    h->n_vocab = V;
    h->rms_eps = (float)json_num(cfg, "rms_norm_eps", 1e-6);
    const cJSON *nbr = cJSON_GetObjectItemCaseSensitive(root, "norm_before_residual");
    h->norm_before_residual = speculators && cJSON_IsTrue(nbr);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    int32_t scaling = 0;
    if (cJSON_IsObject(rs)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!type) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *ty = cJSON_IsString(type) ? type->valuestring : "";
        if (strcmp(ty, "linear") == 0)
            scaling = 1;
        else if (strcmp(ty, "llama3") == 0)
            scaling = 2;
        else if (strcmp(ty, "default") != 0) {
            SD_ERROR("eagle: config.json: rope_scaling type \"%s\" is not supported (linear, llama3)", ty);
            return SD_ERR_UNSUPPORTED;
        }
    }
    return sd_eagle_rope_init(h, json_num(cfg, "rope_theta", 10000.0), scaling, json_num(rs, "factor", 1.0),
                              json_num(rs, "low_freq_factor", 1.0), json_num(rs, "high_freq_factor", 4.0),
                              json_num(rs, "original_max_position_embeddings", 8192.0));
}

static float elem_f32(sd_dtype dt, const unsigned char *src, uint64_t i) {
    if (dt == SD_DTYPE_F32) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    uint16_t u;
    memcpy(&u, src + 2 * i, 2);
    if (dt == SD_DTYPE_F16) return sd_f16_to_f32(u);
    uint32_t b = (uint32_t)u << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

void sd_eagle_mat_row(const eagle_mat *m, int64_t i, int32_t n, float *out) {
    const size_t esz = m->type == SD_DTYPE_F32 ? 4 : 2;
    const unsigned char *row = (const unsigned char *)m->w + (size_t)i * (size_t)n * esz;
    for (int32_t j = 0; j < n; j++) out[j] = elem_f32(m->type, row, (uint64_t)j);
}

/* The tensor name, checked to be [rows][cols] (cols 0: a vector of rows)
 * of F32/F16/BF16. A vector goes to *vec as f32; a matrix to *mat, copied
 * as stored. An absent optional tensor leaves both NULL. */
static sd_status load_tensor(const sd_safetensors *st, const char *name, int64_t rows, int64_t cols, bool optional,
                             float **vec, eagle_mat *mat) {
    const sd_safetensors_tensor *t = sd_safetensors_find(st, name);
    if (!t) {
        if (optional) return SD_OK;
        SD_ERROR("eagle: model.safetensors lacks the tensor %s", name);
        return SD_ERR_FORMAT;
    }
    const uint32_t dims = cols ? 2 : 1;
    if (t->n_dims != dims || (int64_t)t->shape[0] != rows || (cols && (int64_t)t->shape[1] != cols)) {
        SD_ERROR("eagle: tensor %s has shape [%lld%s%lld], the config implies [%lld%s%lld]", name,
                 (long long)(t->n_dims ? t->shape[0] : 0), t->n_dims > 1 ? ", " : "",
                 (long long)(t->n_dims > 1 ? t->shape[1] : 0), (long long)rows, cols ? ", " : "", (long long)cols);
        return SD_ERR_FORMAT;
    }
    sd_dtype dt;
    if (!sd_safetensors_dtype_to_sd(t->dtype, &dt)) {
        SD_ERROR("eagle: tensor %s is %s: a head's weights are F32, F16 or BF16", name,
                 sd_safetensors_dtype_name(t->dtype));
        return SD_ERR_FORMAT;
    }
    if (mat) {
        mat->type = dt;
        mat->w = malloc((size_t)t->n_bytes);
        if (!mat->w) return SD_ERR_NOMEM;
        memcpy(mat->w, t->data, (size_t)t->n_bytes);
        return SD_OK;
    }
    float *w = malloc((size_t)t->n_elems * sizeof *w);
    if (!w) return SD_ERR_NOMEM;
    for (uint64_t i = 0; i < t->n_elems; i++) w[i] = elem_f32(dt, t->data, i);
    *vec = w;
    return SD_OK;
}

/* d2t (offsets) into h->d2t as target ids; absent: identity (needs Vd == V). */
static sd_status load_d2t(sd_eagle_head *h, const sd_safetensors *st) {
    h->d2t = malloc((size_t)h->draft_vocab * sizeof *h->d2t);
    if (!h->d2t) return SD_ERR_NOMEM;
    const sd_safetensors_tensor *t = sd_safetensors_find(st, "d2t");
    if (!t) {
        if (h->draft_vocab != h->n_vocab) {
            SD_ERROR("eagle: a draft vocabulary of %d of %d ids needs the d2t tensor", (int)h->draft_vocab,
                     (int)h->n_vocab);
            return SD_ERR_FORMAT;
        }
        for (int32_t i = 0; i < h->draft_vocab; i++) h->d2t[i] = i;
        return SD_OK;
    }
    if (t->dtype != SD_SAFETENSORS_I64 || t->n_dims != 1 || (int64_t)t->shape[0] != h->draft_vocab) {
        SD_ERROR("eagle: d2t must be I64 [%d] (draft_vocab_size), it is %s with %u dims", (int)h->draft_vocab,
                 sd_safetensors_dtype_name(t->dtype), (unsigned)t->n_dims);
        return SD_ERR_FORMAT;
    }
    for (int32_t i = 0; i < h->draft_vocab; i++) {
        int64_t off;
        memcpy(&off, (const unsigned char *)t->data + 8 * (size_t)i, 8);
        int64_t id = (int64_t)i + off;
        if (off < -(int64_t)INT32_MAX || off > (int64_t)INT32_MAX || id < 0 || id >= h->n_vocab) {
            SD_ERROR("eagle: d2t maps draft id %d to target id %lld, outside the target's vocabulary [0, %d)", (int)i,
                     (long long)id, (int)h->n_vocab);
            return SD_ERR_RANGE;
        }
        h->d2t[i] = (int32_t)id;
    }
    return SD_OK;
}

bool sd_eagle_weights_parse(const char *name, sd_eagle_weights *out) {
    if (!name || !out) return false;
    if (strcmp(name, "q8_0") == 0)
        *out = SD_EAGLE_WEIGHTS_Q8_0;
    else if (strcmp(name, "stored") == 0)
        *out = SD_EAGLE_WEIGHTS_STORED;
    else
        return false;
    return true;
}

const char *sd_eagle_weights_name(sd_eagle_weights w) { return w == SD_EAGLE_WEIGHTS_STORED ? "stored" : "q8_0"; }

/* out = the n parts (rows[i] rows of n_in each) stacked, in one type: Q8_0
 * when q8 and n_in divides into its blocks, else the parts' type when they
 * share one, else F32 (F16 / BF16 widen exactly). Frees the parts. */
static sd_status pack_matrices(eagle_mat *parts, const int64_t *rows, int n, int64_t n_in, bool q8, eagle_mat *out) {
    sd_dtype type = q8 && n_in % 32 == 0 ? SD_DTYPE_Q8_0 : parts[0].type;
    for (int i = 1; i < n && type != SD_DTYPE_Q8_0; i++)
        if (parts[i].type != type) type = SD_DTYPE_F32;
    size_t be, bb, total = 0;
    sd_dtype_block(type, &be, &bb);
    const size_t row_bytes = (size_t)n_in / be * bb;
    for (int i = 0; i < n; i++) total += (size_t)rows[i];
    sd_status s = SD_OK;
    unsigned char *w = malloc(total * row_bytes);
    float *f = malloc((size_t)n_in * sizeof *f);
    unsigned char *dst = w;
    for (int i = 0; i < n && w && f && s == SD_OK; i++) {
        const size_t src_row = (size_t)n_in * (parts[i].type == SD_DTYPE_F32 ? 4 : 2);
        for (int64_t r = 0; r < rows[i] && s == SD_OK; r++, dst += row_bytes) {
            if (parts[i].type == type) {
                memcpy(dst, (const unsigned char *)parts[i].w + (size_t)r * src_row, row_bytes);
                continue;
            }
            sd_eagle_mat_row(&parts[i], r, (int32_t)n_in, f);
            s = sd_quantize(type, f, (uint64_t)n_in, dst);
        }
    }
    if (!w || !f) s = SD_ERR_NOMEM;
    free(f);
    for (int i = 0; i < n; i++) {
        free(parts[i].w);
        parts[i].w = NULL;
    }
    if (s != SD_OK) {
        free(w);
        return s;
    }
    *out = (eagle_mat){type, w};
    return SD_OK;
}

/* The matrices the forward multiplies by, from the file's (mats: fc, q, k,
 * v, o, gate, up, down, lm_head), packed for sd_eagle_params.weights. */
static sd_status pack_all(sd_eagle_head *h, eagle_mat *mats, sd_eagle_weights how) {
    const bool q8 = how != SD_EAGLE_WEIGHTS_STORED;
    const int64_t H = h->H, QD = (int64_t)h->n_heads * h->head_dim, KD = (int64_t)h->n_kv_heads * h->head_dim;
    const int64_t F = h->n_ff, Vd = h->draft_vocab;
    const int64_t r_fc[] = {H}, r_qkv[] = {QD, KD, KD}, r_o[] = {H}, r_gu[] = {F, F}, r_down[] = {H}, r_lm[] = {Vd};
    SD_TRY(pack_matrices(&mats[0], r_fc, 1, 3 * (int64_t)h->Ht, q8, &h->fc));
    SD_TRY(pack_matrices(&mats[1], r_qkv, 3, 2 * H, q8, &h->wqkv));
    SD_TRY(pack_matrices(&mats[4], r_o, 1, QD, q8, &h->wo));
    SD_TRY(pack_matrices(&mats[5], r_gu, 2, H, q8, &h->w_gu));
    SD_TRY(pack_matrices(&mats[7], r_down, 1, F, q8, &h->w_down));
    return pack_matrices(&mats[8], r_lm, 1, H, q8, &h->lm_head);
}

static sd_status load_tensors(sd_eagle_head *h, const sd_safetensors *st, const char *pre, const sd_eagle_target *t,
                              sd_eagle_weights how) {
    const int64_t H = h->H, QD = (int64_t)h->n_heads * h->head_dim, KD = (int64_t)h->n_kv_heads * h->head_dim;
    char name[128];
    eagle_mat m[9] = {{0}}; /* as stored: fc, q, k, v, o, gate, up, down, lm_head */
    const struct {
        const char *suffix;
        bool layer;
        int64_t rows, cols;
        float **vec;
        eagle_mat *mat;
    } want[] = {
        {"fc.weight", false, H, 3 * (int64_t)h->Ht, NULL, &m[0]},
        {"hidden_norm.weight", true, H, 0, &h->hidden_norm, NULL},
        {"input_layernorm.weight", true, H, 0, &h->input_norm, NULL},
        {"post_attention_layernorm.weight", true, H, 0, &h->post_norm, NULL},
        {"self_attn.q_proj.weight", true, QD, 2 * H, NULL, &m[1]},
        {"self_attn.k_proj.weight", true, KD, 2 * H, NULL, &m[2]},
        {"self_attn.v_proj.weight", true, KD, 2 * H, NULL, &m[3]},
        {"self_attn.o_proj.weight", true, H, QD, NULL, &m[4]},
        {"mlp.gate_proj.weight", true, h->n_ff, H, NULL, &m[5]},
        {"mlp.up_proj.weight", true, h->n_ff, H, NULL, &m[6]},
        {"mlp.down_proj.weight", true, H, h->n_ff, NULL, &m[7]},
        {"norm.weight", false, H, 0, &h->final_norm, NULL},
        {"lm_head.weight", false, h->draft_vocab, H, NULL, &m[8]},
    };
    sd_status s = SD_OK;
    for (size_t i = 0; i < sizeof want / sizeof want[0] && s == SD_OK; i++) {
        snprintf(name, sizeof name, "%s%s", want[i].layer ? pre : "", want[i].suffix);
        s = load_tensor(st, name, want[i].rows, want[i].cols, false, want[i].vec, want[i].mat);
    }
    if (s == SD_OK) s = pack_all(h, m, how);
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) free(m[i].w); /* those pack_all did not take */
    SD_TRY(s);
    SD_TRY(load_tensor(st, "embed_tokens.weight", h->n_vocab, H, true, NULL, &h->embed));
    if (!h->embed.w) {
        if (!t->model || H != t->hidden_size) {
            SD_ERROR("eagle: the head has no embed_tokens and %s", !t->model ? "no target model to borrow one from"
                                                                             : "its hidden size differs from the "
                                                                               "target's");
            return SD_ERR_UNSUPPORTED;
        }
        h->target_model = t->model;
    }
    return load_d2t(h, st);
}

sd_eagle_params sd_eagle_default_params(void) { return (sd_eagle_params){.max_seqs = 1, .max_ctx = 4096}; }

sd_eagle_target sd_eagle_target_of(const sd_model *m) {
    const sd_model_config *c = sd_model_config_of(m);
    return (sd_eagle_target){c->n_embd, c->n_vocab, c->n_layers, m};
}

/* Allocates the per-slot caches and the matmul workers. */
static sd_status alloc_state(sd_eagle_head *h, const sd_eagle_params *p) {
    h->params = *p;
    const size_t KD = (size_t)h->n_kv_heads * (size_t)h->head_dim;
    const size_t n = (size_t)p->max_seqs * (size_t)p->max_ctx * KD;
    h->k_cache = malloc(n * sizeof(float));
    h->v_cache = malloc(n * sizeof(float));
    h->len = calloc((size_t)p->max_seqs, sizeof *h->len);
    if (!h->k_cache || !h->v_cache || !h->len) return SD_ERR_NOMEM;
    return sd_host_ops_create(p->n_threads, &h->ops);
}

sd_status sd_eagle_head_load(const char *dir, const sd_eagle_target *t, const sd_eagle_params *p, sd_eagle_head **out) {
    if (!dir || !t || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_eagle_params prm = p ? *p : sd_eagle_default_params();
    if (prm.max_seqs < 1 || prm.max_ctx < 2 || prm.n_threads < 0 || prm.weights < SD_EAGLE_WEIGHTS_DEFAULT ||
        prm.weights > SD_EAGLE_WEIGHTS_STORED) {
        SD_ERROR("eagle: max_seqs %d, max_ctx %d, n_threads %d, weights %d", (int)prm.max_seqs, (int)prm.max_ctx,
                 (int)prm.n_threads, (int)prm.weights);
        return SD_ERR_INVALID_ARG;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_text(path);
    if (!text) {
        SD_ERROR("eagle: cannot read %s (a head is a directory with config.json and model.safetensors)", path);
        return SD_ERR_IO;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        SD_ERROR("eagle: %s is not a JSON object", path);
        cJSON_Delete(root);
        return SD_ERR_FORMAT;
    }
    sd_eagle_head *h = calloc(1, sizeof *h);
    sd_safetensors *st = NULL;
    bool speculators = false;
    const cJSON *cfg = NULL;
    sd_status s = h ? detect_layout(root, &speculators, &cfg) : SD_ERR_NOMEM;
    if (s == SD_OK) s = read_config(h, root, cfg, speculators, t);
    if (s == SD_OK) s = read_layer_ids(root, speculators, t, h->layer_ids);
    if (s == SD_OK) {
        char err[256] = "";
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        s = sd_safetensors_open(path, &st, err, sizeof err);
        if (s != SD_OK) SD_ERROR("eagle: cannot open %s: %s", path, err);
    }
    if (s == SD_OK) s = load_tensors(h, st, speculators ? "layers.0." : "midlayer.", t, prm.weights);
    if (s == SD_OK) s = alloc_state(h, &prm);
    sd_safetensors_close(&st);
    cJSON_Delete(root);
    if (s != SD_OK) {
        sd_eagle_head_free(&h);
        return s;
    }
    SD_INFO("eagle: head %s (%s layout): hidden %d, %d heads / %d KV, draft vocabulary %d of %d, target layers "
            "%d, %d, %d; weights %s (layer %s, LM head %s)",
            dir, speculators ? "speculators" : "published", (int)h->H, (int)h->n_heads, (int)h->n_kv_heads,
            (int)h->draft_vocab, (int)h->n_vocab, (int)h->layer_ids[0], (int)h->layer_ids[1], (int)h->layer_ids[2],
            sd_eagle_weights_name(prm.weights), sd_dtype_name(h->wqkv.type), sd_dtype_name(h->lm_head.type));
    *out = h;
    return SD_OK;
}

void sd_eagle_head_free(sd_eagle_head **ph) {
    if (!ph || !*ph) return;
    sd_eagle_head *h = *ph;
    float *bufs[] = {h->inv_freq, h->hidden_norm, h->input_norm, h->post_norm, h->final_norm, h->k_cache, h->v_cache,
                     h->x_emb,    h->x_in,        h->qkv,        h->q,         h->k,          h->v,       h->att,
                     h->h1,       h->xn,          h->gu,         h->gate,      h->h2,         h->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    eagle_mat *mats[] = {&h->fc, &h->wqkv, &h->wo, &h->w_gu, &h->w_down, &h->lm_head, &h->embed};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free(mats[i]->w);
    free(h->d2t);
    free(h->len);
    sd_host_ops_free(&h->ops);
    free(h);
    *ph = NULL;
}
