/* worker.c — the register / serve / heartbeat / reconnect loop shared by
 * specd-drafter and specd-verifier (see worker.h).
 *
 * One thread, one zmq_poll over the DEALER and the stop fd. The poll timeout
 * is the time left until the next heartbeat is due, so an idle worker wakes
 * once per interval: it sends a heartbeat when it sent nothing else in that
 * interval and checks the coordinator's liveness. Liveness is judged only
 * after the socket has been drained, so a long handler call (whose
 * heartbeats from the coordinator queued up meanwhile) never counts as
 * silence. Reconnecting closes and reopens the DEALER (a fresh routing id:
 * the coordinator sees a new peer, as the ZeroMQ guide's Paranoid Pirate
 * workers do) rather than relying on libzmq's own reconnect, which would
 * keep the old identity and a queue of stale replies. */
#include "specd/worker.h"

#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/tokenizer.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

sd_worker_params sd_worker_default_params(void) {
    sd_worker_params p;
    memset(&p, 0, sizeof p);
    p.group_size = 1;
    p.heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS;
    p.liveness = SD_HEARTBEAT_LIVENESS;
    p.stop_fd = -1;
    snprintf(p.model.architecture, sizeof p.model.architecture, "llama");
    return p;
}

sd_status sd_worker_identity_from_gguf(const char *path, sd_worker_identity *id) {
    if (!path || !id) return SD_ERR_INVALID_ARG;
    memset(id, 0, sizeof *id);
    sd_gguf *g = NULL;
    char err[256] = "";
    sd_status st = sd_gguf_open(path, &g, err, sizeof err);
    if (st != SD_OK) {
        SD_ERROR("worker: cannot open %s: %s", path, err[0] ? err : sd_status_str(st));
        return st;
    }
    sd_model_config cfg;
    sd_tok *tok = NULL;
    st = sd_model_config_from_gguf(g, &cfg);
    if (st == SD_OK) st = sd_tok_from_gguf(g, &tok);
    if (st == SD_OK) {
        snprintf(id->architecture, sizeof id->architecture, "%s", cfg.arch);
        const char *base = strrchr(path, '/');
        snprintf(id->name, sizeof id->name, "%s", base ? base + 1 : path);
        id->vocab_size = (uint32_t)sd_tok_n_vocab(tok);
        id->vocab_hash = sd_tok_vocab_hash(tok);
        id->context_length = (uint32_t)cfg.n_ctx_train;
        id->n_layers = (uint32_t)cfg.n_layers;
    } else {
        SD_ERROR("worker: cannot read the model identity (config and tokenizer) of %s: %s", path, sd_status_str(st));
    }
    sd_tok_free(&tok);
    sd_gguf_close(&g);
    return st;
}

sd_status sd_worker_signal_fd(int *fd) {
    if (!fd) return SD_ERR_INVALID_ARG;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) {
        SD_ERROR("worker: cannot block SIGINT/SIGTERM");
        return SD_ERR_INTERNAL;
    }
    *fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (*fd < 0) {
        SD_ERROR("worker: signalfd: %s", strerror(errno));
        return SD_ERR_INTERNAL;
    }
    return SD_OK;
}

/* The loop's state across reconnects. */
typedef struct worker_loop {
    const sd_worker_params *p;
    void *zctx;
    void *sock;
    bool registered;
    int refusals;          /* CODE_REFUSED answers to Hello so far */
    uint64_t worker_id;
    int interval_ms;       /* heartbeat interval (the Welcome may change it) */
    int liveness;
    double last_send;      /* sd_now() of the last message sent */
    double last_recv;      /* sd_now() of the last message received (or connect) */
    char name[128];
} worker_loop;

static sd_status loop_send(worker_loop *w, const Specd__WorkerToCoordinator *env) {
    sd_status st = sd_net_send(w->sock, NULL, 0, &env->base);
    if (st == SD_OK) w->last_send = sd_now();
    return st;
}

static void send_error(worker_loop *w, Specd__Code code, uint64_t request_id, const char *message) {
    Specd__Error e = SPECD__ERROR__INIT;
    sd_net_error_init(&e, code, request_id, 0, message);
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR;
    env.error = &e;
    if (loop_send(w, &env) != SD_OK) SD_WARN("worker: could not send an Error (%s)", sd_net_code_name(code));
}

static sd_status send_hello(worker_loop *w) {
    const sd_worker_params *p = w->p;
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = (char *)p->model.architecture;
    id.vocab_size = p->model.vocab_size;
    id.vocab_hash = p->model.vocab_hash;
    id.context_length = p->model.context_length;
    id.name = (char *)p->model.name;
    id.n_layers = p->model.n_layers;
    Specd__WorkerStats stats = SPECD__WORKER_STATS__INIT;
    p->stats(p->user, &stats);
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = SD_PROTOCOL_VERSION;
    h.role = p->role;
    h.rank = p->rank;
    h.group_size = p->group_size;
    h.model = &id;
    h.name = w->name;
    h.drafter_kind = p->drafter_kind;
    h.max_batch = (uint32_t)p->limits.max_batch;
    h.max_draft = (uint32_t)p->limits.max_draft;
    h.stats = &stats;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    env.hello = &h;
    return loop_send(w, &env);
}

