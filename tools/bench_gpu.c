/* bench_gpu.c — `specd-bench gpu`: one model on a CUDA device.
 *
 * Measured in one run, so that ratios compare figures taken side by side:
 *   - the device's copy bandwidth (cudaMemcpy device to device of 1 GiB,
 *     bytes read plus bytes written, median of repetitions timed with
 *     events) and from it the decode floor: weight bytes streamed per step
 *     (BF16 matrices, f32 embedding row) / copy bandwidth;
 *   - decode at batch 1 (one token per call after a prompt, logits
 *     downloaded every step as a real decode does), its median step against
 *     the floor;
 *   - the cost of k new tokens of one sequence in one call, k = 1..max_k,
 *     relative to k = 1 (what verifying k - 1 drafts costs);
 *   - prompt processing of a prompt_len-token prompt;
 *   - throughput at batch B: B sequences, each with a ctx-token prefix,
 *     each advancing one token per call (B tokens a forward).
 * Steps are timed on the host around sd_model_forward, which returns when
 * the logits are on the host: the time a caller sees. Token ids are
 * pseudo-random: the cost does not depend on them. Hygiene
 * (bench_hygiene.h): one forward is shorter than the CPU counters' tick,
 * so the other processes' CPU use is sampled over each measured block
 * (prompt, decode, k-costs, each batch); a block over --max-other-load
 * cores is marked NOISY in the table rather than dropped (its figure is a
 * median of that block alone). */
#include "bench_gpu.h"
#include "specd/cli.h"
#include "bench_hygiene.h"
#include "bench_stats.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/backend_opts.h"

#ifdef SPECD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define MAX_BATCHES 8
#define MAX_K       16

typedef struct gpu_opts {
    const char *model_path;
    const char *out_path;
    int32_t device;
    int reps;
    int decode_steps;
    int prompt_len;
    int ctx;
    int max_k;
    int n_batches;
    int batches[MAX_BATCHES];
    double max_other;        /* cores other processes may use during a block before it is marked NOISY */
    sd_backend_opts backend; /* --cuda-graphs, --cuda-mma, ... (specd/backend_opts.h) */
} gpu_opts;

/* " NOISY" when other processes used more than the limit during a block. */
static const char *noisy(const gpu_opts *o, double other_cores) {
    sd_hyg_params p = sd_hyg_default_params();
    p.max_other_cores = o->max_other;
    return sd_hyg_clean(&p, other_cores) ? "" : " NOISY";
}

#ifdef SPECD_HAVE_CUDA
/* Device copy bandwidth in bytes/s (read + write), or -1. */
static double copy_bandwidth(int32_t device, int reps, char *name, size_t name_cap) {
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = malloc(sizeof(double) * (size_t)reps), result = -1;
    struct cudaDeviceProp prop;
    if (!t || cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
        cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    snprintf(name, name_cap, "%.200s, %d multiprocessors, %.0f GiB", prop.name, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / 1073741824.0);
    cudaMemset(a, 0x3c, bytes); /* not zeros */
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, 0);
        cudaMemcpy(r % 2 ? a : b, r % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t[r] = ms * 1e-3;
    }
    if (cudaGetLastError() == cudaSuccess) result = 2.0 * (double)bytes / sd_bench_median(t, reps);
out:
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(t);
    return result;
}
#endif

/* Runs n_seqs sequences x per_seq new tokens each (sequence s at positions
 * start[s]..), logits for every row (all_rows) or each sequence's last row.
 * logits holds as many rows. Seconds, or -1. */
static double timed_step(sd_model *m, sd_kv *kv, int n_seqs, int per_seq, const int32_t *start, const int32_t *ids,
                         bool all_rows, float *logits) {
    int n = n_seqs * per_seq;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = malloc(sizeof(int32_t) * (size_t)n);
    bool *want = malloc(sizeof(bool) * (size_t)n);
    double dt = -1;
    if (pos && seq && want) {
        for (int s = 0; s < n_seqs; s++)
            for (int i = 0; i < per_seq; i++) {
                int t = s * per_seq + i;
                pos[t] = start[s] + i;
                seq[t] = s;
                want[t] = all_rows || i == per_seq - 1;
            }
        sd_batch b = {n, ids, pos, seq, want};
        double t0 = sd_now();
        if (sd_model_forward(m, kv, &b, logits) == SD_OK) dt = sd_now() - t0;
    }
    free(pos), free(seq), free(want);
    return dt;
}

