/* validate.c — decode and validate every envelope before a process acts on it.
 *
 * protobuf-c checks wire types and nothing else: lengths are unbounded,
 * strings are not checked for UTF-8, and a message of the wrong envelope
 * often decodes "successfully" into other fields. So after unpacking, each
 * decoder walks the tree and checks
 *   - no unknown fields anywhere (the bytes were some other message; all
 *     processes are built from the same proto, so a newer peer is not a
 *     case to support),
 *   - the oneof is set ("empty envelope"),
 *   - every repeated field against the limits (batch, draft, top-N, context),
 *   - token ids in [0, n_vocab), sparse distributions (distinct ids, finite
 *     positive probabilities summing to 1 within 1e-3), sampling ranges, text
 *     as UTF-8, Hello fields.
 * The first failure wins; its message names the field path, the limit and
 * the value ("verify.seqs[3].draft[1]: token id 70000 out of range
 * [0, 49152)"). Rejected: a schema-driven generic validator (descriptor
 * options would need a protoc plugin); the hand-written checks are short and
 * say exactly what each field means. The checks of single fields and of
 * shared messages are in validate_fields.c. */
#include "validate_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- client link ---- */

/* SubmitRequest.messages: roles known, content UTF-8, bounded in count and
 * in total size, and nothing else saying what the prompt is. */
static bool check_messages(vctx *v, const Specd__SubmitRequest *s) {
    char path[96];
    if (s->n_messages > SD_MAX_CHAT_MESSAGES)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.messages: %zu messages over the limit of %d",
                          s->n_messages, SD_MAX_CHAT_MESSAGES);
    if (s->n_prompt_ids > 0 || s->prompt[0] || s->system[0] || s->chat)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "submit.messages: give the conversation alone (prompt, prompt_ids, chat and system empty)");
    if (!sd_nv_check_text(v, "submit.tools", s->tools, SD_MAX_PROMPT_BYTES)) return false;
    size_t total = strlen(s->tools);
    for (size_t i = 0; i < s->n_messages; i++) {
        const Specd__ChatMessage *m = s->messages[i];
        snprintf(path, sizeof path, "submit.messages[%zu].role", i);
        if (m->role != SPECD__CHAT_ROLE__CHAT_ROLE_SYSTEM && m->role != SPECD__CHAT_ROLE__CHAT_ROLE_USER &&
            m->role != SPECD__CHAT_ROLE__CHAT_ROLE_ASSISTANT && m->role != SPECD__CHAT_ROLE__CHAT_ROLE_TOOL)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: %d is not a role (system, user, assistant, tool)",
                              path, (int)m->role);
        snprintf(path, sizeof path, "submit.messages[%zu].content", i);
        if (!sd_nv_check_text(v, path, m->content, SD_MAX_PROMPT_BYTES)) return false;
        snprintf(path, sizeof path, "submit.messages[%zu].tool_calls", i);
        if (!sd_nv_check_text(v, path, m->tool_calls, SD_MAX_PROMPT_BYTES)) return false;
        if (m->tool_calls[0] && m->role != SPECD__CHAT_ROLE__CHAT_ROLE_ASSISTANT)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: tool calls in a turn that is not the assistant's",
                              path);
        snprintf(path, sizeof path, "submit.messages[%zu].tool_call_id", i);
        if (!sd_nv_check_text(v, path, m->tool_call_id, SD_MAX_CALL_ID_BYTES)) return false;
        if (m->tool_call_id[0] && m->role != SPECD__CHAT_ROLE__CHAT_ROLE_TOOL)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: a tool_call_id in a turn that is not a tool's",
                              path);
        total += strlen(m->content) + strlen(m->tool_calls) + strlen(m->tool_call_id);
        if (total > SD_MAX_PROMPT_BYTES)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.messages: more than %d bytes of content in all",
                              SD_MAX_PROMPT_BYTES);
    }
    return true;
}

