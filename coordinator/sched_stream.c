/* sched_stream.c — committing a verify step's tokens and streaming them to
 * the client (the scheduler: sched_dispatch.c).
 *
 * A committed chunk goes out as a TokenChunk, with its logprobs and each
 * token's bytes from the tokenizer (the client has none); chunks committed
 * while a verify reply is applied are deferred and flushed after the next
 * verify request is out (sd_sched_pump). Prompt logprobs go out as
 * PromptLogprobs, one message per scored prefill chunk. */
#include "coord.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A step's chunk holds at most SD_MAX_K + 1 tokens, so its logprobs are
 * laid out on the stack. */
typedef struct chunk_logprobs {
    Specd__TokenLogprob msgs[SD_MAX_K + 1];
    Specd__TokenLogprob *ptrs[SD_MAX_K + 1];
    ProtobufCBinaryData tops[SD_MAX_K + 1][SD_MAX_TOP_LOGPROBS];
} chunk_logprobs;

/* TokenChunk.logprobs for ids[n] from lps[n], with each token's bytes from
 * the tokenizer (the client has none); pointers into lps and the
 * tokenizer, valid while both are. */
/* One TokenLogprob for token id from *lp, with the bytes of the token and
 * its alternatives (tops[lp->n_top]) from the tokenizer (the client has
 * none); pointers into lp and the tokenizer, valid while both are. */
static void fill_logprob_msg(const sd_tok *tok, int32_t id, const sd_token_logprob *lp, Specd__TokenLogprob *m,
                             ProtobufCBinaryData *tops) {
    specd__token_logprob__init(m);
    size_t len = 0;
    const char *piece = sd_tok_piece(tok, id, &len);
    m->token.data = (uint8_t *)(uintptr_t)(piece ? piece : "");
    m->token.len = piece && len <= SD_MAX_TOKEN_BYTES ? len : 0;
    m->logprob = lp->logprob;
    m->n_top_ids = m->n_top_logprobs = m->n_top_tokens = (size_t)lp->n_top;
    m->top_ids = (int32_t *)(uintptr_t)lp->top_ids;
    m->top_logprobs = (float *)(uintptr_t)lp->top_logprobs;
    m->top_tokens = tops;
    for (int32_t j = 0; j < lp->n_top; j++) {
        piece = sd_tok_piece(tok, lp->top_ids[j], &len);
        tops[j].data = (uint8_t *)(uintptr_t)(piece ? piece : "");
        tops[j].len = piece && len <= SD_MAX_TOKEN_BYTES ? len : 0;
    }
}

static void fill_chunk_logprobs(const sd_tok *tok, const int32_t *ids, const sd_token_logprob *lps, int32_t n,
                                chunk_logprobs *out, Specd__TokenChunk *chunk) {
    for (int32_t t = 0; t < n; t++) {
        fill_logprob_msg(tok, ids[t], &lps[t], &out->msgs[t], out->tops[t]);
        out->ptrs[t] = &out->msgs[t];
    }
    chunk->n_logprobs = (size_t)n;
    chunk->logprobs = out->ptrs;
}

static void send_chunk(sd_coord *c, const sd_session *s, int32_t from, int32_t n, int32_t n_generated, const char *text,
                       size_t text_len, const sd_token_logprob *lps, uint64_t now_us) {
    Specd__TokenChunk chunk = SPECD__TOKEN_CHUNK__INIT;
    chunk.request_id = s->id;
    chunk.n_tokens = (size_t)n;
    chunk.tokens = (int32_t *)(uintptr_t)(s->tokens + from);
    chunk_logprobs clp;
    if (lps && n <= SD_MAX_K + 1) fill_chunk_logprobs(c->tok, chunk.tokens, lps, n, &clp, &chunk);
    chunk.text.data = (uint8_t *)(uintptr_t)text;
    chunk.text.len = text_len;
    chunk.n_generated = (uint32_t)n_generated;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS;
    env.tokens = &chunk;
    sd_outbox_client(c, s->client_ident, s->client_ident_len, &env, now_us);
}

/* Streams the chunks a verify reply committed (sd_sched_pump calls this
 * after dispatching: packing and sending 64 chunks took ~50 of the ~100 us
 * between a verify reply and the next request). A request that ended
 * meanwhile has had its Finished or error: its chunk is dropped. */
void sd_sched_flush_chunks(sd_coord *c, uint64_t now_us) {
    for (int32_t i = 0; i < c->n_chunks; i++) {
        sd_pending_chunk *p = &c->chunks[i];
        const sd_session *s = sd_sched_find(c, p->request_id);
        if (s && s->state != SD_SESSION_FINISHED && p->from + p->n <= s->n_tokens)
            send_chunk(c, s, p->from, p->n, p->n_generated, p->text, p->text_len, p->logprobs, now_us);
        free(p->text);
        free(p->logprobs);
    }
    c->n_chunks = 0;
}

