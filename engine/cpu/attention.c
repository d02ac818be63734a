/* attention.c — causal attention over the paged KV cache, and the cache write.
 *
 * Work items. A call's tokens are cut into runs: consecutive tokens of one
 * sequence (same block table, positions p, p+1, ...: a verify call, or a
 * prompt chunk), at most RUN_MAX long; a single token is a run of one. One
 * work item is (run, KV head, part of that KV head's query heads): its rows
 * are every (token, query head) pair of the run and the part, and every K and
 * V row of the KV head is read once for all of them (K 8 positions at a time,
 * 8 scores per row; V once per GROUP rows, from L1/L2). The parts (at most
 * HEADS_MAX query heads each) are as few as give every thread two items when
 * the call has runs longer than one token (verification, prompts: bound by
 * arithmetic); a call of single tokens (decode) has one item per query head
 * (balance wins there: measured). Items are claimed dynamically by the
 * pool's threads.
 *
 * The arithmetic of one (token, head), fixed whatever the run, the batch,
 * the thread or the path (so a token's output depends only on its sequence
 * and position, bit for bit):
 *   - score s_j = dot(q, k_j) * scale, dot as sd_cpu_dot (cpu_impl.h: 8 lanes
 *     of fused multiply-adds, one fixed tree, the head_dim % 8 tail added
 *     one by one). The AVX2 path computes 8 positions' dots side by side and
 *     sums their lanes with one transposing tree that performs exactly
 *     sd_cpu_hsum8's additions for each position (no horizontal sum per dot);
 *   - m = max_j s_j; e_j = attn_exp(s_j - m), a polynomial exp (Cody-Waite
 *     reduction, Cephes' degree-5 minimax polynomial, fused multiply-adds)
 *     with a plain-C twin doing the same operations; within 2 ulp of exp for
 *     arguments in [-87, 0], 0 below -87 (test_attention bounds it);
 *   - sum = the e_j added in 8 lanes (lane l: positions l, l+8, ...) and the
 *     sd_cpu_hsum8 tree;
 *   - out[d] = (sum_j e_j * v_j[d], fused multiply-adds in position order from
 *     0) / sum.
 * The AVX2 path (compiled where the build targets x86-64-v3) and the C twin
 * (always compiled; the only path elsewhere) give the same bits; test_attention
 * checks that, and each path against the same attention in double. Rejected:
 * an online (running-max) softmax over tiles: it rescales partial sums, so a
 * token's bits would depend on the tiling; 16-lane (AVX-512) dots: they would
 * change the canonical dot every other reduction shares. The AVX-512 path
 * (SD_CPU_ATTN_AVX512, picked at run time where the CPU has AVX-512 F/VL/DQ;
 * kernels in attention_z.c) keeps the 8-lane dot and puts two query rows
 * side by side in a 512-bit register instead, computes 16 exps at once and
 * accumulates V 16 columns a register in position slices that stay in L1:
 * the same operations on every lane, so the same bits (test_attention). A
 * decode item (one row) keeps the 256-bit kernels.
 *
 * Token trees (sd_cpu_attention_tree, model_tree.c): every node is a run
 * of one; its K and V row pointers for logical positions from the tree's
 * base on are its path's storage rows (ancestors, then itself) instead of
 * the positions' own, and everything after the pointer table is the code
 * above. So a node's output is, bit for bit, its path's as a chain.
 *
 * An f16 cache (sd_cpu_kv_write_f16 / sd_cpu_attention_f16) rounds each
 * value once when it is written (to nearest, ties to even); attention widens
 * the item's K and V rows to f32 (exact) and then does the very arithmetic of
 * the f32 cache, so batch invariance holds as it does there. The widening
 * uses F16C where the build has AVX2 (every x86-64-v3 CPU has F16C), else the
 * bit-exact software conversion (sd_f16_to_f32). */
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_z.h"
#include "cpu/cpu_impl.h"
#include "cpu/vexp.h"
#include "specd/gguf.h"

/* Most tokens in a run (the scores kept per item are RUN_MAX x positions),
 * and tokens sharing each pass over V (4 x 16 accumulator lanes in registers). */
