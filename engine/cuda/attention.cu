/* attention.cu — the paged KV cache write and causal attention over it,
 * twin of engine/cpu/attention.c.
 *
 * kv_write: one block per token copies its K (or V) row into slot
 * pos % block_size of block bt[bt_off + pos / block_size].
 *
 * attention: one block of 128 threads per (token, query head); kv head
 * h / (n_heads / n_kv_heads). The positions 0..pos[t] are walked in chunks
 * of ATT_CHUNK with an online softmax (running maximum m and sum l; the
 * running output is rescaled by exp(m_old - m_new) when the maximum grows):
 *   1. each thread scores its positions of the chunk, dot(q, k) * scale,
 *      into shared memory;
 *   2. the block takes the chunk's maximum, rescales, and turns scores into
 *      weights exp(s - m) summed into l;
 *   3. thread (d, g) accumulates weight * v[d] over the chunk's positions
 *      g, g + G, ... (v rows read coalesced across d).
 * The G partial outputs are added in group order and divided by l. Grid and
 * shared memory depend only on the batch shape (n_tokens, heads, head_dim),
 * never on the positions, which are read from device memory: the same
 * launch serves every step of a recorded forward. The scores are exactly
 * the CPU's up to the order of the dot product; the softmax differs from the
 * CPU's single-maximum form only by rounding.
 *
 * Loads are what bound this kernel at decode (a few blocks, long rows):
 * when head_dim is a multiple of 4, keys are read as float4 with the dot
 * product unrolled, and values by teams of head_dim/4 threads that issue
 * four rows' loads before using them. Every sum still runs in a fixed order
 * that depends only on the shape.
 *
 * Calls of up to SD_CUDA_GEMV_MAX_TOKENS tokens (decode, verification) have
 * too few (token, head) blocks to fill the GPU, so each block takes one of
 * n_splits ranges of the positions (flash-decoding) and writes its
 * unnormalized output with its maximum and sum; attention_combine_kernel
 * joins the ranges in order. The split count depends only on the head
 * count and the GPU, so it does not break batch invariance.
 *
 * A sliding window (attention_window) starts each token's positions at
 * max(0, pos - window + 1); the splits divide that range.
 *
 * Rejected for now: sharing K/V loads across the query heads of a GQA group
 * (L2 already serves the repeats). */
#include "cuda/cuda_impl.h"

#define ATT_THREADS             128
#define ATT_CHUNK               256
#define ATT_MAX_HEAD_DIM        1024
#define ATT_MAX_DIMS_PER_THREAD (ATT_MAX_HEAD_DIM / ATT_THREADS)
#define ATT_SPLIT_ALIGN         64 /* positions of a split come in pieces of this many */
#define ATT_MAX_SPLITS          32

__global__ void kv_write_kernel(float *pool, int block_size, int row_width, const float *__restrict__ src,
                                const int32_t *__restrict__ pos, const int32_t *__restrict__ bt,
                                const int32_t *__restrict__ bt_off) {
    sd_pdl_wait();
    sd_pdl_release();
    const int t = blockIdx.x;
    const int p = pos[t];
    const size_t slot = (size_t)bt[bt_off[t] + p / block_size] * (size_t)block_size + (size_t)(p % block_size);
    float *dst = pool + slot * (size_t)row_width;
    const float *s = src + (size_t)t * (size_t)row_width;
    for (int i = threadIdx.x; i < row_width; i += blockDim.x) dst[i] = s[i];
}

sd_status sd_cuda_kv_write(sd_backend *be, float *pool, int32_t block_size, int32_t row_width, const float *src,
                           int32_t n_tokens, const int32_t *pos, const int32_t *bt, const int32_t *bt_off) {
    if (n_tokens <= 0) return SD_OK;
    const int32_t *d_pos, *d_off, *d_bt;
    SD_TRY(sd_cuda_dev_paging(be, n_tokens, block_size, pos, bt, bt_off, &d_pos, &d_bt, &d_off));
    return sd_cuda_launch(be, "kv_write", kv_write_kernel, dim3((unsigned)n_tokens), dim3(128), 0, pool, block_size,
                          row_width, src, d_pos, d_bt, d_off);
}

