/* add.c — out = a + b, elementwise (the residual connections). */
#include "cpu/cpu_impl.h"

typedef struct add_args {
    const float *a, *b;
    float *out;
    size_t n;
} add_args;

static void add_thread(void *p, int32_t ith, int32_t nth) {
    const add_args *a = p;
    size_t begin, end;
    sd_cpu_split(a->n, 64, ith, nth, &begin, &end);
    for (size_t i = begin; i < end; i++) a->out[i] = a->a[i] + a->b[i];
}

sd_status sd_cpu_add(sd_backend *be, const float *a, const float *b, size_t n, float *out) {
    add_args args = {a, b, out, n};
    sd_cpu_parallel(be, add_thread, &args, n);
    return SD_OK;
}
