/* model.c — a Llama model: config, weights, and the ragged batched forward.
 *
 * The whole model reads top to bottom in forward_layers(): per layer rmsnorm,
 * Q/K/V projections, RoPE, the K/V write into the paged cache, attention,
 * output projection, residual, rmsnorm, SwiGLU MLP, residual; then the final
 * norm and LM head for the wanted rows only. Every op goes through the backend
 * table (backend_impl.h), so this file never knows where the numbers live.
 *
 * Weights are dequantized to f32 at load (the CPU backend streams them at
 * memory bandwidth; quantized kernels would be a later, separate op). The
 * batch is validated completely and the KV cache grown for every sequence
 * before any op runs, so a rejected batch or an out-of-blocks cache leaves the
 * cache exactly as it was.
 *
 * Tensor shapes follow llama.cpp's GGUF layout: a weight with ne = [n_in,
 * n_out] is n_out rows of n_in floats. */
#include "specd/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "specd/spec.h"
#include "specd/weights.h"

/* Sanity bounds on hyper-parameters (far above any real Llama). */
enum {
    MAX_EMBD = 1 << 16,
    MAX_LAYERS = 1024,
    MAX_FF = 1 << 20,
    MAX_HEADS = 1024,
    MAX_HEAD_DIM = 1024,
    MAX_VOCAB = 1 << 24,
};

typedef struct layer_weights {
    float *attn_norm; /* [n_embd] */
    float *wq;        /* [n_heads*head_dim][n_embd] */
    float *wk;        /* [n_kv_heads*head_dim][n_embd] */
    float *wv;        /* [n_kv_heads*head_dim][n_embd] */
    float *wo;        /* [n_embd][n_heads*head_dim] */
    float *ffn_norm;  /* [n_embd] */
    float *w_gate;    /* [n_ff][n_embd] */
    float *w_up;      /* [n_ff][n_embd] */
    float *w_down;    /* [n_embd][n_ff] */
} layer_weights;

/* Per-call activations, grown to the largest batch seen. */
typedef struct activations {
    int32_t cap_tokens;
    float *x;    /* [n_tokens][n_embd] residual stream */
    float *xb;   /* [n_tokens][n_embd] normed input / branch output */
    float *q;    /* [n_tokens][n_heads*head_dim] */
    float *k;    /* [n_tokens][n_kv_heads*head_dim] */
    float *v;    /* [n_tokens][n_kv_heads*head_dim] */
    float *att;  /* [n_tokens][n_heads*head_dim] */
    float *gate; /* [n_tokens][n_ff] */
    float *up;   /* [n_tokens][n_ff] */
    float *logits; /* [n_tokens][n_vocab], only for backends without host memory */
} activations;

/* Host-side bookkeeping for one call, grown as needed. */
typedef struct batch_plan {
    int32_t cap_seqs;
    int32_t *seq_start; /* [max_seqs] length at call start, -1 = not in batch */
    int32_t *seq_next;  /* [max_seqs] next expected position */
    int32_t *seq_bt;    /* [max_seqs] offset of the seq's table in bt */
    int32_t *seq_order; /* [max_seqs] distinct seqs in order of first appearance */
    int32_t cap_tokens;
    int32_t *bt_off;    /* [n_tokens] */
    int32_t *wanted;    /* [n_tokens] rows whose logits are wanted */
    size_t cap_bt;
    int32_t *bt;        /* flat block tables of the batch's sequences */
} batch_plan;

struct sd_model {
    sd_model_config cfg;
    sd_model_params params;
    int32_t n_layers_used;
    sd_backend_handle be;
    float *tok_embd;    /* [n_vocab][n_embd] */
    float *output_norm; /* [n_embd] */
    float *output;      /* [n_vocab][n_embd]; == tok_embd when tied */
    float *inv_freq;    /* [head_dim/2] rope frequencies, scaling applied */
    layer_weights *layers; /* [n_layers_used] */
    const sd_model *parent; /* non-NULL for a view: every weight above is borrowed from it */
    bool host_verify;       /* SPECD_DEVICE_VERIFY=0: verification on the host even on a device */
    uint64_t weight_bytes;
    activations act;
    batch_plan plan;
};

sd_model_params sd_model_default_params(void) {
    sd_model_params p = {.n_threads = 0, .n_layers_used = 0, .device = -1, .tp_rank = 0, .tp_size = 1,
                         .coll = NULL};
    return p;
}

/* ------------------------------------------------------------------ config */

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
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%llu", d ? ", " : "",
                                    (unsigned long long)t->ne[d]);
        if (n_dims == 1)
            SD_ERROR("model: tensor %s has shape [%s], expected [%llu]", name, got, (unsigned long long)ne0);
        else
            SD_ERROR("model: tensor %s has shape [%s], expected [%llu, %llu]", name, got,
                     (unsigned long long)ne0, (unsigned long long)ne1);
        return SD_ERR_FORMAT;
    }
    size_t be, bb;
    if (!sd_dtype_block(t->type, &be, &bb)) {
        SD_ERROR("model: tensor %s has unsupported type %d", name, (int)t->type);
        return SD_ERR_UNSUPPORTED;
    }
    return SD_OK;
}

static sd_status check_all_tensors(const sd_gguf *g, const sd_model_config *c) {
    uint64_t e = (uint64_t)c->n_embd, v = (uint64_t)c->n_vocab, f = (uint64_t)c->n_ff;
    uint64_t qd = (uint64_t)c->n_heads * (uint64_t)c->head_dim, kd = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    SD_TRY(check_tensor(g, "token_embd.weight", 2, e, v));
    SD_TRY(check_tensor(g, "output_norm.weight", 1, e, 0));
    if (!c->tied_output) SD_TRY(check_tensor(g, "output.weight", 2, e, v));
    char name[96];
    for (int32_t l = 0; l < c->n_layers; l++) {
        struct {
            const char *suffix;
            uint32_t n_dims;
            uint64_t ne0, ne1;
        } const want[] = {
            {"attn_norm", 1, e, 0}, {"attn_q", 2, e, qd},  {"attn_k", 2, e, kd},   {"attn_v", 2, e, kd},
            {"attn_output", 2, qd, e}, {"ffn_norm", 1, e, 0}, {"ffn_gate", 2, e, f}, {"ffn_up", 2, e, f},
            {"ffn_down", 2, f, e},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, want[i].suffix);
            SD_TRY(check_tensor(g, name, want[i].n_dims, want[i].ne0, want[i].ne1));
        }
    }
    const sd_gguf_tensor *rf = sd_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) SD_TRY(check_tensor(g, "rope_freqs.weight", 1, (uint64_t)c->head_dim / 2, 0));
    return SD_OK;
}

