/* matmul.cu — y[t][o] = sum_i w[o][i] * x[t][i] with BF16 weights, twin of
 * engine/cpu/matmul.c; and the f32 -> BF16 conversion weight_upload uses.
 *
 * Decode and verification (up to SD_CUDA_GEMV_MAX_TOKENS tokens) are bound
 * by streaming the weights, so they run a weight-streaming kernel that reads
 * each weight once per call whatever the token count:
 *
 *  - tensor cores (the default when n_in % 32 == 0): mma.sync over 16-row
 *    tiles with the tokens as the MMA's columns and x split into three BF16
 *    terms (f32 accuracy); described below, at mma_matvec_kernel. Its cost
 *    hardly grows with the tokens: on the 8B shape (H100) 8 tokens cost
 *    1.16x one, against 1.87x on the CUDA cores; alone, one token costs ~6%
 *    more than on the CUDA cores (7.75 vs 7.28 ms a step), but it also runs
 *    the fused jobs (sd_cuda_matmul_fused: Q/K/V and gate/up in one launch
 *    each, the residual add in the epilogue), and with them a step takes
 *    7.04-7.07 ms.
 *  - CUDA cores (other shapes, or --cuda-mma 0): each warp owns R rows;
 *    each lane loads 8 BF16 weights (16 bytes) per row at a time and applies
 *    them to all NT tokens with f32 fused multiply-adds, so from ~4 tokens
 *    it is bound by instructions, not bytes. R grows with NT so activation
 *    traffic per weight byte stays bounded. When the matrix has too few rows
 *    to fill the GPU, the reduction over i is split into S slices (grid.y)
 *    whose partial sums go to scratch and are added by a second kernel in
 *    slice order.
 *
 * Batch invariance (like the CPU): on either path an output element is the
 * same sequence of operations whatever the token count or the rest of the
 * batch (the partition depends only on n_in, n_out and the GPU; an MMA's
 * column does not depend on the other columns). So greedy speculative output
 * equals greedy plain output on the GPU too, as long as the calls stay at or
 * under the kernel's token limit and the path is not switched mid-run.
 *
 * Longer calls (prefill chunks, large batches) go to cuBLAS: x is rounded to
 * BF16 and cublasGemmEx multiplies BF16 x BF16 into f32 with f32
 * accumulation on the tensor cores. Their results differ from the kernel's
 * by the BF16 rounding of x and the summation order.
 *
 * Rejected: cuBLAS for one token (its GEMV-shaped kernels were the first
 * thing measured against: see bench/results/cuda-h100.md); converting x to
 * BF16 on the streaming path (accuracy lost for no bandwidth: x is tiny next
 * to w); feeding the tensor cores through a cp.async shared-memory pipeline
 * (4 or 6 stages: 9.0-9.9 ms a step on the 8B shape against 7.75 with
 * registers). */
#include "cuda/cuda_impl.h"

#include <climits>
#include <cstring>

#include <cuda_bf16.h>

#define MV_THREADS 256
#define MV_WARPS   (MV_THREADS / 32)
#define MV_K_STEP  256 /* elements of a row a warp covers per iteration: 32 lanes x 8 */

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
    sd_pdl_wait();
    sd_pdl_release();
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
    sd_pdl_wait();
    sd_pdl_release();
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
static sd_status launch_rows(sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x, float *y,
                             float *partial, int slice_len, int n_slices, bool vec) {
    const int warps = (n_out + R - 1) / R;
    dim3 grid((unsigned)((warps + MV_WARPS - 1) / MV_WARPS), (unsigned)n_slices);
    return sd_cuda_launch(be, "matvec", matvec_kernel<NT, R>, grid, dim3(MV_THREADS), 0, w, n_in, n_out, x, y, partial,
                          slice_len, vec);
}

/* Rows per warp only changes which rows a warp takes, never an element's
 * arithmetic (two rows against four for 5..16 tokens was measured on the 8B
 * shape, 68ff6c8: four stay better at 8 and 16). */
template <int NT>
static sd_status launch_matvec(sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x, float *y,
                               float *partial, int slice_len, int n_slices, bool vec) {
    return launch_rows<NT, rows_for(NT)>(be, w, n_in, n_out, x, y, partial, slice_len, n_slices, vec);
}

typedef sd_status (*matvec_launcher)(sd_backend *, const __nv_bfloat16 *, int, int, const float *, float *, float *,
                                     int, int, bool);

