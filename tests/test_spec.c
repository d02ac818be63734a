/* test_spec.c — unit tests of the verifier math (engine/spec.c) on
 * hand-made p and q, and of the chi-square p-values the exactness test uses.
 *
 * Every edge case named in spec.h/spec.c has a test here: p = q, disjoint
 * supports, q(y) = 0 and y absent from q (drafter bugs, rejected and counted),
 * residual mass 0 (fallback to p), one-hot q, k = 0 and the bonus draw (both
 * equal to plain decoding's draw at that position), the RNG keying of the
 * acceptance test and of the residual draw, sparsification, and refusal of
 * malformed inputs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "spec_stats.h"
#include "specd/sample.h"
#include "specd/spec.h"

static int n_warn_lines, n_error_lines;
static void count_sink(sd_log_level level, const char *line, void *user) {
    (void)line;
    (void)user;
    if (level == SD_LOG_WARN) n_warn_lines++;
    if (level == SD_LOG_ERROR) n_error_lines++;
}

static int setup(void **state) {
    (void)state;
    n_warn_lines = n_error_lines = 0;
    sd_log_set(count_sink, NULL, SD_LOG_WARN, "test_spec");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    sd_log_set(NULL, NULL, SD_LOG_INFO, "test_spec");
    return 0;
}

#define V_MAX 16

/* ---- chi-square p-values against closed forms ---- */

static void test_chi2_pvalue_closed_forms(void **state) {
    (void)state;
    const double xs[] = {0.01, 0.5, 1.0, 2.5, 7.0, 15.0, 40.0, 90.0};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        double x = xs[i];
        /* df = 2: Q = exp(-x/2); df = 4: exp(-x/2)(1 + x/2); df = 1: erfc(sqrt(x/2)). */
        assert_true(fabs(spec_chi2_pvalue(x, 2) - exp(-x / 2)) <= 1e-12 * fmax(1.0, 0.0) + 1e-9 * exp(-x / 2));
        double q4 = exp(-x / 2) * (1 + x / 2);
        assert_true(fabs(spec_chi2_pvalue(x, 4) - q4) <= 1e-9 * q4 + 1e-15);
        double q1 = erfc(sqrt(x / 2));
        assert_true(fabs(spec_chi2_pvalue(x, 1) - q1) <= 1e-9 * q1 + 1e-15);
    }
    /* Published critical values: df 1 at 0.05 is 3.841459, df 3 at 1e-4 is 21.10751, df 10 at 1e-3 is 29.5883. */
    assert_true(fabs(spec_chi2_pvalue(3.841459, 1) - 0.05) < 1e-6);
    assert_true(fabs(spec_chi2_pvalue(21.10751, 3) - 1e-4) < 1e-8);
    assert_true(fabs(spec_chi2_pvalue(29.5883, 10) - 1e-3) < 1e-7);
    assert_true(spec_chi2_pvalue(0.0, 5) == 1.0);
}

static void test_chi2_gof_basics(void **state) {
    (void)state;
    const double prob[4] = {0.25, 0.25, 0.5, 0.0};
    const uint64_t fair[4] = {2500, 2500, 5000, 0};
    double stat;
    int32_t df;
    assert_true(spec_chi2_gof(fair, prob, 4, &stat, &df) > 0.999);
    assert_int_equal(df, 2);
    const uint64_t skewed[4] = {2000, 3000, 5000, 0};
    assert_true(spec_chi2_gof(skewed, prob, 4, &stat, &df) < 1e-10);
    const uint64_t impossible[4] = {2500, 2500, 4999, 1}; /* a count where p = 0 */
    assert_true(spec_chi2_gof(impossible, prob, 4, &stat, &df) == 0.0);
    const uint64_t a[3] = {1000, 2000, 3000}, b[3] = {500, 1000, 1500}, c[3] = {1500, 1500, 1500};
    assert_true(spec_chi2_two_sample(a, b, 3, &stat, &df) > 0.99);
    assert_true(spec_chi2_two_sample(a, c, 3, &stat, &df) < 1e-10);
}

/* ---- sparsification ---- */

