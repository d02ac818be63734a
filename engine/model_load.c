/* model_load.c — a model (Llama, and what model_arch.c adds for the other
 * architectures): loading, tensor-parallel sharding, views,
 * and the KV pools sized for it (the forward pass is model_forward.c).
 *
 * Matrices stay as the file stores them (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1 and the K-quants) on a
 * backend that computes on them (the CPU: ops->matmul_stored, see
 * cpu/quant_kernels.h), so a step streams the file's bytes, not their f32
 * expansion; the embedding table too, its looked-up rows dequantized on the
 * host per step. Other types, and every matrix on a backend without
 * matmul_stored (CUDA: BF16 through weight_upload), are read as f32. The
 * stored bytes are copied out of the mapping into the backend's buffers
 * (huge pages on the CPU): the model does not keep the file mapped, so it
 * may outlive its weights source. Rejected for now: pointing into the
 * mapping (pages shared between processes) — the source would have to live
 * as long as the model and every caller closes it after loading.
 *
 * The integer formats round each matmul's input to 8 bits, a discontinuous
 * step: a tensor-parallel group, whose all-reduce sums partial results in
 * another order than one rank does (~1e-7 apart), can round an activation
 * to the other side and drift from TP = 1 by a quantum, so on those formats
 * TP is close to TP = 1, not equal to it (greedy text can part).
 * SD_CPU_WEIGHTS_F32 (--cpu-weights f32) reads every matrix as f32 (the
 * earlier behaviour, 4 bytes per weight): TP then equals TP = 1 as before,
 * which the TP integration tests on SmolLM2 rely on.
 *
 * Matrices kept as stored are not copied where they can be used in place:
 * whole rows of a tensor in a mapped GGUF file (every matrix at TP = 1, the
 * row-split ones of a TP rank) point into the file's mapping, which the
 * model holds a reference to (sd_weights_map_stored). Resident memory is
 * then about the file, and processes mapping one file (a verifier and a
 * drafter on one model) share its pages. The mapping's page size is the
 * page cache's: 2 MiB folios for a file read from disk (ext4, Linux 6.18),
 * 4 KiB for one written recently or read ahead by the MADV_WILLNEED below
 * (bench/results/quant-cpu.md, bw2); the copies ask for huge pages
 * (cpu/backend.c). SD_CPU_WEIGHTS_COPY (--cpu-weights copy) copies
 * the stored matrices as before, for comparison (bench/results/quant-cpu.md).
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
#include "model_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "specd/weights.h"

sd_model_params sd_model_default_params(void) {
    sd_model_params p = {.n_threads = 0,
                         .n_layers_used = 0,
                         .device = -1,
                         .tp_rank = 0,
                         .tp_size = 1,
                         .tp_lm_head = SD_TP_LM_HEAD_SPLIT,
                         .coll = NULL,
                         .kv_type = SD_DTYPE_F32,
                         .max_ctx = 0,
                         .backend = sd_backend_default_opts()};
    return p;
}

bool sd_kv_type_parse(const char *name, sd_dtype *type) {
    if (!name || !type) return false;
    if (strcmp(name, "f32") == 0) {
        *type = SD_DTYPE_F32;
        return true;
    }
    if (strcmp(name, "f16") == 0) {
        *type = SD_DTYPE_F16;
        return true;
    }
    return false;
}

/* A rectangle of a 2-D weight [rows][cols]: what a tensor-parallel rank
 * loads. */
typedef struct slice {
    int64_t row0, n_rows, col0, n_cols;
} slice;

/* Checks that tensor name is [rows][cols] (1-D when rows == 0) and that r
 * lies inside it on whole blocks of its type; *t_out gets its info. */
static sd_status find_slice(sd_model *m, const sd_weights *w, const char *name, int64_t rows, int64_t cols, slice r,
                            sd_weights_tensor *t_out) {
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
    if (t_out) *t_out = t;
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
    return SD_OK;
}