static bool check_submit(vctx *v, const Specd__SubmitRequest *s, sd_sampling *sampling) {
    char path[96];
    if (s->n_messages > 0) {
        if (!check_messages(v, s)) return false;
    } else if (s->tools[0]) {
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.tools: only with messages");
    } else if (s->n_prompt_ids > 0) {
        if (s->n_prompt_ids > (size_t)v->max_context)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.prompt_ids: %zu tokens over the context of %d",
                              s->n_prompt_ids, v->max_context);
        if (!sd_nv_check_tokens(v, "submit.prompt_ids", s->prompt_ids, s->n_prompt_ids)) return false;
    } else {
        if (s->prompt[0] == '\0')
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt: empty (need text or prompt_ids)");
        if (!sd_nv_check_text(v, "submit.prompt", s->prompt, SD_MAX_PROMPT_BYTES)) return false;
    }
    if (!sd_nv_check_text(v, "submit.system", s->system, SD_MAX_PROMPT_BYTES)) return false;
    if (s->n_continuation > 0) {
        if (s->n_continuation + s->n_prompt_ids > (size_t)v->max_context)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.continuation: %zu tokens over the context of %d",
                              s->n_continuation, v->max_context);
        if (s->max_tokens > 0 && s->n_continuation >= s->max_tokens)
            return sd_nv_fail(
                v, SPECD__CODE__CODE_BAD_REQUEST,
                "submit.continuation: %zu tokens already reach max_tokens %u: nothing is left to generate",
                s->n_continuation, s->max_tokens);
        if (!sd_nv_check_tokens(v, "submit.continuation", s->continuation, s->n_continuation)) return false;
    }
    if (v->max_context < INT32_MAX && s->max_tokens > (uint32_t)v->max_context)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.max_tokens: %u over the context of %d", s->max_tokens,
                          v->max_context);
    if (!sd_nv_check_sampling(v, "submit.sampling", s->sampling, sampling)) return false;
    if (!sd_nv_check_logprob_request(v, "submit", s->logprobs || s->prompt_logprobs, s->top_logprobs)) return false;
    if (s->prompt_only && s->max_tokens != 0)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt_only: with max_tokens %u (must be 0)",
                          s->max_tokens);
    if (s->prompt_only && s->n_continuation > 0)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "submit.prompt_only: with a continuation (nothing is generated)");
    if (s->n_stop > SD_MAX_STOP_STRINGS)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.stop: %zu strings over the limit of %d", s->n_stop,
                          SD_MAX_STOP_STRINGS);
    for (size_t i = 0; i < s->n_stop; i++) {
        snprintf(path, sizeof path, "submit.stop[%zu]", i);
        if (s->stop[i][0] == '\0') return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: empty stop string", path);
        if (!sd_nv_check_text(v, path, s->stop[i], SD_MAX_STOP_BYTES)) return false;
    }
    if (s->max_k < -1 || s->max_k > SD_MAX_K)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.max_k: %d outside [-1, %d]", s->max_k, SD_MAX_K);
    if (s->drafter_kind > SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.drafter_kind: %d is not a known kind (0..4)",
                          (int)s->drafter_kind);
    return sd_nv_check_submit_constraint(v, s);
}

/* Decodes a ClientToCoordinator into m (env and, for a submit, its sampling). */
static bool decode_client(const uint8_t *data, size_t len, const sd_net_limits *lim, sd_net_client_msg *m,
                          Specd__Code *code, char *err, size_t err_len) {
    vctx v = sd_nv_make_ctx(lim, code, err, err_len);
    Specd__ClientToCoordinator *env =
        (Specd__ClientToCoordinator *)sd_nv_unpack_env(&v, &specd__client_to_coordinator__descriptor, data, len);
    if (!env) return false;
    bool ok = sd_nv_no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__CLIENT_TO_COORDINATOR__BODY_HELLO: ok = sd_nv_check_hello(&v, "hello", env->hello, false); break;
        case SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT:
            m->submit.req = env->submit;
            ok = check_submit(&v, env->submit, &m->submit.sampling);
            break;
        case SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL:
        case SPECD__CLIENT_TO_COORDINATOR__BODY_STATS:
        case SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT: break;
        default: ok = sd_nv_fail(&v, SPECD__CODE__CODE_MALFORMED, "ClientToCoordinator: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__client_to_coordinator__free_unpacked(env, NULL);
        return false;
    }
    m->env = env;
    return true;
}

/* A zeroed validated message of size bytes, or NULL with CODE_INTERNAL. */
static void *new_msg(size_t size, const char *what, Specd__Code *code, char *err, size_t err_len) {
    void *m = calloc(1, size);
    if (!m) {
        vctx v = sd_nv_make_ctx(NULL, code, err, err_len);
        sd_nv_fail(&v, SPECD__CODE__CODE_INTERNAL, "%s: out of memory", what);
    }
    return m;
}

sd_net_client_msg *sd_net_read_client(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                      char *err, size_t err_len) {
    sd_net_client_msg *m = new_msg(sizeof *m, "ClientToCoordinator", code, err, err_len);
    if (m && !decode_client(data, len, lim, m, code, err, err_len)) {
        free(m);
        m = NULL;
    }
    return m;
}

