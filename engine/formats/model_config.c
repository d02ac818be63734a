/* model_config.c — the model config from GGUF metadata (<arch>.* keys for
 * llama, qwen2, qwen3, gemma3 and phi3, each architecture's additions set by
 * arch_features and their tensors checked by check_arch_tensors),
 * every value range-checked and every tensor the model will need checked for
 * presence, type and shape before anything is loaded. Split out of the model
 * so that readers of a model file (the weights sources, the coordinator, a
 * worker reporting its identity) need no forward-pass code. */
#include "specd/model_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static sd_status get_pos_u32(const sd_gguf *g, const char *key, bool required, uint32_t max, int32_t *out) {
    uint32_t v;
    sd_status s = sd_gguf_get_u32(g, key, &v);
    if (s == SD_ERR_NOT_FOUND && !required) return SD_ERR_NOT_FOUND;
    if (s == SD_ERR_NOT_FOUND) {
        SD_ERROR("model: missing required key %s", key);
        return SD_ERR_FORMAT;
    }
    if (s != SD_OK) {
        SD_ERROR("model: key %s is not an unsigned integer", key);
        return SD_ERR_FORMAT;
    }
    if (v == 0 || v > max) {
        SD_ERROR("model: %s = %u is out of range (1..%u)", key, v, max);
        return SD_ERR_FORMAT;
    }
    *out = (int32_t)v;
    return SD_OK;
}

/* Optional positive finite float; returns SD_ERR_NOT_FOUND when absent. */
static sd_status get_pos_f32(const sd_gguf *g, const char *key, float *out) {
    float v;
    sd_status s = sd_gguf_get_f32(g, key, &v);
    if (s == SD_ERR_NOT_FOUND) return s;
    if (s != SD_OK || !isfinite(v) || v <= 0.0f) {
        SD_ERROR("model: key %s must be a positive finite float", key);
        return SD_ERR_FORMAT;
    }
    *out = v;
    return SD_OK;
}

