/* spec_batch.h — one batched speculative step over many sequences: the
 * verifier leader's core (verify) and the drafter's (draft), shaped like the
 * protocol's VerifyRequest / DraftRequest (docs/DESIGN.md).
 *
 * Every sequence lives in a slot of a KV cache that the caller owns. A
 * request for a sequence says keep_len (the cache is truncated to this many
 * tokens first: the part of the sequence the sender knows the cache holds),
 * append (committed tokens the cache has not seen, at positions keep_len..)
 * and, for verification, the draft y_1..y_K with the sparse q each was drawn
 * from. The sequence's committed length is n_ctx = keep_len + n_append; y_i
 * sits at position n_ctx + i - 1. A cache that holds fewer than keep_len
 * tokens answers CACHE_MISS for that sequence (the sender then resends the
 * whole prefix with keep_len 0), and a malformed sequence answers
 * INVALID: neither fails the batch.
 *
 * Verification runs ONE ragged forward over every sequence's append + draft
 * rows, with logits only for the last append row and each draft row (K + 1
 * rows per sequence). Penalties (over the generated tokens and the drafts
 * before each row) are applied to the logits first, then p is processed
 * with sd_sample_probs and the draft is
 * verified greedily (temperature 0) or by coupled verification keyed by
 * (seed, position) (spec.h); the cache is then truncated to n_ctx + n_accepted. On
 * the CPU backend a sequence's logits do not depend on the rest of the
 * batch, so its tokens are the same alone or batched. A batch in which a
 * sequence has penalties or wants logprobs is verified on the host even on
 * a device backend (the logits are copied out; the device kernels apply
 * neither), and so is one under a constraint (its rows are masked there).
 * Not thread-safe: one
 * call at a time per model / drafter. */
#ifndef SPECD_SPEC_BATCH_H
#define SPECD_SPEC_BATCH_H

#include "specd/common.h"
typedef struct sd_constraint sd_constraint; /* specd/constrain.h (specd_constrain); only its handle here */
#include "specd/drafter.h"
#include "specd/kv.h"
#include "specd/model.h"
#include "specd/sample.h"
#include "specd/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-sequence outcome of a batched call. */
typedef enum sd_seq_outcome {
    SD_SEQ_OK = 0,
    SD_SEQ_CACHE_MISS = 1,    /* the cache holds fewer than keep_len tokens; resend the prefix */
    SD_SEQ_INVALID = 2,       /* malformed request (bad id, length, K, duplicate slot); logged */
    SD_SEQ_OUT_OF_BLOCKS = 3, /* no KV room for this sequence in this step; retry later or with less */
} sd_seq_outcome;

/* "ok", "cache_miss", "invalid", "out_of_blocks" (static string). */
const char *sd_seq_outcome_str(sd_seq_outcome o);

/* One sequence of a verification step. Arrays are borrowed for the call. */
typedef struct sd_verify_seq {
    int32_t slot;          /* KV slot in [0, max_seqs) */
    int32_t keep_len;      /* truncate the cached sequence to this many tokens first */
    int32_t n_append;      /* >= 1: the last committed token is always fed (its row gives p_1) */
    const int32_t *append; /* [n_append] committed tokens at positions keep_len.. */
    int32_t k;             /* draft length, 0..SD_MAX_K (0 = a plain decoding step) */
    const int32_t *draft;  /* [k] y_1..y_k at positions n_ctx.. */
    const sd_spec_q *q;    /* [k] the sparse proposals y_i was drawn from; may be NULL when greedy */
    sd_sampling sampling;  /* the request's sampling (temperature 0 = greedy) incl. seed; taken as
                              given: valid by sd_sampling_check, which the callers ran once (the wire
                              decoder, net/validate.c; sd_spec_decoder's entry points) */
    /* With penalties (sd_sampling_has_penalties): the committed tokens
     * generated so far, i.e. the sequence's tokens from the end of its
     * prompt up to n_ctx; row i is penalized over them and draft[0..i).
     * Borrowed; ignored without penalties. */
    const int32_t *generated;
    int32_t n_generated;
    /* each committed token's logprob and top_logprobs
     * (0..SD_MAX_TOP_LOGPROBS) alternatives in result.logprobs */
    bool logprobs;
    int32_t top_logprobs;
    /* Structured output: the sequence's constraint, advanced over its
     * committed tokens up to n_ctx, or NULL. Row i is masked under the
     * state after draft[0..i) (after the penalties, before sampling), so
     * the committed tokens are those constrained plain decoding draws;
     * the constraint is left as it was given. Verified on the host.
     * Borrowed for the call. */
    sd_constraint *constraint;
} sd_verify_seq;

