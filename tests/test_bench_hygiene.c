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
#include <string.h>
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
    uint64_t c0 = sd_hyg_process_ticks((int)child), c1 = c0;
    /* at least 0.6 s, longer (up to 6 s) while the child has not had 0.15 s
     * of CPU: on a machine loaded by other jobs it gets a small share */
    for (int i = 0; i < 20 && (i < 2 || (double)(c1 - c0) / sd_hyg_tick_hz() < 0.15); i++) {
        sleep_s(0.3);
        c1 = sd_hyg_process_ticks((int)child);
    }
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
    assert_true(child_cores > 0.02); /* it ran */
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

static bool has_cpu(const unsigned char *set, int i) { return (set[i / 8] >> (i % 8)) & 1u; }

/* CPU lists as Linux writes them; anything else is refused. */
static void test_cpu_lists(void **state) {
    (void)state;
    unsigned char set[SD_HYG_CPUS_MAX / 8];
    assert_true(sd_hyg_parse_cpus("0-1", set));
    assert_true(has_cpu(set, 0) && has_cpu(set, 1) && !has_cpu(set, 2));
    assert_true(sd_hyg_parse_cpus("0,2,4-5", set));
    assert_true(has_cpu(set, 0) && !has_cpu(set, 1) && has_cpu(set, 2) && !has_cpu(set, 3) && has_cpu(set, 4) &&
                has_cpu(set, 5) && !has_cpu(set, 6));
    assert_true(sd_hyg_parse_cpus("1023", set));
    assert_true(has_cpu(set, 1023) && !has_cpu(set, 0));
    const char *bad[] = {"", "x", "1-", "-1", "2-1", "1,", ",1", "1024", "0-1024", "1 2", "1;2", "0x1", NULL};
    memset(set, 0xAB, sizeof set);
    for (int i = 0; bad[i]; i++) {
        assert_false(sd_hyg_parse_cpus(bad[i], set));
        assert_int_equal(set[0], 0xAB); /* untouched */
    }
    assert_false(sd_hyg_parse_cpus(NULL, set));
}

/* Pinning to one CPU shows in the affinity text, in this process and in a
 * child it starts; a bad list fails and leaves the affinity as it was. */
static void test_pin_cpus(void **state) {
    (void)state;
    char before[256], after[256], first[16];
    sd_hyg_affinity_text(before, sizeof before);
    int cpu = atoi(before); /* the first allowed CPU */
    snprintf(first, sizeof first, "%d", cpu);
    assert_true(sd_hyg_pin_cpus(first));
    sd_hyg_affinity_text(after, sizeof after);
    assert_string_equal(after, first);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        char text[256];
        sd_hyg_affinity_text(text, sizeof text);
        _exit(strcmp(text, first) == 0 ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_false(sd_hyg_pin_cpus("7-3"));
    sd_hyg_affinity_text(after, sizeof after);
    assert_string_equal(after, first);
    assert_true(sd_hyg_pin_cpus(before)); /* back as it was */
    sd_hyg_affinity_text(after, sizeof after);
    assert_string_equal(after, before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spinning_child_is_seen),
        cmocka_unit_test(test_own_work_not_counted),
        cmocka_unit_test(test_cpu_lists),
        cmocka_unit_test(test_pin_cpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
