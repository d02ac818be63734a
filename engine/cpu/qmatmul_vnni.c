/* qmatmul_vnni.c — the AVX-512 VNNI tiles of qmatmul.c: qmatmul_simd.inc
 * with dpbusd for the integer dots, compiled for that instruction set
 * (GCC's target pragma) and picked at run time when the CPU has it; the
 * blocks of 32 here, the K-quants in qmatmul_vnni_k.c. The F16 / BF16
 * tiles here are 512-bit ones of their own (ftile_z).
 *
 * A file of its own, as qmatmul_avx2.c is: qmatmul_impl.h says why. */
#include "cpu/qmatmul_impl.h"

#if HAVE_VNNI_PATH
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#include "cpu/qmatmul_vnni_defs.h"
#define QFN(name) name##_vnni
#define QBLOCK32  1
#define QKQUANT   0 /* qmatmul_vnni_k.c */
#include "cpu/qmatmul_simd.inc"

/* ---- Q4_0 and Q5_0 on prepared activations (qmatmul_impl.h: zprep) ----
 *
 * The 512-bit tile of qmatmul_simd.inc (ztile) spends, per token and
 * block, a permute (each dword of q twice) and a dpbusd and a subtraction
 * (Q4_0's -8 sum q, the dot's start): with 4 rows, one more instruction
 * per (row, token, block) on top of the dpbusd, conversion and fused add
 * per (row pair, token, block); and 7 to unpack a row pair's nibbles per
 * block. Here the activation side is done once per call
 * (sd_cpu_zprep_row_vnni: q + 128, doubled) and the offset moves to the
 * weights, where it is paid per (row pair, block) and shared by the tile's
 * tokens (one-token calls included: measured as fast or faster, the 2048 x
 * 8192 kernel 1.25x):
 *     sum (q + 128)(n - 8) = P + 128 sum (n - 8)   (per lane, exact in int32)
 * so the dot starts from -128 sum (n - 8) = 4096 - 128 sum n, one dpbusd of
 * the nibbles with -128. Per (row pair, block): a two-source permute of
 * both rows' 16 bytes, a masked shift (the high nibbles), an and, the - 8
 * and that dpbusd; per (row pair, token, block) only the dot, its
 * conversion and the fused add. The lanes are ztile's (dword 2k + i: row
 * r_i's lane k) and each lane's operations and their order are the C
 * twin's: the same P_bk, the same products dw_b * dx_b, the same fused
 * adds, the same lane tree. Tried and not kept: -8 sum q per token and
 * block stored with the prepared rows as the dot's start (twice the bytes
 * per block read by every tile; slower on 2048- and 8192-wide matrices).
 *
 * Q5_0 the same way, v = n + 16 h (h the fifth bit) in place of n and 16
 * in place of 8: the start is 8192 - 128 sum v. The fifth bits of both
 * rows go into the byte mask of the permuted nibbles by two pdep (element
 * 4k + e of row r_i is byte 8k + 4i + e: nibble k of each qh, interleaved)
 * and one masked blend. Measured against ztile (one thread, this AMD EPYC,
 * 2026-12-02): 1152 x 8192 at 1 token 0.97 -> 0.82 ns per (row, block),
 * 1152 x 2048 at 64 tokens 0.35 -> 0.29 ns per (row, token, block); a
 * first version gathering the d with scalar loads was 1.3x slower at 1
 * token than ztile (bench/results/family-cpu.md). */

void sd_cpu_zprep_row_vnni(const uint8_t *xr, size_t nb, uint8_t *dst) {
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const float *dx = (const float *)(xr + nb * QK);
    float *dxd = (float *)(dst + nb * ZPREP_BLOCK_BYTES);
    for (size_t b = 0; b < nb; b++) {
        const __m512i qz =
            _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xr + b * QK))));
        _mm512_store_si512((void *)(dst + b * ZPREP_BLOCK_BYTES), _mm512_xor_si512(qz, _mm512_set1_epi8((char)0x80)));
        dxd[2 * b] = dxd[2 * b + 1] = dx[b];
    }
    for (size_t b = nb; b < zprep_padded_blocks(nb); b++) dxd[2 * b] = dxd[2 * b + 1] = 0.0f;
}

