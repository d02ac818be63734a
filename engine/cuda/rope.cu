/* rope.cu — rotary position embedding, adjacent pairs (rope) and NeoX
 * halves (rope_neox) by one kernel, twin of engine/cpu/rope.c; and rope_kv,
 * the adjacent-pair rotation of q and k fused with the two KV-cache writes
 * that follow it in the attention block. One thread per (token, pair i)
 * computes theta = pos * inv_freq[i] and its cosine and sine in double,
 * rounds them once to float (as the CPU does) and rotates pair i of every
 * head, so the double-precision work is done once per pair, not once per
 * head. A layout is where pair i starts (2i, or i for NeoX) and the gap
 * between its two elements (1, or head_dim/2). pos comes from the forward's
 * announced host arrays. */
#include "cuda/cuda_impl.h"

/* Rotates one pair of n_heads heads of one token's row by (cf, sf): the
 * pair's first element at row[0] of each head, its second gap floats on.
 * One function for every layout and for rope_kv, so all round the same
 * way. */
__device__ __forceinline__ void rotate_heads(float *row, int n_heads, int head_dim, int gap, float cf, float sf) {
    for (int h = 0; h < n_heads; h++) {
        float *v = row + (size_t)h * (size_t)head_dim;
        const float x0 = v[0], x1 = v[gap];
        v[0] = x0 * cf - x1 * sf;
        v[gap] = x0 * sf + x1 * cf;
    }
}

/* neox: 0 for adjacent pairs (2i, 2i + 1), 1 for NeoX halves (i, i + head_dim/2). */
__global__ void rope_kernel(float *x, int n_tokens, int n_heads, int head_dim, const int32_t *__restrict__ pos,
                            const float *__restrict__ inv_freq, int neox) {
    sd_pdl_wait();
    sd_pdl_release();
    const int half = head_dim / 2;
    const long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (long long)n_tokens * half) return;
    const int t = (int)(item / half), i = (int)(item % half);
    double s, c;
    sincos((double)pos[t] * (double)inv_freq[i], &s, &c);
    const float cf = (float)c, sf = (float)s;
    const int first = neox ? i : 2 * i, gap = neox ? half : 1;
    rotate_heads(x + (size_t)t * (size_t)n_heads * (size_t)head_dim + first, n_heads, head_dim, gap, cf, sf);
}

/* One launch of rope_kernel in either layout, named for the profiles. */
static sd_status launch_rope(sd_backend *be, const char *name, float *x, int32_t n_tokens, int32_t n_heads,
                             int32_t head_dim, const int32_t *pos, const float *inv_freq, int neox) {
    if (n_tokens <= 0) return SD_OK;
    const int32_t *d_pos;
    SD_TRY(sd_cuda_dev_i32(be, pos, (size_t)n_tokens, &d_pos));
    long long items = (long long)n_tokens * (head_dim / 2);
    int blocks = (int)((items + 127) / 128);
    return sd_cuda_launch(be, name, rope_kernel, dim3((unsigned)blocks), dim3(128), 0, x, n_tokens, n_heads, head_dim,
                          d_pos, inv_freq, neox);
}

sd_status sd_cuda_rope(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                       const int32_t *pos, const float *inv_freq) {
    return launch_rope(be, "rope", x, n_tokens, n_heads, head_dim, pos, inv_freq, 0);
}

/* rope_kv: one block per token. Its threads take the pairs, rotate the
 * token's q and k heads (theta once per pair), then, after a barrier, copy
 * the rotated k row and the v row into the token's slot of the pools
 * (kv_write's addressing). */
__global__ void rope_kv_kernel(float *q, float *k, const float *__restrict__ v, int n_heads, int n_kv_heads,
                               int head_dim, const int32_t *__restrict__ pos, const float *__restrict__ inv_freq,
                               float *k_pool, float *v_pool, int block_size, const int32_t *__restrict__ bt,
                               const int32_t *__restrict__ bt_off) {
    sd_pdl_wait();
    sd_pdl_release();
    const int t = blockIdx.x, half = head_dim / 2, row_width = n_kv_heads * head_dim;
    const int p = pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double s, c;
        sincos((double)p * (double)inv_freq[i], &s, &c);
        const float cf = (float)c, sf = (float)s;
        rotate_heads(q + (size_t)t * (size_t)n_heads * (size_t)head_dim + 2 * i, n_heads, head_dim, 1, cf, sf);
        rotate_heads(k + (size_t)t * (size_t)row_width + 2 * i, n_kv_heads, head_dim, 1, cf, sf);
    }
    __syncthreads();
    const size_t slot = (size_t)bt[bt_off[t] + p / block_size] * (size_t)block_size + (size_t)(p % block_size);
    const float *ks = k + (size_t)t * (size_t)row_width, *vs = v + (size_t)t * (size_t)row_width;
    float *kd = k_pool + slot * (size_t)row_width, *vd = v_pool + slot * (size_t)row_width;
    for (int i = threadIdx.x; i < row_width; i += blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}

sd_status sd_cuda_rope_kv(sd_backend *be, float *q, float *k, const float *v, int32_t n_tokens, int32_t n_heads,
                          int32_t n_kv_heads, int32_t head_dim, const int32_t *pos, const float *inv_freq,
                          float *k_pool, float *v_pool, int32_t block_size, const int32_t *bt, const int32_t *bt_off) {
    if (n_tokens <= 0) return SD_OK;
    if (be->fuse == 0) { /* op by op, for comparison (--cuda-fuse 0) */
        const int32_t row = n_kv_heads * head_dim;
        SD_TRY(sd_cuda_rope(be, q, n_tokens, n_heads, head_dim, pos, inv_freq));
        SD_TRY(sd_cuda_rope(be, k, n_tokens, n_kv_heads, head_dim, pos, inv_freq));
        SD_TRY(sd_cuda_kv_write(be, k_pool, block_size, row, k, n_tokens, pos, bt, bt_off));
        return sd_cuda_kv_write(be, v_pool, block_size, row, v, n_tokens, pos, bt, bt_off);
    }
    const int32_t *d_pos, *d_off, *d_bt;
    SD_TRY(sd_cuda_dev_paging(be, n_tokens, block_size, pos, bt, bt_off, &d_pos, &d_bt, &d_off));
    return sd_cuda_launch(be, "rope_kv", rope_kv_kernel, dim3((unsigned)n_tokens), dim3(128), 0, q, k, v, n_heads,
                          n_kv_heads, head_dim, d_pos, inv_freq, k_pool, v_pool, block_size, d_bt, d_off);
}

/* NeoX mode (Qwen2/3, Gemma 3), twin of sd_cpu_rope_neox: pair i of a head
 * is (x[i], x[i + head_dim/2]); theta, cos and sin as for adjacent pairs. */
sd_status sd_cuda_rope_neox(sd_backend *be, float *x, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                            const int32_t *pos, const float *inv_freq) {
    return launch_rope(be, "rope_neox", x, n_tokens, n_heads, head_dim, pos, inv_freq, 1);
}