static sd_status read_rope_scaling(const sd_gguf *g, sd_model_config *c) {
    c->rope_scaling_type = 0;
    c->rope_scale_factor = 1.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_orig_ctx = 8192;
    sd_gguf_str type;
    sd_status s = sd_gguf_get_str(g, "llama.rope.scaling.type", &type);
    if (s == SD_ERR_NOT_FOUND) {
        /* older files: llama.rope.scale_linear */
        float f;
        s = get_pos_f32(g, "llama.rope.scale_linear", &f);
        if (s == SD_ERR_NOT_FOUND) return SD_OK;
        SD_TRY(s);
        if (f != 1.0f) {
            c->rope_scaling_type = 1;
            c->rope_scale_factor = f;
        }
        return SD_OK;
    }
    if (s != SD_OK) {
        SD_ERROR("model: llama.rope.scaling.type is not a string");
        return SD_ERR_FORMAT;
    }
    if (str_eq(type, "none")) return SD_OK;
    if (str_eq(type, "linear"))
        c->rope_scaling_type = 1;
    else if (str_eq(type, "llama3"))
        c->rope_scaling_type = 2;
    else {
        SD_ERROR("model: rope scaling type '%.*s' is not supported (none, linear, llama3)",
                 (int)(type.len > 32 ? 32 : type.len), type.ptr);
        return SD_ERR_UNSUPPORTED;
    }
    s = get_pos_f32(g, "llama.rope.scaling.factor", &c->rope_scale_factor);
    if (s == SD_ERR_NOT_FOUND) {
        SD_ERROR("model: rope scaling '%.*s' without llama.rope.scaling.factor", (int)type.len, type.ptr);
        return SD_ERR_FORMAT;
    }
    SD_TRY(s);
    if (c->rope_scaling_type == 2) {
        s = get_pos_f32(g, "llama.rope.scaling.low_freq_factor", &c->rope_low_freq_factor);
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        s = get_pos_f32(g, "llama.rope.scaling.high_freq_factor", &c->rope_high_freq_factor);
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        s = get_pos_u32(g, "llama.rope.scaling.original_context_length", false, 1u << 30, &c->rope_orig_ctx);
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor)) {
            SD_ERROR("model: llama3 rope scaling needs high_freq_factor (%g) > low_freq_factor (%g)",
                     (double)c->rope_high_freq_factor, (double)c->rope_low_freq_factor);
            return SD_ERR_FORMAT;
        }
    }
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
    if (!str_eq(arch, "llama")) {
        SD_ERROR("model: architecture '%.*s' is not supported (only llama)", (int)(arch.len > 64 ? 64 : arch.len),
                 arch.ptr);
        return SD_ERR_UNSUPPORTED;
    }
    snprintf(c.arch, sizeof c.arch, "llama");

    SD_TRY(get_pos_u32(g, "llama.context_length", true, 1u << 30, &c.n_ctx_train));
    SD_TRY(get_pos_u32(g, "llama.embedding_length", true, MAX_EMBD, &c.n_embd));
    SD_TRY(get_pos_u32(g, "llama.block_count", true, MAX_LAYERS, &c.n_layers));
    SD_TRY(get_pos_u32(g, "llama.feed_forward_length", true, MAX_FF, &c.n_ff));
    SD_TRY(get_pos_u32(g, "llama.attention.head_count", true, MAX_HEADS, &c.n_heads));
    sd_status s = get_pos_u32(g, "llama.attention.head_count_kv", false, MAX_HEADS, &c.n_kv_heads);
    if (s == SD_ERR_NOT_FOUND)
        c.n_kv_heads = c.n_heads;
    else
        SD_TRY(s);
    if (c.n_heads % c.n_kv_heads != 0) {
        SD_ERROR("model: head_count %d is not a multiple of head_count_kv %d", (int)c.n_heads, (int)c.n_kv_heads);
        return SD_ERR_FORMAT;
    }
    s = get_pos_u32(g, "llama.rope.dimension_count", false, MAX_HEAD_DIM, &c.head_dim);
    if (s == SD_ERR_NOT_FOUND)
        c.head_dim = c.n_embd / c.n_heads;
    else
        SD_TRY(s);
    if (c.head_dim <= 0 || c.n_heads * c.head_dim != c.n_embd) {
        SD_ERROR("model: embedding_length %d != head_count %d * head_dim %d (partial rotary or odd head sizes "
                 "are not supported)",
                 (int)c.n_embd, (int)c.n_heads, (int)c.head_dim);
        return SD_ERR_UNSUPPORTED;
    }
    if (c.head_dim % 2 != 0 || c.head_dim > MAX_HEAD_DIM) {
        SD_ERROR("model: head_dim %d must be even and <= %d", (int)c.head_dim, MAX_HEAD_DIM);
        return SD_ERR_FORMAT;
    }
    s = get_pos_f32(g, "llama.attention.layer_norm_rms_epsilon", &c.rms_eps);
    if (s == SD_ERR_NOT_FOUND) {
        SD_ERROR("model: missing required key llama.attention.layer_norm_rms_epsilon");
        return SD_ERR_FORMAT;
    }
    SD_TRY(s);
    if (c.rms_eps >= 1.0f) {
        SD_ERROR("model: rms epsilon %g is not plausible", (double)c.rms_eps);
        return SD_ERR_FORMAT;
    }
    c.rope_base = 10000.0f;
    s = get_pos_f32(g, "llama.rope.freq_base", &c.rope_base);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    SD_TRY(read_rope_scaling(g, &c));

    /* vocabulary: llama.vocab_size, else the tokenizer's list, else token_embd */
    const sd_gguf_tensor *embd = sd_gguf_find_tensor(g, "token_embd.weight");
    s = get_pos_u32(g, "llama.vocab_size", false, MAX_VOCAB, &c.n_vocab);
    if (s == SD_ERR_NOT_FOUND) {
        sd_gguf_type et;
        uint64_t len;
        if (sd_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &len) == SD_OK) {
            if (len == 0 || len > MAX_VOCAB) {
                SD_ERROR("model: tokenizer.ggml.tokens has %llu entries", (unsigned long long)len);
                return SD_ERR_FORMAT;
            }
            c.n_vocab = (int32_t)len;
        } else if (embd && embd->n_dims == 2 && embd->ne[1] > 0 && embd->ne[1] <= MAX_VOCAB) {
            c.n_vocab = (int32_t)embd->ne[1];
        } else {
            SD_ERROR("model: cannot determine the vocabulary size");
            return SD_ERR_FORMAT;
        }
    } else {
        SD_TRY(s);
    }
    c.tied_output = sd_gguf_find_tensor(g, "output.weight") == NULL;
    SD_TRY(check_all_tensors(g, &c));
    *cfg = c;
    return SD_OK;
}

