/* test_client.c — libspecd-client against a fake coordinator thread (a
 * ROUTER on loopback TCP that answers Accepted / TokenChunk / Finished /
 * Error / ServiceStats and heartbeats). Checks streaming order, cancel, many
 * concurrent submits from several threads, coordinator death detection,
 * an unreachable coordinator and error propagation.
 *
 * What the fake does with a prompt:
 *   "untagged"   Error CODE_MALFORMED without client_tag
 *   "refuse..."  Error CODE_OVERLOADED for the submit (client_tag echoed)
 *   "kvfull..."  Accepted, one chunk, then Error CODE_KV_FULL for the request
 *   "slow..."    Accepted, a chunk every 40 ms, never finishes by itself
 *   "lost..."    no answer at all (a reply the coordinator lost), heartbeats go on
 *   "noisy..."   stray messages first (tokens, an end, an Accepted, an Error
 *                for requests this client does not have; undecodable bytes),
 *                then as otherwise
 *   otherwise    Accepted, max_tokens chunks "<prompt>:<i>;" (token i), Finished LENGTH
 * A Cancel of a request the fake is not running is answered UNKNOWN_REQUEST,
 * as the coordinator does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "specd/client.h"

/* ---- fake coordinator ---- */

typedef struct fake_req {
    uint8_t identity[SD_MAX_IDENTITY_BYTES];
    size_t identity_len;
    uint64_t request_id;
    char prompt[64];
    uint32_t max_tokens, sent;
    bool slow, paced, active; /* slow: 40 ms a token, never ends; paced: 40 ms a token, ends at max_tokens */
    double next_at;
} fake_req;

#define FAKE_MAX 512

typedef struct fake {
    void *ctx, *router;
    char endpoint[256];
    pthread_t thread;
    _Atomic int stop;       /* ends the thread */
    _Atomic int mute;       /* stops every reply and heartbeat (a hung coordinator) */
    _Atomic int restart_ms; /* nonzero: close the socket, stay down this long, rebind with no state (a restart) */
    _Atomic int restarts;   /* done */
    _Atomic uint64_t last_continuation; /* tokens of continuation in the last Submit */
    fake_req reqs[FAKE_MAX];
    size_t n_reqs;
    uint64_t next_id;
    uint8_t peers[8][SD_MAX_IDENTITY_BYTES];
    size_t peer_len[8], n_peers;
    _Atomic int cancels_seen;            /* read by tests while the fake runs */
    _Atomic uint64_t stray_before_stats; /* nonzero: answer a stats query with UNKNOWN_REQUEST for this id first */
} fake;

static void fake_send(fake *f, const uint8_t *id, size_t id_len, Specd__CoordinatorToClient *env) {
    if (f->mute) return;
    sd_net_send(f->router, id, id_len, &env->base);
}

static void fake_error(fake *f, const uint8_t *id, size_t id_len, Specd__Code code, uint64_t rid, uint64_t tag,
                       const char *msg) {
    Specd__Error e;
    sd_net_error_init(&e, code, rid, tag, msg);
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR;
    env.error = &e;
    fake_send(f, id, id_len, &env);
}

static void fake_finish(fake *f, fake_req *r, Specd__StopReason reason) {
    Specd__RequestStats st = SPECD__REQUEST_STATS__INIT;
    st.generated_tokens = r->sent, st.drafted = 2 * r->sent, st.accepted = r->sent, st.target_steps = r->sent;
    st.total_ms = 12.5;
    Specd__Finished fin = SPECD__FINISHED__INIT;
    fin.request_id = r->request_id, fin.reason = reason, fin.stats = &st;
    fin.text_tail.data = (uint8_t *)"END", fin.text_tail.len = 3;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED;
    env.finished = &fin;
    fake_send(f, r->identity, r->identity_len, &env);
    r->active = false;
}

static void fake_remember_peer(fake *f, const sd_net_msg *m) {
    for (size_t i = 0; i < f->n_peers; i++)
        if (f->peer_len[i] == m->identity_len && memcmp(f->peers[i], m->identity, m->identity_len) == 0) return;
    if (f->n_peers < 8) {
        memcpy(f->peers[f->n_peers], m->identity, m->identity_len);
        f->peer_len[f->n_peers++] = m->identity_len;
    }
}

