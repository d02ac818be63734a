/* draft_serve.h — the drafter's request handling, without sockets: a
 * request_id -> slot map, each slot holding the committed tokens the
 * coordinator sent for that request, and DraftRequest batches answered with
 * an sd_drafter (see draft_serve.c). specd-drafter's main wires these into
 * the worker loop (specd/worker.h); the unit tests call them directly. */
#ifndef SPECD_DRAFT_SERVE_H
#define SPECD_DRAFT_SERVE_H

#include "specd/drafter.h"
#include "specd/net.h"
#include "specd/spec_batch.h"
#include "specd/tokenizer.h"

typedef struct sd_draft_server sd_draft_server;

/* What a head spent on rows past the 1 + k a drafting step takes in (the
 * positions it drafted nothing for: fed and run when it drafts again):
 * DraftResponse.catchup_us / catchup_rows. */
typedef struct sd_head_catchup {
    double s;
    int64_t rows;
} sd_head_catchup;

/* An EAGLE-3 head's path for one admitted sequence (draft_head.c, which
 * links the engine; this library does not): feed sq's features, draft up to
 * k tokens on held[0..len + n_forced) into tokens / q / *n, masked by con
 * (NULL: unconstrained; else at the end of those tokens, held[len..] being
 * the constraint's forced drafts, draft_constrain.h); adds its catch-up to
 * *cu. */
typedef void (*sd_draft_head_fn)(void *head, sd_drafter *d, int32_t slot, const Specd__DraftSeq *sq,
                                 const int32_t *held, int32_t len, int32_t n_forced, int32_t k, const sd_sampling *s,
                                 sd_constraint *con, int32_t *tokens, sd_spec_q *q, int32_t *n, sd_head_catchup *cu);

typedef struct sd_draft_server_params {
    int32_t max_seqs;  /* request slots; must equal the drafter's max_seqs (default 64) */
    int32_t max_ctx;   /* tokens per sequence; <= the drafter's max_ctx (default 4096) */
    int32_t max_batch; /* sequences per DraftRequest (default 64, <= SD_MAX_BATCH) */
    int32_t max_k;     /* tokens proposed per sequence (default 16, <= SD_MAX_K) */
    int32_t n_vocab;   /* token ids must be below this (required) */
    int32_t top_n;     /* entries of each q kept: at least sd_drafter_max_q (create refuses less) */
    /* The target's tokenizer (borrowed; must outlive the server): with it
     * a constrained DraftSeq's drafts follow its constraint
     * (draft_constrain.h); NULL = every draft unconstrained */
    const sd_tok *tok;
    /* An EAGLE-3 head drafter (specd-drafter --eagle): floats per position
     * of DraftSeq.features (its layers x the target's hidden size), and the
     * head's per-sequence path (head_seq(head, ...): features fed, then
     * drafts on the whole context; draft_head.c), which serves every
     * sequence instead of sd_draft_batch; 0 / NULL = any other drafter,
     * which takes no features */
    int32_t feature_width;
    sd_draft_head_fn head_seq;
    void *head;
} sd_draft_server_params;

/* max_seqs 64, max_ctx 4096, max_batch 64, max_k 16, n_vocab 0 (must
 * be set), top_n SD_SPEC_DEFAULT_TOP_N, tok NULL, feature_width 0, no head. */
sd_draft_server_params sd_draft_server_default_params(void);

/* A server over drafter (borrowed; must outlive it). Caller frees with
 * sd_draft_server_free. */
sd_status sd_draft_server_create(sd_drafter *drafter, const sd_draft_server_params *p, sd_draft_server **out);
void sd_draft_server_free(sd_draft_server **s);

/* Limits incoming envelopes are validated against. */
sd_net_limits sd_draft_server_limits(const sd_draft_server *s);

/* The target's rows, from the coordinator's Welcome (sd_worker_welcome_fn):
 * safe from another thread; applied before the next step. */
void sd_draft_server_pair_vocab(sd_draft_server *s, int32_t target_n_vocab);

/* Serves one batch: per sequence truncate to keep_len (CODE_CACHE_MISS when
 * it holds fewer or the id is unknown and keep_len > 0), append, propose up
 * to min(k, max_k) tokens with the q each was drawn from; cached_len =
 * keep_len + |append| (the drafts are not counted as held). No slot or room
 * left: CODE_KV_FULL. Fills *resp (initialized) with memory owned by s,
 * valid until the next call. Errors only for a batch over max_batch or a
 * drafter failure. */
sd_status sd_draft_server_handle(sd_draft_server *s, const sd_net_draft_step *step, Specd__DraftResponse *resp);

/* Runs draft batches of synthetic sequences before serving, for the same
 * reason as the verifier's warm-up (verify_serve.h): a model drafter on a
 * GPU runs a new forward size op by op, records it the second time, and
 * loads each kernel module on first use. For each size T of sd_warmup_run
 * (SD_WARMUP_FULL) up to max_tokens, min(T, max_batch, max_seqs) sequences share T appended
 * tokens (the catch-up forward has T rows) and draft two tokens each (a
 * forward with a row per sequence). Every drafter slot is released
 * afterwards and the step count is unchanged. Stops early where the slots
 * are too short (logged). Refused (SD_ERR_INVALID_ARG) once a slot is in
 * use. rep may be NULL. */
sd_status sd_draft_server_warmup(sd_draft_server *s, int32_t max_tokens, sd_warmup_report *rep);

/* Frees the slots of the given ids; unknown ids are ignored. */
void sd_draft_server_release(sd_draft_server *s, const uint64_t *request_ids, size_t n);
/* Frees every slot. */
void sd_draft_server_reset(sd_draft_server *s);
/* Blocks in 16-token units (what the slots could hold / what they hold not),
 * sequences cached, batches served. */
void sd_draft_server_stats(const sd_draft_server *s, Specd__WorkerStats *stats);

#endif
