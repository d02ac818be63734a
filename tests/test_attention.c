/* test_attention.c — the CPU attention over the paged KV cache (engine/cpu/attention.c).
 *
 * On random shapes (GQA groups 1, 3, 4, 8; head_dim 64 and 128, and 40 and 36
 * for the 8-column and scalar tails; block sizes 7, 16, 32; f32 and f16
 * caches) a call mixes several sequences (1..600 positions): runs of 1..16
 * tokens, a run longer than one work item's run (it is split), single tokens,
 * interleaved in the token order. Checked:
 *   - every path this build and CPU have (the C twin, AVX2, AVX-512) and 1 or 2 threads give
 *     the same bits for the whole call;
 *   - each token computed alone (a one-token call) equals its row of the
 *     mixed call bit for bit, per path: batch invariance;
 *   - against the attention in double (scores, softmax and sum in double,
 *     on the cache's values as stored): for output element d of a token,
 *       |out - ref| <= (2.5 * D + (1.25 n + 64) * 2^-24) * sum_j p_j |v_j[d]|
 *     with p the softmax in double, n the positions attended, and
 *     D = max_j (head_dim + 4) * 2^-24 * scale * sum_i |q_i k_j[i]| the
 *     score error bound (8-lane dot); 2 * D is the weights' relative error
 *     from the scores, 1.25 n + 64 units cover the exp (2 ulp), the lane
 *     sums, the fused accumulation over n positions and the division;
 *   - the same with a sliding window (1, 8, 37, 300 positions): against the
 *     double attention over the window alone, paths, threads and batch
 *     invariance bit for bit;
 *   - the exp against exp in double on [-87, 0]: within 2 ulp (relative
 *     2 * 2^-23), exactly 1 at 0, 0 below -87 and for NaN;
 *   - refusals: heads not a multiple of KV heads, a negative position. */
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
#include "specd/gguf.h"
#include "cpu_fixture.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t next_u32(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}
static float uniform(void) { return (float)((double)(next_u32() >> 8) / (double)(1u << 24) * 2.0 - 1.0); } /* [-1,1) */
static int below(int n) { return (int)(next_u32() % (uint32_t)n); }

typedef struct shape {
    int heads, kv_heads, head_dim, block_size;
} shape;

enum { MAX_SEQS = 5, MAX_TOKENS = 64 };

/* A cache holding MAX_SEQS sequences and one call's tokens over them. */
typedef struct scene {
    shape s;
    bool f16;
    int n_seqs, len[MAX_SEQS];
    int32_t *bt, bt_off_seq[MAX_SEQS];
    size_t n_slots, row; /* row = kv_heads * head_dim */
    float *k, *v;        /* [n_slots][row] the values as stored (f16: widened) */
    uint16_t *k16, *v16; /* f16 cache */
    int n_tokens, seq_of[MAX_TOKENS];
    int32_t pos[MAX_TOKENS], bt_off[MAX_TOKENS];
    float *q; /* [n_tokens][heads][head_dim] */
    float scale;
} scene;

/* Appends a run of n tokens of sequence sq ending at its last position. */
static void add_run(scene *c, int sq, int first, int n) {
    for (int i = 0; i < n; i++) {
        assert_true(c->n_tokens < MAX_TOKENS);
        c->seq_of[c->n_tokens] = sq;
        c->pos[c->n_tokens] = first + i;
        c->bt_off[c->n_tokens] = c->bt_off_seq[sq];
        c->n_tokens++;
    }
}

