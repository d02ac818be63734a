/* test_tp.c — tensor-parallel shards of the model (engine/model.c) run by
 * real rank processes over the shared-memory collectives.
 *
 * Each case forks tp ranks. Rank 0 loads shard 0, runs ragged batches with
 * sd_model_forward and hands every plan to the others through its plan sink
 * — here a broadcast on the group's own collectives (the verifier's group
 * sends plans over ZeroMQ instead; tests/integration/test_tp.py covers
 * that) — and ranks 1..tp-1 run them with sd_model_forward_plan. Logits
 * land in shared memory, keyed by (sequence, position), so that any two
 * runs compare row by row whatever their batch schedule.
 *
 * Checked, on random models written by specd-mkmodel:
 *   - TP = 2 and 4 (KV heads replicated at 4 > 2) match TP = 1: max |diff|
 *     <= 1e-5 x max |logit| and the same argmax on every row, with the LM
 *     head split by vocabulary and kept whole on the leader; Q8_0 weights
 *     (column slices on block boundaries; 8-bit activations, so rounding
 *     flips are allowed as assert_close says), a tied head, and a vocabulary
 *     that TP does not divide (the head falls back to the leader);
 *   - deterministic and batch-invariant under TP: a sequence's logits are
 *     bit-identical when each sequence runs alone, token by token, or all
 *     interleaved in two chunks;
 *   - a rank checks every plan index (bad block id, position past the
 *     table, token out of the vocabulary: SD_ERR_RANGE, nothing run);
 *   - resident weights per rank: 1/tp of the layers plus the replicated
 *     parts, to the byte;
 *   - Gemma 3 and Qwen2 models (q/k norms, post-norms, windowed layers,
 *     biases split with their heads) at TP 2 and 4 match TP = 1 as well;
 *   - clear refusals: a TP size that does not divide the heads, the KV
 *     heads (nor is a multiple of them) or the MLP, or that cuts quantized
 *     blocks.
 * `test_tp smollm` runs TP = 3 on SmolLM2-135M (9 heads, 3 KV heads) against
 * TP = 1 (label model; skipped without the model); `test_tp cuda` runs the
 * NCCL path with one rank on a GPU (skipped without one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/coll.h"
#include "specd/model.h"
#include "specd/weights.h"
#include "tp_wire.h"

#define MAX_TP       4
#define MAX_SEQS     4
#define MAX_LEN      16
#define KV_BLOCKS    64
#define BLOCK        4
#define GROUP_WAIT_S 600.0

/* ------------------------------------------------------------ models */

static struct {
    char dir[64];
    char m_gqa[128]; /* dim 64, 4 heads, 2 KV heads, ff 128, vocab 512, untied, f32 */
    char m_q8[128];  /* dim 128, 8 heads, 8 KV heads, ff 256, vocab 510, tied, q8_0 */
    char m_odd[128]; /* dim 96, 6 heads, 2 KV heads, ff 192 (refusals) */
    char m_ff[128];  /* dim 64, 4 heads, ff 130 (refusals) */
    char m_q8s[128]; /* dim 64, 4 heads, q8_0: 16 columns per rank at tp 4 (refusal) */
    char m_gemma[128]; /* gemma3: dim 64, 4 heads of 32, 2 KV heads, 7 layers, window 4 */
    char m_qwen2[128]; /* qwen2: dim 64, 4 heads, 2 KV heads, Q/K/V biases */
    char m_phi3[128];  /* phi3: dim 64, 4 heads, 2 KV heads, fused QKV and gate/up */
    char m_phi3lr[128]; /* phi3 LongRoPE: context 4096 over an original 256 (its long factors, attn_factor) */
    bool ok;
} env;