void sd_net_client_msg_free(sd_net_client_msg **mp) {
    if (!mp || !*mp) return;
    specd__client_to_coordinator__free_unpacked((*mp)->env, NULL);
    free(*mp);
    *mp = NULL;
}

Specd__ClientToCoordinator *sd_net_decode_client(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                 Specd__Code *code, char *err, size_t err_len) {
    sd_net_client_msg m = {0};
    return decode_client(data, len, lim, &m, code, err, err_len) ? m.env : NULL;
}

/* The per-position counters: one entry per draft position at most, the
 * two arrays as long as each other. */
static bool check_service_stats(vctx *v, const Specd__ServiceStats *s) {
    if (s->n_draft_tokens_per_pos > SD_MAX_K || s->n_accepted_tokens_per_pos > SD_MAX_K)
        return sd_nv_fail(
            v, SPECD__CODE__CODE_TOO_LARGE,
            "stats.draft_tokens_per_pos / accepted_tokens_per_pos: %zu / %zu entries, over the limit of %d",
            s->n_draft_tokens_per_pos, s->n_accepted_tokens_per_pos, SD_MAX_K);
    if (s->n_draft_tokens_per_pos != s->n_accepted_tokens_per_pos)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "stats.draft_tokens_per_pos: %zu entries but accepted_tokens_per_pos %zu",
                          s->n_draft_tokens_per_pos, s->n_accepted_tokens_per_pos);
    return true;
}

Specd__CoordinatorToClient *sd_net_decode_to_client(const uint8_t *data, size_t len, Specd__Code *code, char *err,
                                                    size_t err_len) {
    vctx v = sd_nv_make_ctx(NULL, code, err, err_len);
    Specd__CoordinatorToClient *env =
        (Specd__CoordinatorToClient *)sd_nv_unpack_env(&v, &specd__coordinator_to_client__descriptor, data, len);
    if (!env) return NULL;
    bool ok = sd_nv_no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS:
            ok = sd_nv_check_tokens(&v, "tokens.tokens", env->tokens->tokens, env->tokens->n_tokens);
            if (ok && env->tokens->n_logprobs != 0 && env->tokens->n_logprobs != env->tokens->n_tokens)
                ok = sd_nv_fail(&v, SPECD__CODE__CODE_BAD_REQUEST, "tokens.logprobs: %zu entries for %zu tokens",
                                env->tokens->n_logprobs, env->tokens->n_tokens);
            if (ok) ok = sd_nv_check_logprobs(&v, "tokens.logprobs", env->tokens->logprobs, env->tokens->n_logprobs);
            break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS: {
            const Specd__PromptLogprobs *p = env->prompt_logprobs;
            ok = sd_nv_check_tokens(&v, "prompt_logprobs.tokens", p->tokens, p->n_tokens);
            if (ok && (p->n_logprobs != p->n_tokens || p->n_tokens == 0 || p->n_tokens > SD_MAX_PROMPT_LP_ROWS ||
                       (p->from == 0 && p->n_tokens != 1)))
                ok = sd_nv_fail(&v, SPECD__CODE__CODE_BAD_REQUEST,
                                "prompt_logprobs: %zu entries for %zu tokens from %u (1..%d, one for position 0)",
                                p->n_logprobs, p->n_tokens, p->from, SD_MAX_PROMPT_LP_ROWS);
            if (ok)
                ok =
                    sd_nv_check_logprobs_from(&v, "prompt_logprobs.logprobs", p->logprobs, p->n_logprobs, p->from == 0);
            break;
        }
        case SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED:
            if (env->finished->reason > SPECD__STOP_REASON__STOP_REASON_CANCELLED)
                ok = sd_nv_fail(&v, SPECD__CODE__CODE_BAD_REQUEST, "finished.reason: %d is not a stop reason",
                                (int)env->finished->reason);
            break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR: ok = sd_nv_check_error(&v, "error", env->error); break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_STATS: ok = check_service_stats(&v, env->stats); break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED:
            if (env->accepted->prompt_text.len > SD_MAX_PROMPT_BYTES)
                ok = sd_nv_fail(&v, SPECD__CODE__CODE_TOO_LARGE, "accepted.prompt_text: %zu bytes over the limit of %d",
                                env->accepted->prompt_text.len, SD_MAX_PROMPT_BYTES);
            break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT: break;
        default: ok = sd_nv_fail(&v, SPECD__CODE__CODE_MALFORMED, "CoordinatorToClient: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__coordinator_to_client__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* ---- worker link ---- */

static bool check_draft_response(vctx *v, const Specd__DraftResponse *r) {
    char path[96];
    uint64_t rows = 0; /* the results' contexts, each + 1: what catch-up rows can be */
    if (r->n_results > (size_t)v->max_batch)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "draft.results: %zu results over the limit of %d",
                          r->n_results, v->max_batch);
    for (size_t i = 0; i < r->n_results; i++) {
        const Specd__DraftResult *d = r->results[i];
        snprintf(path, sizeof path, "draft.results[%zu].code", i);
        if (!sd_nv_check_code(v, path, d->code)) return false;
        if (d->n_tokens > (size_t)v->max_k)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                              "draft.results[%zu].tokens: %zu tokens over the limit of %d", i, d->n_tokens, v->max_k);
        if (d->n_q != d->n_tokens)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "draft.results[%zu].q: %zu distributions for %zu tokens", i, d->n_q, d->n_tokens);
        snprintf(path, sizeof path, "draft.results[%zu].tokens", i);
        if (!sd_nv_check_tokens(v, path, d->tokens, d->n_tokens)) return false;
        for (size_t j = 0; j < d->n_q; j++) {
            snprintf(path, sizeof path, "draft.results[%zu].q[%zu]", i, j);
            if (!sd_nv_check_q(v, path, d->q[j], d->tokens[j])) return false;
        }
        if (d->cached_len > (uint32_t)v->max_context)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "draft.results[%zu].cached_len: %u over the context of %d", i, d->cached_len,
                              v->max_context);
        rows += (uint64_t)d->cached_len + 1;
    }
    if (r->catchup_us > r->draft_us)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.catchup_us: %u of the step's %u us (draft_us)",
                          r->catchup_us, r->draft_us);
    if ((uint64_t)r->catchup_rows > rows)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.catchup_rows: %u rows past the results' %llu",
                          r->catchup_rows, (unsigned long long)rows);
    return true;
}