static void send_heartbeat(worker_loop *w) {
    Specd__WorkerStats stats = SPECD__WORKER_STATS__INIT;
    w->p->stats(w->p->user, &stats);
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    hb.stats = &stats;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    if (loop_send(w, &env) != SD_OK) SD_WARN("worker: could not send a heartbeat");
}

static sd_status connect_and_hello(worker_loop *w) {
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_DEALER;
    sp.max_msg_bytes = SD_MAX_WORKER_MSG_BYTES;
    SD_TRY(sd_net_socket_open(w->zctx, &sp, NULL, w->p->coordinator, &w->sock));
    w->registered = false;
    w->last_recv = sd_now();
    SD_INFO("worker: connecting to %s, sending Hello", w->p->coordinator);
    sd_status st = send_hello(w);
    if (st != SD_OK) sd_net_close(&w->sock);
    return st;
}

/* What one received message asks the loop to do next. */
typedef enum { NEXT_CONTINUE, NEXT_REFUSED } loop_next;

static void serve_request(worker_loop *w, const Specd__CoordinatorToWorker *env) {
    const sd_worker_params *p = w->p;
    bool is_draft = env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT;
    uint64_t step = is_draft ? env->draft->step_id : env->verify->step_id;
    Specd__Role wanted = is_draft ? SPECD__ROLE__ROLE_DRAFTER : SPECD__ROLE__ROLE_VERIFIER;
    if (!w->registered) {
        send_error(w, SPECD__CODE__CODE_PROTOCOL, 0, "request before Welcome: this worker is not registered yet");
        return;
    }
    if (p->role != wanted) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s request (step %llu) sent to a %s", is_draft ? "draft" : "verify",
                 (unsigned long long)step, p->role == SPECD__ROLE__ROLE_DRAFTER ? "drafter" : "verifier");
        send_error(w, SPECD__CODE__CODE_PROTOCOL, 0, msg);
        return;
    }
    Specd__WorkerToCoordinator reply = SPECD__WORKER_TO_COORDINATOR__INIT;
    sd_status st = p->handle(p->user, env, &reply);
    if (st != SD_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "worker: step %llu failed: %s", (unsigned long long)step, sd_status_str(st));
        SD_ERROR("%s", msg);
        send_error(w, SPECD__CODE__CODE_INTERNAL, 0, msg);
        return;
    }
    if (loop_send(w, &reply) != SD_OK) SD_WARN("worker: could not send the reply of step %llu", (unsigned long long)step);
}

static loop_next dispatch(worker_loop *w, const sd_net_msg *m) {
    const sd_worker_params *p = w->p;
    Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
    char err[512] = "";
    Specd__CoordinatorToWorker *env = sd_net_decode_to_worker(m->body, m->body_len, &p->limits, &code, err, sizeof err);
    if (!env) {
        SD_WARN("worker: bad message from the coordinator (%s): %s", sd_net_code_name(code), err);
        send_error(w, code == SPECD__CODE__CODE_UNSPECIFIED ? SPECD__CODE__CODE_MALFORMED : code, 0, err);
        return NEXT_CONTINUE;
    }
    loop_next next = NEXT_CONTINUE;
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME:
        if (w->registered) {
            SD_DEBUG("worker: a second Welcome, ignored");
            break;
        }
        w->registered = true;
        w->refusals = 0;
        w->worker_id = env->welcome->worker_id;
        if (env->welcome->heartbeat_interval_ms > 0) w->interval_ms = (int)env->welcome->heartbeat_interval_ms;
        if (env->welcome->heartbeat_liveness > 0) w->liveness = (int)env->welcome->heartbeat_liveness;
        SD_INFO("worker: registered as worker %llu (heartbeat %d ms, liveness %d)",
                (unsigned long long)w->worker_id, w->interval_ms, w->liveness);
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_ERROR: {
        const Specd__Error *e = env->error;
        if (!w->registered && e->code == SPECD__CODE__CODE_REFUSED && w->refusals < SD_WORKER_REFUSED_RETRIES) {
            /* Most likely the peer we replace (a verifier restarted after a
             * clean stop) is not yet known to be dead: say Hello again once
             * the liveness period has passed (the reconnect below). */
            w->refusals++;
            SD_WARN("worker: registration refused (%s); retrying after the liveness period (%d of %d)",
                    e->message ? e->message : "", w->refusals, SD_WORKER_REFUSED_RETRIES);
        } else if (!w->registered) {
            SD_ERROR("worker: the coordinator refused registration: %s: %s", sd_net_code_name(e->code),
                     e->message ? e->message : "");
            next = NEXT_REFUSED;
        } else {
            SD_WARN("worker: error from the coordinator: %s: %s (request %llu)", sd_net_code_name(e->code),
                    e->message ? e->message : "", (unsigned long long)e->request_id);
        }
        break;
    }
    case SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT:
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT:
    case SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY:
        serve_request(w, env);
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE:
        if (!w->registered) {
            send_error(w, SPECD__CODE__CODE_PROTOCOL, 0, "Release before Welcome: this worker is not registered yet");
            break;
        }
        p->release(p->user, env->release->request_ids, env->release->n_request_ids);
        break;
    default:
        SD_WARN("worker: envelope with no body (case %d), ignored", (int)env->body_case);
        send_error(w, SPECD__CODE__CODE_MALFORMED, 0, "envelope has no body");
        break;
    }
    specd__coordinator_to_worker__free_unpacked(env, NULL);
    return next;
}

