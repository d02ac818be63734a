/* spec.c — the verifier math of speculative decoding (see spec.h).
 *
 * Why the rules are exact. For one position with target p and proposal q,
 * a token drawn from q and accepted with probability min(1, p/q) is emitted
 * with probability min(p(v), q(v)); a rejection happens with probability
 * 1 - alpha = sum_v max(0, p(v) - q(v)) and is followed by a draw from the
 * residual r = max(0, p - q) / (1 - alpha), emitting v with probability
 * max(0, p(v) - q(v)). The two add up to p(v). Later positions are only
 * reached after an acceptance, so the argument chains; the bonus token is an
 * ordinary draw from p_{K+1}.
 *
 * Edge cases, each handled here and tested in tests/test_spec.c:
 *   - q(y) = 0 for the proposed y: the drafter cannot have drawn y from q,
 *     so this is a drafter bug. The ratio is undefined; we reject (logged as
 *     a WARN and counted in sd_spec_info.n_q_zero) and draw the replacement
 *     from the residual. Exactness cannot be promised once the drafter broke
 *     its contract, but this choice never commits a token with p = 0 and
 *     never trusts the bad draft; the same holds for a y absent from q.
 *   - p = q: the ratio is 1 at every proposed token; u < 1 always holds, so
 *     every token is accepted (the residual is never needed).
 *   - disjoint supports: p(y) = 0 for every y drawn from q, so u < 0 never
 *     holds and the first token is always rejected; the residual is then
 *     max(0, p - q) = p, and the emitted token is a draw from p.
 *   - one-hot q (n-gram drafts): q(y) = 1, acceptance probability p(y); the
 *     residual is p with y removed, renormalized.
 *   - residual mass ~0: the mass is sum_v max(0, p(v) - q(v)) = 1 - alpha.
 *     If it is exactly 0 then p <= q everywhere, and since both sum to 1,
 *     p = q, so acceptance is certain and this branch has probability 0:
 *     any choice there is exact. Numerically (float p and q, rounding in the
 *     normalizations) the mass can be a tiny positive number made of noise;
 *     below SD_SPEC_RESIDUAL_EPS we draw from p instead. The branch is taken
 *     with probability 1 - alpha < SD_SPEC_RESIDUAL_EPS, so the deviation from
 *     p is at most that much in total variation, far below anything that
 *     can be observed; drawing from a noise-shaped residual would be worse.
 *
 * Sums for normalization are taken in double and in index order, so a
 * result depends only on the inputs, never on threads. Rejected: computing
 * the residual mass as 1 - alpha (cancellation when alpha ~ 1) — we sum the
 * positive parts directly. */
#include "specd/spec.h"

#include "specd/sample.h"

#include <math.h>

/* ---- sparsification ---- */

/* True when (pa, ia) ranks below (pb, ib): lower probability, or equal
 * probability and higher id. The heap keeps the worst kept entry on top. */
static bool ranks_below(float pa, int32_t ia, float pb, int32_t ib) { return pa < pb || (pa == pb && ia > ib); }

static void heap_sift_down(int32_t *ids, float *pr, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && ranks_below(pr[l], ids[l], pr[worst], ids[worst])) worst = l;
        if (r < n && ranks_below(pr[r], ids[r], pr[worst], ids[worst])) worst = r;
        if (worst == i) return;
        float tp = pr[i];
        int32_t ti = ids[i];
        pr[i] = pr[worst];
        ids[i] = ids[worst];
        pr[worst] = tp;
        ids[worst] = ti;
        i = worst;
    }
}

static void heap_sift_up(int32_t *ids, float *pr, int32_t i) {
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!ranks_below(pr[i], ids[i], pr[parent], ids[parent])) return;
        float tp = pr[i];
        int32_t ti = ids[i];
        pr[i] = pr[parent];
        ids[i] = ids[parent];
        pr[parent] = tp;
        ids[parent] = ti;
        i = parent;
    }
}

