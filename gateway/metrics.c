/* metrics.c — Prometheus text exposition (format 0.0.4) for /metrics.
 *
 * Two sources: what the gateway itself sees (HTTP responses by route and
 * status, finished requests by reason, tokens, drafted/accepted from each
 * request's final stats, latency histograms measured at the gateway), and
 * a ServiceStats snapshot from the coordinator, queried per scrape
 * (running/queued requests, committed tokens, verify steps, drafted and
 * accepted tokens overall and per draft position, step overhead, draft
 * wait, and per worker: up, KV blocks, sequences, steps). Counters of the
 * gateway are since this gateway started; the coordinator's since it did.
 * One mutex guards the counters: updates are a few additions, and no
 * update allocates. specd_gateway_forward_seconds times the gateway's own
 * work per forwarded event (http.c): its buckets go from 5 µs to 50 ms in
 * 1-2-5 steps, so issue 16's 100 µs target is a bucket bound. */
#include "gateway_impl.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CODES 12
static const int k_codes[N_CODES] = {200, 400, 401, 404, 405, 413, 429, 431, 500, 503, 504, 0 /* other */};
static const char *const k_routes[GW_ROUTE_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "other"};

enum { FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR, FIN_COUNT };
static const char *const k_finish[FIN_COUNT] = {"stop", "length", "cancelled", "error"};

