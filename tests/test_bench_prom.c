/* test_bench_prom.c — the histogram reader of `specd-bench http`
 * (tools/bench_prom.c): the right series picked out of /metrics text by
 * its labels, the difference of two scrapes bucket by bucket, quantiles
 * interpolated inside a bucket as histogram_quantile does (worked by hand
 * below), the +Inf bucket reported as beyond the last bound, and every
 * malformed or inconsistent input refused with a reason. The gateway's
 * own output is read back with this code in test_gateway_metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bench_prom.h"

#define NAME "fwd_seconds"

/* A scrape: the stream series with cumulative counts a, b, c at le 1, 2, 4,
 * total `inf`, and a whole series and an unlabelled look-alike around it
 * that must not be read. */
static void scrape(char *dst, size_t n, int a, int b, int c, int inf, double sum) {
    snprintf(dst, n,
             "# HELP fwd_seconds x\n# TYPE fwd_seconds histogram\n"
             "fwd_seconds_bucket{response=\"whole\",le=\"1\"} 100\n"
             "fwd_seconds_bucket{response=\"whole\",le=\"2\"} 100\n"
             "fwd_seconds_bucket{response=\"whole\",le=\"4\"} 100\n"
             "fwd_seconds_bucket{response=\"whole\",le=\"+Inf\"} 100\n"
             "fwd_seconds_sum{response=\"whole\"} 7\nfwd_seconds_count{response=\"whole\"} 100\n"
             "fwd_seconds_bucket{response=\"stream\",le=\"1\"} %d\n"
             "fwd_seconds_bucket{response=\"stream\",le=\"2\"} %d\n"
             "fwd_seconds_bucket{response=\"stream\",le=\"4\"} %d\n"
             "fwd_seconds_bucket{response=\"stream\",le=\"+Inf\"} %d\n"
             "fwd_seconds_sum{response=\"stream\"} %.9g\nfwd_seconds_count{response=\"stream\"} %d\n"
             "fwd_seconds_more_bucket{response=\"stream\",le=\"1\"} 55\n"
             "other_total 3\n",
             a, b, c, inf, sum, inf);
}

static void test_parse_picks_series(void **state) {
    (void)state;
    char text[2048], err[256];
    sd_prom_histo h;
    scrape(text, sizeof text, 3, 5, 9, 10, 12.5);
    assert_true(sd_prom_histo_parse(text, NAME, "response=\"stream\"", &h, err, sizeof err));
    assert_int_equal(h.n, 3);
    assert_true(h.le[0] == 1 && h.le[1] == 2 && h.le[2] == 4);
    assert_true(h.cum[0] == 3 && h.cum[1] == 5 && h.cum[2] == 9);
    assert_true(h.count == 10 && h.sum == 12.5);
    assert_true(sd_prom_histo_parse(text, NAME, "response=\"whole\"", &h, err, sizeof err));
    assert_true(h.cum[0] == 100 && h.count == 100 && h.sum == 7);
    /* no such series: unlabelled, or another label value */
    assert_false(sd_prom_histo_parse(text, NAME, "", &h, err, sizeof err));
    assert_non_null(strstr(err, "missing"));
    assert_false(sd_prom_histo_parse(text, NAME, "response=\"other\"", &h, err, sizeof err));
    assert_false(sd_prom_histo_parse(text, "fwd", "response=\"stream\"", &h, err, sizeof err));
}

