/* cuda_impl.h — internals shared by the CUDA backend's files.
 *
 * The backend context (device, one stream, cuBLAS, the device copies of a
 * forward's host arrays, scratch, recorded graphs), the op prototypes that
 * backend.cu puts into the table, and the checking macros. Ops are mirrored
 * by name with engine/cpu/: embed.cu <-> embed.c, and so on; each is tested
 * against its CPU twin in tests/test_cuda_ops.c.
 *
 * Everything a forward does is enqueued on the backend's one stream, in
 * order, and nothing waits for the device except buf_download (the logits
 * the caller reads) and weight/KV set-up. That makes a whole forward
 * recordable as one CUDA graph (backend.cu) and keeps the host ahead of the
 * device: the host's bookkeeping for the next step overlaps this step's
 * kernels.
 *
 * Matrices live in device memory as BF16 (weight_upload converts the f32
 * the loader produces); activations, norms, the embedding table and the KV
 * cache stay f32, and every product accumulates in f32. */
#ifndef SPECD_CUDA_IMPL_H
#define SPECD_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "backend_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host arrays a forward announces (model.c: tokens, pos, bt, bt_off,
 * wanted): one device copy each. */
#define SD_CUDA_MAX_MIRRORS     8
/* Host arrays an op copies itself when they were not announced. */
#define SD_CUDA_MAX_TMP         4
/* Recorded forwards kept (a key per batch shape and KV cache). */
#define SD_CUDA_MAX_GRAPHS      64
/* Keys seen once (recorded the second time they come). */
#define SD_CUDA_MAX_SEEN        256
/* Largest token count the weight-streaming matmul takes in one pass; above
 * it matmul goes through cuBLAS (see matmul.cu). */
#define SD_CUDA_GEMV_MAX_TOKENS 16
/* Blocks per multiprocessor the tensor-core matmul's K split aims at
 * (matmul.cu: 2 measured best of 1, 2, 4, 8 on the 8B shape). */
#define SD_CUDA_MMA_SM_BLOCKS   2
/* Row tiles of one matrix whose K is split over blocks (matmul.cu). */
#define SD_CUDA_MM_COUNTERS     4096

typedef struct sd_cuda_mirror {
    const int32_t *host; /* announced host array (identity only, never read after the copy) */
    size_t n;            /* elements announced */
    int32_t *dev;        /* device copy [cap] */
    size_t cap;
} sd_cuda_mirror;

typedef struct sd_cuda_graph {
    uint64_t key;
    cudaGraphExec_t exec;
    uint64_t last_used;
} sd_cuda_graph;

typedef struct sd_cuda_seen {
    uint64_t key;
    bool never; /* recording this key failed once: always run it op by op */
} sd_cuda_seen;

struct sd_backend {
    int32_t device;
    int32_t n_sm;     /* multiprocessors (sizes the matmul's split) */
    size_t total_mem; /* bytes of device memory */
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws; /* cuBLAS workspace (fixed, so calls are recordable) */
    size_t cublas_ws_bytes;

    sd_cuda_mirror mirrors[SD_CUDA_MAX_MIRRORS];
    int32_t n_mirrors;
    int32_t *staging; /* pinned host [staging_cap]: announced arrays back to back */
    size_t staging_cap;
    cudaEvent_t staging_done; /* recorded after the copies out of staging */
    bool staging_busy;        /* staging_done recorded and not yet waited for */

    int32_t *tmp[SD_CUDA_MAX_TMP]; /* device copies of unannounced host arrays */
    size_t tmp_cap[SD_CUDA_MAX_TMP];
    int32_t tmp_next;

    void *scratch; /* split-K partial sums, BF16 activations for cuBLAS */
    size_t scratch_bytes;
    void *spec_scratch; /* verification: processed rows, sort buffers (spec.cu) */
    size_t spec_scratch_bytes;
    float *convert_buf; /* device staging for weight conversion */
    size_t convert_floats;

