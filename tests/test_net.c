/* test_net.c — unit tests of libspecd-net: every envelope over a real
 * ROUTER/DEALER pair, malformed bytes, each validation rule (by the substring
 * its message must contain), the socket safety settings (MAXMSGSIZE,
 * ROUTER_MANDATORY, extra frames) and CurveZMQ. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "specd/net.h"

static const sd_net_limits LIM = {.n_vocab = 1000, .max_context = 512, .max_batch = 8, .max_k = 4};

/* ---- helpers ---- */

typedef struct pair {
    void *ctx, *router, *dealer;
} pair;

static void pair_open(pair *p, const char *addr, int64_t max_msg) {
    p->ctx = zmq_ctx_new();
    assert_non_null(p->ctx);
    sd_net_socket_params rp = sd_net_socket_default_params();
    rp.type = ZMQ_ROUTER;
    rp.max_msg_bytes = max_msg;
    assert_int_equal(sd_net_socket_open(p->ctx, &rp, addr, NULL, &p->router), SD_OK);
    char endpoint[256];
    size_t n = sizeof endpoint;
    assert_int_equal(zmq_getsockopt(p->router, ZMQ_LAST_ENDPOINT, endpoint, &n), 0);
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = max_msg;
    dp.identity = "dealer-1";
    assert_int_equal(sd_net_socket_open(p->ctx, &dp, NULL, endpoint, &p->dealer), SD_OK);
}

static void pair_close(pair *p) {
    sd_net_close(&p->dealer);
    sd_net_close(&p->router);
    assert_null(p->router);
    zmq_ctx_term(p->ctx);
}

static bool wait_readable(void *sock, long timeout_ms) {
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, timeout_ms) == 1;
}

/* Sends env from the dealer, receives it on the router (identity checked). */
static void dealer_to_router(pair *p, const ProtobufCMessage *env, sd_net_msg *m) {
    assert_int_equal(sd_net_send(p->dealer, NULL, 0, env), SD_OK);
    assert_true(wait_readable(p->router, 2000));
    assert_int_equal(sd_net_recv(p->router, true, true, m), SD_OK);
    assert_int_equal(m->identity_len, 8);
    assert_memory_equal(m->identity, "dealer-1", 8);
}

static void router_to_dealer(pair *p, const ProtobufCMessage *env, sd_net_msg *m) {
    assert_int_equal(sd_net_send(p->router, (const uint8_t *)"dealer-1", 8, env), SD_OK);
    assert_true(wait_readable(p->dealer, 2000));
    assert_int_equal(sd_net_recv(p->dealer, false, true, m), SD_OK);
    assert_int_equal(m->identity_len, 0);
}

/* A packed envelope in a malloc'd buffer. */
static uint8_t *pack(const ProtobufCMessage *env, size_t *len) {
    *len = protobuf_c_message_get_packed_size(env);
    uint8_t *buf = malloc(*len ? *len : 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(env, buf), *len);
    return buf;
}

/* ---- round trips ---- */

static void test_round_trip_client_link(void **state) {
    (void)state;
    pair p;
    pair_open(&p, "inproc://rt-client", SD_MAX_CLIENT_MSG_BYTES);
    sd_net_msg m;
    Specd__Code code;
    char err[256];

    /* submit with every field */
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    Specd__SubmitRequest sub = SPECD__SUBMIT_REQUEST__INIT;
    Specd__Sampling smp = SPECD__SAMPLING__INIT;
    sd_sampling s = {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f, .seed = 42};
    sd_net_sampling_to_pb(&s, &smp);
    char *stops[] = {"\n\n", "END"};
    sub.client_tag = 77;
    sub.prompt = "Bonjour, ça va? 日本";
    sub.chat = 1;
    sub.system = "sys";
    sub.max_tokens = 100;
    sub.sampling = &smp;
    sub.n_stop = 2;
    sub.stop = stops;
    sub.ignore_eos = 1;
    sub.max_k = -1;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    env.submit = &sub;
    dealer_to_router(&p, &env.base, &m);
    Specd__ClientToCoordinator *got = sd_net_decode_client(m.body, m.body_len, &LIM, &code, err, sizeof err);
    assert_non_null(got);
    assert_int_equal(code, SPECD__CODE__CODE_OK);
    assert_int_equal(got->body_case, SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT);
    assert_int_equal(got->submit->client_tag, 77);
    assert_string_equal(got->submit->prompt, sub.prompt);
    assert_int_equal(got->submit->n_stop, 2);
    assert_string_equal(got->submit->stop[1], "END");
    assert_int_equal(got->submit->max_k, -1);
    sd_sampling back;
    assert_true(sd_net_sampling_from_pb(got->submit->sampling, &back, err, sizeof err));
    assert_true(back.temperature == s.temperature && back.top_k == 40 && back.top_p == s.top_p &&
                back.min_p == s.min_p && back.seed == 42);
    specd__client_to_coordinator__free_unpacked(got, NULL);
    sd_net_msg_clear(&m);

    /* cancel, stats, heartbeat, hello */
    Specd__Cancel cancel = SPECD__CANCEL__INIT;
    cancel.request_id = 9;
    Specd__StatsQuery sq = SPECD__STATS_QUERY__INIT;
    sq.include_workers = 1;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__Hello hello = SPECD__HELLO__INIT;
    hello.protocol_version = SD_PROTOCOL_VERSION;
    hello.role = SPECD__ROLE__ROLE_CLIENT;
    hello.name = "test";
    for (int which = 0; which < 4; which++) {
        Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
        if (which == 0) e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL, e.cancel = &cancel;
        if (which == 1) e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_STATS, e.stats = &sq;
        if (which == 2) e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT, e.heartbeat = &hb;
        if (which == 3) e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HELLO, e.hello = &hello;
        dealer_to_router(&p, &e.base, &m);
        got = sd_net_decode_client(m.body, m.body_len, NULL, &code, err, sizeof err);
        assert_non_null(got);
        assert_int_equal(got->body_case, e.body_case);
        if (which == 0) assert_int_equal(got->cancel->request_id, 9);
        if (which == 1) assert_true(got->stats->include_workers);
        if (which == 2) assert_int_equal(got->heartbeat->sent_us, hb.sent_us);
        if (which == 3) assert_string_equal(got->hello->name, "test");
        specd__client_to_coordinator__free_unpacked(got, NULL);
        sd_net_msg_clear(&m);
    }

    /* coordinator -> client: every case */
    Specd__Accepted acc = SPECD__ACCEPTED__INIT;
    acc.client_tag = 77, acc.request_id = 5, acc.prompt_tokens = 12;
    Specd__TokenChunk tc = SPECD__TOKEN_CHUNK__INIT;
    int32_t toks[] = {1, 2, 999};
    tc.request_id = 5, tc.n_tokens = 3, tc.tokens = toks, tc.text.data = (uint8_t *)"abc", tc.text.len = 3;
    tc.n_generated = 3;
    Specd__RequestStats rs = SPECD__REQUEST_STATS__INIT;
    rs.drafted = 10, rs.accepted = 7, rs.total_ms = 12.5;
    Specd__Finished fin = SPECD__FINISHED__INIT;
    fin.request_id = 5, fin.reason = SPECD__STOP_REASON__STOP_REASON_LENGTH, fin.stats = &rs;
    Specd__Error er = SPECD__ERROR__INIT;
    sd_net_error_init(&er, SPECD__CODE__CODE_OVERLOADED, 0, 77, "queue full (256 waiting)");
    Specd__WorkerStats ws = SPECD__WORKER_STATS__INIT;
    ws.kv_blocks_total = 100, ws.kv_blocks_free = 60;
    Specd__WorkerInfo wi = SPECD__WORKER_INFO__INIT;
    wi.role = SPECD__ROLE__ROLE_VERIFIER, wi.alive = 1, wi.stats = &ws, wi.name = "v0";
    Specd__WorkerInfo *wis[] = {&wi};
    Specd__ServiceStats ss = SPECD__SERVICE_STATS__INIT;
    ss.active_requests = 3, ss.n_workers = 1, ss.workers = wis;
    for (int which = 0; which < 6; which++) {
        Specd__CoordinatorToClient e = SPECD__COORDINATOR_TO_CLIENT__INIT;
        if (which == 0) e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED, e.accepted = &acc;
        if (which == 1) e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS, e.tokens = &tc;
        if (which == 2) e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED, e.finished = &fin;
        if (which == 3) e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR, e.error = &er;
        if (which == 4) e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_STATS, e.stats = &ss;
        if (which == 5) e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT, e.heartbeat = &hb;
        router_to_dealer(&p, &e.base, &m);
        Specd__CoordinatorToClient *g = sd_net_decode_to_client(m.body, m.body_len, &code, err, sizeof err);
        assert_non_null(g);
        assert_int_equal(g->body_case, e.body_case);
        if (which == 0) assert_int_equal(g->accepted->prompt_tokens, 12);
        if (which == 1) {
            assert_int_equal(g->tokens->n_tokens, 3);
            assert_int_equal(g->tokens->tokens[2], 999);
            assert_memory_equal(g->tokens->text.data, "abc", 3);
        }
        if (which == 2) assert_true(g->finished->stats->accepted == 7 && g->finished->stats->total_ms == 12.5);
        if (which == 3) {
            assert_int_equal(g->error->code, SPECD__CODE__CODE_OVERLOADED);
            assert_string_equal(g->error->message, "queue full (256 waiting)");
            assert_int_equal(g->error->client_tag, 77);
        }
        if (which == 4) assert_int_equal(g->stats->workers[0]->stats->kv_blocks_free, 60);
        specd__coordinator_to_client__free_unpacked(g, NULL);
        sd_net_msg_clear(&m);
    }
    pair_close(&p);
}

