/* specd-bench — benchmarks whose results are committed to bench/results/.
 *
 * Modes (the first argument):
 *   forward   one model on this machine: prompt processing, decode at batch 1,
 *             the cost of k new tokens in one call relative to 1 (what
 *             verification costs), and decode's weight-streaming rate as a
 *             share of the memory bandwidth measured in the same run.
 *   spec      plain vs speculative decoding on bench/prompts/ (bench_spec.c).
 *   gpu       one model on a CUDA device (bench_gpu.c).
 *   tp        a CPU tensor-parallel verifier group against TP = 1 (bench_tp.c).
 *   serve     through the running service (bench_serve.c).
 *   link      one message on a specd link, plaintext and CurveZMQ (bench_link.c).
 *   window    decode at a long context, sliding-window vs global model (bench_window.c).
 *
 * Every figure is a median over repetitions, and ratios are taken between
 * figures measured side by side in one run: the machines are shared and
 * noisy, so absolute numbers from different runs are not compared. In
 * forward mode one repetition runs every measure once, in turn (bandwidth,
 * prompt, decode, k = 1..max_k), and a ratio is the median of the
 * per-repetition ratios: a burst of load from another job then spoils one
 * repetition of every figure rather than all repetitions of one figure.
 * Every mode also samples the CPU time other processes use during each
 * repetition (bench_hygiene.h) and leaves out repetitions over a limit
 * (--max-other-load, default a quarter of a core), writing the share into
 * its table.
 * Rejected: timing each measure in its own block of repetitions (what this
 * mode first did) — on the shared 2-core development VM the bandwidth block
 * alone swung 2x between runs (16 vs 32 GB/s read), once putting decode at
 * 148% of "memory bandwidth".
 *
 * The bandwidth reference is measured with as many threads as the model
 * uses, on buffers allocated like the weights (huge pages asked for): a
 * read-only pass (what decode does with weights) and memcpy, reported both
 * as STREAM's "copy" (bytes read plus bytes written) and as bytes copied per
 * second, because the two conventions differ by 2x and a target written as
 * "a share of copy bandwidth" must say which one it means. */
#include "bench_gpu.h"
#include "specd/cli.h"
#include "bench_hygiene.h"
#include "bench_stats.h"
#include "bench_spec.h"
#include "bench_link.h"
#include "bench_window.h"
#ifdef SPECD_BENCH_SERVE
#include "bench_serve.h"
#include "bench_http.h"
#endif
#ifdef SPECD_BENCH_TP
#include "bench_tp.h"
#endif
#include "specd/common.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/backend_opts.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ---- small statistics ---- */

/* ---- memory bandwidth reference ---- */

typedef struct bw_job {
    const float *src;
    float *dst;
    size_t n;    /* floats in this thread's slice */
    double sink; /* keeps the read pass from being optimized away */
    int copy;    /* 1: memcpy, 0: read-only sum */
} bw_job;

