/* head_relay.c — a verifier group's EAGLE-3 head as a drafter of its own
 * (specd-verifier --eagle DIR).
 *
 * The head reads the target's hidden states, which only the verifier has,
 * so it drafts there: each normal verify step asks it for the next step's
 * drafts (VerifySeq.next_k), and they come back with the verdict
 * (VerifyResult.next_draft / next_q), with no drafter round trip.
 * sched_results.c stores them on the session (sd_head_store).
 *
 * Everything else in the coordinator (adaptive K, the drafter kind choice,
 * placement, shadow drafts, metrics, the cost model) is about drafters, so
 * the head is given one: for every live group whose Hello announced a head
 * (drafter_kind EAGLE) this module registers a relay, a worker of kind
 * EAGLE that serves only the requests on that group (placement.c,
 * drafter_fits). A draft step sent to it is answered on the spot from the
 * drafts stored on each session, when they continue the context the step
 * names (head_base tokens ending in head_last), else with none; its
 * draft_us is the head's own time for them, measured by the verifier, so
 * the cost model prices the head by what it costs the verifier. The
 * transport is local_draft.c's: c->io is wrapped, replies are packed as a
 * worker would send them and wait in a short queue until the handler that
 * sent the request has returned (sd_head_relays_pump). A relay whose group
 * goes away says UNAVAILABLE and is dropped at once; a group that
 * registers again gets a new relay.
 *
 * Rejected: taking the head's drafts straight into s->draft when the
 * verify result arrives. It saves the in-process step, but every kind-wise
 * piece above would need a case for "drafts that came with no drafter".
 *
 * Routing ids are six bytes starting with a zero byte (as local_draft.c's,
 * which libzmq never generates) and end with the group's worker slot. */
#include "coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RELAY_QUEUE    (2 * SD_COORD_MAX_WORKERS + 8)
#define RELAY_PUMP_MAX 256

typedef struct relay {
    bool active;
    uint64_t group_worker_id; /* the registration of the group it drafts for */
} relay;

struct sd_head_relays {
    sd_coord *c;
    sd_coord_io inner;
    relay r[SD_COORD_MAX_WORKERS]; /* by group slot */
    struct {
        uint8_t ident[6];
        uint8_t *buf;
        size_t len;
    } q[RELAY_QUEUE];
    int32_t q_head, q_len;
    uint64_t dropped;
};

static void relay_ident(int32_t g, uint8_t *ident) {
    ident[0] = 0;
    memcpy(ident + 1, "head", 4);
    ident[5] = (uint8_t)g;
}

bool sd_head_relay_is_ident(const uint8_t *ident, size_t ident_len, int32_t *group) {
    if (ident_len != 6 || ident[0] != 0 || memcmp(ident + 1, "head", 4) != 0 || ident[5] >= SD_COORD_MAX_WORKERS)
        return false;
    if (group) *group = ident[5];
    return true;
}

bool sd_head_store(sd_session *s, const Specd__VerifyResult *vr) {
    size_t n = vr->n_next_draft < SD_MAX_K ? vr->n_next_draft : SD_MAX_K, total = 0;
    for (size_t j = 0; j < n; j++) total += vr->next_q[j]->n_ids;
    if (total > s->head_q_cap) {
        int32_t *ids = realloc(s->head_q_ids, total * sizeof *ids);
        if (!ids) return false;
        s->head_q_ids = ids;
        float *pr = realloc(s->head_q_probs, total * sizeof *pr);
        if (!pr) return false;
        s->head_q_probs = pr;
        s->head_q_cap = total;
    }
    size_t off = 0;
    s->head_q_off[0] = 0;
    for (size_t j = 0; j < n; j++) {
        const Specd__SparseDist *q = vr->next_q[j];
        s->head_draft[j] = vr->next_draft[j];
        memcpy(s->head_q_ids + off, q->ids, q->n_ids * sizeof *s->head_q_ids);
        memcpy(s->head_q_probs + off, q->probs, q->n_ids * sizeof *s->head_q_probs);
        off += q->n_ids;
        s->head_q_off[j + 1] = (uint32_t)off;
    }
    s->head_k = (int32_t)n;
    s->head_base = (int32_t)vr->cached_len + 1;
    s->head_last = vr->commit[vr->n_commit - 1]; /* validated: a result with head drafts commits */
    /* the drafts' price: the catch-up (head rows of a context it fell behind
     * on) is what shadowing costs, priced apart (sched_results.c) */
    s->head_us = vr->next_us - (vr->next_catchup_us < vr->next_us ? vr->next_catchup_us : vr->next_us);
    return true;
}