/* A valid verify batch of two sequences; the pieces live in *vb. */
typedef struct verify_batch {
    Specd__CoordinatorToWorker env;
    Specd__VerifyRequest req;
    Specd__VerifySeq seq[2];
    Specd__VerifySeq *seqs[2];
    Specd__SparseDist q[2];
    Specd__SparseDist *qs[2];
    Specd__Sampling smp;
    int32_t append0[3], append1[1], draft[2], qids[2][3];
    float qprobs[2][3];
} verify_batch;

static void verify_batch_init(verify_batch *vb) {
    memset(vb, 0, sizeof *vb);
    specd__coordinator_to_worker__init(&vb->env);
    specd__verify_request__init(&vb->req);
    specd__sampling__init(&vb->smp);
    vb->smp.temperature = 1.0f;
    int32_t a0[3] = {5, 6, 7};
    memcpy(vb->append0, a0, sizeof a0);
    vb->append1[0] = 9;
    vb->draft[0] = 10, vb->draft[1] = 11;
    for (int j = 0; j < 2; j++) {
        specd__sparse_dist__init(&vb->q[j]);
        vb->qids[j][0] = vb->draft[j], vb->qids[j][1] = 20, vb->qids[j][2] = 30;
        vb->qprobs[j][0] = 0.5f, vb->qprobs[j][1] = 0.25f, vb->qprobs[j][2] = 0.25f;
        vb->q[j].n_ids = vb->q[j].n_probs = 3;
        vb->q[j].ids = vb->qids[j];
        vb->q[j].probs = vb->qprobs[j];
        vb->qs[j] = &vb->q[j];
    }
    for (int i = 0; i < 2; i++) {
        specd__verify_seq__init(&vb->seq[i]);
        vb->seqs[i] = &vb->seq[i];
        vb->seq[i].sampling = &vb->smp;
    }
    vb->seq[0].request_id = 1, vb->seq[0].keep_len = 0, vb->seq[0].n_append = 3, vb->seq[0].append = vb->append0;
    vb->seq[1].request_id = 2, vb->seq[1].keep_len = 40, vb->seq[1].n_append = 1, vb->seq[1].append = vb->append1;
    vb->seq[1].n_draft = 2, vb->seq[1].draft = vb->draft, vb->seq[1].n_q = 2, vb->seq[1].q = vb->qs;
    vb->req.step_id = 33, vb->req.n_seqs = 2, vb->req.seqs = vb->seqs;
    vb->env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY;
    vb->env.verify = &vb->req;
}

static void test_round_trip_worker_link(void **state) {
    (void)state;
    pair p;
    pair_open(&p, "inproc://rt-worker", SD_MAX_WORKER_MSG_BYTES);
    sd_net_msg m;
    Specd__Code code;
    char err[256];

    /* coordinator -> worker */
    verify_batch vb;
    verify_batch_init(&vb);
    Specd__DraftSeq ds = SPECD__DRAFT_SEQ__INIT;
    int32_t app[] = {1, 2, 3, 4};
    ds.request_id = 4, ds.n_append = 4, ds.append = app, ds.k = 4, ds.top_n = 8;
    Specd__DraftSeq *dss[] = {&ds};
    Specd__DraftRequest dr = SPECD__DRAFT_REQUEST__INIT;
    dr.step_id = 8, dr.n_seqs = 1, dr.seqs = dss;
    Specd__Welcome wel = SPECD__WELCOME__INIT;
    wel.worker_id = 3, wel.heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS;
    uint64_t rel_ids[] = {1, 2, 3};
    Specd__Release rel = SPECD__RELEASE__INIT;
    rel.n_request_ids = 3, rel.request_ids = rel_ids;
    Specd__Error er = SPECD__ERROR__INIT;
    sd_net_error_init(&er, SPECD__CODE__CODE_PROTOCOL, 0, 0, "not registered");
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    for (int which = 0; which < 6; which++) {
        Specd__CoordinatorToWorker e = SPECD__COORDINATOR_TO_WORKER__INIT;
        if (which == 0) e = vb.env;
        if (which == 1) e.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT, e.draft = &dr;
        if (which == 2) e.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME, e.welcome = &wel;
        if (which == 3) e.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE, e.release = &rel;
        if (which == 4) e.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_ERROR, e.error = &er;
        if (which == 5) e.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT, e.heartbeat = &hb;
        router_to_dealer(&p, &e.base, &m);
        Specd__CoordinatorToWorker *g = sd_net_decode_to_worker(m.body, m.body_len, &LIM, &code, err, sizeof err);
        if (!g) fail_msg("case %d rejected: %s", which, err);
        assert_int_equal(g->body_case, e.body_case);
        if (which == 0) {
            assert_int_equal(g->verify->n_seqs, 2);
            assert_int_equal(g->verify->seqs[1]->draft[1], 11);
            assert_true(g->verify->seqs[1]->q[0]->probs[1] == 0.25f);
        }
        if (which == 1) assert_int_equal(g->draft->seqs[0]->append[3], 4);
        if (which == 2) assert_int_equal(g->welcome->worker_id, 3);
        if (which == 3) assert_int_equal(g->release->request_ids[2], 3);
        if (which == 4) assert_string_equal(g->error->message, "not registered");
        specd__coordinator_to_worker__free_unpacked(g, NULL);
        sd_net_msg_clear(&m);
    }

    /* worker -> coordinator */
    Specd__ModelIdentity mid = SPECD__MODEL_IDENTITY__INIT;
    mid.architecture = "llama", mid.vocab_size = 1000, mid.vocab_hash = 0x123456789abcdefull;
    Specd__Hello hello = SPECD__HELLO__INIT;
    hello.protocol_version = SD_PROTOCOL_VERSION, hello.role = SPECD__ROLE__ROLE_DRAFTER, hello.group_size = 1;
    hello.model = &mid, hello.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM, hello.max_batch = 8;
    hello.max_k = 4;
    Specd__DraftResult dres = SPECD__DRAFT_RESULT__INIT;
    dres.request_id = 4, dres.code = SPECD__CODE__CODE_OK, dres.n_tokens = 2, dres.tokens = vb.draft;
    dres.n_q = 2, dres.q = vb.qs, dres.cached_len = 4;
    Specd__DraftResult *dress[] = {&dres};
    Specd__DraftResponse dresp = SPECD__DRAFT_RESPONSE__INIT;
    dresp.step_id = 8, dresp.n_results = 1, dresp.results = dress;
    int32_t commit[] = {10, 11, 12};
    Specd__VerifyResult vres = SPECD__VERIFY_RESULT__INIT;
    vres.request_id = 2, vres.code = SPECD__CODE__CODE_OK, vres.n_accepted = 2, vres.n_commit = 3;
    vres.commit = commit, vres.cached_len = 43;
    Specd__VerifyResult *vress[] = {&vres};
    Specd__VerifyResponse vresp = SPECD__VERIFY_RESPONSE__INIT;
    vresp.step_id = 33, vresp.n_results = 1, vresp.results = vress;
    Specd__WorkerStats ws = SPECD__WORKER_STATS__INIT;
    ws.kv_blocks_total = 64;
    hb.stats = &ws;
    for (int which = 0; which < 5; which++) {
        Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
        if (which == 0) e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO, e.hello = &hello;
        if (which == 1) e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT, e.draft = &dresp;
        if (which == 2) e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY, e.verify = &vresp;
        if (which == 3) e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT, e.heartbeat = &hb;
        if (which == 4) e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR, e.error = &er;
        dealer_to_router(&p, &e.base, &m);
        Specd__WorkerToCoordinator *g = sd_net_decode_worker(m.body, m.body_len, &LIM, &code, err, sizeof err);
        if (!g) fail_msg("case %d rejected: %s", which, err);
        assert_int_equal(g->body_case, e.body_case);
        if (which == 0) assert_true(g->hello->model->vocab_hash == 0x123456789abcdefull);
        if (which == 1) assert_int_equal(g->draft->results[0]->q[1]->ids[0], 11);
        if (which == 2) assert_int_equal(g->verify->results[0]->commit[2], 12);
        if (which == 3) assert_int_equal(g->heartbeat->stats->kv_blocks_total, 64);
        specd__worker_to_coordinator__free_unpacked(g, NULL);
        sd_net_msg_clear(&m);
    }
    pair_close(&p);
}

