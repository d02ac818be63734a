/* qmatmul.c — matmul on weights as stored (see quant_kernels.h for the
 * arithmetic every path shares).
 *
 * Layout of the work, as in matmul.c: threads claim chunks of ROW_CHUNK
 * output rows (a multiple of it when a call streams its weights:
 * chunk_rows); inside a chunk an R x T tile keeps R weight rows' blocks in
 * registers and applies them to T (up to 8) token rows (qtile_shape), so a decode or
 * verify call (1-16 tokens) streams each weight row from memory once and the
 * other token groups reread it from L1/L2. The activations are quantized
 * once per call by the calling thread before the pool runs (O(n_tokens *
 * n_in), small next to the matmul), so a run needs no barrier of its own.
 *
 * Paths: the plain C twin (the oracle the tests compare with), AVX2
 * (maddubs + madd for the integer dots) and AVX-512 VNNI (dpbusd for the
 * same integer dots, picked at run time with __builtin_cpu_supports). The
 * integer products are exact and the float steps are the same operations in
 * the same order, so the three agree bit for bit. The VNNI path computes
 * the blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), F16 / BF16 and (3 or
 * more tokens) the K-quants in
 * 512-bit registers holding two weight rows' 8 lanes each, so every lane
 * keeps its one chain. Rejected: a 512-bit
 * float accumulation of two blocks per instruction — it would sum a lane's
 * blocks in two chains, changing the result with the path. The tiles are in
 * qmatmul_avx2.c, qmatmul_vnni.c and qmatmul_vnni_k.c, only in the shapes this dispatch picks
 * (qmatmul_impl.h: why their own files). On the VNNI path a Q4_0 or Q5_0 call
 * also prepares its activation rows once (q + 128, each dword twice:
 * qmatmul_impl.h's zprep) for tiles that take the offset from the weights
 * instead (qmatmul_vnni.c), same arithmetic.
 *
 * K-quants (Q4_K, Q5_K, Q6_K) take activations of their own, llama.cpp's
 * Q8_K size: one f32 scale per 256 elements (a super-block), and per 4
 * elements the int16 sum of q (sd_cpu_q8k_quantize_row). Each (row, token,
 * super-block) is then integer sums across the super-block, the sub-block
 * scales (and Q4_K / Q5_K's minimums, Q6_K's -32) multiplied in as
 * integers, and a few float steps per lane (kdot_c here; ktile in
 * qmatmul_simd.inc, and on the VNNI path for 3 or more tokens the 512-bit
 * kztile). This was first rejected as a second activation format for the
 * same dots; it was taken up (branch kq8k) because the activations of 32
 * left two fused adds per lane for every (row, token, 32 elements), what
 * bound the 1B Q4_K_M prompt at 0.74x llama.cpp (bench/results/quant-cpu.md:
 * q4kp), and because with exact integer sums per super-block the minimum's
 * cancellation happens per super-block in the same lanes as the dots (the
 * per-super-block minimum tried on scales of 32 kept it apart until the end
 * and failed the float64 oracle). The price is the coarser activation
 * rounding (a scale per 256), which tests/ref/llama_ref.py models.
 *
 * Block data is unaligned (18-, 20-, 22-, 24-, 144-, 176- and 210-byte blocks): every
 * load is unaligned and scalar loads go through memcpy. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/qmatmul_impl.h"
#include "specd/model.h"

static int kind_of(sd_dtype t) {
    switch (t) {
    case SD_DTYPE_Q8_0: return KIND_Q8_0;
    case SD_DTYPE_Q4_0: return KIND_Q4_0;
    case SD_DTYPE_Q5_0: return KIND_Q5_0;
    case SD_DTYPE_Q5_1: return KIND_Q5_1;
    case SD_DTYPE_Q4_K: return KIND_Q4_K;
    case SD_DTYPE_Q5_K: return KIND_Q5_K;
    case SD_DTYPE_Q6_K: return KIND_Q6_K;
    default: return KIND_Q4_1;
    }
}

static bool is_integer_type(sd_dtype t) {
    return t == SD_DTYPE_Q8_0 || t == SD_DTYPE_Q4_0 || t == SD_DTYPE_Q4_1 || t == SD_DTYPE_Q5_0 || t == SD_DTYPE_Q5_1 ||
           sd_dtype_is_k(t);
}

/* Elements per weight block of an integer type (what n_in must divide by). */
static int32_t int_block(sd_dtype t) { return sd_dtype_is_k(t) ? SD_QK_K : QK; }

