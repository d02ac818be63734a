/* client.h — libspecd-client: submit generation jobs to a specd coordinator.
 *
 * One sd_client is one DEALER connection to the coordinator, owned by a
 * background I/O thread (ZeroMQ sockets are not thread-safe). Every API
 * function may be called from any thread: calls hand their message to the
 * I/O thread through a mutex-protected queue and wake it with an eventfd
 * that zmq_poll watches next to the socket.
 *
 * Callbacks run on the I/O thread, one at a time, in the order the
 * coordinator sent the events: they must be quick and must not call
 * sd_client_submit, sd_client_wait, sd_client_stats or sd_client_close
 * (those wait for the I/O thread); sd_client_cancel is allowed.
 *
 * Liveness: while anything is in flight the I/O thread sends a Heartbeat
 * every heartbeat_interval_ms when it sent nothing else. When the
 * coordinator has been silent for heartbeat_liveness intervals it is taken
 * for dead (or restarting): the client reconnects and resubmits every
 * request in flight as a continuation of the tokens it received (same
 * prompt, parameters and seed), so the caller sees one uninterrupted
 * stream with the same output; a request fails (SD_ERR_NET, "coordinator
 * ... unreachable") only when no coordinator answers within
 * reconnect_timeout_ms (0: fail at once, "coordinator ... silent"). Before
 * the coordinator has answered anything, connect_timeout_ms applies
 * instead (it may simply not be up yet).
 *
 * No wait is endless: a Submit the answering coordinator neither accepts
 * nor refuses within answer_timeout_ms fails, and every request ends by its
 * deadline (request_timeout_ms, or its own timeout_ms), cancelled on the
 * coordinator, with SD_ERR_NET and a message saying which deadline passed.
 *
 * A connection that receives this client's own Hello, or first a message
 * that does not decode, is not to a coordinator (a TCP self-connect, say):
 * it is dropped at once and the requests resubmitted on a new one. */
#ifndef SPECD_CLIENT_H
#define SPECD_CLIENT_H

#include "specd/net.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_CLIENT_DEFAULT_ADDR "tcp://127.0.0.1:7700"
#define SD_CLIENT_MAX_WORKERS  64 /* workers reported by sd_client_stats */

typedef struct sd_client sd_client;

typedef struct sd_client_params {
    const char *coordinator;   /* address to connect to (default SD_CLIENT_DEFAULT_ADDR) */
    int connect_timeout_ms;    /* first answer from the coordinator (default 10000) */
    int heartbeat_interval_ms; /* default SD_HEARTBEAT_INTERVAL_MS */
    int heartbeat_liveness;    /* silent intervals before the coordinator is dead (default SD_HEARTBEAT_LIVENESS) */
    int reconnect_timeout_ms;  /* after that: wait this long for a coordinator to take the resubmitted requests
                                  (default 60000; 0 = fail them at once) */
    int answer_timeout_ms;     /* a Submit the coordinator (alive, answering) has neither accepted nor refused
                                  this long fails with SD_ERR_NET (default 30000) */
    int request_timeout_ms;    /* every request ends within this long of its submit: past it, it is cancelled and
                                  fails with SD_ERR_NET (default 3600000; 0 = no limit); see
                                  sd_client_request.timeout_ms */
    const char *name;          /* sent in Hello, for the coordinator's logs (default "specd-client") */
    /* CurveZMQ (Z85 text, 40 chars): the coordinator's public key and this
     * client's own pair, whose public key must be on the coordinator's
     * --client-keys list (all three, or all NULL: plaintext). A key the
     * coordinator refuses fails every request at once with the reason.
     * sd_curve_id_load (specd/curve.h) reads them from specd-keygen files. */
    const char *curve_server_public, *curve_public, *curve_secret;
} sd_client_params;

/* Defaults as documented on each field. */
sd_client_params sd_client_default_params(void);

/* One turn of a conversation (sd_client_request.messages). */
typedef struct sd_client_chat_msg {
    const char *role; /* "system", "user", "assistant" or "tool" */
    const char *content;
    const char *tool_calls;   /* an assistant's calls: a JSON list of {"name", "arguments", "id"}; NULL: none */
    const char *tool_call_id; /* a tool turn's: the call it answers (SD_MAX_CALL_ID_BYTES); NULL: none */
} sd_client_chat_msg;

