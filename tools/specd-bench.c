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
 *
 * Every figure is a median over repetitions, and ratios are taken between
 * figures measured side by side in one run: the machines are shared and
 * noisy, so absolute numbers from different runs are not compared. The
 * bandwidth reference is measured with as many threads as the model uses:
 * a read-only pass (what decode does with weights) and memcpy (STREAM's
 * "copy", counting bytes read plus bytes written). */
#include "bench_gpu.h"
#include "bench_spec.h"
#ifdef SPECD_BENCH_SERVE
#include "bench_serve.h"
#endif
#ifdef SPECD_BENCH_TP
#include "bench_tp.h"
#endif
#include "specd/common.h"
#include "specd/gguf.h"
#include "specd/model.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ---- small statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts v in place). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- memory bandwidth reference ---- */

typedef struct bw_job {
    const float *src;
    float *dst;
    size_t n;       /* floats in this thread's slice */
    double sink;    /* keeps the read pass from being optimized away */
    int copy;       /* 1: memcpy, 0: read-only sum */
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

/* One timed pass over bytes with n_threads; returns seconds. */
static double bw_pass(const float *src, float *dst, size_t n_floats, int n_threads, int copy) {
    pthread_t th[64];
    bw_job jobs[64];
    if (n_threads > 64) n_threads = 64;
    size_t per = n_floats / (size_t)n_threads;
    double t0 = sd_now();
    for (int t = 0; t < n_threads; t++) {
        jobs[t] = (bw_job){src + per * (size_t)t, dst + per * (size_t)t, per, 0, copy};
        pthread_create(&th[t], NULL, bw_worker, &jobs[t]);
    }
    for (int t = 0; t < n_threads; t++) pthread_join(th[t], NULL);
    return sd_now() - t0;
}

/* Median read and copy bandwidth in bytes/s over a buffer far larger than
 * the caches. Copy counts read + write bytes (STREAM convention). */
static void measure_bandwidth(int n_threads, int reps, double *read_bps, double *copy_bps) {
    const size_t bytes = (size_t)1 << 30;
    size_t n = bytes / sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        *read_bps = *copy_bps = 0;
        return;
    }
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023), b[i] = 0;
    double tr[32], tc[32];
    if (reps > 32) reps = 32;
    for (int r = 0; r < reps; r++) {
        tr[r] = bw_pass(a, b, n, n_threads, 0);
        tc[r] = bw_pass(a, b, n, n_threads, 1);
    }
    *read_bps = (double)bytes / median(tr, reps);
    *copy_bps = 2.0 * (double)bytes / median(tc, reps);
    free(a);
    free(b);
}

/* ---- machine description ---- */

static void describe_machine(FILE *f, int n_threads) {
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
    struct utsname u;
    uname(&u);
    fprintf(f, "- machine: %s, %ld online cores, %.1f GiB RAM, %s %s\n", model, sysconf(_SC_NPROCESSORS_ONLN),
            (double)mem_kb / (1024.0 * 1024.0), u.sysname, u.release);
    fprintf(f, "- threads used: %d\n", n_threads);
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
} fwd_opts;

/* Runs n tokens of sequence 0 starting at position start; logits for the
 * last row only (last_only) or every row. Returns seconds, or -1. */