/* ----------------------------------------------------------------- loading */

/* rope inverse frequencies [head_dim/2] with linear / llama3 scaling and
 * optional per-frequency divisors (rope_freqs.weight), computed in double. */
static void compute_inv_freq(const sd_model_config *c, const float *freq_factors, float *inv_freq) {
    int32_t half = c->head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double f = pow((double)c->rope_base, -2.0 * i / (double)c->head_dim);
        if (c->rope_scaling_type == 1) {
            f /= (double)c->rope_scale_factor;
        } else if (c->rope_scaling_type == 2 && !freq_factors) {
            /* Llama 3.1: long wavelengths slowed by factor, short kept,
             * a smooth blend between */
            const double pi = 3.14159265358979323846;
            double wavelen = 2.0 * pi / f;
            double lo_wavelen = (double)c->rope_orig_ctx / (double)c->rope_low_freq_factor;
            double hi_wavelen = (double)c->rope_orig_ctx / (double)c->rope_high_freq_factor;
            if (wavelen > lo_wavelen) {
                f /= (double)c->rope_scale_factor;
            } else if (wavelen >= hi_wavelen) {
                double smooth = ((double)c->rope_orig_ctx / wavelen - (double)c->rope_low_freq_factor) /
                                ((double)c->rope_high_freq_factor - (double)c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / (double)c->rope_scale_factor + smooth * f;
            }
        }
        if (freq_factors) f /= (double)freq_factors[i];
        inv_freq[i] = (float)f;
    }
}

/* Reads tensor name, which must be [rows][cols] (1-D when rows == 0), as
 * f32 into a new backend buffer. A matrix goes through the backend's
 * weight_upload when it has one (its own matmul format); *out is then that
 * opaque weight, which only matmul reads. */
static sd_status load_tensor(sd_model *m, const sd_weights *w, const char *name, int64_t rows, int64_t cols,
                             bool matrix, float **out) {
    sd_weights_tensor t;
    if (!sd_weights_find(w, name, &t)) {
        SD_ERROR("model: tensor %s is missing", name);
        return SD_ERR_FORMAT;
    }
    int64_t want_rows = rows ? rows : 1;
    if (t.ne[0] != cols || t.ne[1] != want_rows || (rows == 0) != (t.n_dims == 1)) {
        SD_ERROR("model: tensor %s has shape [%lld][%lld], expected [%lld][%lld]", name, (long long)t.ne[1],
                 (long long)t.ne[0], (long long)want_rows, (long long)cols);
        return SD_ERR_FORMAT;
    }
    size_t bytes;
    if (!sd_mul_ok((size_t)want_rows, (size_t)cols, &bytes) || !sd_mul_ok(bytes, sizeof(float), &bytes))
        return SD_ERR_NOMEM;
    const sd_backend_ops *ops = m->be.ops;
    bool convert = matrix && ops->weight_upload;
    float *host = NULL, *buf = NULL;
    if (ops->host_memory && !convert) {
        buf = host = ops->buf_alloc(m->be.ctx, bytes);
    } else {
        host = malloc(bytes);
    }
    if (!host) {
        SD_ERROR("model: cannot allocate %zu bytes for %s", bytes, name);
        return SD_ERR_NOMEM;
    }
    sd_status s = sd_weights_read(w, name, 0, want_rows, 0, cols, host);
    if (s != SD_OK) {
        SD_ERROR("model: cannot read %s (%s, %s)", name, sd_dtype_name(t.type), sd_status_str(s));
    } else if (convert) {
        void *conv = NULL;
        s = ops->weight_upload(m->be.ctx, host, (int32_t)want_rows, (int32_t)cols, &conv);
        buf = conv;
    } else if (!buf) {
        buf = ops->buf_alloc(m->be.ctx, bytes);
        s = buf ? ops->buf_upload(m->be.ctx, buf, host, bytes) : SD_ERR_NOMEM;
    }
    if (host != buf) free(host);
    if (s != SD_OK) {
        if (buf) (convert ? ops->weight_free : ops->buf_free)(m->be.ctx, buf);
        if (s == SD_ERR_NOMEM) SD_ERROR("model: out of %s memory loading %s (%zu bytes as f32)", ops->name, name, bytes);
        return s;
    }
    *out = buf;
    /* what matmul streams: the backend's own format for converted matrices */
    m->weight_bytes += convert ? bytes / sizeof(float) * (size_t)ops->weight_elem_bytes : bytes;
    return SD_OK;
}

/* Frees one weight loaded by load_tensor. */
static void free_tensor(sd_model *m, float *buf, bool matrix) {
    if (!buf) return;
    if (matrix && m->be.ops->weight_upload)
        m->be.ops->weight_free(m->be.ctx, buf);
    else
        m->be.ops->buf_free(m->be.ctx, buf);
}