/* The blocks whose other-process CPU use is sampled (hygiene). */
enum { HYG_PROMPT, HYG_DECODE, HYG_K, HYG_BATCH0, N_HYG = HYG_BATCH0 + MAX_BATCHES };

/* What one run measured: the report's figures. */
typedef struct gpu_results {
    char dev_name[256];
    double copy_bps; /* device copy bandwidth, bytes/s (read + write) */
    double t_load;   /* seconds to load the model */
    double prompt_s, step_s;
    double k_cost[MAX_K + 1];
    double batch_tps[MAX_BATCHES];
    double hyg[N_HYG]; /* other processes' cores during each block */
} gpu_results;

/* The loaded model with its cache and the buffers every block shares. */
typedef struct gpu_bench {
    const gpu_opts *o;
    sd_model *m;
    sd_kv *kv;
    const sd_model_config *cfg;
    int max_b;     /* the largest batch */
    int n_ids;     /* pseudo-random token ids in ids */
    int32_t *ids;  /* owned */
    float *logits; /* owned: max(max_b, max_k) rows */
    double *t;     /* owned: max(reps, decode_steps) step times */
    int32_t start[256];
} gpu_bench;

/* Sizes the buffers and the KV cache for every block of the run and fills
 * the token ids. False when an allocation fails (the caller frees). */
static bool bench_setup(gpu_bench *b) {
    const gpu_opts *o = b->o;
    b->max_b = 1;
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] > b->max_b) b->max_b = o->batches[i];
    const int rows = b->max_b > o->max_k ? b->max_b : o->max_k;
    int seq_len = (o->prompt_len > o->ctx ? o->prompt_len : o->ctx) + o->decode_steps + o->max_k + 16;
    b->n_ids = seq_len * rows + o->prompt_len;
    b->ids = malloc(sizeof(int32_t) * (size_t)b->n_ids);
    b->logits = malloc(sizeof(float) * (size_t)b->cfg->n_vocab * (size_t)rows);
    int n_t = o->reps > o->decode_steps ? o->reps : o->decode_steps;
    b->t = malloc(sizeof(double) * (size_t)n_t);
    if (!b->ids || !b->logits || !b->t || b->max_b > 256) return false;
    uint32_t x = 12345;
    for (int i = 0; i < b->n_ids; i++) {
        x = x * 1664525u + 1013904223u;
        b->ids[i] = (int32_t)(x % (uint32_t)b->cfg->n_vocab);
    }
    int blocks_per_seq = seq_len / 16 + 2;
    return sd_model_kv_create(b->m, b->max_b, blocks_per_seq * b->max_b, 16, &b->kv) == SD_OK;
}

/* Prompt processing, then decode at batch 1 continuing it; *h0 is the
 * hygiene mark the prompt block starts at, moved to the end of decode. */