static int setup_models(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-tp-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.m_gqa, sizeof env.m_gqa, "%s/gqa.gguf", env.dir);
    snprintf(env.m_q8, sizeof env.m_q8, "%s/q8.gguf", env.dir);
    snprintf(env.m_odd, sizeof env.m_odd, "%s/odd.gguf", env.dir);
    snprintf(env.m_ff, sizeof env.m_ff, "%s/ff.gguf", env.dir);
    snprintf(env.m_q8s, sizeof env.m_q8s, "%s/q8s.gguf", env.dir);
    snprintf(env.m_gemma, sizeof env.m_gemma, "%s/gemma.gguf", env.dir);
    snprintf(env.m_qwen2, sizeof env.m_qwen2, "%s/qwen2.gguf", env.dir);
    snprintf(env.m_phi3, sizeof env.m_phi3, "%s/phi3.gguf", env.dir);
    snprintf(env.m_phi3lr, sizeof env.m_phi3lr, "%s/phi3lr.gguf", env.dir);
    char cmd[2560];
    snprintf(cmd, sizeof cmd,
             "'%1$s' -o '%2$s' --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 512 --seed 5 && "
             "'%1$s' -o '%3$s' --dim 128 --layers 2 --heads 8 --kv-heads 8 --ff 256 --vocab 510 --tied "
             "--dtype q8_0 --seed 6 && "
             "'%1$s' -o '%4$s' --dim 96 --layers 1 --heads 6 --kv-heads 2 --ff 192 --vocab 300 && "
             "'%1$s' -o '%5$s' --dim 64 --layers 1 --heads 4 --kv-heads 4 --ff 130 --vocab 300 && "
             "'%1$s' -o '%6$s' --dim 64 --layers 1 --heads 4 --kv-heads 4 --ff 128 --vocab 300 --dtype q8_0 && "
             "'%1$s' -o '%7$s' --arch gemma3 --dim 64 --layers 7 --heads 4 --kv-heads 2 --head-dim 32 --ff 128 "
             "--window 4 --vocab 512 --tied --seed 8 && "
             "'%1$s' -o '%8$s' --arch qwen2 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 512 --seed 9 && "
             "'%1$s' -o '%9$s' --arch phi3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 512 --seed 10 && "
             "'%1$s' -o '%10$s' --arch phi3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 512 --seed 11 "
             "--ctx 4096 --longrope 256",
             SPECD_MKMODEL, env.m_gqa, env.m_q8, env.m_odd, env.m_ff, env.m_q8s, env.m_gemma, env.m_qwen2, env.m_phi3,
             env.m_phi3lr);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown_models(void **state) {
    (void)state;
    const char *files[] = {env.m_gqa,   env.m_q8,    env.m_odd,  env.m_ff,    env.m_q8s,
                           env.m_gemma, env.m_qwen2, env.m_phi3, env.m_phi3lr};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(files[i]);
    rmdir(env.dir);
    return 0;
}

#define SKIP_WITHOUT_MODELS()                                                   \
    do {                                                                        \
        if (!env.ok) {                                                          \
            fprintf(stderr, "skipped: specd-mkmodel could not write models\n"); \
            skip();                                                             \
        }                                                                       \
    } while (0)

static sd_status load(const char *path, int tp, int rank, sd_tp_lm_head mode, sd_model **out) {
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(path, &w);
    if (st != SD_OK) return st;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    mp.tp_size = tp;
    mp.tp_rank = rank;
    mp.tp_lm_head = mode;
    st = sd_model_load_weights(w, &mp, out);
    sd_weights_close(&w);
    return st;
}

/* ------------------------------------------------------------ workloads */

/* A forward schedule over MAX_SEQS sequences of fixed lengths: "mixed" runs
 * each sequence's first half interleaved, then the rest interleaved;
 * "alone" runs one token per call. Logits are wanted on every row and
 * stored at [seq][pos]. */
typedef enum { SCHED_MIXED, SCHED_ALONE, SCHED_PREFIX } sched;

typedef struct workload {
    int32_t n_seqs;
    int32_t len[MAX_SEQS];
    int32_t ids[MAX_SEQS][MAX_LEN];
} workload;

static workload make_workload(int32_t n_vocab, uint32_t seed) {
    workload w = {.n_seqs = 4, .len = {7, 3, 12, 5}};
    for (int32_t s = 0; s < w.n_seqs; s++)
        for (int32_t p = 0; p < w.len[s]; p++) {
            seed = seed * 1664525u + 1013904223u;
            w.ids[s][p] = (int32_t)((seed >> 8) % (uint32_t)n_vocab);
        }
    return w;
}

/* make_workload's, with sequences 0, 3 and 1 starting with sequence 2's
 * first 6, 5 and 3 tokens (a prefix cache's workload). */
static workload make_shared_workload(int32_t n_vocab, uint32_t seed) {
    workload w = make_workload(n_vocab, seed);
    const int32_t shared[MAX_SEQS] = {6, 3, 0, 5};
    for (int32_t s = 0; s < w.n_seqs; s++)
        for (int32_t p = 0; p < shared[s]; p++) w.ids[s][p] = w.ids[2][p];
    return w;
}

static size_t row_of(int32_t s, int32_t p) { return (size_t)s * MAX_LEN + (size_t)p; }

/* SCHED_PREFIX on the leader's model m with its prefix cache on: sequence
 * 2, then 0, 3 and 1, each alone: it adopts the cached blocks of its tokens
 * (all but the last), computes the rest in one call, registers its blocks
 * and ends. adopted[s]: the rows not computed. */
