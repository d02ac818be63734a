/* client_api.c — the calls of specd/client.h that callers make: defaults,
 * submit, cancel, wait, stats. Each builds and packs its envelope in the
 * caller's thread, queues it for the I/O thread (client.c) and waits on the
 * client's condition variable for the I/O thread's news. Every wait ends:
 * a Submit by its answer deadline, liveness or the connect timeout (the I/O
 * thread fails it), a request by its own deadline (request_timeout_ms, or
 * the request's timeout_ms), sd_client_wait and sd_client_stats by their
 * timeout. */
#include "client_impl.h"
#include "client_wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void deadline_ts(int timeout_ms, struct timespec *ts) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

static void unlink_locked(sd_client *c, req *target) {
    for (req **pp = &c->reqs; *pp; pp = &(*pp)->next)
        if (*pp == target) {
            *pp = target->next;
            return;
        }
}

sd_client_params sd_client_default_params(void) {
    sd_client_params p;
    memset(&p, 0, sizeof p);
    p.coordinator = SD_CLIENT_DEFAULT_ADDR;
    p.connect_timeout_ms = 10000;
    p.heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS;
    p.heartbeat_liveness = SD_HEARTBEAT_LIVENESS;
    p.reconnect_timeout_ms = 60000;
    p.answer_timeout_ms = 30000;
    p.request_timeout_ms = 3600000;
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

/* sd_client_submit with rq's conversation already in protobuf form. */
static sd_status submit_with(sd_client *c, const sd_client_request *rq, Specd__ChatMessage **messages,
                             sd_client_token_cb cb, void *user, uint64_t *request_id) {
    Specd__SubmitRequest sub;
    Specd__Sampling smp;
    sd_client_wire_submit(rq, messages, rq->n_messages, &smp, &sub);
    Specd__Constraint con;
    sd_client_wire_constraint(rq, &con, &sub);
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
    r->sent_ms = sd_client_mono_ms();
    int timeout_ms = rq->timeout_ms > 0 ? rq->timeout_ms : c->params.request_timeout_ms;
    r->deadline_ms = timeout_ms > 0 ? r->sent_ms + (uint64_t)timeout_ms : 0;
    r->in_submit = true;

    pthread_mutex_lock(&c->mu);
    r->client_tag = sub.client_tag = c->next_tag++;
    sd_status st = sd_client_enqueue_locked(c, &env.base);
    if (st != SD_OK) {
        pthread_mutex_unlock(&c->mu);
        free(r->submit);
        free(r);
        return st;
    }
    r->next = c->reqs;
    c->reqs = r;
    sd_client_wake(c);
    /* The I/O thread fails a pending request on its own deadline
     * (answer_timeout_ms, connect_timeout_ms, or liveness), so this wait
     * always ends. */
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
        sd_client_req_free(r);
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
    req *r = sd_client_find_by_id_locked(c, request_id);
    sd_status st = SD_ERR_NOT_FOUND;
    if (r && (r->state == REQ_ACTIVE || r->state == REQ_FINISHING)) {
        if (r->server_id)
            sd_client_send_cancel_locked(c, r->server_id);
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
        r = sd_client_find_by_id_locked(c, request_id);
        if (!r || (r->state == REQ_DONE && !r->in_submit)) break;
        int rc = timeout_ms < 0 ? pthread_cond_wait(&c->cv, &c->mu) : pthread_cond_timedwait(&c->cv, &c->mu, &until);
        if (rc == ETIMEDOUT) {
            r = sd_client_find_by_id_locked(c, request_id);
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
    sd_status st = sd_client_enqueue_locked(c, &env.base);
    if (st != SD_OK) {
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    w.next = c->stats_waiters;
    c->stats_waiters = &w;
    sd_client_wake(c);
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