/* Packs env as a worker would send it, from relay g, for the next pump. */
static void queue_reply(sd_head_relays *hr, int32_t g, const Specd__WorkerToCoordinator *env) {
    if (hr->q_len == RELAY_QUEUE) {
        hr->dropped++;
        SD_WARN("head relay: reply queue full, a reply dropped (%llu so far)", (unsigned long long)hr->dropped);
        return;
    }
    size_t len = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        hr->dropped++;
        SD_ERROR("head relay: out of memory for a reply");
        return;
    }
    protobuf_c_message_pack(&env->base, buf);
    int32_t at = (hr->q_head + hr->q_len) % RELAY_QUEUE;
    relay_ident(g, hr->q[at].ident);
    hr->q[at].buf = buf;
    hr->q[at].len = len;
    hr->q_len++;
}

/* One sequence of a draft step: the stored drafts when they continue
 * the context the step names, else none. Adds the head's time to *us. */
static void draft_one(sd_coord *c, const Specd__DraftSeq *ds, Specd__DraftResult *dr, Specd__SparseDist *dists,
                      Specd__SparseDist **pdists, uint32_t *us) {
    dr->request_id = ds->request_id;
    dr->code = SPECD__CODE__CODE_OK;
    const int64_t len = (int64_t)ds->keep_len + (int64_t)ds->n_append;
    dr->cached_len = (uint32_t)len; /* it holds nothing: whatever is named is "held" */
    sd_session *s = sd_sched_find(c, ds->request_id);
    if (!s || s->head_base < 0 || s->head_base != len || len > s->n_tokens || s->tokens[len - 1] != s->head_last)
        return;
    size_t n = (size_t)sd_imin(s->head_k, (int32_t)ds->k);
    dr->n_tokens = dr->n_q = n;
    dr->tokens = s->head_draft;
    dr->q = pdists;
    for (size_t j = 0; j < n; j++) {
        specd__sparse_dist__init(&dists[j]);
        dists[j].n_ids = dists[j].n_probs = s->head_q_off[j + 1] - s->head_q_off[j];
        dists[j].ids = s->head_q_ids + s->head_q_off[j];
        dists[j].probs = s->head_q_probs + s->head_q_off[j];
        pdists[j] = &dists[j];
    }
    *us += s->head_us;
    s->head_us = 0; /* told once: a shadow and a normal step may read the same drafts */
}

static void reply_draft(sd_head_relays *hr, int32_t g, const Specd__DraftRequest *req) {
    size_t n = req->n_seqs;
    Specd__DraftResult *res = calloc(n ? n : 1, sizeof *res);
    Specd__DraftResult **pres = calloc(n ? n : 1, sizeof *pres);
    Specd__SparseDist *dists = calloc((n ? n : 1) * SD_MAX_K, sizeof *dists);
    Specd__SparseDist **pdists = calloc((n ? n : 1) * SD_MAX_K, sizeof *pdists);
    Specd__DraftResponse resp = SPECD__DRAFT_RESPONSE__INIT;
    resp.step_id = req->step_id;
    if (res && pres && dists && pdists) {
        uint32_t us = 0;
        for (size_t i = 0; i < n; i++) {
            specd__draft_result__init(&res[i]);
            draft_one(hr->c, req->seqs[i], &res[i], dists + i * SD_MAX_K, pdists + i * SD_MAX_K, &us);
            pres[i] = &res[i];
        }
        resp.n_results = n;
        resp.results = pres;
        resp.draft_us = us;
        Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
        env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
        env.draft = &resp;
        queue_reply(hr, g, &env);
    } else {
        SD_ERROR("head relay: out of memory for a draft step of %zu sequences", n);
    }
    free(res);
    free(pres);
    free(dists);
    free(pdists);
}

static void reply_heartbeat(sd_head_relays *hr, int32_t g) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    queue_reply(hr, g, &env);
}

static void deliver(sd_head_relays *hr, int32_t g, const Specd__CoordinatorToWorker *env) {
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME:
        SD_INFO("head relay of verifier group slot %d registered as worker %llu", (int)g,
                (unsigned long long)env->welcome->worker_id);
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_ERROR:
        SD_WARN("head relay %d: the coordinator says %s: %s", (int)g, sd_net_code_name(env->error->code),
                env->error->message ? env->error->message : "");
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT: reply_heartbeat(hr, g); break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT: reply_draft(hr, g, env->draft); break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE: break; /* the drafts live on the sessions */
    default: SD_WARN("head relay %d: message case %d ignored", (int)g, (int)env->body_case); break;
    }
}

