/* workers.c — the registry of drafters and the verifier leader.
 *
 * A worker is known by its ZeroMQ routing id once its Hello was accepted:
 * protocol version equal to ours (else CODE_PROTOCOL), role drafter or
 * verifier leader (rank 0), the target's vocabulary (sd_tok_vocab_hash, and
 * for a verifier its size; a drafter's embedding may be padded to other rows,
 * logged, and its Welcome says the target's size; else CODE_VOCAB_MISMATCH:
 * the log names both, the refused peer is told only that its identity was
 * refused and logs its own), and for a
 * verifier no other live leader (else CODE_REFUSED). A worker silent for
 * liveness intervals, or one that leaves a step unanswered past its timeout,
 * is dead: the scheduler drops its step and its beliefs; so is one that
 * reports CODE_UNAVAILABLE (a verifier group that lost a rank). Its later messages
 * come from an unknown peer and are dropped with a log line (they are
 * responses, not requests: answering them with an Error would only make a
 * slow worker exit); it re-registers once it misses our heartbeats.
 * Dead entries stay in the table (alive = false) for ServiceStats. */
#include "coord.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The deepest k a drafter's step in flight asked for (0: none). */
static int32_t step_depth(const sd_coord_worker *w) {
    int32_t depth = 0;
    for (int32_t i = 0; i < w->n_step; i++)
        if (w->step_k[i] > depth) depth = w->step_k[i];
    return depth;
}

static void send_error(sd_coord *c, const uint8_t *ident, size_t ident_len, Specd__Code code, const char *msg) {
    Specd__Error e;
    sd_net_error_init(&e, code, 0, 0, msg);
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_ERROR;
    env.error = &e;
    (void)c->io.to_worker(c->io.user, ident, ident_len, &env);
}

/* A heartbeat to worker slot i, stamped now (sd_net_now_us): the idle
 * keep-alive and the probe of a leader that may be gone. */
static void send_heartbeat(sd_coord *c, int32_t i, uint64_t now_us) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    sd_outbox_worker(c, i, &env, now_us);
}

static int32_t find_alive(const sd_coord *c, const uint8_t *ident, size_t ident_len) {
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &c->workers[i];
        if (w->used && w->alive && w->ident_len == ident_len && memcmp(w->ident, ident, ident_len) == 0) return i;
    }
    return -1;
}

static void mark_dead(sd_coord *c, int32_t wi, const char *why) {
    sd_coord_worker *w = &c->workers[wi];
    SD_WARN("%s %s (worker %llu) is dead: %s", w->role == SPECD__ROLE__ROLE_VERIFIER ? "verifier" : "drafter", w->name,
            (unsigned long long)w->worker_id, why);
    sd_sched_on_worker_lost(c, wi);
    w->alive = false;
}

/* A slot for a new registration: the same peer's dead entry, a free one, or
 * the oldest dead one. */
static int32_t new_slot(sd_coord *c, const uint8_t *ident, size_t ident_len) {
    int32_t free_slot = -1, dead = -1;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        sd_coord_worker *w = &c->workers[i];
        if (!w->used) {
            if (free_slot < 0) free_slot = i;
        } else if (!w->alive) {
            if (w->ident_len == ident_len && memcmp(w->ident, ident, ident_len) == 0) return i;
            if (dead < 0 || w->worker_id < c->workers[dead].worker_id) dead = i;
        }
    }
    return free_slot >= 0 ? free_slot : dead;
}

static const char *kind_name(Specd__DrafterKind k) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, (int)k);
    return v ? v->name : "?";
}

/* The live verifier leader of group id (0: none asked), or -1. */
static int32_t group_with_id(const sd_coord *c, uint32_t id) {
    if (id == 0) return -1;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++)
        if (sd_coord_is_group(&c->workers[i]) && c->workers[i].group_id == id) return i;
    return -1;
}

/* The smallest group id no live leader has (for a leader that named none). */
static uint32_t free_group_id(const sd_coord *c) {
    for (uint32_t id = 1;; id++)
        if (group_with_id(c, id) < 0) return id;
}

/* The line is fitted to the seeded sizes up to SD_COST_SIZES only: those
 * are the steps a service makes most, and a least-squares fit over sizes up
 * to 1088 would be set by the largest steps, where a GPU's cost is no longer
 * that of a small step (a choice, not a measurement). */
