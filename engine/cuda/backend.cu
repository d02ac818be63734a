/* backend.cu — the CUDA backend: its op table, device memory, the device
 * copies of a forward's host arrays, and recorded forwards (CUDA graphs).
 *
 * Memory. Buffers are cudaMalloc'ed device memory; an allocation that does
 * not fit is refused with the numbers (asked, free, total) in the log, so a
 * model or KV cache too large for the card is a clear error, not a crash.
 * Matrices are converted to BF16 on the device: the loader's f32 rows go up
 * in 64 MB pieces into a staging buffer and a kernel rounds them into place
 * (no host-side conversion pass over tens of GB).
 *
 * Host arrays. The model announces the int32 arrays of a forward once
 * (host_arrays): they are packed into one pinned staging buffer and copied
 * with one cudaMemcpyAsync each into fixed device buffers (mirrors). Ops
 * receiving those host pointers read the mirrors, so a forward costs one
 * small upload instead of one per op and layer, and the mirrors' addresses
 * stay fixed from step to step — what recording needs. Before the staging
 * buffer is overwritten the previous step's copies are waited for (an event),
 * never the whole stream.
 *
 * Graphs. A forward of a given shape (the model's key: token count and KV
 * cache) runs op by op the first time it is seen; the second time it is
 * recorded with stream capture and launched; from then on it is replayed
 * with one cudaGraphLaunch. Every kernel reads what changes between steps
 * (ids, positions, block tables) from the mirrors, never from launch
 * arguments, so a replay is exact. If an op cannot be recorded (a host
 * array that was not announced, scratch that would have to grow, the cuBLAS
 * path) the recording is dropped, the forward runs op by op, and the key is
 * never recorded again. --cuda-graphs 0 (sd_backend_opts) turns recording off.
 *
 * Rejected: cudaMallocManaged (page faults in the hot path, and
 * oversubscribing managed memory can hang the GPU); one stream per op kind
 * (the ops of a forward are a chain; there is nothing to overlap). */
#include "cuda/cuda_impl.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

/* Weight conversion staging: 64 MB of f32 per piece. */
#define CONVERT_FLOATS  ((size_t)16 << 20)
/* cuBLAS workspace, fixed at creation so cuBLAS never allocates mid-forward. */
#define CUBLAS_WS_BYTES ((size_t)32 << 20)

static const double MIB = 1024.0 * 1024.0;

static void graph_reset(sd_backend *be);

/* ------------------------------------------------------------------ memory */

static void log_oom(sd_backend *be, size_t bytes, const char *what) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    SD_ERROR("cuda:%d: out of device memory allocating %.1f MiB for %s (%.1f MiB free of %.1f MiB)", (int)be->device,
             (double)bytes / MIB, what, (double)free_b / MIB, (double)total_b / MIB);
}

static void *cuda_buf_alloc(sd_backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state of the runtime */
        log_oom(be, bytes, "a buffer");
        return NULL;
    }
    return p;
}

static void cuda_buf_free(sd_backend *be, void *buf) {
    (void)be;
    if (buf) cudaFree(buf);
}

static sd_status cuda_upload(sd_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return SD_OK;
    be->after_kernel = false;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, be->stream));
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    return SD_OK;
}

static sd_status cuda_download(sd_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return SD_OK;
    be->after_kernel = false;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, be->stream));
    CUDA_TRY(cudaStreamSynchronize(be->stream));
    return SD_OK;
}