typedef struct sd_verify_result {
    sd_seq_outcome outcome;
    int32_t n_ctx;      /* keep_len + n_append: position of tokens[0] */
    int32_t n_accepted; /* drafts accepted (0..k) */
    int32_t n_tokens;   /* tokens to commit: n_accepted + 1 (0 unless outcome is OK) */
    int32_t tokens[SD_MAX_K + 1];
    int32_t cache_len; /* tokens the slot holds now: n_ctx + n_accepted (the next keep_len) */
    /* the sequence's first row in the step's forward batch (its n_append
     * rows, then its k drafts: the row order of sd_model_capture_aux), -1
     * when it did not run */
    int32_t batch_row0;
    sd_spec_info info; /* stochastic verification details (zero when greedy) */
    /* [n_tokens] when the sequence asked for logprobs:
     * the target's log-softmax at each committed token's position, after
     * penalties, before temperature and the filters */
    sd_token_logprob logprobs[SD_MAX_K + 1];
} sd_verify_result;

/* Growable buffers of the batched calls (batch rows, logits, p). */
typedef struct sd_spec_scratch sd_spec_scratch;

/* Caller frees with sd_spec_scratch_free. Buffers grow on demand. */
sd_status sd_spec_scratch_create(sd_spec_scratch **out);
void sd_spec_scratch_free(sd_spec_scratch **s);

/* Verifies n_seqs sequences in one target forward (see the file comment).
 * Writes results[n_seqs]. Returns SD_OK when the batch ran (each sequence's
 * own outcome is in its result), or an error for a failure of the whole
 * call (bad arguments, out of memory, a forward that failed for another
 * reason than room; the cache is then left as the truncations made it). */
sd_status sd_spec_verify_batch(sd_model *m, sd_kv *kv, int32_t n_seqs, const sd_verify_seq *seqs,
                               sd_verify_result *results, sd_spec_scratch *scratch);

/* Warm-ups (verifier and drafter processes, before they register): step
 * sizes 1..SD_WARMUP_EXACT_TOKENS one by one, since a GPU backend records
 * each of those sizes as a graph of its own, then a ladder 24, 32, 48, 64,
 * 96, 128, ... (2^k and 3 * 2^(k-1)) for the sizes that run on cuBLAS. The
 * size after n; start from 1. */
#define SD_WARMUP_EXACT_TOKENS 16
#define SD_WARMUP_MAX_SIZES    64
int32_t sd_warmup_next_size(int32_t n);

/* What a warm-up ran and measured. */
typedef struct sd_warmup_report {
    int32_t n_sizes;                      /* distinct step sizes run */
    int32_t n_steps;                      /* steps run */
    int32_t max_tokens;                   /* the largest size run (0: none) */
    double seconds;                       /* the whole warm-up */
    double first_s_max;                   /* the slowest first step of a size up to SD_WARMUP_EXACT_TOKENS */
    int32_t first_max_at;                 /* ... and its size */
    int32_t tokens[SD_WARMUP_MAX_SIZES];  /* each size run, ascending */
    double steady_s[SD_WARMUP_MAX_SIZES]; /* the time of its last step */
} sd_warmup_report;