static bool measure_prompt_decode(gpu_bench *b, gpu_results *res, sd_hyg_mark *h0) {
    const gpu_opts *o = b->o;
    fprintf(stderr, "specd-bench gpu: prompt processing (%d tokens)...\n", o->prompt_len);
    b->start[0] = 0;
    for (int r = 0; r < o->reps + 1; r++) { /* the first run warms up */
        sd_kv_release(b->kv, 0);
        double dt = timed_step(b->m, b->kv, 1, o->prompt_len, b->start, b->ids, false, b->logits);
        if (dt < 0) return false;
        if (r) b->t[r - 1] = dt;
    }
    res->prompt_s = sd_bench_median(b->t, o->reps);
    sd_hyg_mark h1 = sd_hyg_now(NULL);
    res->hyg[HYG_PROMPT] = sd_hyg_other_cores(h0, &h1);
    *h0 = h1;
    fprintf(stderr, "specd-bench gpu: decode (%d steps)...\n", o->decode_steps);
    for (int i = -2; i < o->decode_steps; i++) { /* 2 warm-up steps (the recording) */
        b->start[0] = sd_kv_seq_len(b->kv, 0);
        double dt = timed_step(b->m, b->kv, 1, 1, b->start, b->ids + o->prompt_len + i + 2, false, b->logits);
        if (dt < 0) return false;
        if (i >= 0) b->t[i] = dt;
    }
    res->step_s = sd_bench_median(b->t, o->decode_steps);
    h1 = sd_hyg_now(NULL);
    res->hyg[HYG_DECODE] = sd_hyg_other_cores(h0, &h1);
    *h0 = h1;
    return true;
}

/* The cost of k = 1..max_k new tokens of sequence 0 in one call, each
 * from the same cached prefix; the hygiene block runs from *h0. */
static bool measure_k_costs(gpu_bench *b, gpu_results *res, const sd_hyg_mark *h0) {
    const gpu_opts *o = b->o;
    fprintf(stderr, "specd-bench gpu: k tokens in one call (k = 1..%d)...\n", o->max_k);
    int base = sd_kv_seq_len(b->kv, 0);
    for (int k = 1; k <= o->max_k; k++) {
        for (int r = -2; r < o->reps; r++) {
            if (sd_kv_truncate(b->kv, 0, base) != SD_OK) return false;
            b->start[0] = base;
            double dt = timed_step(b->m, b->kv, 1, k, b->start, b->ids + base, true, b->logits);
            if (dt < 0) return false;
            if (r >= 0) b->t[r] = dt;
        }
        res->k_cost[k] = sd_bench_median(b->t, o->reps);
    }
    sd_hyg_mark h1 = sd_hyg_now(NULL);
    res->hyg[HYG_K] = sd_hyg_other_cores(h0, &h1);
    return true;
}

/* Gives sequences 0..B-1 a ctx-token prefix each, in calls of at most 256
 * tokens (untimed). */
static bool prefill_batch(gpu_bench *b, int B) {
    const int ctx = b->o->ctx;
    for (int s = 0; s < B; s++)
        for (int done_tok = 0; done_tok < ctx; done_tok += 256) {
            int n = ctx - done_tok < 256 ? ctx - done_tok : 256;
            int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *sq = malloc(sizeof(int32_t) * (size_t)n);
            bool *want = calloc((size_t)n, sizeof(bool));
            sd_status fst = SD_ERR_NOMEM;
            if (pos && sq && want) {
                for (int i = 0; i < n; i++) pos[i] = done_tok + i, sq[i] = s;
                want[n - 1] = true;
                sd_batch batch = {n, b->ids + (size_t)s * 7 + (size_t)done_tok, pos, sq, want};
                fst = sd_model_forward(b->m, b->kv, &batch, b->logits);
            }
            free(pos), free(sq), free(want);
            if (fst != SD_OK) return false;
        }
    return true;
}

/* Throughput at each batch size: B sequences advancing one token a call. */
static bool measure_batches(gpu_bench *b, gpu_results *res) {
    const gpu_opts *o = b->o;
    for (int bi = 0; bi < o->n_batches; bi++) {
        int B = o->batches[bi];
        fprintf(stderr, "specd-bench gpu: batch %d (context %d)...\n", B, o->ctx);
        for (int s = 0; s < b->max_b; s++) sd_kv_release(b->kv, s);
        if (!prefill_batch(b, B)) return false;
        int steps = o->decode_steps;
        sd_hyg_mark h0 = sd_hyg_now(NULL);
        for (int i = -2; i < steps; i++) {
            for (int s = 0; s < B; s++) b->start[s] = sd_kv_seq_len(b->kv, s);
            const int32_t *ids = b->ids + (size_t)(i + 2) * (size_t)B % (size_t)(b->n_ids - B);
            double dt = timed_step(b->m, b->kv, B, 1, b->start, ids, false, b->logits);
            if (dt < 0) return false;
            if (i >= 0) b->t[i] = dt;
        }
        res->batch_tps[bi] = B / sd_bench_median(b->t, steps);
        sd_hyg_mark h1 = sd_hyg_now(NULL);
        res->hyg[HYG_BATCH0 + bi] = sd_hyg_other_cores(&h0, &h1);
    }
    return true;
}

