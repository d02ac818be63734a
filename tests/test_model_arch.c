/* test_model_arch.c — the architectures beyond Llama (engine/model_arch.c):
 * qwen2, qwen3, gemma3, phi3 and mistral (llama with a sliding window), small
 * random models written by specd-mkmodel at test start (skipped when it
 * cannot run). For each:
 *   - batch invariance, bit for bit: a sequence's logits alone in one call
 *     equal its logits token by token and interleaved with another sequence
 *     in chunks of 3 (the windowed models' sequences are longer than the
 *     window, so the window's edge moves inside a call);
 *   - KV rollback across the window's edge: 30 tokens, truncated to 9,
 *     other tokens appended, truncated again and the original ones
 *     re-appended, gives the fresh computation's logits bit for bit;
 *   - greedy speculative decoding equals plain greedy decoding, with the
 *     n-gram drafter and with a 1-layer random draft of the same
 *     architecture (K = 4, 10 prompts of 24 new tokens);
 * and the refusals: an unknown architecture is named with the supported
 * list; a file without one architecture-specific tensor (a Gemma post-norm,
 * a Qwen bias, a Qwen3 q-norm, Phi-3's fused QKV) is refused with the
 * tensor's name. Phi-3 LongRoPE (the 128k variants) runs all of the above
 * (the phi3-longrope case, its long factors in use), its config carries the
 * file's factors and attention factor (in the scores' scale, squared), the
 * factor set follows sd_model_params.max_ctx, and a file with a factor
 * tensor missing, of the wrong length, with a factor <= 0, or on another
 * architecture is refused naming the tensor (or the architecture). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

#define VOCAB   300
#define MAX_CTX 96

typedef struct arch_case {
    const char *name, *target_args, *draft_args;
} arch_case;

static const arch_case cases[] = {
    {"qwen2", "--arch qwen2 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128 --tied",
     "--arch qwen2 --layers 1 --dim 32 --heads 2 --kv-heads 1 --ff 64 --tied"},
    {"qwen3", "--arch qwen3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 128",
     "--arch qwen3 --layers 1 --dim 32 --heads 2 --kv-heads 2 --head-dim 32 --ff 64"},
    {"gemma3", "--arch gemma3 --layers 7 --dim 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --window 7 --tied",
     "--arch gemma3 --layers 1 --dim 32 --heads 2 --kv-heads 1 --head-dim 32 --ff 64 --window 7 --tied"},
    {"mistral", "--arch mistral --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128 --window 5",
     "--arch mistral --layers 1 --dim 32 --heads 2 --kv-heads 2 --ff 64 --window 5"},
    {"phi3", "--arch phi3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128",
     "--arch phi3 --layers 1 --dim 32 --heads 2 --kv-heads 2 --ff 64"},
    {"phi3-longrope", "--arch phi3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128 --ctx 4096 --longrope 256",
     "--arch phi3 --layers 1 --dim 32 --heads 2 --kv-heads 2 --ff 64 --ctx 4096 --longrope 256"},
};
#define LONGROPE 5 /* cases[LONGROPE]: context 4096 over an original 256 */
#define N_CASES (sizeof cases / sizeof cases[0])

static struct {
    char dir[64];
    char target[N_CASES][128], draft[N_CASES][128];
    bool ok;
} env;

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-arch-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    env.ok = true;
    for (size_t i = 0; i < N_CASES && env.ok; i++) {
        snprintf(env.target[i], sizeof env.target[i], "%s/%s.gguf", env.dir, cases[i].name);
        snprintf(env.draft[i], sizeof env.draft[i], "%s/%s-draft.gguf", env.dir, cases[i].name);
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "'%s' -o '%s' %s --vocab %d --seed 31 >/dev/null 2>&1 && '%s' -o '%s' %s --vocab %d --seed 32 "
                 ">/dev/null 2>&1",
                 SPECD_MKMODEL, env.target[i], cases[i].target_args, VOCAB, SPECD_MKMODEL, env.draft[i],
                 cases[i].draft_args, VOCAB);
        env.ok = system(cmd) == 0;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < N_CASES; i++) unlink(env.target[i]), unlink(env.draft[i]);
    rmdir(env.dir);
    return 0;
}