static void test_sparsify(void **state) {
    (void)state;
    const float probs[8] = {0.05f, 0.3f, 0.0f, 0.2f, 0.2f, 0.1f, 0.0f, 0.15f};
    int32_t ids[8];
    float q[8];
    int32_t n = 0;
    assert_int_equal(sd_spec_sparsify(probs, 8, 3, ids, q, &n), SD_OK);
    assert_int_equal(n, 3);
    /* Best first; the tie 0.2 at ids 3 and 4 goes to the lower id first. */
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 4);
    assert_true(fabsf(q[0] - 0.3f / 0.7f) < 1e-6f);
    assert_true(fabsf(q[1] - 0.2f / 0.7f) < 1e-6f);
    assert_true(fabsf(q[0] + q[1] + q[2] - 1.0f) < 1e-6f);
    /* top_n above the support keeps every positive entry and no zero. */
    assert_int_equal(sd_spec_sparsify(probs, 8, 8, ids, q, &n), SD_OK);
    assert_int_equal(n, 6);
    for (int32_t j = 0; j < n; j++) assert_true(ids[j] != 2 && ids[j] != 6);
    for (int32_t j = 1; j < n; j++) assert_true(q[j - 1] >= q[j]);
    /* The tie is cut by id: with top_n 2, id 3 is kept and id 4 dropped. */
    assert_int_equal(sd_spec_sparsify(probs, 8, 2, ids, q, &n), SD_OK);
    assert_int_equal(ids[1], 3);
    /* Bad inputs. */
    const float zeros[3] = {0, 0, 0};
    const float negative[3] = {0.5f, -0.1f, 0.6f};
    assert_int_equal(sd_spec_sparsify(zeros, 3, 2, ids, q, &n), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_spec_sparsify(negative, 3, 2, ids, q, &n), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_spec_sparsify(probs, 8, 0, ids, q, &n), SD_ERR_INVALID_ARG);
    assert_true(n_error_lines >= 3);
}

static void test_sparsify_large_vocab(void **state) {
    (void)state;
    enum { V = 5000, TOP = 16 };
    static float probs[V];
    double total = 0;
    for (int32_t v = 0; v < V; v++) {
        probs[v] = (float)((v * 7919) % V + 1); /* a permutation of 1..V: distinct values */
        total += probs[v];
    }
    for (int32_t v = 0; v < V; v++) probs[v] = (float)(probs[v] / total);
    int32_t ids[TOP];
    float q[TOP];
    int32_t n;
    assert_int_equal(sd_spec_sparsify(probs, V, TOP, ids, q, &n), SD_OK);
    assert_int_equal(n, TOP);
    /* The kept ones are exactly the values V, V-1, ..., V-TOP+1 in that order. */
    for (int32_t j = 0; j < TOP; j++) assert_int_equal((ids[j] * 7919) % V + 1, V - j);
}

static void test_q_sample_and_prob(void **state) {
    (void)state;
    const int32_t ids[3] = {7, 2, 7};
    const float pr[3] = {0.25f, 0.5f, 0.25f};
    sd_spec_q q = {3, ids, pr};
    assert_true(fabs(sd_spec_q_prob(&q, 7) - 0.5) < 1e-12); /* repeated id: summed */
    assert_true(fabs(sd_spec_q_prob(&q, 2) - 0.5) < 1e-12);
    assert_true(sd_spec_q_prob(&q, 3) == 0.0);
    assert_int_equal(sd_spec_q_sample(&q, 0.0), 7);
    assert_int_equal(sd_spec_q_sample(&q, 0.3), 2);
    assert_int_equal(sd_spec_q_sample(&q, 0.8), 7);
    sd_spec_q empty = {0, ids, pr};
    assert_int_equal(sd_spec_q_sample(&empty, 0.5), -1);
}

/* ---- greedy ---- */