static void *bw_worker(void *arg) {
    bw_job *j = arg;
    if (j->copy) {
        memcpy(j->dst, j->src, j->n * sizeof(float));
    } else {
        /* Eight independent sums so the loop is bound by loads, not adds. */
        float acc[8] = {0};
        size_t i = 0;
        for (; i + 8 <= j->n; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += j->src[i + k];
        double s = 0;
        for (int k = 0; k < 8; k++) s += acc[k];
        j->sink = s;
    }
    return NULL;
}

/* One timed pass over n_floats with n_threads; returns seconds, or -1 when a
 * thread cannot be started. */
static double bw_pass(const float *src, float *dst, size_t n_floats, int n_threads, int copy) {
    pthread_t th[64];
    bw_job jobs[64];
    if (n_threads > 64) n_threads = 64;
    size_t per = n_floats / (size_t)n_threads;
    int started = 0;
    double t0 = sd_now();
    for (int t = 0; t < n_threads; t++) {
        jobs[t] = (bw_job){src + per * (size_t)t, dst + per * (size_t)t, per, 0, copy};
        if (pthread_create(&th[t], NULL, bw_worker, &jobs[t]) != 0) break;
        started++;
    }
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    return started == n_threads ? sd_now() - t0 : -1;
}

/* Bandwidth buffers are allocated like the CPU backend's weights (2 MB
 * aligned, transparent huge pages asked for) and written before any pass is
 * timed, so the reference pays neither page faults nor 4 KB-page TLB misses
 * that decode does not pay: a weaker reference would flatter decode. */
#define BW_HUGE_PAGE  ((size_t)2 << 20)
#define BW_DEFAULT_MB 1024 /* twice the 480 MiB L3 the development VM reports */

typedef struct bw_buffers {
    float *src, *dst;
    size_t bytes, n_floats;
    const float *file;  /* the model file mapped a second time, read-only (NULL: not mapped) */
    size_t file_floats; /* whole floats of it the pass reads */
} bw_buffers;

/* Two buffers of mb MiB each, rounded up to whole huge pages. */
static bool bw_alloc(bw_buffers *b, size_t mb) {
    b->bytes = ((mb << 20) + BW_HUGE_PAGE - 1) & ~(BW_HUGE_PAGE - 1);
    b->n_floats = b->bytes / sizeof(float);
    b->src = aligned_alloc(BW_HUGE_PAGE, b->bytes);
    b->dst = aligned_alloc(BW_HUGE_PAGE, b->bytes);
    if (!b->src || !b->dst) return false;
#ifdef MADV_HUGEPAGE
    madvise(b->src, b->bytes, MADV_HUGEPAGE); /* advisory, as for the weights */
    madvise(b->dst, b->bytes, MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < b->n_floats; i++) b->src[i] = (float)(i & 1023);
    memset(b->dst, 1, b->bytes);
    return true;
}

static void bw_free(bw_buffers *b) {
    free(b->src);
    free(b->dst);
    if (b->file) munmap((void *)b->file, b->file_floats * sizeof(float));
    b->src = b->dst = NULL;
    b->file = NULL;
}

/* Maps the model file again for a second read-only pass, over the page
 * cache's own pages: the weights stream from those, which may be 4 KiB
 * pages (model_map_pages), while the buffers above get 2 MiB ones when the
 * kernel grants them. The first figure stays the machine's read bandwidth;
 * this one says what a plain read of the same file's pages reaches. */
static void bw_map_file(bw_buffers *b, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size >= (long)(64 * sizeof(float))) {
        size_t n = (size_t)size / sizeof(float);
        void *p = mmap(NULL, n * sizeof(float), PROT_READ, MAP_PRIVATE, fileno(f), 0);
        if (p != MAP_FAILED) {
            b->file = p;
            b->file_floats = n;
        }
    }
    fclose(f);
}

/* ---- machine description ---- */

/* First line of a small text file into buf (newline removed); "?" when absent. */
static void read_line(const char *path, char *buf, size_t size) {
    snprintf(buf, size, "?");
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(buf, (int)size, f)) snprintf(buf, size, "?");
    buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

/* The 1, 5 and 15 minute load averages (the first three fields of
 * /proc/loadavg): how busy the shared machine was around the run. */
static void read_loadavg(char *buf, size_t size) {
    read_line("/proc/loadavg", buf, size);
    int fields = 0;
    for (char *c = buf; *c; c++)
        if (*c == ' ' && ++fields == 3) {
            *c = 0;
            break;
        }
}

static void describe_machine(FILE *f, int n_threads, const sd_backend_opts *backend, const char *load_before,
                             const char *load_after) {
    char model[256] = "unknown CPU";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(model, sizeof model, "%s", c + 2);
                    model[strcspn(model, "\n")] = 0;
                }
                break;
            }
        fclose(ci);
    }
    long mem_kb = 0;
    FILE *mi = fopen("/proc/meminfo", "r");
    if (mi) {
        if (fscanf(mi, "MemTotal: %ld kB", &mem_kb) != 1) mem_kb = 0;
        fclose(mi);
    }
    char l2[32], l3[32], thp[128];
    read_line("/sys/devices/system/cpu/cpu0/cache/index2/size", l2, sizeof l2);
    read_line("/sys/devices/system/cpu/cpu0/cache/index3/size", l3, sizeof l3);
    read_line("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof thp);
    struct utsname u;
    uname(&u);
    fprintf(f,
            "- machine: %s, %ld online cores, L2 %s per core, L3 %s (as the kernel reports it), %.1f GiB RAM, "
            "%s %s\n",
            model, sysconf(_SC_NPROCESSORS_ONLN), l2, l3, (double)mem_kb / (1024.0 * 1024.0), u.sysname, u.release);
    fprintf(f, "- transparent huge pages: %s (weights and bandwidth buffers ask for them with madvise)\n", thp);
    char sw[256];
    sd_backend_opts_describe(backend, sw, sizeof sw);
    fprintf(f,
            "- CPU kernels for stored weights: %s (--cpu-qpath, else the fastest this CPU has); backend switches: %s\n",
            sd_cpu_kernel_path(backend->cpu_qpath), sw[0] ? sw : "the defaults");
    fprintf(f, "- load average (1, 5, 15 min) before: %s; after: %s\n", load_before, load_after);
    char cpus[256];
    sd_hyg_affinity_text(cpus, sizeof cpus);
    fprintf(f, "- threads used: %d, on CPUs %s (process affinity; no thread pinned to one core)\n", n_threads, cpus);
}

