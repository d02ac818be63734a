/* quant_k.c — the K-quant types: super-blocks of 256 elements (ggml's
 * layouts, little-endian, no padding; a sub-block of 32 is "s", j its index):
 *
 *   Q4_K (144 B): f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]
 *       x = (d * sc_s) * nibble - (dmin * m_s)      (8 sub-blocks of 32)
 *   Q5_K (176 B): f16 d, f16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]
 *       x = (d * sc_s) * (nibble + 16 * hbit) - (dmin * m_s)
 *   Q6_K (210 B): uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d
 *       x = (d * scales[e / 16]) * (q - 32), q 6 bits  (16 sub-blocks of 16)
 *
 * Q4_K / Q5_K: sc_s and m_s are 6-bit, packed into 12 bytes: for s < 4,
 * sc = scales[s] & 63 and m = scales[s + 4] & 63; for s >= 4 the low 4 bits
 * come from scales[s + 4] (sc low nibble, m high nibble) and the top 2 bits
 * from the top bits of scales[s - 4] (sc) and scales[s] (m). Elements are
 * taken 64 at a time (chunk c = 0..3, sub-blocks 2c and 2c+1): element l of
 * sub-block 2c is the low nibble of qs[32c + l], of sub-block 2c+1 the high
 * nibble; Q5_K's fifth bit of those is bit 2c (resp. 2c+1) of qh[l].
 * Q6_K: the 256 elements are two halves of 128; in half h, for l < 32,
 * elements l, l+32, l+64, l+96 take their low 4 bits from ql[64h+l] low,
 * ql[64h+l+32] low, ql[64h+l] high, ql[64h+l+32] high, and their top 2 bits
 * from bits 0-1, 2-3, 4-5, 6-7 of qh[32h+l].
 *
 * Dequantization is written as the same float32 expressions (same grouping)
 * as ggml's reference and the gguf Python package, so with
 * -ffp-contract=off it is bit-identical to both (tests/ref/test_dequant.py).
 *
 * Quantization is this project's own, simple and not tuned for speed: each
 * sub-block gets a least-squares (scale, min) chosen among a few candidate
 * step sizes, the per-sub-block values are then quantized to 6 bits (8 bits
 * signed for Q6_K) against the super-block's largest, and the elements are
 * rounded against the scales as stored (f16 d times the integer scale), so
 * the rounding of the scales is not compounded. Rejected: importance
 * weighting (llama.cpp's imatrix), which needs activation statistics. */
#include <math.h>
#include <string.h>

#include "quant_impl.h"

static void store_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* The 6-bit scale and min of sub-block s (0..7) of a Q4_K / Q5_K block. */
static void scale_min(const uint8_t *q, int s, int *sc, int *m) {
    if (s < 4) {
        *sc = q[s] & 63;
        *m = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4);
        *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

/* The inverse of scale_min for all 8 sub-blocks (each value 0..63). */
static void pack_scale_min(const int sc[8], const int m[8], uint8_t q[12]) {
    memset(q, 0, 12);
    for (int s = 0; s < 4; s++) {
        q[s] = (uint8_t)sc[s];
        q[s + 4] = (uint8_t)m[s];
    }
    for (int s = 4; s < 8; s++) {
        q[s + 4] = (uint8_t)((sc[s] & 0x0f) | ((m[s] & 0x0f) << 4));
        q[s - 4] |= (uint8_t)((sc[s] >> 4) << 6);
        q[s] |= (uint8_t)((m[s] >> 4) << 6);
    }
}

/* ---- dequantize ---- */

static void dequant_q45_k(bool five, const uint8_t *b, float *y) {
    const float d = sd_quant_f16_to_f32(sd_load_u16(b)), dmin = sd_quant_f16_to_f32(sd_load_u16(b + 2));
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++) {
        int sc0, m0, sc1, m1;
        scale_min(scales, 2 * c, &sc0, &m0);
        scale_min(scales, 2 * c + 1, &sc1, &m1);
        const float d0 = d * (float)sc0, min0 = dmin * (float)m0;
        const float d1 = d * (float)sc1, min1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 0x0f, hi = qs[32 * c + l] >> 4;
            if (five) {
                lo += ((qh[l] >> (2 * c)) & 1) << 4;
                hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            y[64 * c + l] = d0 * (float)lo - min0;
            y[64 * c + 32 + l] = d1 * (float)hi - min1;
        }
    }
}

static void dequant_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = sd_quant_f16_to_f32(sd_load_u16(b + 208));
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t lo = ql[64 * h + l], hi = ql[64 * h + l + 32], top = qh[32 * h + l];
            const int q[4] = {(lo & 0x0f) | ((top & 3) << 4), (hi & 0x0f) | (((top >> 2) & 3) << 4),
                              (lo >> 4) | (((top >> 4) & 3) << 4), (hi >> 4) | (((top >> 6) & 3) << 4)};
            for (int k = 0; k < 4; k++) {
                const int e = 128 * h + 32 * k + l;
                y[e] = d * (float)scales[e / 16] * (float)(q[k] - 32);
            }
        }
    }
}

