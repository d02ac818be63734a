/* spec_decode.c — one sequence, one process: draft, verify in one target
 * pass, roll back (see spec_decode.h).
 *
 * Row layout of a step's target batch: the context tokens the cache lacks
 * (always at least the last one, whose logits give p for the first draft
 * position), then the drafts y_1..y_n. Logits are wanted for the last
 * context row and every draft row: n + 1 rows, row i being the target's
 * distribution for the token at position n_ctx + i. After verification the
 * cache holds the context and all drafts; it is truncated to n_ctx +
 * n_accepted (the accepted drafts stay cached, the committed correction is
 * fed at the next step with the next drafts). Because the CPU forward is
 * batch invariant, the target's logits here equal plain decoding's bit for
 * bit, which is what makes greedy speculative output equal greedy plain
 * output exactly. */
#include "specd/spec_decode.h"

#include <stdlib.h>
#include <string.h>

#include "specd/spec_batch.h"

struct sd_spec_decoder {
    sd_model *target;
    sd_drafter *drafter;
    sd_kv *kv;
    int32_t max_ctx;
    int32_t *cached;   /* [max_ctx] tokens held in kv */
    sd_spec_scratch *scratch;
    sd_spec_stats stats;
};

void sd_spec_decoder_free(sd_spec_decoder **pd) {
    if (!pd || !*pd) return;
    sd_spec_decoder *d = *pd;
    sd_kv_free(&d->kv);
    free(d->cached);
    sd_spec_scratch_free(&d->scratch);
    free(d);
    *pd = NULL;
}

sd_status sd_spec_decoder_create(sd_model *target, sd_drafter *drafter, int32_t max_ctx, sd_spec_decoder **out) {
    if (!target || !out || max_ctx <= 0) {
        SD_ERROR("spec: decoder needs a target, an output and max_ctx > 0 (got %d)", (int)max_ctx);
        return SD_ERR_INVALID_ARG;
    }
    *out = NULL;
    sd_spec_decoder *d = calloc(1, sizeof *d);
    if (!d) return SD_ERR_NOMEM;
    d->target = target;
    d->drafter = drafter;
    d->max_ctx = max_ctx;
    d->cached = malloc((size_t)max_ctx * sizeof *d->cached);
    sd_status st = d->cached ? sd_spec_scratch_create(&d->scratch) : SD_ERR_NOMEM;
    if (st == SD_OK) {
        const int32_t block = 16;
        st = sd_model_kv_create(target, 1, (max_ctx + SD_SPEC_MAX_K + block - 1) / block + 1, block, &d->kv);
    } else {
        SD_ERROR("spec: out of memory creating a decoder");
    }
    if (st != SD_OK) {
        sd_spec_decoder_free(&d);
        return st;
    }
    *out = d;
    return SD_OK;
}

sd_status sd_spec_decoder_step(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t k,
                               const sd_sampling *s, int32_t *out, int32_t *n_out, int32_t *n_drafted,
                               int32_t *n_accepted) {
    if (!d || !ctx || !s || !out || !n_out || n_ctx <= 0 || k < 0 || k > SD_SPEC_MAX_K) {
        SD_ERROR("spec: step needs a decoder, a non-empty context, sampling, outputs and 0 <= k <= %d",
                 SD_SPEC_MAX_K);
        return SD_ERR_INVALID_ARG;
    }
    if (n_ctx >= d->max_ctx) {
        SD_ERROR("spec: context of %d tokens is at the decoder's limit %d", (int)n_ctx, (int)d->max_ctx);
        return SD_ERR_RANGE;
    }
    SD_TRY(sd_sampling_validate(s));
    if (k > d->max_ctx - n_ctx) k = d->max_ctx - n_ctx;
    /* Draft. */
    int32_t draft[SD_SPEC_MAX_K];
    sd_spec_q q[SD_SPEC_MAX_K];
    int32_t nd = 0;
    double t0 = sd_now();
    if (d->drafter && k > 0) SD_TRY(sd_drafter_propose(d->drafter, 0, ctx, n_ctx, k, s, draft, q, &nd));
    double t1 = sd_now();

    /* Verify: one sequence of the batched step, keeping the longest common
     * prefix of what the cache holds and the context. */
    int32_t n_cached = sd_kv_seq_len(d->kv, 0), keep = 0;
    while (keep < n_cached && keep < n_ctx && d->cached[keep] == ctx[keep]) keep++;
    if (keep == n_ctx) keep = n_ctx - 1;
    sd_verify_seq v = {
        .slot = 0, .keep_len = keep, .n_append = n_ctx - keep, .append = ctx + keep,
        .k = nd, .draft = draft, .q = q, .sampling = *s,
    };
    sd_verify_result r;
    SD_TRY(sd_spec_verify_batch(d->target, d->kv, 1, &v, &r, d->scratch));
    if (r.outcome != SD_SEQ_OK) {
        SD_ERROR("spec: verification step failed: %s", sd_seq_outcome_str(r.outcome));
        return r.outcome == SD_SEQ_OUT_OF_BLOCKS ? SD_ERR_OUT_OF_BLOCKS : SD_ERR_INVALID_ARG;
    }
    /* The cache now holds the context and the accepted drafts. */
    memcpy(d->cached + keep, ctx + keep, (size_t)(n_ctx - keep) * sizeof *ctx);
    memcpy(d->cached + n_ctx, draft, (size_t)r.n_accepted * sizeof *draft);
    int32_t acc = r.n_accepted;
    memcpy(out, r.tokens, (size_t)r.n_tokens * sizeof *out);
    *n_out = r.n_tokens;
    if (n_drafted) *n_drafted = nd;
    if (n_accepted) *n_accepted = acc;
    d->stats.steps++;
    d->stats.drafted += nd;
    d->stats.accepted += acc;
    d->stats.committed += acc + 1;
    d->stats.draft_s += t1 - t0;
    d->stats.target_s += sd_now() - t1;
    return SD_OK;
}

const sd_spec_stats *sd_spec_decoder_stats(const sd_spec_decoder *d) { return d ? &d->stats : NULL; }

void sd_spec_decoder_reset_stats(sd_spec_decoder *d) {
    if (d) memset(&d->stats, 0, sizeof d->stats);
}