enum { RUN_MAX = 16, HEADS_MAX = 4, ROWS_MAX = RUN_MAX * HEADS_MAX, GROUP = 4 };

sd_status sd_cpu_kv_write(sd_backend *be, float *pool, int32_t block_size, int32_t row_width, const float *src,
                          int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off) {
    (void)be;
    for (int32_t t = 0; t < n_tokens; t++) {
        size_t block = (size_t)bt[bt_off[t] + pos[t] / block_size];
        size_t slot = block * (size_t)block_size + (size_t)(pos[t] % block_size);
        memcpy(pool + slot * (size_t)row_width, src + (size_t)t * (size_t)row_width, (size_t)row_width * sizeof(float));
    }
    return SD_OK;
}

sd_status sd_cpu_kv_write_f16(sd_backend *be, uint16_t *pool, int32_t block_size, int32_t row_width, const float *src,
                              int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off) {
    (void)be;
    for (int32_t t = 0; t < n_tokens; t++) {
        size_t block = (size_t)bt[bt_off[t] + pos[t] / block_size];
        uint16_t *dst = pool + (block * (size_t)block_size + (size_t)(pos[t] % block_size)) * (size_t)row_width;
        const float *row = src + (size_t)t * (size_t)row_width;
        for (int32_t i = 0; i < row_width; i++) dst[i] = sd_f32_to_f16(row[i]);
    }
    return SD_OK;
}

/* n halves to floats (exact either way). */
static inline void widen(const uint16_t *h, size_t n, float *out) {
    size_t i = 0;
#if SD_CPU_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) out[i] = sd_f16_to_f32(h[i]);
}

/* ---- the exp: cpu/vexp.h (both paths: the same operations in the same order) ---- */

static inline float attn_exp(float x) { return sd_cpu_exp(x); }

float sd_cpu_attn_exp(float x) { return attn_exp(x); }

#if SD_CPU_AVX2
static inline __m256 attn_exp8(__m256 x) { return sd_cpu_exp8(x); }
#endif

/* ---- one item ---- */

typedef struct attn_args {
    sd_backend *be;
    sd_cpu_attn_path path;
    const float *q;
    const void *k_pool, *v_pool; /* float or uint16_t (f16) */
    bool f16;
    float *out;
    const int32_t *pos, *bt, *bt_off;
    const int32_t *run_start; /* [n_runs + 1]: run r is tokens run_start[r] .. run_start[r + 1] - 1 */
    size_t n_runs, n_heads, n_kv_heads, head_dim, block_size;
    size_t n_sub;             /* items per (run, KV head): its query heads cut into n_sub parts */
    size_t n_pad;             /* the longest token's position count, rounded up to 8 */
    size_t window;            /* 0: none; else a token sees its last `window` positions only */
    const sd_attn_tree *tree; /* NULL: none; else every run is one tree node (its path's rows) */
    float scale;
} attn_args;

/* Floats of scratch one thread needs: see the layout in attn_item. */
static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }
static size_t scratch_floats(size_t n_pad, size_t hd, bool f16) {
    size_t ptr_floats = (sizeof(const float *) + sizeof(float) - 1) / sizeof(float);
    return round16(2 * n_pad * ptr_floats) + 2 * round16(hd) + round16(ROWS_MAX * n_pad) + (f16 ? 2 * n_pad * hd : 0);
}

/* s[p] = dot(q, k[p]) * scale for the 8 rows k[0..7], the C twin: sd_cpu_dot's operations. */
static void scores8_c(const float *q, const float *const *k, size_t hd, float scale, float *s) {
    size_t n8 = hd & ~(size_t)7;
    for (int p = 0; p < 8; p++) {
        float l[8] = {0};
        for (size_t i = 0; i < n8; i += 8)
            for (int j = 0; j < 8; j++) l[j] = fmaf(q[i + j], k[p][i + j], l[j]);
        float d = sd_cpu_hsum8(l);
        for (size_t i = n8; i < hd; i++) d = fmaf(q[i], k[p][i], d);
        s[p] = d * scale;
    }
}

