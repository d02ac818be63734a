/* client_handle.c — what libspecd-client does with each message the
 * coordinator sends: one function per message type, called on the I/O
 * thread with the client's lock held (client.c's loop decodes and
 * validates first, sd_net_decode_to_client). A callback runs with the
 * lock dropped; the record stays linked meanwhile, since only DONE
 * records are ever removed (sd_client_wait). Requests are found by their
 * tag (Accepted, a refusal) or by the current coordinator's id (the rest),
 * see client.c's top comment for the ids across coordinator restarts. */
#include "client_impl.h"
#include "client_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* By the current coordinator's id (what its messages carry). */
static req *find_by_server_id_locked(sd_client *c, uint64_t server_id) {
    if (server_id == 0) return NULL;
    for (req *r = c->reqs; r; r = r->next)
        if (r->state != REQ_PENDING && r->server_id == server_id) return r;
    return NULL;
}

static req *find_by_tag_locked(sd_client *c, uint64_t tag) {
    for (req *r = c->reqs; r; r = r->next)
        if (r->client_tag == tag) return r;
    return NULL;
}

/* Runs r's callback on ch with the lock dropped. */
static void callback_unlocked(sd_client *c, req *r, const sd_client_chunk *ch) {
    pthread_mutex_unlock(&c->mu);
    r->cb(ch, r->user);
    pthread_mutex_lock(&c->mu);
}

/* A token's logprob and alternatives, pointing into lp. */
static void logprob_of(int32_t id, const Specd__TokenLogprob *lp, sd_client_logprob *out) {
    out->token = (sd_client_token_lp){id, lp->logprob, (const char *)lp->token.data, lp->token.len};
    out->n_top = lp->n_top_ids;
    for (size_t j = 0; j < lp->n_top_ids && j < SD_MAX_TOP_LOGPROBS; j++)
        out->top[j] = (sd_client_token_lp){lp->top_ids[j], lp->top_logprobs[j], (const char *)lp->top_tokens[j].data,
                                           lp->top_tokens[j].len};
}

static void on_accepted(sd_client *c, const Specd__Accepted *a) {
    req *r = find_by_tag_locked(c, a->client_tag);
    if (r && r->state == REQ_ACTIVE && r->server_id == 0) { /* a resubmission, after a coordinator restart */
        r->server_id = a->request_id;
        SD_INFO("request %llu continues as the new coordinator's request %llu after %zu tokens",
                (unsigned long long)r->result.request_id, (unsigned long long)a->request_id, r->result.n_ids);
        if (r->cancel_requested) sd_client_send_cancel_locked(c, r->server_id);
        return;
    }
    if (!r || r->state != REQ_PENDING) {
        SD_WARN("Accepted for unknown client_tag %llu (request %llu): cancelling it", (unsigned long long)a->client_tag,
                (unsigned long long)a->request_id);
        sd_client_send_cancel_locked(c, a->request_id);
        return;
    }
    r->result.request_id = r->server_id = a->request_id;
    r->result.prompt_tokens = a->prompt_tokens;
    r->state = REQ_ACTIVE;
    pthread_cond_broadcast(&c->cv);
    if (r->cb && a->prompt_text.len > 0) {
        sd_client_chunk ch = {.request_id = r->result.request_id,
                              .prompt_text = (const char *)a->prompt_text.data,
                              .prompt_text_len = a->prompt_text.len};
        callback_unlocked(c, r, &ch);
    }
}

static void on_prompt_logprobs(sd_client *c, const Specd__PromptLogprobs *p) {
    req *r = find_by_server_id_locked(c, p->request_id);
    if (!r || r->state != REQ_ACTIVE || !r->cb) return;
    /* validated: 1..SD_MAX_PROMPT_LP_ROWS entries, one per token */
    sd_client_logprob *lps = calloc(p->n_logprobs, sizeof *lps);
    if (!lps) {
        sd_client_finish_locked(c, r, SD_ERR_NOMEM, SPECD__CODE__CODE_UNSPECIFIED, "out of memory for prompt logprobs",
                                NULL, 0);
        return;
    }
    for (size_t i = 0; i < p->n_logprobs; i++) logprob_of(p->tokens[i], p->logprobs[i], &lps[i]);
    sd_client_chunk ch = {.request_id = r->result.request_id,
                          .prompt_logprobs = lps,
                          .n_prompt_logprobs = p->n_logprobs,
                          .prompt_from = p->from};
    callback_unlocked(c, r, &ch);
    free(lps);
}