static const matvec_launcher launchers[SD_CUDA_GEMV_MAX_TOKENS] = {
    launch_matvec<1>,  launch_matvec<2>,  launch_matvec<3>,  launch_matvec<4>,  launch_matvec<5>,  launch_matvec<6>,
    launch_matvec<7>,  launch_matvec<8>,  launch_matvec<9>,  launch_matvec<10>, launch_matvec<11>, launch_matvec<12>,
    launch_matvec<13>, launch_matvec<14>, launch_matvec<15>, launch_matvec<16>,
};

/* How the CUDA-core kernel splits i: slices and their length. */
static bool matvec_split(const sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x,
                         int *n_slices_out, int *slice_len_out) {
    const bool vec = (n_in % 8) == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
    int n_slices = vec ? slices_for(be, n_in, n_out) : 1;
    int slice_len = n_in;
    if (n_slices > 1) {
        slice_len = (n_in + n_slices - 1) / n_slices;
        slice_len = (slice_len + MV_K_STEP - 1) / MV_K_STEP * MV_K_STEP;
        n_slices = (n_in + slice_len - 1) / slice_len;
    }
    *n_slices_out = n_slices;
    *slice_len_out = slice_len;
    return vec;
}

/* Floats of scratch the CUDA-core kernel uses for its partial sums. */
static size_t matvec_scratch_floats(const sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x,
                                    int nt) {
    int n_slices, slice_len;
    matvec_split(be, w, n_in, n_out, x, &n_slices, &slice_len);
    return (size_t)(n_slices - 1) * (size_t)nt * (size_t)n_out;
}

/* The CUDA-core streaming path for nt <= SD_CUDA_GEMV_MAX_TOKENS tokens. */
static sd_status matvec(sd_backend *be, const __nv_bfloat16 *w, int n_in, int n_out, const float *x, int nt, float *y) {
    int n_slices, slice_len;
    const bool vec = matvec_split(be, w, n_in, n_out, x, &n_slices, &slice_len);
    const size_t per_slice = (size_t)nt * (size_t)n_out;
    float *partial = NULL;
    if (n_slices > 1) {
        void *scratch;
        SD_TRY(sd_cuda_scratch(be, (size_t)(n_slices - 1) * per_slice * sizeof(float), &scratch));
        partial = (float *)scratch;
    }
    SD_TRY(launchers[nt - 1](be, w, n_in, n_out, x, y, partial, slice_len, n_slices, vec));
    if (n_slices > 1) {
        size_t blocks = (per_slice + 255) / 256;
        if (blocks > (size_t)be->n_sm * 8) blocks = (size_t)be->n_sm * 8;
        SD_TRY(sd_cuda_launch(be, "slice_sum", slice_sum_kernel, dim3((unsigned)blocks), dim3(256), 0, partial,
                              n_slices, per_slice, y));
    }
    return SD_OK;
}

/* ---- the tensor-core streaming path (n_in % 32 == 0) ----
 *
 * A warp takes a tile of 16 rows and a 32-wide chunk of i at a time and
 * multiplies it with mma.sync m16n8k16 (BF16 in, f32 accumulate): tokens
 * are the MMA's 8 columns (two column tiles above 8 tokens). Each lane loads
 * 16 contiguous bytes of a row, the 8 weights at 8 * (lane % 4) of the
 * chunk, straight from the row-major matrix: the MMA sums over its k in any
 * order, so k is permuted -- a lane's 8 physical columns become its 4
 * logical columns in each of the chunk's two k16 steps -- and the
 * activations are gathered with the same permutation (token lane / 4, the
 * same 8 columns). No shared memory, no layout change of the weights.
 *
 * x is f32: each activation is split into three BF16 terms hi + mid + lo
 * (exact to f32's 24 bits) and each term multiplied in turn, so the result
 * has f32 accuracy like the CUDA-core kernel. The tensor cores have ~50x the
 * rate this needs; what counts is that the instruction count per weight byte
 * no longer grows with the tokens (the CUDA-core kernel ran 8 tokens x 8
 * weights of multiply-adds per 16-byte load: instruction-bound from 4
 * tokens).
 *
 * Partition: a block of MMA_WARPS warps owns one row tile and one slice of
 * i; its warps take the slice's chunks in turn (warp w: chunks w, w + W, ..)
 * and add their tiles in warp order through shared memory. When the matrix
 * has too few row tiles to fill the GPU, i is split into S slices over
 * grid.y: each block writes its partial tile, and the last block of a row
 * tile to finish (a counter per row tile) adds the S partials in slice order
 * and resets the counter. Everything here depends on n_in, n_out and the GPU
 * only, and an MMA's column is computed the same whatever the other columns
 * hold, so a token's row is bit-identical alone or in a 16-token call.
 * Results differ from the CUDA-core kernel's in the order of summation. */
