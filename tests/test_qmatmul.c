/* test_qmatmul.c — the stored-weight matmul kernels (engine/cpu/qmatmul.c).
 *
 * For F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 weights on random shapes (n_in not a
 * multiple of 256, n_out across chunk boundaries, 1 token, odd token counts,
 * more tokens than a tile or a token block), and Q4_K, Q5_K, Q6_K on shapes
 * with n_in a multiple of 256 (their super-block):
 *   - every SIMD path this CPU has (AVX2, AVX-512 VNNI) equals the plain C
 *     twin bit for bit (on the VNNI path Q4_0 and Q5_0 run the tiles on prepared
 *     rows, qmatmul_vnni.c: the token counts 1 .. 17 and the shapes here
 *     reach their edges, token blocks of 16 and groups of fewer than 8
 *     blocks);
 *   - batch invariance: each token's row of a batched call equals the same
 *     token computed alone, bit for bit, with 1 and 2 threads;
 *   - against the exact (double) product of the dequantized weights with x:
 *       integer types: |y - ref| <= sum_j |w_j| * 0.5001 * dx_b(j)
 *                                   + 1e-5 * sum_j |w_j| (|x_j| + dx_b(j)),
 *         the first term being the activation rounding (|x - q dx| <=
 *         dx/2, plus the rounding of x * (1/dx)), the second f32 summation;
 *       and, tighter, against the double product of the dequantized weights
 *         with the quantized activations q * dx: 1e-5 * sum |w_j q_j dx|;
 *       F16 / BF16: bit-identical to the f32 matmul on the widened matrix
 *         (the kernel's stated arithmetic), and within n_in * 2^-23 * sum |w x|
 *         of the double product;
 *     (the K-quants' weights being their dequantized values, the same bounds
 *     hold with dx the scale of the element's 256-element activation block:
 *     their arithmetic is exact integer sums per super-block);
 *   - refusals: an integer type with n_in not a multiple of 32 (a K-quant
 *     with n_in not a multiple of 256), an unsupported type. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/qmatmul_impl.h"
#include "cpu/quant_kernels.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "cpu_fixture.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

typedef struct shape {
    int n_in, n_out, n_tokens;
} shape;

static const sd_dtype types[] = {SD_DTYPE_F16,  SD_DTYPE_BF16, SD_DTYPE_Q8_0, SD_DTYPE_Q4_0, SD_DTYPE_Q4_1,
                                 SD_DTYPE_Q5_0, SD_DTYPE_Q5_1, SD_DTYPE_Q4_K, SD_DTYPE_Q5_K, SD_DTYPE_Q6_K};
enum { N_TYPES = sizeof types / sizeof types[0] };

/* The last two of each list: many chunks and tiles, partial ones at the end
 * (the integer formats: calls of <= 8 tokens in chunks of 2 x ROW_CHUNK rows
 * on 2 threads, see chunk_rows in qmatmul.c). */
static const shape shapes[] = {
    {32, 1, 1},    {64, 5, 3},   {96, 47, 1},  {288, 49, 9}, {576, 97, 17}, {160, 130, 70},
    {1536, 13, 2}, {224, 96, 8}, {32, 200, 5}, {736, 3, 16}, {64, 1001, 1}, {96, 1000, 3},
};

/* The K-quants: n_in whole super-blocks of 256. */
static const shape k_shapes[] = {
    {256, 1, 1},  {256, 5, 3},   {512, 47, 1},  {768, 49, 9},  {1536, 97, 17}, {256, 130, 70}, {1536, 13, 2},
    {512, 96, 8}, {512, 33, 64}, {256, 200, 5}, {1024, 3, 16}, {256, 1001, 1}, {256, 1000, 3},
};

/* Odd lengths for the float formats (no block constraint). */
static const shape float_shapes[] = {{37, 9, 3}, {7, 4, 1}, {131, 50, 11}};

