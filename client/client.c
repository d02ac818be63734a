/* client.c — libspecd-client: one DEALER to the coordinator, one I/O thread.
 *
 * The I/O thread is the only one that touches the socket. API calls build and
 * pack their envelope in the caller's thread, append it to an outbox under
 * the client's mutex and write to an eventfd that the I/O thread polls with
 * the socket (rejected: an inproc PAIR per caller — a PAIR is not
 * thread-safe either, so every calling thread would need its own). State
 * changes (accepted, finished, failed, stats arrived) are broadcast on one
 * condition variable; waiters re-check their own request.
 *
 * A request moves PENDING (Submit sent) -> ACTIVE (Accepted) -> FINISHING
 * (final callback running, without the lock) -> DONE (record ready for
 * sd_client_wait, which frees it). Tokens are appended to the record by the
 * I/O thread only; the lock hand-over at DONE publishes them to the waiter.
 *
 * Replies carry no tag for stats, so every ServiceStats answers all current
 * stats waiters (a snapshot a few ms older is as good).
 *
 * Coordinator restarts. Each record keeps its Submit (packed) and the
 * tokens received. When the coordinator falls silent for the liveness
 * period with requests in flight, the I/O thread reopens its DEALER (a
 * fresh routing id, as net/worker.c does: replies a stopped coordinator
 * still holds for the old one never arrive) and resubmits every request as
 * a continuation (SubmitRequest.continuation = the tokens received), with a
 * new tag; the coordinator's new id is kept in server_id, while the user
 * keeps the first one (request ids do not repeat across coordinator
 * starts). Greedy and seeded output then continue as if nothing happened;
 * the callback sees one stream. Rejected: resubmitting the prompt alone
 * and skipping what was already received (the text would be decoded twice
 * and an unseeded request would not reproduce its tokens).
 *
 * The field-by-field mapping between the protocol's messages and the API's
 * structs (Submit, stats, error codes) is client_wire.c's. */
#include "client_impl.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* ---- small helpers ---- */

uint64_t sd_client_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void sd_client_wake(sd_client *c) {
    uint64_t one = 1;
    ssize_t w = write(c->wake_fd, &one, sizeof one);
    (void)w; /* a full counter still wakes the poller */
}

/* Packs env and queues it for the I/O thread. Call with c->mu held. */
sd_status sd_client_enqueue_locked(sd_client *c, const ProtobufCMessage *env) {
    outmsg *m = calloc(1, sizeof *m);
    size_t len = protobuf_c_message_get_packed_size(env);
    uint8_t *data = malloc(len ? len : 1);
    if (!m || !data) {
        free(m);
        free(data);
        return SD_ERR_NOMEM;
    }
    protobuf_c_message_pack(env, data);
    m->data = data;
    m->len = len;
    if (c->out_tail)
        c->out_tail->next = m;
    else
        c->out_head = m;
    c->out_tail = m;
    return SD_OK;
}

/* By the id the user knows (the first coordinator's). */
req *sd_client_find_by_id_locked(sd_client *c, uint64_t request_id) {
    for (req *r = c->reqs; r; r = r->next)
        if (r->state != REQ_PENDING && r->result.request_id == request_id) return r;
    return NULL;
}

void sd_client_req_free(req *r) {
    if (!r) return;
    sd_client_result_clear(&r->result);
    free(r->submit);
    free(r);
}

bool sd_client_append_tokens(req *r, const int32_t *ids, size_t n, const uint8_t *text, size_t text_len) {
    sd_client_result *res = &r->result;
    if (res->n_ids + n > r->ids_cap) {
        size_t cap = r->ids_cap ? r->ids_cap * 2 : 64;
        while (cap < res->n_ids + n) cap *= 2;
        int32_t *p = realloc(res->ids, cap * sizeof *p);
        if (!p) return false;
        res->ids = p;
        r->ids_cap = cap;
    }
    if (n) memcpy(res->ids + res->n_ids, ids, n * sizeof *ids);
    res->n_ids += n;
    if (res->text_len + text_len + 1 > r->text_cap) {
        size_t cap = r->text_cap ? r->text_cap * 2 : 256;
        while (cap < res->text_len + text_len + 1) cap *= 2;
        char *p = realloc(res->text, cap);
        if (!p) return false;
        res->text = p;
        r->text_cap = cap;
    }
    if (text_len) memcpy(res->text + res->text_len, text, text_len);
    res->text_len += text_len;
    res->text[res->text_len] = '\0';
    return true;
}

