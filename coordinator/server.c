/* server.c — sockets and the event loop of specd-coordinator.
 *
 * One thread: zmq_poll over the client ROUTER and the worker ROUTER with a
 * short timeout; every readable socket is drained (non-blocking) and each
 * message handled to completion, then the timers run (heartbeats, liveness,
 * step timeouts) at most every few milliseconds. Replies go out from inside
 * the handlers through sd_coord_io, so a verify reply is answered by the
 * next verify request without a trip through the poll. Prompts are
 * tokenized on a thread of their own (tokq.h); its eventfd is polled beside
 * the sockets. */
#include "coord.h"
#include "specd/curve.h"
#include "tokq.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define POLL_MS         20
#define BACKLOG_POLL_MS 1
#define TICK_US         5000u
#define DRAIN_MAX       256
#define DRAIN_US        20000u /* a drain yields to the timers after this long (a flood of large messages) */

struct sd_coord_server {
    void *zctx;
    void *client_sock, *worker_sock;
    sd_coord c;
    bool state_ok;
    sd_tokq *tokq;
    sd_curve_id id; /* on = CurveZMQ */
    sd_curve_allow client_keys, worker_keys;
    sd_zap_domain domains[2];
    sd_zap *zap;             /* the ZAP handler thread (CurveZMQ only) */
    sd_local_drafter *local; /* --local-ngram, or NULL */
    sd_head_relays *relays;  /* verifier groups' EAGLE heads as drafters (head_relay.c) */
};

/* Delivers the in-process workers' replies (each may queue the next). */
static void pump_local(sd_coord_server *s) {
    sd_local_drafter_pump(s->local, sd_coord_now_us());
    sd_head_relays_pump(s->relays, sd_coord_now_us());
    sd_local_drafter_pump(s->local, sd_coord_now_us());
}

static bool send_to_worker(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToWorker *env) {
    sd_coord_server *s = user;
    if (sd_net_send(s->worker_sock, ident, ident_len, &env->base) != SD_OK) {
        SD_DEBUG("send to a worker failed (gone?); body case %d", (int)env->body_case);
        return false;
    }
    return true;
}

