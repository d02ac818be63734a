/* client_impl.h — libspecd-client's insides, shared by its files:
 * client.c (the I/O thread, connect and close), client_handle.c (one
 * function per message the coordinator sends) and client_api.c (the calls
 * of specd/client.h). Nothing here is public. Locking: the _locked
 * functions are called with c->mu held; the ones that run a callback drop
 * it for the call and take it again (say so where they do). */
#ifndef SPECD_CLIENT_IMPL_H
#define SPECD_CLIENT_IMPL_H

#include "specd/client.h"

#include <pthread.h>
#include <stdint.h>

enum req_state { REQ_PENDING, REQ_ACTIVE, REQ_FINISHING, REQ_DONE };

typedef struct req {
    uint64_t client_tag;
    uint64_t server_id; /* the current coordinator's id (result.request_id is the first one); 0 while resubmitted */
    enum req_state state;
    uint8_t *submit; /* the packed ClientToCoordinator Submit, for resubmission */
    size_t submit_len;
    uint32_t max_tokens;   /* as submitted (0 = the coordinator's default) */
    bool cancel_requested; /* cancelled while resubmitted: sent once the new id is known */
    bool in_submit;        /* sd_client_submit still reads it: sd_client_wait must not collect it yet */
    uint64_t sent_ms;      /* when its Submit was (re)queued: the answer deadline runs from here */
    uint64_t deadline_ms;  /* the whole request ends by then (monotonic ms; 0 = none) */
    sd_client_token_cb cb;
    void *user;
    sd_client_result result;
    size_t ids_cap, text_cap;
    struct req *next;
} req;

typedef struct outmsg {
    uint8_t *data;
    size_t len;
    struct outmsg *next;
} outmsg;

typedef struct stats_waiter {
    bool done;
    sd_status status;
    sd_client_service_stats *out;
    struct stats_waiter *next;
} stats_waiter;

struct sd_client {
    sd_client_params params;
    char addr[512];
    char curve_server_public[64], curve_public[64], curve_secret[64]; /* copies, for reopening */
    char name[128];                                                   /* sent in Hello */
    uint8_t *hello;                                                   /* the packed Hello of this connection */
    size_t hello_len;
    uint32_t n_resubmits; /* coordinator restarts lived through */
    void *zctx, *sock;
    void *monitor;          /* failed handshakes of sock (CurveZMQ only) */
    char refused[256];      /* set once the coordinator refused our key: every request fails with it */
    int handshake_failures; /* in a row, without detail (SD_NET_HANDSHAKE_TRIES make a refusal) */
    int wake_fd;
    pthread_t io;
    bool io_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    outmsg *out_head, *out_tail;
    req *reqs;
    stats_waiter *stats_waiters;
    uint64_t next_tag;
};

/* Monotonic milliseconds. */
uint64_t sd_client_mono_ms(void);
/* Wakes the I/O thread (its eventfd). */
void sd_client_wake(sd_client *c);
/* Packs env and queues it for the I/O thread. Locked. */
sd_status sd_client_enqueue_locked(sd_client *c, const ProtobufCMessage *env);
/* The record of the id the user knows (the first coordinator's), or NULL. Locked. */
req *sd_client_find_by_id_locked(sd_client *c, uint64_t request_id);
/* Frees r and its result; NULL-safe. */
void sd_client_req_free(req *r);
/* Appends tokens and text to r's result; false when out of memory. */
bool sd_client_append_tokens(req *r, const int32_t *ids, size_t n, const uint8_t *text, size_t text_len);
/* Ends r: records the status, runs the final callback (dropping the lock
 * for it), publishes. Locked. */
void sd_client_finish_locked(sd_client *c, req *r, sd_status status, Specd__Code code, const char *why,
                             const uint8_t *tail, size_t tail_len);
/* Queues a Cancel of the coordinator's request_id. Locked. */
void sd_client_send_cancel_locked(sd_client *c, uint64_t request_id);
/* One message from the coordinator (client_handle.c). Locked; callbacks
 * run with the lock dropped. */
void sd_client_handle_locked(sd_client *c, const Specd__CoordinatorToClient *env);

#endif