/* A generation job. Strings are borrowed for the duration of sd_client_submit. */
typedef struct sd_client_request {
    const char *prompt;        /* UTF-8 text, NUL-terminated: it cannot hold a NUL byte (callers refuse
                                  input that does, as specd-client and the gateway do, rather than
                                  cut it); special-token text in it stays text. Ignored when
                                  n_prompt_ids > 0 */
    const int32_t *prompt_ids; /* token ids instead of text */
    size_t n_prompt_ids;
    bool chat;          /* format prompt as a user turn with the model's chat template */
    const char *system; /* system prompt with chat; NULL = the model's default */
    /* A whole conversation, history included, formatted by the model's chat
     * template (at most SD_MAX_CHAT_MESSAGES turns, SD_MAX_PROMPT_BYTES of
     * content); when n_messages > 0, prompt, prompt_ids, chat and system
     * must be unset. */
    const sd_client_chat_msg *messages;
    size_t n_messages;
    const char *tools; /* with messages: a JSON list of OpenAI tools the template renders; NULL: none */
    uint32_t max_tokens;     /* 0 = coordinator default */
    sd_sampling sampling;    /* default: greedy */
    const char *const *stop; /* stop strings */
    size_t n_stop;
    bool ignore_eos;
    int32_t max_k;                   /* 0 = default, -1 = no speculation */
    Specd__DrafterKind drafter_kind; /* only drafters of this kind; UNSPECIFIED = the coordinator chooses */
    /* The target model's log-probability of each generated token and the
     * top_logprobs (0..SD_MAX_TOP_LOGPROBS) most likely tokens at its
     * position (log-softmax after the penalties, before temperature and the
     * filters), in each chunk's logprobs. */
    bool logprobs;
    uint32_t top_logprobs;
    /* echo (OpenAI completions): the target's logprob of every prompt token
     * given the ones before it, top_logprobs alternatives each, from the
     * target's prefill (no speculation, no penalties), delivered in the
     * chunks' prompt_logprobs before any token */
    bool prompt_logprobs;
    bool echo;        /* one chunk's prompt_text: the prompt's tokens detokenized, before any token */
    bool prompt_only; /* generate nothing (max_tokens must be 0): ends with LENGTH once the prompt is scored */
    int timeout_ms;   /* this request's deadline from its submit (0 = the client's request_timeout_ms) */
    /* A plain text prompt only: its special-token text ("<|im_start|>") is
     * read as control tokens (for prompts formatted by the caller). Off:
     * it stays text. Refused with chat or messages, which are always safe. */
    bool parse_special;
    /* Structured output: the generated text belongs to this language
     * (SubmitRequest.constraint): JSON_OBJECT (no text), JSON_SCHEMA (the
     * schema's JSON), REGEX or GRAMMAR (GBNF) with constraint_text, at most
     * SD_MAX_CONSTRAINT_BYTES. NONE (default): free text. A constraint that
     * does not compile is refused (BAD_REQUEST naming the construct). */
    Specd__ConstraintKind constraint_kind;
    const char *constraint_text;
} sd_client_request;

/* Greedy, no stop strings, coordinator defaults for the rest. */
sd_client_request sd_client_default_request(void);

/* Per-request statistics (RequestStats). */
typedef struct sd_client_request_stats {
    uint32_t prompt_tokens, generated_tokens;
    uint32_t drafted, accepted, target_steps;
    double queued_ms, drafting_ms, verifying_ms, first_token_ms, total_ms;
    Specd__DrafterKind drafter_kind; /* the kind that drafted it at the end (choice or pin); UNSPECIFIED: none */
    uint32_t drafter_switches;       /* times the coordinator moved it to a drafter of another kind */
} sd_client_request_stats;

