/* test_net_head.c — the wire fields of an EAGLE head in the verifier
 * (VerifySeq.next_k, VerifyResult.next_draft / next_q, Hello.drafter_kind
 * EAGLE), as net/validate.c checks them where they enter a process: each
 * bad field is refused with the field's path in the message, and the good
 * message passes. */
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_next_draft),
        cmocka_unit_test(test_next_k_and_hello),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