void sd_sched_prompt_logprobs(sd_coord *c, const sd_session *s, int32_t from, int32_t n, const sd_token_logprob *lps,
                              uint64_t now_us) {
    if (n < 1 || n > SD_MAX_PROMPT_LP_ROWS || from < 0 || from + n > s->n_prompt || (!lps && (from != 0 || n != 1)))
        return; /* the callers' invariants */
    /* on the stack (about 30 KiB): nothing here can fail, so the session
     * outlives the call for the callers */
    Specd__TokenLogprob msgs[SD_MAX_PROMPT_LP_ROWS], *ptrs[SD_MAX_PROMPT_LP_ROWS];
    ProtobufCBinaryData tops[SD_MAX_PROMPT_LP_ROWS][SD_MAX_TOP_LOGPROBS];
    sd_token_logprob none = {.logprob = NAN, .n_top = 0};
    for (int32_t t = 0; t < n; t++) {
        fill_logprob_msg(c->tok, s->tokens[from + t], lps ? &lps[t] : &none, &msgs[t], tops[t]);
        ptrs[t] = &msgs[t];
    }
    Specd__PromptLogprobs pl = SPECD__PROMPT_LOGPROBS__INIT;
    pl.request_id = s->id;
    pl.from = (uint32_t)from;
    pl.n_tokens = (size_t)n;
    pl.tokens = s->tokens + from;
    pl.n_logprobs = (size_t)n;
    pl.logprobs = ptrs;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS;
    env.prompt_logprobs = &pl;
    sd_outbox_client(c, s->client_ident, s->client_ident_len, &env, now_us);
}

/* A checked prefill result with prompt logprobs: the scored positions go
 * to the client; a prompt-only request whose prompt is all scored ends. */
void sd_sched_prompt_logprobs_applied(sd_coord *c, sd_session *s, const Specd__VerifyResult *vr, uint64_t now_us) {
    const int32_t n = (int32_t)vr->n_logprobs, from = s->prompt_lp_next; /* checked: n <= SD_MAX_PROMPT_LP_ROWS */
    const size_t per = (size_t)s->top_logprobs;
    sd_token_logprob lps[SD_MAX_PROMPT_LP_ROWS];
    for (int32_t t = 0; t < n; t++) {
        lps[t].logprob = vr->logprobs[t];
        lps[t].n_top = (int32_t)per;
        memcpy(lps[t].top_ids, vr->top_ids + (size_t)t * per, per * sizeof *vr->top_ids);
        memcpy(lps[t].top_logprobs, vr->top_logprobs + (size_t)t * per, per * sizeof *vr->top_logprobs);
    }
    sd_sched_prompt_logprobs(c, s, from, n, lps, now_us);
    s->prompt_lp_next = from + n;
    if (s->prompt_only && s->prompt_lp_next >= s->n_prompt && s->state != SD_SESSION_FINISHED)
        sd_sched_finish(c, s, SPECD__STOP_REASON__STOP_REASON_LENGTH, NULL, 0, now_us);
}

/* Commits a verify step's tokens[n]; lps[n] their logprobs when the
 * request asked for them, else NULL. */
void sd_sched_commit_step(sd_coord *c, sd_session *s, const int32_t *tokens, int32_t n, const sd_token_logprob *lps,
                          uint64_t now_us) {
    sd_commit_out out;
    sd_status st = sd_session_commit(s, c->tok, tokens, n, &out);
    if (st != SD_OK) {
        free(out.text);
        free(out.tail);
        sd_sched_abort(c, s, SPECD__CODE__CODE_INTERNAL, "committing tokens failed", true, now_us);
        return;
    }
    if (s->t_first_token_us == 0 && out.n_taken > 0) s->t_first_token_us = now_us;
    c->committed_tokens += (uint64_t)out.n_taken;
    int32_t from = s->n_tokens - out.n_taken, n_gen = sd_session_generated(s);
    if (out.n_taken > 0 && c->defer_chunks && !out.finished) {
        if (c->n_chunks == c->cap_chunks) {
            int32_t cap = c->cap_chunks ? 2 * c->cap_chunks : 64;
            sd_pending_chunk *p = realloc(c->chunks, (size_t)cap * sizeof *p);
            if (p) c->chunks = p, c->cap_chunks = cap;
        }
        sd_token_logprob *kept = NULL;
        if (lps && (kept = malloc((size_t)out.n_taken * sizeof *kept)))
            memcpy(kept, lps, (size_t)out.n_taken * sizeof *kept);
        if (c->n_chunks < c->cap_chunks && (!lps || kept)) {
            c->chunks[c->n_chunks++] =
                (sd_pending_chunk){s->id, from, out.n_taken, n_gen, out.text, out.text_len, kept};
            return; /* the text and logprobs are the chunk's now */
        }
        free(kept);
    }
    /* now: not deferring, no room to defer, or the last chunk before Finished */
    if (out.n_taken > 0) send_chunk(c, s, from, out.n_taken, n_gen, out.text, out.text_len, lps, now_us);
    if (out.finished) sd_sched_finish(c, s, out.reason, out.tail, out.tail_len, now_us);
    free(out.text);
    free(out.tail);
}
