/* test_gen_timing.c — specd-generate's speculative loop (tools/gen_spec.c)
 * reports decode speed as the tokens of the steps it timed over their time.
 *
 * A fake clock that advances one second per reading makes every step last
 * exactly one second, so the figures are step and token counts: the
 * decode time must be the number of steps after the first, the decode
 * tokens what those steps committed. The drafter is a view of all the
 * target's layers (a random model from specd-mkmodel, SPECD_MKMODEL): its
 * greedy drafts are always accepted, so the first step commits K + 1
 * tokens, the case the old loop got wrong (it divided every token but one
 * by the time after the first step). Also: no step commits past
 * n_predict (nothing is produced and dropped), and at K = 0 the first step
 * gives one token, as plain decoding's prefill does. */
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
#include "specd/spec_decode.h"

#include "gen_spec.h"

#define N_PREDICT 43
#define MAX_CTX   256

static char dir[64], path[128];
static bool have_model;

static int make_model(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/specd-gentime-XXXXXX");
    if (!mkdtemp(dir)) return 0;
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 2 --vocab 300 --seed 3 >/dev/null 2>&1", SPECD_MKMODEL, path);
    have_model = system(cmd) == 0;
    return 0;
}

static int remove_model(void **state) {
    (void)state;
    unlink(path);
    rmdir(dir);
    return 0;
}

static double fake_clock(void *user) {
    double *t = user;
    return (*t)++;
}

/* Runs the loop at K = k with the always-accepted self-view and checks the
 * figures; returns the first step's token count. */
static int32_t check_run(int32_t k, bool adaptive) {
    char err[256];
    sd_gguf *g = NULL;
    sd_model *m = NULL;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = MAX_CTX + SD_MAX_K + 1;
    dp.n_threads = 1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_self_view(m, sd_model_config_of(m)->n_layers, &dp, &d), SD_OK);
    sd_spec_decoder *dec = NULL;
    assert_int_equal(sd_spec_decoder_create(m, d, MAX_CTX, &dec), SD_OK);
    int32_t prompt[12];
    for (int32_t i = 0; i < 12; i++) prompt[i] = (i * 53 + 9) % 300;
    double now = 100.0;
    sd_gen_spec_params p = {.n_predict = N_PREDICT,
                            .k = k,
                            .adaptive_k = adaptive,
                            .sampling = sd_sampling_default(),
                            .user = &now,
                            .clock = fake_clock};
    p.sampling.temperature = 0.0f;
    int32_t ctx[12 + N_PREDICT + SD_MAX_K + 1], ids[N_PREDICT];
    sd_gen_spec_result r;
    assert_int_equal(sd_gen_spec_run(dec, prompt, 12, &p, ctx, ids, &r), SD_OK);
    const sd_spec_stats *st = sd_spec_decoder_stats(dec);
    printf("K %d%s: %d steps, first %d tokens, decode %d tokens in %.0f s (%d steps)\n", (int)k,
           adaptive ? " adaptive" : "", (int)r.n_steps, (int)r.prompt_step_tokens, (int)r.decode_tokens, r.decode_s,
           (int)r.decode_steps);
    assert_int_equal(r.n_ids, N_PREDICT);
    assert_int_equal(st->committed, N_PREDICT); /* nothing committed and dropped */
    assert_int_equal(r.n_steps, st->steps);
    assert_true(r.prompt_s == 1.0);
    assert_int_equal(r.decode_steps, r.n_steps - 1);
    assert_true(r.decode_s == (double)r.decode_steps);
    assert_int_equal(r.prompt_step_tokens + r.decode_tokens, N_PREDICT);
    assert_true(sd_gen_spec_decode_tok_s(&r) == (double)r.decode_tokens / r.decode_s);
    int32_t first = r.prompt_step_tokens;
    sd_spec_decoder_free(&dec);
    sd_drafter_free(&d);
    sd_model_free(&m);
    sd_gguf_close(&g);
    return first;
}

static void test_first_step_tokens_not_in_decode(void **state) {
    (void)state;
    if (!have_model) skip();
    assert_int_equal(check_run(4, false), 5);
    assert_int_equal(check_run(8, false), 9);
}

static void test_plain_and_adaptive(void **state) {
    (void)state;
    if (!have_model) skip();
    assert_int_equal(check_run(0, false), 1);
    int32_t first = check_run(4, true);
    assert_true(first >= 1 && first <= 5);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_gen_timing");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_step_tokens_not_in_decode),
        cmocka_unit_test(test_plain_and_adaptive),
    };
    return cmocka_run_group_tests(tests, make_model, remove_model);
}
