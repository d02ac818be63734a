/* backend.c — the CPU backend: its op table, memory and thread pool.
 *
 * Buffers are plain 64-byte-aligned host memory, so upload/download are
 * memcpy and the loader writes weights straight into them: f32, or the
 * stored blocks of the formats matmul_stored computes on (qmatmul.c). The ops live
 * one per file (embed.c, matmul.c, ...), mirrored by name in engine/cuda/. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/cpu_impl.h"
#include "cpu/quant_kernels.h"

/* Below this much work an op runs on the calling thread alone. */
enum { PARALLEL_MIN_WORK = 16384 };

void sd_cpu_parallel(sd_backend *be, sd_threadpool_fn fn, void *arg, int64_t n_chunks, size_t work) {
    if (be->n_threads <= 1 || n_chunks <= 1 || work < PARALLEL_MIN_WORK)
        for (int64_t c = 0; c < n_chunks; c++) fn(arg, c, 0);
    else
        sd_threadpool_run(be->tp, fn, arg, n_chunks);
}

sd_status sd_cpu_scratch_reserve(sd_backend *be, size_t floats) {
    if (floats <= be->scratch_per_thread) return SD_OK;
    size_t per = (floats + 15) & ~(size_t)15, total;
    if (!sd_mul_ok(per, (size_t)be->n_threads * sizeof(float), &total)) return SD_ERR_NOMEM;
    float *s = aligned_alloc(64, total);
    if (!s) {
        SD_ERROR("cpu backend: cannot allocate %zu bytes of scratch", total);
        return SD_ERR_NOMEM;
    }
    free(be->scratch);
    be->scratch = s;
    be->scratch_per_thread = per;
    return SD_OK;
}

static void cpu_destroy(sd_backend **pbe) {
    if (!pbe || !*pbe) return;
    sd_backend *be = *pbe;
    sd_threadpool_free(&be->tp);
    free(be->scratch);
    free(be->qbuf);
    free(be->attn_runs);
    free(be);
    *pbe = NULL;
}

/* Buffers of at least this size are 2 MB aligned and asked to be backed by
 * transparent huge pages: decode streams every weight once per token, and
 * 4 KB pages would cost a TLB miss every 4 KB. */
#define HUGE_MIN  ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

static void *cpu_buf_alloc(sd_backend *be, size_t bytes) {
    (void)be;
    if (bytes >= HUGE_MIN) {
        size_t rounded = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        if (rounded < bytes) return NULL;
        void *p = aligned_alloc(HUGE_PAGE, rounded);
#ifdef MADV_HUGEPAGE
        if (p) madvise(p, rounded, MADV_HUGEPAGE); /* advisory: failure is harmless */
#endif
        return p;
    }
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void cpu_buf_free(sd_backend *be, void *buf) {
    (void)be;
    free(buf);
}

static sd_status cpu_copy(sd_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return SD_OK;
}

static const sd_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = true,
    .weight_elem_bytes = 4,
    .destroy = cpu_destroy,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .buf_upload = cpu_copy,
    .buf_download = cpu_copy,
    .embed = sd_cpu_embed,
    .matmul = sd_cpu_matmul,
    .stored_supports = sd_cpu_qmatmul_supports,
    .matmul_stored = sd_cpu_matmul_stored,
    .rmsnorm = sd_cpu_rmsnorm,
    .rope = sd_cpu_rope,
    .kv_write = sd_cpu_kv_write,
    .attention = sd_cpu_attention,
    .kv_write_f16 = sd_cpu_kv_write_f16,
    .attention_f16 = sd_cpu_attention_f16,
    .swiglu = sd_cpu_swiglu,
    .add = sd_cpu_add,
    .rope_neox = sd_cpu_rope_neox,
    .attention_window = sd_cpu_attention_window,
    .attention_window_f16 = sd_cpu_attention_window_f16,
    .attention_tree = sd_cpu_attention_tree,
    .geglu = sd_cpu_geglu,
    .add_rows = sd_cpu_add_rows,
    .scale = sd_cpu_scale,
};

sd_status sd_cpu_backend_create(int32_t n_threads, sd_backend_handle *out) {
    const sd_backend_opts def = sd_backend_default_opts();
    return sd_cpu_backend_create_opts(n_threads, &def, out);
}

sd_status sd_cpu_backend_create_opts(int32_t n_threads, const sd_backend_opts *opts, sd_backend_handle *out) {
    if (!out || !opts || n_threads < 0) return SD_ERR_INVALID_ARG;
    out->ops = NULL;
    out->ctx = NULL;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int32_t)(n > 256 ? 256 : n) : 1;
    }
    sd_backend *be = calloc(1, sizeof *be);
    if (!be) return SD_ERR_NOMEM;
    be->n_threads = n_threads;
    be->qpath = sd_cpu_qpath_named(opts->cpu_qpath);
    sd_status s = sd_threadpool_create(n_threads, &be->tp);
    if (s != SD_OK) {
        free(be);
        return s;
    }
    out->ops = &cpu_ops;
    out->ctx = be;
    return SD_OK;
}
