/* coord.h — internal interfaces of specd-coordinator.
 *
 * The coordinator is one struct (sd_coord) and four modules operating on it:
 *   session.c    one request: committed tokens, stream decoding, stop strings
 *                with text hold-back, stats, adaptive K
 *   sched_*.c    the scheduler: continuous batching, draft/verify requests
 *                and the keep_len / cached_len beliefs (sched_dispatch.c),
 *                applying results (sched_results.c), streaming to clients
 *                (sched_stream.c), ending requests and worker-death recovery
 *                (sched_end.c)
 *   placement.c  which verifier group and which drafter serve a request
 *                (measured load; cached prefixes, prefix_route.c; affinity;
 *                failover)
 *   workers.c    Hello/Welcome/refusal, heartbeats, liveness
 *   clients.c    Submit validation and tokenization, Cancel, Stats
 *   head_relay.c the EAGLE head of a verifier group as a drafter of its own
 * and server.c (sockets and the zmq_poll loop) on top. Everything below the
 * loop sends through the sd_coord_io callbacks and takes the time as an
 * argument, so the logic runs in unit tests without sockets or clocks.
 * Single-threaded: nothing here is thread-safe. */
#ifndef SPECD_COORD_H
#define SPECD_COORD_H

#include <stdatomic.h>

#include "specd/common.h"
#include "specd/net.h"
#include "specd/spec_adapt.h"
#include "specd/chat.h"
#include "specd/tokenizer.h"

#define SD_COORD_MAX_WORKERS         32
#define SD_COORD_MAX_CLIENTS         1024
/* Replies waiting for a client whose queue is full (outbox.c): at most this
 * many bytes per client and over all clients, and not stalled (none taken)
 * for longer than SD_COORD_BACKLOG_STALL_US; a client past a bound does not
 * read its replies and is dropped (its requests cancelled). */
#define SD_COORD_BACKLOG_BYTES       (8 << 20)
#define SD_COORD_BACKLOG_TOTAL_BYTES (256 << 20)
#define SD_COORD_BACKLOG_STALL_US    30000000u
#define SD_COORD_OVERHEAD_WINDOW     1024
#define SD_DRAFTER_KINDS             5 /* Specd__DrafterKind values, UNSPECIFIED included */

/* prefix_route.c: the coordinator's record of the token prefixes each
 * verifier group (worker slot g, registration worker_id) holds cached. */
typedef struct sd_route sd_route;
/* Caller frees with sd_route_free (NULL on out of memory). */
sd_route *sd_route_create(void);
void sd_route_free(sd_route **r);
/* Group g holds the full blocks of tokens[0 .. n). */
void sd_route_record(sd_route *r, int32_t g, uint64_t worker_id, const int32_t *tokens, int32_t n);
/* Tokens of tokens[0 .. n) group g likely holds: the longest recorded
 * prefix of whole blocks, short of the last token (always computed). */
int32_t sd_route_cached(sd_route *r, int32_t g, uint64_t worker_id, const int32_t *tokens, int32_t n);

/* What a send to a client did: a full queue (the peer reads slower than we
 * send) is not a loss: outbox.c keeps the reply and sends it later. */
typedef enum sd_coord_sent { SD_COORD_SENT = 0, SD_COORD_FULL, SD_COORD_GONE } sd_coord_sent;

/* Where the logic sends messages. The envelope (the packed body) is valid
 * only during the call. */
typedef struct sd_coord_io {
    void *user;
    /* false when the peer cannot be reached (gone: ROUTER_MANDATORY) */
    bool (*to_worker)(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToWorker *env);
    /* one packed CoordinatorToClient, without blocking */
    sd_coord_sent (*to_client)(void *user, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len);
} sd_coord_io;

typedef struct sd_coord_params {
    const char *model_path;        /* target GGUF (metadata only) */
    const char *client_addr;       /* default tcp://127.0.0.1:7700 */
    const char *worker_addr;       /* default tcp://127.0.0.1:7701 */
    const char *curve_secret_file; /* the coordinator's secret key file (curve.h), or NULL: plaintext */
    const char *client_keys_file;  /* allow-list of client public keys (required with a secret) */
    const char *worker_keys_file;  /* allow-list of worker public keys (required with a secret) */
    bool insecure;                 /* allow a non-loopback bind without keys */
    const char *chat_template;     /* chat format by name (--chat-template), NULL = the model's */
    int32_t max_queue;             /* waiting requests (256) */
    int32_t max_active;            /* sequences admitted to the verifier at once (64) */
    int32_t max_tokens_default;    /* 256 */
    int32_t default_k;             /* 4: K with adaptive off, and the starting K */
    int32_t max_k;                 /* 8 */
    bool adaptive_k;               /* on */
    int32_t prefill_chunk;         /* prompt tokens per verify step, all sequences together (512) */
    int32_t draft_timeout_ms;      /* 2000 */
    int32_t verify_timeout_ms;     /* 30000 */
    int32_t drain_timeout_ms;      /* after SIGTERM: in-flight requests get this long to finish (20000) */
    int32_t heartbeat_interval_ms; /* SD_HEARTBEAT_INTERVAL_MS (tests shorten it) */
    int32_t heartbeat_liveness;    /* SD_HEARTBEAT_LIVENESS */
    bool stats_names;              /* workers' names (host:pid) in stats replies: off */
    bool local_ngram;              /* an n-gram drafter inside the coordinator (local_draft.c): off */
    int32_t local_ngram_cache;     /* its cache shared across requests, entries (65536; 0 = none) */
    int32_t verify_rule;           /* sd_verify_rule of requests that name none (--verify-rule; coupled) */
} sd_coord_params;

