/* test_sample.c — unit tests of engine/sample.c.
 *
 * Philox4x32-10 against the Random123 known-answer vectors
 * (tests/kat_vectors of github.com/DEShawResearch/random123: counter words,
 * key words, expected output), the uniform generator against a chi-square
 * bound, each filter (temperature, top-k, top-p, min-p, their order) on
 * hand-made logits with hand-computed results, greedy ties, parameter
 * validation, and seeded determinism / independence of purposes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "specd/sample.h"

static int n_error_lines;
static void count_sink(sd_log_level level, const char *line, void *user) {
    (void)line;
    (void)user;
    if (level == SD_LOG_ERROR) n_error_lines++;
}

static int setup(void **state) {
    (void)state;
    n_error_lines = 0;
    sd_log_set(count_sink, NULL, SD_LOG_WARN, "test_sample");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    sd_log_set(NULL, NULL, SD_LOG_INFO, "test_sample");
    return 0;
}

static void test_philox_kat(void **state) {
    (void)state;
    static const struct {
        uint32_t ctr[4];
        uint32_t key[2];
        uint32_t want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t ctr[4], out[4];
        memcpy(ctr, kat[i].ctr, sizeof ctr);
        uint64_t seed = ((uint64_t)kat[i].key[1] << 32) | kat[i].key[0];
        sd_philox4x32(seed, ctr, out);
        for (int w = 0; w < 4; w++) assert_int_equal(out[w], kat[i].want[w]);
        assert_memory_equal(ctr, kat[i].ctr, sizeof ctr); /* counter not modified */
    }
}

static void test_uniform_layout(void **state) {
    (void)state;
    /* sd_rng_uniform is Philox of (pos lo, pos hi, purpose, 0), top 53 bits of words 0,1. */
    uint64_t seed = 0x299f31d0a4093822ull, pos = 0x0000000500000007ull;
    uint32_t ctr[4] = {7, 5, SD_RNG_ACCEPT, 0}, out[4];
    sd_philox4x32(seed, ctr, out);
    uint64_t bits = (((uint64_t)out[0] << 32) | out[1]) >> 11;
    assert_true(sd_rng_uniform(seed, pos, SD_RNG_ACCEPT) == ldexp((double)bits, -53));
}

/* Chi-square over 100 bins of 10^5 uniforms: df = 99, the 0.999 quantile
 * is 148.23, so a correct generator fails this with probability 0.001
 * (and the seed is fixed, so the outcome is reproducible). */
static void test_uniform_chi_square(void **state) {
    (void)state;
    enum { BINS = 100, DRAWS = 100000 };
    static int count[BINS];
    memset(count, 0, sizeof count);
    double lo = 1.0, hi = 0.0;
    for (int i = 0; i < DRAWS; i++) {
        double u = sd_rng_uniform(12345, (uint64_t)i, SD_RNG_SAMPLE);
        assert_true(u >= 0.0 && u < 1.0);
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        count[(int)(u * BINS)]++;
    }
    double expect = (double)DRAWS / BINS, chi2 = 0.0;
    for (int b = 0; b < BINS; b++) chi2 += (count[b] - expect) * (count[b] - expect) / expect;
    print_message("uniform chi2 = %.2f (limit 148.23), min %.3g max %.6f\n", chi2, lo, hi);
    assert_true(chi2 < 148.23);
    assert_true(lo < 1e-3 && hi > 1.0 - 1e-3);
}