/* Block-wide max / sum through shared memory; every thread gets the result. */
__device__ __forceinline__ float block_max(float v, float *red) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    __syncthreads(); /* red may still be read from the last call */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < ATT_THREADS / 32; w++) r = fmaxf(r, red[w]);
    return r;
}

__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < ATT_THREADS / 32; w++) r += red[w];
    return r;
}

/* The output layout. Vector path (head_dim % 4 == 0): a position's values
 * are read as float4 by head_dim/4 threads, and the block's threads form
 * `groups` such teams, each walking its own positions. Scalar path: teams of
 * head_dim threads (or one team whose threads own dims tid, tid + 128, ...
 * when head_dim > 128). */
__host__ __device__ __forceinline__ bool att_vec(int head_dim) {
    return head_dim % 4 == 0 && head_dim / 4 <= ATT_THREADS;
}
__host__ __device__ __forceinline__ int att_groups(int head_dim) {
    if (att_vec(head_dim)) return ATT_THREADS / (head_dim / 4);
    return head_dim <= ATT_THREADS ? ATT_THREADS / head_dim : 1;
}

/* Address of kv head kvh's vector at position p of a sequence (table). */
__device__ __forceinline__ const float *kv_row(const float *pool, const int32_t *table, int p, int block_size,
                                               size_t row, int kvh, int head_dim) {
    const size_t slot = (size_t)table[p / block_size] * (size_t)block_size + (size_t)(p % block_size);
    return pool + slot * row + (size_t)kvh * (size_t)head_dim;
}

/* Sum over the teams' partial outputs for dim d, in team order. */
__device__ __forceinline__ float g_owned_sum(const float *part_sh, int groups, int head_dim, int d) {
    float sum = part_sh[d];
    for (int gg = 1; gg < groups; gg++) sum += part_sh[gg * head_dim + d];
    return sum;
}

/* 1. A chunk's scores dot(q, k) * scale into w_sh, each a dot product in
 * increasing d (float4 loads on the vector path); returns the maximum of
 * this thread's scores. */
__device__ __forceinline__ float chunk_scores(const float *q_sh, const float *__restrict__ k_pool,
                                              const int32_t *table, int c0, int c_len, int block_size, size_t row,
                                              int kvh, int head_dim, bool vec, float scale, float *w_sh) {
    float local_max = -INFINITY;
    for (int j = threadIdx.x; j < c_len; j += ATT_THREADS) {
        const float *k = kv_row(k_pool, table, c0 + j, block_size, row, kvh, head_dim);
        float s = 0.0f;
        if (vec) {
            const float4 *k4 = (const float4 *)k, *q4 = (const float4 *)q_sh;
#pragma unroll 8
            for (int d4 = 0; d4 < head_dim / 4; d4++) {
                const float4 kv = __ldg(k4 + d4), qv = q4[d4];
                s = fmaf(qv.x, kv.x, s);
                s = fmaf(qv.y, kv.y, s);
                s = fmaf(qv.z, kv.z, s);
                s = fmaf(qv.w, kv.w, s);
            }
        } else {
            for (int d = 0; d < head_dim; d++) s = fmaf(q_sh[d], k[d], s);
        }
        s *= scale;
        w_sh[j] = s;
        local_max = fmaxf(local_max, s);
    }
    return local_max;
}

/* 3, vector path: team g rescales acc[0..3] (dims 4*lane .. 4*lane+3) and
 * adds weight * v over positions g, g + groups, ... of the chunk; four
 * rows' loads are issued before their multiply-adds, which run in position
 * order. */