static sd_model *load(const char *path) {
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK) fail_msg("%s: %s", path, err);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_gguf_close(&g);
    return m;
}

static int32_t tok_of(int32_t seq, int32_t i) { return (seq * 7919 + i * 104729 + 13) % VOCAB; }

/* Logits of tokens [from, to) of sequence seq (positions from..to-1) in
 * calls of `chunk` tokens; other: a second sequence interleaved (slot 1). */
static void run_seq(sd_model *m, sd_kv *kv, int32_t seq, int32_t from, int32_t to, int32_t chunk, bool other,
                    float *out) {
    int32_t tok[2 * MAX_CTX], pos[2 * MAX_CTX], sq[2 * MAX_CTX];
    bool want[2 * MAX_CTX];
    static float buf[2 * MAX_CTX * VOCAB];
    for (int32_t p = from; p < to; p += chunk) {
        int32_t n = 0, end = p + chunk < to ? p + chunk : to;
        for (int32_t q = p; q < end; q++) {
            tok[n] = tok_of(seq, q), pos[n] = q, sq[n] = 0, want[n] = true, n++;
            if (other) tok[n] = tok_of(99, q), pos[n] = q, sq[n] = 1, want[n] = false, n++;
        }
        sd_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = sq, .logits = want};
        assert_int_equal(sd_model_forward(m, kv, &b, buf), SD_OK);
        memcpy(out + (size_t)(p - from) * VOCAB, buf, (size_t)(end - p) * VOCAB * sizeof(float));
    }
}

static void test_invariance_and_rollback(void **state) {
    (void)state;
    if (!env.ok) skip();
    enum { LEN = 30 };
    static float whole[LEN * VOCAB], step[LEN * VOCAB], mixed[LEN * VOCAB], tail[LEN * VOCAB];
    for (size_t i = 0; i < N_CASES; i++) {
        sd_model *m = load(env.target[i]);
        sd_kv *kv = NULL;
        assert_int_equal(sd_model_kv_create(m, 2, 16, 4, &kv), SD_OK);
        run_seq(m, kv, 0, 0, LEN, LEN, false, whole);
        assert_int_equal(sd_kv_truncate(kv, 0, 0), SD_OK);
        run_seq(m, kv, 0, 0, LEN, 1, false, step);
        assert_memory_equal(whole, step, sizeof whole);
        assert_int_equal(sd_kv_truncate(kv, 0, 0), SD_OK);
        run_seq(m, kv, 0, 0, LEN, 3, true, mixed);
        assert_memory_equal(whole, mixed, sizeof whole);
        /* rollback: truncate to 9, append other tokens, truncate, re-append */
        assert_int_equal(sd_kv_truncate(kv, 1, 0), SD_OK);
        assert_int_equal(sd_kv_truncate(kv, 0, 9), SD_OK);
        run_seq(m, kv, 5, 9, 20, 4, false, tail);
        assert_int_equal(sd_kv_truncate(kv, 0, 9), SD_OK);
        run_seq(m, kv, 0, 9, LEN, 7, false, tail);
        assert_memory_equal(whole + 9 * VOCAB, tail, (size_t)(LEN - 9) * VOCAB * sizeof(float));
        print_message("  %s: batch-invariant and exact after rollback over %d tokens\n", cases[i].name, LEN);
        sd_kv_free(&kv);
        sd_model_free(&m);
    }
}

static void plain_generate(sd_model *m, const int32_t *prompt, int32_t n_prompt, int32_t n_new, int32_t *out) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, MAX_CTX / 16 + 2, 16, &kv), SD_OK);
    float logits[VOCAB];
    int32_t pos[MAX_CTX], seq[MAX_CTX] = {0};
    bool want[MAX_CTX] = {false};
    for (int32_t i = 0; i < n_prompt; i++) pos[i] = i;
    want[n_prompt - 1] = true;
    sd_batch b = {n_prompt, prompt, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, logits), SD_OK);
    for (int32_t i = 0; i < n_new; i++) {
        int32_t best = 0, p = n_prompt + i;
        for (int32_t v = 1; v < VOCAB; v++)
            if (logits[v] > logits[best]) best = v;
        out[i] = best;
        if (i + 1 == n_new) break;
        bool one = true;
        sd_batch s = {1, &out[i], &p, seq, &one};
        assert_int_equal(sd_model_forward(m, kv, &s, logits), SD_OK);
    }
    sd_kv_free(&kv);
}