#define MMA_WARPS   8
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_UNROLL  4 /* chunks of loads in flight per warp: 4 x 1 KB of weights */

/* Weights are read once: keep them out of L1, which holds the activations. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Starts bringing the line at p into L2 (no register is written). */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }

/* (a, b) -> three BF16 pairs with a = hi.x + mid.x + lo.x (same for b). */
__device__ __forceinline__ void split3(float a, float b, uint32_t &hi, uint32_t &mid, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float ra = a - __low2float(h), rb = b - __high2float(h);
    const __nv_bfloat162 m = __floats2bfloat162_rn(ra, rb);
    const __nv_bfloat162 l = __floats2bfloat162_rn(ra - __low2float(m), rb - __high2float(m));
    hi = bf16x2_bits(h);
    mid = bf16x2_bits(m);
    lo = bf16x2_bits(l);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One chunk: wa/wb are rows g and g + 8 of the tile (8 weights each), xv[j]
 * token 8j + g's 8 activations at the same columns. */
template <int NTILES>
__device__ __forceinline__ void mma_chunk(const uint4 wa, const uint4 wb, const float4 (&xv)[NTILES][2],
                                          float (&acc)[NTILES][4]) {
#pragma unroll
    for (int j = 0; j < NTILES; j++) {
        uint32_t h[4], m[4], l[4];
        split3(xv[j][0].x, xv[j][0].y, h[0], m[0], l[0]);
        split3(xv[j][0].z, xv[j][0].w, h[1], m[1], l[1]);
        split3(xv[j][1].x, xv[j][1].y, h[2], m[2], l[2]);
        split3(xv[j][1].z, xv[j][1].w, h[3], m[3], l[3]);
        /* k16 step 0 takes the lane's columns 0-3, step 1 columns 4-7 */
        mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, h[0], h[1]);
        mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, h[2], h[3]);
        mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, m[0], m[1]);
        mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, m[2], m[3]);
        mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, l[0], l[1]);
        mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, l[2], l[3]);
    }
}

/* What one tensor-core launch computes: up to three matrices that share
 * their input (Q/K/V, gate/up), laid end to end over the grid's row tiles;
 * results are stored, or added to y (the residual). (Computing the SwiGLU
 * while loading x, for the down projection, was measured too: 8.10 ms a
 * step on the 8B shape against 7.04-7.07 with the SwiGLU as its own
 * kernel. The extra loads took the kernel to 112 registers, 2 blocks per
 * multiprocessor.) */
typedef struct mm_args {
    const __nv_bfloat16 *w[3];
    float *y[3];
    int n_out[3];
    int tile0[3]; /* first row tile of matrix m; INT_MAX past the last */
    const float *x;
    int n_in, nt, slice_len;
    int prow;       /* rows of the partial buffer: all tiles x 16 */
    float *partial; /* [slices][nt][prow] */
    unsigned *counters;
    bool accumulate;
    int prefetch; /* chunks per warp to prefetch into L2 before the wait (launched programmatically) */
} mm_args;

