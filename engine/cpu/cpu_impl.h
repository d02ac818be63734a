/* cpu_impl.h — internals shared by the CPU backend's op files.
 *
 * The backend context (a thread pool and per-thread scratch), the op
 * prototypes that backend.c puts into the table, and the one dot-product
 * kernel every reduction uses. Batch invariance rests on that kernel: a dot
 * product of length n is always computed as 8 lanes, lane j accumulating
 * elements j, j+8, j+16, ... with fused multiply-adds in increasing order,
 * the lanes summed by one fixed tree, then the n % 8 tail added one by one.
 * The AVX2 path and the portable path perform exactly these operations
 * (fmaf is the same correctly rounded fused operation as vfmadd), so they
 * agree bit for bit. */
#ifndef SPECD_CPU_IMPL_H
#define SPECD_CPU_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend_impl.h"
#include "cpu/threadpool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SD_CPU_AVX2 1
#else
#define SD_CPU_AVX2 0
#endif

struct sd_backend {
    sd_threadpool *tp;
    int32_t n_threads;
    float *scratch;            /* [n_threads][scratch_per_thread] */
    size_t scratch_per_thread; /* floats */
    void *qbuf;                /* quantized activations of the current stored-weight matmul (qmatmul.c) */
    size_t qbuf_bytes;
    int qpath;          /* sd_cpu_qpath the stored-weight matmul runs (SD_CPU_QPATH_AUTO unless
                  sd_backend_opts.cpu_qpath named one at creation) */
    int32_t *attn_runs; /* attention.c: where each run of the current call starts [attn_runs_cap] */
    size_t attn_runs_cap;
};

/* Runs fn on chunks [0, n_chunks) on the pool, or on the caller alone when
 * the op is too small for threads to pay off (work = rough count of flops or
 * bytes). Results never depend on which: an element's arithmetic is the same
 * whichever chunk or thread computes it. */
void sd_cpu_parallel(sd_backend *be, sd_threadpool_fn fn, void *arg, int64_t n_chunks, size_t work);

/* Makes sure every thread has at least floats of scratch. */
sd_status sd_cpu_scratch_reserve(sd_backend *be, size_t floats);

/* [begin, end) of chunk c when n items are cut into chunks of size. */
static inline void sd_cpu_chunk(size_t n, size_t size, int64_t c, size_t *begin, size_t *end) {
    size_t b = (size_t)c * size, e = b + size;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

/* Sums the 8 lanes in the fixed tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float sd_cpu_hsum8(const float l[8]) {
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

#if SD_CPU_AVX2
/* Same tree as sd_cpu_hsum8 on a vector. */
static inline float sd_cpu_hsum256(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* a0..a3 */
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                 /* b0=a0+a2, b1=a1+a3 */
    __m128 c = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));                             /* b0+b1 */
    return _mm_cvtss_f32(c);
}
#endif