#if SD_CPU_AVX2
/* lane p = sd_cpu_hsum8 of a[p], for 8 vectors at once: the same additions
 * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), transposed. */
static inline __m256 hsum8x8(const __m256 a[8]) {
    __m256 s[4]; /* s[i]: [a_{2i} lanes 0-3 + 4-7 | a_{2i+1} lanes 0-3 + 4-7] */
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    /* w0: [x0+x2, x1+x3 of a0, of a2 | of a1, of a3]; w1 the same for a4..a7 */
    __m256 w0 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(s[0], s[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 w1 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(s[2], s[3], _MM_SHUFFLE(3, 2, 3, 2)));
    /* [a0, a2, a4, a6 | a1, a3, a5, a7] */
    __m256 t = _mm256_add_ps(_mm256_shuffle_ps(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void scores8_avx2(const float *q, const float *const *k, size_t hd, float scale, float *s) {
    size_t n8 = hd & ~(size_t)7;
    __m256 a[8];
    for (int p = 0; p < 8; p++) a[p] = _mm256_setzero_ps();
    if (hd % 64 == 0) {
        /* 64 columns of q held in registers, one row at a time: each row's
         * pointer is read once (8 rows' pointers do not fit in registers
         * beside 8 accumulators); the same fused adds in the same order */
        for (size_t i0 = 0; i0 < hd; i0 += 64) {
            __m256 qc[8];
            for (int c = 0; c < 8; c++) qc[c] = _mm256_loadu_ps(q + i0 + 8 * c);
            for (int p = 0; p < 8; p++) {
                const float *kr = k[p] + i0;
                for (int c = 0; c < 8; c++) a[p] = _mm256_fmadd_ps(qc[c], _mm256_loadu_ps(kr + 8 * c), a[p]);
            }
        }
        _mm256_storeu_ps(s, _mm256_mul_ps(hsum8x8(a), _mm256_set1_ps(scale)));
        return;
    }
    for (size_t i = 0; i < n8; i += 8) {
        __m256 qi = _mm256_loadu_ps(q + i);
        for (int p = 0; p < 8; p++) a[p] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k[p] + i), a[p]);
    }
    __m256 d = hsum8x8(a);
    if (n8 < hd) {
        float l[8];
        _mm256_storeu_ps(l, d);
        for (int p = 0; p < 8; p++)
            for (size_t i = n8; i < hd; i++) l[p] = fmaf(q[i], k[p][i], l[p]);
        d = _mm256_loadu_ps(l);
    }
    _mm256_storeu_ps(s, _mm256_mul_ps(d, _mm256_set1_ps(scale)));
}
#endif

/* s[0..n) -> e_j = exp(s_j - max), s[n..round8(n)) = 0; returns the lane sum. */
static float softmax_weights(sd_cpu_attn_path path, float *s, size_t n) {
    size_t n8 = (n + 7) & ~(size_t)7;
#if SD_CPU_AVX2
    if (path != SD_CPU_ATTN_C) {
        __m256 mv = _mm256_set1_ps(-INFINITY);
        size_t j = 0;
        for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
        float lanes[8], max = -INFINITY;
        _mm256_storeu_ps(lanes, mv);
        for (int l = 0; l < 8; l++) max = lanes[l] > max ? lanes[l] : max;
        for (; j < n; j++) max = s[j] > max ? s[j] : max;
        __m256 m = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (j = 0; j < n8; j += 8) {
            __m256 e = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
            if (j + 8 > n) /* the last block: lanes at n and beyond weigh 0 */
                e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lane)));
            _mm256_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        return sd_cpu_hsum256(sum);
    }
#endif
    (void)path;
    float max = -INFINITY; /* the same value in any order (finite scores) */
    for (size_t j = 0; j < n; j++) max = s[j] > max ? s[j] : max;
    float l[8] = {0};
    for (size_t j = 0; j < n8; j++) {
        float e = j < n ? attn_exp(s[j] - max) : 0.0f;
        s[j] = e;
        l[j % 8] += e;
    }
    return sd_cpu_hsum8(l);
}