static sd_status run_prefix(sd_model *m, sd_kv *kv, const workload *w, float *out, int32_t *adopted) {
    int32_t V = sd_model_config_of(m)->n_vocab, pos[MAX_LEN], seq[MAX_LEN];
    bool want[MAX_LEN];
    const int32_t order[MAX_SEQS] = {2, 0, 3, 1};
    sd_status st = SD_OK;
    for (int32_t i = 0; i < w->n_seqs && st == SD_OK; i++) {
        int32_t s = order[i], got = 0, len = w->len[s];
        st = sd_kv_prefix_adopt(kv, s, w->ids[s], len - 1, &got);
        for (int32_t p = got; p < len; p++) pos[p - got] = p, seq[p - got] = s, want[p - got] = true;
        sd_batch b = {len - got, w->ids[s] + got, pos, seq, want};
        if (st == SD_OK) st = sd_model_forward(m, kv, &b, out + row_of(s, got) * (size_t)V);
        if (st == SD_OK) st = sd_kv_prefix_commit(kv, s, w->ids[s], len);
        sd_kv_release(kv, s);
        adopted[s] = got;
    }
    return st;
}

/* Runs the schedule on the leader's model m, storing logits in out
 * [MAX_SEQS*MAX_LEN][V]. */
static sd_status run_workload(sd_model *m, sd_kv *kv, const workload *w, sched sc, float *out) {
    int32_t V = sd_model_config_of(m)->n_vocab;
    int32_t tokens[MAX_SEQS * MAX_LEN], pos[MAX_SEQS * MAX_LEN], seq[MAX_SEQS * MAX_LEN];
    bool want[MAX_SEQS * MAX_LEN];
    float *logits = malloc((size_t)MAX_SEQS * MAX_LEN * (size_t)V * sizeof(float));
    if (!logits) return SD_ERR_NOMEM;
    int32_t done[MAX_SEQS] = {0};
    sd_status st = SD_OK;
    for (int32_t call = 0; st == SD_OK; call++) {
        int32_t n = 0;
        if (sc == SCHED_MIXED) {
            if (call > 1) break;
            for (int32_t p = 0; p < MAX_LEN; p++)
                for (int32_t s = 0; s < w->n_seqs; s++) {
                    int32_t half = (w->len[s] + 1) / 2, end = call == 0 ? half : w->len[s];
                    if (p < done[s] || p >= end) continue;
                    tokens[n] = w->ids[s][p], pos[n] = p, seq[n] = s, want[n] = true, n++;
                }
        } else {
            int32_t s = 0;
            while (s < w->n_seqs && done[s] == w->len[s]) s++;
            if (s == w->n_seqs) break;
            tokens[n] = w->ids[s][done[s]], pos[n] = done[s], seq[n] = s, want[n] = true, n++;
        }
        sd_batch b = {n, tokens, pos, seq, want};
        st = sd_model_forward(m, kv, &b, logits);
        for (int32_t i = 0; st == SD_OK && i < n; i++) {
            memcpy(out + row_of(seq[i], pos[i]) * (size_t)V, logits + (size_t)i * (size_t)V, (size_t)V * sizeof(float));
            done[seq[i]] = pos[i] + 1;
        }
    }
    free(logits);
    return st;
}

/* ------------------------------------------------------------ plans over the collectives */

/* A plan with one index wrong must be refused before anything runs. */
static int check_bad_plans(sd_model *m, sd_kv *kv) {
    int32_t V = sd_model_config_of(m)->n_vocab;
    int32_t tok[2] = {1, 2}, pos[2] = {0, 1}, off[2] = {0, 0}, bt[1] = {0}, wanted[1] = {1};
    sd_model_plan good = {2, tok, pos, off, 1, bt, 1, wanted, NULL};
    sd_model_plan p = good;
    int32_t bad_bt[1] = {KV_BLOCKS};
    p.bt = bad_bt;
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 30;
    p = good;
    int32_t far[2] = {0, BLOCK}; /* position 4 needs a second table entry */
    p.pos = far;
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 31;
    p = good;
    int32_t big[2] = {1, V};
    p.tokens = big;
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 32;
    p = good;
    int32_t back[2] = {1, 0};
    p.n_wanted = 2, p.wanted = back;
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 33;
    return 0;
}

typedef struct group_case {
    const char *model;
    int tp;
    sd_tp_lm_head mode;
    sched sc;
    uint32_t seed;
    char shm_name[64];
    float *out;             /* shared: [MAX_SEQS*MAX_LEN][V] written by rank 0 */
    uint64_t *resident;     /* shared: [tp] each rank's sd_model_resident_bytes */
    sd_model_shard *shards; /* shared: [tp] */
    bool shared;            /* make_shared_workload */
    int32_t *adopted;       /* shared: [MAX_SEQS] rows adopted, SCHED_PREFIX */
} group_case;

/* gc's workload on the leader's m (SCHED_PREFIX with the prefix cache on). */
static sd_status run_case(group_case *gc, sd_model *m, sd_kv *kv) {
    int32_t V = sd_model_config_of(m)->n_vocab;
    workload w = gc->shared ? make_shared_workload(V, gc->seed) : make_workload(V, gc->seed);
    if (gc->sc != SCHED_PREFIX) return run_workload(m, kv, &w, gc->sc, gc->out);
    SD_TRY(sd_kv_prefix_enable(kv, KV_BLOCKS / 2));
    return run_prefix(m, kv, &w, gc->out, gc->adopted);
}

