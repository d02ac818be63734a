/* bench_tp.c — `specd-bench tp`: a tensor-parallel verifier group on this
 * machine's CPU against TP = 1, with what the service really runs per step.
 *
 * For each configuration (a TP size, an LM head mode) the benchmark forks
 * ranks 1..tp-1, each loading its shard and serving the group with
 * sd_group_rank_run (verifier/group.c: plans over ZeroMQ, shared-memory
 * collectives), and is itself the leader: it loads shard 0, forms the group
 * with sd_group_leader_start and times sd_model_forward with the group's
 * plan sink installed — exactly a specd-verifier leader's step, without the
 * coordinator. Measured, medians over repetitions:
 *   - decode: one sequence, one token per step after a prompt;
 *   - verify: one sequence, 1 + K tokens in one call, logits on every row;
 *   - batched decode: B sequences, one token each per step;
 *   - time inside the all-reduces and the LM head's gather during decode
 *     (sd_model_tp_stats: it includes waiting for the slowest rank);
 *   - a bare all-reduce of one step's residual update ([B][n_embd] floats)
 *     between tp fresh processes, for the transfer alone;
 *   - resident memory of every rank (VmRSS, RssAnon) and its weights.
 * The total thread budget (-t, default every core) is split evenly over
 * the ranks, so TP = 1 and TP = N use the same cores. Hygiene
 * (bench_hygiene.h): each configuration's round is sampled for the CPU
 * time of processes other than the benchmark's own (its forked ranks are
 * named specd-bench); rounds over --max-other-load cores are left out of
 * the medians and the table gives the share. */
#include "bench_tp.h"
#include "bench_hygiene.h"
#include "bench_stats.h"

#include "group.h"
#include "specd/coll.h"
#include "specd/model.h"
#include "specd/net.h"
#include "specd/weights.h"
#include "specd/worker.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_CONFIGS 8
#define MAX_RANKS   16
#define MAX_BATCH   32
#define MAX_ROUNDS  9

typedef struct tp_opts {
    const char *model_path, *out_path;
    int tps[MAX_CONFIGS], n_tps;
    int modes[2], n_modes; /* sd_tp_lm_head */
    int threads;           /* total over the ranks */
    int reps, prompt_len, decode_steps, k, batch, rounds;
    double max_other; /* cores other processes may use during a kept round */
} tp_opts;

typedef struct tp_result {
    int tp, mode, threads_per_rank;
    double decode_ms, verify_ms, batch_ms;
    double ar_us, ar_per_step, gather_us, bare_ar_us, bare_ar_batch_us;
    uint64_t weights[MAX_RANKS];
    long rss_kb[MAX_RANKS], anon_kb[MAX_RANKS];
    double other;        /* CPU cores other processes used meanwhile (bench_hygiene.h); medians: the max */
    double other_median; /* over the rounds */
    int n_dirty;         /* rounds over the limit, left out of the medians */
} tp_result;

/* VmRSS and RssAnon of pid (0: this process), in kB. */
static void memory_of(pid_t pid, long *rss, long *anon) {
    char path[64], line[256];
    snprintf(path, sizeof path, pid ? "/proc/%d/status" : "/proc/self/status", (int)pid);
    *rss = *anon = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *rss = strtol(line + 6, NULL, 10);
        if (!strncmp(line, "RssAnon:", 8)) *anon = strtol(line + 8, NULL, 10);
    }
    fclose(f);
}

static sd_status load_shard(const char *path, int tp, int rank, int mode, int threads, sd_model **out) {
    sd_weights *w = NULL;
    SD_TRY(sd_weights_open(path, &w));
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = threads;
    mp.tp_size = tp;
    mp.tp_rank = rank;
    mp.tp_lm_head = (sd_tp_lm_head)mode;
    sd_status st = sd_model_load_weights(w, &mp, out);
    sd_weights_close(&w); /* the shard is copied out: RSS counts what the rank holds */
    return st;
}

