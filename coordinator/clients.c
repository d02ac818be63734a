/* clients.c — the client link: Submit, Cancel, Stats, liveness.
 *
 * Every message is decoded and validated by sd_net_read_client against the
 * target's limits; what the decoder cannot know (the queue, the context, the
 * tokenized length, stop-string limits) is checked here, and every refusal
 * is an Error naming the field, the limit and the value, sent to that client
 * only. Prompts are tokenized like specd-generate does (BOS when the model
 * adds one, a chat turn or a whole conversation in the model's chat
 * template, specd/chat.h, and special tokens only where the template's
 * markup puts them: typed into a prompt or a message they are text) so that
 * the service and the one-shot tool see the same tokens. With echo, Accepted
 * carries the prompt's tokens detokenized (the gateway has no tokenizer).
 * Tokenizing runs on
 * the tokq thread (tokq.h); admit() turns its result into a session. A client with requests in flight is watched: silent for
 * the liveness period, its requests are cancelled and released everywhere. */
#include "coord.h"
#include "tokq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Turns a tokenized submit into a session and answers Accepted, or
 * refuses it. Takes ownership of j. */
static void admit(sd_coord *c, sd_submit_job *j, uint64_t now_us) {
    char msg[512];
    Specd__Code code = j->code;
    const uint8_t *ident = j->ident;
    size_t ident_len = j->ident_len;
    if (code != SPECD__CODE__CODE_OK) {
        snprintf(msg, sizeof msg, "%s", j->msg);
        goto refuse;
    }
    sd_coord_client *cl = sd_coord_client_find(c, ident, ident_len, true);
    if (!cl) {
        code = SPECD__CODE__CODE_OVERLOADED;
        snprintf(msg, sizeof msg, "too many clients connected");
        goto refuse;
    }
    if ((int64_t)j->n_ids + (int64_t)j->n_continuation >= c->n_ctx) {
        code = SPECD__CODE__CODE_TOO_LARGE;
        snprintf(msg, sizeof msg, "submit.prompt: %zu tokens%s, the context holds %d (and one must be generated)",
                 j->n_ids + j->n_continuation, j->n_continuation ? " with the continuation" : "", c->n_ctx);
        goto refuse;
    }
    /* echo: the prompt's tokens detokenized, exact bytes (the gateway has
     * no tokenizer; a prompt of ids has no text of its own) */
    char *echo_text = NULL;
    size_t echo_len = 0;
    if (j->echo && sd_tok_decode(c->tok, j->ids, j->n_ids, &echo_text, &echo_len) != SD_OK) {
        code = SPECD__CODE__CODE_INTERNAL;
        snprintf(msg, sizeof msg, "submit.echo: the prompt's tokens could not be detokenized");
        goto refuse;
    }
    if (echo_len > SD_MAX_PROMPT_BYTES) {
        free(echo_text);
        code = SPECD__CODE__CODE_TOO_LARGE;
        snprintf(msg, sizeof msg, "submit.echo: the prompt's text is %zu bytes, over the limit of %d", echo_len,
                 SD_MAX_PROMPT_BYTES);
        goto refuse;
    }
    int32_t max_tokens = j->max_tokens ? (int32_t)j->max_tokens : c->p.max_tokens_default;
    sd_session *s = sd_session_new(c->tok, ++c->next_request_id, j->ids, (int32_t)j->n_ids, max_tokens, c->n_ctx,
                                   (const char *const *)j->stop, j->n_stop);
    if (s) s->ignore_eos = j->ignore_eos;
    if (s && j->n_continuation > 0 &&
        !sd_session_resume(s, c->tok, j->continuation, (int32_t)j->n_continuation, msg, sizeof msg)) {
        sd_session_free(&s);
        free(echo_text);
        code = SPECD__CODE__CODE_BAD_REQUEST;
        goto refuse;
    }
    if (!s || sd_sched_add(c, s) != SD_OK) {
        sd_session_free(&s);
        free(echo_text);
        code = SPECD__CODE__CODE_INTERNAL;
        snprintf(msg, sizeof msg, "out of memory creating the request");
        goto refuse;
    }
    s->client_tag = j->client_tag;
    memcpy(s->client_ident, ident, ident_len);
    s->client_ident_len = ident_len;
    s->sampling = j->sampling;
    s->ignore_eos = j->ignore_eos;
    s->max_k = j->max_k;
    s->pin_kind = j->pin_kind; /* validated: a known kind */
    s->logprobs = j->logprobs;
    s->top_logprobs = j->top_logprobs;
    s->prompt_logprobs = j->prompt_logprobs;
    s->prompt_lp_next = j->prompt_logprobs ? 1 : s->n_prompt;
    s->prompt_only = j->prompt_only;
    s->con_kind = j->con_kind;
    s->con_text = j->con_text; /* moves to the session */
    j->con_text = NULL;
    if (s->prompt_only) s->max_k = -1; /* nothing to draft for */
    s->t_submit_us = j->t_submit_us;
    cl->n_active++;
    cl->last_recv_us = now_us;
    Specd__Accepted acc = SPECD__ACCEPTED__INIT;
    acc.client_tag = j->client_tag;
    acc.request_id = s->id;
    acc.prompt_tokens = (uint32_t)s->n_prompt;
    acc.prompt_text.data = (uint8_t *)echo_text;
    acc.prompt_text.len = echo_text ? echo_len : 0;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED;
    env.accepted = &acc;
    SD_INFO("request %llu accepted: %d prompt tokens%s, max_tokens %d%s, temperature %g", (unsigned long long)s->id,
            s->n_prompt, j->n_continuation ? " (a continuation)" : "", s->max_tokens,
            s->prompt_only ? " (prompt only)" : "", (double)s->sampling.temperature);
    sd_outbox_client(c, ident, ident_len, &env, now_us);
    free(echo_text);
    sd_submit_job_free(&j);
    /* prompt position 0 has no logprob: its entry goes out at once; the
     * rest come from the prefill chunks (sched_dispatch.c) */
    if (s->prompt_logprobs) sd_sched_prompt_logprobs(c, s, 0, 1, NULL, now_us);
    if (s->prompt_only && s->prompt_lp_next >= s->n_prompt)
        sd_sched_finish(c, s, SPECD__STOP_REASON__STOP_REASON_LENGTH, NULL, 0, now_us);
    return;
refuse:
    SD_INFO("submit refused (%s): %s", sd_net_code_name(code), msg);
    sd_outbox_client_error(c, ident, ident_len, code, 0, j->client_tag, msg, now_us);
    sd_submit_job_free(&j);
}