static sd_status load_weights(sd_model *m, const sd_weights *w) {
    const sd_model_config *c = &m->cfg;
    int64_t E = c->n_embd, V = c->n_vocab, F = c->n_ff;
    int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    SD_TRY(load_tensor(m, w, "token_embd.weight", V, E, false, &m->tok_embd));
    /* a step reads one row of the table per token: it is not streamed
     * (unless it is also the LM head, counted again just below) */
    m->weight_bytes -= (uint64_t)V * (uint64_t)E * sizeof(float);
    SD_TRY(load_tensor(m, w, "output_norm.weight", 0, E, false, &m->output_norm));
    /* tied: the LM head reads the embedding table, unless the backend keeps
     * matrices in a format of its own (then it gets its own copy) */
    if (c->tied_output && !m->be.ops->weight_upload) {
        m->output = m->tok_embd;
        m->weight_bytes += (uint64_t)V * (uint64_t)E * sizeof(float);
    } else
        SD_TRY(load_tensor(m, w, c->tied_output ? "token_embd.weight" : "output.weight", V, E, true, &m->output));
    char name[96];
    for (int32_t l = 0; l < m->n_layers_used; l++) {
        layer_weights *L = &m->layers[l];
        struct {
            const char *suffix;
            int64_t rows, cols;
            float **dst;
        } const parts[] = {
            {"attn_norm", 0, E, &L->attn_norm}, {"attn_q", QD, E, &L->wq},      {"attn_k", KD, E, &L->wk},
            {"attn_v", KD, E, &L->wv},          {"attn_output", E, QD, &L->wo}, {"ffn_norm", 0, E, &L->ffn_norm},
            {"ffn_gate", F, E, &L->w_gate},     {"ffn_up", F, E, &L->w_up},     {"ffn_down", E, F, &L->w_down},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, parts[i].suffix);
            SD_TRY(load_tensor(m, w, name, parts[i].rows, parts[i].cols, parts[i].rows != 0, parts[i].dst));
        }
    }
    /* rope frequencies (small: computed on the host, then uploaded) */
    float freq_host[MAX_HEAD_DIM / 2];
    float factors[MAX_HEAD_DIM / 2];
    sd_weights_tensor rf;
    bool has_rf = sd_weights_find(w, "rope_freqs.weight", &rf);
    if (has_rf) {
        if (rf.n_dims != 1 || rf.ne[0] != c->head_dim / 2) {
            SD_ERROR("model: rope_freqs.weight has %lld elements, expected %d", (long long)rf.ne[0],
                     (int)(c->head_dim / 2));
            return SD_ERR_FORMAT;
        }
        SD_TRY(sd_weights_read(w, "rope_freqs.weight", 0, 1, 0, c->head_dim / 2, factors));
    }
    compute_inv_freq(c, has_rf ? factors : NULL, freq_host);
    size_t bytes = (size_t)(c->head_dim / 2) * sizeof(float);
    m->inv_freq = m->be.ops->buf_alloc(m->be.ctx, bytes);
    if (!m->inv_freq) return SD_ERR_NOMEM;
    return m->be.ops->buf_upload(m->be.ctx, m->inv_freq, freq_host, bytes);
}