void sd_cost_seed(sd_cost_model *c, const sd_step_cost *costs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const int32_t t = costs[i].tokens > INT32_MAX ? INT32_MAX : (int32_t)costs[i].tokens;
        sd_cost_seed_size(c, t, costs[i].forward_us);
    }
}

/* A worker's resource report (Hello or heartbeat) into its record. */
static void take_stats(sd_coord_worker *w, const Specd__WorkerStats *st) {
    w->kv_blocks_total = st->kv_blocks_total;
    w->kv_blocks_free = st->kv_blocks_free;
    w->n_sequences = st->n_sequences;
    w->prefix_query_tokens = st->prefix_query_tokens;
    w->prefix_hit_tokens = st->prefix_hit_tokens;
    w->prefix_blocks_cached = st->prefix_blocks_cached;
    w->prefix_blocks_evicted = st->prefix_blocks_evicted;
}

/* Whether Hello h may register at all, whatever is registered now: the
 * key's role (peer_role, from the allow-list), the protocol version, the
 * role, the model's vocabulary. SPECD__CODE__CODE_OK, or the refusal's code
 * with msg[msg_len] for the peer (a vocabulary mismatch's details go to our
 * log only: the target's identity is not told to whoever connects). */
static Specd__Code hello_refusal(const sd_coord *c, const char *peer_role, const Specd__Hello *h, const char *name,
                                 char *msg, size_t msg_len) {
    const char *asked = h->role == SPECD__ROLE__ROLE_VERIFIER  ? "verifier"
                        : h->role == SPECD__ROLE__ROLE_DRAFTER ? "drafter"
                                                               : "?";
    if (peer_role && peer_role[0] && strcmp(peer_role, asked) != 0) {
        /* the allow-list binds this key to another role (role=...) */
        SD_WARN("refused %s: its key may register as a %s only, it asked to be a %s", name, peer_role, asked);
        snprintf(msg, msg_len, "this worker's key may not register as a %s", asked);
        return SPECD__CODE__CODE_REFUSED;
    }
    if (h->protocol_version != SD_PROTOCOL_VERSION) {
        snprintf(msg, msg_len, "hello.protocol_version: %u, the coordinator speaks %u", h->protocol_version,
                 SD_PROTOCOL_VERSION);
        SD_WARN("refused %s: %s", name, msg);
        return SPECD__CODE__CODE_PROTOCOL;
    }
    if (h->role != SPECD__ROLE__ROLE_VERIFIER && h->role != SPECD__ROLE__ROLE_DRAFTER) {
        snprintf(msg, msg_len, "hello.role: %d is not a drafter or verifier leader on the worker socket", h->role);
        SD_WARN("refused %s: %s", name, msg);
        return SPECD__CODE__CODE_REFUSED;
    }
    if (!h->model) {
        snprintf(msg, msg_len, "hello.model: missing");
        return SPECD__CODE__CODE_BAD_REQUEST;
    }
    /* The hash covers the tokenizer's tokens before trailing unused padding:
     * a drafter whose embedding is padded to other rows shares the target's
     * tokenizer (the Welcome tells it the target's size); a verifier is the
     * target, row for row. */
    const bool rows_may_differ = h->role == SPECD__ROLE__ROLE_DRAFTER;
    if (h->model->vocab_hash != c->vocab_hash || (!rows_may_differ && (int64_t)h->model->vocab_size != c->n_vocab)) {
        SD_WARN("refused %s: vocabulary mismatch: %s model '%s' has %u tokens, vocab hash 0x%016llx; the target has "
                "%d tokens, vocab hash 0x%016llx",
                name, asked, h->model->name ? h->model->name : "?", h->model->vocab_size,
                (unsigned long long)h->model->vocab_hash, c->n_vocab, (unsigned long long)c->vocab_hash);
        snprintf(msg, msg_len,
                 "model identity refused: this worker's vocabulary is not the service's (see the coordinator's log)");
        return SPECD__CODE__CODE_VOCAB_MISMATCH;
    }
    if ((int64_t)h->model->vocab_size != c->n_vocab)
        SD_INFO("%s %s: its vocabulary pads the target's tokenizer to %u rows, the target to %d (same tokenizer)",
                asked, name, h->model->vocab_size, c->n_vocab);
    return SPECD__CODE__CODE_OK;
}

/* Whether a verifier leader may take its group now: rank 0, and no live
 * leader of the same group id (an old one gone without a word, SIGKILL, is
 * probed first). As hello_refusal. */
