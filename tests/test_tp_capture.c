/* test_tp_capture.c — the feature capture (engine/model_capture.c) on a
 * tensor-parallel group's leader: what an EAGLE-3 head in a TP verifier
 * (specd-verifier --tp N --eagle DIR) reads, and what the group sends a
 * head drafter (VerifyResult.features).
 *
 * Each case forks tp ranks over the shared-memory collectives, as
 * test_tp.c does (tests/tp_wire.c carries the leader's plans). Only the
 * leader sets a capture (sd_model_capture_set: three layers, and the final
 * norm); after every forward it copies each row's captured layers and
 * final-norm row into shared memory keyed by (sequence, position).
 *
 * Checked, on a random 4-layer model written by specd-mkmodel (dim 64, 4
 * heads, 2 KV heads, f32), layers {0, 2, 3}:
 *   - TP 2 and TP 4 (KV heads replicated) equal TP 1 within the tolerance
 *     test_tp uses for logits: per row, max |diff| <= 1e-5 x the row's max
 *     |value|, for every captured layer and the final norm (the all-reduce
 *     adds the row-parallel partial sums in another order than one rank, so
 *     bits may differ; the worst ratio is printed);
 *   - the rows are those of the right positions: a control compares TP 2
 *     against TP 1 shifted by one position and must fail the same bound;
 *   - under TP 2 a row's features do not depend on the batch: each sequence
 *     alone, token by token, equals them all interleaved in two chunks, bit
 *     for bit (the prefix cache's side rows rely on it: verify_head.c). */
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
#define N_CAP        3
#define DIM          64
#define WIDTH        ((N_CAP + 1) * DIM) /* a row: the three layers, then the final norm */
#define GROUP_WAIT_S 600.0

static const int32_t cap_layers[N_CAP] = {0, 2, 3};

static struct {
    char dir[64];
    char model[128];
    bool ok;
} env;

static int setup_model(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-tpcap-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.model, sizeof env.model, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --dim %d --layers 4 --heads 4 --kv-heads 2 --ff 128 --vocab 512 --seed 31 >/dev/null",
             SPECD_MKMODEL, env.model, DIM);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown_model(void **state) {
    (void)state;
    unlink(env.model);
    rmdir(env.dir);
    return 0;
}

typedef enum { SCHED_MIXED, SCHED_ALONE } sched;

typedef struct workload {
    int32_t n_seqs;
    int32_t len[MAX_SEQS];
    int32_t ids[MAX_SEQS][MAX_LEN];
} workload;

static workload make_workload(uint32_t seed) {
    workload w = {.n_seqs = 4, .len = {7, 3, 12, 5}};
    for (int32_t s = 0; s < w.n_seqs; s++)
        for (int32_t p = 0; p < w.len[s]; p++) {
            seed = seed * 1664525u + 1013904223u;
            w.ids[s][p] = (int32_t)((seed >> 8) % 512u);
        }
    return w;
}

static size_t row_of(int32_t s, int32_t p) { return (size_t)s * MAX_LEN + (size_t)p; }

/* The capture of the last forward's n rows into out [row_of][WIDTH]. */
static sd_status store_rows(const sd_model *m, const int32_t *seq, const int32_t *pos, int32_t n, float *out) {
    int32_t n_aux = 0, n_fin = 0;
    const float *aux = sd_model_capture_aux(m, &n_aux), *fin = sd_model_capture_final(m, &n_fin);
    if (!aux || !fin || n_aux != n || n_fin != n) return SD_ERR_INTERNAL;
    for (int32_t i = 0; i < n; i++) {
        float *dst = out + row_of(seq[i], pos[i]) * WIDTH;
        memcpy(dst, aux + (size_t)i * N_CAP * DIM, N_CAP * DIM * sizeof(float));
        memcpy(dst + N_CAP * DIM, fin + (size_t)i * DIM, DIM * sizeof(float));
    }
    return SD_OK;
}

