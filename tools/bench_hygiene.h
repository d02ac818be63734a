/* bench_hygiene.h — is the machine quiet while a repetition is measured?
 * (bench_hygiene.c)
 *
 * On a shared machine another job taking a core slows whichever program
 * yields to it, and a run that nobody checked flatters the program that
 * yields better. Every specd-bench mode therefore samples, around each
 * measured repetition, the CPU time the rest of the machine used: the
 * busy time of all CPUs (/proc/stat) minus this process's own (all its
 * threads and its reaped children, /proc/self/stat) and minus that of
 * running processes whose name starts
 * with exclude_prefix (the service's own processes, for `serve`), in
 * cores (1.0 = one core busy the whole time). A repetition during which
 * others used more than max_other_cores is dirty: the modes leave dirty
 * repetitions out of their medians while clean ones remain, and write the
 * share into their tables. Resolution: the kernel's clock tick (10 ms), so
 * a repetition should last at least ~0.2 s for the share to mean much. */
#ifndef SPECD_BENCH_HYGIENE_H
#define SPECD_BENCH_HYGIENE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SD_HYG_DEFAULT_MAX_OTHER 0.25 /* cores: a quarter of a core */

typedef struct sd_hyg_params {
    double max_other_cores;     /* a repetition with more is dirty (default SD_HYG_DEFAULT_MAX_OTHER) */
    const char *exclude_prefix; /* processes whose name (comm) starts with this count as ours; NULL: none */
} sd_hyg_params;

sd_hyg_params sd_hyg_default_params(void);

#define SD_HYG_MAX_EXCLUDED 256

/* CPU counters at one moment (clock ticks, and the wall clock). */
typedef struct sd_hyg_mark {
    double wall_s;
    uint64_t busy_ticks; /* all CPUs, /proc/stat */
    uint64_t own_ticks;  /* this process and its reaped children */
    int n_excluded;      /* running processes matching exclude_prefix, each with its ticks: one that
                                exits between two marks must not take ticks it had before out of the
                                difference, nor one that starts add ticks from before its start */
    int excluded_pid[SD_HYG_MAX_EXCLUDED];
    uint64_t excluded_ticks[SD_HYG_MAX_EXCLUDED];
    bool ok; /* the counters could be read */
} sd_hyg_mark;

/* Reads the counters now. */
sd_hyg_mark sd_hyg_now(const sd_hyg_params *p);

/* Cores the rest of the machine used between a and b (>= 0); -1 when the
 * counters could not be read or no time passed. */
double sd_hyg_other_cores(const sd_hyg_mark *a, const sd_hyg_mark *b);

/* Whether a repetition with other_cores of foreign load counts as clean
 * (an unreadable share, -1, counts as clean: nothing known against it). */
bool sd_hyg_clean(const sd_hyg_params *p, double other_cores);

/* CPU ticks (user + system) that process pid has used; 0 if unreadable. */
uint64_t sd_hyg_process_ticks(int pid);

/* Ticks per second of the counters above. */
double sd_hyg_tick_hz(void);

/* CPU affinity, so that specd and a peer it is compared with run on the
 * same CPUs. Neither pins a thread to a single core (specd's thread pool
 * does not, and neither do llama.cpp's defaults): the whole process, and
 * every process it starts, is kept to one set.
 *
 * Parses a Linux CPU list ("0-1", "0,2,4-5") into *set; false (and *set
 * untouched) for anything else: empty, junk, a CPU >= CPU_SETSIZE, a
 * reversed range. */
#define SD_HYG_CPUS_MAX 1024
bool sd_hyg_parse_cpus(const char *list, unsigned char set[SD_HYG_CPUS_MAX / 8]);

/* Keeps this process (and what it starts later) to the CPUs in list;
 * false, with a message on stderr, when the list is bad or the kernel
 * refuses it (a CPU that is offline or outside a cgroup's set). */
bool sd_hyg_pin_cpus(const char *list);

/* This process's CPU affinity as a CPU list ("0-1"), into buf. */
void sd_hyg_affinity_text(char *buf, size_t size);

#endif