static void test_greedy_spec_equals_plain(void **state) {
    (void)state;
    if (!env.ok) skip();
    enum { N_PROMPTS = 10, N_NEW = 24, K = 4 };
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        sd_gguf *g = NULL;
        char err[256];
        assert_int_equal(sd_gguf_open(env.target[i], &g, err, sizeof err), SD_OK);
        sd_tok *tok = NULL;
        assert_int_equal(sd_tok_from_gguf(g, &tok), SD_OK);
        uint64_t hash = sd_tok_vocab_hash(tok);
        int32_t n_vocab = sd_tok_n_vocab(tok);
        sd_tok_free(&tok);
        sd_gguf_close(&g);
        sd_model *m = load(env.target[i]);
        sd_drafter_params dp = sd_drafter_default_params();
        dp.max_ctx = MAX_CTX;
        dp.n_threads = 1;
        sd_drafter *drafters[2] = {NULL, NULL};
        assert_int_equal(sd_drafter_ngram_create(&dp, &drafters[0]), SD_OK);
        assert_int_equal(sd_drafter_model_open(env.draft[i], hash, n_vocab, &dp, &drafters[1]), SD_OK);
        for (int d = 0; d < 2; d++) {
            sd_spec_decoder *dec = NULL;
            assert_int_equal(sd_spec_decoder_create(m, drafters[d], MAX_CTX, &dec), SD_OK);
            for (int32_t p = 0; p < N_PROMPTS; p++) {
                int32_t prompt[16], n_prompt = 3 + p % 9, plain[N_NEW], ctx[MAX_CTX + SD_MAX_K + 1];
                for (int32_t j = 0; j < n_prompt; j++) prompt[j] = (p * 131 + j * 71 + (j % 3) * 7) % VOCAB;
                if (p % 2 && n_prompt >= 6) memcpy(prompt + n_prompt - 3, prompt, 3 * sizeof *prompt);
                plain_generate(m, prompt, n_prompt, N_NEW, plain);
                memcpy(ctx, prompt, (size_t)n_prompt * sizeof *prompt);
                int32_t n = n_prompt;
                while (n < n_prompt + N_NEW) {
                    int32_t stepv[SD_MAX_K + 1], n_step;
                    assert_int_equal(sd_spec_decoder_step(dec, ctx, n, K, &greedy, stepv, &n_step, NULL, NULL),
                                     SD_OK);
                    memcpy(ctx + n, stepv, (size_t)n_step * sizeof *stepv);
                    n += n_step;
                }
                assert_memory_equal(plain, ctx + n_prompt, sizeof plain);
            }
            print_message("  %s greedy spec == plain with the %s drafter: %lld drafted, %lld accepted\n",
                          cases[i].name, sd_drafter_name(drafters[d]), (long long)sd_spec_decoder_stats(dec)->drafted,
                          (long long)sd_spec_decoder_stats(dec)->accepted);
            sd_spec_decoder_free(&dec);
            sd_drafter_free(&drafters[d]);
        }
        sd_model_free(&m);
    }
}

/* ---- refusals: the log lines are kept to look for names in them ---- */

static char logged[4096];
static void keep_log(sd_log_level level, const char *line, void *user) {
    (void)level, (void)user;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%s\n", line);
}

/* Copies src into dst with general.architecture set to arch (NULL: kept),
 * tensor skip left out (NULL: none) and f32 key add set to 1 (NULL: none). */
