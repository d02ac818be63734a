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
#include "client_wire.h"
#include "specd/client.h"

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

enum req_state { REQ_PENDING, REQ_ACTIVE, REQ_FINISHING, REQ_DONE };

typedef struct req {
    uint64_t client_tag;
    uint64_t server_id; /* the current coordinator's id (result.request_id is the first one); 0 while resubmitted */
    enum req_state state;
    uint8_t *submit; /* the packed ClientToCoordinator Submit, for resubmission */
    size_t submit_len;
    uint32_t max_tokens;   /* as submitted (0 = the coordinator's default) */
    bool cancel_requested; /* cancelled while resubmitted: sent once the new id is known */
    bool in_submit;        /* sd_client_submit still reads it: sd_client_wait must not collect it yet */
    sd_client_token_cb cb;
    void *user;
    sd_client_result result;
    size_t ids_cap, text_cap;
    struct req *next;
} req;

typedef struct outmsg {
    uint8_t *data;
    size_t len;
    struct outmsg *next;
} outmsg;

typedef struct stats_waiter {
    bool done;
    sd_status status;
    sd_client_service_stats *out;
    struct stats_waiter *next;
} stats_waiter;

struct sd_client {
    sd_client_params params;
    char addr[512];
    char curve_server_public[64], curve_public[64], curve_secret[64]; /* copies, for reopening */
    char name[128];                                                   /* sent in Hello */
    uint32_t n_resubmits;                                             /* coordinator restarts lived through */
    void *zctx, *sock;
    void *monitor;          /* failed handshakes of sock (CurveZMQ only) */
    char refused[256];      /* set once the coordinator refused our key: every request fails with it */
    int handshake_failures; /* in a row, without detail (SD_NET_HANDSHAKE_TRIES make a refusal) */
    int wake_fd;
    pthread_t io;
    bool io_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    outmsg *out_head, *out_tail;
    req *reqs;
    stats_waiter *stats_waiters;
    uint64_t next_tag;
};

/* ---- small helpers ---- */

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void deadline_ts(int timeout_ms, struct timespec *ts) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

static void wake(sd_client *c) {
    uint64_t one = 1;
    ssize_t w = write(c->wake_fd, &one, sizeof one);
    (void)w; /* a full counter still wakes the poller */
}