static sd_group_params group_params(const char *addr, int tp, int rank, const sd_model_identity *id, sd_model *m) {
    sd_group_params gp = sd_group_default_params();
    gp.addr = addr;
    gp.rank = rank;
    gp.size = tp;
    gp.model = *id;
    sd_model_shard sh;
    sd_model_shard_of(m, &sh);
    gp.lm_head = (int32_t)sh.lm_head;
    gp.weight_bytes = sd_model_resident_bytes(m);
    gp.join_timeout_ms = 600000;
    gp.coll_timeout_ms = 60000;
    return gp;
}

/* A forked rank: its shard, the group, until the leader stops it. Its
 * weight bytes go to weights[rank] (shared memory). */
static int rank_child(const tp_opts *o, const char *addr, int tp, int rank, int mode, int threads,
                      const sd_model_identity *id, uint64_t *weights) {
    sd_model *m = NULL;
    if (load_shard(o->model_path, tp, rank, mode, threads, &m) != SD_OK) return 10;
    weights[rank] = sd_model_resident_bytes(m);
    void *zctx = zmq_ctx_new();
    sd_group_params gp = group_params(addr, tp, rank, id, m);
    sd_group_exit why = SD_GROUP_DOWN;
    sd_status st = sd_group_rank_run(zctx, &gp, m, &why);
    zmq_ctx_term(zctx);
    sd_model_free(&m);
    return st == SD_OK && why == SD_GROUP_STOPPED ? 0 : 11;
}

/* One forward of rows (seq, pos, token) on the leader; seconds or -1. */
static double timed(sd_model *m, sd_kv *kv, int n, const int32_t *tok, const int32_t *pos, const int32_t *seq,
                    const bool *want, float *logits) {
    sd_batch b = {n, tok, pos, seq, want};
    double t0 = sd_now();
    sd_status st = sd_model_forward(m, kv, &b, logits);
    return st == SD_OK ? sd_now() - t0 : -1;
}

/* The leader's measurements; 0 or an error. */
static int measure(const tp_opts *o, sd_model *m, sd_kv *kv, tp_result *r) {
    const sd_model_config *cfg = sd_model_config_of(m);
    int V = cfg->n_vocab, P = o->prompt_len, n_max = P > o->batch * 2 ? P : o->batch * 2;
    if (n_max < o->k + 1) n_max = o->k + 1;
    int32_t *tok = malloc((size_t)n_max * sizeof *tok), *pos = malloc((size_t)n_max * sizeof *pos);
    int32_t *seq = malloc((size_t)n_max * sizeof *seq);
    bool *want = malloc((size_t)n_max * sizeof *want);
    float *logits = malloc((size_t)n_max * (size_t)V * sizeof(float));
    int n_t = o->reps > o->decode_steps ? o->reps : o->decode_steps;
    double *t = malloc((size_t)n_t * sizeof *t);
    int rc = 1;
    if (!tok || !pos || !seq || !want || !logits || !t) goto done;
    uint32_t x = 977;
    /* prompts: sequence s holds P tokens */
    for (int s = 0; s < o->batch; s++) {
        for (int i = 0; i < P; i++) {
            x = x * 1664525u + 1013904223u;
            tok[i] = (int32_t)(x % (uint32_t)V), pos[i] = i, seq[i] = s, want[i] = i == P - 1;
        }
        if (timed(m, kv, P, tok, pos, seq, want, logits) < 0) goto done;
    }
    /* decode, sequence 0 */
    sd_model_tp_stats_get(m, NULL, true);
    for (int i = 0; i < o->decode_steps; i++) {
        tok[0] = (int32_t)(i % V), pos[0] = P + i, seq[0] = 0, want[0] = true;
        if ((t[i] = timed(m, kv, 1, tok, pos, seq, want, logits)) < 0) goto done;
    }
    r->decode_ms = sd_bench_median(t, o->decode_steps) * 1e3;
    sd_model_tp_stats st;
    sd_model_tp_stats_get(m, &st, true);
    r->ar_us = st.all_reduces ? st.all_reduce_s / (double)st.all_reduces * 1e6 : 0;
    r->ar_per_step = (double)st.all_reduces / o->decode_steps;
    r->gather_us = st.gathers ? st.gather_s / (double)st.gathers * 1e6 : 0;
    /* verify: 1 + K rows of sequence 0, every row's logits, then roll back */
    for (int rep = 0; rep < o->reps; rep++) {
        if (sd_kv_truncate(kv, 0, P) != SD_OK) goto done;
        for (int i = 0; i <= o->k; i++)
            tok[i] = (int32_t)((7 * i + rep) % V), pos[i] = P + i, seq[i] = 0, want[i] = true;
        if ((t[rep] = timed(m, kv, o->k + 1, tok, pos, seq, want, logits)) < 0) goto done;
    }
    r->verify_ms = sd_bench_median(t, o->reps) * 1e3;
    if (sd_kv_truncate(kv, 0, P) != SD_OK) goto done;
    /* batched decode: one token for each of the B sequences per step */
    for (int i = 0; i < o->decode_steps; i++) {
        for (int s = 0; s < o->batch; s++) tok[s] = (int32_t)((s + i) % V), pos[s] = P + i, seq[s] = s, want[s] = true;
        if ((t[i] = timed(m, kv, o->batch, tok, pos, seq, want, logits)) < 0) goto done;
    }
    r->batch_ms = sd_bench_median(t, o->decode_steps) * 1e3;
    rc = 0;
done:
    free(tok), free(pos), free(seq), free(want), free(logits), free(t);
    return rc;
}

