/* worker_opts.h — the command-line options every worker process
 * (specd-verifier, specd-drafter) shares, in one table and one parser:
 * where the coordinator is and who this worker is (--coordinator, --name,
 * --curve-secret, --curve-server), the serving limits (--threads,
 * --max-seqs, --kv-blocks, --prefix-cache, --max-batch, --max-k, --warmup)
 * and -v. Each main keeps its own usage text (the wording that fits its
 * role), its own defaults and the options of its role; the options here
 * are parsed, bounded and reported the same way in both.
 *
 * Rejected: one usage string for the shared options (the two helps place
 * and word them for their role, and the help text is part of the
 * interface), and a table-driven parser for every option (the role's own
 * options read better as a switch). */
#ifndef SPECD_WORKER_OPTS_H
#define SPECD_WORKER_OPTS_H

#include <getopt.h>

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_worker_opts {
    const char *coordinator;                 /* --coordinator ADDR */
    const char *name;                        /* --name NAME (NULL: host:pid) */
    const char *curve_secret, *curve_server; /* --curve-secret, --curve-server FILE */
    int32_t n_threads;                       /* -t, --threads N (0: all cores) */
    int32_t max_seqs;                        /* --max-seqs N */
    int32_t kv_blocks;                       /* --kv-blocks N (0: the role's default) */
    int32_t prefix_cache;                    /* --prefix-cache PCT (the role's default when not given) */
    int32_t max_batch;                       /* --max-batch N */
    int32_t max_k;                           /* --max-k N */
    int32_t min_max_k;                       /* the smallest --max-k the role accepts (set by the main) */
    int32_t warmup;                          /* --warmup N (-1: the role's default) */
    bool verbose;                            /* -v, --verbose */
} sd_worker_opts;

/* getopt_long's values of the shared long options (-t and -v are 't', 'v'). */
enum {
    SD_WORKER_OPT_COORDINATOR = 0x5b0,
    SD_WORKER_OPT_NAME,
    SD_WORKER_OPT_CURVE_SECRET,
    SD_WORKER_OPT_CURVE_SERVER,
    SD_WORKER_OPT_MAX_SEQS,
    SD_WORKER_OPT_KV_BLOCKS,
    SD_WORKER_OPT_PREFIX_CACHE,
    SD_WORKER_OPT_MAX_BATCH,
    SD_WORKER_OPT_MAX_K,
    SD_WORKER_OPT_WARMUP,
};

/* clang-format off */
#define SD_WORKER_LONG_OPTIONS                                                \
    {"coordinator", required_argument, 0, SD_WORKER_OPT_COORDINATOR},         \
    {"name", required_argument, 0, SD_WORKER_OPT_NAME},                       \
    {"curve-secret", required_argument, 0, SD_WORKER_OPT_CURVE_SECRET},       \
    {"curve-server", required_argument, 0, SD_WORKER_OPT_CURVE_SERVER},       \
    {"threads", required_argument, 0, 't'},                                   \
    {"max-seqs", required_argument, 0, SD_WORKER_OPT_MAX_SEQS},               \
    {"kv-blocks", required_argument, 0, SD_WORKER_OPT_KV_BLOCKS},             \
    {"prefix-cache", required_argument, 0, SD_WORKER_OPT_PREFIX_CACHE},       \
    {"max-batch", required_argument, 0, SD_WORKER_OPT_MAX_BATCH},             \
    {"max-k", required_argument, 0, SD_WORKER_OPT_MAX_K},                     \
    {"warmup", required_argument, 0, SD_WORKER_OPT_WARMUP},                   \
    {"verbose", no_argument, 0, 'v'}
/* clang-format on */
/* The short options they include, for getopt_long's optstring. */
#define SD_WORKER_SHORT_OPTIONS "t:v"

typedef enum sd_worker_opt_result {
    SD_WORKER_OPT_OTHER = 0, /* not a shared option: the main's own */
    SD_WORKER_OPT_TAKEN,     /* applied to *o */
    SD_WORKER_OPT_BAD,       /* a bad value, said on stderr as "prog: --flag must be ..." */
} sd_worker_opt_result;

/* Applies getopt_long's result c with its argument arg to *o when c is one
 * of the shared options. Not thread-safe (writes stderr); borrows arg. */
sd_worker_opt_result sd_worker_opts_apply(sd_worker_opts *o, int c, const char *arg, const char *prog);

/* An integer flag in [lo, hi] into *out, or false with "prog: flag must be
 * an integer in [lo, hi], got 'arg'" on stderr: the one message of every
 * worker's numeric flags. */
bool sd_worker_opts_int(const char *prog, const char *flag, const char *arg, int32_t lo, int32_t hi, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
