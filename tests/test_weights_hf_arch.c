/* test_weights_hf_arch.c — Hugging Face checkpoints of the architectures
 * beyond Llama (weights_hf_config.c, weights_hf.c) against the same model as
 * GGUF.
 *
 * specd-mkmodel writes each random model twice from one seed: as GGUF and as
 * an HF directory (Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM,
 * Phi3ForCausalLM, MistralForCausalLM; f32, and bf16 for Gemma where the
 * norm weights go through w = (1 + w) - 1 in bf16). For each pair:
 *   - the configs are equal field by field, the architecture's own fields
 *     included (biases, q/k norms, post-norms, GeGLU, embedding and query
 *     scales, window, local / global pattern and RoPE bases, fused matrices);
 *   - every tensor the architecture reads (sd_model_config_tensors) reads
 *     back as the same f32 numbers, whole and in tensor-parallel row ranges;
 *   - the tokenizers have the same vocabulary hash and encodings;
 *   - the loaded models give bit-identical logits on a ragged batch whose
 *     longer sequence runs past the window.
 * Then the refusals: a checkpoint without one architecture-specific tensor
 * (a Qwen2 bias, a Qwen3 q_norm, a Gemma post-norm, Phi-3's gate_up_proj) is
 * refused naming it; an unknown architectures entry names the supported
 * list; Gemma3ForConditionalGeneration, Phi-3 YaRN, Gemma's logit
 * soft-capping or an irregular layer_types, and Qwen's use_sliding_window
 * are refused by name; Phi-3 LongRoPE (a pair above) reads its factors, its
 * original context from either place, its attention factor given or
 * derived, "su" as "longrope", and refuses a factor list of the wrong
 * length, a factor <= 0 or a missing list, naming the key; a Gemma norm stored as GGUF's 1 + w changes the
 * logits (the loader's + 1 is needed). A qwen2 GGUF with the "qwen2"
 * pre-tokenizer becomes a tokenizer.json with Qwen2's split that encodes the
 * same. With --shapes
 * (slow): Qwen2.5-0.5B, Qwen3-0.6B and Gemma-3-270M shapes, equal configs
 * and bit-identical logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/safetensors.h"
#include "specd/weights.h"
#include "weights_hf_impl.h"

#define VOCAB 300

typedef struct pair {
    const char *label, *cls;
    const char *args; /* specd-mkmodel arguments shared by both files */
    char gguf[160], hf[160];
} pair;

static pair PAIRS[] = {
    {"qwen2", "Qwen2ForCausalLM", "--arch qwen2 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 96 --seed 21", "", ""},
    {"qwen2 tied f16", "Qwen2ForCausalLM",
     "--arch qwen2 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 96 --tied --dtype f16 --seed 22", "", ""},
    {"qwen3", "Qwen3ForCausalLM",
     "--arch qwen3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 --seed 23", "", ""},
    {"gemma3", "Gemma3ForCausalLM",
     "--arch gemma3 --layers 7 --dim 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 96 --window 5 --tied --seed 24", "",
     ""},
    {"gemma3 bf16", "Gemma3ForCausalLM",
     "--arch gemma3 --layers 6 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ff 96 --window 3 --dtype bf16 "
     "--norm-dtype bf16 --seed 25",
     "", ""},
    {"phi3", "Phi3ForCausalLM", "--arch phi3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 96 --seed 26", "", ""},
    {"mistral", "MistralForCausalLM",
     "--arch mistral --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 96 --window 5 --seed 27", "", ""},
    {"phi3 LongRoPE", "Phi3ForCausalLM",
     "--arch phi3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 96 --ctx 4096 --longrope 256 --seed 28", "", ""},
};
#define N_PAIRS (sizeof PAIRS / sizeof PAIRS[0])
enum { P_QWEN2, P_QWEN2_TIED, P_QWEN3, P_GEMMA, P_GEMMA_BF16, P_PHI3, P_MISTRAL, P_PHI3_LONGROPE };

static struct {
    char dir[64];
    bool ok;
} env;

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-hfarch-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    env.ok = true;
    for (size_t i = 0; i < N_PAIRS; i++) {
        pair *p = &PAIRS[i];
        snprintf(p->gguf, sizeof p->gguf, "%s/m%zu.gguf", env.dir, i);
        snprintf(p->hf, sizeof p->hf, "%s/m%zu-hf", env.dir, i);
        env.ok &= run("'%s' -o '%s' --vocab %d %s >/dev/null 2>&1", SPECD_MKMODEL, p->gguf, VOCAB, p->args) == 0;
        env.ok &=
            run("'%s' -o '%s' --vocab %d %s --format hf >/dev/null 2>&1", SPECD_MKMODEL, p->hf, VOCAB, p->args) == 0;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (env.dir[0]) run("rm -rf '%s'", env.dir);
    return 0;
}

