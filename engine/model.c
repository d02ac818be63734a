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
 * n_out] is n_out rows of n_in floats.
 *
 * Tensor parallelism (tp_size > 1): a rank loads only its rectangle of each
 * matrix (sd_weights_read), Megatron style: Q/K/V and gate/up by output rows
 * (its heads, its MLP columns), the attention output and down projections by
 * input columns, so each of those two produces a partial sum of the residual
 * update, summed across ranks by one all-reduce (the collective sums in rank
 * order: deterministic, and batch-invariant because every per-rank op is).
 * KV heads are split with the query heads, or replicated when there are
 * fewer KV heads than ranks. Norms and the embedding table are replicated
 * (a lookup is a few rows; splitting it would cost one more all-reduce per
 * step). The LM head is split by vocabulary rows and gathered to the leader
 * (or kept whole on the leader): each logit is then computed by one rank
 * exactly as without TP. The shapes below are per rank: H, KV and F are this
 * rank's heads, KV heads and MLP columns. Rejected: splitting the residual
 * stream (sequence parallelism), which needs reduce-scatter + all-gather
 * pairs and pays only at prefill sizes we do not have on a verifier. */
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

/* Per rank (tp_size 1: the whole model): H, KV, F = this rank's heads, KV
 * heads and MLP columns. */
typedef struct layer_weights {
    float *attn_norm; /* [n_embd] */
    float *wq;        /* [H*head_dim][n_embd]   rows of this rank's heads */
    float *wk;        /* [KV*head_dim][n_embd] */
    float *wv;        /* [KV*head_dim][n_embd] */
    float *wo;        /* [n_embd][H*head_dim]   columns of this rank's heads */
    float *ffn_norm;  /* [n_embd] */
    float *w_gate;    /* [F][n_embd] */
    float *w_up;      /* [F][n_embd] */
    float *w_down;    /* [n_embd][F]            columns of this rank's MLP slice */
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
    float *logits; /* [n_tokens][n_vocab], only for backends without host memory (leader) */
    float *head_part; /* [n_tokens][n_vocab_l] split LM head: this rank's logits columns */
    float *head_all;  /* [tp][n_tokens][n_vocab_l] split LM head, leader: every rank's part */
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
    int32_t cap_head;
    int32_t *head_ids;  /* [n_wanted * tp] row of head_all for each row of the logits viewed as [.][n_vocab_l] */
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
    uint64_t resident_bytes;
    activations act;
    batch_plan plan;
    /* tensor parallelism (see the file comment); tp_size 1: the whole model */
    sd_model_shard shard;
    bool output_borrowed;   /* output points into tok_embd (tied head, host memory) */
    sd_coll *coll;          /* borrowed; NULL: no collectives */
    bool coll_on_stream;    /* coll enqueues on the backend's stream: wait with sd_coll_wait */
    sd_model_plan_fn plan_sink;
    void *plan_user;
    sd_model_tp_stats tp_stats;
};