sd_status sd_model_load(const sd_gguf *g, const sd_model_params *p, sd_model **out) {
    if (!g || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_weights *w = NULL;
    SD_TRY(sd_weights_from_gguf(g, &w));
    sd_status s = sd_model_load_weights(w, p, out);
    sd_weights_close(&w);
    return s;
}

/* Refuses a load that cannot fit in the backend's memory, with the numbers,
 * before any of it is read (the backends that report their memory). */
static sd_status check_memory(sd_model *m) {
    const sd_backend_ops *ops = m->be.ops;
    size_t free_b = 0, total_b = 0;
    if (!ops->mem_info || ops->mem_info(m->be.ctx, &free_b, &total_b) != SD_OK) return SD_OK;
    const sd_model_config *c = &m->cfg;
    double E = c->n_embd, V = c->n_vocab, F = c->n_ff, QD = (double)c->n_heads * c->head_dim;
    double KD = (double)c->n_kv_heads * c->head_dim, mat = ops->weight_elem_bytes;
    double per_layer = (2 * E * QD + 2 * E * KD + 3 * E * F) * mat + 2 * E * 4;
    double need = E * V * 4 /* embedding table */ + E * V * mat /* LM head */ + E * 4 +
                  (double)m->n_layers_used * per_layer;
    if (need > (double)free_b) {
        SD_ERROR("model: the weights need %.2f GiB of %s memory (%d layers, %s matrices), but only %.2f GiB of "
                 "%.2f GiB are free",
                 need / 1073741824.0, ops->name, (int)m->n_layers_used, mat == 2 ? "BF16" : "f32",
                 (double)free_b / 1073741824.0, (double)total_b / 1073741824.0);
        return SD_ERR_NOMEM;
    }
    return SD_OK;
}

sd_status sd_model_load_weights(const sd_weights *w, const sd_model_params *p, sd_model **out) {
    if (!w || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_model_params params = p ? *p : sd_model_default_params();
    if (params.n_threads < 0 || params.n_layers_used < 0) {
        SD_ERROR("model: n_threads (%d) and n_layers_used (%d) must be >= 0", (int)params.n_threads,
                 (int)params.n_layers_used);
        return SD_ERR_INVALID_ARG;
    }
    if (params.tp_size != 1 || params.tp_rank != 0) {
        SD_ERROR("model: tensor parallelism (tp_size %d) is not implemented yet", (int)params.tp_size);
        return SD_ERR_UNSUPPORTED;
    }
    sd_model *m = calloc(1, sizeof *m);
    if (!m) return SD_ERR_NOMEM;
    m->params = params;
    sd_status s = sd_weights_config(w, &m->cfg);
    if (s == SD_OK && params.n_layers_used > m->cfg.n_layers) {
        SD_ERROR("model: n_layers_used %d > block_count %d", (int)params.n_layers_used, (int)m->cfg.n_layers);
        s = SD_ERR_INVALID_ARG;
    }
    if (s == SD_OK) {
        m->n_layers_used = params.n_layers_used ? params.n_layers_used : m->cfg.n_layers;
        m->layers = calloc((size_t)m->n_layers_used, sizeof *m->layers);
        s = m->layers ? sd_backend_create(params.device, params.n_threads, &m->be) : SD_ERR_NOMEM;
    }
    const char *dv = getenv("SPECD_DEVICE_VERIFY");
    m->host_verify = dv && strcmp(dv, "0") == 0;
    if (s == SD_OK) s = check_memory(m);
    if (s == SD_OK) s = load_weights(m, w);
    if (s != SD_OK) {
        sd_model_free(&m);
        return s;
    }
    SD_INFO("model: llama, %d/%d layers, n_embd %d, n_ff %d, heads %d/%d, head_dim %d, vocab %d, %.1f MB of "
            "weights streamed per step (%s matrices), backend %s",
            (int)m->n_layers_used, (int)m->cfg.n_layers, (int)m->cfg.n_embd, (int)m->cfg.n_ff,
            (int)m->cfg.n_heads, (int)m->cfg.n_kv_heads, (int)m->cfg.head_dim, (int)m->cfg.n_vocab,
            (double)m->weight_bytes / 1e6, m->be.ops->weight_elem_bytes == 2 ? "BF16" : "f32", m->be.ops->name);
    *out = m;
    return SD_OK;
}

static void free_activations(sd_model *m) {
    activations *a = &m->act;
    float **bufs[] = {&a->x, &a->xb, &a->q, &a->k, &a->v, &a->att, &a->gate, &a->up, &a->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) m->be.ops->buf_free(m->be.ctx, *bufs[i]);
        *bufs[i] = NULL;
    }
    a->cap_tokens = 0;
}

void sd_model_free(sd_model **pm) {
    if (!pm || !*pm) return;
    sd_model *m = *pm;
    if (m->be.ops && m->parent) {
        free_activations(m); /* a view owns its activations and backend, not the weights */
        m->be.ops->destroy(&m->be.ctx);
    } else if (m->be.ops) {
        const sd_backend_ops *ops = m->be.ops;
        free_activations(m);
        if (m->output != m->tok_embd) free_tensor(m, m->output, true);
        if (m->tok_embd) ops->buf_free(m->be.ctx, m->tok_embd);
        if (m->output_norm) ops->buf_free(m->be.ctx, m->output_norm);
        if (m->inv_freq) ops->buf_free(m->be.ctx, m->inv_freq);
        for (int32_t l = 0; m->layers && l < m->n_layers_used; l++) {
            layer_weights *L = &m->layers[l];
            float *w[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
            for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
                free_tensor(m, w[i], i != 0 && i != 5); /* the norms are vectors */
        }
        ops->destroy(&m->be.ctx);
    }
    if (!m->parent) free(m->layers);
    batch_plan *pl = &m->plan;
    free(pl->seq_start);
    free(pl->seq_next);
    free(pl->seq_bt);
    free(pl->seq_order);
    free(pl->bt_off);
    free(pl->wanted);
    free(pl->bt);
    free(m);
    *pm = NULL;
}

/* A view shares the parent's weight buffers (and its layer table, whose
 * first n_layers entries it reads) and gets its own backend instance, so its
 * activations, batch plan and worker threads are its own and it can run
 * while the parent is idle or busy on another thread. Only backends whose
 * buffers are host memory can lend them to a second backend instance. */
sd_status sd_model_view_layers(const sd_model *m, int32_t n_layers, sd_model **out) {
    if (!m || !out || n_layers <= 0 || n_layers > m->n_layers_used) {
        SD_ERROR("model: a view needs a model, an output and 1 <= n_layers <= %d (got %d)",
                 m ? (int)m->n_layers_used : 0, (int)n_layers);
        return SD_ERR_INVALID_ARG;
    }
    *out = NULL;
    if (!m->be.ops->host_memory && m->params.device < 0) {
        SD_ERROR("model: backend %s cannot share weights with a view", m->be.ops->name);
        return SD_ERR_UNSUPPORTED;
    }
    sd_model *v = calloc(1, sizeof *v);
    if (!v) return SD_ERR_NOMEM;
    v->cfg = m->cfg;
    v->params = m->params;
    v->params.n_layers_used = n_layers;
    v->n_layers_used = n_layers;
    v->parent = m;
    v->host_verify = m->host_verify;
    v->tok_embd = m->tok_embd;
    v->output_norm = m->output_norm;
    v->output = m->output;
    v->inv_freq = m->inv_freq;
    v->layers = m->layers;
    const sd_model_config *c = &m->cfg;
    uint64_t E = (uint64_t)c->n_embd, QD = (uint64_t)c->n_heads * (uint64_t)c->head_dim;
    uint64_t KD = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, F = (uint64_t)c->n_ff;
    /* what a step streams, as load counts it: matrices in the backend's
     * format, norms in f32, the LM head but not the embedding table */
    uint64_t mat = (uint64_t)m->be.ops->weight_elem_bytes;
    uint64_t per_layer = (2 * E * QD + 2 * E * KD + 3 * E * F) * mat + 2 * E * sizeof(float);
    uint64_t head = E * (uint64_t)c->n_vocab * mat + E * sizeof(float);
    v->weight_bytes = head + (uint64_t)n_layers * per_layer;
    /* a backend instance of its own on the same device: device buffers are
     * shared by every stream of the process */
    sd_status s = sd_backend_create(m->params.device, m->params.n_threads, &v->be);
    if (s != SD_OK) {
        free(v);
        return s;
    }
    *out = v;
    return SD_OK;
}

const sd_model_config *sd_model_config_of(const sd_model *m) { return m ? &m->cfg : NULL; }

uint64_t sd_model_weight_bytes(const sd_model *m) { return m ? m->weight_bytes : 0; }

/* A device-resident cache's pools come from the model's backend. */
static void *kv_pool_alloc(void *ctx, size_t bytes) {
    const sd_backend_handle *be = ctx;
    return be->ops->buf_alloc(be->ctx, bytes);
}

static void kv_pool_free(void *ctx, void *pool) {
    const sd_backend_handle *be = ctx;
    be->ops->buf_free(be->ctx, pool);
}

sd_status sd_model_kv_create(const sd_model *m, int32_t max_seqs, int32_t n_blocks, int32_t block_size,
                             sd_kv **out) {
    if (!m || !out) return SD_ERR_INVALID_ARG;
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = m->n_layers_used;
    p.n_kv_heads = m->cfg.n_kv_heads;
    p.head_dim = m->cfg.head_dim;
    if (block_size) p.block_size = block_size;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    const sd_backend_ops *ops = m->be.ops;
    if (!ops->host_memory) {
        p.pool_alloc = kv_pool_alloc;
        p.pool_free = kv_pool_free;
        p.pool_ctx = (void *)&m->be;
        size_t free_b = 0, total_b = 0;
        double need = 2.0 * p.n_layers * (double)n_blocks * (double)p.block_size * p.n_kv_heads * p.head_dim * 4;
        if (n_blocks > 0 && ops->mem_info && ops->mem_info(m->be.ctx, &free_b, &total_b) == SD_OK &&
            need > (double)free_b) {
            SD_ERROR("model: a KV cache of %d blocks x %d tokens needs %.2f GiB of %s memory, but only %.2f GiB of "
                     "%.2f GiB are free (fewer blocks or sequences would fit)",
                     (int)n_blocks, (int)p.block_size, need / 1073741824.0, ops->name,
                     (double)free_b / 1073741824.0, (double)total_b / 1073741824.0);
            return SD_ERR_NOMEM;
        }
    }
    return sd_kv_create(&p, out);
}

/* ----------------------------------------------------------------- forward */

static sd_status reserve_activations(sd_model *m, int32_t n_tokens) {
    activations *a = &m->act;
    if (n_tokens <= a->cap_tokens) return SD_OK;
    if (m->be.ops->graph_reset) m->be.ops->graph_reset(m->be.ctx); /* recordings name the old buffers */
    free_activations(m);
    const sd_model_config *c = &m->cfg;
    size_t n = (size_t)n_tokens, q = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    struct {
        float **dst;
        size_t floats;
    } const want[] = {
        {&a->x, n * (size_t)c->n_embd}, {&a->xb, n * (size_t)c->n_embd}, {&a->q, n * q},
        {&a->k, n * kvd},               {&a->v, n * kvd},                {&a->att, n * q},
        {&a->gate, n * (size_t)c->n_ff}, {&a->up, n * (size_t)c->n_ff},
        {&a->logits, m->be.ops->host_memory ? 0 : n * (size_t)c->n_vocab},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!want[i].floats) continue;
        *want[i].dst = m->be.ops->buf_alloc(m->be.ctx, want[i].floats * sizeof(float));
        if (!*want[i].dst) {
            SD_ERROR("model: cannot allocate activations for %d tokens", (int)n_tokens);
            free_activations(m);
            return SD_ERR_NOMEM;
        }
    }
    a->cap_tokens = n_tokens;
    return SD_OK;
}

static sd_status grow_i32(int32_t **p, size_t n) {
    int32_t *q = realloc(*p, (n ? n : 1) * sizeof(int32_t));
    if (!q) return SD_ERR_NOMEM;
    *p = q;
    return SD_OK;
}

static sd_status reserve_plan(batch_plan *pl, int32_t max_seqs, int32_t n_tokens) {
    if (max_seqs > pl->cap_seqs) {
        SD_TRY(grow_i32(&pl->seq_start, (size_t)max_seqs));
        SD_TRY(grow_i32(&pl->seq_next, (size_t)max_seqs));
        SD_TRY(grow_i32(&pl->seq_bt, (size_t)max_seqs));
        SD_TRY(grow_i32(&pl->seq_order, (size_t)max_seqs));
        pl->cap_seqs = max_seqs;
    }
    if (n_tokens > pl->cap_tokens) {
        SD_TRY(grow_i32(&pl->bt_off, (size_t)n_tokens));
        SD_TRY(grow_i32(&pl->wanted, (size_t)n_tokens));
        pl->cap_tokens = n_tokens;
    }
    return SD_OK;
}

/* Checks every token and fills seq_start/seq_next/seq_order; *n_seqs is the
 * number of distinct sequences, *n_wanted the number of logits rows. Touches
 * nothing outside the plan. */
static sd_status validate_batch(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t *n_seqs, int32_t *n_wanted) {
    batch_plan *pl = &m->plan;
    const sd_kv_params *kp = sd_kv_params_of(kv);
    for (int32_t s = 0; s < kp->max_seqs; s++) pl->seq_start[s] = -1;
    *n_seqs = 0;
    *n_wanted = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t id = b->tokens[t], s = b->seq[t], p = b->pos[t];
        if (id < 0 || id >= m->cfg.n_vocab) {
            SD_ERROR("model: batch token %d has id %d outside [0, %d)", (int)t, (int)id, (int)m->cfg.n_vocab);
            return SD_ERR_RANGE;
        }
        if (s < 0 || s >= kp->max_seqs) {
            SD_ERROR("model: batch token %d has sequence slot %d outside [0, %d)", (int)t, (int)s,
                     (int)kp->max_seqs);
            return SD_ERR_RANGE;
        }
        if (pl->seq_start[s] < 0) {
            pl->seq_start[s] = sd_kv_seq_len(kv, s);
            pl->seq_next[s] = pl->seq_start[s];
            pl->seq_order[(*n_seqs)++] = s;
        }
        if (p != pl->seq_next[s]) {
            SD_ERROR("model: batch token %d of sequence %d has position %d, expected %d (positions must continue "
                     "the sequence)",
                     (int)t, (int)s, (int)p, (int)pl->seq_next[s]);
            return SD_ERR_INVALID_ARG;
        }
        if (p == INT32_MAX) {
            SD_ERROR("model: position %d overflows", (int)p);
            return SD_ERR_RANGE;
        }
        pl->seq_next[s] = p + 1;
        if (b->logits && b->logits[t]) pl->wanted[(*n_wanted)++] = t;
    }
    return SD_OK;
}