static Specd__Code leader_refusal(sd_coord *c, const Specd__Hello *h, const char *name, char *msg, size_t msg_len,
                                  uint64_t now_us) {
    if (h->rank != 0) {
        snprintf(msg, msg_len, "hello.rank: %u; only the verifier leader (rank 0) registers", h->rank);
        return SPECD__CODE__CODE_REFUSED;
    }
    int32_t same = group_with_id(c, h->group_id);
    if (same < 0) return SPECD__CODE__CODE_OK;
    send_heartbeat(c, same, now_us);
    if (c->workers[same].unreachable) mark_dead(c, same, "disconnected");
    if (!c->workers[same].alive) return SPECD__CODE__CODE_OK;
    snprintf(msg, msg_len, "hello.group_id: group %u already has a live leader", h->group_id);
    SD_WARN("refused %s: %s (%s)", name, msg, c->workers[same].name);
    return SPECD__CODE__CODE_REFUSED;
}

/* Clears worker slot w for a new registration, keeping its step buffers
 * (allocated once, reused by every worker the slot holds). */
static void worker_clear(sd_coord_worker *w) {
    uint64_t *rids = w->step_rids;
    int32_t *ks = w->step_k, *ends = w->step_end, cap = w->cap_step;
    bool *lps = w->step_lp;
    memset(w, 0, sizeof *w);
    w->step_lp = lps;
    w->step_rids = rids;
    w->step_k = ks;
    w->step_end = ends;
    w->cap_step = cap;
    sd_cost_init(&w->cost);
}

/* What the worker in slot w said of itself in its Hello h. */
static void worker_from_hello(sd_coord *c, sd_coord_worker *w, const uint8_t *ident, size_t ident_len,
                              const Specd__Hello *h, const char *name, uint64_t now_us) {
    w->used = w->alive = true;
    w->worker_id = ++c->next_worker_id;
    memcpy(w->ident, ident, ident_len);
    w->ident_len = ident_len;
    w->role = h->role;
    w->rank = h->rank;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->drafter_kind = h->drafter_kind;
    w->head_relay = h->role == SPECD__ROLE__ROLE_DRAFTER && sd_head_relay_is_ident(ident, ident_len, &w->head_group);
    sd_feat_hello_take(w, h);
    w->group_size = h->group_size ? h->group_size : 1;
    w->n_ctx = (int32_t)(h->model->context_length > INT32_MAX ? INT32_MAX : h->model->context_length);
    w->max_batch = h->max_batch == 0 || h->max_batch > SD_MAX_BATCH ? SD_MAX_BATCH : (int32_t)h->max_batch;
    w->max_k = h->max_k == 0 || h->max_k > SD_MAX_K ? SD_MAX_K : (int32_t)h->max_k;
    if (h->stats) take_stats(w, h->stats);
    w->last_recv_us = now_us;
}

/* A verifier leader's group id, and the cost model seeded from the step
 * times it measured in its warm-up. */
static void verifier_from_hello(sd_coord *c, sd_coord_worker *w, const Specd__Hello *h, const char *name) {
    w->group_id = h->group_id ? h->group_id : free_group_id(c);
    if (h->model->context_length && (int64_t)h->model->context_length < c->n_ctx)
        SD_WARN("verifier %s: context %u < the target's %d", name, h->model->context_length, c->n_ctx);
    if (h->n_step_costs == 0) return;
    sd_step_cost costs[SD_MAX_STEP_COSTS]; /* validated: <= SD_MAX_STEP_COSTS, tokens and times > 0 */
    size_t n = 0;
    for (size_t i = 0; i < h->n_step_costs && n < SD_MAX_STEP_COSTS; i++)
        costs[n++] = (sd_step_cost){h->step_costs[i]->tokens, h->step_costs[i]->forward_us};
    sd_cost_seed(&c->cost, costs, n);
    sd_cost_seed(&w->cost, costs, n);
    SD_INFO("verifier %s: cost model seeded from %zu measured step sizes (%u..%u tokens): %.0f us a step + "
            "%.1f us a token",
            name, n, costs[0].tokens, costs[n - 1].tokens, c->cost.verify_fixed_us, c->cost.verify_token_us);
}

/* The Welcome to worker slot wi, whose Hello said worker_vocab rows: the
 * target's rows only when they differ (a worker built before
 * Welcome.vocab_size refuses an unknown field; it never pairs padded). */
