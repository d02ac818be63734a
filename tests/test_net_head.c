/* test_net_head.c — the wire fields of an EAGLE head in the verifier
 * (VerifySeq.next_k, VerifyResult.next_draft / next_q, Hello.drafter_kind
 * EAGLE) and of a head in its own drafter process (Hello.feature_layers /
 * feature_width, VerifyRequest.feature_layers, VerifyResult.features,
 * DraftSeq.features: net/validate_feat.c), as net/ checks them where they
 * enter a process: each bad field is refused with the field's path in the
 * message, and the good message passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "specd/net.h"

static const sd_net_limits LIM = {.n_vocab = 1000, .max_context = 512, .max_batch = 8, .max_k = 4};

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    protobuf_c_message_pack(m, b);
    return b;
}

/* Decodes env on the worker -> coordinator link: NULL with err, or freed
 * and true. */
static bool worker_ok(const Specd__WorkerToCoordinator *env, char *err, size_t err_len) {
    Specd__Code code;
    size_t len;
    uint8_t *bytes = pack(&env->base, &len);
    Specd__WorkerToCoordinator *g = sd_net_decode_worker(bytes, len, &LIM, &code, err, err_len);
    free(bytes);
    if (!g) return false;
    specd__worker_to_coordinator__free_unpacked(g, NULL);
    return true;
}

static void expect_refused(const Specd__WorkerToCoordinator *env, const char *want) {
    char err[256] = "";
    if (worker_ok(env, err, sizeof err)) fail_msg("accepted; expected a refusal with '%s'", want);
    if (!strstr(err, want)) fail_msg("'%s' lacks '%s'", err, want);
}

static void test_next_draft(void **state) {
    (void)state;
    int32_t commit[] = {10, 11};
    int32_t drafts[] = {5, 6, 7, 8, 9};
    int32_t ids[] = {5, 6, 7, 8, 9};
    float one = 1.0f;
    Specd__SparseDist q[5], *pq[5];
    for (int i = 0; i < 5; i++) {
        specd__sparse_dist__init(&q[i]);
        q[i].n_ids = q[i].n_probs = 1, q[i].ids = &ids[i], q[i].probs = &one;
        pq[i] = &q[i];
    }
    Specd__VerifyResult vr = SPECD__VERIFY_RESULT__INIT;
    vr.request_id = 2, vr.code = SPECD__CODE__CODE_OK, vr.n_accepted = 1, vr.n_commit = 2, vr.commit = commit;
    vr.n_next_draft = vr.n_next_q = 3, vr.next_draft = drafts, vr.next_q = pq;
    Specd__VerifyResult *pvr[] = {&vr};
    Specd__VerifyResponse resp = SPECD__VERIFY_RESPONSE__INIT;
    resp.n_results = 1, resp.results = pvr;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY, env.verify = &resp;
    char err[256];
    if (!worker_ok(&env, err, sizeof err)) fail_msg("a good result refused: %s", err);

    /* more drafts than max_k (4): refused, however well formed */
    vr.n_next_draft = vr.n_next_q = 5;
    expect_refused(&env, "verify.results[0].next_draft: 5 tokens over the limit of 4");
    /* one q per draft */
    vr.n_next_draft = 3, vr.n_next_q = 2;
    expect_refused(&env, "verify.results[0].next_q: 2 distributions for 3 drafts");
    /* ids in the vocabulary, q holding its token */
    vr.n_next_q = 3, drafts[1] = 4242;
    expect_refused(&env, "verify.results[0].next_draft[1]: token id 4242 out of range [0, 1000)");
    drafts[1] = 6, ids[2] = 99;
    expect_refused(&env, "verify.results[0].next_q[2]");
    ids[2] = 7;
    /* drafts for a sequence that committed nothing (a prefill, a miss) */
    vr.n_commit = 0, vr.n_accepted = 0;
    expect_refused(&env, "verify.results[0].next_draft: 3 drafts with nothing committed");
    vr.n_commit = 2, vr.n_accepted = 1, vr.code = SPECD__CODE__CODE_CACHE_MISS;
    expect_refused(&env, "with nothing committed");
    vr.code = SPECD__CODE__CODE_OK;
    /* the catch-up: within the head's time and the context */
    vr.cached_len = 40, vr.next_us = 900, vr.next_catchup_us = 900, vr.next_catchup_rows = 41;
    if (!worker_ok(&env, err, sizeof err)) fail_msg("a catch-up of all of the head's time refused: %s", err);
    vr.next_catchup_us = 901;
    expect_refused(&env, "verify.results[0].next_catchup_us: 901 of the head's 900 us");
    vr.next_catchup_us = 800, vr.next_catchup_rows = 42;
    expect_refused(&env, "verify.results[0].next_catchup_rows: 42 rows past a context of 41");
}