/* ---- I/O thread ---- */

/* Ends r: record status, run the final callback without the lock, publish.
 * Call with c->mu held; returns with it held. */
void sd_client_finish_locked(sd_client *c, req *r, sd_status status, Specd__Code code, const char *why,
                             const uint8_t *tail, size_t tail_len) {
    r->result.status = status;
    r->result.code = code;
    if (why) snprintf(r->result.error, sizeof r->result.error, "%s", why);
    if (!sd_client_append_tokens(r, NULL, 0, tail, tail_len) && status == SD_OK) {
        r->result.status = SD_ERR_NOMEM;
        snprintf(r->result.error, sizeof r->result.error, "out of memory collecting the output");
    }
    r->state = REQ_FINISHING;
    if (r->cb) {
        sd_client_chunk ch = {
            .request_id = r->result.request_id, .text = (const char *)tail, .text_len = tail_len, .final = &r->result};
        pthread_mutex_unlock(&c->mu);
        r->cb(&ch, r->user);
        pthread_mutex_lock(&c->mu);
    }
    r->state = REQ_DONE;
    pthread_cond_broadcast(&c->cv);
}

static void fail_all_locked(sd_client *c, const char *why) {
    for (;;) {
        req *victim = NULL;
        for (req *r = c->reqs; r; r = r->next)
            if (r->state == REQ_PENDING || r->state == REQ_ACTIVE) {
                victim = r;
                break;
            }
        if (!victim) break;
        sd_client_finish_locked(c, victim, SD_ERR_NET, SPECD__CODE__CODE_UNSPECIFIED, why, NULL, 0);
    }
    for (stats_waiter *w = c->stats_waiters; w; w = w->next)
        if (!w->done) w->done = true, w->status = SD_ERR_NET;
    pthread_cond_broadcast(&c->cv);
}

/* Opens (or reopens, with a fresh routing id) the DEALER to the
 * coordinator and says Hello. Only the connecting thread before the I/O
 * thread starts, or the I/O thread itself, may call it. */
static sd_status open_socket(sd_client *c) {
    if (c->sock) sd_net_monitor_close(c->sock, &c->monitor);
    sd_net_close(&c->sock);
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_DEALER;
    sp.max_msg_bytes = SD_MAX_CLIENT_MSG_BYTES;
    sp.curve_server_public = c->curve_server_public[0] ? c->curve_server_public : NULL;
    sp.curve_public = c->curve_public[0] ? c->curve_public : NULL;
    sp.curve_secret = c->curve_secret[0] ? c->curve_secret : NULL;
    sp.monitor = &c->monitor; /* always: a plaintext client of a CURVE coordinator learns it at once too */
    sd_status st = sd_net_socket_open(c->zctx, &sp, NULL, c->addr, &c->sock);
    if (st != SD_OK) return st;
    /* A DEALER without a connected peer blocks on send until one connects,
     * which may be never (a CurveZMQ handshake the coordinator refused):
     * bound every send, so the I/O thread keeps its deadlines and
     * sd_client_close its promise. A send that times out is logged and its
     * request fails by the connect/liveness deadlines like any other. */
    int send_timeout_ms = c->params.heartbeat_interval_ms;
    if (zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &send_timeout_ms, sizeof send_timeout_ms) != 0) {
        SD_ERROR("sd_client_connect: ZMQ_SNDTIMEO: %s", zmq_strerror(zmq_errno()));
        return SD_ERR_NET;
    }
    /* Say who we are; the coordinator may log it. */
    Specd__Hello hello = SPECD__HELLO__INIT;
    hello.protocol_version = SD_PROTOCOL_VERSION;
    hello.role = SPECD__ROLE__ROLE_CLIENT;
    hello.name = c->name;
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HELLO;
    env.hello = &hello;
    /* kept: a connection that echoes it back is connected to itself */
    free(c->hello);
    c->hello_len = protobuf_c_message_get_packed_size(&env.base);
    if (!(c->hello = malloc(c->hello_len ? c->hello_len : 1))) return SD_ERR_NOMEM;
    protobuf_c_message_pack(&env.base, c->hello);
    return sd_net_send(c->sock, NULL, 0, &env.base);
}