static int rank_main(group_case *gc, int rank) {
    sd_model *m = NULL;
    if (load(gc->model, gc->tp, rank, gc->mode, &m) != SD_OK) return 10;
    gc->resident[rank] = sd_model_resident_bytes(m);
    sd_model_shard_of(m, &gc->shards[rank]);
    sd_coll_params cp = sd_coll_default_params();
    cp.rank = rank;
    cp.size = gc->tp;
    cp.timeout_ms = 60000;
    cp.max_bytes = 4096; /* small: every all-reduce is chunked */
    sd_coll *coll = NULL;
    if (sd_coll_shm_open(gc->shm_name, &cp, &coll) != SD_OK) return 11;
    int rc = sd_model_set_coll(m, coll) == SD_OK ? 0 : 12;
    sd_kv *kv = NULL;
    if (!rc && sd_model_kv_create(m, MAX_SEQS, KV_BLOCKS, BLOCK, &kv) != SD_OK) rc = 13;
    if (!rc && rank == 0) {
        plan_wire pw = {.coll = coll};
        sd_model_set_plan_sink(m, tp_wire_send, &pw);
        if (run_case(gc, m, kv) != SD_OK) rc = 14;
        if (tp_wire_end(coll) != SD_OK && !rc) rc = 15;
        free(pw.buf);
    } else if (!rc) {
        if (rank == 1) rc = check_bad_plans(m, kv);
        plan_wire pw = {.coll = coll};
        for (sd_model_plan p; !rc;) {
            int got = tp_wire_recv(&pw, &p);
            if (got <= 0) {
                rc = got < 0 ? 21 : 0;
                break;
            }
            if (sd_model_forward_plan(m, kv, &p) != SD_OK) rc = 22;
        }
        free(pw.buf);
    }
    if (rc) sd_coll_abort(coll); /* the others fail fast instead of timing out */
    sd_kv_free(&kv);
    sd_model_set_coll(m, NULL);
    sd_coll_close(&coll);
    sd_model_free(&m);
    return rc;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *shared(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0, bytes);
    return p;
}

/* Runs a tp-rank group on gc; returns logits [MAX_SEQS*MAX_LEN][V] (caller
 * frees with free_logits) or asserts. tp 1 runs in this process. */
static float *run_group(group_case *gc, int32_t V) {
    size_t bytes = (size_t)MAX_SEQS * MAX_LEN * (size_t)V * sizeof(float);
    gc->out = shared(bytes);
    gc->resident = shared(MAX_TP * sizeof(uint64_t));
    gc->shards = shared(MAX_TP * sizeof(sd_model_shard));
    gc->adopted = shared(MAX_SEQS * sizeof(int32_t));
    static int counter;
    snprintf(gc->shm_name, sizeof gc->shm_name, "specd-test-tp-%d-%d", (int)getpid(), ++counter);
    if (gc->tp == 1) {
        sd_model *m = NULL;
        assert_int_equal(load(gc->model, 1, 0, gc->mode, &m), SD_OK);
        gc->resident[0] = sd_model_resident_bytes(m);
        sd_model_shard_of(m, &gc->shards[0]);
        sd_kv *kv = NULL;
        assert_int_equal(sd_model_kv_create(m, MAX_SEQS, KV_BLOCKS, BLOCK, &kv), SD_OK);
        assert_int_equal(run_case(gc, m, kv), SD_OK);
        sd_kv_free(&kv);
        sd_model_free(&m);
        return gc->out;
    }
    pid_t pids[MAX_TP];
    for (int r = 0; r < gc->tp; r++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) exit(rank_main(gc, r)); /* exit, not _exit: LeakSanitizer checks the rank */
        pids[r] = pid;
    }
    int failed = 0, running = gc->tp;
    double t0 = now_s();
    while (running > 0) {
        bool late = now_s() - t0 > GROUP_WAIT_S;
        for (int r = 0; r < gc->tp; r++) {
            if (pids[r] <= 0) continue;
            int status = 0;
            if (late) {
                fprintf(stderr, "rank %d hung: killing it\n", r);
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status, 0);
            } else if (waitpid(pids[r], &status, WNOHANG) != pids[r]) {
                continue;
            }
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "rank %d of %d failed (status 0x%x, exit %d)\n", r, gc->tp, status,
                        WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                failed++;
            }
            pids[r] = -1;
            running--;
        }
        usleep(2000);
    }
    assert_int_equal(failed, 0);
    return gc->out;
}