static sd_weights *open_ok(const char *path) {
    sd_weights *w = NULL;
    sd_status s = sd_weights_open(path, &w);
    if (s != SD_OK) fail_msg("cannot open %s: %s", path, sd_status_str(s));
    return w;
}

/* ------------------------------------------------------------ same numbers */

static void expect_same_config(const char *label, const sd_model_config *a, const sd_model_config *b) {
    assert_string_equal(a->arch, b->arch);
#define SAME(f) \
    if (a->f != b->f) fail_msg("%s: config field " #f " differs (%g vs %g)", label, (double)a->f, (double)b->f)
    SAME(arch_id);
    SAME(n_vocab);
    SAME(n_ctx_train);
    SAME(n_embd);
    SAME(n_layers);
    SAME(n_ff);
    SAME(n_heads);
    SAME(n_kv_heads);
    SAME(head_dim);
    SAME(rms_eps);
    SAME(rope_base);
    SAME(rope_scaling_type);
    SAME(rope_scale_factor);
    SAME(rope_orig_ctx);
    SAME(rope_attn_factor);
    if (memcmp(a->rope_factors_long, b->rope_factors_long, sizeof a->rope_factors_long) != 0 ||
        memcmp(a->rope_factors_short, b->rope_factors_short, sizeof a->rope_factors_short) != 0)
        fail_msg("%s: LongRoPE factors differ", label);
    SAME(tied_output);
    SAME(qkv_bias);
    SAME(qk_norm);
    SAME(post_norms);
    SAME(rope_neox);
    SAME(gelu);
    SAME(fused_qkv);
    SAME(fused_gate_up);
    SAME(embd_scale);
    SAME(attn_scale);
    SAME(sliding_window);
    SAME(rope_base_swa);
    if (a->sliding_window) SAME(swa_pattern);
#undef SAME
}

typedef struct cmp_ctx {
    const sd_weights *g, *h;
    int32_t head_dim;
    int n_tensors;
} cmp_ctx;

/* Reads the same rectangle from both sources and compares the bits. */
static void expect_same_rect(const cmp_ctx *c, const char *name, int64_t row0, int64_t rows) {
    sd_weights_tensor t;
    assert_true(sd_weights_find(c->g, name, &t));
    int64_t cols = t.ne[0];
    size_t n = (size_t)(rows * cols);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(sd_weights_read(c->g, name, row0, rows, 0, cols, a), SD_OK);
    assert_int_equal(sd_weights_read(c->h, name, row0, rows, 0, cols, b), SD_OK);
    if (memcmp(a, b, n * sizeof *a) != 0) {
        size_t k = 0;
        while (a[k] == b[k]) k++;
        fail_msg("%s rows [%lld, +%lld): element %zu differs (%g vs %g)", name, (long long)row0, (long long)rows, k,
                 (double)a[k], (double)b[k]);
    }
    free(a);
    free(b);
}

static sd_status compare_tensor(const sd_model_tensor *t, void *ctx) {
    cmp_ctx *c = ctx;
    sd_weights_tensor tg, th;
    assert_true(sd_weights_find(c->g, t->name, &tg));
    if (!sd_weights_find(c->h, t->name, &th)) fail_msg("%s: not in the HF checkpoint", t->name);
    assert_int_equal(tg.n_dims, th.n_dims);
    assert_int_equal(tg.ne[0], th.ne[0]);
    assert_int_equal(tg.ne[1], th.ne[1]);
    expect_same_rect(c, t->name, 0, tg.ne[1]);
    if (tg.n_dims == 2 && tg.ne[1] >= 2 * c->head_dim) { /* rank 1 of 2, an odd single row */
        expect_same_rect(c, t->name, tg.ne[1] / 2, tg.ne[1] / 2);
        expect_same_rect(c, t->name, c->head_dim + 3, 1);
    }
    c->n_tensors++;
    return SD_OK;
}

static void test_same_numbers(void **state) {
    (void)state;
    if (!env.ok) skip();
    for (size_t i = 0; i < N_PAIRS; i++) {
        const pair *p = &PAIRS[i];
        sd_weights *g = open_ok(p->gguf), *h = open_ok(p->hf);
        sd_model_config cg, ch;
        assert_int_equal(sd_weights_config(g, &cg), SD_OK);
        assert_int_equal(sd_weights_config(h, &ch), SD_OK);
        expect_same_config(p->label, &cg, &ch);
        cmp_ctx c = {.g = g, .h = h, .head_dim = cg.head_dim};
        assert_int_equal(sd_model_config_tensors(&cg, compare_tensor, &c), SD_OK);
        assert_true(c.n_tensors > 3 + 9 * cg.n_layers - 4 * cg.n_layers); /* at least llama's less fused ones */

        sd_tok *tg = NULL, *th = NULL;
        assert_int_equal(sd_weights_tokenizer(g, &tg), SD_OK);
        assert_int_equal(sd_weights_tokenizer(h, &th), SD_OK);
        assert_true(sd_tok_vocab_hash(tg) == sd_tok_vocab_hash(th));
        assert_int_equal(sd_tok_bos(tg), sd_tok_bos(th));
        assert_int_equal(sd_tok_eos(tg), sd_tok_eos(th));
        static const char *const texts[] = {"the quick brown fox 12345", "  x\t\ny!", "caf\xc3\xa9 \xe4\xb8\xad"};
        for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
            int32_t *ia = NULL, *ib = NULL;
            size_t na = 0, nb = 0;
            assert_int_equal(sd_tok_encode(tg, texts[t], strlen(texts[t]), true, &ia, &na), SD_OK);
            assert_int_equal(sd_tok_encode(th, texts[t], strlen(texts[t]), true, &ib, &nb), SD_OK);
            assert_int_equal(na, nb);
            assert_memory_equal(ia, ib, na * sizeof *ia);
            free(ia);
            free(ib);
        }
        sd_tok_free(&tg);
        sd_tok_free(&th);
        sd_weights_close(&g);
        sd_weights_close(&h);
    }
}