/* A head drafter's catch-up (DraftResponse.catchup_us / catchup_rows):
 * within the step's draft_us, and within its results' contexts + 1 each. */
static void test_draft_catchup(void **state) {
    (void)state;
    Specd__DraftResult r0 = SPECD__DRAFT_RESULT__INIT, r1 = SPECD__DRAFT_RESULT__INIT;
    r0.request_id = 1, r0.code = SPECD__CODE__CODE_OK, r0.cached_len = 30;
    r1.request_id = 2, r1.code = SPECD__CODE__CODE_OK, r1.cached_len = 9;
    Specd__DraftResult *pr[] = {&r0, &r1};
    Specd__DraftResponse resp = SPECD__DRAFT_RESPONSE__INIT;
    resp.step_id = 3, resp.n_results = 2, resp.results = pr, resp.draft_us = 700;
    resp.catchup_us = 700, resp.catchup_rows = 41;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT, env.draft = &resp;
    char err[256];
    if (!worker_ok(&env, err, sizeof err)) fail_msg("a catch-up of all of the step refused: %s", err);
    resp.catchup_us = 701;
    expect_refused(&env, "draft.catchup_us: 701 of the step's 700 us");
    resp.catchup_us = 10, resp.catchup_rows = 42;
    expect_refused(&env, "draft.catchup_rows: 42 rows past the results' 41");
}

static void test_next_k_and_hello(void **state) {
    (void)state;
    int32_t append[] = {1};
    Specd__Sampling samp = SPECD__SAMPLING__INIT;
    Specd__VerifySeq vs = SPECD__VERIFY_SEQ__INIT;
    vs.request_id = 1, vs.n_append = 1, vs.append = append, vs.sampling = &samp, vs.next_k = 4;
    Specd__VerifySeq *pvs[] = {&vs};
    Specd__VerifyRequest req = SPECD__VERIFY_REQUEST__INIT;
    req.step_id = 1, req.n_seqs = 1, req.seqs = pvs;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY, env.verify = &req;
    Specd__Code code;
    char err[256];
    size_t len;
    uint8_t *bytes = pack(&env.base, &len);
    Specd__CoordinatorToWorker *g = sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err);
    free(bytes);
    if (!g) fail_msg("next_k 4 refused: %s", err);
    specd__coordinator_to_worker__free_unpacked(g, NULL);
    vs.next_k = 5; /* over max_k */
    bytes = pack(&env.base, &len);
    assert_null(sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "verify.seqs[0].next_k: 5"));
    vs.next_k = 1, req.prefill_only = true; /* a prefill drafts nothing */
    bytes = pack(&env.base, &len);
    assert_null(sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "verify.seqs[0].next_k: 1"));

    /* a verifier leader may announce a head, no other drafter kind */
    Specd__ModelIdentity mid = SPECD__MODEL_IDENTITY__INIT;
    mid.architecture = "llama", mid.vocab_size = 1000;
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = 1, h.role = SPECD__ROLE__ROLE_VERIFIER, h.group_size = 1, h.model = &mid;
    h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    Specd__WorkerToCoordinator we = SPECD__WORKER_TO_COORDINATOR__INIT;
    we.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO, we.hello = &h;
    if (!worker_ok(&we, err, sizeof err)) fail_msg("a verifier with a head refused: %s", err);
    h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    expect_refused(&we, "hello.drafter_kind: 2 for a verifier");
    h.drafter_kind = (Specd__DrafterKind)5;
    expect_refused(&we, "hello.drafter_kind: 5 is not a known kind");
}

/* VerifyResult.features: exactly (cached_len - feature_pos0) rows of
 * feature_width floats, within the context, finite, on an OK result. */