__device__ __forceinline__ void chunk_values_vec(float *acc, float rescale, const float *__restrict__ v_pool,
                                                 const int32_t *table, int c0, int c_len, int block_size, size_t row,
                                                 int kvh, int head_dim, int g, int groups, int lane,
                                                 const float *w_sh) {
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] *= rescale;
    for (int j = g; j < c_len; j += 4 * groups) {
        float4 v[4];
        float w[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int jj = j + u * groups;
            if (jj < c_len) {
                v[u] = __ldg((const float4 *)kv_row(v_pool, table, c0 + jj, block_size, row, kvh, head_dim) + lane);
                w[u] = w_sh[jj];
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (j + u * groups >= c_len) break;
            acc[0] = fmaf(w[u], v[u].x, acc[0]);
            acc[1] = fmaf(w[u], v[u].y, acc[1]);
            acc[2] = fmaf(w[u], v[u].z, acc[2]);
            acc[3] = fmaf(w[u], v[u].w, acc[3]);
        }
    }
}

/* 3, scalar path: the same for the thread's dims lane, lane + ATT_THREADS, ... */
__device__ __forceinline__ void chunk_values_scalar(float *acc, float rescale, const float *__restrict__ v_pool,
                                                    const int32_t *table, int c0, int c_len, int block_size,
                                                    size_t row, int kvh, int head_dim, int g, int groups, int lane,
                                                    const float *w_sh) {
#pragma unroll
    for (int r = 0; r < ATT_MAX_DIMS_PER_THREAD; r++) acc[r] *= rescale;
    for (int j = g; j < c_len; j += groups) {
        const float *v = kv_row(v_pool, table, c0 + j, block_size, row, kvh, head_dim);
        const float wj = w_sh[j];
#pragma unroll
        for (int r = 0; r < ATT_MAX_DIMS_PER_THREAD; r++) {
            const int d = lane + r * ATT_THREADS;
            if (d < head_dim) acc[r] = fmaf(wj, v[d], acc[r]);
        }
    }
}

/* The teams' partial outputs into part_sh[g][d], for the ordered sum. */
__device__ __forceinline__ void store_parts(const float *acc, float *part_sh, bool vec, int g, int lane,
                                            int head_dim) {
    if (vec) {
#pragma unroll
        for (int e = 0; e < 4; e++) part_sh[g * head_dim + 4 * lane + e] = acc[e];
        return;
    }
#pragma unroll
    for (int r = 0; r < ATT_MAX_DIMS_PER_THREAD; r++) {
        const int d = lane + r * ATT_THREADS;
        if (d < head_dim) part_sh[g * head_dim + d] = acc[r];
    }
}