/* f32 rows [n_out][n_in] on the host -> BF16 [n_out][n_in] on the device. */
static sd_status cuda_weight_upload(sd_backend *be, const float *host, int32_t n_out, int32_t n_in, void **out) {
    *out = NULL;
    size_t n;
    if (n_out <= 0 || n_in <= 0 || !sd_mul_ok((size_t)n_out, (size_t)n_in, &n)) return SD_ERR_INVALID_ARG;
    void *w = NULL;
    if (cudaMalloc(&w, n * sizeof(__nv_bfloat16)) != cudaSuccess) {
        cudaGetLastError();
        log_oom(be, n * sizeof(__nv_bfloat16), "a BF16 weight matrix");
        return SD_ERR_NOMEM;
    }
    if (!be->convert_buf) {
        if (cudaMalloc((void **)&be->convert_buf, CONVERT_FLOATS * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            cudaFree(w);
            log_oom(be, CONVERT_FLOATS * sizeof(float), "weight conversion staging");
            return SD_ERR_NOMEM;
        }
        be->convert_floats = CONVERT_FLOATS;
    }
    for (size_t done = 0; done < n; done += be->convert_floats) {
        size_t piece = n - done < be->convert_floats ? n - done : be->convert_floats;
        sd_status s = cuda_upload(be, be->convert_buf, host + done, piece * sizeof(float));
        if (s == SD_OK) s = sd_cuda_f32_to_bf16(be, be->convert_buf, (__nv_bfloat16 *)w + done, piece);
        if (s != SD_OK) {
            cudaFree(w);
            return s;
        }
    }
    /* the next piece's upload waits for the conversion; the last one is
     * waited for here so the staging buffer is free when we return */
    cudaError_t e = cudaStreamSynchronize(be->stream);
    if (e != cudaSuccess) {
        SD_ERROR("cuda: converting a weight matrix failed: %s", cudaGetErrorString(e));
        cudaFree(w);
        return SD_ERR_CUDA;
    }
    *out = w;
    return SD_OK;
}

static void cuda_weight_free(sd_backend *be, void *w) {
    (void)be;
    if (w) cudaFree(w);
}

sd_status sd_cuda_scratch(sd_backend *be, size_t bytes, void **out) {
    if (bytes > be->scratch_bytes) {
        if (be->capturing) {
            be->capture_failed = true;
            return SD_ERR_INTERNAL;
        }
        size_t want = bytes + bytes / 4;
        void *p = NULL;
        if (cudaMalloc(&p, want) != cudaSuccess) {
            cudaGetLastError();
            log_oom(be, want, "matmul scratch");
            return SD_ERR_NOMEM;
        }
        /* the old scratch may still be read by queued kernels */
        cudaStreamSynchronize(be->stream);
        if (be->scratch) cudaFree(be->scratch);
        be->scratch = p;
        be->scratch_bytes = want;
        graph_reset(be); /* recordings name the old scratch */
    }
    *out = be->scratch;
    return SD_OK;
}

static sd_status cuda_mem_info(sd_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return SD_OK;
}

/* ------------------------------------------------------------- host arrays */

static sd_status cuda_host_arrays(sd_backend *be, const sd_host_array *arrays, int32_t n) {
    if (n < 0 || n > SD_CUDA_MAX_MIRRORS) return SD_ERR_INVALID_ARG;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += arrays[i].n;
    /* the previous step's copies out of staging must be done before it is rewritten */
    if (be->staging_busy) {
        CUDA_TRY(cudaEventSynchronize(be->staging_done));
        be->staging_busy = false;
    }
    if (total > be->staging_cap) {
        size_t cap = total + total / 2 + 1024;
        int32_t *p = NULL;
        CUDA_TRY(cudaMallocHost((void **)&p, cap * sizeof(int32_t)));
        if (be->staging) cudaFreeHost(be->staging);
        be->staging = p;
        be->staging_cap = cap;
    }
    bool moved = false;
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        sd_cuda_mirror *mr = &be->mirrors[i];
        size_t cnt = arrays[i].n;
        if (cnt > mr->cap) {
            size_t cap = cnt + cnt / 2 + 256;
            int32_t *d = NULL;
            if (cudaMalloc((void **)&d, cap * sizeof(int32_t)) != cudaSuccess) {
                cudaGetLastError();
                log_oom(be, cap * sizeof(int32_t), "a forward's host arrays");
                return SD_ERR_NOMEM;
            }
            CUDA_TRY(cudaStreamSynchronize(be->stream)); /* queued kernels may read the old copy */
            if (mr->dev) cudaFree(mr->dev);
            mr->dev = d;
            mr->cap = cap;
            moved = true;
        }
        mr->host = arrays[i].data;
        mr->n = cnt;
        if (cnt) {
            be->after_kernel = false;
            memcpy(be->staging + off, arrays[i].data, cnt * sizeof(int32_t));
            CUDA_TRY(
                cudaMemcpyAsync(mr->dev, be->staging + off, cnt * sizeof(int32_t), cudaMemcpyHostToDevice, be->stream));
        }
        off += cnt;
    }
    for (int32_t i = n; i < be->n_mirrors; i++) be->mirrors[i].host = NULL, be->mirrors[i].n = 0;
    be->n_mirrors = n;
    be->after_kernel = false;
    CUDA_TRY(cudaEventRecord(be->staging_done, be->stream));
    be->staging_busy = true;
    if (moved) graph_reset(be);
    return SD_OK;
}