/* Logits of a two-sequence ragged batch (4 and 8 tokens: past the windows),
 * all rows: [n_rows][*n_vocab]. */
static float *batch_logits(const char *path, int32_t *n_rows, int32_t *n_vocab) {
    sd_weights *w = open_ok(path);
    sd_model_config cfg;
    assert_int_equal(sd_weights_config(w, &cfg), SD_OK);
    *n_vocab = cfg.n_vocab;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load_weights(w, &mp, &m), SD_OK);
    sd_weights_close(&w);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 2, 8, 16, &kv), SD_OK);
    enum { N = 12 };
    const int32_t tokens[N] = {5, 17, 99, 3, 250, 42, 7, 8, 11, 200, 1, 2};
    int32_t pos[N], seq[N], next[2] = {0, 0};
    bool want[N];
    for (int32_t i = 0; i < N; i++) {
        seq[i] = i % 3 == 0;
        pos[i] = next[seq[i]]++;
        want[i] = true;
    }
    float *out = malloc((size_t)N * (size_t)cfg.n_vocab * sizeof *out);
    assert_non_null(out);
    sd_batch b = {.n_tokens = N, .tokens = tokens, .pos = pos, .seq = seq, .logits = want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    sd_kv_free(&kv);
    sd_model_free(&m);
    *n_rows = N;
    return out;
}

/* The logits of pairs[0..n) bit for bit equal between GGUF and HF. */
static void expect_same_logits(const pair *pairs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t na, nb, va, vb;
        float *a = batch_logits(pairs[i].gguf, &na, &va), *b = batch_logits(pairs[i].hf, &nb, &vb);
        assert_int_equal(na, nb);
        assert_int_equal(va, vb);
        size_t n_all = (size_t)na * (size_t)va;
        if (memcmp(a, b, n_all * sizeof *a) != 0) fail_msg("%s: logits differ", pairs[i].label);
        float lo = a[0], hi = a[0];
        for (size_t k = 0; k < n_all; k++) {
            lo = a[k] < lo ? a[k] : lo;
            hi = a[k] > hi ? a[k] : hi;
        }
        if (!(hi - lo > 1.0f)) fail_msg("%s: degenerate logits", pairs[i].label);
        free(a);
        free(b);
    }
}

static void test_same_logits(void **state) {
    (void)state;
    if (!env.ok) skip();
    expect_same_logits(PAIRS, N_PAIRS);
}

/* --shapes (slow): the real models' shapes (specd-mkmodel --shape, bf16),
 * GGUF and HF: equal configs and bit-identical logits. Mistral-7B and
 * Phi-3-mini (14 and 7.6 GB in bf16) are left to the small pairs above. */
