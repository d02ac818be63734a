/* spec_adapt.h — the draft length policy: how many tokens to draft for a
 * sequence's next step (K, 0 = no draft), from its acceptance history and a
 * cost model of drafting and verifying. One implementation for the
 * coordinator's scheduler (per sequence, per batch) and for single-process
 * speculative decoding (sd_spec_decoder_step_adaptive in spec_decode.h).
 * The reasoning, and what was measured, is in spec_adapt.c.
 *
 * The cost model is in microseconds and learns from what the caller
 * measures: verify steps (forward over n tokens), draft tokens, the draft
 * round trip. Nothing here keeps a clock or a global; nothing is
 * thread-safe (one owner per model / history). */
#ifndef SPECD_SPEC_ADAPT_H
#define SPECD_SPEC_ADAPT_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Acceptance history and the K it leads to. */
typedef struct sd_adapt {
    double alpha;          /* EMA of the per-token acceptance rate */
    int32_t steps_at_zero; /* K = 0 steps since the last shadow draft or probe */
    /* What the start value of alpha is worth, in trials: while fewer than
     * that many more trials have been seen, each moves alpha as a running
     * mean would (weight 1 / (start_trials + n_trials + 1)) rather than
     * by the EMA's smaller weight. 0 (the default): the EMA from the first
     * trial. */
    double start_trials;
    uint32_t n_trials; /* trials folded in so far (saturating) */
    /* EMA weight of one trial; 0 (the default): 0.15, ~7 trials of memory */
    double trial_weight;
} sd_adapt;

/* Steps of up to this many tokens also keep their own measured time. */
#define SD_COST_SIZES 128

/* Decaying sums of a weighted least-squares line y = a + b x. */
typedef struct sd_line_sums {
    double w, x, y, xx, xy;
} sd_line_sums;

/* Cost model of one step: verify time = fixed + per_token * tokens; draft
 * time per draft token; the round trip of a whole draft step. Microseconds,
 * estimated from responses. */
typedef struct sd_cost_model {
    double verify_fixed_us, verify_token_us, draft_token_us;
    /* a drafting step's own cost besides its tokens' (0 unless fitted by
     * sd_cost_observe_draft_fit: one process, where a draft model's first
     * forward of a step also takes in the committed tokens) */
    double draft_fixed_us;
    sd_line_sums draft_fit;           /* decaying sums of that fit */
    double draft_step_us;             /* EMA of draft request -> response, 0 until measured */
    uint32_t n_draft_obs;             /* draft-token measurements taken (the first replaces the prior) */
    double row_us_peak;               /* slowest recent verify forward per token, refills included (step timeouts) */
    /* EMA of what a drafter that skipped positions (an EAGLE head at K = 0)
     * spends per skipped position when it drafts again: every shadow makes
     * it take in all of them, so shadowing at any interval costs this per
     * sequence and step (sd_adapt_shadow_interval); 0 until measured */
    double catchup_row_us;
    /* decaying sums for the least-squares fit of verify time vs tokens */
    sd_line_sums verify_fit;
    /* each step size's own time: the verifier's cost is not a line (a GPU
     * kernel's column tile is 8 tokens wide: the 9th token costs a step) */
    double size_us[SD_COST_SIZES + 1];  /* EMA of forward_us of steps of exactly n tokens */
    uint16_t size_n[SD_COST_SIZES + 1]; /* observations of each (saturating) */
} sd_cost_model;

void sd_cost_init(sd_cost_model *c);
/* One verify step's forward over n_tokens tokens (one appended per
 * sequence + drafts; steps that refill a prefix are not observed). */
void sd_cost_observe_verify(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us);
void sd_cost_observe_draft(sd_cost_model *c, int32_t n_draft_tokens, uint32_t draft_us);
/* One drafting step of one sequence in one process (n_draft_tokens, its
 * time): fits draft_fixed_us + draft_token_us * tokens over the recent
 * steps; with too little spread in their sizes, keeps the fixed part and
 * rescales the per-token one. The first one sets the per-token price. */
void sd_cost_observe_draft_fit(sd_cost_model *c, int32_t n_draft_tokens, uint32_t draft_us);
/* A drafter's catch-up: us spent taking in rows positions it had skipped
 * (VerifyResult.next_catchup_us / _rows). Nothing for rows 0. */
void sd_cost_observe_catchup(sd_cost_model *c, int32_t rows, uint32_t us);
/* Any verify step's forward (refills and prefill chunks included), for
 * the step timeout. */
void sd_cost_observe_rows(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us);
/* How long a verify step of n_tokens may take before its verifier is
 * declared hung: the configured floor, or 8x what the slowest recent step
 * took per token. */
uint64_t sd_cost_verify_timeout_us(const sd_cost_model *c, int32_t n_tokens, uint64_t floor_us);
/* A verify step of n_tokens timed out after timeout_us: the next one gets
 * at least twice as long per token. */