static void test_parse_refuses(void **state) {
    (void)state;
    char text[2048], err[256];
    sd_prom_histo h;
    /* a count that goes down from one bucket to the next */
    scrape(text, sizeof text, 6, 5, 9, 10, 1);
    assert_false(sd_prom_histo_parse(text, NAME, "response=\"stream\"", &h, err, sizeof err));
    assert_non_null(strstr(err, "decreasing"));
    /* a bucket above the total */
    scrape(text, sizeof text, 3, 5, 11, 10, 1);
    assert_false(sd_prom_histo_parse(text, NAME, "response=\"stream\"", &h, err, sizeof err));
    /* _count differing from the +Inf bucket */
    const char *bad_count = "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n";
    assert_false(sd_prom_histo_parse(bad_count, "h", "", &h, err, sizeof err));
    assert_non_null(strstr(err, "_count"));
    /* a value that is no number, a NaN, a bound out of order, no _sum */
    assert_false(sd_prom_histo_parse("h_bucket{le=\"1\"} x\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n", "h", "", &h,
                                     err, sizeof err));
    assert_false(sd_prom_histo_parse("h_bucket{le=\"1\"} NaN\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n", "h", "",
                                     &h, err, sizeof err));
    assert_false(sd_prom_histo_parse("h_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
                                     "h_sum 1\nh_count 2\n",
                                     "h", "", &h, err, sizeof err));
    assert_false(sd_prom_histo_parse("h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n", "h", "", &h, err,
                                     sizeof err));
    /* the unlabelled form reads */
    assert_true(sd_prom_histo_parse("h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1.5\nh_count 2\n", "h", "",
                                    &h, err, sizeof err));
    assert_true(h.n == 1 && h.count == 2 && h.sum == 1.5);
}

/* Two scrapes 10 events apart: 0 in (0, 1], 8 in (1, 2], 2 in (2, 4]. */
static void test_diff_and_quantiles(void **state) {
    (void)state;
    char text[2048], err[256];
    sd_prom_histo before, after, d;
    scrape(text, sizeof text, 3, 5, 9, 10, 12.5);
    assert_true(sd_prom_histo_parse(text, NAME, "response=\"stream\"", &before, err, sizeof err));
    scrape(text, sizeof text, 3, 13, 19, 20, 27.5);
    assert_true(sd_prom_histo_parse(text, NAME, "response=\"stream\"", &after, err, sizeof err));
    assert_true(sd_prom_histo_diff(&after, &before, &d));
    assert_true(d.cum[0] == 0 && d.cum[1] == 8 && d.cum[2] == 10 && d.count == 10 && d.sum == 15);
    bool beyond = true;
    /* p50: rank 5 of the 8 in (1, 2] -> 1 + 1 * 5/8 */
    assert_true(fabs(sd_prom_histo_quantile(&d, 0.5, &beyond) - 1.625) < 1e-12);
    assert_false(beyond);
    /* p99: rank 9.9, 1.9 into the 2 in (2, 4] -> 2 + 2 * 1.9/2 */
    assert_true(fabs(sd_prom_histo_quantile(&d, 0.99, &beyond) - 3.9) < 1e-12);
    assert_false(beyond);
    /* p80: rank 8 is the top of (1, 2] */
    assert_true(fabs(sd_prom_histo_quantile(&d, 0.8, NULL) - 2.0) < 1e-12);
    /* the undiffed scrapes: p50 of `after` is rank 10, 7 into the 10 in
     * (1, 2] -> 1.7; p99 of `before` is rank 9.9, in +Inf: beyond 4 */
    assert_true(fabs(sd_prom_histo_quantile(&after, 0.5, NULL) - (1 + 1 * (10.0 - 3) / 10)) < 1e-12);
    assert_true(sd_prom_histo_quantile(&before, 0.99, &beyond) == 4);
    assert_true(beyond);
    /* sums of differences (the bench adds its kept rounds) */
    sd_prom_histo acc = {0};
    assert_true(sd_prom_histo_add(&acc, &d));
    assert_true(sd_prom_histo_add(&acc, &d));
    assert_true(acc.count == 20 && acc.cum[1] == 16 && acc.sum == 30);
    assert_true(fabs(sd_prom_histo_quantile(&acc, 0.5, NULL) - 1.625) < 1e-12);
    /* a counter that went down (the gateway restarted) is no difference */
    assert_false(sd_prom_histo_diff(&before, &after, &d));
    /* nor are histograms with other bounds */
    sd_prom_histo other = after;
    other.le[2] = 5;
    assert_false(sd_prom_histo_diff(&other, &before, &d));
    assert_false(sd_prom_histo_add(&acc, &other));
    /* nothing observed: no quantile */
    assert_true(sd_prom_histo_diff(&before, &before, &d));
    assert_true(isnan(sd_prom_histo_quantile(&d, 0.5, NULL)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_picks_series),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_diff_and_quantiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