static void on_submit(sd_coord *c, const uint8_t *ident, size_t ident_len, const sd_net_submit *sub, uint64_t now_us) {
    const Specd__SubmitRequest *r = sub->req;
    char msg[512];
    Specd__Code code = SPECD__CODE__CODE_BAD_REQUEST;
    uint64_t tag = r->client_tag;
    /* Submits still being tokenized count as waiting beyond the free active slots. */
    int32_t pending = c->tokq ? sd_tokq_pending(c->tokq) : 0, free_slots = c->p.max_active - c->n_active;
    int32_t waiting = c->n_queued + (pending > free_slots ? pending - (free_slots > 0 ? free_slots : 0) : 0);
    if (c->draining) { /* a rolling restart: another coordinator (or this one restarted) takes it */
        sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_OVERLOADED, 0, tag,
                               "the coordinator is draining (shutting down): retry in a moment", now_us);
        return;
    }
    const sd_coord_client *known = sd_coord_client_find(c, ident, ident_len, false);
    if (known && known->backlog) { /* the backlog counts against its client (outbox.c) */
        snprintf(msg, sizeof msg, "replies to this client are backed up (%zu waiting): read them, then retry",
                 known->backlog_n);
        sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_OVERLOADED, 0, tag, msg, now_us);
        return;
    }
    if (waiting >= c->p.max_queue) {
        snprintf(msg, sizeof msg, "queue full: %d requests waiting (limit %d); retry later", waiting, c->p.max_queue);
        sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_OVERLOADED, 0, tag, msg, now_us);
        return;
    }
    /* sampling (converted there), max_tokens, max_k and the stop strings
     * were checked by sd_net_read_client against c->lim (the context), once */
    sd_net_submit taken = *sub;
    if (taken.sampling.rule == SD_RULE_DEFAULT) taken.sampling.rule = c->p.verify_rule; /* the service's rule */
    sd_coord_client *cl = sd_coord_client_find(c, ident, ident_len, true);
    if (!cl) {
        sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_OVERLOADED, 0, tag, "too many clients connected",
                               now_us);
        return;
    }
    sd_submit_job *j = sd_submit_job_new(&taken, ident, ident_len, now_us);
    if (!j) {
        code = SPECD__CODE__CODE_INTERNAL;
        snprintf(msg, sizeof msg, "out of memory queueing the request");
        goto refuse;
    }
    /* Text is tokenized off the loop (its cost grows with the prompt);
     * without a queue (unit tests) it is done here. */
    if (c->tokq && r->n_prompt_ids == 0) {
        if (!sd_tokq_push(c->tokq, &j)) {
            sd_submit_job_free(&j);
            sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_OVERLOADED, 0, tag,
                                   "tokenizer queue full; retry later", now_us);
        }
        return;
    }
    sd_submit_tokenize(c->tok, c->chat, c->n_ctx, c->n_vocab, j);
    admit(c, j, now_us);
    return;