static void test_seeded_determinism_and_purposes(void **state) {
    (void)state;
    /* Same (seed, position, purpose): same value, whatever the call order. */
    double a = sd_rng_uniform(7, 42, SD_RNG_SAMPLE);
    for (int i = 0; i < 100; i++) (void)sd_rng_uniform(7, (uint64_t)i, SD_RNG_DRAFT);
    assert_true(sd_rng_uniform(7, 42, SD_RNG_SAMPLE) == a);
    assert_true(sd_rng_uniform(8, 42, SD_RNG_SAMPLE) != a);
    assert_true(sd_rng_uniform(7, 43, SD_RNG_SAMPLE) != a);
    /* The high word of the position matters. */
    assert_true(sd_rng_uniform(7, 42 + (1ull << 32), SD_RNG_SAMPLE) != a);

    /* Purposes: streams uncorrelated (|r| < 0.04 over 10^4 pairs; sd ~0.01). */
    enum { N = 10000 };
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    int equal = 0;
    for (int i = 0; i < N; i++) {
        double x = sd_rng_uniform(99, (uint64_t)i, SD_RNG_ACCEPT);
        double y = sd_rng_uniform(99, (uint64_t)i, SD_RNG_RESIDUAL);
        equal += x == y;
        sx += x;
        sy += y;
        sxx += x * x;
        syy += y * y;
        sxy += x * y;
    }
    double cov = sxy / N - (sx / N) * (sy / N);
    double r = cov / sqrt((sxx / N - (sx / N) * (sx / N)) * (syy / N - (sy / N) * (sy / N)));
    print_message("corr(ACCEPT, RESIDUAL) = %.4f\n", r);
    assert_true(fabs(r) < 0.04);
    assert_int_equal(equal, 0);

    /* Tokens: a seeded request is reproducible; purposes are not mixed up. */
    float logits[8] = {0.1f, 0.5f, -0.3f, 0.9f, 0.0f, 0.2f, 0.4f, -1.0f};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    s.seed = 2024;
    int32_t first[64], again[64];
    int distinct = 0;
    for (int pos = 0; pos < 64; pos++) {
        assert_int_equal(sd_sample_token(logits, 8, &s, (uint64_t)pos, &first[pos]), SD_OK);
        distinct |= 1 << first[pos];
    }
    for (int pos = 63; pos >= 0; pos--)
        assert_int_equal(sd_sample_token(logits, 8, &s, (uint64_t)pos, &again[pos]), SD_OK);
    assert_memory_equal(first, again, sizeof first);
    assert_true(__builtin_popcount((unsigned)distinct) >= 6);
    /* sd_sample_token draws by the race: the same as doing it by hand. */
    float probs[8];
    assert_int_equal(sd_sample_probs(logits, 8, &s, probs), SD_OK);
    for (int pos = 0; pos < 64; pos++) assert_int_equal(first[pos], sd_sample_race(probs, 8, 2024, (uint64_t)pos));
}

/* softmax(l / t) computed here independently, for comparison. */
static void softmax_ref(const float *l, int n, double t, double *p) {
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) m = fmax(m, l[i] / t);
    for (int i = 0; i < n; i++) sum += (p[i] = exp(l[i] / t - m));
    for (int i = 0; i < n; i++) p[i] /= sum;
}

static void assert_probs(const float *got, const double *want, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (fabs(got[i] - want[i]) > 1e-6) fail_msg("p[%d] = %.9g, want %.9g", i, (double)got[i], want[i]);
        if (want[i] == 0.0) assert_true(got[i] == 0.0f);
        sum += got[i];
    }
    assert_true(fabs(sum - 1.0) < 1e-6);
}

static void test_temperature_softmax(void **state) {
    (void)state;
    const float l[5] = {1.0f, 2.0f, 3.0f, -INFINITY, 0.5f};
    double want[5];
    float got[5];
    sd_sampling s = sd_sampling_default();
    for (double t = 0.25; t <= 4.0; t *= 2) {
        s.temperature = (float)t;
        softmax_ref(l, 5, t, want);
        assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
        assert_probs(got, want, 5);
        assert_true(got[3] == 0.0f);
    }
    /* Large logits do not overflow (max subtracted). */
    const float big[3] = {10000.0f, 9999.0f, -10000.0f};
    s.temperature = 1.0f;
    assert_int_equal(sd_sample_probs(big, 3, &s, got), SD_OK);
    assert_true(fabs(got[0] - 1.0 / (1.0 + exp(-1.0))) < 1e-6);
    assert_true(got[2] == 0.0f);
}

