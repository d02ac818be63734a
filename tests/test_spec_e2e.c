/* test_spec_e2e.c — speculative decoding end to end on small random models
 * (written by specd-mkmodel at test start; skipped when it cannot run).
 *
 * Greedy equality: for 20 prompts, K in {1, 4, 8} and the n-gram drafter,
 * the self-draft (first layer of the target) and a separate random draft
 * model with the same vocabulary, speculative greedy output equals plain
 * greedy output token for token (the plain loop is written here, one
 * sd_model_forward per token).
 *
 * (and the target's own weights quantized to Q4_0, a draft that agrees
 * often, so long accepted runs are exercised too; that draft and the
 * self-draft again with a vocabulary cut, draft_vocab, so a draft misses
 * wherever the target's token lies above the cut).
 *
 * Exactness (argument "exact", label slow): a 3-layer target and as draft
 * the same random weights quantized to Q4_0 (close to the target but not
 * equal: both acceptance and rejection happen often), K = 3, at
 * temperature 1.0 and at temperature 0.7 with top-p 0.9. 20,000 seeded runs
 * of plain target sampling (seeds 0..N-1) and 20,000 speculative runs (seeds
 * N..2N-1, so the two samples are independent) generate 4 tokens each; for
 * each of the 4 positions and for the joint of the first two, a two-sample
 * chi-square test of homogeneity must not reject at significance 1e-4. The
 * acceptance rate is printed and must be strictly between 0 and 1, so both
 * the accept and the residual paths are exercised. The same at temperature
 * 1.0 with the draft's vocabulary cut to its first CUT_VOCAB ids (its q is 0
 * above).
 *
 * The rejection rule (argument "reject", label slow): the same tests with
 * sd_sampling.rule = SD_RULE_REJECTION (drafts drawn from q, accepted with
 * probability min(1, p/q), replaced from the residual), at temperature 1.0,
 * and at 0.7 with top-p 0.9 and the draft vocabulary cut. Greedy requests
 * under that rule must still equal plain greedy (test_greedy_equality, K = 4). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "spec_stats.h"
#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

#define SIGNIFICANCE 1e-4
#define VOCAB        300
#define MAX_CTX      128
#define CUT_VOCAB    200 /* the draft vocabulary cut of the cut-draft runs */

static struct {
    char dir[64], target[128], draft[128], draft_q4[128];
    bool ok;
    sd_model *target_model;
    uint64_t hash;
    int32_t n_vocab;
} env;

static int setup_models(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-e2e-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.target, sizeof env.target, "%s/target.gguf", env.dir);
    snprintf(env.draft, sizeof env.draft, "%s/draft.gguf", env.dir);
    snprintf(env.draft_q4, sizeof env.draft_q4, "%s/draft_q4.gguf", env.dir);
    char cmd[1536];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers 3 --vocab %d --seed 21 >/dev/null 2>&1 && "
             "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab %d --seed 22 >/dev/null 2>&1 && "
             "'%s' -o '%s' --layers 3 --vocab %d --seed 21 --dtype q4_0 >/dev/null 2>&1",
             SPECD_MKMODEL, env.target, VOCAB, SPECD_MKMODEL, env.draft, VOCAB, SPECD_MKMODEL, env.draft_q4, VOCAB);
    env.ok = system(cmd) == 0;
    if (!env.ok) return 0;
    sd_gguf *g = NULL;
    char err[128];
    if (sd_gguf_open(env.target, &g, err, sizeof err) != SD_OK) return -1;
    sd_tok *tok = NULL;
    if (sd_tok_from_gguf(g, &tok) != SD_OK) return -1;
    env.hash = sd_tok_vocab_hash(tok);
    env.n_vocab = sd_tok_n_vocab(tok);
    sd_tok_free(&tok);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    sd_status st = sd_model_load(g, &mp, &env.target_model);
    sd_gguf_close(&g);
    return st == SD_OK ? 0 : -1;
}

static int teardown_models(void **state) {
    (void)state;
    sd_model_free(&env.target_model);
    unlink(env.target);
    unlink(env.draft);
    unlink(env.draft_q4);
    rmdir(env.dir);
    return 0;
}

/* Plain decoding: one forward per token, sd_sample_token at each position. */
static void plain_generate(const int32_t *prompt, int32_t n_prompt, int32_t n_new, const sd_sampling *s, int32_t *out) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.target_model, 1, MAX_CTX / 16 + 2, 16, &kv), SD_OK);
    float logits[VOCAB];
    int32_t pos[MAX_CTX], seq[MAX_CTX] = {0};
    bool want[MAX_CTX] = {false};
    for (int32_t i = 0; i < n_prompt; i++) pos[i] = i;
    want[n_prompt - 1] = true;
    sd_batch b = {n_prompt, prompt, pos, seq, want};
    assert_int_equal(sd_model_forward(env.target_model, kv, &b, logits), SD_OK);
    for (int32_t i = 0; i < n_new; i++) {
        int32_t p = n_prompt + i;
        assert_int_equal(sd_sample_token(logits, VOCAB, s, (uint64_t)p, &out[i]), SD_OK);
        if (i + 1 == n_new) break;
        bool one = true;
        sd_batch step = {1, &out[i], &p, seq, &one};
        assert_int_equal(sd_model_forward(env.target_model, kv, &step, logits), SD_OK);
    }
    sd_kv_free(&kv);
}

