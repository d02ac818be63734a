/* qmatmul_vnni.c — the AVX-512 VNNI tiles of qmatmul.c: qmatmul_simd.inc
 * with dpbusd for the integer dots, compiled for that instruction set
 * (GCC's target pragma) and picked at run time when the CPU has it. The
 * F16 / BF16 tiles here are 512-bit ones of their own (ftile_z).
 *
 * A file of its own, as qmatmul_avx2.c is: qmatmul_impl.h says why. */
#include "cpu/qmatmul_impl.h"

#if HAVE_VNNI_PATH
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define QFN(name)          name##_vnni
#define QIDOT(u, v)        _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (v))
#define QIDOT_ACC(a, u, v) _mm256_dpbusd_epi32((a), (u), (v))
#define QOFFSET8           1
#define QZMM               1
#define QSHAPES(X)         SD_QTILE_SHAPES_WIDE(X)
#include "cpu/qmatmul_simd.inc"
#undef QFN
#undef QIDOT
#undef QIDOT_ACC
#undef QOFFSET8
#undef QZMM
#undef QSHAPES

/* 8 weights of each of rows w0 and w1 from element i, widened to f32
 * (exact): row w0 in lanes 0-7, w1 in 8-15. */
static inline __attribute__((always_inline)) __m512 widen8x2(const uint8_t *w0, const uint8_t *w1, size_t i,
                                                             const int f16) {
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w0 + 2 * i))),
                                        _mm_loadu_si128((const __m128i *)(w1 + 2 * i)), 1);
    if (f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One R x T tile of F16 (f16 = 1) or BF16 in 512-bit registers: a register
 * holds two weight rows' 8 lanes for one token (row r0 in lanes 0-7, r1 in
 * 8-15), the token's 8 activations broadcast to both halves, so one fused
 * add does two (row, token) pairs; each half is sd_cpu_dot's 8 lanes in
 * sd_cpu_dot's order, summed by its lane tree, then the fused tail. An odd
 * R pairs its last row with itself, the copy discarded. */
static inline __attribute__((always_inline)) void ftile_z(const uint8_t *w, size_t row_bytes, const float *x, float *y,
                                                          size_t n_in, size_t n_out, size_t pf_ahead, const int R,
                                                          const int T, const int f16) {
    enum { MAX_P = MAX_R / 2 };
    const int P = (R + 1) / 2;
    size_t n8 = n_in & ~(size_t)7;
    __m512 acc[MAX_P][MAX_T];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t i = 0; i < n8; i += 8) {
        __m512 wv[MAX_P];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const uint8_t *w0 = w + (size_t)(2 * p) * row_bytes;
            const uint8_t *w1 = 2 * p + 1 < R ? w0 + row_bytes : w0;
            if ((i & 31) == 0 && pf_ahead) { /* one cache line per 32 weights */
                _mm_prefetch((const char *)(w0 + 2 * i + pf_ahead), _MM_HINT_T1);
                if (2 * p + 1 < R) _mm_prefetch((const char *)(w1 + 2 * i + pf_ahead), _MM_HINT_T1);
            }
            wv[p] = widen8x2(w0, w1, i, f16);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 xv =
                _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(x + (size_t)t * n_in + i))));
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc[p][t] = _mm512_fmadd_ps(wv[p], xv, acc[p][t]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) {
                const int r = 2 * p + i;
                if (r >= R) continue;
                const uint8_t *wr = w + (size_t)r * row_bytes;
                const float *xt = x + (size_t)t * n_in;
                __m256 half = i ? _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc[p][t], acc[p][t], 0xee))
                                : _mm512_castps512_ps256(acc[p][t]);
                y[(size_t)t * n_out + (size_t)r] = f16_row_tail(wr, xt, n8, n_in, f16, sd_cpu_hsum256(half));
            }
}

/* macro-generated tiles, laid out by hand: clang-format cannot read them */
// clang-format off
#define FTILE_FN(F, R, T)                                                                                    \
    static void ftile_z_##F##_##R##_##T(const uint8_t *w, size_t rb, const float *x, float *y, size_t n_in, \
                                        size_t n_out, size_t pf_ahead) {                                    \
        ftile_z(w, rb, x, y, n_in, n_out, pf_ahead, R, T, F);                                               \
    }
#define FTILE_FN_0(R, T) FTILE_FN(0, R, T)
#define FTILE_FN_1(R, T) FTILE_FN(1, R, T)
SD_QTILE_SHAPES_WIDE(FTILE_FN_0)
SD_QTILE_SHAPES_WIDE(FTILE_FN_1)
#define FTILE_AT_0(R, T) [0][R - 1][T - 1] = ftile_z_0_##R##_##T,
#define FTILE_AT_1(R, T) [1][R - 1][T - 1] = ftile_z_1_##R##_##T,
const ftile_fn sd_cpu_ftiles_vnni[2][MAX_R][MAX_T] = {SD_QTILE_SHAPES_WIDE(FTILE_AT_0)
                                                          SD_QTILE_SHAPES_WIDE(FTILE_AT_1)};
// clang-format on
#pragma GCC pop_options
#else
typedef int qmatmul_vnni_not_built; /* ISO C wants a declaration in every file */
#endif