__global__ void __launch_bounds__(ATT_THREADS)
    attention_kernel(const float *__restrict__ q, const float *__restrict__ k_pool, const float *__restrict__ v_pool,
                     int n_heads, int n_kv_heads, int head_dim, int block_size, const int32_t *__restrict__ pos,
                     const int32_t *__restrict__ bt, const int32_t *__restrict__ bt_off, int window, float scale,
                     float *out, int n_splits, float *__restrict__ split_ml, float *__restrict__ split_acc) {
    __shared__ __align__(16) float q_sh[ATT_MAX_HEAD_DIM];
    __shared__ float w_sh[ATT_CHUNK];
    __shared__ float red[ATT_THREADS / 32];
    extern __shared__ __align__(16) float part_sh[]; /* [groups][head_dim] partial outputs */
    sd_pdl_wait();
    sd_pdl_release();

    const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int n_pos = pos[t] + 1;
    const int32_t *table = bt + bt_off[t];
    const size_t row = (size_t)n_kv_heads * (size_t)head_dim; /* floats per cached token */
    const float *qrow = q + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
    for (int d = threadIdx.x; d < head_dim; d += ATT_THREADS) q_sh[d] = qrow[d];

    const bool vec = att_vec(head_dim);
    const int groups = att_groups(head_dim);
    const int team = vec ? head_dim / 4 : (head_dim <= ATT_THREADS ? head_dim : ATT_THREADS);
    const int g = threadIdx.x / team, lane = threadIdx.x % team;
    const bool owns = g < groups && (vec || lane < head_dim);
    float acc[ATT_MAX_DIMS_PER_THREAD]; /* vector path: acc[0..3] are dims 4*lane .. 4*lane+3 */
#pragma unroll
    for (int r = 0; r < ATT_MAX_DIMS_PER_THREAD; r++) acc[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    __syncthreads();

    /* this block's share of the positions: split s of n_splits takes a
     * range of whole ATT_SPLIT_ALIGN-position pieces (empty when the
     * context is short); the ranges depend on the position alone */
    /* a sliding window (window > 0) starts the positions at lo */
    const int lo = window > 0 && n_pos > window ? n_pos - window : 0;
    int per = (n_pos - lo + n_splits - 1) / n_splits;
    per = (per + ATT_SPLIT_ALIGN - 1) / ATT_SPLIT_ALIGN * ATT_SPLIT_ALIGN;
    const int p_begin = min(n_pos, lo + (int)blockIdx.y * per), p_end = min(n_pos, p_begin + per);
    for (int c0 = p_begin; c0 < p_end; c0 += ATT_CHUNK) {
        const int c_len = min(ATT_CHUNK, p_end - c0);
        const float local_max =
            chunk_scores(q_sh, k_pool, table, c0, c_len, block_size, row, kvh, head_dim, vec, scale, w_sh);
        /* 2. online softmax */
        const float c_max = block_max(local_max, red);
        const float m_new = fmaxf(m, c_max);
        const float rescale = expf(m - m_new); /* 0 on the first chunk (m = -inf) */
        float local_sum = 0.0f;
        for (int j = threadIdx.x; j < c_len; j += ATT_THREADS) {
            const float e = expf(w_sh[j] - m_new);
            w_sh[j] = e;
            local_sum += e;
        }
        const float c_sum = block_sum(local_sum, red); /* its barriers publish w_sh */
        l = l * rescale + c_sum;
        m = m_new;
        /* 3. weighted values */
        if (owns && vec)
            chunk_values_vec(acc, rescale, v_pool, table, c0, c_len, block_size, row, kvh, head_dim, g, groups, lane,
                             w_sh);
        else if (owns)
            chunk_values_scalar(acc, rescale, v_pool, table, c0, c_len, block_size, row, kvh, head_dim, g, groups,
                                lane, w_sh);
        __syncthreads(); /* w_sh is rewritten by the next chunk */
    }

    /* combine the teams in order */
    if (owns) store_parts(acc, part_sh, vec, g, lane, head_dim);
    __syncthreads();
    if (n_splits > 1) { /* unnormalized, relative to this split's maximum m */
        const size_t part = (size_t)blockIdx.x * (size_t)n_splits + blockIdx.y;
        if (threadIdx.x == 0) split_ml[2 * part] = m, split_ml[2 * part + 1] = l;
        for (int d = threadIdx.x; d < head_dim; d += ATT_THREADS) {
            float sum = g_owned_sum(part_sh, groups, head_dim, d);
            split_acc[part * (size_t)head_dim + d] = sum;
        }
        return;
    }
    float *orow = out + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
    for (int d = threadIdx.x; d < head_dim; d += ATT_THREADS) orow[d] = g_owned_sum(part_sh, groups, head_dim, d) / l;
}

/* Joins the splits of each (token, head) in split order: M = max m_s,
 * out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). An empty split has
 * m = -inf and weighs nothing. */
__global__ void attention_combine_kernel(const float *__restrict__ split_ml, const float *__restrict__ split_acc,
                                         int n_splits, int head_dim, float *out) {
    sd_pdl_wait();
    sd_pdl_release();
    const size_t base = (size_t)blockIdx.x * (size_t)n_splits;
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, split_ml[2 * (base + s)]);
    float L = 0.0f;
    for (int s = 0; s < n_splits; s++) L += split_ml[2 * (base + s) + 1] * expf(split_ml[2 * (base + s)] - M);
    float *orow = out + (size_t)blockIdx.x * (size_t)head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++)
            o += split_acc[(base + s) * (size_t)head_dim + d] * expf(split_ml[2 * (base + s)] - M);
        orow[d] = o / L;
    }
}