static void test_top_k(void **state) {
    (void)state;
    /* logits = log of 0.1 0.4 0.2 0.2 0.1 (two ties). */
    const float l[5] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.2f), logf(0.1f)};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    float got[5];
    s.top_k = 2; /* keeps 1 and the lower-id of the tied 2, 3 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.4 / 0.6, 0.2 / 0.6, 0, 0}, 5);
    s.top_k = 4; /* keeps 0 over 4 on the tie */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0.1 / 0.9, 0.4 / 0.9, 0.2 / 0.9, 0.2 / 0.9, 0}, 5);
    s.top_k = 1;
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 1, 0, 0, 0}, 5);
    s.top_k = 5; /* k >= n: no-op */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0.1, 0.4, 0.2, 0.2, 0.1}, 5);
    s.top_k = 1000;
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0.1, 0.4, 0.2, 0.2, 0.1}, 5);
}

/* The top-k filter's selection on a Gemma-sized vocabulary (262,144 ids,
 * logits on a coarse grid: many ties) against a full sort done here, with
 * top-p and min-p after it: the kept ids and their probabilities equal bit
 * for bit (the contract's steps, summed in the same orders). */
typedef struct ref_rank {
    double p;
    int32_t id;
} ref_rank;
static int ref_cmp(const void *a, const void *b) {
    const ref_rank *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static void ref_probs(const float *l, int32_t n, const sd_sampling *s, ref_rank *r, double *dense, float *out) {
    double inv_t = 1.0 / (double)s->temperature, z_max = -INFINITY, total = 0.0;
    for (int32_t i = 0; i < n; i++) z_max = fmax(z_max, (double)l[i] * inv_t);
    for (int32_t i = 0; i < n; i++) r[i] = (ref_rank){exp((double)l[i] * inv_t - z_max), i}, total += r[i].p;
    for (int32_t i = 0; i < n; i++) r[i].p /= total;
    qsort(r, (size_t)n, sizeof *r, ref_cmp);
    int32_t kept = s->top_k > 0 && s->top_k < n ? s->top_k : n;
    double mass = 0.0, cum = 0.0;
    for (int32_t i = 0; i < kept; i++) mass += r[i].p;
    for (int32_t i = 0; s->top_p < 1.0f && i < kept; i++)
        if ((cum += r[i].p) >= (double)s->top_p * mass) kept = i + 1;
    int32_t keep = 1;
    while (s->min_p > 0.0f && keep < kept && r[keep].p >= (double)s->min_p * r[0].p) keep++;
    if (s->min_p > 0.0f) kept = keep;
    memset(dense, 0, (size_t)n * sizeof *dense);
    for (int32_t i = 0; i < kept; i++) dense[r[i].id] = r[i].p;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += dense[i];
    for (int32_t i = 0; i < n; i++) out[i] = (float)(dense[i] / sum);
}

static void test_top_k_large_vocab(void **state) {
    (void)state;
    enum { V = 262144 };
    float *l = malloc(V * sizeof *l), *got = malloc(V * sizeof *got), *want = malloc(V * sizeof *want);
    ref_rank *r = malloc(V * sizeof *r);
    double *dense = malloc(V * sizeof *dense);
    assert_true(l && got && want && r && dense);
    uint64_t x = 7;
    for (int32_t i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((x >> 40) % 2000) / 100.0f; /* 2,000 values: ties everywhere */
    }
    const struct {
        int32_t k;
        float p, min_p;
    } cases[] = {{1, 1, 0}, {40, 1, 0}, {40, 0.5f, 0}, {1000, 0.9f, 0.05f}, {200000, 1, 0}, {V - 1, 0.95f, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sd_sampling s = sd_sampling_default();
        s.temperature = 0.7f, s.top_k = cases[c].k, s.top_p = cases[c].p, s.min_p = cases[c].min_p;
        assert_int_equal(sd_sample_probs(l, V, &s, got), SD_OK);
        ref_probs(l, V, &s, r, dense, want);
        if (memcmp(got, want, V * sizeof *got) != 0)
            fail_msg("top_k %d top_p %g: not the full sort's", cases[c].k, cases[c].p);
    }
    free(l), free(got), free(want), free(r), free(dense);
}

static void test_top_p(void **state) {
    (void)state;
    /* p = 0.05 0.5 0.25 0.15 0.05 (sorted: 1, 2, 3, then 0 and 4 tied). */
    const float l[5] = {logf(0.05f), logf(0.5f), logf(0.25f), logf(0.15f), logf(0.05f)};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    float got[5];
    s.top_p = 0.49f; /* token 1 alone reaches 0.49 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 1, 0, 0, 0}, 5);
    s.top_p = 0.51f; /* it does not reach 0.51 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.5 / 0.75, 0.25 / 0.75, 0, 0}, 5);
    s.top_p = 0.6f; /* 0.5 < 0.6 <= 0.75 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.5 / 0.75, 0.25 / 0.75, 0, 0}, 5);
    s.top_p = 0.92f; /* 0.9 < 0.92 <= 0.95: the tie is broken towards id 0 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0.05 / 0.95, 0.5 / 0.95, 0.25 / 0.95, 0.15 / 0.95, 0}, 5);
    s.top_p = 0.3f;
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 1, 0, 0, 0}, 5);

    /* top-p after top-k acts on the renormalized top-k mass: top_k 3 keeps
     * 0.5 0.25 0.15 (mass 0.9); top_p 0.8 needs 0.72 of it -> 1, 2 (0.75). */
    s.top_k = 3;
    s.top_p = 0.8f;
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.5 / 0.75, 0.25 / 0.75, 0, 0}, 5);
    /* Without top-k, 0.8 of the full mass needs 1, 2, 3 (0.9). */
    s.top_k = 0;
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0}, 5);
}

