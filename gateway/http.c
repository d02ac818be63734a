/* http.c — the HTTP side of specd-gateway, on libmicrohttpd.
 *
 * Threading: libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a handler may block: a non-streaming
 * request waits on its job's condition variable, a streaming response's
 * content reader blocks until tokens arrive and returns them as SSE
 * events. Connections are capped (MHD_OPTION_CONNECTION_LIMIT), and so are
 * the threads. Rejected: suspend/resume with one polling thread — less
 * code on our side to get wrong matters more here than thousands of idle
 * streams.
 *
 * While it waits, a handler looks every GW_POLL_MS at its socket: a peer
 * that hung up (POLLRDHUP) has its requests cancelled at once, which frees
 * their KV blocks everywhere; writes that fail end the stream the same way
 * (the response's free callback cancels what is unfinished). A client
 * that half-closes its socket after sending the request (shutdown(SHUT_WR))
 * looks the same as one that left, and is treated so.
 *
 * Forwarding time (specd_gateway_forward_seconds, issue 16's "added by
 * the gateway"): a streamed text event is timed from the arrival of the
 * oldest chunk it carries (on_chunk's clock) to the return of the
 * stream_read call that hands its last byte to libmicrohttpd; a whole
 * response from the last choice's final callback to MHD_queue_response.
 * (With logprobs, a delta that carries only the logprobs of tokens whose
 * text is held back counts as well; the role, finish and [DONE] events
 * carry no chunk and are not timed.)
 * What libmicrohttpd and the kernel do with the bytes after that is left
 * out: it is the same for any HTTP server, and measured end to end by
 * `specd-bench http`. Rejected: timing from the client side only, whose
 * run-to-run spread at 8 and 64 streams (±0.4 ms) hides a 100 µs target.
 *
 * Limits: the body is capped (413, also when Content-Length announces too
 * much, before reading it), headers by libmicrohttpd's per-connection
 * memory (GW_HEADER_MEMORY), idle connections time out
 * (MHD_OPTION_CONNECTION_TIMEOUT), and coordinator requests in flight from
 * this gateway are capped (429 with Retry-After). */
#include "gateway_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cjson/cJSON.h>

/* Where a generation request stands between the calls of the access handler. */
typedef enum gw_phase {
    GW_PHASE_NEW,     /* the whole request is here, nothing done yet */
    GW_PHASE_WORKING, /* suspended: a worker runs the blocking part */
    GW_PHASE_WORKED,  /* the worker's result is in the gw_conn */
} gw_phase;

/* Per-request state between the calls of the access handler. */
typedef struct gw_conn {
    gw_route route;
    struct MHD_Connection *conn;
    char *body;
    size_t len, cap;
    size_t seen; /* body bytes received, kept or not */
    bool too_large;
    bool rejected; /* answer with `reject` once the body has been read (and dropped) */
    gw_error reject;
    gw_phase phase;
    struct gw_conn *next_work; /* in the worker queue */
    /* the worker's result: an error to send (failed), a body to send
     * (out, out_status; /health and /metrics), or a submitted job */
    bool failed;
    gw_error err;
    char *out;
    int out_status;
    gw_job *job; /* held (one reference) until handed to the stream or answered */
    bool stream, include_usage;
} gw_conn;

/* The event loop's helpers: the worker threads that run what blocks, the
 * list of suspended connections waiting for a job, and the ticker that
 * looks at those for a gone client or a due keep-alive. */
struct gw_http {
    gw_server *srv;
    struct MHD_Daemon *daemon;
    /* the wait list (every job's `wait` fields) */
    pthread_mutex_t mu;
    gw_job *waiting;
    size_t n_waiting;
    bool closed; /* stopping: nothing is suspended any more */
    pthread_cond_t tick_cv;
    bool tick_stop;
    pthread_t ticker;
    bool ticker_started;
    struct pollfd *pfds; /* [max_connections] the ticker's */
    gw_job **pjobs;
    /* the workers */
    pthread_mutex_t work_mu;
    pthread_cond_t work_cv;
    gw_conn *work_head, *work_tail;
    bool work_stop;
    pthread_t workers[GW_WORKERS];
    size_t n_workers;
};

/* A body announced larger than this is refused before it is read (the
 * client may then see the connection close while it still sends); smaller
 * ones are read and dropped first, so an ordinary client gets its 413. */
