/* backend_impl.h — the internal backend interface the model is written against.
 *
 * A backend is a table of function pointers (sd_backend_ops) plus an opaque
 * context (sd_backend). model.c calls only these; it never knows whether the
 * buffers live in host or device memory. The CPU backend (engine/cpu/) is the
 * readable reference and is fast; a CUDA backend implements the same table and
 * is tested op by op against it.
 *
 * Conventions for every op:
 *   - all tensors are f32, row-major, rows contiguous (no strides): a shape
 *     written [a][b] means a rows of b floats;
 *   - a weight matrix W with GGUF ne = [n_in, n_out] is [n_out][n_in]:
 *     y[o] = sum_i W[o*n_in + i] * x[i];
 *   - "buffer" pointers were returned by the same backend's buf_alloc (or are
 *     KV pools handed in by the caller, see attention/kv_write);
 *   - host-side small arrays (positions, block tables) are marked "host";
 *   - every op returns SD_OK or an error (the CPU ops cannot fail);
 *   - batch invariance (CPU): each output element is computed by one fixed
 *     sequence of floating-point operations that depends only on the op's
 *     per-row shape (n_in, head_dim, ...), never on n_tokens, on which tile or
 *     thread a row falls in, or on the thread count.
 *
 * Rejected: a generic tensor/graph abstraction (ggml style). The model is one
 * architecture; plain pointers plus shape arguments keep each op testable
 * against its CUDA mirror with a few lines of setup. */
#ifndef SPECD_BACKEND_IMPL_H
#define SPECD_BACKEND_IMPL_H

#include "specd/common.h"
#include "specd/gguf.h"
#include "specd/sample.h"
#include "specd/spec.h"
#include "specd/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_backend sd_backend;

/* A host int32 array an op will receive (see host_arrays). */
typedef struct sd_host_array {
    const int32_t *data;
    size_t n;
} sd_host_array;

/* Matmuls fused for a backend whose small kernels cost launches (matmul_fused):
 * up to three matrices sharing their input (Q/K/V, gate/up), the input
 * optionally silu(x) * up (the MLP's down projection, reading gate and up
 * without a separate swiglu), the result optionally added to y (the
 * residual). Op by op it is: swiglu(x, up) into x; y[m] = w[m] x, or
 * y[m] += w[m] x. */
typedef struct sd_matmul_job {
    int32_t n_mats;    /* 1..3 */
    const float *w[3]; /* [n_out[m]][n_in], as matmul takes them */
    int32_t n_out[3];
    float *y[3]; /* [n_tokens][n_out[m]], none aliasing x or up */
    int32_t n_in, n_tokens;
    const float *x;  /* [n_tokens][n_in]; may be overwritten when up is set */
    const float *up; /* NULL, or [n_tokens][n_in]: the input is silu(x) * up */
    bool accumulate; /* y[m] += instead of = */
} sd_matmul_job;

/* Where the nodes of a token tree read their keys (attention_tree). */
typedef struct sd_attn_tree {
    int32_t base;            /* logical positions below base are the sequence's own rows */
    const int32_t *path_off; /* [n_tokens] where token t's path starts in path */
    const int32_t *path;     /* storage positions of token t's logical positions base .. pos[t] */
} sd_attn_tree;

