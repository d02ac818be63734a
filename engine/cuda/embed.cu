/* embed.cu — embedding lookup (also the gather of wanted rows before the LM
 * head), twin of engine/cpu/embed.c: out[t][:] = table[ids[t]][:].
 * One block per token copies its row with 16-byte loads when the rows allow
 * it. ids come from the forward's announced host arrays (already range-checked
 * by the model). */
#include "cuda/cuda_impl.h"

__global__ void embed_kernel(const float *__restrict__ table, int dim, const int32_t *__restrict__ ids,
                             float *__restrict__ out) {
    sd_pdl_wait();
    sd_pdl_release();
    const int t = blockIdx.x;
    const float *src = table + (size_t)ids[t] * (size_t)dim;
    float *dst = out + (size_t)t * (size_t)dim;
    if ((dim & 3) == 0) {
        const float4 *s4 = (const float4 *)src;
        float4 *d4 = (float4 *)dst;
        for (int i = threadIdx.x; i < dim / 4; i += blockDim.x) d4[i] = s4[i];
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
    }
}

sd_status sd_cuda_embed(sd_backend *be, const float *table, int32_t dim, const int32_t *ids, int32_t n_tokens,
                        float *out) {
    if (n_tokens <= 0) return SD_OK;
    const int32_t *d_ids;
    SD_TRY(sd_cuda_dev_i32(be, ids, (size_t)n_tokens, &d_ids));
    return sd_cuda_launch(be, "embed", embed_kernel, dim3((unsigned)n_tokens), dim3(128), 0, table, dim, d_ids, out);
}
