/* bench_http.c — `specd-bench http`: what the HTTP gateway adds to latency,
 * against the same load sent through libspecd-client directly.
 *
 * The service runs already (specd-launch starts the gateway by default).
 * For each concurrency (default 1, 8, 64) it runs rounds of that many
 * concurrent streaming chat requests, greedy, EOS ignored, -n new tokens,
 * alternately through HTTP (POST /v1/chat/completions with "stream": true,
 * many transfers on one libcurl multi handle, one thread) and through
 * libspecd-client (one connection, the chunk callback), in ABBA order, both
 * rounds of a pair sending the same prompts. Measured per request:
 *   - time to first token: submit to the first event that carries text;
 *   - inter-event gaps: between successive events that carry text (an
 *     event is one committed chunk: a verify step's accepted tokens; the
 *     gateway writes one SSE event per chunk, the client library calls back
 *     once per chunk), reported as p50 / p99, with events per request.
 * The gateway's cost is the difference of the medians of the two paths in
 * the same run (HTTP parsing, JSON, SSE framing, one more process hop);
 * the target is p50 added <= 100 µs. At 8 and 64 streams the gaps are
 * set by the verifier's batch step (tens to hundreds of ms) and that
 * difference moves by ±0.4 ms from round to round, so the gateway also
 * times its own forwarding: the histogram specd_gateway_forward_seconds
 * {response="stream"} on its /metrics (an SSE text event, from the arrival
 * of the oldest chunk it carries to its bytes handed to libmicrohttpd).
 * /metrics is scraped before and after every measured HTTP round; the
 * differences of the kept rounds are summed and their p50 / p99 printed,
 * interpolated linearly inside a bucket (bench_prom.c; buckets 5 µs ..
 * 50 ms in 1-2-5 steps, so a quantile is exact only to its bucket). Other
 * users of the same gateway during the run would be counted too.
 * Hygiene (bench_hygiene.h): each round is sampled for the CPU time of
 * processes other than this one and the service's (named "specd-*"); a
 * pair with a round over --max-other-load cores is left out while clean
 * pairs remain, and the table says how many.
 * Rejected: a Python load generator (its own interpreter overhead is of
 * the order of what is measured); counting per-token gaps (a chunk of k
 * tokens arrives at once on both paths, so per-token figures only divide
 * the same gap by k). */
#include "bench_http.h"
#include "bench_hygiene.h"
#include "bench_prom.h"
#include "bench_prompts.h"
#include "bench_stats.h"

#include "specd/cli.h"
#include "specd/client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PROMPTS 256
#define MAX_CONC    256
#define MAX_ROUNDS  100
#define SSE_MAX     (64 * 1024) /* one SSE event at most (a chunk's JSON) */
#define METRICS_MAX (8u << 20)  /* one /metrics body at most */
#define FWD_METRIC  "specd_gateway_forward_seconds"
#define FWD_LABELS  "response=\"stream\""

typedef struct lat_set {
    double *v;
    size_t n, cap;
} lat_set;

static void lat_push(lat_set *s, double x) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 256;
        double *p = realloc(s->v, nc * sizeof *p);
        if (!p) return;
        s->v = p, s->cap = nc;
    }
    s->v[s->n++] = x;
}

static double lat_pct(lat_set *s, double p) {
    if (!s->n) return 0;
    qsort(s->v, s->n, sizeof *s->v, sd_bench_cmp_double);
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i < s->n ? i : s->n - 1];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One request's timing, on either path. */
typedef struct req_time {
    pthread_mutex_t mu;
    double t_submit, t_last; /* t_last 0 before the first text */
    lat_set gaps;            /* ms */
    double ttft_ms;          /* -1 before the first text */
    int events;
    bool failed;
    /* HTTP only: the bytes of the event being received */
    char *buf;
    size_t len;
} req_time;

static void req_event(req_time *r) {
    double t = now_s();
    pthread_mutex_lock(&r->mu);
    if (r->t_last > 0)
        lat_push(&r->gaps, (t - r->t_last) * 1e3);
    else
        r->ttft_ms = (t - r->t_submit) * 1e3;
    r->t_last = t;
    r->events++;
    pthread_mutex_unlock(&r->mu);
}

/* ---- HTTP path ---- */