/* Queues r's Submit again as a continuation of the tokens it received,
 * with a new tag. False when it could not be (then r must be failed). */
static bool resubmit_locked(sd_client *c, req *r) {
    Specd__ClientToCoordinator *env = specd__client_to_coordinator__unpack(NULL, r->submit_len, r->submit);
    if (!env || env->body_case != SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT) {
        if (env) specd__client_to_coordinator__free_unpacked(env, NULL);
        return false;
    }
    Specd__SubmitRequest *sub = env->submit;
    int32_t *own = sub->continuation;
    size_t n_own = sub->n_continuation;
    r->client_tag = sub->client_tag = c->next_tag++;
    r->server_id = 0;
    r->sent_ms = sd_client_mono_ms();
    if (r->state == REQ_ACTIVE) {
        sub->continuation = r->result.ids;
        sub->n_continuation = r->result.n_ids;
    }
    bool ok = sd_client_enqueue_locked(c, &env->base) == SD_OK;
    sub->continuation = own;
    sub->n_continuation = n_own;
    specd__client_to_coordinator__free_unpacked(env, NULL);
    return ok;
}

/* The coordinator fell silent with requests in flight: reopen the socket
 * and resubmit them all (see the top of this file). Requests that already
 * hold max_tokens end here with LENGTH (the coordinator's Finished was
 * lost). Call with c->mu held. False when the socket cannot be reopened. */
static bool reconnect_locked(sd_client *c, const char *why) {
    if (open_socket(c) != SD_OK) return false;
    c->n_resubmits++;
    size_t n = 0;
    for (req *r = c->reqs; r; r = r->next) {
        if (r->state != REQ_PENDING && r->state != REQ_ACTIVE) continue;
        if (r->state == REQ_ACTIVE && r->max_tokens > 0 && r->result.n_ids >= r->max_tokens) continue;
        if (resubmit_locked(c, r)) n++;
    }
    SD_WARN("%s: reconnecting and resubmitting %zu request(s) as continuations", why, n);
    for (;;) { /* the ones that were not resubmitted end now (finish_locked drops the lock) */
        req *done = NULL;
        for (req *r = c->reqs; r && !done; r = r->next)
            if ((r->state == REQ_PENDING || r->state == REQ_ACTIVE) && r->server_id != 0) done = r;
        if (!done) break;
        bool full = done->state == REQ_ACTIVE && done->max_tokens > 0 && done->result.n_ids >= done->max_tokens;
        if (full) done->result.stop_reason = SPECD__STOP_REASON__STOP_REASON_LENGTH;
        sd_client_finish_locked(c, done, full ? SD_OK : SD_ERR_NOMEM,
                                full ? SPECD__CODE__CODE_OK : SPECD__CODE__CODE_UNSPECIFIED,
                                full ? NULL : "out of memory resubmitting the request", NULL, 0);
    }
    sd_client_wake(c);
    return true;
}

void sd_client_send_cancel_locked(sd_client *c, uint64_t request_id) {
    Specd__Cancel cancel = SPECD__CANCEL__INIT;
    cancel.request_id = request_id;
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL;
    env.cancel = &cancel;
    if (sd_client_enqueue_locked(c, &env.base) == SD_OK) sd_client_wake(c);
}

static size_t in_flight_locked(sd_client *c) {
    size_t n = 0;
    for (req *r = c->reqs; r; r = r->next) n += r->state == REQ_PENDING || r->state == REQ_ACTIVE;
    for (stats_waiter *w = c->stats_waiters; w; w = w->next) n += !w->done;
    return n;
}

static sd_status send_heartbeat(sd_client *c) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    return sd_net_send(c->sock, NULL, 0, &env.base);
}

/* The monitor's news: a refused key (or one failed handshake after another)
 * fails every request now rather than after the connect timeout, and keeps
 * failing new ones until a handshake succeeds. I/O thread. */
static void on_handshake(sd_client *c) {
    char why[sizeof c->refused];
    sd_net_handshake h = sd_net_monitor_read(c->monitor, why, sizeof why);
    if (h == SD_NET_HANDSHAKE_NONE) return;
    pthread_mutex_lock(&c->mu);
    if (h == SD_NET_HANDSHAKE_OK) {
        c->handshake_failures = 0;
        c->refused[0] = '\0';
    } else if (h == SD_NET_HANDSHAKE_REFUSED || ++c->handshake_failures >= SD_NET_HANDSHAKE_TRIES) {
        if (!c->refused[0]) SD_ERROR("coordinator %s: %s", c->addr, why);
        memcpy(c->refused, why, sizeof why);
        fail_all_locked(c, c->refused);
    } else {
        SD_WARN("coordinator %s: %s; retrying", c->addr, why);
    }
    pthread_mutex_unlock(&c->mu);
}