sd_status sd_cuda_dev_i32(sd_backend *be, const int32_t *host, size_t n, const int32_t **dev) {
    for (int32_t i = 0; i < be->n_mirrors; i++) {
        const sd_cuda_mirror *mr = &be->mirrors[i];
        if (mr->host == host && n <= mr->n) {
            *dev = mr->dev;
            return SD_OK;
        }
    }
    if (be->capturing) {
        be->capture_failed = true;
        return SD_ERR_INTERNAL;
    }
    int32_t k = be->tmp_next;
    be->tmp_next = (be->tmp_next + 1) % SD_CUDA_MAX_TMP;
    if (n > be->tmp_cap[k]) {
        size_t cap = n + n / 2 + 256;
        int32_t *d = NULL;
        CUDA_TRY(cudaStreamSynchronize(be->stream));
        if (be->tmp[k]) cudaFree(be->tmp[k]);
        be->tmp[k] = NULL;
        be->tmp_cap[k] = 0;
        if (cudaMalloc((void **)&d, cap * sizeof(int32_t)) != cudaSuccess) {
            cudaGetLastError();
            log_oom(be, cap * sizeof(int32_t), "an op's host array");
            return SD_ERR_NOMEM;
        }
        be->tmp[k] = d;
        be->tmp_cap[k] = cap;
    }
    /* from pageable memory: returns once the source has been read */
    if (n) be->after_kernel = false;
    if (n) CUDA_TRY(cudaMemcpyAsync(be->tmp[k], host, n * sizeof(int32_t), cudaMemcpyHostToDevice, be->stream));
    *dev = be->tmp[k];
    return SD_OK;
}

sd_status sd_cuda_dev_paging(sd_backend *be, int32_t n_tokens, int32_t block_size, const int32_t *pos,
                             const int32_t *bt, const int32_t *bt_off, const int32_t **d_pos, const int32_t **d_bt,
                             const int32_t **d_off) {
    SD_TRY(sd_cuda_dev_i32(be, pos, (size_t)n_tokens, d_pos));
    SD_TRY(sd_cuda_dev_i32(be, bt_off, (size_t)n_tokens, d_off));
    size_t bt_len = 0; /* the table's length: the largest entry any token reads */
    for (int32_t t = 0; t < n_tokens; t++) {
        size_t end = (size_t)bt_off[t] + (size_t)(pos[t] / block_size) + 1;
        if (end > bt_len) bt_len = end;
    }
    return sd_cuda_dev_i32(be, bt, bt_len, d_bt);
}

/* ------------------------------------------------------------------ graphs */

static void graph_reset(sd_backend *be) {
    for (int32_t i = 0; i < be->n_graphs; i++) cudaGraphExecDestroy(be->graphs[i].exec);
    be->n_graphs = 0;
    be->n_seen = 0;
}