/* The schedule on the leader's m (test_tp.c's: "mixed" runs each
 * sequence's first half interleaved, then the rest; "alone" one token a
 * call), its captured rows into out. */
static sd_status run_workload(sd_model *m, sd_kv *kv, const workload *w, sched sc, float *out) {
    int32_t tokens[MAX_SEQS * MAX_LEN], pos[MAX_SEQS * MAX_LEN], seq[MAX_SEQS * MAX_LEN];
    bool want[MAX_SEQS * MAX_LEN];
    const int32_t V = sd_model_config_of(m)->n_vocab;
    float *logits = malloc((size_t)MAX_SEQS * MAX_LEN * (size_t)V * sizeof(float));
    if (!logits) return SD_ERR_NOMEM;
    int32_t done[MAX_SEQS] = {0};
    sd_status st = sd_model_capture_set(m, N_CAP, cap_layers, true);
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
        if (st == SD_OK) st = store_rows(m, seq, pos, n, out);
        for (int32_t i = 0; st == SD_OK && i < n; i++) done[seq[i]] = pos[i] + 1;
    }
    sd_model_capture_set(m, 0, NULL, false);
    free(logits);
    return st;
}

typedef struct group_case {
    int tp;
    sched sc;
    char shm_name[64];
    float *out; /* shared: [MAX_SEQS*MAX_LEN][WIDTH] written by rank 0 */
} group_case;

static sd_status load(int tp, int rank, sd_model **out) {
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(env.model, &w);
    if (st != SD_OK) return st;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    mp.tp_size = tp;
    mp.tp_rank = rank;
    st = sd_model_load_weights(w, &mp, out);
    sd_weights_close(&w);
    return st;
}