/* ---- malformed bytes ---- */

/* sd_utf8_valid_len (engine/common.c), which checks every text field here
 * and the safetensors header: the valid prefix's length. */
static void test_utf8_valid_len(void **state) {
    (void)state;
    const struct {
        const char *bytes;
        size_t len, valid;
    } cases[] = {
        {"", 0, 0},
        {"plain", 5, 5},
        {"caf\xc3\xa9", 5, 5},       /* U+00E9 */
        {"\xe2\x82\xac", 3, 3},      /* U+20AC */
        {"\xf0\x9f\x98\x80", 4, 4},  /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", 4, 4},  /* U+10FFFF */
        {"a\xc0\x80", 3, 1},         /* overlong NUL */
        {"\xe0\x80\x80", 3, 0},      /* overlong 3-byte */
        {"\xf0\x80\x80\x80", 4, 0},  /* overlong 4-byte */
        {"ab\xed\xa0\x80", 5, 2},    /* surrogate U+D800 */
        {"\xf4\x90\x80\x80", 4, 0},  /* above U+10FFFF */
        {"ok\xe2\x82", 4, 2},        /* truncated at the end */
        {"\x80", 1, 0},              /* lone continuation */
        {"x\xf5\x80\x80\x80", 5, 1}, /* 0xF5 never starts one */
        {"\xc3(", 2, 0},             /* bad continuation */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = sd_utf8_valid_len(cases[i].bytes, cases[i].len);
        if (got != cases[i].valid) fail_msg("case %zu: valid prefix %zu, expected %zu", i, got, cases[i].valid);
    }
}

/* Welcome.vocab_size (the target's rows, for a drafter padded to others):
 * 0 (not said) and an int32 size pass, a larger one is refused. */
static void test_welcome_vocab(void **state) {
    (void)state;
    const uint32_t sizes[3] = {0, 152064, (uint32_t)INT32_MAX + 1u};
    for (int i = 0; i < 3; i++) {
        Specd__Welcome wel = SPECD__WELCOME__INIT;
        wel.protocol_version = SD_PROTOCOL_VERSION;
        wel.vocab_size = sizes[i];
        Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
        env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME;
        env.welcome = &wel;
        size_t len;
        uint8_t *bytes = pack(&env.base, &len);
        Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
        char err[256] = "";
        Specd__CoordinatorToWorker *w = sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err);
        free(bytes);
        if (i < 2) {
            assert_non_null(w);
            assert_int_equal(w->welcome->vocab_size, sizes[i]);
            specd__coordinator_to_worker__free_unpacked(w, NULL);
        } else {
            assert_null(w);
            assert_int_equal(code, SPECD__CODE__CODE_BAD_REQUEST);
            assert_non_null(strstr(err, "welcome.vocab_size"));
        }
    }
}

static void test_malformed(void **state) {
    (void)state;
    Specd__Code code;
    char err[256];
    /* random garbage: fixed seed, every buffer rejected */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int malformed = 0;
    for (int t = 0; t < 500; t++) {
        uint8_t buf[64];
        size_t n = 1 + (size_t)(t % 64);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        Specd__ClientToCoordinator *c = sd_net_decode_client(buf, n, &LIM, &code, err, sizeof err);
        Specd__CoordinatorToWorker *w = sd_net_decode_to_worker(buf, n, &LIM, &code, err, sizeof err);
        if (c) specd__client_to_coordinator__free_unpacked(c, NULL);
        if (w) specd__coordinator_to_worker__free_unpacked(w, NULL);
        assert_null(c);
        assert_null(w);
        malformed += code == SPECD__CODE__CODE_MALFORMED;
    }
    assert_true(malformed > 450); /* a few may decode into a field that then fails validation */

    /* truncated: a valid verify batch cut at every length */
    verify_batch vb;
    verify_batch_init(&vb);
    size_t len;
    uint8_t *bytes = pack(&vb.env.base, &len);
    Specd__CoordinatorToWorker *ok = sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err);
    assert_non_null(ok);
    specd__coordinator_to_worker__free_unpacked(ok, NULL);
    for (size_t cut = 0; cut < len; cut++) {
        Specd__CoordinatorToWorker *w = sd_net_decode_to_worker(bytes, cut, &LIM, &code, err, sizeof err);
        if (w) specd__coordinator_to_worker__free_unpacked(w, NULL);
        assert_null(w);
        if (cut > 0 && code != SPECD__CODE__CODE_MALFORMED) fail_msg("cut %zu: code %d (%s)", cut, code, err);
    }
    /* cut 0 is an empty envelope */
    assert_null(sd_net_decode_to_worker(bytes, 0, &LIM, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    assert_non_null(strstr(err, "empty envelope"));
    free(bytes);

    /* wrong envelope: a worker Hello handed to the client decoder */
    Specd__ModelIdentity mid = SPECD__MODEL_IDENTITY__INIT;
    mid.vocab_size = 1000;
    Specd__Hello hello = SPECD__HELLO__INIT;
    hello.protocol_version = 1, hello.role = SPECD__ROLE__ROLE_VERIFIER, hello.group_size = 2, hello.model = &mid;
    Specd__WorkerToCoordinator we = SPECD__WORKER_TO_COORDINATOR__INIT;
    we.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO, we.hello = &hello;
    bytes = pack(&we.base, &len);
    assert_null(sd_net_decode_to_client(bytes, len, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    /* Hello's group_size (a varint) lands on Accepted.prompt_text (bytes):
     * the bytes do not decode at all, which is as MALFORMED */
    if (!strstr(err, "unknown field") && !strstr(err, "do not decode")) fail_msg("wrong envelope: '%s'", err);
    free(bytes);
    /* a verify batch handed to the worker->coordinator decoder */
    bytes = pack(&vb.env.base, &len);
    assert_null(sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    free(bytes);
    /* ServiceStats: the per-position counters, as long as each other and
     * at most SD_MAX_K entries */
    uint64_t pos[SD_MAX_K + 1] = {0};
    Specd__ServiceStats ss = SPECD__SERVICE_STATS__INIT;
    ss.draft_tokens_per_pos = ss.accepted_tokens_per_pos = pos;
    Specd__CoordinatorToClient se = SPECD__COORDINATOR_TO_CLIENT__INIT;
    se.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_STATS, se.stats = &ss;
    const size_t n_pos[3][2] = {{SD_MAX_K, SD_MAX_K}, {SD_MAX_K + 1, SD_MAX_K + 1}, {4, 3}};
    const Specd__Code want_code[3] = {SPECD__CODE__CODE_OK, SPECD__CODE__CODE_TOO_LARGE, SPECD__CODE__CODE_BAD_REQUEST};
    for (int i = 0; i < 3; i++) {
        ss.n_draft_tokens_per_pos = n_pos[i][0], ss.n_accepted_tokens_per_pos = n_pos[i][1];
        bytes = pack(&se.base, &len);
        Specd__CoordinatorToClient *g = sd_net_decode_to_client(bytes, len, &code, err, sizeof err);
        free(bytes);
        if (want_code[i] == SPECD__CODE__CODE_OK) {
            assert_non_null(g);
            assert_int_equal(g->stats->n_accepted_tokens_per_pos, SD_MAX_K);
            specd__coordinator_to_client__free_unpacked(g, NULL);
        } else {
            assert_null(g);
            assert_int_equal(code, want_code[i]);
            assert_non_null(strstr(err, "per_pos"));
        }
    }
    /* empty envelopes on every link */
    assert_null(sd_net_decode_client((const uint8_t *)"", 0, NULL, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    assert_null(sd_net_decode_to_client((const uint8_t *)"", 0, &code, err, sizeof err));
    assert_null(sd_net_decode_worker((const uint8_t *)"", 0, NULL, &code, err, sizeof err));
    assert_non_null(strstr(err, "empty envelope"));
}

/* ---- validation rules ---- */

/* Packs env, decodes it with the to-worker decoder, expects rejection with
 * code and a message containing want. */
static void expect_to_worker(const Specd__CoordinatorToWorker *env, Specd__Code want_code, const char *want) {
    size_t len;
    uint8_t *bytes = pack(&env->base, &len);
    Specd__Code code;
    char err[256];
    Specd__CoordinatorToWorker *g = sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err);
    free(bytes);
    if (g) {
        specd__coordinator_to_worker__free_unpacked(g, NULL);
        fail_msg("accepted, expected an error containing '%s'", want);
    }
    if (code != want_code || !strstr(err, want))
        fail_msg("got code %s '%s', expected %s '%s'", sd_net_code_name(code), err, sd_net_code_name(want_code), want);
}

static void test_validate_verify(void **state) {
    (void)state;
    verify_batch vb;
    const Specd__Code BAD = SPECD__CODE__CODE_BAD_REQUEST, BIG = SPECD__CODE__CODE_TOO_LARGE;

    verify_batch_init(&vb);
    vb.draft[1] = 1000; /* also q's support */
    vb.qids[1][0] = 1000;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].draft[1]: token id 1000 out of range [0, 1000)");
    verify_batch_init(&vb);
    vb.append0[2] = -3;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].append[2]: token id -3");
    verify_batch_init(&vb);
    Specd__VerifySeq *many[9];
    for (int i = 0; i < 9; i++) many[i] = &vb.seq[0];
    vb.req.seqs = many, vb.req.n_seqs = 9;
    expect_to_worker(&vb.env, BIG, "verify.seqs: 9 sequences over the limit of 8");
    verify_batch_init(&vb);
    vb.req.n_seqs = 0;
    expect_to_worker(&vb.env, BAD, "verify.seqs: empty batch");
    verify_batch_init(&vb);
    vb.seq[1].request_id = 1;
    expect_to_worker(&vb.env, BAD, "request_id 1 appears twice");
    verify_batch_init(&vb);
    int32_t five[5] = {1, 2, 3, 4, 5};
    vb.seq[0].draft = five, vb.seq[0].n_draft = 5;
    expect_to_worker(&vb.env, BIG, "verify.seqs[0].draft: 5 tokens over the limit of 4");
    verify_batch_init(&vb);
    vb.seq[1].n_q = 1;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q: 1 distributions for 2 drafts");
    verify_batch_init(&vb);
    vb.qprobs[0][1] = 0.3f;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[0].probs: sum 1.05");
    verify_batch_init(&vb);
    vb.qprobs[1][2] = NAN;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[1].probs[2]: nan");
    verify_batch_init(&vb);
    vb.qprobs[1][0] = 0.75f, vb.qprobs[1][2] = 0.0f;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[1].probs[2]: 0 is not a finite probability > 0");
    verify_batch_init(&vb);
    vb.qids[0][2] = 20;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[0].ids[2]: duplicate token id 20");
    verify_batch_init(&vb);
    vb.q[0].n_probs = 2;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[0]: 3 ids but 2 probs");
    verify_batch_init(&vb);
    vb.qids[0][0] = 500; /* drafted 10 but q has no mass on it */
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[0]: drafted token 10 is not in its support");
    verify_batch_init(&vb);
    vb.qids[0][1] = 5000;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[0].ids[1]: token id 5000 out of range");
    /* a large q with a duplicate (sorted path) and one over SD_MAX_TOP_N */
    verify_batch_init(&vb);
    int32_t *bigids = malloc((SD_MAX_TOP_N + 1) * sizeof *bigids);
    float *bigp = malloc((SD_MAX_TOP_N + 1) * sizeof *bigp);
    for (int i = 0; i <= SD_MAX_TOP_N; i++) bigids[i] = i % 1000, bigp[i] = 1.0f / 100;
    bigids[0] = 10;
    vb.q[0].ids = bigids, vb.q[0].probs = bigp, vb.q[0].n_ids = vb.q[0].n_probs = 100;
    bigids[50] = 7, bigids[60] = 7;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].q[0].ids: duplicate token id 7");
    vb.q[0].n_ids = vb.q[0].n_probs = SD_MAX_TOP_N + 1;
    expect_to_worker(&vb.env, BIG, "verify.seqs[1].q[0]: 1025 entries over the limit of 1024");
    free(bigids);
    free(bigp);
    verify_batch_init(&vb);
    vb.seq[1].keep_len = 509; /* 509 + 1 + 2 = 512 fits */
    {
        size_t len;
        uint8_t *bytes = pack(&vb.env.base, &len);
        Specd__Code code;
        char err[256];
        Specd__CoordinatorToWorker *g = sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err);
        free(bytes);
        if (!g) fail_msg("rejected: %s", err);
        specd__coordinator_to_worker__free_unpacked(g, NULL);
    }
    vb.seq[1].keep_len = 510;
    expect_to_worker(&vb.env, BIG, "verify.seqs[1]: keep_len 510 + new tokens = 513 over the context of 512");
    verify_batch_init(&vb);
    vb.seq[0].n_append = 0;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].append: empty with no drafts");
    verify_batch_init(&vb);
    vb.req.prefill_only = 1;
    expect_to_worker(&vb.env, BAD, "verify.seqs[1].draft: 2 drafts in a prefill_only batch");
    verify_batch_init(&vb);
    vb.smp.temperature = -1.0f;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].sampling.temperature: -1");
    verify_batch_init(&vb);
    vb.smp.top_p = 1.5f;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].sampling.top_p: 1.5 outside (0, 1]");
    verify_batch_init(&vb);
    vb.smp.min_p = 1.0f;
    expect_to_worker(&vb.env, BAD, "sampling.min_p: 1 outside [0, 1)");
}