#define LAT_BUCKETS 14
static const double k_lat_bounds[LAT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
#define ITL_BUCKETS 11
static const double k_itl_bounds[ITL_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

#define FWD_BUCKETS 13
static const double k_fwd_bounds[FWD_BUCKETS] = {5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4,
                                                 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2};
static const char *const k_fwd_kinds[GW_FORWARD_COUNT] = {"stream", "whole"};

#define HISTO_MAX 14
_Static_assert(LAT_BUCKETS <= HISTO_MAX && ITL_BUCKETS <= HISTO_MAX && FWD_BUCKETS <= HISTO_MAX, "HISTO_MAX");

typedef struct histo {
    uint64_t counts[HISTO_MAX]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} histo;

typedef struct counters {
    uint64_t http[GW_ROUTE_COUNT][N_CODES];
    uint64_t finished[FIN_COUNT];
    uint64_t prompt_tokens, generation_tokens, drafted, accepted;
    histo ttft, itl, e2e;
    histo forward[GW_FORWARD_COUNT];
} counters;

struct gw_metrics {
    pthread_mutex_t mu;
    counters c;
};

gw_metrics *gw_metrics_create(void) {
    gw_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void gw_metrics_destroy(gw_metrics **mp) {
    if (!mp || !*mp) return;
    pthread_mutex_destroy(&(*mp)->mu);
    free(*mp);
    *mp = NULL;
}

static void observe(histo *h, const double *bounds, int n_bounds, double v) {
    int b = 0;
    while (b < n_bounds && v > bounds[b]) b++;
    if (b < n_bounds) h->counts[b]++;
    h->count++;
    h->sum += v;
}

void gw_metrics_http(gw_metrics *m, gw_route route, int status) {
    int k = N_CODES - 1;
    for (int i = 0; i < N_CODES - 1; i++)
        if (k_codes[i] == status) k = i;
    pthread_mutex_lock(&m->mu);
    m->c.http[route][k]++;
    pthread_mutex_unlock(&m->mu);
}

void gw_metrics_tokens(gw_metrics *m, uint32_t n, double gap_ms) {
    if (gap_ms < 0 || n == 0) return; /* the first chunk is time to first token, not a gap */
    pthread_mutex_lock(&m->mu);
    for (uint32_t i = 0; i < n; i++) observe(&m->c.itl, k_itl_bounds, ITL_BUCKETS, gap_ms / 1e3 / n);
    pthread_mutex_unlock(&m->mu);
}

void gw_metrics_forward(gw_metrics *m, gw_forward_kind kind, double seconds) {
    if ((unsigned)kind >= GW_FORWARD_COUNT) return;
    if (seconds < 0) seconds = 0; /* one monotonic clock: cannot happen, but a negative sum would be worse */
    pthread_mutex_lock(&m->mu);
    observe(&m->c.forward[kind], k_fwd_bounds, FWD_BUCKETS, seconds);
    pthread_mutex_unlock(&m->mu);
}

void gw_metrics_choice(gw_metrics *m, const gw_choice *c, double t_start_ms) {
    int fin = c->status != SD_OK ? (c->code == SPECD__CODE__CODE_CANCELLED ? FIN_CANCELLED : FIN_ERROR)
              : c->stop_reason == SPECD__STOP_REASON__STOP_REASON_CANCELLED ? FIN_CANCELLED
              : !strcmp(gw_finish_reason(c), "length")                      ? FIN_LENGTH
                                                                            : FIN_STOP;
    double now = gw_now_ms();
    pthread_mutex_lock(&m->mu);
    m->c.finished[fin]++;
    m->c.prompt_tokens += c->prompt_tokens;
    m->c.generation_tokens += c->n_tokens;
    m->c.drafted += c->stats.drafted;
    m->c.accepted += c->stats.accepted;
    if (c->t_first_ms > 0) observe(&m->c.ttft, k_lat_bounds, LAT_BUCKETS, (c->t_first_ms - t_start_ms) / 1e3);
    if (fin == FIN_STOP || fin == FIN_LENGTH) observe(&m->c.e2e, k_lat_bounds, LAT_BUCKETS, (now - t_start_ms) / 1e3);
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ---- */

typedef struct outbuf {
    char *data;
    size_t len, cap;
    bool failed;
} outbuf;

static void out(outbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(outbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
}

static void head(outbuf *b, const char *name, const char *type, const char *help) {
    out(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram series; labels is "" or `key="value",` (with the comma). */
static void histogram_series(outbuf *b, const char *name, const char *labels, const histo *h, const double *bounds,
                             int n_bounds) {
    uint64_t cum = 0;
    for (int i = 0; i < n_bounds; i++) {
        cum += h->counts[i];
        out(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels, bounds[i], (unsigned long long)cum);
    }
    out(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->count);
    size_t n = strlen(labels);
    if (n == 0) {
        out(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
    } else { /* the labels without their trailing comma */
        out(b, "%s_sum{%.*s} %.9g\n%s_count{%.*s} %llu\n", name, (int)n - 1, labels, h->sum, name, (int)n - 1, labels,
            (unsigned long long)h->count);
    }
}

static void histogram(outbuf *b, const char *name, const char *help, const histo *h, const double *bounds,
                      int n_bounds) {
    head(b, name, "histogram", help);
    histogram_series(b, name, "", h, bounds, n_bounds);
}

/* A label value with \, " and newline escaped. */
static void label_value(char *dst, size_t n, const char *s) {
    size_t o = 0;
    for (; *s && o + 3 < n; s++) {
        if (*s == '\\' || *s == '"')
            dst[o++] = '\\', dst[o++] = *s;
        else if (*s == '\n')
            dst[o++] = '\\', dst[o++] = 'n';
        else
            dst[o++] = *s;
    }
    dst[o] = '\0';
}

static const char *role_name(Specd__Role r) {
    switch (r) {
    case SPECD__ROLE__ROLE_VERIFIER: return "verifier";
    case SPECD__ROLE__ROLE_DRAFTER: return "drafter";
    case SPECD__ROLE__ROLE_CLIENT: return "client";
    default: return "unknown";
    }
}

/* The verifiers' prefix caches (kv.h), per group leader and overall. */
static void prefix_cache_metrics(outbuf *b, const sd_client_service_stats *st) {
    static const char *const names[4] = {"specd_prefix_cache_query_tokens_total", "specd_prefix_cache_hit_tokens_total",
                                         "specd_prefix_cache_evicted_blocks_total", "specd_prefix_cache_blocks"};
    static const char *const help[4] = {"Prompt tokens looked up in the verifier group's prefix cache.",
                                        "Prompt tokens found in the prefix cache (not computed).",
                                        "Cached KV blocks evicted for room or the cache's bound.",
                                        "KV blocks in the prefix cache now."};
    uint64_t query = 0, hit = 0;
    for (int k = 0; k < 4; k++) {
        head(b, names[k], k == 3 ? "gauge" : "counter", help[k]);
        for (size_t i = 0; i < st->n_workers; i++) {
            const sd_client_worker_info *w = &st->workers[i];
            if (w->role != SPECD__ROLE__ROLE_VERIFIER || w->rank != 0) continue;
            uint64_t v = k == 0   ? w->prefix_query_tokens
                         : k == 1 ? w->prefix_hit_tokens
                         : k == 2 ? w->prefix_blocks_evicted
                                  : w->prefix_blocks_cached;
            if (k == 0) query += v;
            if (k == 1) hit += v;
            out(b, "%s{group=\"%u\",worker=\"%llu\"} %llu\n", names[k], w->group_id, (unsigned long long)w->worker_id,
                (unsigned long long)v);
        }
    }
    head(b, "specd_prefix_cache_hit_ratio", "gauge",
         "Prompt tokens found in the prefix caches / looked up, all groups.");
    out(b, "specd_prefix_cache_hit_ratio %.6f\n", query ? (double)hit / (double)query : 0.0);
}

/* Speculative decoding as the coordinator counts it (vLLM's names where it
 * has one: vllm:spec_decode_num_drafts, _num_draft_tokens,
 * _num_accepted_tokens, _num_accepted_tokens_per_pos). Rates come from the
 * counters: acceptance at position i = accepted_per_pos / draft_per_pos,
 * mean accepted length = accepted / drafts, goodput = committed tokens /
 * verify steps; the two gauges are those ratios since the coordinator
 * started. */
static void spec_decode_metrics(outbuf *b, const sd_client_service_stats *st) {
    head(b, "specd_spec_decode_verify_steps_total", "counter",
         "Sequence verify steps: one sequence's part in a verify step after its prefill (commits 1 + accepted "
         "tokens).");
    out(b, "specd_spec_decode_verify_steps_total %llu\n", (unsigned long long)st->seq_verify_steps);
    head(b, "specd_verify_batches_total", "counter", "Verify steps sent to verifier groups (prefill-only left out).");
    out(b, "specd_verify_batches_total %llu\n", (unsigned long long)st->verify_batches);
    head(b, "specd_spec_decode_num_drafts_total", "counter", "Sequence verify steps with at least one draft token.");
    out(b, "specd_spec_decode_num_drafts_total %llu\n", (unsigned long long)st->drafts);
    head(b, "specd_spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.");
    out(b, "specd_spec_decode_num_draft_tokens_total %llu\n", (unsigned long long)st->draft_tokens);
    head(b, "specd_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.");
    out(b, "specd_spec_decode_num_accepted_tokens_total %llu\n", (unsigned long long)st->accepted_tokens);
    head(b, "specd_spec_decode_num_draft_tokens_per_pos_total", "counter",
         "Draft tokens verified at each draft position (0-based).");
    for (size_t i = 0; i < st->n_positions; i++)
        out(b, "specd_spec_decode_num_draft_tokens_per_pos_total{position=\"%zu\"} %llu\n", i,
            (unsigned long long)st->draft_tokens_per_pos[i]);
    head(b, "specd_spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Draft tokens accepted at each draft position (0-based; non-increasing in the position).");
    for (size_t i = 0; i < st->n_positions; i++)
        out(b, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"%zu\"} %llu\n", i,
            (unsigned long long)st->accepted_tokens_per_pos[i]);
    head(b, "specd_spec_decode_mean_accepted_length", "gauge",
         "Accepted draft tokens per sequence verify step with drafts, since the coordinator started.");
    out(b, "specd_spec_decode_mean_accepted_length %.9g\n",
        st->drafts ? (double)st->accepted_tokens / (double)st->drafts : 0.0);
    head(b, "specd_spec_decode_goodput", "gauge",
         "Committed tokens per sequence verify step, since the coordinator started.");
    out(b, "specd_spec_decode_goodput %.9g\n",
        st->seq_verify_steps ? (double)st->committed_tokens / (double)st->seq_verify_steps : 0.0);
}

static void coordinator_metrics(outbuf *b, const sd_client_service_stats *st) {
    head(b, "specd_num_requests_running", "gauge", "Requests admitted by the coordinator and not finished.");
    out(b, "specd_num_requests_running %u\n", st->active_requests);
    head(b, "specd_num_requests_waiting", "gauge", "Requests queued at the coordinator.");
    out(b, "specd_num_requests_waiting %u\n", st->queued_requests);
    head(b, "specd_coordinator_finished_requests_total", "counter", "Requests the coordinator finished.");
    out(b, "specd_coordinator_finished_requests_total %llu\n", (unsigned long long)st->finished_requests);
    head(b, "specd_coordinator_committed_tokens_total", "counter", "Tokens the coordinator committed.");
    out(b, "specd_coordinator_committed_tokens_total %llu\n", (unsigned long long)st->committed_tokens);
    head(b, "specd_step_overhead_seconds", "gauge",
         "Coordinator time from a verify reply to the next verify request (recent window).");
    out(b, "specd_step_overhead_seconds{quantile=\"0.5\"} %.9g\n", st->step_overhead_p50_us / 1e6);
    out(b, "specd_step_overhead_seconds{quantile=\"0.99\"} %.9g\n", st->step_overhead_p99_us / 1e6);
    head(b, "specd_draft_wait_seconds", "gauge", "Time a verify step was held for drafts (recent window).");
    out(b, "specd_draft_wait_seconds{stat=\"mean\"} %.9g\n", st->draft_wait_mean_us / 1e6);
    out(b, "specd_draft_wait_seconds{stat=\"p99\"} %.9g\n", st->draft_wait_p99_us / 1e6);
    head(b, "specd_draft_wait_share", "gauge", "Share of verify steps held for drafts (0..1).");
    out(b, "specd_draft_wait_share %.9g\n", st->draft_wait_share);

    spec_decode_metrics(b, st);

    /* Every per-worker series carries worker="ID", the coordinator's id of
     * the registration: a dead worker stays listed (up 0) beside the one
     * that replaced it, with the same role, rank and (without
     * --stats-names) name, and two series may not share all their labels. */
    head(b, "specd_worker_up", "gauge", "1 while the worker is registered and alive.");
    for (size_t i = 0; i < st->n_workers; i++) {
        char name[300];
        label_value(name, sizeof name, st->workers[i].name);
        out(b, "specd_worker_up{role=\"%s\",rank=\"%u\",name=\"%s\",worker=\"%llu\"} %d\n",
            role_name(st->workers[i].role), st->workers[i].rank, name, (unsigned long long)st->workers[i].worker_id,
            st->workers[i].alive ? 1 : 0);
    }
    static const char *const kv_names[4] = {"specd_worker_kv_blocks_total", "specd_worker_kv_blocks_free",
                                            "specd_worker_kv_blocks_used", "specd_worker_sequences"};
    static const char *const kv_help[4] = {"KV cache blocks of the worker.", "Free KV cache blocks of the worker.",
                                           "Used KV cache blocks of the worker.", "Sequences the worker holds."};
    for (int k = 0; k < 4; k++) {
        head(b, kv_names[k], "gauge", kv_help[k]);
        for (size_t i = 0; i < st->n_workers; i++) {
            const sd_client_worker_info *w = &st->workers[i];
            uint32_t v = k == 0   ? w->kv_blocks_total
                         : k == 1 ? w->kv_blocks_free
                         : k == 2 ? w->kv_blocks_total - (w->kv_blocks_free < w->kv_blocks_total ? w->kv_blocks_free
                                                                                                 : w->kv_blocks_total)
                                  : w->n_sequences;
            out(b, "%s{role=\"%s\",rank=\"%u\",worker=\"%llu\"} %u\n", kv_names[k], role_name(w->role), w->rank,
                (unsigned long long)w->worker_id, v);
        }
    }
    prefix_cache_metrics(b, st);
    head(b, "specd_worker_steps_total", "counter", "Forward steps the worker ran.");
    for (size_t i = 0; i < st->n_workers; i++)
        out(b, "specd_worker_steps_total{role=\"%s\",rank=\"%u\",worker=\"%llu\"} %llu\n",
            role_name(st->workers[i].role), st->workers[i].rank, (unsigned long long)st->workers[i].worker_id,
            (unsigned long long)st->workers[i].steps);
    /* routing: per verifier group and per drafter, labelled by name (the
     * series above are by role and rank, which several groups share) */
    static const char *const r_names[5] = {"specd_worker_active_requests", "specd_worker_served_requests_total",
                                           "specd_worker_drafted_total", "specd_worker_accepted_total",
                                           "specd_worker_step_us"};
    static const char *const r_types[5] = {"gauge", "counter", "counter", "counter", "gauge"};
    static const char *const r_help[5] = {
        "Requests placed on the verifier group or drafter now.",
        "Requests placed on the verifier group or drafter since it registered.",
        "Draft tokens verified (a drafter's own, or all a group verified).", "Of those, accepted.",
        "Verifier group: modelled 64-token verify step; drafter: draft round trip (microseconds)."};
    for (int k = 0; k < 5; k++) {
        head(b, r_names[k], r_types[k], r_help[k]);
        for (size_t i = 0; i < st->n_workers; i++) {
            const sd_client_worker_info *w = &st->workers[i];
            char name[300];
            label_value(name, sizeof name, w->name);
            double v = k == 0   ? w->active_requests
                       : k == 1 ? (double)w->served_requests
                       : k == 2 ? (double)w->drafted
                       : k == 3 ? (double)w->accepted
                                : w->step_us;
            out(b, "%s{role=\"%s\",name=\"%s\",group=\"%u\",worker=\"%llu\"} %.17g\n", r_names[k], role_name(w->role),
                name, w->group_id, (unsigned long long)w->worker_id, v);
        }
    }
}

char *gw_metrics_render(gw_metrics *m, const gw_server *srv, const sd_client_service_stats *st) {
    outbuf b = {malloc(16384), 0, 16384, false};
    if (!b.data) return NULL;
    b.data[0] = '\0';
    pthread_mutex_lock(&m->mu);
    counters snap = m->c;
    pthread_mutex_unlock(&m->mu);

    head(&b, "specd_gateway_http_requests_total", "counter", "HTTP responses by route and status code.");
    for (int r = 0; r < GW_ROUTE_COUNT; r++)
        for (int k = 0; k < N_CODES; k++)
            if (snap.http[r][k]) {
                char code[16];
                if (k_codes[k])
                    snprintf(code, sizeof code, "%d", k_codes[k]);
                else
                    snprintf(code, sizeof code, "other");
                out(&b, "specd_gateway_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n", k_routes[r], code,
                    (unsigned long long)snap.http[r][k]);
            }
    head(&b, "specd_request_finished_total", "counter",
         "Generation requests (one per choice) finished, by finish reason.");
    for (int f = 0; f < FIN_COUNT; f++)
        out(&b, "specd_request_finished_total{finished_reason=\"%s\"} %llu\n", k_finish[f],
            (unsigned long long)snap.finished[f]);
    head(&b, "specd_gateway_requests_running", "gauge", "Requests this gateway has in flight at the coordinator.");
    out(&b, "specd_gateway_requests_running %u\n", atomic_load(&srv->inflight));
    head(&b, "specd_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    out(&b, "specd_prompt_tokens_total %llu\n", (unsigned long long)snap.prompt_tokens);
    head(&b, "specd_generation_tokens_total", "counter", "Generated tokens of finished requests.");
    out(&b, "specd_generation_tokens_total %llu\n", (unsigned long long)snap.generation_tokens);
    head(&b, "specd_gateway_draft_tokens_total", "counter",
         "Draft tokens verified for requests this gateway finished.");
    out(&b, "specd_gateway_draft_tokens_total %llu\n", (unsigned long long)snap.drafted);
    head(&b, "specd_gateway_accepted_tokens_total", "counter",
         "Draft tokens accepted for requests this gateway finished.");
    out(&b, "specd_gateway_accepted_tokens_total %llu\n", (unsigned long long)snap.accepted);
    histogram(&b, "specd_time_to_first_token_seconds", "Request received to first token, at the gateway.", &snap.ttft,
              k_lat_bounds, LAT_BUCKETS);
    histogram(&b, "specd_inter_token_latency_seconds", "Time between tokens, at the gateway.", &snap.itl, k_itl_bounds,
              ITL_BUCKETS);
    histogram(&b, "specd_e2e_request_latency_seconds", "Request received to last token, at the gateway.", &snap.e2e,
              k_lat_bounds, LAT_BUCKETS);
    head(&b, "specd_gateway_forward_seconds", "histogram",
         "Time inside the gateway: response=\"stream\": from the arrival of the oldest token chunk an SSE delta "
         "event carries to its bytes handed to the HTTP library; response=\"whole\": from a request's last "
         "chunk to its response queued.");
    for (int k = 0; k < GW_FORWARD_COUNT; k++) {
        char labels[64];
        snprintf(labels, sizeof labels, "response=\"%s\",", k_fwd_kinds[k]);
        histogram_series(&b, "specd_gateway_forward_seconds", labels, &snap.forward[k], k_fwd_bounds, FWD_BUCKETS);
    }

    head(&b, "specd_coordinator_up", "gauge", "1 when the coordinator answered the stats query of this scrape.");
    out(&b, "specd_coordinator_up %d\n", st ? 1 : 0);
    if (st) coordinator_metrics(&b, st);
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}
