/* bench_stats.h — the small statistics every specd-bench mode uses (bench_stats.c). */
#ifndef SPECD_BENCH_STATS_H
#define SPECD_BENCH_STATS_H

/* qsort comparator for doubles, ascending. */
int sd_bench_cmp_double(const void *a, const void *b);
/* Median of v[0..n) (sorts v in place); 0 when n <= 0. */
double sd_bench_median(double *v, int n);

#endif