static bool str_eq(sd_gguf_str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* Checks that tensor name exists with exactly the dims given (n_dims of
 * them; trailing ne of 1 are tolerated) and a supported type. */
static sd_status check_tensor(const sd_gguf *g, const char *name, uint32_t n_dims, uint64_t ne0, uint64_t ne1) {
    const sd_gguf_tensor *t = sd_gguf_find_tensor(g, name);
    if (!t) {
        SD_ERROR("model: tensor %s is missing", name);
        return SD_ERR_FORMAT;
    }
    uint64_t want[SD_GGUF_MAX_DIMS] = {ne0, n_dims > 1 ? ne1 : 1, 1, 1};
    bool ok = t->n_dims >= 1 && t->n_dims <= SD_GGUF_MAX_DIMS;
    for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = t->ne[d] == want[d];
    for (uint32_t d = t->n_dims; ok && d < n_dims; d++) ok = want[d] == 1;
    if (!ok) {
        char got[96] = "";
        size_t len = 0;
        for (uint32_t d = 0; d < t->n_dims && d < SD_GGUF_MAX_DIMS && len < sizeof got; d++)
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
        if (n_dims == 1)
            SD_ERROR("model: tensor %s has shape [%s], expected [%llu]", name, got, (unsigned long long)ne0);
        else
            SD_ERROR("model: tensor %s has shape [%s], expected [%llu, %llu]", name, got, (unsigned long long)ne0,
                     (unsigned long long)ne1);
        return SD_ERR_FORMAT;
    }
    size_t be, bb;
    if (!sd_dtype_block(t->type, &be, &bb)) {
        SD_ERROR("model: tensor %s has unsupported type %d", name, (int)t->type);
        return SD_ERR_UNSUPPORTED;
    }
    return SD_OK;
}

/* Calls visit on one tensor (1-D when ne1 is 0). */
static sd_status visit_one(sd_model_tensor_fn visit, void *ctx, const char *name, uint64_t ne0, uint64_t ne1) {
    sd_model_tensor t = {.n_dims = ne1 ? 2 : 1, .ne0 = ne0, .ne1 = ne1};
    snprintf(t.name, sizeof t.name, "%s", name);
    return visit(&t, ctx);
}

/* The tensors of layer l, llama's and those an architecture adds (model_config.h). */
static sd_status layer_tensors(const sd_model_config *c, int32_t l, sd_model_tensor_fn visit, void *ctx) {
    const uint64_t e = (uint64_t)c->n_embd, d = (uint64_t)c->head_dim, f = (uint64_t)c->n_ff;
    const uint64_t qd = (uint64_t)c->n_heads * d, kd = (uint64_t)c->n_kv_heads * d;
    const bool fq = c->fused_qkv, fu = c->fused_gate_up; /* phi3: one matrix where llama has two or three */
    struct {
        bool on;
        const char *suffix;
        uint64_t ne0, ne1; /* ne1 0: 1-D */
    } const want[] = {
        {true, "attn_norm.weight", e, 0},
        {!fq, "attn_q.weight", e, qd},
        {!fq, "attn_k.weight", e, kd},
        {!fq, "attn_v.weight", e, kd},
        {fq, "attn_qkv.weight", e, qd + 2 * kd},
        {true, "attn_output.weight", qd, e},
        {true, "ffn_norm.weight", e, 0},
        {!fu, "ffn_gate.weight", e, f},
        {true, "ffn_up.weight", e, fu ? 2 * f : f},
        {true, "ffn_down.weight", f, e},
        {c->qkv_bias, "attn_q.bias", qd, 0},
        {c->qkv_bias, "attn_k.bias", kd, 0},
        {c->qkv_bias, "attn_v.bias", kd, 0},
        {c->qk_norm, "attn_q_norm.weight", d, 0},
        {c->qk_norm, "attn_k_norm.weight", d, 0},
        {c->post_norms, "post_attention_norm.weight", e, 0},
        {c->post_norms, "post_ffw_norm.weight", e, 0},
    };
    char name[64];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!want[i].on) continue;
        snprintf(name, sizeof name, "blk.%d.%s", (int)l, want[i].suffix);
        SD_TRY(visit_one(visit, ctx, name, want[i].ne0, want[i].ne1));
    }
    return SD_OK;
}

sd_status sd_model_config_tensors(const sd_model_config *c, sd_model_tensor_fn visit, void *ctx) {
    const uint64_t e = (uint64_t)c->n_embd, v = (uint64_t)c->n_vocab;
    SD_TRY(visit_one(visit, ctx, "token_embd.weight", e, v));
    SD_TRY(visit_one(visit, ctx, "output_norm.weight", e, 0));
    if (!c->tied_output) SD_TRY(visit_one(visit, ctx, "output.weight", e, v));
    for (int32_t l = 0; l < c->n_layers; l++) SD_TRY(layer_tensors(c, l, visit, ctx));
    return SD_OK;
}

static sd_status check_visit(const sd_model_tensor *t, void *ctx) {
    return check_tensor(ctx, t->name, t->n_dims, t->ne0, t->ne1);
}

static sd_status check_all_tensors(const sd_gguf *g, const sd_model_config *c) {
    SD_TRY(sd_model_config_tensors(c, check_visit, (void *)g));
    const sd_gguf_tensor *rf = sd_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) SD_TRY(check_tensor(g, "rope_freqs.weight", 1, (uint64_t)c->head_dim / 2, 0));
    static const char *const lr[] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    for (size_t i = 0; i < 2; i++) {
        if (!sd_gguf_find_tensor(g, lr[i])) continue;
        /* another scaling said by name, or two kinds of divisors */
        if (c->rope_scaling_type != SD_ROPE_LONGROPE || rf) {
            SD_ERROR("model: tensor %s (LongRoPE) with %s: one RoPE scaling per model", lr[i],
                     rf ? "rope_freqs.weight" : "another rope.scaling.type");
            return SD_ERR_FORMAT;
        }
    }
    return SD_OK;
}