/* Packs env and queues it for the I/O thread. Call with c->mu held. */
static sd_status enqueue_locked(sd_client *c, const ProtobufCMessage *env) {
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
static req *find_by_id_locked(sd_client *c, uint64_t request_id) {
    for (req *r = c->reqs; r; r = r->next)
        if (r->state != REQ_PENDING && r->result.request_id == request_id) return r;
    return NULL;
}

/* By the current coordinator's id (what its messages carry). */
static req *find_by_server_id_locked(sd_client *c, uint64_t server_id) {
    if (server_id == 0) return NULL;
    for (req *r = c->reqs; r; r = r->next)
        if (r->state != REQ_PENDING && r->server_id == server_id) return r;
    return NULL;
}

static req *find_by_tag_locked(sd_client *c, uint64_t tag) {
    for (req *r = c->reqs; r; r = r->next)
        if (r->client_tag == tag) return r;
    return NULL;
}

static void unlink_locked(sd_client *c, req *target) {
    for (req **pp = &c->reqs; *pp; pp = &(*pp)->next)
        if (*pp == target) {
            *pp = target->next;
            return;
        }
}

static void req_free(req *r) {
    if (!r) return;
    sd_client_result_clear(&r->result);
    free(r->submit);
    free(r);
}

static bool append_tokens(req *r, const int32_t *ids, size_t n, const uint8_t *text, size_t text_len) {
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
static void finish_locked(sd_client *c, req *r, sd_status status, Specd__Code code, const char *why,
                          const uint8_t *tail, size_t tail_len) {
    r->result.status = status;
    r->result.code = code;
    if (why) snprintf(r->result.error, sizeof r->result.error, "%s", why);
    if (!append_tokens(r, NULL, 0, tail, tail_len) && status == SD_OK) {
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
        finish_locked(c, victim, SD_ERR_NET, SPECD__CODE__CODE_UNSPECIFIED, why, NULL, 0);
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
    if (r->state == REQ_ACTIVE) {
        sub->continuation = r->result.ids;
        sub->n_continuation = r->result.n_ids;
    }
    bool ok = enqueue_locked(c, &env->base) == SD_OK;
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
        finish_locked(c, done, full ? SD_OK : SD_ERR_NOMEM, full ? SPECD__CODE__CODE_OK : SPECD__CODE__CODE_UNSPECIFIED,
                      full ? NULL : "out of memory resubmitting the request", NULL, 0);
    }
    wake(c);
    return true;
}

static void send_cancel_locked(sd_client *c, uint64_t request_id) {
    Specd__Cancel cancel = SPECD__CANCEL__INIT;
    cancel.request_id = request_id;
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL;
    env.cancel = &cancel;
    if (enqueue_locked(c, &env.base) == SD_OK) wake(c);
}

/* One message from the coordinator. Call with c->mu held. */
static void handle_locked(sd_client *c, const Specd__CoordinatorToClient *env) {
    req *r;
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED: {
        const Specd__Accepted *a = env->accepted;
        r = find_by_tag_locked(c, a->client_tag);
        if (r && r->state == REQ_ACTIVE && r->server_id == 0) { /* a resubmission, after a coordinator restart */
            r->server_id = a->request_id;
            SD_INFO("request %llu continues as the new coordinator's request %llu after %zu tokens",
                    (unsigned long long)r->result.request_id, (unsigned long long)a->request_id, r->result.n_ids);
            if (r->cancel_requested) send_cancel_locked(c, r->server_id);
            break;
        }
        if (!r || r->state != REQ_PENDING) {
            SD_WARN("Accepted for unknown client_tag %llu (request %llu): cancelling it",
                    (unsigned long long)a->client_tag, (unsigned long long)a->request_id);
            send_cancel_locked(c, a->request_id);
            break;
        }
        r->result.request_id = r->server_id = a->request_id;
        r->result.prompt_tokens = a->prompt_tokens;
        r->state = REQ_ACTIVE;
        pthread_cond_broadcast(&c->cv);
        if (r->cb && a->prompt_text.len > 0) {
            sd_client_chunk ch = {.request_id = r->result.request_id,
                                  .prompt_text = (const char *)a->prompt_text.data,
                                  .prompt_text_len = a->prompt_text.len};
            pthread_mutex_unlock(&c->mu); /* r stays linked: only DONE records are ever removed */
            r->cb(&ch, r->user);
            pthread_mutex_lock(&c->mu);
        }
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS: {
        const Specd__PromptLogprobs *p = env->prompt_logprobs;
        r = find_by_server_id_locked(c, p->request_id);
        if (!r || r->state != REQ_ACTIVE || !r->cb) break;
        /* validated: 1..SD_MAX_PROMPT_LP_ROWS entries, one per token */
        sd_client_logprob *lps = calloc(p->n_logprobs, sizeof *lps);
        if (!lps) {
            finish_locked(c, r, SD_ERR_NOMEM, SPECD__CODE__CODE_UNSPECIFIED, "out of memory for prompt logprobs", NULL,
                          0);
            break;
        }
        for (size_t i = 0; i < p->n_logprobs; i++) {
            const Specd__TokenLogprob *lp = p->logprobs[i];
            lps[i].token = (sd_client_token_lp){p->tokens[i], lp->logprob, (const char *)lp->token.data, lp->token.len};
            lps[i].n_top = lp->n_top_ids;
            for (size_t j = 0; j < lp->n_top_ids && j < SD_MAX_TOP_LOGPROBS; j++)
                lps[i].top[j] = (sd_client_token_lp){lp->top_ids[j], lp->top_logprobs[j],
                                                     (const char *)lp->top_tokens[j].data, lp->top_tokens[j].len};
        }
        sd_client_chunk ch = {.request_id = r->result.request_id,
                              .prompt_logprobs = lps,
                              .n_prompt_logprobs = p->n_logprobs,
                              .prompt_from = p->from};
        pthread_mutex_unlock(&c->mu);
        r->cb(&ch, r->user);
        pthread_mutex_lock(&c->mu);
        free(lps);
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS: {
        const Specd__TokenChunk *t = env->tokens;
        r = find_by_server_id_locked(c, t->request_id);
        if (!r || r->state != REQ_ACTIVE) {
            SD_DEBUG("tokens for unknown request %llu", (unsigned long long)t->request_id);
            break;
        }
        if (!append_tokens(r, t->tokens, t->n_tokens, t->text.data, t->text.len)) {
            finish_locked(c, r, SD_ERR_NOMEM, SPECD__CODE__CODE_UNSPECIFIED, "out of memory collecting the output",
                          NULL, 0);
            break;
        }
        if (r->cb) {
            /* validated: none, or one per token with at most SD_MAX_TOP_LOGPROBS alternatives */
            sd_client_logprob *lps = NULL;
            if (t->n_logprobs > 0 && t->n_logprobs == t->n_tokens) lps = calloc(t->n_logprobs, sizeof *lps);
            for (size_t i = 0; lps && i < t->n_logprobs; i++) {
                const Specd__TokenLogprob *lp = t->logprobs[i];
                lps[i].token =
                    (sd_client_token_lp){t->tokens[i], lp->logprob, (const char *)lp->token.data, lp->token.len};
                lps[i].n_top = lp->n_top_ids;
                for (size_t j = 0; j < lp->n_top_ids && j < SD_MAX_TOP_LOGPROBS; j++)
                    lps[i].top[j] = (sd_client_token_lp){lp->top_ids[j], lp->top_logprobs[j],
                                                         (const char *)lp->top_tokens[j].data, lp->top_tokens[j].len};
            }
            if (t->n_logprobs > 0 && !lps)
                SD_WARN("request %llu: out of memory for logprobs: left out", (unsigned long long)r->result.request_id);
            sd_client_chunk ch = {.request_id = r->result.request_id,
                                  .ids = t->tokens,
                                  .n_ids = t->n_tokens,
                                  .text = (const char *)t->text.data,
                                  .text_len = t->text.len,
                                  .logprobs = lps};
            /* r stays linked: only DONE records are ever removed. */
            pthread_mutex_unlock(&c->mu);
            r->cb(&ch, r->user);
            pthread_mutex_lock(&c->mu);
            free(lps);
        }
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED: {
        const Specd__Finished *f = env->finished;
        r = find_by_server_id_locked(c, f->request_id);
        if (!r || r->state != REQ_ACTIVE) {
            SD_DEBUG("Finished for unknown request %llu", (unsigned long long)f->request_id);
            break;
        }
        r->result.stop_reason = f->reason;
        if (f->stats) sd_client_wire_request_stats(f->stats, &r->result.stats);
        finish_locked(c, r, SD_OK, SPECD__CODE__CODE_OK, NULL, f->text_tail.data, f->text_tail.len);
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR: {
        const Specd__Error *e = env->error;
        char why[512];
        snprintf(why, sizeof why, "%s", e->message);
        r = NULL;
        if (e->client_tag) r = find_by_tag_locked(c, e->client_tag);
        if ((!r || (r->state != REQ_PENDING && r->state != REQ_ACTIVE)) && e->request_id)
            r = find_by_server_id_locked(c, e->request_id);
        if (!r && !e->client_tag && !e->request_id) {
            /* An untagged error (the coordinator could not decode the submit
             * far enough to read its tag) answers the oldest pending submit:
             * one connection's replies come in the order of its requests. */
            for (req *p = c->reqs; p; p = p->next)
                if (p->state == REQ_PENDING && (!r || p->client_tag < r->client_tag)) r = p;
        }
        if (r && (r->state == REQ_PENDING || r->state == REQ_ACTIVE)) {
            if (e->code == SPECD__CODE__CODE_CANCELLED)
                r->result.stop_reason = SPECD__STOP_REASON__STOP_REASON_CANCELLED;
            finish_locked(c, r, sd_client_wire_status(e->code), e->code, why, NULL, 0);
            break;
        }
        if (e->request_id || e->client_tag) {
            /* About a request that is no longer live here: the answer to a
             * Cancel that crossed the request's end, say (UNKNOWN_REQUEST).
             * It answers nothing else, least of all a stats query. */
            SD_DEBUG("coordinator error %s for request %llu (tag %llu), no longer pending here: %s",
                     sd_net_code_name(e->code), (unsigned long long)e->request_id, (unsigned long long)e->client_tag,
                     why);
            break;
        }
        /* Not about a request: it answers a stats query, or reports a protocol error. */
        SD_WARN("coordinator error %s: %s", sd_net_code_name(e->code), why);
        bool any = false;
        for (stats_waiter *w = c->stats_waiters; w; w = w->next)
            if (!w->done) w->done = true, w->status = sd_client_wire_status(e->code), any = true;
        if (any) pthread_cond_broadcast(&c->cv);
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_STATS:
        for (stats_waiter *w = c->stats_waiters; w; w = w->next)
            if (!w->done) {
                sd_client_wire_service_stats(env->stats, w->out);
                w->done = true;
                w->status = SD_OK;
            }
        pthread_cond_broadcast(&c->cv);
        break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT: break;
    default: SD_WARN("unexpected message case %d from the coordinator", (int)env->body_case); break;
    }
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

static void *io_main(void *arg) {
    sd_client *c = arg;
    const uint64_t interval = (uint64_t)c->params.heartbeat_interval_ms;
    const uint64_t dead_after = interval * (uint64_t)c->params.heartbeat_liveness;
    bool heard = false;        /* anything received since the connection started */
    bool reconnecting = false; /* resubmitted after the coordinator fell silent; nothing heard since */
    uint64_t last_recv = mono_ms(), last_send = 0, busy_since = 0;
    bool was_busy = false;

    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        /* 1. send what the API queued */
        while (c->out_head) {
            outmsg *m = c->out_head;
            c->out_head = m->next;
            if (!c->out_head) c->out_tail = NULL;
            pthread_mutex_unlock(&c->mu);
            if (zmq_send(c->sock, m->data, m->len, 0) < 0)
                SD_ERROR("send to coordinator %s: %s", c->addr, zmq_strerror(zmq_errno()));
            else
                last_send = mono_ms();
            free(m->data);
            free(m);
            pthread_mutex_lock(&c->mu);
        }
        /* 2. liveness */
        if (c->refused[0] && in_flight_locked(c) > 0) fail_all_locked(c, c->refused);
        uint64_t now = mono_ms();
        bool busy = in_flight_locked(c) > 0;
        if (busy && !was_busy) {
            busy_since = now;
            if (now - last_recv > dead_after) last_recv = now; /* idle silence is not death */
        }
        was_busy = busy;
        if (busy) {
            if (heard && now - last_recv > dead_after) {
                char why[600];
                snprintf(why, sizeof why, "coordinator %s silent for %llu ms (dead?)", c->addr,
                         (unsigned long long)(now - last_recv));
                heard = false;
                if (c->params.reconnect_timeout_ms > 0 && reconnect_locked(c, why)) {
                    reconnecting = true;
                    busy_since = last_recv = now;
                    was_busy = in_flight_locked(c) > 0;
                    continue;
                }
                SD_ERROR("%s: failing %zu pending request(s)", why, in_flight_locked(c));
                fail_all_locked(c, why);
                was_busy = false;
                continue;
            }
            int first_answer_ms = reconnecting ? c->params.reconnect_timeout_ms : c->params.connect_timeout_ms;
            if (!heard && now - busy_since > (uint64_t)first_answer_ms) {
                char why[600];
                snprintf(why, sizeof why, "coordinator %s unreachable: no answer within %d ms%s", c->addr,
                         first_answer_ms, reconnecting ? " of resubmitting" : "");
                SD_ERROR("%s", why);
                fail_all_locked(c, why);
                was_busy = false;
                reconnecting = false;
                continue;
            }
            if (now - last_send >= interval) {
                pthread_mutex_unlock(&c->mu);
                if (send_heartbeat(c) == SD_OK) last_send = now;
                pthread_mutex_lock(&c->mu);
            }
        }
        pthread_mutex_unlock(&c->mu);

        /* 3. wait for the socket or a wake-up */
        zmq_pollitem_t items[3] = {
            {c->sock, 0, ZMQ_POLLIN, 0}, {NULL, c->wake_fd, ZMQ_POLLIN, 0}, {c->monitor, 0, ZMQ_POLLIN, 0}};
        long timeout = busy ? (long)interval / 2 : 1000;
        int rc = zmq_poll(items, c->monitor ? 3 : 2, timeout);
        if (rc < 0 && zmq_errno() != EINTR) SD_ERROR("zmq_poll: %s", zmq_strerror(zmq_errno()));
        if (rc > 0 && c->monitor && (items[2].revents & ZMQ_POLLIN)) on_handshake(c);
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN)) {
            uint64_t v;
            ssize_t rd = read(c->wake_fd, &v, sizeof v);
            (void)rd;
        }
        /* drain the socket */
        for (int budget = 0; rc > 0 && (items[0].revents & ZMQ_POLLIN) && budget < 256; budget++) {
            sd_net_msg m;
            sd_status st = sd_net_recv(c->sock, false, true, &m);
            if (st == SD_ERR_NET) break; /* EAGAIN: drained */
            last_recv = mono_ms();
            heard = true;
            reconnecting = false;
            if (st != SD_OK) continue;
            Specd__Code code;
            char err[256];
            Specd__CoordinatorToClient *env = sd_net_decode_to_client(m.body, m.body_len, &code, err, sizeof err);
            sd_net_msg_clear(&m);
            if (!env) {
                SD_WARN("bad message from the coordinator (%s): %s", sd_net_code_name(code), err);
                continue;
            }
            pthread_mutex_lock(&c->mu);
            handle_locked(c, env);
            pthread_mutex_unlock(&c->mu);
            specd__coordinator_to_client__free_unpacked(env, NULL);
        }
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

sd_client_params sd_client_default_params(void) {
    sd_client_params p;
    memset(&p, 0, sizeof p);
    p.coordinator = SD_CLIENT_DEFAULT_ADDR;
    p.connect_timeout_ms = 10000;
    p.heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS;
    p.heartbeat_liveness = SD_HEARTBEAT_LIVENESS;
    p.reconnect_timeout_ms = 60000;
    p.name = "specd-client";
    return p;
}

sd_client_request sd_client_default_request(void) {
    sd_client_request r;
    memset(&r, 0, sizeof r);
    r.sampling = sd_sampling_default();
    return r;
}

void sd_client_result_clear(sd_client_result *r) {
    if (!r) return;
    free(r->ids);
    free(r->text);
    r->ids = NULL;
    r->text = NULL;
    r->n_ids = r->text_len = 0;
}

const char *sd_client_stop_reason_name(Specd__StopReason r) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&specd__stop_reason__descriptor, (int)r);
    if (!v) return "UNKNOWN";
    return strncmp(v->name, "STOP_REASON_", 12) == 0 ? v->name + 12 : v->name;
}

sd_status sd_client_connect(const sd_client_params *p, sd_client **out) {
    if (!p || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    if (p->heartbeat_interval_ms <= 0 || p->heartbeat_liveness <= 0 || p->connect_timeout_ms <= 0 ||
        p->reconnect_timeout_ms < 0) {
        SD_ERROR("sd_client_connect: heartbeat interval, liveness and connect timeout must be > 0, the reconnect "
                 "timeout >= 0");
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
        wake(c);
        pthread_join(c->io, NULL);
    }
    sd_net_monitor_close(c->sock, &c->monitor);
    sd_net_close(&c->sock);
    if (c->zctx) zmq_ctx_term(c->zctx);
    if (c->wake_fd >= 0) close(c->wake_fd);
    while (c->out_head) {
        outmsg *m = c->out_head;
        c->out_head = m->next;
        free(m->data);
        free(m);
    }
    while (c->reqs) {
        req *r = c->reqs;
        c->reqs = r->next;
        req_free(r);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *cp = NULL;
}

/* sd_client_submit with rq's conversation already in protobuf form. */
static sd_status submit_with(sd_client *c, const sd_client_request *rq, Specd__ChatMessage **messages,
                             sd_client_token_cb cb, void *user, uint64_t *request_id) {
    Specd__SubmitRequest sub;
    Specd__Sampling smp;
    sd_client_wire_submit(rq, messages, rq->n_messages, &smp, &sub);
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    env.submit = &sub;

    req *r = calloc(1, sizeof *r);
    if (!r) return SD_ERR_NOMEM;
    /* Validate here with the coordinator's own rules (vocabulary unknown):
     * a bad request fails at once with the precise message. */
    {
        size_t len = protobuf_c_message_get_packed_size(&env.base);
        uint8_t *bytes = malloc(len ? len : 1);
        if (!bytes) {
            free(r);
            return SD_ERR_NOMEM;
        }
        protobuf_c_message_pack(&env.base, bytes);
        Specd__Code code;
        char why[256];
        Specd__ClientToCoordinator *check = sd_net_decode_client(bytes, len, NULL, &code, why, sizeof why);
        r->submit = bytes; /* kept for resubmission after a coordinator restart */
        r->submit_len = len;
        if (!check) {
            r->result.status = sd_client_wire_status(code);
            r->result.code = code;
            snprintf(r->result.error, sizeof r->result.error, "%s", why);
            SD_DEBUG("submit rejected locally: %s", r->result.error);
            if (cb) {
                sd_client_chunk ch = {.final = &r->result};
                cb(&ch, user);
            }
            sd_status st = r->result.status;
            free(r->submit);
            free(r);
            return st;
        }
        specd__client_to_coordinator__free_unpacked(check, NULL);
    }
    r->cb = cb;
    r->user = user;
    r->max_tokens = rq->max_tokens;
    r->state = REQ_PENDING;
    r->in_submit = true;

    pthread_mutex_lock(&c->mu);
    r->client_tag = sub.client_tag = c->next_tag++;
    sd_status st = enqueue_locked(c, &env.base);
    if (st != SD_OK) {
        pthread_mutex_unlock(&c->mu);
        free(r->submit);
        free(r);
        return st;
    }
    r->next = c->reqs;
    c->reqs = r;
    wake(c);
    /* The I/O thread fails a pending request on its own deadline
     * (connect_timeout_ms, or liveness), so this wait always ends. */
    while (r->state == REQ_PENDING || r->state == REQ_FINISHING) pthread_cond_wait(&c->cv, &c->mu);
    /* A request may be accepted and already finished by the time this thread
     * wakes up: only one that never got a request_id was refused. Another
     * thread may know the id already (from a callback) and wait for it:
     * in_submit keeps sd_client_wait from freeing the record until here. */
    r->in_submit = false;
    pthread_cond_broadcast(&c->cv);
    if (r->state == REQ_DONE && r->result.request_id == 0) {
        st = r->result.status != SD_OK ? r->result.status : SD_ERR_INTERNAL;
        SD_DEBUG("submit refused: %s", r->result.error);
        unlink_locked(c, r);
        req_free(r);
    } else if (request_id) {
        *request_id = r->result.request_id;
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

sd_status sd_client_submit(sd_client *c, const sd_client_request *rq, sd_client_token_cb cb, void *user,
                           uint64_t *request_id) {
    if (!c || !rq || (rq->n_messages && !rq->messages)) return SD_ERR_INVALID_ARG;
    if (request_id) *request_id = 0;
    Specd__ChatMessage **pp, *pm;
    size_t n;
    if (sd_client_wire_messages(rq, &pp, &pm, &n) != SD_OK) return SD_ERR_NOMEM;
    sd_client_request capped = *rq; /* only the count copied is capped */
    capped.n_messages = n;
    sd_status st = submit_with(c, &capped, pp, cb, user, request_id);
    free(pm);
    free(pp);
    return st;
}

sd_status sd_client_cancel(sd_client *c, uint64_t request_id) {
    if (!c) return SD_ERR_INVALID_ARG;
    pthread_mutex_lock(&c->mu);
    req *r = find_by_id_locked(c, request_id);
    sd_status st = SD_ERR_NOT_FOUND;
    if (r && (r->state == REQ_ACTIVE || r->state == REQ_FINISHING)) {
        if (r->server_id)
            send_cancel_locked(c, r->server_id);
        else
            r->cancel_requested = true; /* resubmitted: sent when the new coordinator accepts it */
        st = SD_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

sd_status sd_client_wait(sd_client *c, uint64_t request_id, int timeout_ms, sd_client_result *result) {
    if (!c || !result) return SD_ERR_INVALID_ARG;
    struct timespec until;
    if (timeout_ms >= 0) deadline_ts(timeout_ms, &until);
    pthread_mutex_lock(&c->mu);
    req *r;
    for (;;) {
        r = find_by_id_locked(c, request_id);
        if (!r || (r->state == REQ_DONE && !r->in_submit)) break;
        int rc = timeout_ms < 0 ? pthread_cond_wait(&c->cv, &c->mu) : pthread_cond_timedwait(&c->cv, &c->mu, &until);
        if (rc == ETIMEDOUT) {
            r = find_by_id_locked(c, request_id);
            if (r && r->state == REQ_DONE && !r->in_submit) break;
            pthread_mutex_unlock(&c->mu);
            errno = ETIMEDOUT;
            return SD_ERR_NET;
        }
    }
    if (!r) {
        pthread_mutex_unlock(&c->mu);
        return SD_ERR_NOT_FOUND;
    }
    unlink_locked(c, r);
    pthread_mutex_unlock(&c->mu);
    *result = r->result;
    if (!result->text) { /* always a valid string */
        result->text = calloc(1, 1);
    }
    free(r->submit);
    free(r);
    return SD_OK;
}

sd_status sd_client_stats(sd_client *c, int timeout_ms, sd_client_service_stats *out) {
    if (!c || !out) return SD_ERR_INVALID_ARG;
    Specd__StatsQuery q = SPECD__STATS_QUERY__INIT;
    q.include_workers = 1;
    Specd__ClientToCoordinator env = SPECD__CLIENT_TO_COORDINATOR__INIT;
    env.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_STATS;
    env.stats = &q;
    stats_waiter w = {false, SD_ERR_NET, out, NULL};
    struct timespec until;
    deadline_ts(timeout_ms < 0 ? 0 : timeout_ms, &until);
    pthread_mutex_lock(&c->mu);
    sd_status st = enqueue_locked(c, &env.base);
    if (st != SD_OK) {
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    w.next = c->stats_waiters;
    c->stats_waiters = &w;
    wake(c);
    while (!w.done)
        if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) break;
    for (stats_waiter **pp = &c->stats_waiters; *pp; pp = &(*pp)->next)
        if (*pp == &w) {
            *pp = w.next;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    if (!w.done) {
        errno = ETIMEDOUT;
        return SD_ERR_NET;
    }
    return w.status;
}
