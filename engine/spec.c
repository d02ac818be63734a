/* spec.c — the verifier math of speculative decoding (see spec.h).
 *
 * The rule (sampled requests): the target's token at position t is the draw
 * plain decoding makes there, x_t = sd_sample_race(p_t, seed, t) (the
 * exponential race, i.e. the Gumbel-max trick, over uniforms fixed by
 * (seed, t) alone). A draft token y_t is accepted when y_t == x_t; at the
 * first mismatch x_t is committed and the rest is discarded; when all K
 * match, x_{K+1} (the bonus) is committed. Exactness is immediate: every
 * committed token is x_t, a draw from the target's own processed
 * distribution with fresh randomness, so the output is plain seeded
 * decoding token for token. The drafter races its own distribution with
 * the same uniforms (sd_spec_draft_coupled), so where q is close to p its
 * draft lands on x_t: with probability >= (1 - TV)/(1 + TV) (Daliri et al.
 * 2024, "Coupling without communication and drafter-invariant speculative
 * decoding"), against 1 - TV for rejection sampling. An inverse-CDF draw
 * in vocabulary order shared by both sides, tried first, is also drafter-
 * invariant but misaligns wherever the cumulative sums drift: acceptance
 * at temperature 1 on the test models fell to 0.12.
 *
 * Why not rejection sampling (accept y with probability min(1, p/q), the
 * replacement from norm(max(0, p - q)), Leviathan et al. 2023), which this
 * file did before: it is exact in distribution but the token committed at
 * a position is a function of the draft (y and q) and of whether the
 * position was drafted at all (a K = 0 step draws from p directly). Every
 * failover changes the drafts — a dead drafter means K = 0 steps, a
 * re-prefill after a verifier or coordinator restart drops a step's drafts,
 * the K policy restarts — so the same seed gave different text (measured:
 * a seeded 1,500-token request diverged at token 627 after a drafter kill).
 * Under the coupled rule the drafts decide only how many positions a step
 * covers, never which token a position gets. The price: acceptance is
 * P(x_t == y_t), somewhat below the optimal sum min(p, q) of rejection
 * sampling where q differs from p (the same for one-hot n-gram drafts:
 * p(y) either way), and one Philox block per 4 vocabulary entries per
 * verified row.
 *
 * Rejection sampling is still offered as a choice (spec_reject.c), per
 * request (sd_sampling.rule) with a service default (specd-coordinator
 * --verify-rule), for callers that want the most accepted drafts and do not
 * need seeded output independent of the drafts; under it a drafter draws
 * its draft from the sparse q it sends (sd_spec_draft_step), which the
 * rule's exactness needs. The coupled rule stays the default.
 *
 * A result depends only on the inputs, never on threads. */
#include "specd/spec.h"
#include "spec_impl.h"

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