/* One R x T Q4_0 or Q5_0 (kind) tile on prepared activation rows xp
 * (prow_bytes apart): lanes as in ztile (dword 2k + i: row r_i's lane k), so
 * the output is taken apart the same way. The scale products of 8 blocks per
 * row pair come from both rows' f16 d gathered by word permutes (d_j at byte
 * BB j of the group; masked loads read no byte past the group's last d), widened,
 * and multiplied by the doubled dx of each token. */
static inline __attribute__((always_inline)) void zptile(const uint8_t *w, size_t row_bytes, const uint8_t *xp,
                                                         size_t prow_bytes, size_t nb, float *y, size_t n_out,
                                                         size_t pf_ahead, const int R, const int T, const int kind) {
    enum { MAX_P = MAX_R / 2 };
    const int P = (R + 1) / 2;
    const size_t BB = qblock_bytes(kind);
    const bool q5 = kind == KIND_Q5_0;
    /* both rows' 16 bytes of nibbles: dword 2k + i = row i's dword k % 4 */
    const __m512i wlanes = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 0, 16, 1, 17, 2, 18, 3, 19);
#define WORDS(lo, hi) ((lo) | (hi) << 16)
    /* word (BB / 2) j (byte BB j) of the group's first 128 bytes: block j's
     * d (Q4_0 all 8; Q5_0 blocks 0-5, and 6-7 at words 2 and 13 of the next 64) */
    const __m512i dwords =
        q5 ? _mm512_setr_epi32(WORDS(0, 11), WORDS(22, 33), WORDS(44, 55), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
           : _mm512_setr_epi32(WORDS(0, 9), WORDS(18, 27), WORDS(36, 45), WORDS(54, 63), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 0);
    const __m512i dwords_hi = _mm512_setr_epi32(0, 0, 0, WORDS(2, 13), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    /* word 2 j + i: word j of d[i] */
    const __m512i dpair = _mm512_setr_epi32(WORDS(0, 32), WORDS(1, 33), WORDS(2, 34), WORDS(3, 35), WORDS(4, 36),
                                            WORDS(5, 37), WORDS(6, 38), WORDS(7, 39), 0, 0, 0, 0, 0, 0, 0, 0);
#undef WORDS
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[MAX_P][MAX_T];
    /* per row pair and token, blocks b0 .. b0 + 7: [2j + i] = dw_{r_i, b0 + j} * dx */
    float prod[MAX_P][MAX_T][16] __attribute__((aligned(64)));
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[p][t] = _mm512_setzero_ps();
    for (size_t b0 = 0; b0 < nb; b0 += 8) {
        const size_t n_group = nb - b0 < 8 ? nb - b0 : 8;
        const size_t d_end = (n_group - 1) * BB + 2; /* bytes up to the group's last d */
        __mmask64 m[3];                              /* the bytes of each 64 up to there */
        for (size_t i = 0; i < 3; i++)
            m[i] = d_end <= 64 * i ? 0 : d_end >= 64 * (i + 1) ? ~(__mmask64)0 : ((__mmask64)1 << (d_end - 64 * i)) - 1;
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            __m512i d[2];
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) {
                const int r = 2 * p + i < R ? 2 * p + i : R - 1;
                const uint8_t *g = w + (size_t)r * row_bytes + b0 * BB;
                /* the group's blocks in the chunk's next tile, into L2, as
                 * the other integer tiles (qmatmul_simd.inc: prefetch_group) */
                if (pf_ahead && 2 * p + i < R)
                    for (size_t off = 0; off < n_group * BB; off += 64)
                        _mm_prefetch((const char *)(g + pf_ahead + off), _MM_HINT_T1);
                d[i] = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(m[0], g), dwords,
                                                 _mm512_maskz_loadu_epi8(m[1], g + 64));
                if (q5)
                    d[i] = _mm512_mask_permutexvar_epi16(d[i], 0xc0, dwords_hi, _mm512_maskz_loadu_epi8(m[2], g + 128));
            }
            const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(d[0], dpair, d[1])));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const float *dxd = (const float *)(xp + (size_t)t * prow_bytes + nb * ZPREP_BLOCK_BYTES) + 2 * b0;
                _mm512_store_ps(prod[p][t], _mm512_mul_ps(dw, _mm512_loadu_ps(dxd)));
            }
        }
        for (size_t j = 0; j < n_group; j++) {
            const size_t b = b0 + j;
            __m512i ws[MAX_P], start[MAX_P];
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                const int r1 = 2 * p + 1 < R ? 2 * p + 1 : R - 1;
                const uint8_t *blk0 = w + (size_t)(2 * p) * row_bytes + b * BB,
                              *blk1 = w + (size_t)r1 * row_bytes + b * BB;
                const size_t qs = q5 ? 6 : 2;
                __m512i z = _mm512_permutex2var_epi32(
                    _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk0 + qs))), wlanes,
                    _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk1 + qs))));
                z = _mm512_mask_srli_epi16(z, (__mmask32)0xffff0000u, z, 4); /* lanes 4-7: the high nibbles */
                __m512i n = _mm512_and_si512(z, low4);
                if (q5) {
                    /* element 4k + e of row r_i sits at byte 8k + 4i + e, so
                     * the fifth bits, nibble k of each row's qh, interleave
                     * by nibbles into the byte mask: v = n + 16 h */
                    uint32_t h0, h1;
                    memcpy(&h0, blk0 + 2, 4);
                    memcpy(&h1, blk1 + 2, 4);
                    const __mmask64 hm = _pdep_u64(h0, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(h1, 0xf0f0f0f0f0f0f0f0ull);
                    n = _mm512_mask_blend_epi8(hm, n, _mm512_or_si512(n, _mm512_set1_epi8(0x10)));
                }
                const int bias = q5 ? 16 : 8;
                ws[p] = _mm512_sub_epi8(n, _mm512_set1_epi8((char)bias));
                /* -128 * sum (v - bias) = 512 bias - 128 * sum v per lane (v: n, Q5_0's 5-bit value) */
                start[p] = _mm512_dpbusd_epi32(_mm512_set1_epi32(512 * bias), n, _mm512_set1_epi8(-128));
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const __m512i qu =
                    _mm512_load_si512((const void *)(xp + (size_t)t * prow_bytes + b * ZPREP_BLOCK_BYTES));
#pragma GCC unroll 4
                for (int p = 0; p < P; p++) {
                    const __m512i dot = _mm512_dpbusd_epi32(start[p], qu, ws[p]); /* P_bk, exact */
                    double s2;
                    memcpy(&s2, &prod[p][t][2 * j], 8);
                    acc[p][t] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_castpd_ps(_mm512_set1_pd(s2)), acc[p][t]);
                }
            }
        }
    }
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            y[(size_t)t * n_out + (size_t)(2 * p)] =
                sd_cpu_hsum256(_mm512_castps512_ps256(_mm512_permutexvar_ps(even, acc[p][t])));
            if (2 * p + 1 < R)
                y[(size_t)t * n_out + (size_t)(2 * p + 1)] =
                    sd_cpu_hsum256(_mm512_castps512_ps256(_mm512_permutexvar_ps(odd, acc[p][t])));
        }
}