/* Grows every sequence of the batch; on failure shrinks back the ones already
 * grown so kv is unchanged. */
static sd_status grow_sequences(sd_model *m, sd_kv *kv, int32_t n_seqs) {
    batch_plan *pl = &m->plan;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t s = pl->seq_order[i];
        sd_status st = sd_kv_grow(kv, s, pl->seq_next[s]);
        if (st != SD_OK) {
            for (int32_t j = 0; j < i; j++) {
                int32_t r = pl->seq_order[j];
                sd_kv_truncate(kv, r, pl->seq_start[r]);
            }
            if (st == SD_ERR_OUT_OF_BLOCKS)
                SD_WARN("model: KV cache out of blocks growing sequence %d to %d tokens (%d free blocks)", (int)s,
                        (int)pl->seq_next[s], (int)sd_kv_n_free_blocks(kv));
            else
                SD_ERROR("model: growing sequence %d failed: %s", (int)s, sd_status_str(st));
            return st;
        }
    }
    return SD_OK;
}

/* Copies the block tables of the batch's sequences into one flat array and
 * points each token at its sequence's table. */
static sd_status gather_block_tables(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_seqs) {
    batch_plan *pl = &m->plan;
    size_t total = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t nb = 0;
        sd_kv_block_table(kv, pl->seq_order[i], &nb);
        total += (size_t)nb;
    }
    if (total > pl->cap_bt) {
        SD_TRY(grow_i32(&pl->bt, total));
        pl->cap_bt = total;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t s = pl->seq_order[i], nb = 0;
        const int32_t *table = sd_kv_block_table(kv, s, &nb);
        if (nb > 0) memcpy(pl->bt + off, table, (size_t)nb * sizeof(int32_t));
        pl->seq_bt[s] = (int32_t)off;
        off += (size_t)nb;
    }
    for (int32_t t = 0; t < b->n_tokens; t++) pl->bt_off[t] = pl->seq_bt[b->seq[t]];
    return SD_OK;
}