static void test_validate_draft_request(void **state) {
    (void)state;
    Specd__DraftSeq ds = SPECD__DRAFT_SEQ__INIT;
    int32_t app[] = {1, 2, 3, 4};
    ds.request_id = 4, ds.n_append = 4, ds.append = app, ds.k = 4;
    Specd__DraftSeq *dss[] = {&ds, &ds};
    Specd__DraftRequest dr = SPECD__DRAFT_REQUEST__INIT;
    dr.n_seqs = 1, dr.seqs = dss;
    Specd__CoordinatorToWorker e = SPECD__COORDINATOR_TO_WORKER__INIT;
    e.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT, e.draft = &dr;
    ds.k = 5;
    expect_to_worker(&e, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[0].k: 5 outside [1, 4]");
    ds.k = 0;
    expect_to_worker(&e, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[0].k: 0 outside [1, 4]");
    ds.k = 2, ds.top_n = 5000;
    expect_to_worker(&e, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[0].top_n: 5000 over the limit of 1024");
    ds.top_n = 0, app[1] = 1000;
    expect_to_worker(&e, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[0].append[1]: token id 1000 out of range");
    app[1] = 2, dr.n_seqs = 2;
    expect_to_worker(&e, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs: request_id 4 appears twice");
    dr.n_seqs = 1, ds.keep_len = 600;
    expect_to_worker(&e, SPECD__CODE__CODE_TOO_LARGE, "draft.seqs[0]: keep_len 600");
    int32_t *longer = calloc(513, sizeof *longer);
    ds.keep_len = 0, ds.append = longer, ds.n_append = 513;
    expect_to_worker(&e, SPECD__CODE__CODE_TOO_LARGE, "draft.seqs[0].append: 513 tokens over the context of 512");
    free(longer);
}

/* Expects the client decoder to reject sub with code and a message containing want. */
static void expect_submit(const Specd__SubmitRequest *sub, Specd__Code want_code, const char *want) {
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = (Specd__SubmitRequest *)sub;
    size_t len;
    uint8_t *bytes = pack(&e.base, &len);
    Specd__Code code;
    char err[256];
    Specd__ClientToCoordinator *g = sd_net_decode_client(bytes, len, &LIM, &code, err, sizeof err);
    free(bytes);
    if (g) {
        specd__client_to_coordinator__free_unpacked(g, NULL);
        fail_msg("accepted, expected an error containing '%s'", want);
    }
    if (code != want_code || !strstr(err, want))
        fail_msg("got code %s '%s', expected %s '%s'", sd_net_code_name(code), err, sd_net_code_name(want_code), want);
}

static void test_validate_submit(void **state) {
    (void)state;
    const Specd__Code BAD = SPECD__CODE__CODE_BAD_REQUEST, BIG = SPECD__CODE__CODE_TOO_LARGE;
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    expect_submit(&s, BAD, "submit.prompt: empty");
    s.prompt = "ok \xc3\x28 bad";
    expect_submit(&s, BAD, "submit.prompt: invalid UTF-8 at byte 3 (0xc3)");
    s.prompt = "\xed\xa0\x80"; /* a UTF-16 surrogate */
    expect_submit(&s, BAD, "invalid UTF-8 at byte 0");
    s.prompt = "\xc0\xaf"; /* overlong */
    expect_submit(&s, BAD, "invalid UTF-8 at byte 0");
    char *huge = malloc(SD_MAX_PROMPT_BYTES + 2);
    memset(huge, 'a', SD_MAX_PROMPT_BYTES + 1);
    huge[SD_MAX_PROMPT_BYTES + 1] = '\0';
    s.prompt = huge;
    expect_submit(&s, BIG, "submit.prompt: 1048577 bytes over the limit of 1048576");
    free(huge);
    s.prompt = "hello";
    int32_t ids[600];
    for (int i = 0; i < 600; i++) ids[i] = i;
    s.prompt_ids = ids, s.n_prompt_ids = 600;
    expect_submit(&s, BIG, "submit.prompt_ids: 600 tokens over the context of 512");
    s.n_prompt_ids = 3, ids[1] = 1000;
    expect_submit(&s, BAD, "submit.prompt_ids[1]: token id 1000 out of range [0, 1000)");
    s.n_prompt_ids = 0, s.max_tokens = 513;
    expect_submit(&s, BIG, "submit.max_tokens: 513 over the context of 512");
    s.max_tokens = 10;
    char *stops[SD_MAX_STOP_STRINGS + 1];
    for (int i = 0; i <= SD_MAX_STOP_STRINGS; i++) stops[i] = "x";
    s.stop = stops, s.n_stop = SD_MAX_STOP_STRINGS + 1;
    expect_submit(&s, BIG, "submit.stop: 17 strings over the limit of 16");
    s.n_stop = 2, stops[1] = "";
    expect_submit(&s, BAD, "submit.stop[1]: empty stop string");
    char longstop[SD_MAX_STOP_BYTES + 2];
    memset(longstop, 'z', sizeof longstop - 1);
    longstop[sizeof longstop - 1] = '\0';
    stops[1] = longstop;
    expect_submit(&s, BIG, "submit.stop[1]: 257 bytes over the limit of 256");
    s.n_stop = 0, s.max_k = 33;
    expect_submit(&s, BAD, "submit.max_k: 33 outside [-1, 32]");
    s.max_k = -2;
    expect_submit(&s, BAD, "submit.max_k: -2");
    s.max_k = 0;
    Specd__Sampling smp = SPECD__SAMPLING__INIT;
    smp.temperature = INFINITY;
    s.sampling = &smp;
    expect_submit(&s, BAD, "submit.sampling.temperature: inf, must be finite and >= 0");
    smp.temperature = 0.5f, smp.top_p = -0.1f;
    expect_submit(&s, BAD, "submit.sampling.top_p: -0.1");
}

/* SubmitRequest.messages[].tool_call_id: a tool turn's only, UTF-8, at most
 * SD_MAX_CALL_ID_BYTES; a good one reaches the coordinator intact. */
static void test_validate_submit_tool_call_id(void **state) {
    (void)state;
    const Specd__Code BAD = SPECD__CODE__CODE_BAD_REQUEST, BIG = SPECD__CODE__CODE_TOO_LARGE;
    Specd__ChatMessage user = SPECD__CHAT_MESSAGE__INIT, tool = SPECD__CHAT_MESSAGE__INIT;
    user.role = SPECD__CHAT_ROLE__CHAT_ROLE_USER, user.content = "q";
    tool.role = SPECD__CHAT_ROLE__CHAT_ROLE_TOOL, tool.content = "12:00", tool.tool_call_id = "abcDEF123";
    Specd__ChatMessage *msgs[] = {&user, &tool};
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.messages = msgs, s.n_messages = 2;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    size_t len;
    uint8_t *bytes = pack(&e.base, &len);
    Specd__Code code;
    char err[256];
    Specd__ClientToCoordinator *g = sd_net_decode_client(bytes, len, &LIM, &code, err, sizeof err);
    free(bytes);
    if (!g) fail_msg("rejected: %s", err);
    assert_string_equal(g->submit->messages[1]->tool_call_id, "abcDEF123");
    assert_string_equal(g->submit->messages[0]->tool_call_id, "");
    specd__client_to_coordinator__free_unpacked(g, NULL);
    user.tool_call_id = "abcDEF123";
    expect_submit(&s, BAD, "submit.messages[0].tool_call_id: a tool_call_id in a turn that is not a tool's");
    user.tool_call_id = "";
    tool.tool_call_id = "ab\xc3\x28";
    expect_submit(&s, BAD, "submit.messages[1].tool_call_id: invalid UTF-8 at byte 2");
    char long_id[SD_MAX_CALL_ID_BYTES + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    tool.tool_call_id = long_id;
    expect_submit(&s, BIG, "submit.messages[1].tool_call_id: 257 bytes over the limit of 256");
}

/* A decoded message must pass: frees it, or fails naming why not. */
static void accept_decoded(void *g, void (*free_fn)(void *), const char *err, const char *what) {
    if (!g) fail_msg("%s rejected: %s", what, err);
    free_fn(g);
}

static void free_to_worker(void *g) { specd__coordinator_to_worker__free_unpacked(g, NULL); }
static void free_from_worker(void *g) { specd__worker_to_coordinator__free_unpacked(g, NULL); }
static void free_to_client(void *g) { specd__coordinator_to_client__free_unpacked(g, NULL); }

/* Expects the client-side decoder to reject env with code and want. */
static void expect_to_client(const Specd__CoordinatorToClient *env, Specd__Code want_code, const char *want) {
    size_t len;
    uint8_t *bytes = pack(&env->base, &len);
    Specd__Code code;
    char err[256];
    Specd__CoordinatorToClient *g = sd_net_decode_to_client(bytes, len, &code, err, sizeof err);
    free(bytes);
    if (g) {
        specd__coordinator_to_client__free_unpacked(g, NULL);
        fail_msg("accepted, expected an error containing '%s'", want);
    }
    if (code != want_code || !strstr(err, want))
        fail_msg("got code %s '%s', expected %s '%s'", sd_net_code_name(code), err, sd_net_code_name(want_code), want);
}

/* Prompt logprobs (echo): VerifySeq.prompt_logprobs only in prefill steps,
 * at most SD_MAX_PROMPT_LP_ROWS appended tokens, prompt_next a token inside
 * the context; a prefill result with one logprob per appended token at
 * most; SubmitRequest.prompt_only only with max_tokens 0; PromptLogprobs
 * one entry per token, position 0 without a logprob, the others with one;
 * Accepted.prompt_text bounded. */
static void test_validate_prompt_logprobs(void **state) {
    (void)state;
    const Specd__Code BAD = SPECD__CODE__CODE_BAD_REQUEST, BIG = SPECD__CODE__CODE_TOO_LARGE;
    Specd__Code code;
    char err[256];
    size_t len;
    uint8_t *bytes;

    /* ---- VerifySeq */
    verify_batch vb;
    verify_batch_init(&vb);
    vb.req.n_seqs = 1, vb.req.prefill_only = 1;
    vb.seq[0].prompt_logprobs = 1, vb.seq[0].prompt_next = 8, vb.seq[0].top_logprobs = 3;
    bytes = pack(&vb.env.base, &len);
    accept_decoded(sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err), free_to_worker, err,
                   "a prefill chunk with prompt logprobs");
    free(bytes);
    vb.req.prefill_only = 0;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].prompt_logprobs: a normal step");
    vb.req.prefill_only = 1, vb.seq[0].prompt_next = 1000;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].prompt_next[0]: token id 1000 out of range");
    vb.seq[0].prompt_next = -1;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].prompt_next[0]: token id -1");
    vb.seq[0].prompt_next = 8, vb.seq[0].keep_len = 509; /* 509 + 3 = 512 fits, the next token does not */
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].prompt_next: position 512 past the context of 512");
    vb.seq[0].keep_len = 0, vb.seq[0].top_logprobs = SD_MAX_TOP_LOGPROBS + 1;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].top_logprobs: 21 over the limit of 20");
    int32_t rows[SD_MAX_PROMPT_LP_ROWS + 1] = {0};
    vb.seq[0].top_logprobs = 3, vb.seq[0].append = rows, vb.seq[0].n_append = SD_MAX_PROMPT_LP_ROWS + 1;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].prompt_logprobs: prefill with 65 appended tokens");
    vb.seq[0].n_append = SD_MAX_PROMPT_LP_ROWS;
    bytes = pack(&vb.env.base, &len);
    accept_decoded(sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err), free_to_worker, err,
                   "a 64-token chunk with prompt logprobs");
    free(bytes);

    /* ---- VerifyResult of a prefill chunk: up to SD_MAX_PROMPT_LP_ROWS logprobs, nothing committed */
    float lps[SD_MAX_PROMPT_LP_ROWS + 1], tops[2 * (SD_MAX_PROMPT_LP_ROWS + 1)];
    int32_t top_ids[2 * (SD_MAX_PROMPT_LP_ROWS + 1)];
    for (int i = 0; i <= SD_MAX_PROMPT_LP_ROWS; i++) lps[i] = -1.0f;
    for (int i = 0; i < 2 * (SD_MAX_PROMPT_LP_ROWS + 1); i++) tops[i] = -0.5f, top_ids[i] = i % 1000;
    Specd__VerifyResult vres = SPECD__VERIFY_RESULT__INIT;
    vres.request_id = 1, vres.code = SPECD__CODE__CODE_OK, vres.cached_len = 3;
    vres.n_logprobs = 3, vres.logprobs = lps;
    vres.n_top_ids = vres.n_top_logprobs = 6, vres.top_ids = top_ids, vres.top_logprobs = tops;
    Specd__VerifyResult *vress[] = {&vres};
    Specd__VerifyResponse vresp = SPECD__VERIFY_RESPONSE__INIT;
    vresp.n_results = 1, vresp.results = vress;
    Specd__WorkerToCoordinator we = SPECD__WORKER_TO_COORDINATOR__INIT;
    we.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY, we.verify = &vresp;
    bytes = pack(&we.base, &len);
    accept_decoded(sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err), free_from_worker, err,
                   "a prefill result with 3 prompt logprobs");
    free(bytes);
    struct {
        size_t n_lp, n_top;
        float first;
        const char *want;
    } bad_results[] = {
        {SD_MAX_PROMPT_LP_ROWS + 1, 2 * (SD_MAX_PROMPT_LP_ROWS + 1), -1.0f, "65 logprobs, 130 top ids"},
        {3, 7, -1.0f, "3 logprobs, 7 top ids"},
        {3, 6, 0.5f, "0.5 is not a log-probability"},
        {3, 6, NAN, "nan is not a log-probability"},
    };
    for (size_t c = 0; c < sizeof bad_results / sizeof bad_results[0]; c++) {
        vres.n_logprobs = bad_results[c].n_lp;
        vres.n_top_ids = vres.n_top_logprobs = bad_results[c].n_top;
        lps[0] = bad_results[c].first;
        bytes = pack(&we.base, &len);
        Specd__WorkerToCoordinator *g = sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err);
        free(bytes);
        if (g) specd__worker_to_coordinator__free_unpacked(g, NULL);
        if (g || !strstr(err, bad_results[c].want)) fail_msg("case %zu: '%s' lacks '%s'", c, err, bad_results[c].want);
    }

    /* ---- SubmitRequest */
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.prompt = "hello", s.prompt_only = 1, s.max_tokens = 5;
    expect_submit(&s, BAD, "submit.prompt_only: with max_tokens 5 (must be 0)");
    s.max_tokens = 0, s.top_logprobs = 21, s.prompt_logprobs = 1;
    expect_submit(&s, BAD, "submit.top_logprobs: 21 over the limit of 20");
    s.top_logprobs = 3, s.prompt_logprobs = 0;
    expect_submit(&s, BAD, "submit.top_logprobs: 3 without logprobs");
    int32_t cont[] = {4};
    s.prompt_logprobs = 1, s.continuation = cont, s.n_continuation = 1;
    expect_submit(&s, BAD, "submit.prompt_only: with a continuation");

    /* ---- PromptLogprobs */
    Specd__TokenLogprob tl[SD_MAX_PROMPT_LP_ROWS + 1], *tlp[SD_MAX_PROMPT_LP_ROWS + 1];
    int32_t ptoks[SD_MAX_PROMPT_LP_ROWS + 1];
    for (int i = 0; i <= SD_MAX_PROMPT_LP_ROWS; i++) {
        specd__token_logprob__init(&tl[i]);
        tl[i].logprob = -2.0f;
        tlp[i] = &tl[i];
        ptoks[i] = i;
    }
    Specd__PromptLogprobs pl = SPECD__PROMPT_LOGPROBS__INIT;
    pl.request_id = 7, pl.from = 1, pl.n_tokens = pl.n_logprobs = 4, pl.tokens = ptoks, pl.logprobs = tlp;
    Specd__CoordinatorToClient ce = SPECD__COORDINATOR_TO_CLIENT__INIT;
    ce.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS, ce.prompt_logprobs = &pl;
    bytes = pack(&ce.base, &len);
    accept_decoded(sd_net_decode_to_client(bytes, len, &code, err, sizeof err), free_to_client, err,
                   "prompt logprobs of positions 1..4");
    free(bytes);
    pl.n_logprobs = 3;
    expect_to_client(&ce, BAD, "prompt_logprobs: 3 entries for 4 tokens from 1");
    pl.n_tokens = pl.n_logprobs = SD_MAX_PROMPT_LP_ROWS + 1;
    expect_to_client(&ce, BAD, "prompt_logprobs: 65 entries for 65 tokens");
    pl.n_tokens = pl.n_logprobs = 0;
    expect_to_client(&ce, BAD, "prompt_logprobs: 0 entries");
    pl.n_tokens = pl.n_logprobs = 2, pl.from = 0;
    expect_to_client(&ce, BAD, "prompt_logprobs: 2 entries for 2 tokens from 0");
    pl.n_tokens = pl.n_logprobs = 1;
    expect_to_client(&ce, BAD, "prompt_logprobs.logprobs[0]: prompt position 0 has no logprob");
    tl[0].logprob = NAN;
    bytes = pack(&ce.base, &len);
    accept_decoded(sd_net_decode_to_client(bytes, len, &code, err, sizeof err), free_to_client, err,
                   "prompt position 0");
    free(bytes);
    int32_t one_id[] = {3};
    float one_lp[] = {-1.0f};
    ProtobufCBinaryData one_tok[] = {{1, (uint8_t *)"x"}};
    tl[0].n_top_ids = tl[0].n_top_logprobs = tl[0].n_top_tokens = 1;
    tl[0].top_ids = one_id, tl[0].top_logprobs = one_lp, tl[0].top_tokens = one_tok;
    expect_to_client(&ce, BAD, "prompt_logprobs.logprobs[0]: prompt position 0 has no logprob");
    pl.from = 5, pl.n_tokens = pl.n_logprobs = 2; /* NaN past position 0 */
    expect_to_client(&ce, BAD, "prompt_logprobs.logprobs[0].logprob: nan is not a log-probability");
    tl[0].logprob = -1.0f, ptoks[1] = -5; /* the client knows no vocabulary: ids only >= 0 */
    expect_to_client(&ce, BAD, "prompt_logprobs.tokens[1]: token id -5 is negative");
    int32_t two_ids[] = {1, 2};
    ptoks[1] = 1, tl[1].n_top_ids = 2, tl[1].top_ids = two_ids;
    expect_to_client(&ce, BAD, "prompt_logprobs.logprobs[1]: 2 top ids, 0 top logprobs and 0 top tokens");
    tl[1].n_top_ids = 0;
    bytes = pack(&ce.base, &len);
    accept_decoded(sd_net_decode_to_client(bytes, len, &code, err, sizeof err), free_to_client, err,
                   "prompt logprobs of positions 5..6");
    free(bytes);

    /* ---- Accepted.prompt_text */
    Specd__Accepted acc = SPECD__ACCEPTED__INIT;
    uint8_t *text = calloc(SD_MAX_PROMPT_BYTES + 1, 1);
    assert_non_null(text);
    acc.prompt_text.data = text, acc.prompt_text.len = SD_MAX_PROMPT_BYTES + 1;
    ce.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED, ce.accepted = &acc;
    expect_to_client(&ce, BIG, "accepted.prompt_text: 1048577 bytes over the limit of 1048576");
    acc.prompt_text.len = 16;
    bytes = pack(&ce.base, &len);
    accept_decoded(sd_net_decode_to_client(bytes, len, &code, err, sizeof err), free_to_client, err,
                   "an Accepted with the prompt's text");
    free(bytes);
    free(text);
}

