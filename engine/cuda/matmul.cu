/* matmul.cu — y[t][o] = sum_i w[o][i] * x[t][i] with BF16 weights, twin of
 * engine/cpu/matmul.c; and the f32 -> BF16 conversion weight_upload uses.
 *
 * Decode and verification (up to SD_CUDA_GEMV_MAX_TOKENS tokens) are bound
 * by streaming the weights, so they run a weight-streaming kernel: each warp
 * owns R rows; each lane loads 8 BF16 weights (16 bytes) per row at a time
 * and applies them to all NT tokens of the call, whose f32 activations come
 * through L1, so the weights are read from memory once per call whatever
 * NT is (verifying 8 tokens costs about what 1 does). R grows with NT so the
 * activation traffic per weight byte stays bounded. When the matrix has too
 * few rows to fill the GPU, the reduction over i is split into S slices
 * (grid.y) whose partial sums go to scratch and are added by a second
 * kernel in slice order.
 *
 * Batch invariance (like the CPU): an output element is the same sequence
 * of operations whatever NT, R or the rest of the batch: lane-local fused
 * multiply-adds over its i in increasing order, a fixed xor butterfly over
 * the 32 lanes, and the slices (their number depends only on n_in, n_out
 * and the GPU) added in order. So greedy speculative output equals greedy
 * plain output on the GPU too, as long as the calls stay at or under the
 * kernel's token limit.
 *
 * Longer calls (prefill chunks, large batches) go to cuBLAS: x is rounded to
 * BF16 and cublasGemmEx multiplies BF16 x BF16 into f32 with f32
 * accumulation on the tensor cores. Their results differ from the kernel's
 * by the BF16 rounding of x and the summation order.
 *
 * Rejected: cuBLAS for one token (its GEMV-shaped kernels were the first
 * thing measured against: see bench/results/cuda-h100.md) and converting x
 * to BF16 on the streaming path (it would cost accuracy for no bandwidth:
 * x is tiny next to w). */
#include "cuda/cuda_impl.h"

#include <cuda_bf16.h>

#define MV_THREADS 256
#define MV_WARPS (MV_THREADS / 32)
#define MV_K_STEP 256 /* elements of a row a warp covers per iteration: 32 lanes x 8 */

/* 8 BF16 -> 8 f32 (exact: BF16 is the top half of an f32). */
__device__ __forceinline__ void bf16x8_to_f32(const uint4 v, float *f) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = __uint_as_float(u[j] << 16);
        f[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
    }
}

/* acc[r][t] += w[r][e] * x[t][k + e] for e = 0..7, in that order. */
template <int NT, int R>
__device__ __forceinline__ void fma_step(const float (&wf)[R][8], const float *__restrict__ x, int n_in, int k,
                                         float (&acc)[R][NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *xp = (const float4 *)(x + (size_t)t * (size_t)n_in + k);
        const float4 a = __ldg(xp), b = __ldg(xp + 1);
        const float xf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][t] = fmaf(wf[r][e], xf[e], acc[r][t]);
    }
}

/* Rows [row0, row0 + R) x tokens [0, NT) over the slice's i in
 * [k_begin, k_end). Slice 0 writes y [NT][n_out], slice s > 0 its partial
 * sums partial[s - 1] [NT][n_out]. vec: 16-byte rows (n_in % 8 == 0). */