/* The report's header lines: model, device, switches, method, hygiene. */
static void write_report_header(FILE *f, const gpu_opts *o, const sd_model_config *cfg, const gpu_results *res,
                                double wbytes) {
    time_t now = time(NULL);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%d", gmtime(&now));
    fprintf(f, "# specd-bench gpu — %s\n\n", day);
    fprintf(f,
            "- model: %s (%d layers, dim %d, ff %d, heads %d/%d, vocab %d); %.1f MB streamed per step "
            "(BF16 matrices); loaded in %.1f s\n",
            o->model_path, cfg->n_layers, cfg->n_embd, cfg->n_ff, cfg->n_heads, cfg->n_kv_heads, cfg->n_vocab,
            wbytes / 1e6, res->t_load);
    fprintf(f, "- device: cuda:%d, %s; recorded forwards (CUDA graphs) %s\n", (int)o->device, res->dev_name,
            o->backend.cuda_graphs ? "on" : "off");
    /* the backend's switches as set for this run, so a table says what it measured */
    char sw[256];
    sd_backend_opts_describe(&o->backend, sw, sizeof sw);
    fprintf(f, "- switches: %s\n", sw[0] ? sw : "none (the defaults)");
    fprintf(f,
            "- medians over %d repetitions (%d decode steps); host-timed around sd_model_forward, logits "
            "downloaded every call\n\n",
            o->reps, o->decode_steps);
    const double *hyg = res->hyg;
    fprintf(f,
            "- hygiene: other processes' CPU use during each measured block, cores (over %.2f marked "
            "NOISY): prompt %.2f%s, decode %.2f%s, k-costs %.2f%s",
            o->max_other, hyg[HYG_PROMPT], noisy(o, hyg[HYG_PROMPT]), hyg[HYG_DECODE], noisy(o, hyg[HYG_DECODE]),
            hyg[HYG_K], noisy(o, hyg[HYG_K]));
    for (int bi = 0; bi < o->n_batches; bi++)
        fprintf(f, ", batch %d %.2f%s", o->batches[bi], hyg[HYG_BATCH0 + bi], noisy(o, hyg[HYG_BATCH0 + bi]));
    fprintf(f, "\n\n");
}

/* The report's tables: the measures, then the k-token costs. */
static void write_report_tables(FILE *f, const gpu_opts *o, const gpu_results *res, double floor_s) {
    const double *hyg = res->hyg;
    fprintf(f, "| measure | value |\n| --- | --- |\n");
    fprintf(f, "| device copy bandwidth (read + write) | %.0f GB/s |\n", res->copy_bps / 1e9);
    fprintf(f, "| decode floor (weight bytes / copy bandwidth) | %.3f ms |\n", floor_s * 1e3);
    fprintf(f, "| decode at batch 1 | %.3f ms/token (%.1f tok/s)%s |\n", res->step_s * 1e3, 1.0 / res->step_s,
            noisy(o, hyg[HYG_DECODE]));
    fprintf(f, "| decode step / floor | %.2fx |\n", res->step_s / floor_s);
    fprintf(f, "| prompt processing, %d tokens | %.0f tok/s%s |\n", o->prompt_len, o->prompt_len / res->prompt_s,
            noisy(o, hyg[HYG_PROMPT]));
    for (int bi = 0; bi < o->n_batches; bi++)
        fprintf(f, "| throughput at batch %d (context %d) | %.0f tok/s%s |\n", o->batches[bi], o->ctx,
                res->batch_tps[bi], noisy(o, hyg[HYG_BATCH0 + bi]));
    fprintf(f, "\nCost of k new tokens of one sequence in one call (logits for every row):\n\n"
               "| k | ms | relative to k = 1 |\n| --- | --- | --- |\n");
    for (int k = 1; k <= o->max_k; k++)
        fprintf(f, "| %d | %.3f | %.2f |\n", k, res->k_cost[k] * 1e3, res->k_cost[k] / res->k_cost[1]);
}

