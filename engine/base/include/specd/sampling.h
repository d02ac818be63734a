/* sampling.h — the sampling parameters of a request: one struct, one default
 * (greedy), one validator with one rule set, and the one limit on the draft
 * length. The validator runs once where parameters enter a process: in
 * net/'s decoders (the coordinator, the verifier and the drafter), and at the
 * engine's public entry points for callers that are not the wire
 * (sd_sample_probs, sd_sample_token, sd_drafter_propose,
 * sd_spec_decoder_step: specd-generate, tools, tests); code behind those
 * edges takes an sd_sampling as given. So a request is judged the same
 * wherever it enters. (On the wire, proto3 sends 0 for an unset top_p; net
 * maps that to 1 = off before validating: a property of the encoding, not a
 * second rule.) */
#ifndef SPECD_SAMPLING_H
#define SPECD_SAMPLING_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest draft length (draft tokens verified per sequence per step),
 * for every process and the wire. */
#define SD_MAX_K                    32
/* The largest temperature accepted (beyond it the distribution is uniform to
 * float precision; the bound keeps 1/T finite and meaningful). */
#define SD_SAMPLING_MAX_TEMPERATURE 1000.0f
/* presence_penalty and frequency_penalty lie in [-SD_SAMPLING_MAX_PENALTY,
 * SD_SAMPLING_MAX_PENALTY] (OpenAI's range). */
#define SD_SAMPLING_MAX_PENALTY     2.0f
/* The most alternatives a request may ask to see per token (top_logprobs). */
#define SD_MAX_TOP_LOGPROBS         20

/* How sampled drafts are verified (spec.h): the coupled rule (seeded
 * output = plain decoding's, whatever was drafted) or rejection sampling
 * (accept min(1, p/q), replace from norm(max(0, p - q)): the most accepted
 * drafts, but seeded output depends on them). SD_RULE_DEFAULT: the
 * service's choice (the coordinator's --verify-rule); the engine reads it as
 * coupled. Greedy requests ignore it. Values as the protocol's VerifyRule. */
typedef enum sd_verify_rule {
    SD_RULE_DEFAULT = 0,
    SD_RULE_COUPLED = 1,
    SD_RULE_REJECTION = 2,
} sd_verify_rule;

typedef struct sd_sampling {
    float temperature; /* 0 = greedy (argmax); otherwise in (0, SD_SAMPLING_MAX_TEMPERATURE] */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* in (0, 1]; 1 = off */
    float min_p;       /* in [0, 1); 0 = off */
    uint64_t seed;
    /* OpenAI's penalties, on the logits before temperature: logit[t] -=
     * frequency_penalty * count(t) + presence_penalty * (count(t) > 0), count
     * over the tokens generated so far (not the prompt). 0 = off. */
    float presence_penalty;
    float frequency_penalty;
    int32_t rule; /* sd_verify_rule */
} sd_sampling;

/* The target's log-probability of one generated token and its most likely
 * alternatives at that position (log-softmax of the logits after penalties,
 * before temperature and the filters). */
typedef struct sd_token_logprob {
    float logprob; /* log p(token), <= 0 */
    int32_t n_top; /* 0..SD_MAX_TOP_LOGPROBS */
    int32_t top_ids[SD_MAX_TOP_LOGPROBS];
    float top_logprobs[SD_MAX_TOP_LOGPROBS]; /* descending (ties: lower id first) */
} sd_token_logprob;

/* Greedy: temperature 0, top_k 0, top_p 1, min_p 0, seed 0, no penalties. */
sd_sampling sd_sampling_default(void);

/* True when s picks the argmax (temperature 0); the filters then do not
 * matter. */
static inline bool sd_sampling_is_greedy(const sd_sampling *s) { return s->temperature == 0.0f; }

/* True when s penalizes repeated tokens (the generated tokens matter). */
static inline bool sd_sampling_has_penalties(const sd_sampling *s) {
    return s->presence_penalty != 0.0f || s->frequency_penalty != 0.0f;
}

/* The one rule set: SD_OK, or SD_ERR_INVALID_ARG with a sentence naming the
 * field and its range written to err (when err_len > 0). Logs nothing. */
sd_status sd_sampling_check(const sd_sampling *s, char *err, size_t err_len);

/* sd_sampling_check, with the sentence logged as an error. */
sd_status sd_sampling_validate(const sd_sampling *s);

#ifdef __cplusplus
}
#endif
#endif
