/* outbox.c — where every message leaves the coordinator's state, and the
 * peer bookkeeping that sending implies.
 *
 * The scheduler, the client link and the worker registry all send through
 * these functions, which hand the envelope to c->io (bound by the server loop
 * to its two ROUTER sockets, by tests to fakes) and note the send time that
 * heartbeats are scheduled from. Nothing here calls back up: before it, the
 * send wrappers lived in clients.c and workers.c, so the scheduler called up
 * into the modules that call it (clients.c -> the scheduler -> clients.c).
 *
 * No reply is dropped. A client's queue in libzmq holds a high-water mark
 * of messages; past it a send fails at once (EAGAIN: the loop never blocks
 * on one slow client). The reply is then kept, packed, in that client's
 * backlog, and every later reply to it joins the backlog behind it (order
 * kept); sd_outbox_flush, every pass of the loop, sends the backlog as the
 * queue drains. The backlog counts against its client: while one waits,
 * clients.c refuses that client's new submits (OVERLOADED, which is itself
 * a small reply in the backlog), so a flood meets backpressure rather than
 * new work. A backlog over SD_COORD_BACKLOG_BYTES (or all of them over
 * SD_COORD_BACKLOG_TOTAL_BYTES), or one that has not shrunk for
 * SD_COORD_BACKLOG_STALL_US, belongs to a client that does not read: it is dropped
 * whole and its requests are cancelled (sd_clients_tick), so memory stays
 * bounded. Rejected: stopping reads on the client socket while a backlog
 * waits (one ROUTER serves every client, so one slow reader would stall
 * all of them), and dropping the reply (the loss this replaces: a flood
 * of 10,000 submits left 19 without an answer). */
#include "coord.h"

#include <stdlib.h>
#include <string.h>

struct sd_coord_reply {
    sd_coord_reply *next;
    size_t len;
    uint8_t bytes[];
};

void sd_outbox_worker(sd_coord *c, int32_t wi, const Specd__CoordinatorToWorker *env, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[wi];
    if (!c->io.to_worker(c->io.user, w->ident, w->ident_len, env)) w->unreachable = true;
    w->last_send_us = now_us;
}

void sd_outbox_client_forget(sd_coord *c, sd_coord_client *cl) {
    if (cl->backlog) c->n_backlogged--;
    while (cl->backlog) {
        sd_coord_reply *r = cl->backlog;
        cl->backlog = r->next;
        free(r);
    }
    c->backlog_bytes -= cl->backlog_bytes;
    cl->backlog_tail = NULL;
    cl->backlog_n = cl->backlog_bytes = 0;
}

/* cl does not read its replies: everything waiting for it goes, and so does
 * whatever comes next until the tick cancels its requests. */
static void drop_unreading(sd_coord *c, sd_coord_client *cl, const char *why) {
    SD_WARN("a client does not read its replies (%s: %zu replies, %zu bytes waiting): dropping them and "
            "cancelling its %d requests",
            why, cl->backlog_n, cl->backlog_bytes, cl->n_active);
    sd_outbox_client_forget(c, cl);
    cl->unreading = true;
}

/* Appends a copy of body to cl's backlog, within the bounds. */
static void backlog_push(sd_coord *c, sd_coord_client *cl, const uint8_t *body, size_t len, uint64_t now_us) {
    if (cl->backlog_bytes + len > SD_COORD_BACKLOG_BYTES) {
        drop_unreading(c, cl, "over the per-client bound");
        return;
    }
    if (c->backlog_bytes + len > SD_COORD_BACKLOG_TOTAL_BYTES) {
        drop_unreading(c, cl, "over the bound for all clients");
        return;
    }
    sd_coord_reply *r = malloc(sizeof *r + (len ? len : 1));
    if (!r) {
        drop_unreading(c, cl, "out of memory");
        return;
    }
    r->next = NULL;
    r->len = len;
    memcpy(r->bytes, body, len);
    if (!cl->backlog) {
        c->n_backlogged++;
        cl->backlog = r;
        cl->backlog_moved_us = now_us;
    } else {
        cl->backlog_tail->next = r;
    }
    cl->backlog_tail = r;
    cl->backlog_n++;
    cl->backlog_bytes += len;
    c->backlog_bytes += len;
}