/* One SSE event's data (without "data: "): text events count. */
static void sse_event(req_time *r, const char *data) {
    if (strcmp(data, "[DONE]") == 0) return;
    cJSON *j = cJSON_Parse(data);
    if (!j) {
        r->failed = true;
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(j, "error")) r->failed = true;
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *delta = ch ? cJSON_GetObjectItemCaseSensitive(ch, "delta") : NULL;
    const cJSON *content = delta ? cJSON_GetObjectItemCaseSensitive(delta, "content") : NULL;
    if (cJSON_IsString(content) && content->valuestring[0]) req_event(r);
    cJSON_Delete(j);
}

static size_t on_http_bytes(char *p, size_t size, size_t n, void *user) {
    req_time *r = user;
    size_t bytes = size * n;
    for (size_t i = 0; i < bytes; i++) {
        if (r->len + 1 >= SSE_MAX) {
            r->failed = true;
            return 0; /* aborts the transfer */
        }
        r->buf[r->len++] = p[i];
        if (r->len >= 2 && r->buf[r->len - 1] == '\n' && r->buf[r->len - 2] == '\n') {
            r->buf[r->len - 2] = 0;
            if (strncmp(r->buf, "data: ", 6) == 0) sse_event(r, r->buf + 6);
            r->len = 0;
        }
    }
    return bytes;
}

typedef struct http_cfg {
    const char *url, *api_key;
    int tokens;
} http_cfg;

static CURL *http_request(const http_cfg *cfg, const char *prompt, req_time *r, struct curl_slist *hdrs,
                          char **body_out) {
    cJSON *root = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(root, "messages");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt);
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(root, "model", "specd");
    cJSON_AddNumberToObject(root, "max_tokens", cfg->tokens);
    cJSON_AddNumberToObject(root, "temperature", 0);
    cJSON_AddBoolToObject(root, "stream", true);
    cJSON_AddBoolToObject(root, "ignore_eos", true);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    CURL *e = body ? curl_easy_init() : NULL;
    if (!e) {
        free(body);
        return NULL;
    }
    curl_easy_setopt(e, CURLOPT_URL, cfg->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_http_bytes);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 600L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    *body_out = body;
    return e;
}

