/* test_tp_window.c — the KV cache's window group (engine/kv_window.c,
 * engine/model_window.c) in tensor-parallel groups: forked rank processes
 * over the shared-memory collectives, the leader's plans carrying the
 * window table (tests/tp_wire.c; the verifier's group: GroupPlan.bt_win).
 *
 * The workload, on the leader, as a speculative verifier drives its cache:
 * a prompt prefilled in one call at main block ids past the window pools'
 * (another sequence holds the low ones), then steps that append a token and
 * three drafts to each, want every row, and keep 1..4 of the four (the rest
 * rolled back); five steps of each sequence also roll it back 20 tokens
 * (past the window, inside the slack: the window stays), two 40 (past the
 * slack and the window: the slot empties, kv.h, and the rows are recomputed
 * in one call, unlogged). Sequences of 160 tokens, a window of 12, blocks of 4:
 * blocks leave the window all along. Every row computed outside a
 * recomputation is logged in call order.
 *
 * Checked, on random Gemma 3 (5 windowed layers of 7, 4 heads, 2 KV heads)
 * and Mistral (every layer windowed) models written by specd-mkmodel:
 *   - TP 2 and 4 (KV heads replicated at 4) against TP 1, row by row, within
 *     test_tp's tolerance (max |diff| <= 1e-5 x max |logit|, the same
 *     argmax: the all-reduce sums in another order);
 *   - TP 2 with the window group against TP 2 whose caches keep the whole
 *     context (no window group on any rank): bit for bit;
 *   - the window blocks the leader holds per sequence stay within the bound
 *     after every draft step, the deep rollbacks emptied the slot, and every
 *     rank's cache has the leader's window pool, smaller than a
 *     whole-context cache;
 *   - a rank refuses (SD_ERR_RANGE) a plan without the window table, one
 *     with an entry outside the window pool, one whose token reads a freed
 *     entry, and a window table its cache does not have; and a group whose
 *     leader drops the table fails instead of computing. */
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
#include <unistd.h>

#include <cmocka.h>

#include "specd/coll.h"
#include "specd/kv.h"
#include "specd/model.h"
#include "specd/weights.h"
#include "tp_wire.h"

#define MAX_TP    4
#define N_SEQS    2
#define SEQ_LEN   160
#define MAX_HIST  (SEQ_LEN + 8)
#define MAX_ROWS  4096
#define KV_BLOCKS 256
#define BLOCK     4
#define WINDOW    12
#define SLACK     32 /* sd_kv_default_params' window_slack: SD_MAX_K */
#define VOCAB     512
#define DRAFTS    3

static struct {
    char dir[64];
    char gemma[128], mistral[128];
    bool ok;
} env;

static int setup_models(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-tpw-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.gemma, sizeof env.gemma, "%s/gemma.gguf", env.dir);
    snprintf(env.mistral, sizeof env.mistral, "%s/mistral.gguf", env.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%1$s' -o '%2$s' --arch gemma3 --layers 7 --dim 128 --heads 4 --kv-heads 2 --head-dim 32 --ff 256 "
             "--tied --window %4$d --vocab %5$d --seed 21 >/dev/null && "
             "'%1$s' -o '%3$s' --arch mistral --layers 2 --dim 128 --heads 4 --kv-heads 2 --ff 256 --window %4$d "
             "--vocab %5$d --seed 22 >/dev/null",
             SPECD_MKMODEL, env.gemma, env.mistral, WINDOW, VOCAB);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown_models(void **state) {
    (void)state;
    unlink(env.gemma);
    unlink(env.mistral);
    rmdir(env.dir);
    return 0;
}

/* ------------------------------------------------------------ one group's run */

typedef struct rank_kv {
    int32_t window, window_blocks;
    uint64_t pool_bytes, whole_bytes; /* its cache's pools; a whole-context cache's */
} rank_kv;