sd_coord_params sd_coord_default_params(void);

/* ---------------------------------------------------------------- sessions */

typedef enum sd_session_state {
    SD_SESSION_QUEUED = 0, /* waiting for capacity (max_active) */
    SD_SESSION_ACTIVE,     /* admitted: scheduled on the workers */
    SD_SESSION_FINISHED,   /* Finished sent; kept only until in-flight steps drain */
} sd_session_state;

/* A token chunk waiting to be streamed (see sd_coord.chunks). */
typedef struct sd_pending_chunk {
    uint64_t request_id;
    int32_t from, n; /* committed tokens [from, from + n) */
    int32_t n_generated;
    char *text; /* owned */
    size_t text_len;
    sd_token_logprob *logprobs; /* owned, [n] when the request wants logprobs, else NULL */
} sd_pending_chunk;

typedef struct sd_session {
    uint64_t id;
    uint64_t client_tag;
    uint8_t client_ident[SD_MAX_IDENTITY_BYTES];
    size_t client_ident_len;
    sd_session_state state;

    /* committed tokens: prompt then generated; the single source of truth */
    int32_t *tokens;
    int32_t n_tokens, cap_tokens, n_prompt;
    int32_t max_tokens;  /* new tokens at most */
    int32_t max_context; /* tokens in the sequence at most */
    int32_t max_k;       /* request's cap: 0 default, -1 none */
    bool ignore_eos;
    sd_sampling sampling;
    bool logprobs;        /* stream each token's target logprob (TokenChunk.logprobs) */
    int32_t top_logprobs; /* ... with this many alternatives */
    /* echo with logprobs: the target's logprob of each prompt token, from
     * prefill chunks (sched_dispatch.c); prompt_lp_next is the next prompt
     * position owed to the client (n_prompt: all sent) */
    bool prompt_logprobs;
    int32_t prompt_lp_next;
    bool prompt_only; /* generate nothing: finish once the prompt is scored */
    /* structured output: the constraint every verify step carries (kind
     * NONE: none; con_text owned, compiled once at submit) */
    Specd__ConstraintKind con_kind;
    char *con_text;

    /* output text */
    sd_tok_stream *stream;
    char **stop; /* n_stop stop strings (owned) */
    size_t *stop_len;
    int32_t n_stop;
    char *held; /* decoded text held back: a prefix of some stop string */
    size_t held_len, held_cap;

    /* placement (placement.c): worker slots of the verifier group leader
     * and the drafter serving this request, -1 none yet. A request stays
     * on its group while that group lives (its KV cache is warm there). */
    int32_t group;
    int32_t drafter;
    Specd__DrafterKind pin_kind; /* only drafters of this kind (UNSPECIFIED: any) */
    /* drafter kind choice (choice.c): the kind it should be drafted by now
     * (UNSPECIFIED: any), and each kind's record on this request */
    Specd__DrafterKind want_kind;
    bool kind_chosen;       /* false while kinds are being tried */
    uint32_t kind_switches; /* moves to a drafter of another kind */
    int32_t steps_since_choice;
    int32_t recheck_steps;          /* steps on the chosen kind before the next routine re-trial (doubles) */
    Specd__DrafterKind last_choice; /* the kind chosen last time (0: none yet) */
    double chosen_tokens;           /* the chosen kind's tokens per step when chosen */
    int32_t shadow_slot;            /* its slot in the shadow n-gram drafter (choice.c), -1 none */
    uint8_t shadow_ring[8];         /* the shadow's tokens a step over its last 8 steps (ring) */
    int32_t shadow_steps;           /* steps the shadow has priced (ring index: mod 8) */
    /* whether it tries kinds that look unpromising (choice.c): 0 not yet
     * asked, 1 yes (one such request in SD_CHOICE_SAMPLE), -1 no */
    int8_t explore;
    unsigned sampled_kinds; /* kinds it tried as such a sample (bits by Specd__DrafterKind) */
    /* the wall time of its steps (choice.c): when its last step committed
     * (0: none yet) and the drafter it had then; draft_refill: the drafts
     * of its step in flight came from a step that took in a prefix (a
     * prompt, a move), so that step's time is not a drafting kind's */
    uint64_t wall_from_us;
    int32_t wall_drafter;
    bool draft_refill;
    struct sd_kind_record {
        double tokens; /* EMA of tokens committed per verify step while drafted by this kind */
        double k;      /* EMA of drafts per verify step */
        int32_t steps; /* verify steps observed since the kind was last (re)tried */
    } kinds[SD_DRAFTER_KINDS];
    /* scheduling: beliefs about the workers' caches */
    int32_t v_cached;      /* tokens its verifier group holds */
    int32_t route_hint;    /* tokens of it its group's prefix cache likely holds, taken when it was placed
                            * (prefix_route.c): the verifier adopts them, so they split no step (sched_dispatch.c) */
    int32_t d_cached;      /* tokens its drafter holds */
    bool v_holds, d_holds; /* the worker has an entry (needs a Release) */
    bool in_verify, in_draft;
    /* drafts ready for verification (valid while n_tokens == draft_base) */
    int32_t draft_base;
    int32_t k;
    int32_t draft[SD_MAX_K];
    uint32_t *q_off; /* k + 1 offsets into q_ids/q_probs */
    int32_t *q_ids;
    float *q_probs;
    size_t q_cap;
    sd_adapt adapt;
    /* shadow draft: a one-token draft for position shadow_base, made while
     * that position was verified with K = 0; the committed token says
     * whether it would have been accepted (-1: none; token -1: not back yet) */
    int32_t shadow_base, shadow_token;
    /* the drafts its verifier group's EAGLE head made after the last verify
     * step (VerifyResult.next_draft), for the context of head_base tokens
     * ending in head_last; head_relay.c hands them out as a drafter's
     * (head_base -1: none). head_us: the head's time for them (0 once told) */
    int32_t head_base, head_last, head_k;
    int32_t head_draft[SD_MAX_K];
    uint32_t head_q_off[SD_MAX_K + 1];
    int32_t *head_q_ids;
    float *head_q_probs;
    size_t head_q_cap;
    uint32_t head_us;
    /* features for a head drafter in its own process not yet sent to it
     * (feat_relay.c): positions feat_pos0 .. + feat_rows - 1, feat_width
     * floats each; feat_sent: how many of them (a leading part, when a
     * step's float budget could not carry all) a draft step carried since
     * the last verify result (dropped at the next one) */
    float *feat;
    size_t feat_cap;
    int32_t feat_pos0, feat_rows, feat_width;
    int32_t feat_sent;
    int32_t verify_k;        /* drafts in the verify step in flight */
    int32_t verify_failures; /* consecutive failed verify steps (bounded retries) */

    /* stats */
    uint32_t drafted, accepted, target_steps;
    uint64_t t_submit_us, t_sched_us, t_first_token_us;
    uint64_t drafting_us, verifying_us;
} sd_session;

