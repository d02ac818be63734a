/* matmul.c — y[t][o] = sum_i w[o][i] * x[t][i], the op that carries the time.
 *
 * Decode streams every weight once per token, so the kernel must run at
 * memory bandwidth; verifying K drafted tokens must cost little more than one,
 * so each weight row, once loaded, is applied to every token of the call:
 * threads claim chunks of ROW_CHUNK output rows; within a chunk the kernel
 * walks R rows x T tokens tiles (R*T vector accumulators in registers, T up
 * to 8), so up to 8 tokens share one pass over each weight row and longer
 * batches reread a row from L1. Tokens are taken in blocks of TOK_BLOCK so
 * the activations of a block stay in L2 during long prefills.
 *
 * Batch invariance: every (t, o) element has its own accumulator and is
 * computed exactly like sd_cpu_dot (8 lanes, FMA in increasing i, fixed lane
 * tree, fused tail). The tile shape only decides which elements are computed
 * side by side, never how, so the result does not depend on n_tokens, tile
 * position or thread count. Rejected: splitting the reduction over i across
 * threads or accumulators chosen by tile size (faster at batch 1 for tiny
 * matrices, but the sum order would change with the batch). */
#include "cpu/cpu_impl.h"

/* ROW_CHUNK: output rows per pool chunk (a multiple of 3 and 4, ~100 KB of
 * weights at n_in 576: long sequential streams, yet enough chunks for
 * dynamic balancing). */
enum { MAX_R = 4, MAX_T = 8, TOK_BLOCK = 64, ROW_CHUNK = 48, PREFETCH_FLOATS = 2048 };

typedef struct matmul_args {
    const float *w;
    const float *x;
    float *y;
    size_t n_in, n_out, n_tokens;
} matmul_args;

/* One R x T tile: rows w[0..R), tokens x[0..T), writes y[t*n_out + r].
 * Inlined with constant R and T so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(const float *w, const float *x, float *y, size_t n_in,
                                                       size_t n_out, const int R, const int T) {
    size_t n8 = n_in & ~(size_t)7;
#if SD_CPU_AVX2
    __m256 acc[MAX_R][MAX_T];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t i = 0; i < n8; i += 8) {
        if ((i & 15) == 0) {
            /* the weights are streamed once from DRAM: ask for them 8 KB
             * ahead, once per 64-byte line (page-crossing streams defeat the
             * hardware prefetcher; measured +25% at batch 1). Prefetches
             * never fault. */
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                _mm_prefetch((const char *)(w + (size_t)r * n_in + i + PREFETCH_FLOATS), _MM_HINT_T0);
        }
        __m256 wv[MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + (size_t)r * n_in + i);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * n_in + i);
            /* keep xv in a register: otherwise GCC folds the load into
             * each of the R FMAs, R times the load traffic */
            __asm__("" : "+x"(xv));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float *wr = w + (size_t)r * n_in, *xt = x + (size_t)t * n_in;
            float s = sd_cpu_hsum256(acc[r][t]);
            for (size_t i = n8; i < n_in; i++) s = fmaf(wr[i], xt[i], s);
            y[(size_t)t * n_out + (size_t)r] = s;
        }
#else
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            y[(size_t)t * n_out + (size_t)r] = sd_cpu_dot(w + (size_t)r * n_in, x + (size_t)t * n_in, n_in);
    (void)n8;
#endif
}

/* macro-generated tiles, laid out by hand: clang-format cannot read them */
// clang-format off
#define TILE_FN(R, T)                                                                          \
    static void tile_##R##_##T(const float *w, const float *x, float *y, size_t n_in, size_t n_out) { \
        tile(w, x, y, n_in, n_out, R, T);                                                      \
    }
#define TILE_ROW(R) TILE_FN(R, 1) TILE_FN(R, 2) TILE_FN(R, 3) TILE_FN(R, 4) TILE_FN(R, 5) TILE_FN(R, 6) TILE_FN(R, 7) TILE_FN(R, 8)
TILE_ROW(1) TILE_ROW(2) TILE_ROW(3) TILE_ROW(4)

typedef void (*tile_fn)(const float *w, const float *x, float *y, size_t n_in, size_t n_out);
static const tile_fn tiles[MAX_R][MAX_T] = {
#define TILE_PTRS(R) {tile_##R##_1, tile_##R##_2, tile_##R##_3, tile_##R##_4, tile_##R##_5, tile_##R##_6, tile_##R##_7, tile_##R##_8}
    TILE_PTRS(1), TILE_PTRS(2), TILE_PTRS(3), TILE_PTRS(4),
};
// clang-format on

static void matmul_chunk(void *p, int64_t c, int32_t ith) {
    const matmul_args *a = p;
    size_t r_begin, r_end;
    sd_cpu_chunk(a->n_out, ROW_CHUNK, c, &r_begin, &r_end);
    /* Tile shape (measured on the development Xeon): up to 8 tokens are
     * memory-bound, so one pass over each weight row serves every token
     * (fewer tokens leave registers for more rows: more independent FMA
     * chains); longer batches are compute-bound and use the 3 x 4 tile,
     * whose 12 accumulators + 3 weight vectors + 1 activation fill the 16
     * ymm registers and reuse each load best. */
    size_t n = a->n_tokens, rb, tb;
    if (n <= 8) {
        tb = n;
        rb = n <= 2 ? 4 : n <= 4 ? 2 : 1;
    } else {
        tb = 4;
        rb = 3;
    }
    for (size_t t0 = 0; t0 < a->n_tokens; t0 += TOK_BLOCK) {
        size_t t_end = t0 + TOK_BLOCK < a->n_tokens ? t0 + TOK_BLOCK : a->n_tokens;
        for (size_t r = r_begin; r < r_end; r += rb) {
            size_t nr = r_end - r < rb ? r_end - r : rb;
            const float *w = a->w + r * a->n_in;
            for (size_t t = t0; t < t_end; t += tb) {
                size_t nt = t_end - t < tb ? t_end - t : tb;
                tiles[nr - 1][nt - 1](w, a->x + t * a->n_in, a->y + t * a->n_out + r, a->n_in, a->n_out);
            }
        }
    }
}

sd_status sd_cpu_matmul(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n_tokens,
                        float *y) {
    if (n_tokens <= 0 || n_out <= 0) return SD_OK;
    matmul_args a = {w, x, y, (size_t)n_in, (size_t)n_out, (size_t)n_tokens};
    sd_cpu_parallel(be, matmul_chunk, &a, (int64_t)(((size_t)n_out + ROW_CHUNK - 1) / ROW_CHUNK),
                    (size_t)n_in * (size_t)n_out);
    return SD_OK;
}