static pair SHAPES[] = {
    {"qwen2.5-0.5b", "Qwen2ForCausalLM", "--shape qwen2.5-0.5b --dtype bf16 --seed 31", "", ""},
    {"qwen3-0.6b", "Qwen3ForCausalLM", "--shape qwen3-0.6b --dtype bf16 --seed 32", "", ""},
    {"gemma3-270m", "Gemma3ForCausalLM", "--shape gemma3-270m --dtype bf16 --seed 33", "", ""},
};

static void test_shapes(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        pair *p = &SHAPES[i];
        snprintf(p->gguf, sizeof p->gguf, "%s/shape.gguf", env.dir);
        snprintf(p->hf, sizeof p->hf, "%s/shape-hf", env.dir);
        assert_int_equal(run("'%s' -o '%s' %s >/dev/null 2>&1", SPECD_MKMODEL, p->gguf, p->args), 0);
        assert_int_equal(
            run("rm -rf '%s' && '%s' -o '%s' %s --format hf >/dev/null 2>&1", p->hf, SPECD_MKMODEL, p->hf, p->args), 0);
        sd_weights *g = open_ok(p->gguf), *h = open_ok(p->hf);
        sd_model_config cg, ch;
        assert_int_equal(sd_weights_config(g, &cg), SD_OK);
        assert_int_equal(sd_weights_config(h, &ch), SD_OK);
        expect_same_config(p->label, &cg, &ch);
        sd_weights_close(&g);
        sd_weights_close(&h);
        expect_same_logits(p, 1);
        run("rm -rf '%s' '%s'", p->gguf, p->hf);
    }
}

/* ------------------------------------------------------------- refusals */

static char logged[8192];
static void keep_log(sd_log_level level, const char *line, void *user) {
    (void)level, (void)user;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%s\n", line);
}

/* Opens dir expecting want; the log lines are left in `logged`. */
static void expect_open(const char *dir, sd_status want, const char *what) {
    sd_weights *w = NULL;
    logged[0] = 0;
    sd_log_set(keep_log, NULL, SD_LOG_WARN, "test_weights_hf_arch");
    sd_status s = sd_weights_open(dir, &w);
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_weights_hf_arch");
    if (s != want) fail_msg("%s: expected %s, got %s: %s", what, sd_status_str(want), sd_status_str(s), logged);
    sd_weights_close(&w);
}

static void copy_hf(size_t i, char *dst, size_t cap) {
    snprintf(dst, cap, "%s/broken", env.dir);
    assert_int_equal(run("rm -rf '%s' && cp -r '%s' '%s'", dst, PAIRS[i].hf, dst), 0);
}

/* Sets config.json's key to a parsed JSON value. */
static void set_config(const char *dir, const char *key, const char *json) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddItemToObject(j, key, cJSON_Parse(json));
    char *text = cJSON_PrintUnformatted(j);
    f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(j);
}

/* Rewrites dir/model.safetensors without tensor drop. */
static void drop_tensor(const char *dir, const char *drop) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sd_safetensors *st = NULL;
    assert_int_equal(sd_safetensors_open(path, &st, err, sizeof err), SD_OK);
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    bool found = false;
    for (int64_t i = 0; i < sd_safetensors_n_tensors(st); i++) {
        const sd_safetensors_tensor *t = sd_safetensors_tensor_at(st, i);
        if (strcmp(t->name, drop) == 0) {
            found = true;
            continue;
        }
        assert_int_equal(sd_safetensors_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->shape, t->data), SD_OK);
    }
    if (!found) fail_msg("%s has no tensor %s to drop", dir, drop);
    sd_safetensors_close(&st);
    assert_int_equal(sd_safetensors_writer_write(w, path), SD_OK);
    sd_safetensors_writer_free(&w);
}

static void test_missing_tensors(void **state) {
    (void)state;
    if (!env.ok) skip();
    static const struct {
        size_t pair;
        const char *tensor;
    } missing[] = {
        {P_QWEN2, "model.layers.1.self_attn.k_proj.bias"},
        {P_QWEN2, "model.layers.0.self_attn.v_proj.bias"},
        {P_QWEN3, "model.layers.0.self_attn.q_norm.weight"},
        {P_GEMMA, "model.layers.3.post_feedforward_layernorm.weight"},
        {P_GEMMA, "model.layers.0.post_attention_layernorm.weight"},
        {P_GEMMA, "model.layers.6.pre_feedforward_layernorm.weight"},
        {P_GEMMA, "model.layers.2.self_attn.k_norm.weight"},
        {P_PHI3, "model.layers.1.mlp.gate_up_proj.weight"},
        {P_PHI3, "model.layers.0.self_attn.qkv_proj.weight"},
    };
    char d[256];
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        copy_hf(missing[i].pair, d, sizeof d);
        drop_tensor(d, missing[i].tensor);
        expect_open(d, SD_ERR_FORMAT, missing[i].tensor);
        if (!strstr(logged, missing[i].tensor)) fail_msg("refusal does not name %s: %s", missing[i].tensor, logged);
        if (!strstr(logged, PAIRS[missing[i].pair].cls))
            fail_msg("refusal does not name the architecture %s: %s", PAIRS[missing[i].pair].cls, logged);
    }
    copy_hf(P_QWEN2, d, sizeof d); /* the untouched copy opens */
    expect_open(d, SD_OK, "qwen2 copy");
}

