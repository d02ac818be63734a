/* test_gateway_metrics.c — the gateway's /metrics text (gateway/metrics.c)
 * from a made-up coordinator snapshot, without a server: the speculation
 * series (per draft position, the totals, the two ratio gauges), a dead
 * drafter listed beside the one that replaced it (same role, rank and
 * name) as two distinct series, every sample's name and labels unique,
 * every sample under a family declared before it, and the coordinator's
 * series left out when it did not answer; the forwarding histogram's
 * buckets, read back with specd-bench's reader (tools/bench_prom.c). The integration tests
 * (test_gateway_load.py, test_gateway_streams.py) parse the live output
 * with prometheus_client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_prom.h"
#include "gateway_impl.h"

/* metrics.c's one outside need from jobs.c */
double gw_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static sd_client_service_stats *snapshot(void) {
    sd_client_service_stats *st = calloc(1, sizeof *st);
    st->committed_tokens = 35;
    st->seq_verify_steps = 20;
    st->verify_batches = 6;
    st->drafts = 10;
    st->draft_tokens = 28;
    st->accepted_tokens = 9;
    st->n_positions = 4;
    const uint64_t d[4] = {10, 8, 6, 4}, a[4] = {5, 3, 1, 0};
    memcpy(st->draft_tokens_per_pos, d, sizeof d);
    memcpy(st->accepted_tokens_per_pos, a, sizeof a);
    st->n_workers = 3;
    st->workers[0] = (sd_client_worker_info){.role = SPECD__ROLE__ROLE_VERIFIER,
                                             .alive = true,
                                             .worker_id = 2,
                                             .kv_blocks_total = 100,
                                             .kv_blocks_free = 60,
                                             .group_id = 1,
                                             .prefix_query_tokens = 400,
                                             .prefix_hit_tokens = 300,
                                             .prefix_blocks_cached = 20,
                                             .prefix_blocks_evicted = 5};
    /* the killed drafter (kept for stats) and the one that replaced it */
    st->workers[1] = (sd_client_worker_info){.role = SPECD__ROLE__ROLE_DRAFTER, .alive = false, .worker_id = 1};
    st->workers[2] = (sd_client_worker_info){.role = SPECD__ROLE__ROLE_DRAFTER, .alive = true, .worker_id = 3};
    return st;
}

static char *render(const sd_client_service_stats *st) {
    gw_metrics *m = gw_metrics_create();
    assert_non_null(m);
    gw_server srv;
    memset(&srv, 0, sizeof srv);
    gw_metrics_http(m, GW_ROUTE_COUNT - 1, 200);
    char *text = gw_metrics_render(m, &srv, st);
    gw_metrics_destroy(&m);
    assert_non_null(text);
    return text;
}

static void has_line(const char *text, const char *line) {
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n') return;
    fail_msg("no line \"%s\" in:\n%s", line, text);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Exposition 0.0.4 as far as a scraper relies on it: each sample's series
 * (name and labels) appears once, and its name is a family declared by a
 * # TYPE line before it (histograms and summaries with their suffixes). */
static void check_exposition(const char *text) {
    char *copy = strdup(text), *save = NULL;
    char *series[1024], *families[256];
    int n_series = 0, n_fam = 0;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "# TYPE ", 7)) {
            assert_true(n_fam < 256);
            char *name = line + 7;
            *strchr(name, ' ') = '\0';
            families[n_fam++] = name;
            continue;
        }
        if (line[0] == '#') continue;
        char *sp = strrchr(line, ' ');
        assert_non_null(sp);
        *sp = '\0';
        assert_true(n_series < 1024);
        series[n_series++] = line;
        size_t len = strcspn(line, "{");
        bool declared = false;
        for (int f = 0; f < n_fam && !declared; f++) {
            size_t fl = strlen(families[f]);
            declared = fl <= len && !strncmp(line, families[f], fl) &&
                       (fl == len || !strncmp(line + fl, "_bucket", len - fl) ||
                        !strncmp(line + fl, "_sum", len - fl) || !strncmp(line + fl, "_count", len - fl));
        }
        if (!declared) fail_msg("sample %s has no # TYPE line before it", line);
    }
    qsort(series, (size_t)n_series, sizeof *series, cmp_str);
    for (int i = 1; i < n_series; i++)
        if (!strcmp(series[i - 1], series[i])) fail_msg("series %s appears twice", series[i]);
    free(copy);
}