static void on_tokens(sd_client *c, const Specd__TokenChunk *t) {
    req *r = find_by_server_id_locked(c, t->request_id);
    if (!r || r->state != REQ_ACTIVE) {
        SD_DEBUG("tokens for unknown request %llu", (unsigned long long)t->request_id);
        return;
    }
    if (!sd_client_append_tokens(r, t->tokens, t->n_tokens, t->text.data, t->text.len)) {
        sd_client_finish_locked(c, r, SD_ERR_NOMEM, SPECD__CODE__CODE_UNSPECIFIED,
                                "out of memory collecting the output", NULL, 0);
        return;
    }
    if (!r->cb) return;
    /* validated: none, or one per token with at most SD_MAX_TOP_LOGPROBS alternatives */
    sd_client_logprob *lps = NULL;
    if (t->n_logprobs > 0 && t->n_logprobs == t->n_tokens) lps = calloc(t->n_logprobs, sizeof *lps);
    for (size_t i = 0; lps && i < t->n_logprobs; i++) logprob_of(t->tokens[i], t->logprobs[i], &lps[i]);
    if (t->n_logprobs > 0 && !lps)
        SD_WARN("request %llu: out of memory for logprobs: left out", (unsigned long long)r->result.request_id);
    sd_client_chunk ch = {.request_id = r->result.request_id,
                          .ids = t->tokens,
                          .n_ids = t->n_tokens,
                          .text = (const char *)t->text.data,
                          .text_len = t->text.len,
                          .logprobs = lps};
    callback_unlocked(c, r, &ch);
    free(lps);
}

static void on_finished(sd_client *c, const Specd__Finished *f) {
    req *r = find_by_server_id_locked(c, f->request_id);
    if (!r || r->state != REQ_ACTIVE) {
        SD_DEBUG("Finished for unknown request %llu", (unsigned long long)f->request_id);
        return;
    }
    r->result.stop_reason = f->reason;
    if (f->stats) sd_client_wire_request_stats(f->stats, &r->result.stats);
    sd_client_finish_locked(c, r, SD_OK, SPECD__CODE__CODE_OK, NULL, f->text_tail.data, f->text_tail.len);
}

static void on_error(sd_client *c, const Specd__Error *e) {
    char why[512];
    snprintf(why, sizeof why, "%s", e->message);
    req *r = NULL;
    if (e->client_tag) r = find_by_tag_locked(c, e->client_tag);
    if ((!r || (r->state != REQ_PENDING && r->state != REQ_ACTIVE)) && e->request_id)
        r = find_by_server_id_locked(c, e->request_id);
    if (!r && !e->client_tag && !e->request_id) {
        /* An untagged error (the coordinator could not decode the submit
         * far enough to read its tag) answers the oldest pending submit:
         * one connection's replies come in the order of its requests. */
        for (req *p = c->reqs; p; p = p->next)
            if (p->state == REQ_PENDING && (!r || p->client_tag < r->client_tag)) r = p;
    }
    if (r && (r->state == REQ_PENDING || r->state == REQ_ACTIVE)) {
        if (e->code == SPECD__CODE__CODE_CANCELLED) r->result.stop_reason = SPECD__STOP_REASON__STOP_REASON_CANCELLED;
        sd_client_finish_locked(c, r, sd_client_wire_status(e->code), e->code, why, NULL, 0);
        return;
    }
    if (e->request_id || e->client_tag) {
        /* About a request that is no longer live here: the answer to a
         * Cancel that crossed the request's end, say (UNKNOWN_REQUEST).
         * It answers nothing else, least of all a stats query. */
        SD_DEBUG("coordinator error %s for request %llu (tag %llu), no longer pending here: %s",
                 sd_net_code_name(e->code), (unsigned long long)e->request_id, (unsigned long long)e->client_tag, why);
        return;
    }
    /* Not about a request: it answers a stats query, or reports a protocol error. */
    SD_WARN("coordinator error %s: %s", sd_net_code_name(e->code), why);
    bool any = false;
    for (stats_waiter *w = c->stats_waiters; w; w = w->next)
        if (!w->done) w->done = true, w->status = sd_client_wire_status(e->code), any = true;
    if (any) pthread_cond_broadcast(&c->cv);
}

/* Every ServiceStats answers all current stats waiters (client.c's top). */
static void on_stats(sd_client *c, const Specd__ServiceStats *s) {
    for (stats_waiter *w = c->stats_waiters; w; w = w->next)
        if (!w->done) {
            sd_client_wire_service_stats(s, w->out);
            w->done = true;
            w->status = SD_OK;
        }
    pthread_cond_broadcast(&c->cv);
}

void sd_client_handle_locked(sd_client *c, const Specd__CoordinatorToClient *env) {
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED: on_accepted(c, env->accepted); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS: on_prompt_logprobs(c, env->prompt_logprobs); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS: on_tokens(c, env->tokens); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED: on_finished(c, env->finished); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR: on_error(c, env->error); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_STATS: on_stats(c, env->stats); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT: break;
    default: SD_WARN("unexpected message case %d from the coordinator", (int)env->body_case); break;
    }
}