static bool is_int_type(sd_dtype t) {
    return t == SD_DTYPE_Q8_0 || t == SD_DTYPE_Q4_0 || t == SD_DTYPE_Q4_1 || t == SD_DTYPE_Q5_0 || t == SD_DTYPE_Q5_1 ||
           sd_dtype_is_k(t);
}

static void first_mismatch(const char *what, sd_dtype t, shape s, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            print_error("%s: %s n_in %d n_out %d n_tokens %d: element %zu (token %zu, row %zu): %.9g vs %.9g\n", what,
                        sd_dtype_name(t), s.n_in, s.n_out, s.n_tokens, i, i / (size_t)s.n_out, i % (size_t)s.n_out,
                        (double)a[i], (double)b[i]);
            fail();
        }
}

static void check_one(fixture *f, sd_dtype t, shape s) {
    size_t be_elems, bb;
    assert_true(sd_dtype_block(t, &be_elems, &bb));
    size_t n_w = (size_t)s.n_in * (size_t)s.n_out, n_x = (size_t)s.n_tokens * (size_t)s.n_in;
    size_t n_y = (size_t)s.n_tokens * (size_t)s.n_out;
    float *wf = malloc(n_w * sizeof(float)), *wd = malloc(n_w * sizeof(float));
    uint8_t *wq = malloc(n_w / be_elems * bb);
    float *x = malloc(n_x * sizeof(float));
    float *y_c = malloc(n_y * sizeof(float)), *y = malloc(n_y * sizeof(float)), *y1 = malloc(s.n_out * sizeof(float));
    assert_non_null(wf);
    assert_non_null(wd);
    assert_non_null(wq);
    assert_non_null(x);
    assert_non_null(y_c);
    assert_non_null(y);
    assert_non_null(y1);
    for (int o = 0; o < s.n_out; o++) {
        float row_scale = 0.05f + fabsf(uniform());
        for (int i = 0; i < s.n_in; i++) wf[(size_t)o * s.n_in + i] = uniform() * row_scale;
    }
    for (size_t i = 0; i < n_x; i++) x[i] = uniform() * (i % 97 == 3 ? 20.0f : 1.0f); /* a few outliers */
    if (s.n_in >= 64 && s.n_tokens > 1)
        for (int i = 32; i < 64; i++) x[(size_t)s.n_in + i] = 0.0f; /* an all-zero block: dx = 0 */
    assert_int_equal(sd_quantize(t, wf, n_w, wq), SD_OK);
    assert_int_equal(sd_dequantize(t, wq, n_w, wd), SD_OK);

    /* the C twin, then every SIMD path, then the other thread count */
    sd_backend *b1 = f->be1.ctx, *b2 = f->be2.ctx;
    assert_int_equal(sd_cpu_qmatmul(b1, SD_CPU_QPATH_C, t, wq, s.n_in, s.n_out, x, s.n_tokens, y_c), SD_OK);
    const sd_cpu_qpath paths[] = {SD_CPU_QPATH_AVX2, SD_CPU_QPATH_VNNI, SD_CPU_QPATH_AMX, SD_CPU_QPATH_AUTO};
    const char *names[] = {"avx2 vs C", "vnni vs C", "amx vs C", "auto vs C"};
    for (size_t p = 0; p < 4; p++) {
        if (!sd_cpu_qpath_available(paths[p])) continue;
        for (int th = 0; th < 2; th++) {
            memset(y, 0xff, n_y * sizeof(float));
            assert_int_equal(sd_cpu_qmatmul(th ? b2 : b1, paths[p], t, wq, s.n_in, s.n_out, x, s.n_tokens, y), SD_OK);
            first_mismatch(names[p], t, s, y, y_c, n_y);
        }
    }
    /* batch invariance: each token alone, both thread counts */
    for (int tok = 0; tok < s.n_tokens; tok++)
        for (int th = 0; th < 2; th++) {
            assert_int_equal(
                sd_cpu_matmul_stored(th ? b2 : b1, t, wq, s.n_in, s.n_out, x + (size_t)tok * s.n_in, 1, y1), SD_OK);
            shape one = {s.n_in, s.n_out, 1};
            first_mismatch("token alone vs in the batch", t, one, y1, y_c + (size_t)tok * s.n_out, (size_t)s.n_out);
        }

    /* against the exact products; the K-quants' activations have one scale
     * per 256 elements (their own rows), the others one per 32 */
    const bool k = sd_dtype_is_k(t);
    const int xblock = k ? 256 : 32;
    size_t rb = k ? sd_cpu_q8k_row_bytes(s.n_in) : sd_cpu_q8_row_bytes(s.n_in);
    uint8_t *xq = is_int_type(t) ? malloc(rb) : NULL;
    if (!is_int_type(t)) {
        /* the stated arithmetic: the f32 matmul on the widened matrix */
        assert_int_equal(sd_cpu_matmul(b1, wd, s.n_in, s.n_out, x, s.n_tokens, y), SD_OK);
        first_mismatch("F16/BF16 vs f32 matmul on the widened matrix", t, s, y_c, y, n_y);
    }
    for (int tok = 0; tok < s.n_tokens; tok++) {
        const float *xt = x + (size_t)tok * s.n_in;
        if (xq && k)
            sd_cpu_q8k_quantize_row(xt, s.n_in, xq);
        else if (xq)
            sd_cpu_q8_quantize_row(xt, s.n_in, xq);
        for (int o = 0; o < s.n_out; o++) {
            const float *wr = wd + (size_t)o * s.n_in;
            double ref = 0, ref_q = 0, abs_wx = 0, abs_wqd = 0, quant_err = 0, abs_w_xd = 0;
            for (int i = 0; i < s.n_in; i++) {
                ref += (double)wr[i] * xt[i];
                abs_wx += fabs((double)wr[i] * xt[i]);
                if (xq) {
                    float dx;
                    memcpy(&dx, xq + (size_t)s.n_in + (size_t)(i / xblock) * 4, 4);
                    double xqd = (double)(int8_t)xq[i] * dx;
                    ref_q += (double)wr[i] * xqd;
                    abs_wqd += fabs((double)wr[i] * xqd);
                    quant_err += fabs((double)wr[i]) * 0.5001 * dx;
                    abs_w_xd += fabs((double)wr[i]) * (fabs((double)xt[i]) + dx);
                }
            }
            double got = y_c[(size_t)tok * s.n_out + o];
            double tol = xq ? quant_err + 1e-5 * abs_w_xd : s.n_in * 0x1p-23 * abs_wx;
            if (fabs(got - ref) > tol) {
                print_error("%s n_in %d n_out %d: token %d row %d: %.9g, exact %.9g, bound %.3g\n", sd_dtype_name(t),
                            s.n_in, s.n_out, tok, o, got, ref, tol);
                fail();
            }
            if (xq && fabs(got - ref_q) > 1e-5 * abs_wqd + 1e-30) {
                print_error("%s n_in %d n_out %d: token %d row %d: %.9g, exact on quantized x %.9g\n", sd_dtype_name(t),
                            s.n_in, s.n_out, tok, o, got, ref_q);
                fail();
            }
        }
    }
    free(xq);
    free(wf);
    free(wd);
    free(wq);
    free(x);
    free(y_c);
    free(y);
    free(y1);
}