typedef struct group_case {
    const char *model;
    int tp;
    bool whole;       /* no window group anywhere: every layer keeps the context */
    bool drop_window; /* the leader's plans leave the window table out */
    char shm_name[64];
    /* shared with the forked ranks */
    float *rows;    /* [MAX_ROWS][VOCAB] logged rows, call order */
    int32_t *meta;  /* [0] rows logged, [1] deep rollbacks that emptied a slot, [2] most window blocks held */
    rank_kv *ranks; /* [MAX_TP] */
} group_case;

static uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u, *s >> 8; }

/* One call: the tokens of each sequence from its kv length to hist's end
 * (n_hist[s]), all rows wanted; logged unless quiet. */
static sd_status run_call(sd_model *m, sd_kv *kv, int32_t hist[N_SEQS][MAX_HIST], const int32_t *n_hist, bool quiet,
                          group_case *gc, float *buf) {
    int32_t tok[N_SEQS * MAX_HIST], pos[N_SEQS * MAX_HIST], seq[N_SEQS * MAX_HIST], n = 0;
    bool want[N_SEQS * MAX_HIST];
    for (int32_t s = 0; s < N_SEQS; s++)
        for (int32_t p = sd_kv_seq_len(kv, s); p < n_hist[s]; p++)
            tok[n] = hist[s][p], pos[n] = p, seq[n] = s, want[n] = true, n++;
    sd_batch b = {n, tok, pos, seq, want};
    SD_TRY(sd_model_forward(m, kv, &b, buf));
    if (quiet) return SD_OK;
    if (gc->meta[0] + n > MAX_ROWS) {
        fprintf(stderr, "more than %d rows logged\n", MAX_ROWS);
        return SD_ERR_RANGE;
    }
    memcpy(gc->rows + (size_t)gc->meta[0] * VOCAB, buf, (size_t)n * VOCAB * sizeof(float));
    gc->meta[0] += n;
    return SD_OK;
}

/* The workload at the top of the file, on the leader's m and kv. */
static sd_status run_spec(group_case *gc, sd_model *m, sd_kv *kv) {
    static int32_t hist[N_SEQS][MAX_HIST];
    int32_t n_hist[N_SEQS] = {30, 5}, steps[N_SEQS] = {0, 0};
    uint32_t seed = 4242;
    float *buf = malloc((size_t)N_SEQS * MAX_HIST * VOCAB * sizeof(float));
    if (!buf) return SD_ERR_NOMEM;
    for (int32_t s = 0; s < N_SEQS; s++)
        for (int32_t p = 0; p < MAX_HIST; p++) hist[s][p] = (int32_t)(lcg(&seed) % VOCAB);
    /* sequence 1 first takes 160 main blocks (bookkeeping only, 64 tokens a
     * grow so its window keeps moving), so sequence 0's main block ids run
     * past the window pools': a windowed layer addressed through the main
     * table would leave its pool */
    sd_status st = SD_OK;
    for (int32_t n = 64; st == SD_OK && n <= 160 * BLOCK; n += 64) st = sd_kv_grow(kv, 1, n);
    if (st == SD_OK) st = run_call(m, kv, hist, n_hist, false, gc, buf);
    sd_kv_release(kv, 1);
    const int32_t bound = (WINDOW + SLACK + BLOCK - 1 + DRAFTS + 1 + BLOCK - 1) / BLOCK + 1;
    while (st == SD_OK && (n_hist[0] < SEQ_LEN || n_hist[1] < SEQ_LEN)) {
        int32_t len[N_SEQS];
        for (int32_t s = 0; s < N_SEQS; s++) {
            len[s] = n_hist[s];
            if (n_hist[s] < SEQ_LEN) n_hist[s] += 1 + DRAFTS; /* a token and its drafts: fresh ones */
            for (int32_t p = len[s]; p < n_hist[s]; p++) hist[s][p] = (int32_t)(lcg(&seed) % VOCAB);
        }
        st = run_call(m, kv, hist, n_hist, false, gc, buf);
        for (int32_t s = 0; st == SD_OK && s < N_SEQS; s++) {
            if (len[s] == n_hist[s]) continue;
            int32_t held = sd_kv_window_held(kv, s);
            if (held > gc->meta[2]) gc->meta[2] = held;
            if (!gc->whole && held > bound) {
                fprintf(stderr, "seq %d at %d holds %d window blocks, over %d\n", (int)s, (int)n_hist[s], (int)held,
                        (int)bound);
                st = SD_ERR_INTERNAL;
            }
            int32_t keep = len[s] + 1 + (int32_t)(lcg(&seed) % (DRAFTS + 1)), step = ++steps[s];
            if ((step == 30 || step == 60) && keep > 60)
                keep -= 40; /* past the slack and the window */
            else if (step % 10 == 7 && step < 50 && keep > 30)
                keep -= 20;
            if (st == SD_OK) st = sd_kv_truncate(kv, s, keep);
            if (st == SD_OK && sd_kv_seq_len(kv, s) < keep) gc->meta[1]++;
            n_hist[s] = keep;
        }
        /* recompute what a deep rollback emptied, unlogged */
        if (st == SD_OK && (sd_kv_seq_len(kv, 0) < n_hist[0] || sd_kv_seq_len(kv, 1) < n_hist[1]))
            st = run_call(m, kv, hist, n_hist, true, gc, buf);
    }
    free(buf);
    return st;
}

