/* host_ops.c — a CPU backend handle behind the small host_ops.h interface:
 * the threaded f32 and stored-type (F16 / BF16) matmuls for networks above
 * the model layer (the EAGLE-3 head). */
#include "specd/host_ops.h"

#include "backend_impl.h"

#include <stdlib.h>

struct sd_host_ops {
    sd_backend_handle be;
};

sd_status sd_host_ops_create(int32_t n_threads, sd_host_ops **out) {
    if (!out || n_threads < 0) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_host_ops *o = calloc(1, sizeof *o);
    if (!o) return SD_ERR_NOMEM;
    sd_status s = sd_cpu_backend_create(n_threads, &o->be);
    if (s != SD_OK) {
        free(o);
        return s;
    }
    *out = o;
    return SD_OK;
}

void sd_host_ops_free(sd_host_ops **po) {
    if (!po || !*po) return;
    (*po)->be.ops->destroy(&(*po)->be.ctx);
    free(*po);
    *po = NULL;
}

sd_status sd_host_matmul(sd_host_ops *o, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n,
                         float *y) {
    if (!o || !w || !x || !y || n_in <= 0 || n_out < 0 || n < 0) return SD_ERR_INVALID_ARG;
    return o->be.ops->matmul(o->be.ctx, w, n_in, n_out, x, n, y);
}

sd_status sd_host_matmul_stored(sd_host_ops *o, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                                const float *x, int32_t n, float *y) {
    if (!o || !w || !x || !y || n_in <= 0 || n_out < 0 || n < 0) return SD_ERR_INVALID_ARG;
    if (type == SD_DTYPE_F32) return o->be.ops->matmul(o->be.ctx, w, n_in, n_out, x, n, y);
    if (!o->be.ops->stored_supports || !o->be.ops->stored_supports(type)) return SD_ERR_UNSUPPORTED;
    return o->be.ops->matmul_stored(o->be.ctx, type, w, n_in, n_out, x, n, y);
}
