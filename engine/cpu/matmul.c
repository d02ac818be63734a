/* matmul.c — y[t][o] = sum_i w[o][i] * x[t][i], the op that carries the time.
 *
 * Decode streams every weight once per token, so the kernel must run at
 * memory bandwidth; verifying K drafted tokens must cost little more than one,
 * so each weight row, once loaded, is applied to every token of the call:
 * threads claim chunks of ROW_CHUNK output rows; within a chunk the kernel
 * walks R rows x T tokens tiles (R*T vector accumulators in registers), the
 * R weight rows staying in L1 while all token tiles pass over them. Tokens
 * are taken in blocks of TOK_BLOCK so the activations of a block stay in L2
 * during long prefills.
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
enum { MAX_R = 4, MAX_T = 4, TOK_BLOCK = 64, ROW_CHUNK = 48 };
/* Tile for 3+ tokens: 3 rows x 4 tokens = 12 accumulators + 3 weight
 * vectors + 1 activation vector = 16 ymm registers (measured ~1.5x faster
 * than 2x4 or 4x3 on the development Xeon). */
#ifndef MANY_R
#define MANY_R 3
#define MANY_T 4
#endif

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
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t i = 0; i < n8; i += 8) {
        __m256 wv[MAX_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + (size_t)r * n_in + i);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * n_in + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
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

#define TILE_FN(R, T)                                                                          \
    static void tile_##R##_##T(const float *w, const float *x, float *y, size_t n_in, size_t n_out) { \
        tile(w, x, y, n_in, n_out, R, T);                                                      \
    }
TILE_FN(1, 1) TILE_FN(1, 2) TILE_FN(1, 3) TILE_FN(1, 4)
TILE_FN(2, 1) TILE_FN(2, 2) TILE_FN(2, 3) TILE_FN(2, 4)
TILE_FN(3, 1) TILE_FN(3, 2) TILE_FN(3, 3) TILE_FN(3, 4)
TILE_FN(4, 1) TILE_FN(4, 2) TILE_FN(4, 3) TILE_FN(4, 4)

typedef void (*tile_fn)(const float *w, const float *x, float *y, size_t n_in, size_t n_out);
static const tile_fn tiles[MAX_R][MAX_T] = {
    {tile_1_1, tile_1_2, tile_1_3, tile_1_4},
    {tile_2_1, tile_2_2, tile_2_3, tile_2_4},
    {tile_3_1, tile_3_2, tile_3_3, tile_3_4},
    {tile_4_1, tile_4_2, tile_4_3, tile_4_4},
};

static void matmul_chunk(void *p, int64_t c, int32_t ith) {
    const matmul_args *a = p;
    size_t r_begin, r_end;
    sd_cpu_chunk(a->n_out, ROW_CHUNK, c, &r_begin, &r_end);
    /* Tile shape: with 1-2 tokens, 4 rows share each activation load; with
     * more, MANY_R rows x MANY_T tokens. */
    size_t rb = a->n_tokens >= 3 ? MANY_R : 4, tb = a->n_tokens >= 3 ? MANY_T : a->n_tokens;
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

sd_status sd_cpu_matmul(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x,
                        int32_t n_tokens, float *y) {
    if (n_tokens <= 0 || n_out <= 0) return SD_OK;
    matmul_args a = {w, x, y, (size_t)n_in, (size_t)n_out, (size_t)n_tokens};
    sd_cpu_parallel(be, matmul_chunk, &a, (int64_t)(((size_t)n_out + ROW_CHUNK - 1) / ROW_CHUNK),
                    (size_t)n_in * (size_t)n_out);
    return SD_OK;
}