static sd_status load(const char *path, int tp, int rank, sd_model **out) {
    sd_weights *w = NULL;
    SD_TRY(sd_weights_open(path, &w));
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    mp.tp_size = tp;
    mp.tp_rank = rank;
    sd_status st = sd_model_load_weights(w, &mp, out);
    sd_weights_close(&w);
    return st;
}

/* The leader's cache: sd_model_kv_create's, or one without a window group. */
static sd_status leader_kv(const sd_model *m, bool whole, sd_kv **kv) {
    if (!whole) return sd_model_kv_create(m, N_SEQS, KV_BLOCKS, BLOCK, kv);
    sd_model_shard sh;
    sd_model_shard_of(m, &sh);
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = sd_model_config_of(m)->n_layers;
    p.n_kv_heads = sh.n_kv_heads;
    p.head_dim = sd_model_config_of(m)->head_dim;
    p.block_size = BLOCK, p.n_blocks = KV_BLOCKS, p.max_seqs = N_SEQS;
    return sd_kv_create(&p, kv);
}

/* Plans a rank must refuse before anything runs (kv has a window group). */
static int check_bad_plans(sd_model *m, sd_kv *kv) {
    int32_t tok[2] = {1, 2}, pos[2] = {0, 1}, off[2] = {0, 0}, bt[1] = {0}, wanted[1] = {1}, win[1] = {0};
    const sd_model_plan good = {2, tok, pos, off, 1, bt, 1, wanted, win};
    sd_model_plan p = good;
    p.bt_win = NULL; /* the table left out */
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 30;
    int32_t outside[1] = {sd_kv_params_of(kv)->window_blocks};
    p = good, p.bt_win = outside;
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 31;
    int32_t freed[1] = {-1}; /* positions 0 and 1 read entry 0 */
    p = good, p.bt_win = freed;
    if (sd_model_forward_plan(m, kv, &p) != SD_ERR_RANGE) return 32;
    sd_kv *whole = NULL; /* a cache without a window group gets no table */
    if (sd_model_kv_create_rank(m, KV_BLOCKS, BLOCK, 0, &whole) != SD_OK || sd_kv_window(whole) != 0) return 33;
    sd_status st = sd_model_forward_plan(m, whole, &good);
    sd_kv_free(&whole);
    return st == SD_ERR_RANGE ? 0 : 34;
}

/* Rank r > 0: its cache from the leader's pool shape, then the plans. */
static int rank_loop(group_case *gc, int rank, sd_model *m, sd_coll *coll, int32_t window_blocks) {
    sd_kv *kv = NULL, *whole = NULL;
    if (sd_model_kv_create_rank(m, KV_BLOCKS, BLOCK, gc->whole ? 0 : window_blocks, &kv) != SD_OK ||
        sd_model_kv_create_rank(m, KV_BLOCKS, BLOCK, 0, &whole) != SD_OK)
        return 40;
    gc->ranks[rank] =
        (rank_kv){sd_kv_window(kv), sd_kv_params_of(kv)->window_blocks, sd_kv_pool_bytes(kv), sd_kv_pool_bytes(whole)};
    sd_kv_free(&whole);
    int rc = rank == 1 && !gc->whole ? check_bad_plans(m, kv) : 0;
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
    sd_kv_free(&kv);
    return rc;
}