/* ---- the model file's pages ---- */

/* Resident kB of the mappings of path in this process (the model's and
 * bw_map_file's: the same page cache folios), and how many of them the
 * kernel maps in 2 MiB pages (FilePmdMapped in /proc/self/smaps);
 * false when smaps cannot be read. Decode streams the weights from that
 * mapping, and the page cache's folio size is not the program's choice: a
 * file read from disk is cached in 2 MiB folios (ext4, Linux 6.18), one
 * written recently (a fresh quantizer output, a copy) or read back through
 * MADV_WILLNEED's readahead in 4 KiB ones, and a plain read of the two
 * runs at different rates (bench/results/quant-cpu.md, bw2), so the table
 * says which it got. */
static bool model_map_pages(const char *path, double *rss_kb, double *pmd_kb) {
    char want[4096];
    if (!realpath(path, want)) return false;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[4352];
    bool in_map = false;
    *rss_kb = *pmd_kb = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        unsigned long lo, hi;
        int name_at = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &name_at) == 2) {
            in_map = name_at > 0 && strcmp(line + name_at, want) == 0;
            continue;
        }
        double kb;
        if (!in_map) continue;
        if (sscanf(line, "Rss: %lf kB", &kb) == 1) *rss_kb += kb;
        if (sscanf(line, "FilePmdMapped: %lf kB", &kb) == 1) *pmd_kb += kb;
    }
    fclose(f);
    return true;
}

/* ---- forward mode ---- */

typedef struct fwd_opts {
    const char *model_path;
    const char *out_path;
    int n_threads;
    int reps;
    int prompt_len;
    int max_k;
    int decode_steps;
    int bw_mb;               /* size of each bandwidth buffer, MiB */
    double max_other;        /* cores other processes may use during a kept repetition (bench_hygiene.h) */
    sd_backend_opts backend; /* --cpu-weights, --cpu-qpath, ... (specd/backend_opts.h) */
} fwd_opts;

#define FWD_MAX_REPS   32
#define FWD_MAX_K      64
#define FWD_MAX_PROMPT 1024
#define FWD_MAX_DECODE 4096

/* Targets of the issue that asked for this benchmark. */
#define TARGET_DECODE_SHARE 0.60 /* decode weight bytes/s >= 60% of copy bandwidth */
#define TARGET_K8_RATIO     1.6  /* 8 tokens in one call <= 1.6x the cost of 1 */

/* Every figure, one value per repetition (medians are taken at the end). */
typedef struct fwd_samples {
    double read_bps[FWD_MAX_REPS];                 /* read-only pass, bytes read / s */
    double file_bps[FWD_MAX_REPS];                 /* the same pass over the model file's mapping (0: none) */
    double copied_bps[FWD_MAX_REPS];               /* memcpy, bytes copied / s */
    double prompt_s[FWD_MAX_REPS];                 /* prompt processing, seconds */
    double other[FWD_MAX_REPS];                    /* other processes' CPU use during the repetition, cores */
    int n_kept;                                    /* repetitions [0, n_kept) are the ones the figures use */
    int n_dirty;                                   /* repetitions over the limit (left out unless all were) */
    double other_median, other_max;                /* over all repetitions */
    double map_rss_kb, map_pmd_kb;                 /* the model file's mapping after the run (model_map_pages) */
    double step_s[FWD_MAX_REPS];                   /* decode: median step of this repetition */
    double k_s[FWD_MAX_K + 1][FWD_MAX_REPS];       /* k tokens in one call after the prompt, seconds */
    double k_short_s[FWD_MAX_K + 1][FWD_MAX_REPS]; /* the same after a SHORT_PREFIX-token prefix */
} fwd_samples;

/* The k-token calls are timed twice: after the whole prompt, and after its
 * first SHORT_PREFIX tokens. Attention over the prefix grows with k while
 * the weights are streamed once, so the difference between the two columns
 * is what attention adds to verification at that context length. */
#define SHORT_PREFIX 16

/* Runs n tokens of sequence 0 starting at position start; logits for the
 * last row only (last_only) or every row. Returns seconds, or -1. */