static void test_refused_configs(void **state) {
    (void)state;
    if (!env.ok) skip();
    static const struct {
        size_t pair;
        const char *key, *json, *named;
    } cases[] = {
        {P_QWEN2, "architectures", "[\"GPTNeoXForCausalLM\"]", "'GPTNeoXForCausalLM'"},
        {P_QWEN3, "model_type", "\"qwen2\"", "model_type 'qwen2'"},
        {P_PHI3, "rope_scaling", "{\"type\":\"yarn\",\"factor\":4}", "'yarn'"},
        {P_PHI3, "partial_rotary_factor", "0.75", "partial_rotary_factor"},
        {P_GEMMA, "final_logit_softcapping", "30.0", "final_logit_softcapping"},
        {P_GEMMA, "layer_types",
         "[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\","
         "\"sliding_attention\",\"full_attention\"]",
         "layer_types"},
        {P_GEMMA, "hidden_activation", "\"gelu\"", "hidden_activation"},
        {P_QWEN2, "use_sliding_window", "true", "use_sliding_window"},
        {P_MISTRAL, "mlp_bias", "true", "mlp_bias"},
    };
    char d[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_hf(cases[i].pair, d, sizeof d);
        set_config(d, cases[i].key, cases[i].json);
        expect_open(d, SD_ERR_UNSUPPORTED, cases[i].named);
        if (!strstr(logged, cases[i].named)) fail_msg("refusal does not name %s: %s", cases[i].named, logged);
    }
    /* the unknown class comes with the supported list */
    copy_hf(P_QWEN2, d, sizeof d);
    set_config(d, "architectures", "[\"GPTNeoXForCausalLM\"]");
    expect_open(d, SD_ERR_UNSUPPORTED, "unknown class");
    assert_non_null(strstr(logged, SD_HF_ARCHS));
    /* what is accepted: Gemma's older sliding_window_pattern alone, Mistral's null window */
    copy_hf(P_GEMMA, d, sizeof d);
    set_config(d, "layer_types", "null");
    expect_open(d, SD_OK, "gemma3 with sliding_window_pattern only");
    copy_hf(P_MISTRAL, d, sizeof d);
    set_config(d, "sliding_window", "null");
    sd_weights *w = open_ok(d);
    sd_model_config c;
    assert_int_equal(sd_weights_config(w, &c), SD_OK);
    assert_int_equal(c.sliding_window, 0);
    sd_weights_close(&w);
}

/* The loader's + 1 is what makes Gemma's logits equal: a checkpoint whose
 * norm holds GGUF's 1 + w (a converter that forgot Gemma3RMSNorm's form)
 * loads, but its logits differ from the GGUF's. */
