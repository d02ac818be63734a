/* vexp.h — the CPU backend's exp: e^x in f32 within 2 ulp on [-87, 88]
 * (tests/test_attention.c: test_exp), 0 below -87 and for NaN, e^88 above
 * 88; a plain-C twin (sd_cpu_exp) and 8 AVX2 lanes (sd_cpu_exp8) doing the
 * same correctly rounded operations in the same order, so an element's
 * value does not depend on whether a vector or a tail computed it.
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, Cephes' degree-5
 * polynomial, 2^n built in the exponent bits. The attention softmax
 * (attention.c) and GeGLU (swiglu.c) use it. */
#ifndef SPECD_CPU_VEXP_H
#define SPECD_CPU_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu_impl.h"

#define SD_EXP_LO     (-87.0f) /* below: 0 (2^n stays a normal number down to here) */
#define SD_EXP_HI     88.0f
#define SD_EXP_LOG2E  1.44269504088896341f
#define SD_EXP_LN2_HI 0.693359375f /* ln 2 = HI + LO; HI has 9 bits, so n * HI is exact */
#define SD_EXP_LN2_LO (-2.12194440e-4f)
#define SD_EXP_P0     1.9875691500e-4f /* Cephes expf: exp(r) ~ 1 + r + r^2 (P5 + P4 r + ... + P0 r^5) */
#define SD_EXP_P1     1.3981999507e-3f
#define SD_EXP_P2     8.3334519073e-3f
#define SD_EXP_P3     4.1665795894e-2f
#define SD_EXP_P4     1.6666665459e-1f
#define SD_EXP_P5     5.0000001201e-1f

static inline float sd_cpu_exp(float x) {
    float xc = x < SD_EXP_HI ? x : SD_EXP_HI; /* NaN -> HI, as _mm256_min_ps */
    xc = xc > SD_EXP_LO ? xc : SD_EXP_LO;
    float n = rintf(xc * SD_EXP_LOG2E);
    float r = fmaf(n, -SD_EXP_LN2_HI, xc);
    r = fmaf(n, -SD_EXP_LN2_LO, r);
    float p = SD_EXP_P0;
    p = fmaf(p, r, SD_EXP_P1);
    p = fmaf(p, r, SD_EXP_P2);
    p = fmaf(p, r, SD_EXP_P3);
    p = fmaf(p, r, SD_EXP_P4);
    p = fmaf(p, r, SD_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x >= SD_EXP_LO ? y * scale : 0.0f;
}

#if SD_CPU_AVX2
static inline __m256 sd_cpu_exp8(__m256 x) {
    __m256 xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(SD_EXP_HI)), _mm256_set1_ps(SD_EXP_LO));
    __m256 n =
        _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(SD_EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-SD_EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-SD_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(SD_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SD_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SD_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SD_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SD_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SD_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    return _mm256_and_ps(e, _mm256_cmp_ps(x, _mm256_set1_ps(SD_EXP_LO), _CMP_GE_OQ));
}
#endif

#endif