/* The I/O thread's view of the connection (io_main's locals). */
typedef struct io_state {
    uint64_t interval, dead_after;
    bool heard;        /* anything received since the connection started */
    bool reconnecting; /* resubmitted after the coordinator fell silent; nothing heard since */
    uint64_t last_recv, last_send, busy_since;
    bool was_busy;
} io_state;

/* Sends what the API queued. Locked (dropped around each send). */
static void send_queued_locked(sd_client *c, io_state *io) {
    while (c->out_head) {
        outmsg *m = c->out_head;
        c->out_head = m->next;
        if (!c->out_head) c->out_tail = NULL;
        pthread_mutex_unlock(&c->mu);
        if (zmq_send(c->sock, m->data, m->len, 0) < 0)
            SD_ERROR("send to coordinator %s: %s", c->addr, zmq_strerror(zmq_errno()));
        else
            io->last_send = sd_client_mono_ms();
        free(m->data);
        free(m);
        pthread_mutex_lock(&c->mu);
    }
}

/* Per-request deadlines: a Submit the (answering) coordinator has not
 * answered within answer_timeout_ms, and a request past its own deadline,
 * end with SD_ERR_NET (the latter cancelled on the coordinator), so that
 * no wait is ever endless, even for a reply the coordinator lost. Locked. */
static void check_deadlines_locked(sd_client *c, const io_state *io, uint64_t now) {
    for (;;) {
        req *late = NULL;
        char why[160];
        for (req *r = c->reqs; r && !late; r = r->next) {
            if (r->state != REQ_PENDING && r->state != REQ_ACTIVE) continue;
            if (r->deadline_ms && now >= r->deadline_ms) {
                late = r;
                snprintf(why, sizeof why, "the request's deadline passed (%llu ms after it was submitted): cancelled",
                         (unsigned long long)(r->deadline_ms - r->sent_ms));
            } else if (io->heard && r->state == REQ_PENDING &&
                       now - r->sent_ms > (uint64_t)c->params.answer_timeout_ms) {
                late = r;
                snprintf(why, sizeof why, "coordinator %.64s did not answer the submit within %d ms", c->addr,
                         c->params.answer_timeout_ms);
            }
        }
        if (!late) return;
        SD_WARN("%s", why);
        if (late->state == REQ_ACTIVE && late->server_id) sd_client_send_cancel_locked(c, late->server_id);
        sd_client_finish_locked(c, late, SD_ERR_NET, SPECD__CODE__CODE_UNSPECIFIED, why, NULL, 0);
    }
}

/* Heartbeats, and the coordinator's death or absence (reconnect, or fail
 * everything). Locked. False when the loop must start over. */
static bool liveness_locked(sd_client *c, io_state *io, bool *busy_out) {
    if (c->refused[0] && in_flight_locked(c) > 0) fail_all_locked(c, c->refused);
    uint64_t now = sd_client_mono_ms();
    check_deadlines_locked(c, io, now);
    bool busy = *busy_out = in_flight_locked(c) > 0;
    if (busy && !io->was_busy) {
        io->busy_since = now;
        if (now - io->last_recv > io->dead_after) io->last_recv = now; /* idle silence is not death */
    }
    io->was_busy = busy;
    if (!busy) return true;
    if (io->heard && now - io->last_recv > io->dead_after) {
        char why[600];
        snprintf(why, sizeof why, "coordinator %s silent for %llu ms (dead?)", c->addr,
                 (unsigned long long)(now - io->last_recv));
        io->heard = false;
        if (c->params.reconnect_timeout_ms > 0 && reconnect_locked(c, why)) {
            io->reconnecting = true;
            io->busy_since = io->last_recv = now;
            io->was_busy = in_flight_locked(c) > 0;
            return false;
        }
        SD_ERROR("%s: failing %zu pending request(s)", why, in_flight_locked(c));
        fail_all_locked(c, why);
        io->was_busy = false;
        return false;
    }
    int first_answer_ms = io->reconnecting ? c->params.reconnect_timeout_ms : c->params.connect_timeout_ms;
    if (!io->heard && now - io->busy_since > (uint64_t)first_answer_ms) {
        char why[600];
        snprintf(why, sizeof why, "coordinator %s unreachable: no answer within %d ms%s", c->addr, first_answer_ms,
                 io->reconnecting ? " of resubmitting" : "");
        SD_ERROR("%s", why);
        fail_all_locked(c, why);
        io->was_busy = false;
        io->reconnecting = false;
        return false;
    }
    if (now - io->last_send >= io->interval) {
        pthread_mutex_unlock(&c->mu);
        if (send_heartbeat(c) == SD_OK) io->last_send = now;
        pthread_mutex_lock(&c->mu);
    }
    return true;
}