static int rank_main(group_case *gc, int rank) {
    sd_model *m = NULL;
    if (load(gc->model, gc->tp, rank, &m) != SD_OK) return 10;
    /* the leader's window pool, as the verifier's GroupSetup tells it */
    int32_t window_blocks = sd_model_kv_window_blocks(m, N_SEQS, KV_BLOCKS, BLOCK);
    sd_coll_params cp = sd_coll_default_params();
    cp.rank = rank, cp.size = gc->tp, cp.timeout_ms = 60000, cp.max_bytes = 1 << 16;
    sd_coll *coll = NULL;
    int rc = 0;
    if (gc->tp > 1 && sd_coll_shm_open(gc->shm_name, &cp, &coll) != SD_OK) rc = 11;
    if (!rc && coll && sd_model_set_coll(m, coll) != SD_OK) rc = 12;
    if (!rc && rank == 0) {
        sd_kv *kv = NULL;
        if (leader_kv(m, gc->whole, &kv) != SD_OK) rc = 13;
        if (!rc && sd_kv_params_of(kv)->window_blocks != (gc->whole ? 0 : window_blocks)) rc = 16;
        if (!rc) {
            gc->ranks[0] = (rank_kv){sd_kv_window(kv), sd_kv_params_of(kv)->window_blocks, sd_kv_pool_bytes(kv), 0};
            plan_wire pw = {.coll = coll, .drop_window = gc->drop_window};
            if (coll) sd_model_set_plan_sink(m, tp_wire_send, &pw);
            if (run_spec(gc, m, kv) != SD_OK) rc = 14;
            if (coll && tp_wire_end(coll) != SD_OK && !rc) rc = 15;
            free(pw.buf);
        }
        sd_kv_free(&kv);
    } else if (!rc) {
        rc = rank_loop(gc, rank, m, coll, window_blocks);
    }
    if (rc && coll) sd_coll_abort(coll); /* the others fail fast instead of timing out */
    sd_model_set_coll(m, NULL);
    sd_coll_close(&coll);
    sd_model_free(&m);
    return rc;
}

static void *shared(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0, bytes);
    return p;
}

/* Runs gc's group (tp 1 in this process); returns how many ranks failed. */
static int run_group(group_case *gc) {
    gc->rows = shared((size_t)MAX_ROWS * VOCAB * sizeof(float));
    gc->meta = shared(4 * sizeof(int32_t));
    gc->ranks = shared(MAX_TP * sizeof(rank_kv));
    static int counter;
    snprintf(gc->shm_name, sizeof gc->shm_name, "specd-test-tpw-%d-%d", (int)getpid(), ++counter);
    if (gc->tp == 1) {
        int rc = rank_main(gc, 0);
        if (rc) fprintf(stderr, "tp 1: exit %d\n", rc);
        return rc != 0;
    }
    pid_t pids[MAX_TP];
    for (int r = 0; r < gc->tp; r++) {
        fflush(NULL);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) exit(rank_main(gc, r)); /* exit, not _exit: LeakSanitizer checks the rank */
    }
    int failed = 0;
    for (int r = 0; r < gc->tp; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0); /* a hung rank: the collectives' 60 s timeout, then ctest's */
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rank %d of %d: status 0x%x, exit %d\n", r, gc->tp, status,
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            failed++;
        }
    }
    return failed;
}

static void free_group(group_case *gc) {
    munmap(gc->rows, (size_t)MAX_ROWS * VOCAB * sizeof(float));
    munmap(gc->meta, 4 * sizeof(int32_t));
    munmap(gc->ranks, MAX_TP * sizeof(rank_kv));
}

