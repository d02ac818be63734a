/* test_model_view.c — sd_model_view_layers, the zero-copy self-draft.
 *
 * On a random 4-layer model (specd-mkmodel, ~16 MB of f32 layer weights):
 *   - a view of the first L layers gives logits bit-identical to the same
 *     file loaded with n_layers_used = L, for L = 1..4, on a ragged batch;
 *   - creating a view and running it grows the resident set by far less
 *     than the layer weights, while loading the same L layers again grows it
 *     by at least most of them (so the measurement can tell the two apart);
 *   - the view survives its parent's use and frees cleanly (ASan checks that
 *     the borrowed weights are freed once, by the parent);
 *   - the self-draft drafter built on a view proposes the same tokens and q
 *     as the one loaded from the file;
 *   - bad arguments are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"

#define VOCAB  300
#define LAYERS 4

static struct {
    char dir[64], path[128];
    bool ok;
} env;

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-view-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers %d --dim 256 --ff 1024 --heads 4 --kv-heads 2 --vocab %d --seed 5 "
             ">/dev/null 2>&1",
             SPECD_MKMODEL, env.path, LAYERS, VOCAB);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(env.path);
    rmdir(env.dir);
    return 0;
}

static sd_model *load(int32_t n_layers_used) {
    sd_gguf *g = NULL;
    char err[128];
    assert_int_equal(sd_gguf_open(env.path, &g, err, sizeof err), SD_OK);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    mp.n_layers_used = n_layers_used;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_gguf_close(&g);
    return m;
}

/* Logits of a fixed two-sequence ragged batch (all rows) into out[14][VOCAB]. */
static void run_batch(sd_model *m, float *out) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 2, 8, 16, &kv), SD_OK);
    const int32_t tokens[14] = {5, 17, 99, 3, 250, 42, 7, 8, 11, 200, 1, 2, 299, 64};
    int32_t pos[14], seq[14];
    bool want[14];
    int32_t next[2] = {0, 0};
    for (int32_t i = 0; i < 14; i++) {
        seq[i] = i % 3 == 0;
        pos[i] = next[seq[i]]++;
        want[i] = true;
    }
    sd_batch b = {14, tokens, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    sd_kv_free(&kv);
}

static void skip_without_model(void) {
    if (!env.ok) {
        print_message("specd-mkmodel could not write the test model: skipped\n");
        skip();
    }
}

static void test_view_logits_equal_partial_load(void **state) {
    (void)state;
    skip_without_model();
    sd_model *full = load(0);
    float *want = malloc(14 * VOCAB * sizeof *want), *got = malloc(14 * VOCAB * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    for (int32_t L = 1; L <= LAYERS; L++) {
        sd_model *partial = load(L), *view = NULL;
        assert_int_equal(sd_model_view_layers(full, L, &view), SD_OK);
        assert_int_equal(sd_model_config_of(view)->n_vocab, VOCAB);
        run_batch(partial, want);
        run_batch(view, got);
        assert_memory_equal(want, got, 14 * VOCAB * sizeof *got);
        assert_true(sd_model_weight_bytes(view) == sd_model_weight_bytes(partial));
        sd_model_free(&view);
        assert_null(view);
        sd_model_free(&partial);
    }
    /* The parent still works after its views are gone. */
    sd_model *again = load(0);
    run_batch(full, want);
    run_batch(again, got);
    assert_memory_equal(want, got, 14 * VOCAB * sizeof *got);
    sd_model_free(&again);
    free(want);
    free(got);
    sd_model_free(&full);
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long size = 0, resident = 0;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    return n == 2 ? resident * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

static void test_view_memory(void **state) {
    (void)state;
    skip_without_model();
    if (rss_kb() < 0) skip();
    sd_model *full = load(0);
    float *logits = malloc(14 * VOCAB * sizeof *logits);
    assert_non_null(logits);
    run_batch(full, logits); /* the parent's activations exist before measuring */
    const long layer_kb = (2L * 256 + 2L * 256 * 256 + 2L * 256 * 128 + 3L * 256 * 1024) * 4 / 1024;

    long before = rss_kb();
    sd_model *view = NULL;
    assert_int_equal(sd_model_view_layers(full, LAYERS - 1, &view), SD_OK);
    run_batch(view, logits);
    long view_growth = rss_kb() - before;

    before = rss_kb();
    sd_model *copy = load(LAYERS - 1);
    long copy_growth = rss_kb() - before;
    print_message("rss growth: view %ld KB, loading %d layers again %ld KB (one layer %ld KB)\n", view_growth,
                  LAYERS - 1, copy_growth, layer_kb);
    /* A copy costs at least most of its layers; a view less than one layer. */
    assert_true(copy_growth > (LAYERS - 1) * layer_kb * 3 / 4);
    assert_true(view_growth < layer_kb);
    sd_model_free(&copy);
    sd_model_free(&view);
    sd_model_free(&full);
    free(logits);
}

static void test_self_view_drafter(void **state) {
    (void)state;
    skip_without_model();
    sd_model *full = load(0);
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = 64;
    dp.n_threads = 1;
    sd_drafter *from_file = NULL, *from_view = NULL;
    assert_int_equal(sd_drafter_self_open(env.path, 2, &dp, &from_file), SD_OK);
    assert_int_equal(sd_drafter_self_view(full, 2, &dp, &from_view), SD_OK);
    assert_int_equal(sd_drafter_kind_of(from_view), SD_DRAFTER_SELF);
    const int32_t ctx[6] = {9, 8, 7, 100, 101, 102};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    s.seed = 77;
    int32_t ta[6], tb[6], na = 0, nb = 0;
    sd_spec_q qa[6], qb[6];
    assert_int_equal(sd_drafter_propose(from_file, 0, ctx, 6, 6, &s, ta, qa, &na), SD_OK);
    assert_int_equal(sd_drafter_propose(from_view, 0, ctx, 6, 6, &s, tb, qb, &nb), SD_OK);
    assert_int_equal(na, 6);
    assert_int_equal(nb, na);
    assert_memory_equal(ta, tb, (size_t)na * sizeof *ta);
    for (int32_t i = 0; i < na; i++) {
        assert_int_equal(qa[i].n, qb[i].n);
        assert_memory_equal(qa[i].ids, qb[i].ids, (size_t)qa[i].n * sizeof(int32_t));
        assert_memory_equal(qa[i].probs, qb[i].probs, (size_t)qa[i].n * sizeof(float));
    }
    sd_drafter_free(&from_file);
    sd_drafter_free(&from_view);
    sd_model_free(&full);
}

static void test_view_refusals(void **state) {
    (void)state;
    skip_without_model();
    sd_model *m = load(2), *view = NULL;
    assert_int_equal(sd_model_view_layers(m, 0, &view), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_model_view_layers(m, 3, &view), SD_ERR_INVALID_ARG); /* more than m runs */
    assert_int_equal(sd_model_view_layers(NULL, 1, &view), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_model_view_layers(m, 1, NULL), SD_ERR_INVALID_ARG);
    assert_null(view);
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_self_view(m, 0, NULL, &d), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_drafter_self_view(NULL, 1, NULL, &d), SD_ERR_INVALID_ARG);
    assert_null(d);
    sd_model_free(&m);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_view_logits_equal_partial_load),
        cmocka_unit_test(test_view_memory),
        cmocka_unit_test(test_self_view_drafter),
        cmocka_unit_test(test_view_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
