/* swiglu.c — out = silu(gate) * up, elementwise (silu(g) = g / (1 + e^-g)),
 * and GeGLU (Gemma): out = gelu(gate) * up with the tanh form of gelu.
 * Each element is one scalar expression with libm's expf (no vector math
 * library: a vectorized exp on full chunks and a scalar one on tails would
 * make an element's value depend on where the split falls). */
#include "cpu/cpu_impl.h"

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

/* 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), libm's tanhf: one scalar
 * expression per element, as above. */
static void geglu_chunk(void *p, int64_t c, int32_t ith) {
    const swiglu_args *a = p;
    size_t begin, end;
    sd_cpu_chunk(a->n, CHUNK, c, &begin, &end);
    for (size_t i = begin; i < end; i++) {
        float g = a->gate[i];
        a->out[i] = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * a->up[i];
    }
}

sd_status sd_cpu_geglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out) {
    swiglu_args a = {gate, up, out, n};
    sd_cpu_parallel(be, geglu_chunk, &a, (int64_t)((n + CHUNK - 1) / CHUNK), n * 24);
    return SD_OK;
}