static void test_all_types_shapes(void **state) {
    fixture *f = *state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        if (sd_dtype_is_k(types[ti])) {
            for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) check_one(f, types[ti], k_shapes[si]);
            continue;
        }
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) check_one(f, types[ti], shapes[si]);
        if (!is_int_type(types[ti]))
            for (size_t si = 0; si < sizeof float_shapes / sizeof float_shapes[0]; si++)
                check_one(f, types[ti], float_shapes[si]);
    }
}

/* Every token count 1 .. 17 (all the tile widths and their edges: the
 * verify calls) on an odd row count, n_in not a multiple of 256 where the
 * format allows. */
static void test_token_counts(void **state) {
    fixture *f = *state;
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (int n = 1; n <= 17; n++) {
            shape s = {sd_dtype_is_k(types[ti]) ? 512 : is_int_type(types[ti]) ? 160 : 101, 53, n};
            check_one(f, types[ti], s);
        }
}

/* Random shapes on top of the fixed ones. */
static void test_random_shapes(void **state) {
    fixture *f = *state;
    for (int it = 0; it < 64; it++) {
        sd_dtype t = types[it % N_TYPES];
        rng_state += 0x1234567ull * (uint64_t)(it + 1);
        shape s;
        s.n_in = 32 * (1 + (int)((uniform() + 1.0f) * 20.0f));
        if (!is_int_type(t) && it % 2) s.n_in += it % 7;
        if (sd_dtype_is_k(t)) s.n_in = 256 * (1 + s.n_in / 256 % 6);
        s.n_out = 1 + (int)((uniform() + 1.0f) * 80.0f);
        s.n_tokens = 1 + (int)((uniform() + 1.0f) * 12.0f);
        check_one(f, t, s);
    }
}

