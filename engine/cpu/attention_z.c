/* attention_z.c — 512-bit kernels for attention.c (SD_CPU_ATTN_AVX512),
 * compiled for AVX-512 F/VL/DQ (GCC's target pragma) and picked at run time
 * when the CPU has it.
 *
 * Every (token, head)'s arithmetic is attention.c's, bit for bit (its
 * header comment): the wider registers only put independent lanes side by
 * side, never change an operation or its order.
 *   - scores: two query rows that read the same K rows share a register,
 *     [row a's 8 lanes | row b's 8 lanes], each half against the same K
 *     columns (broadcast): every lane's fused adds are sd_cpu_dot's, in the
 *     same order, and each (position, row)'s lanes are summed by
 *     sd_cpu_hsum8's tree (a row alone is paired with itself);
 *   - weights: 16 exps at once (sd_cpu_exp's operations, lane by lane), the
 *     lane sums kept in 8 lanes and added 8 positions at a time in position
 *     order, as the 256-bit path does;
 *   - V: 16 output columns a register, the accumulation per element in
 *     position order from 0, then / sum. The positions go in slices of
 *     V_SLICE, each slice's V rows read by every group of 4 rows while they
 *     are in L1 (the partial sums parked in the output rows between slices,
 *     stored and reloaded exactly).
 * On a CPU with full-width 512-bit units (Zen 5, Intel server cores) that is
 * twice the fused adds an instruction; test_attention checks the bits
 * against the C twin. */
#include "cpu/attention_z.h"

#if SD_CPU_ATTN_Z
#include <immintrin.h>
#include <math.h>

#include "cpu/vexp.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq")

/* Scores of rows a and b against the 8 K rows k[0..7]: sa[p] = dot(qa,
 * k[p]) * scale, sb likewise. acc[p] holds position p: lanes 0-7 row a's 8
 * dot lanes, 8-15 row b's. The lane sums are sd_cpu_hsum8's tree,
 * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), for all 16 (position, row) pairs
 * at once: 128-bit lane k of S[i] is (position 2i + k/2, row k%2) after
 * the first additions, and the final permutation puts row a's positions in
 * lanes 0-7 and row b's in 8-15. */
static inline __attribute__((always_inline)) void scores_pair(const float *qa, const float *qb, const float *const *k,
                                                              size_t hd, float scale, float *sa, float *sb) {
    const size_t n8 = hd & ~(size_t)7;
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3], *k4 = k[4], *k5 = k[5], *k6 = k[6], *k7 = k[7];
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i < n8; i += 8) {
        const __m512 q =
            _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(qa + i)), _mm256_loadu_ps(qb + i), 1);
        a0 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k0 + i)), a0);
        a1 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k1 + i)), a1);
        a2 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k2 + i)), a2);
        a3 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k3 + i)), a3);
        a4 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k4 + i)), a4);
        a5 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k5 + i)), a5);
        a6 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k6 + i)), a6);
        a7 = _mm512_fmadd_ps(q, _mm512_broadcast_f32x8(_mm256_loadu_ps(k7 + i)), a7);
    }
    /* S[i] = lanes l0-3 + l4-7 of positions 2i and 2i + 1, both rows */
#define PAIR_SUM(x, y)                                                 \
    _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)), \
                  _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)))
    const __m512 s0 = PAIR_SUM(a0, a1), s1 = PAIR_SUM(a2, a3), s2 = PAIR_SUM(a4, a5), s3 = PAIR_SUM(a6, a7);
#undef PAIR_SUM
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_ps(s0, s1, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(s0, s1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_ps(s2, s3, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(s2, s3, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
    /* lane 4k + i of t: position 2i + k / 2, row k % 2 */
    __m512 d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), t);
    if (n8 < hd) { /* the head_dim % 8 tail, one by one after the tree */
        float l[16];
        _mm512_storeu_ps(l, d);
        for (int p = 0; p < 8; p++)
            for (size_t i = n8; i < hd; i++) {
                l[p] = fmaf(qa[i], k[p][i], l[p]);
                l[8 + p] = fmaf(qb[i], k[p][i], l[8 + p]);
            }
        d = _mm512_loadu_ps(l);
    }
    d = _mm512_mul_ps(d, _mm512_set1_ps(scale));
    _mm256_storeu_ps(sa, _mm512_castps512_ps256(d));
    _mm256_storeu_ps(sb, _mm512_extractf32x8_ps(d, 1));
}

void sd_cpu_attn_scores_z(const float *const *q, float *const *e, const size_t *n_pos, const size_t *lo, size_t n_rows,
                          const float *const *kp, size_t b0, size_t b1, size_t hd, float scale) {
    float spare[8];
    for (size_t b = b0; b < b1; b++) {
        const float *const *k = kp + 8 * b;
        for (size_t i = 0; i < n_rows; i++) {
            if (8 * b >= n_pos[i] || 8 * b + 8 <= lo[i]) continue; /* not read, or wholly outside the window */
            if (i + 1 < n_rows && 8 * b < n_pos[i + 1] && 8 * b + 8 > lo[i + 1]) {
                scores_pair(q[i], q[i + 1], k, hd, scale, e[i] + 8 * b, e[i + 1] + 8 * b);
                i++;
            } else { /* a row alone: paired with itself */
                scores_pair(q[i], q[i], k, hd, scale, e[i] + 8 * b, spare);
            }
        }
    }
}

/* sd_cpu_exp8's operations on 16 lanes. */
static inline __m512 exp16_z(__m512 x) {
    __m512 xc = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(SD_EXP_HI)), _mm512_set1_ps(SD_EXP_LO));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(SD_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-SD_EXP_LN2_HI), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-SD_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(SD_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SD_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SD_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SD_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SD_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SD_EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 e = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(SD_EXP_LO), _CMP_GE_OQ), e);
}

