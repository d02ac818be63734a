/* spec_decode.h — speculative decoding of one sequence in one process:
 * a target model, an optional drafter, the verifier of spec.h between them.
 *
 * A step drafts up to k tokens, runs the target once over the context's
 * uncached tail plus the drafts (one ragged batch, logits for the last
 * context row and every draft row), verifies (greedy at temperature 0,
 * the coupled rule of spec.h otherwise) and rolls the target's KV cache
 * back past the rejected drafts. Whatever the drafter and k, every token is
 * the one plain decoding draws at its position (the same race, same key).
 * The decoder keeps a copy of the tokens its target cache holds and reuses
 * their longest common prefix with the context it is given, so callers just
 * pass the committed context every time. Not thread-safe. */
#ifndef SPECD_SPEC_DECODE_H
#define SPECD_SPEC_DECODE_H

#include "specd/constrain.h"
#include "specd/drafter.h"
#include "specd/model.h"
#include "specd/sample.h"
#include "specd/spec.h"
#include "specd/spec_adapt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_spec_decoder sd_spec_decoder;

/* Counters over the decoder's life (or since the last reset). */
typedef struct sd_spec_stats {
    int64_t steps;     /* target forward calls that produced tokens */
    int64_t drafted;   /* draft tokens proposed and verified */
    int64_t accepted;  /* of those, accepted */
    int64_t committed; /* tokens committed (accepted + one per step) */
    double draft_s;    /* seconds in the drafter */
    double target_s;   /* seconds in the target forward + verification */
    /* Per draft position i (0 = the first draft after the context; a
     * tree's depth i + 1): steps that drafted there, steps where every
     * draft before it was accepted (it was reached), and steps that
     * accepted it. Acceptance at position i given the ones before:
     * accepted_at[i] / reached_at[i]. */
    int64_t drafted_at[SD_MAX_K], reached_at[SD_MAX_K], accepted_at[SD_MAX_K];
} sd_spec_stats;

/* A decoder for one sequence of at most max_ctx tokens over target
 * (borrowed) and drafter (borrowed, may be NULL; it uses slot 0). Caller
 * frees with sd_spec_decoder_free. */
sd_status sd_spec_decoder_create(sd_model *target, sd_drafter *drafter, int32_t max_ctx, sd_spec_decoder **out);
void sd_spec_decoder_free(sd_spec_decoder **d);

/* One step after committed context ctx[n_ctx] (n_ctx >= 1): drafts up to k
 * tokens, verifies them, writes the tokens to commit to out[k+1] and their
 * count (>= 1) to *n_out, and the step's draft length / accepted count to
 * *n_drafted / *n_accepted when not NULL. */
sd_status sd_spec_decoder_step(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t k, const sd_sampling *s,
                               int32_t *out, int32_t *n_out, int32_t *n_drafted, int32_t *n_accepted);

/* One step with a token tree (sd_drafter_eagle_propose_tree's shape; the
 * drafter must be an EAGLE head): the tree is verified in one target
 * forward (sd_model_forward_tree), the longest path whose tokens are the
 * target's own is accepted (spec_tree.h), and the cache keeps the context
 * and that path. out[shape->depth + 1] and *n_out as sd_spec_decoder_step;
 * *n_drafted counts the tree's nodes. Greedy and sampled requests under
 * the coupled rule: output equal to plain decoding's. A constraint, the
 * rejection rule (sampled), another drafter or a backend without tree
 * attention: SD_ERR_UNSUPPORTED with a log line. */
sd_status sd_spec_decoder_step_tree(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, const sd_tree_shape *shape,
                                    const sd_sampling *s, int32_t *out, int32_t *n_out, int32_t *n_drafted,
                                    int32_t *n_accepted);

/* One step like sd_spec_decoder_step with K chosen by the shared policy
 * of spec_adapt.h (sd_adapt_next_k at batch 1, 0..max_k) from this
 * decoder's acceptance history and its own timings of the drafter and the
 * target; after the decoder's first step it also times the target at a
 * few step sizes and the drafter once, which seeds those costs (some 0.2 s
 * for a 135M model, inside that first call). At K = 0 a greedy request
 * re-measures now and then by a K = 1 probe or a shadow draft of one token
 * (sd_adapt_inline_interval) to notice when drafting starts to pay, a
 * sampled one probes K = 1 (sd_adapt_sampled_k). Writes the K used to
 * *k_used when not NULL (1 for a probe, 0 for a shadow step: nothing is
 * verified). Greedy output is plain greedy output whatever K is. */
sd_status sd_spec_decoder_step_adaptive(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t max_k,
                                        const sd_sampling *s, int32_t *out, int32_t *n_out, int32_t *k_used);

/* Costs the adaptive policy learns from, in place of the wall clock: given
 * the rows the target computed in a step and the tokens the drafter
 * proposed, writes the seconds each took. For tests, which need the
 * policy's decisions not to depend on the machine's speed or load; the
 * decoder's own timing statistics stay measured. NULL restores the clock. */
typedef void (*sd_spec_cost_fn)(void *user, int32_t n_target_rows, int32_t n_proposed, double *target_s,
                                double *draft_s);
void sd_spec_decoder_set_cost_fn(sd_spec_decoder *d, sd_spec_cost_fn fn, void *user);

/* Where the prompt ends in the contexts the steps get: tokens from
 * n_prompt on are the generated ones that penalties count
 * (sd_sampling.presence_penalty / frequency_penalty). Default 0 (every
 * token counts); set it before the first step of each generation. */
void sd_spec_decoder_set_prompt_len(sd_spec_decoder *d, int32_t n_prompt);

/* Structured output: the tokens generated after the prompt
 * (sd_spec_decoder_set_prompt_len) are constrained by c (borrowed, NULL
 * removes it; rolled back to its start here). Each step brings c to the
 * context's generated tokens, masks the target's rows before sampling
 * (spec_batch.h: the output is constrained plain decoding's), drafts first
 * the tokens c forces (sd_constraint_forced_tokens with tok; q = 1, no
 * drafter time; tok NULL: none) and then the drafter's tokens (a model or
 * EAGLE drafter's distribution masked by c: sd_drafter_set_constraint), cut
 * at the first one c refuses. Works without a drafter (forced drafts only). */
sd_status sd_spec_decoder_set_constraint(sd_spec_decoder *d, sd_constraint *c, const sd_tok *tok);
/* Forced drafts proposed over the decoder's life. */
int64_t sd_spec_decoder_forced_drafted(const sd_spec_decoder *d);

/* The policy's state and cost model (borrowed, valid while d lives). */
const sd_adapt *sd_spec_decoder_adapt(const sd_spec_decoder *d);
const sd_cost_model *sd_spec_decoder_cost(const sd_spec_decoder *d);

/* Borrowed counters, valid while d lives; reset clears them. */
const sd_spec_stats *sd_spec_decoder_stats(const sd_spec_decoder *d);
void sd_spec_decoder_reset_stats(sd_spec_decoder *d);

#ifdef __cplusplus
}
#endif
#endif
