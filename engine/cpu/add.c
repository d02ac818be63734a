/* add.c — out = a + b, elementwise (the residual connections). */
#include "cpu/cpu_impl.h"

typedef struct add_args {
    const float *a, *b;
    float *out;
    size_t n;
} add_args;

enum { CHUNK = 8192 };

static void add_chunk(void *p, int64_t c, int32_t ith) {
    const add_args *a = p;
    size_t begin, end;
    sd_cpu_chunk(a->n, CHUNK, c, &begin, &end);
    for (size_t i = begin; i < end; i++) a->out[i] = a->a[i] + a->b[i];
}

sd_status sd_cpu_add(sd_backend *be, const float *a, const float *b, size_t n, float *out) {
    add_args args = {a, b, out, n};
    sd_cpu_parallel(be, add_chunk, &args, (int64_t)((n + CHUNK - 1) / CHUNK), n);
    return SD_OK;
}