/* A bare all-reduce of n floats among tp fresh processes: median µs per
 * call of the slowest rank (rank 0 reports through a pipe). */
static double bare_all_reduce_us(int tp, size_t n, int iters) {
    if (tp < 2) return 0;
    char name[64];
    static int gen;
    snprintf(name, sizeof name, "specd-bench-ar-%d-%d", (int)getpid(), ++gen);
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < tp; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            sd_coll_params cp = sd_coll_default_params();
            cp.rank = r;
            cp.size = tp;
            cp.max_bytes = (size_t)1 << 20;
            sd_coll *c = NULL;
            float *buf = calloc(n, sizeof *buf);
            double *t = malloc((size_t)iters * sizeof *t);
            if (!buf || !t || sd_coll_shm_open(name, &cp, &c) != SD_OK) _exit(1);
            for (int i = 0; i < 50; i++) sd_coll_all_reduce_sum(c, buf, n);
            for (int i = 0; i < iters; i++) {
                sd_coll_barrier(c);
                double t0 = sd_now();
                sd_coll_all_reduce_sum(c, buf, n);
                t[i] = sd_now() - t0;
            }
            /* the slowest rank's time per iteration */
            float *tf = malloc((size_t)iters * sizeof *tf);
            float *allf = r == 0 ? malloc((size_t)iters * (size_t)tp * sizeof *allf) : NULL;
            for (int i = 0; i < iters; i++) tf[i] = (float)t[i];
            sd_coll_gather(c, tf, (size_t)iters, allf, 0);
            if (r == 0) {
                for (int i = 0; i < iters; i++) {
                    t[i] = 0;
                    for (int q = 0; q < tp; q++) {
                        double v = allf[(size_t)q * (size_t)iters + (size_t)i];
                        if (v > t[i]) t[i] = v;
                    }
                }
                double med = sd_bench_median(t, iters) * 1e6;
                if (write(fds[1], &med, sizeof med) != sizeof med) _exit(2);
            }
            sd_coll_close(&c);
            free(allf), free(tf), free(t), free(buf);
            _exit(0);
        }
    }
    close(fds[1]);
    double med = -1;
    if (read(fds[0], &med, sizeof med) != sizeof med) med = -1;
    close(fds[0]);
    for (int r = 0; r < tp; r++) waitpid(pids[r], NULL, 0);
    return med;
}