refuse:
    SD_INFO("submit refused (%s): %s", sd_net_code_name(code), msg);
    sd_outbox_client_error(c, ident, ident_len, code, 0, tag, msg, now_us);
}

void sd_clients_on_tokenized(sd_coord *c, uint64_t now_us) {
    if (!c->tokq) return;
    sd_submit_job *j;
    while ((j = sd_tokq_pop(c->tokq)) != NULL) admit(c, j, now_us);
    sd_sched_pump(c, now_us);
}

static void on_cancel(sd_coord *c, const uint8_t *ident, size_t ident_len, const Specd__Cancel *r, uint64_t now_us) {
    sd_session *s = sd_sched_find(c, r->request_id);
    if (!s || s->state == SD_SESSION_FINISHED || s->client_ident_len != ident_len ||
        memcmp(s->client_ident, ident, ident_len) != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "cancel.request_id: %llu is not a running request of this client",
                 (unsigned long long)r->request_id);
        sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_UNKNOWN_REQUEST, r->request_id, 0, msg, now_us);
        return;
    }
    char *tail = NULL;
    size_t tail_len = 0;
    (void)sd_session_flush(s, &tail, &tail_len);
    sd_sched_finish(c, s, SPECD__STOP_REASON__STOP_REASON_CANCELLED, tail, tail_len, now_us);
    free(tail);
}