static double timed_forward(sd_model *m, sd_kv *kv, const int32_t *tokens, int n, int start, bool last_only,
                            float *logits) {
    int32_t pos[FWD_MAX_PROMPT], seq[FWD_MAX_PROMPT];
    bool want[FWD_MAX_PROMPT];
    if (n < 1 || n > FWD_MAX_PROMPT) return -1;
    for (int i = 0; i < n; i++) {
        pos[i] = start + i;
        seq[i] = 0;
        want[i] = !last_only || i == n - 1;
    }
    sd_batch b = {n, tokens, pos, seq, want};
    double t0 = sd_now();
    sd_status st = sd_model_forward(m, kv, &b, logits);
    double dt = sd_now() - t0;
    return st == SD_OK ? dt : -1;
}

/* Truncates sequence 0 to len; on a cache whose window group freed the
 * window of len (a rollback deeper than its slack, kv.h), the lost tokens
 * are fed again from tokens, untimed. */
static bool rewind_to(sd_model *m, sd_kv *kv, const int32_t *tokens, int len, float *logits) {
    if (sd_kv_truncate(kv, 0, len) != SD_OK) return false;
    int have = sd_kv_seq_len(kv, 0);
    return have == len || timed_forward(m, kv, tokens + have, len - have, have, true, logits) >= 0;
}

/* One repetition, every measure in turn (so that machine noise, which comes
 * and goes on a shared machine, falls on all of them alike and the ratios of
 * one repetition compare figures taken seconds apart): the bandwidth
 * passes, the prompt, the decode steps that follow it, then k = 1..max_k
 * tokens in one call after the prompt. Returns false on a failed forward. */
static bool forward_rep(const fwd_opts *o, int r, sd_model *m, sd_kv *kv, const int32_t *tokens, float *logits,
                        const bw_buffers *bw, int threads, double *step_scratch, fwd_samples *s) {
    int bw_threads = threads < 64 ? threads : 64;
    double covered = (double)(bw->n_floats / (size_t)bw_threads * (size_t)bw_threads * sizeof(float));
    double tr = bw_pass(bw->src, bw->dst, bw->n_floats, bw_threads, 0);
    double tc = bw_pass(bw->src, bw->dst, bw->n_floats, bw_threads, 1);
    if (tr <= 0 || tc <= 0) return false;
    s->read_bps[r] = covered / tr;
    s->file_bps[r] = 0;
    if (bw->file) {
        double tf = bw_pass(bw->file, bw->dst, bw->file_floats, bw_threads, 0); /* dst unused */
        if (tf > 0)
            s->file_bps[r] = (double)(bw->file_floats / (size_t)bw_threads * (size_t)bw_threads * sizeof(float)) / tf;
    }
    s->copied_bps[r] = covered / tc;

    sd_kv_release(kv, 0);
    if ((s->prompt_s[r] = timed_forward(m, kv, tokens, o->prompt_len, 0, true, logits)) < 0) return false;

    for (int i = 0; i < o->decode_steps; i++)
        if ((step_scratch[i] = timed_forward(m, kv, tokens + o->prompt_len + i, 1, o->prompt_len + i, true, logits)) <
            0)
            return false;
    s->step_s[r] = sd_bench_median(step_scratch, o->decode_steps);

    for (int k = 1; k <= o->max_k; k++) {
        if (!rewind_to(m, kv, tokens, o->prompt_len, logits)) return false;
        if ((s->k_s[k][r] = timed_forward(m, kv, tokens + o->prompt_len, k, o->prompt_len, false, logits)) < 0)
            return false;
    }
    int short_prefix = o->prompt_len < SHORT_PREFIX ? o->prompt_len : SHORT_PREFIX;
    for (int k = 1; k <= o->max_k; k++) {
        if (!rewind_to(m, kv, tokens, short_prefix, logits)) return false;
        if ((s->k_short_s[k][r] = timed_forward(m, kv, tokens + o->prompt_len, k, short_prefix, false, logits)) < 0)
            return false;
    }
    return true;
}

/* Median over repetitions of a per-repetition ratio num[r] / den[r] * scale. */
static double median_ratio(const double *num, const double *den, int reps, double scale) {
    double v[FWD_MAX_REPS];
    for (int r = 0; r < reps; r++) v[r] = den[r] > 0 ? scale * num[r] / den[r] : 0;
    return sd_bench_median(v, reps);
}

static double median_of(const double *x, int reps) {
    double v[FWD_MAX_REPS];
    memcpy(v, x, (size_t)reps * sizeof *v);
    return sd_bench_median(v, reps);
}

/* Moves the clean repetitions (other processes used at most o->max_other
 * cores) to the front and sets n_kept to their number; with none clean all
 * are kept. Dirty ones are left out of every figure, so that each
 * repetition's figures stay together (the ratios are per repetition). */