static sd_status cuda_graph_launch(sd_backend *be, uint64_t key) {
    for (int32_t i = 0; i < be->n_graphs; i++) {
        if (be->graphs[i].key != key) continue;
        be->graphs[i].last_used = ++be->clock;
        be->after_kernel = false;
        CUDA_TRY(cudaGraphLaunch(be->graphs[i].exec, be->stream));
        be->n_replayed++;
        return SD_OK;
    }
    return SD_ERR_NOT_FOUND;
}

static sd_status cuda_graph_begin(sd_backend *be, uint64_t key) {
    if (!be->graphs_enabled || be->capturing) return SD_ERR_NOT_FOUND;
    int32_t i = 0;
    while (i < be->n_seen && be->seen[i].key != key) i++;
    if (i == be->n_seen) { /* first sighting: run op by op (warms up buffers) */
        if (be->n_seen == SD_CUDA_MAX_SEEN) be->n_seen = 0;
        be->seen[be->n_seen].key = key;
        be->seen[be->n_seen].never = false;
        be->n_seen++;
        be->n_first++;
        return SD_ERR_NOT_FOUND;
    }
    if (be->seen[i].never) {
        be->n_never++;
        return SD_ERR_NOT_FOUND;
    }
    cudaError_t e = cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        be->seen[i].never = true;
        return SD_ERR_NOT_FOUND;
    }
    be->capturing = true;
    be->capture_failed = false;
    be->after_kernel = false; /* the recording's first kernel has no kernel before it */
    be->capture_key = key;
    be->capture_t0 = sd_now();
    return SD_OK;
}

static void mark_never(sd_backend *be, uint64_t key) {
    for (int32_t i = 0; i < be->n_seen; i++)
        if (be->seen[i].key == key) be->seen[i].never = true;
}

static sd_status cuda_graph_end(sd_backend *be, bool ok) {
    if (!be->capturing) return SD_ERR_INVALID_ARG;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(be->stream, &graph);
    be->capturing = false;
    be->after_kernel = false; /* the stream's last operation is what preceded the recording */
    if (e != cudaSuccess || !graph || be->capture_failed || !ok) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        if (ok || be->capture_failed) {
            /* an op could not be recorded (it said so by failing): nothing
             * ran, the caller runs the ops, and this shape is never
             * recorded again */
            mark_never(be, be->capture_key);
            SD_DEBUG("cuda: forward %llx cannot be recorded; it runs op by op", (unsigned long long)be->capture_key);
            return SD_ERR_NOT_FOUND;
        }
        return SD_OK; /* a real failure: the caller reports its own status */
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        mark_never(be, be->capture_key);
        SD_WARN("cuda: instantiating a recorded forward failed (%s); it runs op by op", cudaGetErrorString(e));
        return SD_ERR_NOT_FOUND;
    }
    int32_t slot = be->n_graphs;
    if (slot == SD_CUDA_MAX_GRAPHS) { /* evict the least recently used */
        slot = 0;
        for (int32_t i = 1; i < be->n_graphs; i++)
            if (be->graphs[i].last_used < be->graphs[slot].last_used) slot = i;
        cudaGraphExecDestroy(be->graphs[slot].exec);
        be->n_evicted++;
    } else {
        be->n_graphs++;
    }
    be->graphs[slot].key = be->capture_key;
    be->graphs[slot].exec = exec;
    be->graphs[slot].last_used = ++be->clock;
    be->n_recorded++;
    be->record_s += sd_now() - be->capture_t0; /* capture and instantiation, on the host */
    CUDA_TRY(cudaGraphLaunch(exec, be->stream));
    return SD_OK;
}

static void cuda_graph_reset(sd_backend *be) {
    if (be->capturing) return; /* the model never resets mid-recording */
    graph_reset(be);
}

/* ----------------------------------------------------------------- backend */