/* LongRoPE (phi3's 128k models): the original context (default the
 * model's, as llama.cpp's n_ctx_orig_yarn), the attention factor (the
 * source's default when absent: number() answers for HF, 1 for GGUF) and
 * both factor sets, head_dim/2 each. */
static sd_status longrope(const sd_rope_source *src, sd_model_config *c) {
    if (c->arch_id != SD_ARCH_PHI3) {
        SD_ERROR("%s: LongRoPE scaling is supported for phi3 only (this is %s)", src->where, c->arch);
        return SD_ERR_UNSUPPORTED;
    }
    c->rope_scaling_type = SD_ROPE_LONGROPE;
    c->rope_orig_ctx = c->n_ctx_train;
    double v;
    sd_status s = src->number(src->src, SD_ROPE_ORIG_CTX, &v); /* an integer in 1..2^30 (each reader checks) */
    if (s == SD_OK) c->rope_orig_ctx = (int32_t)v;
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    s = src->number(src->src, SD_ROPE_ATTN_FACTOR, &v);
    if (s == SD_OK) c->rope_attn_factor = (float)v;
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    const int32_t half = c->head_dim / 2;
    for (int set = 0; set < 2; set++) {
        float *out = set == 0 ? c->rope_factors_long : c->rope_factors_short;
        s = src->factors ? src->factors(src->src, set == 0, half, out) : SD_ERR_NOT_FOUND;
        if (s == SD_ERR_NOT_FOUND) {
            const char *name = set == 0 ? "long" : "short";
            SD_ERROR("%s: LongRoPE scaling without its %s factors (GGUF tensor rope_factors_%s.weight, config.json "
                     "rope_scaling.%s_factor: %d, one per frequency)",
                     src->where, name, name, name, (int)half);
            return SD_ERR_FORMAT;
        }
        SD_TRY(s);
    }
    return SD_OK;
}

sd_status sd_model_config_rope_scaling(const sd_rope_source *src, sd_model_config *c) {
    c->rope_scaling_type = SD_ROPE_NONE;
    c->rope_scale_factor = 1.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_orig_ctx = 8192;
    c->rope_attn_factor = 1.0f;
    memset(c->rope_factors_long, 0, sizeof c->rope_factors_long);
    memset(c->rope_factors_short, 0, sizeof c->rope_factors_short);
    char t[33];
    sd_status s = src->type(src->src, t, sizeof t);
    if (s == SD_ERR_NOT_FOUND) return SD_OK;
    SD_TRY(s);
    if (strcmp(t, src->type_none) == 0) return SD_OK;
    if (strcmp(t, "longrope") == 0 || strcmp(t, "su") == 0) return longrope(src, c);
    if (strcmp(t, "linear") == 0)
        c->rope_scaling_type = SD_ROPE_LINEAR;
    else if (strcmp(t, "llama3") == 0)
        c->rope_scaling_type = SD_ROPE_LLAMA3;
    else {
        SD_ERROR("%s: rope scaling type '%s' is not supported (%s, linear, llama3, longrope)", src->where, t,
                 src->type_none);
        return SD_ERR_UNSUPPORTED;
    }
    double v;
    s = src->number(src->src, SD_ROPE_FACTOR, &v);
    if (s == SD_OK) c->rope_scale_factor = (float)v;
    if (s == SD_ERR_NOT_FOUND) {
        SD_ERROR("%s: rope scaling '%s' without a factor", src->where, t);
        return SD_ERR_FORMAT;
    }
    SD_TRY(s);
    if (c->rope_scaling_type == SD_ROPE_LLAMA3) {
        s = src->number(src->src, SD_ROPE_LOW_FREQ_FACTOR, &v);
        if (s == SD_OK) c->rope_low_freq_factor = (float)v;
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        s = src->number(src->src, SD_ROPE_HIGH_FREQ_FACTOR, &v);
        if (s == SD_OK) c->rope_high_freq_factor = (float)v;
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        s = src->number(src->src, SD_ROPE_ORIG_CTX, &v); /* an integer in 1..2^30 (each reader checks) */
        if (s == SD_OK) c->rope_orig_ctx = (int32_t)v;
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor)) {
            SD_ERROR("%s: llama3 rope scaling needs high_freq_factor (%g) > low_freq_factor (%g)", src->where,
                     (double)c->rope_high_freq_factor, (double)c->rope_low_freq_factor);
            return SD_ERR_FORMAT;
        }
    }
    return SD_OK;
}