static size_t discard_limit(const gw_server *srv) {
    return srv->max_body < (4u << 20) ? (16u << 20) : srv->max_body * 4;
}

static gw_route route_of(const char *url) {
    if (!strcmp(url, "/v1/chat/completions")) return GW_ROUTE_CHAT;
    if (!strcmp(url, "/v1/completions")) return GW_ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return GW_ROUTE_MODELS;
    if (!strcmp(url, "/health")) return GW_ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return GW_ROUTE_METRICS;
    return GW_ROUTE_OTHER;
}

/* ---- responses ---- */

static enum MHD_Result send_body(gw_server *srv, struct MHD_Connection *conn, gw_route route, int status, char *body,
                                 const char *content_type) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        body = strdup(oom);
        status = 500;
        content_type = "application/json";
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == 429) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", GW_RETRY_AFTER_S);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                route == GW_ROUTE_CHAT || route == GW_ROUTE_COMPLETIONS ? "POST" : "GET");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    gw_metrics_http(srv->metrics, route, status);
    return ret;
}

static enum MHD_Result send_json(gw_server *srv, struct MHD_Connection *conn, gw_route route, int status, char *json) {
    return send_body(srv, conn, route, status, json, "application/json");
}

static enum MHD_Result send_error(gw_server *srv, struct MHD_Connection *conn, gw_route route, const gw_error *err) {
    if (err->http_status >= 500)
        SD_WARN("HTTP %d: %s", err->http_status, err->message);
    else
        SD_DEBUG("HTTP %d: %s", err->http_status, err->message);
    return send_json(srv, conn, route, err->http_status, gw_error_json(err));
}