/* One configuration, in a process of its own (run_config forks it): the
 * ranks it forks then inherit no heap from earlier configurations, so their
 * RSS is theirs. */
static int run_config_here(const tp_opts *o, int tp, int mode, const sd_model_identity *id, tp_result *r) {
    memset(r, 0, sizeof *r);
    r->tp = tp;
    r->mode = mode;
    int per_rank = o->threads / tp > 0 ? o->threads / tp : 1;
    r->threads_per_rank = per_rank;
    char addr[128];
    static int gen;
    snprintf(addr, sizeof addr, "ipc:///tmp/specd-bench-tp-%d-%d.sock", (int)getpid(), ++gen);
    pid_t pids[MAX_RANKS] = {0};
    uint64_t *weights =
        mmap(NULL, MAX_RANKS * sizeof *weights, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (weights == MAP_FAILED) return 1;
    memset(weights, 0, MAX_RANKS * sizeof *weights);
    for (int rank = 1; rank < tp; rank++) {
        fflush(NULL);
        pids[rank] = fork();
        if (pids[rank] < 0) return 1;
        if (pids[rank] == 0) _exit(rank_child(o, addr, tp, rank, mode, per_rank, id, weights));
    }
    sd_model *m = NULL;
    sd_kv *kv = NULL;
    sd_group *g = NULL;
    void *zctx = zmq_ctx_new();
    int rc = 1;
    int blocks = o->batch * ((o->prompt_len + o->decode_steps + o->k + 16) / 16 + 2);
    if (load_shard(o->model_path, tp, 0, mode, per_rank, &m) != SD_OK) goto done;
    if (sd_model_kv_create(m, o->batch, blocks, 16, &kv) != SD_OK) goto done;
    if (tp > 1) {
        sd_group_params gp = group_params(addr, tp, 0, id, m);
        gp.kv_blocks = blocks;
        gp.block_size = 16;
        gp.window_blocks = sd_kv_params_of(kv)->window_blocks; /* a sliding-window model's (0 without) */
        if (sd_group_leader_start(zctx, &gp, &g) != SD_OK || sd_model_set_coll(m, sd_group_coll(g)) != SD_OK) goto done;
        sd_model_set_plan_sink(m, sd_group_plan, g);
    }
    weights[0] = sd_model_resident_bytes(m);
    for (int rank = 0; rank < tp; rank++) {
        memory_of(pids[rank], &r->rss_kb[rank], &r->anon_kb[rank]);
        r->weights[rank] = weights[rank];
    }
    fprintf(stderr, "specd-bench tp: tp %d, head %s, %d thread(s) per rank: measuring...\n", tp,
            mode ? "on the leader" : "split", per_rank);
    rc = measure(o, m, kv, r);
done:
    sd_model_set_plan_sink(m, NULL, NULL);
    sd_model_set_coll(m, NULL);
    sd_group_close(&g); /* ranks are told to stop cleanly */
    sd_kv_free(&kv);
    sd_model_free(&m);
    if (zctx) zmq_ctx_term(zctx);
    for (int rank = 1; rank < tp; rank++) {
        int status = 0;
        if (pids[rank] > 0 && waitpid(pids[rank], &status, 0) == pids[rank] &&
            (!WIFEXITED(status) || WEXITSTATUS(status)))
            fprintf(stderr, "specd-bench tp: rank %d ended with status 0x%x\n", rank, status);
    }
    munmap(weights, MAX_RANKS * sizeof *weights);
    char path[128];
    snprintf(path, sizeof path, "%s", addr + 6);
    unlink(path);
    return rc;
}

static int run_config(const tp_opts *o, int tp, int mode, const sd_model_identity *id, tp_result *r, bool bare) {
    tp_result *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 1;
    fflush(NULL);
    pid_t runner = fork();
    if (runner < 0) return 1;
    if (runner == 0) _exit(run_config_here(o, tp, mode, id, shared));
    int status = 0, rc = 1;
    if (waitpid(runner, &status, 0) == runner && WIFEXITED(status) && WEXITSTATUS(status) == 0) rc = 0;
    *r = *shared;
    munmap(shared, sizeof *shared);
    if (!rc && tp > 1 && bare) {
        const sd_model_config *cfg = NULL;
        sd_weights *w = NULL;
        sd_model_config c;
        if (sd_weights_open(o->model_path, &w) == SD_OK && sd_weights_config(w, &c) == SD_OK) cfg = &c;
        if (cfg) {
            r->bare_ar_us = bare_all_reduce_us(tp, (size_t)cfg->n_embd, 2000);
            r->bare_ar_batch_us = bare_all_reduce_us(tp, (size_t)cfg->n_embd * (size_t)o->batch, 1000);
        }
        sd_weights_close(&w);
    }
    return rc;
}

static void write_results(FILE *f, const tp_opts *o, const sd_model_config *cfg, const tp_result *res, int n) {
    time_t now = time(NULL);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%d", gmtime(&now));
    fprintf(f, "# specd-bench tp — %s\n\n", day);
    fprintf(f, "- model: %s (%d layers, dim %d, %d heads / %d KV heads, MLP %d, vocab %d), weights as f32\n",
            o->model_path, cfg->n_layers, cfg->n_embd, cfg->n_heads, cfg->n_kv_heads, cfg->n_ff, cfg->n_vocab);
    char cpus[256];
    sd_hyg_affinity_text(cpus, sizeof cpus);
    fprintf(f, "- CPUs: %s (process affinity of the bench and its ranks, no thread pinned to one core)\n", cpus);
    fprintf(f, "- %ld online cores; %d threads in all, split evenly over the ranks\n", sysconf(_SC_NPROCESSORS_ONLN),
            o->threads);
    fprintf(f,
            "- prompt %d tokens; decode = 1 token per step; verify = 1 + %d tokens in one call, logits on every "
            "row; batch = %d sequences x 1 token per step; medians of %d steps / %d repetitions, then the median of "
            "%d rounds that run every configuration in turn\n\n",
            o->prompt_len, o->k, o->batch, o->decode_steps, o->reps, o->rounds);
    fprintf(f,
            "| TP | LM head | threads/rank | decode ms | decode tok/s | verify ms | verify tok/s | batch-%d ms | "
            "batch tok/s | all-reduces/step | µs per all-reduce (in forward) | bare all-reduce µs (1 / %d rows) | "
            "gather µs | other CPU, cores: median / max | rounds over %.2f |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            o->batch, o->batch, o->max_other);
    for (int i = 0; i < n; i++) {
        const tp_result *r = &res[i];
        fprintf(f,
                "| %d | %s | %d | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %.0f | %.1f | %.1f / %.1f | %.1f "
                "| %.2f / %.2f | %d of %d%s |\n",
                r->tp,
                r->tp == 1 ? "—"
                : r->mode  ? "leader"
                           : "split",
                r->threads_per_rank, r->decode_ms, 1e3 / r->decode_ms, r->verify_ms, (o->k + 1) * 1e3 / r->verify_ms,
                r->batch_ms, o->batch * 1e3 / r->batch_ms, r->ar_per_step, r->ar_us, r->bare_ar_us, r->bare_ar_batch_us,
                r->gather_us, r->other_median, r->other, r->n_dirty, o->rounds,
                r->n_dirty == o->rounds ? ", all kept: unreliable" : "");
    }
    fprintf(f, "\nMemory per rank after load (weights: sd_model_resident_bytes; RSS and anonymous RSS from "
               "/proc/PID/status, the mapped file closed), MiB:\n\n| TP | LM head | rank | weights | VmRSS | "
               "RssAnon |\n|---:|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++)
        for (int rank = 0; rank < res[i].tp; rank++)
            fprintf(f, "| %d | %s | %d | %.1f | %.1f | %.1f |\n", res[i].tp,
                    res[i].tp == 1 ? "—"
                    : res[i].mode  ? "leader"
                                   : "split",
                    rank, (double)res[i].weights[rank] / 1048576.0, res[i].rss_kb[rank] / 1024.0,
                    res[i].anon_kb[rank] / 1024.0);
}

/* Each configuration's figures: the medians of its rounds on a quiet
 * machine (all rounds, when none was quiet), with the other load seen. */
static void reduce_rounds(const tp_opts *o, tp_result runs[][2 * MAX_CONFIGS], int n, tp_result *res) {
    for (int i = 0; i < n; i++) {
        res[i] = runs[o->rounds - 1][i];
        double v[MAX_ROUNDS];
        /* hygiene: medians over the clean rounds (all, when none is clean) */
        sd_hyg_params hp = {.max_other_cores = o->max_other, .exclude_prefix = "specd-"};
        bool keep[MAX_ROUNDS];
        int n_keep = 0;
        res[i].other = 0;
        for (int round = 0; round < o->rounds; round++) {
            keep[round] = sd_hyg_clean(&hp, runs[round][i].other);
            n_keep += keep[round];
            v[round] = runs[round][i].other;
            if (v[round] > res[i].other) res[i].other = v[round];
        }
        res[i].other_median = sd_bench_median(v, o->rounds);
        res[i].n_dirty = o->rounds - n_keep;
        if (n_keep == 0)
            for (int round = 0; round < o->rounds; round++) keep[round] = true;
#define MEDIAN_OF(field)                                      \
    do {                                                      \
        int n_v = 0;                                          \
        for (int round = 0; round < o->rounds; round++)       \
            if (keep[round]) v[n_v++] = runs[round][i].field; \
        res[i].field = sd_bench_median(v, n_v);               \
    } while (0)
        MEDIAN_OF(decode_ms);
        MEDIAN_OF(verify_ms);
        MEDIAN_OF(batch_ms);
        MEDIAN_OF(ar_us);
        MEDIAN_OF(gather_us);
#undef MEDIAN_OF
    }
}

int bench_tp_main(int argc, char **argv) {
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"tp", required_argument, 0, 'T'},
                                          {"lm-head", required_argument, 0, 'L'},
                                          {"threads", required_argument, 0, 't'},
                                          {"reps", required_argument, 0, 'r'},
                                          {"prompt-len", required_argument, 0, 'P'},
                                          {"decode-steps", required_argument, 0, 'D'},
                                          {"k", required_argument, 0, 'K'},
                                          {"batch", required_argument, 0, 'B'},
                                          {"out", required_argument, 0, 'o'},
                                          {"rounds", required_argument, 0, 'R'},
                                          {"max-other-load", required_argument, 0, 'X'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    tp_opts o = {.threads = (int)sysconf(_SC_NPROCESSORS_ONLN),
                 .reps = 9,
                 .prompt_len = 64,
                 .decode_steps = 32,
                 .k = 4,
                 .batch = 8,
                 .rounds = 3,
                 .max_other = SD_HYG_DEFAULT_MAX_OTHER};
    const char *tps = "1,2", *modes = "split,leader";
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "m:t:r:o:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o.model_path = optarg; break;
        case 'T': tps = optarg; break;
        case 'L': modes = optarg; break;
        case 't': o.threads = atoi(optarg); break;
        case 'r': o.reps = atoi(optarg); break;
        case 'P': o.prompt_len = atoi(optarg); break;
        case 'D': o.decode_steps = atoi(optarg); break;
        case 'K': o.k = atoi(optarg); break;
        case 'B': o.batch = atoi(optarg); break;
        case 'R': o.rounds = atoi(optarg); break;
        case 'X': o.max_other = atof(optarg); break;
        case 'o': o.out_path = optarg; break;
        case 'h':
            printf("usage: specd-bench tp -m MODEL [--tp 1,2] [--lm-head split,leader] [-t THREADS] [-r REPS]\n"
                   "                      [--prompt-len 64] [--decode-steps 32] [--k 4] [--batch 8] [--rounds 3]\n"
                   "                      [--max-other-load 0.25]\n"
                   "                      [-o OUT.md]\n"
                   "A CPU verifier group (forked ranks, shared-memory collectives, plans over ZeroMQ) against TP = 1:\n"
                   "decode, verify and batched decode, time in the collectives, memory per rank.\n");
            return 0;
        default: return 2;
        }
    }
    for (char *s = (char *)tps; *s && o.n_tps < MAX_CONFIGS; s++) {
        int v = (int)strtol(s, &s, 10);
        if (v >= 1 && v <= MAX_RANKS) o.tps[o.n_tps++] = v;
        if (!*s) break;
    }
    if (strstr(modes, "split")) o.modes[o.n_modes++] = SD_TP_LM_HEAD_SPLIT;
    if (strstr(modes, "leader")) o.modes[o.n_modes++] = SD_TP_LM_HEAD_LEADER;
    if (!o.model_path || !o.n_tps || !o.n_modes || o.threads < 1 || o.reps < 1 || o.reps > 64 || o.prompt_len < 1 ||
        o.prompt_len > 1024 || o.decode_steps < 1 || o.decode_steps > 1024 || o.k < 0 || o.k > 32 || o.batch < 1 ||
        o.batch > MAX_BATCH || o.rounds < 1 || o.rounds > MAX_ROUNDS || !(o.max_other > 0)) {
        fprintf(stderr,
                "specd-bench tp: need -m MODEL, --tp sizes in 1..%d; reps 1..64, prompt-len 1..1024, "
                "decode-steps 1..1024, k 0..32, batch 1..%d, rounds 1..%d\n",
                MAX_RANKS, MAX_BATCH, MAX_ROUNDS);
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "bench");
    sd_model_identity id;
    if (sd_weights_identity(o.model_path, &id) != SD_OK) return 1;
    sd_weights *w = NULL;
    sd_model_config cfg;
    if (sd_weights_open(o.model_path, &w) != SD_OK || sd_weights_config(w, &cfg) != SD_OK) {
        sd_weights_close(&w);
        return 1;
    }
    sd_weights_close(&w);
    /* rounds of every configuration in turn: a shared machine's load drifts,
     * and each figure is the median of its rounds */
    tp_result res[2 * MAX_CONFIGS], runs[MAX_ROUNDS][2 * MAX_CONFIGS];
    int n = 0;
    for (int round = 0; round < o.rounds; round++) {
        n = 0;
        for (int i = 0; i < o.n_tps; i++)
            for (int j = 0; j < (o.tps[i] == 1 ? 1 : o.n_modes); j++) {
                int mode = o.tps[i] == 1 ? SD_TP_LM_HEAD_SPLIT : o.modes[j];
                /* the forked ranks and runner are named specd-bench: ours */
                sd_hyg_params hp = {.max_other_cores = o.max_other, .exclude_prefix = "specd-"};
                sd_hyg_mark h0 = sd_hyg_now(&hp);
                int failed = run_config(&o, o.tps[i], mode, &id, &runs[round][n], round == o.rounds - 1);
                sd_hyg_mark h1 = sd_hyg_now(&hp);
                runs[round][n].other = sd_hyg_other_cores(&h0, &h1);
                if (failed) {
                    fprintf(stderr, "specd-bench tp: tp %d failed (see the log above)\n", o.tps[i]);
                    return 1;
                }
                n++;
            }
    }
    reduce_rounds(&o, runs, n, res);
    write_results(stdout, &o, &cfg, res, n);
    if (o.out_path) {
        FILE *f = fopen(o.out_path, "w");
        if (!f) {
            fprintf(stderr, "specd-bench tp: cannot write %s: %s\n", o.out_path, strerror(errno));
            return 1;
        }
        write_results(f, &o, &cfg, res, n);
        fclose(f);
    }
    return 0;
}