sd_status sd_spec_sparsify(const float *probs, int32_t n_vocab, int32_t top_n, int32_t *ids, float *q_probs,
                           int32_t *n_out) {
    if (!probs || !ids || !q_probs || !n_out || n_vocab <= 0 || top_n <= 0) {
        SD_ERROR("spec: sparsify needs probs, outputs, n_vocab > 0 and top_n > 0 (n_vocab %d, top_n %d)", (int)n_vocab,
                 (int)top_n);
        return SD_ERR_INVALID_ARG;
    }
    /* Min-heap (worst on top) of the best entries seen so far. */
    int32_t n = 0;
    for (int32_t v = 0; v < n_vocab; v++) {
        float pv = probs[v];
        if (!(pv >= 0.0f) || !isfinite(pv)) {
            SD_ERROR("spec: sparsify: probability %d is %g", (int)v, (double)pv);
            return SD_ERR_INVALID_ARG;
        }
        if (pv == 0.0f) continue;
        if (n < top_n) {
            ids[n] = v;
            q_probs[n] = pv;
            heap_sift_up(ids, q_probs, n);
            n++;
        } else if (ranks_below(q_probs[0], ids[0], pv, v)) {
            ids[0] = v;
            q_probs[0] = pv;
            heap_sift_down(ids, q_probs, n, 0);
        }
    }
    if (n == 0) {
        SD_ERROR("spec: sparsify: the distribution has no positive mass");
        return SD_ERR_INVALID_ARG;
    }
    /* Heap sort: moving the worst to the end leaves best-first order. */
    for (int32_t end = n - 1; end > 0; end--) {
        float tp = q_probs[0];
        int32_t ti = ids[0];
        q_probs[0] = q_probs[end];
        ids[0] = ids[end];
        q_probs[end] = tp;
        ids[end] = ti;
        heap_sift_down(ids, q_probs, end, 0);
    }
    double kept = 0.0;
    for (int32_t j = 0; j < n; j++) kept += q_probs[j];
    for (int32_t j = 0; j < n; j++) q_probs[j] = (float)((double)q_probs[j] / kept);
    *n_out = n;
    return SD_OK;
}

/* ---- sparse q ---- */

static double q_total(const sd_spec_q *q) {
    double total = 0.0;
    for (int32_t j = 0; j < q->n; j++)
        if (q->probs[j] > 0.0f) total += q->probs[j];
    return total;
}

int32_t sd_spec_q_sample(const sd_spec_q *q, double u) {
    if (!q || q->n <= 0 || !q->ids || !q->probs) return -1;
    int32_t j = sd_sample_from(q->probs, q->n, u);
    return j < 0 ? -1 : q->ids[j];
}

double sd_spec_q_prob(const sd_spec_q *q, int32_t token) {
    if (!q || q->n <= 0 || !q->ids || !q->probs) return 0.0;
    double total = q_total(q), mass = 0.0;
    if (!(total > 0.0)) return 0.0;
    for (int32_t j = 0; j < q->n; j++)
        if (q->ids[j] == token && q->probs[j] > 0.0f) mass += q->probs[j];
    return mass / total;
}

sd_status sd_spec_q_check(const sd_spec_q *q, int32_t n_vocab, int32_t i, double *total) {
    if (!q->ids || !q->probs || q->n <= 0) {
        SD_ERROR("spec: q[%d] is empty", (int)i);
        return SD_ERR_INVALID_ARG;
    }
    for (int32_t j = 0; j < q->n; j++) {
        if (q->ids[j] < 0 || q->ids[j] >= n_vocab) {
            SD_ERROR("spec: q[%d] entry %d has token id %d outside [0, %d)", (int)i, (int)j, (int)q->ids[j],
                     (int)n_vocab);
            return SD_ERR_RANGE;
        }
        if (!(q->probs[j] >= 0.0f) || !isfinite(q->probs[j])) {
            SD_ERROR("spec: q[%d] entry %d has probability %g", (int)i, (int)j, (double)q->probs[j]);
            return SD_ERR_INVALID_ARG;
        }
    }
    *total = q_total(q);
    if (!(*total > 0.0)) {
        SD_ERROR("spec: q[%d] has no positive mass", (int)i);
        return SD_ERR_INVALID_ARG;
    }
    return SD_OK;
}