static enum MHD_Result fail(gw_server *srv, struct MHD_Connection *conn, gw_route route, int status, const char *type,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result fail(gw_server *srv, struct MHD_Connection *conn, gw_route route, int status, const char *type,
                            const char *code, const char *fmt, ...) {
    gw_error err = {.http_status = status, .type = type, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof err.message, fmt, ap);
    va_end(ap);
    return send_error(srv, conn, route, &err);
}

/* ---- connection checks ---- */

/* True when the peer hung up or the socket failed. */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int connection_fd(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static bool peer_is_loopback(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return false;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* NULL when authorised, otherwise why not. Every /v1/ path needs the key (when
 * one is set); /health and /metrics only from off the loopback. */
static const char *auth_problem(gw_server *srv, struct MHD_Connection *conn, gw_route route, const char *url) {
    if (!srv->api_key) return NULL;
    bool v1 = !strncmp(url, "/v1/", 4);
    if (!v1 && peer_is_loopback(conn)) return NULL;
    if (!v1 && route != GW_ROUTE_HEALTH && route != GW_ROUTE_METRICS) return NULL; /* 404 anyway */
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) return "missing API key: send 'Authorization: Bearer KEY'";
    if (strncasecmp(h, "Bearer ", 7) != 0) return "the Authorization header must be 'Bearer KEY'";
    h += 7;
    while (*h == ' ') h++;
    return gw_key_equal(h, srv->api_key) ? NULL : "incorrect API key";
}

/* ---- waiting for a job without a thread ---- */

static void unlink_wait_locked(gw_http *h, gw_job *job) {
    if (job->wait.prev)
        job->wait.prev->wait.next = job->wait.next;
    else
        h->waiting = job->wait.next;
    if (job->wait.next) job->wait.next->wait.prev = job->wait.prev;
    job->wait.prev = job->wait.next = NULL;
    job->wait.suspended = false;
    h->n_waiting--;
}

/* Resumes the connection waiting for job. Call with h->mu held. */
static void resume_locked(gw_http *h, gw_job *job) {
    struct MHD_Connection *conn = job->wait.conn;
    unlink_wait_locked(h, job);
    job->wait.conn = NULL;
    MHD_resume_connection(conn);
}

typedef enum gw_wait_result { GW_WAIT_SUSPENDED, GW_WAIT_GONE } gw_wait_result;

/* Suspends conn until job has something for it (gw_http_wake_locked), its
 * client hangs up or a keep-alive is due (the ticker). GW_WAIT_GONE, and
 * nothing suspended, when the client is gone (seen by the ticker before,
 * or now) or the gateway is stopping. Call with job->mu held, from the
 * access handler or the content reader. */
static gw_wait_result wait_for_job_locked(gw_http *h, gw_job *job, struct MHD_Connection *conn, int fd, bool stream,
                                          double last_emit_ms) {
    if (client_gone(fd)) return GW_WAIT_GONE;
    pthread_mutex_lock(&h->mu);
    if (h->closed || job->wait.gone || atomic_load(&h->srv->stopping)) {
        pthread_mutex_unlock(&h->mu);
        return GW_WAIT_GONE;
    }
    job->wait.conn = conn;
    job->wait.fd = fd;
    job->wait.stream = stream;
    job->wait.last_emit_ms = last_emit_ms;
    job->wait.suspended = true;
    job->wait.prev = NULL;
    job->wait.next = h->waiting;
    if (h->waiting) h->waiting->wait.prev = job;
    h->waiting = job;
    h->n_waiting++;
    MHD_suspend_connection(conn);
    pthread_mutex_unlock(&h->mu);
    return GW_WAIT_SUSPENDED;
}

/* True when the ticker saw the client of job's connection hang up (or the
 * gateway stopping) and resumed it for that. */
static bool wait_gone(gw_http *h, gw_job *job) {
    pthread_mutex_lock(&h->mu);
    bool gone = job->wait.gone;
    pthread_mutex_unlock(&h->mu);
    return gone;
}

/* Takes job out of the wait list if it is there (a connection that ends
 * while suspended: only when the daemon stops). */
static void wait_forget(gw_http *h, gw_job *job) {
    pthread_mutex_lock(&h->mu);
    if (job->wait.suspended) unlink_wait_locked(h, job);
    job->wait.conn = NULL;
    pthread_mutex_unlock(&h->mu);
}

void gw_http_wake_locked(gw_job *job) {
    gw_http *h = job->srv->http;
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    if (job->wait.suspended && (job->wait.stream || gw_job_done_locked(job))) resume_locked(h, job);
    pthread_mutex_unlock(&h->mu);
}

/* Every GW_POLL_MS: one poll() over the suspended connections' sockets;
 * those whose client hung up are resumed to be closed (their requests
 * cancelled), and streams silent for GW_KEEPALIVE_MS to send a comment. */
static void *ticker_main(void *arg) {
    gw_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->tick_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += GW_POLL_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&h->tick_cv, &h->mu, &until);
        if (h->tick_stop) break;
        size_t n = 0;
        for (gw_job *j = h->waiting; j && n < h->srv->max_connections; j = j->wait.next) {
            h->pfds[n] = (struct pollfd){.fd = j->wait.fd, .events = POLLRDHUP};
            h->pjobs[n++] = j;
        }
        if (!n) continue;
        if (poll(h->pfds, n, 0) < 0)
            for (size_t i = 0; i < n; i++) h->pfds[i].revents = 0;
        bool stopping = atomic_load(&h->srv->stopping);
        double now = gw_now_ms();
        for (size_t i = 0; i < n; i++) {
            gw_job *j = h->pjobs[i];
            bool gone = stopping || (h->pfds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
            bool keepalive = j->wait.stream && now - j->wait.last_emit_ms >= GW_KEEPALIVE_MS;
            if (gone) j->wait.gone = true;
            if (gone || keepalive) resume_locked(h, j);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- streaming ---- */

typedef struct gw_stream {
    gw_server *srv;
    gw_http *h;
    struct MHD_Connection *conn;
    gw_job *job;
    int fd;
    bool include_usage;
    char *buf; /* SSE bytes not yet handed to libmicrohttpd */
    size_t len, off, cap;
    bool done_sent; /* "data: [DONE]" is in buf */
    bool usage_sent;
    double last_emit_ms;
    /* arrival (ms) of the oldest chunk of each text event in buf, observed
     * when buf has been handed over (one delta per choice per fill) */
    double fwd_from_ms[GW_MAX_CHOICES];
    size_t n_fwd;
} gw_stream;

static bool buf_add(gw_stream *s, const char *a, size_t n) {
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n) cap *= 2;
        char *p = realloc(s->buf, cap);
        if (!p) return false;
        s->buf = p;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, a, n);
    s->len += n;
    return true;
}

/* "data: JSON\n\n"; takes json. */
static bool buf_event(gw_stream *s, char *json) {
    bool ok = json && buf_add(s, "data: ", 6) && buf_add(s, json, strlen(json)) && buf_add(s, "\n\n", 2);
    free(json);
    return ok;
}

/* Turns what the job has that was not sent yet into SSE events. Call with
 * the job's mutex held. False when out of memory. */
static bool emit_locked(gw_stream *s) {
    gw_job *job = s->job;
    const char *model = s->srv->model_name;
    bool all = true;
    for (size_t i = 0; i < job->n_choices; i++) {
        gw_choice *c = &job->choices[i];
        if (job->endpoint == GW_EP_CHAT && !c->role_sent) {
            if (!buf_event(s, gw_chunk_json(job, model, i, true, NULL, 0, 0, 0, false, s->include_usage))) return false;
            c->role_sent = true;
        }
        /* a delta carries the logprobs of the tokens that arrived with it
         * (text held back for a stop string or a split character comes later) */
        if (c->text_len > c->streamed || c->n_lps > c->lps_streamed) {
            if (!buf_event(s, gw_chunk_json(job, model, i, false, c->text ? c->text + c->streamed : "",
                                            c->text_len - c->streamed, c->lps_streamed, c->n_lps, false,
                                            s->include_usage)))
                return false;
            c->streamed = c->text_len;
            c->lps_streamed = c->n_lps;
            if (c->t_pending_ms > 0 && s->n_fwd < GW_MAX_CHOICES) s->fwd_from_ms[s->n_fwd++] = c->t_pending_ms;
            c->t_pending_ms = 0;
        }
        if (c->done && !c->finish_sent) {
            if (c->status == SD_OK) {
                if (!buf_event(s, gw_chunk_json(job, model, i, false, NULL, 0, 0, 0, true, s->include_usage)))
                    return false;
            } else {
                gw_error err;
                gw_choice_error(c, &err);
                if (!buf_event(s, gw_error_json(&err))) return false;
            }
            c->finish_sent = true;
        }
        all = all && c->finish_sent;
    }
    if (all && !s->done_sent) {
        if (s->include_usage && !s->usage_sent) {
            if (!buf_event(s, gw_usage_chunk_json(job, model))) return false;
            s->usage_sent = true;
        }
        if (!buf_add(s, "data: [DONE]\n\n", 14)) return false;
        s->done_sent = true;
    }
    return true;
}

/* libmicrohttpd's content reader, on its event thread: hands over what is
 * buffered, else formats what the job has that was not sent yet, else
 * suspends the connection until on_chunk (or the ticker) resumes it. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    gw_stream *s = cls;
    gw_job *job = s->job;
    if (s->off == s->len) {
        s->off = s->len = 0;
        if (s->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        bool gone = wait_gone(s->h, job);
        pthread_mutex_lock(&job->mu);
        if (!gone && !emit_locked(s)) {
            pthread_mutex_unlock(&job->mu);
            SD_ERROR("stream %s: out of memory", job->id);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!gone && s->len == 0 && gw_now_ms() - s->last_emit_ms >= GW_KEEPALIVE_MS &&
            !buf_add(s, ": keep-alive\n\n", 14)) {
            pthread_mutex_unlock(&job->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (s->len == 0) {
            if (!gone && wait_for_job_locked(s->h, job, s->conn, s->fd, true, s->last_emit_ms) == GW_WAIT_SUSPENDED) {
                pthread_mutex_unlock(&job->mu);
                return 0; /* called again once resumed */
            }
            pthread_mutex_unlock(&job->mu);
            SD_INFO("stream %s: %s: cancelling", job->id,
                    atomic_load(&s->srv->stopping) ? "shutting down" : "the client hung up");
            return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels */
        }
        pthread_mutex_unlock(&job->mu);
        s->last_emit_ms = gw_now_ms();
    }
    size_t n = s->len - s->off < max ? s->len - s->off : max;
    memcpy(out, s->buf + s->off, n);
    s->off += n;
    if (s->off == s->len && s->n_fwd) {
        double now = gw_now_ms();
        for (size_t i = 0; i < s->n_fwd; i++)
            gw_metrics_forward(s->srv->metrics, GW_FORWARD_STREAM, (now - s->fwd_from_ms[i]) / 1e3);
        s->n_fwd = 0;
    }
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    gw_stream *s = cls;
    wait_forget(s->h, s->job);
    pthread_mutex_lock(&s->job->mu);
    bool finished = gw_job_done_locked(s->job);
    pthread_mutex_unlock(&s->job->mu);
    if (!finished) gw_job_cancel(s->job);
    gw_job_release(s->job);
    free(s->buf);
    free(s);
}

