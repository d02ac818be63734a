/* outbox.c — where every message leaves the coordinator's state, and the
 * peer bookkeeping that sending implies.
 *
 * The scheduler, the client link and the worker registry all send through
 * these functions, which hand the envelope to c->io (bound by the server loop
 * to its two ROUTER sockets, by tests to fakes) and note the send time that
 * heartbeats are scheduled from. Nothing here calls back up: before it, the
 * send wrappers lived in clients.c and workers.c, so the scheduler called up
 * into the modules that call it (clients.c -> the scheduler -> clients.c). */
#include "coord.h"

#include <string.h>

void sd_outbox_worker(sd_coord *c, int32_t wi, const Specd__CoordinatorToWorker *env, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[wi];
    if (!c->io.to_worker(c->io.user, w->ident, w->ident_len, env)) w->unreachable = true;
    w->last_send_us = now_us;
}

void sd_outbox_client(sd_coord *c, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToClient *env,
                      uint64_t now_us) {
    c->io.to_client(c->io.user, ident, ident_len, env);
    for (int32_t i = 0; i < c->n_clients; i++) {
        if (c->clients[i].ident_len == ident_len && memcmp(c->clients[i].ident, ident, ident_len) == 0) {
            c->clients[i].last_send_us = now_us;
            break;
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