template <int NTILES>
__device__ __forceinline__ void load_x(const float *const (&xp)[NTILES], const bool (&xok)[NTILES], int off,
                                       float4 (&xv)[NTILES][2]) {
#pragma unroll
    for (int j = 0; j < NTILES; j++) {
        if (xok[j]) {
            xv[j][0] = __ldg((const float4 *)(xp[j] + off));
            xv[j][1] = __ldg((const float4 *)(xp[j] + off) + 1);
        } else {
            xv[j][0] = xv[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
}

/* The block's tiles added in warp order and stored (or added to y); with
 * slices, each block leaves its partial tile and the last block of the row
 * tile to finish adds the partials in slice order, then stores. */
template <int NTILES>
__device__ __forceinline__ void mma_finish(const float (&acc)[NTILES][4], const mm_args &a, float *__restrict__ y,
                                           int n_out, int row0) {
    __shared__ float red[MMA_WARPS][NTILES * 4][32];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slice = blockIdx.y, n_slices = gridDim.y;
#pragma unroll
    for (int j = 0; j < NTILES; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) red[warp][j * 4 + r][lane] = acc[j][r];
    __syncthreads();
    /* thread e: register e / 32 of lane e % 32, summed over the warps in order.
     * Register r of column tile j holds row g + 8 (r / 2), token 8j + 2 tig + r % 2. */
    const int e = threadIdx.x;
    const bool mine = e < NTILES * 4 * 32;
    int rt = 0, tok = 0; /* row within the tile, token */
    float v = 0.0f;
    if (mine) {
        const int reg = e >> 5, el = e & 31;
        rt = (el >> 2) + 8 * ((reg & 3) >> 1);
        tok = 8 * (reg >> 2) + 2 * (el & 3) + (reg & 1);
        v = red[0][reg][el];
#pragma unroll
        for (int wi = 1; wi < MMA_WARPS; wi++) v += red[wi][reg][el];
    }
    const int row = row0 + rt;
    const bool store = mine && row < n_out && tok < a.nt;
    float *dst = y + (size_t)tok * (size_t)n_out + row;
    if (n_slices > 1) {
        const size_t per_slice = (size_t)a.nt * (size_t)a.prow;
        const size_t at = (size_t)tok * (size_t)a.prow + (size_t)blockIdx.x * 16 + rt;
        if (store) a.partial[(size_t)slice * per_slice + at] = v;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&a.counters[blockIdx.x], 1u) == (unsigned)(n_slices - 1);
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (store) {
            v = __ldcg(a.partial + at);
            for (int si = 1; si < n_slices; si++) v += __ldcg(a.partial + (size_t)si * per_slice + at);
        }
        if (threadIdx.x == 0) a.counters[blockIdx.x] = 0;
    }
    if (store) *dst = a.accumulate ? *dst + v : v;
}

/* Blocks per multiprocessor the register budget is held to: the one-tile
 * kernel measured best at 64 registers (4 blocks). */
#define MMA_MIN_BLOCKS(NTILES) ((NTILES) == 1 ? 4 : 3)

/* grid (row tiles of all matrices, slices of i). slice_len is a multiple of
 * 32. MMA_UNROLL chunks of loads are issued before the first is used. */
template <int NTILES>
__global__ void __launch_bounds__(MMA_THREADS, MMA_MIN_BLOCKS(NTILES)) mma_matvec_kernel(const mm_args a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int tile = blockIdx.x;
    const int m = tile >= a.tile0[2] ? 2 : tile >= a.tile0[1] ? 1 : 0;
    const __nv_bfloat16 *w = m == 0 ? a.w[0] : m == 1 ? a.w[1] : a.w[2];
    float *y = m == 0 ? a.y[0] : m == 1 ? a.y[1] : a.y[2];
    const int n_out = m == 0 ? a.n_out[0] : m == 1 ? a.n_out[1] : a.n_out[2];
    const int row0 = (tile - (m == 0 ? 0 : m == 1 ? a.tile0[1] : a.tile0[2])) * 16;
    const int n_in = a.n_in, nt = a.nt;
    const int k_begin = blockIdx.y * a.slice_len;
    const int n_chunks = (min(n_in, k_begin + a.slice_len) - k_begin) / 32;

    /* rows past n_out read row n_out - 1 (valid memory) and are not stored */
    const uint4 *wa = (const uint4 *)(w + (size_t)min(row0 + g, n_out - 1) * (size_t)n_in + k_begin) + tig;
    const uint4 *wb = (const uint4 *)(w + (size_t)min(row0 + g + 8, n_out - 1) * (size_t)n_in + k_begin) + tig;
    const float *xp[NTILES];
    bool xok[NTILES];
#pragma unroll
    for (int j = 0; j < NTILES; j++) {
        const int t = 8 * j + g;
        xok[j] = t < nt;
        xp[j] = a.x + (size_t)min(t, nt - 1) * (size_t)n_in + k_begin + 8 * tig;
    }
    /* launched programmatically (cuda_impl.h): the weights' first chunks are
     * requested while the previous kernel finishes; nothing else is read
     * before the wait */
    for (int p = 0; p < a.prefetch; p++) {
        const int c = warp + p * MMA_WARPS;
        if (c >= n_chunks) break;
        prefetch_l2(wa + (size_t)c * 4);
        prefetch_l2(wb + (size_t)c * 4);
    }
    sd_pdl_wait();
    sd_pdl_release();
    float acc[NTILES][4];
#pragma unroll
    for (int j = 0; j < NTILES; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    /* warp w takes chunks w, w + W, ..: the block streams its 16 rows in order
     * (each warp taking a contiguous run instead measured 17% slower) */
    int c = warp;
    for (; c + (MMA_UNROLL - 1) * MMA_WARPS < n_chunks; c += MMA_UNROLL * MMA_WARPS) {
        uint4 ra[MMA_UNROLL], rb[MMA_UNROLL];
        float4 xv[MMA_UNROLL][NTILES][2];
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; u++) {
            ra[u] = ld_stream(wa + (size_t)(c + u * MMA_WARPS) * 4);
            rb[u] = ld_stream(wb + (size_t)(c + u * MMA_WARPS) * 4);
        }
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; u++) load_x<NTILES>(xp, xok, (c + u * MMA_WARPS) * 32, xv[u]);
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; u++) mma_chunk<NTILES>(ra[u], rb[u], xv[u], acc);
    }
    for (; c < n_chunks; c += MMA_WARPS) {
        float4 xv[NTILES][2];
        const uint4 wa_ = ld_stream(wa + (size_t)c * 4), wb_ = ld_stream(wb + (size_t)c * 4);
        load_x<NTILES>(xp, xok, c * 32, xv);
        mma_chunk<NTILES>(wa_, wb_, xv, acc);
    }
    mma_finish<NTILES>(acc, a, y, n_out, row0);
}

