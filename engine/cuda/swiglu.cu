/* swiglu.cu — out = silu(gate) * up elementwise, twin of engine/cpu/swiglu.c:
 * g / (1 + expf(-g)) * up with the precise expf (no fast-math), a
 * grid-stride loop; and GeGLU, gelu(gate) * up with the tanh gelu in the
 * CPU's form (swiglu.c: g * sigmoid(2u) through t = e^-|2u|, the same
 * operations uncontracted, with the precise expf). */
#include "cuda/cuda_impl.h"

__global__ void swiglu_kernel(const float *gate, const float *up, size_t n, float *out) {
    sd_pdl_wait();
    sd_pdl_release();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

sd_status sd_cuda_swiglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out) {
    if (n == 0) return SD_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)be->n_sm * 16) blocks = (size_t)be->n_sm * 16;
    return sd_cuda_launch(be, "swiglu", swiglu_kernel, dim3((unsigned)blocks), dim3(256), 0, gate, up, n, out);
}

__global__ void geglu_kernel(const float *gate, const float *up, size_t n, float *out) {
    sd_pdl_wait();
    sd_pdl_release();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float c = __fmul_rn(0.044715f, __fmul_rn(g, g));
        const float z = __fmul_rn(1.5957691216057308f, fmaf(c, g, g));
        const float t = expf(-fabsf(z));
        out[i] = __fmul_rn(__fmul_rn(g, __fdiv_rn(z >= 0.0f ? 1.0f : t, __fadd_rn(1.0f, t))), up[i]);
    }
}

sd_status sd_cuda_geglu(sd_backend *be, const float *gate, const float *up, size_t n, float *out) {
    if (n == 0) return SD_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)be->n_sm * 16) blocks = (size_t)be->n_sm * 16;
    return sd_cuda_launch(be, "geglu", geglu_kernel, dim3((unsigned)blocks), dim3(256), 0, gate, up, n, out);
}