static void fake_handle(fake *f, const sd_net_msg *m) {
    Specd__Code code;
    char err[256];
    Specd__ClientToCoordinator *env = sd_net_decode_client(m->body, m->body_len, NULL, &code, err, sizeof err);
    if (!env) {
        fake_error(f, m->identity, m->identity_len, code, 0, 0, err);
        return;
    }
    fake_remember_peer(f, m);
    switch (env->body_case) {
    case SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT: {
        const Specd__SubmitRequest *s = env->submit;
        if (strncmp(s->prompt, "untagged", 8) == 0) {
            fake_error(f, m->identity, m->identity_len, SPECD__CODE__CODE_MALFORMED, 0, 0, "cannot decode that");
            break;
        }
        if (strncmp(s->prompt, "refuse", 6) == 0) {
            fake_error(f, m->identity, m->identity_len, SPECD__CODE__CODE_OVERLOADED, 0, s->client_tag,
                       "queue full: 256 requests waiting (limit 256)");
            break;
        }
        if (strncmp(s->prompt, "lost", 4) == 0) break;
        if (strncmp(s->prompt, "noisy", 5) == 0) {
            /* Strays first: tokens and an end for requests this client never
             * had, an Accepted for a tag it never used, an Error about an
             * unknown request, and bytes that do not decode. */
            int32_t tok = 7;
            Specd__TokenChunk tc = SPECD__TOKEN_CHUNK__INIT;
            tc.request_id = 999999, tc.n_tokens = 1, tc.tokens = &tok, tc.n_generated = 1;
            Specd__CoordinatorToClient out = SPECD__COORDINATOR_TO_CLIENT__INIT;
            out.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS;
            out.tokens = &tc;
            fake_send(f, m->identity, m->identity_len, &out);
            Specd__Finished fin = SPECD__FINISHED__INIT;
            fin.request_id = 888888, fin.reason = SPECD__STOP_REASON__STOP_REASON_EOS;
            out.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED;
            out.finished = &fin;
            fake_send(f, m->identity, m->identity_len, &out);
            Specd__Accepted stray = SPECD__ACCEPTED__INIT;
            stray.client_tag = s->client_tag + 1000, stray.request_id = 777777;
            out.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED;
            out.accepted = &stray;
            fake_send(f, m->identity, m->identity_len, &out);
            fake_error(f, m->identity, m->identity_len, SPECD__CODE__CODE_KV_FULL, 666666, 0, "not yours");
            zmq_send(f->router, m->identity, m->identity_len, ZMQ_SNDMORE);
            zmq_send(f->router, "\xff\xff\xff", 3, 0);
        }
        if (f->n_reqs == FAKE_MAX) break;
        fake_req *r = &f->reqs[f->n_reqs++];
        memset(r, 0, sizeof *r);
        memcpy(r->identity, m->identity, m->identity_len);
        r->identity_len = m->identity_len;
        r->request_id = ++f->next_id;
        snprintf(r->prompt, sizeof r->prompt, "%s", s->prompt);
        r->max_tokens = s->max_tokens ? s->max_tokens : 5;
        r->slow = strncmp(s->prompt, "slow", 4) == 0;
        r->paced = strncmp(s->prompt, "paced", 5) == 0;
        r->sent = (uint32_t)s->n_continuation; /* tokens are numbered by position: a continuation goes on */
        f->last_continuation = s->n_continuation;
        for (size_t i = 0; i < s->n_continuation; i++)
            if (s->continuation[i] != (int32_t)i) r->sent = 0; /* not what this fake sent: start over (visible) */
        r->active = true;
        Specd__Accepted a = SPECD__ACCEPTED__INIT;
        a.client_tag = s->client_tag, a.request_id = r->request_id, a.prompt_tokens = (uint32_t)strlen(s->prompt);
        Specd__CoordinatorToClient out = SPECD__COORDINATOR_TO_CLIENT__INIT;
        out.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED;
        out.accepted = &a;
        fake_send(f, m->identity, m->identity_len, &out);
        break;
    }
    case SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL: {
        f->cancels_seen++;
        bool running = false;
        for (size_t i = 0; i < f->n_reqs; i++)
            if (f->reqs[i].active && f->reqs[i].request_id == env->cancel->request_id) {
                fake_finish(f, &f->reqs[i], SPECD__STOP_REASON__STOP_REASON_CANCELLED);
                running = true;
            }
        if (!running) /* as the coordinator answers a Cancel that crossed the request's end */
            fake_error(f, m->identity, m->identity_len, SPECD__CODE__CODE_UNKNOWN_REQUEST, env->cancel->request_id, 0,
                       "cancel.request_id: not a running request of this client");
        break;
    }
    case SPECD__CLIENT_TO_COORDINATOR__BODY_STATS: {
        if (f->stray_before_stats)
            fake_error(f, m->identity, m->identity_len, SPECD__CODE__CODE_UNKNOWN_REQUEST, f->stray_before_stats, 0,
                       "cancel.request_id: not a running request of this client");
        Specd__WorkerStats ws = SPECD__WORKER_STATS__INIT;
        ws.kv_blocks_total = 128, ws.kv_blocks_free = 100, ws.n_sequences = 2;
        Specd__WorkerInfo wi = SPECD__WORKER_INFO__INIT;
        wi.role = SPECD__ROLE__ROLE_VERIFIER, wi.alive = 1, wi.name = "verifier-0", wi.stats = &ws;
        Specd__WorkerInfo *wis[] = {&wi};
        Specd__ServiceStats ss = SPECD__SERVICE_STATS__INIT;
        ss.active_requests = 7, ss.finished_requests = 3, ss.n_workers = 1, ss.workers = wis;
        Specd__CoordinatorToClient out = SPECD__COORDINATOR_TO_CLIENT__INIT;
        out.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_STATS;
        out.stats = &ss;
        fake_send(f, m->identity, m->identity_len, &out);
        break;
    }
    default: break;
    }
    specd__client_to_coordinator__free_unpacked(env, NULL);
}