typedef struct sd_backend_ops {
    const char *name;
    /* true when buffers are ordinary host memory (the loader may write
     * dequantized weights straight into them) */
    bool host_memory;

    /* Frees the backend and everything it allocated; sets *be = NULL. */
    void (*destroy)(sd_backend **be);

    /* Bytes per element of a matrix as matmul reads it (for bandwidth
     * figures): 4 for f32 weights, 2 for BF16. */
    int32_t weight_elem_bytes;

    /* ---- memory ---- */
    /* Returns a buffer of bytes (64-byte aligned), or NULL. Freed by buf_free. */
    void *(*buf_alloc)(sd_backend *be, size_t bytes);
    void (*buf_free)(sd_backend *be, void *buf);
    /* Copies bytes from host src into buffer dst / from buffer src to host dst. */
    sd_status (*buf_upload)(sd_backend *be, void *dst, const void *src, size_t bytes);
    sd_status (*buf_download)(sd_backend *be, void *dst, const void *src, size_t bytes);

    /* Optional (NULL: matmul weights are plain f32 buffers). Converts a host
     * f32 weight matrix [n_out][n_in] into the backend's own matmul format
     * (e.g. BF16 in device memory) and returns it in *out; matmul's w then
     * receives exactly that pointer. Freed with weight_free. */
    sd_status (*weight_upload)(sd_backend *be, const float *host, int32_t n_out, int32_t n_in, void **out);
    void (*weight_free)(sd_backend *be, void *w);

    /* Optional: free and total bytes of the backend's memory (for clear
     * errors before a large load). */
    sd_status (*mem_info)(sd_backend *be, size_t *free_bytes, size_t *total_bytes);

    /* Optional (NULL: ops run on the host, results in place when they
     * return, as on the CPU): the CUDA stream (cudaStream_t) every op is
     * enqueued on; a NCCL group enqueues its collectives on it too
     * (sd_coll_use_stream), ordered between the ops with no host wait. */
    void *(*stream)(sd_backend *be);

    /* ---- forward-wide hooks (all optional: NULL on the CPU) ---- */
    /* Announces the host int32 arrays (token ids, positions, block tables,
     * their offsets, wanted rows) that the ops of the forward about to run
     * will receive, in a fixed order. A backend whose ops run on another
     * device copies them there once, here; an op that later receives one of
     * these exact pointers reads that copy, any other host pointer is copied
     * by the op itself. The arrays must not change until the forward ends. */
    sd_status (*host_arrays)(sd_backend *be, const sd_host_array *arrays, int32_t n);
    /* Recorded forwards (CUDA graphs). graph_launch replays what was
     * recorded under key (SD_OK) or returns SD_ERR_NOT_FOUND; graph_begin
     * starts recording under key (SD_OK: the ops that follow are recorded,
     * not run, until graph_end) or declines (SD_ERR_NOT_FOUND: run the ops
     * as usual); graph_end(be, ok) finishes a recording, keeps it when ok and
     * launches it. graph_reset forgets every recording (buffers they name
     * were freed or moved). A key names everything that is fixed in a
     * recording: the shapes and every buffer passed to the ops. */
    sd_status (*graph_launch)(sd_backend *be, uint64_t key);
    sd_status (*graph_begin)(sd_backend *be, uint64_t key);
    sd_status (*graph_end)(sd_backend *be, bool ok);
    void (*graph_reset)(sd_backend *be);

    /* Optional: speculative verification next to the logits, so the target
     * distributions never leave the backend. logits: the forward's wanted
     * rows [n_rows][n_vocab] in backend memory. For each sequence: greedy
     * (temperature 0) or stochastic verification with exactly the rules,
     * processing and random keys of sd_spec_verify_greedy / sd_sample_probs
     * + sd_spec_verify (spec.h, sample.c), so the decisions are the CPU's.
     * A sequence whose input is malformed gets its own status; the call
     * fails only when the backend does. */
    sd_status (*spec_verify)(sd_backend *be, const float *logits, int32_t n_vocab, int32_t n_seqs, sd_spec_rows *seqs);

    /* ---- ops ---- */
    /* out[t][:] = table[ids[t]][:] for t < n_tokens.
     * table [n_vocab][dim], ids host [n_tokens] (already range-checked),
     * out [n_tokens][dim]. */
    sd_status (*embed)(sd_backend *be, const float *table, int32_t dim, const int32_t *ids, int32_t n_tokens,
                       float *out);

    /* y[t][o] = sum_i w[o][i] * x[t][i].
     * w [n_out][n_in], x [n_tokens][n_in], y [n_tokens][n_out] (y != x). */
    sd_status (*matmul)(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n_tokens,
                        float *y);

    /* Optional, both or neither (NULL: every matrix is f32 or converted by
     * weight_upload). stored_supports(type): matmul_stored computes on
     * matrices of that GGUF type as stored. matmul_stored: y = w x as
     * matmul, with w [n_out] rows of n_in elements in type's layout (rows of
     * n_in / 32 blocks for the block types; n_in a multiple of 32 then).
     * The integer types quantize x per row to 8 bits first (see
     * cpu/quant_kernels.h): results differ from the f32 matmul on the
     * dequantized matrix by that rounding, and keep batch invariance. */
    bool (*stored_supports)(sd_dtype type);
    sd_status (*matmul_stored)(sd_backend *be, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                               const float *x, int32_t n_tokens, float *y);

    /* Optional (NULL: the model runs the job as separate ops): the job in as
     * few launches as the backend can (see sd_matmul_job). */
    sd_status (*matmul_fused)(sd_backend *be, const sd_matmul_job *job);

    /* out[t][i] = x[t][i] / sqrt(mean_i(x[t][:]^2) + eps) * weight[i].
     * x, out [n_tokens][dim] (may alias), weight [dim]. */
    sd_status (*rmsnorm)(sd_backend *be, const float *x, const float *weight, int32_t n_tokens, int32_t dim, float eps,
                         float *out);

    /* In place "normal" (adjacent-pair) rotary embedding: for every token t,
     * head h and pair i < head_dim/2, (x[2i], x[2i+1]) of that head rotates by
     * theta = pos[t] * inv_freq[i], theta computed in double.
     * x [n_tokens][n_heads*head_dim], pos host [n_tokens], inv_freq [head_dim/2]. */
    sd_status (*rope)(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                      const float *inv_freq);

    /* Writes each token's row into a paged pool: row src[t] goes to slot
     * pos[t] of its sequence, i.e. pool + (bt[bt_off[t] + pos[t]/block_size]
     * * block_size + pos[t] % block_size) * row_width.
     * pool [n_blocks][block_size][row_width], src [n_tokens][row_width],
     * pos, bt, bt_off host. */
    sd_status (*kv_write)(sd_backend *be, float *pool, int32_t block_size, int32_t row_width, const float *src,
                          int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off);

    /* Optional (NULL: the four ops one by one): what the attention block
     * does between the Q/K/V projections and attention, in one launch:
     * rope(q, n_heads) and rope(k, n_kv_heads) in place, then
     * kv_write(k_pool, k) and kv_write(v_pool, v), all with the same pos, bt
     * and bt_off. */
    sd_status (*rope_kv)(sd_backend *be, float *q, float *k, const float *v, int32_t n_tokens, int32_t n_heads,
                         int32_t n_kv_heads, int32_t head_dim, const int32_t *pos, const float *inv_freq, float *k_pool,
                         float *v_pool, int32_t block_size, const int32_t *bt, const int32_t *bt_off);

    /* Causal attention over the paged cache. Token t, query head h attends to
     * positions 0..pos[t] of its own sequence (block table bt + bt_off[t]),
     * kv head h / (n_heads / n_kv_heads):
     *   s[p] = dot(q[t][h], k[p][kvh]) * scale; w = softmax(s) (max-subtracted);
     *   out[t][h] = sum_p w[p] * v[p][kvh].
     * q, out [n_tokens][n_heads*head_dim]; k_pool, v_pool
     * [n_blocks][block_size][n_kv_heads][head_dim]; pos, bt, bt_off host. */
    sd_status (*attention)(sd_backend *be, const float *q, const float *k_pool, const float *v_pool, int32_t n_tokens,
                           int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                           const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out);

    /* Optional (NULL: the backend keeps an f32 cache only): kv_write and
     * attention over an f16 cache, pools of uint16_t halves; each value is
     * rounded once when written (to nearest, ties to even) and widened
     * exactly when read, the arithmetic otherwise that of the f32 ops. */
    sd_status (*kv_write_f16)(sd_backend *be, uint16_t *pool, int32_t block_size, int32_t row_width, const float *src,
                              int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off);
    sd_status (*attention_f16)(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                               int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                               int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                               float scale, float *out);

    /* out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i].
     * gate, up, out [n] (out may alias gate or up). */
    sd_status (*swiglu)(sd_backend *be, const float *gate, const float *up, size_t n, float *out);

    /* out[i] = a[i] + b[i]; out may alias a or b. [n] each. */
    sd_status (*add)(sd_backend *be, const float *a, const float *b, size_t n, float *out);

    /* ---- the ops of architectures beyond Llama (optional: NULL refuses a
     * model that needs one at load, naming it) ---- */
    /* In place "NeoX" rotary embedding (Qwen2/3, Gemma 3): for every token,
     * head and i < head_dim/2, the pair (x[i], x[i + head_dim/2]) rotates by
     * theta = pos[t] * inv_freq[i], as rope otherwise. */
    sd_status (*rope_neox)(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                           const int32_t *pos, const float *inv_freq);

    /* attention / attention_f16 with a sliding window: token t attends to
     * positions max(0, pos[t] - window + 1) .. pos[t] only (window >= 1;
     * the earlier positions weigh exactly 0 and their blocks must still be
     * in the table). The arithmetic of each kept position is that of
     * attention. */
    sd_status (*attention_window)(sd_backend *be, const float *q, const float *k_pool, const float *v_pool,
                                  int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                  int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                  int32_t window, float scale, float *out);
    sd_status (*attention_window_f16)(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                                      int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                      int32_t block_size, const int32_t *pos, const int32_t *bt,
                                      const int32_t *bt_off, int32_t window, float scale, float *out);

    /* Optional (NULL: the backend verifies no token trees; model_tree.c
     * refuses them): attention for the nodes of a token tree. Token t sits
     * at logical position pos[t] (RoPE's) but its K/V row was written at a
     * storage position of its own (the tree's nodes one after another).
     * It attends to the logical positions 0..pos[t]: those below tree->base
     * are the sequence's own rows, read in place; logical position j >=
     * base is read from storage position tree->path[tree->path_off[t] + j -
     * base] (its ancestors', then its own). The arithmetic of each (token,
     * head) is attention's over the same keys in the same order, so a node's
     * output equals, bit for bit, what the same path run as a chain gives.
     * k_pool / v_pool are float, or uint16_t halves with f16. */
    sd_status (*attention_tree)(sd_backend *be, const float *q, const void *k_pool, const void *v_pool, bool f16,
                                int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                const struct sd_attn_tree *tree, float scale, float *out);

    /* out[i] = gelu(gate[i]) * up[i], gelu the tanh form:
     * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). Aliasing as swiglu. */
    sd_status (*geglu)(sd_backend *be, const float *gate, const float *up, size_t n, float *out);

    /* out[t][i] = x[t][i] + bias[i] (Q/K/V biases). x, out [n_rows][dim]
     * (may alias), bias [dim]. */
    sd_status (*add_rows)(sd_backend *be, const float *x, const float *bias, int32_t n_rows, int32_t dim, float *out);

    /* out[i] = x[i] * s (Gemma's embedding scale); out may alias x. */
    sd_status (*scale)(sd_backend *be, const float *x, size_t n, float s, float *out);
} sd_backend_ops;

