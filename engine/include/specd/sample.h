/* sample.h — processed distributions, seeded sampling, counter-based RNG.
 *
 * Random numbers come from Philox4x32-10 keyed by (seed, position, purpose):
 * a draw depends only on those three values, never on the order of calls,
 * the batch, or which process makes it. Processing (temperature, top-k,
 * top-p, min-p) turns logits into the exact distribution that is sampled
 * from; speculative verification applies the same processing to draft and
 * target logits. */
#ifndef SPECD_SAMPLE_H
#define SPECD_SAMPLE_H

#include "specd/common.h"
#include "specd/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Purposes keep independent streams apart for the same (seed, position). */
typedef enum sd_rng_purpose {
    SD_RNG_SAMPLE = 1,   /* a uniform for an inverse-CDF draw (sd_sample_from) */
    SD_RNG_DRAFT = 2,    /* independent draft draws (the rejection rule's drafts; the coupled rule races) */
    SD_RNG_ACCEPT = 3,   /* acceptance uniforms (the rejection rule; the coupled rule needs none) */
    SD_RNG_RESIDUAL = 4, /* residual draws (the rejection rule; the coupled rule needs none) */
    SD_RNG_RACE = 5,     /* the exponential race: one uniform per vocabulary entry (sd_sample_race) */
} sd_rng_purpose;

/* Philox4x32-10 of counter (position, purpose, sub, 0) under key seed. */
void sd_philox4x32(uint64_t seed, uint32_t ctr[4], uint32_t out[4]);
/* A uniform double in [0, 1) with 53 random bits for (seed, position, purpose). */
double sd_rng_uniform(uint64_t seed, uint64_t position, sd_rng_purpose purpose);

/* Index of the largest logit (lowest index on ties). */
int32_t sd_argmax(const float *logits, int32_t n);

/* Writes the processed distribution of logits into probs[n] (sums to 1,
 * zeros outside the kept set). Greedy (temperature 0) gives a one-hot on the
 * argmax. Thread-safe; allocates a scratch index array. A public entry
 * point: s is checked here (sd_sampling_validate). */
sd_status sd_sample_probs(const float *logits, int32_t n, const sd_sampling *s, float *probs);
/* sd_sample_probs for parameters the caller has already checked once
 * (a wire decoder in net/, or a public entry point of the engine): the
 * logits are checked, s is taken as given. */
sd_status sd_sample_probs_given(const float *logits, int32_t n, const sd_sampling *s, float *probs);

/* The token greedy sampling picks from logits[n] (the one-hot's index of
 * sd_sample_probs at temperature 0: the largest logit, lowest index on
 * ties), with sd_sample_probs' input checks, in one pass and without a
 * probs row. Pure; no allocation. */
sd_status sd_sample_greedy(const float *logits, int32_t n, int32_t *token);

/* Inverse-CDF draw from probs[n] with uniform u in [0,1): the first index
 * whose cumulative sum exceeds u*total, skipping zero-probability entries. */
int32_t sd_sample_from(const float *probs, int32_t n, double u);

/* The exponential race (the Gumbel-max trick): the token minimizing
 * E_v / probs[v] over entries with probs[v] > 0, E_v = -log U_v, U_v the
 * uniform of entry v for (seed, position, SD_RNG_RACE) (32 bits, from
 * Philox block v / 4). Token v wins with probability probs[v] / sum(probs)
 * (no normalization needed), ties to the lower id. Every token's U is fixed
 * by (seed, position) alone, so two distributions raced at the same key
 * pick the same token with probability sum_v 1 / sum_w max(p_w/p_v, q_w/q_v)
 * >= (1 - TV)/(1 + TV) whatever the vocabulary order: the coupling of
 * speculative sampling (spec.h). -1 when no entry is positive. Pure. */
int32_t sd_sample_race(const float *probs, int32_t n, uint64_t seed, uint64_t position);

/* OpenAI's repetition penalties, in place: logits[t] -= frequency_penalty *
 * count(t) + presence_penalty * (count(t) > 0), count(t) the occurrences of
 * t in generated[0..n_generated) (the tokens generated so far, never the
 * prompt). counts is caller scratch of n_vocab zeros, left zeroed. Applied
 * before sd_sample_probs / sd_argmax / sd_sample_logprobs, so penalties come
 * before temperature and the filters. No-op without penalties. Ids outside
 * [0, n_vocab) are SD_ERR_RANGE (logits untouched). O(n_generated). */
sd_status sd_sample_penalize(float *logits, int32_t n_vocab, const sd_sampling *s, const int32_t *generated,
                             int32_t n_generated, int32_t *counts);

/* The log-softmax of logits[n] (in double, maximum subtracted, summed in
 * index order) at token, and its top_n entries (log-probability
 * descending, lower id first on ties; 0 <= top_n <= SD_MAX_TOP_LOGPROBS)
 * into *out. This is what a request's logprobs report: the distribution
 * the logits give before temperature and the filters. Pure; no allocation. */
sd_status sd_sample_logprobs(const float *logits, int32_t n, int32_t token, int32_t top_n, sd_token_logprob *out);

/* Processes logits and draws one token with the (seed, position) key
 * (sd_sample_race): the whole sampling step of plain decoding. */
sd_status sd_sample_token(const float *logits, int32_t n, const sd_sampling *s, uint64_t position, int32_t *token);

#ifdef __cplusplus
}
#endif
#endif