/* ---- handlers ---- */

static enum MHD_Result handle_models(gw_server *srv, struct MHD_Connection *conn, const char *url) {
    const char *one = strncmp(url, "/v1/models/", 11) == 0 ? url + 11 : NULL;
    if (one && strcmp(one, srv->model_name) != 0)
        return fail(srv, conn, GW_ROUTE_MODELS, 404, "invalid_request_error", "model_not_found",
                    "the model '%.200s' does not exist (this gateway serves '%.200s')", one, srv->model_name);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "specd");
    cJSON *root = m;
    if (!one) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(srv, conn, GW_ROUTE_MODELS, 200, s);
}

/* ---- the blocking part, on a worker thread ---- */

static void work_health(gw_server *srv, gw_conn *ctx) {
    sd_client_service_stats *st = malloc(sizeof *st);
    if (!st) {
        ctx->out_status = 500; /* out = NULL: send_body's out-of-memory answer */
        return;
    }
    sd_status rc = sd_client_stats(srv->client, GW_STATS_TIMEOUT_MS, st);
    bool verifier = false;
    for (size_t i = 0; rc == SD_OK && i < st->n_workers; i++)
        verifier |= st->workers[i].role == SPECD__ROLE__ROLE_VERIFIER && st->workers[i].alive;
    free(st);
    const char *why = rc != SD_OK ? "the coordinator does not answer" : !verifier ? "no verifier is registered" : NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", why ? "unavailable" : "ok");
    if (why) cJSON_AddStringToObject(root, "reason", why);
    ctx->out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    ctx->out_status = why ? 503 : 200;
}