/* Speculative decoding of n_new tokens after prompt with decoder dec. */
static void spec_generate(sd_spec_decoder *dec, const int32_t *prompt, int32_t n_prompt, int32_t n_new, int32_t k,
                          const sd_sampling *s, int32_t *out) {
    int32_t ctx[MAX_CTX + SD_MAX_K + 1];
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *prompt);
    int32_t n = n_prompt;
    while (n < n_prompt + n_new) {
        int32_t step[SD_MAX_K + 1], n_step;
        assert_int_equal(sd_spec_decoder_step(dec, ctx, n, k, s, step, &n_step, NULL, NULL), SD_OK);
        assert_true(n_step >= 1 && n_step <= k + 1);
        memcpy(ctx + n, step, (size_t)n_step * sizeof *step);
        n += n_step;
    }
    memcpy(out, ctx + n_prompt, (size_t)n_new * sizeof *out);
}

static void make_prompt(int32_t p, int32_t *prompt, int32_t *n_prompt) {
    *n_prompt = 3 + p % 9;
    for (int32_t i = 0; i < *n_prompt; i++) prompt[i] = (int32_t)((p * 131 + i * 71 + (i % 3) * 7) % VOCAB);
    /* Some prompts repeat a chunk, so the n-gram drafter has something to find. */
    if (p % 2 && *n_prompt >= 6) memcpy(prompt + *n_prompt - 3, prompt, 3 * sizeof *prompt);
}

static void test_greedy_equality(void **state) {
    (void)state;
    if (!env.ok) skip();
    enum { N_PROMPTS = 20, N_NEW = 24 };
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = MAX_CTX;
    dp.n_threads = 1;
    enum { N_DRAFTERS = 6 };
    sd_drafter *drafters[N_DRAFTERS] = {NULL};
    assert_int_equal(sd_drafter_ngram_create(&dp, &drafters[0]), SD_OK);
    assert_int_equal(sd_drafter_self_open(env.target, 1, &dp, &drafters[1]), SD_OK);
    assert_int_equal(sd_drafter_model_open(env.draft, env.hash, env.n_vocab, &dp, &drafters[2]), SD_OK);
    assert_int_equal(sd_drafter_model_open(env.draft_q4, env.hash, env.n_vocab, &dp, &drafters[3]), SD_OK);
    sd_drafter_params cut = dp;
    cut.draft_vocab = CUT_VOCAB;
    assert_int_equal(sd_drafter_model_open(env.draft_q4, env.hash, env.n_vocab, &cut, &drafters[4]), SD_OK);
    cut.draft_vocab = CUT_VOCAB / 2;
    assert_int_equal(sd_drafter_self_open(env.target, 1, &cut, &drafters[5]), SD_OK);
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    sd_sampling greedy_rej = greedy;
    greedy_rej.rule = SD_RULE_REJECTION;
    const int32_t ks[3] = {1, 4, 8};
    for (int32_t di = 0; di < N_DRAFTERS; di++) {
        int64_t drafted = 0, accepted = 0;
        for (int32_t ki = 0; ki < 3; ki++) {
            sd_spec_decoder *dec = NULL;
            assert_int_equal(sd_spec_decoder_create(env.target_model, drafters[di], MAX_CTX, &dec), SD_OK);
            for (int32_t p = 0; p < N_PROMPTS; p++) {
                int32_t prompt[16], n_prompt, plain[N_NEW], spec[N_NEW];
                make_prompt(p, prompt, &n_prompt);
                plain_generate(prompt, n_prompt, N_NEW, &greedy, plain);
                spec_generate(dec, prompt, n_prompt, N_NEW, ks[ki], &greedy, spec);
                assert_memory_equal(plain, spec, sizeof plain);
                if (ks[ki] == 4) { /* greedy ignores the verification rule */
                    spec_generate(dec, prompt, n_prompt, N_NEW, ks[ki], &greedy_rej, spec);
                    assert_memory_equal(plain, spec, sizeof plain);
                }
            }
            drafted += sd_spec_decoder_stats(dec)->drafted;
            accepted += sd_spec_decoder_stats(dec)->accepted;
            sd_spec_decoder_free(&dec);
        }
        print_message("  greedy equality with %-5s drafter%s: %lld drafted, %lld accepted\n",
                      sd_drafter_name(drafters[di]), di >= 4 ? " (vocabulary cut)" : "", (long long)drafted,
                      (long long)accepted);
        assert_true(drafted > 0);
        sd_drafter_free(&drafters[di]);
    }
}