/* conc streaming requests at once on one multi handle; false if any failed. */
static bool http_round(const http_cfg *cfg, char **prompts, int n_prompts, int first, int conc, req_time *reqs) {
    CURLM *multi = curl_multi_init();
    CURL *easy[MAX_CONC] = {0};
    char *bodies[MAX_CONC] = {0};
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    char auth[512];
    if (cfg->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", cfg->api_key);
        hdrs = curl_slist_append(hdrs, auth);
    }
    bool ok = multi && hdrs;
    for (int i = 0; ok && i < conc; i++) {
        reqs[i].t_submit = now_s();
        easy[i] = http_request(cfg, prompts[(first + i) % n_prompts], &reqs[i], hdrs, &bodies[i]);
        ok = easy[i] && curl_multi_add_handle(multi, easy[i]) == CURLM_OK;
    }
    int running = 1;
    while (ok && running) {
        if (curl_multi_perform(multi, &running) != CURLM_OK) break;
        if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    CURLMsg *msg;
    int left;
    while (multi && (msg = curl_multi_info_read(multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        req_time *r = NULL;
        long code = 0;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
        if (r && (msg->data.result != CURLE_OK || code != 200)) r->failed = true;
    }
    for (int i = 0; i < conc; i++) {
        if (easy[i]) {
            curl_multi_remove_handle(multi, easy[i]);
            curl_easy_cleanup(easy[i]);
        }
        free(bodies[i]);
        ok = ok && !reqs[i].failed && reqs[i].events > 0;
    }
    curl_slist_free_all(hdrs);
    if (multi) curl_multi_cleanup(multi);
    return ok;
}

/* ---- the gateway's own forwarding time ---- */

typedef struct body_buf {
    char *data;
    size_t len, cap;
} body_buf;

static size_t on_metrics_bytes(char *p, size_t size, size_t n, void *user) {
    body_buf *b = user;
    size_t bytes = size * n;
    if (b->len + bytes + 1 > METRICS_MAX) return 0; /* aborts the transfer */
    if (b->len + bytes + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + bytes + 1) cap *= 2;
        char *q = realloc(b->data, cap);
        if (!q) return 0;
        b->data = q, b->cap = cap;
    }
    memcpy(b->data + b->len, p, bytes);
    b->len += bytes;
    b->data[b->len] = '\0';
    return bytes;
}

/* GET gateway/metrics and read the streamed events' forwarding histogram.
 * False, with why in err, when the gateway does not answer or has no such
 * series (an older gateway). */
static bool scrape_forward(const char *gateway, const char *api_key, sd_prom_histo *h, char *err, size_t err_len) {
    char url[512], auth[512];
    snprintf(url, sizeof url, "%s/metrics", gateway);
    body_buf b = {0};
    CURL *e = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    if (api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        hdrs = curl_slist_append(NULL, auth);
    }
    long code = 0;
    bool ok = e != NULL;
    if (ok) {
        curl_easy_setopt(e, CURLOPT_URL, url);
        if (hdrs) curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_metrics_bytes);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
        ok = curl_easy_perform(e) == CURLE_OK && curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK &&
             code == 200 && b.data;
    }
    if (!ok)
        snprintf(err, err_len, "%.200s: no answer (HTTP %ld)", url, code);
    else
        ok = sd_prom_histo_parse(b.data, FWD_METRIC, FWD_LABELS, h, err, err_len);
    if (e) curl_easy_cleanup(e);
    curl_slist_free_all(hdrs);
    free(b.data);
    return ok;
}

/* "p50 / p99 µs (n = N)" of h, or "n/a". */
static void forward_cell(char *dst, size_t n, const sd_prom_histo *h, bool have) {
    if (!have || h->count <= 0) {
        snprintf(dst, n, "n/a");
        return;
    }
    bool beyond50, beyond99;
    double p50 = sd_prom_histo_quantile(h, 0.5, &beyond50), p99 = sd_prom_histo_quantile(h, 0.99, &beyond99);
    snprintf(dst, n, "%s%.1f / %s%.1f µs (n = %.0f)", beyond50 ? ">" : "", p50 * 1e6, beyond99 ? ">" : "", p99 * 1e6,
             h->count);
}

/* ---- direct path ---- */

static void on_chunk(const sd_client_chunk *ch, void *user) {
    if (ch->n_ids > 0) req_event(user);
}

static bool direct_round(sd_client *c, char **prompts, int n_prompts, int first, int conc, int tokens, req_time *reqs) {
    uint64_t ids[MAX_CONC];
    bool ok = true, sent[MAX_CONC] = {0};
    for (int i = 0; i < conc; i++) {
        sd_client_request q = sd_client_default_request();
        q.prompt = prompts[(first + i) % n_prompts];
        q.chat = true;
        q.max_tokens = (uint32_t)tokens;
        q.ignore_eos = true;
        reqs[i].t_submit = now_s();
        sent[i] = sd_client_submit(c, &q, on_chunk, &reqs[i], &ids[i]) == SD_OK;
        ok &= sent[i];
    }
    for (int i = 0; i < conc; i++) {
        if (!sent[i]) continue;
        sd_client_result res = {0};
        if (sd_client_wait(c, ids[i], 600000, &res) != SD_OK || res.status != SD_OK) ok = false;
        sd_client_result_clear(&res);
    }
    return ok;
}

/* ---- rounds and the table ---- */

typedef struct path_tally {
    lat_set ttft[MAX_ROUNDS], gaps[MAX_ROUNDS]; /* per measured round, pooled over the kept ones */
    double events[MAX_ROUNDS], requests[MAX_ROUNDS];
    double other[MAX_ROUNDS];
    /* HTTP only: the gateway's forwarding histogram over each round */
    sd_prom_histo fwd[MAX_ROUNDS];
    bool fwd_ok[MAX_ROUNDS];
    char fwd_err[256]; /* why the last scrape failed */
} path_tally;

typedef struct http_opts {
    const char *gateway, *addr, *prompts_path, *out_path, *api_key;
    char conc_list[128];
    int tokens, rounds, warmup;
    sd_hyg_params hyg;
} http_opts;

/* One round on one path; its requests' figures go to t when measured. */
static bool run_round(int path, const http_opts *o, sd_client *c, char **prompts, int n_prompts, int first, int conc,
                      path_tally *t, int round, bool measured) {
    req_time *reqs = calloc((size_t)conc, sizeof *reqs);
    if (!reqs) return false;
    for (int i = 0; i < conc; i++) {
        pthread_mutex_init(&reqs[i].mu, NULL);
        reqs[i].ttft_ms = -1;
        reqs[i].buf = path == 0 ? malloc(SSE_MAX) : NULL;
    }
    char url[512];
    snprintf(url, sizeof url, "%s/v1/chat/completions", o->gateway);
    http_cfg cfg = {url, o->api_key, o->tokens};
    bool scrape = path == 0 && measured && round < MAX_ROUNDS;
    sd_prom_histo fwd0;
    bool fwd_ok = scrape && scrape_forward(o->gateway, o->api_key, &fwd0, t->fwd_err, sizeof t->fwd_err);
    sd_hyg_mark h0 = sd_hyg_now(&o->hyg);
    bool ok = path == 0 ? http_round(&cfg, prompts, n_prompts, first, conc, reqs)
                        : direct_round(c, prompts, n_prompts, first, conc, o->tokens, reqs);
    sd_hyg_mark h1 = sd_hyg_now(&o->hyg);
    if (fwd_ok) {
        sd_prom_histo fwd1;
        t->fwd_ok[round] = scrape_forward(o->gateway, o->api_key, &fwd1, t->fwd_err, sizeof t->fwd_err);
        if (t->fwd_ok[round] && !sd_prom_histo_diff(&fwd1, &fwd0, &t->fwd[round])) {
            t->fwd_ok[round] = false;
            snprintf(t->fwd_err, sizeof t->fwd_err, "%s went down during a round (a gateway restart?)", FWD_METRIC);
        }
    }
    for (int i = 0; i < conc; i++) {
        pthread_mutex_lock(&reqs[i].mu);
        if (measured && round < MAX_ROUNDS) {
            if (reqs[i].ttft_ms >= 0) lat_push(&t->ttft[round], reqs[i].ttft_ms);
            for (size_t k = 0; k < reqs[i].gaps.n; k++) lat_push(&t->gaps[round], reqs[i].gaps.v[k]);
            t->events[round] += reqs[i].events;
            t->requests[round] += 1;
        }
        pthread_mutex_unlock(&reqs[i].mu);
        pthread_mutex_destroy(&reqs[i].mu);
        free(reqs[i].gaps.v);
        free(reqs[i].buf);
    }
    free(reqs);
    if (measured && round < MAX_ROUNDS) t->other[round] = sd_hyg_other_cores(&h0, &h1);
    return ok;
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd-bench http [--gateway URL] [--coordinator ADDR] [--prompts FILE] [--conc 1,8,64]\n"
               "                       [-n TOKENS] [--rounds R] [--warmup W] [--api-key KEY]\n"
               "                       [--max-other-load CORES] [-o OUT.md]\n"
               "Start the service first (specd-launch --target ... --ngram; the gateway is on by default).\n"
               "Each concurrency runs R rounds through HTTP and R through libspecd-client, alternating.\n"
               "Besides the end-to-end difference (\"added by the gateway\"), the HTTP row gives the gateway's own\n"
               "forwarding time per SSE text event, p50 / p99, from specd_gateway_forward_seconds on its /metrics\n"
               "(scraped before and after each HTTP round; interpolated inside the histogram's buckets).\n"
               "  --gateway URL       the gateway (default http://127.0.0.1:8000)\n"
               "  --coordinator ADDR  the coordinator's client address (default tcp://127.0.0.1:7700)\n"
               "  --prompts FILE      one prompt per line (\\n a newline, # lines skipped), sent as chat turns\n"
               "                      (default bench/prompts/chat.txt)\n"
               "  --conc LIST         concurrencies (default 1,8,64)\n"
               "  -n TOKENS           new tokens per request (default 64; EOS ignored)\n"
               "  --rounds R          rounds per path and concurrency (default 4)\n"
               "  --warmup W          unmeasured rounds per path before them (default 1)\n"
               "  --api-key KEY       sent as a Bearer token (a gateway started with --api-key)\n"
               "  --max-other-load C  leave out pairs of rounds during which processes other than the\n"
               "                      service's (specd-*) used more than C cores (default 0.25)\n"
               "  -o FILE             also write the markdown table to FILE\n");
}