static void scene_make(scene *c, shape s, bool f16, const int *lens, int n_seqs) {
    memset(c, 0, sizeof *c);
    c->s = s;
    c->f16 = f16;
    c->n_seqs = n_seqs;
    c->row = (size_t)s.kv_heads * (size_t)s.head_dim;
    int n_blocks = 0, max_blocks = 0;
    for (int i = 0; i < n_seqs; i++) {
        c->len[i] = lens[i];
        int nb = (lens[i] + s.block_size - 1) / s.block_size;
        c->bt_off_seq[i] = n_blocks;
        n_blocks += nb;
        if (nb > max_blocks) max_blocks = nb;
    }
    int total_blocks = n_blocks + 3; /* spare blocks nobody owns */
    c->n_slots = (size_t)total_blocks * (size_t)s.block_size;
    c->bt = malloc((size_t)n_blocks * sizeof *c->bt);
    int *perm = malloc((size_t)total_blocks * sizeof *perm);
    assert_non_null(c->bt);
    assert_non_null(perm);
    for (int i = 0; i < total_blocks; i++) perm[i] = i;
    for (int i = total_blocks - 1; i > 0; i--) { /* shuffled: tables jump around the pool */
        int j = below(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < n_blocks; i++) c->bt[i] = perm[i];
    free(perm);
    size_t n = c->n_slots * c->row;
    c->k = malloc(n * sizeof(float));
    c->v = malloc(n * sizeof(float));
    c->k16 = malloc(n * sizeof(uint16_t));
    c->v16 = malloc(n * sizeof(uint16_t));
    assert_non_null(c->k);
    assert_non_null(c->v);
    assert_non_null(c->k16);
    assert_non_null(c->v16);
    for (size_t i = 0; i < n; i++) {
        float kf = uniform(), vf = uniform() * (i % 53 == 7 ? 8.0f : 1.0f);
        if (f16) {
            c->k16[i] = sd_f32_to_f16(kf);
            c->v16[i] = sd_f32_to_f16(vf);
            kf = sd_f16_to_f32(c->k16[i]);
            vf = sd_f16_to_f32(c->v16[i]);
        }
        c->k[i] = kf;
        c->v[i] = vf;
    }
    c->scale = 1.0f / sqrtf((float)s.head_dim);
    (void)max_blocks;
}

static void scene_queries(scene *c) {
    size_t n = (size_t)c->n_tokens * (size_t)c->s.heads * (size_t)c->s.head_dim;
    c->q = malloc(n * sizeof(float));
    assert_non_null(c->q);
    for (size_t i = 0; i < n; i++) c->q[i] = uniform() * 3.0f; /* some peaked softmaxes */
}

static void scene_free(scene *c) {
    free(c->bt);
    free(c->k);
    free(c->v);
    free(c->k16);
    free(c->v16);
    free(c->q);
}

/* The sliding window of the calls (0: none; test_window sets it). */
static int g_window;

/* tokens [t0, t0 + n) of the scene on a path, into out (rows of those tokens). */
static sd_status run_call(sd_backend *be, sd_cpu_attn_path path, const scene *c, int t0, int n, float *out) {
    if (g_window)
        return sd_cpu_attention_window_path(be, path, c->q + (size_t)t0 * (size_t)c->s.heads * (size_t)c->s.head_dim,
                                            c->f16 ? (const void *)c->k16 : (const void *)c->k,
                                            c->f16 ? (const void *)c->v16 : (const void *)c->v, c->f16, n, c->s.heads,
                                            c->s.kv_heads, c->s.head_dim, c->s.block_size, c->pos + t0, c->bt,
                                            c->bt_off + t0, g_window, c->scale, out);
    return sd_cpu_attention_path(be, path, c->q + (size_t)t0 * (size_t)c->s.heads * (size_t)c->s.head_dim,
                                 c->f16 ? (const void *)c->k16 : (const void *)c->k,
                                 c->f16 ? (const void *)c->v16 : (const void *)c->v, c->f16, n, c->s.heads,
                                 c->s.kv_heads, c->s.head_dim, c->s.block_size, c->pos + t0, c->bt, c->bt_off + t0,
                                 c->scale, out);
}

static void describe(const scene *c, const char *what, int t, size_t d, float a, float b) {
    print_error("%s: heads %d kv %d head_dim %d block %d %s: token %d (seq %d pos %d) element %zu: %.9g vs %.9g\n",
                what, c->s.heads, c->s.kv_heads, c->s.head_dim, c->s.block_size, c->f16 ? "f16" : "f32", t,
                c->seq_of[t], (int)c->pos[t], d, (double)a, (double)b);
}

static void assert_same_bits(const scene *c, const char *what, const float *a, const float *b) {
    size_t per = (size_t)c->s.heads * (size_t)c->s.head_dim;
    for (size_t i = 0; i < (size_t)c->n_tokens * per; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            describe(c, what, (int)(i / per), i % per, a[i], b[i]);
            fail();
        }
}

/* The bound stated at the top, per element, against the attention in double. */
static void check_against_double(const scene *c, const float *out) {
    const shape s = c->s;
    const size_t hd = (size_t)s.head_dim, group = (size_t)(s.heads / s.kv_heads);
    double *sc = malloc(700 * sizeof(double)), *mag = malloc(700 * sizeof(double));
    assert_non_null(sc);
    assert_non_null(mag);
    const double u = ldexp(1.0, -24);
    for (int t = 0; t < c->n_tokens; t++)
        for (size_t h = 0; h < (size_t)s.heads; h++) {
            const float *q = c->q + ((size_t)t * (size_t)s.heads + h) * hd;
            size_t n = (size_t)c->pos[t] + 1, kvh = h / group;
            size_t lo = g_window && n > (size_t)g_window ? n - (size_t)g_window : 0; /* the window's first */
            const int32_t *bt = c->bt + c->bt_off[t];
            assert_true(n <= 700);
            double max = -INFINITY, dmax = 0.0;
            for (size_t j = 0; j < lo; j++) sc[j] = -INFINITY;
            for (size_t j = lo; j < n; j++) {
                size_t slot = (size_t)bt[j / (size_t)s.block_size] * (size_t)s.block_size + j % (size_t)s.block_size;
                const float *k = c->k + slot * c->row + kvh * hd;
                double dot = 0.0, abs_dot = 0.0;
                for (size_t i = 0; i < hd; i++) {
                    dot += (double)q[i] * (double)k[i];
                    abs_dot += fabs((double)q[i] * (double)k[i]);
                }
                sc[j] = dot * (double)c->scale;
                double dj = (double)(hd + 4) * u * (double)c->scale * abs_dot;
                if (dj > dmax) dmax = dj;
                if (sc[j] > max) max = sc[j];
            }
            double sum = 0.0;
            for (size_t j = 0; j < n; j++) {
                sc[j] = j < lo ? 0.0 : exp(sc[j] - max);
                sum += sc[j];
            }
            for (size_t d = 0; d < hd; d++) {
                double ref = 0.0, pv = 0.0;
                for (size_t j = 0; j < n; j++) {
                    size_t slot =
                        (size_t)bt[j / (size_t)s.block_size] * (size_t)s.block_size + j % (size_t)s.block_size;
                    double v = (double)c->v[slot * c->row + kvh * hd + d];
                    ref += sc[j] / sum * v;
                    pv += sc[j] / sum * fabs(v);
                }
                double got = (double)out[((size_t)t * (size_t)s.heads + h) * hd + d];
                double bound = (2.5 * dmax + (1.25 * (double)n + 64.0) * u) * pv + 1e-30;
                if (!(fabs(got - ref) <= bound)) {
                    describe(c, "against double", t, h * hd + d, (float)got, (float)ref);
                    print_error("  |d| = %.3g > bound %.3g\n", fabs(got - ref), bound);
                    fail();
                }
            }
        }
    free(sc);
    free(mag);
}

/* A call over n_seqs random sequences: every check of the file comment. */
static void check_scene(fixture *f, shape s, bool f16) {
    int lens[MAX_SEQS], n_seqs = 4;
    lens[0] = 1 + below(600);
    lens[1] = 20 + below(581); /* a run of 20 > RUN_MAX */
    lens[2] = 1 + below(40);
    lens[3] = 600;
    scene c;
    scene_make(&c, s, f16, lens, n_seqs);
    int run0 = 1 + below(lens[0] < 16 ? lens[0] : 16), run3 = 1 + below(16);
    add_run(&c, 0, lens[0] - run0, run0);
    add_run(&c, 2, lens[2] - 1, 1);
    add_run(&c, 1, lens[1] - 20, 20);
    add_run(&c, 3, lens[3] - run3, run3);
    add_run(&c, 0, below(lens[0]), 1); /* a token of sequence 0 away from its run */
    scene_queries(&c);

    size_t per = (size_t)s.heads * (size_t)s.head_dim, n_out = (size_t)c.n_tokens * per;
    float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    assert_non_null(ref);
    assert_non_null(got);
    assert_int_equal(run_call(f->be1.ctx, SD_CPU_ATTN_C, &c, 0, c.n_tokens, ref), SD_OK);
    check_against_double(&c, ref);
    const sd_cpu_attn_path paths[] = {SD_CPU_ATTN_C, SD_CPU_ATTN_AVX2, SD_CPU_ATTN_AVX512};
    const char *const names[] = {"C, mixed call vs C 1 thread", "AVX2 vs C", "AVX-512 vs C"};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!sd_cpu_attn_path_available(paths[p])) continue;
        for (int th = 1; th <= 2; th++) {
            memset(got, 0xff, n_out * sizeof(float));
            assert_int_equal(run_call(th == 1 ? f->be1.ctx : f->be2.ctx, paths[p], &c, 0, c.n_tokens, got), SD_OK);
            assert_same_bits(&c, names[p], got, ref);
        }
        for (int t = 0; t < c.n_tokens; t++) { /* alone */
            assert_int_equal(run_call(f->be1.ctx, paths[p], &c, t, 1, got + (size_t)t * per), SD_OK);
        }
        assert_same_bits(&c, "alone vs in the mixed call", got, ref);
    }
    free(ref);
    free(got);
    scene_free(&c);
}

