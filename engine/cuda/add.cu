/* add.cu — out = a + b elementwise (the residual adds), twin of
 * engine/cpu/add.c; out may alias a or b. */
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
