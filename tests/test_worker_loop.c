/* test_worker_loop.c — the shared worker loop (net/worker.c) against a fake
 * coordinator: a ROUTER on a random loopback port in the test thread, the
 * loop in a second thread with stub callbacks.
 *
 * Checked: Hello carries the identity, limits and step costs; a request before Welcome
 * gets CODE_PROTOCOL; after Welcome a VerifyRequest reaches the handler and
 * its reply comes back; malformed bytes get CODE_MALFORMED and an
 * out-of-range token CODE_BAD_REQUEST, and the loop carries on; idle
 * heartbeats carry the stats; Release reaches its callback; the stop fd
 * ends the loop with SD_WORKER_STOPPED; an Error in answer to Hello ends it
 * with SD_WORKER_REFUSED; a silent coordinator makes the worker clear its
 * caches and register again from a new socket; a full queue behind a
 * running step answers OVERLOADED at once; a peer that echoes the worker's
 * own Hello (a TCP self-connect) or answers it with bytes that do not
 * decode is dropped at once for a new socket, long before the liveness
 * period. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "specd/net.h"
#include "specd/worker.h"

#define VOCAB   100
#define WAIT_MS 5000

typedef struct stub {
    /* written by the worker loop's threads, read by the test: atomics, and
     * released[i] is published by the n_released increment after it */
    _Atomic int n_handled, n_reset, n_released;
    uint64_t released[8];
    Specd__VerifyResponse resp;
    Specd__VerifyResult result;
    Specd__VerifyResult *result_ptr;
    int32_t commit;
} stub;

static sd_status stub_handle(void *user, const sd_net_worker_msg *req, Specd__WorkerToCoordinator *reply) {
    stub *s = user;
    s->n_handled++;
    const Specd__VerifyRequest *vr = req->verify.req;
    if (vr->seqs[0]->append[0] == 77) usleep(400 * 1000); /* a long step */
    specd__verify_result__init(&s->result);
    s->result.request_id = vr->seqs[0]->request_id;
    s->result.code = SPECD__CODE__CODE_OK;
    s->commit = vr->seqs[0]->append[0] + 1;
    s->result.commit = &s->commit;
    s->result.n_commit = 1;
    s->result_ptr = &s->result;
    specd__verify_response__init(&s->resp);
    s->resp.step_id = vr->step_id;
    s->resp.results = &s->result_ptr;
    s->resp.n_results = 1;
    reply->body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    reply->verify = &s->resp;
    return SD_OK;
}
static void stub_release(void *user, const uint64_t *ids, size_t n) {
    stub *s = user;
    for (size_t i = 0; i < n && s->n_released < 8; i++) {
        s->released[s->n_released] = ids[i];
        s->n_released++;
    }
}
static void stub_reset(void *user) { ((stub *)user)->n_reset++; }
static void stub_stats(void *user, Specd__WorkerStats *st) {
    (void)user;
    st->kv_blocks_total = 100;
    st->kv_blocks_free = 90;
    st->n_sequences = 2;
}

typedef struct loop_thread {
    pthread_t thread;
    void *zctx;
    sd_worker_params p;
    stub stub;
    int stop_pipe[2];
    sd_status status;
    sd_worker_exit why;
} loop_thread;

static void *loop_main(void *arg) {
    loop_thread *t = arg;
    t->status = sd_worker_run(t->zctx, &t->p, &t->why);
    return NULL;
}

static void loop_start(loop_thread *t, const char *endpoint, int liveness) {
    memset(t, 0, sizeof *t);
    assert_int_equal(pipe(t->stop_pipe), 0);
    t->zctx = zmq_ctx_new();
    t->p = sd_worker_default_params();
    t->p.coordinator = endpoint;
    t->p.role = SPECD__ROLE__ROLE_VERIFIER;
    t->p.model.vocab_size = VOCAB;
    t->p.model.vocab_hash = 0x1234abcdull;
    t->p.model.context_length = 512;
    t->p.model.n_layers = 2;
    snprintf(t->p.model.name, sizeof t->p.model.name, "stub.gguf");
    t->p.limits = (sd_net_limits){VOCAB, 512, 8, 4, 0};
    static const sd_step_cost costs[2] = {{1, 900}, {8, 1300}};
    t->p.step_costs = costs;
    t->p.n_step_costs = 2;
    t->p.stop_fd = t->stop_pipe[0];
    t->p.heartbeat_interval_ms = 40;
    t->p.liveness = liveness; /* until a Welcome says otherwise */
    t->p.handle = stub_handle;
    t->p.release = stub_release;
    t->p.reset = stub_reset;
    t->p.stats = stub_stats;
    t->p.user = &t->stub;
    t->status = SD_ERR_INTERNAL;
    assert_int_equal(pthread_create(&t->thread, NULL, loop_main, t), 0);
}