/* Receives everything waiting. NEXT_REFUSED when the coordinator refused us. */
static sd_status drain(worker_loop *w, loop_next *next) {
    *next = NEXT_CONTINUE;
    for (;;) {
        sd_net_msg m;
        memset(&m, 0, sizeof m);
        errno = 0;
        sd_status st = sd_net_recv(w->sock, false, true, &m);
        if (st == SD_ERR_NET && errno == EAGAIN) {
            sd_net_msg_clear(&m);
            return SD_OK;
        }
        if (st == SD_ERR_FORMAT) {
            w->last_recv = sd_now();
            send_error(w, SPECD__CODE__CODE_MALFORMED, 0, "message must be exactly one body frame");
            sd_net_msg_clear(&m);
            continue;
        }
        if (st != SD_OK) {
            sd_net_msg_clear(&m);
            return st;
        }
        w->last_recv = sd_now();
        *next = dispatch(w, &m);
        sd_net_msg_clear(&m);
        if (*next == NEXT_REFUSED) return SD_OK;
    }
}

static bool stop_requested(int fd, short revents) {
    return fd >= 0 && (revents & (POLLIN | POLLERR | POLLHUP)) != 0;
}

sd_status sd_worker_run(void *zctx, const sd_worker_params *p, sd_worker_exit *why) {
    if (!zctx || !p || !why || !p->coordinator || !p->handle || !p->release || !p->reset || !p->stats ||
        p->heartbeat_interval_ms <= 0 || p->liveness <= 0) {
        SD_ERROR("worker: run needs a context, an address, the four callbacks and positive heartbeat timing");
        return SD_ERR_INVALID_ARG;
    }
    *why = SD_WORKER_STOPPED;
    worker_loop w;
    memset(&w, 0, sizeof w);
    w.p = p;
    w.zctx = zctx;
    w.interval_ms = p->heartbeat_interval_ms;
    w.liveness = p->liveness;
    if (p->name && p->name[0]) {
        snprintf(w.name, sizeof w.name, "%s", p->name);
    } else {
        char host[64] = "localhost";
        gethostname(host, sizeof host - 1);
        snprintf(w.name, sizeof w.name, "%s:%ld", host, (long)getpid());
    }
    SD_TRY(connect_and_hello(&w));
    sd_status st = SD_OK;
    for (;;) {
        double now = sd_now();
        double until_beat = w.interval_ms / 1e3 - (now - w.last_send);
        long timeout_ms = until_beat > 0 ? (long)(until_beat * 1e3) + 1 : 0;
        if (!w.registered) timeout_ms = w.interval_ms; /* only the liveness check is due */
        zmq_pollitem_t items[2] = {
            {w.sock, 0, ZMQ_POLLIN, 0},
            {NULL, p->stop_fd, ZMQ_POLLIN, 0},
        };
        int rc = zmq_poll(items, p->stop_fd >= 0 ? 2 : 1, timeout_ms);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            SD_ERROR("worker: zmq_poll: %s", zmq_strerror(zmq_errno()));
            st = SD_ERR_NET;
            break;
        }
        if (p->stop_fd >= 0 && stop_requested(p->stop_fd, items[1].revents)) {
            SD_INFO("worker: stop requested, closing the connection");
            break;
        }
        if (items[0].revents & ZMQ_POLLIN) {
            loop_next next;
            st = drain(&w, &next);
            if (st != SD_OK) break;
            if (next == NEXT_REFUSED) {
                *why = SD_WORKER_REFUSED;
                break;
            }
        }
        now = sd_now();
        double dead_after = (double)w.interval_ms * w.liveness / 1e3;
        if (now - w.last_recv > dead_after) {
            if (w.refusals == 0 || w.registered)
                SD_WARN("worker: the coordinator has been silent for %.1f s (%s); clearing caches and reconnecting",
                        now - w.last_recv, w.registered ? "after registration" : "no Welcome");
            p->reset(p->user);
            sd_net_close(&w.sock);
            st = connect_and_hello(&w);
            if (st != SD_OK) break;
            continue;
        }
        /* Before Welcome nothing is sent: an unanswered Hello ends in a reconnect above. */
        if (w.registered && now - w.last_send >= w.interval_ms / 1e3) send_heartbeat(&w);
    }
    sd_net_close(&w.sock);
    return st;
}