static void send_welcome(sd_coord *c, int32_t wi, uint32_t worker_vocab, uint64_t now_us) {
    Specd__Welcome wel = SPECD__WELCOME__INIT;
    wel.protocol_version = SD_PROTOCOL_VERSION;
    wel.worker_id = c->workers[wi].worker_id;
    wel.heartbeat_interval_ms = (uint32_t)c->p.heartbeat_interval_ms;
    wel.heartbeat_liveness = (uint32_t)c->p.heartbeat_liveness;
    if ((int64_t)worker_vocab != c->n_vocab) wel.vocab_size = (uint32_t)c->n_vocab;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME;
    env.welcome = &wel;
    sd_outbox_worker(c, wi, &env, now_us);
}

/* A Hello: refused (an Error to the peer), or registered in a free slot
 * and welcomed. */
static void on_hello(sd_coord *c, const uint8_t *ident, size_t ident_len, const char *peer_role, const Specd__Hello *h,
                     uint64_t now_us) {
    char msg[512];
    const char *name = h->name && h->name[0] ? h->name : "?";
    Specd__Code code = hello_refusal(c, peer_role, h, name, msg, sizeof msg);
    if (code != SPECD__CODE__CODE_OK) {
        send_error(c, ident, ident_len, code, msg);
        return;
    }
    const bool verifier = h->role == SPECD__ROLE__ROLE_VERIFIER;
    int32_t again = find_alive(c, ident, ident_len);
    if (again >= 0) mark_dead(c, again, "registered again");
    if (!verifier && (code = sd_feat_hello_refusal(c, h, name, msg, sizeof msg)) != SPECD__CODE__CODE_OK) {
        send_error(c, ident, ident_len, code, msg);
        return;
    }
    if (verifier && (code = leader_refusal(c, h, name, msg, sizeof msg, now_us)) != SPECD__CODE__CODE_OK) {
        send_error(c, ident, ident_len, code, msg);
        return;
    }
    int32_t wi = new_slot(c, ident, ident_len);
    if (wi < 0) {
        send_error(c, ident, ident_len, SPECD__CODE__CODE_REFUSED, "too many workers registered");
        return;
    }
    sd_coord_worker *w = &c->workers[wi];
    worker_clear(w);
    worker_from_hello(c, w, ident, ident_len, h, name, now_us);
    if (verifier) {
        verifier_from_hello(c, w, h, name);
        SD_INFO("verifier group %u (leader %s, TP %u) registered as worker %llu (max_batch %d, max_k %d, context "
                "%d)",
                w->group_id, name, w->group_size, (unsigned long long)w->worker_id, w->max_batch, w->max_k, w->n_ctx);
    } else {
        SD_INFO("drafter %s (%s) registered as worker %llu (max_batch %d, max_k %d, context %d)", name,
                kind_name(w->drafter_kind), (unsigned long long)w->worker_id, w->max_batch, w->max_k, w->n_ctx);
    }
    send_welcome(c, wi, h->model->vocab_size, now_us);
    if (!verifier) sd_place_share_drafter(c, wi, now_us);
}

void sd_workers_on_message(sd_coord *c, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len,
                           uint64_t now_us) {
    sd_workers_on_message_as(c, ident, ident_len, NULL, body, len, now_us);
}

