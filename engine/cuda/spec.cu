/* spec.cu — speculative verification on the GPU, next to the logits; twin
 * of engine/spec.c (verification) and engine/sample.c (processing).
 *
 * The target's distributions p never leave the device; what crosses to the
 * host is a few numbers per row. For a batch of sequences:
 *   greedy    one kernel takes the argmax of every row (lowest id on ties,
 *             NaN never wins, as sd_argmax); the host compares them with the
 *             drafts (sd_spec_verify_greedy).
 *   sampled   1. processing (probs_kernel): per row, in double, z = logit/T,
 *                the maximum, e = exp(z - max) and its sum, p = e / sum:
 *                exactly sample.c's steps. Rows with top-k, top-p or min-p
 *                are then sorted by (p descending, id ascending) with CUB's
 *                stable segmented radix sort (the CPU's total order) and cut
 *                by filter_kernel: top-k, top-p on the prefix sums of the
 *                sorted masses, min-p against the largest; the kept masses
 *                are renormalized into the float row, as sd_sample_probs
 *                writes it.
 *             2. stats_kernel: each row's total, and whether it is bad.
 *             3. draw_kernel: every row's draw by the coupled rule (spec.h):
 *                sd_sample_race, the exponential race over the uniforms of
 *                (seed, position) — Philox twin below, one block per 4
 *                entries, keys -log(u)/p in double, the least key and then
 *                the lowest id winning. The host accepts drafts while they
 *                equal the draws (sd_spec_verify's decisions).
 * Sums are taken in double by fixed block trees (CUB BlockReduce/BlockScan)
 * instead of the CPU's left-to-right loops; the results differ in the last
 * bits of a double, so a decision could differ only when a uniform lands
 * within ~1e-16 of a threshold. tests/test_cuda_spec.c checks that the
 * decisions are the CPU's on many random rows.
 *
 * Sequences go through in groups whose rows fit the scratch budget (each
 * row needs ~28 bytes per vocabulary entry while it is processed); a group
 * costs two small device-to-host copies. */
#include "cuda/cuda_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cub/cub.cuh>

#define SPEC_THREADS        1024
#define SPEC_ITEMS          4 /* contiguous entries per thread in a scan chunk */
#define SPEC_SCRATCH_BUDGET ((size_t)256 << 20)
#define SPEC_MAX_Q          2048 /* sparse q entries a draw keeps in shared memory (the protocol allows 1024) */

typedef cub::BlockReduce<double, SPEC_THREADS> block_reduce_d;
typedef cub::BlockScan<double, SPEC_THREADS> block_scan_d;
typedef cub::BlockReduce<int, SPEC_THREADS> block_reduce_i;

struct max_op {
    template <typename T> __device__ __forceinline__ T operator()(const T &a, const T &b) const {
        return a > b ? a : b;
    }
};
struct min_op {
    template <typename T> __device__ __forceinline__ T operator()(const T &a, const T &b) const {
        return a < b ? a : b;
    }
};

/* A row to process. */
typedef struct row_desc {
    int32_t row;    /* logits row */
    int32_t ranked; /* index among ranked rows, -1 = no filter */
    int32_t top_k;
    float top_p, min_p;
    double inv_t; /* 1 / temperature, as sample.c computes it */
    int32_t y;    /* draft token of this row, -1 for the bonus row */
} row_desc;

/* Per row results for the host. */
typedef struct row_stats {
    double p_tot; /* sum of the processed float row */
    float p_y;    /* processed p of the draft token */
    int32_t bad;  /* 1: a logit was NaN or +inf, or all were -inf */
} row_stats;

/* A draw to make. */
typedef struct draw_desc {
    int32_t prow; /* processed row (index into the group's rows) */
    uint64_t seed, position;
} draw_desc;

typedef struct draw_out {
    int32_t token;
} draw_out;

/* ---- greedy ---- */