/* One warm-up step of n_tokens over the synthetic tokens toks[0..n_tokens)
 * with the given sampling; leaves nothing behind; *fits false (and SD_OK)
 * when the process cannot hold a step that large. */
typedef sd_status (*sd_warmup_step_fn)(void *user, int32_t n_tokens, const sd_sampling *sampling, const int32_t *toks,
                                       bool *fits);

typedef enum sd_warmup_mode {
    /* every size of sd_warmup_next_size: three steps for sizes up to
     * SD_WARMUP_EXACT_TOKENS (greedy, the first sighting; sampled with
     * top-k and top-p, the sampling kernels' first use and a GPU backend's
     * recording; greedy again, timed: a replay), two greedy steps above
     * (the second timed). What a GPU needs. */
    SD_WARMUP_FULL = 0,
    /* sizes 1, 2, 4, 8, .., two greedy steps each, the faster kept: only
     * the step times, for the coordinator's cost model (a CPU has nothing
     * to record or load). One step each, the verifier's very first step
     * (1 token) took 9.6 ms against 7.2 warm, and 2 tokens 12.3 against
     * 8.9: the fit priced a verified row at 0.4 of a step where it costs
     * 0.25. */
    SD_WARMUP_TIMES = 1,
} sd_warmup_mode;

/* Runs step for the sizes mode gives, up to max_tokens. Token ids cycle
 * through [0, n_vocab). Stops (SD_OK, logged under who) at the first size
 * that does not fit; an error of step ends it with that error. rep may be
 * NULL. */
sd_status sd_warmup_run(const char *who, sd_warmup_mode mode, int32_t max_tokens, int32_t n_vocab,
                        sd_warmup_step_fn step, void *user, sd_warmup_report *rep);
/* One sequence's outcome in a warm-up step of n_tokens: OUT_OF_BLOCKS
 * clears *fits; anything else but OK is an error (logged under who). */
sd_status sd_warmup_outcome(const char *who, int32_t n_tokens, int32_t seq, sd_seq_outcome o, bool *fits);

/* One sequence of a drafting step. */
typedef struct sd_draft_seq {
    int32_t slot;          /* drafter slot in [0, max_seqs) */
    int32_t keep_len;      /* truncate what the drafter holds for slot to this first */
    int32_t n_append;      /* >= 1 committed tokens the drafter has not seen */
    const int32_t *append; /* [n_append] at positions keep_len.. */
    int32_t k;             /* tokens wanted, 0..SD_MAX_K */
    sd_sampling sampling;  /* the request's sampling incl. seed (coupled draws: spec.h); taken as
                              given, as sd_verify_seq's */
    /* Structured output: NULL, or the sequence's constraint advanced over
     * its context's generated tokens (borrowed). A model drafter masks
     * each draft step's logits with it (q is the masked distribution) and
     * stops where it allows nothing or ends; it is left advanced over the
     * drafts (the caller rolls it back). The n-gram drafter ignores it
     * (its one-hot drafts are cut by the caller). */
    sd_constraint *constraint;
} sd_draft_seq;

typedef struct sd_draft_result {
    sd_seq_outcome outcome;
    int32_t n_drafted; /* 0..k (the n-gram drafter may find nothing) */
    int32_t tokens[SD_MAX_K];
    sd_spec_q q[SD_MAX_K]; /* ids/probs borrowed from the drafter until its next call for slot */
} sd_draft_result;

/* Drafts for n_seqs sequences. A model drafter runs one ragged forward per
 * draft step across all sequences still drafting (its KV cache has one slot
 * per sequence); the n-gram drafter keeps each slot's tokens and looks them
 * up. The tokens and q of a sequence are the same as sd_drafter_propose on
 * its committed context alone. Writes results[n_seqs]; per-sequence
 * outcomes as in sd_spec_verify_batch. */
sd_status sd_draft_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs, sd_draft_result *results);

#ifdef __cplusplus
}
#endif
#endif