    /* recorded forwards */
    bool capturing;
    bool capture_failed; /* an op could not be recorded: run the forward op by op */
    uint64_t capture_key;
    sd_cuda_graph graphs[SD_CUDA_MAX_GRAPHS];
    int32_t n_graphs;
    sd_cuda_seen seen[SD_CUDA_MAX_SEEN];
    int32_t n_seen;
    uint64_t clock; /* launches, for least-recently-used eviction */
    /* what happened to forwards, logged when the backend closes: replayed,
     * recorded (and the host time recording took), run op by op on a
     * shape's first sighting, run op by op for good (cannot be recorded),
     * recordings evicted */
    uint64_t n_replayed, n_recorded, n_first, n_never, n_evicted;
    double record_s;
    double capture_t0;
    /* The switches (sd_backend_opts, from the command line) */
    bool graphs_enabled;   /* --cuda-graphs 0 turns recording off */
    bool mma;              /* --cuda-mma 0 turns the tensor-core streaming matmul off (matmul.cu) */
    int32_t fuse;          /* --cuda-fuse 0: matmul_fused and rope_kv run op by op (for comparison) */
    unsigned *mm_counters; /* [SD_CUDA_MM_COUNTERS] slices finished per row tile, zero between launches */
    /* programmatic dependent launch (--cuda-pdl 1, compute capability
     * 9.0+; see sd_cuda_launch) */
    bool pdl;
    int32_t pdl_prefetch; /* --cuda-pdl-prefetch: weight chunks per warp the matmul prefetches */
    bool after_kernel;    /* the stream's last operation is a kernel sd_cuda_launch enqueued */
};

/* Logs "cuda: <call> failed: <error>" with file and line, returns SD_ERR_CUDA. */
#define CUDA_TRY(call)                                                           \
    do {                                                                         \
        cudaError_t cuda_e_ = (call);                                            \
        if (cuda_e_ != cudaSuccess) {                                            \
            SD_ERROR("cuda: %s failed: %s", #call, cudaGetErrorString(cuda_e_)); \
            return SD_ERR_CUDA;                                                  \
        }                                                                        \
    } while (0)

/* After a kernel launch: a bad configuration shows up here. */
#define CUDA_LAUNCH_CHECK(what)                                                             \
    do {                                                                                    \
        cudaError_t cuda_e_ = cudaGetLastError();                                           \
        if (cuda_e_ != cudaSuccess) {                                                       \
            SD_ERROR("cuda: launching %s failed: %s", (what), cudaGetErrorString(cuda_e_)); \
            return SD_ERR_CUDA;                                                             \
        }                                                                                   \
    } while (0)

#define CUBLAS_TRY(call)                                                              \
    do {                                                                              \
        cublasStatus_t cublas_e_ = (call);                                            \
        if (cublas_e_ != CUBLAS_STATUS_SUCCESS) {                                     \
            SD_ERROR("cuda: %s failed: %s", #call, cublasGetStatusString(cublas_e_)); \
            return SD_ERR_CUDA;                                                       \
        }                                                                             \
    } while (0)

/* The device copy of host array host[n] for an op: the announced mirror
 * when host is one (same pointer, n within what was announced), otherwise a
 * copy made now into a temporary (refused while recording: a recorded copy
 * would replay stale host data). Borrowed; valid until the op's kernels ran. */
sd_status sd_cuda_dev_i32(sd_backend *be, const int32_t *host, size_t n, const int32_t **dev);

/* The device copies of a paged-cache op's host arrays: pos and bt_off
 * [n_tokens], and bt as far as any token's entry reaches (bt_off[t] +
 * pos[t] / block_size). */
sd_status sd_cuda_dev_paging(sd_backend *be, int32_t n_tokens, int32_t block_size, const int32_t *pos,
                             const int32_t *bt, const int32_t *bt_off, const int32_t **d_pos, const int32_t **d_bt,
                             const int32_t **d_off);

/* Makes the scratch buffer at least bytes large (refused while recording
 * when it would have to grow). */
sd_status sd_cuda_scratch(sd_backend *be, size_t bytes, void **out);

/* ---- ops (one file each, named like engine/cpu/) ---- */
sd_status sd_cuda_embed(sd_backend *be, const float *table, int32_t dim, const int32_t *ids, int32_t n_tokens,
                        float *out);
sd_status sd_cuda_matmul(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n_tokens,
                         float *y);
sd_status sd_cuda_matmul_fused(sd_backend *be, const sd_matmul_job *job);
sd_status sd_cuda_rmsnorm(sd_backend *be, const float *x, const float *weight, int32_t n_tokens, int32_t dim, float eps,
                          float *out);
sd_status sd_cuda_rope(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                       const int32_t *pos, const float *inv_freq);
sd_status sd_cuda_rope_kv(sd_backend *be, float *q, float *k, const float *v, int32_t n_tokens, int32_t n_heads,
                          int32_t n_kv_heads, int32_t head_dim, const int32_t *pos, const float *inv_freq,
                          float *k_pool, float *v_pool, int32_t block_size, const int32_t *bt, const int32_t *bt_off);
sd_status sd_cuda_kv_write(sd_backend *be, float *pool, int32_t block_size, int32_t row_width, const float *src,
                           int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off);
sd_status sd_cuda_attention(sd_backend *be, const float *q, const float *k_pool, const float *v_pool, int32_t n_tokens,
                            int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                            const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out);
sd_status sd_cuda_swiglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out);
/* the ops of architectures beyond Llama (backend_impl.h) */
sd_status sd_cuda_rope_neox(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                            const int32_t *pos, const float *inv_freq);
sd_status sd_cuda_attention_window(sd_backend *be, const float *q, const float *k_pool, const float *v_pool,
                                   int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                   int32_t window, float scale, float *out);
sd_status sd_cuda_geglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out);
sd_status sd_cuda_add_rows(sd_backend *be, const float *x, const float *bias, int32_t n_rows, int32_t dim, float *out);
sd_status sd_cuda_scale(sd_backend *be, const float *x, size_t n, float s, float *out);
sd_status sd_cuda_add(sd_backend *be, const float *a, const float *b, size_t n, float *out);

