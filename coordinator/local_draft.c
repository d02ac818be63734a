/* local_draft.c — the n-gram drafter inside the coordinator process
 * (specd-coordinator --local-ngram).
 *
 * Lookup decoding needs no model, only the committed tokens, which the
 * coordinator owns. In its own process the n-gram drafter costs a draft
 * round trip after every commit (coordinator -> drafter -> coordinator,
 * 0.26-2.3 ms on the 2-core CPU against a ~10 ms verify step), and the
 * scheduler prices that round trip: it holds requests at K = 0 that would
 * pay in one process, and shadow-drafts them less often
 * (bench/results/ngram-cpu.md: 1.28-1.34 tokens per target step through the
 * service against 1.90 in one process on the copy-heavy prompts).
 *
 * Here the same drafter (engine/spec/drafter.c) behind the same request
 * handling as specd-drafter (drafter/draft_serve.c) is a registered worker
 * like any other: it says Hello, is welcomed, gets DraftRequest steps and
 * Releases, answers heartbeats, and shows in the stats. Only the transport
 * differs: the coordinator's sd_coord_io is wrapped so that what is sent to
 * this worker's routing id is answered on the spot, and the answer, packed
 * as the worker would send it, waits in a short queue until the handler that
 * sent the request has returned (the scheduler is not re-entrant). The
 * server loop delivers the queue after every message it handles
 * (sd_local_drafter_pump). A draft step thus costs the lookup and the
 * (un)packing, microseconds, and the cost model measures it as it measures
 * any drafter.
 *
 * The routing id starts with a zero byte and is six bytes long: libzmq
 * reserves ids that start with zero for the ids it generates itself, which
 * are five bytes long, so no peer can be addressed as this worker; the
 * server drops anything arriving from a peer with this id all the same. */
#include "coord.h"
#include "draft_serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOCAL_QUEUE    8  /* one draft step and a heartbeat are ever waiting */
#define LOCAL_PUMP_MAX 64 /* messages delivered per pump (each may queue the next) */

static const uint8_t LOCAL_IDENT[6] = {0, 'n', 'g', 'r', 'a', 'm'};

struct sd_local_drafter {
    sd_coord *c;
    sd_coord_io inner; /* the transport of every other peer */
    sd_drafter *drafter;
    sd_draft_server *server;
    struct {
        uint8_t *buf;
        size_t len;
    } q[LOCAL_QUEUE];
    int32_t q_head, q_len;
    uint64_t worker_id;     /* from the Welcome; 0 until registered */
    uint64_t dropped;       /* replies lost to a full queue (never expected) */
    sd_net_draft_step step; /* the step in hand: the scheduler's request, its sampling converted back */
};

bool sd_local_drafter_is_ident(const uint8_t *ident, size_t ident_len) {
    return ident_len == sizeof LOCAL_IDENT && memcmp(ident, LOCAL_IDENT, sizeof LOCAL_IDENT) == 0;
}

/* Packs env as the worker would send it and queues it for the next pump. */
static void queue_reply(sd_local_drafter *ld, const Specd__WorkerToCoordinator *env) {
    if (ld->q_len == LOCAL_QUEUE) {
        ld->dropped++;
        SD_WARN("in-coordinator n-gram drafter: reply queue full, a reply dropped (%llu so far)",
                (unsigned long long)ld->dropped);
        return;
    }
    size_t len = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        ld->dropped++;
        SD_ERROR("in-coordinator n-gram drafter: out of memory for a reply");
        return;
    }
    protobuf_c_message_pack(&env->base, buf);
    int32_t at = (ld->q_head + ld->q_len) % LOCAL_QUEUE;
    ld->q[at].buf = buf;
    ld->q[at].len = len;
    ld->q_len++;
}

static void reply_heartbeat(sd_local_drafter *ld) {
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_draft_server_stats(ld->server, &st);
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    hb.stats = &st;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    queue_reply(ld, &env);
}

static void reply_draft(sd_local_drafter *ld, const Specd__DraftRequest *req) {
    Specd__DraftResponse resp;
    sd_net_draft_step_of(req, &ld->step); /* the coordinator's own request: its sampling was checked at submit */
    sd_status st = sd_draft_server_handle(ld->server, &ld->step, &resp);
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    Specd__Error e;
    if (st == SD_OK) {
        env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
        env.draft = &resp;
    } else {
        /* what specd-drafter's worker loop answers a failed step with */
        char msg[160];
        snprintf(msg, sizeof msg, "worker: step %llu failed: %s", (unsigned long long)req->step_id, sd_status_str(st));
        SD_ERROR("in-coordinator n-gram drafter: %s", msg);
        sd_net_error_init(&e, SPECD__CODE__CODE_INTERNAL, 0, 0, msg);
        env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR;
        env.error = &e;
    }
    queue_reply(ld, &env);
}