void sd_quant_k_dequantize(sd_dtype t, const uint8_t *src, uint64_t n_blocks, float *out) {
    size_t be, bb;
    sd_dtype_block(t, &be, &bb);
    for (uint64_t i = 0; i < n_blocks; i++, src += bb, out += SD_QK_K) {
        if (t == SD_DTYPE_Q6_K)
            dequant_q6_k(src, out);
        else
            dequant_q45_k(t == SD_DTYPE_Q5_K, src, out);
    }
}

int64_t sd_dtype_first_bad_scale(sd_dtype t, const void *data, uint64_t n_blocks) {
    size_t be, bb;
    if (!sd_dtype_is_k(t) || !data || !sd_dtype_block(t, &be, &bb)) return -1;
    const uint8_t *b = data;
    for (uint64_t i = 0; i < n_blocks; i++, b += bb) {
        /* an f16 is NaN or infinite when its exponent bits are all ones */
        const bool bad = t == SD_DTYPE_Q6_K
                             ? (sd_load_u16(b + 208) & 0x7c00u) == 0x7c00u
                             : (sd_load_u16(b) & 0x7c00u) == 0x7c00u || (sd_load_u16(b + 2) & 0x7c00u) == 0x7c00u;
        if (bad) return (int64_t)i;
    }
    return -1;
}

/* ---- quantize ---- */

static int round_clamp(float v, int lo, int hi) {
    if (!(v >= (float)lo)) return lo; /* NaN too */
    if (v > (float)hi) return hi;
    return (int)lroundf(v);
}

/* Asymmetric fit of n values to scale * L - min with L in 0..nmax, min >= 0
 * (the offset only shifts down, as the format stores it): tries step sizes
 * around range / nmax and keeps the least-squares (scale, min) of the best. */
static void fit_asym(const float *x, int n, int nmax, float *scale, float *min) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    *scale = 0.0f;
    *min = -lo;
    if (!(hi > lo)) return;
    float best = INFINITY;
    for (int k = -6; k <= 6; k++) {
        const float iscale = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        float sl = 0, sll = 0, sx = 0, sxl = 0;
        int L[SD_QK_K];
        for (int i = 0; i < n; i++) {
            L[i] = round_clamp((x[i] - lo) * iscale, 0, nmax);
            sl += (float)L[i];
            sll += (float)(L[i] * L[i]);
            sx += x[i];
            sxl += x[i] * (float)L[i];
        }
        /* least squares for x ~ s L - m; with m < 0 fixed at 0 instead */
        const float det = (float)n * sll - sl * sl;
        float s = det > 0.0f ? ((float)n * sxl - sl * sx) / det : 0.0f;
        float m = det > 0.0f ? (sl * sxl - sll * sx) / det : -lo;
        if (m < 0.0f) {
            m = 0.0f;
            s = sll > 0.0f ? sxl / sll : 0.0f;
        }
        if (!(s > 0.0f)) continue;
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float r = s * (float)round_clamp((x[i] + m) / s, 0, nmax) - m - x[i];
            err += r * r;
        }
        if (err < best) {
            best = err;
            *scale = s;
            *min = m;
        }
    }
}

/* Symmetric fit of n values to scale * L with L in -nmax..nmax-1 (scale may
 * be negative so the extreme value can use -nmax), least squares over a few
 * step sizes. */
static float fit_sym(const float *x, int n, int nmax) {
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            vmax = x[i];
        }
    if (!(amax > 0.0f)) return 0.0f;
    float best = INFINITY, best_s = vmax / (float)-nmax;
    for (int k = -4; k <= 4; k++) {
        const float iscale = -((float)nmax + 0.1f * (float)k) / vmax;
        float sll = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int L = round_clamp(x[i] * iscale, -nmax, nmax - 1);
            sll += (float)(L * L);
            sxl += x[i] * (float)L;
        }
        if (!(sll > 0.0f)) continue;
        const float s = sxl / sll;
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float r = s * (float)round_clamp(x[i] / s, -nmax, nmax - 1) - x[i];
            err += r * r;
        }
        if (err < best) {
            best = err;
            best_s = s;
        }
    }
    return best_s;
}

/* Squared error of n values rounded to ds * L - dm, L in 0..nmax. */
static float asym_error(const float *x, int n, int nmax, float ds, float dm) {
    float err = 0;
    for (int i = 0; i < n; i++) {
        const int L = ds > 0.0f ? round_clamp((x[i] + dm) / ds, 0, nmax) : 0;
        const float r = ds * (float)L - dm - x[i];
        err += r * r;
    }
    return err;
}