static void test_speculation_series(void **state) {
    (void)state;
    sd_client_service_stats *st = snapshot();
    char *text = render(st);
    check_exposition(text);
    has_line(text, "specd_spec_decode_verify_steps_total 20");
    has_line(text, "specd_verify_batches_total 6");
    has_line(text, "specd_spec_decode_num_drafts_total 10");
    has_line(text, "specd_spec_decode_num_draft_tokens_total 28");
    has_line(text, "specd_spec_decode_num_accepted_tokens_total 9");
    has_line(text, "specd_spec_decode_num_draft_tokens_per_pos_total{position=\"0\"} 10");
    has_line(text, "specd_spec_decode_num_draft_tokens_per_pos_total{position=\"3\"} 4");
    has_line(text, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 3");
    has_line(text, "specd_spec_decode_num_accepted_tokens_per_pos_total{position=\"3\"} 0");
    assert_null(strstr(text, "position=\"4\""));
    has_line(text, "specd_spec_decode_mean_accepted_length 0.9");
    has_line(text, "specd_spec_decode_goodput 1.75");
    has_line(text, "# TYPE specd_spec_decode_num_accepted_tokens_per_pos_total counter");
    free(text);
    /* nothing verified yet: the ratios are 0, not NaN */
    memset(st, 0, sizeof *st);
    text = render(st);
    check_exposition(text);
    has_line(text, "specd_spec_decode_mean_accepted_length 0");
    has_line(text, "specd_spec_decode_goodput 0");
    free(text);
    free(st);
}

static void test_workers_distinct(void **state) {
    (void)state;
    sd_client_service_stats *st = snapshot();
    char *text = render(st);
    check_exposition(text);
    has_line(text, "specd_worker_up{role=\"drafter\",rank=\"0\",name=\"\",worker=\"1\"} 0");
    has_line(text, "specd_worker_up{role=\"drafter\",rank=\"0\",name=\"\",worker=\"3\"} 1");
    has_line(text, "specd_worker_up{role=\"verifier\",rank=\"0\",name=\"\",worker=\"2\"} 1");
    has_line(text, "specd_worker_kv_blocks_used{role=\"verifier\",rank=\"0\",worker=\"2\"} 40");
    has_line(text, "specd_worker_kv_blocks_free{role=\"verifier\",rank=\"0\",worker=\"2\"} 60");
    has_line(text, "specd_prefix_cache_hit_tokens_total{group=\"1\",worker=\"2\"} 300");
    has_line(text, "specd_prefix_cache_blocks{group=\"1\",worker=\"2\"} 20");
    has_line(text, "specd_prefix_cache_hit_ratio 0.750000");
    has_line(text, "specd_coordinator_up 1");
    free(text);
    free(st);
}

/* The forwarding histogram: a value on a bound counts in that bucket (le
 * is inclusive), one above 50 ms only in +Inf, the two kinds apart; read
 * back with specd-bench's reader, two renders apart give what was observed
 * between them and the quantiles of that. */
static void test_forward_histogram(void **state) {
    (void)state;
    gw_metrics *m = gw_metrics_create();
    assert_non_null(m);
    gw_server srv;
    memset(&srv, 0, sizeof srv);
    char *before = gw_metrics_render(m, &srv, NULL);
    assert_non_null(before);
    has_line(before, "specd_gateway_forward_seconds_count{response=\"stream\"} 0");
    gw_metrics_forward(m, GW_FORWARD_STREAM, 3e-6);
    gw_metrics_forward(m, GW_FORWARD_STREAM, 5e-6);
    gw_metrics_forward(m, GW_FORWARD_STREAM, 7e-5);
    gw_metrics_forward(m, GW_FORWARD_STREAM, 0.2);
    gw_metrics_forward(m, GW_FORWARD_WHOLE, 1e-3);
    char *text = gw_metrics_render(m, &srv, NULL);
    gw_metrics_destroy(&m);
    assert_non_null(text);
    check_exposition(text);
    has_line(text, "# TYPE specd_gateway_forward_seconds histogram");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"stream\",le=\"5e-06\"} 2");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"stream\",le=\"5e-05\"} 2");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"stream\",le=\"0.0001\"} 3");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"stream\",le=\"0.05\"} 3");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"stream\",le=\"+Inf\"} 4");
    has_line(text, "specd_gateway_forward_seconds_count{response=\"stream\"} 4");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"whole\",le=\"0.0005\"} 0");
    has_line(text, "specd_gateway_forward_seconds_bucket{response=\"whole\",le=\"0.001\"} 1");
    has_line(text, "specd_gateway_forward_seconds_count{response=\"whole\"} 1");

    sd_prom_histo h0, h1, d;
    char err[256];
    assert_true(
        sd_prom_histo_parse(before, "specd_gateway_forward_seconds", "response=\"stream\"", &h0, err, sizeof err));
    assert_true(
        sd_prom_histo_parse(text, "specd_gateway_forward_seconds", "response=\"stream\"", &h1, err, sizeof err));
    assert_int_equal(h1.n, 13);
    assert_true(sd_prom_histo_diff(&h1, &h0, &d));
    assert_true(d.count == 4 && fabs(d.sum - (3e-6 + 5e-6 + 7e-5 + 0.2)) < 1e-12);
    bool beyond = true;
    /* rank 2 of 4: the top of the first bucket, (0, 5 µs] holding 2 */
    assert_true(fabs(sd_prom_histo_quantile(&d, 0.5, &beyond) - 5e-6) < 1e-15);
    assert_false(beyond);
    /* rank 2.6: 0.6 into the one in (50, 100] µs */
    assert_true(fabs(sd_prom_histo_quantile(&d, 0.65, NULL) - 8e-5) < 1e-12);
    /* rank 3.96: in +Inf */
    assert_true(sd_prom_histo_quantile(&d, 0.99, &beyond) == 0.05);
    assert_true(beyond);
    free(before);
    free(text);
}

static void test_coordinator_down(void **state) {
    (void)state;
    char *text = render(NULL);
    check_exposition(text);
    has_line(text, "specd_coordinator_up 0");
    assert_null(strstr(text, "specd_spec_decode_verify_steps_total"));
    assert_null(strstr(text, "specd_worker_up"));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_speculation_series),
        cmocka_unit_test(test_workers_distinct),
        cmocka_unit_test(test_coordinator_down),
        cmocka_unit_test(test_forward_histogram),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