static void keep_clean_reps(const fwd_opts *o, fwd_samples *s) {
    sd_hyg_params hp = sd_hyg_default_params();
    hp.max_other_cores = o->max_other;
    double all[FWD_MAX_REPS];
    memcpy(all, s->other, (size_t)o->reps * sizeof *all);
    s->other_max = 0;
    for (int r = 0; r < o->reps; r++)
        if (s->other[r] > s->other_max) s->other_max = s->other[r];
    s->other_median = sd_bench_median(all, o->reps);
    int kept = 0;
    for (int r = 0; r < o->reps; r++) {
        if (!sd_hyg_clean(&hp, s->other[r])) continue;
        if (kept != r) {
            s->read_bps[kept] = s->read_bps[r];
            s->file_bps[kept] = s->file_bps[r];
            s->copied_bps[kept] = s->copied_bps[r];
            s->prompt_s[kept] = s->prompt_s[r];
            s->step_s[kept] = s->step_s[r];
            s->other[kept] = s->other[r];
            for (int k = 0; k <= FWD_MAX_K; k++) {
                s->k_s[k][kept] = s->k_s[k][r];
                s->k_short_s[k][kept] = s->k_short_s[k][r];
            }
        }
        kept++;
    }
    s->n_dirty = o->reps - kept;
    s->n_kept = kept > 0 ? kept : o->reps;
}

static void write_forward_table(FILE *f, const fwd_opts *o, const sd_model_config *cfg, double wbytes, int threads,
                                const char *load_before, const char *load_after, const fwd_samples *s) {
    int R = s->n_kept;
    time_t now = time(NULL);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%d", gmtime(&now));
    double read_bps = median_of(s->read_bps, R), copied_bps = median_of(s->copied_bps, R);
    double prompt_s = median_of(s->prompt_s, R), step_s = median_of(s->step_s, R);
    double stream_bps[FWD_MAX_REPS], decode_bps[FWD_MAX_REPS];
    for (int r = 0; r < R; r++) {
        stream_bps[r] = 2.0 * s->copied_bps[r];
        decode_bps[r] = s->step_s[r] > 0 ? wbytes / s->step_s[r] : 0;
    }
    double share_copy = median_ratio(decode_bps, stream_bps, R, 1.0);
    double share_copied = median_ratio(decode_bps, s->copied_bps, R, 1.0);
    double share_read = median_ratio(decode_bps, s->read_bps, R, 1.0);
    double share_file = median_ratio(decode_bps, s->file_bps, R, 1.0), file_bps = median_of(s->file_bps, R);

    fprintf(f, "# specd-bench forward — %s\n\n", day);
    fprintf(f, "- model: %s (%d layers, dim %d, vocab %d), weights streamed per token as the CPU holds them: %.1f MB\n",
            o->model_path, cfg->n_layers, cfg->n_embd, cfg->n_vocab, wbytes / 1e6);
    describe_machine(f, threads, &o->backend, load_before, load_after);
    if (s->map_rss_kb > 0)
        fprintf(f,
                "- model file's pages after the run: %.0f%% of the resident ones mapped in 2 MiB pages (the page "
                "cache's folios; the rest in 4 KiB pages)\n",
                100.0 * s->map_pmd_kb / s->map_rss_kb);
    fprintf(f,
            "- %d repetitions, each running every measure in turn (bandwidth, %d-token prompt, %d decode steps, "
            "k = 1..%d); figures are medians over repetitions, ratios are medians of per-repetition ratios\n\n",
            R, o->prompt_len, o->decode_steps, o->max_k);
    if (s->n_dirty == o->reps)
        fprintf(f,
                "- hygiene: other processes used more than %.2f of a core during every repetition (median %.2f, "
                "max %.2f cores): all kept, and these figures are unreliable\n\n",
                o->max_other, s->other_median, s->other_max);
    else
        fprintf(f,
                "- hygiene: other processes' CPU use during a repetition, median %.2f, max %.2f cores; %d of %d "
                "repetitions over %.2f of a core left out\n\n",
                s->other_median, s->other_max, s->n_dirty, o->reps, o->max_other);
    fprintf(f, "| measure | value |\n| --- | --- |\n");
    fprintf(f, "| memory read bandwidth (read-only pass, %d MiB) | %.2f GB/s |\n", o->bw_mb, read_bps / 1e9);
    fprintf(f, "| memory copy bandwidth, read + write bytes (STREAM convention; memcpy of %d MiB) | %.2f GB/s |\n",
            o->bw_mb, 2.0 * copied_bps / 1e9);
    fprintf(f, "| memory copy, bytes copied per second | %.2f GB/s |\n", copied_bps / 1e9);
    fprintf(f, "| prompt processing, %d tokens | %.1f tok/s |\n", o->prompt_len, o->prompt_len / prompt_s);
    fprintf(f, "| decode at batch 1 | %.2f ms/token, %.1f tok/s |\n", step_s * 1e3, 1.0 / step_s);
    fprintf(f, "| decode weight streaming | %.2f GB/s |\n", wbytes / step_s / 1e9);
    fprintf(f, "| decode / copy bandwidth (read + write) | %.0f%% |\n", 100.0 * share_copy);
    fprintf(f, "| decode / bytes copied per second | %.0f%% |\n", 100.0 * share_copied);
    fprintf(f, "| decode / read bandwidth | %.0f%% |\n", 100.0 * share_read);
    if (file_bps > 0)
        fprintf(f,
                "| read-only pass over the model file's own pages (its page cache, as mapped) | %.2f GB/s |\n"
                "| decode / that pass | %.0f%% |\n",
                file_bps / 1e9, 100.0 * share_file);
    fprintf(f, "\n");
    int short_prefix = o->prompt_len < SHORT_PREFIX ? o->prompt_len : SHORT_PREFIX;
    fprintf(f,
            "Cost of k new tokens of one sequence in one call (logits for every row), after a %d-token "
            "prefix and after a %d-token prefix:\n\n"
            "| k | ms, prefix %d | relative to k = 1 | ms, prefix %d | relative to k = 1 |\n"
            "| --- | --- | --- | --- | --- |\n",
            o->prompt_len, short_prefix, o->prompt_len, short_prefix);
    for (int k = 1; k <= o->max_k; k++)
        fprintf(f, "| %d | %.2f | %.2f | %.2f | %.2f |\n", k, median_of(s->k_s[k], R) * 1e3,
                median_ratio(s->k_s[k], s->k_s[1], R, 1.0), median_of(s->k_short_s[k], R) * 1e3,
                median_ratio(s->k_short_s[k], s->k_short_s[1], R, 1.0));
    fprintf(f, "\nTargets: decode >= %.0f%% of copy bandwidth (read + write): %.0f%%, %s", 100.0 * TARGET_DECODE_SHARE,
            100.0 * share_copy, share_copy >= TARGET_DECODE_SHARE ? "met" : "MISSED");
    if (o->max_k >= 8) {
        double k8 = median_ratio(s->k_s[8], s->k_s[1], R, 1.0);
        double k8_short = median_ratio(s->k_short_s[8], s->k_short_s[1], R, 1.0);
        fprintf(f, "; 8 tokens in one call <= %.1fx the cost of 1: %.2fx after %d tokens, %s (%.2fx after %d)",
                TARGET_K8_RATIO, k8, o->prompt_len, k8 <= TARGET_K8_RATIO ? "met" : "MISSED", k8_short, short_prefix);
    }
    fprintf(f, ".\n");
}

