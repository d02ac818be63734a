/* quant.c — element types of GGUF tensors: block sizes, dequantize, quantize.
 *
 * Block layouts are ggml's (all little-endian, blocks of 32 for the quantized
 * types, no padding):
 *   Q8_0 (34 B): f16 d, int8 q[32];                 x = q * d
 *   Q4_0 (18 B): f16 d, uint8 qs[16];               x = (nibble - 8) * d
 *   Q4_1 (20 B): f16 d, f16 m, uint8 qs[16];        x = nibble * d + m
 *   Q5_0 (22 B): f16 d, uint8 qh[4], uint8 qs[16];  x = (v - 16) * d
 *   Q5_1 (24 B): f16 d, f16 m, uint8 qh[4], qs[16]; x = v * d + m
 * where a Q5 value v is a nibble of qs plus bit j of the little-endian
 * 32-bit qh (element j's) as its fifth bit,
 * and the K-quants Q4_K, Q5_K, Q6_K in super-blocks of 256 (quant_k.c),
 * where element j < 16 is the low nibble of qs[j] and element j + 16 the
 * high nibble. Dequantization is written as the same float32 expressions the
 * reference implementations use (and the build uses -ffp-contract=off), so
 * results are bit-identical to ggml's and the gguf Python package's.
 *
 * Quantization follows the reference (non-SIMD) ggml quantizers: the scale
 * comes from the block's absolute maximum (Q8_0, Q4_0, Q5_0) or its range
 * (Q4_1, Q5_1),
 * and values are rounded to nearest. It exists for tools and tests that write
 * models; it is not tuned for speed. Block data may be unaligned: every
 * multi-byte load and store goes through memcpy. */
#include "quant_impl.h"

#include <math.h>
#include <string.h>

#define QK 32 /* elements per quantized block */

const char *sd_dtype_name(sd_dtype t) {
    switch (t) {
    case SD_DTYPE_F32: return "F32";
    case SD_DTYPE_F16: return "F16";
    case SD_DTYPE_Q4_0: return "Q4_0";
    case SD_DTYPE_Q4_1: return "Q4_1";
    case SD_DTYPE_Q5_0: return "Q5_0";
    case SD_DTYPE_Q5_1: return "Q5_1";
    case SD_DTYPE_Q8_0: return "Q8_0";
    case SD_DTYPE_BF16: return "BF16";
    case SD_DTYPE_Q4_K: return "Q4_K";
    case SD_DTYPE_Q5_K: return "Q5_K";
    case SD_DTYPE_Q6_K: return "Q6_K";
    }
    return "?";
}

bool sd_dtype_block(sd_dtype t, size_t *block_elems, size_t *block_bytes) {
    size_t e, b;
    switch (t) {
    case SD_DTYPE_F32:
        e = 1;
        b = 4;
        break;
    case SD_DTYPE_F16:
        e = 1;
        b = 2;
        break;
    case SD_DTYPE_BF16:
        e = 1;
        b = 2;
        break;
    case SD_DTYPE_Q8_0:
        e = QK;
        b = 2 + QK;
        break;
    case SD_DTYPE_Q4_0:
        e = QK;
        b = 2 + QK / 2;
        break;
    case SD_DTYPE_Q4_1:
        e = QK;
        b = 4 + QK / 2;
        break;
    case SD_DTYPE_Q5_0: /* d, the fifth bits, the nibbles */
        e = QK;
        b = 2 + 4 + QK / 2;
        break;
    case SD_DTYPE_Q5_1: /* d, m, the fifth bits, the nibbles */
        e = QK;
        b = 4 + 4 + QK / 2;
        break;
    case SD_DTYPE_Q4_K: /* d, dmin, 12 bytes of 6-bit scales, 4-bit q */
        e = SD_QK_K;
        b = 4 + 12 + SD_QK_K / 2;
        break;
    case SD_DTYPE_Q5_K: /* as Q4_K plus a high bit per element */
        e = SD_QK_K;
        b = 4 + 12 + SD_QK_K / 8 + SD_QK_K / 2;
        break;
    case SD_DTYPE_Q6_K: /* low 4 bits, high 2 bits, 16 int8 scales, d */
        e = SD_QK_K;
        b = SD_QK_K / 2 + SD_QK_K / 4 + SD_QK_K / 16 + 2;
        break;
    default: return false;
    }
    if (block_elems) *block_elems = e;
    if (block_bytes) *block_bytes = b;
    return true;
}