/* A verifier's head drafts (VerifyResult.next_draft / next_q): at most
 * max_k, one q each, as a drafter's DraftResult; its catch-up within its
 * time and its context. */
static bool check_next_draft(vctx *v, size_t i, const Specd__VerifyResult *d) {
    char path[96];
    if (d->n_next_draft > (size_t)v->max_k)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                          "verify.results[%zu].next_draft: %zu tokens over the limit of %d", i, d->n_next_draft,
                          v->max_k);
    if (d->n_next_q != d->n_next_draft)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "verify.results[%zu].next_q: %zu distributions for %zu drafts", i, d->n_next_q,
                          d->n_next_draft);
    if (d->n_next_draft > 0 && (d->code != SPECD__CODE__CODE_OK || d->n_commit == 0))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "verify.results[%zu].next_draft: %zu drafts with nothing committed", i, d->n_next_draft);
    if (d->next_catchup_us > d->next_us)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "verify.results[%zu].next_catchup_us: %u of the head's %u us (next_us)", i,
                          d->next_catchup_us, d->next_us);
    if ((uint64_t)d->next_catchup_rows > (uint64_t)d->cached_len + 1)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "verify.results[%zu].next_catchup_rows: %u rows past a context of %u", i,
                          d->next_catchup_rows, d->cached_len + 1);
    snprintf(path, sizeof path, "verify.results[%zu].next_draft", i);
    if (!sd_nv_check_tokens(v, path, d->next_draft, d->n_next_draft)) return false;
    for (size_t j = 0; j < d->n_next_q; j++) {
        snprintf(path, sizeof path, "verify.results[%zu].next_q[%zu]", i, j);
        if (!sd_nv_check_q(v, path, d->next_q[j], d->next_draft[j])) return false;
    }
    return true;
}

