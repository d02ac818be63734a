/* test_feat_relay.c — the coordinator's relay of a head drafter's features
 * (coordinator/feat_relay.c): runs from verify results are kept on the
 * session as one contiguous run (appended, replaced from a lower position,
 * restarted past a gap), ride with the next draft step to a head drafter
 * only (whole, within the context, within the step's float budget), and are
 * dropped at the verify result after that; a result from a step that kept
 * more positions than it claims to have computed, or of another width, is
 * dropped; a second head drafter with other layers is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "coord.h"

enum { W = 4, HEAD = 3, OTHER = 5 };

typedef struct fixture {
    sd_coord *c;
    sd_session *s;
    float rows[64 * W]; /* row p holds p + j / 10 */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->c = calloc(1, sizeof *f->c);
    f->s = calloc(1, sizeof *f->s);
    assert_true(f->c && f->s);
    for (int p = 0; p < 64; p++)
        for (int j = 0; j < W; j++) f->rows[p * W + j] = (float)p + (float)j / 10.0f;
    sd_coord_worker *w = &f->c->workers[HEAD];
    w->used = w->alive = true;
    w->feat_width = W;
    w->n_feat_layers = 2;
    w->feat_layers[0] = 1, w->feat_layers[1] = 7;
    f->c->workers[OTHER].used = f->c->workers[OTHER].alive = true; /* an n-gram drafter */
    f->s->id = 9;
    f->s->drafter = HEAD;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    free(f->s->feat);
    free(f->s);
    free(f->c);
    free(f);
    return 0;
}

/* A verify result with the features of positions pos0 .. cached_len - 1. */
static Specd__VerifyResult result(fixture *f, uint32_t pos0, uint32_t cached_len) {
    Specd__VerifyResult vr = SPECD__VERIFY_RESULT__INIT;
    vr.request_id = 9, vr.code = SPECD__CODE__CODE_OK, vr.cached_len = cached_len;
    vr.feature_pos0 = pos0, vr.feature_width = W, vr.n_features = (size_t)(cached_len - pos0) * W;
    vr.features = f->rows + (size_t)pos0 * W;
    return vr;
}

/* The draft step's sequence of len tokens (keep_len 0) for drafter d. */
static Specd__DraftSeq draft(fixture *f, int32_t d, uint32_t len, size_t *budget) {
    Specd__DraftSeq ds = SPECD__DRAFT_SEQ__INIT;
    ds.keep_len = 0, ds.n_append = len;
    sd_feat_draft_seq(f->c, d, f->s, &ds, budget);
    return ds;
}

static void expect_run(const Specd__DraftSeq *ds, int32_t pos0, int32_t rows) {
    assert_int_equal(ds->feature_pos0, pos0);
    assert_int_equal(ds->n_features, (size_t)rows * W);
    for (int32_t r = 0; r < rows; r++) assert_true(ds->features[(size_t)r * W] == (float)(pos0 + r));
}

static void test_runs(void **state) {
    fixture *f = *state;
    size_t budget = 0;
    assert_true(sd_feat_wanted(f->c, f->s));
    Specd__VerifyResult vr = result(f, 0, 10); /* a prefill chunk: positions 0..9 */
    sd_feat_store(f->c, f->s, &vr, 0);
    vr = result(f, 10, 20); /* the next chunk continues it */
    sd_feat_store(f->c, f->s, &vr, 10);
    Specd__DraftSeq ds = draft(f, OTHER, 21, &budget); /* not a head drafter: nothing */
    assert_int_equal(ds.n_features, 0);
    ds = draft(f, HEAD, 21, &budget);
    expect_run(&ds, 0, 20);
    assert_int_equal(budget, 20 * W);
    ds = draft(f, HEAD, 21, &budget); /* a second step before the verdict carries them again */
    expect_run(&ds, 0, 20);
    vr = result(f, 20, 24); /* the verdict: the sent ones are dropped */
    sd_feat_store(f->c, f->s, &vr, 20);
    ds = draft(f, HEAD, 25, &budget);
    expect_run(&ds, 20, 4);
    /* not sent yet: a run from a lower position replaces what follows it */
    vr = result(f, 24, 30);
    sd_feat_store(f->c, f->s, &vr, 24);
    vr = result(f, 22, 26);
    sd_feat_store(f->c, f->s, &vr, 22);
    ds = draft(f, HEAD, 27, &budget);
    expect_run(&ds, 22, 4);
    /* a gap restarts the run past it (the drafter sees the gap and drafts nothing) */
    vr = result(f, 40, 44);
    sd_feat_store(f->c, f->s, &vr, 40);
    ds = draft(f, HEAD, 45, &budget);
    expect_run(&ds, 40, 4);
    assert_int_equal(f->c->feat_rows_in, 10 + 10 + 4 + 6 + 4 + 4);
}

