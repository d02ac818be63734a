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

struct sd_spec_decoder {
    sd_model *target;
    sd_drafter *drafter;
    sd_kv *kv;
    int32_t n_vocab;
    int32_t max_ctx;
    int32_t *cached;   /* [max_ctx] tokens held in kv */
    int32_t *batch;    /* [max_ctx + SD_SPEC_MAX_K] tokens of a step */
    int32_t *pos;      /* same, positions */
    int32_t *seq;      /* same, all 0 */
    bool *want;        /* same */
    float *logits;     /* [SD_SPEC_MAX_K + 1][n_vocab] */
    float *p;          /* [SD_SPEC_MAX_K + 1][n_vocab] processed */
    double *scratch;   /* [n_vocab] */
    sd_spec_stats stats;
};

void sd_spec_decoder_free(sd_spec_decoder **pd) {
    if (!pd || !*pd) return;
    sd_spec_decoder *d = *pd;
    sd_kv_free(&d->kv);
    free(d->cached);
    free(d->batch);
    free(d->pos);
    free(d->seq);
    free(d->want);
    free(d->logits);
    free(d->p);
    free(d->scratch);
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
    d->n_vocab = sd_model_config_of(target)->n_vocab;
    d->max_ctx = max_ctx;
    size_t rows = (size_t)max_ctx + SD_SPEC_MAX_K, vrows = (size_t)(SD_SPEC_MAX_K + 1) * (size_t)d->n_vocab;
    d->cached = malloc((size_t)max_ctx * sizeof *d->cached);
    d->batch = malloc(rows * sizeof *d->batch);
    d->pos = malloc(rows * sizeof *d->pos);
    d->seq = calloc(rows, sizeof *d->seq);
    d->want = malloc(rows * sizeof *d->want);
    d->logits = malloc(vrows * sizeof *d->logits);
    d->p = malloc(vrows * sizeof *d->p);
    d->scratch = malloc((size_t)d->n_vocab * sizeof *d->scratch);
    sd_status st = SD_ERR_NOMEM;
    if (d->cached && d->batch && d->pos && d->seq && d->want && d->logits && d->p && d->scratch) {
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

    /* Target pass over the uncached tail + drafts. */
    int32_t n_cached = sd_kv_seq_len(d->kv, 0), keep = 0;
    while (keep < n_cached && keep < n_ctx && d->cached[keep] == ctx[keep]) keep++;
    if (keep == n_ctx) keep = n_ctx - 1;
    SD_TRY(sd_kv_truncate(d->kv, 0, keep));
    int32_t n_tail = n_ctx - keep, n_rows = n_tail + nd;
    memcpy(d->batch, ctx + keep, (size_t)n_tail * sizeof *ctx);
    memcpy(d->batch + n_tail, draft, (size_t)nd * sizeof *draft);
    for (int32_t i = 0; i < n_rows; i++) {
        d->pos[i] = keep + i;
        d->want[i] = i >= n_tail - 1;
    }
    sd_batch b = {n_rows, d->batch, d->pos, d->seq, d->want};
    SD_TRY(sd_model_forward(d->target, d->kv, &b, d->logits));
    memcpy(d->cached + keep, d->batch, (size_t)(n_rows < d->max_ctx - keep ? n_rows : d->max_ctx - keep) *
                                           sizeof *d->batch);

    /* Verify. */
    int32_t acc = 0;
    size_t V = (size_t)d->n_vocab;
    if (s->temperature == 0.0f) {
        int32_t target_argmax[SD_SPEC_MAX_K + 1];
        for (int32_t i = 0; i <= nd; i++) target_argmax[i] = sd_argmax(d->logits + (size_t)i * V, d->n_vocab);
        SD_TRY(sd_spec_verify_greedy(target_argmax, draft, nd, out, &acc));
    } else {
        for (int32_t i = 0; i <= nd; i++)
            SD_TRY(sd_sample_probs(d->logits + (size_t)i * V, d->n_vocab, s, d->p + (size_t)i * V));
        SD_TRY(sd_spec_verify(d->p, d->n_vocab, draft, q, nd, s->seed, (uint64_t)n_ctx, d->scratch, out, &acc,
                              NULL));
    }
    /* Keep the context and the accepted drafts; drop the rejected ones. */
    SD_TRY(sd_kv_truncate(d->kv, 0, n_ctx + acc));
    *n_out = acc + 1;
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
