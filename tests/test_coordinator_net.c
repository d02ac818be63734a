/* test_coordinator_net.c — the coordinator's loop over real sockets.
 *
 * The server runs in a thread on ipc:// endpoints in a fresh temporary
 * directory; the test plays a verifier, a mismatched drafter and a client
 * with DEALER sockets made by sd_net_socket_open. Every wait is a bounded
 * poll (5 s), never a sleep. */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include <cmocka.h>

#include "coord.h"
#include "specd/gguf.h"

#define WAIT_MS 5000

static struct {
    char dir[64], model[128], caddr[160], waddr[160];
    bool ok;
} env;

typedef struct server_thread {
    sd_coord_server *srv;
    atomic_int stop;
    pthread_t th;
} server_thread;

static void *run_server(void *arg) {
    server_thread *t = arg;
    sd_coord_server_run(t->srv, &t->stop);
    return NULL;
}

static void server_start(server_thread *t, int32_t max_active, int32_t max_queue) {
    sd_coord_params p = sd_coord_default_params();
    p.model_path = env.model;
    p.client_addr = env.caddr;
    p.worker_addr = env.waddr;
    p.max_active = max_active;
    p.max_queue = max_queue;
    memset(t, 0, sizeof *t);
    assert_int_equal(sd_coord_server_new(&p, &t->srv), SD_OK);
    assert_int_equal(pthread_create(&t->th, NULL, run_server, t), 0);
}

static void server_stop(server_thread *t) {
    t->stop = 1;
    pthread_join(t->th, NULL);
    sd_coord_server_free(&t->srv);
}

static void *dealer(void *zctx, const char *addr, int64_t max) {
    sd_net_socket_params p = sd_net_socket_default_params();
    p.type = ZMQ_DEALER;
    p.max_msg_bytes = max;
    void *s = NULL;
    assert_int_equal(sd_net_socket_open(zctx, &p, NULL, addr, &s), SD_OK);
    return s;
}

/* Receives the next non-heartbeat body within WAIT_MS; NULL on timeout. */
static sd_net_msg g_msg; /* the last message received (freed at the end) */

static sd_net_msg *recv_body(void *sock) {
    sd_net_msg *mp = &g_msg;
    for (;;) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, WAIT_MS) <= 0) return NULL;
        sd_net_msg_clear(mp);
        if (sd_net_recv(sock, false, true, mp) != SD_OK) continue;
        return mp;
    }
}

static Specd__CoordinatorToWorker *recv_worker(void *sock) {
    for (;;) {
        sd_net_msg *m = recv_body(sock);
        if (!m) return NULL;
        Specd__CoordinatorToWorker *e = specd__coordinator_to_worker__unpack(NULL, m->body_len, m->body);
        if (e && e->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT) {
            specd__coordinator_to_worker__free_unpacked(e, NULL);
            continue;
        }
        return e;
    }
}

static Specd__CoordinatorToClient *recv_client(void *sock) {
    for (;;) {
        sd_net_msg *m = recv_body(sock);
        if (!m) return NULL;
        Specd__CoordinatorToClient *e = specd__coordinator_to_client__unpack(NULL, m->body_len, m->body);
        if (e && e->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT) {
            specd__coordinator_to_client__free_unpacked(e, NULL);
            continue;
        }
        return e;
    }
}

static void send_hello(void *sock, Specd__Role role, uint64_t hash, uint32_t vocab) {
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = "llama";
    id.vocab_size = vocab;
    id.vocab_hash = hash;
    id.context_length = 256;
    id.name = "fake.gguf";
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = SD_PROTOCOL_VERSION;
    h.role = role;
    h.group_size = 1;
    h.model = &id;
    h.name = "fake";
    h.max_batch = 8;
    h.max_k = 8;
    if (role == SPECD__ROLE__ROLE_DRAFTER) h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    e.hello = &h;
    assert_int_equal(sd_net_send(sock, NULL, 0, &e.base), SD_OK);
}