static void loop_join(loop_thread *t) {
    pthread_join(t->thread, NULL);
    zmq_ctx_term(t->zctx);
    close(t->stop_pipe[0]);
    close(t->stop_pipe[1]);
}

/* The fake coordinator. */
typedef struct fake_coord {
    void *zctx, *router;
    char endpoint[128];
    uint8_t peer[SD_MAX_IDENTITY_BYTES];
    size_t peer_len;
    int heartbeats;
} fake_coord;

static void coord_open(fake_coord *c) {
    memset(c, 0, sizeof *c);
    c->zctx = zmq_ctx_new();
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_ROUTER;
    sp.max_msg_bytes = SD_MAX_WORKER_MSG_BYTES;
    assert_int_equal(sd_net_socket_open(c->zctx, &sp, "tcp://127.0.0.1:*", NULL, &c->router), SD_OK);
    size_t len = sizeof c->endpoint;
    assert_int_equal(zmq_getsockopt(c->router, ZMQ_LAST_ENDPOINT, c->endpoint, &len), 0);
}

static void coord_close(fake_coord *c) {
    sd_net_close(&c->router);
    zmq_ctx_term(c->zctx);
}

/* Waits (bounded) for the next message that is not a heartbeat; counts heartbeats. */
static Specd__WorkerToCoordinator *coord_expect(fake_coord *c, Specd__WorkerToCoordinator__BodyCase want) {
    double deadline = sd_now() + WAIT_MS / 1e3;
    while (sd_now() < deadline) {
        zmq_pollitem_t item = {c->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 100) <= 0) continue;
        sd_net_msg m;
        memset(&m, 0, sizeof m);
        assert_int_equal(sd_net_recv(c->router, true, false, &m), SD_OK);
        Specd__Code code;
        char err[256];
        Specd__WorkerToCoordinator *env = sd_net_decode_worker(m.body, m.body_len, NULL, &code, err, sizeof err);
        if (!env) fail_msg("undecodable reply from the worker: %s", err);
        memcpy(c->peer, m.identity, m.identity_len);
        c->peer_len = m.identity_len;
        sd_net_msg_clear(&m);
        if (env->body_case == want) return env;
        if (env->body_case == SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT) {
            assert_non_null(env->heartbeat->stats);
            assert_int_equal(env->heartbeat->stats->kv_blocks_total, 100);
            assert_int_equal(env->heartbeat->stats->kv_blocks_free, 90);
            c->heartbeats++;
        } else {
            fail_msg("unexpected message case %d while waiting for %d", (int)env->body_case, (int)want);
        }
        specd__worker_to_coordinator__free_unpacked(env, NULL);
    }
    fail_msg("no message of case %d within %d ms", (int)want, WAIT_MS);
    return NULL;
}

static void coord_send(fake_coord *c, Specd__CoordinatorToWorker *env) {
    assert_int_equal(sd_net_send(c->router, c->peer, c->peer_len, &env->base), SD_OK);
}

static void send_welcome(fake_coord *c, uint32_t interval_ms, uint32_t liveness) {
    Specd__Welcome w = SPECD__WELCOME__INIT;
    w.protocol_version = SD_PROTOCOL_VERSION;
    w.worker_id = 7;
    w.heartbeat_interval_ms = interval_ms;
    w.heartbeat_liveness = liveness;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME;
    env.welcome = &w;
    coord_send(c, &env);
}

static void send_verify(fake_coord *c, uint64_t step, int32_t token) {
    int32_t append[1] = {token};
    Specd__VerifySeq seq = SPECD__VERIFY_SEQ__INIT;
    seq.request_id = 42;
    seq.append = append;
    seq.n_append = 1;
    Specd__VerifySeq *seqs[1] = {&seq};
    Specd__VerifyRequest vr = SPECD__VERIFY_REQUEST__INIT;
    vr.step_id = step;
    vr.seqs = seqs;
    vr.n_seqs = 1;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY;
    env.verify = &vr;
    coord_send(c, &env);
}

static void expect_error(fake_coord *c, Specd__Code code) {
    Specd__WorkerToCoordinator *env = coord_expect(c, SPECD__WORKER_TO_COORDINATOR__BODY_ERROR);
    if (env->error->code != code)
        fail_msg("expected error %s, got %s: %s", sd_net_code_name(code), sd_net_code_name(env->error->code),
                 env->error->message);
    assert_true(env->error->message && env->error->message[0]);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
}