/* A session from a validated submit (tokens copied, stops copied); NULL on
 * allocation failure. Caller frees with sd_session_free. */
sd_session *sd_session_new(const sd_tok *tok, uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                           int32_t max_context, const char *const *stop, int32_t n_stop);
void sd_session_free(sd_session **s);

/* What committing a step's tokens produced. */
typedef struct sd_commit_out {
    int32_t n_taken; /* tokens of the step kept (the rest was after a stop) */
    char *text;      /* malloc'd text to stream now (complete UTF-8, no stop string) */
    size_t text_len;
    bool finished;
    Specd__StopReason reason;
    char *tail; /* malloc'd Finished.text_tail when finished (may be empty) */
    size_t tail_len;
} sd_commit_out;

/* Appends tokens[0..n) to the committed tokens one at a time, checking the
 * stop conditions after each (EOS unless ignore_eos, max_tokens, stop
 * strings on the decoded text across token boundaries, the context); tokens
 * after a stop are discarded. Text that could be the start of a stop string
 * is held back. Caller frees out->text and out->tail. */
sd_status sd_session_commit(sd_session *s, const sd_tok *tok, const int32_t *tokens, int32_t n, sd_commit_out *out);
/* Ends the output: flushes the decoder and the held-back text into a
 * malloc'd tail (cancel, or a finish decided outside commit). */
sd_status sd_session_flush(sd_session *s, char **tail, size_t *tail_len);
int32_t sd_session_generated(const sd_session *s);
/* Replays a continuation (SubmitRequest.continuation: tokens the request
 * generated before a coordinator restart) through commit without streaming
 * it, so max_tokens, the decoder and the held-back stop-string text stand
 * where they stood. False, with msg set, when the replay already ends the
 * request (then it must not be served again). */
bool sd_session_resume(sd_session *s, const sd_tok *tok, const int32_t *tokens, int32_t n, char *msg, size_t msg_len);

/* The cost model and the K policy (sd_cost_*, sd_adapt_*) are the
 * engine's (specd/spec_adapt.h), shared with single-process decoding. */
/* Step times a verifier measured before it registered (Hello.step_costs,
 * one per size): each size up to SD_COST_SIZES is trusted at its measured
 * time at once, and those sizes are fed to the line's fit and to the step
 * timeout as if observed. Later observations take over as usual. */
void sd_cost_seed(sd_cost_model *c, const sd_step_cost *costs, size_t n);

/* ---------------------------------------------------------------- workers */

/* A worker's measured step times and misses (liveness.c says why). */
#define SD_STEP_TIMES_N         64
#define SD_STEP_TIMEOUT_MULT    4 /* timeout = this x p99, at least the floor */
#define SD_STEP_TIMEOUT_MAX_US  (120ull * 1000000u)
#define SD_STEP_BACKOFF_BASE_US (1000000ull) /* no drafts this long after a first miss, doubled per miss */
#define SD_STEP_BACKOFF_MAX_US  (30ull * 1000000u)

typedef struct sd_step_times {
    uint32_t unit_us[SD_STEP_TIMES_N]; /* step time / (depth + 1), the last SD_STEP_TIMES_N steps */
    int32_t n, next;
    uint32_t p99_unit_us;
    int32_t misses;            /* steps that overran their timeout since the last one in time */
    uint64_t backoff_until_us; /* no steps before this */
    uint64_t late_step_id;     /* the overrun step, still measured when its reply comes (0 = none) */
    uint64_t late_sent_us;
    int32_t late_depth;
} sd_step_times;

/* Records one step of depth (the deepest k asked; 0 for a step with none)
 * that took step_us. */
void sd_step_times_add(sd_step_times *t, uint64_t step_us, int32_t depth);
/* The timeout of a step of depth: max(floor_us, MULT x p99 x (depth + 1)),
 * doubled per miss, at most SD_STEP_TIMEOUT_MAX_US. */
uint64_t sd_step_times_timeout_us(const sd_step_times *t, uint64_t floor_us, int32_t depth);
/* A step overran its timeout: one more miss, back-off from now_us, and the
 * step remembered so its late reply is still measured. */
