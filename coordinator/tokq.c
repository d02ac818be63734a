/* tokq.c — submitted prompts tokenized on a thread of their own (tokq.h).
 *
 * One thread, two singly linked FIFOs under one mutex: `todo` (bounded by
 * SD_TOKQ_MAX_JOBS and SD_TOKQ_MAX_BYTES, counted from push to pop so a slow
 * loop cannot pile up results either) and `done`. The thread signals the
 * loop by writing to an eventfd, which zmq_poll watches beside the sockets.
 * One thread is enough: it exists to keep the loop free, not to tokenize
 * faster, and the coordinator's machine also runs workers. Rejected: a
 * ZeroMQ inproc pair (a second message format for one pointer) and
 * tokenizing a prompt in slices on the loop (BPE merges one word at a time:
 * a 1 MiB word is one slice). */
#include "tokq.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ---- jobs ---- */

static char *dup_text(const char *s) {
    size_t n = s ? strlen(s) : 0;
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

sd_submit_job *sd_submit_job_new(const sd_net_submit *sub, const uint8_t *ident, size_t ident_len, uint64_t now_us) {
    const Specd__SubmitRequest *r = sub->req;
    sd_submit_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (ident_len > sizeof j->ident) ident_len = sizeof j->ident;
    memcpy(j->ident, ident, ident_len);
    j->ident_len = ident_len;
    j->client_tag = r->client_tag;
    j->t_submit_us = now_us;
    j->sampling = sub->sampling;
    j->max_tokens = r->max_tokens;
    j->ignore_eos = r->ignore_eos;
    j->max_k = r->max_k;
    j->pin_kind = r->drafter_kind;
    j->logprobs = r->logprobs;
    j->top_logprobs = (int32_t)r->top_logprobs; /* validated: <= SD_MAX_TOP_LOGPROBS */
    j->prompt_logprobs = r->prompt_logprobs;
    j->echo = r->echo;
    j->prompt_only = r->prompt_only; /* validated: max_tokens 0, no continuation */
    j->parse_special = r->parse_special; /* with chat or messages: refused by sd_submit_tokenize */
    j->chat = r->chat;
    j->code = SPECD__CODE__CODE_OK;
    bool ok = true;
    if (r->constraint && r->constraint->kind != SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) {
        j->con_kind = r->constraint->kind;
        ok = (j->con_text = dup_text(r->constraint->text)) != NULL;
    }
    if (r->n_prompt_ids > 0) {
        j->prompt_ids = malloc(r->n_prompt_ids * sizeof *j->prompt_ids);
        ok = j->prompt_ids != NULL;
        if (ok) memcpy(j->prompt_ids, r->prompt_ids, r->n_prompt_ids * sizeof *j->prompt_ids);
        j->n_prompt_ids = r->n_prompt_ids;
    } else {
        j->prompt = dup_text(r->prompt);
        j->system = dup_text(r->system);
        ok = j->prompt && j->system;
        if (ok) j->text_bytes = strlen(j->prompt) + strlen(j->system);
    }
    if (ok && r->n_messages > 0) { /* roles were checked by sd_net_read_client */
        static const char *const ROLES[] = {[SPECD__CHAT_ROLE__CHAT_ROLE_SYSTEM] = "system",
                                            [SPECD__CHAT_ROLE__CHAT_ROLE_USER] = "user",
                                            [SPECD__CHAT_ROLE__CHAT_ROLE_ASSISTANT] = "assistant",
                                            [SPECD__CHAT_ROLE__CHAT_ROLE_TOOL] = "tool"};
        j->msg_role = calloc(r->n_messages, sizeof *j->msg_role);
        j->msg_content = calloc(r->n_messages, sizeof *j->msg_content);
        j->msg_calls = calloc(r->n_messages, sizeof *j->msg_calls);
        j->msg_call_ids = calloc(r->n_messages, sizeof *j->msg_call_ids);
        ok = j->msg_role && j->msg_content && j->msg_calls && j->msg_call_ids;
        for (size_t i = 0; ok && i < r->n_messages; i++) {
            int role = (int)r->messages[i]->role;
            const char *calls = r->messages[i]->tool_calls, *id = r->messages[i]->tool_call_id;
            j->msg_role[i] = role >= 1 && role <= 4 ? ROLES[role] : "";
            j->msg_content[i] = dup_text(r->messages[i]->content);
            j->msg_calls[i] = calls && calls[0] ? dup_text(calls) : NULL;
            j->msg_call_ids[i] = id && id[0] ? dup_text(id) : NULL;
            ok = j->msg_content[i] != NULL && (!(calls && calls[0]) || j->msg_calls[i]) &&
                 (!(id && id[0]) || j->msg_call_ids[i]);
            j->n_messages = i + 1;
            if (ok)
                j->text_bytes += strlen(j->msg_content[i]) + (j->msg_calls[i] ? strlen(j->msg_calls[i]) : 0) +
                                 (j->msg_call_ids[i] ? strlen(j->msg_call_ids[i]) : 0);
        }
        if (ok && r->tools && r->tools[0]) {
            ok = (j->tools = dup_text(r->tools)) != NULL;
            if (ok) j->text_bytes += strlen(j->tools);
        }
    }
    if (ok && r->n_continuation > 0) {
        j->continuation = malloc(r->n_continuation * sizeof *j->continuation);
        ok = j->continuation != NULL;
        if (ok) memcpy(j->continuation, r->continuation, r->n_continuation * sizeof *j->continuation);
        j->n_continuation = ok ? r->n_continuation : 0;
    }
    if (ok && r->n_stop > 0) {
        j->stop = calloc(r->n_stop, sizeof *j->stop);
        ok = j->stop != NULL;
        for (size_t i = 0; ok && i < r->n_stop; i++) {
            j->stop[i] = dup_text(r->stop[i]);
            ok = j->stop[i] != NULL;
            j->n_stop = (int32_t)i + 1;
        }
    }
    if (!ok) sd_submit_job_free(&j);
    return j;
}

void sd_submit_job_free(sd_submit_job **jp) {
    if (!jp || !*jp) return;
    sd_submit_job *j = *jp;
    for (int32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->stop);
    free(j->prompt);
    free(j->system);
    free(j->prompt_ids);
    for (size_t i = 0; i < j->n_messages; i++) free(j->msg_content[i]);
    for (size_t i = 0; j->msg_calls && i < j->n_messages; i++) free(j->msg_calls[i]);
    for (size_t i = 0; j->msg_call_ids && i < j->n_messages; i++) free(j->msg_call_ids[i]);
    free(j->msg_call_ids);
    free(j->msg_content);
    free(j->msg_calls);
    free(j->tools);
    free(j->msg_role);
    free(j->continuation);
    free(j->ids);
    free(j->con_text);
    free(j);
    *jp = NULL;
}

static void refuse(sd_submit_job *j, Specd__Code code, const char *what) {
    j->code = code;
    snprintf(j->msg, sizeof j->msg, "%s", what);
}

/* The job's conversation in the chat template, tokenized with special
 * tokens from the markup only; false + j->code/msg on a refusal. */
static bool encode_chat(const sd_tok *tok, const sd_chat_template *chat, sd_submit_job *j, int32_t **enc,
                        size_t *n_enc) {
    sd_chat_msg two[2], *m = two;
    sd_chat_tools tt = {NULL, NULL, NULL}; /* tools, calls and tool turns (messages only) */
    size_t n = 0;
    if (j->n_messages > 0) {
        if (!(m = malloc(j->n_messages * sizeof *m))) {
            refuse(j, SPECD__CODE__CODE_INTERNAL, "out of memory tokenizing the prompt");
            return false;
        }
        for (size_t i = 0; i < j->n_messages; i++) m[n++] = (sd_chat_msg){j->msg_role[i], j->msg_content[i]};
        tt.tools = j->tools;
        tt.tool_calls = (const char *const *)j->msg_calls;
        tt.tool_call_ids = (const char *const *)j->msg_call_ids;
    } else {
        if (j->system[0]) m[n++] = (sd_chat_msg){"system", j->system};
        m[n++] = (sd_chat_msg){"user", j->prompt};
    }
    char why[400];
    sd_status st = sd_chat_template_encode_tools(chat, tok, m, n, j->n_messages > 0 ? &tt : NULL, true, enc, n_enc,
                                                 NULL, why, sizeof why);
    if (m != two) free(m);
    if (st == SD_ERR_INVALID_ARG) {
        j->code = SPECD__CODE__CODE_BAD_REQUEST;
        snprintf(j->msg, sizeof j->msg, "chat template: %s", why);
        return false;
    }
    if (st != SD_OK) {
        j->code = st == SD_ERR_NOMEM ? SPECD__CODE__CODE_INTERNAL : SPECD__CODE__CODE_BAD_REQUEST;
        snprintf(j->msg, sizeof j->msg, "submit.prompt: tokenization failed (%s)", sd_status_str(st));
        return false;
    }
    return true;
}

void sd_submit_tokenize(const sd_tok *tok, const sd_chat_template *chat, int32_t n_ctx, int32_t n_vocab,
                        sd_submit_job *j) {
    if (!sd_submit_check_constraint(j)) return;
    if (j->n_prompt_ids > 0) {
        if (j->n_prompt_ids > (size_t)n_ctx) {
            j->code = SPECD__CODE__CODE_TOO_LARGE;
            snprintf(j->msg, sizeof j->msg, "submit.prompt_ids: %zu tokens, the context holds %d", j->n_prompt_ids,
                     n_ctx);
            return;
        }
        for (size_t i = 0; i < j->n_prompt_ids; i++) {
            if (j->prompt_ids[i] < 0 || j->prompt_ids[i] >= n_vocab) {
                j->code = SPECD__CODE__CODE_BAD_REQUEST;
                snprintf(j->msg, sizeof j->msg, "submit.prompt_ids[%zu]: token id %d out of range [0, %d)", i,
                         j->prompt_ids[i], n_vocab);
                return;
            }
        }
        j->ids = j->prompt_ids;
        j->n_ids = j->n_prompt_ids;
        j->prompt_ids = NULL;
        j->n_prompt_ids = 0;
        return;
    }
    if (j->parse_special && (j->chat || j->n_messages > 0)) {
        refuse(j, SPECD__CODE__CODE_BAD_REQUEST,
               "submit.parse_special: for a plain text prompt only (chat and messages are always encoded safely)");
        return;
    }
    size_t plen = strlen(j->prompt);
    if (plen == 0 && j->n_messages == 0) {
        refuse(j, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt: empty (give prompt text or prompt_ids)");
        return;
    }
    if (plen > SD_MAX_PROMPT_BYTES) {
        j->code = SPECD__CODE__CODE_TOO_LARGE;
        snprintf(j->msg, sizeof j->msg, "submit.prompt: %zu bytes, limit %d", plen, SD_MAX_PROMPT_BYTES);
        return;
    }
    /* Special tokens come from the chat template's markup only: text a
     * client sent is encoded as text, so it cannot forge a turn, unless a
     * plain prompt asks for its special-token text (parse_special). */
    int32_t *enc = NULL;
    size_t n_enc = 0;
    sd_status st = SD_OK;
    if (j->chat || j->n_messages > 0) {
        if (!encode_chat(tok, chat, j, &enc, &n_enc)) return;
    } else {
        st = sd_tok_encode(tok, j->prompt, plen, j->parse_special, &enc, &n_enc);
    }
    if (st != SD_OK) {
        j->code = st == SD_ERR_NOMEM ? SPECD__CODE__CODE_INTERNAL : SPECD__CODE__CODE_BAD_REQUEST;
        snprintf(j->msg, sizeof j->msg, "submit.prompt: tokenization failed (%s)", sd_status_str(st));
        return;
    }
    bool bos = sd_tok_add_bos(tok) && sd_tok_bos(tok) >= 0;
    if (j->parse_special && n_enc > 0 && enc[0] == sd_tok_bos(tok)) bos = false; /* the text brought its own */
    int32_t *out = malloc((n_enc + 1) * sizeof *out);
    if (!out) {
        free(enc);
        refuse(j, SPECD__CODE__CODE_INTERNAL, "out of memory tokenizing the prompt");
        return;
    }
    size_t k = 0;
    if (bos) out[k++] = sd_tok_bos(tok);
    if (n_enc) memcpy(out + k, enc, n_enc * sizeof *out);
    free(enc);
    if (k + n_enc == 0) {
        free(out);
        refuse(j, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt: empty after tokenization");
        return;
    }
    j->ids = out;
    j->n_ids = k + n_enc;
}

/* ---- the queue ---- */

struct sd_tokq {
    const sd_tok *tok;
    const sd_chat_template *chat;
    int32_t n_ctx, n_vocab;
    int efd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, started;
    sd_submit_job *todo, *todo_tail, *done, *done_tail;
    int32_t n_jobs; /* pushed and not popped */
    size_t n_bytes; /* their text bytes */
};

static void *tokq_main(void *arg) {
    sd_tokq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && !q->todo) pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop) break;
        sd_submit_job *j = q->todo;
        q->todo = j->next;
        if (!q->todo) q->todo_tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&q->mu);
        sd_submit_tokenize(q->tok, q->chat, q->n_ctx, q->n_vocab, j);
        pthread_mutex_lock(&q->mu);
        if (q->done_tail)
            q->done_tail->next = j;
        else
            q->done = j;
        q->done_tail = j;
        uint64_t one = 1;
        if (write(q->efd, &one, sizeof one) < 0 && errno != EAGAIN) SD_WARN("tokq: eventfd write: %s", strerror(errno));
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

sd_status sd_tokq_new(const sd_tok *tok, const sd_chat_template *chat, int32_t n_ctx, int32_t n_vocab, sd_tokq **out) {
    *out = NULL;
    sd_tokq *q = calloc(1, sizeof *q);
    if (!q) return SD_ERR_NOMEM;
    q->tok = tok;
    q->chat = chat;
    q->n_ctx = n_ctx;
    q->n_vocab = n_vocab;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        SD_ERROR("eventfd: %s", strerror(errno));
        free(q);
        return SD_ERR_IO;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    int rc = pthread_create(&q->thread, NULL, tokq_main, q);
    if (rc != 0) {
        SD_ERROR("pthread_create (tokenizer thread): %s", strerror(rc));
        sd_tokq_free(&q);
        return SD_ERR_INTERNAL;
    }
    q->started = true;
    *out = q;
    return SD_OK;
}

static void free_list(sd_submit_job *j) {
    while (j) {
        sd_submit_job *next = j->next;
        sd_submit_job_free(&j);
        j = next;
    }
}

void sd_tokq_free(sd_tokq **qp) {
    if (!qp || !*qp) return;
    sd_tokq *q = *qp;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
    }
    free_list(q->todo);
    free_list(q->done);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    close(q->efd);
    free(q);
    *qp = NULL;
}

