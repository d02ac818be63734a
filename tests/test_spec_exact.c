/* test_spec_exact.c — exactness of one speculative step, by simulation.
 *
 * For several small vocabularies and p/q pairs (close, far, disjoint, with
 * zeros, one-hot q as n-gram drafts give, q sparsified to its top 5, p = q)
 * it simulates N = 10^6 steps of K = 3 drafted tokens with independent
 * per-position p_1..p_4 and q_1..q_3: the drafter draws y_i from q_i with
 * the verifier's race (sd_sample_race: the coupled rule of spec.h),
 * sd_spec_verify decides. Three chi-square goodness-of-fit
 * tests per case, each at significance 1e-4:
 *   - the first emitted token follows p_1;
 *   - the second emitted token, when the first was accepted, follows p_2;
 *   - the number accepted follows theory: P(n = j) = a_1..a_j (1 - a_{j+1}),
 *     P(n = K) = a_1..a_K with a_i = sum_v 1 / sum_w max(p_w/p_v, q_w/q_v),
 *     the agreement of two exponential races over shared uniforms (the
 *     integral over E_v of prod_w P(E_w > E_v max(p_w/p_v, q_w/q_v))),
 *     computed here from the dense distributions, independently of the
 *     library.
 * Seeds are fixed, so the outcome is deterministic. The same harness is then
 * run against a deliberately wrong verifier (the real one, except that after
 * a rejection the replacement is a fresh draw from p instead of the
 * target's own coupled draw)
 * over N/4 steps, and the suite asserts the test rejects it wherever the
 * bias is large enough to be seen (noncentrality >= 200, where a chi-square
 * test at 1e-4 misses with negligible probability) and that this covers at
 * least four cases, so the test demonstrably can fail.
 * SPEC_EXACT_N overrides N (for a quick look; the default is what is tested). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "spec_stats.h"
#include "specd/sample.h"
#include "specd/spec.h"

#define SIGNIFICANCE 1e-4
#define K            3
#define V_MAX        24
#define DEFAULT_N    1000000

typedef struct spec_case {
    const char *name;
    int32_t n_vocab;
    float p[K + 1][V_MAX];         /* target rows, position 1..K+1 (padded) */
    float p_flat[(K + 1) * V_MAX]; /* the same rows packed as [K+1][n_vocab], what the verifier reads */
    float q_dense[K][V_MAX];       /* proposal rows as a dense vector (test's reference) */
    int32_t q_ids[K][V_MAX];       /* the sparse q handed to the verifier */
    float q_probs[K][V_MAX];
    sd_spec_q q[K];
} spec_case;