static void test_greedy(void **state) {
    (void)state;
    const int32_t target[5] = {4, 9, 1, 3, 8};
    int32_t out[5], n_acc = -1;
    const int32_t all[4] = {4, 9, 1, 3};
    assert_int_equal(sd_spec_verify_greedy(target, all, 4, out, &n_acc), SD_OK);
    assert_int_equal(n_acc, 4);
    assert_memory_equal(out, target, sizeof target); /* four accepted + the bonus */
    const int32_t mid[4] = {4, 9, 2, 3};
    assert_int_equal(sd_spec_verify_greedy(target, mid, 4, out, &n_acc), SD_OK);
    assert_int_equal(n_acc, 2);
    assert_int_equal(out[2], 1); /* the target's token replaces the mismatch */
    const int32_t first[4] = {0, 9, 1, 3};
    assert_int_equal(sd_spec_verify_greedy(target, first, 4, out, &n_acc), SD_OK);
    assert_int_equal(n_acc, 0);
    assert_int_equal(out[0], 4);
    assert_int_equal(sd_spec_verify_greedy(target, NULL, 0, out, &n_acc), SD_OK);
    assert_int_equal(n_acc, 0);
    assert_int_equal(out[0], 4);
    assert_int_equal(sd_spec_verify_greedy(target, all, -1, out, &n_acc), SD_ERR_INVALID_ARG);
}

/* ---- stochastic (coupled): edge cases ---- */

/* One position (k = 1) with p row 0, bonus row 1. */
static sd_status verify1(const float *p, int32_t n_vocab, int32_t y, const sd_spec_q *q, uint64_t seed, int32_t out[2],
                         int32_t *n_acc, sd_spec_info *info) {
    return sd_spec_verify(p, n_vocab, &y, q, 1, seed, 100, out, n_acc, info);
}

static void test_p_equals_q_always_accepts(void **state) {
    (void)state;
    /* The drafter draws with the verifier's uniform over the same
     * distribution, so its draft is the target's draw at every position. */
    enum { V = 5, K = 3 };
    const float dist[V] = {0.1f, 0.4f, 0.2f, 0.25f, 0.05f};
    float p[(K + 1) * V];
    for (int32_t i = 0; i <= K; i++) memcpy(p + i * V, dist, sizeof dist);
    int32_t ids[K][V];
    float qp[K][V];
    sd_spec_q q[K];
    for (uint64_t seed = 0; seed < 2000; seed++) {
        int32_t draft[K], out[K + 1], n_acc, n_q;
        for (int32_t i = 0; i < K; i++) {
            assert_int_equal(sd_spec_draft_coupled(dist, V, V, seed, 50 + (uint64_t)i, ids[i], qp[i], &n_q, &draft[i]),
                             SD_OK);
            q[i] = (sd_spec_q){n_q, ids[i], qp[i]};
        }
        sd_spec_info info;
        assert_int_equal(sd_spec_verify(p, V, draft, q, K, seed, 50, out, &n_acc, &info), SD_OK);
        assert_int_equal(n_acc, K);
        assert_true(info.bonus);
        assert_memory_equal(out, draft, sizeof draft);
    }
}

static void test_disjoint_supports_always_reject(void **state) {
    (void)state;
    enum { V = 6 };
    const float p[2 * V] = {0.5f, 0, 0.3f, 0, 0.2f, 0, /* bonus */ 1, 0, 0, 0, 0, 0};
    const int32_t ids[3] = {1, 3, 5};
    const float qp[3] = {0.2f, 0.3f, 0.5f};
    sd_spec_q q = {3, ids, qp};
    uint64_t counts[V] = {0};
    for (uint64_t seed = 0; seed < 3000; seed++) {
        int32_t y = sd_spec_q_sample(&q, sd_rng_uniform(seed, 100, SD_RNG_DRAFT));
        int32_t out[2], n_acc;
        sd_spec_info info;
        assert_int_equal(verify1(p, V, y, &q, seed, out, &n_acc, &info), SD_OK);
        assert_int_equal(n_acc, 0);
        assert_false(info.bonus);
        assert_int_equal(out[0], sd_sample_race(p, V, seed, 100));
        counts[out[0]]++;
    }
    assert_true(counts[1] == 0 && counts[3] == 0 && counts[5] == 0);
    assert_true(counts[0] > counts[2] && counts[2] > counts[4] && counts[4] > 0);
}

