/* bench_prom.h — one Prometheus histogram read from /metrics text, the
 * difference of two scrapes, and its quantiles (bench_prom.c). */
#ifndef SPECD_BENCH_PROM_H
#define SPECD_BENCH_PROM_H

#include <stdbool.h>
#include <stddef.h>

#define SD_PROM_MAX_BUCKETS 32 /* finite bounds kept; a histogram with more is refused */

/* A histogram as exposed: finite upper bounds ascending with their
 * cumulative counts, the total (the +Inf bucket, = _count) and _sum. */
typedef struct sd_prom_histo {
    int n;                           /* finite buckets */
    double le[SD_PROM_MAX_BUCKETS];  /* upper bounds, ascending */
    double cum[SD_PROM_MAX_BUCKETS]; /* observations <= le[i] */
    double count, sum;
} sd_prom_histo;

/* Reads histogram `name` from exposition text (format 0.0.4): the series
 * whose labels, le aside, are exactly `labels` ("" for none, else e.g.
 * `response="stream"`). False, with why in err, when the series is absent,
 * malformed, has over SD_PROM_MAX_BUCKETS bounds, bounds not ascending or
 * counts decreasing. Pure; thread-safe. */
bool sd_prom_histo_parse(const char *text, const char *name, const char *labels, sd_prom_histo *out, char *err,
                         size_t err_len);

/* out = after - before, bucket by bucket (what was observed between the two
 * scrapes). False when the bounds differ or a count went down (the process
 * restarted between the scrapes). */
bool sd_prom_histo_diff(const sd_prom_histo *after, const sd_prom_histo *before, sd_prom_histo *out);

/* Adds b's counts to *acc (same bounds, or *acc empty: n == 0 and count 0).
 * False when the bounds differ. */
bool sd_prom_histo_add(sd_prom_histo *acc, const sd_prom_histo *b);

/* The q-quantile (0 <= q <= 1) as Prometheus' histogram_quantile computes
 * it: the bucket holding rank q * count, linearly interpolated between its
 * lower bound (the previous bound, 0 for the first) and its upper bound.
 * When the rank falls in the +Inf bucket, returns the largest finite bound
 * and sets *beyond (NULL allowed). NAN for an empty histogram. */
double sd_prom_histo_quantile(const sd_prom_histo *h, double q, bool *beyond);

#endif