// clang-format off
#define PTILE_FN(K, R, T)                                                                                         \
    static void ptile_##K##_##R##_##T(const uint8_t *w, size_t rb, const uint8_t *xp, size_t prb, size_t nb, float *y, \
                                      size_t n_out, size_t pf_ahead) {                                              \
        zptile(w, rb, xp, prb, nb, y, n_out, pf_ahead, R, T, K);                                                    \
    }
#define PTILE_FN_1(R, T) PTILE_FN(1, R, T)
#define PTILE_FN_3(R, T) PTILE_FN(3, R, T)
SD_QTILE_SHAPES_WIDE(PTILE_FN_1)
SD_QTILE_SHAPES_WIDE(PTILE_FN_3)
#define PTILE_AT_1(R, T) [0][R - 1][T - 1] = ptile_1_##R##_##T,
#define PTILE_AT_3(R, T) [1][R - 1][T - 1] = ptile_3_##R##_##T,
const qtile_fn sd_cpu_zptiles_vnni[2][MAX_R][MAX_T] = {SD_QTILE_SHAPES_WIDE(PTILE_AT_1) SD_QTILE_SHAPES_WIDE(PTILE_AT_3)};
// clang-format on
#undef PTILE_FN
#undef PTILE_FN_1
#undef PTILE_FN_3
#undef PTILE_AT_1
#undef PTILE_AT_3

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