static void test_result_features(void **state) {
    (void)state;
    enum { W = 6 };
    int32_t commit[] = {10, 11};
    float feat[10 * W];
    for (int i = 0; i < 10 * W; i++) feat[i] = 0.25f * (float)i - 1.0f;
    Specd__VerifyResult vr = SPECD__VERIFY_RESULT__INIT;
    vr.request_id = 2, vr.code = SPECD__CODE__CODE_OK, vr.n_accepted = 1, vr.n_commit = 2, vr.commit = commit;
    vr.cached_len = 12, vr.feature_pos0 = 10, vr.feature_width = W, vr.n_features = 2 * W, vr.features = feat;
    Specd__VerifyResult *pvr[] = {&vr};
    Specd__VerifyResponse resp = SPECD__VERIFY_RESPONSE__INIT;
    resp.n_results = 1, resp.results = pvr;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY, env.verify = &resp;
    char err[256];
    if (!worker_ok(&env, err, sizeof err)) fail_msg("good features refused: %s", err);
    vr.n_features = 2 * W - 1; /* a float short */
    expect_refused(&env, "verify.results[0].features: 11 floats, expected 2 rows x 6 = 12");
    vr.n_features = 3 * W; /* three rows for two positions */
    expect_refused(&env, "verify.results[0].features: 18 floats, expected 2 rows x 6 = 12");
    vr.n_features = 2 * W, vr.feature_width = 0;
    expect_refused(&env, "verify.results[0].feature_width: 0 outside [1, 65536]");
    vr.feature_width = SD_MAX_FEATURE_WIDTH + 1;
    expect_refused(&env, "verify.results[0].feature_width: 65537 outside");
    vr.feature_width = W, vr.feature_pos0 = 12; /* no position below cached_len */
    expect_refused(&env, "verify.results[0].feature_pos0: 12, not below cached_len 12");
    vr.feature_pos0 = 2, vr.n_features = 10 * W; /* a first step's whole prompt: 10 rows */
    if (!worker_ok(&env, err, sizeof err)) fail_msg("ten rows refused: %s", err);
    vr.cached_len = 513; /* past the context of 512 */
    expect_refused(&env, "verify.results[0].cached_len: 513 over the context of 512");
    vr.cached_len = 12, vr.feature_pos0 = 10, vr.n_features = 2 * W, feat[7] = 1.0f / 0.0f;
    expect_refused(&env, "is not a finite feature value");
    feat[7] = 0.5f, vr.code = SPECD__CODE__CODE_CACHE_MISS;
    expect_refused(&env, "verify.results[0].features: with code");
    /* a prefill chunk commits nothing: its rows are bounded by the context */
    vr.code = SPECD__CODE__CODE_OK, vr.n_commit = 0, vr.n_accepted = 0, vr.feature_pos0 = 9, vr.n_features = 3 * W;
    if (!worker_ok(&env, err, sizeof err)) fail_msg("a prefill's three rows refused: %s", err);
}

/* DraftSeq.features: only to a drafter that announced a width, whole rows,
 * all before the context's last token. */