static void free_group(group_case *gc, int32_t V) {
    munmap(gc->out, (size_t)MAX_SEQS * MAX_LEN * (size_t)V * sizeof(float));
    munmap(gc->resident, MAX_TP * sizeof(uint64_t));
    munmap(gc->shards, MAX_TP * sizeof(sd_model_shard));
    munmap(gc->adopted, MAX_SEQS * sizeof(int32_t));
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Every row of the workload: |a - b| <= 1e-5 * max |a| and the same argmax. */
/* TP = 1 (a) against TP = tp (b), row by row. int_act: the model's matrices
 * take 8-bit activations (Q8_0 on the CPU): the all-reduce sums the
 * row-parallel partial sums in another order than one rank does (~1e-7
 * apart), and an activation that lands on the other side of a rounding half
 * step moves the next matmul by one quantum, so some rows differ by that
 * much. Then at least half of the rows must still agree within 1e-5 (a
 * wrongly sliced block would spoil every row), every row within 5% of its
 * max |logit|, and the argmax must agree unless the top two logits of the
 * TP = 1 row are within twice the row's difference. deep (SmolLM2's 30
 * layers, whose outlier activations make the quanta coarse): flips compound
 * through the layers and few rows stay within 1e-5, so no count is asked
 * and the bound is 10% (tests/ref/test_forward_oracle.py measures the same
 * spread, ~5%, between the numpy reference and itself with its activations
 * jittered by 1e-6). */
static void assert_close(const float *a, const float *b, const workload *w, int32_t V, const char *what, bool int_act,
                         bool deep) {
    const double loose = deep ? 0.10 : 0.05;
    double worst = 0, top = 0;
    int n_rows = 0, n_tight = 0;
    for (int32_t s = 0; s < w->n_seqs; s++)
        for (int32_t p = 0; p < w->len[s]; p++) {
            const float *x = a + row_of(s, p) * (size_t)V, *y = b + row_of(s, p) * (size_t)V;
            double row_top = 0, row_worst = 0;
            for (int32_t i = 0; i < V; i++) {
                if (fabs(x[i]) > row_top) row_top = fabs(x[i]);
                if (fabs((double)x[i] - y[i]) > row_worst) row_worst = fabs((double)x[i] - y[i]);
            }
            bool tight = row_worst <= 1e-5 * row_top;
            n_tight += tight;
            if (!tight && (!int_act || row_worst > loose * row_top))
                fail_msg("%s: seq %d pos %d: max |diff| %.3g > %g x max |logit| %.3g", what, (int)s, (int)p, row_worst,
                         int_act ? loose : 1e-5, row_top);
            int32_t ax = argmax(x, V), ay = argmax(y, V);
            if (ax != ay && (!int_act || x[ax] - x[ay] > 2 * row_worst))
                fail_msg("%s: seq %d pos %d: argmax %d vs %d", what, (int)s, (int)p, (int)ax, (int)ay);
            if (row_worst / (row_top > 0 ? row_top : 1) > worst) worst = row_worst / (row_top > 0 ? row_top : 1);
            if (row_top > top) top = row_top;
            n_rows++;
        }
    fprintf(stderr, "%s: %d rows, %d within 1e-5, max |diff| / max |logit| = %.3g (max |logit| %.3g)\n", what, n_rows,
            n_tight, worst, top);
    if (int_act && !deep && 2 * n_tight < n_rows) fail_msg("%s: only %d of %d rows within 1e-5", what, n_tight, n_rows);
}

static void assert_bits(const float *a, const float *b, const workload *w, int32_t V, const char *what) {
    for (int32_t s = 0; s < w->n_seqs; s++)
        for (int32_t p = 0; p < w->len[s]; p++)
            if (memcmp(a + row_of(s, p) * (size_t)V, b + row_of(s, p) * (size_t)V, (size_t)V * sizeof(float)))
                fail_msg("%s: seq %d pos %d differs bit for bit", what, (int)s, (int)p);
}

static int32_t vocab_of(const char *path) {
    sd_weights *w = NULL;
    assert_int_equal(sd_weights_open(path, &w), SD_OK);
    sd_model_config c;
    assert_int_equal(sd_weights_config(w, &c), SD_OK);
    sd_weights_close(&w);
    return c.n_vocab;
}

/* TP = tp (mixed schedule) against TP = 1. */
static void check_matches(const char *model, int tp, sd_tp_lm_head mode, const char *what, bool int_act, bool deep) {
    int32_t V = vocab_of(model);
    group_case ref = {.model = model, .tp = 1, .mode = mode, .sc = SCHED_MIXED, .seed = 77};
    group_case tpc = ref;
    tpc.tp = tp;
    float *a = run_group(&ref, V), *b = run_group(&tpc, V);
    workload w = make_workload(V, 77);
    assert_close(a, b, &w, V, what, int_act, deep);
    free_group(&ref, V);
    free_group(&tpc, V);
}

/* ------------------------------------------------------------ tests */

static void test_tp2_matches_tp1(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    check_matches(env.m_gqa, 2, SD_TP_LM_HEAD_SPLIT, "tp 2, head split", false, false);
    check_matches(env.m_gqa, 2, SD_TP_LM_HEAD_LEADER, "tp 2, head on the leader", false, false);
}

static void test_tp4_matches_tp1(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    /* 2 KV heads over 4 ranks: each KV head held by two ranks */
    check_matches(env.m_gqa, 4, SD_TP_LM_HEAD_SPLIT, "tp 4 (KV replicated), head split", false, false);
    /* q8_0 columns on block boundaries; tied head; vocabulary 510 not a
     * multiple of 4: the head stays on the leader */
    check_matches(env.m_q8, 4, SD_TP_LM_HEAD_SPLIT, "tp 4, q8_0, tied head, vocab 510", true, false);
    check_matches(env.m_q8, 2, SD_TP_LM_HEAD_SPLIT, "tp 2, q8_0, tied head split", true, false);
}

/* The other architectures (engine/model_arch.c): Gemma 3 (q/k norms
 * replicated, post-norms after the all-reduce, windowed layers), Qwen2
 * (biases split with their heads) at TP 2 and 4, and Phi-3 (each rank's rows
 * of each part of the fused QKV and gate/up) at TP 2, with LongRoPE (every
 * rank picks the same factor set) at TP 2 and 4, match TP 1. */
static void test_tp_arch_matches_tp1(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    check_matches(env.m_gemma, 2, SD_TP_LM_HEAD_SPLIT, "gemma3 tp 2, head split", false, false);
    check_matches(env.m_gemma, 4, SD_TP_LM_HEAD_SPLIT, "gemma3 tp 4 (KV replicated)", false, false);
    check_matches(env.m_qwen2, 2, SD_TP_LM_HEAD_SPLIT, "qwen2 tp 2, biases split", false, false);
    check_matches(env.m_qwen2, 4, SD_TP_LM_HEAD_LEADER, "qwen2 tp 4, head on the leader", false, false);
    check_matches(env.m_phi3, 2, SD_TP_LM_HEAD_SPLIT, "phi3 tp 2, fused matrices split by part", false, false);
    check_matches(env.m_phi3lr, 2, SD_TP_LM_HEAD_SPLIT, "phi3 LongRoPE tp 2", false, false);
    check_matches(env.m_phi3lr, 4, SD_TP_LM_HEAD_SPLIT, "phi3 LongRoPE tp 4", false, false);
}

/* Under TP a row's logits do not depend on the batch: each sequence alone,
 * token by token, equals all of them interleaved in two chunks. */
static void test_tp_batch_invariant(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    int32_t V = vocab_of(env.m_gqa);
    group_case mixed = {.model = env.m_gqa, .tp = 2, .mode = SD_TP_LM_HEAD_SPLIT, .sc = SCHED_MIXED, .seed = 91};
    group_case alone = mixed;
    alone.sc = SCHED_ALONE;
    float *a = run_group(&mixed, V), *b = run_group(&alone, V);
    workload w = make_workload(V, 91);
    assert_bits(a, b, &w, V, "tp 2: interleaved vs alone");
    free_group(&mixed, V);
    free_group(&alone, V);
}

/* The prefix cache in a group: the leader adopts cached blocks (its ranks
 * read and write by its block tables) and every row it computes equals,
 * bit for bit, the same row without the cache (each sequence alone); at TP
 * 1 and 2, on the GQA model and on Gemma 3, whose windowed layers (window
 * 4) live in a window group: the adopted blocks' window twins, at the
 * leader's window block ids, are read by the ranks. */
static void test_tp_prefix_cache(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    for (int c = 0; c < 4; c++) {
        const int tp = 1 + c % 2;
        const char *model = c / 2 ? env.m_gemma : env.m_gqa;
        int32_t V = vocab_of(model);
        group_case cold = {
            .model = model, .tp = tp, .mode = SD_TP_LM_HEAD_SPLIT, .sc = SCHED_ALONE, .seed = 93, .shared = true};
        group_case warm = cold;
        warm.sc = SCHED_PREFIX;
        float *a = run_group(&cold, V), *b = run_group(&warm, V);
        workload w = make_shared_workload(V, 93);
        int32_t n_adopted = 0;
        for (int32_t s = 0; s < w.n_seqs; s++) {
            n_adopted += warm.adopted[s];
            for (int32_t p = warm.adopted[s]; p < w.len[s]; p++)
                if (memcmp(a + row_of(s, p) * (size_t)V, b + row_of(s, p) * (size_t)V, (size_t)V * sizeof(float)))
                    fail_msg("%s, tp %d: seq %d pos %d differs with the prefix cache", model, tp, (int)s, (int)p);
        }
        assert_int_equal(n_adopted, 4 + 4); /* sequences 0 and 3: one block of sequence 2 each */
        free_group(&cold, V);
        free_group(&warm, V);
    }
}

/* Shards: the layer weights split 1/tp, the rest held where the mode says. */
static void test_tp_resident_bytes(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    int32_t V = vocab_of(env.m_gqa);
    group_case one = {.model = env.m_gqa, .tp = 1, .mode = SD_TP_LM_HEAD_SPLIT, .sc = SCHED_MIXED, .seed = 3};
    group_case two = one;
    two.tp = 2;
    run_group(&one, V);
    run_group(&two, V);
    /* dim 64, 2 layers, 4 heads of 16, 2 KV heads, ff 128, vocab 512, f32 */
    const uint64_t E = 64, F = 128, QD = 64, KD = 32, L = 2;
    uint64_t layer = (2 * E * QD + 2 * E * KD + 3 * E * F) * 4, norms = 2 * E * 4;
    uint64_t embd = (uint64_t)V * E * 4, head = (uint64_t)V * E * 4, out_norm = E * 4;
    assert_int_equal(one.resident[0], embd + head + out_norm + L * (layer + norms));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(two.resident[r], embd + head / 2 + out_norm + L * (layer / 2 + norms));
        assert_int_equal(two.shards[r].n_heads, 2);
        assert_int_equal(two.shards[r].head0, 2 * r);
        assert_int_equal(two.shards[r].n_kv_heads, 1);
        assert_int_equal(two.shards[r].kv_head0, r);
        assert_int_equal(two.shards[r].n_vocab, V / 2);
        assert_int_equal(two.shards[r].vocab0, r * V / 2);
    }
    fprintf(stderr, "resident weights: tp 1 %llu bytes; tp 2 %llu per rank (%.1f%%)\n",
            (unsigned long long)one.resident[0], (unsigned long long)two.resident[0],
            100.0 * (double)two.resident[0] / (double)one.resident[0]);
    free_group(&one, V);
    free_group(&two, V);
    /* the head on the leader only */
    group_case lead = {.model = env.m_gqa, .tp = 4, .mode = SD_TP_LM_HEAD_LEADER, .sc = SCHED_MIXED, .seed = 3};
    run_group(&lead, V);
    /* 2 KV heads over 4 ranks: each rank holds one whole KV head (replicated) */
    uint64_t layer4 = (2 * E * QD / 4 + 2 * E * (KD / 2) + 3 * E * F / 4) * 4;
    assert_int_equal(lead.resident[0], embd + head + out_norm + L * (layer4 + norms));
    assert_int_equal(lead.resident[3], embd + out_norm + L * (layer4 + norms));
    assert_int_equal(lead.shards[3].n_vocab, 0);
    assert_int_equal(lead.shards[2].kv_head0, 1); /* heads 2 of 4 -> KV head 1 of 2 */
    free_group(&lead, V);
}