static void test_min_p(void **state) {
    (void)state;
    const float l[5] = {logf(0.05f), logf(0.5f), logf(0.25f), logf(0.15f), logf(0.05f)};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    float got[5];
    s.min_p = 0.4f; /* floor 0.2: keeps 0.5 and 0.25 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.5 / 0.75, 0.25 / 0.75, 0, 0}, 5);
    s.min_p = 0.2f; /* floor 0.1: keeps 0.5 0.25 0.15 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0}, 5);
    s.min_p = 0.05f; /* floor 0.025: keeps all */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0.05, 0.5, 0.25, 0.15, 0.05}, 5);
    /* min-p runs last: after top-p 0.6 keeps {1, 2}, min_p 0.6 (floor 0.3) leaves {1}. */
    s.top_p = 0.6f;
    s.min_p = 0.6f;
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    assert_probs(got, (const double[5]){0, 1, 0, 0, 0}, 5);
    /* Filters combine with temperature: T = 2 flattens to sqrt(p) before filtering. */
    s = sd_sampling_default();
    s.temperature = 2.0f;
    s.min_p = 0.5f; /* sqrt: .224 .707 .5 .387 .224 (floor .354) -> 1, 2, 3 */
    assert_int_equal(sd_sample_probs(l, 5, &s, got), SD_OK);
    double r1 = sqrt(0.5), r2 = sqrt(0.25), r3 = sqrt(0.15), t = r1 + r2 + r3;
    assert_probs(got, (const double[5]){0, r1 / t, r2 / t, r3 / t, 0}, 5);
}

static void test_greedy(void **state) {
    (void)state;
    const float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9999f, -INFINITY};
    assert_int_equal(sd_argmax(l, 6), 1);
    assert_int_equal(sd_argmax(l + 2, 4), 1); /* index 3 of l */
    assert_int_equal(sd_argmax(l, 1), 0);
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.0f;
    s.top_k = 3; /* filters do not matter when greedy */
    s.top_p = 0.1f;
    float got[6];
    assert_int_equal(sd_sample_probs(l, 6, &s, got), SD_OK);
    assert_probs(got, (const double[6]){0, 1, 0, 0, 0, 0}, 6);
    int32_t tok = -1;
    for (uint64_t pos = 0; pos < 10; pos++) {
        s.seed = pos * 31;
        assert_int_equal(sd_sample_token(l, 6, &s, pos, &tok), SD_OK);
        assert_int_equal(tok, 1);
    }
}

