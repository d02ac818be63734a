/* test_eagle.c — the target's feature capture (engine/model_capture.c) on a
 * random 4-layer model (specd-mkmodel):
 *   - logits are bit-identical with the capture on and off;
 *   - the rows of layer j equal the last layer's rows of a view of the
 *     first j + 1 layers (the same computation);
 *   - bad capture requests are refused and leave the forward as it was;
 * and an EAGLE head directory that does not exist is refused with SD_ERR_IO.
 * The head itself is checked against a numpy reference in
 * tests/ref/test_eagle_head.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "specd/drafter.h"
#include "specd/eagle.h"
#include "specd/gguf.h"
#include "specd/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { LAYERS = 4, VOCAB = 300, DIM = 64, N = 7 };

static struct {
    char dir[64];
    char path[96];
    bool ok;
} env;

static int setup(void **state) {
    (void)state;
    strcpy(env.dir, "/tmp/specd_eagle_XXXXXX");
    if (!mkdtemp(env.dir)) return -1;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers %d --dim %d --ff 128 --heads 4 --kv-heads 2 --vocab %d --seed 9 >/dev/null 2>&1",
             SPECD_MKMODEL, env.path, LAYERS, DIM, VOCAB);
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

/* One sequence of N tokens, logits of every row into out[N][VOCAB]. */
static void run(sd_model *m, float *out) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 4, 16, &kv), SD_OK);
    const int32_t tokens[N] = {5, 17, 99, 3, 250, 42, 7};
    int32_t pos[N], seq[N] = {0};
    bool want[N];
    for (int32_t i = 0; i < N; i++) {
        pos[i] = i;
        want[i] = true;
    }
    sd_batch b = {N, tokens, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    sd_kv_free(&kv);
}

static void test_capture(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(0);
    static float plain[N * VOCAB], captured[N * VOCAB];
    run(m, plain);
    int32_t n_rows = -1;
    assert_null(sd_model_capture_aux(m, &n_rows));
    assert_int_equal(n_rows, 0);
    const int32_t bad[2] = {0, LAYERS};
    assert_int_equal(sd_model_capture_set(m, 2, bad, false), SD_ERR_RANGE);
    assert_int_equal(sd_model_capture_set(m, SD_MODEL_CAPTURE_MAX + 1, bad, false), SD_ERR_RANGE);
    const int32_t ids[3] = {1, 0, LAYERS - 1};
    assert_int_equal(sd_model_capture_set(m, 3, ids, true), SD_OK);
    run(m, captured);
    assert_memory_equal(plain, captured, sizeof plain);
    const float *aux = sd_model_capture_aux(m, &n_rows);
    assert_non_null(aux);
    assert_int_equal(n_rows, N);
    const float *fin = sd_model_capture_final(m, &n_rows);
    assert_non_null(fin);
    /* layer j's rows = the last rows of a view of j + 1 layers */
    for (int32_t slot = 0; slot < 3; slot++) {
        sd_model *v = NULL;
        assert_int_equal(sd_model_view_layers(m, ids[slot] + 1, &v), SD_OK);
        const int32_t last = ids[slot];
        assert_int_equal(sd_model_capture_set(v, 1, &last, false), SD_OK);
        run(v, captured);
        int32_t nv = 0;
        const float *va = sd_model_capture_aux(v, &nv);
        assert_int_equal(nv, N);
        for (int32_t t = 0; t < N; t++)
            assert_memory_equal(va + (size_t)t * DIM, aux + ((size_t)t * 3 + (size_t)slot) * DIM, DIM * sizeof(float));
        sd_model_free(&v);
    }
    for (int32_t i = 0; i < N * DIM; i++) assert_true(isfinite(fin[i])); /* its values: test_eagle_head.py */
    assert_int_equal(sd_model_capture_set(m, 0, NULL, false), SD_OK);
    assert_null(sd_model_capture_aux(m, &n_rows));
    run(m, captured);
    assert_memory_equal(plain, captured, sizeof plain);
    sd_model_free(&m);
}

static void test_eagle_missing_dir(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(0);
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = 64;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_eagle_open("/nonexistent/specd-head", m, &dp, &d), SD_ERR_IO);
    assert_null(d);
    int32_t ids[3];
    sd_eagle_default_layers(30, ids);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 14);
    assert_int_equal(ids[2], 26);
    sd_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture),
        cmocka_unit_test(test_eagle_missing_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