static bool check_verify_response(vctx *v, const Specd__VerifyResponse *r) {
    char path[96];
    size_t features = 0; /* floats of features in the response */
    if (r->n_results > (size_t)v->max_batch)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "verify.results: %zu results over the limit of %d",
                          r->n_results, v->max_batch);
    for (size_t i = 0; i < r->n_results; i++) {
        const Specd__VerifyResult *d = r->results[i];
        snprintf(path, sizeof path, "verify.results[%zu].code", i);
        if (!sd_nv_check_code(v, path, d->code)) return false;
        if (d->n_commit > (size_t)v->max_k + 1)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                              "verify.results[%zu].commit: %zu tokens over the limit of %d", i, d->n_commit,
                              v->max_k + 1);
        if (d->n_accepted > (uint32_t)v->max_k)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "verify.results[%zu].n_accepted: %u over the limit of %d", i, d->n_accepted, v->max_k);
        if (d->n_commit > 0 && d->n_accepted + 1 != d->n_commit)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "verify.results[%zu].commit: %zu tokens, expected n_accepted + 1 = %u", i, d->n_commit,
                              d->n_accepted + 1);
        snprintf(path, sizeof path, "verify.results[%zu].commit", i);
        if (!sd_nv_check_tokens(v, path, d->commit, d->n_commit)) return false;
        /* logprobs: one per commit token, or (nothing committed: a
         * prefill chunk's prompt logprobs) one per appended token */
        if ((d->n_logprobs != 0 && d->n_logprobs != d->n_commit &&
             !(d->n_commit == 0 && d->n_logprobs <= SD_MAX_PROMPT_LP_ROWS)) ||
            d->n_top_ids != d->n_top_logprobs ||
            (d->n_logprobs == 0
                 ? d->n_top_ids != 0
                 : d->n_top_ids % d->n_logprobs != 0 || d->n_top_ids / d->n_logprobs > SD_MAX_TOP_LOGPROBS))
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "verify.results[%zu]: %zu logprobs, %zu top ids and %zu top logprobs for %zu tokens "
                              "(one logprob per token, at most %d alternatives each)",
                              i, d->n_logprobs, d->n_top_ids, d->n_top_logprobs, d->n_commit, SD_MAX_TOP_LOGPROBS);
        snprintf(path, sizeof path, "verify.results[%zu].top_ids", i);
        if (!sd_nv_check_tokens(v, path, d->top_ids, d->n_top_ids)) return false;
        for (size_t j = 0; j < d->n_logprobs + d->n_top_logprobs; j++) {
            float x = j < d->n_logprobs ? d->logprobs[j] : d->top_logprobs[j - d->n_logprobs];
            if (!(x <= 0.0f))
                return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.results[%zu]: %g is not a log-probability",
                                  i, (double)x);
        }
        if (d->cached_len > (uint32_t)v->max_context)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "verify.results[%zu].cached_len: %u over the context of %d", i, d->cached_len,
                              v->max_context);
        if (!check_next_draft(v, i, d)) return false;
        if (!sd_nv_check_result_features(v, i, d, &features)) return false;
    }
    return true;
}

Specd__WorkerToCoordinator *sd_net_decode_worker(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                 Specd__Code *code, char *err, size_t err_len) {
    vctx v = sd_nv_make_ctx(lim, code, err, err_len);
    Specd__WorkerToCoordinator *env =
        (Specd__WorkerToCoordinator *)sd_nv_unpack_env(&v, &specd__worker_to_coordinator__descriptor, data, len);
    if (!env) return NULL;
    bool ok = sd_nv_no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__WORKER_TO_COORDINATOR__BODY_HELLO: ok = sd_nv_check_hello(&v, "hello", env->hello, true); break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_ERROR: ok = sd_nv_check_error(&v, "error", env->error); break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT: break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT: ok = check_draft_response(&v, env->draft); break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY: ok = check_verify_response(&v, env->verify); break;
        default: ok = sd_nv_fail(&v, SPECD__CODE__CODE_MALFORMED, "WorkerToCoordinator: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__worker_to_coordinator__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* keep_len + appended (+ drafts) must fit the context. */
static bool check_context(vctx *v, const char *path, uint64_t keep_len, uint64_t total) {
    if (total > (uint64_t)v->max_context)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                          "%s: keep_len %llu + new tokens = %llu over the context of %d", path,
                          (unsigned long long)keep_len, (unsigned long long)total, v->max_context);
    return true;
}

/* sampling[i]: seqs[i]'s sampling, converted (SD_MAX_BATCH entries). */
static bool check_draft_request(vctx *v, const Specd__DraftRequest *r, sd_sampling *sampling) {
    char path[96];
    size_t features = 0; /* floats of features in the request */
    if (!sd_nv_check_batch_size(v, "draft.seqs", r->n_seqs)) return false;
    uint64_t ids[SD_MAX_BATCH];
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Specd__DraftSeq *s = r->seqs[i];
        ids[i] = s->request_id;
        if (s->n_append > (size_t)v->max_context)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                              "draft.seqs[%zu].append: %zu tokens over the context of %d", i, s->n_append,
                              v->max_context);
        snprintf(path, sizeof path, "draft.seqs[%zu].append", i);
        if (!sd_nv_check_tokens(v, path, s->append, s->n_append)) return false;
        if (s->k < 1 || s->k > (uint32_t)v->max_k)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[%zu].k: %u outside [1, %d]", i, s->k,
                              v->max_k);
        if (s->top_n > SD_MAX_TOP_N)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[%zu].top_n: %u over the limit of %d", i,
                              s->top_n, SD_MAX_TOP_N);
        snprintf(path, sizeof path, "draft.seqs[%zu]", i);
        if (!check_context(v, path, s->keep_len, (uint64_t)s->keep_len + s->n_append)) return false;
        snprintf(path, sizeof path, "draft.seqs[%zu].sampling", i);
        if (!sd_nv_check_sampling(v, path, s->sampling, &sampling[i])) return false;
        if (!sd_nv_check_draft_constraint(v, i, s)) return false;
        if (!sd_nv_check_draft_features(v, i, s, &features)) return false;
    }
    return sd_nv_check_distinct_ids(v, "draft.seqs", ids, r->n_seqs);
}