static const shape shapes[] = {
    {4, 4, 64, 16},  /* group 1 */
    {9, 3, 64, 16},  /* SmolLM2: group 3 */
    {8, 2, 128, 32}, /* group 4, head_dim 128 */
    {6, 2, 64, 7},   /* an odd block size */
    {4, 1, 128, 16}, /* group 4, one KV head */
    {8, 1, 64, 16},  /* group 8: more than one item per KV head */
    {3, 3, 40, 16},  /* 16 + 16 + 8 columns */
    {2, 1, 36, 8},   /* a scalar tail of 4 */
};

static void test_shapes(void **state) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_scene(*state, shapes[i], false);
        check_scene(*state, shapes[i], true);
    }
}

/* A sliding window (attention_window): the positions before it weigh
 * exactly 0, so the same checks hold against the double attention over the
 * window alone (windows of 1, of a block's width, and wider than most). */
static void test_window(void **state) {
    const int windows[] = {1, 8, 37, 300};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        g_window = windows[w];
        check_scene(*state, shapes[w % 4 + 1], false);
        check_scene(*state, shapes[(w + 2) % 8], true);
    }
    g_window = 0;
}

/* Short sequences only: runs that end inside the first 8-position block. */
static void test_short(void **state) {
    fixture *f = *state;
    const shape s = {4, 2, 64, 4};
    for (int rep = 0; rep < 4; rep++) {
        int lens[3] = {1 + below(3), 1 + below(9), 1 + below(17)};
        scene c;
        scene_make(&c, s, rep % 2 == 1, lens, 3);
        add_run(&c, 1, 0, lens[1]);
        add_run(&c, 0, 0, lens[0]);
        add_run(&c, 2, 0, lens[2]);
        scene_queries(&c);
        size_t n_out = (size_t)c.n_tokens * (size_t)s.heads * (size_t)s.head_dim;
        float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
        assert_non_null(ref);
        assert_non_null(got);
        assert_int_equal(run_call(f->be2.ctx, SD_CPU_ATTN_C, &c, 0, c.n_tokens, ref), SD_OK);
        check_against_double(&c, ref);
        if (sd_cpu_attn_path_available(SD_CPU_ATTN_AVX2)) {
            assert_int_equal(run_call(f->be2.ctx, SD_CPU_ATTN_AVX2, &c, 0, c.n_tokens, got), SD_OK);
            assert_same_bits(&c, "AVX2 vs C (short)", got, ref);
        }
        if (sd_cpu_attn_path_available(SD_CPU_ATTN_AVX512)) {
            assert_int_equal(run_call(f->be2.ctx, SD_CPU_ATTN_AVX512, &c, 0, c.n_tokens, got), SD_OK);
            assert_same_bits(&c, "AVX-512 vs C (short)", got, ref);
        }
        free(ref);
        free(got);
        scene_free(&c);
    }
}