sd_status sd_spec_p_row_total(const float *row, int32_t n_vocab, int32_t i, double *total) {
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

sd_status sd_spec_verify(const float *p, int32_t n_vocab, const int32_t *draft, const sd_spec_q *q, int32_t k,
                         uint64_t seed, uint64_t pos0, int32_t *out_tokens, int32_t *n_accepted, sd_spec_info *info) {
    if (!p || n_vocab <= 0 || k < 0 || k > SD_MAX_K || (k > 0 && (!draft || !q)) || !out_tokens || !n_accepted) {
        SD_ERROR("spec: verify needs p, draft, q, outputs, n_vocab > 0 and 0 <= k <= %d (n_vocab %d, k %d)", SD_MAX_K,
                 (int)n_vocab, (int)k);
        return SD_ERR_INVALID_ARG;
    }
    /* Every draft and q is checked before any decision, so a malformed
     * step is refused whole whatever the target says. */
    for (int32_t i = 0; i < k; i++) {
        if (draft[i] < 0 || draft[i] >= n_vocab) {
            SD_ERROR("spec: draft token %d at index %d is outside [0, %d)", (int)draft[i], (int)i, (int)n_vocab);
            return SD_ERR_RANGE;
        }
        double q_tot;
        SD_TRY(sd_spec_q_check(&q[i], n_vocab, i, &q_tot));
    }
    for (int32_t i = 0; i <= k; i++) {
        const float *p_row = p + (size_t)i * (size_t)n_vocab;
        double p_tot;
        SD_TRY(sd_spec_p_row_total(p_row, n_vocab, i, &p_tot));
        int32_t x = sd_sample_race(p_row, n_vocab, seed, pos0 + (uint64_t)i);
        if (x < 0) return SD_ERR_INTERNAL;
        out_tokens[i] = x;
        if (i < k && draft[i] == x) continue;
        *n_accepted = i;
        if (info) *info = (sd_spec_info){.bonus = i == k};
        return SD_OK;
    }
    return SD_ERR_INTERNAL; /* unreachable: row k always returns */
}

sd_status sd_spec_draft_coupled(const float *probs, int32_t n_vocab, int32_t top_n, uint64_t seed, uint64_t position,
                                int32_t *ids, float *q_probs, int32_t *n_out, int32_t *token) {
    if (!token) return SD_ERR_INVALID_ARG;
    SD_TRY(sd_spec_sparsify(probs, n_vocab, top_n, ids, q_probs, n_out));
    int32_t y = sd_sample_race(probs, n_vocab, seed, position);
    if (y < 0) return SD_ERR_INTERNAL;
    int32_t j = 0;
    while (j < *n_out && ids[j] != y) j++;
    if (j == *n_out) {
        /* y lies outside the top_n: it takes the last (least) entry's place
         * with its own mass, so the q sent still contains the draft */
        if (*n_out == top_n)
            j = *n_out - 1;
        else
            (*n_out)++;
        ids[j] = y;
        q_probs[j] = probs[y];
        double kept = 0.0;
        for (int32_t e = 0; e < *n_out; e++) kept += q_probs[e];
        for (int32_t e = 0; e < *n_out; e++) q_probs[e] = (float)((double)q_probs[e] / kept);
    }
    *token = y;
    return SD_OK;
}

sd_status sd_spec_draft_step(const float *logits, int32_t n_vocab, const sd_sampling *s, int32_t top_n,
                             uint64_t position, float *probs, int32_t *ids, float *q_probs, int32_t *n_out,
                             int32_t *token) {
    if (!s || !ids || !q_probs || !n_out || !token || top_n <= 0) {
        SD_ERROR("spec: draft step needs sampling, outputs and top_n > 0 (top_n %d)", (int)top_n);
        return SD_ERR_INVALID_ARG;
    }
    if (sd_sampling_is_greedy(s)) { /* s: taken as given (spec.h) */
        /* the one-hot's sparsification is itself and its race its one entry */
        int32_t y;
        SD_TRY(sd_sample_greedy(logits, n_vocab, &y));
        ids[0] = y;
        q_probs[0] = 1.0f;
        *n_out = 1;
        *token = y;
        return SD_OK;
    }
    SD_TRY(sd_sample_probs_given(logits, n_vocab, s, probs));
    return sd_spec_draft_probs(probs, n_vocab, s, top_n, position, ids, q_probs, n_out, token);
}

sd_status sd_spec_draft_probs(const float *probs, int32_t n_vocab, const sd_sampling *s, int32_t top_n,
                              uint64_t position, int32_t *ids, float *q_probs, int32_t *n_out, int32_t *token) {
    if (!s || !probs || !ids || !q_probs || !n_out || !token || top_n <= 0) return SD_ERR_INVALID_ARG;
    if (s->rule == SD_RULE_REJECTION) {
        /* the rejection rule is exact only for a draft drawn from the q it
         * is sent with: its top_n, drawn on a stream of its own */
        SD_TRY(sd_spec_sparsify(probs, n_vocab, top_n, ids, q_probs, n_out));
        const sd_spec_q q = {*n_out, ids, q_probs};
        *token = sd_spec_q_sample(&q, sd_rng_uniform(s->seed, position, SD_RNG_DRAFT));
        return *token < 0 ? SD_ERR_INTERNAL : SD_OK;
    }
    return sd_spec_draft_coupled(probs, n_vocab, top_n, s->seed, position, ids, q_probs, n_out, token);
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