/* The integer scales of one K-quant super-block and its f16 factors as f32:
 * Q4_K / Q5_K: sc[s], mins[s] (6 bits) for the 8 sub-blocks of 32, *d, *dmin;
 * Q6_K: sc[i] (int8) for the 16 of 16, *d (*dmin unused). The C twin's; the
 * SIMD tiles unpack the same fields as int16 vectors (kscw). */
static void kscales_c(int kind, const uint8_t *blk, int sc[16], int mins[8], float *d, float *dmin) {
    if (kind == KIND_Q6_K) {
        *d = sd_f16_to_f32(sd_load_u16(blk + 208));
        *dmin = 0.0f;
        for (int i = 0; i < 16; i++) sc[i] = (int8_t)blk[192 + i];
        return;
    }
    *d = sd_f16_to_f32(sd_load_u16(blk));
    *dmin = sd_f16_to_f32(sd_load_u16(blk + 2));
    const uint8_t *q = blk + 4;
    for (int s = 0; s < 8; s++) {
        if (s < 4) {
            sc[s] = q[s] & 63;
            mins[s] = q[s + 4] & 63;
        } else {
            sc[s] = (q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4);
            mins[s] = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
        }
    }
}

bool sd_cpu_qmatmul_supports(sd_dtype t) { return is_integer_type(t) || t == SD_DTYPE_F16 || t == SD_DTYPE_BF16; }

/* ---- activations ---- */

size_t sd_cpu_q8_row_bytes(int32_t n_in) {
    size_t nb = (size_t)(n_in > 0 ? n_in : 0) / QK;
    return nb * (QK + 4 + 32);
}

/* The activation rounding both formats share: x * id to nearest even,
 * clamped to +-127, NaN -> -127 (never UB). */
static inline int q8_round(float x, float id) {
    float v = nearbyintf(x * id);
    return !(v >= -127.0f) ? -127 : v > 127.0f ? 127 : (int)v;
}

#if SD_CPU_AVX2
/* The same operations 8 at a time: max_ps(|x|, amax) keeps amax when x is
 * NaN, as fmaxf does; round_ps is nearbyintf's rounding to nearest even;
 * max_ps(v, -127) gives -127 for NaN, as q8_round's clamp does. */

/* max |x[i]| over n (a multiple of 8) floats */
static inline float amax_avx2(const float *x, int n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < n; k += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    return _mm_cvtss_f32(m4);
}

/* q8_round of 32 floats, as 32 int8 in order */
static inline __m256i q8_round32_avx2(const float *x, float id) {
    __m256i qi[4];
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), _mm256_set1_ps(id)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        qi[k] = _mm256_cvtps_epi32(v);
    }
    __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    return _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* the 8 sums of 4 consecutive int8 of q8, as int32 (an exact dot with 1s) */
static inline __m256i lane_sums_avx2(__m256i q8) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8), _mm256_set1_epi16(1));
}
#endif

/* The scale of n activations (d = max |x| / 127) and its inverse (0 for
 * d = 0), which q8_round takes. */
static inline float q8_scale(const float *x, int n, float *id) {
#if SD_CPU_AVX2
    const float amax = amax_avx2(x, n);
#else
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
#endif
    const float d = amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}