static void cuda_destroy(sd_backend **pbe) {
    if (!pbe || !*pbe) return;
    sd_backend *be = *pbe;
    if (be->n_replayed + be->n_recorded + be->n_first + be->n_never > 0)
        SD_INFO("cuda:%d: forwards: %llu replayed from recordings, %llu recorded (%.1f ms on the host), %llu op by op "
                "on a shape's first sighting, %llu op by op for good (cannot be recorded); %llu recordings evicted",
                (int)be->device, (unsigned long long)be->n_replayed, (unsigned long long)be->n_recorded,
                be->record_s * 1e3, (unsigned long long)be->n_first, (unsigned long long)be->n_never,
                (unsigned long long)be->n_evicted);
    cudaSetDevice(be->device);
    if (be->stream) cudaStreamSynchronize(be->stream);
    graph_reset(be);
    for (int32_t i = 0; i < SD_CUDA_MAX_MIRRORS; i++)
        if (be->mirrors[i].dev) cudaFree(be->mirrors[i].dev);
    for (int32_t i = 0; i < SD_CUDA_MAX_TMP; i++)
        if (be->tmp[i]) cudaFree(be->tmp[i]);
    if (be->staging) cudaFreeHost(be->staging);
    if (be->staging_done) cudaEventDestroy(be->staging_done);
    if (be->scratch) cudaFree(be->scratch);
    if (be->spec_scratch) cudaFree(be->spec_scratch);
    if (be->convert_buf) cudaFree(be->convert_buf);
    if (be->cublas_ws) cudaFree(be->cublas_ws);
    if (be->mm_counters) cudaFree(be->mm_counters);
    if (be->cublas) cublasDestroy(be->cublas);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
    *pbe = NULL;
}

/* The one stream (a tensor-parallel group's NCCL collectives join it).
 * NCCL's kernels know nothing of programmatic launches, so from here on
 * every kernel is launched plainly. */
static void *cuda_stream(sd_backend *be) {
    if (be->pdl) SD_INFO("cuda:%d: the stream is shared with collectives: programmatic launches off", (int)be->device);
    be->pdl = false;
    return (void *)be->stream;
}

static const sd_backend_ops cuda_ops = {
    .name = "cuda",
    .host_memory = false,
    .destroy = cuda_destroy,
    .weight_elem_bytes = 2,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .buf_upload = cuda_upload,
    .buf_download = cuda_download,
    .weight_upload = cuda_weight_upload,
    .weight_free = cuda_weight_free,
    .mem_info = cuda_mem_info,
    .stream = cuda_stream,
    .host_arrays = cuda_host_arrays,
    .graph_launch = cuda_graph_launch,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_reset = cuda_graph_reset,
    .spec_verify = sd_cuda_spec_verify,
    .embed = sd_cuda_embed,
    .matmul = sd_cuda_matmul,
    .stored_supports = NULL, /* matrices are BF16 through weight_upload */
    .matmul_stored = NULL,
    .matmul_fused = sd_cuda_matmul_fused,
    .rmsnorm = sd_cuda_rmsnorm,
    .rope = sd_cuda_rope,
    .kv_write = sd_cuda_kv_write,
    .rope_kv = sd_cuda_rope_kv,
    .attention = sd_cuda_attention,
    .kv_write_f16 = NULL, /* f32 cache only: sd_model_kv_create refuses --kv-type f16 */
    .attention_f16 = NULL,
    .swiglu = sd_cuda_swiglu,
    .add = sd_cuda_add,
    .rope_neox = sd_cuda_rope_neox,
    .attention_window = sd_cuda_attention_window,
    .attention_window_f16 = NULL,
    .attention_tree = NULL, /* token trees run on the CPU backend only: model_tree.c refuses them here */
    .geglu = sd_cuda_geglu,
    .add_rows = sd_cuda_add_rows,
    .scale = sd_cuda_scale,
};

