/* tokq.h — tokenizing submitted prompts off the coordinator's event loop.
 *
 * A Submit is checked on the loop (cheap, bounded checks), then its text
 * goes to one tokenizer thread through a bounded queue; the finished job
 * comes back through a second queue and an eventfd the loop polls next to
 * its sockets, and the loop admits it (clients.c). Tokenizing costs time in
 * proportion to the prompt (0.5 s for a 1 MiB word) and must never delay
 * heartbeats or steps. The tokenizer is immutable and thread-safe; the
 * thread touches nothing else of the coordinator. */
#ifndef SPECD_COORD_TOKQ_H
#define SPECD_COORD_TOKQ_H

#include "coord.h"

#define SD_TOKQ_MAX_JOBS  256        /* submits waiting for or in tokenization */
#define SD_TOKQ_MAX_BYTES (32 << 20) /* their prompt, system and message text, bytes */

/* A Submit between its checks on the loop and its admission: what the
 * session needs (copied out of the unpacked message) and the result. */
typedef struct sd_submit_job {
    uint8_t ident[SD_MAX_IDENTITY_BYTES];
    size_t ident_len;
    uint64_t client_tag;
    uint64_t t_submit_us;
    sd_sampling sampling;
    uint32_t max_tokens;
    bool ignore_eos;
    int32_t max_k;
    Specd__DrafterKind pin_kind; /* drafter_kind (routing), validated by the decoder */
    bool logprobs;               /* stream the target's logprobs, top_logprobs alternatives each */
    int32_t top_logprobs;
    bool prompt_logprobs; /* the target's logprob of each prompt token (PromptLogprobs) */
    bool echo;            /* Accepted.prompt_text */
    bool prompt_only;     /* generate nothing */
    char **stop;          /* n_stop owned strings */
    int32_t n_stop;
    bool chat;
    bool parse_special;    /* a plain prompt's special-token text is read as control tokens (not with chat) */
    char *prompt, *system; /* owned, NUL-terminated */
    /* a whole conversation (messages): n_messages roles ("system", "user",
     * "assistant"; static strings) and owned contents; used instead of
     * prompt/system when n_messages > 0 */
    const char **msg_role;
    char **msg_content;
    char **msg_calls;    /* [n_messages]: an assistant's tool calls (JSON), NULL: none */
    char **msg_call_ids; /* [n_messages]: a tool turn's tool_call_id, NULL: none */
    char *tools;         /* the request's tools (JSON), NULL: none */
    size_t n_messages;
    int32_t *prompt_ids; /* owned; used instead of the text when n_prompt_ids > 0 */
    size_t n_prompt_ids;
    int32_t *continuation; /* owned: tokens already generated (failover), resumed after the prompt */
    size_t n_continuation;
    /* structured output (SubmitRequest.constraint, shape validated by the
     * decoder): kind NONE or the kind and its owned text; compiled once by
     * sd_submit_tokenize to refuse one that does not compile */
    Specd__ConstraintKind con_kind;
    char *con_text;
    size_t text_bytes; /* the text's bytes (prompt, system, messages), for the queue's byte bound */
    /* result of sd_submit_tokenize */
    int32_t *ids; /* owned, n_ids tokens (BOS first when the model adds one) */
    size_t n_ids;
    Specd__Code code; /* CODE_OK, or why the prompt is refused (msg) */
    char msg[512];
    struct sd_submit_job *next;
} sd_submit_job;

/* Copies what admission needs out of the validated submit (its request
 * borrowed for the call); NULL when out of memory. Caller frees with
 * sd_submit_job_free. */
sd_submit_job *sd_submit_job_new(const sd_net_submit *sub, const uint8_t *ident, size_t ident_len, uint64_t now_us);
void sd_submit_job_free(sd_submit_job **j);

/* Tokenizes j's prompt (a conversation in the chat template with
 * sd_chat_template_encode when j->chat or j->n_messages, special tokens from
 * the template's markup only; else the text with special tokens off; BOS
 * when the model adds one) into j->ids, or sets j->code/j->msg. Reads only
 * its arguments: thread-safe. */
void sd_submit_tokenize(const sd_tok *tok, const sd_chat_template *chat, int32_t n_ctx, int32_t n_vocab,
                        sd_submit_job *j);

/* constrain_check.c: compiles j's constraint (thread-safe); false with
 * j->code BAD_REQUEST and j->msg naming the construct it refuses. */
bool sd_submit_check_constraint(sd_submit_job *j);

typedef struct sd_tokq sd_tokq;

/* Starts the tokenizer thread over tok and chat (borrowed; both must
 * outlive the queue). Caller frees with sd_tokq_free. */
sd_status sd_tokq_new(const sd_tok *tok, const sd_chat_template *chat, int32_t n_ctx, int32_t n_vocab, sd_tokq **out);
/* Stops and joins the thread; frees every job still held. NULL-safe. */
void sd_tokq_free(sd_tokq **q);
/* File descriptor that is readable while finished jobs wait (for zmq_poll). */
int sd_tokq_fd(const sd_tokq *q);
/* Queues *j (ownership moves to the queue, *j = NULL). false when the
 * queue is at SD_TOKQ_MAX_JOBS or SD_TOKQ_MAX_BYTES (the caller keeps *j and
 * answers OVERLOADED). Loop thread only. */
bool sd_tokq_push(sd_tokq *q, sd_submit_job **j);
/* A finished job (caller owns it, frees with sd_submit_job_free), or NULL
 * when none waits. Loop thread only. */
sd_submit_job *sd_tokq_pop(sd_tokq *q);
/* Jobs queued, in tokenization or finished but not popped. */
int32_t sd_tokq_pending(const sd_tokq *q);

#endif