static bool check_verify_request(vctx *v, const Specd__VerifyRequest *r, sd_sampling *sampling) {
    char path[96];
    if (!sd_nv_check_batch_size(v, "verify.seqs", r->n_seqs)) return false;
    uint64_t ids[SD_MAX_BATCH];
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Specd__VerifySeq *s = r->seqs[i];
        ids[i] = s->request_id;
        if (s->n_append > (size_t)v->max_context)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                              "verify.seqs[%zu].append: %zu tokens over the context of %d", i, s->n_append,
                              v->max_context);
        snprintf(path, sizeof path, "verify.seqs[%zu].append", i);
        if (!sd_nv_check_tokens(v, path, s->append, s->n_append)) return false;
        if (s->n_draft > (size_t)v->max_k)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "verify.seqs[%zu].draft: %zu tokens over the limit of %d",
                              i, s->n_draft, v->max_k);
        if (r->prefill_only && s->n_draft > 0)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "verify.seqs[%zu].draft: %zu drafts in a prefill_only batch", i, s->n_draft);
        if (s->n_append == 0 && s->n_draft == 0)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.seqs[%zu].append: empty with no drafts", i);
        if (s->n_q != s->n_draft)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.seqs[%zu].q: %zu distributions for %zu drafts",
                              i, s->n_q, s->n_draft);
        if (s->next_k > (uint32_t)v->max_k || (r->prefill_only && s->next_k > 0))
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "verify.seqs[%zu].next_k: %u (at most %d, and 0 in a prefill_only batch)", i, s->next_k,
                              v->max_k);
        snprintf(path, sizeof path, "verify.seqs[%zu].draft", i);
        if (!sd_nv_check_tokens(v, path, s->draft, s->n_draft)) return false;
        for (size_t j = 0; j < s->n_q; j++) {
            snprintf(path, sizeof path, "verify.seqs[%zu].q[%zu]", i, j);
            if (!sd_nv_check_q(v, path, s->q[j], s->draft[j])) return false;
        }
        snprintf(path, sizeof path, "verify.seqs[%zu]", i);
        if (!check_context(v, path, s->keep_len, (uint64_t)s->keep_len + s->n_append + s->n_draft)) return false;
        snprintf(path, sizeof path, "verify.seqs[%zu].sampling", i);
        if (!sd_nv_check_sampling(v, path, s->sampling, &sampling[i])) return false;
        snprintf(path, sizeof path, "verify.seqs[%zu]", i);
        if (!sd_nv_check_logprob_request(v, path, s->logprobs || s->prompt_logprobs, s->top_logprobs)) return false;
        if (s->prompt_logprobs && (!r->prefill_only || s->n_append > SD_MAX_PROMPT_LP_ROWS))
            return sd_nv_fail(
                v, SPECD__CODE__CODE_BAD_REQUEST,
                "verify.seqs[%zu].prompt_logprobs: %s with %zu appended tokens (prefill_only steps, at most %d)", i,
                r->prefill_only ? "prefill" : "a normal step", s->n_append, SD_MAX_PROMPT_LP_ROWS);
        snprintf(path, sizeof path, "verify.seqs[%zu].constraint", i);
        if (!sd_nv_check_constraint(v, path, s->constraint)) return false;
        if (s->prompt_logprobs) {
            snprintf(path, sizeof path, "verify.seqs[%zu].prompt_next", i);
            if (!sd_nv_check_tokens(v, path, &s->prompt_next, 1)) return false;
            if ((uint64_t)s->keep_len + s->n_append + 1 > (uint64_t)v->max_context)
                return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                                  "verify.seqs[%zu].prompt_next: position %zu past the context of %d", i,
                                  (size_t)s->keep_len + s->n_append, v->max_context);
        }
    }
    if (!sd_nv_check_feature_layers(v, r)) return false;
    return sd_nv_check_distinct_ids(v, "verify.seqs", ids, r->n_seqs);
}