static void test_draft_features(void **state) {
    (void)state;
    enum { W = 4 };
    int32_t append[] = {1, 2, 3};
    float feat[3 * W] = {0};
    Specd__Sampling samp = SPECD__SAMPLING__INIT;
    Specd__DraftSeq ds = SPECD__DRAFT_SEQ__INIT;
    ds.request_id = 1, ds.keep_len = 5, ds.n_append = 3, ds.append = append, ds.k = 2, ds.sampling = &samp;
    ds.feature_pos0 = 5, ds.n_features = 2 * W, ds.features = feat; /* positions 5, 6 of a context of 8 */
    Specd__DraftSeq *pds[] = {&ds};
    Specd__DraftRequest req = SPECD__DRAFT_REQUEST__INIT;
    req.step_id = 1, req.n_seqs = 1, req.seqs = pds;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT, env.draft = &req;
    sd_net_limits lim = LIM;
    lim.feature_width = W;
    Specd__Code code;
    char err[256];
    size_t len;
    struct {
        uint32_t pos0;
        size_t n;
        int32_t width;
        const char *want; /* NULL: accepted */
    } cases[] = {
        {5, 2 * W, W, NULL},
        {5, 2 * W, 0, "draft.seqs[0].features: 8 floats to a drafter that reads no features"},
        {5, 2 * W - 1, W, "draft.seqs[0].features: 7 floats, not a whole number of rows of 4"},
        {6, 2 * W, W,
         "draft.seqs[0].features: positions 6..7, the context of 8 tokens has features of positions "
         "below 7 only"},
        {0, 3 * W, W, NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds.feature_pos0 = cases[c].pos0, ds.n_features = cases[c].n, lim.feature_width = cases[c].width;
        uint8_t *bytes = pack(&env.base, &len);
        Specd__CoordinatorToWorker *g = sd_net_decode_to_worker(bytes, len, &lim, &code, err, sizeof err);
        free(bytes);
        if (!cases[c].want) {
            if (!g) fail_msg("case %zu refused: %s", c, err);
            specd__coordinator_to_worker__free_unpacked(g, NULL);
            continue;
        }
        if (g) fail_msg("case %zu accepted; expected '%s'", c, cases[c].want);
        if (!strstr(err, cases[c].want)) fail_msg("case %zu: '%s' lacks '%s'", c, err, cases[c].want);
        assert_int_equal(code, SPECD__CODE__CODE_BAD_REQUEST);
    }
    /* a NaN */
    ds.feature_pos0 = 5, ds.n_features = 2 * W, lim.feature_width = W, feat[3] = 0.0f / 0.0f;
    uint8_t *bytes = pack(&env.base, &len);
    assert_null(sd_net_decode_to_worker(bytes, len, &lim, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "is not a finite feature value"));
}

/* Hello.feature_layers / feature_width: a drafter of kind EAGLE only, 1..8
 * layers, a width that is a multiple of them; VerifyRequest.feature_layers
 * at most 8. */
static void test_hello_features(void **state) {
    (void)state;
    uint32_t layers[SD_MAX_FEATURE_LAYERS + 1] = {1, 3, 5, 7, 9, 11, 13, 15, 17};
    Specd__ModelIdentity mid = SPECD__MODEL_IDENTITY__INIT;
    mid.architecture = "llama", mid.vocab_size = 1000;
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = 1, h.role = SPECD__ROLE__ROLE_DRAFTER, h.group_size = 1, h.model = &mid;
    h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    h.n_feature_layers = 3, h.feature_layers = layers, h.feature_width = 3 * 576;
    Specd__WorkerToCoordinator we = SPECD__WORKER_TO_COORDINATOR__INIT;
    we.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO, we.hello = &h;
    char err[256];
    if (!worker_ok(&we, err, sizeof err)) fail_msg("a head drafter's Hello refused: %s", err);
    h.feature_width = 3 * 576 + 1;
    expect_refused(&we, "hello.feature_width: 1729, expected a multiple of the 3 layers");
    h.feature_width = 0;
    expect_refused(&we, "hello.feature_width: 0");
    h.feature_width = 9 * 64, h.n_feature_layers = 9;
    expect_refused(&we, "hello.feature_layers: 9 layers, expected 1..8");
    h.n_feature_layers = 3, h.feature_width = 3 * 64, h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    expect_refused(&we, "hello.feature_layers: only a drafter of kind DRAFTER_KIND_EAGLE");

    int32_t append[] = {1};
    Specd__Sampling samp = SPECD__SAMPLING__INIT;
    Specd__VerifySeq vs = SPECD__VERIFY_SEQ__INIT;
    vs.request_id = 1, vs.n_append = 1, vs.append = append, vs.sampling = &samp, vs.want_features = true;
    Specd__VerifySeq *pvs[] = {&vs};
    Specd__VerifyRequest req = SPECD__VERIFY_REQUEST__INIT;
    req.step_id = 1, req.n_seqs = 1, req.seqs = pvs, req.n_feature_layers = 3, req.feature_layers = layers;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY, env.verify = &req;
    Specd__Code code;
    size_t len;
    uint8_t *bytes = pack(&env.base, &len);
    Specd__CoordinatorToWorker *g = sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err);
    free(bytes);
    if (!g) fail_msg("feature_layers refused: %s", err);
    specd__coordinator_to_worker__free_unpacked(g, NULL);
    req.n_feature_layers = SD_MAX_FEATURE_LAYERS + 1;
    bytes = pack(&env.base, &len);
    assert_null(sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "verify.feature_layers: 9 layers over the limit of 8"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_next_draft),
        cmocka_unit_test(test_draft_catchup),      cmocka_unit_test(test_next_k_and_hello),
        cmocka_unit_test(test_result_features), cmocka_unit_test(test_draft_features),
        cmocka_unit_test(test_hello_features),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
