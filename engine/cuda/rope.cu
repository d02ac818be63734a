/* rope.cu — rotary position embedding, adjacent pairs, twin of
 * engine/cpu/rope.c. One thread per (token, pair i) computes
 * theta = pos * inv_freq[i] and its cosine and sine in double, rounds them
 * once to float (as the CPU does) and rotates pair i of every head, so the
 * double-precision work is done once per pair, not once per head. pos comes
 * from the forward's announced host arrays. */
#include "cuda/cuda_impl.h"

__global__ void rope_kernel(float *x, int n_tokens, int n_heads, int head_dim, const int32_t *__restrict__ pos,
                            const float *__restrict__ inv_freq) {
    const int half = head_dim / 2;
    const long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (long long)n_tokens * half) return;
    const int t = (int)(item / half), i = (int)(item % half);
    double s, c;
    sincos((double)pos[t] * (double)inv_freq[i], &s, &c);
    const float cf = (float)c, sf = (float)s;
    float *row = x + (size_t)t * (size_t)n_heads * (size_t)head_dim + 2 * i;
    for (int h = 0; h < n_heads; h++) {
        float *v = row + (size_t)h * (size_t)head_dim;
        const float x0 = v[0], x1 = v[1];
        v[0] = x0 * cf - x1 * sf;
        v[1] = x0 * sf + x1 * cf;
    }
}

sd_status sd_cuda_rope(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                       const int32_t *pos, const float *inv_freq) {
    if (n_tokens <= 0) return SD_OK;
    const int32_t *d_pos;
    SD_TRY(sd_cuda_dev_i32(be, pos, (size_t)n_tokens, &d_pos));
    long long items = (long long)n_tokens * (head_dim / 2);
    int blocks = (int)((items + 127) / 128);
    rope_kernel<<<blocks, 128, 0, be->stream>>>(x, n_tokens, n_heads, head_dim, d_pos, inv_freq);
    CUDA_LAUNCH_CHECK("rope");
    return SD_OK;
}