/* A GGUF file and its architecture's key prefix ("llama", "qwen2", ...). */
typedef struct arch_keys {
    const sd_gguf *g;
    const char *arch;
} arch_keys;

static const char *akey(const arch_keys *k, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", k->arch, suffix);
    return buf;
}

/* GGUF's rope scaling keys (<arch>.rope.scaling.*; older files say only
 * <arch>.rope.scale_linear, read as linear scaling when it is not 1). */
static sd_status gguf_rope_type(const void *src, char *out, size_t n) {
    const arch_keys *k = src;
    char key[96];
    sd_gguf_str type;
    sd_status s = sd_gguf_get_str(k->g, akey(k, "rope.scaling.type", key, sizeof key), &type);
    if (s == SD_ERR_NOT_FOUND && (sd_gguf_find_tensor(k->g, "rope_factors_long.weight") ||
                                  sd_gguf_find_tensor(k->g, "rope_factors_short.weight"))) {
        snprintf(out, n, "longrope"); /* llama.cpp's converter writes the factors and no type */
        return SD_OK;
    }
    if (s == SD_ERR_NOT_FOUND) {
        float f;
        s = get_pos_f32(k->g, akey(k, "rope.scale_linear", key, sizeof key), &f);
        if (s != SD_OK) return s;
        if (f == 1.0f) return SD_ERR_NOT_FOUND;
        snprintf(out, n, "linear");
        return SD_OK;
    }
    if (s != SD_OK) {
        SD_ERROR("model: %s is not a string", key);
        return SD_ERR_FORMAT;
    }
    snprintf(out, n, "%.*s", (int)(type.len < n - 1 ? type.len : n - 1), type.ptr);
    return SD_OK;
}

static sd_status gguf_rope_number(const void *src, sd_rope_key key, double *out) {
    const arch_keys *k = src;
    char name[96];
    float f = 0.0f;
    sd_status s;
    switch (key) {
    case SD_ROPE_FACTOR:
        s = get_pos_f32(k->g,
                        sd_gguf_find_key(k->g, akey(k, "rope.scaling.type", name, sizeof name)) >= 0
                            ? akey(k, "rope.scaling.factor", name, sizeof name)
                            : akey(k, "rope.scale_linear", name, sizeof name),
                        &f);
        break;
    case SD_ROPE_LOW_FREQ_FACTOR: s = get_pos_f32(k->g, akey(k, "rope.scaling.low_freq_factor", name, sizeof name), &f); break;
    case SD_ROPE_HIGH_FREQ_FACTOR:
        s = get_pos_f32(k->g, akey(k, "rope.scaling.high_freq_factor", name, sizeof name), &f);
        break;
    case SD_ROPE_ATTN_FACTOR: s = get_pos_f32(k->g, akey(k, "rope.scaling.attn_factor", name, sizeof name), &f); break;
    case SD_ROPE_ORIG_CTX: {
        int32_t v;
        s = get_pos_u32(k->g, akey(k, "rope.scaling.original_context_length", name, sizeof name), false,
                        (uint32_t)SD_MODEL_MAX_CTX, &v);
        if (s == SD_OK) *out = v;
        return s;
    }
    default: return SD_ERR_INVALID_ARG;
    }
    if (s == SD_OK) *out = f;
    return s;
}

