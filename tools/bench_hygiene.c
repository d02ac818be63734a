/* bench_hygiene.c — foreign CPU load during a measurement (bench_hygiene.h).
 *
 * /proc/stat's first line sums all CPUs: user nice system idle iowait irq
 * softirq steal (guest time is already inside user). Busy = everything but
 * idle and iowait. A process's own use is utime + stime of /proc/PID/stat
 * (fields 14 and 15, counted after the parenthesised name, which may hold
 * spaces), which covers all its threads. This process's own use includes
 * its children that exited and were waited for (cutime/cstime, fields 16
 * and 17): the ranks `specd-bench tp` forks are its work, and once reaped
 * their time lives only there. A child still running is another process
 * unless its name matches exclude_prefix. Rejected: getrusage(RUSAGE_SELF)
 * (microseconds, but no way to read the same for excluded processes, and
 * mixing two clocks would add their rounding errors); a load average (a
 * one-minute average cannot say which repetition was disturbed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#endif
#include "bench_hygiene.h"

#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

sd_hyg_params sd_hyg_default_params(void) {
    sd_hyg_params p = {.max_other_cores = SD_HYG_DEFAULT_MAX_OTHER, .exclude_prefix = NULL};
    return p;
}

double sd_hyg_tick_hz(void) {
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)hz : 100.0;
}

static bool read_busy(uint64_t *busy) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]);
    fclose(f);
    if (n < 4) return false;
    *busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]; /* not idle (3), not iowait (4) */
    return true;
}

/* utime + stime of /proc/<dir>/stat (+ cutime + cstime with children);
 * *comm gets the name when not NULL. */
static bool read_proc_stat(const char *dir, bool children, uint64_t *ticks, char *comm, size_t comm_size) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%s/stat", dir);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (!open || !close || close < open) return false;
    if (comm) {
        size_t len = (size_t)(close - open - 1);
        if (len >= comm_size) len = comm_size - 1;
        memcpy(comm, open + 1, len);
        comm[len] = 0;
    }
    /* after ") ": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8) flags(9) minflt(10) cminflt(11)
     * majflt(12) cmajflt(13) utime(14) stime(15) */
    unsigned long long ut = 0, stime = 0, cut = 0, cst = 0;
    if (sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu", &ut, &stime, &cut, &cst) !=
        4)
        return false;
    *ticks = ut + stime + (children ? cut + cst : 0);
    return true;
}

uint64_t sd_hyg_process_ticks(int pid) {
    char dir[32];
    snprintf(dir, sizeof dir, "%d", pid);
    uint64_t t = 0;
    return read_proc_stat(dir, false, &t, NULL, 0) ? t : 0;
}

/* The processes named exclude_prefix*, this one left out, into m. */
static void read_excluded(const char *prefix, sd_hyg_mark *m) {
    DIR *d = opendir("/proc");
    if (!d) return;
    size_t plen = strlen(prefix);
    int self = (int)getpid();
    struct dirent *e;
    while ((e = readdir(d)) && m->n_excluded < SD_HYG_MAX_EXCLUDED) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        char comm[64];
        uint64_t t = 0;
        if (pid == self || !read_proc_stat(e->d_name, false, &t, comm, sizeof comm) || strncmp(comm, prefix, plen))
            continue;
        m->excluded_pid[m->n_excluded] = pid;
        m->excluded_ticks[m->n_excluded++] = t;
    }
    closedir(d);
}

sd_hyg_mark sd_hyg_now(const sd_hyg_params *p) {
    sd_hyg_mark m;
    memset(&m, 0, sizeof m);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    m.wall_s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    m.ok = read_busy(&m.busy_ticks) && read_proc_stat("self", true, &m.own_ticks, NULL, 0);
    if (p && p->exclude_prefix && *p->exclude_prefix) read_excluded(p->exclude_prefix, &m);
    return m;
}

double sd_hyg_other_cores(const sd_hyg_mark *a, const sd_hyg_mark *b) {
    if (!a->ok || !b->ok || b->wall_s <= a->wall_s || b->busy_ticks < a->busy_ticks) return -1.0;
    double busy = (double)(b->busy_ticks - a->busy_ticks);
    double own = b->own_ticks >= a->own_ticks ? (double)(b->own_ticks - a->own_ticks) : 0.0;
    /* excluded processes: what each running at b used since a (all of it if
     * it started since); one that exited took its ticks along, unknown */
    for (int i = 0; i < b->n_excluded; i++) {
        uint64_t before = 0;
        for (int j = 0; j < a->n_excluded; j++)
            if (a->excluded_pid[j] == b->excluded_pid[i]) before = a->excluded_ticks[j];
        if (b->excluded_ticks[i] >= before) own += (double)(b->excluded_ticks[i] - before);
    }
    double other = (busy - own) / sd_hyg_tick_hz() / (b->wall_s - a->wall_s);
    return other > 0 ? other : 0.0;
}

bool sd_hyg_clean(const sd_hyg_params *p, double other_cores) {
    double max = p && p->max_other_cores > 0 ? p->max_other_cores : SD_HYG_DEFAULT_MAX_OTHER;
    return other_cores < 0 || other_cores <= max;
}

bool sd_hyg_parse_cpus(const char *list, unsigned char set[SD_HYG_CPUS_MAX / 8]) {
    unsigned char out[SD_HYG_CPUS_MAX / 8] = {0};
    const char *c = list;
    if (!c || !*c) return false;
    for (;;) {
        if (!isdigit((unsigned char)*c)) return false;
        char *end;
        long lo = strtol(c, &end, 10), hi = lo;
        c = end;
        if (*c == '-') {
            if (!isdigit((unsigned char)c[1])) return false;
            hi = strtol(c + 1, &end, 10);
            c = end;
        }
        if (lo < 0 || hi < lo || hi >= SD_HYG_CPUS_MAX) return false;
        for (long i = lo; i <= hi; i++) out[i / 8] |= (unsigned char)(1u << (i % 8));
        if (*c == 0) break;
        if (*c++ != ',') return false;
    }
    memcpy(set, out, sizeof out);
    return true;
}

bool sd_hyg_pin_cpus(const char *list) {
    unsigned char bits[SD_HYG_CPUS_MAX / 8];
    if (!sd_hyg_parse_cpus(list, bits)) {
        fprintf(stderr, "--cpus '%s': not a CPU list (for example 0-1 or 0,2)\n", list ? list : "");
        return false;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < SD_HYG_CPUS_MAX && i < CPU_SETSIZE; i++)
        if (bits[i / 8] & (1u << (i % 8))) CPU_SET(i, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "--cpus %s: sched_setaffinity: %s\n", list, strerror(errno));
        return false;
    }
    return true;
}

void sd_hyg_affinity_text(char *buf, size_t size) {
    cpu_set_t set;
    size_t at = 0;
    if (size == 0) return;
    buf[0] = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        snprintf(buf, size, "unknown");
        return;
    }
    for (int i = 0; i < CPU_SETSIZE; i++) {
        if (!CPU_ISSET(i, &set)) continue;
        int j = i;
        while (j + 1 < CPU_SETSIZE && CPU_ISSET(j + 1, &set)) j++;
        int n = j > i ? snprintf(buf + at, size - at, "%s%d-%d", at ? "," : "", i, j)
                      : snprintf(buf + at, size - at, "%s%d", at ? "," : "", i);
        if (n < 0 || (size_t)n >= size - at) break;
        at += (size_t)n;
        i = j;
    }
}