void sd_workers_on_message_as(sd_coord *c, const uint8_t *ident, size_t ident_len, const char *peer_role,
                              const uint8_t *body, size_t len, uint64_t now_us) {
    int32_t wi = find_alive(c, ident, ident_len);
    Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
    char err[512];
    Specd__WorkerToCoordinator *env = sd_net_decode_worker(body, len, &c->lim, &code, err, sizeof err);
    if (!env) {
        SD_WARN("worker %s: bad message (%s): %s", wi >= 0 ? c->workers[wi].name : "(unregistered)",
                sd_net_code_name(code), err);
        send_error(c, ident, ident_len, code, err);
        if (wi >= 0 && c->workers[wi].busy) {
            sd_sched_fail_step(c, wi, err);
            sd_sched_pump(c, now_us);
        }
        return;
    }
    if (wi >= 0) c->workers[wi].last_recv_us = now_us;
    switch (env->body_case) {
    case SPECD__WORKER_TO_COORDINATOR__BODY_HELLO: on_hello(c, ident, ident_len, peer_role, env->hello, now_us); break;
    case SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT:
        if (wi < 0) {
            SD_DEBUG("heartbeat from an unregistered worker; ignored");
        } else if (env->heartbeat->stats) {
            take_stats(&c->workers[wi], env->heartbeat->stats);
        }
        break;
    case SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT:
        if (wi < 0 || c->workers[wi].role != SPECD__ROLE__ROLE_DRAFTER) {
            SD_INFO("draft response from a worker that is not a registered drafter; dropped");
        } else if (sd_step_times_late_reply(&c->workers[wi].times, env->draft->step_id, now_us)) {
            SD_INFO("drafter %s: the overrun step %llu answered after all; its time is measured (p99 %u us per "
                    "depth)",
                    c->workers[wi].name, (unsigned long long)env->draft->step_id, c->workers[wi].times.p99_unit_us);
        } else {
            sd_coord_worker *w = &c->workers[wi];
            if (w->busy && env->draft->step_id == w->step_id) {
                sd_step_times_add(&w->times, now_us - w->step_sent_us, step_depth(w));
                w->times.misses = 0;
            }
            sd_sched_on_draft(c, wi, env->draft, now_us);
        }
        break;
    case SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY:
        if (wi < 0 || c->workers[wi].role != SPECD__ROLE__ROLE_VERIFIER)
            SD_INFO("verify response from a worker that is not a registered verifier leader; dropped");
        else
            sd_sched_on_verify(c, wi, env->verify, now_us);
        break;
    case SPECD__WORKER_TO_COORDINATOR__BODY_ERROR:
        SD_WARN("worker %s reports %s: %s", wi >= 0 ? c->workers[wi].name : "(unregistered)",
                sd_net_code_name(env->error->code), env->error->message ? env->error->message : "");
        if (wi >= 0 && c->workers[wi].busy) sd_sched_fail_step(c, wi, "the worker answered the step with an Error");
        /* A worker that cannot serve any more (a verifier group that lost
         * a rank) says so: drop it now rather than after the liveness
         * period; its requests keep their tokens and wait for the next. */
        if (wi >= 0 && env->error->code == SPECD__CODE__CODE_UNAVAILABLE)
            mark_dead(c, wi, "it reported itself unavailable");
        break;
    default: SD_WARN("worker message with body case %d; ignored", (int)env->body_case); break;
    }
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    sd_sched_pump(c, now_us);
}

void sd_workers_tick(sd_coord *c, uint64_t now_us) {
    uint64_t interval = (uint64_t)c->p.heartbeat_interval_ms * 1000u;
    uint64_t dead_after = interval * (uint64_t)c->p.heartbeat_liveness;
    bool changed = false;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        sd_coord_worker *w = &c->workers[i];
        if (!w->used || !w->alive) continue;
        bool is_drafter = w->role == SPECD__ROLE__ROLE_DRAFTER;
        uint64_t timeout = (uint64_t)(is_drafter ? c->p.draft_timeout_ms : c->p.verify_timeout_ms) * 1000u;
        if (!is_drafter) timeout = sd_cost_verify_timeout_us(&w->cost, w->step_tokens, timeout);
        if (is_drafter) {
            timeout = sd_step_times_timeout_us(&w->times, timeout, step_depth(w));
            bool backed_off = sd_step_times_backed_off(&w->times, now_us);
            changed |= w->backed_off && !backed_off; /* drafts may go out again */
            w->backed_off = backed_off;
        }
        if (now_us > w->last_recv_us + dead_after || w->unreachable) {
            mark_dead(c, i, w->unreachable ? "disconnected" : "no heartbeat");
            changed = true;
            continue;
        }
        if (w->busy && now_us > w->step_sent_us + timeout) {
            char why[96];
            snprintf(why, sizeof why, "step %llu (%d tokens) unanswered after %llu ms", (unsigned long long)w->step_id,
                     w->step_tokens, (unsigned long long)(timeout / 1000u));
            if (is_drafter) {
                /* alive (it heartbeats) but slow: drop the step, not the drafter (liveness.c) */
                sd_step_times_missed(&w->times, now_us, w->step_id, w->step_sent_us, step_depth(w));
                w->backed_off = true;
                SD_WARN("drafter %s: %s; its sequences go on with K = 0, no drafts for %llu ms (miss %d)", w->name, why,
                        (unsigned long long)((w->times.backoff_until_us - now_us) / 1000u), (int)w->times.misses);
                sd_sched_fail_step(c, i, why);
                changed = true;
                continue;
            }
            sd_cost_verify_timed_out(&w->cost, w->step_tokens, timeout);
            mark_dead(c, i, why);
            changed = true;
            continue;
        }
        if (now_us >= w->last_send_us + interval) send_heartbeat(c, i, now_us);
    }
    if (changed) sd_sched_pump(c, now_us);
}