static void work_metrics(gw_server *srv, gw_conn *ctx) {
    sd_client_service_stats *st = malloc(sizeof *st);
    if (st && sd_client_stats(srv->client, GW_STATS_TIMEOUT_MS, st) != SD_OK) {
        free(st);
        st = NULL;
    }
    ctx->out = gw_metrics_render(srv->metrics, srv, st);
    ctx->out_status = 200;
    free(st);
}

/* Parses the body and submits the job (waits for the coordinator's yes or
 * no). */
static void work_generate(gw_server *srv, gw_conn *ctx) {
    gw_gen g;
    if (atomic_load(&srv->stopping)) {
        gw_fail(&ctx->err, 503, "server_error", NULL, NULL, "the gateway is shutting down");
        ctx->failed = true;
        return;
    }
    if (!gw_gen_parse(ctx->route == GW_ROUTE_CHAT ? GW_EP_CHAT : GW_EP_COMPLETIONS, ctx->body ? ctx->body : "",
                      ctx->len, &g, &ctx->err)) {
        ctx->failed = true;
        return;
    }
    gw_job *job = gw_job_create(srv, &g);
    if (!job) {
        gw_gen_clear(&g);
        ctx->out_status = 500; /* out = NULL: out of memory */
        return;
    }
    if (!gw_job_submit(job, &g, &ctx->err)) {
        gw_gen_clear(&g);
        gw_job_release(job);
        ctx->failed = true;
        return;
    }
    ctx->stream = g.stream;
    ctx->include_usage = g.include_usage;
    ctx->job = job;
    gw_gen_clear(&g);
}

static void *worker_main(void *arg) {
    gw_http *h = arg;
    pthread_mutex_lock(&h->work_mu);
    for (;;) {
        while (!h->work_head && !h->work_stop) pthread_cond_wait(&h->work_cv, &h->work_mu);
        gw_conn *ctx = h->work_head;
        if (!ctx) break; /* stopping, and the queue is empty */
        h->work_head = ctx->next_work;
        if (!h->work_head) h->work_tail = NULL;
        pthread_mutex_unlock(&h->work_mu);
        if (ctx->route == GW_ROUTE_HEALTH)
            work_health(h->srv, ctx);
        else if (ctx->route == GW_ROUTE_METRICS)
            work_metrics(h->srv, ctx);
        else
            work_generate(h->srv, ctx);
        ctx->phase = GW_PHASE_WORKED;
        MHD_resume_connection(ctx->conn); /* ctx may be gone after this */
        pthread_mutex_lock(&h->work_mu);
    }
    pthread_mutex_unlock(&h->work_mu);
    return NULL;
}

