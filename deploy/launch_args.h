/* launch_args.h — specd-launch's command line (launch_args.c): the options
 * with their defaults, limits and rules between flags, and --help. The
 * launcher itself (specd-launch.c) only reads the launch_opts this fills. */
#ifndef SPECD_LAUNCH_ARGS_H
#define SPECD_LAUNCH_ARGS_H

#include <stdbool.h>

#define MAX_TP         64 /* verifier ranks in all, over every group */
#define MAX_GROUPS     16
#define MAX_DRAFTERS   8
#define MAX_EXTRA_ARGS 32

/* The processes the launcher starts. */
typedef enum child_role {
    CHILD_COORDINATOR,
    CHILD_VERIFIER,
    CHILD_DRAFTER,
    CHILD_GATEWAY,
    CHILD_ROLE_COUNT
} child_role;

/* One drafter to run: --draft FILE, --ngram, --draft-layers L or
 * --eagle-drafter DIR (each repeatable), or an entry of --drafters. */
typedef enum drafter_kind { DRAFT_MODEL, DRAFT_NGRAM, DRAFT_LAYERS, DRAFT_EAGLE } drafter_kind;
typedef struct drafter_spec {
    drafter_kind kind;
    const char *model; /* DRAFT_MODEL: the draft model file; DRAFT_EAGLE: the head's directory */
    int layers;        /* DRAFT_LAYERS */
} drafter_spec;

/* Strings are borrowed from argv (valid for the process's life). */
typedef struct launch_opts {
    const char *target;
    bool no_draft;
    bool local_ngram; /* --local-ngram: the coordinator's own n-gram drafter */
    const char *eagle; /* --eagle DIR: an EAGLE-3 head drafting in every verifier group's leader */
    const char *eagle_weights; /* --eagle-weights q8_0|stored: passed to every head (NULL: their default) */
    drafter_spec drafters[MAX_DRAFTERS];
    int n_drafters;
    int tp, groups;
    const char *client_addr, *worker_addr;
    const char *group_addr; /* the verifier group's own socket (--tp > 1) */
    int device_base;        /* -1: verifier ranks on the CPU; N: rank r on cuda:N+r */
    int threads_verifier, threads_drafter;
    const char *bin_dir;
    int ready_timeout_s, stop_timeout_s;
    bool restart, verbose;
    bool no_gateway;
    const char *http;      /* the gateway's --listen ADDR:PORT */
    const char *curve_dir; /* --curve DIR: keys for every link, NULL = plaintext on loopback */
    bool addrs_given;      /* --client-addr, --worker-addr or --group-addr given */
    bool insecure;         /* --insecure: the TCP loopback defaults, open to every local user */
    char model_name[256];  /* the gateway's --model-name: the target's file name without .gguf */
    const char *extra[CHILD_ROLE_COUNT][MAX_EXTRA_ARGS]; /* per child_role: passed through verbatim */
    int n_extra[CHILD_ROLE_COUNT];
} launch_opts;

/* Fills *o from the defaults and argv (--drafters lists are cut in place).
 * Returns -1 to run, 0 after --help (on stdout), 2 on a usage error (the
 * reason on stderr). Not thread-safe (getopt). */
int launch_args_parse(int argc, char **argv, launch_opts *o);

#endif