/* Our own Hello, or a first message that does not decode: the connection
 * is not to a coordinator. The usual cause is a TCP
 * self-connect (a port in the kernel's ephemeral range, no coordinator
 * bound to it yet: the connection's source port became its destination,
 * and it talks to itself, holding the port the coordinator needs). Drop it
 * at once: reopen the socket and resubmit. Locked. */
static void on_not_coordinator_locked(sd_client *c, io_state *io, const char *what) {
    char why[1024];
    snprintf(why, sizeof why, "coordinator %s: %s (a TCP self-connect?): dropping the connection", c->addr, what);
    if (reconnect_locked(c, why)) {
        io->heard = false; /* the deadlines run on from the first try: an echo cannot keep a request forever */
    } else {
        fail_all_locked(c, why);
    }
}

/* Handles up to 256 waiting messages. Unlocked; returns unlocked. */
static void drain_socket(sd_client *c, io_state *io) {
    for (int budget = 0; budget < 256; budget++) {
        sd_net_msg m;
        sd_status st = sd_net_recv(c->sock, false, true, &m);
        if (st == SD_ERR_NET) break; /* EAGAIN: drained */
        if (st != SD_OK) continue;
        if (m.body_len == c->hello_len && c->hello && memcmp(m.body, c->hello, m.body_len) == 0) {
            sd_net_msg_clear(&m);
            pthread_mutex_lock(&c->mu);
            on_not_coordinator_locked(c, io, "received our own Hello");
            pthread_mutex_unlock(&c->mu);
            return;
        }
        Specd__Code code;
        char err[256];
        Specd__CoordinatorToClient *env = sd_net_decode_to_client(m.body, m.body_len, &code, err, sizeof err);
        sd_net_msg_clear(&m);
        if (!env && io->heard) { /* a coordinator that answered before: one bad message, skipped */
            SD_WARN("bad message from the coordinator (%s): %s", sd_net_code_name(code), err);
            continue;
        }
        if (!env) { /* the first thing heard on this connection: not a coordinator's greeting */
            char what[320];
            snprintf(what, sizeof what, "a bad message (%s: %s)", sd_net_code_name(code), err);
            pthread_mutex_lock(&c->mu);
            on_not_coordinator_locked(c, io, what);
            pthread_mutex_unlock(&c->mu);
            return;
        }
        io->last_recv = sd_client_mono_ms();
        io->heard = true;
        io->reconnecting = false;
        pthread_mutex_lock(&c->mu);
        sd_client_handle_locked(c, env);
        pthread_mutex_unlock(&c->mu);
        specd__coordinator_to_client__free_unpacked(env, NULL);
    }
}