static sd_status attention_launch(sd_backend *be, const float *q, const float *k_pool, const float *v_pool,
                                  int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                  int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                  int32_t window, float scale, float *out) {
    if (n_tokens <= 0) return SD_OK;
    if (head_dim > ATT_MAX_HEAD_DIM || n_kv_heads <= 0 || n_heads % n_kv_heads != 0) {
        SD_ERROR("cuda: attention supports head_dim <= %d and n_heads a multiple of n_kv_heads (got %d, %d, %d)",
                 ATT_MAX_HEAD_DIM, (int)head_dim, (int)n_heads, (int)n_kv_heads);
        return SD_ERR_UNSUPPORTED;
    }
    if ((long long)n_tokens * n_heads > 0x7fffffffll) return SD_ERR_RANGE;
    const int32_t *d_pos, *d_off, *d_bt;
    SD_TRY(sd_cuda_dev_paging(be, n_tokens, block_size, pos, bt, bt_off, &d_pos, &d_bt, &d_off));
    const int groups = att_groups(head_dim);
    const size_t part_bytes = (size_t)groups * (size_t)head_dim * sizeof(float);
    /* Decode and verification calls are few blocks over long rows: split the
     * positions of each (token, head) over enough blocks to fill the GPU.
     * The split count depends on the heads and the GPU only, so a token's
     * result is the same in any call of up to SD_CUDA_GEMV_MAX_TOKENS
     * tokens; longer calls (prefill) have blocks enough and do not split. */
    int n_splits = 1;
    if (n_tokens <= SD_CUDA_GEMV_MAX_TOKENS) {
        n_splits = (2 * be->n_sm + n_heads - 1) / n_heads;
        if (n_splits > ATT_MAX_SPLITS) n_splits = ATT_MAX_SPLITS;
        if (n_splits < 1) n_splits = 1;
    }
    float *split_ml = NULL, *split_acc = NULL;
    if (n_splits > 1) {
        const size_t parts = (size_t)n_tokens * (size_t)n_heads * (size_t)n_splits;
        void *scr;
        SD_TRY(sd_cuda_scratch(be, parts * (2 + (size_t)head_dim) * sizeof(float), &scr));
        split_ml = (float *)scr;
        split_acc = split_ml + 2 * parts;
    }
    dim3 grid((unsigned)(n_tokens * n_heads), (unsigned)n_splits);
    SD_TRY(sd_cuda_launch(be, "attention", attention_kernel, grid, dim3(ATT_THREADS), part_bytes, q, k_pool, v_pool,
                          n_heads, n_kv_heads, head_dim, block_size, d_pos, d_bt, d_off, (int)window, scale, out,
                          n_splits, split_ml, split_acc));
    if (n_splits > 1)
        SD_TRY(sd_cuda_launch(be, "attention combine", attention_combine_kernel, dim3((unsigned)(n_tokens * n_heads)),
                              dim3(128), 0, split_ml, split_acc, n_splits, head_dim, out));
    return SD_OK;
}

sd_status sd_cuda_attention(sd_backend *be, const float *q, const float *k_pool, const float *v_pool, int32_t n_tokens,
                            int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t block_size,
                            const int32_t *pos, const int32_t *bt, const int32_t *bt_off, float scale, float *out) {
    return attention_launch(be, q, k_pool, v_pool, n_tokens, n_heads, n_kv_heads, head_dim, block_size, pos, bt, bt_off,
                            0, scale, out);
}

/* The sliding window: every split's range starts at the window's first
 * position (the twin of the CPU's -inf scores: those positions weigh 0). */
sd_status sd_cuda_attention_window(sd_backend *be, const float *q, const float *k_pool, const float *v_pool,
                                   int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   int32_t block_size, const int32_t *pos, const int32_t *bt, const int32_t *bt_off,
                                   int32_t window, float scale, float *out) {
    if (window < 1) return SD_ERR_INVALID_ARG;
    return attention_launch(be, q, k_pool, v_pool, n_tokens, n_heads, n_kv_heads, head_dim, block_size, pos, bt, bt_off,
                            window, scale, out);
}