/* true when (v, i) beats (bv, bi) for sd_argmax: larger, or equal and lower
 * id; NaN never beats a number, and between NaNs the lower id wins */
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
    if (isnan(v)) return isnan(bv) && i < bi;
    if (isnan(bv)) return true;
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(SPEC_THREADS)
    argmax_kernel(const float *__restrict__ logits, int n_vocab, const int32_t *__restrict__ rows, int32_t *out) {
    __shared__ float sv[SPEC_THREADS / 32];
    __shared__ int si[SPEC_THREADS / 32];
    const float *row = logits + (size_t)rows[blockIdx.x] * (size_t)n_vocab;
    float bv = NAN;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS)
        if (argmax_better(row[i], i, bv, bi)) bv = row[i], bi = i;
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v0 = sv[0];
        int i0 = si[0];
        for (int w = 1; w < SPEC_THREADS / 32; w++)
            if (argmax_better(sv[w], si[w], v0, i0)) v0 = sv[w], i0 = si[w];
        out[blockIdx.x] = i0 == 0x7fffffff ? 0 : i0;
    }
}

/* ---- processing ---- */

__global__ void __launch_bounds__(SPEC_THREADS)
    probs_kernel(const float *__restrict__ logits, int n_vocab, const row_desc *__restrict__ descs, float *pf,
                 double *pd, int32_t *pid, row_stats *stats) {
    __shared__ typename block_reduce_d::TempStorage red;
    __shared__ double bcast;
    __shared__ int bad_sh;
    const row_desc d = descs[blockIdx.x];
    const float *row = logits + (size_t)d.row * (size_t)n_vocab;
    if (threadIdx.x == 0) bad_sh = 0;
    __syncthreads();
    double z_max = -INFINITY;
    bool any_finite = false, bad = false;
    for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS) {
        const float l = row[i];
        if (isnan(l) || l == INFINITY) bad = true;
        any_finite |= isfinite(l);
        const double z = (double)l * d.inv_t;
        if (z > z_max) z_max = z;
    }
    if (bad) atomicOr(&bad_sh, 1);
    if (any_finite) atomicOr(&bad_sh, 2);
    z_max = block_reduce_d(red).Reduce(z_max, max_op());
    if (threadIdx.x == 0) bcast = z_max;
    __syncthreads();
    z_max = bcast;
    const int flags = bad_sh;
    if ((flags & 1) || !(flags & 2)) { /* the CPU refuses such logits */
        if (threadIdx.x == 0) stats[blockIdx.x].bad = 1;
        return;
    }
    double local = 0.0;
    for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS) local += exp((double)row[i] * d.inv_t - z_max);
    __syncthreads(); /* red is reused */
    double total = block_reduce_d(red).Sum(local);
    if (threadIdx.x == 0) bcast = total;
    __syncthreads();
    total = bcast;
    float *prow = pf + (size_t)blockIdx.x * (size_t)n_vocab;
    if (d.ranked < 0) {
        for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS)
            prow[i] = (float)(exp((double)row[i] * d.inv_t - z_max) / total);
    } else {
        double *drow = pd + (size_t)d.ranked * (size_t)n_vocab;
        int32_t *irow = pid + (size_t)d.ranked * (size_t)n_vocab;
        for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS) {
            drow[i] = exp((double)row[i] * d.inv_t - z_max) / total;
            irow[i] = i;
        }
    }
    if (threadIdx.x == 0) stats[blockIdx.x].bad = 0;
}

/* First index j in [0, n) whose inclusive running sum of v (in index order)
 * reaches need (>= when at_least, > otherwise), or -1; *total gets the sum.
 * v(j) is a functor so rows can be read through a transformation. */
template <typename F>
__device__ int block_first_reaching(F v, int n, double need, bool at_least, double *total, int *last_pos) {
    __shared__ typename block_scan_d::TempStorage scan;
    __shared__ typename block_reduce_i::TempStorage redi;
    __shared__ double carry_sh;
    __shared__ int found_sh, last_sh;
    if (threadIdx.x == 0) carry_sh = 0.0, found_sh = -1, last_sh = -1;
    __syncthreads();
    for (int base = 0; base < n; base += SPEC_THREADS * SPEC_ITEMS) {
        const int first = base + threadIdx.x * SPEC_ITEMS;
        double item[SPEC_ITEMS], mine = 0.0;
        int my_last = -1;
#pragma unroll
        for (int e = 0; e < SPEC_ITEMS; e++) {
            item[e] = first + e < n ? v(first + e) : 0.0;
            mine += item[e];
            if (item[e] > 0.0) my_last = first + e;
        }
        double prefix, chunk;
        block_scan_d(scan).ExclusiveSum(mine, prefix, chunk);
        double cum = carry_sh + prefix;
        int hit = 0x7fffffff;
#pragma unroll
        for (int e = 0; e < SPEC_ITEMS; e++) {
            if (!(item[e] > 0.0)) continue; /* zero entries never end a search */
            cum += item[e];
            if (hit == 0x7fffffff && (at_least ? cum >= need : cum > need)) hit = first + e;
        }
        int best = block_reduce_i(redi).Reduce(hit, min_op());
        __syncthreads(); /* redi is reused */
        int last = block_reduce_i(redi).Reduce(my_last, max_op());
        __syncthreads();
        if (threadIdx.x == 0) {
            if (found_sh < 0 && best != 0x7fffffff) found_sh = best;
            if (last > last_sh) last_sh = last;
            carry_sh += chunk;
        }
        __syncthreads();
        if (found_sh >= 0 && !total) break;
    }
    if (total) *total = carry_sh;
    if (last_pos) *last_pos = last_sh;
    return found_sh;
}