#if SD_CPU_AVX2
/* Columns d .. d + 8*NC - 1 of the outputs of G tokens (G <= GROUP), tokens
 * sorted by position: acc += e_j * v_j in position order, then / sum. The
 * positions all G tokens attend to go in one pass with the accumulators in
 * registers; each later token's few more positions continue from its partial
 * sums parked in its output row (stored and reloaded exactly). */
static inline __attribute__((always_inline)) void v_pass_avx2(const float *const *vp, float *const *e,
                                                              const size_t *n_pos, const float *sum, float *const *o,
                                                              size_t d, const int G, const int NC) {
    __m256 acc[GROUP][8];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NC; c++) acc[g][c] = _mm256_setzero_ps();
    for (size_t j = 0; j < n_pos[0]; j++) {
        __m256 v[8];
        for (int c = 0; c < NC; c++) v[c] = _mm256_loadu_ps(vp[j] + d + 8 * c);
        for (int g = 0; g < G; g++) {
            __m256 w = _mm256_broadcast_ss(e[g] + j);
            for (int c = 0; c < NC; c++) acc[g][c] = _mm256_fmadd_ps(w, v[c], acc[g][c]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(o[g] + d + 8 * c, acc[g][c]);
    for (int g = 1; g < G; g++)
        for (int c = 0; c < NC; c++) {
            __m256 a = _mm256_loadu_ps(o[g] + d + 8 * c);
            for (size_t j = n_pos[0]; j < n_pos[g]; j++)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(e[g] + j), _mm256_loadu_ps(vp[j] + d + 8 * c), a);
            _mm256_storeu_ps(o[g] + d + 8 * c, _mm256_div_ps(a, _mm256_set1_ps(sum[g])));
        }
    for (int c = 0; c < NC; c++)
        _mm256_storeu_ps(o[0] + d + 8 * c, _mm256_div_ps(_mm256_loadu_ps(o[0] + d + 8 * c), _mm256_set1_ps(sum[0])));
}

/* G tokens' whole rows: 8 chunks of 8 columns per pass for one token (8
 * independent fused-add chains keep both FMA units busy), 4 for two, 2 for
 * three or four; then single chunks, then the head_dim % 8 tail. */
static void v_group_avx2(const float *const *vp, float *const *e, const size_t *n_pos, const float *sum,
                         float *const *o, size_t hd, int G) {
    size_t d = 0;
    switch (G) {
    case 1:
        for (; d + 64 <= hd; d += 64) v_pass_avx2(vp, e, n_pos, sum, o, d, 1, 8);
        for (; d + 32 <= hd; d += 32) v_pass_avx2(vp, e, n_pos, sum, o, d, 1, 4);
        break;
    case 2:
        for (; d + 32 <= hd; d += 32) v_pass_avx2(vp, e, n_pos, sum, o, d, 2, 4);
        break;
    case 3:
        for (; d + 16 <= hd; d += 16) v_pass_avx2(vp, e, n_pos, sum, o, d, 3, 2);
        break;
    default:
        for (; d + 16 <= hd; d += 16) v_pass_avx2(vp, e, n_pos, sum, o, d, 4, 2);
        break;
    }
    for (; d + 8 <= hd; d += 8) switch (G) {
        case 1: v_pass_avx2(vp, e, n_pos, sum, o, d, 1, 1); break;
        case 2: v_pass_avx2(vp, e, n_pos, sum, o, d, 2, 1); break;
        case 3: v_pass_avx2(vp, e, n_pos, sum, o, d, 3, 1); break;
        default: v_pass_avx2(vp, e, n_pos, sum, o, d, 4, 1); break;
        }
    for (int g = 0; g < G; g++) /* the head_dim % 8 tail */
        for (size_t dd = d; dd < hd; dd++) {
            float acc = 0.0f;
            for (size_t j = 0; j < n_pos[g]; j++) acc = fmaf(e[g][j], vp[j][dd], acc);
            o[g][dd] = acc / sum[g];
        }
}
#endif

/* One token's output, the C twin: acc[hd] is scratch. */
static void v_token_c(const float *const *vp, const float *e, size_t n_pos, float sum, float *o, size_t hd,
                      float *acc) {
    for (size_t d = 0; d < hd; d++) acc[d] = 0.0f;
    for (size_t j = 0; j < n_pos; j++)
        for (size_t d = 0; d < hd; d++) acc[d] = fmaf(e[j], vp[j][d], acc[d]);
    for (size_t d = 0; d < hd; d++) o[d] = acc[d] / sum;
}

/* kp[j], vp[j] for positions j0 .. n_max - 1 of the item's run (its first
 * token t0) and KV head kvh: the cache's rows (widened into wk, wv for an
 * f16 cache). A tree node (a run of one): logical positions from the
 * tree's base on are read at its path's storage positions; before it, in
 * place. */
static void row_pointers(const attn_args *a, size_t t0, size_t kvh, size_t j0, size_t n_max, const float **kp,
                         const float **vp, float *wk, float *wv) {
    const size_t hd = a->head_dim;
    const int32_t *bt = a->bt + a->bt_off[t0];
    const size_t n_direct = a->tree && (size_t)a->tree->base < n_max ? (size_t)a->tree->base : n_max;
    const int32_t *path = a->tree ? a->tree->path + a->tree->path_off[t0] : NULL;
    size_t j = j0;
    while (j < n_max) {
        size_t slot = (size_t)bt[j / a->block_size] * a->block_size;
        for (size_t off = j % a->block_size; off < a->block_size && j < n_max; off++, j++) {
            size_t row = slot + off;
            if (j >= n_direct) {
                size_t sp = (size_t)path[j - n_direct];
                row = (size_t)bt[sp / a->block_size] * a->block_size + sp % a->block_size;
            }
            size_t at = (row * a->n_kv_heads + kvh) * hd;
            if (a->f16) {
                widen((const uint16_t *)a->k_pool + at, hd, wk + j * hd);
                widen((const uint16_t *)a->v_pool + at, hd, wv + j * hd);
                kp[j] = wk + j * hd;
                vp[j] = wv + j * hd;
            } else {
                kp[j] = (const float *)a->k_pool + at;
                vp[j] = (const float *)a->v_pool + at;
            }
        }
    }
}

static void attn_item(void *p, int64_t item, int32_t ith) {
    const attn_args *a = p;
    const size_t hd = a->head_dim, n_pad = a->n_pad, group = a->n_heads / a->n_kv_heads;
    const size_t per_run = a->n_kv_heads * a->n_sub, run = (size_t)item / per_run;
    const size_t kvh = (size_t)item % per_run / a->n_sub, sub = (size_t)item % a->n_sub;
    const size_t h0 = kvh * group + sub * group / a->n_sub, n_h = kvh * group + (sub + 1) * group / a->n_sub - h0;
    const size_t t0 = (size_t)a->run_start[run], n_run = (size_t)a->run_start[run + 1] - t0;
    const size_t n_rows = n_run * n_h;                       /* row i: token t0 + i / n_h, head h0 + i % n_h */
    const size_t n_max = (size_t)a->pos[t0 + n_run - 1] + 1; /* the run's positions are increasing */
    const size_t n_blocks8 = (n_max + 7) / 8;

    /* scratch: K and V row pointers [n_pad] each, a zero row, acc [hd],
     * scores [ROWS_MAX][n_pad], and (f16) the widened K and V rows [n_pad][hd] */
    float *scratch = a->be->scratch + (size_t)ith * a->be->scratch_per_thread;
    const float **kp = (const float **)(void *)scratch, **vp = kp + n_pad;
    size_t ptr_floats = (sizeof(const float *) + sizeof(float) - 1) / sizeof(float);
    float *zero = scratch + round16(2 * n_pad * ptr_floats);
    float *acc = zero + round16(hd);
    float *scores = acc + round16(hd);
    float *wk = scores + round16(ROWS_MAX * n_pad), *wv = wk + n_pad * hd;

    for (size_t d = 0; d < hd; d++) zero[d] = 0.0f;
    /* a sliding window: the item's first row (the lowest position) sees
     * nothing before lo0, so no row reads a position there (its block may
     * have been freed: kv_window.c); every pass starts at base, lo0 rounded
     * down to 8 (what it skips weighs exactly 0 and adds nothing: the same
     * bits, and window-sized work at any context) */
    const size_t n_min = (size_t)a->pos[t0] + 1;
    const size_t lo0 = a->window && n_min > a->window ? n_min - a->window : 0, base = lo0 & ~(size_t)7;
    size_t j = base;
    for (; j < lo0; j++) kp[j] = vp[j] = zero; /* weighed 0 */
    row_pointers(a, t0, kvh, j, n_max, kp, vp, wk, wv);
    for (j = n_max; j < n_blocks8 * 8; j++) kp[j] = vp[j] = zero; /* lanes past the last position, never used */

    float sum[ROWS_MAX];
    size_t n_pos[ROWS_MAX];
    float *e[ROWS_MAX], *o[ROWS_MAX];
    const float *q[ROWS_MAX];
    for (size_t i = 0; i < n_rows; i++) { /* sorted by position: V passes need that */
        size_t t = t0 + i / n_h, h = h0 + i % n_h;
        n_pos[i] = (size_t)a->pos[t] + 1;
        e[i] = scores + i * n_pad;
        q[i] = a->q + (t * a->n_heads + h) * hd;
        o[i] = a->out + (t * a->n_heads + h) * hd;
    }

    /* a sliding window: positions before lo[i] score -inf (weigh exactly 0:
     * the sums and the V pass then add zeros, so a kept position's
     * arithmetic is attention's) */
    size_t lo[ROWS_MAX];
    for (size_t i = 0; i < n_rows; i++) lo[i] = a->window && n_pos[i] > a->window ? n_pos[i] - a->window : 0;

    /* scores: each block of 8 K rows once for all the item's (token, head)
     * rows (the 512-bit kernels: two rows at a time; an item of one row, a
     * decode step's, keeps the 256-bit ones throughout: measured faster) */
    bool z = false;
#if SD_CPU_ATTN_Z
    z = a->path == SD_CPU_ATTN_AVX512 && n_rows > 1;
    if (z) sd_cpu_attn_scores_z(q, e, n_pos, lo, n_rows, kp, base / 8, n_blocks8, hd, a->scale);
#endif
    for (size_t b = base / 8; !z && b < n_blocks8; b++)
        for (size_t i = 0; i < n_rows; i++) {
            if (8 * b >= n_pos[i]) continue;
            if (8 * b + 8 <= lo[i]) continue; /* wholly outside the window: set below */
#if SD_CPU_AVX2
            if (a->path != SD_CPU_ATTN_C) {
                scores8_avx2(q[i], kp + 8 * b, hd, a->scale, e[i] + 8 * b);
                continue;
            }
#endif
            scores8_c(q[i], kp + 8 * b, hd, a->scale, e[i] + 8 * b);
        }

    for (size_t i = 0; i < n_rows; i++)
        for (size_t jj = base; jj < lo[i]; jj++) e[i][jj] = -INFINITY;

    /* from base on: the weights and sums, then the outputs, GROUP rows per
     * pass over V */
    for (size_t i = 0; i < n_rows; i++) {
        e[i] += base;
        n_pos[i] -= base;
#if SD_CPU_ATTN_Z
        if (z) {
            sum[i] = sd_cpu_attn_softmax_z(e[i], n_pos[i]);
            continue;
        }
#endif
        sum[i] = softmax_weights(a->path, e[i], n_pos[i]);
    }
#if SD_CPU_ATTN_Z
    if (z) {
        sd_cpu_attn_v_rows_z(vp + base, e, n_pos, sum, o, n_rows, hd);
        return;
    }
#endif
#if SD_CPU_AVX2
    if (a->path != SD_CPU_ATTN_C) {
        for (size_t g = 0; g < n_rows; g += GROUP)
            v_group_avx2(vp + base, e + g, n_pos + g, sum + g, o + g, hd,
                         (int)(n_rows - g < GROUP ? n_rows - g : GROUP));
        return;
    }
#endif
    for (size_t i = 0; i < n_rows; i++) v_token_c(vp + base, e[i], n_pos[i], sum[i], o[i], hd, acc);
}

bool sd_cpu_attn_path_available(sd_cpu_attn_path path) {
    return path == SD_CPU_ATTN_C || (path == SD_CPU_ATTN_AVX2 && SD_CPU_AVX2) ||
           (path == SD_CPU_ATTN_AVX512 && sd_cpu_attn_z_supported());
}

sd_status sd_cpu_attention_path(sd_backend *be, sd_cpu_attn_path path, const float *q, const void *k_pool,
                                const void *v_pool, bool f16, int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, int32_t block_size, const int32_t *pos, const int32_t *bt,
                                const int32_t *bt_off, float scale, float *out) {
    return sd_cpu_attention_window_path(be, path, q, k_pool, v_pool, f16, n_tokens, n_heads, n_kv_heads, head_dim,
                                        block_size, pos, bt, bt_off, 0, scale, out);
}

sd_status sd_cpu_attention_window_path(sd_backend *be, sd_cpu_attn_path path, const float *q, const void *k_pool,
                                       const void *v_pool, bool f16, int32_t n_tokens, int32_t n_heads,
                                       int32_t n_kv_heads, int32_t head_dim, int32_t block_size, const int32_t *pos,
                                       const int32_t *bt, const int32_t *bt_off, int32_t window, float scale,
                                       float *out) {
    return sd_cpu_attention_tree_path(be, path, q, k_pool, v_pool, f16, n_tokens, n_heads, n_kv_heads, head_dim,
                                      block_size, pos, bt, bt_off, window, NULL, scale, out);
}

sd_status sd_cpu_attention_tree_path(sd_backend *be, sd_cpu_attn_path path, const float *q, const void *k_pool,
                                     const void *v_pool, bool f16, int32_t n_tokens, int32_t n_heads,
                                     int32_t n_kv_heads, int32_t head_dim, int32_t block_size, const int32_t *pos,
                                     const int32_t *bt, const int32_t *bt_off, int32_t window, const sd_attn_tree *tree,
                                     float scale, float *out) {
    if (n_tokens <= 0) return SD_OK;
    if (tree && (window != 0 || tree->base < 0 || !tree->path || !tree->path_off)) return SD_ERR_INVALID_ARG;
    if (!sd_cpu_attn_path_available(path)) return SD_ERR_UNSUPPORTED;
    if (window < 0) return SD_ERR_INVALID_ARG;
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || head_dim <= 0 || block_size <= 0)
        return SD_ERR_INVALID_ARG;
    size_t max_pos = 0, work = 0, n_runs = 0;
    if ((size_t)n_tokens + 1 > be->attn_runs_cap) {
        int32_t *runs = realloc(be->attn_runs, ((size_t)n_tokens + 1) * sizeof *runs);
        if (!runs) return SD_ERR_NOMEM;
        be->attn_runs = runs;
        be->attn_runs_cap = (size_t)n_tokens + 1;
    }
    for (int32_t t = 0; t < n_tokens; t++) {
        if (pos[t] < 0) return SD_ERR_INVALID_ARG;
        if ((size_t)pos[t] > max_pos) max_pos = (size_t)pos[t];
        work += (size_t)pos[t] + 1;
        bool joins = !tree && t > 0 && bt_off[t] == bt_off[t - 1] && (int64_t)pos[t] == (int64_t)pos[t - 1] + 1 &&
                     t - be->attn_runs[n_runs - 1] < RUN_MAX;
        if (!joins) be->attn_runs[n_runs++] = t;
    }
    be->attn_runs[n_runs] = n_tokens;
    size_t n_pad = (max_pos + 1 + 7) & ~(size_t)7, floats;
    /* Runs longer than one token: the fewest parts (at most HEADS_MAX query
     * heads each) that give every thread two items. Single tokens (decode):
     * one item per query head, as many items as heads to balance; measured
     * on SmolLM2 (3 KV heads, 2 threads) decode was ~10% faster so than with
     * one item per KV head, the other heads' re-reads hitting the cache. */
    size_t group = (size_t)(n_heads / n_kv_heads), n_sub = (group + HEADS_MAX - 1) / HEADS_MAX;
    if (n_runs == (size_t)n_tokens) n_sub = group;
    while (n_sub < group && n_runs * (size_t)n_kv_heads * n_sub < 2 * (size_t)be->n_threads) n_sub++;
    if (!sd_mul_ok(n_pad, 2 * (size_t)head_dim, &floats)) return SD_ERR_NOMEM;
    SD_TRY(sd_cpu_scratch_reserve(be, scratch_floats(n_pad, (size_t)head_dim, f16)));
    attn_args a = {.be = be,
                   .path = path,
                   .q = q,
                   .k_pool = k_pool,
                   .v_pool = v_pool,
                   .f16 = f16,
                   .out = out,
                   .pos = pos,
                   .bt = bt,
                   .bt_off = bt_off,
                   .run_start = be->attn_runs,
                   .n_runs = n_runs,
                   .n_heads = (size_t)n_heads,
                   .n_kv_heads = (size_t)n_kv_heads,
                   .head_dim = (size_t)head_dim,
                   .block_size = (size_t)block_size,
                   .n_pad = n_pad,
                   .n_sub = n_sub,
                   .window = (size_t)window,
                   .tree = tree,
                   .scale = scale};
    sd_cpu_parallel(be, attn_item, &a, (int64_t)(n_runs * (size_t)n_kv_heads * n_sub),
                    work * (size_t)n_heads * (size_t)head_dim * 2);
    return SD_OK;
}