/* Suspends ctx's connection and queues its blocking part for a worker,
 * which resumes it when done (the access handler then runs again). False
 * when the gateway is stopping. Called from the access handler. */
static bool work_queue(gw_http *h, gw_conn *ctx) {
    pthread_mutex_lock(&h->work_mu);
    if (h->work_stop) {
        pthread_mutex_unlock(&h->work_mu);
        return false;
    }
    ctx->phase = GW_PHASE_WORKING;
    ctx->next_work = NULL;
    MHD_suspend_connection(ctx->conn);
    if (h->work_tail)
        h->work_tail->next_work = ctx;
    else
        h->work_head = ctx;
    h->work_tail = ctx;
    pthread_cond_signal(&h->work_cv);
    pthread_mutex_unlock(&h->work_mu);
    return true;
}

/* ---- handlers, on the event thread ---- */

/* /health, /metrics and the generation endpoints: the first call queues the
 * blocking part (true: answered for now); after it, false. */
static bool queued_work(gw_http *h, gw_conn *ctx, enum MHD_Result *ret) {
    if (ctx->phase == GW_PHASE_WORKED) return false;
    *ret = MHD_YES;
    if (ctx->phase == GW_PHASE_WORKING) return true; /* not expected: the connection is suspended */
    if (!work_queue(h, ctx))
        *ret = fail(h->srv, ctx->conn, ctx->route, 503, "server_error", NULL, "the gateway is shutting down");
    return true;
}

static enum MHD_Result handle_stats(gw_http *h, struct MHD_Connection *conn, gw_conn *ctx) {
    enum MHD_Result ret;
    if (queued_work(h, ctx, &ret)) return ret;
    char *out = ctx->out;
    ctx->out = NULL;
    if (ctx->route == GW_ROUTE_METRICS && out)
        return send_body(h->srv, conn, ctx->route, ctx->out_status, out, "text/plain; version=0.0.4; charset=utf-8");
    return send_json(h->srv, conn, ctx->route, ctx->out_status, out);
}

static enum MHD_Result handle_generate(gw_http *h, struct MHD_Connection *conn, gw_conn *ctx) {
    gw_server *srv = h->srv;
    gw_route route = ctx->route;
    enum MHD_Result ret;
    if (queued_work(h, ctx, &ret)) return ret;
    if (ctx->failed) return send_error(srv, conn, route, &ctx->err);
    if (!ctx->job) return send_json(srv, conn, route, ctx->out_status, NULL);
    gw_job *job = ctx->job;
    int fd = connection_fd(conn);