static int bench_forward(const fwd_opts *o) {
    char err[512] = "", load_before[64], load_after[64];
    sd_gguf *g = NULL;
    sd_model *m = NULL;
    sd_kv *kv = NULL;
    bw_buffers bw = {0};
    fwd_samples *s = NULL;
    int rc = 1;
    read_loadavg(load_before, sizeof load_before);
    if (sd_gguf_open(o->model_path, &g, err, sizeof err) != SD_OK) {
        fprintf(stderr, "specd-bench: cannot open %s: %s\n", o->model_path, err);
        return 1;
    }
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = o->n_threads;
    mp.backend = o->backend;
    if (sd_model_load(g, &mp, &m) != SD_OK) {
        fprintf(stderr, "specd-bench: cannot load %s (see the log above)\n", o->model_path);
        sd_gguf_close(&g);
        return 1;
    }
    sd_gguf_close(&g);
    const sd_model_config *cfg = sd_model_config_of(m);
    int threads = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int ctx = o->prompt_len + o->decode_steps + o->max_k + 16;
    float *logits = malloc(((size_t)o->max_k + 1) * (size_t)cfg->n_vocab * sizeof(float));
    int32_t *tokens = malloc((size_t)ctx * sizeof *tokens);
    double *step_scratch = malloc((size_t)o->decode_steps * sizeof *step_scratch);
    s = calloc(1, sizeof *s);
    if (!logits || !tokens || !step_scratch || !s) goto done;
    if (!bw_alloc(&bw, (size_t)o->bw_mb)) {
        fprintf(stderr, "specd-bench: cannot allocate two %d MiB bandwidth buffers\n", o->bw_mb);
        goto done;
    }
    bw_map_file(&bw, o->model_path);
    if (sd_model_kv_create(m, 1, ctx / 16 + 2, 16, &kv) != SD_OK) goto done;
    /* Deterministic pseudo-random token ids stand in for text: the cost of a
     * forward pass does not depend on which ids they are. */
    uint32_t x = 12345;
    for (int i = 0; i < ctx; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (int32_t)(x % (uint32_t)cfg->n_vocab);
    }
    /* One untimed warm-up repetition: first-touch of the KV pool and scratch,
     * thread pool start. */
    if (!forward_rep(o, 0, m, kv, tokens, logits, &bw, threads, step_scratch, s)) goto done;
    for (int r = 0; r < o->reps; r++) {
        fprintf(stderr, "specd-bench: repetition %d/%d\n", r + 1, o->reps);
        sd_hyg_mark h0 = sd_hyg_now(NULL);
        if (!forward_rep(o, r, m, kv, tokens, logits, &bw, threads, step_scratch, s)) goto done;
        sd_hyg_mark h1 = sd_hyg_now(NULL);
        s->other[r] = sd_hyg_other_cores(&h0, &h1);
    }
    keep_clean_reps(o, s);
    read_loadavg(load_after, sizeof load_after);
    if (!model_map_pages(o->model_path, &s->map_rss_kb, &s->map_pmd_kb)) s->map_rss_kb = 0;

    double wbytes = (double)sd_model_weight_bytes(m);
    write_forward_table(stdout, o, cfg, wbytes, threads, load_before, load_after, s);
    if (o->out_path) {
        FILE *f = fopen(o->out_path, "w");
        if (!f) {
            fprintf(stderr, "specd-bench: cannot write %s: %s\n", o->out_path, strerror(errno));
            goto done;
        }
        write_forward_table(f, o, cfg, wbytes, threads, load_before, load_after, s);
        if (fclose(f) != 0) {
            fprintf(stderr, "specd-bench: cannot write %s: %s\n", o->out_path, strerror(errno));
            goto done;
        }
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "specd-bench: forward benchmark failed (see the log above)\n");
    sd_kv_free(&kv);
    sd_model_free(&m);
    bw_free(&bw);
    free(s);
    free(step_scratch);
    free(tokens);
    free(logits);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-bench MODE [options]\n"
            "\n"
            "modes:\n"
            "  forward   prompt tok/s, decode tok/s, k-token call cost, bandwidth share\n"
            "  spec      plain vs speculative decoding on bench/prompts/ (spec --help)\n"
            "  gpu       one model on a CUDA GPU: decode vs bandwidth floor, k-token cost, batches (gpu --help)\n"
            "  serve     through the running service: tok/s, latency, spec vs target-only (serve --help)\n"
            "  http      through the HTTP gateway vs libspecd-client: time to first token, gaps (http --help)\n"
            "  link      round trips on a specd link, plaintext and CurveZMQ side by side (link --help)\n"
            "  window    decode at 4k context: a sliding-window model vs a global one, KV memory (window --help)\n"
            "  tp        a CPU tensor-parallel verifier group vs TP = 1: decode, verify, all-reduce cost (tp --help)\n"
            "\n"
            "every mode:\n"
            "      --cpus LIST       run on these CPUs only (for example 0-1), with everything specd-bench starts;\n"
            "                        give a peer the same set (bench/lookup_side_by_side.py --cpus)\n"
            "\n"
            "forward options:\n"
            "  -m, --model FILE      GGUF model (required)\n"
            "  -t, --threads N       worker threads (default: all cores)\n"
            "  -r, --reps N          repetitions per figure (default 7)\n"
            "      --max-other-load C  leave out repetitions during which other processes used more than C\n"
            "                        cores (default 0.25; all are kept if none is under)\n"
            "      --prompt-len N    prompt length for prompt processing (default 512)\n"
            "      --max-k N         largest k for the k-token call cost (default 16)\n"
            "      --decode-steps N  decode steps timed (default 64)\n"
            "      --bw-mb N         size of each bandwidth buffer in MiB (default %d; far above the L3)\n"
            "  -o, --out FILE        also write the table (markdown) to FILE\n"
            "  -h, --help            this help\n"
            "\nforward and gpu: " SD_BACKEND_OPTIONS_USAGE,
            BW_DEFAULT_MB);
}