/* Sum of a dense processed distribution row, in index order. */
static sd_status p_row_total(const float *row, int32_t n_vocab, int32_t i, double *total) {
    double t = 0.0;
    for (int32_t v = 0; v < n_vocab; v++) {
        if (!(row[v] >= 0.0f) || !isfinite(row[v])) {
            SD_ERROR("spec: p[%d][%d] is %g", (int)i, (int)v, (double)row[v]);
            return SD_ERR_INVALID_ARG;
        }
        t += row[v];
    }
    if (!(t > 0.0)) {
        SD_ERROR("spec: p[%d] has no positive mass", (int)i);
        return SD_ERR_INVALID_ARG;
    }
    *total = t;
    return SD_OK;
}

/* ---- verification ---- */

sd_status sd_spec_verify_greedy(const int32_t *target_argmax, const int32_t *draft, int32_t k, int32_t *out_tokens,
                                int32_t *n_accepted) {
    if (!target_argmax || (!draft && k > 0) || !out_tokens || !n_accepted || k < 0 || k > SD_MAX_K) {
        SD_ERROR("spec: greedy verify needs target argmax, draft, outputs and 0 <= k <= %d (k = %d)", SD_MAX_K, (int)k);
        return SD_ERR_INVALID_ARG;
    }
    int32_t i = 0;
    while (i < k && draft[i] == target_argmax[i]) {
        out_tokens[i] = draft[i];
        i++;
    }
    out_tokens[i] = target_argmax[i];
    *n_accepted = i;
    return SD_OK;
}

/* Draws the replacement at a rejected position from norm(max(0, p - q)),
 * falling back to p when that mass is ~0. scratch[n_vocab] holds p/P - q/Q
 * in double; the clipped positive parts are the residual. */
static int32_t draw_residual(const float *p_row, double p_tot, const sd_spec_q *q, double q_tot, int32_t n_vocab,
                             double u, double *scratch, bool *fallback) {
    for (int32_t v = 0; v < n_vocab; v++) scratch[v] = (double)p_row[v] / p_tot;
    for (int32_t j = 0; j < q->n; j++) scratch[q->ids[j]] -= (double)q->probs[j] / q_tot;
    double mass = 0.0;
    for (int32_t v = 0; v < n_vocab; v++)
        if (scratch[v] > 0.0) mass += scratch[v];
    if (!(mass > SD_SPEC_RESIDUAL_EPS)) {
        *fallback = true;
        return sd_sample_from(p_row, n_vocab, u);
    }
    double target = u * mass, cum = 0.0;
    int32_t last = -1;
    for (int32_t v = 0; v < n_vocab; v++) {
        if (!(scratch[v] > 0.0)) continue;
        cum += scratch[v];
        last = v;
        if (cum > target) return v;
    }
    return last; /* u * mass rounded up to the mass */
}