__global__ void __launch_bounds__(SPEC_THREADS)
    filter_kernel(int n_vocab, const row_desc *__restrict__ descs, const int32_t *__restrict__ ranked_rows,
                  const double *__restrict__ sp_all, const int32_t *__restrict__ sid_all, const row_stats *stats,
                  float *pf) {
    __shared__ typename block_reduce_d::TempStorage red;
    __shared__ typename block_reduce_i::TempStorage redi;
    __shared__ double bcast;
    __shared__ int keep_sh;
    const int prow_i = ranked_rows[blockIdx.x];
    if (stats[prow_i].bad) return; /* never processed: its sort holds garbage */
    const row_desc d = descs[prow_i];
    const double *sp = sp_all + (size_t)blockIdx.x * (size_t)n_vocab;
    const int32_t *sid = sid_all + (size_t)blockIdx.x * (size_t)n_vocab;
    int n_kept = d.top_k > 0 && d.top_k < n_vocab ? d.top_k : n_vocab;
    /* top-p on the mass top-k kept */
    if (d.top_p < 1.0f) {
        double local = 0.0;
        for (int j = threadIdx.x; j < n_kept; j += SPEC_THREADS) local += sp[j];
        double mass = block_reduce_d(red).Sum(local);
        if (threadIdx.x == 0) bcast = mass;
        __syncthreads();
        const double need = (double)d.top_p * bcast;
        int j = block_first_reaching([&](int i) { return sp[i]; }, n_kept, need, true, NULL, NULL);
        if (j >= 0) n_kept = j + 1;
    }
    /* min-p: the sorted prefix with p >= min_p * p_max */
    if (d.min_p > 0.0f) {
        const double floor_p = (double)d.min_p * sp[0];
        int local = 0;
        for (int j = 1 + threadIdx.x; j < n_kept; j += SPEC_THREADS) local += sp[j] >= floor_p;
        __syncthreads();
        int cnt = block_reduce_i(redi).Sum(local);
        if (threadIdx.x == 0) keep_sh = 1 + cnt;
        __syncthreads();
        n_kept = keep_sh;
    }
    double local = 0.0;
    for (int j = threadIdx.x; j < n_kept; j += SPEC_THREADS) local += sp[j];
    __syncthreads();
    double kept = block_reduce_d(red).Sum(local);
    if (threadIdx.x == 0) bcast = kept;
    __syncthreads();
    kept = bcast;
    float *row = pf + (size_t)prow_i * (size_t)n_vocab;
    for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS) row[i] = 0.0f;
    __syncthreads();
    for (int j = threadIdx.x; j < n_kept; j += SPEC_THREADS) row[sid[j]] = (float)(sp[j] / kept);
}

__global__ void __launch_bounds__(SPEC_THREADS)
    stats_kernel(int n_vocab, const row_desc *__restrict__ descs, const float *__restrict__ pf, row_stats *stats) {
    __shared__ typename block_reduce_d::TempStorage red;
    if (stats[blockIdx.x].bad) return;
    const float *row = pf + (size_t)blockIdx.x * (size_t)n_vocab;
    double local = 0.0;
    for (int i = threadIdx.x; i < n_vocab; i += SPEC_THREADS) local += (double)row[i];
    double tot = block_reduce_d(red).Sum(local);
    if (threadIdx.x == 0) {
        stats[blockIdx.x].p_tot = tot;
        const int y = descs[blockIdx.x].y;
        stats[blockIdx.x].p_y = y >= 0 && y < n_vocab ? row[y] : 0.0f;
    }
}