/* Parses a whole decimal integer in [lo, hi] from text into *out. */
static bool parse_int(const char *name, const char *text, long lo, long hi, int *out) {
    if (sd_cli_parse_int(text, (int)lo, (int)hi, out)) return true;
    fprintf(stderr, "specd-bench: %s wants an integer in %ld..%ld, not '%s'\n", name, lo, hi, text);
    return false;
}

/* --cpus LIST, in any mode: keeps specd-bench and everything it starts
 * (the service's processes, the ranks) to these CPUs, the same set a peer
 * compared with it is given (bench/lookup_side_by_side.py --cpus). Taken
 * out of argv before the mode parses its own options. */
static bool take_cpus_option(int *argc, char **argv) {
    for (int i = 2; i < *argc; i++) {
        const char *list = NULL;
        int used = 1;
        if (strcmp(argv[i], "--cpus") == 0) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "specd-bench: --cpus needs a CPU list (for example 0-1)\n");
                return false;
            }
            list = argv[i + 1];
            used = 2;
        } else if (strncmp(argv[i], "--cpus=", 7) == 0) {
            list = argv[i] + 7;
        } else {
            continue;
        }
        if (!sd_hyg_pin_cpus(list)) return false;
        memmove(argv + i, argv + i + used, (size_t)(*argc - i - used + 1) * sizeof *argv);
        *argc -= used;
        i--;
    }
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!take_cpus_option(&argc, argv)) return 2;
    const char *mode = argv[1];
    if (strcmp(mode, "spec") == 0) return bench_spec_main(argc, argv);
    if (strcmp(mode, "gpu") == 0) return bench_gpu_main(argc, argv);
    if (strcmp(mode, "link") == 0) return bench_link_main(argc, argv);
    if (strcmp(mode, "window") == 0) return bench_window_main(argc, argv);