void sd_step_times_missed(sd_step_times *t, uint64_t now_us, uint64_t step_id, uint64_t sent_us, int32_t depth);
/* True (and the reply measured) when step_id is the overrun step. */
bool sd_step_times_late_reply(sd_step_times *t, uint64_t step_id, uint64_t now_us);
bool sd_step_times_backed_off(const sd_step_times *t, uint64_t now_us);

typedef struct sd_coord_worker {
    bool used; /* slot in use (alive or kept for stats) */
    bool alive;
    bool unreachable; /* a send failed: the peer disconnected (dead at the next tick) */
    uint64_t worker_id;
    uint8_t ident[SD_MAX_IDENTITY_BYTES];
    size_t ident_len;
    Specd__Role role;
    uint32_t rank;
    char name[64];
    Specd__DrafterKind drafter_kind; /* verifier leaders: EAGLE when their head drafts (VerifySeq.next_k) */
    /* drafters: a head relay (head_relay.c), which drafts only for the
     * requests on verifier group slot head_group */
    bool head_relay;
    int32_t head_group;
    /* drafters: a head in its own process reads these target layers,
     * feat_width floats a position (Hello.feature_layers; 0: none) */
    int32_t feat_layers[SD_MAX_FEATURE_LAYERS];
    int32_t n_feat_layers, feat_width;
    uint32_t group_id; /* verifier leaders: the group's id (unique among the live ones) */
    uint32_t group_size;
    int32_t max_batch, max_k;
    int32_t n_ctx; /* model context from Hello (0 = not given) */
    uint32_t kv_blocks_total, kv_blocks_free, n_sequences;
    uint32_t prefix_blocks_cached;                                          /* prefix cache (WorkerStats) */
    uint64_t prefix_query_tokens, prefix_hit_tokens, prefix_blocks_evicted; /* since the worker started */
    uint64_t steps;
    uint64_t last_recv_us, last_send_us;
    /* the step in flight (one at a time per worker) */
    bool busy;
    bool prefill_only;
    uint64_t step_id;
    uint64_t step_sent_us;
    uint64_t *step_rids; /* request ids of the step's sequences, in order */
    int32_t *step_k;     /* drafts sent per sequence (verify) or k asked (draft) */
    int32_t *step_end;   /* keep_len + len(append) per sequence (what it holds before drafting/sampling) */
    bool *step_lp;       /* per sequence: its prefill chunk asked for prompt logprobs */
    int32_t n_step, cap_step;
    int32_t step_tokens;   /* tokens the step's forward computes (appended + drafts) */
    int32_t step_appended; /* drafters: prefix tokens the step's sequences appended */
    /* verify: some sequence appended more than its last committed token;
     * draft: some sequence appended more than a step commits (a prompt, a
     * moved request's prefix), so the step's time is not a draft's cost */
    bool step_refill;
    sd_step_times times; /* drafters: measured draft steps, misses, back-off (liveness.c) */
    bool backed_off;     /* sd_step_times_backed_off at the last tick: no drafts, K = 0 */
    /* this worker's own measured costs (placement compares workers by them;
     * the K policy uses the service-wide sd_coord.cost) */
    sd_cost_model cost;
    /* drafters: EMA of the time a prefix token costs it to take in (a
     * refill step's time less its drafts, per appended token; what moving
     * a request to it costs, choice.c), 0 until measured */
    double refill_token_us;
    /* verifier leaders: holding the group for drafts (sched_dispatch.c) */
    uint64_t hold_since_us;   /* clock when its idle step was first held; 0 = not held */
    uint64_t verify_reply_us; /* when its last verify reply was handled; 0 = none pending */
    /* stats: what it served */
    uint64_t served_requests; /* requests placed on it */
    uint64_t drafted, accepted, committed;
} sd_coord_worker;

/* ---------------------------------------------------------------- clients */

typedef struct sd_coord_reply sd_coord_reply; /* outbox.c */

typedef struct sd_coord_client {
    uint8_t ident[SD_MAX_IDENTITY_BYTES];
    size_t ident_len;
    uint64_t last_recv_us, last_send_us;
    int32_t n_active; /* requests not finished */
    /* Replies its full queue could not take yet, in order (owned; outbox.c).
     * While any wait, its new submits are refused OVERLOADED: the backlog
     * counts against the client that does not read. */
    sd_coord_reply *backlog, *backlog_tail;
    size_t backlog_n, backlog_bytes;
    uint64_t backlog_moved_us; /* the backlog last shrank (or began) */
    bool unreading;            /* over a bound: replies discarded, its requests cancelled at the next tick */
} sd_coord_client;

/* ---------------------------------------------------------------- the whole */

/* Speculative decoding counted over sequence verify steps (one sequence's
 * part in a verify step after its prefill), since the coordinator started;
 * reported in ServiceStats, where Prometheus-style rates are taken. */
typedef struct sd_spec_counts {
    uint64_t seq_steps;                  /* sequence verify steps */
    uint64_t drafts;                     /* of those, with k >= 1 drafts */
    uint64_t draft_tokens, accepted;     /* drafts verified, and accepted */
    uint64_t draft_per_pos[SD_MAX_K];    /* [i]: drafts verified at position i */
    uint64_t accepted_per_pos[SD_MAX_K]; /* [i]: of those, accepted (non-increasing in i) */
    int32_t deepest;                     /* positions with a draft counted: 0..deepest-1 */
} sd_spec_counts;

/* Counts one sequence verify step that verified k drafts and accepted the
 * first n_accepted of them (0 <= n_accepted <= k <= SD_MAX_K, checked by
 * the caller against what was sent). */
