/* test_glu.c — the CPU backend's GeGLU and SwiGLU (engine/cpu/swiglu.c).
 *
 * Checked:
 *   - GeGLU against gelu (tanh form) * up in double (checked against
 *     0.5 g (1 + tanh(u)) where that has no cancellation) on a dense grid of gate
 *     values over [-12, 12] (and random up): the error is the exp's 2 ulp
 *     and a few roundings, plus z = 2u's rounding magnified by |z| in the
 *     sigmoid's tail, |got - want| <= (3 |z| + 16) 2^-24 |want| + 2^-125 |g up|
 *     (the last term: below z = -87, e^z < 2^-125, the exp is taken as 0);
 *   - an element's value is the same bits alone (a one-element call, the
 *     scalar twin), at every offset of a long call (vector or tail) and on
 *     1 and 2 threads: batch invariance;
 *   - gelu(0) = 0, gelu(+inf) = +inf, and NaN stays NaN;
 *   - SwiGLU, the same invariance. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_impl.h"
#include "cpu_fixture.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(float lo, float hi) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((double)(rng_state >> 40) / (double)(1u << 24));
}

/* 0.5 g (1 + tanh(u)) as g / (1 + e^-2u), the same function without the
 * cancellation (in double, 1 + tanh(u) is 0 below u = -19). */
static double gelu_ref(double g) { return g / (1.0 + exp(-2.0 * sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))); }

typedef sd_status (*glu_fn)(sd_backend *, const float *, const float *, size_t, float *);

static void test_geglu_accuracy(void **state) {
    fixture *f = *state;
    enum { N = 1 << 20 };
    float *g = malloc(N * sizeof(float)), *up = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
    assert_non_null(g);
    assert_non_null(up);
    assert_non_null(out);
    for (size_t i = 0; i < N; i++) {
        g[i] = -12.0f + 24.0f * (float)i / (float)N;
        up[i] = uniform(-2.0f, 2.0f);
    }
    assert_int_equal(f->be2.ops->geglu(f->be2.ctx, g, up, N, out), SD_OK);
    double worst = 0.0;
    for (size_t i = 0; i < N; i++) {
        double want = gelu_ref((double)g[i]) * (double)up[i];
        double z = 2.0 * sqrt(2.0 / M_PI) * ((double)g[i] + 0.044715 * (double)g[i] * (double)g[i] * (double)g[i]);
        double err = fabs((double)out[i] - want);
        double bound = (3.0 * fabs(z) + 16.0) * ldexp(1.0, -24) * fabs(want) +
                       ldexp(1.0, -125) * fabs((double)g[i] * (double)up[i]);
        if (fabs(want) > 1e-30 && err / fabs(want) > worst && fabs(z) < 80.0) worst = err / fabs(want);
        if (!(err <= bound)) {
            print_error("geglu(%.9g, up %.9g) = %.9g, want %.17g\n", (double)g[i], (double)up[i], (double)out[i], want);
            fail();
        }
    }
    for (double x = -3.0; x <= 12.0; x += 0.25) /* the reference's two forms agree */
        assert_true(fabs(gelu_ref(x) - 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))) <=
                    1e-15 * (1.0 + fabs(x)));
    print_message("geglu: worst relative error for |z| < 80: %.3g (%.2f x 2^-24)\n", worst, worst / ldexp(1.0, -24));
    const float special[4] = {0.0f, INFINITY, NAN, -0.0f}, ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    float so[4];
    assert_int_equal(f->be1.ops->geglu(f->be1.ctx, special, ones, 4, so), SD_OK);
    assert_true(so[0] == 0.0f);
    assert_true(isinf(so[1]) && so[1] > 0.0f);
    assert_true(isnan(so[2]));
    assert_true(so[3] == 0.0f);
    free(g);
    free(up);
    free(out);
}

/* Every element of a long call (offsets 0..n-1: whole vectors and a tail)
 * against the same element in a one-element call, and 1 vs 2 threads. */
static void check_invariance(fixture *f, bool geglu) {
    enum { N = 3 * 4096 + 13 };
    float *g = malloc(N * sizeof(float)), *up = malloc(N * sizeof(float));
    float *o1 = malloc(N * sizeof(float)), *o2 = malloc(N * sizeof(float));
    assert_non_null(g);
    assert_non_null(up);
    assert_non_null(o1);
    assert_non_null(o2);
    for (size_t i = 0; i < N; i++) g[i] = uniform(-20.0f, 20.0f), up[i] = uniform(-3.0f, 3.0f);
    glu_fn fn1 = geglu ? f->be1.ops->geglu : f->be1.ops->swiglu, fn2 = geglu ? f->be2.ops->geglu : f->be2.ops->swiglu;
    assert_int_equal(fn1(f->be1.ctx, g, up, N, o1), SD_OK);
    assert_int_equal(fn2(f->be2.ctx, g, up, N, o2), SD_OK);
    assert_memory_equal(o1, o2, N * sizeof(float));
    for (size_t off = 0; off < 8; off++) { /* shifted calls: each element at another lane */
        assert_int_equal(fn2(f->be2.ctx, g + off, up + off, N - off, o2), SD_OK);
        assert_memory_equal(o1 + off, o2, (N - off) * sizeof(float));
    }
    for (size_t i = 0; i < N; i += 97) {
        float alone;
        assert_int_equal(fn1(f->be1.ctx, g + i, up + i, 1, &alone), SD_OK);
        assert_memory_equal(&alone, &o1[i], sizeof alone);
    }
    free(g);
    free(up);
    free(o1);
    free(o2);
}

static void test_geglu_invariance(void **state) { check_invariance(*state, true); }
static void test_swiglu_invariance(void **state) { check_invariance(*state, false); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geglu_accuracy),
        cmocka_unit_test(test_geglu_invariance),
        cmocka_unit_test(test_swiglu_invariance),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