    if (ctx->stream) {
        gw_stream *s = calloc(1, sizeof *s);
        struct MHD_Response *r =
            s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free) : NULL;
        if (!r) {
            free(s);
            return send_json(srv, conn, route, 500, NULL); /* on_completed cancels the job */
        }
        ctx->job = NULL; /* the stream's now */
        *s = (gw_stream){.srv = srv,
                         .h = h,
                         .conn = conn,
                         .job = job,
                         .fd = fd,
                         .include_usage = ctx->include_usage,
                         .last_emit_ms = gw_now_ms()};
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
        MHD_destroy_response(r); /* stream_free runs when libmicrohttpd is done with it */
        gw_metrics_http(srv->metrics, route, 200);
        return ret;
    }

    /* Not streaming: suspended until every choice is done, the client
     * hangs up or the gateway stops. */
    pthread_mutex_lock(&job->mu);
    if (!gw_job_done_locked(job)) {
        if (wait_for_job_locked(h, job, conn, fd, false, 0) == GW_WAIT_SUSPENDED) {
            pthread_mutex_unlock(&job->mu);
            return MHD_YES; /* called again once resumed */
        }
        pthread_mutex_unlock(&job->mu);
        bool stopping = atomic_load(&srv->stopping);
        SD_INFO("request %s: %s: cancelling", job->id, stopping ? "shutting down" : "the client hung up");
        gw_job_cancel(job);
        gw_job_release(job);
        ctx->job = NULL;
        gw_metrics_http(srv->metrics, route, 499 /* counted as "other" */);
        return MHD_NO; /* closes the connection */
    }
    ctx->job = NULL;
    gw_error err;
    const gw_choice *bad = NULL;
    for (size_t i = 0; i < job->n_choices && !bad; i++)
        if (job->choices[i].status != SD_OK) bad = &job->choices[i];
    if (bad) {
        gw_choice_error(bad, &err);
        pthread_mutex_unlock(&job->mu);
        gw_job_release(job);
        return send_error(srv, conn, route, &err);
    }
    char *body = gw_response_json(job, srv->model_name);
    double t_final_ms = 0;
    for (size_t i = 0; i < job->n_choices; i++)
        if (job->choices[i].t_final_ms > t_final_ms) t_final_ms = job->choices[i].t_final_ms;
    pthread_mutex_unlock(&job->mu);
    gw_job_release(job);
    ret = send_json(srv, conn, route, 200, body);
    if (t_final_ms > 0) gw_metrics_forward(srv->metrics, GW_FORWARD_WHOLE, (gw_now_ms() - t_final_ms) / 1e3);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    gw_http *h = cls;
    gw_server *srv = h->srv;
    gw_conn *ctx = *con_cls;
    if (!ctx) {
        /* First call: headers only. Decide what can be decided before the body. */
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) return MHD_NO;
        *con_cls = ctx;
        ctx->conn = conn;
        ctx->route = route_of(url);
        const char *why = auth_problem(srv, conn, ctx->route, url);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long announced = cl ? strtoull(cl, NULL, 10) : 0;
        if (why) {
            ctx->rejected = true;
            gw_fail(&ctx->reject, 401, "invalid_request_error", "invalid_api_key", NULL, "%s", why);
        } else if (announced > srv->max_body) {
            ctx->rejected = true;
            gw_fail(&ctx->reject, 413, "invalid_request_error", "request_too_large", NULL,
                    "the request body is %llu bytes, the limit is %zu", announced, srv->max_body);
        }
        if (ctx->rejected && announced > discard_limit(srv)) return send_error(srv, conn, ctx->route, &ctx->reject);
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        ctx->seen += n;
        if (ctx->seen > discard_limit(srv)) {
            SD_INFO("closing a connection that sent over %zu body bytes", discard_limit(srv));
            return MHD_NO;
        }
        if (ctx->too_large || ctx->rejected) return MHD_YES; /* read and dropped */
        if (ctx->len + n > srv->max_body) {
            ctx->too_large = true;
            free(ctx->body);
            ctx->body = NULL;
            ctx->len = ctx->cap = 0;
            return MHD_YES;
        }
        if (ctx->len + n + 1 > ctx->cap) {
            size_t cap = ctx->cap ? ctx->cap : 4096;
            while (cap < ctx->len + n + 1) cap *= 2;
            char *p = realloc(ctx->body, cap);
            if (!p) return MHD_NO;
            ctx->body = p;
            ctx->cap = cap;
        }
        memcpy(ctx->body + ctx->len, upload_data, n);
        ctx->len += n;
        ctx->body[ctx->len] = '\0';
        return MHD_YES;
    }

    /* The whole request is here. */
    gw_route route = ctx->route;
    if (ctx->rejected) return send_error(srv, conn, route, &ctx->reject);
    if (ctx->too_large)
        return fail(srv, conn, route, 413, "invalid_request_error", "request_too_large",
                    "the request body is over the limit of %zu bytes", srv->max_body);
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    switch (route) {
    case GW_ROUTE_CHAT:
    case GW_ROUTE_COMPLETIONS:
        if (!post) break;
        return handle_generate(h, conn, ctx);
    case GW_ROUTE_MODELS:
        if (!get) break;
        return handle_models(srv, conn, url);
    case GW_ROUTE_HEALTH:
    case GW_ROUTE_METRICS:
        if (!get) break;
        return handle_stats(h, conn, ctx);
    default:
        return fail(srv, conn, route, 404, "invalid_request_error", "not_found", "no such endpoint: %s %.200s", method,
                    url);
    }
    return fail(srv, conn, route, 405, "invalid_request_error", "method_not_allowed", "%s is not allowed on %.200s",
                method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    gw_http *h = cls;
    gw_conn *ctx = *con_cls;
    if (!ctx) return;
    if (ctx->job) { /* submitted, never answered */
        wait_forget(h, ctx->job);
        pthread_mutex_lock(&ctx->job->mu);
        bool finished = gw_job_done_locked(ctx->job);
        pthread_mutex_unlock(&ctx->job->mu);
        if (!finished) gw_job_cancel(ctx->job);
        gw_job_release(ctx->job);
    }
    free(ctx->out);
    free(ctx->body);
    free(ctx);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    SD_WARN("libmicrohttpd: %s", line);
}