/* Welcome.vocab_size: 0 (not said) or a size an int32 id holds. */
static bool check_welcome(vctx *v, const Specd__Welcome *w) {
    if (w->vocab_size > (uint32_t)INT32_MAX)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "welcome.vocab_size: %u outside [0, %d]", w->vocab_size,
                          INT32_MAX);
    return true;
}

/* Decodes a CoordinatorToWorker into m (env and, for a step, each
 * sequence's sampling). */
static bool decode_to_worker(const uint8_t *data, size_t len, const sd_net_limits *lim, sd_net_worker_msg *m,
                             Specd__Code *code, char *err, size_t err_len) {
    vctx v = sd_nv_make_ctx(lim, code, err, err_len);
    Specd__CoordinatorToWorker *env =
        (Specd__CoordinatorToWorker *)sd_nv_unpack_env(&v, &specd__coordinator_to_worker__descriptor, data, len);
    if (!env) return false;
    bool ok = sd_nv_no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME: ok = check_welcome(&v, env->welcome); break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT:
        case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE: break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_ERROR: ok = sd_nv_check_error(&v, "error", env->error); break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT:
            m->draft.req = env->draft;
            ok = check_draft_request(&v, env->draft, m->draft.sampling);
            break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY:
            m->verify.req = env->verify;
            ok = check_verify_request(&v, env->verify, m->verify.sampling);
            break;
        default: ok = sd_nv_fail(&v, SPECD__CODE__CODE_MALFORMED, "CoordinatorToWorker: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__coordinator_to_worker__free_unpacked(env, NULL);
        return false;
    }
    m->env = env;
    return true;
}

sd_net_worker_msg *sd_net_read_to_worker(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                         char *err, size_t err_len) {
    sd_net_worker_msg *m = new_msg(sizeof *m, "CoordinatorToWorker", code, err, err_len);
    if (m && !decode_to_worker(data, len, lim, m, code, err, err_len)) {
        free(m);
        m = NULL;
    }
    return m;
}

void sd_net_worker_msg_free(sd_net_worker_msg **mp) {
    if (!mp || !*mp) return;
    specd__coordinator_to_worker__free_unpacked((*mp)->env, NULL);
    free(*mp);
    *mp = NULL;
}

Specd__CoordinatorToWorker *sd_net_decode_to_worker(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                    Specd__Code *code, char *err, size_t err_len) {
    sd_net_worker_msg *m = sd_net_read_to_worker(data, len, lim, code, err, err_len);
    if (!m) return NULL;
    Specd__CoordinatorToWorker *env = m->env;
    free(m);
    return env;
}

/* ---- the verifier group's own link (verifier/group.c) ---- */

static bool check_group_join(vctx *v, const Specd__GroupJoin *j) {
    if (j->group_size < 2 || j->group_size > SD_MAX_GROUP_SIZE)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.group_size: %u outside [2, %d]", j->group_size,
                          SD_MAX_GROUP_SIZE);
    if (j->rank < 1 || j->rank >= j->group_size)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.rank: %u outside [1, %u) (rank 0 is the leader)",
                          j->rank, j->group_size);
    if (j->lm_head > 1)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.lm_head: %u is not 0 or 1", j->lm_head);
    if (!j->model) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.model: missing");
    return sd_nv_check_text(v, "join.host", j->host, NAME_MAX_BYTES) &&
           sd_nv_check_text(v, "join.model.architecture", j->model->architecture, NAME_MAX_BYTES) &&
           sd_nv_check_text(v, "join.model.name", j->model->name, 4096);
}