float sd_cpu_attn_softmax_z(float *s, size_t n) {
    const size_t n8 = (n + 7) & ~(size_t)7;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    size_t j = 0;
    for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
    float max = _mm512_reduce_max_ps(mv); /* a max: the same value in any order */
    for (; j < n; j++) max = s[j] > max ? s[j] : max;
    const __m512 m = _mm512_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j < n8; j += 16) {
        const size_t left = n - j; /* > 0 */
        const __mmask16 live = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        /* lanes at n and beyond weigh 0 (their scores are never read) */
        __m512 e = _mm512_maskz_mov_ps(live, exp16_z(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + j), m)));
        if (j + 16 <= n8) {
            _mm512_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e)); /* positions j .. j+7, then j+8 .. j+15 */
            sum = _mm256_add_ps(sum, _mm512_extractf32x8_ps(e, 1));
        } else { /* 8 positions left in the padded row */
            _mm256_storeu_ps(s + j, _mm512_castps512_ps256(e));
            sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
        }
    }
    return sd_cpu_hsum256(sum);
}

/* Positions in one slice of the V pass: 64 V rows of a 64-wide head are
 * 16 KiB, kept in L1 while every group of the item's rows reads them. */
enum { V_SLICE = 64 };

/* Columns d .. d + 16*NC - 1 of G rows' outputs (rows sorted by position),
 * positions j0 .. j1 - 1 of them: acc += e_j * v_j in position order,
 * continuing the partial sums parked in the output rows (stored and
 * reloaded exactly) when j0 > 0; a row whose last position is in the slice
 * ends with / sum. Rows done before j0 are not touched. */
static inline __attribute__((always_inline)) void v_slice_z(const float *const *vp, float *const *e,
                                                            const size_t *n_pos, const float *sum, float *const *o,
                                                            size_t d, size_t j0, size_t j1, const int G, const int NC) {
    __m512 acc[4][4];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NC; c++)
            acc[g][c] = j0 == 0 || n_pos[g] <= j0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o[g] + d + 16 * c);
    const size_t joint = n_pos[0] < j1 ? n_pos[0] : j1; /* positions every row reads */
    for (size_t j = j0; j < joint; j++) {
        __m512 v[4];
        for (int c = 0; c < NC; c++) v[c] = _mm512_loadu_ps(vp[j] + d + 16 * c);
        for (int g = 0; g < G; g++) {
            __m512 w = _mm512_set1_ps(e[g][j]);
            for (int c = 0; c < NC; c++) acc[g][c] = _mm512_fmadd_ps(w, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < G; g++) {
        if (n_pos[g] <= j0) continue; /* done in an earlier slice */
        const size_t end = n_pos[g] < j1 ? n_pos[g] : j1;
        for (size_t j = joint > j0 ? joint : j0; j < end; j++) {
            __m512 w = _mm512_set1_ps(e[g][j]);
            for (int c = 0; c < NC; c++) acc[g][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp[j] + d + 16 * c), acc[g][c]);
        }
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(o[g] + d + 16 * c,
                             n_pos[g] <= j1 ? _mm512_div_ps(acc[g][c], _mm512_set1_ps(sum[g])) : acc[g][c]);
    }
}

/* One slice for G rows: 64 columns a pass (16 accumulators for 4 rows),
 * then 16; returns the columns done. */
#define V_SLICES(G)                                                                     \
    do {                                                                                \
        for (; d + 64 <= hd; d += 64) v_slice_z(vp, e, n_pos, sum, o, d, j0, j1, G, 4); \
        for (; d + 16 <= hd; d += 16) v_slice_z(vp, e, n_pos, sum, o, d, j0, j1, G, 1); \
    } while (0)

static size_t v_group_slice(const float *const *vp, float *const *e, const size_t *n_pos, const float *sum,
                            float *const *o, size_t hd, int G, size_t j0, size_t j1) {
    size_t d = 0;
    switch (G) {
    case 1: V_SLICES(1); break;
    case 2: V_SLICES(2); break;
    case 3: V_SLICES(3); break;
    default: V_SLICES(4); break;
    }
    return d;
}

void sd_cpu_attn_v_rows_z(const float *const *vp, float *const *e, const size_t *n_pos, const float *sum,
                          float *const *o, size_t n_rows, size_t hd) {
    const size_t n_max = n_pos[n_rows - 1];
    size_t d = 0;
    for (size_t j0 = 0; j0 < n_max; j0 += V_SLICE)
        for (size_t g = 0; g < n_rows; g += 4) {
            const int G = (int)(n_rows - g < 4 ? n_rows - g : 4);
            if (n_pos[g + (size_t)G - 1] <= j0) continue; /* the group's rows are all done */
            d = v_group_slice(vp, e + g, n_pos + g, sum + g, o + g, hd, G, j0, j0 + V_SLICE);
        }
    for (size_t r = 0; r < n_rows; r++) /* columns past the last 16: one by one, the same order */
        for (size_t dd = d; dd < hd; dd++) {
            float a = 0.0f;
            for (size_t j = 0; j < n_pos[r]; j++) a = fmaf(e[r][j], vp[j][dd], a);
            o[r][dd] = a / sum[r];
        }
}

#pragma GCC pop_options

bool sd_cpu_attn_z_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

#else

bool sd_cpu_attn_z_supported(void) { return false; }

#endif