/* "ADDR:PORT" or "[ADDR6]:PORT" -> a socket address. */
static bool parse_listen(const char *s, struct sockaddr_storage *ss, bool *v6) {
    memset(ss, 0, sizeof *ss);
    char host[128];
    const char *colon;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host) return false;
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = '\0';
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof host) return false;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
    }
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port > 65535) return false;
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *v6 = false;
        return true;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *v6 = true;
        return true;
    }
    return false;
}

static void http_free(gw_http *h) {
    pthread_cond_destroy(&h->work_cv);
    pthread_mutex_destroy(&h->work_mu);
    pthread_cond_destroy(&h->tick_cv);
    pthread_mutex_destroy(&h->mu);
    free(h->pfds);
    free(h->pjobs);
    free(h);
}

/* Stops the workers (each finishes the queue, resuming its connections) and
 * the ticker, then resumes every waiting connection, which then closes. */
static void http_quiesce(gw_http *h) {
    pthread_mutex_lock(&h->work_mu);
    h->work_stop = true;
    pthread_cond_broadcast(&h->work_cv);
    pthread_mutex_unlock(&h->work_mu);
    for (size_t i = 0; i < h->n_workers; i++) pthread_join(h->workers[i], NULL);
    h->n_workers = 0;
    pthread_mutex_lock(&h->mu);
    h->tick_stop = true;
    pthread_cond_signal(&h->tick_cv);
    pthread_mutex_unlock(&h->mu);
    if (h->ticker_started) pthread_join(h->ticker, NULL);
    h->ticker_started = false;
    pthread_mutex_lock(&h->mu);
    h->closed = true;
    while (h->waiting) {
        h->waiting->wait.gone = true;
        resume_locked(h, h->waiting);
    }
    pthread_mutex_unlock(&h->mu);
}

bool gw_http_start(gw_server *srv) {
    struct sockaddr_storage ss;
    bool v6;
    if (!parse_listen(srv->listen, &ss, &v6)) {
        SD_ERROR("--listen '%s': expected ADDR:PORT with a numeric IPv4 address or [IPv6]:PORT", srv->listen);
        return false;
    }
    gw_http *h = calloc(1, sizeof *h);
    if (!h) return false;
    h->srv = srv;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->tick_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&h->work_mu, NULL);
    pthread_cond_init(&h->work_cv, NULL);
    size_t cap = srv->max_connections ? srv->max_connections : 1;
    h->pfds = calloc(cap, sizeof *h->pfds);
    h->pjobs = calloc(cap, sizeof *h->pjobs);
    if (!h->pfds || !h->pjobs) {
        http_free(h);
        return false;
    }
    for (size_t i = 0; i < GW_WORKERS; i++) {
        if (pthread_create(&h->workers[i], NULL, worker_main, h) != 0) break;
        h->n_workers++;
    }
    h->ticker_started = pthread_create(&h->ticker, NULL, ticker_main, h) == 0;
    if (!h->n_workers || !h->ticker_started) {
        SD_ERROR("cannot start the gateway's threads");
        http_quiesce(h);
        http_free(h);
        return false;
    }
    srv->http = h;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     (v6 ? MHD_USE_IPv6 : 0);
    uint16_t port = v6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    h->daemon = MHD_start_daemon(
        flags, port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv, /* first: see MHD docs */
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)GW_HEADER_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_LISTENING_ADDRESS_REUSE,
        (unsigned)1, MHD_OPTION_END);
    if (!h->daemon) {
        int e = errno;
        SD_ERROR("cannot listen on %s: %s", srv->listen, strerror(e));
        srv->http = NULL;
        http_quiesce(h);
        http_free(h);
        return false;
    }
    return true;
}

void gw_http_stop(gw_server *srv) {
    gw_http *h = srv ? srv->http : NULL;
    if (!h) return;
    atomic_store(&srv->stopping, true);
    http_quiesce(h);
    /* A connection resumed by http_quiesce is taken back by the event
     * thread before it closes (libmicrohttpd resumes pending ones first). */
    MHD_stop_daemon(h->daemon);
    h->daemon = NULL;
}

void gw_http_free(gw_server *srv) {
    if (!srv || !srv->http) return;
    http_free(srv->http);
    srv->http = NULL;
}