/* Reads the rectangle r of tensor name, which must be [rows][cols] as a
 * whole (1-D when rows == 0; r is then the whole vector), as f32 into a new
 * backend buffer: only those bytes of the mapped file are touched. A matrix
 * goes through the backend's weight_upload when it has one (its own matmul
 * format); *out is then that opaque weight, which only matmul reads. */
static sd_status load_slice(sd_model *m, const sd_weights *w, const char *name, int64_t rows, int64_t cols, slice r,
                            bool matrix, float **out) {
    sd_weights_tensor t;
    SD_TRY(find_slice(m, w, name, rows, cols, r, &t));
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
        if (s == SD_ERR_NOMEM)
            SD_ERROR("model: out of %s memory loading %s (%zu bytes as f32)", ops->name, name, bytes);
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

/* True when the backend computes on matrices of type as stored. */
static bool keeps_stored(const sd_model *m, sd_dtype type) {
    const sd_backend_ops *ops = m->be.ops;
    return type != SD_DTYPE_F32 && !m->f32_matrices && ops->host_memory && ops->matmul_stored && ops->stored_supports &&
           ops->stored_supports(type);
}

/* Points out at the slice r of name inside the file mapping (whole rows
 * only); SD_ERR_UNSUPPORTED when the source cannot, and the caller copies. */
static sd_status map_matrix(sd_model *m, const sd_weights *w, const char *name, slice r, sd_dtype type, size_t bytes,
                            sd_mat *out) {
    const void *ptr = NULL;
    sd_file_map *keep = NULL;
    sd_status s = sd_weights_map_stored(w, name, r.row0, r.n_rows, r.col0, r.n_cols, &ptr, &keep);
    if (s != SD_OK) {
        if (s != SD_ERR_UNSUPPORTED)
            SD_ERROR("model: cannot read %s (%s, %s)", name, sd_dtype_name(type), sd_status_str(s));
        return s;
    }
    int i = 0;
    while (i < m->n_maps && m->maps[i] != keep) i++;
    if (i < m->n_maps) {
        sd_file_map_release(&keep); /* held already */
    } else if (m->n_maps == SD_MODEL_MAX_MAPS) {
        sd_file_map_release(&keep);
        return SD_ERR_UNSUPPORTED;
    } else {
        m->maps[m->n_maps++] = keep;
    }
    madvise((void *)((uintptr_t)ptr & ~(uintptr_t)4095), bytes + ((uintptr_t)ptr & 4095), MADV_WILLNEED);
    out->w = (void *)ptr;
    out->type = type;
    out->mapped = true;
    m->weight_bytes += bytes;
    m->resident_bytes += bytes;
    m->mapped_bytes += bytes;
    return SD_OK;
}

/* The slice r of matrix name [rows][cols]: as stored when keeps_stored
 * (r's columns are whole blocks: find_slice refuses anything else), else as
 * f32 / the backend's weight_upload format (load_slice). */
static sd_status load_matrix(sd_model *m, const sd_weights *w, const char *name, int64_t rows, int64_t cols, slice r,
                             sd_mat *out) {
    sd_weights_tensor t;
    SD_TRY(find_slice(m, w, name, rows, cols, r, &t));
    size_t be, bb, bytes;
    if (keeps_stored(m, t.type) && sd_dtype_block(t.type, &be, &bb)) {
        if (!sd_mul_ok((size_t)r.n_rows, (size_t)r.n_cols / be * bb, &bytes)) return SD_ERR_NOMEM;
        sd_status ms = m->copy_matrices ? SD_ERR_UNSUPPORTED : map_matrix(m, w, name, r, t.type, bytes, out);
        if (ms != SD_ERR_UNSUPPORTED) return ms;
        void *buf = m->be.ops->buf_alloc(m->be.ctx, bytes);
        if (!buf) {
            SD_ERROR("model: cannot allocate %zu bytes for %s (%s)", bytes, name, sd_dtype_name(t.type));
            return SD_ERR_NOMEM;
        }
        sd_status s = sd_weights_read_stored(w, name, r.row0, r.n_rows, r.col0, r.n_cols, buf, bytes);
        if (s == SD_OK) {
            out->w = buf;
            out->type = t.type;
            m->weight_bytes += bytes;
            m->resident_bytes += bytes;
            return SD_OK;
        }
        m->be.ops->buf_free(m->be.ctx, buf);
        if (s != SD_ERR_UNSUPPORTED) {
            SD_ERROR("model: cannot read %s (%s, %s)", name, sd_dtype_name(t.type), sd_status_str(s));
            return s;
        }
        /* a source without stored reads: f32 below */
    }
    float *f = NULL;
    SD_TRY(load_slice(m, w, name, rows, cols, r, true, &f));
    out->w = f;
    out->type = SD_DTYPE_F32;
    return SD_OK;
}

static void free_matrix(sd_model *m, sd_mat *mat) {
    if (mat->mapped)
        ; /* the mapping is released with the model */
    else if (mat->type == SD_DTYPE_F32)
        free_tensor(m, mat->w, true);
    else if (mat->w)
        m->be.ops->buf_free(m->be.ctx, mat->w);
    mat->w = NULL;
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

/* A 1-D tensor of n values, or its slice [col0, col0 + n_cols) (a TP
 * rank's biases), as f32 (sd_model_vec_loader). */
static sd_status load_vec(sd_model *m, const sd_weights *w, const char *name, int64_t n, int64_t col0, int64_t n_cols,
                          float **out) {
    slice r = {0, 1, col0, n_cols};
    return load_slice(m, w, name, 0, n, r, false, out);
}

static sd_status load_weights(sd_model *m, const sd_weights *w) {
    const sd_model_config *c = &m->cfg;
    const sd_model_shard *sh = &m->shard;
    int64_t E = c->n_embd, V = c->n_vocab, F = c->n_ff, D = c->head_dim;
    int64_t QD = (int64_t)c->n_heads * D, KD = (int64_t)c->n_kv_heads * D;
    /* the embedding table: as stored where the backend computes on its
     * type (the forward dequantizes the looked-up rows), else f32. A step
     * reads one row per token: it is not counted as streamed (unless it is
     * also the LM head, counted just below) */
    uint64_t before = m->weight_bytes;
    sd_weights_tensor te;
    if (sd_weights_find(w, "token_embd.weight", &te) && keeps_stored(m, te.type)) {
        slice all = {0, V, 0, E};
        SD_TRY(load_matrix(m, w, "token_embd.weight", V, E, all, &m->tok_embd));
    } else {
        float *f = NULL;
        SD_TRY(load_tensor(m, w, "token_embd.weight", V, E, false, &f));
        m->tok_embd.w = f;
        m->tok_embd.type = SD_DTYPE_F32;
    }
    m->weight_bytes = before;
    SD_TRY(load_tensor(m, w, "output_norm.weight", 0, E, false, &m->output_norm));
    /* this rank's LM head rows. Tied: they are rows of the embedding table,
     * unless the backend keeps f32 matrices in a format of its own (then it
     * gets its own copy) */
    if (sh->n_vocab > 0 && c->tied_output && (m->tok_embd.type != SD_DTYPE_F32 || !m->be.ops->weight_upload)) {
        size_t be = 1, bb = 4;
        sd_dtype_block(m->tok_embd.type, &be, &bb);
        size_t row_bytes = (size_t)E / be * bb;
        m->output.w = (unsigned char *)m->tok_embd.w + (size_t)sh->vocab0 * row_bytes;
        m->output.type = m->tok_embd.type;
        m->output_borrowed = true;
        m->weight_bytes += (uint64_t)sh->n_vocab * (uint64_t)row_bytes;
    } else if (sh->n_vocab > 0) {
        slice head = {sh->vocab0, sh->n_vocab, 0, E};
        SD_TRY(load_matrix(m, w, c->tied_output ? "token_embd.weight" : "output.weight", V, E, head, &m->output));
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
        uint64_t layer_start = m->weight_bytes;
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", (int)l);
        SD_TRY(load_slice(m, w, name, 0, E, norm, false, &L->attn_norm));
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", (int)l);
        SD_TRY(load_slice(m, w, name, 0, E, norm, false, &L->ffn_norm));
        /* phi3's fused matrices: Q, K, V (and gate, up) are row ranges of one
         * tensor, each loaded (or mapped) as a matrix of its own */
        const bool fq = c->fused_qkv, fu = c->fused_gate_up;
        const int64_t QKV = QD + 2 * KD;
        const slice k_rows = {kv.row0 + (fq ? QD : 0), kv.n_rows, 0, E};
        const slice v_rows = {kv.row0 + (fq ? QD + KD : 0), kv.n_rows, 0, E};
        const slice up_rows = {up.row0 + (fu ? F : 0), up.n_rows, 0, E};
        struct {
            const char *suffix;
            int64_t rows, cols;
            slice part;
            sd_mat *dst;
        } const parts[] = {
            {fq ? "attn_qkv" : "attn_q", fq ? QKV : QD, E, q, &L->wq},
            {fq ? "attn_qkv" : "attn_k", fq ? QKV : KD, E, k_rows, &L->wk},
            {fq ? "attn_qkv" : "attn_v", fq ? QKV : KD, E, v_rows, &L->wv},
            {"attn_output", E, QD, o, &L->wo},
            {fu ? "ffn_up" : "ffn_gate", fu ? 2 * F : F, E, up, &L->w_gate},
            {"ffn_up", fu ? 2 * F : F, E, up_rows, &L->w_up},
            {"ffn_down", E, F, down, &L->w_down},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, parts[i].suffix);
            SD_TRY(load_matrix(m, w, name, parts[i].rows, parts[i].cols, parts[i].part, parts[i].dst));
        }
        SD_TRY(sd_model_load_arch_layer(m, w, l, load_vec));
        L->bytes = m->weight_bytes - layer_start;
    }
    return sd_model_load_freqs(m, w); /* small: computed on the host, then uploaded */
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
    if (params.n_threads < 0 || params.n_layers_used < 0 || params.max_ctx < 0) {
        SD_ERROR("model: n_threads (%d), n_layers_used (%d) and max_ctx (%d) must be >= 0", (int)params.n_threads,
                 (int)params.n_layers_used, (int)params.max_ctx);
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
        s = m->layers ? sd_backend_create(params.device, params.n_threads, &params.backend, &m->be) : SD_ERR_NOMEM;
    }
    m->f32_matrices = params.backend.cpu_weights == SD_CPU_WEIGHTS_F32;
    m->copy_matrices = params.backend.cpu_weights == SD_CPU_WEIGHTS_COPY;
    m->host_verify = params.backend.host_verify;
    if (s == SD_OK) s = sd_model_arch_check_ops(m);
    if (s == SD_OK) s = check_memory(m);
    if (s == SD_OK) s = load_weights(m, w);
    if (s == SD_OK && params.coll) s = sd_model_set_coll(m, params.coll);
    if (s != SD_OK) {
        sd_model_free(&m);
        return s;
    }
    SD_INFO("model: %s, %d/%d layers, n_embd %d, n_ff %d, heads %d/%d, head_dim %d, vocab %d, %.1f MB of "
            "weights streamed per step (%s matrices), backend %s",
            m->cfg.arch, (int)m->n_layers_used, (int)m->cfg.n_layers, (int)m->cfg.n_embd, (int)m->cfg.n_ff, (int)m->cfg.n_heads,
            (int)m->cfg.n_kv_heads, (int)m->cfg.head_dim, (int)m->cfg.n_vocab, (double)m->weight_bytes / 1e6,
            m->layers[0].wq.type != SD_DTYPE_F32 ? sd_dtype_name(m->layers[0].wq.type)
            : m->be.ops->weight_elem_bytes == 2  ? "BF16"
                                                 : "f32",
            m->be.ops->name);
    if (m->shard.tp_size > 1)
        SD_INFO("model: tensor-parallel rank %d of %d: heads %d..%d, KV heads %d..%d, MLP columns %d..%d, LM head "
                "%s; %.1f MB of weights held",
                (int)m->shard.tp_rank, (int)m->shard.tp_size, (int)m->shard.head0,
                (int)(m->shard.head0 + m->shard.n_heads - 1), (int)m->shard.kv_head0,
                (int)(m->shard.kv_head0 + m->shard.n_kv_heads - 1), (int)m->shard.ff0,
                (int)(m->shard.ff0 + m->shard.n_ff - 1),
                m->shard.n_vocab == 0                      ? "none (on the leader)"
                : m->shard.lm_head == SD_TP_LM_HEAD_LEADER ? "whole (leader)"
                                                           : "split by vocabulary",
                (double)m->resident_bytes / 1e6);
    *out = m;
    return SD_OK;
}

void sd_model_free(sd_model **pm) {
    if (!pm || !*pm) return;
    sd_model *m = *pm;
    sd_model_capture_free(m);
    if (m->be.ops && m->parent) {
        sd_model_free_activations(m); /* a view owns its activations and backend, not the weights */
        m->be.ops->destroy(&m->be.ctx);
    } else if (m->be.ops) {
        const sd_backend_ops *ops = m->be.ops;
        sd_model_free_activations(m);
        if (!m->output_borrowed) free_matrix(m, &m->output);
        if (m->tok_embd.mapped)
            ; /* in the mapping */
        else if (m->tok_embd.type == SD_DTYPE_F32 && m->tok_embd.w)
            ops->buf_free(m->be.ctx, m->tok_embd.w);
        else
            free_matrix(m, &m->tok_embd);
        if (m->output_norm) ops->buf_free(m->be.ctx, m->output_norm);
        if (m->inv_freq) ops->buf_free(m->be.ctx, m->inv_freq);
        if (m->inv_freq_swa) ops->buf_free(m->be.ctx, m->inv_freq_swa);
        for (int32_t l = 0; m->layers && l < m->n_layers_used; l++) {
            layer_weights *L = &m->layers[l];
            free_tensor(m, L->attn_norm, false);
            free_tensor(m, L->ffn_norm, false);
            sd_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) free_matrix(m, mats[i]);
            sd_model_free_arch_layer(m, L);
        }
        ops->destroy(&m->be.ctx);
    }
    if (!m->parent) free(m->layers);
    for (int i = 0; !m->parent && i < m->n_maps; i++) sd_file_map_release(&m->maps[i]);
    batch_plan *pl = &m->plan;
    free(pl->seq_start);
    free(pl->seq_next);
    free(pl->seq_bt);
    free(pl->seq_order);
    free(pl->bt_off);
    free(pl->wanted);
    free(pl->bt);
    free(pl->bt_win);
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
    v->inv_freq_swa = m->inv_freq_swa;
    v->layers = m->layers;
    v->shard = m->shard;
    v->output_borrowed = true;
    /* what a step streams, as load counts it: the first n_layers layers,
     * the LM head and the final norm */
    uint64_t layers = 0;
    for (int32_t l = 0; l < m->n_layers_used; l++) layers += m->layers[l].bytes;
    v->weight_bytes = m->weight_bytes - layers;
    for (int32_t l = 0; l < n_layers; l++) v->weight_bytes += m->layers[l].bytes;
    /* a backend instance of its own on the same device: device buffers are
     * shared by every stream of the process */
    sd_status s = sd_backend_create(m->params.device, m->params.n_threads, &m->params.backend, &v->be);
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

uint64_t sd_model_mapped_bytes(const sd_model *m) { return m ? (m->parent ? m->parent : m)->mapped_bytes : 0; }

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

/* window_blocks: sd_model_window_params's. */
static sd_status kv_create(const sd_model *m, int32_t max_seqs, int32_t n_blocks, int32_t block_size,
                           int32_t window_blocks, sd_kv **out) {
    if (!m || !out) return SD_ERR_INVALID_ARG;
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = m->n_layers_used;
    p.n_kv_heads = m->shard.n_kv_heads; /* this rank's heads only */
    p.head_dim = m->cfg.head_dim;
    if (block_size) p.block_size = block_size;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    p.type = m->params.kv_type;
    /* The prefix cache's identity (kv_prefix.c): a cache belongs to one
     * model, so its shape and this rank's slice of the KV heads suffice. */
    const int32_t ident[] = {m->cfg.n_vocab,   m->cfg.n_embd,    m->n_layers_used,  m->cfg.n_heads,
                             m->shard.tp_rank, m->shard.tp_size, m->shard.kv_head0, m->shard.n_kv_heads};
    uint64_t salt = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof ident / sizeof ident[0]; i++) salt = (salt ^ (uint32_t)ident[i]) * 1099511628211ull;
    p.prefix_salt = salt;
    bool windowed[SD_MODEL_MAX_LAYERS] = {false};
    sd_model_window_params(m, &p, windowed, window_blocks); /* model_window.c: the sliding window's group */
    const sd_backend_ops *ops = m->be.ops;
    if (p.type == SD_DTYPE_F16 && (!ops->kv_write_f16 || !ops->attention_f16)) {
        SD_ERROR("model: the %s backend keeps an f32 KV cache only (--kv-type f32)", ops->name);
        return SD_ERR_UNSUPPORTED;
    }
    if (p.type != SD_DTYPE_F32 && p.type != SD_DTYPE_F16) {
        SD_ERROR("model: a KV cache holds f32 or f16, not %s", sd_dtype_name(p.type));
        return SD_ERR_INVALID_ARG;
    }
    if (!ops->host_memory) {
        p.pool_alloc = kv_pool_alloc;
        p.pool_free = kv_pool_free;
        p.pool_ctx = (void *)&m->be;
        size_t free_b = 0, total_b = 0;
        double need = 0; /* every layer's K and V pools, f32 (the device keeps no f16 cache) */
        for (int32_t l = 0; l < p.n_layers; l++)
            need += 2.0 * (windowed[l] ? p.window_blocks : n_blocks) * (double)p.block_size * p.n_kv_heads * p.head_dim * 4;
        if (n_blocks > 0 && ops->mem_info && ops->mem_info(m->be.ctx, &free_b, &total_b) == SD_OK &&
            need > (double)free_b) {
            SD_ERROR("model: a KV cache of %d blocks x %d tokens needs %.2f GiB of %s memory, but only %.2f GiB of "
                     "%.2f GiB are free (fewer blocks or sequences would fit)",
                     (int)n_blocks, (int)p.block_size, need / 1073741824.0, ops->name, (double)free_b / 1073741824.0,
                     (double)total_b / 1073741824.0);
            return SD_ERR_NOMEM;
        }
    }
    return sd_kv_create(&p, out);
}

sd_status sd_model_kv_create(const sd_model *m, int32_t max_seqs, int32_t n_blocks, int32_t block_size, sd_kv **out) {
    return kv_create(m, max_seqs, n_blocks, block_size, -1, out);
}

sd_status sd_model_kv_create_rank(const sd_model *m, int32_t n_blocks, int32_t block_size, int32_t window_blocks,
                                  sd_kv **out) {
    if (window_blocks < 0 || (window_blocks > 0 && (!m || m->cfg.sliding_window <= 0))) {
        SD_ERROR("model: a window pool of %d blocks for a model %s", (int)window_blocks,
                 window_blocks < 0 ? "(negative)" : "without a sliding window");
        return SD_ERR_INVALID_ARG;
    }
    return kv_create(m, 1, n_blocks, block_size, window_blocks, out);
}