static bool check_group_setup(vctx *v, const Specd__GroupSetup *s) {
    size_t name_len = strlen(s->shm_name);
    if (name_len > 200 || strchr(s->shm_name, '/'))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.shm_name: %zu bytes (at most 200, no '/')",
                          name_len);
    if ((name_len == 0) == (s->nccl_id.len == 0))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup: exactly one of shm_name and nccl_id must be set");
    if (s->nccl_id.len > 1024)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "setup.nccl_id: %zu bytes over the limit of 1024",
                          s->nccl_id.len);
    if (s->coll_timeout_ms < 1 || s->coll_timeout_ms > 3600000)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.coll_timeout_ms: %u outside [1, 3600000]",
                          s->coll_timeout_ms);
    if (s->coll_max_bytes < 64 || s->coll_max_bytes > ((uint64_t)1 << 34))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.coll_max_bytes: %llu outside [64, 2^34]",
                          (unsigned long long)s->coll_max_bytes);
    if (s->kv_blocks < 1 || s->kv_blocks > (1u << 28) || s->block_size < 1 || s->block_size > 4096)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "setup: kv_blocks %u outside [1, 2^28] or block_size %u "
                          "outside [1, 4096]",
                          s->kv_blocks, s->block_size);
    if (s->window_blocks > s->kv_blocks)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.window_blocks: %u over kv_blocks %u",
                          s->window_blocks, s->kv_blocks);
    if (s->heartbeat_interval_ms < 1 || s->heartbeat_interval_ms > 60000 || s->heartbeat_liveness < 1 ||
        s->heartbeat_liveness > 1000)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "setup: heartbeat interval %u ms outside [1, 60000] or "
                          "liveness %u outside [1, 1000]",
                          s->heartbeat_interval_ms, s->heartbeat_liveness);
    return true;
}

static bool check_group_plan(vctx *v, const Specd__GroupPlan *p) {
    if (p->n_tokens < 1 || p->n_tokens > SD_MAX_GROUP_ROWS)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.tokens: %zu rows outside [1, %d]", p->n_tokens,
                          SD_MAX_GROUP_ROWS);
    if (p->n_pos != p->n_tokens || p->n_bt_off != p->n_tokens)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan: %zu tokens but %zu positions and %zu table offsets",
                          p->n_tokens, p->n_pos, p->n_bt_off);
    if (p->n_bt < 1 || p->n_bt > (1u << 28))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.bt: %zu entries outside [1, 2^28]", p->n_bt);
    if (p->n_wanted > p->n_tokens)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.wanted: %zu rows of %zu", p->n_wanted, p->n_tokens);
    if (p->n_bt_win != 0 && p->n_bt_win != p->n_bt)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.bt_win: %zu entries, bt has %zu", p->n_bt_win,
                          p->n_bt);
    return sd_nv_check_tokens(v, "plan.tokens", p->tokens, p->n_tokens);
}

Specd__RankToLeader *sd_net_decode_rank(const uint8_t *data, size_t len, Specd__Code *code, char *err, size_t err_len) {
    vctx v = sd_nv_make_ctx(NULL, code, err, err_len);
    Specd__RankToLeader *env =
        (Specd__RankToLeader *)sd_nv_unpack_env(&v, &specd__rank_to_leader__descriptor, data, len);
    if (!env) return NULL;
    bool ok = sd_nv_no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__RANK_TO_LEADER__BODY_JOIN: ok = check_group_join(&v, env->join); break;
        case SPECD__RANK_TO_LEADER__BODY_READY:
        case SPECD__RANK_TO_LEADER__BODY_HEARTBEAT: break;
        case SPECD__RANK_TO_LEADER__BODY_ERROR: ok = sd_nv_check_error(&v, "error", env->error); break;
        default: ok = sd_nv_fail(&v, SPECD__CODE__CODE_MALFORMED, "RankToLeader: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__rank_to_leader__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

Specd__LeaderToRank *sd_net_decode_leader(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                          char *err, size_t err_len) {
    vctx v = sd_nv_make_ctx(lim, code, err, err_len);
    Specd__LeaderToRank *env =
        (Specd__LeaderToRank *)sd_nv_unpack_env(&v, &specd__leader_to_rank__descriptor, data, len);
    if (!env) return NULL;
    bool ok = sd_nv_no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__LEADER_TO_RANK__BODY_SETUP: ok = check_group_setup(&v, env->setup); break;
        case SPECD__LEADER_TO_RANK__BODY_PLAN: ok = check_group_plan(&v, env->plan); break;
        case SPECD__LEADER_TO_RANK__BODY_HEARTBEAT: break;
        case SPECD__LEADER_TO_RANK__BODY_STOP: ok = sd_nv_check_text(&v, "stop.reason", env->stop->reason, 4096); break;
        case SPECD__LEADER_TO_RANK__BODY_ERROR: ok = sd_nv_check_error(&v, "error", env->error); break;
        default: ok = sd_nv_fail(&v, SPECD__CODE__CODE_MALFORMED, "LeaderToRank: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__leader_to_rank__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}
