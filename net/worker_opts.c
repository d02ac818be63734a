/* worker_opts.c — the worker processes' shared options (worker_opts.h):
 * one table, one set of bounds, one error message. */
#include "specd/worker_opts.h"

#include "specd/cli.h"
#include "specd/net.h"

#include <stdio.h>

bool sd_worker_opts_int(const char *prog, const char *flag, const char *arg, int32_t lo, int32_t hi, int32_t *out) {
    if (sd_cli_parse_i32(arg, lo, hi, out)) return true;
    fprintf(stderr, "%s: %s must be an integer in [%d, %d], got '%s'\n", prog, flag, (int)lo, (int)hi, arg);
    return false;
}

sd_worker_opt_result sd_worker_opts_apply(sd_worker_opts *o, int c, const char *arg, const char *prog) {
    bool ok = true;
    switch (c) {
    case SD_WORKER_OPT_COORDINATOR: o->coordinator = arg; break;
    case SD_WORKER_OPT_NAME: o->name = arg; break;
    case SD_WORKER_OPT_CURVE_SECRET: o->curve_secret = arg; break;
    case SD_WORKER_OPT_CURVE_SERVER: o->curve_server = arg; break;
    case 't': ok = sd_worker_opts_int(prog, "--threads", arg, 0, 1024, &o->n_threads); break;
    case SD_WORKER_OPT_MAX_SEQS: ok = sd_worker_opts_int(prog, "--max-seqs", arg, 1, 65536, &o->max_seqs); break;
    case SD_WORKER_OPT_KV_BLOCKS: ok = sd_worker_opts_int(prog, "--kv-blocks", arg, 1, 1 << 28, &o->kv_blocks); break;
    case SD_WORKER_OPT_PREFIX_CACHE:
        ok = sd_worker_opts_int(prog, "--prefix-cache", arg, 0, 100, &o->prefix_cache);
        break;
    case SD_WORKER_OPT_MAX_BATCH:
        ok = sd_worker_opts_int(prog, "--max-batch", arg, 1, SD_MAX_BATCH, &o->max_batch);
        break;
    case SD_WORKER_OPT_MAX_K: ok = sd_worker_opts_int(prog, "--max-k", arg, o->min_max_k, SD_MAX_K, &o->max_k); break;
    case SD_WORKER_OPT_WARMUP:
        ok = sd_worker_opts_int(prog, "--warmup", arg, 0, SD_MAX_BATCH * (SD_MAX_K + 1), &o->warmup);
        break;
    case 'v': o->verbose = true; break;
    default: return SD_WORKER_OPT_OTHER;
    }
    return ok ? SD_WORKER_OPT_TAKEN : SD_WORKER_OPT_BAD;
}