/* One step of generation for every active request that is due. */
static void fake_step(fake *f) {
    double now = sd_now();
    for (size_t i = 0; i < f->n_reqs; i++) {
        fake_req *r = &f->reqs[i];
        if (!r->active || now < r->next_at) continue;
        if (strncmp(r->prompt, "kvfull", 6) == 0 && r->sent == 1) {
            fake_error(f, r->identity, r->identity_len, SPECD__CODE__CODE_KV_FULL, r->request_id, 0,
                       "no KV blocks left (0 of 128 free)");
            r->active = false;
            continue;
        }
        if (!r->slow && r->sent == r->max_tokens) {
            fake_finish(f, r, SPECD__STOP_REASON__STOP_REASON_LENGTH);
            continue;
        }
        char text[96];
        snprintf(text, sizeof text, "%s:%u;", r->prompt, r->sent);
        int32_t tok = (int32_t)r->sent;
        Specd__TokenChunk tc = SPECD__TOKEN_CHUNK__INIT;
        tc.request_id = r->request_id, tc.n_tokens = 1, tc.tokens = &tok;
        tc.text.data = (uint8_t *)text, tc.text.len = strlen(text);
        tc.n_generated = ++r->sent;
        Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
        env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS;
        env.tokens = &tc;
        fake_send(f, r->identity, r->identity_len, &env);
        r->next_at = now + (r->slow || r->paced ? 0.040 : 0.0);
    }
}

static void *fake_main(void *arg) {
    fake *f = arg;
    double next_hb = 0;
    while (!f->stop) {
        zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 5);
        for (;;) {
            sd_net_msg m;
            sd_status st = sd_net_recv(f->router, true, true, &m);
            if (st == SD_ERR_NET) break;
            if (st == SD_OK) fake_handle(f, &m);
            sd_net_msg_clear(&m);
        }
        fake_step(f);
        if (f->restart_ms) { /* the coordinator dies, and a new one binds the same port later */
            sd_net_close(&f->router);
            usleep((useconds_t)f->restart_ms * 1000);
            sd_net_socket_params p = sd_net_socket_default_params();
            p.type = ZMQ_ROUTER;
            p.max_msg_bytes = SD_MAX_CLIENT_MSG_BYTES;
            if (sd_net_socket_open(f->ctx, &p, f->endpoint, NULL, &f->router) != SD_OK) break;
            f->n_reqs = 0;
            f->n_peers = 0;
            f->next_id += 1000; /* ids do not repeat across starts */
            f->restarts++;
            f->restart_ms = 0;
        }
        if (sd_now() >= next_hb) {
            Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
            Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
            env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT;
            env.heartbeat = &hb;
            for (size_t i = 0; i < f->n_peers; i++) fake_send(f, f->peers[i], f->peer_len[i], &env);
            next_hb = sd_now() + 0.05;
        }
    }
    return NULL;
}