/* Writes the report to stdout and, with --out, to that file. */
static bool write_report(const gpu_opts *o, const sd_model *m, const gpu_results *res) {
    double wbytes = (double)sd_model_weight_bytes(m), floor_s = wbytes / res->copy_bps;
    FILE *outs[2] = {stdout, NULL};
    if (o->out_path && !(outs[1] = fopen(o->out_path, "w"))) {
        fprintf(stderr, "specd-bench gpu: cannot write %s: %s\n", o->out_path, strerror(errno));
        return false;
    }
    for (int i = 0; i < 2 && outs[i]; i++) {
        write_report_header(outs[i], o, sd_model_config_of(m), res, wbytes);
        write_report_tables(outs[i], o, res, floor_s);
        if (outs[i] != stdout) fclose(outs[i]);
    }
    return true;
}

/* Loads the model on the device; *t_load its seconds. 0 or 1 (said). */
static int load_model(const gpu_opts *o, sd_model **m, double *t_load) {
    char err[512] = "";
    sd_gguf *g = NULL;
    if (sd_gguf_open(o->model_path, &g, err, sizeof err) != SD_OK) {
        fprintf(stderr, "specd-bench gpu: cannot open %s: %s\n", o->model_path, err);
        return 1;
    }
    sd_model_params mp = sd_model_default_params();
    mp.device = o->device;
    mp.backend = o->backend;
    *t_load = sd_now();
    sd_status st = sd_model_load(g, &mp, m);
    sd_gguf_close(&g);
    if (st != SD_OK) {
        fprintf(stderr, "specd-bench gpu: cannot load %s (see the log above)\n", o->model_path);
        return 1;
    }
    *t_load = sd_now() - *t_load;
    return 0;
}

/* The whole run: 0, 1 on a failure, 77 without a usable GPU. */
static int run(const gpu_opts *o) {
    gpu_results res = {.dev_name = "no CUDA device", .copy_bps = -1};
#ifdef SPECD_HAVE_CUDA
    res.copy_bps = copy_bandwidth(o->device, o->reps, res.dev_name, sizeof res.dev_name);
#endif
    if (res.copy_bps <= 0) {
        fprintf(stderr, "specd-bench gpu: cuda:%d is not usable here (no CUDA build or no GPU)\n", (int)o->device);
        return 77;
    }
    gpu_bench b = {.o = o};
    if (load_model(o, &b.m, &res.t_load)) return 1;
    b.cfg = sd_model_config_of(b.m);
    int rc = 1;
    if (!bench_setup(&b)) goto done;
    /* hygiene: other processes' CPU use over each measured block (one
     * forward is shorter than the counters' 10 ms tick) */
    sd_hyg_mark h0 = sd_hyg_now(NULL);
    if (!measure_prompt_decode(&b, &res, &h0) || !measure_k_costs(&b, &res, &h0) || !measure_batches(&b, &res) ||
        !write_report(o, b.m, &res))
        goto done;
    rc = 0;
done:
    if (rc) fprintf(stderr, "specd-bench gpu: failed (see the log above)\n");
    sd_kv_free(&b.kv);
    sd_model_free(&b.m);
    free(b.ids), free(b.logits), free(b.t);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd-bench gpu -m MODEL.gguf [options]\n"
               "\n"
               "Decode step against the bandwidth floor, k-token call cost, prompt processing and batch\n"
               "throughput of one model on a CUDA device. Exits 77 when no GPU is usable.\n"
               "\n"
               "  -m, --model FILE      GGUF model (required)\n"
               "      --device D        cuda or cuda:N (default cuda:0)\n"
               "  -r, --reps N          repetitions per figure (default 9)\n"
               "      --max-other-load C  mark a block NOISY when other processes used more than C cores\n"
               "                        during it (default 0.25)\n"
               "      --decode-steps N  decode steps timed (default 64)\n"
               "      --prompt-len N    prompt length (default 512)\n"
               "      --ctx N           context of each sequence in the batch runs (default 256)\n"
               "      --batches LIST    batch sizes, comma-separated, at most 256 (default 1,8,64)\n"
               "      --max-k N         largest k for the k-token call cost (default 16)\n"
               "  -o, --out FILE        also write the table (markdown) to FILE\n"
               "  -h, --help            this help\n"
               "\n" SD_BACKEND_OPTIONS_USAGE);
}

