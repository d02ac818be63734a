/* gen_result.h — what one specd-generate run produced, and its --json
 * report (gen_json.c), apart from the program's loops. */
#ifndef SPECD_GEN_RESULT_H
#define SPECD_GEN_RESULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "specd/sample.h"
#include "specd/spec_adapt.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

typedef struct gen_result {
    int32_t *prompt_ids;
    size_t n_prompt;
    int32_t *ids; /* generated tokens */
    size_t n_ids;
    sd_token_logprob *logprobs; /* [n_ids] with --logprobs */
    const char *stop_reason;
    double prompt_s, decode_s;
    int64_t decode_tokens; /* tokens produced by the steps decode_s times (prefill's excluded) */
    bool spec;             /* speculative mode: the fields below are set */
    sd_spec_stats spec_stats;
    double mean_k;      /* mean draft length asked for per step */
    bool adaptive;      /* --adaptive-k: the policy's state below is set */
    sd_cost_model cost; /* the adaptive policy's cost model at the end */
    sd_adapt adapt;     /* ... and its acceptance estimate */
    /* under a constraint (--json-schema, --regex, --grammar, --response-json) */
    bool constrained;
    int64_t masks, mask_hits; /* masks served, of which from the cache */
    double mask_p50_us, mask_p99_us, mask_max_us, mask_mean_us;
    int64_t forced_drafted; /* drafts the constraint forced (speculative) */
} gen_result;

/* The measured acceptance rate, tokens per target step and the i.i.d.
 * expectation (1-a^(K+1))/(1-a) at the mean draft length proposed. */
void gen_spec_summary(const gen_result *r, double *rate, double *per_step, double *expected);

/* Prints r as one JSON object on stdout (ids, text, timings, spec and
 * constraint figures). 0, or 1 on failure. */
int gen_print_json(const char *model_path, const sd_tok *tok, const char *prompt_text, const gen_result *r);

#endif
