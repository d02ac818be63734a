/* quant_kernels.h — matmul on weights as stored (F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
 *
 * y[t][o] = sum_i W[o][i] * x[t][i] where W stays in its GGUF layout: rows of
 * n_in elements, a Q row being n_in/32 blocks (quant.c has the layouts). The
 * integer formats multiply 8-bit activations: each token row of x is first
 * quantized into blocks of 32 (the K-quants: of 256) (an f32 scale dx, int8
 * q = rint(x / dx), |q| <= 127) and every block product is an exact integer
 * dot product.
 *
 * The arithmetic of one output element, fixed whatever the batch, tile,
 * thread count or code path (C, AVX2, AVX-512 VNNI), so results are batch
 * invariant and every path agrees bit for bit with the plain C twin:
 *   - integer formats: 8 float lanes; for block b in increasing order, lane
 *     k (elements 4k..4k+3 of the block) takes
 *         acc[k] = fmaf((float)P_bk, dw_b * dx_b, acc[k])
 *     with P_bk the exact integer sum of w_j * q_j over its 4 elements (w_j
 *     = q for Q8_0, nibble - 8 for Q4_0, nibble for Q4_1, v - 16 for Q5_0
 *     and v for Q5_1, v the 5-bit value), and for Q4_1 and Q5_1 then
 *         acc[k] = fmaf((float)S_bk, m_b * dx_b, acc[k])
 *     with S_bk the sum of q_j over the same 4 elements (the block minimum's
 *     share); the result is the fixed lane tree sd_cpu_hsum8(acc).
 *   - K-quants (256-element super-blocks, n_in a multiple of 256): the
 *     activations have their own rows, one f32 scale dx_B per 256-element
 *     block B (the super-block) and int8 q as above, plus the sums of q over
 *     each 4 elements; for super-block B in increasing order, with w_j the
 *     unsigned stored value (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) and the
 *     exact int32 sums per lane k (elements 4k..4k+3 of each of the 8
 *     32-element sub-blocks s):
 *         I_k = sum_s sc_{s,k} * P_{s,k}     (P_{s,k}: sum of w_j q_j)
 *         M_k = sum_s c_{s,k} * S_{s,k}      (S_{s,k}: sum of q_j)
 *     Q4_K / Q5_K: sc_{s,k} = sc_s, c_{s,k} = m_s (6 bits), and
 *         t_k = fmaf((float)M_k, -dmin, (float)I_k * d)
 *     Q6_K (16-element sub-blocks: lanes 0-3 take a 32-block's first half):
 *     sc_{s,k} = c_{s,k} = scales[2s + k/4] (int8), and
 *         t_k = (float)(I_k - 32 * M_k) * d
 *     then acc[k] = fmaf(t_k, dx_B, acc[k]), and at the end the lane tree
 *     sd_cpu_hsum8(acc). The dot and the minimum of the same elements meet
 *     in t_k, per super-block and lane. The integers cannot overflow
 *     (|I_k - 32 M_k| < 2^26).
 *   - F16 / BF16: the weights are widened to f32 (exact) and the dot product
 *     is sd_cpu_dot's (8 lanes over i, lane tree, fused tail): the same bits
 *     as the f32 matmul on the widened matrix.
 *
 * Error against the exact product of the dequantized weights with x: only
 * the activation rounding (|x - q*dx| <= dx/2 = amax_b/254 per element, b
 * the element's block of 32 or, for the K-quants, of 256) and f32
 * accumulation; tests/test_qmatmul.c states the bound it checks. */
#ifndef SPECD_CPU_QUANT_KERNELS_H
#define SPECD_CPU_QUANT_KERNELS_H

#include "cpu/cpu_impl.h"
#include "specd/gguf.h"

/* Which implementation runs (tests name one; the backend uses AUTO: the
 * fastest this CPU has). */
typedef enum sd_cpu_qpath {
    SD_CPU_QPATH_AUTO = 0,
    SD_CPU_QPATH_C,    /* the plain C twin */
    SD_CPU_QPATH_AVX2, /* AVX2 + FMA + F16C (x86-64-v3, the build's baseline) */
    SD_CPU_QPATH_VNNI, /* AVX-512 VNNI integer dots (run-time checked) */
    SD_CPU_QPATH_AMX,  /* the VNNI path, with AMX-INT8 tile products for K-quant calls of
                          16 or more tokens (run-time checked, with the kernel's permission) */
} sd_cpu_qpath;

/* True for the stored types sd_cpu_qmatmul computes on. */
bool sd_cpu_qmatmul_supports(sd_dtype type);

/* True when path can run on this CPU (C and AUTO always). */
bool sd_cpu_qpath_available(sd_cpu_qpath path);

/* Name of the path AUTO picks on this CPU ("c", "avx2", "avx512-vnni",
 * "avx512-amx"). */
const char *sd_cpu_qpath_name(void);

/* Bytes of one token row of quantized activations for n_in (a multiple of
 * 32; the K-quants use the same rows): q int8 [nb*32], then dx f32 [nb], then S f32 [nb][8] (per-lane sums
 * of q, see the file comment). */
size_t sd_cpu_q8_row_bytes(int32_t n_in);

/* Quantizes one activation row x [n_in] (n_in a multiple of 32) into dst
 * (sd_cpu_q8_row_bytes(n_in) bytes): per block dx = amax / 127,
 * q = clamp(rint(x * (1/dx)), -127, 127) rounding to nearest even, 0 when
 * amax is 0. */
void sd_cpu_q8_quantize_row(const float *x, int32_t n_in, void *dst);

/* Bytes of one token row of K-quant activations for n_in (a multiple of
 * 256): per 256-element block q int8 [256], then the f32 scales [n_in/256],
 * then int16 lane sums [n_in/256][64] (qmatmul_impl.h: the layout). */
size_t sd_cpu_q8k_row_bytes(int32_t n_in);

/* Quantizes one activation row x [n_in] (n_in a multiple of 256) into dst
 * (sd_cpu_q8k_row_bytes(n_in) bytes) for the K-quants: as
 * sd_cpu_q8_quantize_row but with one scale per 256 elements (d = amax / 127
 * over the 256), and the sums of q over each 4 elements as int16. */
void sd_cpu_q8k_quantize_row(const float *x, int32_t n_in, void *dst);

/* y [n_tokens][n_out] = W x with W of type (one of sd_cpu_qmatmul_supports)
 * stored at w as n_out rows, x [n_tokens][n_in]. For the integer types n_in
 * must be a multiple of 32 (256 for the K-quants). Uses the backend's pool and its activation
 * buffer (not reentrant on one backend). SD_ERR_UNSUPPORTED when path is not
 * available here or type is not supported; SD_ERR_NOMEM when the activation
 * buffer cannot grow. */
sd_status sd_cpu_qmatmul(sd_backend *be, sd_cpu_qpath path, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                         const float *x, int32_t n_tokens, float *y);

/* The path named ("c", "avx2", "avx512-vnni", "avx512-amx"; for measuring
 * and testing one path inside a whole model: --cpu-qpath,
 * sd_backend_opts.cpu_qpath), taken when a backend is created;
 * SD_CPU_QPATH_AUTO when name is NULL or empty, or (with a warning) names a
 * path this CPU or build does not have. */
sd_cpu_qpath sd_cpu_qpath_named(const char *name);

/* The backend op: sd_cpu_qmatmul with the backend's path (AUTO unless
 * sd_backend_opts.cpu_qpath named one). */
sd_status sd_cpu_matmul_stored(sd_backend *be, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                               const float *x, int32_t n_tokens, float *y);

#endif
