/* qmatmul_avx2.c — the AVX2 tiles of qmatmul.c: the integer formats'
 * (qmatmul_simd.inc with maddubs + madd for the integer dots) and the
 * F16 / BF16 tiles, which both SIMD paths use (sd_cpu_ftiles).
 *
 * A file of its own, as qmatmul_vnni.c is: qmatmul_impl.h says why. Only
 * the tile shapes the dispatch picks are instantiated (SD_QTILE_SHAPES). */
#include "cpu/qmatmul_impl.h"

#if SD_CPU_AVX2
#define QFN(name)          name##_avx2
#define QIDOT(u, v)        _mm256_madd_epi16(_mm256_maddubs_epi16((u), (v)), _mm256_set1_epi16(1))
#define QIDOT_ACC(a, u, v) _mm256_add_epi32((a), QIDOT(u, v))
#define QWDOT_ACC(a, u, v) _mm256_add_epi32((a), _mm256_madd_epi16((u), (v)))
#define QOFFSET8           0
#define QZMM               0
#define QSHAPES(X)         SD_QTILE_SHAPES(X)
#define QBLOCK32           1
#define QKQUANT            1
#include "cpu/qmatmul_simd.inc"

/* 8 weights of row w from element i, widened to f32 (exact). */
static inline __attribute__((always_inline)) __m256 widen8(const uint8_t *w, size_t i, const int f16) {
    __m128i h = _mm_loadu_si128((const __m128i *)(w + 2 * i));
    if (f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* One R x T tile of F16 (f16 = 1) or BF16: sd_cpu_dot's arithmetic. */
static inline __attribute__((always_inline)) void ftile(const uint8_t *w, size_t row_bytes, const float *x, float *y,
                                                        size_t n_in, size_t n_out, size_t pf_ahead, const int R,
                                                        const int T, const int f16) {
    size_t n8 = n_in & ~(size_t)7;
    __m256 acc[MAX_R][MAX_T];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (size_t i = 0; i < n8; i += 8) {
        __m256 wv[MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            if ((i & 31) == 0 && pf_ahead) /* one cache line per 32 weights */
                _mm_prefetch((const char *)(w + (size_t)r * row_bytes + 2 * i + pf_ahead), _MM_HINT_T1);
            wv[r] = widen8(w + (size_t)r * row_bytes, i, f16);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * n_in + i);
            __asm__("" : "+x"(xv));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const uint8_t *wr = w + (size_t)r * row_bytes;
            const float *xt = x + (size_t)t * n_in;
            y[(size_t)t * n_out + (size_t)r] = f16_row_tail(wr, xt, n8, n_in, f16, sd_cpu_hsum256(acc[r][t]));
        }
}

/* macro-generated tiles, laid out by hand: clang-format cannot read them */
// clang-format off
#define FTILE_FN(F, R, T)                                                                                  \
    static void ftile_##F##_##R##_##T(const uint8_t *w, size_t rb, const float *x, float *y, size_t n_in, \
                                      size_t n_out, size_t pf_ahead) {                                    \
        ftile(w, rb, x, y, n_in, n_out, pf_ahead, R, T, F);                                               \
    }
#define FTILE_FN_0(R, T) FTILE_FN(0, R, T)
#define FTILE_FN_1(R, T) FTILE_FN(1, R, T)
SD_QTILE_SHAPES(FTILE_FN_0)
SD_QTILE_SHAPES(FTILE_FN_1)
#define FTILE_AT_0(R, T) [0][R - 1][T - 1] = ftile_0_##R##_##T,
#define FTILE_AT_1(R, T) [1][R - 1][T - 1] = ftile_1_##R##_##T,
const ftile_fn sd_cpu_ftiles[2][MAX_R][MAX_T] = {SD_QTILE_SHAPES(FTILE_AT_0) SD_QTILE_SHAPES(FTILE_AT_1)};
// clang-format on
#endif