/* sd_philox4x32 (engine/sample.c), the same constants and rounds. */
__device__ void philox4x32(uint64_t seed, const uint32_t ctr[4], uint32_t out[4]) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * x0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * x2;
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
        uint32_t y1 = (uint32_t)p1;
        uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
        uint32_t y3 = (uint32_t)p0;
        x0 = y0, x1 = y1, x2 = y2, x3 = y3;
    }
    out[0] = x0, out[1] = x1, out[2] = x2, out[3] = x3;
}

/* (key, id) beats (bk, bi): a smaller key, or the same and a lower id. */
__device__ __forceinline__ bool race_better(double k, int i, double bk, int bi) {
    return k < bk || (k == bk && i < bi);
}

/* sd_sample_race over one processed row. */
__global__ void __launch_bounds__(SPEC_THREADS)
    draw_kernel(int n_vocab, const draw_desc *__restrict__ draws, const float *__restrict__ pf, draw_out *out) {
    __shared__ double sk[SPEC_THREADS / 32];
    __shared__ int si[SPEC_THREADS / 32];
    const draw_desc d = draws[blockIdx.x];
    const float *row = pf + (size_t)d.prow * (size_t)n_vocab;
    double bk = INFINITY;
    int bi = 0x7fffffff;
    uint32_t ctr[4] = {(uint32_t)d.position, (uint32_t)(d.position >> 32), (uint32_t)SD_RNG_RACE, 0}, words[4];
    for (int blk = threadIdx.x; blk * 4 < n_vocab; blk += SPEC_THREADS) {
        ctr[3] = (uint32_t)blk;
        philox4x32(d.seed, ctr, words);
        for (int j = 0; j < 4 && blk * 4 + j < n_vocab; j++) {
            const int v = blk * 4 + j;
            if (!(row[v] > 0.0f)) continue;
            const double u = ((double)words[j] + 0.5) * 0x1.0p-32;
            const double key = -log(u) / (double)row[v];
            if (race_better(key, v, bk, bi)) bk = key, bi = v;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        double ok = __shfl_xor_sync(0xffffffffu, bk, off);
        int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (race_better(ok, oi, bk, bi)) bk = ok, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) sk[threadIdx.x >> 5] = bk, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        double k0 = sk[0];
        int i0 = si[0];
        for (int w = 1; w < SPEC_THREADS / 32; w++)
            if (race_better(sk[w], si[w], k0, i0)) k0 = sk[w], i0 = si[w];
        out[blockIdx.x].token = i0 == 0x7fffffff ? -1 : i0;
    }
}

/* ---- host side ---- */