static double timed_forward(sd_model *m, sd_kv *kv, const int32_t *tokens, int n, int start, bool last_only,
                            float *logits) {
    int32_t pos[1024], seq[1024];
    bool want[1024];
    if (n > 1024) return -1;
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

static int bench_forward(const fwd_opts *o) {
    char err[512] = "";
    sd_gguf *g = NULL;
    sd_model *m = NULL;
    sd_kv *kv = NULL;
    int rc = 1;
    if (sd_gguf_open(o->model_path, &g, err, sizeof err) != SD_OK) {
        fprintf(stderr, "specd-bench: cannot open %s: %s\n", o->model_path, err);
        return 1;
    }
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = o->n_threads;
    if (sd_model_load(g, &mp, &m) != SD_OK) {
        fprintf(stderr, "specd-bench: cannot load %s (see the log above)\n", o->model_path);
        sd_gguf_close(&g);
        return 1;
    }
    sd_gguf_close(&g);
    const sd_model_config *cfg = sd_model_config_of(m);
    int threads = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int ctx = o->prompt_len + o->decode_steps + o->max_k + 16;
    float *logits = malloc((size_t)o->max_k * (size_t)cfg->n_vocab * sizeof(float) +
                           (size_t)cfg->n_vocab * sizeof(float));
    int32_t *tokens = malloc((size_t)ctx * sizeof *tokens);
    double *t = malloc(sizeof(double) * (size_t)(o->reps > o->decode_steps ? o->reps : o->decode_steps));
    double k_cost[65] = {0};
    if (!logits || !tokens || !t || o->max_k > 64) goto done;
    if (sd_model_kv_create(m, 1, ctx / 16 + 2, 16, &kv) != SD_OK) goto done;
    /* Deterministic pseudo-random token ids stand in for text: the cost of a
     * forward pass does not depend on which ids they are. */
    uint32_t x = 12345;
    for (int i = 0; i < ctx; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (int32_t)(x % (uint32_t)cfg->n_vocab);
    }

    fprintf(stderr, "specd-bench: measuring memory bandwidth...\n");
    double read_bps, copy_bps;
    measure_bandwidth(threads, o->reps, &read_bps, &copy_bps);

    fprintf(stderr, "specd-bench: prompt processing (%d tokens)...\n", o->prompt_len);
    for (int r = 0; r < o->reps; r++) {
        sd_kv_release(kv, 0);
        if ((t[r] = timed_forward(m, kv, tokens, o->prompt_len, 0, true, logits)) < 0) goto done;
    }
    double prompt_s = median(t, o->reps);

    fprintf(stderr, "specd-bench: decode (%d steps)...\n", o->decode_steps);
    for (int i = 0; i < o->decode_steps; i++)
        if ((t[i] = timed_forward(m, kv, tokens + o->prompt_len + i, 1, o->prompt_len + i, true, logits)) < 0)
            goto done;
    double step_s = median(t, o->decode_steps);

    fprintf(stderr, "specd-bench: k tokens in one call (k = 1..%d)...\n", o->max_k);
    for (int k = 1; k <= o->max_k; k++) {
        for (int r = 0; r < o->reps; r++) {
            if (sd_kv_truncate(kv, 0, o->prompt_len) != SD_OK) goto done;
            if ((t[r] = timed_forward(m, kv, tokens + o->prompt_len, k, o->prompt_len, false, logits)) < 0)
                goto done;
        }
        k_cost[k] = median(t, o->reps);
    }

    double wbytes = (double)sd_model_weight_bytes(m);
    FILE *outs[2] = {stdout, NULL};
    if (o->out_path && !(outs[1] = fopen(o->out_path, "w"))) {
        fprintf(stderr, "specd-bench: cannot write %s: %s\n", o->out_path, strerror(errno));
        goto done;
    }
    for (int i = 0; i < 2 && outs[i]; i++) {
        FILE *f = outs[i];
        time_t now = time(NULL);
        char day[32];
        strftime(day, sizeof day, "%Y-%m-%d", gmtime(&now));
        fprintf(f, "# specd-bench forward — %s\n\n", day);
        fprintf(f, "- model: %s (%d layers, dim %d, vocab %d), weights as f32: %.1f MB\n", o->model_path,
                cfg->n_layers, cfg->n_embd, cfg->n_vocab, wbytes / 1e6);
        describe_machine(f, threads);
        fprintf(f, "- medians over %d repetitions (%d decode steps)\n\n", o->reps, o->decode_steps);
        fprintf(f, "| measure | value |\n| --- | --- |\n");
        fprintf(f, "| memory read bandwidth | %.2f GB/s |\n", read_bps / 1e9);
        fprintf(f, "| memory copy bandwidth (read + write) | %.2f GB/s |\n", copy_bps / 1e9);
        fprintf(f, "| prompt processing, %d tokens | %.1f tok/s |\n", o->prompt_len, o->prompt_len / prompt_s);
        fprintf(f, "| decode at batch 1 | %.2f ms/token, %.1f tok/s |\n", step_s * 1e3, 1.0 / step_s);
        fprintf(f, "| decode weight streaming | %.2f GB/s |\n", wbytes / step_s / 1e9);
        fprintf(f, "| decode / read bandwidth | %.0f%% |\n", 100.0 * wbytes / step_s / read_bps);
        fprintf(f, "| decode / copy bandwidth | %.0f%% |\n\n", 100.0 * wbytes / step_s / copy_bps);
        fprintf(f, "Cost of k new tokens of one sequence in one call (logits for every row), after a %d-token "
                   "prefix:\n\n| k | ms | relative to k = 1 |\n| --- | --- | --- |\n",
                o->prompt_len);
        for (int k = 1; k <= o->max_k; k++)
            fprintf(f, "| %d | %.2f | %.2f |\n", k, k_cost[k] * 1e3, k_cost[k] / k_cost[1]);
        if (f != stdout) fclose(f);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "specd-bench: forward benchmark failed (see the log above)\n");
    sd_kv_free(&kv);
    sd_model_free(&m);
    free(t);
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
            "  tp        a CPU tensor-parallel verifier group vs TP = 1: decode, verify, all-reduce cost (tp --help)\n"
            "\n"
            "forward options:\n"
            "  -m, --model FILE      GGUF model (required)\n"
            "  -t, --threads N       worker threads (default: all cores)\n"
            "  -r, --reps N          repetitions per figure (default 7)\n"
            "      --prompt-len N    prompt length for prompt processing (default 512)\n"
            "      --max-k N         largest k for the k-token call cost (default 16)\n"
            "      --decode-steps N  decode steps timed (default 64)\n"
            "  -o, --out FILE        also write the table (markdown) to FILE\n"
            "  -h, --help            this help\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "spec") == 0) return bench_spec_main(argc, argv);
    if (strcmp(mode, "gpu") == 0) return bench_gpu_main(argc, argv);
#ifdef SPECD_BENCH_SERVE
    if (strcmp(mode, "serve") == 0) return bench_serve_main(argc, argv);
#endif
#ifdef SPECD_BENCH_TP
    if (strcmp(mode, "tp") == 0) return bench_tp_main(argc, argv);
#endif
    if (strcmp(mode, "forward") != 0) {
        fprintf(stderr, "specd-bench: unknown mode '%s' (see --help)\n", mode);
        return 2;
    }
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},       {"threads", required_argument, 0, 't'},
        {"reps", required_argument, 0, 'r'},        {"prompt-len", required_argument, 0, 'P'},
        {"max-k", required_argument, 0, 'K'},       {"decode-steps", required_argument, 0, 'D'},
        {"out", required_argument, 0, 'o'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    fwd_opts o = {.reps = 7, .prompt_len = 512, .max_k = 16, .decode_steps = 64};
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "m:t:r:o:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o.model_path = optarg; break;
        case 't': o.n_threads = atoi(optarg); break;
        case 'r': o.reps = atoi(optarg); break;
        case 'P': o.prompt_len = atoi(optarg); break;
        case 'K': o.max_k = atoi(optarg); break;
        case 'D': o.decode_steps = atoi(optarg); break;
        case 'o': o.out_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o.model_path || o.reps < 1 || o.reps > 32 || o.prompt_len < 1 || o.prompt_len > 1024 || o.max_k < 1 ||
        o.max_k > 64 || o.decode_steps < 1 || o.decode_steps > 4096 || o.n_threads < 0) {
        fprintf(stderr, "specd-bench: need -m MODEL; reps 1..32, prompt-len 1..1024, max-k 1..64, "
                        "decode-steps 1..4096\n");
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "bench");
    return bench_forward(&o);
}
