/* greedy_util.h — shared by the tests that compare speculative and plain
 * greedy decoding (test_spec_demo, test_cuda_model): the committed prompt
 * set and the two decoding loops. */
#ifndef SPECD_TEST_GREEDY_UTIL_H
#define SPECD_TEST_GREEDY_UTIL_H

#include "specd/drafter.h"
#include "specd/model.h"

/* Reads up to max lines of tests/data/spec_prompts.txt ("\n" expanded) into
 * prompts (caller frees each); returns how many, or -1. */
int greedy_read_prompts(const char *source_dir, char **prompts, int max);

/* Plain greedy decoding of n_new tokens after prompt (one sequence, a
 * max_ctx-token cache). 0 on success. */
int greedy_plain(sd_model *m, const int32_t *prompt, int32_t n_prompt, int32_t n_new, int32_t max_ctx, int32_t *out);

/* Greedy speculative decoding with drafter d at K = k; adds the drafted and
 * accepted counts to *drafted / *accepted when not NULL. 0 on success. */
int greedy_spec(sd_model *m, sd_drafter *d, int32_t k, const int32_t *prompt, int32_t n_prompt, int32_t n_new,
                int32_t max_ctx, int32_t *out, long *drafted, long *accepted);

#endif