/* Phi-3 LongRoPE's config.json forms (the pair's own is checked against its GGUF above). */
static void test_longrope_configs(void **state) {
    (void)state;
    if (!env.ok) skip();
#define F8 "[1,1.1,1.2,1.3,1.4,1.5,1.6,1.7]"
    static const struct {
        const char *json, *named; /* named NULL: opens */
        float attn_factor;        /* when it opens */
    } cases[] = {
        {"{\"type\":\"su\",\"long_factor\":" F8 ",\"short_factor\":" F8 "}", NULL, 1.2247449f},
        {"{\"rope_type\":\"longrope\",\"long_factor\":" F8 ",\"short_factor\":" F8 ",\"attention_factor\":1.5}", NULL,
         1.5f},
        {"{\"type\":\"longrope\",\"long_factor\":[1,2,3],\"short_factor\":" F8 "}", "rope_scaling.long_factor", 0},
        {"{\"type\":\"longrope\",\"long_factor\":" F8 ",\"short_factor\":[1,1,1,1,0,1,1,1]}",
         "rope_scaling.short_factor[4]", 0},
        {"{\"type\":\"longrope\",\"long_factor\":" F8 "}", "rope_scaling.short_factor", 0},
        {"{\"type\":\"longrope\",\"long_factor\":" F8 ",\"short_factor\":\"x\"}", "rope_scaling.short_factor", 0},
    };
#undef F8
    char d[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_hf(P_PHI3_LONGROPE, d, sizeof d);
        set_config(d, "rope_scaling", cases[i].json);
        expect_open(d, cases[i].named ? SD_ERR_FORMAT : SD_OK, cases[i].json);
        if (cases[i].named) {
            if (!strstr(logged, cases[i].named)) fail_msg("refusal does not name %s: %s", cases[i].named, logged);
            continue;
        }
        sd_weights *w = open_ok(d);
        sd_model_config c;
        assert_int_equal(sd_weights_config(w, &c), SD_OK);
        assert_int_equal(c.rope_scaling_type, SD_ROPE_LONGROPE);
        assert_int_equal(c.rope_orig_ctx, 256);
        assert_float_equal(c.rope_attn_factor, cases[i].attn_factor, 1e-6); /* sqrt(1 + ln 16 / ln 256) */
        assert_true(c.rope_factors_long[7] == 1.7f && c.rope_factors_short[0] == 1.0f);
        sd_weights_close(&w);
    }
    /* the original context inside rope_scaling (newer configs) reads the same */
    copy_hf(P_PHI3_LONGROPE, d, sizeof d);
    set_config(d, "original_max_position_embeddings", "null");
    set_config(d, "rope_scaling",
               "{\"type\":\"longrope\",\"long_factor\":[1,1,1,1,1,1,1,1],\"short_factor\":[1,1,1,1,1,1,1,1],"
               "\"original_max_position_embeddings\":1024}");
    sd_weights *w = open_ok(d);
    sd_model_config c;
    assert_int_equal(sd_weights_config(w, &c), SD_OK);
    assert_int_equal(c.rope_orig_ctx, 1024);
    assert_float_equal(c.rope_attn_factor, 1.0954451f, 1e-6); /* sqrt(1 + ln 4 / ln 1024) */
    sd_weights_close(&w);
}

static void test_gemma_norm_shift_matters(void **state) {
    (void)state;
    if (!env.ok) skip();
    char d[256], path[512], err[256];
    copy_hf(P_GEMMA, d, sizeof d);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    sd_safetensors *st = NULL;
    assert_int_equal(sd_safetensors_open(path, &st, err, sizeof err), SD_OK);
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    float *shifted = NULL;
    for (int64_t i = 0; i < sd_safetensors_n_tensors(st); i++) {
        const sd_safetensors_tensor *t = sd_safetensors_tensor_at(st, i);
        const void *data = t->data;
        if (strcmp(t->name, "model.layers.0.input_layernorm.weight") == 0) {
            assert_int_equal(t->dtype, SD_SAFETENSORS_F32);
            shifted = malloc(t->shape[0] * sizeof *shifted);
            assert_non_null(shifted);
            memcpy(shifted, t->data, t->shape[0] * sizeof *shifted);
            for (uint64_t k = 0; k < t->shape[0]; k++) shifted[k] += 1.0f;
            data = shifted;
        }
        assert_int_equal(sd_safetensors_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->shape, data), SD_OK);
    }
    assert_non_null(shifted);
    sd_safetensors_close(&st);
    assert_int_equal(sd_safetensors_writer_write(w, path), SD_OK);
    sd_safetensors_writer_free(&w);
    free(shifted);
    int32_t na, nb, va, vb;
    float *a = batch_logits(PAIRS[P_GEMMA].gguf, &na, &va), *b = batch_logits(d, &nb, &vb);
    assert_int_equal((size_t)na * (size_t)va, (size_t)nb * (size_t)vb);
    assert_true(memcmp(a, b, (size_t)na * (size_t)va * sizeof *a) != 0);
    free(a);
    free(b);
}

/* Qwen's own pre-tokenizer: a qwen2 GGUF whose tokenizer.ggml.pre is
 * "qwen2" becomes a tokenizer.json with Qwen2's Split regex, which reads
 * back to the same encodings. */