/* A backend instance: its op table and its context. */
typedef struct sd_backend_handle {
    const sd_backend_ops *ops;
    sd_backend *ctx;
} sd_backend_handle;

/* Creates the backend for device (-1 = CPU with n_threads workers, N >= 0 =
 * CUDA device N; SD_ERR_UNSUPPORTED with a log line in a build without
 * CUDA, SD_ERR_CUDA when the device cannot be used) with the switches in
 * *opts (NULL = sd_backend_default_opts()). */
sd_status sd_backend_create(int32_t device, int32_t n_threads, const sd_backend_opts *opts, sd_backend_handle *out);

/* Creates the CUDA backend on device (engine/cuda/, built when nvcc is
 * found): with the default switches, or with *opts. */
sd_status sd_cuda_backend_create(int32_t device, sd_backend_handle *out);
sd_status sd_cuda_backend_create_opts(int32_t device, const sd_backend_opts *opts, sd_backend_handle *out);

/* Creates the CPU backend with n_threads workers (0 = every online core):
 * with the default switches, or with *opts (cpu_qpath).
 * On success fills *out; the caller destroys it with out->ops->destroy(&out->ctx). */
sd_status sd_cpu_backend_create(int32_t n_threads, sd_backend_handle *out);
sd_status sd_cpu_backend_create_opts(int32_t n_threads, const sd_backend_opts *opts, sd_backend_handle *out);

#ifdef __cplusplus
}
#endif
#endif