static void test_register_serve_heartbeat_stop(void **state) {
    (void)state;
    fake_coord c;
    coord_open(&c);
    loop_thread t;
    loop_start(&t, c.endpoint, 50); /* 2 s: never trips by itself here */

    Specd__WorkerToCoordinator *env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
    const Specd__Hello *h = env->hello;
    assert_int_equal(h->protocol_version, SD_PROTOCOL_VERSION);
    assert_int_equal(h->role, SPECD__ROLE__ROLE_VERIFIER);
    assert_int_equal(h->group_size, 1);
    assert_int_equal(h->model->vocab_size, VOCAB);
    assert_true(h->model->vocab_hash == 0x1234abcdull);
    assert_int_equal(h->model->context_length, 512);
    assert_string_equal(h->model->architecture, "llama");
    assert_int_equal(h->max_batch, 8);
    assert_int_equal(h->max_k, 4);
    assert_non_null(h->stats);
    assert_int_equal(h->n_step_costs, 2);
    assert_int_equal(h->step_costs[1]->tokens, 8);
    assert_int_equal(h->step_costs[1]->forward_us, 1300);
    specd__worker_to_coordinator__free_unpacked(env, NULL);

    /* A request before Welcome is out of turn. */
    send_verify(&c, 1, 5);
    expect_error(&c, SPECD__CODE__CODE_PROTOCOL);
    assert_int_equal(t.stub.n_handled, 0);

    send_welcome(&c, 40, 50);
    send_verify(&c, 2, 5);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY);
    double deadline;
    assert_int_equal(env->verify->step_id, 2);
    assert_int_equal(env->verify->n_results, 1);
    assert_int_equal(env->verify->results[0]->request_id, 42);
    assert_int_equal(env->verify->results[0]->commit[0], 6);
    specd__worker_to_coordinator__free_unpacked(env, NULL);

    /* A 400 ms step: heartbeats (40 ms) keep coming while it runs, and a
     * Release sent meanwhile waits behind it. */
    int beats_before = c.heartbeats;
    send_verify(&c, 20, 77);
    uint64_t early = 99;
    Specd__Release early_rel = SPECD__RELEASE__INIT;
    early_rel.request_ids = &early;
    early_rel.n_request_ids = 1;
    Specd__CoordinatorToWorker eenv = SPECD__COORDINATOR_TO_WORKER__INIT;
    eenv.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE;
    eenv.release = &early_rel;
    coord_send(&c, &eenv);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY);
    assert_int_equal(env->verify->step_id, 20);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    assert_true(c.heartbeats - beats_before >= 4);
    deadline = sd_now() + WAIT_MS / 1e3;
    while (t.stub.n_released < 1 && sd_now() < deadline) usleep(1000);
    assert_int_equal(t.stub.n_released, 1);
    t.stub.n_released = 0;

    /* Malformed bytes, then a token out of range: errors, and the loop carries on. */
    assert_int_equal(zmq_send(c.router, c.peer, c.peer_len, ZMQ_SNDMORE), (int)c.peer_len);
    assert_int_equal(zmq_send(c.router, "\xff\xff\xff\x01", 4, 0), 4);
    expect_error(&c, SPECD__CODE__CODE_MALFORMED);
    send_verify(&c, 3, VOCAB + 400);
    expect_error(&c, SPECD__CODE__CODE_BAD_REQUEST);
    send_verify(&c, 4, 9);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY);
    assert_int_equal(env->verify->step_id, 4);
    assert_int_equal(env->verify->results[0]->commit[0], 10);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    assert_int_equal(t.stub.n_handled, 3);

    /* Release reaches its callback; idle heartbeats (40 ms) keep coming with stats. */
    uint64_t ids[2] = {42, 43};
    Specd__Release rel = SPECD__RELEASE__INIT;
    rel.request_ids = ids;
    rel.n_request_ids = 2;
    Specd__CoordinatorToWorker renv = SPECD__COORDINATOR_TO_WORKER__INIT;
    renv.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE;
    renv.release = &rel;
    coord_send(&c, &renv);
    int before = c.heartbeats;
    deadline = sd_now() + WAIT_MS / 1e3;
    while (c.heartbeats < before + 3 && sd_now() < deadline) {
        zmq_pollitem_t item = {c.router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 100) <= 0) continue;
        env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT);
        assert_int_equal(env->heartbeat->stats->n_sequences, 2);
        c.heartbeats++;
        specd__worker_to_coordinator__free_unpacked(env, NULL);
    }
    assert_true(c.heartbeats >= before + 3);
    assert_int_equal(t.stub.n_released, 2);
    assert_true(t.stub.released[1] == 43);
    assert_int_equal(t.stub.n_reset, 0);

    assert_int_equal(write(t.stop_pipe[1], "x", 1), 1);
    loop_join(&t);
    assert_int_equal(t.status, SD_OK);
    assert_int_equal(t.why, SD_WORKER_STOPPED);
    coord_close(&c);
}