void sd_spec_counts_add(sd_spec_counts *t, int32_t k, int32_t n_accepted);
/* Per-position entries to report: max_k, or deeper when a step drafted deeper. */
int32_t sd_spec_counts_positions(const sd_spec_counts *t, int32_t max_k);

typedef struct sd_coord {
    sd_coord_params p;
    sd_coord_io io;
    sd_tok *tok;
    sd_net_limits lim;
    char arch[32];
    uint64_t vocab_hash;
    int32_t n_vocab, n_ctx;
    sd_chat_template *chat; /* the target's chat template (immutable, shared) */

    /* sessions: active ones first-come order; queue FIFO */
    sd_session **sessions; /* every live session (queued, active, finished-draining) */
    int32_t n_sessions, cap_sessions;
    int32_t n_queued, n_active;
    uint64_t next_request_id;

    sd_coord_worker workers[SD_COORD_MAX_WORKERS];
    uint64_t next_worker_id;
    sd_route *route; /* which prefixes each group holds (prefix_route.c); NULL until the first placement */
    uint64_t next_step_id;
    uint64_t verify_steps; /* verify steps sent that were not prefill-only (shadow draft phase) */

    sd_coord_client clients[SD_COORD_MAX_CLIENTS];
    int32_t n_clients;
    size_t backlog_bytes; /* over all clients */
    bool draining;        /* stopping: new submits refused OVERLOADED, the running ones finish (server.c) */
    int32_t n_backlogged; /* clients with a backlog */
    /* token chunks committed by a verify reply, streamed to the clients
     * only once the next verify request is out (sd_sched_pump) */
    struct sd_pending_chunk *chunks;
    int32_t n_chunks, cap_chunks;
    bool defer_chunks;

    sd_cost_model cost;
    /* where a new greedy request's acceptance estimate starts: follows the
     * estimates of the greedy requests served (this drafter, this workload),
     * so short requests do not spend their few steps unlearning a guess */
    double alpha_prior;
    /* per drafter kind, over all requests: EMA of tokens committed per
     * verify step with its drafts, and how many steps fed it (choice.c) */
    double kind_tokens[SD_DRAFTER_KINDS];
    uint32_t kind_steps[SD_DRAFTER_KINDS];
    /* per kind, over the requests that tried it: EMA of its net goodput on
     * them when their choice was made, and how many choices fed it */
    double kind_goodput[SD_DRAFTER_KINDS];
    uint32_t kind_decisions[SD_DRAFTER_KINDS];
    /* per kind: EMA of what a step of a request drafted by it takes on the
     * wall clock beyond its cost models' verify and drafting time (round
     * trips, wake-ups, the drafter's threads against the verifier's), us,
     * measured on steps that verified the request alone; and how many
     * steps fed it (choice.c) */
    double kind_overhead_us[SD_DRAFTER_KINDS];
    uint32_t kind_overhead_steps[SD_DRAFTER_KINDS];
    /* requests asked whether they try a kind that looks unpromising (one
     * in SD_CHOICE_SAMPLE does; counted here, not by request id, so that
     * pinned requests between them do not skew the share) */
    uint32_t explore_asked;
    /* a sample that fell due (every SD_CHOICE_SAMPLE-th request asked) and
     * waits for a request whose move is cheap: 0 none, else 1 + the
     * requests asked since that passed it over (choice.c) */
    uint32_t sample_due;
    /* the shadow n-gram lookup that prices n-gram drafts for requests
     * another kind drafts (choice.c): created on first use, one slot per
     * active request (shadow_used[slot]), NULL when never needed */
    struct sd_drafter *shadow;
    uint8_t *shadow_used;
    int32_t n_shadow_slots;
    /* sd_adapt_drafting_pays for the current batch: greedy requests draft
     * only while it holds (recomputed after each verify step) */
    bool drafting_pays, drafting_dirty;
    uint64_t (*clock_us)(void); /* real clock for the overhead metric (tests replace it) */
    uint64_t hold_event_us;     /* clock when the event being handled began (a draft reply, a tick) */
    /* service stats */
    uint64_t finished_requests, committed_tokens;
    sd_spec_counts spec; /* speculative decoding, per sequence verify step (sched_results.c) */
    /* per verify step, over the last SD_COORD_OVERHEAD_WINDOW steps: the
     * coordinator's own time (the event that let the step go -> sent) and
     * the time the verifier was held waiting for drafts (0 when not held) */
    double overhead_us[SD_COORD_OVERHEAD_WINDOW];
    double draft_wait_us[SD_COORD_OVERHEAD_WINDOW];
    int32_t n_overhead, overhead_pos;
    /* head drafters' features relayed (feat_relay.c): from verifiers, to drafters */
    uint64_t feat_rows_in, feat_bytes_in, feat_rows_out, feat_bytes_out;
    /* prompts being tokenized off the loop (tokq.h; owned by server.c);
     * NULL: tokenized inline, as the unit tests drive the logic */
    struct sd_tokq *tokq;
} sd_coord;

/* Reads the target's metadata (tokenizer, config: no weights) and sets up
 * an empty coordinator; io may be changed afterwards. Caller frees with
 * sd_coord_state_free. */
sd_status sd_coord_state_init(sd_coord *c, const sd_coord_params *p, const sd_coord_io *io);
void sd_coord_state_free(sd_coord *c);