static int rank_main(group_case *gc, int rank) {
    sd_model *m = NULL;
    if (load(gc->tp, rank, &m) != SD_OK) return 10;
    sd_coll_params cp = sd_coll_default_params();
    cp.rank = rank;
    cp.size = gc->tp;
    cp.timeout_ms = 60000;
    sd_coll *coll = NULL;
    if (sd_coll_shm_open(gc->shm_name, &cp, &coll) != SD_OK) {
        sd_model_free(&m);
        return 11;
    }
    int rc = sd_model_set_coll(m, coll) == SD_OK ? 0 : 12;
    sd_kv *kv = NULL;
    if (!rc && sd_model_kv_create(m, MAX_SEQS, KV_BLOCKS, BLOCK, &kv) != SD_OK) rc = 13;
    plan_wire pw = {.coll = coll};
    if (!rc && rank == 0) {
        sd_model_set_plan_sink(m, tp_wire_send, &pw);
        workload w = make_workload(53);
        if (run_workload(m, kv, &w, gc->sc, gc->out) != SD_OK) rc = 14;
        if (tp_wire_end(coll) != SD_OK && !rc) rc = 15;
    } else if (!rc) {
        for (sd_model_plan p; !rc;) {
            int got = tp_wire_recv(&pw, &p);
            if (got <= 0) {
                rc = got < 0 ? 21 : 0;
                break;
            }
            if (sd_model_forward_plan(m, kv, &p) != SD_OK) rc = 22;
        }
    }
    free(pw.buf);
    if (rc) sd_coll_abort(coll);
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

static const size_t out_bytes = (size_t)MAX_SEQS * MAX_LEN * WIDTH * sizeof(float);

/* Runs gc (tp 1 in this process) and returns its rows, or asserts. */
static float *run_group(group_case *gc) {
    gc->out = mmap(NULL, out_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(gc->out != MAP_FAILED);
    memset(gc->out, 0, out_bytes);
    static int counter;
    snprintf(gc->shm_name, sizeof gc->shm_name, "specd-test-tpcap-%d-%d", (int)getpid(), ++counter);
    if (gc->tp == 1) {
        sd_model *m = NULL;
        sd_kv *kv = NULL;
        assert_int_equal(load(1, 0, &m), SD_OK);
        assert_int_equal(sd_model_kv_create(m, MAX_SEQS, KV_BLOCKS, BLOCK, &kv), SD_OK);
        workload w = make_workload(53);
        assert_int_equal(run_workload(m, kv, &w, gc->sc, gc->out), SD_OK);
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
            int status = 0;
            if (pids[r] <= 0) continue;
            if (late) {
                fprintf(stderr, "rank %d hung: killing it\n", r);
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status, 0);
            } else if (waitpid(pids[r], &status, WNOHANG) != pids[r]) {
                continue;
            }
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "rank %d of %d failed (status 0x%x)\n", r, gc->tp, status);
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

/* The worst, over every row of w and each of its N_CAP + 1 parts, of max
 * |a - b| / max |a| (b's row of position p + shift); *n_over the parts
 * past 1e-5. */
static double worst_ratio(const float *a, const float *b, const workload *w, int32_t shift, int *n_over) {
    double worst = 0;
    *n_over = 0;
    for (int32_t s = 0; s < w->n_seqs; s++)
        for (int32_t p = 0; p + shift < w->len[s]; p++)
            for (int32_t part = 0; part <= N_CAP; part++) {
                const float *x = a + row_of(s, p) * WIDTH + part * DIM;
                const float *y = b + row_of(s, p + shift) * WIDTH + part * DIM;
                double top = 0, diff = 0;
                for (int32_t i = 0; i < DIM; i++) {
                    top = fmax(top, fabs(x[i]));
                    diff = fmax(diff, fabs((double)x[i] - y[i]));
                }
                assert_true(top > 0); /* a row was captured: nothing left at zero */
                worst = fmax(worst, diff / top);
                *n_over += diff > 1e-5 * top;
            }
    return worst;
}

static void check_tp(int tp) {
    workload w = make_workload(53);
    group_case ref = {.tp = 1, .sc = SCHED_MIXED}, grp = {.tp = tp, .sc = SCHED_MIXED};
    float *a = run_group(&ref), *b = run_group(&grp);
    int over = 0;
    double worst = worst_ratio(a, b, &w, 0, &over);
    fprintf(stderr, "tp %d: captured layers 0, 2, 3 and the final norm vs tp 1: max |diff| / max |value| = %.3g\n", tp,
            worst);
    if (over > 0) fail_msg("tp %d: %d captured rows differ from tp 1 by more than 1e-5 x their max |value|", tp, over);
    if (tp == 2) { /* control: the neighbouring position's rows must fail the bound */
        int shifted = 0;
        double off = worst_ratio(a, b, &w, 1, &shifted);
        fprintf(stderr, "control: tp 2 against tp 1 one position on: %d rows past 1e-5 (worst %.3g)\n", shifted, off);
        assert_true(shifted > 0 && off > 1e-3);
    }
    munmap(a, out_bytes);
    munmap(b, out_bytes);
}

static void test_capture_tp2_tp4(void **state) {
    (void)state;
    if (!env.ok) skip();
    check_tp(2);
    check_tp(4); /* 2 KV heads over 4 ranks: replicated */
}

static void test_capture_tp_batch_invariant(void **state) {
    (void)state;
    if (!env.ok) skip();
    group_case mixed = {.tp = 2, .sc = SCHED_MIXED}, alone = {.tp = 2, .sc = SCHED_ALONE};
    float *a = run_group(&mixed), *b = run_group(&alone);
    workload w = make_workload(53);
    for (int32_t s = 0; s < w.n_seqs; s++)
        for (int32_t p = 0; p < w.len[s]; p++)
            if (memcmp(a + row_of(s, p) * WIDTH, b + row_of(s, p) * WIDTH, WIDTH * sizeof(float)))
                fail_msg("tp 2: seq %d pos %d: the captured row differs alone and interleaved", (int)s, (int)p);
    munmap(a, out_bytes);
    munmap(b, out_bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_tp2_tp4),
        cmocka_unit_test(test_capture_tp_batch_invariant),
    };
    return cmocka_run_group_tests(tests, setup_model, teardown_model);
}