static void send_submit(void *sock, const char *prompt, uint32_t max_tokens, float temp, uint64_t tag) {
    Specd__Sampling sm = SPECD__SAMPLING__INIT;
    sm.temperature = temp;
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.client_tag = tag;
    s.prompt = (char *)prompt;
    s.max_tokens = max_tokens;
    s.sampling = &sm;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    assert_int_equal(sd_net_send(sock, NULL, 0, &e.base), SD_OK);
}

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-coordnet-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.model, sizeof env.model, "%s/target.gguf", env.dir);
    snprintf(env.caddr, sizeof env.caddr, "ipc://%s/client", env.dir);
    snprintf(env.waddr, sizeof env.waddr, "ipc://%s/worker", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab 300 --ctx 256 >/dev/null 2>&1",
             SPECD_MKMODEL, env.model);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", env.dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_service_over_sockets(void **state) {
    (void)state;
    if (!env.ok) skip();
    server_thread t;
    server_start(&t, 1, 1);
    void *zctx = zmq_ctx_new();
    void *ver = dealer(zctx, env.waddr, SD_MAX_WORKER_MSG_BYTES);
    void *bad = dealer(zctx, env.waddr, SD_MAX_WORKER_MSG_BYTES);
    void *cli = dealer(zctx, env.caddr, SD_MAX_CLIENT_MSG_BYTES);
    uint64_t hash = 0;
    /* the target's identity, as the workers would read it */
    {
        sd_gguf *g = NULL;
        char err[128];
        assert_int_equal(sd_gguf_open(env.model, &g, err, sizeof err), SD_OK);
        sd_tok *tok = NULL;
        assert_int_equal(sd_tok_from_gguf(g, &tok), SD_OK);
        hash = sd_tok_vocab_hash(tok);
        sd_tok_free(&tok);
        sd_gguf_close(&g);
    }

    /* a drafter with another vocabulary is refused, told nothing of the
     * target's identity (the coordinator's log names both hashes) */
    send_hello(bad, SPECD__ROLE__ROLE_DRAFTER, hash + 1, 300);
    Specd__CoordinatorToWorker *w = recv_worker(bad);
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_ERROR);
    assert_int_equal(w->error->code, SPECD__CODE__CODE_VOCAB_MISMATCH);
    char leak[40];
    snprintf(leak, sizeof leak, "%016llx", (unsigned long long)hash);
    assert_null(strstr(w->error->message, leak));
    assert_null(strstr(w->error->message, "300"));
    assert_non_null(strstr(w->error->message, "identity refused"));
    specd__coordinator_to_worker__free_unpacked(w, NULL);

    /* the verifier registers */
    send_hello(ver, SPECD__ROLE__ROLE_VERIFIER, hash, 300);
    w = recv_worker(ver);
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME);
    specd__coordinator_to_worker__free_unpacked(w, NULL);

    /* malformed bytes and a bad field: errors, nothing else disturbed */
    uint8_t junk[4] = {0xff, 0xff, 0xff, 0x7f};
    zmq_send(cli, junk, sizeof junk, 0);
    Specd__CoordinatorToClient *m = recv_client(cli);
    assert_non_null(m);
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
    assert_int_equal(m->error->code, SPECD__CODE__CODE_MALFORMED);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    send_submit(cli, "hello", 0, -2.0f, 9);
    m = recv_client(cli);
    assert_non_null(m);
    assert_int_equal(m->error->code, SPECD__CODE__CODE_BAD_REQUEST);
    assert_non_null(strstr(m->error->message, "temperature"));
    assert_int_equal(m->error->client_tag, 9);
    specd__coordinator_to_client__free_unpacked(m, NULL);

    /* one request runs (max_active 1), one waits (max_queue 1), one is refused */
    send_submit(cli, "abc", 2, 0.0f, 1);
    send_submit(cli, "abd", 2, 0.0f, 2);
    send_submit(cli, "abe", 2, 0.0f, 3);
    uint64_t rid[2] = {0, 0};
    int overloaded = 0;
    for (int i = 0; i < 3; i++) {
        m = recv_client(cli);
        assert_non_null(m);
        if (m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED)
            rid[m->accepted->client_tag - 1] = m->accepted->request_id;
        else if (m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR &&
                 m->error->code == SPECD__CODE__CODE_OVERLOADED && m->error->client_tag == 3)
            overloaded++;
        specd__coordinator_to_client__free_unpacked(m, NULL);
    }
    assert_int_equal(overloaded, 1);
    assert_true(rid[0] && rid[1]);

    /* the verifier serves both requests, two plain steps each */
    int finished = 0, steps = 0;
    while (finished < 2) {
        w = recv_worker(ver);
        assert_non_null(w);
        if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE) {
            specd__coordinator_to_worker__free_unpacked(w, NULL);
            finished++;
            continue;
        }
        assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
        Specd__VerifyRequest *vq = w->verify;
        assert_int_equal(vq->n_seqs, 1);
        Specd__VerifySeq *vs = vq->seqs[0];
        Specd__VerifyResult r = SPECD__VERIFY_RESULT__INIT, *pr = &r;
        int32_t tok = 100 + steps;
        r.request_id = vs->request_id;
        r.code = SPECD__CODE__CODE_OK;
        r.commit = &tok;
        r.n_commit = 1;
        r.cached_len = vs->keep_len + (uint32_t)vs->n_append;
        Specd__VerifyResponse vr = SPECD__VERIFY_RESPONSE__INIT;
        vr.step_id = vq->step_id;
        vr.results = &pr;
        vr.n_results = 1;
        vr.forward_us = 500;
        Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
        e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
        e.verify = &vr;
        assert_int_equal(sd_net_send(ver, NULL, 0, &e.base), SD_OK);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
        steps++;
    }
    assert_int_equal(steps, 4);
    int chunks = 0, fins = 0;
    while (fins < 2) {
        m = recv_client(cli);
        assert_non_null(m);
        if (m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS) chunks++;
        if (m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED) {
            assert_int_equal(m->finished->reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
            assert_int_equal(m->finished->stats->generated_tokens, 2);
            fins++;
        }
        specd__coordinator_to_client__free_unpacked(m, NULL);
    }
    assert_int_equal(chunks, 4);

    /* stats: nothing active, two finished, the verifier alive */
    Specd__StatsQuery q = SPECD__STATS_QUERY__INIT;
    q.include_workers = true;
    Specd__ClientToCoordinator ce = SPECD__CLIENT_TO_COORDINATOR__INIT;
    ce.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_STATS;
    ce.stats = &q;
    assert_int_equal(sd_net_send(cli, NULL, 0, &ce.base), SD_OK);
    m = recv_client(cli);
    assert_non_null(m);
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_STATS);
    assert_int_equal(m->stats->active_requests, 0);
    assert_int_equal(m->stats->finished_requests, 2);
    assert_int_equal(m->stats->committed_tokens, 4);
    assert_int_equal(m->stats->n_workers, 1);
    assert_true(m->stats->workers[0]->alive);
    specd__coordinator_to_client__free_unpacked(m, NULL);

    sd_net_close(&ver);
    sd_net_close(&bad);
    sd_net_close(&cli);
    zmq_ctx_term(zctx);
    server_stop(&t);
    sd_net_msg_clear(&g_msg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_service_over_sockets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