static void test_validate_worker_messages(void **state) {
    (void)state;
    Specd__Code code;
    char err[256];
    Specd__ModelIdentity mid = SPECD__MODEL_IDENTITY__INIT;
    mid.architecture = "llama", mid.vocab_size = 1000;
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = 1, h.role = SPECD__ROLE__ROLE_VERIFIER, h.group_size = 2, h.rank = 2, h.model = &mid;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO, e.hello = &h;
    struct {
        const char *want;
        int field;
    } cases[] = {{"hello.rank: 2 not below group_size 2", 0},
                 {"hello.group_size: 0, must be >= 1", 1},
                 {"hello.role: 1 is not ROLE_DRAFTER", 2},
                 {"hello.max_batch: 300 over the limit of 256", 3},
                 {"hello.model: missing", 4},
                 {"hello.drafter_kind: unspecified", 5},
                 {"hello.step_costs[1].tokens: 0 outside [1, 8448]", 6},
                 {"hello.step_costs[0].forward_us: 0", 7},
                 {"hello.step_costs: 257 entries over the limit of 256", 8},
                 {"hello.step_costs: only a verifier sends them", 9}};
    Specd__StepCost sc_ok = SPECD__STEP_COST__INIT, sc_bad = SPECD__STEP_COST__INIT;
    sc_ok.tokens = 4, sc_ok.forward_us = 900;
    sc_bad.tokens = 0, sc_bad.forward_us = 900;
    static Specd__StepCost *many[SD_MAX_STEP_COSTS + 1];
    for (size_t i = 0; i <= SD_MAX_STEP_COSTS; i++) many[i] = &sc_ok;
    Specd__StepCost *bad_tokens[] = {&sc_ok, &sc_bad}, *bad_time[] = {&sc_bad};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Specd__Hello hc = h;
        if (cases[c].field >= 6) hc.rank = 0, hc.n_step_costs = 2, hc.step_costs = bad_tokens;
        if (cases[c].field == 7)
            sc_bad.forward_us = 0, sc_bad.tokens = 3, hc.n_step_costs = 1, hc.step_costs = bad_time;
        if (cases[c].field == 8) hc.n_step_costs = SD_MAX_STEP_COSTS + 1, hc.step_costs = many;
        if (cases[c].field == 9)
            hc.role = SPECD__ROLE__ROLE_DRAFTER, hc.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM,
            hc.step_costs = many, hc.n_step_costs = 1;
        if (cases[c].field == 1) hc.group_size = 0;
        if (cases[c].field == 2) hc.role = SPECD__ROLE__ROLE_CLIENT, hc.rank = 0;
        if (cases[c].field == 3) hc.rank = 0, hc.max_batch = 300;
        if (cases[c].field == 4) hc.rank = 0, hc.model = NULL;
        if (cases[c].field == 5) hc.rank = 0, hc.role = SPECD__ROLE__ROLE_DRAFTER;
        e.hello = &hc;
        size_t len;
        uint8_t *bytes = pack(&e.base, &len);
        Specd__WorkerToCoordinator *g = sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err);
        free(bytes);
        if (g) specd__worker_to_coordinator__free_unpacked(g, NULL);
        assert_null(g);
        if (!strstr(err, cases[c].want)) fail_msg("'%s' lacks '%s'", err, cases[c].want);
    }

    /* verify results: commit must be n_accepted + 1, ids in range */
    int32_t commit[] = {10, 11, 12};
    Specd__VerifyResult vres = SPECD__VERIFY_RESULT__INIT;
    vres.request_id = 2, vres.code = SPECD__CODE__CODE_OK, vres.n_accepted = 1, vres.n_commit = 3;
    vres.commit = commit;
    Specd__VerifyResult *vress[] = {&vres};
    Specd__VerifyResponse vresp = SPECD__VERIFY_RESPONSE__INIT;
    vresp.n_results = 1, vresp.results = vress;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY, e.verify = &vresp;
    size_t len;
    uint8_t *bytes = pack(&e.base, &len);
    assert_null(sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "verify.results[0].commit: 3 tokens, expected n_accepted + 1 = 2"));
    vres.n_accepted = 2, commit[2] = 4242;
    bytes = pack(&e.base, &len);
    assert_null(sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "verify.results[0].commit[2]: token id 4242 out of range [0, 1000)"));
    /* with no limits (vocabulary unknown) the same ids pass */
    bytes = pack(&e.base, &len);
    Specd__WorkerToCoordinator *g = sd_net_decode_worker(bytes, len, NULL, &code, err, sizeof err);
    free(bytes);
    assert_non_null(g);
    specd__worker_to_coordinator__free_unpacked(g, NULL);

    /* draft results: q count must match tokens */
    int32_t toks[] = {3, 4};
    Specd__DraftResult dres = SPECD__DRAFT_RESULT__INIT;
    dres.code = SPECD__CODE__CODE_OK, dres.n_tokens = 2, dres.tokens = toks;
    Specd__DraftResult *dress[] = {&dres};
    Specd__DraftResponse dresp = SPECD__DRAFT_RESPONSE__INIT;
    dresp.n_results = 1, dresp.results = dress;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT, e.draft = &dresp;
    bytes = pack(&e.base, &len);
    assert_null(sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "draft.results[0].q: 0 distributions for 2 tokens"));

    /* an Error may not carry CODE_OK */
    Specd__Error er = SPECD__ERROR__INIT;
    sd_net_error_init(&er, SPECD__CODE__CODE_OK, 0, 0, "x");
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR, e.error = &er;
    bytes = pack(&e.base, &len);
    assert_null(sd_net_decode_worker(bytes, len, &LIM, &code, err, sizeof err));
    free(bytes);
    assert_non_null(strstr(err, "error.code: an Error cannot carry CODE_OK"));
}

