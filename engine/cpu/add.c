/* add.c — out = a + b, elementwise (the residual connections); a bias added
 * to every row; a scaling. Each element one float operation. */
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

typedef struct rows_args {
    const float *x, *bias;
    float *out;
    size_t n_rows, dim;
} rows_args;

static void add_rows_chunk(void *p, int64_t r, int32_t ith) {
    const rows_args *a = p;
    const size_t off = (size_t)r * a->dim;
    for (size_t i = 0; i < a->dim; i++) a->out[off + i] = a->x[off + i] + a->bias[i];
}

sd_status sd_cpu_add_rows(sd_backend *be, const float *x, const float *bias, int32_t n_rows, int32_t dim, float *out) {
    if (n_rows <= 0 || dim <= 0) return SD_OK;
    rows_args a = {x, bias, out, (size_t)n_rows, (size_t)dim};
    sd_cpu_parallel(be, add_rows_chunk, &a, n_rows, (size_t)n_rows * (size_t)dim);
    return SD_OK;
}

typedef struct scale_args {
    const float *x;
    float *out;
    size_t n;
    float s;
} scale_args;

static void scale_chunk(void *p, int64_t c, int32_t ith) {
    const scale_args *a = p;
    size_t begin, end;
    sd_cpu_chunk(a->n, CHUNK, c, &begin, &end);
    for (size_t i = begin; i < end; i++) a->out[i] = a->x[i] * a->s;
}

sd_status sd_cpu_scale(sd_backend *be, const float *x, size_t n, float s, float *out) {
    scale_args a = {x, out, n, s};
    sd_cpu_parallel(be, scale_chunk, &a, (int64_t)((n + CHUNK - 1) / CHUNK), n);
    return SD_OK;
}
