/* rmsnorm.c — out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, per token.
 * The sum of squares is sd_cpu_dot(x, x): the same fixed reduction order for
 * every token, whatever the batch. Parallel over tokens. */
#include "cpu/cpu_impl.h"

typedef struct rmsnorm_args {
    const float *x, *weight;
    float *out;
    size_t n_tokens, dim;
    float eps;
} rmsnorm_args;

static void rmsnorm_token(void *p, int64_t t, int32_t ith) {
    const rmsnorm_args *a = p;
    const float *x = a->x + (size_t)t * a->dim;
    float *o = a->out + (size_t)t * a->dim;
    float mean = sd_cpu_dot(x, x, a->dim) / (float)a->dim;
    float scale = 1.0f / sqrtf(mean + a->eps);
    for (size_t i = 0; i < a->dim; i++) o[i] = (x[i] * scale) * a->weight[i];
}

sd_status sd_cpu_rmsnorm(sd_backend *be, const float *x, const float *weight, int32_t n_tokens, int32_t dim, float eps,
                         float *out) {
    if (n_tokens <= 0) return SD_OK;
    rmsnorm_args a = {x, weight, out, (size_t)n_tokens, (size_t)dim, eps};
    sd_cpu_parallel(be, rmsnorm_token, &a, n_tokens, (size_t)n_tokens * (size_t)dim);
    return SD_OK;
}