static void on_stats(sd_coord *c, const uint8_t *ident, size_t ident_len, const Specd__StatsQuery *q, uint64_t now_us) {
    Specd__ServiceStats st = SPECD__SERVICE_STATS__INIT;
    st.active_requests = (uint32_t)c->n_active;
    st.queued_requests = (uint32_t)c->n_queued;
    st.finished_requests = c->finished_requests;
    st.committed_tokens = c->committed_tokens;
    sd_sched_overhead(c, &st.step_overhead_p50_us, &st.step_overhead_p99_us);
    sd_sched_draft_wait(c, &st.draft_wait_mean_us, &st.draft_wait_p99_us, &st.draft_wait_share);
    st.verify_fixed_us = c->cost.verify_fixed_us;
    st.verify_token_us = c->cost.verify_token_us;
    st.draft_token_us = c->cost.draft_token_us;
    st.draft_step_us = c->cost.draft_step_us;
    st.catchup_row_us = c->cost.catchup_row_us;
    st.seq_verify_steps = c->spec.seq_steps;
    st.drafts = c->spec.drafts;
    st.draft_tokens = c->spec.draft_tokens;
    st.accepted_tokens = c->spec.accepted;
    st.n_draft_tokens_per_pos = st.n_accepted_tokens_per_pos = (size_t)sd_spec_counts_positions(&c->spec, c->p.max_k);
    st.draft_tokens_per_pos = (uint64_t *)(uintptr_t)c->spec.draft_per_pos;
    st.accepted_tokens_per_pos = (uint64_t *)(uintptr_t)c->spec.accepted_per_pos;
    st.verify_batches = c->verify_steps;
    Specd__WorkerInfo infos[SD_COORD_MAX_WORKERS], *pinfos[SD_COORD_MAX_WORKERS];
    Specd__WorkerStats wst[SD_COORD_MAX_WORKERS];
    size_t n = 0;
    for (int32_t i = 0; q->include_workers && i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &c->workers[i];
        if (!w->used) continue;
        specd__worker_info__init(&infos[n]);
        specd__worker_stats__init(&wst[n]);
        infos[n].role = w->role;
        infos[n].rank = w->rank;
        /* A name is host:pid, a map of the deployment: only for an operator
         * (--stats-names; with CURVE keys this becomes an operator key). */
        infos[n].name = c->p.stats_names ? (char *)(uintptr_t)w->name : (char *)"";
        infos[n].drafter_kind = w->drafter_kind;
        infos[n].alive = w->alive;
        infos[n].worker_id = w->worker_id;
        infos[n].group_id = w->group_id;
        infos[n].group_size = w->group_size;
        infos[n].active_requests = w->alive ? (uint32_t)sd_place_group_load(c, i) : 0;
        infos[n].served_requests = w->served_requests;
        infos[n].drafted = w->drafted;
        infos[n].accepted = w->accepted;
        infos[n].committed = w->committed;
        infos[n].step_us =
            w->role == SPECD__ROLE__ROLE_VERIFIER ? sd_cost_verify_us(&w->cost, 64) : w->cost.draft_step_us;
        wst[n].kv_blocks_total = w->kv_blocks_total;
        wst[n].kv_blocks_free = w->kv_blocks_free;
        wst[n].n_sequences = w->n_sequences;
        wst[n].steps = w->steps;
        wst[n].prefix_query_tokens = w->prefix_query_tokens;
        wst[n].prefix_hit_tokens = w->prefix_hit_tokens;
        wst[n].prefix_blocks_cached = w->prefix_blocks_cached;
        wst[n].prefix_blocks_evicted = w->prefix_blocks_evicted;
        infos[n].stats = &wst[n];
        pinfos[n] = &infos[n];
        n++;
    }
    st.n_workers = n;
    st.workers = pinfos;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_STATS;
    env.stats = &st;
    sd_outbox_client(c, ident, ident_len, &env, now_us);
}

static void send_heartbeat(sd_coord *c, const uint8_t *ident, size_t ident_len, uint64_t now_us) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    sd_outbox_client(c, ident, ident_len, &env, now_us);
}

