/* swiglu.c — out = silu(gate) * up, elementwise (silu(g) = g / (1 + e^-g)).
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