/* LongRoPE's factors: tensor rope_factors_long.weight or
 * rope_factors_short.weight, 1-D of n floats (F32, F16 or BF16), each finite
 * and positive. */
static sd_status gguf_rope_factors(const void *src, bool long_set, int32_t n, float *out) {
    const arch_keys *k = src;
    const char *name = long_set ? "rope_factors_long.weight" : "rope_factors_short.weight";
    const sd_gguf_tensor *t = sd_gguf_find_tensor(k->g, name);
    if (!t) return SD_ERR_NOT_FOUND;
    SD_TRY(check_tensor(k->g, name, 1, (uint64_t)n, 0));
    if (t->type != SD_DTYPE_F32 && t->type != SD_DTYPE_F16 && t->type != SD_DTYPE_BF16) {
        SD_ERROR("model: tensor %s has type %s; LongRoPE factors are f32, f16 or bf16", name, sd_dtype_name(t->type));
        return SD_ERR_FORMAT;
    }
    SD_TRY(sd_dequantize(t->type, t->data, (uint64_t)n, out));
    for (int32_t i = 0; i < n; i++)
        if (!isfinite(out[i]) || out[i] <= 0.0f) {
            SD_ERROR("model: tensor %s[%d] = %g: LongRoPE factors must be finite and positive", name, (int)i,
                     (double)out[i]);
            return SD_ERR_FORMAT;
        }
    return SD_OK;
}

/* What each architecture adds over Llama (model_config.h), and the keys
 * only some have: the sliding window (gemma3 always has one, llama one when
 * the file says so: Mistral), the windowed layers' RoPE base. Gemma 3 as
 * llama.cpp reads it: every 6th layer global, the others windowed with RoPE
 * base 10000 unless <arch>.rope.freq_base_swa says otherwise; the query
 * scale 1/sqrt(head_dim), 1/sqrt(n_embd / n_heads) for the 62-layer 27B
 * (GGUF has no query_pre_attn_scalar key); norm weights as stored (the GGUF
 * converter has folded Gemma's 1 + w into them). Phi-3 as llama.cpp reads
 * it: llama with fused matrices and NeoX RoPE, full attention (llama.cpp
 * turns Phi-3's sliding window off, so does this); its LongRoPE ("su")
 * variants, the 128k-context ones, were read by sd_model_config_rope_scaling
 * and their attention factor joins the scores' scale here (squared: llama.cpp
 * multiplies both q's and k's cos and sin by it). */
static sd_status arch_features(const arch_keys *k, sd_model_config *c) {
    char key[96];
    c->embd_scale = 1.0f;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->rope_base_swa = c->rope_base;
    switch (c->arch_id) {
    case SD_ARCH_LLAMA: break;
    case SD_ARCH_QWEN2:
        c->qkv_bias = true;
        c->rope_neox = true;
        break;
    case SD_ARCH_QWEN3:
        c->qk_norm = true;
        c->rope_neox = true;
        break;
    case SD_ARCH_PHI3:
        c->fused_qkv = c->fused_gate_up = c->rope_neox = true;
        if (c->rope_scaling_type != SD_ROPE_LONGROPE) { /* llama.cpp applies the key with or without factors */
            sd_status s = get_pos_f32(k->g, akey(k, "rope.scaling.attn_factor", key, sizeof key), &c->rope_attn_factor);
            if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        }
        c->attn_scale *= c->rope_attn_factor * c->rope_attn_factor;
        break;
    case SD_ARCH_GEMMA3:
        c->qk_norm = c->post_norms = c->rope_neox = c->gelu = true;
        c->embd_scale = sqrtf((float)c->n_embd);
        if (c->n_layers == 62) c->attn_scale = 1.0f / sqrtf((float)(c->n_embd / c->n_heads));
        c->swa_pattern = 6;
        c->rope_base_swa = 10000.0f;
        break;
    }
    sd_status s = get_pos_u32(k->g, akey(k, "attention.sliding_window", key, sizeof key), false,
                              (uint32_t)SD_MODEL_MAX_CTX, &c->sliding_window);
    if (s == SD_ERR_NOT_FOUND) {
        c->sliding_window = 0;
        if (c->arch_id == SD_ARCH_GEMMA3) {
            SD_ERROR("model: missing required key %s", key);
            return SD_ERR_FORMAT;
        }
    } else {
        SD_TRY(s);
    }
    if (c->arch_id != SD_ARCH_LLAMA && c->arch_id != SD_ARCH_GEMMA3) c->sliding_window = 0; /* qwen, phi3: full attention */
    s = get_pos_f32(k->g, akey(k, "rope.freq_base_swa", key, sizeof key), &c->rope_base_swa);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    return SD_OK;
}