static void test_refusals(void **state) {
    fixture *f = *state;
    size_t budget = 0;
    Specd__VerifyResult vr = result(f, 0, 10);
    sd_feat_store(f->c, f->s, &vr, 2); /* the step kept 2: rows 0, 1 were not computed by it */
    assert_int_equal(f->s->feat_rows, 0);
    vr = result(f, 2, 10);
    vr.feature_width = W + 1, vr.n_features = 8 * (W + 1); /* not the head drafters' width */
    sd_feat_store(f->c, f->s, &vr, 2);
    assert_int_equal(f->s->feat_rows, 0);
    vr = result(f, 2, 10);
    sd_feat_store(f->c, f->s, &vr, 2);
    assert_int_equal(f->s->feat_rows, 8);
    Specd__DraftSeq ds = draft(f, HEAD, 10, &budget); /* positions up to 9 need a context of 11 */
    assert_int_equal(ds.n_features, 0);
    budget = SD_MAX_STEP_FEATURES - W + 1; /* a step already full */
    ds = draft(f, HEAD, 11, &budget);
    assert_int_equal(ds.n_features, 0);
    assert_int_equal(f->s->feat_sent, 0);
    budget = 0;
    ds = draft(f, HEAD, 11, &budget);
    expect_run(&ds, 2, 8);

    /* Hello: the same layers and width register, others are refused */
    uint32_t same[] = {1, 7}, other[] = {1, 8};
    Specd__Hello h = SPECD__HELLO__INIT;
    h.role = SPECD__ROLE__ROLE_DRAFTER, h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    h.n_feature_layers = 2, h.feature_layers = same, h.feature_width = W;
    char msg[256];
    assert_int_equal(sd_feat_hello_refusal(f->c, &h, "b", msg, sizeof msg), SPECD__CODE__CODE_OK);
    h.feature_layers = other;
    assert_int_equal(sd_feat_hello_refusal(f->c, &h, "b", msg, sizeof msg), SPECD__CODE__CODE_REFUSED);
    assert_non_null(strstr(msg, "hello.feature_layers"));
    h.feature_layers = same, h.feature_width = 2 * W;
    assert_int_equal(sd_feat_hello_refusal(f->c, &h, "b", msg, sizeof msg), SPECD__CODE__CODE_REFUSED);
    f->c->workers[HEAD].alive = false; /* the first is gone: any head may register */
    assert_int_equal(sd_feat_hello_refusal(f->c, &h, "b", msg, sizeof msg), SPECD__CODE__CODE_OK);
    assert_false(sd_feat_wanted(f->c, f->s));
}

/* A run longer than a step's budget goes a leading part at a time: each
 * verdict drops what a draft step carried and keeps the rest, in order. */
static void test_split_across_steps(void **state) {
    fixture *f = *state;
    Specd__VerifyResult vr = result(f, 0, 20);
    sd_feat_store(f->c, f->s, &vr, 0);
    size_t budget = SD_MAX_STEP_FEATURES - 5 * W - 3; /* room for 5 rows */
    Specd__DraftSeq ds = draft(f, HEAD, 21, &budget);
    expect_run(&ds, 0, 5);
    assert_int_equal(f->s->feat_sent, 5);
    budget = SD_MAX_STEP_FEATURES - 3 * W; /* a second step before the verdict: room for 3, 5 stay sent */
    ds = draft(f, HEAD, 21, &budget);
    expect_run(&ds, 0, 3);
    assert_int_equal(f->s->feat_sent, 5);
    vr = result(f, 20, 22); /* the verdict: rows 0..4 dropped, 5..21 wait */
    sd_feat_store(f->c, f->s, &vr, 20);
    assert_int_equal(f->s->feat_pos0, 5);
    assert_int_equal(f->s->feat_rows, 17);
    assert_int_equal(f->s->feat_sent, 0);
    budget = SD_MAX_STEP_FEATURES - 10 * W;
    ds = draft(f, HEAD, 23, &budget);
    expect_run(&ds, 5, 10);
    vr = result(f, 22, 23);
    sd_feat_store(f->c, f->s, &vr, 22);
    budget = 0;
    ds = draft(f, HEAD, 24, &budget);
    expect_run(&ds, 15, 8);
    /* the step's budget in rows follows the live head drafter's width */
    assert_int_equal(sd_feat_step_rows(f->c), SD_MAX_STEP_FEATURES / W);
    f->c->workers[HEAD].alive = false;
    assert_int_equal(sd_feat_step_rows(f->c), INT32_MAX);
}

/* VerifyRequest.feature_layers: the head drafters' layers when a sequence wants features. */
static void test_request_layers(void **state) {
    fixture *f = *state;
    Specd__VerifySeq seqs[2];
    specd__verify_seq__init(&seqs[0]);
    specd__verify_seq__init(&seqs[1]);
    uint32_t layers[SD_MAX_FEATURE_LAYERS];
    assert_int_equal(sd_feat_request_layers(f->c, seqs, 2, layers), 0);
    seqs[1].want_features = true;
    assert_int_equal(sd_feat_request_layers(f->c, seqs, 2, layers), 2);
    assert_int_equal(layers[0], 1);
    assert_int_equal(layers[1], 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_across_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_layers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
