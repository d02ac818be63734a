/* session.c — one request: its committed tokens, output text and stop rules.
 *
 * Commit appends tokens one at a time and checks, after each: an
 * end-of-generation token (unless ignore_eos), max_tokens, stop strings, the
 * context length. Stop strings are matched on the decoded text, across token
 * boundaries: the decoder yields complete UTF-8 only, and the longest suffix
 * of the text so far that is a prefix of some stop string is held back
 * rather than streamed, so a stop string is never half-emitted. Any match
 * must then start inside held + new text (a match starting earlier would
 * have made a longer held suffix), so only that buffer is searched. On a
 * match the text before it is streamed, the rest and every later token of
 * the step are discarded. At a finish for another reason the held text and
 * the decoder's incomplete tail become Finished.text_tail. An EOS token is
 * committed (counted, in TokenChunk.tokens) but adds no text, like
 * specd-generate. */
#include "coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sd_session *sd_session_new(const sd_tok *tok, uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                           int32_t max_context, const char *const *stop, int32_t n_stop) {
    sd_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->id = id;
    s->max_tokens = max_tokens;
    s->max_context = max_context;
    s->n_prompt = n_prompt;
    s->cap_tokens = n_prompt + 64;
    s->tokens = malloc((size_t)s->cap_tokens * sizeof *s->tokens);
    s->stream = sd_tok_stream_new(tok);
    s->adapt.alpha = 0.6;
    s->shadow_base = -1;
    s->head_base = -1;
    s->shadow_slot = -1;
    s->wall_drafter = -1;
    s->sampling = sd_sampling_default();
    if (!s->tokens || !s->stream) goto fail;
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    s->n_tokens = n_prompt;
    if (n_stop > 0) {
        s->stop = calloc((size_t)n_stop, sizeof *s->stop);
        s->stop_len = calloc((size_t)n_stop, sizeof *s->stop_len);
        if (!s->stop || !s->stop_len) goto fail;
        s->n_stop = n_stop;
        for (int32_t i = 0; i < n_stop; i++) {
            s->stop[i] = strdup(stop[i]);
            if (!s->stop[i]) goto fail;
            s->stop_len[i] = strlen(stop[i]);
        }
    }
    return s;
fail:
    sd_session_free(&s);
    return NULL;
}

void sd_session_free(sd_session **sp) {
    if (!sp || !*sp) return;
    sd_session *s = *sp;
    for (int32_t i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->stop_len);
    free(s->tokens);
    free(s->held);
    free(s->q_off);
    free(s->q_ids);
    free(s->q_probs);
    free(s->con_text);
    free(s->head_q_ids);
    free(s->head_q_probs);
    free(s->feat);
    sd_tok_stream_free(&s->stream);
    free(s);
    *sp = NULL;
}

int32_t sd_session_generated(const sd_session *s) { return s->n_tokens - s->n_prompt; }