static inline int32_t sd_imin(int32_t a, int32_t b) { return a < b ? a : b; }
static inline bool sd_coord_is_group(const sd_coord_worker *w) {
    return w->used && w->alive && w->role == SPECD__ROLE__ROLE_VERIFIER;
}
static inline bool sd_coord_is_drafter(const sd_coord_worker *w) {
    return w->used && w->alive && w->role == SPECD__ROLE__ROLE_DRAFTER;
}
/* The session's drafter / verifier group, when it has a live one. */
static inline bool sd_coord_drafter_ok(const sd_coord *c, const sd_session *s) {
    return s->drafter >= 0 && sd_coord_is_drafter(&c->workers[s->drafter]);
}
static inline bool sd_coord_group_ok(const sd_coord *c, const sd_session *s) {
    return s->group >= 0 && sd_coord_is_group(&c->workers[s->group]);
}
/* The session's drafter may be given work: alive and not backed off after a
 * late step (liveness.c). */
static inline bool sd_coord_drafter_usable(const sd_coord *c, const sd_session *s) {
    return sd_coord_drafter_ok(c, s) && !c->workers[s->drafter].backed_off;
}

/* sd_session.shadow_token before it is a token */
#define SD_SHADOW_PENDING (-1) /* the shadow draft is in flight */
#define SD_SHADOW_NONE    (-2) /* no proposal (the drafter had none, or failed): nothing to learn */

/* kpolicy.c: the draft length (K) per sequence, from the engine's policy */
/* Largest K the sequence may use now (0: no speculation possible). */
int32_t sd_max_k(const sd_coord *c, const sd_session *s);
/* The one draft-length cap every K obeys, for the K policy (sd_max_k) and
 * the drafts a verify step carries (sched_dispatch.c): what s's request
 * still has room for (the target adds a token after the drafts, within
 * max_tokens and the context) and, for g >= 0, verifier group g's max_k;
 * never below 0. */
int32_t sd_k_cap(const sd_coord *c, const sd_session *s, int32_t g);
/* The K the sequence asks for in its next draft step (0: a plain step). */
int32_t sd_k_want(const sd_coord *c, const sd_session *s);
/* Recomputes c->drafting_pays for the batch (greedy requests draft only while it holds). */
void sd_k_update_gate(sd_coord *c);
/* 1 when the sequence should be shadow-drafted now, else 0. */
int32_t sd_k_shadow(const sd_coord *c, const sd_session *s);
/* What a verifier's head drafts for s's next step (VerifySeq.next_k), in a
 * step carrying k drafts, within room: 0 at K = 0 unless the next step reads it. */
int32_t sd_k_head_next(const sd_coord *c, const sd_session *s, int32_t k, int32_t room);
/* Folds a settled shadow draft into the acceptance estimate (tokens: what is
 * being committed at s->n_tokens onward, n of them). */
void sd_k_shadow_settle(sd_coord *c, sd_session *s, const int32_t *tokens, int32_t n);

/* pack.c: a step's messages, written from the sessions (pointing into them) */
typedef struct sd_verify_pack {
    Specd__VerifySeq *seqs, **pseqs;    /* [n] */
    Specd__Sampling *samp;              /* [n] */
    Specd__SparseDist *dists, **pdists; /* [n][SD_MAX_K] */
    Specd__Constraint *cons;            /* [n]: each sequence's constraint (its text borrowed) */
} sd_verify_pack;
typedef struct sd_draft_pack {
    Specd__DraftSeq *seqs, **pseqs; /* [n] */
    Specd__Sampling *samp;          /* [n] */
    Specd__Constraint *cons;        /* [n] the constrained sequences' (text borrowed from the session) */
} sd_draft_pack;
/* Room for n sequences (SD_ERR_NOMEM); free with sd_pack_*_free. */
sd_status sd_pack_verify_alloc(sd_verify_pack *pk, int32_t n);
void sd_pack_verify_free(sd_verify_pack *pk);
/* Entry m: s's tokens from v_cached (n_append of them) and its first k drafts with their q
 * (borrowed from s, which must not change until the envelope is sent). */
void sd_pack_verify_seq(sd_verify_pack *pk, int32_t m, sd_session *s, int32_t n_append, int32_t k);
sd_status sd_pack_draft_alloc(sd_draft_pack *pk, int32_t n);
void sd_pack_draft_free(sd_draft_pack *pk);
/* Entry m: what the drafter lacks of s, and k drafts wanted. */
void sd_pack_draft_seq(sd_draft_pack *pk, int32_t m, sd_session *s, int32_t k);

/* the scheduler: sched_dispatch.c, sched_results.c, sched_stream.c, sched_end.c */
/* Admits queued requests and sends every draft/verify request that can go
 * now. Call after any event. */
void sd_sched_pump(sd_coord *c, uint64_t now_us);
void sd_sched_on_draft(sd_coord *c, int32_t w, const Specd__DraftResponse *r, uint64_t now_us);
void sd_sched_on_verify(sd_coord *c, int32_t w, const Specd__VerifyResponse *r, uint64_t now_us);
/* A worker died or was replaced: drop its step, reset beliefs. */
void sd_sched_on_worker_lost(sd_coord *c, int32_t w);
/* A worker failed its in-flight step (bad result, timeout): drop the step,
 * reset the beliefs of that step's sequences. */
void sd_sched_fail_step(sd_coord *c, int32_t w, const char *why);
/* Ends session s: Finished (reason, stats, tail) to its client, Release to
 * the workers holding it; s is removed (freed now, or when no step holds it). */
/* Sends s's client PromptLogprobs for prompt tokens [from, from + n) (n <=
 * SD_MAX_PROMPT_LP_ROWS) with lps[n] their logprobs; from 0 (n 1, lps
 * NULL): position 0, which has none. Each token's bytes from the tokenizer. */
