/* warmup.c — the warm-up driver shared by the verifier and the drafter
 * (sd_warmup_run: the size ladder, greedy / sampled / timed steps, the
 * report) and the names of step outcomes (spec_batch.h). It calls no model:
 * the step is the caller's callback, so it lives in specd_ngram with the
 * drafter interface, where a process without a forward pass (the
 * coordinator's in-process n-gram drafter) can link it. */
#include "specd/spec_batch.h"

#include <stdlib.h>
#include <string.h>

const char *sd_seq_outcome_str(sd_seq_outcome o) {
    switch (o) {
    case SD_SEQ_OK: return "ok";
    case SD_SEQ_CACHE_MISS: return "cache_miss";
    case SD_SEQ_INVALID: return "invalid";
    case SD_SEQ_OUT_OF_BLOCKS: return "out_of_blocks";
    }
    return "unknown";
}

int32_t sd_warmup_next_size(int32_t n) {
    if (n < SD_WARMUP_EXACT_TOKENS) return n < 1 ? 1 : n + 1;
    if (n < 24) return 24;
    if (n > INT32_MAX / 2) return INT32_MAX;
    return (n & (n - 1)) == 0 ? n / 2 * 3 : n / 3 * 4; /* 2^k -> 3 * 2^(k-1) -> 2^(k+1) */
}

sd_status sd_warmup_run(const char *who, sd_warmup_mode mode, int32_t max_tokens, int32_t n_vocab,
                        sd_warmup_step_fn step, void *user, sd_warmup_report *rep) {
    sd_warmup_report r;
    memset(&r, 0, sizeof r);
    if (rep) *rep = r;
    if (!step || max_tokens < 0 || n_vocab <= 0) return SD_ERR_INVALID_ARG;
    if (max_tokens == 0) return SD_OK;
    int32_t *toks = malloc((size_t)max_tokens * sizeof *toks);
    if (!toks) return SD_ERR_NOMEM;
    for (int32_t i = 0; i < max_tokens; i++) toks[i] = (int32_t)(((int64_t)i * 7919 + 13) % n_vocab);
    sd_sampling greedy = sd_sampling_default(), sampled = sd_sampling_default();
    sampled.temperature = 1.0f;
    sampled.top_k = 40;
    sampled.top_p = 0.9f;
    sampled.seed = 1;
    const double t0 = sd_now();
    sd_status st = SD_OK;
    bool fits = true;
    const bool full = mode == SD_WARMUP_FULL;
    for (int32_t n = 1; n <= max_tokens && r.n_sizes < SD_WARMUP_MAX_SIZES; n = full ? sd_warmup_next_size(n)
                                                                                : n > INT32_MAX / 2 ? INT32_MAX
                                                                                                    : 2 * n) {
        const bool exact = full && n <= SD_WARMUP_EXACT_TOKENS;
        double t1 = sd_now();
        st = step(user, n, &greedy, toks, &fits);
        const double first = sd_now() - t1;
        double steady = first;
        if (st == SD_OK && fits && exact) st = step(user, n, &sampled, toks, &fits);
        if (st == SD_OK && fits) { /* timed again: FULL's replay; TIMES keeps the faster of two */
            t1 = sd_now();
            st = step(user, n, &greedy, toks, &fits);
            const double again = sd_now() - t1;
            steady = full || again < first ? again : first;
        }
        if (st != SD_OK || !fits) break;
        SD_DEBUG("%s: warm-up: %d tokens: first step %.2f ms, steady %.2f ms", who, (int)n, first * 1e3, steady * 1e3);
        r.tokens[r.n_sizes] = n;
        r.steady_s[r.n_sizes] = steady;
        r.n_sizes++;
        r.n_steps += exact ? 3 : 2;
        r.max_tokens = n;
        if (exact && first > r.first_s_max) r.first_s_max = first, r.first_max_at = n;
    }
    free(toks);
    r.seconds = sd_now() - t0;
    if (rep) *rep = r;
    if (st != SD_OK) {
        SD_ERROR("%s: warm-up failed: %s", who, sd_status_str(st));
        return st;
    }
    if (!fits) SD_WARN("%s: warm-up stopped after %d-token steps: the next size does not fit", who, (int)r.max_tokens);
    return SD_OK;
}

sd_status sd_warmup_outcome(const char *who, int32_t n_tokens, int32_t seq, sd_seq_outcome o, bool *fits) {
    if (o == SD_SEQ_OUT_OF_BLOCKS) *fits = false;
    if (o == SD_SEQ_OK || o == SD_SEQ_OUT_OF_BLOCKS) return SD_OK;
    SD_ERROR("%s: warm-up step of %d tokens: sequence %d: %s", who, (int)n_tokens, (int)seq, sd_seq_outcome_str(o));
    return SD_ERR_INTERNAL;
}