void sd_cost_verify_timed_out(sd_cost_model *c, int32_t n_tokens, uint64_t timeout_us);
/* One draft step's round trip (request sent -> response handled). */
void sd_cost_observe_draft_step(sd_cost_model *c, uint64_t round_trip_us);
/* Expected verify forward time for a step of n_tokens tokens (the line). */
double sd_cost_verify_us(const sd_cost_model *c, int32_t n_tokens);
/* A step of n_tokens as measured at that exact size, once seen a few
 * times; -1 otherwise. */
double sd_cost_size_us(const sd_cost_model *c, int32_t n_tokens);

/* K in [0, max_k] maximizing expected committed tokens per unit cost,
 * (1 - a^(K+1)) / (1 - a) / (c_draft*K + T(batch)/batch + T(batch+K) -
 * T(batch)), for acceptance a, batch sequences sharing a step and T(n) the
 * time of a step of n tokens: measured at that size where seen, between
 * the nearest seen sizes, else the line fixed + per_token * n. */
int32_t sd_adapt_choose_k(double alpha, const sd_cost_model *c, int32_t batch, int32_t max_k);
/* Expected committed tokens of a step with k drafts at acceptance alpha. */
double sd_adapt_expected_tokens(double alpha, int32_t k);
/* Whether drafting pays for a batch of `batch` sequences as a whole: with
 * the K each chose, they expect extra_tokens more committed tokens per step
 * for extra_rows more verified rows, and the draft round trip then lies on
 * the critical path of every step (held: the round trip; split into two
 * cohorts: one more fixed cost; the cheaper of the two). */
bool sd_adapt_drafting_pays(const sd_cost_model *c, int32_t batch, double extra_tokens, int32_t extra_rows);
/* Folds one step's outcome (n_accepted of n_drafted) into the EMA. */
void sd_adapt_observe(sd_adapt *a, int32_t n_drafted, int32_t n_accepted);
/* Folds one shadow draft (a single token; match: it equals the committed
 * token) into the EMA. */
void sd_adapt_observe_shadow(sd_adapt *a, bool match);
/* Moves the service-wide starting estimate *prior toward a greedy
 * request's updated estimate. */
void sd_adapt_prior_update(double *prior, const sd_adapt *a);
/* K of a sampled request: from its own acceptance history only (the batch
 * and measured costs would make its seeded output depend on load), against
 * the fixed reference costs of sd_cost_init at batch 1; at K = 0 for 8
 * steps it probes K = 1. */
int32_t sd_adapt_sampled_k(const sd_adapt *a, int32_t max_k);
/* K = 0 steps between shadow drafts of a (greedy) sequence: a shadow draft costs
 * drafting one token (it overlaps verification and adds nothing to it), so
 * it happens as often as keeps that under ~2% of the sequence's share of a
 * verify step: every step for the n-gram drafter, rarer for a model drafter
 * next to a batch-bound verifier (at most every 256 steps). */
int32_t sd_adapt_shadow_interval(const sd_cost_model *c, int32_t batch);

/* One verify step of n_tokens seen at exactly forward_us before any was
 * observed (a verifier's own measurement): its size is trusted at once and
 * it is fed to the line's fit and the step timeout as if observed. */
void sd_cost_seed_size(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us);

/* Exploration in one process, where a drafter runs on the critical path
 * (sd_spec_decoder_step_adaptive), for a greedy sequence at K = 0: every
 * how many K = 0 steps it re-measures the acceptance, and how. A shadow
 * draft costs a whole draft token there (nothing overlaps it); a K = 1
 * probe costs a draft token and a verified row but saves a step when its
 * draft is accepted: the cheaper of the two by the current estimate, as
 * often as keeps its expected cost under 2% of a step, and at most every
 * 256 steps where no acceptance would make a draft pay. *probe (may be
 * NULL): true for a K = 1 probe, false for a shadow draft. */
int32_t sd_adapt_inline_interval(const sd_adapt *a, const sd_cost_model *c, bool *probe);

/* The K for a sequence's next step, 0..max_k: for a greedy request the
 * cost-optimal K of sd_adapt_choose_k at this batch; for a sampled request
 * sd_adapt_sampled_k (its own history only). The caller counts
 * a->steps_at_zero (K = 0 steps since the last probe or shadow). */
int32_t sd_adapt_next_k(const sd_adapt *a, const sd_cost_model *c, bool greedy, int32_t batch, int32_t max_k);

/* Whether a greedy sequence at K = 0 should shadow-draft one token at this
 * step: its K = 0 steps have reached sd_adapt_shadow_interval. */
bool sd_adapt_shadow_due(const sd_adapt *a, const sd_cost_model *c, int32_t batch);

#ifdef __cplusplus
}
#endif
#endif