static void rewrite(const char *src, const char *dst, const char *arch, const char *skip, const char *add) {
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(src, &g, err, sizeof err), SD_OK);
    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(sd_gguf_writer_copy_kv(w, g, ""), SD_OK);
    if (arch) assert_int_equal(sd_gguf_writer_set_str(w, "general.architecture", arch), SD_OK);
    if (add) assert_int_equal(sd_gguf_writer_set_f32(w, add, 1.0f), SD_OK);
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
        if (skip && strcmp(t->name, skip) == 0) continue;
        assert_int_equal(sd_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), SD_OK);
    }
    assert_int_equal(sd_gguf_writer_write(w, dst), SD_OK);
    sd_gguf_writer_free(&w);
    sd_gguf_close(&g);
}

static sd_status config_of(const char *path) {
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    sd_model_config c;
    logged[0] = 0;
    sd_log_set(keep_log, NULL, SD_LOG_WARN, "test_model_arch");
    sd_status s = sd_model_config_from_gguf(g, &c);
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_model_arch");
    sd_gguf_close(&g);
    return s;
}

static void test_refusals(void **state) {
    (void)state;
    if (!env.ok) skip();
    char path[160];
    snprintf(path, sizeof path, "%s/refused.gguf", env.dir);
    rewrite(env.target[0], path, "mamba", NULL, NULL);
    assert_int_equal(config_of(path), SD_ERR_UNSUPPORTED);
    assert_non_null(strstr(logged, "'mamba'"));
    assert_non_null(strstr(logged, SD_MODEL_ARCHS));
    const struct {
        size_t model;
        const char *tensor;
    } missing[] = {
        {2, "blk.3.post_ffw_norm.weight"},
        {2, "blk.0.post_attention_norm.weight"},
        {0, "blk.1.attn_k.bias"},
        {1, "blk.0.attn_q_norm.weight"},
        {4, "blk.1.attn_qkv.weight"},
    };
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        rewrite(env.target[missing[i].model], path, NULL, missing[i].tensor, NULL);
        assert_int_equal(config_of(path), SD_ERR_FORMAT);
        if (!strstr(logged, missing[i].tensor)) fail_msg("refusal does not name %s: %s", missing[i].tensor, logged);
    }
    /* an attention factor without LongRoPE's factors: applied all the same, as llama.cpp does */
    rewrite(env.target[4], path, NULL, NULL, "phi3.rope.scaling.attn_factor");
    assert_int_equal(config_of(path), SD_OK);
    /* the unmodified files pass the same check */
    rewrite(env.target[2], path, NULL, NULL, NULL);
    assert_int_equal(config_of(path), SD_OK);
    rewrite(env.target[4], path, NULL, NULL, NULL);
    assert_int_equal(config_of(path), SD_OK);
    unlink(path);
}

/* Copies src into dst with LongRoPE tensor name replaced (or added) by n
 * floats, the middle one v (n 0: left out). */
static void rewrite_factors(const char *src, const char *dst, const char *name, uint64_t n, float v) {
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(src, &g, err, sizeof err), SD_OK);
    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(sd_gguf_writer_copy_kv(w, g, ""), SD_OK);
    float f[64];
    for (size_t i = 0; i < 64; i++) f[i] = 1.0f + (float)i / 64.0f;
    f[n / 2] = v;
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
        if (strcmp(t->name, name) != 0)
            assert_int_equal(sd_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), SD_OK);
    }
    if (n) assert_int_equal(sd_gguf_writer_add_tensor(w, name, SD_DTYPE_F32, 1, (uint64_t[]){n}, f), SD_OK);
    assert_int_equal(sd_gguf_writer_write(w, dst), SD_OK);
    sd_gguf_writer_free(&w);
    sd_gguf_close(&g);
}