static void expect_refused(const char *path, int tp, const char *what) {
    for (int r = 0; r<tp; r += tp - 1> 0 ? tp - 1 : 1) {
        sd_model *m = NULL;
        sd_status st = load(path, tp, r, SD_TP_LM_HEAD_SPLIT, &m);
        if (st != SD_ERR_INVALID_ARG) fail_msg("%s (rank %d): %s, expected a refusal", what, r, sd_status_str(st));
        assert_null(m);
    }
}

static void test_tp_refusals(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    expect_refused(env.m_gqa, 3, "tp 3 with 4 heads");
    expect_refused(env.m_odd, 3, "tp 3 with 6 heads but 2 KV heads");
    expect_refused(env.m_odd, 4, "tp 4 with 6 heads");
    expect_refused(env.m_ff, 4, "tp 4 with an MLP of 130");
    expect_refused(env.m_q8s, 4, "tp 4 cutting q8_0 blocks of 32 into 16 columns");
    sd_model *m = NULL;
    assert_int_equal(load(env.m_gqa, 2, 2, SD_TP_LM_HEAD_SPLIT, &m), SD_ERR_INVALID_ARG);
    /* allowed: 6 heads / 2 KV heads over 2 ranks; q8_0 with 32 columns each */
    assert_int_equal(load(env.m_odd, 2, 1, SD_TP_LM_HEAD_SPLIT, &m), SD_OK);
    /* a shard in no group runs no batch of its own */
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 8, 4, &kv), SD_OK);
    int32_t t = 1, p = 0, s = 0;
    sd_batch b = {1, &t, &p, &s, NULL};
    assert_int_equal(sd_model_forward(m, kv, &b, NULL), SD_ERR_INVALID_ARG);
    sd_model *view = NULL;
    assert_int_equal(sd_model_view_layers(m, 1, &view), SD_ERR_UNSUPPORTED);
    sd_kv_free(&kv);
    sd_model_free(&m);
    assert_int_equal(load(env.m_q8s, 2, 1, SD_TP_LM_HEAD_SPLIT, &m), SD_OK);
    sd_model_free(&m);
}