/* sd_sample_greedy is the index of sd_sample_probs' greedy one-hot, with
 * its input checks. */
static void test_sample_greedy(void **state) {
    (void)state;
    const float l[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9999f, -INFINITY};
    int32_t tok = -1;
    assert_int_equal(sd_sample_greedy(l, 6, &tok), SD_OK);
    assert_int_equal(tok, 1); /* the lower of two equal maxima */
    assert_int_equal(sd_sample_greedy(l + 2, 4, &tok), SD_OK);
    assert_int_equal(tok, 1);
    const float tail[3] = {-INFINITY, -INFINITY, 0.5f};
    assert_int_equal(sd_sample_greedy(tail, 3, &tok), SD_OK);
    assert_int_equal(tok, 2);
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.0f;
    uint64_t rng = 12345;
    float r[97], probs[97];
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < 97; i++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            r[i] = (float)((rng >> 40) % 64) / 8.0f - 4.0f; /* coarse values: ties happen */
        }
        assert_int_equal(sd_sample_greedy(r, 97, &tok), SD_OK);
        assert_int_equal(sd_sample_probs(r, 97, &s, probs), SD_OK);
        assert_true(probs[tok] == 1.0f);
        assert_int_equal(tok, sd_argmax(r, 97));
    }
    const float nan_l[3] = {0.0f, NAN, 1.0f}, inf_l[2] = {0.0f, INFINITY}, none[2] = {-INFINITY, -INFINITY};
    const int before = n_error_lines;
    assert_int_equal(sd_sample_greedy(nan_l, 3, &tok), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_greedy(inf_l, 2, &tok), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_greedy(none, 2, &tok), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_greedy(l, 0, &tok), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_greedy(NULL, 3, &tok), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_greedy(l, 3, NULL), SD_ERR_INVALID_ARG);
    assert_int_equal(n_error_lines, before + 6);
}

