/* test_spec_reject.c — the rejection-sampling rule (engine/spec_reject.c,
 * sd_spec_verify_rejection) against its claim: with drafts drawn from q,
 * every committed token follows p.
 *
 *   - chi-square goodness of fit of the first committed token to p_0, of
 *     the second (given a first accepted draft) to p_1, over 40,000
 *     seeded trials each, for a q that differs from p (mass where p has
 *     none, too little where p has much), a one-hot q and q = p: p-value
 *     above 1e-4 (fixed seeds: the outcome is deterministic);
 *   - the acceptance rate of the first draft is sum_v min(p, q) within 5
 *     standard errors (the most any rule accepts; the coupled rule's is
 *     lower where q differs from p);
 *   - negative control: the same test on a wrong residual (the replacement
 *     drawn from p instead of norm(max(0, p - q)), a bug that still looks
 *     plausible) must fail it, p-value below 1e-6: the test can tell;
 *   - a drafter's draft under this rule follows the q it sends
 *     (sd_spec_draft_step), chi-square as above;
 *   - bad input is refused as sd_spec_verify refuses it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "spec_stats.h"
#include "specd/sample.h"
#include "specd/spec.h"

enum { V = 6, TRIALS = 40000 };

/* The rule with the residual replaced by p (the control's bug). */
static int32_t wrong_rule_first(const float *p0, int32_t y, const sd_spec_q *q, uint64_t seed, uint64_t pos) {
    double qy = sd_spec_q_prob(q, y), u = sd_rng_uniform(seed, pos, SD_RNG_ACCEPT);
    if (qy > 0.0 && u * qy < p0[y]) return y;
    return sd_sample_from(p0, V, sd_rng_uniform(seed, pos, SD_RNG_RESIDUAL));
}

/* Runs TRIALS steps of K = 2 with drafts from q (both positions), counting
 * the first committed token, the second when the first draft was accepted,
 * and the first acceptances; wrong: the control's rule (first token only). */
static void run(const float *p, const sd_spec_q *q, bool wrong, uint64_t *first, uint64_t *second, uint64_t *acc0) {
    float residual[V];
    memset(first, 0, V * sizeof *first);
    memset(second, 0, V * sizeof *second);
    *acc0 = 0;
    for (uint64_t seed = 1; seed <= TRIALS; seed++) {
        const uint64_t pos0 = 1000 + seed % 7;
        int32_t draft[2] = {sd_spec_q_sample(q, sd_rng_uniform(seed, pos0, SD_RNG_DRAFT)),
                            sd_spec_q_sample(q, sd_rng_uniform(seed, pos0 + 1, SD_RNG_DRAFT))};
        const sd_spec_q qs[2] = {*q, *q};
        if (wrong) {
            int32_t x = wrong_rule_first(p, draft[0], q, seed, pos0);
            first[x]++;
            *acc0 += x == draft[0];
            continue;
        }
        int32_t out[3], n_acc;
        sd_spec_info info;
        assert_int_equal(sd_spec_verify_rejection(p, V, draft, qs, 2, seed, pos0, residual, out, &n_acc, &info), SD_OK);
        assert_true(n_acc >= 0 && n_acc <= 2);
        assert_true(info.bonus == (n_acc == 2));
        for (int32_t i = 0; i < n_acc; i++) assert_int_equal(out[i], draft[i]);
        first[out[0]]++;
        if (n_acc >= 1) {
            second[out[1]]++;
            (*acc0)++;
        }
    }
}

static double gof(const uint64_t *counts, const float *p) {
    double prob[V];
    for (int32_t v = 0; v < V; v++) prob[v] = p[v];
    return spec_chi2_gof(counts, prob, V, NULL, NULL);
}

static double alpha(const float *p, const sd_spec_q *q) {
    double a = 0.0;
    for (int32_t v = 0; v < V; v++) a += fmin(p[v], sd_spec_q_prob(q, v));
    return a;
}

/* p rows for positions 0, 1 and the bonus 2. */
static const float P[3 * V] = {0.05f, 0.40f, 0.00f, 0.30f, 0.15f, 0.10f, /* p_0 */
                               0.20f, 0.00f, 0.10f, 0.50f, 0.10f, 0.10f, /* p_1 */
                               1.0f,  0,     0,     0,     0,     0};

