/* group.h — the control plane of a tensor-parallel verifier group (see
 * group.c): how rank 0 (the leader) and ranks 1..N-1 find each other over
 * the group's own ZeroMQ socket, build their collectives, run every forward
 * in lockstep, watch each other with heartbeats and end the group when one
 * of them dies or hangs.
 *
 * The leader's side is a handle: sd_group_leader_start returns once every
 * rank has joined and the collectives are open; the model then gets the
 * group's collectives (sd_model_set_coll) and its plan sink
 * (sd_model_set_plan_sink(m, sd_group_plan, g)), and the worker loop gets
 * sd_group_down_fd as its fail_fd. A rank's side is one call that runs
 * until the group ends. Neither keeps global state. */
#ifndef SPECD_VERIFIER_GROUP_H
#define SPECD_VERIFIER_GROUP_H

#include "specd/coll.h"
#include "specd/model.h"
#include "specd/net.h"
#include "specd/worker.h"

typedef struct sd_group sd_group;

/* Default group heartbeat: 200 ms x 10 = a peer silent for 2 s is dead. */
#define SD_GROUP_HEARTBEAT_MS 200
#define SD_GROUP_LIVENESS     10

typedef struct sd_group_params {
    const char *addr;          /* the group's socket: the leader binds it, ranks connect (required) */
    int32_t rank, size;        /* this process's rank; ranks in the group (>= 2) */
    uint32_t group_id;         /* the group's id (--group-id; 0 = not named): every rank's must equal the leader's */
    int32_t device;            /* -1: CPU ranks, shared-memory collectives; N: CUDA device N, NCCL */
    sd_model_identity model;   /* every rank's must equal the leader's */
    int32_t lm_head;           /* sd_tp_lm_head in effect here (sd_model_shard_of): must match */
    uint64_t weight_bytes;     /* this rank's resident weights, for the leader's log */
    int heartbeat_interval_ms; /* default SD_GROUP_HEARTBEAT_MS */
    int liveness;              /* default SD_GROUP_LIVENESS intervals */
    int join_timeout_ms;       /* leader: until every rank joined; rank: until the leader answers (default 600 s) */
    int coll_timeout_ms;       /* bound on every collective wait (default 10000) */
    size_t coll_max_bytes;     /* shared-memory payload per round (default 1 MiB) */
    int32_t kv_blocks, block_size; /* leader: the KV pool shape every rank allocates (required) */
    int32_t window_blocks;         /* leader: its cache's window pool (sd_model_kv_window_blocks; 0 none) */
    int stop_fd;                   /* readable = stop (a signalfd); -1 = never */
    /* CurveZMQ on the group link (borrowed; NULL or off: plaintext). The
     * leader binds with its own key and admits the keys of rank_keys; a rank
     * connects with its own key and curve->server = the leader's key. */
    const sd_curve_id *curve;
    const sd_curve_allow *rank_keys; /* leader: required with curve */
    bool insecure;                   /* leader: plaintext beyond loopback, or an NCCL id in plaintext */
} sd_group_params;

/* Defaults as above; addr NULL, rank 0, size 0, device -1, stop_fd -1. */
sd_group_params sd_group_default_params(void);

/* ---- leader (rank 0) ---- */

/* Binds p->addr, waits (bounded by join_timeout_ms, and stop_fd) until every
 * rank has joined with a matching model, size, LM head mode and device kind,
 * hands each the collectives' setup (a fresh shared-memory name, or the NCCL
 * unique id, which is never logged), opens its own end and waits for every
 * rank to be ready; then starts the group thread (heartbeats, plans, failure
 * detection). SD_ERR_TIMEOUT when ranks did not join in time,
 * SD_ERR_INVALID_ARG when one does not match (it is told so and the leader
 * must not start: a configuration error), SD_ERR_ABORTED on stop_fd.
 * Caller frees with sd_group_close. */
sd_status sd_group_leader_start(void *zctx, const sd_group_params *p, sd_group **out);

/* The group's collectives (borrowed, valid until sd_group_close). */
sd_coll *sd_group_coll(const sd_group *g);

/* The leader model's plan sink (an sd_model_plan_fn; user is the sd_group):
 * sends the plan to every rank. SD_ERR_ABORTED once the group is down.
 * Called from one thread at a time (the forward's). */
sd_status sd_group_plan(void *group, const sd_model_plan *plan);

/* Marks the group down (first call wins): aborts its collectives, tells
 * the ranks, makes sd_group_down_fd readable. Any thread. */
void sd_group_fail(sd_group *g, const char *reason);

/* Readable once the group is down (a rank died, hung, failed or left). */
int sd_group_down_fd(const sd_group *g);

/* Why the group went down ("" while it is up); valid until sd_group_close. */
const char *sd_group_down_reason(const sd_group *g);

/* Ends the group: a healthy group's ranks are told the leader stops
 * (GroupStop, clean); the collectives are closed (aborted when down).
 * *g = NULL. */
void sd_group_close(sd_group **g);

/* ---- ranks 1..N-1 ---- */

typedef enum sd_group_exit {
    SD_GROUP_STOPPED = 0, /* stop_fd, or the leader stopped the group cleanly */
    SD_GROUP_DOWN = 4,    /* the group failed: the leader went silent or said so, or a plan failed here */
    SD_GROUP_REFUSED = 3, /* the leader refused the join (wrong model, size, ...) */
} sd_group_exit;

/* Joins the group at p->addr with the shard m (loaded as rank p->rank of
 * p->size; its collectives are set here), serves the leader's plans until
 * the group ends, and says why in *why. Returns an error only when the
 * group could not be joined at all (socket, collectives, KV pool, or no
 * answer within join_timeout_ms). */
sd_status sd_group_rank_run(void *zctx, const sd_group_params *p, sd_model *m, sd_group_exit *why);

#endif