/* K-quant blocks of random bytes (every scale, minimum and weight value
 * the formats can hold, Q6_K's scales down to -128) with finite f16
 * factors, against activations at the int8 limits: every path equals the
 * C twin, on token counts on both sides of the AMX path's threshold
 * (SD_AMX_MIN_TOKENS), with partial 16-token and 16-row tiles. */
static void test_kquant_raw_blocks(void **state) {
    fixture *f = *state;
    const sd_dtype kt[] = {SD_DTYPE_Q4_K, SD_DTYPE_Q5_K, SD_DTYPE_Q6_K};
    const int tokens[] = {1, 8, SD_AMX_MIN_TOKENS - 1, SD_AMX_MIN_TOKENS, SD_AMX_MIN_TOKENS + 17, 130};
    enum { N_IN = 768, N_OUT = 37 };
    for (size_t ti = 0; ti < 3; ti++) {
        size_t be_elems, bb;
        assert_true(sd_dtype_block(kt[ti], &be_elems, &bb));
        const size_t w_bytes = (size_t)N_OUT * N_IN / be_elems * bb;
        uint8_t *w = malloc(w_bytes);
        float *x = malloc(sizeof(float) * N_IN * 130), *y_c = malloc(sizeof(float) * N_OUT * 130),
              *y = malloc(sizeof(float) * N_OUT * 130);
        assert_non_null(w);
        assert_non_null(x);
        assert_non_null(y_c);
        assert_non_null(y);
        for (size_t i = 0; i < w_bytes; i++) w[i] = (uint8_t)(uniform() * 128.0f + 128.0f);
        for (size_t b = 0; b < w_bytes / bb; b++) {
            const uint16_t d = sd_f32_to_f16(0.01f + 0.01f * fabsf(uniform())),
                           dm = sd_f32_to_f16(0.02f * fabsf(uniform()));
            if (kt[ti] == SD_DTYPE_Q6_K) {
                memcpy(w + b * bb + 208, &d, 2);
                if (b % 5 == 0) w[b * bb + 192] = 0x80; /* a scale of -128 */
            } else {
                memcpy(w + b * bb, &d, 2);
                memcpy(w + b * bb + 2, &dm, 2);
                if (b % 5 == 0) memset(w + b * bb + 4, 0xff, 12);       /* every scale and minimum 63 */
                if (b % 7 == 0) memset(w + b * bb + 16, 0xff, bb - 16); /* every weight at its largest */
            }
        }
        for (size_t i = 0; i < (size_t)N_IN * 130; i++) x[i] = i % 3 == 0 ? (i % 2 ? 1.0f : -1.0f) : uniform();
        for (size_t n = 0; n < sizeof tokens / sizeof tokens[0]; n++) {
            const int nt = tokens[n];
            assert_int_equal(sd_cpu_qmatmul(f->be1.ctx, SD_CPU_QPATH_C, kt[ti], w, N_IN, N_OUT, x, nt, y_c), SD_OK);
            const sd_cpu_qpath paths[] = {SD_CPU_QPATH_AVX2, SD_CPU_QPATH_VNNI, SD_CPU_QPATH_AMX};
            for (size_t p = 0; p < 3; p++) {
                if (!sd_cpu_qpath_available(paths[p])) continue;
                for (int th = 0; th < 2; th++) {
                    memset(y, 0xff, sizeof(float) * N_OUT * (size_t)nt);
                    assert_int_equal(
                        sd_cpu_qmatmul(th ? f->be2.ctx : f->be1.ctx, paths[p], kt[ti], w, N_IN, N_OUT, x, nt, y),
                        SD_OK);
                    shape s = {N_IN, N_OUT, nt};
                    first_mismatch(paths[p] == SD_CPU_QPATH_AMX    ? "raw blocks, amx vs C"
                                   : paths[p] == SD_CPU_QPATH_VNNI ? "raw blocks, vnni vs C"
                                                                   : "raw blocks, avx2 vs C",
                                   kt[ti], s, y, y_c, (size_t)N_OUT * (size_t)nt);
                }
            }
        }
        free(w);
        free(x);
        free(y_c);
        free(y);
    }
    if (!sd_cpu_qpath_available(SD_CPU_QPATH_AMX))
        print_message("test_kquant_raw_blocks: no AMX-INT8 on this CPU (or no permission): the AMX path was "
                      "not run\n");
}