static void *io_main(void *arg) {
    sd_client *c = arg;
    io_state io = {.interval = (uint64_t)c->params.heartbeat_interval_ms, .last_recv = sd_client_mono_ms()};
    io.dead_after = io.interval * (uint64_t)c->params.heartbeat_liveness;

    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        send_queued_locked(c, &io);
        bool busy;
        if (!liveness_locked(c, &io, &busy)) continue;
        pthread_mutex_unlock(&c->mu);
        /* wait for the socket or a wake-up */
        zmq_pollitem_t items[3] = {
            {c->sock, 0, ZMQ_POLLIN, 0}, {NULL, c->wake_fd, ZMQ_POLLIN, 0}, {c->monitor, 0, ZMQ_POLLIN, 0}};
        long timeout = busy ? (long)io.interval / 2 : 1000;
        int rc = zmq_poll(items, c->monitor ? 3 : 2, timeout);
        if (rc < 0 && zmq_errno() != EINTR) SD_ERROR("zmq_poll: %s", zmq_strerror(zmq_errno()));
        if (rc > 0 && c->monitor && (items[2].revents & ZMQ_POLLIN)) on_handshake(c);
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN)) {
            uint64_t v;
            ssize_t rd = read(c->wake_fd, &v, sizeof v);
            (void)rd;
        }
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) drain_socket(c, &io);
        pthread_mutex_lock(&c->mu);
    }
    /* Leaving: cancel what is still running (best effort, within linger). */
    for (req *r = c->reqs; r; r = r->next)
        if (r->state == REQ_ACTIVE && r->server_id) {
            Specd__Cancel cancel = SPECD__CANCEL__INIT;
            cancel.request_id = r->server_id;
            Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
            env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL;
            env.cancel = &cancel;
            sd_net_send(c->sock, NULL, 0, &env.base);
        }
    fail_all_locked(c, "client closed");
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- API ---- */

sd_status sd_client_connect(const sd_client_params *p, sd_client **out) {
    if (!p || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    if (p->heartbeat_interval_ms <= 0 || p->heartbeat_liveness <= 0 || p->connect_timeout_ms <= 0 ||
        p->reconnect_timeout_ms < 0 || p->answer_timeout_ms <= 0 || p->request_timeout_ms < 0) {
        SD_ERROR("sd_client_connect: heartbeat interval, liveness, connect and answer timeouts must be > 0, the "
                 "reconnect and request timeouts >= 0");
        return SD_ERR_INVALID_ARG;
    }
    sd_client *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->params = *p;
    snprintf(c->addr, sizeof c->addr, "%s", p->coordinator ? p->coordinator : SD_CLIENT_DEFAULT_ADDR);
    c->params.coordinator = c->addr;
    c->params.name = NULL; /* borrowed strings are not kept: copies for reopening the socket */
    const char *keys[3] = {p->curve_server_public, p->curve_public, p->curve_secret};
    char *copies[3] = {c->curve_server_public, c->curve_public, c->curve_secret};
    for (int i = 0; i < 3; i++) {
        if (keys[i] && strlen(keys[i]) >= sizeof c->curve_public) {
            SD_ERROR("sd_client_connect: a CurveZMQ key is %zu characters (Z85 keys have 40)", strlen(keys[i]));
            free(c);
            return SD_ERR_INVALID_ARG;
        }
        snprintf(copies[i], sizeof c->curve_public, "%s", keys[i] ? keys[i] : "");
    }
    c->params.curve_server_public = c->params.curve_public = c->params.curve_secret = NULL;
    snprintf(c->name, sizeof c->name, "%s:%d", p->name ? p->name : "specd-client", (int)getpid());
    c->wake_fd = -1;
    c->next_tag = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);

    sd_status st = SD_ERR_NET;
    c->zctx = zmq_ctx_new();
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!c->zctx || c->wake_fd < 0) {
        SD_ERROR("sd_client_connect: cannot create the ZeroMQ context or eventfd");
        goto fail;
    }
    st = open_socket(c);
    if (st != SD_OK) goto fail;

    if (pthread_create(&c->io, NULL, io_main, c) != 0) {
        SD_ERROR("sd_client_connect: cannot start the I/O thread");
        st = SD_ERR_INTERNAL;
        goto fail;
    }
    c->io_started = true;
    *out = c;
    return SD_OK;
fail:
    sd_client_close(&c);
    return st;
}

void sd_client_close(sd_client **cp) {
    if (!cp || !*cp) return;
    sd_client *c = *cp;
    if (c->io_started) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_mutex_unlock(&c->mu);
        sd_client_wake(c);
        pthread_join(c->io, NULL);
    }
    sd_net_monitor_close(c->sock, &c->monitor);
    sd_net_close(&c->sock);
    if (c->zctx) zmq_ctx_term(c->zctx);
    if (c->wake_fd >= 0) close(c->wake_fd);
    free(c->hello);
    while (c->out_head) {
        outmsg *m = c->out_head;
        c->out_head = m->next;
        free(m->data);
        free(m);
    }
    while (c->reqs) {
        req *r = c->reqs;
        c->reqs = r->next;
        sd_client_req_free(r);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *cp = NULL;
}