/* Device scratch for one group of rows, grown on demand. */
static sd_status spec_scratch(sd_backend *be, size_t bytes, char **out) {
    if (bytes > be->spec_scratch_bytes) {
        if (be->spec_scratch) {
            cudaStreamSynchronize(be->stream);
            cudaFree(be->spec_scratch);
            be->spec_scratch = NULL;
            be->spec_scratch_bytes = 0;
        }
        if (cudaMalloc(&be->spec_scratch, bytes) != cudaSuccess) {
            cudaGetLastError();
            SD_ERROR("cuda: out of device memory for verification scratch (%zu bytes)", bytes);
            return SD_ERR_NOMEM;
        }
        be->spec_scratch_bytes = bytes;
    }
    *out = (char *)be->spec_scratch;
    return SD_OK;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static bool needs_rank(const sd_sampling *s, int32_t n_vocab) {
    return (s->top_k > 0 && s->top_k < n_vocab) || s->top_p < 1.0f || s->min_p > 0.0f;
}

static sd_status verify_greedy(sd_backend *be, const float *logits, int32_t n_vocab, int32_t n_seqs,
                               sd_spec_rows *seqs) {
    int32_t n_rows = 0;
    for (int32_t i = 0; i < n_seqs; i++)
        if (seqs[i].status == SD_OK && sd_sampling_is_greedy(seqs[i].sampling)) n_rows += seqs[i].k + 1;
    if (!n_rows) return SD_OK;
    int32_t *rows = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_rows * 2);
    if (!rows) return SD_ERR_NOMEM;
    int32_t *arg = rows + n_rows, r = 0;
    for (int32_t i = 0; i < n_seqs; i++)
        if (seqs[i].status == SD_OK && sd_sampling_is_greedy(seqs[i].sampling))
            for (int32_t j = 0; j <= seqs[i].k; j++) rows[r++] = seqs[i].row0 + j;
    char *scr;
    sd_status s = spec_scratch(be, sizeof(int32_t) * (size_t)n_rows * 2, &scr);
    if (s == SD_OK) {
        int32_t *d_rows = (int32_t *)scr, *d_arg = d_rows + n_rows;
        if (cudaMemcpyAsync(d_rows, rows, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyHostToDevice, be->stream) !=
            cudaSuccess)
            s = SD_ERR_CUDA;
        if (s == SD_OK) {
            argmax_kernel<<<n_rows, SPEC_THREADS, 0, be->stream>>>(logits, n_vocab, d_rows, d_arg);
            if (cudaGetLastError() != cudaSuccess ||
                cudaMemcpyAsync(arg, d_arg, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost, be->stream) !=
                    cudaSuccess ||
                cudaStreamSynchronize(be->stream) != cudaSuccess) {
                SD_ERROR("cuda: greedy verification failed: %s", cudaGetErrorString(cudaGetLastError()));
                s = SD_ERR_CUDA;
            }
        }
    }
    r = 0;
    for (int32_t i = 0; s == SD_OK && i < n_seqs; i++) {
        sd_spec_rows *v = &seqs[i];
        if (v->status != SD_OK || !sd_sampling_is_greedy(v->sampling)) continue;
        v->status = sd_spec_verify_greedy(arg + r, v->draft, v->k, v->tokens, &v->n_accepted);
        memset(&v->info, 0, sizeof v->info);
        r += v->k + 1;
    }
    free(rows);
    return s;
}

/* Host staging of verify_group: one row_desc per processed row (each
 * sequence's k drafts and its bonus row), the rows that need ranking, every
 * q flattened, and where each sequence's rows and q entries start. */
static void stage_rows(int32_t n_vocab, const sd_spec_rows *seqs, const int32_t *idx, int32_t n_idx, row_desc *descs,
                       int32_t *ranked_rows, int32_t *q_ids, float *q_probs, int32_t *row_of, int32_t *q_off_of) {
    int32_t r = 0, rk = 0, qo = 0;
    for (int32_t g = 0; g < n_idx; g++) {
        const sd_spec_rows *v = &seqs[idx[g]];
        bool rank = needs_rank(v->sampling, n_vocab);
        row_of[g] = r;
        q_off_of[g] = qo;
        for (int32_t j = 0; j <= v->k; j++, r++) {
            descs[r].row = v->row0 + j;
            descs[r].ranked = rank ? rk : -1;
            if (rank) ranked_rows[rk++] = r;
            descs[r].top_k = v->sampling->top_k;
            descs[r].top_p = v->sampling->top_p;
            descs[r].min_p = v->sampling->min_p;
            descs[r].inv_t = 1.0 / (double)v->sampling->temperature;
            descs[r].y = j < v->k ? v->draft[j] : -1;
            if (descs[r].y >= n_vocab || descs[r].y < -1) descs[r].y = -1; /* refused on the host below */
        }
        for (int32_t j = 0; j < v->k; j++) {
            memcpy(q_ids + qo, v->q[j].ids, sizeof(int32_t) * (size_t)v->q[j].n);
            memcpy(q_probs + qo, v->q[j].probs, sizeof(float) * (size_t)v->q[j].n);
            qo += v->q[j].n;
        }
    }
}

/* The draws for sampled seqs (idx[0..n_idx)): one per processed row, in
 * row order, with the coupled rule's key (spec.h). Checks each sequence's
 * rows, drafts and q first, as sd_spec_verify, and sets its status. */