static void test_sampling_and_names(void **state) {
    (void)state;
    sd_sampling s;
    char err[128];
    assert_true(sd_net_sampling_from_pb(NULL, &s, err, sizeof err));
    assert_true(s.temperature == 0.0f && s.top_p == 1.0f && s.top_k == 0);
    Specd__Sampling m = SPECD__SAMPLING__INIT;
    m.temperature = 0.8f; /* top_p 0 means off */
    assert_true(sd_net_sampling_from_pb(&m, &s, err, sizeof err));
    assert_true(s.top_p == 1.0f && s.temperature == 0.8f);
    Specd__Sampling back = SPECD__SAMPLING__INIT;
    sd_net_sampling_to_pb(&s, &back);
    assert_true(back.top_p == 0.0f && back.temperature == 0.8f);
    assert_int_equal(s.rule, SD_RULE_DEFAULT); /* no rule named: the service's */
    m.rule = SPECD__VERIFY_RULE__VERIFY_RULE_REJECTION;
    assert_true(sd_net_sampling_from_pb(&m, &s, err, sizeof err));
    assert_int_equal(s.rule, SD_RULE_REJECTION);
    sd_net_sampling_to_pb(&s, &back);
    assert_int_equal(back.rule, SPECD__VERIFY_RULE__VERIFY_RULE_REJECTION);
    m.rule = (Specd__VerifyRule)3; /* no such rule: refused at the edge */
    assert_false(sd_net_sampling_from_pb(&m, &s, err, sizeof err));
    assert_non_null(strstr(err, "rule: 3 is not a verification rule"));
    m.rule = (Specd__VerifyRule)-2;
    assert_false(sd_net_sampling_from_pb(&m, &s, err, sizeof err));
    m.rule = SPECD__VERIFY_RULE__VERIFY_RULE_COUPLED;
    m.min_p = -0.5f;
    assert_false(sd_net_sampling_from_pb(&m, &s, err, sizeof err));
    assert_non_null(strstr(err, "min_p: -0.5"));
    assert_string_equal(sd_net_code_name(SPECD__CODE__CODE_CACHE_MISS), "CACHE_MISS");
    assert_string_equal(sd_net_code_name(SPECD__CODE__CODE_OK), "OK");
    assert_string_equal(sd_net_code_name((Specd__Code)999), "UNKNOWN_CODE");
    uint64_t a = sd_net_now_us();
    assert_true(a > 1600000000ull * 1000000ull);
}