/* SmolLM2-135M: 9 heads, 3 KV heads, MLP 1536, vocab 49152, Q4_1 (blocks of
 * 32: each rank's 192 attention and 512 MLP columns are whole blocks). */
static void test_smollm_tp3(void **state) {
    (void)state;
    const char *path = getenv("SPECD_MODEL");
    if (!path || access(path, R_OK) != 0) {
        fprintf(stderr, "skipped: SPECD_MODEL (the demo model) is not set or not readable\n");
        skip();
    }
    check_matches(path, 3, SD_TP_LM_HEAD_SPLIT, "SmolLM2-135M, tp 3, head split", true, true);
}

/* `test_tp cuda`: on a GPU, the model with a one-rank NCCL group (every
 * all-reduce and the LM head's gather run, on device buffers) gives the
 * same logits, bit for bit, as without a group. Exits 77 without a CUDA
 * build or a usable GPU. */
static int cuda_main(void) {
    setup_models(NULL);
    if (!env.ok) {
        printf("test_tp cuda: skipped: specd-mkmodel could not write a model\n");
        return 77;
    }
    int rc = 1;
    sd_weights *w = NULL;
    sd_model *plain = NULL, *grouped = NULL;
    sd_kv *kv1 = NULL, *kv2 = NULL;
    sd_coll *coll = NULL;
    float *a = NULL, *b = NULL;
    uint8_t id[1024];
    size_t id_len = 0;
    sd_model_params mp = sd_model_default_params();
    mp.device = 0;
    if (sd_weights_open(env.m_gqa, &w) != SD_OK) goto out;
    if (sd_model_load_weights(w, &mp, &plain) != SD_OK) {
        printf("test_tp cuda: skipped: no CUDA backend or no usable GPU (the model could not be put on cuda:0)\n");
        rc = 77;
        goto out;
    }
    sd_coll_params cp = sd_coll_default_params();
    if (sd_coll_nccl_unique_id(id, sizeof id, &id_len) != SD_OK ||
        sd_coll_nccl_open(id, id_len, 0, &cp, &coll) != SD_OK) {
        printf("test_tp cuda: skipped: NCCL is not usable here\n");
        rc = 77;
        goto out;
    }
    memset(id, 0, sizeof id);
    int32_t V = sd_model_config_of(plain)->n_vocab;
    size_t bytes = (size_t)MAX_SEQS * MAX_LEN * (size_t)V * sizeof(float);
    a = calloc(1, bytes);
    b = calloc(1, bytes);
    workload wl = make_workload(V, 13);
    for (int mode = 0; mode < 2; mode++) {
        mp.tp_lm_head = mode ? SD_TP_LM_HEAD_LEADER : SD_TP_LM_HEAD_SPLIT;
        mp.coll = coll;
        if (!a || !b || sd_model_load_weights(w, &mp, &grouped) != SD_OK) goto out;
        if (sd_model_kv_create(plain, MAX_SEQS, KV_BLOCKS, BLOCK, &kv1) != SD_OK ||
            sd_model_kv_create(grouped, MAX_SEQS, KV_BLOCKS, BLOCK, &kv2) != SD_OK)
            goto out;
        if (run_workload(plain, kv1, &wl, SCHED_MIXED, a) != SD_OK ||
            run_workload(grouped, kv2, &wl, SCHED_MIXED, b) != SD_OK)
            goto out;
        for (int32_t s = 0; s < wl.n_seqs; s++)
            for (int32_t p = 0; p < wl.len[s]; p++)
                if (memcmp(a + row_of(s, p) * (size_t)V, b + row_of(s, p) * (size_t)V, (size_t)V * sizeof(float))) {
                    printf("test_tp cuda: head %s: seq %d pos %d differs with a one-rank NCCL group\n",
                           mode ? "on the leader" : "split", (int)s, (int)p);
                    goto out;
                }
        printf("test_tp cuda: head %s: %d rows bit-identical with a one-rank NCCL group\n",
               mode ? "on the leader" : "split", 4 * MAX_LEN);
        sd_kv_free(&kv1);
        sd_kv_free(&kv2);
        sd_model_free(&grouped);
    }
    rc = 0;
out:
    if (rc == 1) printf("test_tp cuda: FAILED\n");
    sd_kv_free(&kv1);
    sd_kv_free(&kv2);
    sd_model_free(&grouped);
    sd_model_free(&plain);
    sd_coll_close(&coll);
    sd_weights_close(&w);
    free(a);
    free(b);
    teardown_models(NULL);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) return cuda_main();
    if (argc > 1 && strcmp(argv[1], "smollm") == 0) {
        const char *path = getenv("SPECD_MODEL");
        if (!path || access(path, R_OK) != 0) {
            printf("test_tp smollm: skipped: SPECD_MODEL (the demo model) is not set or not readable\n");
            return 77;
        }
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_smollm_tp3)};
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_matches_tp1),    cmocka_unit_test(test_tp4_matches_tp1),
        cmocka_unit_test(test_tp_batch_invariant), cmocka_unit_test(test_tp_prefix_cache),
        cmocka_unit_test(test_tp_resident_bytes),  cmocka_unit_test(test_tp_refusals),
        cmocka_unit_test(test_tp_arch_matches_tp1),
    };
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