static int parse_http_opts(int argc, char **argv, http_opts *o) {
    *o = (http_opts){.gateway = "http://127.0.0.1:8000",
                     .addr = "tcp://127.0.0.1:7700",
                     .prompts_path = "bench/prompts/chat.txt",
                     .conc_list = "1,8,64",
                     .tokens = 64,
                     .rounds = 4,
                     .warmup = 1,
                     .hyg = sd_hyg_default_params()};
    o->hyg.exclude_prefix = "specd-";
    static const struct option longs[] = {{"gateway", required_argument, 0, 'g'},
                                          {"coordinator", required_argument, 0, 'c'},
                                          {"prompts", required_argument, 0, 'p'},
                                          {"conc", required_argument, 0, 'C'},
                                          {"rounds", required_argument, 0, 'r'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {"api-key", required_argument, 0, 'k'},
                                          {"out", required_argument, 0, 'o'},
                                          {"max-other-load", required_argument, 0, 'X'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int ch;
    bool ok = true;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "n:o:h", longs, NULL)) != -1) {
        switch (ch) {
        case 'g': o->gateway = optarg; break;
        case 'c': o->addr = optarg; break;
        case 'p': o->prompts_path = optarg; break;
        case 'C': snprintf(o->conc_list, sizeof o->conc_list, "%s", optarg); break;
        case 'r': ok &= sd_cli_parse_int(optarg, 1, MAX_ROUNDS, &o->rounds); break;
        case 'w': ok &= sd_cli_parse_int(optarg, 0, 10, &o->warmup); break;
        case 'n': ok &= sd_cli_parse_int(optarg, 1, 4096, &o->tokens); break;
        case 'k': o->api_key = optarg; break;
        case 'o': o->out_path = optarg; break;
        case 'X': ok &= sd_cli_parse_double(optarg, 1e-6, 1e6, &o->hyg.max_other_cores); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!ok || optind != argc) {
        fprintf(stderr,
                "specd-bench http: bad option value (-n in [1, 4096], --rounds in [1, %d], --warmup in "
                "[0, 10], --max-other-load > 0)\n",
                MAX_ROUNDS);
        return 2;
    }
    return -1;
}

static void write_row(FILE *out, const char *line) {
    printf("%s", line);
    fflush(stdout);
    if (out) fprintf(out, "%s", line);
}

static const char *const PATH_NAME[2] = {"HTTP (gateway)", "libspecd-client"};

static void tally_free(path_tally *t) {
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < MAX_ROUNDS; r++) {
            free(t[p].ttft[r].v);
            free(t[p].gaps[r].v);
        }
    free(t);
}