/* Slices of i for the tensor-core path: enough blocks for
 * SD_CUDA_MMA_SM_BLOCKS per multiprocessor (2: on the 8B shape 1, 2, 4
 * and 8 gave decode steps of 8.14, 7.75, 8.16 and 8.33 ms), each warp at
 * least MMA_UNROLL chunks. Depends on the matrices and the GPU only (batch
 * invariance). */
static int mma_slices(const sd_backend *be, int n_in, long tiles) {
    if (tiles > SD_CUDA_MM_COUNTERS) return 1;
    long want = ((long)be->n_sm * SD_CUDA_MMA_SM_BLOCKS + tiles - 1) / tiles;
    const long max_slices = n_in / (32 * MMA_WARPS * MMA_UNROLL);
    if (want > max_slices) want = max_slices;
    return want < 1 ? 1 : (int)want;
}

/* Whether a job can take the tensor-core path (16-byte rows and inputs). */
static bool mma_fits(const sd_backend *be, const sd_matmul_job *job) {
    if (!be->mma || job->n_tokens > SD_CUDA_GEMV_MAX_TOKENS || job->n_in % 32 != 0) return false;
    if ((uintptr_t)job->x % 16 != 0) return false;
    for (int m = 0; m < job->n_mats; m++)
        if ((uintptr_t)job->w[m] % 16 != 0) return false;
    return true;
}

static sd_status mma_matvec(sd_backend *be, const sd_matmul_job *job) {
    mm_args a;
    memset(&a, 0, sizeof a);
    long tiles = 0;
    for (int m = 0; m < 3; m++) {
        a.tile0[m] = m < job->n_mats ? (int)tiles : INT_MAX;
        if (m >= job->n_mats) continue;
        a.w[m] = (const __nv_bfloat16 *)(const void *)job->w[m];
        a.y[m] = job->y[m];
        a.n_out[m] = job->n_out[m];
        tiles += (job->n_out[m] + 15) / 16;
    }
    const int nt = job->n_tokens, chunks = job->n_in / 32;
    int n_slices = mma_slices(be, job->n_in, tiles);
    const int chunks_per_slice = (chunks + n_slices - 1) / n_slices;
    n_slices = (chunks + chunks_per_slice - 1) / chunks_per_slice;
    a.x = job->x;
    a.n_in = job->n_in;
    a.nt = nt;
    a.slice_len = chunks_per_slice * 32;
    a.prow = (int)tiles * 16;
    a.counters = be->mm_counters;
    a.accumulate = job->accumulate;
    if (n_slices > 1) {
        void *scratch;
        SD_TRY(sd_cuda_scratch(be, (size_t)n_slices * (size_t)nt * (size_t)a.prow * sizeof(float), &scratch));
        a.partial = (float *)scratch;
    }
    a.prefetch = sd_cuda_pdl_next(be) ? be->pdl_prefetch : 0;
    const dim3 grid((unsigned)tiles, (unsigned)n_slices);
    if (nt <= 8) return sd_cuda_launch(be, "mma_matvec", mma_matvec_kernel<1>, grid, dim3(MMA_THREADS), 0, a);
    return sd_cuda_launch(be, "mma_matvec", mma_matvec_kernel<2>, grid, dim3(MMA_THREADS), 0, a);
}