static fake *fake_start(void) {
    fake *f = calloc(1, sizeof *f);
    f->ctx = zmq_ctx_new();
    sd_net_socket_params p = sd_net_socket_default_params();
    p.type = ZMQ_ROUTER;
    p.max_msg_bytes = SD_MAX_CLIENT_MSG_BYTES;
    assert_int_equal(sd_net_socket_open(f->ctx, &p, "tcp://127.0.0.1:*", NULL, &f->router), SD_OK);
    size_t n = sizeof f->endpoint;
    assert_int_equal(zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &n), 0);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
    return f;
}

static void fake_stop(fake **fp) {
    fake *f = *fp;
    f->stop = 1;
    pthread_join(f->thread, NULL);
    sd_net_close(&f->router);
    zmq_ctx_term(f->ctx);
    free(f);
    *fp = NULL;
}

static sd_client *client_for_reconnect(const fake *f, int hb_ms, int liveness, int reconnect_timeout_ms) {
    sd_client_params p = sd_client_default_params();
    p.coordinator = f->endpoint;
    p.heartbeat_interval_ms = hb_ms;
    p.heartbeat_liveness = liveness;
    p.connect_timeout_ms = 2000;
    p.reconnect_timeout_ms = reconnect_timeout_ms;
    sd_client *c = NULL;
    assert_int_equal(sd_client_connect(&p, &c), SD_OK);
    return c;
}

static sd_client *client_for(const fake *f, int hb_ms, int liveness) {
    return client_for_reconnect(f, hb_ms, liveness, 60000);
}

/* ---- a callback that records what it sees ---- */

typedef struct record {
    pthread_mutex_t mu;
    int32_t ids[256];
    size_t n_ids;
    char text[4096];
    size_t text_len;
    int finals;
    bool chunk_after_final;
    sd_status final_status;
    Specd__Code final_code;
    char final_error[512];
} record;

static void record_cb(const sd_client_chunk *ch, void *user) {
    record *r = user;
    pthread_mutex_lock(&r->mu);
    if (r->finals) r->chunk_after_final = true;
    for (size_t i = 0; i < ch->n_ids && r->n_ids < 256; i++) r->ids[r->n_ids++] = ch->ids[i];
    if (ch->text_len && r->text_len + ch->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ch->text, ch->text_len);
        r->text_len += ch->text_len;
        r->text[r->text_len] = '\0';
    }
    if (ch->final) {
        r->finals++;
        r->final_status = ch->final->status;
        r->final_code = ch->final->code;
        snprintf(r->final_error, sizeof r->final_error, "%s", ch->final->error);
    }
    pthread_mutex_unlock(&r->mu);
}

static void record_init(record *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
}

static void expected_text(const char *prompt, uint32_t n, char *out, size_t out_len) {
    size_t o = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < n; i++) o += (size_t)snprintf(out + o, out_len - o, "%s:%u;", prompt, i);
    snprintf(out + o, out_len - o, "END");
}

/* ---- tests ---- */

static void test_streaming_order(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for(f, 50, 20);
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "hello";
    rq.max_tokens = 12;
    uint64_t id = 0;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_OK);
    assert_true(id > 0);
    sd_client_result r;
    assert_int_equal(sd_client_wait(c, id, 5000, &r), SD_OK);
    assert_int_equal(r.status, SD_OK);
    assert_int_equal(r.stop_reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    assert_int_equal(r.request_id, id);
    assert_int_equal(r.prompt_tokens, 5);
    assert_int_equal(r.n_ids, 12);
    for (size_t i = 0; i < 12; i++) assert_int_equal(r.ids[i], (int32_t)i);
    char want[1024];
    expected_text("hello", 12, want, sizeof want);
    assert_string_equal(r.text, want);
    assert_int_equal(r.stats.drafted, 24);
    assert_true(r.stats.total_ms == 12.5);
    /* the callback saw the same, in order, and the final call last and once */
    assert_int_equal(rec.finals, 1);
    assert_false(rec.chunk_after_final);
    assert_int_equal(rec.n_ids, 12);
    assert_memory_equal(rec.ids, r.ids, 12 * sizeof(int32_t));
    assert_string_equal(rec.text, want);
    sd_client_result_clear(&r);
    /* collected once only */
    assert_int_equal(sd_client_wait(c, id, 0, &r), SD_ERR_NOT_FOUND);
    /* stats */
    sd_client_service_stats ss;
    assert_int_equal(sd_client_stats(c, 2000, &ss), SD_OK);
    assert_int_equal(ss.active_requests, 7);
    assert_int_equal(ss.n_workers, 1);
    assert_int_equal(ss.workers[0].role, SPECD__ROLE__ROLE_VERIFIER);
    assert_int_equal(ss.workers[0].kv_blocks_free, 100);
    assert_string_equal(ss.workers[0].name, "verifier-0");
    sd_client_close(&c);
    assert_null(c);
    fake_stop(&f);
}