static sd_cpu_attn_path best_path(void) {
    return sd_cpu_attn_z_supported() ? SD_CPU_ATTN_AVX512 : SD_CPU_AVX2 ? SD_CPU_ATTN_AVX2 : SD_CPU_ATTN_C;
}

sd_status sd_cpu_attention(sd_backend *be, const float *q, const float *k_pool, const float *v_pool, int32_t n_tokens,
                           int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                           const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out) {
    return sd_cpu_attention_path(be, best_path(), q, k_pool, v_pool, false, n_tokens, n_heads, n_kv_heads, head_dim,
                                 block_size, pos, bt, bt_off, scale, out);
}

sd_status sd_cpu_attention_f16(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                               int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                               int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                               float scale, float *out) {
    return sd_cpu_attention_path(be, best_path(), q, k_pool, v_pool, true, n_tokens, n_heads, n_kv_heads, head_dim,
                                 block_size, pos, bt, bt_off, scale, out);
}

sd_status sd_cpu_attention_window(sd_backend *be, const float *q, const float *k_pool, const float *v_pool,
                                  int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                  int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                  int32_t window, float scale, float *out) {
    if (window < 1) return SD_ERR_INVALID_ARG;
    return sd_cpu_attention_window_path(be, best_path(), q, k_pool, v_pool, false, n_tokens, n_heads, n_kv_heads,
                                        head_dim, block_size, pos, bt, bt_off, window, scale, out);
}

sd_status sd_cpu_attention_window_f16(sd_backend *be, const float *q, const uint16_t *k_pool, const uint16_t *v_pool,
                                      int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                      int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                      int32_t window, float scale, float *out) {
    if (window < 1) return SD_ERR_INVALID_ARG;
    return sd_cpu_attention_window_path(be, best_path(), q, k_pool, v_pool, true, n_tokens, n_heads, n_kv_heads,
                                        head_dim, block_size, pos, bt, bt_off, window, scale, out);
}

sd_status sd_cpu_attention_tree(sd_backend *be, const float *q, const void *k_pool, const void *v_pool, bool f16,
                                int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                const sd_attn_tree *tree, float scale, float *out) {
    if (!tree) return SD_ERR_INVALID_ARG;
    return sd_cpu_attention_tree_path(be, best_path(), q, k_pool, v_pool, f16, n_tokens, n_heads, n_kv_heads, head_dim,
                                      block_size, pos, bt, bt_off, 0, tree, scale, out);
}