sd_status sd_model_config_from_gguf(const sd_gguf *g, sd_model_config *cfg) {
    if (!g || !cfg) return SD_ERR_INVALID_ARG;
    sd_model_config c;
    memset(&c, 0, sizeof c);

    sd_gguf_str arch;
    if (sd_gguf_get_str(g, "general.architecture", &arch) != SD_OK) {
        SD_ERROR("model: general.architecture is missing or not a string");
        return SD_ERR_FORMAT;
    }
    static const struct {
        const char *name;
        sd_model_arch id;
    } archs[] = {{"llama", SD_ARCH_LLAMA}, {"qwen2", SD_ARCH_QWEN2}, {"qwen3", SD_ARCH_QWEN3}, {"gemma3", SD_ARCH_GEMMA3},
                 {"phi3", SD_ARCH_PHI3}};
    size_t ai = 0;
    while (ai < sizeof archs / sizeof archs[0] && !str_eq(arch, archs[ai].name)) ai++;
    if (ai == sizeof archs / sizeof archs[0]) {
        SD_ERROR("model: architecture '%.*s' is not supported (supported: " SD_MODEL_ARCHS ")",
                 (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        return SD_ERR_UNSUPPORTED;
    }
    snprintf(c.arch, sizeof c.arch, "%s", archs[ai].name);
    c.arch_id = archs[ai].id;
    const arch_keys keys = {g, archs[ai].name};
    char key[96];
#define K(suffix) akey(&keys, suffix, key, sizeof key)

    SD_TRY(get_pos_u32(g, K("context_length"), true, (uint32_t)SD_MODEL_MAX_CTX, &c.n_ctx_train));
    SD_TRY(get_pos_u32(g, K("embedding_length"), true, SD_MODEL_MAX_EMBD, &c.n_embd));
    SD_TRY(get_pos_u32(g, K("block_count"), true, SD_MODEL_MAX_LAYERS, &c.n_layers));
    SD_TRY(get_pos_u32(g, K("feed_forward_length"), true, SD_MODEL_MAX_FF, &c.n_ff));
    SD_TRY(get_pos_u32(g, K("attention.head_count"), true, SD_MODEL_MAX_HEADS, &c.n_heads));
    sd_status s = get_pos_u32(g, K("attention.head_count_kv"), false, SD_MODEL_MAX_HEADS, &c.n_kv_heads);
    if (s == SD_ERR_NOT_FOUND)
        c.n_kv_heads = c.n_heads;
    else
        SD_TRY(s);
    if (c.n_heads % c.n_kv_heads != 0) {
        SD_ERROR("model: head_count %d is not a multiple of head_count_kv %d", (int)c.n_heads, (int)c.n_kv_heads);
        return SD_ERR_FORMAT;
    }
    /* head_dim: <arch>.attention.key_length (Gemma 3, Qwen3: heads wider
     * than n_embd / n_heads), else rope.dimension_count, else n_embd /
     * n_heads; the value heads and the rotary part as wide */
    int32_t key_len = 0, val_len = 0, n_rot = 0;
    s = get_pos_u32(g, K("attention.key_length"), false, SD_MODEL_MAX_HEAD_DIM, &key_len);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    s = get_pos_u32(g, K("attention.value_length"), false, SD_MODEL_MAX_HEAD_DIM, &val_len);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    s = get_pos_u32(g, K("rope.dimension_count"), false, SD_MODEL_MAX_HEAD_DIM, &n_rot);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    c.head_dim = key_len ? key_len : n_rot ? n_rot : c.n_embd / c.n_heads;
    if (c.head_dim <= 0 || (!key_len && c.n_heads * c.head_dim != c.n_embd) || (val_len && val_len != c.head_dim) ||
        (n_rot && n_rot != c.head_dim)) {
        SD_ERROR("model: head_dim %d (embedding_length %d, head_count %d, key_length %d, value_length %d, "
                 "rope.dimension_count %d): partial rotary or unequal key and value heads are not supported",
                 (int)c.head_dim, (int)c.n_embd, (int)c.n_heads, (int)key_len, (int)val_len, (int)n_rot);
        return SD_ERR_UNSUPPORTED;
    }
    if (c.head_dim % 2 != 0 || c.head_dim > SD_MODEL_MAX_HEAD_DIM) {
        SD_ERROR("model: head_dim %d must be even and <= %d", (int)c.head_dim, SD_MODEL_MAX_HEAD_DIM);
        return SD_ERR_FORMAT;
    }
    s = get_pos_f32(g, K("attention.layer_norm_rms_epsilon"), &c.rms_eps);
    if (s == SD_ERR_NOT_FOUND) {
        SD_ERROR("model: missing required key %s", key);
        return SD_ERR_FORMAT;
    }
    SD_TRY(s);
    if (c.rms_eps >= 1.0f) {
        SD_ERROR("model: rms epsilon %g is not plausible", (double)c.rms_eps);
        return SD_ERR_FORMAT;
    }
    c.rope_base = 10000.0f;
    s = get_pos_f32(g, K("rope.freq_base"), &c.rope_base);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    sd_rope_source rope = {.where = "model",
                           .type_none = "none",
                           .type = gguf_rope_type,
                           .number = gguf_rope_number,
                           .factors = gguf_rope_factors,
                           .src = &keys};
    SD_TRY(sd_model_config_rope_scaling(&rope, &c));
    SD_TRY(arch_features(&keys, &c));

    /* vocabulary: <arch>.vocab_size, else the tokenizer's list, else token_embd */
    const sd_gguf_tensor *embd = sd_gguf_find_tensor(g, "token_embd.weight");
    s = get_pos_u32(g, K("vocab_size"), false, SD_MODEL_MAX_VOCAB, &c.n_vocab);
    if (s == SD_ERR_NOT_FOUND) {
        sd_gguf_type et;
        uint64_t len;
        if (sd_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &len) == SD_OK) {
            if (len == 0 || len > SD_MODEL_MAX_VOCAB) {
                SD_ERROR("model: tokenizer.ggml.tokens has %llu entries", (unsigned long long)len);
                return SD_ERR_FORMAT;
            }
            c.n_vocab = (int32_t)len;
        } else if (embd && embd->n_dims == 2 && embd->ne[1] > 0 && embd->ne[1] <= SD_MODEL_MAX_VOCAB) {
            c.n_vocab = (int32_t)embd->ne[1];
        } else {
            SD_ERROR("model: cannot determine the vocabulary size");
            return SD_ERR_FORMAT;
        }
    } else {
        SD_TRY(s);
    }
    c.tied_output = sd_gguf_find_tensor(g, "output.weight") == NULL;
#undef K
    SD_TRY(check_all_tensors(g, &c));
    *cfg = c;
    return SD_OK;
}
