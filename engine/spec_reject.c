/* spec_reject.c — rejection-sampling verification (sd_spec_verify_rejection,
 * spec.h), offered beside the coupled rule of spec.c.
 *
 * The rule (Leviathan et al. 2023, "Fast inference from transformers via
 * speculative decoding"; Chen et al. 2023): a draft y ~ q is accepted with
 * probability min(1, p(y)/q(y)); at the first rejection the position takes
 * a draw from the residual norm(max(0, p - q)). The committed token then
 * follows p exactly: P(x) = q(x) min(1, p/q) + (1 - sum_v min(p, q)) *
 * max(0, p - q)(x) / sum_v max(0, p - q) = min(p, q)(x) + max(0, p - q)(x)
 * = p(x), since both sums equal 1 - sum_v min(p, q). It accepts the most
 * drafts any rule can (sum_v min(p, q) per position, against the coupled
 * rule's >= (1 - TV)/(1 + TV)), but the token a position gets depends on
 * the draft and on whether it was drafted at all, so seeded output changes
 * with the drafter, K and failovers (spec.c says why the service's default
 * is the coupled rule). Its uniforms come from their own streams
 * (SD_RNG_ACCEPT, SD_RNG_RESIDUAL), independent of the race the drafters
 * draw with.
 *
 * q is sparse and p dense: the residual is p with each q entry's
 * normalized mass subtracted, clamped at 0 (q's repeated ids add up, as
 * sd_spec_q_prob reads them). Pure; thread-safe; no allocation. */
#include "specd/spec.h"
#include "spec_impl.h"

#include "specd/sample.h"

#include <math.h>

/* The replacement token at a rejected position: a draw from
 * norm(max(0, p/p_tot - q)), or from p when that has no mass. */
static int32_t draw_residual(const float *p_row, double p_tot, int32_t n_vocab, const sd_spec_q *q, double q_tot,
                             uint64_t seed, uint64_t pos, float *residual) {
    for (int32_t v = 0; v < n_vocab; v++) residual[v] = (float)((double)p_row[v] / p_tot);
    for (int32_t j = 0; j < q->n; j++)
        if (q->probs[j] > 0.0f) residual[q->ids[j]] -= (float)((double)q->probs[j] / q_tot);
    double mass = 0.0;
    for (int32_t v = 0; v < n_vocab; v++) {
        if (!(residual[v] > 0.0f)) residual[v] = 0.0f;
        mass += residual[v];
    }
    double u = sd_rng_uniform(seed, pos, SD_RNG_RESIDUAL);
    return mass > 0.0 ? sd_sample_from(residual, n_vocab, u) : sd_sample_from(p_row, n_vocab, u);
}

sd_status sd_spec_verify_rejection(const float *p, int32_t n_vocab, const int32_t *draft, const sd_spec_q *q, int32_t k,
                                   uint64_t seed, uint64_t pos0, float *residual, int32_t *out_tokens,
                                   int32_t *n_accepted, sd_spec_info *info) {
    if (!p || n_vocab <= 0 || k < 0 || k > SD_MAX_K || (k > 0 && (!draft || !q || !residual)) || !out_tokens ||
        !n_accepted) {
        SD_ERROR("spec: rejection verify needs p, draft, q, scratch, outputs, n_vocab > 0 and 0 <= k <= %d "
                 "(n_vocab %d, k %d)",
                 SD_MAX_K, (int)n_vocab, (int)k);
        return SD_ERR_INVALID_ARG;
    }
    double q_tot[SD_MAX_K];
    for (int32_t i = 0; i < k; i++) { /* everything checked before any decision, as sd_spec_verify */
        if (draft[i] < 0 || draft[i] >= n_vocab) {
            SD_ERROR("spec: draft token %d at index %d is outside [0, %d)", (int)draft[i], (int)i, (int)n_vocab);
            return SD_ERR_RANGE;
        }
        SD_TRY(sd_spec_q_check(&q[i], n_vocab, i, &q_tot[i]));
    }
    for (int32_t i = 0; i <= k; i++) {
        const float *p_row = p + (size_t)i * (size_t)n_vocab;
        double p_tot;
        SD_TRY(sd_spec_p_row_total(p_row, n_vocab, i, &p_tot));
        const uint64_t pos = pos0 + (uint64_t)i;
        int32_t x;
        if (i < k) {
            const int32_t y = draft[i];
            const double py = (double)p_row[y] / p_tot, qy = sd_spec_q_prob(&q[i], y);
            const double u = sd_rng_uniform(seed, pos, SD_RNG_ACCEPT);
            if (qy > 0.0 && u * qy < py) { /* u < min(1, p/q) */
                out_tokens[i] = y;
                continue;
            }
            x = draw_residual(p_row, p_tot, n_vocab, &q[i], q_tot[i], seed, pos, residual);
        } else {
            x = sd_sample_race(p_row, n_vocab, seed, pos); /* the bonus: plain decoding's draw */
        }
        if (x < 0) return SD_ERR_INTERNAL;
        out_tokens[i] = x;
        *n_accepted = i;
        if (info) *info = (sd_spec_info){.bonus = i == k};
        return SD_OK;
    }
    return SD_ERR_INTERNAL; /* unreachable: row k always returns */
}