void sd_cpu_q8_quantize_row(const float *x, int32_t n_in, void *dst) {
    size_t nb = (size_t)n_in / QK;
    int8_t *q = dst;
    uint8_t *dxs = (uint8_t *)dst + nb * QK, *sums = dxs + nb * 4;
    for (size_t b = 0; b < nb; b++) {
        const float *xb = x + b * QK;
        float id;
        const float d = q8_scale(xb, QK, &id);
#if SD_CPU_AVX2
        const __m256i q8 = q8_round32_avx2(xb, id);
        _mm256_storeu_si256((__m256i *)(q + b * QK), q8);
        memcpy(dxs + b * 4, &d, 4);
        _mm256_storeu_ps((float *)(sums + b * 32), _mm256_cvtepi32_ps(lane_sums_avx2(q8)));
#else
        int32_t lane[8] = {0};
        for (int j = 0; j < QK; j++) {
            const int iv = q8_round(xb[j], id);
            q[b * QK + (size_t)j] = (int8_t)iv;
            lane[j / 4] += iv;
        }
        memcpy(dxs + b * 4, &d, 4);
        for (int k = 0; k < 8; k++) {
            float s = (float)lane[k];
            memcpy(sums + b * 32 + (size_t)k * 4, &s, 4);
        }
#endif
    }
}

size_t sd_cpu_q8k_row_bytes(int32_t n_in) {
    size_t nsb = (size_t)(n_in > 0 ? n_in : 0) / SD_QK_K;
    return nsb * Q8K_SB_BYTES;
}

void sd_cpu_q8k_quantize_row(const float *x, int32_t n_in, void *dst) {
    const size_t nsb = (size_t)n_in / SD_QK_K;
    int8_t *q = dst;
    for (size_t sb = 0; sb < nsb; sb++) {
        const float *xb = x + sb * SD_QK_K;
        int8_t *qb = q + sb * SD_QK_K;
        uint8_t *ls = (uint8_t *)dst + nsb * (SD_QK_K + 4) + sb * 128;
        float id;
        const float d = q8_scale(xb, SD_QK_K, &id);
#if SD_CPU_AVX2
        /* sd_cpu_q8_quantize_row's operations over 256 elements; the lane
         * sums of sub-blocks 2u and 2u + 1 interleaved as int16 words
         * (values within +-508) */
        __m256i lane[2];
        for (int s = 0; s < 8; s++) {
            const __m256i q8 = q8_round32_avx2(xb + 32 * s, id);
            _mm256_storeu_si256((__m256i *)(qb + 32 * s), q8);
            lane[s & 1] = lane_sums_avx2(q8);
            if (s & 1)
                _mm256_storeu_si256((__m256i *)(ls + 32 * (s / 2)),
                                    _mm256_or_si256(_mm256_and_si256(lane[0], _mm256_set1_epi32(0xffff)),
                                                    _mm256_slli_epi32(lane[1], 16)));
        }
        memcpy((uint8_t *)dst + nsb * SD_QK_K + sb * 4, &d, 4);
#else
        int16_t lsum[64] = {0};
        for (int j = 0; j < SD_QK_K; j++) {
            const int iv = q8_round(xb[j], id);
            qb[j] = (int8_t)iv;
            const int s = j / 32, k = j % 32 / 4;
            lsum[16 * (s / 2) + 2 * k + (s & 1)] = (int16_t)(lsum[16 * (s / 2) + 2 * k + (s & 1)] + iv);
        }
        memcpy((uint8_t *)dst + nsb * SD_QK_K + sb * 4, &d, 4);
        memcpy(ls, lsum, sizeof lsum);
#endif
    }
}

/* ---- the C twins ---- */

