/* test_draft_serve_head.c — a draft server whose drafter is an EAGLE head
 * (drafter/draft_serve.c with params.head_seq; specd-drafter --eagle): every
 * admitted sequence goes to the head's path with its DraftSeq (features
 * included) and the whole context the server holds, and the path's drafts
 * come back as the sequence's result; a cache miss never reaches it; the
 * server refuses a width without a path and a path without a width, and its
 * limits carry the width (DraftSeq.features are validated against it); the
 * path's catch-up is summed into the response (catchup_us within draft_us).
 * The head here is a fake that records its calls (the real one,
 * drafter/draft_head.c, needs the engine: it_greedy_tiny_eagle_drafter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "draft_serve.h"

enum { VOCAB = 100, WIDTH = 6, MAX_CALLS = 8 };

typedef struct fake_head {
    int32_t n_calls;
    struct {
        int32_t slot, len, k;
        int32_t held[64];
        uint32_t feature_pos0;
        size_t n_features;
        const float *features;
    } call[MAX_CALLS];
    int32_t ids[2];
    float probs[2];
} fake_head;

/* Records the call; drafts k tokens: the context's last token + 1, + 2, ... (q one-hot). */
static void fake_seq(void *head, sd_drafter *d, int32_t slot, const Specd__DraftSeq *sq, const int32_t *held,
                     int32_t len, int32_t n_forced, int32_t k, const sd_sampling *s, sd_constraint *con,
                     int32_t *tokens, sd_spec_q *q, int32_t *n, sd_head_catchup *cu) {
    (void)d;
    (void)s;
    assert_int_equal(n_forced, 0); /* no constraint here: no forced drafts, no mask */
    assert_null(con);
    fake_head *h = head;
    assert_true(h->n_calls < MAX_CALLS && len <= 64);
    h->call[h->n_calls].slot = slot;
    h->call[h->n_calls].len = len;
    h->call[h->n_calls].k = k;
    memcpy(h->call[h->n_calls].held, held, (size_t)len * sizeof *held);
    h->call[h->n_calls].feature_pos0 = sq->feature_pos0;
    h->call[h->n_calls].n_features = sq->n_features;
    h->call[h->n_calls].features = sq->features;
    h->n_calls++;
    static int32_t ids[SD_MAX_K];
    static const float one = 1.0f;
    for (int32_t i = 0; i < k; i++) {
        tokens[i] = ids[i] = (held[len - 1] + 1 + i) % VOCAB;
        q[i] = (sd_spec_q){1, &ids[i], &one};
    }
    *n = k;
    /* the features past 1 + k as catch-up rows, a second each: more than
     * the step took, which the response caps at its draft_us */
    int32_t fed = (int32_t)(sq->n_features / WIDTH);
    if (fed > k + 1) cu->rows += fed - k - 1, cu->s += fed - k - 1;
}

static void test_head_path(void **state) {
    (void)state;
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = 4;
    dp.max_ctx = 64;
    dp.top_n = 1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_ngram_create(&dp, &d), SD_OK);
    fake_head head = {0};
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = 4, sp.max_ctx = 64, sp.max_batch = 4, sp.max_k = 4, sp.n_vocab = VOCAB, sp.top_n = 1;
    sd_draft_server *srv = NULL;
    sp.feature_width = WIDTH; /* a width without a path, and a path without a width: refused */
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_ERR_INVALID_ARG);
    sp.feature_width = 0, sp.head_seq = fake_seq, sp.head = &head;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_ERR_INVALID_ARG);
    sp.feature_width = WIDTH;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_OK);
    assert_int_equal(sd_draft_server_limits(srv).feature_width, WIDTH);

    int32_t a[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    float feat[9 * WIDTH] = {0};
    Specd__Sampling samp = SPECD__SAMPLING__INIT;
    Specd__DraftSeq s0 = SPECD__DRAFT_SEQ__INIT, s1 = SPECD__DRAFT_SEQ__INIT;
    s0.request_id = 1, s0.keep_len = 0, s0.n_append = 10, s0.append = a, s0.k = 3, s0.sampling = &samp;
    s0.feature_pos0 = 0, s0.n_features = 9 * WIDTH, s0.features = feat;
    s1.request_id = 2, s1.keep_len = 4, s1.n_append = 1, s1.append = a, s1.k = 2, s1.sampling = &samp; /* unknown */
    Specd__DraftSeq *ps[] = {&s0, &s1};
    Specd__DraftRequest req = SPECD__DRAFT_REQUEST__INIT;
    req.step_id = 7, req.n_seqs = 2, req.seqs = ps;
    static sd_net_draft_step step;
    sd_net_draft_step_of(&req, &step);
    Specd__DraftResponse resp;
    assert_int_equal(sd_draft_server_handle(srv, &step, &resp), SD_OK);
    assert_int_equal(head.n_calls, 1); /* the miss never reaches the head */
    assert_int_equal(head.call[0].len, 10);
    assert_int_equal(head.call[0].k, 3);
    assert_memory_equal(head.call[0].held, a, sizeof a);
    assert_true(head.call[0].features == feat && head.call[0].n_features == 9 * WIDTH);
    const Specd__DraftResult *r = resp.results[0];
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->cached_len, 10);
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[0], 15);
    assert_int_equal(r->tokens[2], 17);
    assert_int_equal(r->q[1]->ids[0], 16);
    assert_int_equal(resp.results[1]->code, SPECD__CODE__CODE_CACHE_MISS);
    /* 9 positions' features for a step of 3 drafts: 5 rows of catch-up,
     * their time within the step's */
    assert_int_equal(resp.catchup_rows, 5);
    assert_int_equal(resp.catchup_us, resp.draft_us);

    /* the next step keeps 10 and appends 2: the head sees all 12 held tokens */
    int32_t b[2] = {40, 41};
    s0.keep_len = 10, s0.n_append = 2, s0.append = b, s0.feature_pos0 = 9, s0.n_features = 2 * WIDTH;
    req.n_seqs = 1;
    sd_net_draft_step_of(&req, &step);
    assert_int_equal(sd_draft_server_handle(srv, &step, &resp), SD_OK);
    assert_int_equal(head.n_calls, 2);
    assert_int_equal(head.call[1].len, 12);
    assert_memory_equal(head.call[1].held, a, sizeof a);
    assert_int_equal(head.call[1].held[11], 41);
    assert_int_equal(head.call[1].feature_pos0, 9);
    assert_int_equal(resp.results[0]->tokens[0], 42);
    assert_int_equal(resp.catchup_rows, 0); /* 2 positions for 3 drafts: none */
    assert_int_equal(resp.catchup_us, 0);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