static void plan_draws(int32_t n_vocab, sd_spec_rows *seqs, const int32_t *idx, int32_t n_idx, const row_stats *stats,
                       const int32_t *row_of, draw_desc *draws) {
    for (int32_t g = 0; g < n_idx; g++) {
        sd_spec_rows *v = &seqs[idx[g]];
        memset(&v->info, 0, sizeof v->info);
        const row_stats *rs = stats + row_of[g];
        for (int32_t j = 0; j <= v->k; j++) {
            draws[row_of[g] + j] = {row_of[g] + j, v->sampling->seed, v->pos0 + (uint64_t)j};
            if (rs[j].bad) {
                SD_ERROR("spec: sequence row %d: logits with NaN or +inf, or all -inf", (int)(v->row0 + j));
                v->status = SD_ERR_INVALID_ARG;
            }
        }
        for (int32_t i = 0; v->status == SD_OK && i < v->k; i++) {
            const int32_t y = v->draft[i];
            double q_tot;
            if (y < 0 || y >= n_vocab) {
                SD_ERROR("spec: draft token %d at index %d is outside [0, %d)", (int)y, (int)i, (int)n_vocab);
                v->status = SD_ERR_RANGE;
            } else {
                v->status = sd_spec_q_check(&v->q[i], n_vocab, i, &q_tot);
            }
        }
    }
}

/* The decisions from the draws: drafts accepted while they equal the
 * draws, then the draw at the first mismatch (or the bonus row's). */
static void decide(int32_t n_vocab, sd_spec_rows *seqs, const int32_t *idx, int32_t n_idx, const int32_t *row_of,
                   const draw_out *outs) {
    for (int32_t g = 0; g < n_idx; g++) {
        sd_spec_rows *v = &seqs[idx[g]];
        if (v->status != SD_OK) continue;
        const draw_out *o = outs + row_of[g];
        int32_t i = 0;
        while (i < v->k && v->draft[i] == o[i].token) {
            v->tokens[i] = v->draft[i];
            i++;
        }
        if (o[i].token < 0 || o[i].token >= n_vocab) {
            v->status = SD_ERR_INTERNAL;
            continue;
        }
        v->tokens[i] = o[i].token;
        v->n_accepted = i;
        v->info.bonus = i == v->k;
    }
}