/* splitmix64: the test's own generator for building distributions. */
static uint64_t mix_state;
static double rand01(void) {
    uint64_t z = (mix_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void normalize(float *row, int32_t n) {
    double t = 0;
    for (int32_t v = 0; v < n; v++) t += row[v];
    for (int32_t v = 0; v < n; v++) row[v] = (float)(row[v] / t);
}

/* Sparse q from a dense row: every positive entry, in id order. */
static void sparse_from_dense(spec_case *c, int32_t i) {
    int32_t n = 0;
    for (int32_t v = 0; v < c->n_vocab; v++) {
        if (c->q_dense[i][v] > 0) {
            c->q_ids[i][n] = v;
            c->q_probs[i][n] = c->q_dense[i][v];
            n++;
        }
    }
    c->q[i] = (sd_spec_q){n, c->q_ids[i], c->q_probs[i]};
}

typedef enum { KIND_CLOSE, KIND_FAR, KIND_DISJOINT, KIND_ZEROS, KIND_ONE_HOT, KIND_SPARSIFIED, KIND_EQUAL } case_kind;

static void build_case(spec_case *c, case_kind kind, const char *name, int32_t n_vocab, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->name = name;
    c->n_vocab = n_vocab;
    mix_state = seed;
    int32_t V = n_vocab;
    for (int32_t i = 0; i <= K; i++) {
        for (int32_t v = 0; v < V; v++) {
            double w = 0.1 + rand01();
            if (kind == KIND_FAR) w = exp(-0.6 * v) * (0.5 + rand01()) + 0.02;
            if (kind == KIND_DISJOINT && v % 2) w = 0;
            if (kind == KIND_ZEROS && v % 3 == 0) w = 0;
            if (kind == KIND_ONE_HOT && v == (i * 5 + 1) % V) w = 0;
            c->p[i][v] = (float)w;
        }
        normalize(c->p[i], V);
    }
    for (int32_t i = 0; i < K; i++) {
        float *q = c->q_dense[i];
        switch (kind) {
        case KIND_CLOSE:
            for (int32_t v = 0; v < V; v++) q[v] = (float)(c->p[i][v] * (0.85 + 0.3 * rand01()));
            normalize(q, V);
            sparse_from_dense(c, i);
            break;
        case KIND_FAR:
            for (int32_t v = 0; v < V; v++) q[v] = (float)(exp(-0.6 * (V - 1 - v)) * (0.5 + rand01()) + 0.02);
            normalize(q, V);
            sparse_from_dense(c, i);
            break;
        case KIND_DISJOINT:
            for (int32_t v = 0; v < V; v++) q[v] = v % 2 ? (float)(0.1 + rand01()) : 0.0f;
            normalize(q, V);
            sparse_from_dense(c, i);
            break;
        case KIND_ZEROS:
            for (int32_t v = 0; v < V; v++) q[v] = v % 3 == 1 ? 0.0f : (float)(0.1 + rand01());
            normalize(q, V);
            sparse_from_dense(c, i);
            break;
        case KIND_ONE_HOT: {
            int32_t y;
            do y = (int32_t)(rand01() * V);
            while (c->p[i][y] == 0.0f);
            q[y] = 1.0f;
            sparse_from_dense(c, i);
            break;
        }
        case KIND_SPARSIFIED: {
            /* A dense draft near p, sparsified to its top 5 by the library:
             * q is what the drafter would report and sample from. */
            float draft[V_MAX];
            for (int32_t v = 0; v < V; v++) draft[v] = (float)(c->p[i][v] * (0.5 + rand01()));
            normalize(draft, V);
            int32_t n = 0;
            assert_int_equal(sd_spec_sparsify(draft, V, 5, c->q_ids[i], c->q_probs[i], &n), SD_OK);
            assert_int_equal(n, 5);
            c->q[i] = (sd_spec_q){n, c->q_ids[i], c->q_probs[i]};
            for (int32_t j = 0; j < n; j++) q[c->q_ids[i][j]] = c->q_probs[i][j];
            break;
        }
        case KIND_EQUAL:
            memcpy(q, c->p[i], sizeof(float) * (size_t)V);
            sparse_from_dense(c, i);
            break;
        }
    }
    for (int32_t i = 0; i <= K; i++) memcpy(c->p_flat + i * V, c->p[i], sizeof(float) * (size_t)V);
}

/* ---- theory, from the dense rows ---- */

static void row_probs(const float *row, int32_t n, double *out) {
    double t = 0;
    for (int32_t v = 0; v < n; v++) t += row[v];
    for (int32_t v = 0; v < n; v++) out[v] = row[v] / t;
}

/* P(x == y == v) for the coupled races at one position:
 * 1 / sum_w max(p_w/p_v, q_w/q_v) (0 unless both give v mass). */
static double overlap_of(const spec_case *c, int32_t i, int32_t v) {
    double p[V_MAX] = {0}, q[V_MAX] = {0}, den = 0;
    row_probs(c->p[i], c->n_vocab, p);
    row_probs(c->q_dense[i], c->n_vocab, q);
    if (!(p[v] > 0) || !(q[v] > 0)) return 0.0;
    for (int32_t w = 0; w < c->n_vocab; w++) den += fmax(p[w] / p[v], q[w] / q[v]);
    return 1.0 / den;
}

static double alpha_of(const spec_case *c, int32_t i) {
    double a = 0;
    for (int32_t v = 0; v < c->n_vocab; v++) a += overlap_of(c, i, v);
    return a;
}

/* ---- the harness ---- */

typedef sd_status (*verify_fn)(const spec_case *c, const int32_t *draft, uint64_t seed, uint64_t pos0, int32_t *out,
                               int32_t *n_acc);

static sd_status verify_real(const spec_case *c, const int32_t *draft, uint64_t seed, uint64_t pos0, int32_t *out,
                             int32_t *n_acc) {
    return sd_spec_verify(c->p_flat, c->n_vocab, draft, c->q, K, seed, pos0, out, n_acc, NULL);
}

/* Wrong on purpose: replaces the draw at a rejection by a fresh draw from p. */
static sd_status verify_wrong(const spec_case *c, const int32_t *draft, uint64_t seed, uint64_t pos0, int32_t *out,
                              int32_t *n_acc) {
    sd_status st = verify_real(c, draft, seed, pos0, out, n_acc);
    if (st == SD_OK && *n_acc < K)
        out[*n_acc] =
            sd_sample_from(c->p[*n_acc], c->n_vocab, sd_rng_uniform(seed, pos0 + (uint64_t)*n_acc, SD_RNG_RESIDUAL));
    return st;
}

typedef struct harness_result {
    double p_first, p_second, p_accepted;
} harness_result;

static harness_result run_harness(const spec_case *c, verify_fn fn, uint64_t n_steps, uint64_t base_seed) {
    uint64_t first[V_MAX] = {0}, second[V_MAX] = {0}, accepted[K + 1] = {0};
    for (uint64_t t = 0; t < n_steps; t++) {
        uint64_t seed = base_seed * 0x100000001B3ull + t;
        uint64_t pos0 = 17 + (t & 1023);
        int32_t draft[K], out[K + 1], n_acc = -1;
        for (int32_t i = 0; i < K; i++) {
            draft[i] = sd_sample_race(c->q_dense[i], c->n_vocab, seed, pos0 + (uint64_t)i);
            assert_true(draft[i] >= 0);
        }
        assert_int_equal(fn(c, draft, seed, pos0, out, &n_acc), SD_OK);
        assert_true(n_acc >= 0 && n_acc <= K);
        first[out[0]]++;
        if (n_acc >= 1) second[out[1]]++;
        accepted[n_acc]++;
    }
    double p1[V_MAX], p2[V_MAX], pn[K + 1], a[K];
    row_probs(c->p[0], c->n_vocab, p1);
    row_probs(c->p[1], c->n_vocab, p2);
    for (int32_t i = 0; i < K; i++) a[i] = alpha_of(c, i);
    double reach = 1.0;
    for (int32_t j = 0; j < K; j++) {
        pn[j] = reach * (1.0 - a[j]);
        reach *= a[j];
    }
    pn[K] = reach;
    harness_result r;
    double s1, s2, s3;
    int32_t d1, d2, d3;
    r.p_first = spec_chi2_gof(first, p1, c->n_vocab, &s1, &d1);
    r.p_second = accepted[0] == n_steps ? 1.0 : spec_chi2_gof(second, p2, c->n_vocab, &s2, &d2);
    r.p_accepted = spec_chi2_gof(accepted, pn, K + 1, &s3, &d3);
    print_message("  %-10s %s: alpha %.3f %.3f %.3f | first token chi2 %.1f df %d p %.3g | accepted chi2 %.1f "
                  "df %d p %.3g | second p %.3g\n",
                  c->name, fn == verify_real ? "real " : "WRONG", a[0], a[1], a[2], s1, (int)d1, r.p_first, s3, (int)d3,
                  r.p_accepted, r.p_second);
    return r;
}

static uint64_t steps_from_env(void) {
    const char *s = getenv("SPEC_EXACT_N");
    if (s && *s) {
        long long n = atoll(s);
        if (n > 0) return (uint64_t)n;
    }
    return DEFAULT_N;
}

/* Noncentrality of the wrong verifier's first-token distribution against
 * p_1: N * sum (w - p)^2 / p with w = overlap(v) + (1 - alpha) p. */
static double wrong_noncentrality(const spec_case *c, uint64_t n_steps) {
    double p[V_MAX], a = alpha_of(c, 0), lambda = 0;
    row_probs(c->p[0], c->n_vocab, p);
    for (int32_t v = 0; v < c->n_vocab; v++) {
        if (p[v] <= 0) continue;
        double w = overlap_of(c, 0, v) + (1 - a) * p[v];
        lambda += (double)n_steps * (w - p[v]) * (w - p[v]) / p[v];
    }
    return lambda;
}

static void test_exact_one_step(void **state) {
    (void)state;
    static spec_case cases[7];
    build_case(&cases[0], KIND_CLOSE, "close", 8, 11);
    build_case(&cases[1], KIND_FAR, "far", 10, 12);
    build_case(&cases[2], KIND_DISJOINT, "disjoint", 6, 13);
    build_case(&cases[3], KIND_ZEROS, "zeros", 12, 14);
    build_case(&cases[4], KIND_ONE_HOT, "one-hot", 8, 15);
    build_case(&cases[5], KIND_SPARSIFIED, "sparse-5", 24, 16);
    build_case(&cases[6], KIND_EQUAL, "p=q", 7, 17);
    uint64_t n_steps = steps_from_env();
    print_message("spec exactness: %llu steps of K=%d per case, significance %g\n", (unsigned long long)n_steps, K,
                  SIGNIFICANCE);
    int32_t wrong_checked = 0;
    for (int32_t c = 0; c < 7; c++) {
        harness_result r = run_harness(&cases[c], verify_real, n_steps, 1000 + (uint64_t)c);
        assert_true(r.p_first >= SIGNIFICANCE);
        assert_true(r.p_second >= SIGNIFICANCE);
        assert_true(r.p_accepted >= SIGNIFICANCE);
        /* A quarter of the steps is plenty to see the wrong verifier's bias. */
        uint64_t n_wrong = n_steps / 4;
        double lambda = wrong_noncentrality(&cases[c], n_wrong);
        if (lambda >= 200) {
            harness_result w = run_harness(&cases[c], verify_wrong, n_wrong, 1000 + (uint64_t)c);
            print_message("  %-10s wrong verifier: noncentrality %.0f, rejected with p %.3g\n", cases[c].name, lambda,
                          w.p_first);
            assert_true(w.p_first < SIGNIFICANCE);
            wrong_checked++;
        }
    }
    /* The wrong verifier must have been caught on at least the far, zeros, one-hot and sparse cases. */
    assert_true(wrong_checked >= 4);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_ERROR, "test_spec_exact");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_one_step),
    };
    return cmocka_run_group_tests_name("spec_exact", tests, NULL, NULL);
}