template <int NT, int R>
__global__ void __launch_bounds__(MV_THREADS)
matvec_kernel(const __nv_bfloat16 *__restrict__ w, int n_in, int n_out, const float *__restrict__ x,
              float *__restrict__ y, float *__restrict__ partial, int slice_len, bool vec) {
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int row0 = warp * R;
    if (row0 >= n_out) return;
    const int slice = blockIdx.y;
    const int k_begin = slice * slice_len;
    const int k_end = min(n_in, k_begin + slice_len);
    float *out = slice == 0 ? y : partial + (size_t)(slice - 1) * (size_t)NT * (size_t)n_out;

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    /* rows past n_out read row n_out - 1 (valid memory) and are not stored */
    const __nv_bfloat16 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)min(row0 + r, n_out - 1) * (size_t)n_in;

    if (vec) {
        /* U steps of loads issued before any is used: 8 x 16 bytes in
         * flight per lane. The multiply-adds still run in increasing k. */
        constexpr int U = R >= 8 ? 1 : 8 / R;
        int k = k_begin + lane * 8;
        for (; k + (U - 1) * MV_K_STEP < k_end; k += U * MV_K_STEP) {
            uint4 raw[U][R];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) raw[u][r] = __ldg((const uint4 *)(wr[r] + k + u * MV_K_STEP));
#pragma unroll
            for (int u = 0; u < U; u++) {
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) bf16x8_to_f32(raw[u][r], wf[r]);
                fma_step<NT, R>(wf, x, n_in, k + u * MV_K_STEP, acc);
            }
        }
        for (; k < k_end; k += MV_K_STEP) {
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) bf16x8_to_f32(__ldg((const uint4 *)(wr[r] + k)), wf[r]);
            fma_step<NT, R>(wf, x, n_in, k, acc);
        }
    } else {
        for (int k = k_begin + lane; k < k_end; k += 32) {
            float wf[R];
#pragma unroll
            for (int r = 0; r < R; r++) wf[r] = __bfloat162float(wr[r][k]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float xv = x[(size_t)t * (size_t)n_in + k];
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] = fmaf(wf[r], xv, acc[r][t]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = acc[r][t];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            acc[r][t] = v;
        }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (row0 + r < n_out)
#pragma unroll
                for (int t = 0; t < NT; t++) out[(size_t)t * (size_t)n_out + row0 + r] = acc[r][t];
    }
}

/* y[t][o] = sum over slices s = 1..S-1 of partial[s][t][o], added in order
 * onto slice 0, which was written straight into y. */
__global__ void slice_sum_kernel(const float *__restrict__ partial, int n_slices, size_t per_slice, float *y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < per_slice; i += (size_t)gridDim.x * blockDim.x) {
        float v = y[i];
        for (int s = 1; s < n_slices; s++) v += partial[(size_t)(s - 1) * per_slice + i];
        y[i] = v;
    }
}

__global__ void f32_to_bf16_kernel(const float *__restrict__ src, __nv_bfloat16 *__restrict__ dst, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

sd_status sd_cuda_f32_to_bf16(sd_backend *be, const float *src, void *dst, size_t n) {
    if (n == 0) return SD_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)be->n_sm * 16) blocks = (size_t)be->n_sm * 16;
    f32_to_bf16_kernel<<<(unsigned)blocks, 256, 0, be->stream>>>(src, (__nv_bfloat16 *)dst, n);
    CUDA_LAUNCH_CHECK("f32_to_bf16");
    return SD_OK;
}

/* Rows per warp for NT tokens: two rows (and four load steps) in flight up
 * to 4 tokens, four rows beyond so activation loads per weight byte stay
 * <= 4x. Measured side by side on the 8B shape (H100): 4 tokens 8.80 ms
 * with two rows vs 9.31 with four; 8 tokens 13.70 with four vs 14.54; 16
 * tokens 20.70 vs 25.62. */
static constexpr int rows_for(int nt) { return nt <= 4 ? 2 : 4; }

/* Number of slices of the reduction: rows times slices cover the GPU's
 * multiprocessors 32 times over, slices of at least 1024 elements. Depends
 * on the matrix and the GPU only (batch invariance). On an H100 an 8B
 * layer's k/v projections (1024 rows) take 4 slices, q/o (4096) 2, the MLP
 * and the LM head 1. (A first version aimed at 4x more and split even the
 * 4096-row matrices 4 ways: each warp then streamed only 4 KB.) */
static int slices_for(const sd_backend *be, int n_in, int n_out) {
    long want = ((long)be->n_sm * 32 + n_out - 1) / n_out;
    long max_slices = n_in / 1024;
    if (want > max_slices) want = max_slices;
    return want < 1 ? 1 : (int)want;
}

template <int NT, int R>
static void launch_rows(const sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x, float *y,
                        float *partial, int slice_len, int n_slices, bool vec) {
    const int warps = (n_out + R - 1) / R;
    dim3 grid((unsigned)((warps + MV_WARPS - 1) / MV_WARPS), (unsigned)n_slices);
    matvec_kernel<NT, R><<<grid, MV_THREADS, 0, be->stream>>>(w, n_in, n_out, x, y, partial, slice_len, vec);
}