#ifdef SPECD_BENCH_SERVE
    if (strcmp(mode, "serve") == 0) return bench_serve_main(argc, argv);
#endif
#ifdef SPECD_BENCH_HTTP
    if (strcmp(mode, "http") == 0) return bench_http_main(argc, argv);
#endif
#ifdef SPECD_BENCH_TP
    if (strcmp(mode, "tp") == 0) return bench_tp_main(argc, argv);
#endif
    if (strcmp(mode, "forward") != 0) {
        fprintf(stderr, "specd-bench: unknown mode '%s' (see --help)\n", mode);
        return 2;
    }
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"threads", required_argument, 0, 't'},
                                          {"reps", required_argument, 0, 'r'},
                                          {"prompt-len", required_argument, 0, 'P'},
                                          {"max-k", required_argument, 0, 'K'},
                                          {"decode-steps", required_argument, 0, 'D'},
                                          {"out", required_argument, 0, 'o'},
                                          {"bw-mb", required_argument, 0, 'B'},
                                          {"max-other-load", required_argument, 0, 'X'},
                                          {"help", no_argument, 0, 'h'},
                                          SD_BACKEND_LONG_OPTIONS,
                                          {0, 0, 0, 0}};
    fwd_opts o = {.reps = 7,
                  .prompt_len = 512,
                  .max_k = 16,
                  .decode_steps = 64,
                  .bw_mb = BW_DEFAULT_MB,
                  .max_other = SD_HYG_DEFAULT_MAX_OTHER,
                  .backend = sd_backend_default_opts()};
    int c, li = 0;
    bool ok = true;
    optind = 2;
    while (ok && (c = getopt_long(argc, argv, "m:t:r:o:h", longs, &li)) != -1) {
        switch (c) {
        case SD_BACKEND_OPTION: ok = sd_backend_opts_parse(&o.backend, longs[li].name, optarg, "specd-bench"); break;
        case 'm': o.model_path = optarg; break;
        case 't': ok = parse_int("--threads", optarg, 0, 256, &o.n_threads); break;
        case 'r': ok = parse_int("--reps", optarg, 1, FWD_MAX_REPS, &o.reps); break;
        case 'P': ok = parse_int("--prompt-len", optarg, 1, FWD_MAX_PROMPT, &o.prompt_len); break;
        case 'K': ok = parse_int("--max-k", optarg, 1, FWD_MAX_K, &o.max_k); break;
        case 'D': ok = parse_int("--decode-steps", optarg, 1, FWD_MAX_DECODE, &o.decode_steps); break;
        case 'B': ok = parse_int("--bw-mb", optarg, 2, 16384, &o.bw_mb); break;
        case 'o': o.out_path = optarg; break;
        case 'X':
            o.max_other = atof(optarg);
            ok = o.max_other > 0;
            if (!ok) fprintf(stderr, "specd-bench: --max-other-load must be > 0 cores\n");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!ok) return 2;
    if (!o.model_path) {
        fprintf(stderr, "specd-bench: forward needs -m MODEL (see --help)\n");
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "bench");
    return bench_forward(&o);
}