void sd_sched_prompt_logprobs(sd_coord *c, const sd_session *s, int32_t from, int32_t n, const sd_token_logprob *lps,
                              uint64_t now_us);
void sd_sched_finish(sd_coord *c, sd_session *s, Specd__StopReason reason, const char *tail, size_t tail_len,
                     uint64_t now_us);
/* Ends session s with an Error to its client (when notify) instead of
 * Finished, releasing it like sd_sched_finish. */
void sd_sched_abort(sd_coord *c, sd_session *s, Specd__Code code, const char *msg, bool notify, uint64_t now_us);
sd_session *sd_sched_find(sd_coord *c, uint64_t request_id);
/* Adds an accepted session (queued). */
sd_status sd_sched_add(sd_coord *c, sd_session *s);
/* Coordinator overhead percentiles over the window (0 when empty). */
void sd_sched_overhead(const sd_coord *c, double *p50, double *p99);
/* Mean and p99 of the time verify steps were held for drafts, and the share
 * of steps held, over the same window (0 when empty). */
void sd_sched_draft_wait(const sd_coord *c, double *mean, double *p99, double *held_share);
/* Between the sched_*.c files. */
/* Frees s if it is finished and no step refers to it any more. */
void sd_sched_reap(sd_coord *c, sd_session *s);
/* Streams the chunks deferred while a verify reply was applied. */
void sd_sched_flush_chunks(sd_coord *c, uint64_t now_us);
/* Commits a verify step's tokens[n] to s and streams (or defers) them;
 * lps[n] their logprobs when the request asked for them, else NULL. */
void sd_sched_commit_step(sd_coord *c, sd_session *s, const int32_t *tokens, int32_t n, const sd_token_logprob *lps,
                          uint64_t now_us);
/* A checked prefill result with prompt logprobs: to the client; a
 * prompt-only request whose prompt is all scored ends. */
void sd_sched_prompt_logprobs_applied(sd_coord *c, sd_session *s, const Specd__VerifyResult *vr, uint64_t now_us);

/* placement.c: which group and which drafter serve each request */
/* Places every active request that has no live group on the group where
 * it waits least, and gives every one without a live drafter the least
 * loaded drafter (of its pinned kind). Call before dispatching. */
void sd_place_pending(sd_coord *c, uint64_t now_us);
/* Drafter d (just registered) takes its share of the running requests:
 * they move to it between draft steps (Release sent to the old drafter). */
void sd_place_share_drafter(sd_coord *c, int32_t d, uint64_t now_us);
/* Live workers of a role (verifier groups or drafters). */
int32_t sd_place_count(const sd_coord *c, Specd__Role role);
/* Active requests placed on worker g (a group or a drafter). */
int32_t sd_place_group_load(const sd_coord *c, int32_t g);

/* choice.c: which drafter kind drafts each request, by measured goodput */
/* After a verify step of s drafted by its current drafter (k drafts, the
 * n_commit tokens commit about to be committed; s->tokens is still the
 * context the step verified; refill: the step sent the verifier more of
 * s's prefix than its last token, e.g. its prompt): updates that kind's
 * record on s (and the n-gram kind's from the shadow lookup) and decides
 * the kind s should use next (s->want_kind; placement moves it). now_us:
 * the clock at the step's reply (the step's wall time prices the kind). */
void sd_choice_observe(sd_coord *c, sd_session *s, int32_t k, bool refill, const int32_t *commit, int32_t n_commit,
                       uint64_t now_us);
/* A session leaves: its shadow slot is freed. */
void sd_choice_forget(sd_coord *c, sd_session *s);
/* The shadow drafter and its slots are freed (coordinator teardown). */
void sd_choice_free(sd_coord *c);
/* The net goodput of kind k on s: tokens per verify step, discounted by the
 * drafting time it adds to the step (0 when never observed). */
double sd_choice_goodput(const sd_coord *c, const sd_session *s, Specd__DrafterKind k);

/* workers.c */
/* As sd_workers_on_message, from a peer whose key is restricted to role
 * peer_role ("verifier", "drafter"; "" or NULL = any): a Hello for another
 * role is refused. */
void sd_workers_on_message_as(sd_coord *c, const uint8_t *ident, size_t ident_len, const char *peer_role,
                              const uint8_t *body, size_t len, uint64_t now_us);
void sd_workers_on_message(sd_coord *c, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len,
                           uint64_t now_us);
/* Heartbeats, liveness and step timeouts. */
void sd_workers_tick(sd_coord *c, uint64_t now_us);

/* clients.c */
void sd_clients_on_message(sd_coord *c, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len,
                           uint64_t now_us);
void sd_clients_tick(sd_coord *c, uint64_t now_us);
/* Admits (or refuses) every submit the tokenizer thread has finished (c->tokq). */
void sd_clients_on_tokenized(sd_coord *c, uint64_t now_us);

/* outbox.c: every send goes through here (to c->io), with the peer
 * bookkeeping sending implies; nothing in it calls up into the modules above */
void sd_outbox_worker(sd_coord *c, int32_t w, const Specd__CoordinatorToWorker *env, uint64_t now_us);
/* Tells worker w to free its cache entry for one request (a Release). */
void sd_outbox_release(sd_coord *c, int32_t w, uint64_t request_id, uint64_t now_us);
void sd_outbox_client(sd_coord *c, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToClient *env,
                      uint64_t now_us);
void sd_outbox_client_error(sd_coord *c, const uint8_t *ident, size_t ident_len, Specd__Code code, uint64_t request_id,
                            uint64_t client_tag, const char *msg, uint64_t now_us);
