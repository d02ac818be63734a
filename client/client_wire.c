/* client_wire.c — libspecd-client's mapping between the protocol's
 * messages and the API's structs (client_wire.h). Split from client.c,
 * which keeps the socket, the I/O thread and the request records: these
 * are the field-by-field copies, which change with the protocol, not with
 * the threading. */
#include "client_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sd_status sd_client_wire_status(Specd__Code code) {
    switch (code) {
    case SPECD__CODE__CODE_BAD_REQUEST:
    case SPECD__CODE__CODE_MALFORMED:
    case SPECD__CODE__CODE_TOO_LARGE:
    case SPECD__CODE__CODE_PROTOCOL: return SD_ERR_INVALID_ARG;
    case SPECD__CODE__CODE_OVERLOADED:
    case SPECD__CODE__CODE_KV_FULL: return SD_ERR_OUT_OF_BLOCKS;
    case SPECD__CODE__CODE_UNKNOWN_REQUEST: return SD_ERR_NOT_FOUND;
    default: return SD_ERR_NET;
    }
}

void sd_client_wire_service_stats(const Specd__ServiceStats *s, sd_client_service_stats *o) {
    memset(o, 0, sizeof *o);
    o->active_requests = s->active_requests;
    o->queued_requests = s->queued_requests;
    o->finished_requests = s->finished_requests;
    o->committed_tokens = s->committed_tokens;
    o->step_overhead_p50_us = s->step_overhead_p50_us;
    o->step_overhead_p99_us = s->step_overhead_p99_us;
    o->draft_wait_mean_us = s->draft_wait_mean_us;
    o->draft_wait_p99_us = s->draft_wait_p99_us;
    o->draft_wait_share = s->draft_wait_share;
    o->verify_fixed_us = s->verify_fixed_us;
    o->verify_token_us = s->verify_token_us;
    o->draft_token_us = s->draft_token_us;
    o->draft_step_us = s->draft_step_us;
    o->catchup_row_us = s->catchup_row_us;
    o->seq_verify_steps = s->seq_verify_steps;
    o->drafts = s->drafts;
    o->draft_tokens = s->draft_tokens;
    o->accepted_tokens = s->accepted_tokens;
    o->verify_batches = s->verify_batches;
    /* sd_net_decode_to_client checked both arrays: equal lengths, at most SD_MAX_K */
    for (size_t i = 0; i < s->n_draft_tokens_per_pos && i < s->n_accepted_tokens_per_pos && i < SD_MAX_K; i++) {
        o->draft_tokens_per_pos[i] = s->draft_tokens_per_pos[i];
        o->accepted_tokens_per_pos[i] = s->accepted_tokens_per_pos[i];
        o->n_positions = i + 1;
    }
    for (size_t i = 0; i < s->n_workers && o->n_workers < SD_CLIENT_MAX_WORKERS; i++) {
        const Specd__WorkerInfo *w = s->workers[i];
        sd_client_worker_info *d = &o->workers[o->n_workers++];
        d->role = w->role;
        d->rank = w->rank;
        snprintf(d->name, sizeof d->name, "%s", w->name);
        d->drafter_kind = w->drafter_kind;
        d->alive = w->alive;
        d->group_id = w->group_id;
        d->group_size = w->group_size;
        d->active_requests = w->active_requests;
        d->served_requests = w->served_requests;
        d->drafted = w->drafted;
        d->accepted = w->accepted;
        d->committed = w->committed;
        d->step_us = w->step_us;
        d->worker_id = w->worker_id;
        if (w->stats) {
            d->kv_blocks_total = w->stats->kv_blocks_total;
            d->kv_blocks_free = w->stats->kv_blocks_free;
            d->n_sequences = w->stats->n_sequences;
            d->steps = w->stats->steps;
            d->prefix_query_tokens = w->stats->prefix_query_tokens;
            d->prefix_hit_tokens = w->stats->prefix_hit_tokens;
            d->prefix_blocks_cached = w->stats->prefix_blocks_cached;
            d->prefix_blocks_evicted = w->stats->prefix_blocks_evicted;
        }
    }
}