sd_status sd_cuda_backend_create(int32_t device, sd_backend_handle *out) {
    const sd_backend_opts def = sd_backend_default_opts();
    return sd_cuda_backend_create_opts(device, &def, out);
}

sd_status sd_cuda_backend_create_opts(int32_t device, const sd_backend_opts *opts, sd_backend_handle *out) {
    if (!out || !opts || device < 0 || opts->cuda_pdl_prefetch < 0 || opts->cuda_pdl_prefetch > 64)
        return SD_ERR_INVALID_ARG;
    out->ops = NULL;
    out->ctx = NULL;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        SD_ERROR("cuda:%d was asked for, but no CUDA GPU is usable here (%s)", (int)device,
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return SD_ERR_CUDA;
    }
    if (device >= n_dev) {
        SD_ERROR("cuda:%d was asked for, but this machine has %d CUDA device%s (cuda:0..%d)", (int)device, n_dev,
                 n_dev == 1 ? "" : "s", n_dev - 1);
        return SD_ERR_CUDA;
    }
    CUDA_TRY(cudaSetDevice(device));
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, device));
    sd_backend *be = (sd_backend *)calloc(1, sizeof *be);
    if (!be) return SD_ERR_NOMEM;
    be->device = device;
    be->n_sm = prop.multiProcessorCount;
    be->total_mem = prop.totalGlobalMem;
    be->graphs_enabled = opts->cuda_graphs;
    be->mma = opts->cuda_mma;
    be->fuse = opts->cuda_fuse ? 1 : 0;
    be->pdl = opts->cuda_pdl;
    be->pdl_prefetch = opts->cuda_pdl_prefetch;
    if (be->pdl && prop.major < 9) {
        SD_WARN("cuda:%d: --cuda-pdl 1 needs compute capability 9.0 or later (this GPU is %d.%d); off", (int)device,
                prop.major, prop.minor);
        be->pdl = false;
    }
    sd_status s = SD_ERR_CUDA;
    if (cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&be->staging_done, cudaEventDisableTiming) != cudaSuccess) {
        SD_ERROR("cuda:%d: cannot create a stream", (int)device);
        goto fail;
    }
    if (cublasCreate(&be->cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(be->cublas, be->stream) != 0) {
        SD_ERROR("cuda:%d: cannot create a cuBLAS handle", (int)device);
        goto fail;
    }
    if (cudaMalloc(&be->cublas_ws, CUBLAS_WS_BYTES) != cudaSuccess) {
        cudaGetLastError();
        log_oom(be, CUBLAS_WS_BYTES, "the cuBLAS workspace");
        s = SD_ERR_NOMEM;
        goto fail;
    }
    be->cublas_ws_bytes = CUBLAS_WS_BYTES;
    if (cudaMalloc((void **)&be->mm_counters, SD_CUDA_MM_COUNTERS * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(be->mm_counters, 0, SD_CUDA_MM_COUNTERS * sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        log_oom(be, SD_CUDA_MM_COUNTERS * sizeof(unsigned), "the matmul slice counters");
        s = SD_ERR_NOMEM;
        goto fail;
    }
    if (cublasSetWorkspace(be->cublas, be->cublas_ws, be->cublas_ws_bytes) != CUBLAS_STATUS_SUCCESS) {
        SD_ERROR("cuda:%d: cublasSetWorkspace failed", (int)device);
        goto fail;
    }
    SD_INFO("cuda:%d: %s, %d multiprocessors, %.0f MiB, compute capability %d.%d%s%s%s", (int)device, prop.name,
            be->n_sm, (double)prop.totalGlobalMem / MIB, prop.major, prop.minor,
            be->graphs_enabled ? "" : ", graphs off", be->mma ? "" : ", tensor-core matmul off",
            be->pdl ? ", programmatic launches on" : "");
    out->ops = &cuda_ops;
    out->ctx = be;
    return SD_OK;
fail:
    cuda_destroy(&be);
    return s;
}