/* Sampled verification of seqs[first..last) (all stochastic and OK). */
static sd_status verify_group(sd_backend *be, const float *logits, int32_t n_vocab, sd_spec_rows *seqs,
                              const int32_t *idx, int32_t n_idx) {
    const size_t V = (size_t)n_vocab;
    int32_t n_rows = 0, n_ranked = 0, n_q = 0;
    for (int32_t g = 0; g < n_idx; g++) {
        const sd_spec_rows *v = &seqs[idx[g]];
        n_rows += v->k + 1;
        if (needs_rank(v->sampling, n_vocab)) n_ranked += v->k + 1;
        for (int32_t j = 0; j < v->k; j++) n_q += v->q[j].n;
    }
    /* host staging */
    row_desc *descs = (row_desc *)calloc((size_t)n_rows, sizeof *descs);
    row_stats *stats = (row_stats *)calloc((size_t)n_rows, sizeof *stats);
    int32_t *ranked_rows = (int32_t *)calloc((size_t)n_ranked + 1, sizeof(int32_t));
    draw_desc *draws = (draw_desc *)calloc((size_t)n_rows, sizeof *draws);
    draw_out *outs = (draw_out *)calloc((size_t)n_rows, sizeof *outs);
    int32_t *q_ids = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n_q + 1));
    float *q_probs = (float *)malloc(sizeof(float) * ((size_t)n_q + 1));
    int32_t *row_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_idx); /* first processed row of a seq */
    int32_t *q_off_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_idx);
    sd_status s = SD_OK;
    char *scr = NULL;
    if (!descs || !stats || !ranked_rows || !draws || !outs || !q_ids || !q_probs || !row_of || !q_off_of) {
        s = SD_ERR_NOMEM;
        goto done;
    }
    stage_rows(n_vocab, seqs, idx, n_idx, descs, ranked_rows, q_ids, q_probs, row_of, q_off_of);
    /* device layout */
    {
        size_t cub_bytes = 0;
        int32_t *no_off = NULL;
        cub::DeviceSegmentedRadixSort::SortPairsDescending(
            NULL, cub_bytes, (const double *)NULL, (double *)NULL, (const int32_t *)NULL, (int32_t *)NULL,
            (int64_t)n_ranked * (int64_t)V, n_ranked, no_off, no_off, 0, 64, be->stream);
        size_t off_pf = 0, off_pd = align256(off_pf + sizeof(float) * (size_t)n_rows * V);
        size_t off_pd2 = align256(off_pd + sizeof(double) * (size_t)n_ranked * V);
        size_t off_id = align256(off_pd2 + sizeof(double) * (size_t)n_ranked * V);
        size_t off_id2 = align256(off_id + sizeof(int32_t) * (size_t)n_ranked * V);
        size_t off_seg = align256(off_id2 + sizeof(int32_t) * (size_t)n_ranked * V);
        size_t off_desc = align256(off_seg + sizeof(int32_t) * ((size_t)n_ranked + 1));
        size_t off_rr = align256(off_desc + sizeof(row_desc) * (size_t)n_rows);
        size_t off_st = align256(off_rr + sizeof(int32_t) * ((size_t)n_ranked + 1));
        size_t off_dr = align256(off_st + sizeof(row_stats) * (size_t)n_rows);
        size_t off_do = align256(off_dr + sizeof(draw_desc) * (size_t)n_rows);
        size_t off_qi = align256(off_do + sizeof(draw_out) * (size_t)n_rows);
        size_t off_qp = align256(off_qi + sizeof(int32_t) * ((size_t)n_q + 1));
        size_t off_cub = align256(off_qp + sizeof(float) * ((size_t)n_q + 1));
        s = spec_scratch(be, off_cub + cub_bytes + 256, &scr);
        if (s != SD_OK) goto done;
        float *d_pf = (float *)(scr + off_pf);
        double *d_pd = (double *)(scr + off_pd), *d_pd2 = (double *)(scr + off_pd2);
        int32_t *d_id = (int32_t *)(scr + off_id), *d_id2 = (int32_t *)(scr + off_id2);
        int32_t *d_seg = (int32_t *)(scr + off_seg), *d_rr = (int32_t *)(scr + off_rr);
        row_desc *d_desc = (row_desc *)(scr + off_desc);
        row_stats *d_st = (row_stats *)(scr + off_st);
        draw_desc *d_dr = (draw_desc *)(scr + off_dr);
        draw_out *d_do = (draw_out *)(scr + off_do);
        int32_t *d_qi = (int32_t *)(scr + off_qi);
        float *d_qp = (float *)(scr + off_qp);
        void *d_cub = scr + off_cub;
        int32_t *seg = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n_ranked + 1));
        if (!seg) {
            s = SD_ERR_NOMEM;
            goto done;
        }
        for (int32_t i = 0; i <= n_ranked; i++) seg[i] = (int32_t)((size_t)i * V);
        cudaStream_t st = be->stream;
        cudaMemcpyAsync(d_desc, descs, sizeof(row_desc) * (size_t)n_rows, cudaMemcpyHostToDevice, st);
        cudaMemcpyAsync(d_seg, seg, sizeof(int32_t) * ((size_t)n_ranked + 1), cudaMemcpyHostToDevice, st);
        cudaMemcpyAsync(d_rr, ranked_rows, sizeof(int32_t) * ((size_t)n_ranked + 1), cudaMemcpyHostToDevice, st);
        if (n_q) {
            cudaMemcpyAsync(d_qi, q_ids, sizeof(int32_t) * (size_t)n_q, cudaMemcpyHostToDevice, st);
            cudaMemcpyAsync(d_qp, q_probs, sizeof(float) * (size_t)n_q, cudaMemcpyHostToDevice, st);
        }
        probs_kernel<<<n_rows, SPEC_THREADS, 0, st>>>(logits, n_vocab, d_desc, d_pf, d_pd, d_id, d_st);
        if (n_ranked) {
            size_t bytes = cub_bytes;
            cub::DeviceSegmentedRadixSort::SortPairsDescending(d_cub, bytes, d_pd, d_pd2, d_id, d_id2,
                                                               (int64_t)n_ranked * (int64_t)V, n_ranked, d_seg,
                                                               d_seg + 1, 0, 64, st);
            filter_kernel<<<n_ranked, SPEC_THREADS, 0, st>>>(n_vocab, d_desc, d_rr, d_pd2, d_id2, d_st, d_pf);
        }
        stats_kernel<<<n_rows, SPEC_THREADS, 0, st>>>(n_vocab, d_desc, d_pf, d_st);
        cudaMemcpyAsync(stats, d_st, sizeof(row_stats) * (size_t)n_rows, cudaMemcpyDeviceToHost, st);
        cudaError_t e = cudaStreamSynchronize(st);
        free(seg);
        if (e != cudaSuccess || (e = cudaGetLastError()) != cudaSuccess) {
            SD_ERROR("cuda: processing target distributions failed: %s", cudaGetErrorString(e));
            s = SD_ERR_CUDA;
            goto done;
        }

        /* every row's draw, then the decisions, as sd_spec_verify makes them */
        plan_draws(n_vocab, seqs, idx, n_idx, stats, row_of, draws);
        cudaMemcpyAsync(d_dr, draws, sizeof(draw_desc) * (size_t)n_rows, cudaMemcpyHostToDevice, st);
        draw_kernel<<<n_rows, SPEC_THREADS, 0, st>>>(n_vocab, d_dr, d_pf, d_do);
        cudaMemcpyAsync(outs, d_do, sizeof(draw_out) * (size_t)n_rows, cudaMemcpyDeviceToHost, st);
        e = cudaStreamSynchronize(st);
        if (e != cudaSuccess || (e = cudaGetLastError()) != cudaSuccess) {
            SD_ERROR("cuda: drawing verified tokens failed: %s", cudaGetErrorString(e));
            s = SD_ERR_CUDA;
            goto done;
        }
        decide(n_vocab, seqs, idx, n_idx, row_of, outs);
    }
