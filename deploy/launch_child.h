/* launch_child.h — one process specd-launch runs: its role, its binary
 * and its command line (launch_child.c); starting, watching and restarting
 * it are specd-launch.c's. */
#ifndef SPECD_LAUNCH_CHILD_H
#define SPECD_LAUNCH_CHILD_H

#include "launch_args.h"
#include "launch_keys.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define LAUNCH_MAX_ARGV 96

typedef struct launch_child {
    child_role role;
    int rank;
    int group;                   /* verifiers: its group, 0..groups-1 */
    int drafter;                 /* drafters: index into launch_opts.drafters */
    char name[32];               /* "coordinator", "verifier[0]", "drafter" */
    char path[PATH_MAX];         /* resolved binary */
    char *argv[LAUNCH_MAX_ARGV]; /* argv[0] = path; strings borrowed or in argbuf */
    char argbuf[8][PATH_MAX];
    pid_t pid; /* 0 = not running */
    double started_ms, restart_at_ms;
    int backoff_ms, restarts;
} launch_child;

/* What a child's command line is built from besides its own fields. */
typedef struct launch_argv_ctx {
    const launch_opts *o;
    const launch_keys *keys;    /* with --curve */
    const char *worker_connect; /* the coordinator's worker address, to connect to */
    const char *client_connect; /* and its client address */
    const char *group_addr;     /* the child's verifier group's own socket (--tp > 1) */
} launch_argv_ctx;

/* Finds binary `name`: in --bin-dir (flat or with the build tree's role
 * folders), else next to the launcher's own build folder (build/deploy/ ->
 * build/<subdir>/name) or in the launcher's folder (an install's bin/), else
 * on PATH. False when none is executable. */
bool launch_find_binary(const launch_opts *o, const char *name, const char *subdir, char *out, size_t n);
/* c->argv from c->path, its role and x: the processes' own flags (see each
 * one's --help), its keys with --curve, -v, and the pass-through arguments. */
void launch_build_argv(const launch_argv_ctx *x, launch_child *c);

#endif