/* The final record of a request. */
typedef struct sd_client_result {
    uint64_t request_id;
    sd_status status; /* SD_OK: finished (see stop_reason); otherwise failed */
    Specd__Code code; /* CODE_OK, or the coordinator's error code (CODE_UNSPECIFIED: local failure) */
    char error[512];  /* readable reason when status != SD_OK */
    Specd__StopReason stop_reason;
    uint32_t prompt_tokens; /* from Accepted */
    int32_t *ids;           /* generated token ids (owned; sd_client_result_clear) */
    size_t n_ids;
    char *text; /* generated text, NUL-terminated (owned) */
    size_t text_len;
    sd_client_request_stats stats;
} sd_client_result;

/* Frees ids and text; NULL-safe. */
void sd_client_result_clear(sd_client_result *r);

/* One token with its log-probability and bytes (a token may hold part of a
 * UTF-8 character). */
typedef struct sd_client_token_lp {
    int32_t id;
    float logprob;
    const char *bytes;
    size_t n_bytes;
} sd_client_token_lp;

/* A generated token's logprob and the most likely tokens at its position. */
typedef struct sd_client_logprob {
    sd_client_token_lp token;
    size_t n_top;
    sd_client_token_lp top[SD_MAX_TOP_LOGPROBS]; /* descending */
} sd_client_logprob;

/* What a callback sees: new tokens and their text, and on the last call of a
 * request the final record. All pointers are borrowed for the call only. */
typedef struct sd_client_chunk {
    uint64_t request_id;
    const int32_t *ids;
    size_t n_ids;
    const char *text; /* complete UTF-8 characters (on the final call: the decoder's tail) */
    size_t text_len;
    const sd_client_result *final;     /* non-NULL exactly once, on the last call */
    const sd_client_logprob *logprobs; /* [n_ids] when the request asked for logprobs, else NULL */
    /* With prompt_logprobs: prompt tokens [prompt_from, prompt_from +
     * n_prompt_logprobs), each with its id, bytes and the target's logprob
     * given the prompt before it; position 0 has none (logprob NaN, no
     * alternatives). Chunks carrying them have no ids and no text. */
    const sd_client_logprob *prompt_logprobs;
    size_t n_prompt_logprobs;
    size_t prompt_from;
    /* With echo: the prompt's text (its tokens' bytes as they are, which
     * need not be whole UTF-8 characters), in one chunk before any token. */
    const char *prompt_text;
    size_t prompt_text_len;
} sd_client_chunk;

/* Called on the I/O thread (see the top of this file). */
typedef void (*sd_client_token_cb)(const sd_client_chunk *chunk, void *user);

/* Creates the client and its I/O thread and connects (asynchronously: a
 * coordinator that is not up yet is not an error here). Caller frees with
 * sd_client_close. */
sd_status sd_client_connect(const sd_client_params *p, sd_client **out);

/* Submits req and waits until the coordinator accepted it (*request_id set)
 * or refused it. cb (may be NULL) then receives the tokens as they commit
 * and the final record; a refused or failed submit also gets the final call
 * (with code and message) and returns non-OK: SD_ERR_INVALID_ARG (bad or too
 * large request), SD_ERR_OUT_OF_BLOCKS (overloaded), SD_ERR_NET (coordinator
 * unreachable or dead). The request is first validated locally with the
 * coordinator's rules (sd_net_decode_client without a vocabulary); a bad one
 * fails at once, its final callback then running on the calling thread.
 * The record of an accepted request stays until sd_client_wait collects it.
 * Thread-safe. */
sd_status sd_client_submit(sd_client *c, const sd_client_request *req, sd_client_token_cb cb, void *user,
                           uint64_t *request_id);

/* Asks the coordinator to stop request_id (it ends with STOP_REASON_CANCELLED
 * or CODE_CANCELLED). SD_ERR_NOT_FOUND when the id is not in flight.
 * Thread-safe; may be called from a callback. */
sd_status sd_client_cancel(sd_client *c, uint64_t request_id);

/* Waits up to timeout_ms (< 0: forever) for request_id to end, then moves its
 * final record into *result (caller clears it) and forgets the request.
 * SD_OK when the record was delivered (check result->status);
 * SD_ERR_NOT_FOUND for an unknown or already collected id; SD_ERR_NET with
 * errno ETIMEDOUT on timeout (the request stays). Thread-safe. */
sd_status sd_client_wait(sd_client *c, uint64_t request_id, int timeout_ms, sd_client_result *result);

