/* test_bench_hygiene.c — the benchmark hygiene sampler (tools/bench_hygiene.c)
 * sees a busy process beside the measurement and the filter drops the
 * repetition.
 *
 * A child spins (named "sdhygspin"); the parent sleeps through a 0.6 s
 * window. The child's own CPU use over the window (its /proc/PID/stat
 * ticks) must show up in the foreign share, which then fails a threshold
 * of half of it; the same window sampled with the child's name excluded
 * must lose about that share. Tolerances are two clock ticks per window
 * and a margin for the other jobs of a shared machine, which can only add
 * to the foreign share, never hide the child. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench_hygiene.h"

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static pid_t spawn_spinner(void) {
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_NAME, "sdhygspin", 0, 0, 0);
        volatile uint64_t x = 0;
        for (;;) x++;
    }
    return pid;
}

static void test_spinning_child_is_seen(void **state) {
    (void)state;
    pid_t child = spawn_spinner();
    assert_true(child > 0);
    sleep_s(0.05);
    sd_hyg_params p = sd_hyg_default_params();
    sd_hyg_params px = p;
    px.exclude_prefix = "sdhygspin";
    sd_hyg_mark a = sd_hyg_now(&p), ax = sd_hyg_now(&px);
    uint64_t c0 = sd_hyg_process_ticks((int)child);
    sleep_s(0.6);
    uint64_t c1 = sd_hyg_process_ticks((int)child);
    sd_hyg_mark b = sd_hyg_now(&p), bx = sd_hyg_now(&px);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_true(a.ok && b.ok);
    double wall = b.wall_s - a.wall_s;
    double child_cores = (double)(c1 - c0) / sd_hyg_tick_hz() / wall;
    double other = sd_hyg_other_cores(&a, &b), other_x = sd_hyg_other_cores(&ax, &bx);
    double tol = 2.0 / sd_hyg_tick_hz() / wall + 0.05;
    printf("child %.2f cores; foreign share %.2f cores, %.2f with the child excluded (window %.2f s)\n", child_cores,
           other, other_x, wall);
    assert_true(child_cores > 0.1); /* it ran */
    assert_true(other >= child_cores - tol);
    p.max_other_cores = child_cores / 2;
    assert_false(sd_hyg_clean(&p, other)); /* the repetition is dropped */
    assert_true(other_x <= other - child_cores + 2 * tol);
}

/* This process's own spinning is not foreign load: the share with the
 * parent busy stays below what the parent used (unless other jobs of the
 * machine happen to match it, which the margin allows). */
static void test_own_work_not_counted(void **state) {
    (void)state;
    sd_hyg_params p = sd_hyg_default_params();
    sd_hyg_mark a = sd_hyg_now(&p);
    uint64_t s0 = sd_hyg_process_ticks((int)getpid());
    volatile uint64_t x = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 100000; i++) x++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) < 0.5);
    uint64_t s1 = sd_hyg_process_ticks((int)getpid());
    sd_hyg_mark b = sd_hyg_now(&p);
    double wall = b.wall_s - a.wall_s;
    double self_cores = (double)(s1 - s0) / sd_hyg_tick_hz() / wall;
    double busy_cores = (double)(b.busy_ticks - a.busy_ticks) / sd_hyg_tick_hz() / wall;
    double other = sd_hyg_other_cores(&a, &b);
    printf("self %.2f cores, machine busy %.2f, foreign %.2f\n", self_cores, busy_cores, other);
    assert_true(self_cores > 0.1);
    assert_true(other <= busy_cores - self_cores + 2.0 / sd_hyg_tick_hz() / wall + 1e-9);
    assert_true(sd_hyg_clean(&p, -1.0)); /* unreadable counts as clean */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spinning_child_is_seen),
        cmocka_unit_test(test_own_work_not_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
