/* spec_stats.c — chi-square p-values for the speculative tests (see spec_stats.h). */
#include "spec_stats.h"

#include <math.h>
#include <stdbool.h>

#define GAMMA_EPS      1e-15
#define GAMMA_TINY     1e-300
#define GAMMA_MAX_ITER 100000

/* Lower regularized P(a, x) by its power series; converges fast for x < a + 1. */
static double gamma_p_series(double a, double x) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < GAMMA_MAX_ITER; n++) {
        term *= x / (a + n);
        sum += term;
        if (fabs(term) < fabs(sum) * GAMMA_EPS) break;
    }
    return sum * exp(-x + a * log(x) - lgamma(a));
}

/* Upper regularized Q(a, x) by its continued fraction (modified Lentz), x >= a + 1. */
static double gamma_q_fraction(double a, double x) {
    double b = x + 1.0 - a, c = 1.0 / GAMMA_TINY, d = 1.0 / b, h = d;
    for (int i = 1; i < GAMMA_MAX_ITER; i++) {
        double an = -(double)i * ((double)i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < GAMMA_TINY) d = GAMMA_TINY;
        c = b + an / c;
        if (fabs(c) < GAMMA_TINY) c = GAMMA_TINY;
        d = 1.0 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1.0) < GAMMA_EPS) break;
    }
    return exp(-x + a * log(x) - lgamma(a)) * h;
}

double spec_gamma_q(double a, double x) {
    if (!(a > 0.0) || !(x >= 0.0)) return NAN;
    if (x == 0.0) return 1.0;
    if (x < a + 1.0) return 1.0 - gamma_p_series(a, x);
    return gamma_q_fraction(a, x);
}

double spec_chi2_pvalue(double x, int32_t df) {
    if (df <= 0) return x > 0.0 ? 0.0 : 1.0;
    return spec_gamma_q(0.5 * df, 0.5 * x);
}

double spec_chi2_gof(const uint64_t *observed, const double *prob, int32_t n, double *stat, int32_t *df) {
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += (double)observed[i];
    double chi2 = 0.0, pool_obs = 0.0, pool_exp = 0.0;
    int32_t cells = 0;
    bool impossible = false;
    for (int32_t i = 0; i < n; i++) {
        double e = prob[i] * total, o = (double)observed[i];
        if (prob[i] <= 0.0) {
            if (observed[i] > 0) impossible = true;
            continue;
        }
        if (e < 5.0) {
            pool_obs += o;
            pool_exp += e;
            continue;
        }
        chi2 += (o - e) * (o - e) / e;
        cells++;
    }
    if (pool_exp > 0.0) {
        chi2 += (pool_obs - pool_exp) * (pool_obs - pool_exp) / pool_exp;
        cells++;
    }
    int32_t dof = cells - 1;
    if (stat) *stat = impossible ? INFINITY : chi2;
    if (df) *df = dof;
    if (impossible) return 0.0;
    return spec_chi2_pvalue(chi2, dof);
}

double spec_chi2_two_sample(const uint64_t *a, const uint64_t *b, int32_t n, double *stat, int32_t *df) {
    double na = 0.0, nb = 0.0;
    for (int32_t i = 0; i < n; i++) {
        na += (double)a[i];
        nb += (double)b[i];
    }
    double chi2 = 0.0, pool_a = 0.0, pool_b = 0.0;
    int32_t cells = 0;
    double ntot = na + nb;
    for (int32_t i = 0; i < n; i++) {
        double ai = (double)a[i], bi = (double)b[i];
        if (ai + bi < 10.0) {
            pool_a += ai;
            pool_b += bi;
            continue;
        }
        double col = ai + bi, ea = col * na / ntot, eb = col * nb / ntot;
        chi2 += (ai - ea) * (ai - ea) / ea + (bi - eb) * (bi - eb) / eb;
        cells++;
    }
    if (pool_a + pool_b > 0.0) {
        double col = pool_a + pool_b, ea = col * na / ntot, eb = col * nb / ntot;
        chi2 += (pool_a - ea) * (pool_a - ea) / ea + (pool_b - eb) * (pool_b - eb) / eb;
        cells++;
    }
    int32_t dof = cells - 1;
    if (stat) *stat = chi2;
    if (df) *df = dof;
    return spec_chi2_pvalue(chi2, dof);
}
