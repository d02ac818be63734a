/* host_ops.h — the CPU backend's threaded f32 matrix product for code above
 * the model layer that runs small networks of its own on host memory (the
 * EAGLE-3 draft head, engine/spec/eagle_head.c), without reaching into the
 * backend table (backend_impl.h stays private to the model layer). */
#ifndef SPECD_HOST_OPS_H
#define SPECD_HOST_OPS_H

#include "specd/common.h"
#include "specd/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_host_ops sd_host_ops;

/* A CPU backend with n_threads workers (0 = every online core). Caller frees
 * with sd_host_ops_free. */
sd_status sd_host_ops_create(int32_t n_threads, sd_host_ops **out);
void sd_host_ops_free(sd_host_ops **o);

/* y[t][o] = sum_i w[o][i] * x[t][i]: w [n_out][n_in], x [n][n_in],
 * y [n][n_out] (y != x), all host f32. Batch invariant like the model's. */
sd_status sd_host_matmul(sd_host_ops *o, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n,
                         float *y);

/* y = w x as sd_host_matmul with w [n_out] rows of n_in elements of type
 * as stored (F16 or BF16: half the bytes a step reads; other types the
 * CPU backend's stored matmul supports likewise). SD_ERR_UNSUPPORTED for
 * a type it cannot run. */
sd_status sd_host_matmul_stored(sd_host_ops *o, sd_dtype type, const void *w, int32_t n_in, int32_t n_out,
                                const float *x, int32_t n, float *y);

#ifdef __cplusplus
}
#endif
#endif