/* One output element of an integer format (weight row wr, q8 row xr). */
static float qdot_c(int kind, const uint8_t *wr, const uint8_t *xr, size_t nb) {
    const size_t bb = qblock_bytes(kind);
    const bool has_min = kind_has_min(kind);
    const int8_t *q = (const int8_t *)xr;
    float acc[8] = {0};
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = wr + b * bb;
        int w[QK];
        if (kind == KIND_Q8_0) {
            for (int j = 0; j < QK; j++) w[j] = (int8_t)blk[2 + j];
        } else {
            /* the nibbles follow d (and m), Q5's after its 4 bytes of fifth bits */
            const bool q5 = kind == KIND_Q5_0 || kind == KIND_Q5_1;
            const uint8_t *qs = blk + (has_min ? 4 : 2) + (q5 ? 4 : 0);
            uint32_t qh = 0;
            if (q5) memcpy(&qh, qs - 4, 4);
            const int bias = kind == KIND_Q4_0 ? 8 : kind == KIND_Q5_0 ? 16 : 0;
            for (int j = 0; j < QK / 2; j++) {
                w[j] = ((qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4)) - bias;
                w[j + QK / 2] = ((qs[j] >> 4) | (int)(((qh >> (j + QK / 2)) & 1u) << 4)) - bias;
            }
        }
        float dx, lane_sum[8];
        memcpy(&dx, xr + nb * QK + b * 4, 4);
        memcpy(lane_sum, xr + nb * (QK + 4) + b * 32, 32);
        const float scale = sd_f16_to_f32(sd_load_u16(blk)) * dx;
        const float mscale = has_min ? sd_f16_to_f32(sd_load_u16(blk + 2)) * dx : 0.0f;
        for (int k = 0; k < 8; k++) {
            int32_t p = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++) p += w[j] * q[b * QK + (size_t)j];
            acc[k] = fmaf((float)p, scale, acc[k]);
            if (has_min) acc[k] = fmaf(lane_sum[k], mscale, acc[k]);
        }
    }
    return sd_cpu_hsum8(acc);
}

/* The 32 unsigned integer weights of sub-block s of a K-quant super-block:
 * Q4_K nibbles 0..15, Q5_K 0..31, Q6_K the stored q 0..63 (its -32 is taken
 * off with the lane sums; quant_k.c: layouts). */
static void kweights_c(int kind, const uint8_t *blk, int s, int w[32]) {
    if (kind == KIND_Q6_K) {
        const int h = s / 4, k = s % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (k & 1), *qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            int lo = k < 2 ? ql[l] & 0x0f : ql[l] >> 4;
            w[l] = lo | (((qh[l] >> (2 * k)) & 3) << 4);
        }
        return;
    }
    const uint8_t *qs = blk + (kind == KIND_Q5_K ? 48 : 16) + 32 * (s / 2), *qh = blk + 16;
    for (int l = 0; l < 32; l++) {
        w[l] = s & 1 ? qs[l] >> 4 : qs[l] & 0x0f;
        if (kind == KIND_Q5_K) w[l] |= ((qh[l] >> s) & 1) << 4;
    }
}

/* One output element of a K-quant type on a K-quant activation row xr
 * (nsb super-blocks): the integer lane sums of quant_kernels.h, then per
 * super-block and lane t_k and one fused add. */
static float kdot_c(int kind, const uint8_t *wr, const uint8_t *xr, size_t nsb) {
    const size_t bb = kblock_bytes(kind);
    const int8_t *q = (const int8_t *)xr;
    float acc[8] = {0};
    for (size_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = wr + sb * bb;
        int sc[16], mins[8];
        float d, dmin;
        kscales_c(kind, blk, sc, mins, &d, &dmin);
        int16_t lsum[64];
        memcpy(lsum, q8k_lsums(xr, nsb, sb), sizeof lsum);
        int32_t isum[8] = {0}, msum[8] = {0};
        for (int s = 0; s < 8; s++) {
            int w[32];
            kweights_c(kind, blk, s, w);
            const int8_t *qs = q + sb * SD_QK_K + 32 * (size_t)s;
            for (int k = 0; k < 8; k++) {
                int32_t p = 0;
                for (int j = 4 * k; j < 4 * k + 4; j++) p += w[j] * qs[j];
                const int scale = kind == KIND_Q6_K ? sc[2 * s + k / 4] : sc[s];
                const int coef = kind == KIND_Q6_K ? sc[2 * s + k / 4] : mins[s];
                isum[k] += scale * p;
                msum[k] += coef * lsum[16 * (s / 2) + 2 * k + (s & 1)];
            }
        }
        const float dx = q8k_d(xr, nsb, sb);
        for (int k = 0; k < 8; k++) {
            const float t = kind == KIND_Q6_K ? (float)(isum[k] - 32 * msum[k]) * d
                                              : fmaf((float)msum[k], -dmin, (float)isum[k] * d);
            acc[k] = fmaf(t, dx, acc[k]);
        }
    }
    return sd_cpu_hsum8(acc);
}