void sd_clients_on_message(sd_coord *c, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len,
                           uint64_t now_us) {
    Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
    char err[512];
    sd_coord_client *cl = sd_coord_client_find(c, ident, ident_len, false);
    if (cl) cl->last_recv_us = now_us;
    sd_net_client_msg *msg = sd_net_read_client(body, len, &c->lim, &code, err, sizeof err);
    if (!msg) {
        /* Echo the submit's client_tag when the bytes at least unpack, so the
         * client can match the error to its request. */
        uint64_t tag = 0;
        Specd__ClientToCoordinator *raw =
            code == SPECD__CODE__CODE_MALFORMED
                ? NULL /* it did not unpack within its budget */
                : (Specd__ClientToCoordinator *)sd_net_unpack(&specd__client_to_coordinator__descriptor, body, len,
                                                              sd_net_unpack_budget(len), NULL, NULL);
        if (raw && raw->body_case == SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT) tag = raw->submit->client_tag;
        if (raw) specd__client_to_coordinator__free_unpacked(raw, NULL);
        SD_INFO("client message refused (%s): %s", sd_net_code_name(code), err);
        sd_outbox_client_error(c, ident, ident_len, code, 0, tag, err, now_us);
        return;
    }
    const Specd__ClientToCoordinator *env = msg->env;
    switch (env->body_case) {
    case SPECD__CLIENT_TO_COORDINATOR__BODY_HELLO:
        if (env->hello->protocol_version != SD_PROTOCOL_VERSION) {
            snprintf(err, sizeof err, "hello.protocol_version: %u, the coordinator speaks %u",
                     env->hello->protocol_version, SD_PROTOCOL_VERSION);
            sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_PROTOCOL, 0, 0, err, now_us);
        } else {
            send_heartbeat(c, ident, ident_len, now_us);
        }
        break;
    case SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT: on_submit(c, ident, ident_len, &msg->submit, now_us); break;
    case SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL: on_cancel(c, ident, ident_len, env->cancel, now_us); break;
    case SPECD__CLIENT_TO_COORDINATOR__BODY_STATS: on_stats(c, ident, ident_len, env->stats, now_us); break;
    case SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT: break;
    default:
        SD_WARN("client message with body case %d; ignored", (int)env->body_case);
        sd_outbox_client_error(c, ident, ident_len, SPECD__CODE__CODE_MALFORMED, 0, 0, "no message body", now_us);
        break;
    }
    sd_net_client_msg_free(&msg);
    sd_sched_pump(c, now_us);
}

void sd_clients_tick(sd_coord *c, uint64_t now_us) {
    uint64_t interval = (uint64_t)c->p.heartbeat_interval_ms * 1000u;
    uint64_t dead_after = interval * (uint64_t)c->p.heartbeat_liveness;
    for (int32_t i = 0; i < c->n_clients;) {
        sd_coord_client *cl = &c->clients[i];
        /* A backlog that has not shrunk for a long while: the client does not read. */
        bool stuck = cl->backlog && now_us > cl->backlog_moved_us + SD_COORD_BACKLOG_STALL_US;
        bool silent = now_us > cl->last_recv_us + dead_after && !(cl->backlog && !stuck);
        if (silent || stuck || cl->unreading) {
            if (cl->n_active > 0) {
                SD_WARN("a client %s: cancelling its %d requests",
                        cl->unreading || stuck ? "that does not read its replies" : "silent for the liveness period",
                        cl->n_active);
                cl->unreading = true; /* what the cancellations would send goes nowhere */
                uint8_t ident[SD_MAX_IDENTITY_BYTES];
                size_t ident_len = cl->ident_len;
                memcpy(ident, cl->ident, ident_len);
                for (int32_t j = c->n_sessions - 1; j >= 0; j--) {
                    if (j >= c->n_sessions) continue;
                    sd_session *s = c->sessions[j];
                    if (s->state != SD_SESSION_FINISHED && s->client_ident_len == ident_len &&
                        memcmp(s->client_ident, ident, ident_len) == 0)
                        sd_sched_abort(c, s, SPECD__CODE__CODE_CANCELLED, "client gone", false, now_us);
                }
            }
            if (cl->backlog_n > 0)
                SD_WARN("dropping %zu replies (%zu bytes) to a client that %s", cl->backlog_n, cl->backlog_bytes,
                        stuck ? "has not read any for the stall bound" : "does not read them");
            sd_outbox_client_forget(c, &c->clients[i]);
            c->clients[i] = c->clients[--c->n_clients];
            continue;
        }
        if (cl->n_active > 0 && now_us >= cl->last_send_us + interval)
            send_heartbeat(c, cl->ident, cl->ident_len, now_us);
        i++;
    }
    sd_sched_pump(c, now_us);
}