static void test_exp(void **state) {
    (void)state;
    print_message("attention paths here: AVX2 %s, AVX-512 %s\n",
                  sd_cpu_attn_path_available(SD_CPU_ATTN_AVX2) ? "yes" : "no",
                  sd_cpu_attn_path_available(SD_CPU_ATTN_AVX512) ? "yes" : "no");
    double worst = 0.0;
    for (int i = 0; i <= 2000000; i++) {
        float x = (float)(-87.0 * (double)i / 2000000.0);
        double want = exp((double)x), got = (double)sd_cpu_attn_exp(x);
        double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
        if (!(rel <= 2.0 * ldexp(1.0, -23))) {
            print_error("exp(%.9g) = %.9g, want %.17g (relative %.3g)\n", (double)x, got, want, rel);
            fail();
        }
    }
    print_message("attention exp: worst relative error on [-87, 0]: %.3g (%.2f x 2^-23)\n", worst,
                  worst / ldexp(1.0, -23));
    assert_true(sd_cpu_attn_exp(0.0f) == 1.0f);
    assert_true(sd_cpu_attn_exp(-87.5f) == 0.0f);
    assert_true(sd_cpu_attn_exp(-INFINITY) == 0.0f);
    assert_true(sd_cpu_attn_exp(NAN) == 0.0f);
}

static void test_refusals(void **state) {
    fixture *f = *state;
    float q[4 * 8] = {0}, kv[64] = {0}, out[4 * 8];
    int32_t pos[1] = {0}, bt[1] = {0}, bt_off[1] = {0};
    assert_int_equal(
        sd_cpu_attention_path(f->be1.ctx, SD_CPU_ATTN_C, q, kv, kv, false, 1, 4, 3, 8, 4, pos, bt, bt_off, 1.0f, out),
        SD_ERR_INVALID_ARG);
    pos[0] = -1;
    assert_int_equal(
        sd_cpu_attention_path(f->be1.ctx, SD_CPU_ATTN_C, q, kv, kv, false, 1, 4, 2, 8, 4, pos, bt, bt_off, 1.0f, out),
        SD_ERR_INVALID_ARG);
    if (!sd_cpu_attn_path_available(SD_CPU_ATTN_AVX2)) {
        pos[0] = 0;
        assert_int_equal(sd_cpu_attention_path(f->be1.ctx, SD_CPU_ATTN_AVX2, q, kv, kv, false, 1, 4, 2, 8, 4, pos, bt,
                                               bt_off, 1.0f, out),
                         SD_ERR_UNSUPPORTED);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),
        cmocka_unit_test_setup_teardown(test_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short, setup, teardown),
        cmocka_unit_test_setup_teardown(test_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
