/* add.cu — out = a + b elementwise (the residual adds), twin of
 * engine/cpu/add.c; out may alias a or b. Also add_rows (a bias on every
 * row) and scale. */
#include "cuda/cuda_impl.h"

__global__ void add_kernel(const float *a, const float *b, size_t n, float *out) {
    sd_pdl_wait();
    sd_pdl_release();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

sd_status sd_cuda_add(sd_backend *be, const float *a, const float *b, size_t n, float *out) {
    if (n == 0) return SD_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)be->n_sm * 16) blocks = (size_t)be->n_sm * 16;
    return sd_cuda_launch(be, "add", add_kernel, dim3((unsigned)blocks), dim3(256), 0, a, b, n, out);
}

__global__ void add_rows_kernel(const float *x, const float *bias, size_t n, int dim, float *out) {
    sd_pdl_wait();
    sd_pdl_release();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = x[i] + bias[i % (size_t)dim];
}

sd_status sd_cuda_add_rows(sd_backend *be, const float *x, const float *bias, int32_t n_rows, int32_t dim, float *out) {
    if (n_rows <= 0 || dim <= 0) return SD_OK;
    const size_t n = (size_t)n_rows * (size_t)dim;
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)be->n_sm * 16) blocks = (size_t)be->n_sm * 16;
    return sd_cuda_launch(be, "add_rows", add_rows_kernel, dim3((unsigned)blocks), dim3(256), 0, x, bias, n, (int)dim,
                          out);
}

__global__ void scale_kernel(const float *x, size_t n, float s, float *out) {
    sd_pdl_wait();
    sd_pdl_release();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = x[i] * s;
}

sd_status sd_cuda_scale(sd_backend *be, const float *x, size_t n, float s, float *out) {
    if (n == 0) return SD_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)be->n_sm * 16) blocks = (size_t)be->n_sm * 16;
    return sd_cuda_launch(be, "scale", scale_kernel, dim3((unsigned)blocks), dim3(256), 0, x, n, s, out);
}