static void test_quantize_row(void **state) {
    (void)state;
    float x[64];
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.25f; /* amax 4 at i = 0 */
    for (int i = 32; i < 64; i++) x[i] = 0.0f;
    x[40] = -0.5f; /* amax 0.5: dx = 0.5/127, -0.5 -> -127 */
    uint8_t q[sizeof(float) * 64 * 3];
    assert_true(sd_cpu_q8_row_bytes(64) <= sizeof q);
    sd_cpu_q8_quantize_row(x, 64, q);
    float dx0, dx1, s0[8];
    memcpy(&dx0, q + 64, 4);
    memcpy(&dx1, q + 68, 4);
    memcpy(s0, q + 72, 32);
    assert_true(dx0 == 4.0f / 127.0f);
    assert_true(dx1 == 0.5f / 127.0f);
    assert_int_equal((int8_t)q[0], -127);
    assert_int_equal((int8_t)q[16], 0);
    assert_int_equal((int8_t)q[40], -127);
    assert_int_equal((int8_t)q[41], 0);
    int lane0 = (int8_t)q[0] + (int8_t)q[1] + (int8_t)q[2] + (int8_t)q[3];
    assert_true(s0[0] == (float)lane0);
    /* rounding to nearest even on exact halves: x = 2.5 dx -> 2 */
    float y[32] = {127.0f};
    y[1] = 2.5f;
    y[2] = 3.5f;
    y[3] = -2.5f;
    sd_cpu_q8_quantize_row(y, 32, q);
    assert_int_equal((int8_t)q[0], 127);
    assert_int_equal((int8_t)q[1], 2);
    assert_int_equal((int8_t)q[2], 4);
    assert_int_equal((int8_t)q[3], -2);
}

/* A quantizer's bytes against its scalar reference's, in iteration it. */
static void expect_same_bytes(const uint8_t *got, const uint8_t *want, size_t n, int it) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            print_error("iteration %d: byte %zu: %02x, scalar reference %02x\n", it, i, got[i], want[i]);
            fail();
        }
}

/* The activation rounding as quant_kernels.h states it, written out here
 * once more in scalar C: the backend's quantizer (vectorized where the
 * build has AVX2, so the C twin shares it) must give the same bytes. */
static void quantize_row_ref(const float *x, int n_in, uint8_t *dst) {
    int nb = n_in / 32;
    for (int b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int lane[8] = {0};
        for (int j = 0; j < 32; j++) {
            float v = nearbyintf(x[b * 32 + j] * id);
            int iv = !(v >= -127.0f) ? -127 : v > 127.0f ? 127 : (int)v;
            dst[b * 32 + j] = (uint8_t)(int8_t)iv;
            lane[j / 4] += iv;
        }
        memcpy(dst + nb * 32 + b * 4, &d, 4);
        for (int k = 0; k < 8; k++) {
            float l = (float)lane[k];
            memcpy(dst + nb * 36 + b * 32 + k * 4, &l, 4);
        }
    }
}

