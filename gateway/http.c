/* http.c — the HTTP side of specd-gateway, on libmicrohttpd.
 *
 * Threading: libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a handler may block: a non-streaming
 * request waits on its job's condition variable, a streaming response's
 * content reader blocks until tokens arrive and returns them as SSE
 * events. Connections are capped (MHD_OPTION_CONNECTION_LIMIT), and so are
 * the threads. Rejected, by measurement (bench/results/http-cpu.md,
 * 2026-11-25, the forwarding histogram below): libmicrohttpd's epoll
 * thread with every waiting connection suspended and resumed from
 * on_chunk, the blocking calls on 4 workers (built in commit df0cd06). A
 * step then wakes one thread instead of 8, but that thread formats and
 * writes the step's events one after the other: p50 about the same at 8
 * streams (95-98 against 86-117 µs), 10 µs worse at 1, and 3-4x worse at
 * 64 (315-363 against 77-112 µs). Spreading the connections over 2 event
 * threads (MHD_OPTION_THREAD_POOL_SIZE), with epoll or poll, was no
 * better (301-322 µs at 64).
 *
 * A waiting handler sleeps in one poll (wait_locked) on its job's eventfd,
 * which on_chunk writes, on its socket (POLLRDHUP) and on the gateway's
 * stop eventfd, so it wakes only for news: a peer that hung up has its
 * requests cancelled at once, which frees their KV blocks everywhere;
 * writes that fail end the stream the same way (the response's free
 * callback cancels what is unfinished). Replaced, by measurement
 * (bench/results/http-cpu.md, 2026-11-25 "no polling"): a condition
 * variable with a 100 ms timeout and a look at the socket on each wake,
 * whose idle wake-ups were most of the gateway's CPU at 64 streams. A client
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
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

/* Per-request state between the calls of the access handler. */
typedef struct gw_conn {
    gw_route route;
    char *body;
    size_t len, cap;
    size_t seen; /* body bytes received, kept or not */
    bool too_large;
    bool rejected; /* answer with `reject` once the body has been read (and dropped) */
    gw_error reject;
} gw_conn;

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
    if (status == 429 || status == 503) {
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

/* Why a handler stopped waiting for its job. */
typedef enum wait_end { WAIT_NEWS, WAIT_GONE, WAIT_STOPPING } wait_end;

/* Called with job->mu held, which it releases while it sleeps and holds
 * again on return: sleeps until on_chunk has something for the job (or
 * timeout_ms passes: WAIT_NEWS too, the caller looks again), the client
 * on socket fd hangs up or its socket fails (WAIT_GONE), or the gateway
 * stops (WAIT_STOPPING). One poll on three descriptors, so a quiet stream
 * costs nothing until one of them moves. */
static wait_end wait_locked(gw_server *srv, gw_job *job, int fd, int timeout_ms) {
    job->waiting = true;
    pthread_mutex_unlock(&job->mu);
    struct pollfd p[3] = {{.fd = job->wake_fd, .events = POLLIN},
                          {.fd = srv->stop_fd, .events = POLLIN},
                          {.fd = fd, .events = POLLRDHUP}};
    int r = poll(p, fd >= 0 ? 3 : 2, timeout_ms);
    eventfd_t drained;
    if (r > 0 && (p[0].revents & POLLIN)) eventfd_read(job->wake_fd, &drained);
    wait_end end = WAIT_NEWS;
    if (atomic_load(&srv->stopping))
        end = WAIT_STOPPING;
    else if (r > 0 && fd >= 0 && (p[2].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
        end = WAIT_GONE;
    pthread_mutex_lock(&job->mu);
    job->waiting = false;
    return end;
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

/* ---- streaming ---- */

typedef struct gw_stream {
    gw_server *srv;
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
        if (!job->tools && (c->text_len > c->streamed || c->n_lps > c->lps_streamed)) {
            if (!buf_event(s, gw_chunk_json(job, model, i, false, c->text ? c->text + c->streamed : "",
                                            c->text_len - c->streamed, c->lps_streamed, c->n_lps, false,
                                            s->include_usage)))
                return false;
            c->streamed = c->text_len;
            c->lps_streamed = c->n_lps;
            if (c->t_pending_ms > 0 && s->n_fwd < GW_MAX_CHOICES) s->fwd_from_ms[s->n_fwd++] = c->t_pending_ms;
            c->t_pending_ms = 0;
        }
        if (gw_tool_stream_on(job)) { /* content up to a call marker, then the calls' arguments as they come */
            char *ev = NULL;
            do {
                if (!gw_tool_stream_chunk(job, model, i, s->include_usage, &ev) || (ev && !buf_event(s, ev)))
                    return false;
            } while (ev);
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

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    gw_stream *s = cls;
    gw_job *job = s->job;
    if (s->off == s->len) {
        s->off = s->len = 0;
        if (s->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&job->mu);
        for (;;) {
            if (!emit_locked(s)) {
                pthread_mutex_unlock(&job->mu);
                SD_ERROR("stream %s: out of memory", job->id);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (s->len > 0) break;
            double quiet_ms = gw_now_ms() - s->last_emit_ms;
            if (quiet_ms >= GW_KEEPALIVE_MS) {
                if (!buf_add(s, ": keep-alive\n\n", 14)) {
                    pthread_mutex_unlock(&job->mu);
                    return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                break;
            }
            wait_end end = wait_locked(s->srv, job, s->fd, GW_KEEPALIVE_MS - (int)quiet_ms);
            if (end != WAIT_NEWS) {
                pthread_mutex_unlock(&job->mu);
                SD_INFO("stream %s: %s: cancelling", job->id,
                        end == WAIT_STOPPING ? "shutting down" : "the client hung up");
                return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels */
            }
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

static enum MHD_Result handle_health(gw_server *srv, struct MHD_Connection *conn) {
    sd_client_service_stats *st = malloc(sizeof *st);
    if (!st) return send_json(srv, conn, GW_ROUTE_HEALTH, 500, NULL);
    sd_status rc = sd_client_stats(srv->client, GW_STATS_TIMEOUT_MS, st);
    bool verifier = false;
    for (size_t i = 0; rc == SD_OK && i < st->n_workers; i++)
        verifier |= st->workers[i].role == SPECD__ROLE__ROLE_VERIFIER && st->workers[i].alive;
    free(st);
    const char *why = rc != SD_OK ? "the coordinator does not answer" : !verifier ? "no verifier is registered" : NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", why ? "unavailable" : "ok");
    if (why) cJSON_AddStringToObject(root, "reason", why);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(srv, conn, GW_ROUTE_HEALTH, why ? 503 : 200, s);
}

static enum MHD_Result handle_metrics(gw_server *srv, struct MHD_Connection *conn) {
    sd_client_service_stats *st = malloc(sizeof *st);
    if (st && sd_client_stats(srv->client, GW_STATS_TIMEOUT_MS, st) != SD_OK) {
        free(st);
        st = NULL;
    }
    char *text = gw_metrics_render(srv->metrics, srv, st);
    free(st);
    return send_body(srv, conn, GW_ROUTE_METRICS, 200, text, "text/plain; version=0.0.4; charset=utf-8");
}

static enum MHD_Result handle_generate(gw_server *srv, struct MHD_Connection *conn, gw_conn *ctx) {
    gw_route route = ctx->route;
    gw_gen g;
    gw_error err;
    if (!gw_gen_parse(route == GW_ROUTE_CHAT ? GW_EP_CHAT : GW_EP_COMPLETIONS, ctx->body ? ctx->body : "", ctx->len, &g,
                      &err))
        return send_error(srv, conn, route, &err);
    gw_job *job = gw_job_create(srv, &g);
    if (!job) {
        gw_gen_clear(&g);
        return send_json(srv, conn, route, 500, NULL);
    }
    if (!gw_job_submit(job, &g, &err)) {
        gw_gen_clear(&g);
        gw_job_release(job);
        return send_error(srv, conn, route, &err);
    }
    bool stream = g.stream, include_usage = g.include_usage;
    gw_gen_clear(&g);
    int fd = connection_fd(conn);

    if (stream) {
        gw_stream *s = calloc(1, sizeof *s);
        struct MHD_Response *r =
            s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free) : NULL;
        if (!r) {
            free(s);
            gw_job_cancel(job);
            gw_job_release(job);
            return send_json(srv, conn, route, 500, NULL);
        }
        *s = (gw_stream){.srv = srv, .job = job, .fd = fd, .include_usage = include_usage, .last_emit_ms = gw_now_ms()};
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
        MHD_destroy_response(r); /* stream_free runs when libmicrohttpd is done with it */
        gw_metrics_http(srv->metrics, route, 200);
        return ret;
    }

    /* Not streaming: wait for every choice, watching the client. */
    pthread_mutex_lock(&job->mu);
    while (!gw_job_done_locked(job)) {
        wait_end end = wait_locked(srv, job, fd, -1);
        if (end != WAIT_NEWS) {
            pthread_mutex_unlock(&job->mu);
            SD_INFO("request %s: %s: cancelling", job->id,
                    end == WAIT_STOPPING ? "shutting down" : "the client hung up");
            gw_job_cancel(job);
            gw_job_release(job);
            gw_metrics_http(srv->metrics, route, 499 /* counted as "other" */);
            return MHD_NO; /* closes the connection */
        }
    }
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
    enum MHD_Result ret = send_json(srv, conn, route, 200, body);
    if (t_final_ms > 0) gw_metrics_forward(srv->metrics, GW_FORWARD_WHOLE, (gw_now_ms() - t_final_ms) / 1e3);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    gw_server *srv = cls;
    gw_conn *ctx = *con_cls;
    if (!ctx) {
        /* First call: headers only. Decide what can be decided before the body. */
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) return MHD_NO;
        *con_cls = ctx;
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
        return handle_generate(srv, conn, ctx);
    case GW_ROUTE_MODELS:
        if (!get) break;
        return handle_models(srv, conn, url);
    case GW_ROUTE_HEALTH:
        if (!get) break;
        return handle_health(srv, conn);
    case GW_ROUTE_METRICS:
        if (!get) break;
        return handle_metrics(srv, conn);
    default:
        return fail(srv, conn, route, 404, "invalid_request_error", "not_found", "no such endpoint: %s %.200s", method,
                    url);
    }
    return fail(srv, conn, route, 405, "invalid_request_error", "method_not_allowed", "%s is not allowed on %.200s",
                method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    gw_conn *ctx = *con_cls;
    if (!ctx) return;
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

void *gw_http_start(gw_server *srv) {
    struct sockaddr_storage ss;
    bool v6;
    if (!parse_listen(srv->listen, &ss, &v6)) {
        SD_ERROR("--listen '%s': expected ADDR:PORT with a numeric IPv4 address or [IPv6]:PORT", srv->listen);
        return NULL;
    }
    srv->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (srv->stop_fd < 0) {
        SD_ERROR("eventfd: %s", strerror(errno));
        return NULL;
    }
    if (srv->tls_cert && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        SD_ERROR("--tls-cert: this libmicrohttpd was built without TLS");
        close(srv->stop_fd);
        srv->stop_fd = -1;
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0) | (srv->tls_cert ? MHD_USE_TLS : 0);
    uint16_t port = v6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv, /* first: see MHD docs */
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)GW_HEADER_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_LISTENING_ADDRESS_REUSE,
        (unsigned)1, srv->tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, srv->tls_cert,
        MHD_OPTION_HTTPS_MEM_KEY, srv->tls_key, MHD_OPTION_END);
    if (!d) {
        SD_ERROR("cannot listen on %s: %s", srv->listen, strerror(errno));
        close(srv->stop_fd);
        srv->stop_fd = -1;
        return NULL;
    }
    return d;
}

void gw_http_stop(gw_server *srv, void **daemon) {
    if (!daemon || !*daemon) return;
    /* every waiting handler wakes and gives up (the count is never read back) */
    atomic_store(&srv->stopping, true);
    eventfd_write(srv->stop_fd, 1);
    MHD_stop_daemon(*daemon);
    *daemon = NULL;
    close(srv->stop_fd);
    srv->stop_fd = -1;
}