/* ---- socket behaviour ---- */

static void test_oversized_message_dropped(void **state) {
    (void)state;
    pair p;
    pair_open(&p, "tcp://127.0.0.1:*", 1024);
    /* the dealer's own limit is for what it receives; sending is not limited */
    size_t big = 4096;
    char *payload = calloc(1, big);
    assert_int_equal(zmq_send(p.dealer, payload, big, 0), (int)big);
    free(payload);
    /* the router never sees it: libzmq drops the connection first */
    sd_net_msg m;
    bool got = wait_readable(p.router, 500);
    if (got) {
        assert_int_equal(sd_net_recv(p.router, true, true, &m), SD_OK);
        assert_true(m.body_len <= 1024);
        sd_net_msg_clear(&m);
    }
    /* and the router still serves a fresh peer */
    char endpoint[256];
    size_t n = sizeof endpoint;
    assert_int_equal(zmq_getsockopt(p.router, ZMQ_LAST_ENDPOINT, endpoint, &n), 0);
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = 1024;
    dp.identity = "dealer-2";
    void *d2;
    assert_int_equal(sd_net_socket_open(p.ctx, &dp, NULL, endpoint, &d2), SD_OK);
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = 1;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT, e.heartbeat = &hb;
    assert_int_equal(sd_net_send(d2, NULL, 0, &e.base), SD_OK);
    bool seen = false;
    for (int i = 0; i < 20 && !seen; i++) {
        if (!wait_readable(p.router, 200)) continue;
        assert_int_equal(sd_net_recv(p.router, true, true, &m), SD_OK);
        assert_true(m.body_len <= 1024);
        seen = m.identity_len == 8 && memcmp(m.identity, "dealer-2", 8) == 0;
        sd_net_msg_clear(&m);
    }
    assert_true(seen);
    sd_net_close(&d2);
    pair_close(&p);
}