/* The canonical dot product (see the file comment). */
static inline float sd_cpu_dot(const float *a, const float *b, size_t n) {
    size_t n8 = n & ~(size_t)7;
    float s;
#if SD_CPU_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < n8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = sd_cpu_hsum256(acc);
#else
    float l[8] = {0};
    for (size_t i = 0; i < n8; i += 8)
        for (int j = 0; j < 8; j++) l[j] = fmaf(a[i + j], b[i + j], l[j]);
    s = sd_cpu_hsum8(l);
#endif
    for (size_t i = n8; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* ---- ops (signatures as in sd_backend_ops) ---- */
sd_status sd_cpu_embed(sd_backend *be, const float *table, int32_t dim, const int32_t *ids, int32_t n_tokens,
                       float *out);
sd_status sd_cpu_matmul(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n_tokens,
                        float *y);
sd_status sd_cpu_rmsnorm(sd_backend *be, const float *x, const float *weight, int32_t n_tokens, int32_t dim, float eps,
                         float *out);
sd_status sd_cpu_rope(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                      const float *inv_freq);
sd_status sd_cpu_kv_write(sd_backend *be, float *pool, int32_t block_size, int32_t row_width, const float *src,
                          int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off);
sd_status sd_cpu_attention(sd_backend *be, const float *q, const float *k_pool, const float *v_pool, int32_t n_tokens,
                           int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                           const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out);
sd_status sd_cpu_kv_write_f16(sd_backend *be, uint16_t *pool, int32_t block_size, int32_t row_width, const float *src,
                              int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off);
sd_status sd_cpu_attention_f16(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                               int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                               int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                               float scale, float *out);

/* Attention's arithmetic paths (attention.c); all give the same bits. */
typedef enum sd_cpu_attn_path {
    SD_CPU_ATTN_C,      /* the plain C twin, always compiled */
    SD_CPU_ATTN_AVX2,   /* where the build targets AVX2 + FMA */
    SD_CPU_ATTN_AVX512, /* AVX2 plus attention_z.c's 512-bit kernels, where the CPU has AVX-512 F/VL/DQ */
} sd_cpu_attn_path;
/* Whether this build (and, for SD_CPU_ATTN_AVX512, this CPU) has path. */
bool sd_cpu_attn_path_available(sd_cpu_attn_path path);
/* sd_cpu_attention / sd_cpu_attention_f16 (k_pool and v_pool are uint16_t
 * when f16) on a named path, for the tests; SD_ERR_UNSUPPORTED where the
 * build lacks it, SD_ERR_INVALID_ARG for a negative position or a head
 * count that the KV heads do not divide. Not thread-safe (uses be's scratch). */
sd_status sd_cpu_attention_path(sd_backend *be, sd_cpu_attn_path path, const float *q, const void *k_pool,
                                const void *v_pool, bool f16, int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, int32_t block_size, const int32_t *pos, const int32_t *bt,
                                const int32_t *bt_off, float scale, float *out);
/* The exp attention's softmax uses (attention.c), the C twin, for the tests. */
float sd_cpu_attn_exp(float x);
sd_status sd_cpu_swiglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out);
sd_status sd_cpu_add(sd_backend *be, const float *a, const float *b, size_t n, float *out);
/* the ops of architectures beyond Llama (backend_impl.h) */
sd_status sd_cpu_rope_neox(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                           const int32_t *pos, const float *inv_freq);
sd_status sd_cpu_attention_window(sd_backend *be, const float *q, const float *k_pool, const float *v_pool,
                                  int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                  int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                  int32_t window, float scale, float *out);
sd_status sd_cpu_attention_window_f16(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                                      int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                      int32_t block_size, const int32_t *pos, const int32_t *bt,
                                      const int32_t *bt_off, int32_t window, float scale, float *out);
/* Attention for the nodes of a token tree (backend_impl.h's attention_tree):
 * each token is its own run, its keys from base on read along its path. */
sd_status sd_cpu_attention_tree(sd_backend *be, const float *q, const void *k_pool, const void *v_pool, bool f16,
                                int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                const sd_attn_tree *tree, float scale, float *out);
/* The same on a chosen path, with a window (0: none; a tree takes none), for the tests. */
sd_status sd_cpu_attention_tree_path(sd_backend *be, sd_cpu_attn_path path, const float *q, const void *k_pool,
                                     const void *v_pool, bool f16, int32_t n_tokens, int32_t n_heads,
                                     int32_t n_kv_heads, int32_t head_dim, int32_t block_size, const int32_t *pos,
                                     const int32_t *bt, const int32_t *bt_off, int32_t window,
                                     const sd_attn_tree *tree, float scale, float *out);
/* sd_cpu_attention_path with a sliding window (0: none), for the tests. */
sd_status sd_cpu_attention_window_path(sd_backend *be, sd_cpu_attn_path path, const float *q, const void *k_pool,
                                       const void *v_pool, bool f16, int32_t n_tokens, int32_t n_heads,
                                       int32_t n_kv_heads, int32_t head_dim, int32_t block_size, const int32_t *pos,
                                       const int32_t *bt, const int32_t *bt_off, int32_t window, float scale,
                                       float *out);
sd_status sd_cpu_geglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out);
sd_status sd_cpu_add_rows(sd_backend *be, const float *x, const float *bias, int32_t n_rows, int32_t dim, float *out);
sd_status sd_cpu_scale(sd_backend *be, const float *x, size_t n, float s, float *out);

#endif