/* Rows per warp only changes which rows a warp takes, never an element's
 * arithmetic: SPECD_CUDA_MV_ROWS=2 (be->mv_rows) runs the 5..16-token
 * kernels with two rows too (fewer registers, more warps per SM, twice the
 * activation loads), to compare the two on a GPU (scripts/gpu-run rows-8b). */
template <int NT>
static void launch_matvec(const sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x,
                          float *y, float *partial, int slice_len, int n_slices, bool vec) {
    if (NT >= 3 && be->mv_rows == 2)
        launch_rows<NT, 2>(be, w, n_in, n_out, x, y, partial, slice_len, n_slices, vec);
    else
        launch_rows<NT, rows_for(NT)>(be, w, n_in, n_out, x, y, partial, slice_len, n_slices, vec);
}

typedef void (*matvec_launcher)(const sd_backend *, const __nv_bfloat16 *, int, int, const float *, float *,
                                float *, int, int, bool);

static const matvec_launcher launchers[SD_CUDA_GEMV_MAX_TOKENS] = {
    launch_matvec<1>,  launch_matvec<2>,  launch_matvec<3>,  launch_matvec<4>,
    launch_matvec<5>,  launch_matvec<6>,  launch_matvec<7>,  launch_matvec<8>,
    launch_matvec<9>,  launch_matvec<10>, launch_matvec<11>, launch_matvec<12>,
    launch_matvec<13>, launch_matvec<14>, launch_matvec<15>, launch_matvec<16>,
};

/* The streaming path for nt <= SD_CUDA_GEMV_MAX_TOKENS tokens. */
static sd_status matvec(sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x, int nt,
                        float *y) {
    const bool vec = (n_in % 8) == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
    int n_slices = vec ? slices_for(be, n_in, n_out) : 1;
    int slice_len = n_in;
    if (n_slices > 1) {
        slice_len = (n_in + n_slices - 1) / n_slices;
        slice_len = (slice_len + MV_K_STEP - 1) / MV_K_STEP * MV_K_STEP;
        n_slices = (n_in + slice_len - 1) / slice_len;
    }
    const size_t per_slice = (size_t)nt * (size_t)n_out;
    float *partial = NULL;
    if (n_slices > 1) {
        void *scratch;
        SD_TRY(sd_cuda_scratch(be, (size_t)(n_slices - 1) * per_slice * sizeof(float), &scratch));
        partial = (float *)scratch;
    }
    launchers[nt - 1](be, w, n_in, n_out, x, y, partial, slice_len, n_slices, vec);
    CUDA_LAUNCH_CHECK("matvec");
    if (n_slices > 1) {
        size_t blocks = (per_slice + 255) / 256;
        if (blocks > (size_t)be->n_sm * 8) blocks = (size_t)be->n_sm * 8;
        slice_sum_kernel<<<(unsigned)blocks, 256, 0, be->stream>>>(partial, n_slices, per_slice, y);
        CUDA_LAUNCH_CHECK("slice_sum");
    }
    return SD_OK;
}

sd_status sd_cuda_matmul(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x,
                         int32_t n_tokens, float *y) {
    if (n_tokens <= 0) return SD_OK;
    const __nv_bfloat16 *wb = (const __nv_bfloat16 *)(const void *)w;
    if (n_tokens <= be->gemv_max_tokens) return matvec(be, wb, n_in, n_out, x, n_tokens, y);
    if (be->capturing) { /* cuBLAS shapes are not recorded: keep recordings to the streaming path */
        be->capture_failed = true;
        return SD_ERR_INTERNAL;
    }
    size_t nx = (size_t)n_tokens * (size_t)n_in;
    void *xb;
    SD_TRY(sd_cuda_scratch(be, nx * sizeof(__nv_bfloat16), &xb));
    SD_TRY(sd_cuda_f32_to_bf16(be, x, xb, nx));
    const float alpha = 1.0f, beta = 0.0f;
    /* column-major view: W is [n_in x n_out] (lda n_in), X [n_in x n_tokens],
     * Y [n_out x n_tokens]: Y = W^T X */
    CUBLAS_TRY(cublasGemmEx(be->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_tokens, n_in, &alpha, wb, CUDA_R_16BF,
                            n_in, xb, CUDA_R_16BF, n_in, &beta, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    return SD_OK;
}
