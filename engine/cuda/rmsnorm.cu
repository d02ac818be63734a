/* rmsnorm.cu — out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, twin of
 * engine/cpu/rmsnorm.c. One block of 256 threads per token: each thread sums
 * the squares of elements tid, tid+256, ... in order (fused multiply-add),
 * the warps reduce by a fixed butterfly and the 8 warp sums are added in
 * warp order, so a token's result depends only on its own row. The scale is
 * 1/sqrtf(mean + eps) and each output (x * scale) * weight, as on the CPU;
 * only the order of the sum of squares differs. */
#include "cuda/cuda_impl.h"

#define RMS_THREADS 256

__global__ void rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ weight, int dim, float eps,
                               float *out) {
    __shared__ float warp_sums[RMS_THREADS / 32];
    __shared__ float scale_sh;
    sd_pdl_wait();
    sd_pdl_release();
    const int t = blockIdx.x;
    const float *row = x + (size_t)t * (size_t)dim;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < dim; i += RMS_THREADS) acc = fmaf(row[i], row[i], acc);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < RMS_THREADS / 32; w++) sum += warp_sums[w];
        scale_sh = 1.0f / sqrtf(sum / (float)dim + eps);
    }
    __syncthreads();
    const float scale = scale_sh;
    float *o = out + (size_t)t * (size_t)dim;
    for (int i = threadIdx.x; i < dim; i += RMS_THREADS) o[i] = (row[i] * scale) * weight[i];
}

sd_status sd_cuda_rmsnorm(sd_backend *be, const float *x, const float *weight, int32_t n_tokens, int32_t dim, float eps,
                          float *out) {
    if (n_tokens <= 0) return SD_OK;
    return sd_cuda_launch(be, "rmsnorm", rmsnorm_kernel, dim3((unsigned)n_tokens), dim3(RMS_THREADS), 0, x, weight, dim,
                          eps, out);
}