sd_status sd_spec_verify(const float *p, int32_t n_vocab, const int32_t *draft, const sd_spec_q *q, int32_t k,
                         uint64_t seed, uint64_t pos0, double *scratch, int32_t *out_tokens, int32_t *n_accepted,
                         sd_spec_info *info) {
    if (!p || n_vocab <= 0 || k < 0 || k > SD_MAX_K || (k > 0 && (!draft || !q)) || !scratch || !out_tokens ||
        !n_accepted) {
        SD_ERROR("spec: verify needs p, draft, q, scratch, outputs, n_vocab > 0 and 0 <= k <= %d "
                 "(n_vocab %d, k %d)",
                 SD_MAX_K, (int)n_vocab, (int)k);
        return SD_ERR_INVALID_ARG;
    }
    sd_spec_info local = {0};
    for (int32_t i = 0; i < k; i++) {
        const float *p_row = p + (size_t)i * (size_t)n_vocab;
        int32_t y = draft[i];
        if (y < 0 || y >= n_vocab) {
            SD_ERROR("spec: draft token %d at index %d is outside [0, %d)", (int)y, (int)i, (int)n_vocab);
            return SD_ERR_RANGE;
        }
        double p_tot, q_tot;
        SD_TRY(p_row_total(p_row, n_vocab, i, &p_tot));
        SD_TRY(sd_spec_q_check(&q[i], n_vocab, i, &q_tot));
        double py = (double)p_row[y] / p_tot;
        double qy = sd_spec_q_prob(&q[i], y);
        uint64_t pos = pos0 + (uint64_t)i;
        bool accept;
        if (qy > 0.0) {
            /* u < p/q, written without the division; ratio >= 1 always accepts. */
            double u = sd_rng_uniform(seed, pos, SD_RNG_ACCEPT);
            accept = u * qy < py;
        } else {
            SD_WARN("spec: draft token %d at position %llu has q = 0: the drafter did not sample from the q "
                    "it reported; rejecting it",
                    (int)y, (unsigned long long)pos);
            local.n_q_zero++;
            accept = false;
        }
        if (accept) {
            out_tokens[i] = y;
            continue;
        }
        double u = sd_rng_uniform(seed, pos, SD_RNG_RESIDUAL);
        int32_t t = draw_residual(p_row, p_tot, &q[i], q_tot, n_vocab, u, scratch, &local.residual_fallback);
        if (t < 0) return SD_ERR_INTERNAL;
        out_tokens[i] = t;
        *n_accepted = i;
        if (info) *info = local;
        return SD_OK;
    }
    const float *bonus_row = p + (size_t)k * (size_t)n_vocab;
    double bonus_tot;
    SD_TRY(p_row_total(bonus_row, n_vocab, k, &bonus_tot));
    int32_t t = sd_sample_from(bonus_row, n_vocab, sd_rng_uniform(seed, pos0 + (uint64_t)k, SD_RNG_SAMPLE));
    if (t < 0) return SD_ERR_INTERNAL;
    out_tokens[k] = t;
    *n_accepted = k;
    local.bonus = true;
    if (info) *info = local;
    return SD_OK;
}

/* ---- expectations ---- */

double sd_spec_alpha(const float *p, int32_t n_vocab, const sd_spec_q *q) {
    if (!p || n_vocab <= 0 || !q || q->n <= 0 || !q->ids || !q->probs) return 0.0;
    double p_tot = 0.0;
    for (int32_t v = 0; v < n_vocab; v++)
        if (p[v] > 0.0f) p_tot += p[v];
    if (!(p_tot > 0.0)) return 0.0;
    double alpha = 0.0;
    for (int32_t j = 0; j < q->n; j++) {
        int32_t id = q->ids[j];
        if (id < 0 || id >= n_vocab) continue;
        bool seen = false; /* a repeated id counts once, with its summed mass */
        for (int32_t e = 0; e < j && !seen; e++) seen = q->ids[e] == id;
        if (seen) continue;
        double pv = p[id] > 0.0f ? (double)p[id] / p_tot : 0.0;
        alpha += fmin(pv, sd_spec_q_prob(q, id));
    }
    return alpha;
}

double sd_spec_expected_tokens(double alpha, int32_t k) {
    if (k <= 0) return 1.0;
    if (!(alpha < 1.0)) return (double)k + 1.0;
    if (!(alpha > 0.0)) return 1.0;
    return (1.0 - pow(alpha, (double)k + 1.0)) / (1.0 - alpha);
}