static void test_sample_from(void **state) {
    (void)state;
    const float p[6] = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f, 0.0f};
    assert_int_equal(sd_sample_from(p, 6, 0.0), 1);
    assert_int_equal(sd_sample_from(p, 6, 0.2499), 1);
    assert_int_equal(sd_sample_from(p, 6, 0.25), 3);
    assert_int_equal(sd_sample_from(p, 6, 0.7499), 3);
    assert_int_equal(sd_sample_from(p, 6, 0.75), 4);
    assert_int_equal(sd_sample_from(p, 6, 0.9999999999), 4);
    /* Unnormalized input: scaled by the total. */
    const float q[3] = {2.0f, 0.0f, 6.0f};
    assert_int_equal(sd_sample_from(q, 3, 0.2), 0);
    assert_int_equal(sd_sample_from(q, 3, 0.3), 2);
    const float z[2] = {0.0f, 0.0f};
    assert_int_equal(sd_sample_from(z, 2, 0.5), -1);

    /* Frequencies follow the distribution: chi-square, df 3, 0.999 quantile 16.27. */
    const float l[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    s.seed = 77;
    int count[4] = {0};
    enum { DRAWS = 20000 };
    for (int pos = 0; pos < DRAWS; pos++) {
        int32_t tok = -1;
        assert_int_equal(sd_sample_token(l, 4, &s, (uint64_t)pos, &tok), SD_OK);
        assert_in_range(tok, 0, 3);
        count[tok]++;
    }
    double chi2 = 0;
    for (int i = 0; i < 4; i++) {
        double e = DRAWS * 0.1 * (i + 1);
        chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    print_message("token chi2 = %.2f (limit 16.27): %d %d %d %d\n", chi2, count[0], count[1], count[2], count[3]);
    assert_true(chi2 < 16.27);
}

static void test_race(void **state) {
    (void)state;
    /* The race draws from p (unnormalized, zeros never drawn), and two
     * distributions raced at one key agree as often as the closed form
     * sum_v 1 / sum_w max(p_w/p_v, q_w/q_v) says (spec.c's coupling). */
    enum { V = 6, N = 200000 };
    const float p[V] = {2.0f, 0.0f, 1.0f, 4.0f, 0.5f, 0.5f}; /* sums to 8 */
    const float q[V] = {0.3f, 0.1f, 0.1f, 0.3f, 0.0f, 0.2f};
    long count[V] = {0}, agree = 0;
    for (uint64_t pos = 0; pos < N; pos++) {
        int32_t x = sd_sample_race(p, V, 77, pos);
        assert_true(x >= 0 && x < V);
        count[x]++;
        agree += x == sd_sample_race(q, V, 77, pos);
    }
    assert_int_equal(count[1], 0);
    for (int v = 0; v < V; v++) {
        double e = (double)p[v] / 8.0, sd = sqrt(e * (1 - e) / N);
        assert_true(fabs((double)count[v] / N - e) <= 5 * sd + 1e-12);
    }
    double expect = 0.0;
    for (int v = 0; v < V; v++) {
        if (p[v] <= 0 || q[v] <= 0) continue;
        double den = 0.0;
        for (int w = 0; w < V; w++) den += fmax(p[w] / 8.0 / (p[v] / 8.0), q[w] / q[v]);
        expect += 1.0 / den;
    }
    double sd = sqrt(expect * (1 - expect) / N);
    print_message("race agreement %.4f, closed form %.4f\n", (double)agree / N, expect);
    assert_true(fabs((double)agree / N - expect) <= 5 * sd);
    const float none[3] = {0, 0, 0};
    assert_int_equal(sd_sample_race(none, 3, 1, 1), -1);
}

static void test_invalid_params(void **state) {
    (void)state;
    sd_sampling d = sd_sampling_default();
    assert_true(d.temperature == 0.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f && d.seed == 0);
    assert_true(sd_sampling_is_greedy(&d));
    assert_int_equal(sd_sampling_validate(&d), SD_OK);
    sd_sampling ok = d;
    ok.temperature = 0.0f;
    ok.top_p = 1e-6f;
    ok.min_p = 0.999f;
    ok.top_k = 1;
    assert_int_equal(sd_sampling_validate(&ok), SD_OK);
    assert_int_equal(n_error_lines, 0);

    sd_sampling bad[10];
    for (int i = 0; i < 10; i++) bad[i] = d;
    bad[0].temperature = -0.1f;
    bad[1].temperature = INFINITY;
    bad[2].temperature = NAN;
    bad[3].top_p = 0.0f;
    bad[4].top_p = 1.0001f;
    bad[5].top_p = NAN;
    bad[6].min_p = 1.0f;
    bad[7].min_p = -0.01f;
    bad[8].min_p = NAN;
    bad[9].top_k = -1;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(sd_sampling_validate(&bad[i]), SD_ERR_INVALID_ARG);
        assert_int_equal(n_error_lines, i + 1);
    }
    assert_int_equal(sd_sampling_validate(NULL), SD_ERR_INVALID_ARG);

    float l[3] = {0.0f, 1.0f, 2.0f}, probs[3];
    int32_t tok = 0;
    assert_int_equal(sd_sample_probs(l, 3, &bad[4], probs), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_token(l, 3, &bad[9], 0, &tok), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_probs(l, 0, &d, probs), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_probs(NULL, 3, &d, probs), SD_ERR_INVALID_ARG);
    l[1] = NAN;
    assert_int_equal(sd_sample_probs(l, 3, &d, probs), SD_ERR_INVALID_ARG);
    l[1] = INFINITY;
    assert_int_equal(sd_sample_token(l, 3, &d, 0, &tok), SD_ERR_INVALID_ARG);
    float masked[2] = {-INFINITY, -INFINITY};
    assert_int_equal(sd_sample_probs(masked, 2, &d, probs), SD_ERR_INVALID_ARG);
}

/* OpenAI's penalties: frequency x count + presence once, over the generated
 * tokens only; the counts scratch comes back zeroed; bad ids and ranges are
 * refused. */