static void exactness_at(const sd_sampling *base, int32_t draft_vocab, const char *label) {
    enum { N_RUNS = 20000, N_NEW = 4, K = 3 };
    const int32_t prompt[5] = {1, 77, 78, 150, 9};
    static uint64_t plain_pos[N_NEW][VOCAB], spec_pos[N_NEW][VOCAB];
    static uint64_t plain_joint[VOCAB * VOCAB], spec_joint[VOCAB * VOCAB];
    memset(plain_pos, 0, sizeof plain_pos);
    memset(spec_pos, 0, sizeof spec_pos);
    memset(plain_joint, 0, sizeof plain_joint);
    memset(spec_joint, 0, sizeof spec_joint);
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = MAX_CTX;
    dp.n_threads = 1;
    dp.draft_vocab = draft_vocab;
    sd_drafter *drafter = NULL;
    assert_int_equal(sd_drafter_model_open(env.draft_q4, env.hash, env.n_vocab, &dp, &drafter), SD_OK);
    sd_spec_decoder *dec = NULL;
    assert_int_equal(sd_spec_decoder_create(env.target_model, drafter, MAX_CTX, &dec), SD_OK);
    sd_sampling s = *base;
    for (int32_t r = 0; r < N_RUNS; r++) {
        int32_t plain[N_NEW], spec[N_NEW];
        s.seed = (uint64_t)r;
        plain_generate(prompt, 5, N_NEW, &s, plain);
        s.seed = (uint64_t)(N_RUNS + r);
        spec_generate(dec, prompt, 5, N_NEW, K, &s, spec);
        for (int32_t i = 0; i < N_NEW; i++) {
            plain_pos[i][plain[i]]++;
            spec_pos[i][spec[i]]++;
        }
        plain_joint[plain[0] * VOCAB + plain[1]]++;
        spec_joint[spec[0] * VOCAB + spec[1]]++;
    }
    const sd_spec_stats *st = sd_spec_decoder_stats(dec);
    double rate = st->drafted ? (double)st->accepted / (double)st->drafted : 0;
    print_message("  %s: acceptance %.3f (%lld of %lld), %.2f tokens per target step\n", label, rate,
                  (long long)st->accepted, (long long)st->drafted, (double)st->committed / (double)st->steps);
    assert_true(rate > 0.2 && rate < 0.99);
    for (int32_t i = 0; i < N_NEW; i++) {
        double stat;
        int32_t df;
        double pv = spec_chi2_two_sample(plain_pos[i], spec_pos[i], VOCAB, &stat, &df);
        print_message("    position %d: chi2 %.1f df %d p %.3g\n", (int)i + 1, stat, (int)df, pv);
        assert_true(pv >= SIGNIFICANCE);
    }
    double stat;
    int32_t df;
    double pv = spec_chi2_two_sample(plain_joint, spec_joint, VOCAB * VOCAB, &stat, &df);
    print_message("    joint of 1 and 2: chi2 %.1f df %d p %.3g\n", stat, (int)df, pv);
    assert_true(pv >= SIGNIFICANCE);
    sd_spec_decoder_free(&dec);
    sd_drafter_free(&drafter);
}

static void test_exact_temperature_1(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    exactness_at(&s, 0, "temperature 1.0");
}

static void test_exact_temperature_07_top_p(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.7f;
    s.top_p = 0.9f;
    exactness_at(&s, 0, "temperature 0.7, top-p 0.9");
}

/* The rejection rule (sd_sampling.rule): drafts drawn from the drafter's
 * sparse q, accepted with probability min(1, p/q), replaced from
 * norm(max(0, p - q)); the same two-sample tests against plain sampling. */
static void test_rejection_temperature_1(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f;
    s.rule = SD_RULE_REJECTION;
    exactness_at(&s, 0, "rejection rule, temperature 1.0");
}

static void test_rejection_temperature_07_top_p_cut(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.7f;
    s.top_p = 0.9f;
    s.rule = SD_RULE_REJECTION;
    exactness_at(&s, CUT_VOCAB, "rejection rule, temperature 0.7, top-p 0.9, draft vocabulary cut");
}

static void test_exact_temperature_1_vocab_cut(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f;
    exactness_at(&s, CUT_VOCAB, "temperature 1.0, draft vocabulary cut to 200 of 300");
}

int main(int argc, char **argv) {
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_spec_e2e");
    if (argc > 1 && strcmp(argv[1], "exact") == 0) {
        const struct CMUnitTest exact[] = {
            cmocka_unit_test(test_exact_temperature_1),
            cmocka_unit_test(test_exact_temperature_07_top_p),
            cmocka_unit_test(test_exact_temperature_1_vocab_cut),
        };
        return cmocka_run_group_tests_name("spec_e2e_exact", exact, setup_models, teardown_models);
    }
    if (argc > 1 && strcmp(argv[1], "reject") == 0) {
        const struct CMUnitTest reject[] = {
            cmocka_unit_test(test_rejection_temperature_1),
            cmocka_unit_test(test_rejection_temperature_07_top_p_cut),
        };
        return cmocka_run_group_tests_name("spec_e2e_reject", reject, setup_models, teardown_models);
    }
    const struct CMUnitTest greedy[] = {
        cmocka_unit_test(test_greedy_equality),
    };
    return cmocka_run_group_tests_name("spec_e2e", greedy, setup_models, teardown_models);
}