/* One concurrency: warm-up, then rounds pairs in ABBA order; one row per
 * path. False, with nothing printed, when a round failed: a service that
 * stopped answering gives no figures worth a row, and every later round
 * would only wait for it again. */
static bool run_conc(const http_opts *o, sd_client *c, char **prompts, int n_prompts, int conc, FILE *out) {
    path_tally *t = calloc(2, sizeof *t);
    if (!t) return false;
    int next = 0;
    for (int r = -o->warmup; r < o->rounds; r++) { /* r < 0: warm-up rounds, not measured */
        int first = r < 0 || r % 4 == 0 || r % 4 == 3 ? 0 : 1; /* ABBA */
        for (int k = 0; k < 2; k++) {
            int p = k == 0 ? first : 1 - first;
            if (!run_round(p, o, c, prompts, n_prompts, next, conc, &t[p], r < 0 ? 0 : r, r >= 0)) {
                fprintf(stderr, "specd-bench http: concurrency %d: %s round %d through %s failed\n", conc,
                        r < 0 ? "warm-up" : "measured", r < 0 ? r + o->warmup + 1 : r + 1, PATH_NAME[p]);
                tally_free(t);
                return false;
            }
        }
        if (r >= 0) next += conc;
    }
    bool keep[MAX_ROUNDS];
    int dirty = 0;
    for (int r = 0; r < o->rounds; r++) {
        keep[r] = sd_hyg_clean(&o->hyg, t[0].other[r]) && sd_hyg_clean(&o->hyg, t[1].other[r]);
        dirty += !keep[r];
    }
    if (dirty == o->rounds)
        for (int r = 0; r < o->rounds; r++) keep[r] = true; /* none clean: all, marked unreliable */
    double p50[2];
    sd_prom_histo fwd = {0};
    bool fwd_ok = true;
    for (int r = 0; r < o->rounds; r++)
        if (keep[r]) fwd_ok = fwd_ok && t[0].fwd_ok[r] && sd_prom_histo_add(&fwd, &t[0].fwd[r]);
    if (!fwd_ok)
        fprintf(stderr, "specd-bench http: concurrency %d: no forwarding time from the gateway (%s)\n", conc,
                t[0].fwd_err[0] ? t[0].fwd_err : "bucket bounds changed");
    for (int p = 0; p < 2; p++) {
        lat_set ttft = {0}, gaps = {0};
        double events = 0, requests = 0, other[MAX_ROUNDS], other_max = 0;
        for (int r = 0; r < o->rounds; r++) {
            other[r] = t[p].other[r];
            if (other[r] > other_max) other_max = other[r];
            if (keep[r]) {
                for (size_t k = 0; k < t[p].ttft[r].n; k++) lat_push(&ttft, t[p].ttft[r].v[k]);
                for (size_t k = 0; k < t[p].gaps[r].n; k++) lat_push(&gaps, t[p].gaps[r].v[k]);
                events += t[p].events[r];
                requests += t[p].requests[r];
            }
        }
        p50[p] = lat_pct(&gaps, 0.5);
        char added[64] = "", forward[96] = "";
        if (p == 1) snprintf(added, sizeof added, "%+.0f µs", (p50[0] - p50[1]) * 1e3);
        if (p == 0) forward_cell(forward, sizeof forward, &fwd, fwd_ok);
        char line[640];
        snprintf(line, sizeof line,
                 "| %d | %s | %.2f | %.2f | %.3f | %.3f | %.1f | %s | %s | %.2f / %.2f | %d of %d%s |\n", conc,
                 PATH_NAME[p], lat_pct(&ttft, 0.5), lat_pct(&ttft, 0.99), p50[p],
                 lat_pct(&gaps, 0.99), requests > 0 ? events / requests : 0, added, forward,
                 sd_bench_median(other, o->rounds), other_max, dirty, o->rounds,
                 dirty == o->rounds ? ", all kept: unreliable" : "");
        write_row(out, line);
        free(ttft.v);
        free(gaps.v);
    }
    tally_free(t);
    return true;
}