static bool to_worker(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToWorker *env) {
    sd_head_relays *hr = user;
    int32_t g;
    if (!sd_head_relay_is_ident(ident, ident_len, &g))
        return hr->inner.to_worker(hr->inner.user, ident, ident_len, env);
    if (hr->r[g].active) deliver(hr, g, env);
    return hr->r[g].active;
}

static sd_coord_sent to_client(void *user, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len) {
    sd_head_relays *hr = user;
    return hr->inner.to_client(hr->inner.user, ident, ident_len, body, len);
}

/* Registers relay g for group slot g (a verifier leader with a head). */
static void say_hello(sd_head_relays *hr, int32_t g) {
    sd_coord *c = hr->c;
    const sd_coord_worker *v = &c->workers[g];
    char name[96];
    snprintf(name, sizeof name, "head of %s", v->name);
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = c->arch;
    id.vocab_size = (uint32_t)c->n_vocab;
    id.vocab_hash = c->vocab_hash;
    id.context_length = (uint32_t)v->n_ctx;
    id.name = (char *)"eagle-head";
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = SD_PROTOCOL_VERSION;
    h.role = SPECD__ROLE__ROLE_DRAFTER;
    h.group_size = 1;
    h.model = &id;
    h.name = name;
    h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    h.max_batch = (uint32_t)v->max_batch;
    h.max_k = (uint32_t)v->max_k;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    env.hello = &h;
    queue_reply(hr, g, &env);
}

/* Relay g's group is gone: it leaves at once (UNAVAILABLE), its requests
 * go to another drafter at the next pump. */
static void say_gone(sd_head_relays *hr, int32_t g) {
    Specd__Error e;
    sd_net_error_init(&e, SPECD__CODE__CODE_UNAVAILABLE, 0, 0, "its verifier group is gone");
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR;
    env.error = &e;
    queue_reply(hr, g, &env);
}

static void sync_relays(sd_head_relays *hr) {
    sd_coord *c = hr->c;
    for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++) {
        const sd_coord_worker *v = &c->workers[g];
        bool has_head = sd_coord_is_group(v) && v->drafter_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
        relay *r = &hr->r[g];
        if (r->active && (!has_head || r->group_worker_id != v->worker_id)) {
            say_gone(hr, g);
            r->active = false;
        }
        if (has_head && !r->active) {
            r->active = true;
            r->group_worker_id = v->worker_id;
            say_hello(hr, g);
        }
    }
}

sd_status sd_head_relays_new(sd_coord *c, sd_head_relays **out) {
    *out = NULL;
    sd_head_relays *hr = calloc(1, sizeof *hr);
    if (!hr) return SD_ERR_NOMEM;
    hr->c = c;
    hr->inner = c->io;
    c->io = (sd_coord_io){.user = hr, .to_worker = to_worker, .to_client = to_client};
    *out = hr;
    return SD_OK;
}

bool sd_head_relays_pending(const sd_head_relays *hr) { return hr && hr->q_len > 0; }

void sd_head_relays_pump(sd_head_relays *hr, uint64_t now_us) {
    if (!hr) return;
    sync_relays(hr);
    for (int32_t i = 0; i < RELAY_PUMP_MAX && hr->q_len > 0; i++) {
        uint8_t ident[6];
        memcpy(ident, hr->q[hr->q_head].ident, sizeof ident);
        uint8_t *buf = hr->q[hr->q_head].buf;
        size_t len = hr->q[hr->q_head].len;
        hr->q_head = (hr->q_head + 1) % RELAY_QUEUE;
        hr->q_len--;
        sd_workers_on_message(hr->c, ident, sizeof ident, buf, len, now_us);
        free(buf);
        sync_relays(hr); /* a Hello may have been refused or a group lost meanwhile */
    }
}

void sd_head_relays_free(sd_head_relays **hrp) {
    if (!hrp || !*hrp) return;
    sd_head_relays *hr = *hrp;
    if (hr->c && hr->c->io.user == hr) hr->c->io = hr->inner;
    while (hr->q_len > 0) {
        free(hr->q[hr->q_head].buf);
        hr->q_head = (hr->q_head + 1) % RELAY_QUEUE;
        hr->q_len--;
    }
    free(hr);
    *hrp = NULL;
}