int sd_tokq_fd(const sd_tokq *q) { return q->efd; }

bool sd_tokq_push(sd_tokq *q, sd_submit_job **jp) {
    sd_submit_job *j = *jp;
    pthread_mutex_lock(&q->mu);
    bool room = q->n_jobs < SD_TOKQ_MAX_JOBS && q->n_bytes + j->text_bytes <= SD_TOKQ_MAX_BYTES;
    if (room) {
        j->next = NULL;
        if (q->todo_tail)
            q->todo_tail->next = j;
        else
            q->todo = j;
        q->todo_tail = j;
        q->n_jobs++;
        q->n_bytes += j->text_bytes;
        pthread_cond_signal(&q->cv);
        *jp = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    return room;
}

sd_submit_job *sd_tokq_pop(sd_tokq *q) {
    uint64_t count;
    (void)!read(q->efd, &count, sizeof count); /* clears the wake-up; EAGAIN when already clear */
    pthread_mutex_lock(&q->mu);
    sd_submit_job *j = q->done;
    if (j) {
        q->done = j->next;
        if (!q->done) q->done_tail = NULL;
        j->next = NULL;
        q->n_jobs--;
        q->n_bytes -= j->text_bytes;
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

int32_t sd_tokq_pending(const sd_tokq *q) {
    pthread_mutex_lock((pthread_mutex_t *)&q->mu);
    int32_t n = q->n_jobs;
    pthread_mutex_unlock((pthread_mutex_t *)&q->mu);
    return n;
}