/* ---- scalar conversions ---- */

static float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void store_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return bits_to_f32(sign);
        exp = 113; /* subnormal: normalize, 2^-14 is float exponent 113 */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        return bits_to_f32(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Round to nearest, ties to even; overflow gives infinity, NaN stays NaN. */
static uint16_t f32_to_f16(float f) {
    uint32_t x = f32_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;
    if (ax >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to infinity */
    uint32_t e = ax >> 23;
    if (e < 113) { /* below 2^-14: subnormal half, in units of 2^-24 */
        if (e < 102) return sign;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((e - 112) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float sd_quant_f16_to_f32(uint16_t h) { return f16_to_f32(h); }

uint16_t sd_quant_f32_to_f16(float f) { return f32_to_f16(f); }

bool sd_dtype_is_k(sd_dtype t) { return t == SD_DTYPE_Q4_K || t == SD_DTYPE_Q5_K || t == SD_DTYPE_Q6_K; }

static float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

static uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---- validation ---- */

/* True when any of n 16-bit values at src has all of mask's bits set: for
 * mask 0x7c00 an f16 that is NaN or infinite, for 0x7f80 such a bf16. One
 * OR-reduction the compiler vectorizes; the caller looks for where only on a
 * hit. */
static bool any_exponent_full(const uint8_t *src, uint64_t n, uint16_t mask) {
    uint32_t any = 0;
    for (uint64_t i = 0; i < n; i++) any |= (uint32_t)((sd_load_u16(src + 2 * i) & mask) == mask);
    return any != 0;
}

int64_t sd_dtype_first_non_finite(sd_dtype t, const void *data, uint64_t n_elems) {
    size_t be, bb;
    if (!sd_dtype_block(t, &be, &bb) || n_elems % be != 0 || !data) return -1;
    const uint8_t *src = data;
    if (sd_dtype_is_k(t)) {
        int64_t b = sd_dtype_first_bad_scale(t, src, n_elems / be);
        return b < 0 ? -1 : b * (int64_t)be;
    }
    switch (t) {
    case SD_DTYPE_F32: {
        uint32_t any = 0;
        for (uint64_t i = 0; i < n_elems; i++) {
            uint32_t bits;
            memcpy(&bits, src + 4 * i, 4);
            any |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
        }
        for (uint64_t i = 0; any && i < n_elems; i++) {
            uint32_t bits;
            memcpy(&bits, src + 4 * i, 4);
            if ((bits & 0x7f800000u) == 0x7f800000u) return (int64_t)i;
        }
        return -1;
    }
    case SD_DTYPE_F16:
    case SD_DTYPE_BF16: {
        const uint16_t mask = t == SD_DTYPE_F16 ? 0x7c00u : 0x7f80u;
        if (!any_exponent_full(src, n_elems, mask)) return -1;
        for (uint64_t i = 0; i < n_elems; i++)
            if ((sd_load_u16(src + 2 * i) & mask) == mask) return (int64_t)i;
        return -1;
    }
    case SD_DTYPE_Q8_0:
    case SD_DTYPE_Q4_0:
    case SD_DTYPE_Q4_1:
    case SD_DTYPE_Q5_0:
    case SD_DTYPE_Q5_1: {
        /* d (and Q4_1's and Q5_1's m) lead the block; with them finite every
         * value is (|d| <= 65504 times at most 128, plus m) */
        const bool has_m = t == SD_DTYPE_Q4_1 || t == SD_DTYPE_Q5_1;
        for (uint64_t b = 0; b < n_elems / be; b++) {
            const uint8_t *blk = src + b * bb;
            if ((sd_load_u16(blk) & 0x7c00u) == 0x7c00u || (has_m && (sd_load_u16(blk + 2) & 0x7c00u) == 0x7c00u))
                return (int64_t)(b * be);
        }
        return -1;
    }
    default: return -1;
    }
}

/* ---- dequantize ---- */

sd_status sd_dequantize(sd_dtype t, const void *data, uint64_t n_elems, float *out) {
    size_t be, bb;
    if (!sd_dtype_block(t, &be, &bb) || n_elems % be != 0 || (n_elems && (!data || !out))) return SD_ERR_INVALID_ARG;
    const uint8_t *src = data;
    if (sd_dtype_is_k(t)) {
        sd_quant_k_dequantize(t, src, n_elems / SD_QK_K, out);
        return SD_OK;
    }
    switch (t) {
    case SD_DTYPE_F32: memcpy(out, src, (size_t)n_elems * 4); break;
    case SD_DTYPE_F16:
        for (uint64_t i = 0; i < n_elems; i++) out[i] = f16_to_f32(sd_load_u16(src + 2 * i));
        break;
    case SD_DTYPE_BF16:
        for (uint64_t i = 0; i < n_elems; i++) out[i] = bf16_to_f32(sd_load_u16(src + 2 * i));
        break;
    case SD_DTYPE_Q8_0:
        for (uint64_t b = 0; b < n_elems / QK; b++, src += bb, out += QK) {
            const float d = f16_to_f32(sd_load_u16(src));
            const int8_t *q = (const int8_t *)(src + 2);
            for (int j = 0; j < QK; j++) out[j] = (float)q[j] * d;
        }
        break;
    case SD_DTYPE_Q4_0:
        for (uint64_t b = 0; b < n_elems / QK; b++, src += bb, out += QK) {
            const float d = f16_to_f32(sd_load_u16(src));
            const uint8_t *qs = src + 2;
            for (int j = 0; j < QK / 2; j++) {
                out[j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
                out[j + QK / 2] = (float)((int)(qs[j] >> 4) - 8) * d;
            }
        }
        break;
    case SD_DTYPE_Q4_1:
        for (uint64_t b = 0; b < n_elems / QK; b++, src += bb, out += QK) {
            const float d = f16_to_f32(sd_load_u16(src));
            const float m = f16_to_f32(sd_load_u16(src + 2));
            const uint8_t *qs = src + 4;
            for (int j = 0; j < QK / 2; j++) {
                out[j] = (float)(qs[j] & 0x0f) * d + m;
                out[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
            }
        }
        break;
    case SD_DTYPE_Q5_0:
    case SD_DTYPE_Q5_1: {
        const bool has_m = t == SD_DTYPE_Q5_1;
        for (uint64_t b = 0; b < n_elems / QK; b++, src += bb, out += QK) {
            const float d = f16_to_f32(sd_load_u16(src));
            const float m = has_m ? f16_to_f32(sd_load_u16(src + 2)) : 0.0f;
            const uint8_t *qh = src + (has_m ? 4 : 2), *qs = qh + 4;
            const uint32_t h = load_u32(qh);
            for (int j = 0; j < QK / 2; j++) {
                const int v0 = (qs[j] & 0x0f) | (int)(((h >> j) & 1u) << 4);
                const int v1 = (qs[j] >> 4) | (int)(((h >> (j + QK / 2)) & 1u) << 4);
                if (has_m) {
                    out[j] = (float)v0 * d + m;
                    out[j + QK / 2] = (float)v1 * d + m;
                } else {
                    out[j] = (float)(v0 - 16) * d;
                    out[j + QK / 2] = (float)(v1 - 16) * d;
                }
            }
        }
        break;
    }
    default: break; /* the K types returned above */
    }
    return SD_OK;
}

/* ---- quantize ---- */

/* Truncates v clamped to [lo, hi] to an int (NaN maps to lo). */
static int clamp_trunc(float v, float lo, float hi) {
    if (!(v >= lo)) return (int)lo;
    if (v > hi) return (int)hi;
    return (int)v;
}

/* The value of largest magnitude among x[0..QK), with its sign (the
 * symmetric formats' scale: Q4_0, Q5_0). */
static float signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

/* The range of x[0..QK) (the formats with a minimum: Q4_1, Q5_1). */
static void block_range(const float *x, float *min, float *max) {
    *min = *max = x[0];
    for (int j = 1; j < QK; j++) {
        *min = fminf(*min, x[j]);
        *max = fmaxf(*max, x[j]);
    }
}

/* A Q5 block's 32 values v (0..31) as its 4 bytes of fifth bits (bit j of
 * the little-endian word: v_j >= 16) and its 16 bytes of nibbles (element j
 * low, j + 16 high), from qh on. */
static void pack_q5(const int v[QK], uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < QK / 2; j++) {
        qh[4 + j] = (uint8_t)((v[j] & 0x0f) | ((v[j + QK / 2] & 0x0f) << 4));
        h |= (uint32_t)(v[j] >> 4) << j | (uint32_t)(v[j + QK / 2] >> 4) << (j + QK / 2);
    }
    memcpy(qh, &h, 4);
}

sd_status sd_quantize(sd_dtype t, const float *in, uint64_t n_elems, void *out) {
    size_t be, bb;
    if (!sd_dtype_block(t, &be, &bb) || n_elems % be != 0 || (n_elems && (!in || !out))) return SD_ERR_INVALID_ARG;
    uint8_t *dst = out;
    if (sd_dtype_is_k(t)) {
        sd_quant_k_quantize(t, in, n_elems / SD_QK_K, dst);
        return SD_OK;
    }
    switch (t) {
    case SD_DTYPE_F32: memcpy(dst, in, (size_t)n_elems * 4); break;
    case SD_DTYPE_F16:
        for (uint64_t i = 0; i < n_elems; i++) store_u16(dst + 2 * i, f32_to_f16(in[i]));
        break;
    case SD_DTYPE_BF16:
        for (uint64_t i = 0; i < n_elems; i++) store_u16(dst + 2 * i, f32_to_bf16(in[i]));
        break;
    case SD_DTYPE_Q8_0:
        for (uint64_t b = 0; b < n_elems / QK; b++, in += QK, dst += bb) {
            float amax = 0.0f;
            for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(in[j]));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            store_u16(dst, f32_to_f16(d));
            for (int j = 0; j < QK; j++) {
                int q = clamp_trunc(roundf(in[j] * id), -127.0f, 127.0f);
                dst[2 + j] = (uint8_t)(int8_t)q;
            }
        }
        break;
    case SD_DTYPE_Q4_0:
        for (uint64_t b = 0; b < n_elems / QK; b++, in += QK, dst += bb) {
            const float d = signed_absmax(in) / -8.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            store_u16(dst, f32_to_f16(d));
            for (int j = 0; j < QK / 2; j++) {
                int lo = clamp_trunc(in[j] * id + 8.5f, 0.0f, 15.0f);
                int hi = clamp_trunc(in[j + QK / 2] * id + 8.5f, 0.0f, 15.0f);
                dst[2 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
        break;
    case SD_DTYPE_Q4_1:
        for (uint64_t b = 0; b < n_elems / QK; b++, in += QK, dst += bb) {
            float min, max;
            block_range(in, &min, &max);
            const float d = (max - min) / 15.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            store_u16(dst, f32_to_f16(d));
            store_u16(dst + 2, f32_to_f16(min));
            for (int j = 0; j < QK / 2; j++) {
                int lo = clamp_trunc((in[j] - min) * id + 0.5f, 0.0f, 15.0f);
                int hi = clamp_trunc((in[j + QK / 2] - min) * id + 0.5f, 0.0f, 15.0f);
                dst[4 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
        break;
    case SD_DTYPE_Q5_0:
        for (uint64_t b = 0; b < n_elems / QK; b++, in += QK, dst += bb) {
            const float d = signed_absmax(in) / -16.0f; /* as Q4_0, on 32 levels */
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            store_u16(dst, f32_to_f16(d));
            int v[QK];
            for (int j = 0; j < QK; j++) v[j] = clamp_trunc(in[j] * id + 16.5f, 0.0f, 31.0f);
            pack_q5(v, dst + 2);
        }
        break;
    case SD_DTYPE_Q5_1:
        for (uint64_t b = 0; b < n_elems / QK; b++, in += QK, dst += bb) {
            float min, max;
            block_range(in, &min, &max);
            const float d = (max - min) / 31.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            store_u16(dst, f32_to_f16(d));
            store_u16(dst + 2, f32_to_f16(min));
            int v[QK];
            for (int j = 0; j < QK; j++) v[j] = clamp_trunc((in[j] - min) * id + 0.5f, 0.0f, 31.0f);
            pack_q5(v, dst + 4);
        }
        break;
    default: break; /* the K types returned above */
    }
    return SD_OK;
}

float sd_f16_to_f32(uint16_t h) { return f16_to_f32(h); }

uint16_t sd_f32_to_f16(float f) { return f32_to_f16(f); }