void sd_client_wire_request_stats(const Specd__RequestStats *s, sd_client_request_stats *o) {
    o->prompt_tokens = s->prompt_tokens;
    o->generated_tokens = s->generated_tokens;
    o->drafted = s->drafted;
    o->accepted = s->accepted;
    o->target_steps = s->target_steps;
    o->queued_ms = s->queued_ms;
    o->drafting_ms = s->drafting_ms;
    o->verifying_ms = s->verifying_ms;
    o->first_token_ms = s->first_token_ms;
    o->total_ms = s->total_ms;
    o->drafter_kind = s->drafter_kind;
    o->drafter_switches = s->drafter_switches;
}

/* The wire role of a chat role name; UNSPECIFIED (refused by validation) otherwise. */
static Specd__ChatRole chat_role(const char *role) {
    if (role && strcmp(role, "system") == 0) return SPECD__CHAT_ROLE__CHAT_ROLE_SYSTEM;
    if (role && strcmp(role, "user") == 0) return SPECD__CHAT_ROLE__CHAT_ROLE_USER;
    if (role && strcmp(role, "assistant") == 0) return SPECD__CHAT_ROLE__CHAT_ROLE_ASSISTANT;
    if (role && strcmp(role, "tool") == 0) return SPECD__CHAT_ROLE__CHAT_ROLE_TOOL;
    return SPECD__CHAT_ROLE__CHAT_ROLE_UNSPECIFIED;
}

sd_status sd_client_wire_messages(const sd_client_request *rq, Specd__ChatMessage ***messages,
                                  Specd__ChatMessage **storage, size_t *n_messages) {
    size_t n = rq->n_messages > SD_MAX_CHAT_MESSAGES ? SD_MAX_CHAT_MESSAGES + 1 : rq->n_messages;
    Specd__ChatMessage *pm = n ? calloc(n, sizeof *pm) : NULL;
    Specd__ChatMessage **pp = n ? calloc(n, sizeof *pp) : NULL;
    *messages = NULL, *storage = NULL, *n_messages = 0;
    if (n && (!pm || !pp)) {
        free(pm);
        free(pp);
        return SD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        specd__chat_message__init(&pm[i]);
        pm[i].role = chat_role(rq->messages[i].role);
        pm[i].content = (char *)(rq->messages[i].content ? rq->messages[i].content : "");
        pm[i].tool_calls = (char *)(rq->messages[i].tool_calls ? rq->messages[i].tool_calls : "");
        pm[i].tool_call_id = (char *)(rq->messages[i].tool_call_id ? rq->messages[i].tool_call_id : "");
        pp[i] = &pm[i];
    }
    *messages = pp, *storage = pm, *n_messages = n;
    return SD_OK;
}

void sd_client_wire_submit(const sd_client_request *rq, Specd__ChatMessage **messages, size_t n_messages,
                           Specd__Sampling *smp, Specd__SubmitRequest *sub) {
    specd__submit_request__init(sub);
    sub->messages = messages;
    sub->n_messages = messages ? n_messages : 0;
    specd__sampling__init(smp);
    sd_net_sampling_to_pb(&rq->sampling, smp);
    sub->prompt = (char *)(rq->prompt ? rq->prompt : "");
    sub->prompt_ids = (int32_t *)rq->prompt_ids;
    sub->n_prompt_ids = rq->prompt_ids ? rq->n_prompt_ids : 0;
    sub->chat = rq->chat;
    sub->system = (char *)(rq->system ? rq->system : "");
    sub->max_tokens = rq->max_tokens;
    sub->sampling = smp;
    sub->stop = (char **)rq->stop;
    sub->n_stop = rq->stop ? rq->n_stop : 0;
    sub->ignore_eos = rq->ignore_eos;
    sub->max_k = rq->max_k;
    sub->drafter_kind = rq->drafter_kind;
    sub->logprobs = rq->logprobs;
    sub->top_logprobs = rq->top_logprobs;
    sub->prompt_logprobs = rq->prompt_logprobs;
    sub->echo = rq->echo;
    sub->prompt_only = rq->prompt_only;
    sub->parse_special = rq->parse_special;
    sub->tools = (char *)(rq->tools ? rq->tools : "");
}

void sd_client_wire_constraint(const sd_client_request *rq, Specd__Constraint *con, Specd__SubmitRequest *sub) {
    if (rq->constraint_kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) return;
    specd__constraint__init(con);
    con->kind = rq->constraint_kind;
    con->text = (char *)(rq->constraint_text ? rq->constraint_text : "");
    sub->constraint = con;
}