/* One worker as the coordinator sees it. */
typedef struct sd_client_worker_info {
    Specd__Role role;
    uint32_t rank;
    char name[128];
    Specd__DrafterKind drafter_kind;
    bool alive;
    uint32_t kv_blocks_total, kv_blocks_free, n_sequences;
    uint64_t steps;
    /* prefix cache (verifiers): prompt tokens looked up and found, since the
     * worker started; blocks cached now; cached blocks evicted */
    uint64_t prefix_query_tokens, prefix_hit_tokens, prefix_blocks_evicted;
    uint32_t prefix_blocks_cached;
    uint32_t group_id, group_size; /* verifier leaders: the group and its TP size */
    uint32_t active_requests;      /* placed on it now */
    uint64_t served_requests;      /* placed on it since it registered */
    uint64_t drafted, accepted;    /* draft tokens verified, and accepted */
    uint64_t committed;            /* verifier groups: tokens committed */
    double step_us;                /* groups: modelled 64-token verify step; drafters: draft round trip */
    uint64_t worker_id;            /* the coordinator's id of this registration (a restarted worker gets a new one) */
} sd_client_worker_info;

typedef struct sd_client_service_stats {
    uint32_t active_requests, queued_requests;
    uint64_t finished_requests, committed_tokens;
    /* verify reply (or the draft reply the step waited for) -> next verify request */
    double step_overhead_p50_us, step_overhead_p99_us;
    double draft_wait_mean_us, draft_wait_p99_us; /* per verify step: verifier held for drafts (0 = not held) */
    double draft_wait_share;                      /* share of verify steps held, 0..1 */
    /* the coordinator's cost model (adaptive K): a verify step of n tokens
     * costs verify_fixed_us + verify_token_us * n; a draft token draft_token_us */
    double verify_fixed_us, verify_token_us, draft_token_us;
    double draft_step_us;  /* draft round trip per draft step */
    double catchup_row_us; /* a skipped position's catch-up (an EAGLE head at K = 0): what shadowing it costs */
    /* speculative decoding since the coordinator started, per sequence
     * verify step (one sequence's part in a verify step after prefill) */
    uint64_t seq_verify_steps; /* each commits 1 + accepted tokens (fewer at the request's end) */
    uint64_t drafts;           /* of those, with at least one draft */
    uint64_t draft_tokens, accepted_tokens;
    size_t n_positions;                         /* draft positions counted below (the coordinator's max K) */
    uint64_t draft_tokens_per_pos[SD_MAX_K];    /* [i]: drafts verified at draft position i */
    uint64_t accepted_tokens_per_pos[SD_MAX_K]; /* [i]: of those, accepted (non-increasing in i) */
    uint64_t verify_batches;                    /* verify steps sent (prefill-only ones left out) */
    size_t n_workers;                           /* at most SD_CLIENT_MAX_WORKERS */
    sd_client_worker_info workers[SD_CLIENT_MAX_WORKERS];
} sd_client_service_stats;

/* Queries ServiceStats (with per-worker resource use) and waits up to
 * timeout_ms for the answer. SD_ERR_NET (errno ETIMEDOUT) when none came.
 * Thread-safe. */
sd_status sd_client_stats(sd_client *c, int timeout_ms, sd_client_service_stats *out);

/* Stops the I/O thread (pending requests are abandoned, the coordinator
 * notices by liveness), closes the socket, frees everything, *c = NULL.
 * NULL-safe. Not to be called while other threads use the client. */
void sd_client_close(sd_client **c);

/* The address this user's local service (specd-launch without keys or
 * addresses) recorded under runtime_base ($XDG_RUNTIME_DIR, NULL: /tmp):
 * true and *out filled when runtime_base/specd-UID is this user's with mode
 * 0700 and its "current" file names an ipc:// or tcp:// address. Callers use
 * it when no address is given (specd-client, specd-gateway). */
bool sd_client_discover(const char *runtime_base, char *out, size_t out_len);

/* "EOS", "LENGTH", ... for a stop reason. */
const char *sd_client_stop_reason_name(Specd__StopReason r);

#ifdef __cplusplus
}
#endif
#endif