static void test_cancel(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for(f, 50, 20);
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "slow";
    uint64_t id = 0;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_OK);
    /* wait for a first token, then cancel */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&rec.mu);
        size_t n = rec.n_ids;
        pthread_mutex_unlock(&rec.mu);
        if (n > 0) break;
        usleep(10000);
    }
    sd_client_result r;
    assert_int_equal(sd_client_wait(c, id, 10, &r), SD_ERR_NET); /* still running */
    assert_int_equal(errno, ETIMEDOUT);
    assert_int_equal(sd_client_cancel(c, id), SD_OK);
    assert_int_equal(sd_client_wait(c, id, 5000, &r), SD_OK);
    assert_int_equal(r.status, SD_OK);
    assert_int_equal(r.stop_reason, SPECD__STOP_REASON__STOP_REASON_CANCELLED);
    assert_true(r.n_ids >= 1);
    assert_int_equal(rec.finals, 1);
    sd_client_result_clear(&r);
    assert_int_equal(sd_client_cancel(c, id), SD_ERR_NOT_FOUND);
    assert_int_equal(sd_client_cancel(c, 999999), SD_ERR_NOT_FOUND);
    sd_client_close(&c);
    fake_stop(&f);
}

typedef struct submitter {
    sd_client *c;
    int thread_no;
    int n_ok;
} submitter;

#define N_THREADS  4
#define PER_THREAD 25

static void *submitter_main(void *arg) {
    submitter *s = arg;
    for (int k = 0; k < PER_THREAD; k++) {
        char prompt[32];
        snprintf(prompt, sizeof prompt, "t%d-j%d", s->thread_no, k);
        sd_client_request rq = sd_client_default_request();
        rq.prompt = prompt;
        rq.max_tokens = (uint32_t)(1 + (k % 7));
        uint64_t id;
        sd_status st = sd_client_submit(s->c, &rq, NULL, NULL, &id);
        if (st != SD_OK) {
            print_error("job %s: submit %s\n", prompt, sd_status_str(st));
            continue;
        }
        sd_client_result r;
        st = sd_client_wait(s->c, id, 10000, &r);
        if (st != SD_OK) {
            print_error("job %s: wait %s\n", prompt, sd_status_str(st));
            continue;
        }
        char want[512];
        expected_text(prompt, rq.max_tokens, want, sizeof want);
        if (r.status == SD_OK && r.n_ids == rq.max_tokens && strcmp(r.text, want) == 0)
            s->n_ok++;
        else
            print_error("job %s: status %d n_ids %zu (want %u) text '%s' want '%s' error '%s'\n", prompt, r.status,
                        r.n_ids, rq.max_tokens, r.text, want, r.error);
        sd_client_result_clear(&r);
    }
    return NULL;
}