int bench_http_main(int argc, char **argv) {
    http_opts o;
    int prc = parse_http_opts(argc, argv, &o);
    if (prc >= 0) return prc;
    char *prompts[MAX_PROMPTS];
    int n_prompts = sd_bench_read_prompts(o.prompts_path, prompts, MAX_PROMPTS);
    if (n_prompts <= 0) {
        if (n_prompts == 0) fprintf(stderr, "specd-bench http: no prompts in %s\n", o.prompts_path);
        return 1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 1;
    int rc = 1;
    sd_client *c = NULL;
    sd_client_params cp = sd_client_default_params();
    cp.coordinator = o.addr;
    cp.name = "specd-bench";
    FILE *out = o.out_path ? fopen(o.out_path, "w") : NULL;
    if (o.out_path && !out) {
        fprintf(stderr, "specd-bench http: cannot write %s\n", o.out_path);
        goto done;
    }
    if (sd_client_connect(&cp, &c) != SD_OK) goto done;
    char cpus[256];
    sd_hyg_affinity_text(cpus, sizeof cpus);
    char head[2048];
    snprintf(head, sizeof head,
             "CPUs of specd-bench: %s. %d new tokens per request, greedy, chat prompts from %s.\n"
             "Forwarding inside the gateway: its " FWD_METRIC "{" FWD_LABELS "} histogram (oldest chunk of an\n"
             "SSE text event arrived -> its bytes handed to libmicrohttpd), the difference of /metrics scraped\n"
             "before and after each kept HTTP round; p50 / p99 interpolated linearly inside a bucket (bounds\n"
             "5 µs .. 50 ms in 1-2-5 steps), n = events timed.\n\n"
             "| concurrency | path | time to first token p50 ms | p99 ms | inter-event gap p50 ms | p99 ms | "
             "events / request | added by the gateway, p50 | forwarding inside the gateway, p50 / p99 | "
             "other CPU, cores: median / max | pairs over the limit |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
             cpus, o.tokens, o.prompts_path);
    write_row(out, head);
    for (char *tok = strtok(o.conc_list, ","); tok; tok = strtok(NULL, ",")) {
        int conc = atoi(tok);
        if (conc < 1 || conc > MAX_CONC) {
            fprintf(stderr, "specd-bench http: concurrency %s outside [1, %d]\n", tok, MAX_CONC);
            goto done;
        }
        if (!run_conc(&o, c, prompts, n_prompts, conc, out)) {
            fprintf(stderr, "specd-bench http: stopped: the service did not answer every request (is it still "
                            "running? the gateway at %s, the coordinator at %s)\n",
                    o.gateway, o.addr);
            goto done;
        }
    }
    rc = 0;
done:
    sd_client_close(&c);
    if (out) fclose(out);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    curl_global_cleanup();
    return rc;
}