sd_model_params sd_model_default_params(void) {
    sd_model_params p = {.n_threads = 0, .n_layers_used = 0, .device = -1, .tp_rank = 0, .tp_size = 1,
                         .tp_lm_head = SD_TP_LM_HEAD_SPLIT, .coll = NULL};
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

/* A rectangle of a 2-D weight [rows][cols]: what a tensor-parallel rank
 * loads. */
typedef struct slice {
    int64_t row0, n_rows, col0, n_cols;
} slice;

/* Reads the rectangle r of tensor name, which must be [rows][cols] as a
 * whole (1-D when rows == 0; r is then the whole vector), as f32 into a new
 * backend buffer: only those bytes of the mapped file are touched. A matrix
 * goes through the backend's weight_upload when it has one (its own matmul
 * format); *out is then that opaque weight, which only matmul reads. */
static sd_status load_slice(sd_model *m, const sd_weights *w, const char *name, int64_t rows, int64_t cols, slice r,
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
    if (r.row0 < 0 || r.n_rows < 1 || r.row0 + r.n_rows > want_rows || r.col0 < 0 || r.n_cols < 1 ||
        r.col0 + r.n_cols > cols) {
        SD_ERROR("model: slice [%lld+%lld][%lld+%lld] of %s is outside its [%lld][%lld]", (long long)r.row0,
                 (long long)r.n_rows, (long long)r.col0, (long long)r.n_cols, name, (long long)want_rows,
                 (long long)cols);
        return SD_ERR_INTERNAL;
    }
    size_t block_elems = 1, block_bytes = 0;
    if (sd_dtype_block(t.type, &block_elems, &block_bytes) && block_elems > 1 &&
        (r.col0 % (int64_t)block_elems || r.n_cols % (int64_t)block_elems)) {
        SD_ERROR("model: %s is stored as %s, in blocks of %zu values per row; this rank's columns [%lld, %lld) "
                 "do not start and end on a block, so it cannot be split over %d ranks (a tensor-parallel size whose "
                 "slices are multiples of %zu columns would do)",
                 name, sd_dtype_name(t.type), block_elems, (long long)r.col0, (long long)(r.col0 + r.n_cols),
                 (int)m->shard.tp_size, block_elems);
        return SD_ERR_INVALID_ARG;
    }
    size_t bytes;
    if (!sd_mul_ok((size_t)r.n_rows, (size_t)r.n_cols, &bytes) || !sd_mul_ok(bytes, sizeof(float), &bytes))
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
    sd_status s = sd_weights_read(w, name, r.row0, r.n_rows, r.col0, r.n_cols, host);
    if (s != SD_OK) {
        SD_ERROR("model: cannot read %s (%s, %s)", name, sd_dtype_name(t.type), sd_status_str(s));
    } else if (convert) {
        void *conv = NULL;
        s = ops->weight_upload(m->be.ctx, host, (int32_t)r.n_rows, (int32_t)r.n_cols, &conv);
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
    uint64_t held = convert ? bytes / sizeof(float) * (size_t)ops->weight_elem_bytes : bytes;
    m->weight_bytes += held;
    m->resident_bytes += held;
    return SD_OK;
}

/* The whole tensor (replicated parts: norms, the embedding table). */
static sd_status load_tensor(sd_model *m, const sd_weights *w, const char *name, int64_t rows, int64_t cols,
                             bool matrix, float **out) {
    slice all = {0, rows ? rows : 1, 0, cols};
    return load_slice(m, w, name, rows, cols, all, matrix, out);
}

/* Frees one weight loaded by load_tensor. */
static void free_tensor(sd_model *m, float *buf, bool matrix) {
    if (!buf) return;
    if (matrix && m->be.ops->weight_upload)
        m->be.ops->weight_free(m->be.ctx, buf);
    else
        m->be.ops->buf_free(m->be.ctx, buf);
}

/* This rank's shard of the config (docs/DESIGN.md, "Tensor parallelism"):
 * refuses a TP size that does not divide what must be split, with a line
 * that says which. */
static sd_status plan_shard(sd_model *m) {
    const sd_model_config *c = &m->cfg;
    const sd_model_params *p = &m->params;
    int32_t tp = p->tp_size, r = p->tp_rank;
    if (tp < 1 || tp > 1024 || r < 0 || r >= tp) {
        SD_ERROR("model: tensor-parallel rank %d of %d: need 1 <= tp_size <= 1024 and 0 <= rank < tp_size", (int)r,
                 (int)tp);
        return SD_ERR_INVALID_ARG;
    }
    if (p->tp_lm_head != SD_TP_LM_HEAD_SPLIT && p->tp_lm_head != SD_TP_LM_HEAD_LEADER) {
        SD_ERROR("model: unknown LM head mode %d", (int)p->tp_lm_head);
        return SD_ERR_INVALID_ARG;
    }
    if (c->n_heads % tp != 0) {
        SD_ERROR("model: a tensor-parallel size of %d does not divide the model's %d attention heads; use a "
                 "divisor of %d",
                 (int)tp, (int)c->n_heads, (int)c->n_heads);
        return SD_ERR_INVALID_ARG;
    }
    if (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0) {
        SD_ERROR("model: a tensor-parallel size of %d neither divides the model's %d KV heads nor is a multiple "
                 "of them (then each rank would hold a KV head, replicated); use a divisor of %d or a multiple "
                 "of %d that divides %d",
                 (int)tp, (int)c->n_kv_heads, (int)c->n_kv_heads, (int)c->n_kv_heads, (int)c->n_heads);
        return SD_ERR_INVALID_ARG;
    }
    if (c->n_ff % tp != 0) {
        SD_ERROR("model: a tensor-parallel size of %d does not divide the MLP width %d", (int)tp, (int)c->n_ff);
        return SD_ERR_INVALID_ARG;
    }
    sd_model_shard *sh = &m->shard;
    memset(sh, 0, sizeof *sh);
    sh->tp_rank = r;
    sh->tp_size = tp;
    sh->n_heads = c->n_heads / tp;
    sh->head0 = r * sh->n_heads;
    /* query head h reads KV head h / (n_heads / n_kv_heads) */
    int32_t group = c->n_heads / c->n_kv_heads;
    sh->n_kv_heads = c->n_kv_heads >= tp ? c->n_kv_heads / tp : 1;
    sh->kv_head0 = sh->head0 / group;
    sh->n_ff = c->n_ff / tp;
    sh->ff0 = r * sh->n_ff;
    sh->lm_head = p->tp_lm_head;
    if (tp > 1 && sh->lm_head == SD_TP_LM_HEAD_SPLIT && c->n_vocab % tp != 0) {
        SD_INFO("model: the vocabulary (%d) is not a multiple of the tensor-parallel size %d: the LM head stays "
                "whole on the leader",
                (int)c->n_vocab, (int)tp);
        sh->lm_head = SD_TP_LM_HEAD_LEADER;
    }
    if (sh->lm_head == SD_TP_LM_HEAD_SPLIT) {
        sh->n_vocab = c->n_vocab / tp;
        sh->vocab0 = r * sh->n_vocab;
    } else {
        sh->n_vocab = r == 0 ? c->n_vocab : 0;
        sh->vocab0 = 0;
    }
    return SD_OK;
}

static sd_status load_weights(sd_model *m, const sd_weights *w) {
    const sd_model_config *c = &m->cfg;
    const sd_model_shard *sh = &m->shard;
    int64_t E = c->n_embd, V = c->n_vocab, F = c->n_ff, D = c->head_dim;
    int64_t QD = (int64_t)c->n_heads * D, KD = (int64_t)c->n_kv_heads * D;
    SD_TRY(load_tensor(m, w, "token_embd.weight", V, E, false, &m->tok_embd));
    /* a step reads one row of the table per token: it is not streamed
     * (unless it is also the LM head, counted again just below) */
    m->weight_bytes -= (uint64_t)V * (uint64_t)E * sizeof(float);
    SD_TRY(load_tensor(m, w, "output_norm.weight", 0, E, false, &m->output_norm));
    /* this rank's LM head rows. Tied: they are rows of the embedding table,
     * unless the backend keeps matrices in a format of its own (then it gets
     * its own copy) */
    if (sh->n_vocab > 0 && c->tied_output && !m->be.ops->weight_upload) {
        m->output = m->tok_embd + (size_t)sh->vocab0 * (size_t)E;
        m->output_borrowed = true;
        m->weight_bytes += (uint64_t)sh->n_vocab * (uint64_t)E * sizeof(float);
    } else if (sh->n_vocab > 0) {
        slice head = {sh->vocab0, sh->n_vocab, 0, E};
        SD_TRY(load_slice(m, w, c->tied_output ? "token_embd.weight" : "output.weight", V, E, head, true,
                          &m->output));
    }
    const slice q = {(int64_t)sh->head0 * D, (int64_t)sh->n_heads * D, 0, E};
    const slice kv = {(int64_t)sh->kv_head0 * D, (int64_t)sh->n_kv_heads * D, 0, E};
    const slice o = {0, E, (int64_t)sh->head0 * D, (int64_t)sh->n_heads * D};
    const slice up = {sh->ff0, sh->n_ff, 0, E};
    const slice down = {0, E, sh->ff0, sh->n_ff};
    const slice norm = {0, 1, 0, E};
    char name[96];
    for (int32_t l = 0; l < m->n_layers_used; l++) {
        layer_weights *L = &m->layers[l];
        struct {
            const char *suffix;
            int64_t rows, cols;
            slice part;
            float **dst;
        } const parts[] = {
            {"attn_norm", 0, E, norm, &L->attn_norm}, {"attn_q", QD, E, q, &L->wq},
            {"attn_k", KD, E, kv, &L->wk},            {"attn_v", KD, E, kv, &L->wv},
            {"attn_output", E, QD, o, &L->wo},        {"ffn_norm", 0, E, norm, &L->ffn_norm},
            {"ffn_gate", F, E, up, &L->w_gate},       {"ffn_up", F, E, up, &L->w_up},
            {"ffn_down", E, F, down, &L->w_down},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, parts[i].suffix);
            SD_TRY(load_slice(m, w, name, parts[i].rows, parts[i].cols, parts[i].part, parts[i].rows != 0,
                              parts[i].dst));
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
    const sd_model_shard *sh = &m->shard;
    double E = c->n_embd, V = c->n_vocab, F = sh->n_ff, QD = (double)sh->n_heads * c->head_dim;
    double KD = (double)sh->n_kv_heads * c->head_dim, mat = ops->weight_elem_bytes;
    double per_layer = (2 * E * QD + 2 * E * KD + 3 * E * F) * mat + 2 * E * 4;
    double need = E * V * 4 /* embedding table */ + E * sh->n_vocab * mat /* LM head rows */ + E * 4 +
                  (double)m->n_layers_used * per_layer;
    if (need > (double)free_b) {
        SD_ERROR("model: the weights need %.2f GiB of %s memory (%d layers, %s matrices%s), but only %.2f GiB of "
                 "%.2f GiB are free",
                 need / 1073741824.0, ops->name, (int)m->n_layers_used, mat == 2 ? "BF16" : "f32",
                 sh->tp_size > 1 ? ", this rank's shard" : "", (double)free_b / 1073741824.0,
                 (double)total_b / 1073741824.0);
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
    sd_model *m = calloc(1, sizeof *m);
    if (!m) return SD_ERR_NOMEM;
    m->params = params;
    sd_status s = sd_weights_config(w, &m->cfg);
    if (s == SD_OK && params.n_layers_used > m->cfg.n_layers) {
        SD_ERROR("model: n_layers_used %d > block_count %d", (int)params.n_layers_used, (int)m->cfg.n_layers);
        s = SD_ERR_INVALID_ARG;
    }
    if (s == SD_OK) s = plan_shard(m);
    if (s == SD_OK) {
        m->n_layers_used = params.n_layers_used ? params.n_layers_used : m->cfg.n_layers;
        m->layers = calloc((size_t)m->n_layers_used, sizeof *m->layers);
        s = m->layers ? sd_backend_create(params.device, params.n_threads, &m->be) : SD_ERR_NOMEM;
    }
    const char *dv = getenv("SPECD_DEVICE_VERIFY");
    m->host_verify = dv && strcmp(dv, "0") == 0;
    if (s == SD_OK) s = check_memory(m);
    if (s == SD_OK) s = load_weights(m, w);
    if (s == SD_OK && params.coll) s = sd_model_set_coll(m, params.coll);
    if (s != SD_OK) {
        sd_model_free(&m);
        return s;
    }
    SD_INFO("model: llama, %d/%d layers, n_embd %d, n_ff %d, heads %d/%d, head_dim %d, vocab %d, %.1f MB of "
            "weights streamed per step (%s matrices), backend %s",
            (int)m->n_layers_used, (int)m->cfg.n_layers, (int)m->cfg.n_embd, (int)m->cfg.n_ff,
            (int)m->cfg.n_heads, (int)m->cfg.n_kv_heads, (int)m->cfg.head_dim, (int)m->cfg.n_vocab,
            (double)m->weight_bytes / 1e6, m->be.ops->weight_elem_bytes == 2 ? "BF16" : "f32", m->be.ops->name);
    if (m->shard.tp_size > 1)
        SD_INFO("model: tensor-parallel rank %d of %d: heads %d..%d, KV heads %d..%d, MLP columns %d..%d, LM head "
                "%s; %.1f MB of weights held",
                (int)m->shard.tp_rank, (int)m->shard.tp_size, (int)m->shard.head0,
                (int)(m->shard.head0 + m->shard.n_heads - 1), (int)m->shard.kv_head0,
                (int)(m->shard.kv_head0 + m->shard.n_kv_heads - 1), (int)m->shard.ff0,
                (int)(m->shard.ff0 + m->shard.n_ff - 1),
                m->shard.n_vocab == 0                        ? "none (on the leader)"
                : m->shard.lm_head == SD_TP_LM_HEAD_LEADER ? "whole (leader)"
                                                             : "split by vocabulary",
                (double)m->resident_bytes / 1e6);
    *out = m;
    return SD_OK;
}

static void free_activations(sd_model *m) {
    activations *a = &m->act;
    float **bufs[] = {&a->x,    &a->xb, &a->q,      &a->k,        &a->v,       &a->att,
                      &a->gate, &a->up, &a->logits, &a->head_part, &a->head_all};
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
        if (!m->output_borrowed) free_tensor(m, m->output, true);
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
    free(pl->head_ids);
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
    if (m->shard.tp_size > 1 || m->coll) {
        SD_ERROR("model: a tensor-parallel shard cannot lend its layers to a view (its forward needs the group)");
        return SD_ERR_UNSUPPORTED;
    }
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
    v->shard = m->shard;
    v->output_borrowed = true;
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

uint64_t sd_model_resident_bytes(const sd_model *m) { return m ? m->resident_bytes : 0; }

void sd_model_shard_of(const sd_model *m, sd_model_shard *out) {
    if (!out) return;
    if (m)
        *out = m->shard;
    else
        memset(out, 0, sizeof *out);
}

sd_status sd_model_set_coll(sd_model *m, sd_coll *coll) {
    if (!m) return SD_ERR_INVALID_ARG;
    bool on_stream = false;
    if (coll) {
        bool shm = strcmp(sd_coll_kind(coll), "shm") == 0;
        if (sd_coll_size(coll) != m->shard.tp_size || sd_coll_rank(coll) != m->shard.tp_rank) {
            SD_ERROR("model: loaded as rank %d of %d, but the group says rank %d of %d", (int)m->shard.tp_rank,
                     (int)m->shard.tp_size, (int)sd_coll_rank(coll), (int)sd_coll_size(coll));
            return SD_ERR_INVALID_ARG;
        }
        if (shm != m->be.ops->host_memory) {
            SD_ERROR("model: %s collectives cannot work on %s buffers (shm is for the CPU, nccl for CUDA)",
                     sd_coll_kind(coll), m->be.ops->name);
            return SD_ERR_INVALID_ARG;
        }
        /* NCCL joins the backend's one stream: collectives are ordered after
         * the ops before them with no host wait. (The old group is not
         * touched: the caller may have closed it already.) */
        if (!shm) {
            if (!m->be.ops->stream) {
                SD_ERROR("model: backend %s has no stream for NCCL collectives", m->be.ops->name);
                return SD_ERR_INVALID_ARG;
            }
            SD_TRY(sd_coll_use_stream(coll, m->be.ops->stream(m->be.ctx)));
            on_stream = true;
        }
    }
    if (m->be.ops->graph_reset) m->be.ops->graph_reset(m->be.ctx); /* recordings made without collectives */
    m->coll = coll;
    m->coll_on_stream = on_stream;
    return SD_OK;
}

void sd_model_tp_stats_get(sd_model *m, sd_model_tp_stats *out, bool reset) {
    if (!m) return;
    if (out) *out = m->tp_stats;
    if (reset) memset(&m->tp_stats, 0, sizeof m->tp_stats);
}

void sd_model_set_plan_sink(sd_model *m, sd_model_plan_fn fn, void *user) {
    if (!m) return;
    m->plan_sink = fn;
    m->plan_user = user;
}

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
    p.n_kv_heads = m->shard.n_kv_heads; /* this rank's heads only */
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
    const sd_model_shard *sh = &m->shard;
    size_t n = (size_t)n_tokens, q = (size_t)sh->n_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)sh->n_kv_heads * (size_t)c->head_dim;
    /* the split LM head's buffers exist whenever a group is attached (or may
     * be later: sized from the shard, not from m->coll) */
    bool split = sh->lm_head == SD_TP_LM_HEAD_SPLIT && sh->n_vocab > 0;
    bool leader = sh->tp_rank == 0;
    struct {
        float **dst;
        size_t floats;
    } const want[] = {
        {&a->x, n * (size_t)c->n_embd},
        {&a->xb, n * (size_t)c->n_embd},
        {&a->q, n * q},
        {&a->k, n * kvd},
        {&a->v, n * kvd},
        {&a->att, n * q},
        {&a->gate, n * (size_t)sh->n_ff},
        {&a->up, n * (size_t)sh->n_ff},
        {&a->logits, m->be.ops->host_memory || !leader ? 0 : n * (size_t)c->n_vocab},
        {&a->head_part, split ? n * (size_t)sh->n_vocab : 0},
        {&a->head_all, split && leader ? n * (size_t)sh->n_vocab * (size_t)sh->tp_size : 0},
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

/* Sums a partial residual update over the group (nothing without one).
 * shm sums host buffers the ops before it finished writing, and returns
 * once the sum is in place; NCCL on the backend's stream (coll_on_stream) is
 * enqueued after the ops that wrote buf and before those that read it, and
 * returns at once (the time counted is then the enqueue's), the forward
 * waiting for it at its end (settle_coll). */
static sd_status tp_all_reduce(sd_model *m, float *buf, size_t n) {
    if (!m->coll) return SD_OK;
    double t0 = sd_now();
    sd_status s = sd_coll_all_reduce_sum(m->coll, buf, n);
    m->tp_stats.all_reduces++;
    m->tp_stats.all_reduce_s += sd_now() - t0;
    return s;
}

/* The transformer: embeddings, then n_layers_used blocks, on all n tokens
 * of the plan. Shapes per rank: H, KV heads and F MLP columns of its shard;
 * the two row-parallel matmuls leave partial sums that the all-reduces
 * complete. */
static sd_status forward_layers(sd_model *m, sd_kv *kv, const sd_model_plan *b) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    activations *a = &m->act;
    const int32_t n = b->n_tokens, E = c->n_embd, D = c->head_dim;
    const int32_t H = m->shard.n_heads, KV = m->shard.n_kv_heads, F = m->shard.n_ff;
    const int32_t QD = H * D, KD = KV * D;
    const size_t nE = (size_t)n * (size_t)E;
    const int32_t bs = sd_kv_params_of(kv)->block_size;
    const float scale = 1.0f / sqrtf((float)D);
    const int32_t *bt = b->bt, *bt_off = b->bt_off;
    /* a backend with matmul_fused gets Q/K/V and gate/up in one job each,
     * the residual adds inside the o and down projections' jobs and the
     * SwiGLU as part of the down projection's (the adds stay separate in a
     * group: the partial sums are all-reduced first) */
    const bool fused = op->matmul_fused != NULL;

    SD_TRY(op->embed(be, m->tok_embd, E, b->tokens, n, a->x)); /* x [n][E] */
    for (int32_t l = 0; l < m->n_layers_used; l++) {
        const layer_weights *L = &m->layers[l];
        /* attention block */
        SD_TRY(op->rmsnorm(be, a->x, L->attn_norm, n, E, c->rms_eps, a->xb)); /* xb [n][E] */
        if (fused) {
            const sd_matmul_job qkv = {.n_mats = 3, .w = {L->wq, L->wk, L->wv}, .n_out = {QD, KD, KD},
                                       .y = {a->q, a->k, a->v}, .n_in = E, .n_tokens = n, .x = a->xb};
            SD_TRY(op->matmul_fused(be, &qkv));
        } else {
            SD_TRY(op->matmul(be, L->wq, E, QD, a->xb, n, a->q)); /* q [n][H*D] */
            SD_TRY(op->matmul(be, L->wk, E, KD, a->xb, n, a->k)); /* k [n][KV*D] */
            SD_TRY(op->matmul(be, L->wv, E, KD, a->xb, n, a->v)); /* v [n][KV*D] */
        }
        if (op->rope_kv) {
            SD_TRY(op->rope_kv(be, a->q, a->k, a->v, n, H, KV, D, b->pos, m->inv_freq, sd_kv_k_pool(kv, l),
                               sd_kv_v_pool(kv, l), bs, bt, bt_off));
        } else {
            SD_TRY(op->rope(be, a->q, n, H, D, b->pos, m->inv_freq));
            SD_TRY(op->rope(be, a->k, n, KV, D, b->pos, m->inv_freq));
            SD_TRY(op->kv_write(be, sd_kv_k_pool(kv, l), bs, KD, a->k, n, b->pos, bt, bt_off));
            SD_TRY(op->kv_write(be, sd_kv_v_pool(kv, l), bs, KD, a->v, n, b->pos, bt, bt_off));
        }
        SD_TRY(op->attention(be, a->q, sd_kv_k_pool(kv, l), sd_kv_v_pool(kv, l), n, H, KV, D, bs, b->pos, bt,
                             bt_off, scale, a->att));                          /* att [n][H*D] */
        if (fused && !m->coll) { /* x += wo att */
            const sd_matmul_job o = {.n_mats = 1, .w = {L->wo}, .n_out = {E}, .y = {a->x}, .n_in = QD,
                                     .n_tokens = n, .x = a->att, .accumulate = true};
            SD_TRY(op->matmul_fused(be, &o));
        } else {
            SD_TRY(op->matmul(be, L->wo, QD, E, a->att, n, a->xb)); /* xb [n][E] (partial) */
            SD_TRY(tp_all_reduce(m, a->xb, nE));
            SD_TRY(op->add(be, a->x, a->xb, nE, a->x));
        }
        /* MLP block */
        SD_TRY(op->rmsnorm(be, a->x, L->ffn_norm, n, E, c->rms_eps, a->xb));
        if (fused) {
            const sd_matmul_job gu = {.n_mats = 2, .w = {L->w_gate, L->w_up}, .n_out = {F, F},
                                      .y = {a->gate, a->up}, .n_in = E, .n_tokens = n, .x = a->xb};
            SD_TRY(op->matmul_fused(be, &gu));
            /* x += w_down (silu(gate) * up), or xb = that partial in a group */
            const sd_matmul_job down = {.n_mats = 1, .w = {L->w_down}, .n_out = {E}, .y = {m->coll ? a->xb : a->x},
                                        .n_in = F, .n_tokens = n, .x = a->gate, .up = a->up,
                                        .accumulate = !m->coll};
            SD_TRY(op->matmul_fused(be, &down));
        } else {
            SD_TRY(op->matmul(be, L->w_gate, E, F, a->xb, n, a->gate)); /* gate [n][F] */
            SD_TRY(op->matmul(be, L->w_up, E, F, a->xb, n, a->up));     /* up [n][F] */
            SD_TRY(op->swiglu(be, a->gate, a->up, (size_t)n * (size_t)F, a->gate));
            SD_TRY(op->matmul(be, L->w_down, F, E, a->gate, n, a->xb)); /* xb [n][E] (partial) */
        }
        if (!fused || m->coll) {
            SD_TRY(tp_all_reduce(m, a->xb, nE));
            SD_TRY(op->add(be, a->x, a->xb, nE, a->x));
        }
    }
    return SD_OK;
}

/* forward_layers, replayed from a recording when the backend keeps them
 * (CUDA graphs): the key names the batch shape and the cache, which fix
 * every buffer and launch shape; what changes between steps (ids,
 * positions, block tables) was copied by host_arrays into buffers that stay
 * where they are. A backend that declines to record, or drops a recording
 * that failed, gets the ops run one by one. A model in a group never
 * records: collectives are not part of a recording (shm ones run on the
 * host; NCCL's non-blocking communicators may answer "in progress" to an
 * enqueue, which a capture cannot wait for). */
static sd_status run_layers(sd_model *m, sd_kv *kv, const sd_model_plan *b) {
    const sd_backend_ops *op = m->be.ops;
    if (!op->graph_launch || m->coll) return forward_layers(m, kv, b);
    uint64_t key = sd_kv_uid(kv) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)b->n_tokens;
    sd_status s = op->graph_launch(m->be.ctx, key);
    if (s != SD_ERR_NOT_FOUND) return s;
    if (op->graph_begin(m->be.ctx, key) != SD_OK) return forward_layers(m, kv, b);
    s = forward_layers(m, kv, b);
    sd_status e = op->graph_end(m->be.ctx, s == SD_OK);
    if (e == SD_ERR_NOT_FOUND) return forward_layers(m, kv, b); /* recording dropped: nothing ran yet */
    return s != SD_OK ? s : e;
}

/* The split LM head: every rank computes its vocabulary columns for the
 * wanted rows (xb, normed), the leader gathers them, [tp][n_wanted][Vl],
 * and reorders them into dst [n_wanted][V]: viewed as rows of Vl floats,
 * row t*tp + r of dst is row r*n_wanted + t of the gathered buffer (the
 * embedding lookup does that row gather on any backend). */
static sd_status split_head(sd_model *m, int32_t n_wanted, float *dst) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    activations *a = &m->act;
    const sd_model_shard *sh = &m->shard;
    const size_t part = (size_t)n_wanted * (size_t)sh->n_vocab;
    SD_TRY(op->matmul(be, m->output, m->cfg.n_embd, sh->n_vocab, a->xb, n_wanted, a->head_part));
    double t0 = sd_now();
    SD_TRY(sd_coll_gather(m->coll, a->head_part, part, a->head_all, 0));
    m->tp_stats.gathers++;
    m->tp_stats.gather_s += sd_now() - t0;
    if (sh->tp_rank != 0 || !dst) return SD_OK;
    batch_plan *pl = &m->plan;
    int32_t n_rows = n_wanted * sh->tp_size;
    if (n_rows > pl->cap_head) {
        SD_TRY(grow_i32(&pl->head_ids, (size_t)n_rows));
        pl->cap_head = n_rows;
    }
    for (int32_t t = 0; t < n_wanted; t++)
        for (int32_t r = 0; r < sh->tp_size; r++) pl->head_ids[t * sh->tp_size + r] = r * n_wanted + t;
    return op->embed(be, a->head_all, sh->n_vocab, pl->head_ids, n_rows, dst);
}

/* The bounded wait for collectives enqueued on the backend's stream (and
 * the compute before them): before the host reads results, and at the end
 * of every forward, so a rank whose peer died fails here instead of
 * blocking in a download. */
static sd_status settle_coll(sd_model *m) {
    return m->coll_on_stream ? sd_coll_wait(m->coll) : SD_OK;
}

/* Final norm and LM head for the n_wanted rows listed in wanted; out NULL
 * keeps them in the activations (a->logits on a device backend). In a
 * group every rank with LM head rows takes part; only the leader ends up
 * with logits. */
static sd_status forward_logits(sd_model *m, const int32_t *wanted, int32_t n_wanted, float *out) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    const sd_model_shard *sh = &m->shard;
    activations *a = &m->act;
    bool split = m->coll && sh->lm_head == SD_TP_LM_HEAD_SPLIT;
    if (!split && sh->tp_rank != 0) return SD_OK; /* the leader holds the whole head */
    /* gather wanted rows of x into xb [n_wanted][E], norm in place */
    SD_TRY(op->embed(be, a->x, c->n_embd, wanted, n_wanted, a->xb));
    SD_TRY(op->rmsnorm(be, a->xb, m->output_norm, n_wanted, c->n_embd, c->rms_eps, a->xb));
    float *dst = op->host_memory ? out : a->logits; /* [n_wanted][n_vocab] */
    if (split)
        SD_TRY(split_head(m, n_wanted, dst));
    else
        SD_TRY(op->matmul(be, m->output, c->n_embd, c->n_vocab, a->xb, n_wanted, dst));
    if (sh->tp_rank == 0 && !op->host_memory && out) {
        SD_TRY(settle_coll(m)); /* bounded, before a download that would wait without a bound */
        SD_TRY(op->buf_download(be, out, a->logits, (size_t)n_wanted * (size_t)c->n_vocab * sizeof(float)));
    }
    return SD_OK;
}

/* Everything after the batch was planned: the arrays to the device, the
 * layers, the LM head. */
static sd_status run_plan(sd_model *m, sd_kv *kv, const sd_model_plan *p, float *out) {
    sd_status s = SD_OK;
    if (m->be.ops->host_arrays) {
        /* the order is fixed: a recorded forward reads the same slots */
        const sd_host_array arrays[] = {
            {p->tokens, (size_t)p->n_tokens}, {p->pos, (size_t)p->n_tokens},     {p->bt, (size_t)p->n_bt},
            {p->bt_off, (size_t)p->n_tokens}, {p->wanted, (size_t)p->n_wanted},
        };
        s = m->be.ops->host_arrays(m->be.ctx, arrays, (int32_t)(sizeof arrays / sizeof arrays[0]));
    }
    if (s == SD_OK) s = run_layers(m, kv, p);
    if (s == SD_OK && p->n_wanted > 0) s = forward_logits(m, p->wanted, p->n_wanted, out);
    if (s == SD_OK) s = settle_coll(m);
    return s;
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
    if (m->shard.tp_size > 1 && (!m->coll || m->shard.tp_rank != 0)) {
        SD_ERROR("model: rank %d of a %d-rank group %s", (int)m->shard.tp_rank, (int)m->shard.tp_size,
                 m->coll ? "runs the leader's plans (sd_model_forward_plan), not batches of its own"
                         : "has no collectives yet (sd_model_set_coll)");
        return SD_ERR_INVALID_ARG;
    }
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (kp->n_layers < m->n_layers_used || kp->n_kv_heads != m->shard.n_kv_heads || kp->head_dim != m->cfg.head_dim) {
        SD_ERROR("model: KV cache shape (%d layers, %d kv heads, head_dim %d) does not fit the model (%d, %d, %d)",
                 (int)kp->n_layers, (int)kp->n_kv_heads, (int)kp->head_dim, (int)m->n_layers_used,
                 (int)m->shard.n_kv_heads, (int)m->cfg.head_dim);
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
    size_t n_bt = 0;
    for (int32_t i = 0; s == SD_OK && i < n_seqs; i++) {
        int32_t nb = 0;
        sd_kv_block_table(kv, m->plan.seq_order[i], &nb);
        n_bt += (size_t)nb;
    }
    sd_model_plan plan = {
        .n_tokens = b->n_tokens, .tokens = b->tokens, .pos = b->pos, .bt_off = m->plan.bt_off,
        .n_bt = (int32_t)n_bt, .bt = m->plan.bt, .n_wanted = n_wanted, .wanted = m->plan.wanted,
    };
    /* the other ranks run the same plan at the same time */
    if (s == SD_OK && m->plan_sink) s = m->plan_sink(m->plan_user, &plan);
    if (s == SD_OK) s = run_plan(m, kv, &plan, keep ? NULL : out);
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

/* Checks a plan from the leader against this rank's cache and vocabulary:
 * every array present, ids in the vocabulary, each token's block entry
 * (and every entry before it, which attention reads) inside bt, every block
 * id inside the pool, wanted rows increasing. */
static sd_status check_plan(const sd_model *m, const sd_kv *kv, const sd_model_plan *p) {
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (p->n_tokens < 1 || p->n_bt < 1 || p->n_wanted < 0 || p->n_wanted > p->n_tokens || !p->tokens || !p->pos ||
        !p->bt_off || !p->bt || (p->n_wanted > 0 && !p->wanted)) {
        SD_ERROR("model: plan with %d tokens, %d block entries, %d wanted rows, or an array missing",
                 (int)p->n_tokens, (int)p->n_bt, (int)p->n_wanted);
        return SD_ERR_RANGE;
    }
    for (int32_t i = 0; i < p->n_bt; i++)
        if (p->bt[i] < 0 || p->bt[i] >= kp->n_blocks) {
            SD_ERROR("model: plan block entry %d is block %d, outside the pool [0, %d)", (int)i, (int)p->bt[i],
                     (int)kp->n_blocks);
            return SD_ERR_RANGE;
        }
    for (int32_t t = 0; t < p->n_tokens; t++) {
        if (p->tokens[t] < 0 || p->tokens[t] >= m->cfg.n_vocab || p->pos[t] < 0 || p->bt_off[t] < 0 ||
            (int64_t)p->bt_off[t] + p->pos[t] / kp->block_size >= p->n_bt) {
            SD_ERROR("model: plan token %d (id %d, position %d, table at %d) is outside the vocabulary %d or the "
                     "%d block entries",
                     (int)t, (int)p->tokens[t], (int)p->pos[t], (int)p->bt_off[t], (int)m->cfg.n_vocab,
                     (int)p->n_bt);
            return SD_ERR_RANGE;
        }
    }
    for (int32_t i = 0; i < p->n_wanted; i++)
        if (p->wanted[i] < 0 || p->wanted[i] >= p->n_tokens || (i > 0 && p->wanted[i] <= p->wanted[i - 1])) {
            SD_ERROR("model: plan wanted row %d is %d (rows must increase inside [0, %d))", (int)i,
                     (int)p->wanted[i], (int)p->n_tokens);
            return SD_ERR_RANGE;
        }
    return SD_OK;
}

sd_status sd_model_forward_plan(sd_model *m, sd_kv *kv, const sd_model_plan *plan) {
    if (!m || !kv || !plan) return SD_ERR_INVALID_ARG;
    if (!m->coll || m->shard.tp_rank == 0) {
        SD_ERROR("model: only a rank > 0 of a group with its collectives runs the leader's plans");
        return SD_ERR_INVALID_ARG;
    }
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (kp->n_layers < m->n_layers_used || kp->n_kv_heads != m->shard.n_kv_heads || kp->head_dim != m->cfg.head_dim) {
        SD_ERROR("model: KV cache shape (%d layers, %d kv heads, head_dim %d) does not fit the shard (%d, %d, %d)",
                 (int)kp->n_layers, (int)kp->n_kv_heads, (int)kp->head_dim, (int)m->n_layers_used,
                 (int)m->shard.n_kv_heads, (int)m->cfg.head_dim);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(check_plan(m, kv, plan));
    SD_TRY(reserve_activations(m, plan->n_tokens));
    sd_status s = run_plan(m, kv, plan, NULL);
    if (s != SD_OK) SD_ERROR("model: rank %d: forward of the leader's plan failed: %s", (int)m->shard.tp_rank,
                             sd_status_str(s));
    return s;
}