/* One output element of F16 / BF16: sd_cpu_dot on the widened row. */
static float fdot_c(sd_dtype t, const uint8_t *wr, const float *x, size_t n) {
    size_t n8 = n & ~(size_t)7;
    float l[8] = {0};
    for (size_t i = 0; i < n8; i += 8)
        for (int j = 0; j < 8; j++) {
            uint16_t h = sd_load_u16(wr + 2 * (i + (size_t)j));
            float wv = t == SD_DTYPE_F16 ? sd_f16_to_f32(h) : bf16_to_float(h);
            l[j] = fmaf(wv, x[i + (size_t)j], l[j]);
        }
    return f16_row_tail(wr, x, n8, n, t == SD_DTYPE_F16, sd_cpu_hsum8(l));
}

/* ---- dispatch ---- */

static bool cpu_has_vnni(void) {
#if HAVE_VNNI_PATH
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

bool sd_cpu_qpath_available(sd_cpu_qpath p) {
    switch (p) {
    case SD_CPU_QPATH_AUTO:
    case SD_CPU_QPATH_C: return true;
    case SD_CPU_QPATH_AVX2: return SD_CPU_AVX2;
    case SD_CPU_QPATH_VNNI: return cpu_has_vnni();
    case SD_CPU_QPATH_AMX: return HAVE_AMX_PATH && cpu_has_vnni() && sd_cpu_amx_usable();
    }
    return false;
}

static sd_cpu_qpath auto_path(void) {
    if (sd_cpu_qpath_available(SD_CPU_QPATH_AMX)) return SD_CPU_QPATH_AMX;
    if (cpu_has_vnni()) return SD_CPU_QPATH_VNNI;
    return SD_CPU_AVX2 ? SD_CPU_QPATH_AVX2 : SD_CPU_QPATH_C;
}

static const char *path_name(sd_cpu_qpath p) {
    return p == SD_CPU_QPATH_AMX    ? "avx512-amx"
           : p == SD_CPU_QPATH_VNNI ? "avx512-vnni"
           : p == SD_CPU_QPATH_AVX2 ? "avx2"
                                    : "c";
}

/* The AMX path runs the VNNI tiles wherever it does not use its own. */
static bool vnni_tiles(sd_cpu_qpath p) { return p == SD_CPU_QPATH_VNNI || p == SD_CPU_QPATH_AMX; }

const char *sd_cpu_qpath_name(void) { return path_name(auto_path()); }

const char *sd_cpu_kernel_path(const char *qpath) {
    const sd_cpu_qpath p = sd_cpu_qpath_named(qpath);
    return p == SD_CPU_QPATH_AUTO ? sd_cpu_qpath_name() : path_name(p);
}

sd_cpu_qpath sd_cpu_qpath_named(const char *v) {
    if (!v || !*v) return SD_CPU_QPATH_AUTO;
    const sd_cpu_qpath named[] = {SD_CPU_QPATH_C, SD_CPU_QPATH_AVX2, SD_CPU_QPATH_VNNI, SD_CPU_QPATH_AMX};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (strcmp(v, path_name(named[i])) == 0) {
            if (sd_cpu_qpath_available(named[i])) return named[i];
            SD_WARN("cpu kernel path %s: this CPU or build has no such path; using %s", v, sd_cpu_qpath_name());
            return SD_CPU_QPATH_AUTO;
        }
    SD_WARN("cpu kernel path %s: not one of c, avx2, avx512-vnni, avx512-amx; using %s", v, sd_cpu_qpath_name());
    return SD_CPU_QPATH_AUTO;
}

typedef struct qmatmul_args {
    sd_cpu_qpath path;
    sd_dtype type;
    const uint8_t *w;
    size_t row_bytes;
    const float *x;    /* F16 / BF16 */
    const uint8_t *xq; /* integer types: q8 rows, or the prepared rows (zprep) when zprep */
    size_t xrow_bytes;
    bool zprep;
    /* K-quants on AMX tiles: xq is the activations laid out as B tiles
     * (sd_cpu_kamx_prep_x), kscratch thread ith's weight strip at
     * kscratch + ith * kscratch_bytes */
    bool kamx;
    uint8_t *kscratch;
    size_t kscratch_bytes;
    float *y;
    size_t n_in, n_out, n_tokens;
    size_t chunk_rows; /* output rows per pool chunk (chunk_rows()) */
} qmatmul_args;

/* Output rows per pool chunk. A call of up to MAX_T tokens streams its
 * weights once, and each chunk a thread claims starts its rows cold (the
 * tiles prefetch only inside their chunk, see qtile_fn), so such a call
 * takes chunks of up to STREAM_CHUNK_BYTES of weights: ROW_CHUNK rows times
 * what fits, but at least 4 chunks per thread so the threads still finish
 * together. Measured, Q8_0 at 1 token on 2 threads (2048-wide rows, 2 KiB
 * each): 48-row chunks 23-24 GB/s, 144-192 rows 25-26 GB/s
 * (bench/results/quant-cpu.md). Longer calls (prompts) compute far more per
 * byte and keep ROW_CHUNK, the finer balance; so do the K-quants, whose
 * tiles prefetch past their chunk (kprefetch_ahead) and which were not
 * measured with longer chunks. Any split gives the same
 * results: an element's arithmetic does not depend on its chunk. */
static size_t chunk_rows(const sd_backend *be, sd_dtype type, size_t n_out, size_t row_bytes, size_t n_tokens) {
    if (n_tokens > MAX_T || be->n_threads <= 1 || sd_dtype_is_k(type)) return ROW_CHUNK;
    size_t by_bytes = STREAM_CHUNK_BYTES / (ROW_CHUNK * row_bytes);
    size_t by_balance = n_out / ((size_t)ROW_CHUNK * 4 * (size_t)be->n_threads);
    size_t m = by_bytes < by_balance ? by_bytes : by_balance;
    return ROW_CHUNK * (m > 1 ? m : 1);
}

static void chunk_c(const qmatmul_args *a, size_t r_begin, size_t r_end) {
    size_t nb = a->n_in / QK;
    for (size_t t = 0; t < a->n_tokens; t++)
        for (size_t r = r_begin; r < r_end; r++) {
            const uint8_t *wr = a->w + r * a->row_bytes;
            const uint8_t *xr = a->xq ? a->xq + t * a->xrow_bytes : NULL;
            a->y[t * a->n_out + r] = sd_dtype_is_k(a->type)     ? kdot_c(kind_of(a->type), wr, xr, a->n_in / SD_QK_K)
                                     : is_integer_type(a->type) ? qdot_c(kind_of(a->type), wr, xr, nb)
                                                                : fdot_c(a->type, wr, a->x + t * a->n_in, a->n_in);
        }
}

static void qmatmul_chunk(void *p, int64_t c, int32_t ith) {
    const qmatmul_args *a = p;
    size_t r_begin, r_end;
    sd_cpu_chunk(a->n_out, a->chunk_rows, c, &r_begin, &r_end);
    if (a->path == SD_CPU_QPATH_C) {
        chunk_c(a, r_begin, r_end);
        return;
    }
#if HAVE_AMX_PATH
    if (a->kamx) {
        sd_cpu_kamx_rows(kind_of(a->type), a->w, a->row_bytes, r_begin, r_end, a->xq, a->n_in, a->n_tokens, a->y,
                         a->n_out, a->kscratch + (size_t)ith * a->kscratch_bytes);
        return;
    }
#endif
#if SD_CPU_AVX2
    size_t n = a->n_tokens, rb, tb;
    const bool integer = is_integer_type(a->type);
    /* one F16 / BF16 token streams the weights: the 512-bit tile measured
     * ~10% slower there than the AVX2 one (bench/results/quant-cpu.md) */
    const bool wide = vnni_tiles(a->path) && (integer || n > 1);
    qtile_shape(n, wide, &rb, &tb);
    const int kind = integer ? kind_of(a->type) : 0;
    const qtile_fn(*qt)[MAX_T] = sd_cpu_qtiles_avx2[kind];
#if HAVE_VNNI_PATH
    if (vnni_tiles(a->path)) qt = sd_cpu_vnni_qtiles(kind);
#endif
    const ftile_fn(*ft)[MAX_T] =
#if HAVE_VNNI_PATH
        wide ? sd_cpu_ftiles_vnni[a->type == SD_DTYPE_F16 ? 1 : 0] :
#endif
             sd_cpu_ftiles[a->type == SD_DTYPE_F16 ? 1 : 0];
    const size_t tok_block = a->zprep ? ZPREP_TOK_BLOCK : TOK_BLOCK;
    for (size_t t0 = 0; t0 < n; t0 += tok_block) {
        size_t t_end = t0 + tok_block < n ? t0 + tok_block : n;
        for (size_t r = r_begin; r < r_end; r += rb) {
            size_t nr = r_end - r < rb ? r_end - r : rb;
            const uint8_t *w = a->w + r * a->row_bytes;
            const size_t pf_ahead = r + rb < r_end ? rb * a->row_bytes : 0; /* the chunk's next tile */
            for (size_t t = t0; t < t_end; t += tb) {
                size_t nt = t_end - t < tb ? t_end - t : tb;
                float *y = a->y + t * a->n_out + r;
                if (integer)
                    qt[nr - 1][nt - 1](w, a->row_bytes, a->xq + t * a->xrow_bytes, a->xrow_bytes, a->n_in / QK, y,
                                       a->n_out, pf_ahead);
                else
                    ft[nr - 1][nt - 1](w, a->row_bytes, a->x + t * a->n_in, y, a->n_in, a->n_out, pf_ahead);
            }
        }
    }
#else
    chunk_c(a, r_begin, r_end);
#endif
}

sd_status sd_cpu_qmatmul(sd_backend *be, sd_cpu_qpath path, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                         const float *x, int32_t n_tokens, float *y) {
    if (!be || n_in <= 0 || n_out < 0 || n_tokens < 0) return SD_ERR_INVALID_ARG;
    if (!sd_cpu_qmatmul_supports(type) || !sd_cpu_qpath_available(path)) return SD_ERR_UNSUPPORTED;
    const bool integer = is_integer_type(type);
    if (integer && n_in % int_block(type) != 0) return SD_ERR_INVALID_ARG;
    if (n_tokens == 0 || n_out == 0) return SD_OK;
    if (path == SD_CPU_QPATH_AUTO) path = auto_path();
    size_t be_elems, bb;
    sd_dtype_block(type, &be_elems, &bb);
    qmatmul_args a = {.path = path,
                      .type = type,
                      .w = w,
                      .row_bytes = (size_t)n_in / be_elems * bb,
                      .x = x,
                      .y = y,
                      .n_in = (size_t)n_in,
                      .n_out = (size_t)n_out,
                      .n_tokens = (size_t)n_tokens};
    a.chunk_rows = chunk_rows(be, type, a.n_out, a.row_bytes, a.n_tokens);
    if (integer) {
        const bool k = sd_dtype_is_k(type);
        const size_t rb = k ? sd_cpu_q8k_row_bytes(n_in) : sd_cpu_q8_row_bytes(n_in), nb = (size_t)n_in / QK;
#if HAVE_VNNI_PATH
        a.zprep = vnni_tiles(path) && kind_zprep(kind_of(type));
#endif
#if HAVE_AMX_PATH
        a.kamx = path == SD_CPU_QPATH_AMX && k && n_tokens >= SD_AMX_MIN_TOKENS;
#endif
        /* the q8 rows, then (zprep) the prepared rows from a 64-byte
         * boundary, or (kamx) the B tiles and each thread's weight strip */
        const size_t q8_bytes = ((size_t)n_tokens * rb + 63) & ~(size_t)63;
        const size_t prow = a.zprep ? zprep_row_bytes(nb) : 0;
        size_t need;
        if (!sd_mul_ok(rb + prow, (size_t)n_tokens, &need) || need > SIZE_MAX - 64) return SD_ERR_NOMEM;
        need = q8_bytes + (size_t)n_tokens * prow;
        size_t xprep_bytes = 0;
#if HAVE_AMX_PATH
        if (a.kamx) {
            /* the B tiles are ~1.02 x n_in x (n_tokens + 15) bytes, a
             * thread's strip ~34.5 x n_in: both under this bound */
            size_t bound;
            if (!sd_mul_ok((size_t)n_in * 40, a.n_tokens + 15 + (size_t)be->n_threads, &bound) ||
                bound > SIZE_MAX / 2 - q8_bytes)
                return SD_ERR_NOMEM;
            xprep_bytes = (sd_cpu_kamx_xprep_bytes(a.n_in, a.n_tokens) + 63) & ~(size_t)63;
            a.kscratch_bytes = (sd_cpu_kamx_scratch_bytes(a.n_in) + 63) & ~(size_t)63;
            need = q8_bytes + xprep_bytes + (size_t)be->n_threads * a.kscratch_bytes;
        }
#endif
        if (need > be->qbuf_bytes) {
            void *q = aligned_alloc(64, (need + 63) & ~(size_t)63);
            if (!q) {
                SD_ERROR("cpu backend: cannot allocate %zu bytes of quantized activations", need);
                return SD_ERR_NOMEM;
            }
            free(be->qbuf);
            be->qbuf = q;
            be->qbuf_bytes = need;
        }
        uint8_t *q8 = be->qbuf, *prep = q8 + q8_bytes;
        for (int32_t t = 0; t < n_tokens; t++) {
            if (k)
                sd_cpu_q8k_quantize_row(x + (size_t)t * (size_t)n_in, n_in, q8 + (size_t)t * rb);
            else
                sd_cpu_q8_quantize_row(x + (size_t)t * (size_t)n_in, n_in, q8 + (size_t)t * rb);
#if HAVE_VNNI_PATH
            if (a.zprep) sd_cpu_zprep_row_vnni(q8 + (size_t)t * rb, nb, prep + (size_t)t * prow);
#endif
        }
        a.xq = a.zprep ? prep : q8;
        a.xrow_bytes = a.zprep ? prow : rb;
#if HAVE_AMX_PATH
        if (a.kamx) {
            sd_cpu_kamx_prep_x(q8, rb, a.n_in, a.n_tokens, prep);
            a.xq = prep;
            a.kscratch = prep + xprep_bytes;
        }
#else
        (void)xprep_bytes;
#endif
    }
    sd_cpu_parallel(be, qmatmul_chunk, &a, (int64_t)(((size_t)n_out + a.chunk_rows - 1) / a.chunk_rows),
                    (size_t)n_in * (size_t)n_out);
    return SD_OK;
}

sd_status sd_cpu_matmul_stored(sd_backend *be, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                               const float *x, int32_t n_tokens, float *y) {
    return sd_cpu_qmatmul(be, be ? (sd_cpu_qpath)be->qpath : SD_CPU_QPATH_AUTO, type, w, n_in, n_out, x, n_tokens, y);
}