static void test_quantize_row_matches_scalar(void **state) {
    (void)state;
    enum { N = 32 * 9 };
    float x[N];
    uint8_t got[N * 3], want[N * 3];
    assert_true(sd_cpu_q8_row_bytes(N) <= sizeof got);
    for (int it = 0; it < 200; it++) {
        for (int i = 0; i < N; i++) x[i] = uniform() * (it % 5 == 0 ? 1e-30f : it % 5 == 1 ? 3e4f : 1.0f);
        if (it % 7 == 0) {
            /* exact halves after scaling: amax 127 gives dx 1 */
            x[0] = 127.0f;
            for (int j = 1; j < 32; j++) x[j] = (float)(j - 16) + 0.5f;
        }
        if (it % 11 == 0) x[40] = NAN;      /* block 1: NaN ignored by the max, -127 itself */
        if (it % 13 == 0) x[70] = INFINITY; /* block 2: dx inf, 1/dx 0 */
        if (it % 17 == 0)
            for (int j = 96; j < 128; j++) x[j] = 0.0f; /* block 3: dx 0 */
        if (it % 3 == 0) x[200] = -x[201];              /* ties of |x| */
        memset(got, 0xa5, sizeof got);
        memset(want, 0x5a, sizeof want);
        sd_cpu_q8_quantize_row(x, N, got);
        quantize_row_ref(x, N, want);
        expect_same_bytes(got, want, sd_cpu_q8_row_bytes(N), it);
    }
}

/* The K-quant activation rows as quant_kernels.h states them, in scalar C:
 * the backend's quantizer (vectorized with AVX2) must give the same bytes. */