/* What the coordinator sends this worker, answered as specd-drafter would. */
static void deliver(sd_local_drafter *ld, const Specd__CoordinatorToWorker *env) {
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME:
        ld->worker_id = env->welcome->worker_id;
        SD_INFO("in-coordinator n-gram drafter registered as worker %llu", (unsigned long long)ld->worker_id);
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_ERROR:
        SD_WARN("in-coordinator n-gram drafter: the coordinator says %s: %s", sd_net_code_name(env->error->code),
                env->error->message ? env->error->message : "");
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT: reply_heartbeat(ld); break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT: reply_draft(ld, env->draft); break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE:
        sd_draft_server_release(ld->server, env->release->request_ids, env->release->n_request_ids);
        break;
    default: SD_WARN("in-coordinator n-gram drafter: message case %d ignored", (int)env->body_case); break;
    }
}

static bool to_worker(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToWorker *env) {
    sd_local_drafter *ld = user;
    if (!sd_local_drafter_is_ident(ident, ident_len)) return ld->inner.to_worker(ld->inner.user, ident, ident_len, env);
    deliver(ld, env);
    return true;
}

static sd_coord_sent to_client(void *user, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len) {
    sd_local_drafter *ld = user;
    return ld->inner.to_client(ld->inner.user, ident, ident_len, body, len);
}

/* Registers like specd-drafter --ngram: the target's identity (an n-gram
 * drafter proposes the target's own tokens), kind n-gram, no layers. */
static void say_hello(sd_local_drafter *ld, const sd_draft_server_params *sp, uint64_t now_us) {
    sd_coord *c = ld->c;
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = c->arch;
    id.vocab_size = (uint32_t)c->n_vocab;
    id.vocab_hash = c->vocab_hash;
    id.context_length = (uint32_t)c->n_ctx;
    id.name = (char *)"n-gram";
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_draft_server_stats(ld->server, &st);
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = SD_PROTOCOL_VERSION;
    h.role = SPECD__ROLE__ROLE_DRAFTER;
    h.group_size = 1;
    h.model = &id;
    h.name = (char *)"in-coordinator";
    h.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    h.max_batch = (uint32_t)sp->max_batch;
    h.max_k = (uint32_t)sp->max_k;
    h.stats = &st;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    env.hello = &h;
    queue_reply(ld, &env);
    sd_local_drafter_pump(ld, now_us);
}

sd_status sd_local_drafter_new(sd_coord *c, uint64_t now_us, sd_local_drafter **out) {
    *out = NULL;
    sd_local_drafter *ld = calloc(1, sizeof *ld);
    if (!ld) return SD_ERR_NOMEM;
    ld->c = c;
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = c->p.max_active;
    dp.max_ctx = c->n_ctx;
    dp.top_n = 1; /* q is a point mass on the proposal */
    dp.ngram_cache_entries = c->p.local_ngram_cache > 0 ? c->p.local_ngram_cache : -1;
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = dp.max_seqs;
    sp.max_ctx = dp.max_ctx;
    sp.max_batch = sd_imin(c->p.max_active, SD_MAX_BATCH);
    sp.max_k = c->p.max_k > 0 ? c->p.max_k : 1;
    sp.n_vocab = c->n_vocab;
    sp.top_n = 1;
    sp.tok = c->tok; /* constrained requests: forced drafts, n-gram drafts cut where refused */
    sd_status st = sd_drafter_ngram_create(&dp, &ld->drafter);
    if (st == SD_OK) st = sd_draft_server_create(ld->drafter, &sp, &ld->server);
    if (st != SD_OK) {
        SD_ERROR("cannot start the in-coordinator n-gram drafter: %s", sd_status_str(st));
        sd_local_drafter_free(&ld);
        return st;
    }
    ld->inner = c->io;
    c->io = (sd_coord_io){.user = ld, .to_worker = to_worker, .to_client = to_client};
    SD_INFO("in-coordinator n-gram drafter: %d slots of %d tokens, drafts of up to %d", (int)sp.max_seqs,
            (int)sp.max_ctx, (int)sp.max_k);
    say_hello(ld, &sp, now_us);
    *out = ld;
    return SD_OK;
}

bool sd_local_drafter_pending(const sd_local_drafter *ld) { return ld && ld->q_len > 0; }

void sd_local_drafter_pump(sd_local_drafter *ld, uint64_t now_us) {
    if (!ld) return;
    for (int32_t i = 0; i < LOCAL_PUMP_MAX && ld->q_len > 0; i++) {
        uint8_t *buf = ld->q[ld->q_head].buf;
        size_t len = ld->q[ld->q_head].len;
        ld->q_head = (ld->q_head + 1) % LOCAL_QUEUE;
        ld->q_len--;
        sd_workers_on_message(ld->c, LOCAL_IDENT, sizeof LOCAL_IDENT, buf, len, now_us);
        free(buf);
    }
}

void sd_local_drafter_free(sd_local_drafter **ldp) {
    if (!ldp || !*ldp) return;
    sd_local_drafter *ld = *ldp;
    if (ld->c && ld->c->io.user == ld) ld->c->io = ld->inner;
    while (ld->q_len > 0) {
        free(ld->q[ld->q_head].buf);
        ld->q_head = (ld->q_head + 1) % LOCAL_QUEUE;
        ld->q_len--;
    }
    sd_draft_server_free(&ld->server);
    sd_drafter_free(&ld->drafter);
    free(ld);
    *ldp = NULL;
}