/* The queue behind a running step is bounded: with a 400 ms step running
 * and 64 Releases waiting, one more request is answered OVERLOADED at once
 * (well before the step ends); the step's reply and the queued Releases
 * still come, and the loop serves the next request. */
static void test_queue_full_overloaded(void **state) {
    (void)state;
    fake_coord c;
    coord_open(&c);
    loop_thread t;
    loop_start(&t, c.endpoint, 50);
    Specd__WorkerToCoordinator *env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    send_welcome(&c, 40, 50);
    double t0 = sd_now();
    send_verify(&c, 20, 77); /* the long step */
    uint64_t ids[64];
    for (int i = 0; i < 64; i++) {
        ids[i] = 100 + (uint64_t)i;
        Specd__Release rel = SPECD__RELEASE__INIT;
        rel.request_ids = &ids[i];
        rel.n_request_ids = 1;
        Specd__CoordinatorToWorker renv = SPECD__COORDINATOR_TO_WORKER__INIT;
        renv.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE;
        renv.release = &rel;
        coord_send(&c, &renv);
    }
    send_verify(&c, 21, 5);
    Specd__WorkerToCoordinator *err = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_ERROR);
    double waited = sd_now() - t0;
    assert_int_equal(err->error->code, SPECD__CODE__CODE_OVERLOADED);
    assert_non_null(strstr(err->error->message, "queue full"));
    specd__worker_to_coordinator__free_unpacked(err, NULL);
    print_message("OVERLOADED after %.0f ms (the running step takes 400 ms)\n", waited * 1e3);
    assert_true(waited < 0.35);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY);
    assert_int_equal(env->verify->step_id, 20);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    double deadline = sd_now() + WAIT_MS / 1e3;
    while (t.stub.n_released < 8 && sd_now() < deadline) usleep(1000);
    assert_int_equal(t.stub.n_released, 8); /* the stub keeps the first 8 */
    assert_true(t.stub.released[0] == 100 && t.stub.released[7] == 107);
    send_verify(&c, 22, 9);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY);
    assert_int_equal(env->verify->step_id, 22);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    assert_int_equal(t.stub.n_handled, 2);
    assert_int_equal(write(t.stop_pipe[1], "x", 1), 1);
    loop_join(&t);
    assert_int_equal(t.why, SD_WORKER_STOPPED);
    coord_close(&c);
}

static void test_refused(void **state) {
    (void)state;
    fake_coord c;
    coord_open(&c);
    loop_thread t;
    loop_start(&t, c.endpoint, 50); /* 2 s: never trips by itself here */
    Specd__WorkerToCoordinator *env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    Specd__Error e = SPECD__ERROR__INIT;
    sd_net_error_init(&e, SPECD__CODE__CODE_VOCAB_MISMATCH, 0, 0, "vocabulary hash 1234abcd differs from 99");
    Specd__CoordinatorToWorker out = SPECD__COORDINATOR_TO_WORKER__INIT;
    out.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_ERROR;
    out.error = &e;
    coord_send(&c, &out);
    loop_join(&t); /* returns by itself: no stop needed */
    assert_int_equal(t.status, SD_OK);
    assert_int_equal(t.why, SD_WORKER_REFUSED);
    coord_close(&c);
}

/* CODE_REFUSED (a leader still believed alive) is retried from a new socket after
 * the liveness period; a Welcome then registers the worker. */