static void quantize_row_k_ref(const float *x, int n_in, uint8_t *dst) {
    int nsb = n_in / 256;
    for (int sb = 0; sb < nsb; sb++) {
        float amax = 0.0f;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[sb * 256 + j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int lane[8][8] = {{0}}; /* [sub-block][lane] */
        for (int j = 0; j < 256; j++) {
            float v = nearbyintf(x[sb * 256 + j] * id);
            int iv = !(v >= -127.0f) ? -127 : v > 127.0f ? 127 : (int)v;
            dst[sb * 256 + j] = (uint8_t)(int8_t)iv;
            lane[j / 32][j % 32 / 4] += iv;
        }
        memcpy(dst + nsb * 256 + sb * 4, &d, 4);
        for (int u = 0; u < 4; u++)
            for (int k = 0; k < 8; k++)
                for (int h = 0; h < 2; h++) {
                    int16_t v = (int16_t)lane[2 * u + h][k];
                    memcpy(dst + nsb * 260 + sb * 128 + (16 * u + 2 * k + h) * 2, &v, 2);
                }
    }
}

static void test_quantize_row_k_matches_scalar(void **state) {
    (void)state;
    enum { N = 256 * 3 };
    float x[N];
    uint8_t got[N * 2], want[N * 2];
    assert_true(sd_cpu_q8k_row_bytes(N) <= sizeof got);
    assert_int_equal(sd_cpu_q8k_row_bytes(N), 3 * (256 + 4 + 128));
    for (int it = 0; it < 200; it++) {
        for (int i = 0; i < N; i++) x[i] = uniform() * (it % 5 == 0 ? 1e-30f : it % 5 == 1 ? 3e4f : 1.0f);
        if (it % 7 == 0) {
            x[0] = 127.0f; /* amax 127: dx 1, exact halves below */
            for (int j = 1; j < 256; j++) x[j] = (float)(j % 64 - 32) + 0.5f;
        }
        if (it % 11 == 0) x[300] = NAN;      /* block 1: NaN ignored by the max, -127 itself */
        if (it % 13 == 0) x[600] = INFINITY; /* block 2: dx inf, 1/dx 0 */
        if (it % 17 == 0)
            for (int j = 256; j < 512; j++) x[j] = 0.0f; /* block 1: dx 0 */
        if (it % 19 == 0)
            for (int j = 512; j < 768; j++) x[j] = j / 4 % 2 ? 1.0f : -1.0f; /* full lanes: sums +-508 */
        if (it % 3 == 0) x[200] = -x[201];                                   /* ties of |x| */
        memset(got, 0xa5, sizeof got);
        memset(want, 0x5a, sizeof want);
        sd_cpu_q8k_quantize_row(x, N, got);
        quantize_row_k_ref(x, N, want);
        expect_same_bytes(got, want, sd_cpu_q8k_row_bytes(N), it);
    }
}

static void test_refusals(void **state) {
    fixture *f = *state;
    float x[48] = {0}, y[4];
    uint8_t w[4 * 40] = {0};
    assert_int_equal(sd_cpu_qmatmul(f->be1.ctx, SD_CPU_QPATH_AUTO, SD_DTYPE_Q8_0, w, 48, 1, x, 1, y),
                     SD_ERR_INVALID_ARG);
    assert_int_equal(sd_cpu_qmatmul(f->be1.ctx, SD_CPU_QPATH_AUTO, SD_DTYPE_F32, w, 32, 1, x, 1, y),
                     SD_ERR_UNSUPPORTED);
    const sd_dtype k_types[] = {SD_DTYPE_Q4_K, SD_DTYPE_Q5_K, SD_DTYPE_Q6_K};
    for (int i = 0; i < 3; i++) {
        float xk[288] = {0};
        assert_true(sd_cpu_qmatmul_supports(k_types[i]));
        assert_int_equal(sd_cpu_qmatmul(f->be1.ctx, SD_CPU_QPATH_C, k_types[i], w, 288, 0, xk, 1, y),
                         SD_ERR_INVALID_ARG); /* 288 = 9 blocks of 32, not whole super-blocks */
    }
    assert_false(sd_cpu_qmatmul_supports(SD_DTYPE_F32));
    assert_true(sd_cpu_qmatmul_supports(SD_DTYPE_Q4_1));
    print_message("qmatmul: this CPU's path: %s\n", sd_cpu_qpath_name());
}

/* sd_backend_opts.cpu_qpath (--cpu-qpath) picks a backend's path at
 * creation (a path this CPU lacks, or a wrong name, falls back to AUTO), and
 * the backend op runs it: same bits as the C twin either way. */
static void test_qpath_named(void **state) {
    (void)state;
    const struct {
        const char *value;
        sd_cpu_qpath want;
    } cases[] = {{"c", SD_CPU_QPATH_C},
                 {"avx2", sd_cpu_qpath_available(SD_CPU_QPATH_AVX2) ? SD_CPU_QPATH_AVX2 : SD_CPU_QPATH_AUTO},
                 {"avx512-vnni", sd_cpu_qpath_available(SD_CPU_QPATH_VNNI) ? SD_CPU_QPATH_VNNI : SD_CPU_QPATH_AUTO},
                 {"avx512-amx", sd_cpu_qpath_available(SD_CPU_QPATH_AMX) ? SD_CPU_QPATH_AMX : SD_CPU_QPATH_AUTO},
                 {"sse9", SD_CPU_QPATH_AUTO},
                 {"", SD_CPU_QPATH_AUTO}};
    enum { N_IN = 96, N_OUT = 7, N_TOK = 5 };
    float wf[N_IN * N_OUT], x[N_IN * N_TOK], y[N_OUT * N_TOK], y_c[N_OUT * N_TOK];
    uint8_t wq[N_IN * N_OUT]; /* Q4_1: 20 bytes per 32 */
    for (int i = 0; i < N_IN * N_OUT; i++) wf[i] = uniform();
    for (int i = 0; i < N_IN * N_TOK; i++) x[i] = uniform();
    assert_int_equal(sd_quantize(SD_DTYPE_Q4_1, wf, N_IN * N_OUT, wq), SD_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(sd_cpu_qpath_named(cases[i].value), cases[i].want);
        sd_backend_opts opts = sd_backend_default_opts();
        opts.cpu_qpath = cases[i].value;
        sd_backend_handle be;
        assert_int_equal(sd_cpu_backend_create_opts(2, &opts, &be), SD_OK);
        assert_int_equal(be.ctx->qpath, cases[i].want);
        assert_int_equal(sd_cpu_qmatmul(be.ctx, SD_CPU_QPATH_C, SD_DTYPE_Q4_1, wq, N_IN, N_OUT, x, N_TOK, y_c), SD_OK);
        assert_int_equal(sd_cpu_matmul_stored(be.ctx, SD_DTYPE_Q4_1, wq, N_IN, N_OUT, x, N_TOK, y), SD_OK);
        assert_memory_equal(y, y_c, sizeof y);
        be.ops->destroy(&be.ctx);
    }
    assert_int_equal(sd_cpu_qpath_named(NULL), SD_CPU_QPATH_AUTO);
    /* the default is the fastest path this CPU has, and the tools report it */
    const char *want = sd_cpu_qpath_available(SD_CPU_QPATH_AMX)    ? "avx512-amx"
                       : sd_cpu_qpath_available(SD_CPU_QPATH_VNNI) ? "avx512-vnni"
                       : sd_cpu_qpath_available(SD_CPU_QPATH_AVX2) ? "avx2"
                                                                   : "c";
    assert_string_equal(sd_cpu_qpath_name(), want);
    assert_string_equal(sd_cpu_kernel_path(NULL), want);
    assert_string_equal(sd_cpu_kernel_path("c"), "c");
}

/* Every tile the dispatch can call exists: for calls of 1 .. 2 x TOK_BLOCK
 * + 1 tokens, qtile_shape's R x T and every smaller R x T (the edges of a
 * chunk or token block), in each table this build has: the narrow rule for
 * the AVX2 tiles, the wide one for the VNNI tiles. The tables hold only their shape lists; this fails when a shape
 * rule and its list part. */
static void test_tile_tables_cover_dispatch(void **state) {
    (void)state;
#if SD_CPU_AVX2
    for (size_t n = 1; n <= 2 * TOK_BLOCK + 1; n++) {
        size_t rb = 0, tb = 0;
        qtile_shape(n, false, &rb, &tb);
        assert_true(rb >= 1 && rb <= MAX_R && tb >= 1 && tb <= MAX_T);
        for (size_t r = 0; r < rb; r++)
            for (size_t t = 0; t < tb; t++) {
                assert_non_null(sd_cpu_ftiles[0][r][t]);
                assert_non_null(sd_cpu_ftiles[1][r][t]);
                for (int k = 0; k < N_KINDS; k++) assert_non_null(sd_cpu_qtiles_avx2[k][r][t]);
            }
#if HAVE_VNNI_PATH
        qtile_shape(n, true, &rb, &tb);
        assert_true(rb >= 1 && rb <= MAX_R && tb >= 1 && tb <= MAX_T);
        for (size_t r = 0; r < rb; r++)
            for (size_t t = 0; t < tb; t++) {
                assert_non_null(sd_cpu_ftiles_vnni[0][r][t]);
                assert_non_null(sd_cpu_ftiles_vnni[1][r][t]);
                for (int k = 0; k < N_KINDS; k++) /* Q4_0, Q5_0: the tiles on prepared rows */
                    assert_non_null(sd_cpu_vnni_qtiles(k)[r][t]);
            }
#endif
    }
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_row),
        cmocka_unit_test(test_quantize_row_matches_scalar),
        cmocka_unit_test(test_quantize_row_k_matches_scalar),
        cmocka_unit_test_setup_teardown(test_all_types_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kquant_raw_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test(test_tile_tables_cover_dispatch),
        cmocka_unit_test(test_qpath_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