done:
    free(descs), free(stats), free(ranked_rows), free(draws), free(outs), free(q_ids), free(q_probs), free(row_of),
        free(q_off_of);
    return s;
}

sd_status sd_cuda_spec_verify(sd_backend *be, const float *logits, int32_t n_vocab, int32_t n_seqs,
                              sd_spec_rows *seqs) {
    if (n_seqs <= 0) return SD_OK;
    if (be->capturing) return SD_ERR_INTERNAL;
    be->after_kernel = false; /* copies and plain launches follow */
    for (int32_t i = 0; i < n_seqs; i++) {
        sd_spec_rows *v = &seqs[i];
        v->n_accepted = 0;
        v->status = SD_OK;
        if (!v->sampling || v->k < 0 || v->k > SD_MAX_K || (v->k > 0 && !v->draft) ||
            (v->k > 0 && !sd_sampling_is_greedy(v->sampling) && !v->q)) {
            SD_ERROR("spec: sequence %d: needs sampling, 0 <= k <= %d, drafts and their q (k %d)", (int)i, SD_MAX_K,
                     (int)v->k);
            v->status = SD_ERR_INVALID_ARG;
        }
        for (int32_t j = 0; v->status == SD_OK && !sd_sampling_is_greedy(v->sampling) && j < v->k; j++)
            if (!v->q[j].ids || !v->q[j].probs || v->q[j].n <= 0 || v->q[j].n > SPEC_MAX_Q) {
                SD_ERROR("spec: sequence %d: q[%d] must have 1..%d entries (has %d)", (int)i, (int)j, SPEC_MAX_Q,
                         (int)v->q[j].n);
                v->status = SD_ERR_INVALID_ARG;
            }
    }
    SD_TRY(verify_greedy(be, logits, n_vocab, n_seqs, seqs));
    /* sampled sequences in groups within the scratch budget */
    const size_t per_row = (size_t)n_vocab * 28 + 64;
    int32_t *idx = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_seqs);
    if (!idx) return SD_ERR_NOMEM;
    sd_status s = SD_OK;
    int32_t n_idx = 0;
    size_t bytes = 0;
    for (int32_t i = 0; i <= n_seqs && s == SD_OK; i++) {
        bool take = i < n_seqs && seqs[i].status == SD_OK && !sd_sampling_is_greedy(seqs[i].sampling);
        size_t need = take ? per_row * (size_t)(seqs[i].k + 1) : 0;
        if (n_idx > 0 && (i == n_seqs || bytes + need > SPEC_SCRATCH_BUDGET)) {
            s = verify_group(be, logits, n_vocab, seqs, idx, n_idx);
            n_idx = 0;
            bytes = 0;
        }
        if (take) {
            idx[n_idx++] = i;
            bytes += need;
        }
    }
    free(idx);
    return s;
}