static void test_penalties(void **state) {
    (void)state;
    float logits[6] = {1, 2, 3, 4, 5, -INFINITY};
    int32_t counts[6] = {0};
    sd_sampling s = sd_sampling_default();
    s.presence_penalty = 0.5f;
    s.frequency_penalty = 0.25f;
    const int32_t gen[] = {4, 1, 4, 4, 5};
    assert_int_equal(sd_sample_penalize(logits, 6, &s, gen, 5, counts), SD_OK);
    assert_true(logits[0] == 1.0f && logits[2] == 3.0f && logits[3] == 4.0f);
    assert_true(logits[4] == 5.0f - 0.5f - 3 * 0.25f);
    assert_true(logits[1] == 2.0f - 0.5f - 0.25f);
    assert_true(logits[5] == -INFINITY);
    for (int i = 0; i < 6; i++) assert_int_equal(counts[i], 0);
    /* greedy changes: 4 was the argmax, now 3 is */
    assert_int_equal(sd_argmax(logits, 6), 3);
    /* no penalties: untouched */
    sd_sampling off = sd_sampling_default();
    float before = logits[4];
    assert_int_equal(sd_sample_penalize(logits, 6, &off, gen, 5, counts), SD_OK);
    assert_true(logits[4] == before);
    const int32_t bad[] = {6};
    assert_int_equal(sd_sample_penalize(logits, 6, &s, bad, 1, counts), SD_ERR_RANGE);
    s.presence_penalty = 2.5f;
    assert_int_equal(sd_sampling_check(&s, NULL, 0), SD_ERR_INVALID_ARG);
    s.presence_penalty = NAN;
    assert_int_equal(sd_sampling_check(&s, NULL, 0), SD_ERR_INVALID_ARG);
    s.presence_penalty = -2.0f;
    s.frequency_penalty = 2.0f;
    assert_int_equal(sd_sampling_check(&s, NULL, 0), SD_OK);
    s.frequency_penalty = -2.001f;
    assert_int_equal(sd_sampling_check(&s, NULL, 0), SD_ERR_INVALID_ARG);
}

/* log-softmax at a token and the top-n, against a direct computation. */
static void test_logprobs(void **state) {
    (void)state;
    const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp((double)logits[i]);
    sd_token_logprob lp;
    assert_int_equal(sd_sample_logprobs(logits, 5, 4, 3, &lp), SD_OK);
    assert_true(fabs(lp.logprob - (1.0 - log(z))) < 1e-6);
    assert_int_equal(lp.n_top, 3);
    /* ties: lower id first */
    assert_int_equal(lp.top_ids[0], 1);
    assert_int_equal(lp.top_ids[1], 3);
    assert_int_equal(lp.top_ids[2], 4);
    assert_true(fabs(lp.top_logprobs[0] - (2.0 - log(z))) < 1e-6);
    assert_true(lp.top_logprobs[2] == lp.logprob);
    double mass = 0;
    assert_int_equal(sd_sample_logprobs(logits, 5, 0, 5, &lp), SD_OK);
    for (int j = 0; j < 5; j++) mass += exp(lp.top_logprobs[j]);
    assert_true(fabs(mass - 1.0) < 1e-6);
    assert_int_equal(lp.top_ids[4], 2);
    assert_int_equal(sd_sample_logprobs(logits, 5, 0, 0, &lp), SD_OK);
    assert_int_equal(lp.n_top, 0);
    assert_int_equal(sd_sample_logprobs(logits, 5, 5, 0, &lp), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_sample_logprobs(logits, 5, 0, SD_MAX_TOP_LOGPROBS + 1, &lp), SD_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_philox_kat, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uniform_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uniform_chi_square, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seeded_determinism_and_purposes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_temperature_softmax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_k, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_k_large_vocab, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_p, setup, teardown),
        cmocka_unit_test_setup_teardown(test_min_p, setup, teardown),
        cmocka_unit_test_setup_teardown(test_greedy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sample_greedy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sample_from, setup, teardown),
        cmocka_unit_test_setup_teardown(test_race, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_penalties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logprobs, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