/* Appends n bytes to a growing buffer. */
static bool buf_append(char **buf, size_t *len, size_t *cap, const char *src, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t ncap = (*cap ? *cap * 2 : 64);
        while (ncap < *len + n + 1) ncap *= 2;
        char *nb = realloc(*buf, ncap);
        if (!nb) return false;
        *buf = nb;
        *cap = ncap;
    }
    if (n) memcpy(*buf + *len, src, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* Earliest position where any stop string occurs in buf, or -1. */
static int64_t find_stop(const sd_session *s, const char *buf, size_t len) {
    int64_t best = -1;
    for (int32_t i = 0; i < s->n_stop; i++) {
        if (s->stop_len[i] == 0 || s->stop_len[i] > len) continue;
        const char *hit = memmem(buf, len, s->stop[i], s->stop_len[i]);
        if (hit && (best < 0 || hit - buf < best)) best = hit - buf;
    }
    return best;
}

/* Length of the longest suffix of buf that is a proper prefix of a stop string. */
static size_t hold_len(const sd_session *s, const char *buf, size_t len) {
    size_t best = 0;
    for (int32_t i = 0; i < s->n_stop; i++) {
        size_t m = s->stop_len[i] ? s->stop_len[i] - 1 : 0;
        if (m > len) m = len;
        for (size_t h = m; h > best; h--) {
            if (memcmp(buf + len - h, s->stop[i], h) == 0) {
                best = h;
                break;
            }
        }
    }
    return best;
}

sd_status sd_session_flush(sd_session *s, char **tail, size_t *tail_len) {
    char out[1024];
    size_t n = 0, cap = 0;
    *tail = NULL;
    *tail_len = 0;
    if (!buf_append(tail, tail_len, &cap, s->held ? s->held : "", s->held_len)) return SD_ERR_NOMEM;
    s->held_len = 0;
    if (sd_tok_stream_flush(s->stream, out, sizeof out, &n) == SD_OK && n > 0) {
        if (!buf_append(tail, tail_len, &cap, out, n)) return SD_ERR_NOMEM;
    }
    return SD_OK;
}

sd_status sd_session_commit(sd_session *s, const sd_tok *tok, const int32_t *tokens, int32_t n, sd_commit_out *out) {
    memset(out, 0, sizeof *out);
    size_t text_cap = 0;
    if (!buf_append(&out->text, &out->text_len, &text_cap, "", 0)) return SD_ERR_NOMEM;
    for (int32_t i = 0; i < n && !out->finished; i++) {
        int32_t id = tokens[i];
        if (s->n_tokens == s->cap_tokens) {
            int32_t ncap = s->cap_tokens * 2;
            int32_t *nt = realloc(s->tokens, (size_t)ncap * sizeof *nt);
            if (!nt) return SD_ERR_NOMEM;
            s->tokens = nt;
            s->cap_tokens = ncap;
        }
        s->tokens[s->n_tokens++] = id;
        out->n_taken++;
        if (!s->ignore_eos && sd_tok_is_eog(tok, id)) {
            out->finished = true;
            out->reason = SPECD__STOP_REASON__STOP_REASON_EOS;
            break;
        }
        char piece[512];
        size_t np = 0;
        sd_status st = sd_tok_stream_push(s->stream, id, piece, sizeof piece, &np);
        if (st != SD_OK) return st;
        if (s->n_stop == 0) {
            if (!buf_append(&out->text, &out->text_len, &text_cap, piece, np)) return SD_ERR_NOMEM;
        } else if (np > 0) {
            if (!buf_append(&s->held, &s->held_len, &s->held_cap, piece, np)) return SD_ERR_NOMEM;
            int64_t at = find_stop(s, s->held, s->held_len);
            if (at >= 0) {
                if (!buf_append(&out->text, &out->text_len, &text_cap, s->held, (size_t)at)) return SD_ERR_NOMEM;
                s->held_len = 0;
                out->finished = true;
                out->reason = SPECD__STOP_REASON__STOP_REASON_STOP_STRING;
                break;
            }
            size_t h = hold_len(s, s->held, s->held_len);
            size_t emit = s->held_len - h;
            if (!buf_append(&out->text, &out->text_len, &text_cap, s->held, emit)) return SD_ERR_NOMEM;
            memmove(s->held, s->held + emit, h);
            s->held_len = h;
        }
        if (sd_session_generated(s) >= s->max_tokens) {
            out->finished = true;
            out->reason = SPECD__STOP_REASON__STOP_REASON_LENGTH;
        } else if (s->n_tokens >= s->max_context) {
            out->finished = true;
            out->reason = SPECD__STOP_REASON__STOP_REASON_CONTEXT;
        }
    }
    if (out->finished && out->reason != SPECD__STOP_REASON__STOP_REASON_STOP_STRING) {
        SD_TRY(sd_session_flush(s, &out->tail, &out->tail_len));
    }
    return SD_OK;
}

bool sd_session_resume(sd_session *s, const sd_tok *tok, const int32_t *tokens, int32_t n, char *msg, size_t msg_len) {
    sd_commit_out out;
    sd_status st = sd_session_commit(s, tok, tokens, n, &out);
    bool ok = st == SD_OK && !out.finished && out.n_taken == n;
    if (st != SD_OK)
        snprintf(msg, msg_len, "submit.continuation: %s", sd_status_str(st));
    else if (!ok)
        snprintf(msg, msg_len, "submit.continuation: the request already ended at its token %d (stop reason %d)",
                 (int)out.n_taken, (int)out.reason);
    free(out.text);
    free(out.tail);
    return ok;
}