/* The client record of ident (borrowed from c), created when create is set
 * and the table has room; NULL otherwise. */
sd_coord_client *sd_coord_client_find(sd_coord *c, const uint8_t *ident, size_t ident_len, bool create);
/* A request of the client ended (bookkeeping for liveness). */
void sd_coord_client_request_done(sd_coord *c, const uint8_t *ident, size_t ident_len);
/* Sends what waits in the clients' backlogs, in order, until each queue is
 * full again. The server loop calls it every pass. */
void sd_outbox_flush(sd_coord *c, uint64_t now_us);
/* Frees cl's backlog (the record is about to go). */
void sd_outbox_client_forget(sd_coord *c, sd_coord_client *cl);

/* server.c: sockets and the loop */
typedef struct sd_coord_server sd_coord_server;
/* Opens the sockets and the state. Caller frees with sd_coord_server_free. */
/* ---- local_draft.c: the n-gram drafter inside the coordinator ---- */
typedef struct sd_local_drafter sd_local_drafter;
/* Creates the drafter, wraps c->io so that what is sent to it is answered
 * in-process, and registers it (Hello) as a worker at now_us. */
sd_status sd_local_drafter_new(sd_coord *c, uint64_t now_us, sd_local_drafter **out);
/* Delivers the drafter's queued replies to the coordinator (each may queue
 * the next); call after every handler that may have sent it something. */
void sd_local_drafter_pump(sd_local_drafter *ld, uint64_t now_us);
bool sd_local_drafter_pending(const sd_local_drafter *ld);
/* Its routing id: no ZeroMQ peer can have it (local_draft.c). */
bool sd_local_drafter_is_ident(const uint8_t *ident, size_t ident_len);
/* Restores c->io and frees everything. */
void sd_local_drafter_free(sd_local_drafter **ld);

/* ---- head_relay.c: verifier groups' EAGLE heads as drafters ---- */
typedef struct sd_head_relays sd_head_relays;
/* Wraps c->io (as local_draft.c does) so that what is sent to a relay is
 * answered in-process; relays come and go with the groups that announce a
 * head (sd_head_relays_pump). Caller frees with sd_head_relays_free (before
 * any io wrapper created earlier). */
sd_status sd_head_relays_new(sd_coord *c, sd_head_relays **out);
/* Registers a relay for every live group with a head that has none,
 * retires those whose group is gone, and delivers the relays' queued
 * replies; call after every handler. */
void sd_head_relays_pump(sd_head_relays *r, uint64_t now_us);
bool sd_head_relays_pending(const sd_head_relays *r);
/* A relay's routing id (no ZeroMQ peer can have one); *group: its group slot. */
bool sd_head_relay_is_ident(const uint8_t *ident, size_t ident_len, int32_t *group);
void sd_head_relays_free(sd_head_relays **r);
/* sched_results.c: stores a verify result's head drafts on s (false: out of memory). */
bool sd_head_store(sd_session *s, const Specd__VerifyResult *vr);
/* Whether s's drafter is the head relay of its verifier group. */
static inline bool sd_head_drafts_for(const sd_coord *c, const sd_session *s) {
    return s->drafter >= 0 && s->group >= 0 && c->workers[s->drafter].head_relay &&
           c->workers[s->drafter].head_group == s->group;
}

/* ---- feat_relay.c: features for EAGLE heads in their own drafter process ---- */
static inline bool sd_feat_drafter(const sd_coord_worker *w) { return w->feat_width > 0; }
/* A drafter's Hello naming other layers or width than a live head drafter's: REFUSED (msg said). */
Specd__Code sd_feat_hello_refusal(const sd_coord *c, const Specd__Hello *h, const char *name, char *msg,
                                  size_t msg_len);
void sd_feat_hello_take(sd_coord_worker *w, const Specd__Hello *h);
/* Whether s's drafter is a live head drafter (its verify steps want features). */
bool sd_feat_wanted(const sd_coord *c, const sd_session *s);
/* The committed positions' features one verify step may carry, all its
 * sequences together (SD_MAX_STEP_FEATURES floats over the live head
 * drafters' width); INT32_MAX when no head drafter is live. */
int32_t sd_feat_step_rows(const sd_coord *c);
/* A verify step's feature_layers into layers[SD_MAX_FEATURE_LAYERS] when
 * one of seqs[n] wants features: their count, else 0. */
size_t sd_feat_request_layers(const sd_coord *c, const Specd__VerifySeq *seqs, int32_t n, uint32_t *layers);
/* An OK verify result's features onto s; sent_keep: the keep_len the step sent. */
void sd_feat_store(sd_coord *c, sd_session *s, const Specd__VerifyResult *vr, int32_t sent_keep);
/* s's waiting features into ds, bound for drafter d, when it reads them
 * and *step_floats leaves room (else they wait for the next step). */
void sd_feat_draft_seq(sd_coord *c, int32_t d, sd_session *s, Specd__DraftSeq *ds, size_t *step_floats);

sd_status sd_coord_server_new(const sd_coord_params *p, sd_coord_server **out);
/* Runs the loop until *stop becomes nonzero (checked at least every 50 ms),
 * then drains: new submits are refused OVERLOADED while the requests in
 * flight finish, for up to drain_timeout_ms or until *stop reaches 2. */
sd_status sd_coord_server_run(sd_coord_server *s, atomic_int *stop);
void sd_coord_server_free(sd_coord_server **s);

/* Monotonic microseconds. */
uint64_t sd_coord_now_us(void);

#endif