/* Speculative verification next to the logits (spec.cu; backend op spec_verify). */
sd_status sd_cuda_spec_verify(sd_backend *be, const float *logits, int32_t n_vocab, int32_t n_seqs, sd_spec_rows *seqs);

/* Converts f32 device src[n] to BF16 device dst[n] (round to nearest even). */
sd_status sd_cuda_f32_to_bf16(sd_backend *be, const float *src, void *dst, size_t n);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <utility>

/* Programmatic dependent launch (Hopper and later; --cuda-pdl 1).
 *
 * A forward is a chain of ~11 short kernels per layer, and between two of
 * them the GPU idles: the next grid is launched only once the previous one
 * has finished and its blocks drained. With the launch attribute
 * "programmatic stream serialization" the next grid may be launched while
 * the previous one runs. Every forward kernel then follows one rule:
 *
 *   before sd_pdl_wait(), read nothing but the weights (which no kernel
 *   writes) and write nothing; sd_pdl_wait() returns once every earlier
 *   grid of the stream has finished and its writes are visible.
 *
 * Each kernel calls sd_pdl_wait() in every thread before anything else
 * (before any early return, so the chain stays transitive: a grid that has
 * finished implies its predecessors have) and sd_pdl_release() right after,
 * so at most the running grid and the next one are resident. The streaming
 * matmul issues L2 prefetches of its first weight chunks before its wait:
 * the weight stream starts while the previous kernel (a norm, the
 * attention, the SwiGLU) finishes. Without the attribute both calls return
 * at once, and on GPUs before compute capability 9.0 they compile to
 * nothing.
 *
 * Only kernel-after-kernel launches get the attribute: after a copy, a
 * graph launch, cuBLAS or an event the next kernel is launched plainly
 * (after_kernel false), and a backend whose stream was handed to NCCL
 * (backend op `stream`) launches everything plainly. */
__device__ __forceinline__ void sd_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void sd_pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Whether the next sd_cuda_launch gets the programmatic attribute. */
static inline bool sd_cuda_pdl_next(const sd_backend *be) { return be->pdl && be->after_kernel; }

/* Enqueues kernel<<<grid, block, smem, be->stream>>>(args...): a plain
 * launch, or with the programmatic attribute when sd_cuda_pdl_next(be).
 * what names the kernel in the error. */
template <typename... Params, typename... Args>
static inline sd_status sd_cuda_launch(sd_backend *be, const char *what, void (*kernel)(Params...), dim3 grid,
                                       dim3 block, size_t smem, Args &&...args) {
    cudaError_t e;
    if (sd_cuda_pdl_next(be)) {
        cudaLaunchAttribute attr = {};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = be->stream;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    } else {
        kernel<<<grid, block, smem, be->stream>>>(std::forward<Args>(args)...);
        e = cudaSuccess;
    }
    if (e == cudaSuccess) e = cudaGetLastError();
    be->after_kernel = e == cudaSuccess;
    if (e != cudaSuccess) {
        cudaGetLastError();
        SD_ERROR("cuda: launching %s failed: %s", what, cudaGetErrorString(e));
        return SD_ERR_CUDA;
    }
    return SD_OK;
}
#endif
#endif
