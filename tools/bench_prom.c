/* bench_prom.c — a Prometheus histogram from /metrics text, the difference
 * of two scrapes and its quantiles, for `specd-bench http` (the gateway's
 * specd_gateway_forward_seconds).
 *
 * Only what that needs: one histogram family, series picked by their
 * labels written exactly as the gateway writes them (le last). Rejected:
 * a general exposition parser (escapes, timestamps, every metric type);
 * the bench reads one known producer, and the integration tests check that
 * producer with prometheus_client's parser. Quantiles interpolate linearly
 * inside a bucket, as histogram_quantile does, so they are estimates
 * whose error is bounded by the bucket's width. */
#include "bench_prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool fail(char *err, size_t err_len, const char *msg, const char *name) {
    if (err && err_len) snprintf(err, err_len, "%s: %s", name, msg);
    return false;
}

/* Parses the sample value that ends the line at p ("123", "1.5e-06").
 * False when it is not a finite number or something follows it. */
static bool sample_value(const char *p, double *v) {
    while (*p == ' ') p++;
    char *end;
    *v = strtod(p, &end);
    if (end == p || !isfinite(*v)) return false;
    while (*end == ' ' || *end == '\r') end++;
    return *end == '\n' || *end == '\0';
}

/* The line's series matches `name` + suffix with labels (le aside) equal to
 * `labels`; on a _bucket line *le is its bound. Returns a pointer after the
 * closing brace (or the name when there are no labels), NULL when the line
 * is not this series. */
static const char *match_series(const char *line, const char *name, const char *suffix, const char *labels, double *le,
                                bool *le_ok) {
    size_t nn = strlen(name), ns = strlen(suffix), nl = strlen(labels);
    if (strncmp(line, name, nn) != 0 || strncmp(line + nn, suffix, ns) != 0) return NULL;
    const char *p = line + nn + ns;
    bool bucket = !strcmp(suffix, "_bucket");
    if (*p != '{') return !bucket && nl == 0 && (*p == ' ') ? p : NULL;
    p++;
    if (nl) {
        if (strncmp(p, labels, nl) != 0) return NULL;
        p += nl;
        if (bucket) {
            if (*p != ',') return NULL;
            p++;
        }
    }
    if (bucket) {
        if (strncmp(p, "le=\"", 4) != 0) return NULL;
        p += 4;
        char *end;
        *le = strtod(p, &end);
        *le_ok = end != p && *end == '"';
        p = strchr(p, '"');
        if (!p) return NULL;
        p++;
    }
    if (*p != '}') return NULL;
    return p + 1;
}

bool sd_prom_histo_parse(const char *text, const char *name, const char *labels, sd_prom_histo *out, char *err,
                         size_t err_len) {
    memset(out, 0, sizeof *out);
    if (!labels) labels = "";
    bool have_inf = false, have_count = false, have_sum = false;
    double inf_count = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (*line == '#') continue;
        double le = 0, v;
        bool le_ok = false;
        const char *rest;
        if ((rest = match_series(line, name, "_bucket", labels, &le, &le_ok))) {
            if (!le_ok || !sample_value(rest, &v) || v < 0) return fail(err, err_len, "malformed bucket line", name);
            if (isinf(le)) {
                have_inf = true;
                inf_count = v;
                continue;
            }
            if (out->n == SD_PROM_MAX_BUCKETS) return fail(err, err_len, "too many buckets", name);
            if (out->n && (le <= out->le[out->n - 1] || v < out->cum[out->n - 1]))
                return fail(err, err_len, "buckets not ascending or counts decreasing", name);
            out->le[out->n] = le;
            out->cum[out->n] = v;
            out->n++;
        } else if ((rest = match_series(line, name, "_count", labels, &le, &le_ok))) {
            if (!sample_value(rest, &v) || v < 0) return fail(err, err_len, "malformed _count line", name);
            have_count = true;
            out->count = v;
        } else if ((rest = match_series(line, name, "_sum", labels, &le, &le_ok))) {
            if (!sample_value(rest, &v)) return fail(err, err_len, "malformed _sum line", name);
            have_sum = true;
            out->sum = v;
        }
    }
    if (!have_inf || !have_count || !have_sum || out->n == 0)
        return fail(err, err_len, "series missing (no buckets, +Inf, _count or _sum)", name);
    if (inf_count != out->count) return fail(err, err_len, "_count differs from the +Inf bucket", name);
    if (out->cum[out->n - 1] > out->count) return fail(err, err_len, "a bucket holds more than _count", name);
    return true;
}

static bool same_bounds(const sd_prom_histo *a, const sd_prom_histo *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (a->le[i] != b->le[i]) return false;
    return true;
}

bool sd_prom_histo_diff(const sd_prom_histo *after, const sd_prom_histo *before, sd_prom_histo *out) {
    if (!same_bounds(after, before) || after->count < before->count) return false;
    sd_prom_histo d = *after;
    for (int i = 0; i < d.n; i++) {
        if (after->cum[i] < before->cum[i]) return false;
        d.cum[i] = after->cum[i] - before->cum[i];
    }
    d.count = after->count - before->count;
    d.sum = after->sum - before->sum;
    *out = d;
    return true;
}

bool sd_prom_histo_add(sd_prom_histo *acc, const sd_prom_histo *b) {
    if (acc->n == 0 && acc->count == 0) {
        *acc = *b;
        return true;
    }
    if (!same_bounds(acc, b)) return false;
    for (int i = 0; i < acc->n; i++) acc->cum[i] += b->cum[i];
    acc->count += b->count;
    acc->sum += b->sum;
    return true;
}

double sd_prom_histo_quantile(const sd_prom_histo *h, double q, bool *beyond) {
    if (beyond) *beyond = false;
    if (h->count <= 0 || h->n == 0) return NAN;
    if (q < 0) q = 0;
    if (q > 1) q = 1;
    double rank = q * h->count;
    for (int i = 0; i < h->n; i++) {
        if (h->cum[i] >= rank && h->cum[i] > 0) {
            double lo = i ? h->le[i - 1] : 0, below = i ? h->cum[i - 1] : 0;
            double in = h->cum[i] - below;
            if (in <= 0) return h->le[i];
            return lo + (h->le[i] - lo) * (rank - below) / in;
        }
    }
    if (beyond) *beyond = true;
    return h->le[h->n - 1];
}