static void quant_q45_k(bool five, const float *x, uint8_t *b) {
    const int nmax = five ? 31 : 15;
    float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < 8; s++) {
        fit_asym(x + 32 * s, 32, nmax, &scale[s], &min[s]);
        max_scale = fmaxf(max_scale, scale[s]);
        max_min = fmaxf(max_min, min[s]);
    }
    const uint16_t dh = sd_quant_f32_to_f16(max_scale / 63.0f), mh = sd_quant_f32_to_f16(max_min / 63.0f);
    const float d = sd_quant_f16_to_f32(dh), dmin = sd_quant_f16_to_f32(mh);
    int sc[8], m[8];
    for (int s = 0; s < 8; s++) {
        /* the 6-bit pair nearest the fit, or a neighbour of it where that
         * rounds this sub-block's values better (small sub-blocks lose the
         * most to the integer scales) */
        const int sc0 = d > 0.0f ? round_clamp(scale[s] / d, 0, 63) : 0;
        const int m0 = dmin > 0.0f ? round_clamp(min[s] / dmin, 0, 63) : 0;
        float best = INFINITY;
        for (int i = -1; i <= 1; i++)
            for (int j = -1; j <= 1; j++) {
                const int a = sc0 + i, c = m0 + j;
                if (a < 0 || a > 63 || c < 0 || c > 63) continue;
                const float e = asym_error(x + 32 * s, 32, nmax, d * (float)a, dmin * (float)c);
                if (e < best) {
                    best = e;
                    sc[s] = a;
                    m[s] = c;
                }
            }
    }
    store_u16(b, dh);
    store_u16(b + 2, mh);
    pack_scale_min(sc, m, b + 4);
    uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    if (five) memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int L[2];
            for (int k = 0; k < 2; k++) {
                const int s = 2 * c + k;
                const float ds = d * (float)sc[s], dm = dmin * (float)m[s];
                L[k] = ds > 0.0f ? round_clamp((x[32 * s + l] + dm) / ds, 0, nmax) : 0;
                if (five) qh[l] |= (uint8_t)(((L[k] >> 4) & 1) << s);
            }
            qs[32 * c + l] = (uint8_t)((L[0] & 0x0f) | ((L[1] & 0x0f) << 4));
        }
}

/* Squared error of n values rounded to ds * (q - 32), q in 0..63. */
static float sym_error(const float *x, int n, float ds) {
    float err = 0;
    for (int i = 0; i < n; i++) {
        const float r = ds * (float)(ds != 0.0f ? round_clamp(x[i] / ds, -32, 31) : 0) - x[i];
        err += r * r;
    }
    return err;
}

static void quant_q6_k(const float *x, uint8_t *b) {
    float scale[16], max_abs = 0.0f;
    for (int s = 0; s < 16; s++) {
        scale[s] = fit_sym(x + 16 * s, 16, 32);
        max_abs = fmaxf(max_abs, fabsf(scale[s]));
    }
    const uint16_t dh = sd_quant_f32_to_f16(max_abs / 127.0f);
    const float d = sd_quant_f16_to_f32(dh);
    int8_t *scales = (int8_t *)(b + 192);
    int q[SD_QK_K];
    for (int s = 0; s < 16; s++) {
        /* the int8 scale nearest the fit, or a neighbour that rounds better */
        const int sc0 = d > 0.0f ? round_clamp(scale[s] / d, -127, 127) : 0;
        int sc = sc0;
        float best = INFINITY;
        for (int i = -1; i <= 1; i++) {
            if (sc0 + i < -127 || sc0 + i > 127) continue;
            const float e = sym_error(x + 16 * s, 16, d * (float)(sc0 + i));
            if (e < best) {
                best = e;
                sc = sc0 + i;
            }
        }
        scales[s] = (int8_t)sc;
        const float ds = d * (float)sc;
        for (int i = 0; i < 16; i++) q[16 * s + i] = (ds != 0.0f ? round_clamp(x[16 * s + i] / ds, -32, 31) : 0) + 32;
    }
    store_u16(b + 208, dh);
    uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int *e = q + 128 * h + l; /* e[0], e[32], e[64], e[96] */
            ql[64 * h + l] = (uint8_t)((e[0] & 0x0f) | ((e[64] & 0x0f) << 4));
            ql[64 * h + l + 32] = (uint8_t)((e[32] & 0x0f) | ((e[96] & 0x0f) << 4));
            qh[32 * h + l] = (uint8_t)((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
        }
}

void sd_quant_k_quantize(sd_dtype t, const float *in, uint64_t n_blocks, uint8_t *dst) {
    size_t be, bb;
    sd_dtype_block(t, &be, &bb);
    for (uint64_t i = 0; i < n_blocks; i++, in += SD_QK_K, dst += bb) {
        if (t == SD_DTYPE_Q6_K)
            quant_q6_k(in, dst);
        else
            quant_q45_k(t == SD_DTYPE_Q5_K, in, dst);
    }
}