/* cuBLAS for calls above the streaming kernels' token limit: y = W x + beta y. */
static sd_status gemm(sd_backend *be, const __nv_bfloat16 *wb, int32_t n_in, int32_t n_out, const float *x,
                      int32_t n_tokens, float *y, float beta) {
    if (be->capturing) { /* cuBLAS shapes are not recorded: keep recordings to the streaming path */
        be->capture_failed = true;
        return SD_ERR_INTERNAL;
    }
    size_t nx = (size_t)n_tokens * (size_t)n_in;
    void *xb;
    SD_TRY(sd_cuda_scratch(be, nx * sizeof(__nv_bfloat16), &xb));
    SD_TRY(sd_cuda_f32_to_bf16(be, x, xb, nx));
    const float alpha = 1.0f;
    be->after_kernel = false; /* cuBLAS's kernels are launched plainly */
    /* column-major view: W is [n_in x n_out] (lda n_in), X [n_in x n_tokens],
     * Y [n_out x n_tokens]: Y = W^T X */
    CUBLAS_TRY(cublasGemmEx(be->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_tokens, n_in, &alpha, wb, CUDA_R_16BF, n_in,
                            xb, CUDA_R_16BF, n_in, &beta, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    return SD_OK;
}

sd_status sd_cuda_matmul(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t n_tokens,
                         float *y) {
    if (n_tokens <= 0) return SD_OK;
    sd_matmul_job job;
    memset(&job, 0, sizeof job);
    job.n_mats = 1;
    job.w[0] = w;
    job.n_out[0] = n_out;
    job.y[0] = y;
    job.n_in = n_in;
    job.n_tokens = n_tokens;
    job.x = x;
    if (mma_fits(be, &job)) return mma_matvec(be, &job);
    const __nv_bfloat16 *wb = (const __nv_bfloat16 *)(const void *)w;
    if (n_tokens <= SD_CUDA_GEMV_MAX_TOKENS) return matvec(be, wb, n_in, n_out, x, n_tokens, y);
    return gemm(be, wb, n_in, n_out, x, n_tokens, y, 0.0f);
}

/* y += W x without the tensor cores: cuBLAS adds in place (beta 1); the
 * CUDA-core kernel writes to scratch past its own partial sums, then add. */
static sd_status matmul_acc(sd_backend *be, const float *w, int32_t n_in, int32_t n_out, const float *x, int32_t nt,
                            float *y) {
    const __nv_bfloat16 *wb = (const __nv_bfloat16 *)(const void *)w;
    if (nt > SD_CUDA_GEMV_MAX_TOKENS) return gemm(be, wb, n_in, n_out, x, nt, y, 1.0f);
    const size_t per = (size_t)nt * (size_t)n_out;
    const size_t own = matvec_scratch_floats(be, wb, n_in, n_out, x, nt);
    void *scratch;
    SD_TRY(sd_cuda_scratch(be, (own + per) * sizeof(float), &scratch));
    float *tmp = (float *)scratch + own;
    SD_TRY(matvec(be, wb, n_in, n_out, x, nt, tmp));
    return sd_cuda_add(be, y, tmp, per, y);
}

/* The SwiGLU (into the gate) as its own kernel, then one launch on the
 * tensor cores where the job fits them; otherwise op by op (also with
 * --cuda-fuse 0, for comparison). */
sd_status sd_cuda_matmul_fused(sd_backend *be, const sd_matmul_job *job) {
    if (!job || job->n_mats < 1 || job->n_mats > 3 || !job->x) return SD_ERR_INVALID_ARG;
    if (job->n_tokens <= 0) return SD_OK;
    const sd_matmul_job j = *job;
    if (j.up) SD_TRY(sd_cuda_swiglu(be, j.x, j.up, (size_t)j.n_tokens * (size_t)j.n_in, (float *)j.x));
    if (be->fuse && mma_fits(be, &j)) return mma_matvec(be, &j);
    for (int m = 0; m < j.n_mats; m++) {
        if (j.accumulate)
            SD_TRY(matmul_acc(be, j.w[m], j.n_in, j.n_out[m], j.x, j.n_tokens, j.y[m]));
        else
            SD_TRY(sd_cuda_matmul(be, j.w[m], j.n_in, j.n_out[m], j.x, j.n_tokens, j.y[m]));
    }
    return SD_OK;
}
