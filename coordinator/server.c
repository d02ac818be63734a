/* server.c — sockets and the event loop of specd-coordinator.
 *
 * One thread: zmq_poll over the client ROUTER and the worker ROUTER with a
 * short timeout; every readable socket is drained (non-blocking) and each
 * message handled to completion, then the timers run (heartbeats, liveness,
 * step timeouts) at most every few milliseconds. Replies go out from inside
 * the handlers through sd_coord_io, so a verify reply is answered by the
 * next verify request without a trip through the poll. */
#include "coord.h"
#include "specd/curve.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define POLL_MS   20
#define TICK_US   5000u
#define DRAIN_MAX 256

struct sd_coord_server {
    void *zctx;
    void *client_sock, *worker_sock;
    sd_coord c;
    bool state_ok;
    sd_curve_id id; /* on = CurveZMQ */
    sd_curve_allow client_keys, worker_keys;
    sd_zap_domain domains[2];
    sd_zap *zap; /* the ZAP handler thread (CurveZMQ only) */
};

static bool send_to_worker(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToWorker *env) {
    sd_coord_server *s = user;
    if (sd_net_send(s->worker_sock, ident, ident_len, &env->base) != SD_OK) {
        SD_DEBUG("send to a worker failed (gone?); body case %d", (int)env->body_case);
        return false;
    }
    return true;
}

static void send_to_client(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToClient *env) {
    sd_coord_server *s = user;
    if (sd_net_send(s->client_sock, ident, ident_len, &env->base) != SD_OK)
        SD_INFO("send to a client failed (gone?); body case %d", (int)env->body_case);
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
    sp.max_msg_bytes = SD_MAX_CLIENT_MSG_BYTES;
    if ((st = sd_net_socket_open(s->zctx, &sp, p->client_addr, NULL, &s->client_sock)) != SD_OK) goto fail;
    sp.zap_domain = s->id.on ? SD_ZAP_DOMAIN_WORKER : NULL;
    sp.max_msg_bytes = SD_MAX_WORKER_MSG_BYTES;
    if ((st = sd_net_socket_open(s->zctx, &sp, p->worker_addr, NULL, &s->worker_sock)) != SD_OK) goto fail;
    SD_INFO("clients on %s, workers on %s%s", p->client_addr, p->worker_addr,
            s->id.on ? " (CurveZMQ, allow-lists)" : " (plaintext)");
    *out = s;
    return SD_OK;
fail:
    sd_coord_server_free(&s);
    return st;
}

/* Handles up to DRAIN_MAX waiting messages of one socket. */
static void drain(sd_coord_server *s, bool workers) {
    void *sock = workers ? s->worker_sock : s->client_sock;
    for (int i = 0; i < DRAIN_MAX; i++) {
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
        if (workers)
            sd_workers_on_message_as(&s->c, m.identity, m.identity_len, m.user_id, m.body, m.body_len, now);
        else
            sd_clients_on_message(&s->c, m.identity, m.identity_len, m.body, m.body_len, now);
        sd_net_msg_clear(&m);
    }
}

sd_status sd_coord_server_run(sd_coord_server *s, atomic_int *stop) {
    uint64_t last_tick = 0;
    while (!atomic_load(stop)) {
        zmq_pollitem_t items[2] = {{s->worker_sock, 0, ZMQ_POLLIN, 0}, {s->client_sock, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, 2, POLL_MS);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            SD_ERROR("zmq_poll: %s", zmq_strerror(zmq_errno()));
            return SD_ERR_NET;
        }
        if (items[0].revents & ZMQ_POLLIN) drain(s, true);
        if (items[1].revents & ZMQ_POLLIN) drain(s, false);
        uint64_t now = sd_coord_now_us();
        if (now >= last_tick + TICK_US) {
            sd_workers_tick(&s->c, now);
            sd_clients_tick(&s->c, now);
            last_tick = now;
        }
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
    sd_curve_allow_free(&s->client_keys);
    sd_curve_allow_free(&s->worker_keys);
    memset(&s->id, 0, sizeof s->id);
    if (s->state_ok) sd_coord_state_free(&s->c);
    free(s);
    *sp = NULL;
}
