/* spec_stats.h — chi-square machinery for the speculative-sampling tests.
 *
 * The p-value of a chi-square statistic is the regularized upper incomplete
 * gamma Q(df/2, x/2), computed here (series below a+1, Lentz continued
 * fraction above) so the tests depend on nothing but libm's lgamma. Cells
 * whose expected count is below 5 are pooled; an observation in a cell of
 * expected count 0 is an impossible event and gives p = 0 outright. */
#ifndef SPECD_TESTS_SPEC_STATS_H
#define SPECD_TESTS_SPEC_STATS_H

#include <stdint.h>

/* Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0. */
double spec_gamma_q(double a, double x);

/* P(X >= x) for X ~ chi-square with df degrees of freedom. */
double spec_chi2_pvalue(double x, int32_t df);

/* Goodness of fit of observed[n] counts to expected probabilities prob[n]
 * (summing to 1) over total = sum(observed) trials. Returns the p-value and
 * writes the statistic and degrees of freedom when the pointers are set. */
double spec_chi2_gof(const uint64_t *observed, const double *prob, int32_t n, double *stat, int32_t *df);

/* Two-sample test of homogeneity of counts a[n] and b[n] (chi-square on the
 * 2 x n table, pooling cells whose combined count is below 10). */
double spec_chi2_two_sample(const uint64_t *a, const uint64_t *b, int32_t n, double *stat, int32_t *df);

#endif