static void test_router_mandatory_and_frames(void **state) {
    (void)state;
    pair p;
    pair_open(&p, "inproc://mandatory", SD_MAX_CLIENT_MSG_BYTES);
    Specd__CoordinatorToClient e = SPECD__COORDINATOR_TO_CLIENT__INIT;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    e.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT, e.heartbeat = &hb;
    errno = 0;
    assert_int_equal(sd_net_send(p.router, (const uint8_t *)"nobody", 6, &e.base), SD_ERR_NET);
    assert_int_equal(errno, EHOSTUNREACH);

    /* extra frames are consumed and reported; the identity is still known */
    assert_int_equal(zmq_send(p.dealer, "body", 4, ZMQ_SNDMORE), 4);
    assert_int_equal(zmq_send(p.dealer, "extra1", 6, ZMQ_SNDMORE), 6);
    assert_int_equal(zmq_send(p.dealer, "extra2", 6, 0), 6);
    assert_true(wait_readable(p.router, 2000));
    sd_net_msg m;
    assert_int_equal(sd_net_recv(p.router, true, true, &m), SD_ERR_FORMAT);
    assert_int_equal(m.identity_len, 8);
    assert_null(m.body);
    /* the next message is whole */
    Specd__ClientToCoordinator c = SPECD__CLIENT_TO_COORDINATOR__INIT;
    c.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT, c.heartbeat = &hb;
    dealer_to_router(&p, &c.base, &m);
    sd_net_msg_clear(&m);
    /* the dealer side: [body, extra] from the router */
    assert_int_equal(zmq_send(p.router, "dealer-1", 8, ZMQ_SNDMORE), 8);
    assert_int_equal(zmq_send(p.router, "a", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(p.router, "b", 1, 0), 1);
    assert_true(wait_readable(p.dealer, 2000));
    assert_int_equal(sd_net_recv(p.dealer, false, true, &m), SD_ERR_FORMAT);
    /* nothing waiting: EAGAIN */
    errno = 0;
    assert_int_equal(sd_net_recv(p.dealer, false, true, &m), SD_ERR_NET);
    assert_int_equal(errno, EAGAIN);
    /* bad params */
    void *s = (void *)1;
    sd_net_socket_params bad = sd_net_socket_default_params();
    bad.type = ZMQ_DEALER;
    assert_int_equal(sd_net_socket_open(p.ctx, &bad, NULL, "inproc://x", &s), SD_ERR_INVALID_ARG);
    assert_null(s);
    bad.max_msg_bytes = 100;
    assert_int_equal(sd_net_socket_open(p.ctx, &bad, NULL, "nonsense://x", &s), SD_ERR_NET);
    assert_null(s);
    pair_close(&p);
}

/* Opens a CURVE server and a client with the given server key; true when a
 * message gets through within 500 ms. */
static bool curve_exchange(const char *server_pub_for_client, const char *server_sec) {
    void *ctx = zmq_ctx_new();
    sd_net_socket_params rp = sd_net_socket_default_params();
    rp.type = ZMQ_ROUTER;
    rp.max_msg_bytes = 4096;
    rp.curve_server_secret = server_sec;
    rp.zap_domain = "test"; /* no ZAP handler in ctx: every client key is admitted (see test_curve.c) */
    void *router, *dealer;
    assert_int_equal(sd_net_socket_open(ctx, &rp, "tcp://127.0.0.1:*", NULL, &router), SD_OK);
    char endpoint[256];
    size_t n = sizeof endpoint;
    assert_int_equal(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &n), 0);
    char cpub[41], csec[41];
    assert_int_equal(zmq_curve_keypair(cpub, csec), 0);
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = 4096;
    dp.curve_server_public = server_pub_for_client;
    dp.curve_public = cpub;
    dp.curve_secret = csec;
    assert_int_equal(sd_net_socket_open(ctx, &dp, NULL, endpoint, &dealer), SD_OK);
    Specd__ClientToCoordinator c = SPECD__CLIENT_TO_COORDINATOR__INIT;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = 12345;
    c.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT, c.heartbeat = &hb;
    assert_int_equal(sd_net_send(dealer, NULL, 0, &c.base), SD_OK);
    bool got = wait_readable(router, 500);
    if (got) {
        sd_net_msg m;
        assert_int_equal(sd_net_recv(router, true, true, &m), SD_OK);
        Specd__Code code;
        char err[128];
        Specd__ClientToCoordinator *g = sd_net_decode_client(m.body, m.body_len, NULL, &code, err, sizeof err);
        assert_non_null(g);
        assert_int_equal(g->heartbeat->sent_us, 12345);
        specd__client_to_coordinator__free_unpacked(g, NULL);
        sd_net_msg_clear(&m);
    }
    sd_net_close(&dealer);
    sd_net_close(&router);
    zmq_ctx_term(ctx);
    return got;
}

static void test_curve(void **state) {
    (void)state;
    if (!zmq_has("curve")) {
        print_message("libzmq built without CURVE: skipping the CurveZMQ test\n");
        skip();
    }
    char spub[41], ssec[41], opub[41], osec[41];
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    assert_int_equal(zmq_curve_keypair(opub, osec), 0);
    assert_true(curve_exchange(spub, ssec));
    assert_false(curve_exchange(opub, ssec)); /* client trusts a different server key */
    /* a key of the wrong length is refused up front */
    void *ctx = zmq_ctx_new(), *s = NULL;
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = 100;
    dp.curve_server_public = "short";
    assert_int_equal(sd_net_socket_open(ctx, &dp, NULL, "tcp://127.0.0.1:1", &s), SD_ERR_INVALID_ARG);
    zmq_ctx_term(ctx);
}

/* Constraint (structured output) on a Submit and a VerifySeq: a known
 * kind, text exactly when the kind takes one, UTF-8, bounded; not with
 * ignore_eos or prompt_only. */
static void test_validate_constraint(void **state) {
    (void)state;
    const Specd__Code BAD = SPECD__CODE__CODE_BAD_REQUEST, BIG = SPECD__CODE__CODE_TOO_LARGE;
    Specd__Code code;
    char err[256];
    size_t len;
    Specd__Constraint con = SPECD__CONSTRAINT__INIT;
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.prompt = "hello";
    s.constraint = &con;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    const struct {
        Specd__ConstraintKind kind;
        const char *text;
    } good[] = {{SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE, ""},
                {SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT, ""},
                {SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA, "{\"type\": \"integer\"}"},
                {SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX, "[a-z]+"},
                {SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR, "root ::= \"a\""}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        con.kind = good[i].kind, con.text = (char *)good[i].text;
        uint8_t *bytes = pack(&e.base, &len);
        Specd__ClientToCoordinator *g = sd_net_decode_client(bytes, len, &LIM, &code, err, sizeof err);
        free(bytes);
        if (!g) fail_msg("constraint kind %d refused: %s", (int)good[i].kind, err);
        assert_int_equal(g->submit->constraint->kind, good[i].kind);
        assert_string_equal(g->submit->constraint->text, good[i].text);
        specd__client_to_coordinator__free_unpacked(g, NULL);
    }
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT, con.text = "{}";
    expect_submit(&s, BAD, "submit.constraint.text: 2 bytes for kind 1, which takes none");
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX, con.text = "";
    expect_submit(&s, BAD, "submit.constraint.text: empty");
    con.kind = (Specd__ConstraintKind)7, con.text = "x";
    expect_submit(&s, BAD, "submit.constraint.kind: 7 is not a known kind");
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR, con.text = "root ::= \"\xc3\x28\"";
    expect_submit(&s, BAD, "submit.constraint.text: invalid UTF-8");
    char *big = malloc(SD_MAX_CONSTRAINT_BYTES + 2);
    assert_non_null(big);
    memset(big, 'a', SD_MAX_CONSTRAINT_BYTES + 1);
    big[SD_MAX_CONSTRAINT_BYTES + 1] = '\0';
    con.text = big;
    expect_submit(&s, BIG, "submit.constraint.text: 65537 bytes over the limit of 65536");
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT, con.text = "";
    s.ignore_eos = 1;
    expect_submit(&s, BAD, "submit.constraint: with ignore_eos");
    s.ignore_eos = 0, s.prompt_only = 1;
    expect_submit(&s, BAD, "submit.constraint: with prompt_only");

    /* VerifySeq: the same checks, its own path */
    verify_batch vb;
    verify_batch_init(&vb);
    vb.req.n_seqs = 1;
    vb.seq[0].constraint = &con;
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA, con.text = "{}";
    uint8_t *bytes = pack(&vb.env.base, &len);
    accept_decoded(sd_net_decode_to_worker(bytes, len, &LIM, &code, err, sizeof err), free_to_worker, err,
                   "a verify step with a constraint");
    free(bytes);
    con.text = big;
    expect_to_worker(&vb.env, BIG, "verify.seqs[0].constraint.text: 65537 bytes over the limit");
    con.kind = (Specd__ConstraintKind)5;
    expect_to_worker(&vb.env, BAD, "verify.seqs[0].constraint.kind: 5 is not a known kind");
    free(big);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_net");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_client_link),
        cmocka_unit_test(test_round_trip_worker_link),
        cmocka_unit_test(test_utf8_valid_len),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_welcome_vocab),
        cmocka_unit_test(test_validate_verify),
        cmocka_unit_test(test_validate_draft_request),
        cmocka_unit_test(test_validate_submit),
        cmocka_unit_test(test_validate_constraint),
        cmocka_unit_test(test_validate_prompt_logprobs),
        cmocka_unit_test(test_validate_worker_messages),
        cmocka_unit_test(test_validate_submit_tool_call_id),
        cmocka_unit_test(test_sampling_and_names),
        cmocka_unit_test(test_oversized_message_dropped),
        cmocka_unit_test(test_router_mandatory_and_frames),
        cmocka_unit_test(test_curve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