/* The transformer: embeddings, then n_layers_used blocks, on all n tokens. */
static sd_status forward_layers(sd_model *m, sd_kv *kv, const sd_batch *b) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    activations *a = &m->act;
    const int32_t n = b->n_tokens, E = c->n_embd, H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim;
    const int32_t QD = H * D, KD = KV * D;
    const int32_t bs = sd_kv_params_of(kv)->block_size;
    const float scale = 1.0f / sqrtf((float)D);
    const int32_t *bt = m->plan.bt, *bt_off = m->plan.bt_off;

    SD_TRY(op->embed(be, m->tok_embd, E, b->tokens, n, a->x)); /* x [n][E] */
    for (int32_t l = 0; l < m->n_layers_used; l++) {
        const layer_weights *L = &m->layers[l];
        /* attention block */
        SD_TRY(op->rmsnorm(be, a->x, L->attn_norm, n, E, c->rms_eps, a->xb)); /* xb [n][E] */
        SD_TRY(op->matmul(be, L->wq, E, QD, a->xb, n, a->q));                 /* q [n][H*D] */
        SD_TRY(op->matmul(be, L->wk, E, KD, a->xb, n, a->k));                 /* k [n][KV*D] */
        SD_TRY(op->matmul(be, L->wv, E, KD, a->xb, n, a->v));                 /* v [n][KV*D] */
        SD_TRY(op->rope(be, a->q, n, H, D, b->pos, m->inv_freq));
        SD_TRY(op->rope(be, a->k, n, KV, D, b->pos, m->inv_freq));
        SD_TRY(op->kv_write(be, sd_kv_k_pool(kv, l), bs, KD, a->k, n, b->pos, bt, bt_off));
        SD_TRY(op->kv_write(be, sd_kv_v_pool(kv, l), bs, KD, a->v, n, b->pos, bt, bt_off));
        SD_TRY(op->attention(be, a->q, sd_kv_k_pool(kv, l), sd_kv_v_pool(kv, l), n, H, KV, D, bs, b->pos, bt,
                             bt_off, scale, a->att));                          /* att [n][H*D] */
        SD_TRY(op->matmul(be, L->wo, QD, E, a->att, n, a->xb));               /* xb [n][E] */
        SD_TRY(op->add(be, a->x, a->xb, (size_t)n * (size_t)E, a->x));
        /* MLP block */
        SD_TRY(op->rmsnorm(be, a->x, L->ffn_norm, n, E, c->rms_eps, a->xb));
        SD_TRY(op->matmul(be, L->w_gate, E, c->n_ff, a->xb, n, a->gate));     /* gate [n][F] */
        SD_TRY(op->matmul(be, L->w_up, E, c->n_ff, a->xb, n, a->up));         /* up [n][F] */
        SD_TRY(op->swiglu(be, a->gate, a->up, (size_t)n * (size_t)c->n_ff, a->gate));
        SD_TRY(op->matmul(be, L->w_down, c->n_ff, E, a->gate, n, a->xb));     /* xb [n][E] */
        SD_TRY(op->add(be, a->x, a->xb, (size_t)n * (size_t)E, a->x));
    }
    return SD_OK;
}

/* forward_layers, replayed from a recording when the backend keeps them
 * (CUDA graphs): the key names the batch shape and the cache, which fix
 * every buffer and launch shape; what changes between steps (ids,
 * positions, block tables) was copied by host_arrays into buffers that stay
 * where they are. A backend that declines to record, or drops a recording
 * that failed, gets the ops run one by one. */
static sd_status run_layers(sd_model *m, sd_kv *kv, const sd_batch *b) {
    const sd_backend_ops *op = m->be.ops;
    if (!op->graph_launch) return forward_layers(m, kv, b);
    uint64_t key = sd_kv_uid(kv) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)b->n_tokens;
    sd_status s = op->graph_launch(m->be.ctx, key);
    if (s != SD_ERR_NOT_FOUND) return s;
    if (op->graph_begin(m->be.ctx, key) != SD_OK) return forward_layers(m, kv, b);
    s = forward_layers(m, kv, b);
    sd_status e = op->graph_end(m->be.ctx, s == SD_OK);
    if (e == SD_ERR_NOT_FOUND) return forward_layers(m, kv, b); /* recording dropped: nothing ran yet */
    return s != SD_OK ? s : e;
}

