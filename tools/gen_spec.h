/* gen_spec.h — specd-generate's speculative decoding loop (gen_spec.c),
 * apart from the program so that a test can drive it with a fake clock.
 *
 * Timing contract: every decode figure counts exactly the tokens produced
 * in the time it measures. The first step carries the prefill and is the
 * prompt phase: its time is prompt_s and the tokens it committed (1 plus
 * the drafts it accepted) are prompt_step_tokens, left out of the decode
 * figures. Every later step is decode: decode_s is their time and
 * decode_tokens the tokens they committed. A step never commits tokens
 * past n_predict (K is capped at what is left), so no token is produced
 * and then dropped. */
#ifndef SPECD_GEN_SPEC_H
#define SPECD_GEN_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "specd/spec_decode.h"

typedef struct sd_gen_spec_params {
    int32_t n_predict; /* tokens to generate at most (>= 1) */
    int32_t k;         /* K, or the most K with adaptive_k */
    bool adaptive_k;   /* K per step from the shared policy (sd_spec_decoder_step_adaptive) */
    sd_tree_shape tree; /* tree.topk > 0: a token tree per step (sd_spec_decoder_step_tree), depth k */
    sd_sampling sampling;
    void *user;                                  /* passed to the callbacks */
    bool (*is_end)(void *user, int32_t token);   /* stop after this token (end of generation); may be NULL */
    void (*on_token)(void *user, int32_t token); /* each token as it is committed; may be NULL */
    double (*clock)(void *user);                 /* seconds; NULL: sd_now */
} sd_gen_spec_params;

typedef struct sd_gen_spec_result {
    int32_t n_ids;              /* tokens written to ids */
    bool ended;                 /* stopped at a token is_end accepted */
    double prompt_s;            /* the first step (prefill + its drafts) */
    int32_t prompt_step_tokens; /* tokens the first step committed */
    double decode_s;            /* every later step */
    int32_t decode_tokens;      /* tokens those steps committed */
    int32_t decode_steps;
    double k_sum; /* K asked for, summed over all steps */
    int32_t n_steps;
} sd_gen_spec_result;

/* Generates after prompt[n_prompt] with dec (whose context starts empty),
 * writing the tokens to ids[p->n_predict] (caller's) and the figures to
 * *r. ctx is caller scratch for n_prompt + n_predict + SD_MAX_K + 1
 * tokens. */
sd_status sd_gen_spec_run(sd_spec_decoder *dec, const int32_t *prompt, int32_t n_prompt, const sd_gen_spec_params *p,
                          int32_t *ctx, int32_t *ids, sd_gen_spec_result *r);

/* decode_tokens / decode_s, 0 when nothing was timed. */
double sd_gen_spec_decode_tok_s(const sd_gen_spec_result *r);

#endif