static void test_qwen2_pretokenizer(void **state) {
    (void)state;
    if (!env.ok) skip();
    char src[160], dir[160], err[256];
    snprintf(src, sizeof src, "%s/qwen2-pre.gguf", env.dir);
    snprintf(dir, sizeof dir, "%s/qwen2-pre-hf", env.dir);
    sd_gguf *g = NULL;
    assert_int_equal(sd_gguf_open(PAIRS[P_QWEN2].gguf, &g, err, sizeof err), SD_OK);
    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_int_equal(sd_gguf_writer_copy_kv(w, g, ""), SD_OK);
    assert_int_equal(sd_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2"), SD_OK);
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
        assert_int_equal(sd_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), SD_OK);
    }
    assert_int_equal(sd_gguf_writer_write(w, src), SD_OK);
    sd_gguf_writer_free(&w);
    sd_gguf_close(&g);
    assert_int_equal(run("'%s' -o '%s' --format hf --convert '%s' >/dev/null 2>&1", SPECD_MKMODEL, dir, src), 0);
    assert_int_equal(run("grep -q '\\\\p{N}|' '%s/tokenizer.json'", dir), 0); /* Qwen2's single-digit split */
    /* (the synthetic merges join letters only, so smollm's split would give
     * the same ids here: what is checked is that the file carries Qwen2's
     * regex, the reader accepts it, and it encodes as the GGUF does) */
    sd_weights *wg = open_ok(src), *wh = open_ok(dir);
    sd_tok *tg = NULL, *th = NULL;
    assert_int_equal(sd_weights_tokenizer(wg, &tg), SD_OK);
    assert_int_equal(sd_weights_tokenizer(wh, &th), SD_OK);
    assert_true(sd_tok_vocab_hash(tg) == sd_tok_vocab_hash(th));
    static const char *const texts[] = {"HE'S here 2024!\n\n  ok", "it's 12345 apples", "a\r\nb  \tc"};
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        int32_t *ia = NULL, *ib = NULL;
        size_t na = 0, nb = 0;
        assert_int_equal(sd_tok_encode(tg, texts[t], strlen(texts[t]), false, &ia, &na), SD_OK);
        assert_int_equal(sd_tok_encode(th, texts[t], strlen(texts[t]), false, &ib, &nb), SD_OK);
        assert_int_equal(na, nb);
        assert_memory_equal(ia, ib, na * sizeof *ia);
        free(ia);
        free(ib);
    }
    sd_tok_free(&tg);
    sd_tok_free(&th);
    sd_weights_close(&wg);
    sd_weights_close(&wh);
}

/* ------------------------------------------------- multimodal Gemma 3 */

/* Rewrites a Gemma3ForCausalLM directory in place as the multimodal class
 * saves it: config.json's text model moved under text_config (with
 * eos_token_id left at the top level, as some configs have it), and every
 * tensor renamed under prefix (lm_head under head), beside a vision tensor
 * that must not be read. keep_heads false drops num_key_value_heads from
 * text_config (Gemma3TextConfig's default 4 then applies). */
static void make_multimodal(const char *dir, const char *prefix, const char *head, bool keep_heads) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *text = cJSON_Parse(buf);
    assert_non_null(text);
    cJSON_DeleteItemFromObjectCaseSensitive(text, "architectures");
    cJSON_DeleteItemFromObjectCaseSensitive(text, "model_type");
    cJSON_AddStringToObject(text, "model_type", "gemma3_text");
    cJSON *eos = cJSON_DetachItemFromObjectCaseSensitive(text, "eos_token_id");
    if (!keep_heads) cJSON_DeleteItemFromObjectCaseSensitive(text, "num_key_value_heads");
    cJSON *top = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(top, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString("Gemma3ForConditionalGeneration"));
    cJSON_AddStringToObject(top, "model_type", "gemma3");
    cJSON_AddItemToObject(top, "text_config", text);
    cJSON_AddItemToObject(top, "vision_config", cJSON_Parse("{\"model_type\":\"siglip_vision_model\"}"));
    if (eos) cJSON_AddItemToObject(top, "eos_token_id", eos);
    char *out = cJSON_PrintUnformatted(top);
    f = fopen(path, "wb");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(top);

    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sd_safetensors *st = NULL;
    assert_int_equal(sd_safetensors_open(path, &st, err, sizeof err), SD_OK);
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    for (int64_t i = 0; i < sd_safetensors_n_tensors(st); i++) {
        const sd_safetensors_tensor *t = sd_safetensors_tensor_at(st, i);
        char name[160];
        if (strcmp(t->name, "lm_head.weight") == 0)
            snprintf(name, sizeof name, "%s", head);
        else if (strncmp(t->name, "model.", 6) == 0)
            snprintf(name, sizeof name, "%s%s", prefix, t->name + 6);
        else
            fail_msg("unexpected tensor %s", t->name);
        assert_int_equal(sd_safetensors_writer_add_tensor(w, name, t->dtype, t->n_dims, t->shape, t->data), SD_OK);
        if (strcmp(t->name, "model.norm.weight") == 0) /* a vision tensor the text model must not read */
            assert_int_equal(sd_safetensors_writer_add_tensor(w, "vision_tower.vision_model.post_layernorm.weight",
                                                              t->dtype, t->n_dims, t->shape, t->data),
                             SD_OK);
    }
    sd_safetensors_close(&st);
    assert_int_equal(sd_safetensors_writer_write(w, path), SD_OK);
    sd_safetensors_writer_free(&w);
}