static int32_t argmax(const float *x) {
    int32_t best = 0;
    for (int32_t i = 1; i < VOCAB; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* a (TP 1) against b, row by row: test_tp's tolerance, or bit for bit. */
static void compare(const group_case *a, const group_case *b, bool bits, const char *what) {
    assert_int_equal(a->meta[0], b->meta[0]);
    double worst = 0;
    for (int32_t r = 0; r < a->meta[0]; r++) {
        const float *x = a->rows + (size_t)r * VOCAB, *y = b->rows + (size_t)r * VOCAB;
        if (bits) {
            if (memcmp(x, y, VOCAB * sizeof(float))) fail_msg("%s: row %d differs bit for bit", what, (int)r);
            continue;
        }
        double top = 0, diff = 0;
        for (int32_t i = 0; i < VOCAB; i++) {
            top = fmax(top, fabs(x[i]));
            diff = fmax(diff, fabs((double)x[i] - y[i]));
        }
        if (diff > 1e-5 * top)
            fail_msg("%s: row %d: max |diff| %.3g > 1e-5 x max |logit| %.3g", what, (int)r, diff, top);
        if (argmax(x) != argmax(y))
            fail_msg("%s: row %d: argmax %d vs %d", what, (int)r, (int)argmax(x), (int)argmax(y));
        worst = fmax(worst, diff / (top > 0 ? top : 1));
    }
    fprintf(stderr, "%s: %d rows, %s (max |diff| / max |logit| %.3g)\n", what, (int)a->meta[0],
            bits ? "bit for bit" : "within 1e-5", worst);
}

/* The window group's bounds on a windowed run of tp ranks. */
static void check_bounds(const group_case *gc) {
    assert_true(gc->meta[1] > 0); /* a deep rollback emptied a slot */
    const rank_kv *lead = &gc->ranks[0];
    assert_int_equal(lead->window, WINDOW);
    assert_true(lead->window_blocks > 0 && lead->window_blocks < KV_BLOCKS);
    for (int r = 1; r < gc->tp; r++) {
        const rank_kv *k = &gc->ranks[r];
        assert_int_equal(k->window, WINDOW);
        assert_int_equal(k->window_blocks, lead->window_blocks);
        assert_int_equal(k->pool_bytes, lead->pool_bytes); /* the same shard shapes */
        assert_true(k->pool_bytes < k->whole_bytes);
    }
    fprintf(stderr, "tp %d: %d window blocks per pool of %d, at most %d held per sequence; %d deep rollbacks emptied\n",
            gc->tp, (int)lead->window_blocks, KV_BLOCKS, (int)gc->meta[2], (int)gc->meta[1]);
}

static void check_model(const char *model, const char *name, int max_tp) {
    if (!env.ok) {
        fprintf(stderr, "skipped: specd-mkmodel could not write models\n");
        skip();
    }
    group_case ref = {.model = model, .tp = 1};
    assert_int_equal(run_group(&ref), 0);
    check_bounds(&ref);
    for (int tp = 2; tp <= max_tp; tp *= 2) {
        group_case g = {.model = model, .tp = tp};
        assert_int_equal(run_group(&g), 0);
        check_bounds(&g);
        char what[64];
        snprintf(what, sizeof what, "%s tp %d vs tp 1", name, tp);
        compare(&ref, &g, false, what);
        if (tp == 2) {
            group_case whole = {.model = model, .tp = 2, .whole = true};
            assert_int_equal(run_group(&whole), 0);
            snprintf(what, sizeof what, "%s tp 2: window group vs whole context", name);
            compare(&whole, &g, true, what);
            free_group(&whole);
        }
        free_group(&g);
    }
    free_group(&ref);
}

static void test_gemma3(void **state) {
    (void)state;
    check_model(env.gemma, "gemma3", 4);
}

static void test_mistral(void **state) {
    (void)state;
    check_model(env.mistral, "mistral", 4);
}

/* A leader that leaves the window table out of its plans: rank 1 refuses
 * the first plan and the group fails, instead of writing the windowed
 * layers at the main table's ids (outside the window pools). */
static void test_dropped_table(void **state) {
    (void)state;
    if (!env.ok) skip();
    group_case g = {.model = env.gemma, .tp = 2, .drop_window = true};
    assert_true(run_group(&g) > 0);
    free_group(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_dropped_table),
    };
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