static void check_rule(const sd_spec_q *q, const char *what) {
    uint64_t first[V], second[V], acc0;
    run(P, q, false, first, second, &acc0);
    double p_first = gof(first, P), p_second = gof(second, P + V);
    uint64_t n_second = 0;
    for (int32_t v = 0; v < V; v++) n_second += second[v];
    double a = alpha(P, q), rate = (double)acc0 / TRIALS, se = sqrt(a * (1.0 - a) / TRIALS);
    print_message("%s: first token p-value %.3g, second (%llu trials) %.3g; acceptance %.4f, sum min(p, q) %.4f\n",
                  what, p_first, (unsigned long long)n_second, p_second, rate, a);
    assert_true(p_first > 1e-4);
    assert_true(n_second < 1000 || p_second > 1e-4);
    assert_true(fabs(rate - a) <= 5.0 * se + 1e-9);
    assert_int_equal(first[2], 0); /* p_0 has no mass there, whatever q says */
}

static void test_rejection_rule_is_exact(void **state) {
    (void)state;
    /* mass on token 2 (p has none), too little on 1, too much on 5 */
    const int32_t ids[4] = {1, 2, 3, 5};
    const float qp[4] = {0.10f, 0.30f, 0.25f, 0.35f};
    sd_spec_q q = {4, ids, qp};
    check_rule(&q, "sparse q unlike p");
    const int32_t one_id[1] = {3};
    const float one[1] = {1.0f};
    sd_spec_q q1 = {1, one_id, one};
    check_rule(&q1, "one-hot q");
    const int32_t all_ids[V] = {0, 1, 2, 3, 4, 5};
    sd_spec_q qp0 = {V, all_ids, P}; /* q = p_0: every first draft accepted */
    uint64_t first[V], second[V], acc0;
    run(P, &qp0, false, first, second, &acc0);
    assert_int_equal(acc0, TRIALS);
    check_rule(&qp0, "q = p");
}

static void test_wrong_residual_fails(void **state) {
    (void)state;
    const int32_t ids[4] = {1, 2, 3, 5};
    const float qp[4] = {0.10f, 0.30f, 0.25f, 0.35f};
    sd_spec_q q = {4, ids, qp};
    uint64_t first[V], second[V], acc0;
    run(P, &q, true, first, second, &acc0);
    double pv = gof(first, P);
    print_message("control (residual drawn from p): first token p-value %.3g\n", pv);
    assert_true(pv < 1e-6);
}

/* Under the rejection rule a drafter's draft follows the q it sends (its
 * top_n, renormalized), as the rule's exactness needs; the coupled race
 * would draw from the whole distribution instead. */
static void test_draft_step_draws_from_q(void **state) {
    (void)state;
    const float logits[V] = {1.0f, 2.0f, 0.5f, 1.5f, -1.0f, 0.0f};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f;
    s.rule = SD_RULE_REJECTION;
    uint64_t counts[V] = {0};
    int32_t ids[3], n_q = 0;
    float probs[V], qp[3];
    for (uint64_t seed = 1; seed <= TRIALS / 2; seed++) {
        s.seed = seed;
        int32_t y;
        assert_int_equal(sd_spec_draft_step(logits, V, &s, 3, 77, probs, ids, qp, &n_q, &y), SD_OK);
        assert_int_equal(n_q, 3);
        counts[y]++;
    }
    double prob[V] = {0};
    for (int32_t j = 0; j < n_q; j++) prob[ids[j]] = qp[j];
    double pv = spec_chi2_gof(counts, prob, V, NULL, NULL);
    print_message("drafts under the rejection rule against their q: p-value %.3g\n", pv);
    assert_true(pv > 1e-4);
}

static void test_bad_inputs(void **state) {
    (void)state;
    float residual[V];
    int32_t out[3], n_acc;
    const int32_t ids[1] = {9};
    const float one[1] = {1.0f};
    sd_spec_q bad_q = {1, ids, one};
    int32_t draft[1] = {1};
    assert_int_equal(sd_spec_verify_rejection(P, V, draft, &bad_q, 1, 1, 0, residual, out, &n_acc, NULL), SD_ERR_RANGE);
    draft[0] = 7;
    const int32_t ok_id[1] = {1};
    sd_spec_q q = {1, ok_id, one};
    assert_int_equal(sd_spec_verify_rejection(P, V, draft, &q, 1, 1, 0, residual, out, &n_acc, NULL), SD_ERR_RANGE);
    draft[0] = 1;
    assert_int_equal(sd_spec_verify_rejection(P, V, draft, &q, 1, 1, 0, NULL, out, &n_acc, NULL), SD_ERR_INVALID_ARG);
    /* K = 0 is plain sampling from p_0: the race's draw */
    assert_int_equal(sd_spec_verify_rejection(P, V, NULL, NULL, 0, 5, 9, NULL, out, &n_acc, NULL), SD_OK);
    assert_int_equal(n_acc, 0);
    assert_int_equal(out[0], sd_sample_race(P, V, 5, 9));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejection_rule_is_exact),
        cmocka_unit_test(test_wrong_residual_fails),
        cmocka_unit_test(test_draft_step_draws_from_q),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
