/* bench_stats.c — the small statistics every specd-bench mode uses: one
 * comparator and one median, rather than a copy in each mode's file. */
#include "bench_stats.h"

#include <stdlib.h>

int sd_bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sd_bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, sd_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