/* Fills p[rows][V] with random distributions, some entries zero. */
static void random_rows(float *p, int32_t rows, int32_t V, uint64_t seed) {
    for (int32_t r = 0; r < rows; r++) {
        double tot = 0.0;
        for (int32_t v = 0; v < V; v++) {
            double u = sd_rng_uniform(seed, (uint64_t)(r * V + v), SD_RNG_DRAFT);
            p[r * V + v] = u < 0.3 ? 0.0f : (float)u;
            tot += p[r * V + v];
        }
        if (!(tot > 0.0)) p[r * V] = 1.0f;
    }
}

static void test_committed_tokens_do_not_depend_on_drafts(void **state) {
    (void)state;
    /* The property failover needs: whatever was drafted and however many
     * positions a step covers, the token committed at position t is the
     * draw plain decoding makes at t. Rejection sampling (accept with
     * min(1, p/q), replacement from the residual) fails this. */
    enum { V = 7, K = 5 };
    float p[(K + 1) * V];
    const int32_t all_ids[V] = {0, 1, 2, 3, 4, 5, 6};
    const float flat[V] = {1, 1, 1, 1, 1, 1, 1};
    sd_spec_q q[K];
    for (int32_t i = 0; i < K; i++) q[i] = (sd_spec_q){V, all_ids, flat};
    for (uint64_t seed = 0; seed < 3000; seed++) {
        random_rows(p, K + 1, V, seed * 7919u);
        int32_t plain[K + 1];
        for (int32_t i = 0; i <= K; i++) plain[i] = sd_sample_race(p + i * V, V, seed, 200 + (uint64_t)i);
        int32_t k = (int32_t)(seed % (K + 1)), draft[K], out[K + 1], n_acc;
        /* drafts that match the plain draws for a while, then anything */
        int32_t n_match = (int32_t)((seed / 7) % (K + 1));
        for (int32_t i = 0; i < k; i++)
            draft[i] = i < n_match ? plain[i] : (int32_t)(sd_rng_uniform(seed, (uint64_t)i, SD_RNG_RESIDUAL) * V);
        assert_int_equal(sd_spec_verify(p, V, draft, q, k, seed, 200, out, &n_acc, NULL), SD_OK);
        assert_true(n_acc >= (n_match < k ? n_match : k));
        for (int32_t i = 0; i <= n_acc; i++) assert_int_equal(out[i], plain[i]);
    }
}

