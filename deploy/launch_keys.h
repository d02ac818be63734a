/* launch_keys.h — the key files specd-launch --curve DIR makes for a
 * single-host service (launch_keys.c). */
#ifndef SPECD_LAUNCH_KEYS_H
#define SPECD_LAUNCH_KEYS_H

#include <limits.h>
#include <stdbool.h>

#include "specd/common.h"
#include "specd/curve.h"

/* Key pairs by name: DIR/NAME.key (secret) and DIR/NAME.pub. */
typedef enum launch_key {
    LAUNCH_KEY_COORDINATOR, /* the server of the client and worker sockets */
    LAUNCH_KEY_VERIFIER,    /* the verifier leader: a worker, and the server of the group socket */
    LAUNCH_KEY_RANK,        /* verifier ranks 1..N-1 (one key for all: they run the same binary here) */
    LAUNCH_KEY_DRAFTER,     /* the drafter: a worker */
    LAUNCH_KEY_GATEWAY,     /* the gateway: a client */
    LAUNCH_KEY_CLIENT,      /* for the user's specd-client: a client */
    LAUNCH_KEY_LAUNCH,      /* specd-launch's own readiness queries: a client */
    LAUNCH_KEY_COUNT
} launch_key;

typedef struct launch_keys {
    char secret[LAUNCH_KEY_COUNT][PATH_MAX]; /* DIR/NAME.key */
    char pub[LAUNCH_KEY_COUNT][PATH_MAX];    /* DIR/NAME.pub */
    char clients_allow[PATH_MAX];            /* gateway, client, launch */
    char workers_allow[PATH_MAX];            /* verifier, drafter */
    char ranks_allow[PATH_MAX];              /* rank */
    sd_curve_id launch_id;                   /* the launcher's own keys, loaded */
} launch_keys;

/* Creates dir (mode 0700) when missing; keeps the key pairs already there
 * (so a client key handed out stays valid across restarts) and generates the
 * missing ones; rewrites the three allow-lists from the public keys. */
sd_status launch_keys_make(const char *dir, launch_keys *k);

#define LAUNCH_KEY_MAX_ARGS 8

/* The key flags of the child holding key `who` (COORDINATOR, VERIFIER: the
 * leader, RANK, DRAFTER, GATEWAY) in a service whose verifier group has tp
 * ranks: its own secret key, the public key of the server it connects to,
 * the allow-lists of the sockets it binds. Returns how many strings went
 * into argv (borrowed from k). */
int launch_keys_args(const launch_keys *k, launch_key who, int tp, const char *argv[LAUNCH_KEY_MAX_ARGS]);

#endif