int bench_gpu_main(int argc, char **argv) {
    enum { O_DEVICE = 256, O_STEPS, O_PROMPT, O_CTX, O_BATCHES, O_MAXK };
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"device", required_argument, 0, O_DEVICE},
                                          {"reps", required_argument, 0, 'r'},
                                          {"decode-steps", required_argument, 0, O_STEPS},
                                          {"prompt-len", required_argument, 0, O_PROMPT},
                                          {"ctx", required_argument, 0, O_CTX},
                                          {"batches", required_argument, 0, O_BATCHES},
                                          {"max-k", required_argument, 0, O_MAXK},
                                          {"out", required_argument, 0, 'o'},
                                          {"help", no_argument, 0, 'h'},
                                          {"max-other-load", required_argument, 0, 'X'},
                                          SD_BACKEND_LONG_OPTIONS,
                                          {0, 0, 0, 0}};
    gpu_opts o = {.device = 0,
                  .reps = 9,
                  .decode_steps = 64,
                  .prompt_len = 512,
                  .ctx = 256,
                  .max_k = MAX_K,
                  .n_batches = 3,
                  .batches = {1, 8, 64},
                  .max_other = SD_HYG_DEFAULT_MAX_OTHER,
                  .backend = sd_backend_default_opts()};
    int c, li = 0;
    optind = 2;
    while ((c = getopt_long(argc, argv, "m:r:o:h", longs, &li)) != -1) {
        bool ok = true;
        switch (c) {
        case SD_BACKEND_OPTION:
            if (!sd_backend_opts_parse(&o.backend, longs[li].name, optarg, "specd-bench gpu")) return 2;
            break;
        case 'm': o.model_path = optarg; break;
        case O_DEVICE: ok = sd_device_parse(optarg, &o.device) == SD_OK && o.device >= 0; break;
        case 'r': ok = sd_cli_parse_int(optarg, 1, 64, &o.reps); break;
        case 'X': ok = sd_cli_parse_double(optarg, 1e-6, 1e6, &o.max_other); break;
        case O_STEPS: ok = sd_cli_parse_int(optarg, 1, 4096, &o.decode_steps); break;
        case O_PROMPT: ok = sd_cli_parse_int(optarg, 1, 4096, &o.prompt_len); break;
        case O_CTX: ok = sd_cli_parse_int(optarg, 1, 8192, &o.ctx); break;
        case O_MAXK: ok = sd_cli_parse_int(optarg, 1, MAX_K, &o.max_k); break;
        case O_BATCHES: {
            o.n_batches = 0;
            char *copy = strdup(optarg), *save = NULL;
            for (char *tok = strtok_r(copy, ",", &save); tok && ok; tok = strtok_r(NULL, ",", &save)) {
                ok = o.n_batches < MAX_BATCHES && sd_cli_parse_int(tok, 1, 256, &o.batches[o.n_batches]);
                o.n_batches++;
            }
            free(copy);
            ok = ok && o.n_batches > 0;
            break;
        }
        case 'o': o.out_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "specd-bench gpu: invalid value '%s' (see --help)\n", optarg);
            return 2;
        }
    }
    if (!o.model_path) {
        fprintf(stderr, "specd-bench gpu: -m MODEL is required (see --help)\n");
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "bench");
    return run(&o);
}