/* Final norm and LM head for the n_wanted rows listed in plan.wanted; out
 * NULL keeps them in the activations (a->logits on a device backend). */
static sd_status forward_logits(sd_model *m, int32_t n_wanted, float *out) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    activations *a = &m->act;
    /* gather wanted rows of x into xb [n_wanted][E], norm in place */
    SD_TRY(op->embed(be, a->x, c->n_embd, m->plan.wanted, n_wanted, a->xb));
    SD_TRY(op->rmsnorm(be, a->xb, m->output_norm, n_wanted, c->n_embd, c->rms_eps, a->xb));
    float *dst = op->host_memory ? out : a->logits; /* [n_wanted][n_vocab] */
    SD_TRY(op->matmul(be, m->output, c->n_embd, c->n_vocab, a->xb, n_wanted, dst));
    if (!op->host_memory && out)
        SD_TRY(op->buf_download(be, out, a->logits, (size_t)n_wanted * (size_t)c->n_vocab * sizeof(float)));
    return SD_OK;
}

static sd_status forward(sd_model *m, sd_kv *kv, const sd_batch *b, float *out, bool keep);

sd_status sd_model_forward(sd_model *m, sd_kv *kv, const sd_batch *b, float *out) {
    return forward(m, kv, b, out, false);
}

bool sd_model_verifies_on_device(const sd_model *m) {
    return m && m->be.ops->spec_verify && !m->host_verify;
}

sd_status sd_model_forward_verify(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_seqs, sd_spec_rows *seqs) {
    if (!sd_model_verifies_on_device(m)) {
        SD_ERROR("model: backend %s does not verify on the device", m ? m->be.ops->name : "(none)");
        return SD_ERR_UNSUPPORTED;
    }
    if (n_seqs < 0 || (n_seqs > 0 && !seqs)) return SD_ERR_INVALID_ARG;
    SD_TRY(forward(m, kv, b, NULL, true));
    int32_t n_wanted = 0;
    for (int32_t t = 0; b->logits && t < b->n_tokens; t++) n_wanted += b->logits[t];
    for (int32_t i = 0; i < n_seqs; i++)
        if (seqs[i].row0 < 0 || seqs[i].k < 0 || seqs[i].row0 + seqs[i].k >= n_wanted) {
            SD_ERROR("model: verification of sequence %d reads rows %d..%d of %d wanted", (int)i, (int)seqs[i].row0,
                     (int)(seqs[i].row0 + seqs[i].k), (int)n_wanted);
            return SD_ERR_INVALID_ARG;
        }
    return m->be.ops->spec_verify(m->be.ctx, m->act.logits, m->cfg.n_vocab, n_seqs, seqs);
}

/* The forward: out receives the wanted rows (host), or with keep they stay
 * in the activations for spec_verify. */
static sd_status forward(sd_model *m, sd_kv *kv, const sd_batch *b, float *out, bool keep) {
    if (!m || !kv || !b || b->n_tokens < 0) return SD_ERR_INVALID_ARG;
    if (b->n_tokens == 0) return SD_OK;
    if (!b->tokens || !b->pos || !b->seq) {
        SD_ERROR("model: batch with %d tokens lacks tokens/pos/seq arrays", (int)b->n_tokens);
        return SD_ERR_INVALID_ARG;
    }
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (kp->n_layers < m->n_layers_used || kp->n_kv_heads != m->cfg.n_kv_heads || kp->head_dim != m->cfg.head_dim) {
        SD_ERROR("model: KV cache shape (%d layers, %d kv heads, head_dim %d) does not fit the model (%d, %d, %d)",
                 (int)kp->n_layers, (int)kp->n_kv_heads, (int)kp->head_dim, (int)m->n_layers_used,
                 (int)m->cfg.n_kv_heads, (int)m->cfg.head_dim);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(reserve_plan(&m->plan, kp->max_seqs, b->n_tokens));
    int32_t n_seqs, n_wanted;
    SD_TRY(validate_batch(m, kv, b, &n_seqs, &n_wanted));
    if (n_wanted > 0 && !out && !keep) {
        SD_ERROR("model: %d logits rows wanted but out is NULL", (int)n_wanted);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(reserve_activations(m, b->n_tokens));
    SD_TRY(grow_sequences(m, kv, n_seqs));
    sd_status s = gather_block_tables(m, kv, b, n_seqs);
    if (s == SD_OK && m->be.ops->host_arrays) {
        size_t n_bt = 0;
        for (int32_t i = 0; i < n_seqs; i++) {
            int32_t nb = 0;
            sd_kv_block_table(kv, m->plan.seq_order[i], &nb);
            n_bt += (size_t)nb;
        }
        /* the order is fixed: a recorded forward reads the same slots */
        const sd_host_array arrays[] = {
            {b->tokens, (size_t)b->n_tokens}, {b->pos, (size_t)b->n_tokens}, {m->plan.bt, n_bt},
            {m->plan.bt_off, (size_t)b->n_tokens}, {m->plan.wanted, (size_t)n_wanted},
        };
        s = m->be.ops->host_arrays(m->be.ctx, arrays, (int32_t)(sizeof arrays / sizeof arrays[0]));
    }
    if (s == SD_OK) s = run_layers(m, kv, b);
    if (s == SD_OK && n_wanted > 0) s = forward_logits(m, n_wanted, keep ? NULL : out);
    if (s != SD_OK) {
        /* the cache holds partial entries: give the new positions back */
        for (int32_t i = 0; i < n_seqs; i++) {
            int32_t q = m->plan.seq_order[i];
            sd_kv_truncate(kv, q, m->plan.seq_start[q]);
        }
        SD_ERROR("model: forward failed: %s", sd_status_str(s));
    }
    return s;
}