/* Never blocks: a full queue is SD_COORD_FULL and outbox.c keeps the reply. */
static sd_coord_sent send_to_client(void *user, const uint8_t *ident, size_t ident_len, const uint8_t *body,
                                    size_t len) {
    sd_coord_server *s = user;
    if (zmq_send(s->client_sock, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        if (e == EAGAIN) return SD_COORD_FULL;
        if (e == EHOSTUNREACH)
            SD_INFO("a reply to a client that is gone (disconnected) is not sent");
        else
            SD_ERROR("send to a client: %s", zmq_strerror(e));
        return SD_COORD_GONE;
    }
    /* the routing frame went, so the pipe has room: the body cannot be refused */
    if (zmq_send(s->client_sock, body, len, ZMQ_DONTWAIT) < 0) {
        SD_ERROR("send to a client (%zu bytes): %s", len, zmq_strerror(zmq_errno()));
        return SD_COORD_GONE;
    }
    return SD_COORD_SENT;
}

/* Loads the keys and allow-lists and starts the ZAP handler: keys are all or
 * nothing (a secret without both lists, or a list without a secret, is a
 * start-up error, never plaintext); without keys both binds must be local
 * unless --insecure. */
static sd_status setup_curve(sd_coord_server *s, const sd_coord_params *p) {
    bool any = p->curve_secret_file || p->client_keys_file || p->worker_keys_file;
    if (any && !(p->curve_secret_file && p->client_keys_file && p->worker_keys_file)) {
        SD_ERROR("CurveZMQ needs all three of --curve-secret, --client-keys and --worker-keys");
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(sd_curve_bind_check(p->client_addr, any, p->insecure, "--client-addr"));
    SD_TRY(sd_curve_bind_check(p->worker_addr, any, p->insecure, "--worker-addr"));
    if (!any) return SD_OK;
    SD_TRY(sd_curve_id_load(p->curve_secret_file, NULL, &s->id));
    SD_TRY(sd_curve_allow_read(p->client_keys_file, &s->client_keys));
    SD_TRY(sd_curve_allow_read(p->worker_keys_file, &s->worker_keys));
    s->domains[0] = (sd_zap_domain){SD_ZAP_DOMAIN_CLIENT, &s->client_keys};
    s->domains[1] = (sd_zap_domain){SD_ZAP_DOMAIN_WORKER, &s->worker_keys};
    SD_TRY(sd_zap_start(s->zctx, s->domains, 2, &s->zap));
    SD_INFO("CurveZMQ on: public key %s, %zu client and %zu worker keys allowed", s->id.public_key, s->client_keys.n,
            s->worker_keys.n);
    return SD_OK;
}

sd_status sd_coord_server_new(const sd_coord_params *p, sd_coord_server **out) {
    *out = NULL;
    sd_coord_server *s = calloc(1, sizeof *s);
    if (!s) return SD_ERR_NOMEM;
    sd_coord_io io = {.user = s, .to_worker = send_to_worker, .to_client = send_to_client};
    sd_status st = sd_coord_state_init(&s->c, p, &io);
    if (st != SD_OK) {
        free(s);
        return st;
    }
    s->state_ok = true;
    if ((st = sd_tokq_new(s->c.tok, s->c.chat, s->c.n_ctx, s->c.n_vocab, &s->tokq)) != SD_OK) goto fail;
    s->c.tokq = s->tokq;
    s->zctx = zmq_ctx_new();
    if (!s->zctx) {
        SD_ERROR("zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        st = SD_ERR_NET;
        goto fail;
    }
    if ((st = setup_curve(s, p)) != SD_OK) goto fail;
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_ROUTER;
    sp.curve_server_secret = s->id.on ? s->id.secret : NULL;
    sp.zap_domain = s->id.on ? SD_ZAP_DOMAIN_CLIENT : NULL;
    /* Each cap is what a peer can legitimately need; libzmq drops a peer
     * announcing more before allocating anything for it. */
    sp.max_msg_bytes = sd_net_client_msg_cap(s->c.n_ctx);
    if ((st = sd_net_socket_open(s->zctx, &sp, p->client_addr, NULL, &s->client_sock)) != SD_OK) goto fail;
    int64_t client_cap = sp.max_msg_bytes;
    sp.zap_domain = s->id.on ? SD_ZAP_DOMAIN_WORKER : NULL;
    sp.max_msg_bytes =
        sd_net_worker_reply_cap(p->max_active, p->max_k) + sd_net_feature_bytes_cap(); /* a head drafter's */
    if (sp.max_msg_bytes > SD_MAX_WORKER_MSG_BYTES) sp.max_msg_bytes = SD_MAX_WORKER_MSG_BYTES;
    if ((st = sd_net_socket_open(s->zctx, &sp, p->worker_addr, NULL, &s->worker_sock)) != SD_OK) goto fail;
    SD_INFO("clients on %s, workers on %s%s (messages at most %lld and %lld bytes)", p->client_addr, p->worker_addr,
            s->id.on ? " (CurveZMQ, allow-lists)" : " (plaintext)", (long long)client_cap, (long long)sp.max_msg_bytes);
    if (p->local_ngram && (st = sd_local_drafter_new(&s->c, sd_coord_now_us(), &s->local)) != SD_OK) goto fail;
    if ((st = sd_head_relays_new(&s->c, &s->relays)) != SD_OK) goto fail;
    *out = s;
    return SD_OK;
fail:
    sd_coord_server_free(&s);
    return st;
}

/* Handles up to DRAIN_MAX waiting messages of one socket, for at most
 * DRAIN_US: heartbeats and liveness must run between messages that each take
 * a while (hostile ones at the size cap are refused, but only after a pass
 * over their bytes). */
static void drain(sd_coord_server *s, bool workers) {
    void *sock = workers ? s->worker_sock : s->client_sock;
    uint64_t t_start = sd_coord_now_us();
    for (int i = 0; i < DRAIN_MAX && sd_coord_now_us() - t_start < DRAIN_US; i++) {
        sd_net_msg m = {0};
        sd_status st = sd_net_recv(sock, true, true, &m);
        uint64_t now = sd_coord_now_us();
        if (st == SD_ERR_FORMAT) {
            if (m.identity_len > 0) {
                const char *why = "a message must be exactly one frame holding one envelope";
                if (workers) {
                    Specd__Error e;
                    sd_net_error_init(&e, SPECD__CODE__CODE_MALFORMED, 0, 0, why);
                    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
                    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_ERROR;
                    env.error = &e;
                    (void)send_to_worker(s, m.identity, m.identity_len, &env);
                } else {
                    sd_outbox_client_error(&s->c, m.identity, m.identity_len, SPECD__CODE__CODE_MALFORMED, 0, 0, why,
                                           now);
                }
            }
            sd_net_msg_clear(&m);
            continue;
        }
        if (st != SD_OK) {
            sd_net_msg_clear(&m);
            break;
        }
        if (workers && (sd_local_drafter_is_ident(m.identity, m.identity_len) ||
                        sd_head_relay_is_ident(m.identity, m.identity_len, NULL)))
            SD_WARN("a worker message from a peer with an in-coordinator drafter's routing id; dropped");
        else if (workers)
            sd_workers_on_message_as(&s->c, m.identity, m.identity_len, m.user_id, m.body, m.body_len, now);
        else
            sd_clients_on_message(&s->c, m.identity, m.identity_len, m.body, m.body_len, now);
        sd_net_msg_clear(&m);
        pump_local(s);
    }
}

/* After the first stop request: true while the drain goes on (requests in
 * flight, within drain_timeout_ms, no second request). */
static bool draining(sd_coord_server *s, atomic_int *stop, uint64_t *until_us) {
    int n = atomic_load(stop);
    if (n == 0) return true;
    uint64_t now = sd_coord_now_us();
    if (!s->c.draining) {
        s->c.draining = true;
        *until_us = now + (uint64_t)s->c.p.drain_timeout_ms * 1000u;
        SD_INFO("draining: new submits refused, %d running and %d queued requests get up to %d ms", s->c.n_active,
                s->c.n_queued, s->c.p.drain_timeout_ms);
    }
    bool busy = s->c.n_active + s->c.n_queued > 0 || sd_tokq_pending(s->tokq) > 0;
    if (n >= 2 || !busy || now >= *until_us) {
        if (busy) SD_WARN("drain %s with %d requests unfinished", n >= 2 ? "cut short" : "timed out", s->c.n_active);
        return false;
    }
    return true;
}

sd_status sd_coord_server_run(sd_coord_server *s, atomic_int *stop) {
    uint64_t last_tick = 0, drain_until = 0;
    while (draining(s, stop, &drain_until)) {
        zmq_pollitem_t items[3] = {{s->worker_sock, 0, ZMQ_POLLIN, 0},
                                   {s->client_sock, 0, ZMQ_POLLIN, 0},
                                   {NULL, sd_tokq_fd(s->tokq), ZMQ_POLLIN, 0}};
        /* a backlog waits for its client's queue to drain: look again soon */
        bool pending = sd_local_drafter_pending(s->local) || sd_head_relays_pending(s->relays);
        long timeout = pending ? 0 : s->c.n_backlogged > 0 ? BACKLOG_POLL_MS : POLL_MS;
        int rc = zmq_poll(items, 3, timeout);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            SD_ERROR("zmq_poll: %s", zmq_strerror(zmq_errno()));
            return SD_ERR_NET;
        }
        if (items[0].revents & ZMQ_POLLIN) drain(s, true);
        if (items[1].revents & ZMQ_POLLIN) drain(s, false);
        if (items[2].revents & ZMQ_POLLIN) sd_clients_on_tokenized(&s->c, sd_coord_now_us());
        pump_local(s);
        uint64_t now = sd_coord_now_us();
        sd_outbox_flush(&s->c, now);
        if (now >= last_tick + TICK_US) {
            sd_workers_tick(&s->c, now);
            sd_clients_tick(&s->c, now);
            last_tick = now;
        }
        pump_local(s);
    }
    /* the last replies out of the backlogs (then libzmq's linger) */
    for (uint64_t t0 = sd_coord_now_us(); s->c.n_backlogged > 0 && sd_coord_now_us() - t0 < 500000u;) {
        sd_outbox_flush(&s->c, sd_coord_now_us());
        zmq_poll(NULL, 0, BACKLOG_POLL_MS);
    }
    SD_INFO("stopping");
    return SD_OK;
}

void sd_coord_server_free(sd_coord_server **sp) {
    if (!sp || !*sp) return;
    sd_coord_server *s = *sp;
    sd_net_close(&s->client_sock);
    sd_net_close(&s->worker_sock);
    sd_zap_stop(&s->zap);
    if (s->zctx) zmq_ctx_term(s->zctx);
    sd_tokq_free(&s->tokq);          /* before the state: the thread reads its tokenizer */
    sd_head_relays_free(&s->relays); /* it wrapped the io after the local drafter */
    sd_local_drafter_free(&s->local);
    sd_curve_allow_free(&s->client_keys);
    sd_curve_allow_free(&s->worker_keys);
    memset(&s->id, 0, sizeof s->id);
    if (s->state_ok && s->c.feat_rows_in > 0) /* feat_relay.c's traffic */
        SD_INFO("head drafters' features: %llu positions (%llu bytes) from verifiers, %llu positions (%llu bytes) "
                "to drafters",
                (unsigned long long)s->c.feat_rows_in, (unsigned long long)s->c.feat_bytes_in,
                (unsigned long long)s->c.feat_rows_out, (unsigned long long)s->c.feat_bytes_out);
    if (s->state_ok) sd_coord_state_free(&s->c);
    free(s);
    *sp = NULL;
}