/* Gemma3ForConditionalGeneration in both tensor layouts serves its text
 * model: the GGUF's config and bit-identical logits; what does not fit is
 * refused, named. */
static void test_gemma3_multimodal(void **state) {
    (void)state;
    if (!env.ok) skip();
    static const char *const layouts[][2] = {{"language_model.model.", "language_model.lm_head.weight"},
                                             {"model.language_model.", "lm_head.weight"}};
    const pair *gm = &PAIRS[P_GEMMA];
    sd_weights *g = open_ok(gm->gguf);
    sd_model_config cg;
    assert_int_equal(sd_weights_config(g, &cg), SD_OK);
    sd_weights_close(&g);
    int32_t na, va;
    float *want = batch_logits(gm->gguf, &na, &va);
    for (size_t i = 0; i < 2; i++) {
        char d[256];
        copy_hf(P_GEMMA, d, sizeof d);
        make_multimodal(d, layouts[i][0], layouts[i][1], true);
        sd_weights *h = open_ok(d);
        sd_model_config ch;
        assert_int_equal(sd_weights_config(h, &ch), SD_OK);
        sd_weights_close(&h);
        expect_same_config(layouts[i][0], &cg, &ch);
        int32_t nb, vb;
        float *got = batch_logits(d, &nb, &vb);
        assert_int_equal(na, nb);
        assert_int_equal(va, vb);
        if (memcmp(want, got, (size_t)na * (size_t)va * sizeof *want) != 0)
            fail_msg("%s: multimodal layout's logits differ from the GGUF's", layouts[i][0]);
        free(got);
    }
    free(want);
    char d[256];
    /* Gemma3TextConfig's default of 4 KV heads applies when text_config leaves it out (this model has 2
     * heads and 1 KV head) */
    copy_hf(P_GEMMA, d, sizeof d);
    make_multimodal(d, layouts[0][0], layouts[0][1], false);
    expect_open(d, SD_ERR_FORMAT, "default num_key_value_heads");
    if (!strstr(logged, "num_key_value_heads 4")) fail_msg("the default of 4 KV heads was not applied: %s", logged);
    /* no text_config */
    copy_hf(P_GEMMA, d, sizeof d);
    set_config(d, "architectures", "[\"Gemma3ForConditionalGeneration\"]");
    set_config(d, "model_type", "\"gemma3\"");
    expect_open(d, SD_ERR_FORMAT, "no text_config");
    if (!strstr(logged, "text_config")) fail_msg("refusal does not name text_config: %s", logged);
    /* another text model */
    copy_hf(P_GEMMA, d, sizeof d);
    make_multimodal(d, layouts[0][0], layouts[0][1], true);
    set_config(d, "text_config", "{\"model_type\":\"qwen2\"}");
    expect_open(d, SD_ERR_UNSUPPORTED, "qwen2 text_config");
    if (!strstr(logged, "gemma3_text")) fail_msg("refusal does not name gemma3_text: %s", logged);
    /* the text model under neither prefix */
    copy_hf(P_GEMMA, d, sizeof d);
    make_multimodal(d, "text.model.", "text.lm_head.weight", true);
    expect_open(d, SD_ERR_FORMAT, "unknown prefix");
    if (!strstr(logged, "language_model.model.embed_tokens.weight"))
        fail_msg("refusal does not name the prefixes looked for: %s", logged);
}

static int setup_dir(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-hfarch-XXXXXX");
    return mkdtemp(env.dir) ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--shapes") == 0) {
        const struct CMUnitTest slow[] = {cmocka_unit_test(test_shapes)};
        return cmocka_run_group_tests(slow, setup_dir, teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_numbers),       cmocka_unit_test(test_same_logits),
        cmocka_unit_test(test_missing_tensors),    cmocka_unit_test(test_refused_configs),
        cmocka_unit_test(test_qwen2_pretokenizer), cmocka_unit_test(test_gemma_norm_shift_matters),
        cmocka_unit_test(test_gemma3_multimodal),  cmocka_unit_test(test_longrope_configs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