void sd_outbox_client(sd_coord *c, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToClient *env,
                      uint64_t now_us) {
    uint8_t small[512];
    size_t len = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *body = len <= sizeof small ? small : malloc(len);
    if (!body) {
        SD_ERROR("out of memory packing a %zu-byte reply to a client", len);
        return;
    }
    protobuf_c_message_pack(&env->base, body);
    /* A record to hold a backlog: a client refused before it had one gets
     * one now (when the table is full, a full queue still loses the reply,
     * with an error in the log). */
    sd_coord_client *cl = sd_coord_client_find(c, ident, ident_len, false);
    if (!cl && (cl = sd_coord_client_find(c, ident, ident_len, true)) != NULL) cl->last_recv_us = now_us;
    if (cl && cl->unreading) {
        /* discarded: the client is being dropped */
    } else if (cl && cl->backlog) {
        backlog_push(c, cl, body, len, now_us);
    } else {
        sd_coord_sent r = c->io.to_client(c->io.user, ident, ident_len, body, len);
        if (r == SD_COORD_FULL && cl)
            backlog_push(c, cl, body, len, now_us);
        else if (r == SD_COORD_FULL)
            SD_ERROR("a reply to a client is lost: its queue is full and the client table too");
    }
    if (cl) cl->last_send_us = now_us;
    if (body != small) free(body);
}

void sd_outbox_flush(sd_coord *c, uint64_t now_us) {
    for (int32_t i = 0; c->n_backlogged > 0 && i < c->n_clients; i++) {
        sd_coord_client *cl = &c->clients[i];
        bool moved = false;
        while (cl->backlog) {
            sd_coord_reply *r = cl->backlog;
            sd_coord_sent st = c->io.to_client(c->io.user, cl->ident, cl->ident_len, r->bytes, r->len);
            if (st == SD_COORD_FULL) break;
            if (st == SD_COORD_GONE) { /* disconnected: nobody to deliver to (its liveness cancels the rest) */
                sd_outbox_client_forget(c, cl);
                break;
            }
            cl->backlog = r->next;
            cl->backlog_n--;
            cl->backlog_bytes -= r->len;
            c->backlog_bytes -= r->len;
            free(r);
            moved = true;
        }
        if (!cl->backlog) {
            if (cl->backlog_tail) c->n_backlogged--;
            cl->backlog_tail = NULL;
        } else if (moved) {
            cl->backlog_moved_us = now_us;
        }
    }
}

void sd_outbox_client_error(sd_coord *c, const uint8_t *ident, size_t ident_len, Specd__Code code, uint64_t request_id,
                            uint64_t client_tag, const char *msg, uint64_t now_us) {
    Specd__Error e;
    sd_net_error_init(&e, code, request_id, client_tag, msg);
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR;
    env.error = &e;
    sd_outbox_client(c, ident, ident_len, &env, now_us);
}

sd_coord_client *sd_coord_client_find(sd_coord *c, const uint8_t *ident, size_t ident_len, bool create) {
    for (int32_t i = 0; i < c->n_clients; i++)
        if (c->clients[i].ident_len == ident_len && memcmp(c->clients[i].ident, ident, ident_len) == 0)
            return &c->clients[i];
    if (!create || c->n_clients == SD_COORD_MAX_CLIENTS) return NULL;
    sd_coord_client *cl = &c->clients[c->n_clients++];
    memset(cl, 0, sizeof *cl);
    memcpy(cl->ident, ident, ident_len);
    cl->ident_len = ident_len;
    return cl;
}

void sd_coord_client_request_done(sd_coord *c, const uint8_t *ident, size_t ident_len) {
    sd_coord_client *cl = sd_coord_client_find(c, ident, ident_len, false);
    if (cl && cl->n_active > 0) cl->n_active--;
}

void sd_outbox_release(sd_coord *c, int32_t wi, uint64_t request_id, uint64_t now_us) {
    Specd__Release rel = SPECD__RELEASE__INIT;
    rel.n_request_ids = 1;
    rel.request_ids = &request_id;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE;
    env.release = &rel;
    sd_outbox_worker(c, wi, &env, now_us);
}