static void test_concurrent_submits(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for(f, 50, 20);
    pthread_t th[N_THREADS];
    submitter s[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        s[i] = (submitter){c, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, submitter_main, &s[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) assert_int_equal(s[i].n_ok, PER_THREAD);
    sd_client_close(&c);
    fake_stop(&f);
}

/* A request can finish before sd_client_submit returns, and another thread
 * that learnt its id from a callback may sd_client_wait for it meanwhile:
 * the record must stay valid until submit is done with it (ASan reported a
 * heap-use-after-free here before in_submit). Probabilistic: the window is
 * between the I/O thread finishing the request and submit's thread waking. */
enum { WAIT_JOBS = 160 }; /* 3 threads x 160 within the fake's FAKE_MAX (512) requests */

typedef struct collector {
    sd_client *c;
    _Atomic uint64_t published; /* the latest id a callback saw; 0 none */
    _Atomic int n_collected, n_bad;
    _Atomic int done;
} collector;

static void publish_cb(const sd_client_chunk *ch, void *user) {
    collector *k = user;
    if (ch->request_id) atomic_store(&k->published, ch->request_id);
}

static void *collector_main(void *arg) {
    collector *k = arg;
    uint64_t last = 0;
    while (!atomic_load(&k->done) || atomic_load(&k->published) != last) {
        uint64_t id = atomic_load(&k->published);
        if (id == 0 || id == last) {
            sched_yield();
            continue;
        }
        last = id;
        sd_client_result r;
        if (sd_client_wait(k->c, id, 10000, &r) == SD_OK) {
            if (r.status == SD_OK && r.n_ids == 1)
                k->n_collected++;
            else
                k->n_bad++;
            sd_client_result_clear(&r);
        }
    }
    return NULL;
}

typedef struct wait_submitter {
    sd_client *c;
    collector *k;
    int n_submitted;
} wait_submitter;

static void *wait_submitter_main(void *arg) {
    wait_submitter *w = arg;
    for (int j = 0; j < WAIT_JOBS; j++) {
        sd_client_request rq = sd_client_default_request();
        rq.prompt = "w";
        rq.max_tokens = 1;
        uint64_t id;
        if (sd_client_submit(w->c, &rq, publish_cb, w->k, &id) == SD_OK) w->n_submitted++;
    }
    return NULL;
}

static void test_wait_while_submit_returns(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for(f, 50, 20);
    collector k = {.c = c};
    pthread_t th, sub[3];
    wait_submitter ws[3];
    assert_int_equal(pthread_create(&th, NULL, collector_main, &k), 0);
    for (int i = 0; i < 3; i++) {
        ws[i] = (wait_submitter){c, &k, 0};
        assert_int_equal(pthread_create(&sub[i], NULL, wait_submitter_main, &ws[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(sub[i], NULL);
    atomic_store(&k.done, 1);
    pthread_join(th, NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(ws[i].n_submitted, WAIT_JOBS);
    assert_int_equal(k.n_bad, 0);
    /* every one the collector waited for was whole; those it missed (published
     * over by the next) are freed by sd_client_close */
    assert_true(k.n_collected > 0);
    sd_client_close(&c);
    fake_stop(&f);
}

static void test_coordinator_death(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for_reconnect(f, 40, 5, 0); /* dead after 200 ms of silence; no reconnecting */
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "slow";
    uint64_t id;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_OK);
    usleep(150 * 1000);
    f->mute = 1; /* hung: no tokens, no heartbeats */
    double t0 = sd_now();
    sd_client_result r;
    assert_int_equal(sd_client_wait(c, id, 5000, &r), SD_OK);
    double waited = sd_now() - t0;
    assert_int_equal(r.status, SD_ERR_NET);
    assert_non_null(strstr(r.error, "silent"));
    assert_true(waited < 2.0);
    assert_int_equal(rec.finals, 1);
    assert_int_equal(rec.final_status, SD_ERR_NET);
    sd_client_result_clear(&r);
    sd_client_close(&c);
    fake_stop(&f);
}

static void test_coordinator_restart(void **state) {
    (void)state;
    /* The coordinator dies mid-stream and a new one (no state) binds the
     * same port 600 ms later: the client resubmits the request as a
     * continuation, and the caller sees one stream, no token twice or
     * missing, under the id it was first given. */
    fake *f = fake_start();
    sd_client *c = client_for(f, 40, 5); /* dead after 200 ms of silence */
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "paced";
    rq.max_tokens = 30;
    uint64_t id;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_OK);
    for (int i = 0; i < 200; i++) { /* a few tokens first */
        pthread_mutex_lock(&rec.mu);
        size_t n = rec.n_ids;
        pthread_mutex_unlock(&rec.mu);
        if (n >= 5) break;
        usleep(20 * 1000);
    }
    f->restart_ms = 600;
    sd_client_result r;
    assert_int_equal(sd_client_wait(c, id, 20000, &r), SD_OK);
    assert_int_equal(f->restarts, 1);
    assert_true(f->last_continuation >= 5 && f->last_continuation < 30);
    assert_int_equal(r.status, SD_OK);
    assert_int_equal(r.request_id, id);
    assert_int_equal(r.stop_reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    assert_int_equal(r.n_ids, 30);
    char expect[1024];
    size_t len = 0;
    for (int32_t i = 0; i < 30; i++) {
        assert_int_equal(r.ids[i], i);
        len += (size_t)snprintf(expect + len, sizeof expect - len, "paced:%d;", (int)i);
    }
    snprintf(expect + len, sizeof expect - len, "END");
    assert_string_equal(r.text, expect);
    pthread_mutex_lock(&rec.mu);
    assert_int_equal(rec.n_ids, 30);
    for (int32_t i = 0; i < 30; i++) assert_int_equal(rec.ids[i], i);
    assert_int_equal(rec.finals, 1);
    pthread_mutex_unlock(&rec.mu);
    sd_client_result_clear(&r);
    sd_client_close(&c);
    fake_stop(&f);
}

static void test_unreachable(void **state) {
    (void)state;
    /* a port nobody listens on: bind one, note it, close it */
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t n = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n);
    zmq_close(s);
    zmq_ctx_term(ctx);
    sd_client_params p = sd_client_default_params();
    p.coordinator = ep;
    p.connect_timeout_ms = 300;
    sd_client *c;
    assert_int_equal(sd_client_connect(&p, &c), SD_OK);
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "hello";
    uint64_t id = 7;
    double t0 = sd_now();
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_ERR_NET);
    assert_true(sd_now() - t0 < 3.0);
    assert_int_equal(id, 0);
    assert_int_equal(rec.finals, 1);
    assert_non_null(strstr(rec.final_error, "unreachable"));
    sd_client_service_stats ss;
    assert_int_not_equal(sd_client_stats(c, 100, &ss), SD_OK);
    sd_client_close(&c);
}

static void test_error_propagation(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for(f, 50, 20);
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "refuse me";
    uint64_t id = 5;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(id, 0);
    assert_int_equal(rec.finals, 1);
    assert_int_equal(rec.final_code, SPECD__CODE__CODE_OVERLOADED);
    assert_non_null(strstr(rec.final_error, "queue full: 256 requests waiting"));

    record_init(&rec);
    rq.prompt = "kvfull";
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_OK);
    sd_client_result r;
    assert_int_equal(sd_client_wait(c, id, 5000, &r), SD_OK);
    assert_int_equal(r.status, SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(r.code, SPECD__CODE__CODE_KV_FULL);
    assert_non_null(strstr(r.error, "no KV blocks left"));
    assert_int_equal(r.n_ids, 1); /* what came before the error is kept */
    sd_client_result_clear(&r);

    /* a bad request is refused locally, with the validator's message */
    record_init(&rec);
    rq.prompt = "ok";
    rq.sampling.min_p = 1.5f;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_ERR_INVALID_ARG);
    assert_int_equal(rec.finals, 1);
    assert_int_equal(rec.final_code, SPECD__CODE__CODE_BAD_REQUEST);
    assert_non_null(strstr(rec.final_error, "submit.sampling.min_p: 1.5 outside [0, 1)"));

    /* an untagged Error (coordinator could not read the tag) answers the oldest submit */
    record_init(&rec);
    rq.sampling.min_p = 0.0f;
    rq.prompt = "untagged";
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_ERR_INVALID_ARG);
    assert_int_equal(rec.final_code, SPECD__CODE__CODE_MALFORMED);
    assert_non_null(strstr(rec.final_error, "cannot decode"));
    sd_client_close(&c);
    fake_stop(&f);
}

/* Messages that concern nothing live on this client are dropped and leave
 * the rest alone: stray tokens, ends, an Accepted for an unused tag (the
 * client cancels that request), an Error about an unknown request, bytes
 * that do not decode; and the UNKNOWN_REQUEST that answers a Cancel which
 * crossed its request's end does not fail a stats query waiting beside it
 * (it did, before). */
static void test_stray_messages(void **state) {
    (void)state;
    fake *f = fake_start();
    /* liveness 5 s: a fake starved on a loaded machine must not look dead
     * (the client would resubmit, and the fake answer with strays again) */
    sd_client *c = client_for(f, 50, 100);
    record rec;
    record_init(&rec);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "noisy";
    rq.max_tokens = 3;
    uint64_t id = 0;
    assert_int_equal(sd_client_submit(c, &rq, record_cb, &rec, &id), SD_OK);
    sd_client_result res;
    assert_int_equal(sd_client_wait(c, id, 5000, &res), SD_OK);
    assert_int_equal(res.status, SD_OK);
    assert_int_equal(res.stop_reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    assert_int_equal(res.n_ids, 3);
    for (size_t i = 0; i < 3; i++) assert_int_equal(res.ids[i], (int32_t)i);
    char want[256];
    expected_text("noisy", 3, want, sizeof want);
    assert_string_equal(res.text, want);
    sd_client_result_clear(&res);
    assert_int_equal(rec.finals, 1);
    assert_false(rec.chunk_after_final);
    /* the stray Accepted's request was cancelled */
    for (int i = 0; i < 200 && f->cancels_seen < 1; i++) usleep(5000);
    assert_int_equal(f->cancels_seen, 1);
    /* an UNKNOWN_REQUEST for an ended request (a Cancel that crossed its
     * end) arrives while a stats query waits: the stats still arrive */
    f->stray_before_stats = id;
    sd_client_service_stats st;
    assert_int_equal(sd_client_stats(c, 5000, &st), SD_OK);
    assert_int_equal(st.active_requests, 7);
    sd_client_close(&c);
    fake_stop(&f);
    pthread_mutex_destroy(&rec.mu);
}

/* No wait is endless: a submit the (alive, heartbeating) coordinator never
 * answers fails after answer_timeout_ms, and an accepted request that
 * never ends fails at its own deadline and is cancelled on the coordinator. */
static void test_deadlines(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client_params p = sd_client_default_params();
    p.coordinator = f->endpoint;
    p.heartbeat_interval_ms = 50;
    p.heartbeat_liveness = 100;
    p.connect_timeout_ms = 2000;
    p.answer_timeout_ms = 300;
    sd_client *c = NULL;
    assert_int_equal(sd_client_connect(&p, &c), SD_OK);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "lost";
    uint64_t id = 0;
    double t0 = sd_now();
    assert_int_equal(sd_client_submit(c, &rq, NULL, NULL, &id), SD_ERR_NET);
    double took = sd_now() - t0;
    assert_true(took >= 0.25 && took < 10);
    rq.prompt = "slow";
    rq.timeout_ms = 300;
    assert_int_equal(sd_client_submit(c, &rq, NULL, NULL, &id), SD_OK);
    sd_client_result res;
    assert_int_equal(sd_client_wait(c, id, 10000, &res), SD_OK);
    assert_int_equal(res.status, SD_ERR_NET);
    assert_non_null(strstr(res.error, "deadline"));
    assert_true(res.n_ids > 0); /* it ran until then */
    sd_client_result_clear(&res);
    for (int i = 0; i < 200 && f->cancels_seen < 1; i++) usleep(5000);
    assert_int_equal(f->cancels_seen, 1);
    sd_client_close(&c);
    fake_stop(&f);
}

static void test_close_with_requests_in_flight(void **state) {
    (void)state;
    fake *f = fake_start();
    sd_client *c = client_for(f, 50, 20);
    sd_client_request rq = sd_client_default_request();
    rq.prompt = "slow";
    uint64_t id;
    assert_int_equal(sd_client_submit(c, &rq, NULL, NULL, &id), SD_OK);
    sd_client_close(&c); /* cancels it at the coordinator, frees the record */
    for (int i = 0; i < 100 && f->cancels_seen == 0; i++) usleep(10000);
    assert_int_equal(f->cancels_seen, 1);
    fake_stop(&f);
}

int main(void) {
    sd_log_set(NULL, NULL, getenv("SPECD_TEST_VERBOSE") ? SD_LOG_DEBUG : SD_LOG_OFF, "test_client");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streaming_order),    cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_concurrent_submits), cmocka_unit_test(test_wait_while_submit_returns),
        cmocka_unit_test(test_coordinator_death),  cmocka_unit_test(test_coordinator_restart),
        cmocka_unit_test(test_unreachable),        cmocka_unit_test(test_error_propagation),
        cmocka_unit_test(test_stray_messages),     cmocka_unit_test(test_close_with_requests_in_flight),
        cmocka_unit_test(test_deadlines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