static void test_refused_leader_retried(void **state) {
    (void)state;
    fake_coord c;
    coord_open(&c);
    loop_thread t;
    loop_start(&t, c.endpoint, 4); /* 160 ms without a Welcome: reconnect */
    Specd__WorkerToCoordinator *env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    Specd__Error e = SPECD__ERROR__INIT;
    sd_net_error_init(&e, SPECD__CODE__CODE_REFUSED, 0, 0, "a verifier leader (x) is already registered");
    Specd__CoordinatorToWorker out = SPECD__COORDINATOR_TO_WORKER__INIT;
    out.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_ERROR;
    out.error = &e;
    coord_send(&c, &out);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO); /* the retry */
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    send_welcome(&c, 40, 50);
    send_verify(&c, 8, 1);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY);
    assert_int_equal(env->verify->step_id, 8);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    assert_int_equal(write(t.stop_pipe[1], "x", 1), 1);
    loop_join(&t);
    assert_int_equal(t.why, SD_WORKER_STOPPED);
    coord_close(&c);
}

static void test_silent_coordinator_reconnect(void **state) {
    (void)state;
    fake_coord c;
    coord_open(&c);
    loop_thread t;
    loop_start(&t, c.endpoint, 50); /* 2 s: never trips by itself here */
    Specd__WorkerToCoordinator *env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    uint8_t first[SD_MAX_IDENTITY_BYTES];
    size_t first_len = c.peer_len;
    memcpy(first, c.peer, first_len);
    /* 30 ms x 4 = 120 ms of silence is death; then say nothing. */
    send_welcome(&c, 30, 4);
    env = coord_expect(&c, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    assert_true(c.peer_len != first_len || memcmp(c.peer, first, first_len) != 0); /* a new socket */
    assert_true(t.stub.n_reset >= 1);
    assert_int_equal(write(t.stop_pipe[1], "x", 1), 1);
    loop_join(&t);
    assert_int_equal(t.why, SD_WORKER_STOPPED);
    coord_close(&c);
}

/* The fake coordinator answers the Hello from the worker's routing id with
 * reply (NULL: the Hello's own bytes, as a self-connected socket hears
 * them); the worker must come back from a new socket at once. */
static void not_a_coordinator(const uint8_t *reply, size_t reply_len) {
    fake_coord c;
    coord_open(&c);
    loop_thread t;
    loop_start(&t, c.endpoint, 100); /* 40 ms x 100 = 4 s before silence would reconnect */
    double t0 = sd_now();
    uint8_t first[SD_MAX_IDENTITY_BYTES];
    size_t first_len = 0;
    for (int round = 0; round < 2; round++) {
        sd_net_msg m;
        memset(&m, 0, sizeof m);
        zmq_pollitem_t item = {c.router, 0, ZMQ_POLLIN, 0};
        assert_true(zmq_poll(&item, 1, WAIT_MS) == 1);
        assert_int_equal(sd_net_recv(c.router, true, false, &m), SD_OK);
        Specd__Code code;
        char err[256];
        Specd__WorkerToCoordinator *env = sd_net_decode_worker(m.body, m.body_len, NULL, &code, err, sizeof err);
        assert_non_null(env);
        assert_int_equal(env->body_case, SPECD__WORKER_TO_COORDINATOR__BODY_HELLO);
        specd__worker_to_coordinator__free_unpacked(env, NULL);
        if (round == 0) {
            memcpy(first, m.identity, m.identity_len);
            first_len = m.identity_len;
            const uint8_t *body = reply ? reply : m.body;
            size_t body_len = reply ? reply_len : m.body_len;
            assert_true(zmq_send(c.router, m.identity, m.identity_len, ZMQ_SNDMORE) >= 0);
            assert_true(zmq_send(c.router, body, body_len, 0) >= 0);
        } else {
            assert_true(m.identity_len != first_len || memcmp(m.identity, first, first_len) != 0); /* a new socket */
        }
        sd_net_msg_clear(&m);
    }
    assert_true(sd_now() - t0 < 2.0); /* not the liveness period (4 s): at once */
    assert_int_equal(t.stub.n_handled, 0);
    assert_int_equal(write(t.stop_pipe[1], "x", 1), 1);
    loop_join(&t);
    assert_int_equal(t.why, SD_WORKER_STOPPED);
    coord_close(&c);
}

static void test_own_hello_reconnects(void **state) {
    (void)state;
    not_a_coordinator(NULL, 0);
}

static void test_bad_greeting_reconnects(void **state) {
    (void)state;
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0x01, 0x02};
    not_a_coordinator(junk, sizeof junk);
}

int main(void) {
    sd_net_log_init("test", 0, false);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_serve_heartbeat_stop),
        cmocka_unit_test(test_queue_full_overloaded),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_refused_leader_retried),
        cmocka_unit_test(test_silent_coordinator_reconnect),
        cmocka_unit_test(test_own_hello_reconnects),
        cmocka_unit_test(test_bad_greeting_reconnects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
