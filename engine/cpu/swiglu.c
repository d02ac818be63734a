/* swiglu.c — out = silu(gate) * up, elementwise (silu(g) = g / (1 + e^-g)),
 * and GeGLU (Gemma): out = gelu(gate) * up with the tanh form of gelu.
 * SwiGLU: each element is one scalar expression with libm's expf (no vector
 * math library: a vectorized exp on full chunks and a scalar one on tails
 * would make an element's value depend on where the split falls).
 * GeGLU: cpu/vexp.h's exp, 8 AVX2 lanes with a scalar twin doing the same
 * correctly rounded operations in the same order, so an element's value is
 * the same in a vector or in a tail, on either path (libm's tanhf per
 * element was a fifth of a Gemma prompt's time). */
#include "cpu/cpu_impl.h"
#include "cpu/vexp.h"

typedef struct swiglu_args {
    const float *gate, *up;
    float *out;
    size_t n;
} swiglu_args;

enum { CHUNK = 4096 };

static void swiglu_chunk(void *p, int64_t c, int32_t ith) {
    const swiglu_args *a = p;
    size_t begin, end;
    sd_cpu_chunk(a->n, CHUNK, c, &begin, &end);
    for (size_t i = begin; i < end; i++) {
        float g = a->gate[i];
        a->out[i] = g / (1.0f + expf(-g)) * a->up[i];
    }
}

sd_status sd_cpu_swiglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out) {
    swiglu_args a = {gate, up, out, n};
    sd_cpu_parallel(be, swiglu_chunk, &a, (int64_t)((n + CHUNK - 1) / CHUNK), n * 16);
    return SD_OK;
}

/* GeGLU's gelu, the tanh form, written without the cancellation of
 * 1 + tanh(u) for negative u (the same function):
 *     0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)),   u = sqrt(2/pi) (g + 0.044715 g^3)
 * as g * sigmoid(z), z = 2u, with t = e^(-|z|) in [0, 1] (cpu/vexp.h's exp):
 * sigmoid(z) = 1 / (1 + t) for z >= 0 and t / (1 + t) below, so the exp
 * never overflows. gelu8 performs gelu1's operations in the same order. */
#define GELU_C1    0.044715f
#define GELU_2S2PI 1.5957691216057308f /* 2 sqrt(2 / pi) */

static inline float gelu1(float g) {
    const float c = GELU_C1 * (g * g);
    const float z = GELU_2S2PI * fmaf(c, g, g);
    const float t = sd_cpu_exp(-fabsf(z));
    return g * ((z >= 0.0f ? 1.0f : t) / (1.0f + t));
}

#if SD_CPU_AVX2
static inline __m256 gelu8(__m256 g) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 c = _mm256_mul_ps(_mm256_set1_ps(GELU_C1), _mm256_mul_ps(g, g));
    const __m256 z = _mm256_mul_ps(_mm256_set1_ps(GELU_2S2PI), _mm256_fmadd_ps(c, g, g));
    const __m256 t = sd_cpu_exp8(_mm256_or_ps(z, sign)); /* -|z| */
    const __m256 num = _mm256_blendv_ps(t, one, _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GE_OQ));
    return _mm256_mul_ps(g, _mm256_div_ps(num, _mm256_add_ps(one, t)));
}
#endif

static void geglu_chunk(void *p, int64_t c, int32_t ith) {
    const swiglu_args *a = p;
    size_t begin, end, i;
    sd_cpu_chunk(a->n, CHUNK, c, &begin, &end);
    i = begin;
#if SD_CPU_AVX2
    for (; i + 8 <= end; i += 8)
        _mm256_storeu_ps(a->out + i, _mm256_mul_ps(gelu8(_mm256_loadu_ps(a->gate + i)), _mm256_loadu_ps(a->up + i)));
#endif
    for (; i < end; i++) a->out[i] = gelu1(a->gate[i]) * a->up[i];
}

sd_status sd_cpu_geglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out) {
    swiglu_args a = {gate, up, out, n};
    sd_cpu_parallel(be, geglu_chunk, &a, (int64_t)((n + CHUNK - 1) / CHUNK), n * 24);
    return SD_OK;
}