static void test_longrope(void **state) {
    (void)state;
    if (!env.ok) skip();
    const char *lr = env.target[LONGROPE];
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(lr, &g, err, sizeof err), SD_OK);
    sd_model_config c;
    assert_int_equal(sd_model_config_from_gguf(g, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, SD_ROPE_LONGROPE);
    assert_int_equal(c.rope_orig_ctx, 256);
    assert_int_equal(c.n_ctx_train, 4096);
    float af = 0.0f;
    assert_int_equal(sd_gguf_get_f32(g, "phi3.rope.scaling.attn_factor", &af), SD_OK);
    assert_true(af > 1.1f && c.rope_attn_factor == af); /* sqrt(1 + ln 16 / ln 256) = 1.225 */
    assert_float_equal(c.attn_scale, af * af / 4.0f, 1e-6); /* head_dim 16 */
    const sd_gguf_tensor *tl = sd_gguf_find_tensor(g, "rope_factors_long.weight");
    const sd_gguf_tensor *ts = sd_gguf_find_tensor(g, "rope_factors_short.weight");
    assert_non_null(tl);
    assert_non_null(ts);
    assert_memory_equal(c.rope_factors_long, tl->data, 8 * sizeof(float));
    assert_memory_equal(c.rope_factors_short, ts->data, 8 * sizeof(float));
    /* the rule: long above the original context, short at or below it */
    assert_ptr_equal(sd_model_rope_factors(&c, 0), c.rope_factors_long);
    assert_ptr_equal(sd_model_rope_factors(&c, 257), c.rope_factors_long);
    assert_ptr_equal(sd_model_rope_factors(&c, 256), c.rope_factors_short);
    sd_gguf_close(&g);

    /* the set chosen at load moves the logits: short (max_ctx 256) differs from long (the default) */
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    float lg[2][4 * VOCAB];
    for (int set = 0; set < 2; set++) {
        mp.max_ctx = set ? 256 : 0;
        assert_int_equal(sd_gguf_open(lr, &g, err, sizeof err), SD_OK);
        sd_model *m = NULL;
        assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
        sd_gguf_close(&g);
        sd_kv *kv = NULL;
        assert_int_equal(sd_model_kv_create(m, 1, 4, 16, &kv), SD_OK);
        int32_t tok[4] = {5, 17, 200, 33}, pos[4] = {0, 1, 2, 3}, sq[4] = {0};
        bool want[4] = {true, true, true, true};
        sd_batch b = {.n_tokens = 4, .tokens = tok, .pos = pos, .seq = sq, .logits = want};
        assert_int_equal(sd_model_forward(m, kv, &b, lg[set]), SD_OK);
        sd_kv_free(&kv);
        sd_model_free(&m);
    }
    assert_memory_equal(lg[0], lg[1], VOCAB * sizeof(float)); /* position 0 does not rotate */
    assert_memory_not_equal(lg[0] + VOCAB, lg[1] + VOCAB, 3 * VOCAB * sizeof(float));

    /* refusals, each naming what is wrong */
    char path[160];
    snprintf(path, sizeof path, "%s/longrope.gguf", env.dir);
    const struct {
        const char *tensor;
        uint64_t n;
        float v;
        const char *named;
    } bad[] = {
        {"rope_factors_short.weight", 0, 1.0f, "rope_factors_short.weight"},
        {"rope_factors_long.weight", 0, 1.0f, "rope_factors_long.weight"},
        {"rope_factors_long.weight", 7, 1.0f, "rope_factors_long.weight has shape [7], expected [8]"},
        {"rope_factors_short.weight", 16, 1.0f, "rope_factors_short.weight has shape [16], expected [8]"},
        {"rope_factors_long.weight", 8, 0.0f, "rope_factors_long.weight[4]"},
        {"rope_factors_short.weight", 8, -2.0f, "rope_factors_short.weight[4]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rewrite_factors(lr, path, bad[i].tensor, bad[i].n, bad[i].v);
        assert_int_equal(config_of(path), SD_ERR_FORMAT);
        if (!strstr(logged, bad[i].named)) fail_msg("refusal does not name %s: %s", bad[i].named, logged);
    }
    rewrite_factors(lr, path, "rope_factors_short.weight", 8, 1.5f); /* a well-formed replacement loads */
    assert_int_equal(config_of(path), SD_OK);
    rewrite_factors(env.target[3], path, "rope_factors_long.weight", 8, 1.0f); /* mistral: llama */
    assert_int_equal(config_of(path), SD_ERR_UNSUPPORTED);
    if (!strstr(logged, "phi3 only")) fail_msg("LongRoPE on llama is not refused by name: %s", logged);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariance_and_rollback),
        cmocka_unit_test(test_greedy_spec_equals_plain),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_longrope),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