static void test_one_hot_q(void **state) {
    (void)state;
    enum { V = 4, N = 40000 };
    const float p[2 * V] = {0.5f, 0.3f, 0.2f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
    const int32_t id = 0;
    const float one = 1.0f;
    sd_spec_q q = {1, &id, &one};
    int32_t accepted = 0;
    for (uint64_t seed = 0; seed < N; seed++) {
        int32_t out[2], n_acc;
        sd_spec_info info;
        assert_int_equal(verify1(p, V, 0, &q, seed, out, &n_acc, &info), SD_OK);
        int32_t x = sd_sample_race(p, V, seed, 100);
        assert_int_equal(n_acc, x == 0 ? 1 : 0);
        assert_int_equal(out[0], x);
        accepted += n_acc;
    }
    /* An n-gram draft is accepted with probability p(y) = 0.5, as under
     * rejection sampling; within 5 standard deviations (sd = 0.0025). */
    assert_true(fabs((double)accepted / N - 0.5) < 5 * 0.0025);
}

static void test_draft_coupled(void **state) {
    (void)state;
    enum { V = 6, TOP = 2 };
    const float probs[V] = {0.05f, 0.4f, 0.1f, 0.3f, 0.1f, 0.05f};
    int32_t n_tail = 0;
    for (uint64_t seed = 0; seed < 3000; seed++) {
        int32_t ids[TOP], n_q, y;
        float qp[TOP];
        assert_int_equal(sd_spec_draft_coupled(probs, V, TOP, seed, 9, ids, qp, &n_q, &y), SD_OK);
        assert_int_equal(y, sd_sample_race(probs, V, seed, 9));
        assert_int_equal(n_q, TOP);
        sd_spec_q q = {n_q, ids, qp};
        assert_true(sd_spec_q_prob(&q, y) > 0.0); /* the draft is always in the q sent */
        assert_true(fabs((double)qp[0] + (double)qp[1] - 1.0) < 1e-6);
        if (y != 1 && y != 3) {
            n_tail++;
            assert_int_equal(ids[0], 1); /* the best entry stays, the least gave way */
            assert_int_equal(ids[1], y);
        }
    }
    assert_true(n_tail > 0);
}

/* sd_spec_draft_step: sd_sample_probs + sd_spec_draft_coupled, and for a
 * greedy request the same one-hot from its shortcut. */
static void test_draft_step(void **state) {
    (void)state;
    enum { V = 40, TOP = 4 };
    float logits[V], probs[V], probs2[V];
    uint64_t rng = 7;
    for (int trial = 0; trial < 300; trial++) {
        for (int v = 0; v < V; v++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            logits[v] = (float)((rng >> 40) % 32) / 4.0f - 3.0f; /* coarse: equal maxima happen */
        }
        if (trial % 5 == 0) logits[trial % V] = -INFINITY;
        sd_sampling s = sd_sampling_default();
        s.temperature = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 1.0f : 0.7f;
        s.top_p = trial % 2 ? 0.9f : 1.0f;
        s.seed = (uint64_t)trial;
        int32_t ids[TOP], ids2[TOP], n, n2, y, y2;
        float qp[TOP], qp2[TOP];
        assert_int_equal(sd_spec_draft_step(logits, V, &s, TOP, 11, probs, ids, qp, &n, &y), SD_OK);
        assert_int_equal(sd_sample_probs(logits, V, &s, probs2), SD_OK);
        assert_int_equal(sd_spec_draft_coupled(probs2, V, TOP, s.seed, 11, ids2, qp2, &n2, &y2), SD_OK);
        assert_int_equal(y, y2);
        assert_int_equal(n, n2);
        assert_memory_equal(ids, ids2, (size_t)n * sizeof *ids);
        assert_memory_equal(qp, qp2, (size_t)n * sizeof *qp);
    }
    const float bad[3] = {0.0f, NAN, 1.0f};
    sd_sampling g = sd_sampling_default();
    g.temperature = 0.0f;
    int32_t ids[TOP], n, y;
    float qp[TOP];
    const int before = n_error_lines;
    assert_int_equal(sd_spec_draft_step(bad, 3, &g, TOP, 0, probs, ids, qp, &n, &y), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_spec_draft_step(logits, V, &g, 0, 0, probs, ids, qp, &n, &y), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_spec_draft_step(logits, V, NULL, TOP, 0, probs, ids, qp, &n, &y), SD_ERR_INVALID_ARG);
    assert_int_equal(n_error_lines, before + 3);
}

static void test_k0_is_plain_sampling(void **state) {
    (void)state;
    enum { V = 5 };
    const float p[V] = {0.1f, 0.2f, 0.3f, 0.15f, 0.25f};
    for (uint64_t seed = 0; seed < 1000; seed++) {
        int32_t out[1], n_acc = -1;
        assert_int_equal(sd_spec_verify(p, V, NULL, NULL, 0, seed, 7, out, &n_acc, NULL), SD_OK);
        assert_int_equal(n_acc, 0);
        assert_int_equal(out[0], sd_sample_race(p, V, seed, 7));
    }
}

static void test_one_hot_p_is_greedy(void **state) {
    (void)state;
    /* Temperature 0 makes p one-hot: stochastic verification then accepts
     * exactly the argmax and replaces a mismatch by the argmax, like greedy. */
    enum { V = 4, K = 3 };
    const float p[(K + 1) * V] = {0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1};
    const int32_t target[K + 1] = {1, 2, 0, 3};
    const int32_t all_ids[V] = {0, 1, 2, 3};
    const float flat[V] = {0.25f, 0.25f, 0.25f, 0.25f};
    sd_spec_q q[K] = {{V, all_ids, flat}, {V, all_ids, flat}, {V, all_ids, flat}};
    for (uint64_t seed = 0; seed < 500; seed++) {
        int32_t draft[K], out[K + 1], n_acc, g_out[K + 1], g_acc;
        for (int32_t i = 0; i < K; i++) draft[i] = sd_spec_q_sample(&q[i], sd_rng_uniform(seed, 10 + i, SD_RNG_DRAFT));
        assert_int_equal(sd_spec_verify(p, V, draft, q, K, seed, 10, out, &n_acc, NULL), SD_OK);
        assert_int_equal(sd_spec_verify_greedy(target, draft, K, g_out, &g_acc), SD_OK);
        assert_int_equal(n_acc, g_acc);
        assert_memory_equal(out, g_out, (size_t)(n_acc + 1) * sizeof *out);
    }
}

static void test_bad_inputs(void **state) {
    (void)state;
    enum { V = 3 };
    const float p[2 * V] = {0.3f, 0.3f, 0.4f, 0.3f, 0.3f, 0.4f};
    const int32_t ids[1] = {1}, bad_ids[1] = {3};
    const float one[1] = {1.0f}, negative[1] = {-1.0f};
    sd_spec_q q = {1, ids, one}, q_bad_id = {1, bad_ids, one}, q_neg = {1, ids, negative};
    int32_t out[2], n_acc;
    assert_int_equal(verify1(p, V, 5, &q, 1, out, &n_acc, NULL), SD_ERR_RANGE);
    assert_int_equal(verify1(p, V, 1, &q_bad_id, 1, out, &n_acc, NULL), SD_ERR_RANGE);
    assert_int_equal(verify1(p, V, 1, &q_neg, 1, out, &n_acc, NULL), SD_ERR_INVALID_ARG);
    const float p_nan[2 * V] = {NAN, 0.5f, 0.5f, 0.3f, 0.3f, 0.4f};
    assert_int_equal(verify1(p_nan, V, 1, &q, 1, out, &n_acc, NULL), SD_ERR_INVALID_ARG);
    int32_t draft[1] = {1};
    assert_int_equal(sd_spec_verify(p, V, draft, &q, SD_MAX_K + 1, 1, 0, out, &n_acc, NULL), SD_ERR_INVALID_ARG);
    assert_int_equal(n_error_lines, 5);
}

static void test_alpha_and_expected_tokens(void **state) {
    (void)state;
    const float p[3] = {0.5f, 0.3f, 0.2f};
    const int32_t ids[3] = {0, 1, 2};
    const float qp[3] = {0.2f, 0.3f, 0.5f};
    sd_spec_q q = {3, ids, qp};
    assert_true(fabs(sd_spec_alpha(p, 3, &q) - 0.7) < 1e-7);
    assert_true(fabs(sd_spec_expected_tokens(0.5, 3) - 1.875) < 1e-12);
    assert_true(sd_spec_expected_tokens(1.0, 4) == 5.0);
    assert_true(sd_spec_expected_tokens(0.0, 4) == 1.0);
    assert_true(sd_spec_expected_tokens(0.9, 0) == 1.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chi2_pvalue_closed_forms),
        cmocka_unit_test(test_chi2_gof_basics),
        cmocka_unit_test_setup_teardown(test_sparsify, setup, teardown),
        cmocka_unit_test(test_sparsify_large_vocab),
        cmocka_unit_test(test_q_sample_and_prob),
        cmocka_unit_test_setup_teardown(test_greedy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_p_equals_q_always_accepts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disjoint_supports_always_reject, setup, teardown),
        cmocka_unit_test_setup_teardown(test_committed_tokens_do_not_depend_on_drafts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_hot_q, setup, teardown),
        cmocka_unit_test_setup_teardown(test_draft_coupled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_draft_step, setup, teardown),
        cmocka_unit_test(test_k0_is_plain_sampling),
        cmocka_unit_test(test_one_hot_p_is_greedy),
        cmocka_unit_test_setup_teardown(test_bad_inputs, setup, teardown),
        cmocka_unit_test(test_alpha_and_expected_tokens),
    };
    return cmocka_run_group_tests_name("spec", tests, NULL, NULL);
}
