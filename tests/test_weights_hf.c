/* test_weights_hf.c — Hugging Face checkpoint directories (weights_hf.c,
 * tokenizer_hf.c) against the same model as GGUF.
 *
 * specd-mkmodel writes each random model twice from one seed: as GGUF and as
 * an HF directory (f32 single file; f16 tied in 3 shards; bf16 with bf16
 * norms in 2 shards). For each pair:
 *   - the configs are equal field by field;
 *   - every tensor reads back as the same f32 numbers, whole and in
 *     tensor-parallel rectangles (head-aligned row ranges of q/k, whose rows
 *     the HF source un-permutes, and column ranges);
 *   - the tokenizers have the same vocabulary hash, special ids and
 *     encodings;
 *   - the loaded models give bit-identical logits on a ragged batch.
 * Then broken checkpoints (one fault each: missing files, a non-llama or
 * unsupported config, a missing / mistyped / misshapen tensor, an index
 * pointing outside the directory or at the wrong shard, a tensor in two
 * shards, a corrupt shard) and tokenizer.json variants (merges as pairs,
 * ids missing up to vocab_size, BOS from the post-processor, unsupported
 * normalizer / model / pre-tokenizer) are each refused with the expected
 * status, or accepted with the expected meaning; a Llama 3 ("llama-bpe")
 * vocabulary goes through specd-mkmodel's tokenizer.json and back. With
 * --model, the demo model converted to a checkpoint (test_demo_model). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "specd/model.h"
#include "specd/safetensors.h"
#include "specd/weights.h"
#include "tokenizer_impl.h"

#define VOCAB 300

typedef struct pair {
    const char *label;
    const char *args; /* specd-mkmodel arguments shared by both files */
    const char *hf_args;
    char gguf[160], hf[160];
} pair;

static pair PAIRS[] = {
    {"f32 GQA 4/2 untied", "--dim 64 --heads 4 --kv-heads 2 --ff 96 --seed 3", "", "", ""},
    {"f16 tied MHA 4/4, 3 shards", "--dtype f16 --tied --dim 64 --heads 4 --kv-heads 4 --ff 64 --seed 4", "--shards 3",
     "", ""},
    {"bf16 MQA 2/1, 3 layers, 2 shards",
     "--dtype bf16 --norm-dtype bf16 --dim 32 --heads 2 --kv-heads 1 --ff 64 "
     "--layers 3 --seed 5",
     "--shards 2", "", ""},
};
#define N_PAIRS (sizeof PAIRS / sizeof PAIRS[0])

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
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-hf-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    env.ok = true;
    for (size_t i = 0; i < N_PAIRS; i++) {
        pair *p = &PAIRS[i];
        snprintf(p->gguf, sizeof p->gguf, "%s/m%zu.gguf", env.dir, i);
        snprintf(p->hf, sizeof p->hf, "%s/m%zu-hf", env.dir, i);
        env.ok &= run("'%s' -o '%s' --vocab %d %s >/dev/null 2>&1", SPECD_MKMODEL, p->gguf, VOCAB, p->args) == 0;
        env.ok &= run("'%s' -o '%s' --vocab %d %s --format hf %s >/dev/null 2>&1", SPECD_MKMODEL, p->hf, VOCAB, p->args,
                      p->hf_args) == 0;
    }
    return 0;
}

static int teardown_model(void **state);

static int teardown(void **state) {
    (void)state;
    if (env.dir[0]) run("rm -rf '%s'", env.dir);
    return 0;
}

static int teardown_model(void **state) { return teardown(state); }

static sd_weights *open_ok(const char *path) {
    sd_weights *w = NULL;
    sd_status s = sd_weights_open(path, &w);
    if (s != SD_OK) fail_msg("cannot open %s: %s", path, sd_status_str(s));
    return w;
}

/* ------------------------------------------------------------ same numbers */

static void expect_same_config(const sd_model_config *a, const sd_model_config *b) {
    assert_string_equal(a->arch, b->arch);
#define SAME(f) assert_true(a->f == b->f)
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
    SAME(rope_low_freq_factor);
    SAME(rope_high_freq_factor);
    SAME(rope_orig_ctx);
    SAME(tied_output);
#undef SAME
}

/* Reads the same rectangle from both sources and compares the bits. */
static void expect_same_rect(const sd_weights *g, const sd_weights *h, const char *name, int64_t row0, int64_t rows,
                             int64_t col0, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(sd_weights_read(g, name, row0, rows, col0, cols, a), SD_OK);
    assert_int_equal(sd_weights_read(h, name, row0, rows, col0, cols, b), SD_OK);
    if (memcmp(a, b, n * sizeof *a) != 0) {
        size_t k = 0;
        while (a[k] == b[k]) k++;
        fail_msg("%s rows [%lld, +%lld) cols [%lld, +%lld): element %zu differs (%g vs %g)", name, (long long)row0,
                 (long long)rows, (long long)col0, (long long)cols, k, (double)a[k], (double)b[k]);
    }
    free(a);
    free(b);
}

static void test_same_numbers(void **state) {
    (void)state;
    if (!env.ok) skip();
    for (size_t i = 0; i < N_PAIRS; i++) {
        const pair *p = &PAIRS[i];
        sd_weights *g = open_ok(p->gguf), *h = open_ok(p->hf);
        assert_string_equal(sd_weights_format(g), "gguf");
        assert_string_equal(sd_weights_format(h), "safetensors");
        assert_null(sd_weights_gguf(h));
        sd_model_config cg, ch;
        assert_int_equal(sd_weights_config(g, &cg), SD_OK);
        assert_int_equal(sd_weights_config(h, &ch), SD_OK);
        expect_same_config(&cg, &ch);
        static const char *const parts[] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                                            "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
        char name[64];
        for (int32_t l = -1; l < cg.n_layers; l++) {
            for (size_t k = 0; k < (l < 0 ? 3 : 9); k++) {
                if (l < 0)
                    snprintf(name, sizeof name, "%s",
                             (const char *[]){"token_embd.weight", "output_norm.weight", "output.weight"}[k]);
                else
                    snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, parts[k]);
                sd_weights_tensor tg, th;
                bool has_g = sd_weights_find(g, name, &tg), has_h = sd_weights_find(h, name, &th);
                assert_int_equal(has_g, has_h);
                if (!has_g) continue; /* output.weight of a tied model */
                assert_int_equal(tg.type, th.type);
                assert_int_equal(tg.n_dims, th.n_dims);
                assert_int_equal(tg.ne[0], th.ne[0]);
                assert_int_equal(tg.ne[1], th.ne[1]);
                expect_same_rect(g, h, name, 0, tg.ne[1], 0, tg.ne[0]);
                if (tg.n_dims == 2 && tg.ne[1] >= 2 * cg.head_dim) {
                    /* rank 1 of 2 by heads / rows, an odd single row, a column slice */
                    expect_same_rect(g, h, name, tg.ne[1] / 2, tg.ne[1] / 2, 0, tg.ne[0]);
                    expect_same_rect(g, h, name, cg.head_dim + 3, 1, 0, tg.ne[0]);
                    expect_same_rect(g, h, name, 1, tg.ne[1] - 2, tg.ne[0] / 4, tg.ne[0] / 2);
                }
            }
        }
        assert_false(sd_weights_find(h, "rope_freqs.weight", NULL));
        assert_false(sd_weights_find(h, "blk.99.attn_q.weight", NULL));
        assert_false(sd_weights_find(h, "model.embed_tokens.weight", NULL)); /* GGUF names only */
        float x;
        assert_int_equal(sd_weights_read(h, "blk.0.attn_q.weight", cg.n_embd, 1, 0, 1, &x), SD_ERR_RANGE);

        sd_tok *tg = NULL, *th = NULL;
        assert_int_equal(sd_weights_tokenizer(g, &tg), SD_OK);
        assert_int_equal(sd_weights_tokenizer(h, &th), SD_OK);
        assert_int_equal(sd_tok_n_vocab(tg), sd_tok_n_vocab(th));
        assert_true(sd_tok_vocab_hash(tg) == sd_tok_vocab_hash(th));
        assert_int_equal(sd_tok_bos(tg), sd_tok_bos(th));
        assert_int_equal(sd_tok_eos(tg), sd_tok_eos(th));
        assert_int_equal(sd_tok_add_bos(tg), sd_tok_add_bos(th));
        static const char *const texts[] = {"the quick brown fox", "<|im_start|>user\nhi 42<|im_end|>", "  x\t\ny!",
                                            "caf\xc3\xa9 \xe4\xb8\xad"};
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
        assert_null(h);
    }
}

/* Logits of a two-sequence ragged batch, all rows: out[n][n_vocab]. */
static float *batch_logits(const char *path, int32_t *n_rows) {
    sd_weights *w = open_ok(path);
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
    float *out = malloc((size_t)N * VOCAB * sizeof *out);
    assert_non_null(out);
    sd_batch b = {.n_tokens = N, .tokens = tokens, .pos = pos, .seq = seq, .logits = want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    sd_kv_free(&kv);
    sd_model_free(&m);
    *n_rows = N;
    return out;
}

static void test_same_logits(void **state) {
    (void)state;
    if (!env.ok) skip();
    for (size_t i = 0; i < N_PAIRS; i++) {
        int32_t na, nb;
        float *a = batch_logits(PAIRS[i].gguf, &na), *b = batch_logits(PAIRS[i].hf, &nb);
        assert_int_equal(na, nb);
        if (memcmp(a, b, (size_t)na * VOCAB * sizeof *a) != 0) fail_msg("%s: logits differ", PAIRS[i].label);
        float lo = a[0], hi = a[0];
        for (size_t k = 0; k < (size_t)na * VOCAB; k++) {
            lo = a[k] < lo ? a[k] : lo;
            hi = a[k] > hi ? a[k] : hi;
        }
        assert_true(hi - lo > 1.0f); /* not a degenerate model */
        free(a);
        free(b);
    }
}

/* ------------------------------------------------------ broken checkpoints */

/* A fresh copy of pair i's directory at dst (dst under env.dir). */
static void copy_hf(size_t i, const char *name, char *dst, size_t cap) {
    snprintf(dst, cap, "%s/%s", env.dir, name);
    assert_int_equal(run("rm -rf '%s' && cp -r '%s' '%s'", dst, PAIRS[i].hf, dst), 0);
}

static cJSON *load_json(const char *dir, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    return j;
}

static void save_json(const char *dir, const char *file, cJSON *j) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = cJSON_PrintUnformatted(j);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(j);
}

/* Sets config.json's key to a parsed JSON value (NULL: remove it). */
static void set_config(const char *dir, const char *key, const char *json) {
    cJSON *j = load_json(dir, "config.json");
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    if (json) cJSON_AddItemToObject(j, key, cJSON_Parse(json));
    save_json(dir, "config.json", j);
}

typedef struct rewrite {
    const char *drop;       /* tensor left out */
    const char *as_i8;      /* tensor stored as I8 */
    const char *transpose;  /* tensor with its two dims swapped */
    const char *extra_from; /* a file whose tensor extra is added */
    const char *extra;
} rewrite;

/* Rewrites dir/file with one change. */
static void rewrite_st(const char *dir, const char *file, rewrite r) {
    char path[512], extra_path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char err[256];
    sd_safetensors *st = NULL, *ex = NULL;
    assert_int_equal(sd_safetensors_open(path, &st, err, sizeof err), SD_OK);
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    for (int64_t i = 0; i < sd_safetensors_n_tensors(st); i++) {
        const sd_safetensors_tensor *t = sd_safetensors_tensor_at(st, i);
        if (r.drop && strcmp(t->name, r.drop) == 0) continue;
        uint64_t shape[2] = {t->shape[0], t->n_dims > 1 ? t->shape[1] : 0};
        if (r.transpose && strcmp(t->name, r.transpose) == 0) shape[0] = t->shape[1], shape[1] = t->shape[0];
        if (r.as_i8 && strcmp(t->name, r.as_i8) == 0)
            assert_int_equal(sd_safetensors_writer_add_tensor(w, t->name, SD_SAFETENSORS_I8, t->n_dims, shape, t->data),
                             SD_OK);
        else
            assert_int_equal(sd_safetensors_writer_add_tensor(w, t->name, t->dtype, t->n_dims, shape, t->data), SD_OK);
    }
    if (r.extra_from) {
        snprintf(extra_path, sizeof extra_path, "%s/%s", dir, r.extra_from);
        assert_int_equal(sd_safetensors_open(extra_path, &ex, err, sizeof err), SD_OK);
        const sd_safetensors_tensor *t = sd_safetensors_find(ex, r.extra);
        assert_non_null(t);
        assert_int_equal(sd_safetensors_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->shape, t->data), SD_OK);
    }
    sd_safetensors_close(&st);
    sd_safetensors_close(&ex);
    assert_int_equal(sd_safetensors_writer_write(w, path), SD_OK);
    sd_safetensors_writer_free(&w);
}

static void expect_open(const char *dir, sd_status want, const char *what) {
    sd_weights *w = NULL;
    sd_status s = sd_weights_open(dir, &w);
    if (s != want) fail_msg("%s: expected %s, got %s", what, sd_status_str(want), sd_status_str(s));
    if (s == SD_OK) sd_weights_close(&w);
    assert_null(w);
}

static void test_bad_checkpoints(void **state) {
    (void)state;
    if (!env.ok) skip();
    char d[256], p[512];
    const char *one = "model.safetensors";

    copy_hf(0, "nocfg", d, sizeof d);
    snprintf(p, sizeof p, "%s/config.json", d);
    unlink(p);
    expect_open(d, SD_ERR_NOT_FOUND, "no config.json");

    copy_hf(0, "noweights", d, sizeof d);
    snprintf(p, sizeof p, "%s/%s", d, one);
    unlink(p);
    expect_open(d, SD_ERR_NOT_FOUND, "no safetensors");

    static const struct {
        const char *key, *json;
        sd_status want;
        const char *what;
    } cfgs[] = {
        {"model_type", "\"qwen2\"", SD_ERR_UNSUPPORTED, "model_type qwen2"},
        {"hidden_act", "\"gelu\"", SD_ERR_UNSUPPORTED, "gelu"},
        {"attention_bias", "true", SD_ERR_UNSUPPORTED, "attention bias"},
        {"rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4}", SD_ERR_UNSUPPORTED, "yarn"},
        {"rope_scaling", "{\"rope_type\":\"linear\"}", SD_ERR_FORMAT, "linear without factor"},
        {"hidden_size", "64.5", SD_ERR_FORMAT, "fractional hidden_size"},
        {"hidden_size", NULL, SD_ERR_FORMAT, "no hidden_size"},
        {"num_attention_heads", "6", SD_ERR_UNSUPPORTED, "heads not dividing hidden"},
        {"num_key_value_heads", "3", SD_ERR_FORMAT, "kv heads not dividing heads"},
        {"head_dim", "8", SD_ERR_UNSUPPORTED, "head_dim other than hidden/heads"},
        {"vocab_size", "301", SD_ERR_FORMAT, "vocab_size not the embedding's"},
        {"intermediate_size", "97", SD_ERR_FORMAT, "ffn size not the tensors'"},
        {"num_hidden_layers", "3", SD_ERR_FORMAT, "a layer more than stored"},
        {"rms_norm_eps", "-1", SD_ERR_FORMAT, "negative eps"},
        {"tie_word_embeddings", "\"yes\"", SD_ERR_FORMAT, "non-boolean tie"},
        {"eos_token_id", "\"2\"", SD_ERR_FORMAT, "string eos id"},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        copy_hf(0, "cfg", d, sizeof d);
        set_config(d, cfgs[i].key, cfgs[i].json);
        expect_open(d, cfgs[i].want, cfgs[i].what);
    }
    copy_hf(0, "cfgjson", d, sizeof d);
    snprintf(p, sizeof p, "%s/config.json", d);
    FILE *f = fopen(p, "w");
    fputs("{\"hidden_size\": 64,", f);
    fclose(f);
    expect_open(d, SD_ERR_FORMAT, "config.json not JSON");

    /* tensors */
    copy_hf(0, "drop", d, sizeof d);
    rewrite_st(d, one, (rewrite){.drop = "model.layers.1.mlp.up_proj.weight"});
    expect_open(d, SD_ERR_FORMAT, "missing up_proj");
    copy_hf(0, "droplm", d, sizeof d);
    rewrite_st(d, one, (rewrite){.drop = "lm_head.weight"});
    expect_open(d, SD_ERR_FORMAT, "untied without lm_head");
    set_config(d, "tie_word_embeddings", "true");
    expect_open(d, SD_OK, "tied without lm_head");
    copy_hf(0, "i8", d, sizeof d);
    rewrite_st(d, one, (rewrite){.as_i8 = "model.norm.weight"});
    expect_open(d, SD_ERR_UNSUPPORTED, "I8 norm");
    copy_hf(0, "transpose", d, sizeof d);
    rewrite_st(d, one, (rewrite){.transpose = "model.layers.0.mlp.down_proj.weight"});
    expect_open(d, SD_ERR_FORMAT, "down_proj transposed");
    copy_hf(0, "corrupt", d, sizeof d);
    snprintf(p, sizeof p, "%s/%s", d, one);
    assert_int_equal(truncate(p, 1000), 0);
    expect_open(d, SD_ERR_FORMAT, "truncated shard");

    /* sharded (pair 1: 3 shards) */
    const char *s1 = "model-00001-of-00003.safetensors", *s2 = "model-00002-of-00003.safetensors";
    static const char *const bad_files[] = {"../m0-hf/model.safetensors", "/etc/passwd", "..", ""};
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        copy_hf(1, "index", d, sizeof d);
        cJSON *idx = load_json(d, "model.safetensors.index.json");
        cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
        cJSON_ReplaceItemInObjectCaseSensitive(map, "model.norm.weight", cJSON_CreateString(bad_files[i]));
        save_json(d, "model.safetensors.index.json", idx);
        expect_open(d, SD_ERR_FORMAT, bad_files[i]);
    }
    copy_hf(1, "wrongshard", d, sizeof d);
    cJSON *idx = load_json(d, "model.safetensors.index.json");
    cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    const char *where = cJSON_GetObjectItemCaseSensitive(map, "model.embed_tokens.weight")->valuestring;
    assert_string_equal(where, s1);
    cJSON_ReplaceItemInObjectCaseSensitive(map, "model.embed_tokens.weight", cJSON_CreateString(s2));
    save_json(d, "model.safetensors.index.json", idx);
    expect_open(d, SD_ERR_FORMAT, "index names the wrong shard");

    copy_hf(1, "missingshard", d, sizeof d);
    snprintf(p, sizeof p, "%s/%s", d, s2);
    unlink(p);
    expect_open(d, SD_ERR_IO, "a shard missing");

    copy_hf(1, "twice", d, sizeof d);
    rewrite_st(d, s2, (rewrite){.extra_from = s1, .extra = "model.embed_tokens.weight"});
    expect_open(d, SD_ERR_FORMAT, "a tensor in two shards");

    copy_hf(1, "noindexmap", d, sizeof d);
    save_json(d, "model.safetensors.index.json", cJSON_Parse("{\"metadata\":{}}"));
    expect_open(d, SD_ERR_FORMAT, "index without weight_map");

    copy_hf(1, "trailing", d, sizeof d); /* "dir/" names the same checkpoint */
    snprintf(p, sizeof p, "%s//", d);
    expect_open(p, SD_OK, "trailing slashes");

    /* no tokenizer.json: the weights load, the tokenizer is refused */
    copy_hf(0, "notok", d, sizeof d);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    unlink(p);
    sd_weights *w = open_ok(d);
    sd_tok *t = NULL;
    assert_int_equal(sd_weights_tokenizer(w, &t), SD_ERR_NOT_FOUND);
    assert_null(t);
    sd_weights_close(&w);
}

/* Config values beyond what specd-mkmodel writes. */
static void test_config_values(void **state) {
    (void)state;
    if (!env.ok) skip();
    char d[256];
    copy_hf(0, "rope", d, sizeof d);
    set_config(d, "rope_scaling",
               "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
               "\"original_max_position_embeddings\":64}");
    set_config(d, "max_position_embeddings", NULL);
    set_config(d, "rms_norm_eps", NULL);
    set_config(d, "rope_theta", "500000.0");
    set_config(d, "num_key_value_heads", "2");
    sd_weights *w = open_ok(d);
    sd_model_config c;
    assert_int_equal(sd_weights_config(w, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 2);
    assert_true(c.rope_scale_factor == 8.0f && c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_orig_ctx, 64);
    assert_true(c.rope_base == 500000.0f);
    assert_int_equal(c.n_ctx_train, 2048); /* LlamaConfig's defaults */
    assert_true(c.rms_eps == 1e-6f);
    sd_weights_close(&w);

    set_config(d, "rope_scaling", "{\"type\":\"linear\",\"factor\":4}");
    set_config(d, "eos_token_id", "[2, 5]");
    w = open_ok(d);
    assert_int_equal(sd_weights_config(w, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 1);
    assert_true(c.rope_scale_factor == 4.0f);
    sd_tok *t = NULL;
    assert_int_equal(sd_weights_tokenizer(w, &t), SD_OK);
    assert_true(sd_tok_is_eog(t, 2));
    assert_true(sd_tok_is_eog(t, 5)); /* the last of an eos list ends generation too */
    assert_false(sd_tok_is_eog(t, 6));
    sd_tok_free(&t);
    sd_weights_close(&w);

    set_config(d, "rope_scaling", "{\"rope_type\":\"default\"}");
    set_config(d, "model_type", NULL); /* architectures alone will do */
    w = open_ok(d);
    assert_int_equal(sd_weights_config(w, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 0);
    sd_weights_close(&w);
}

/* ------------------------------------------------------------ tokenizer.json */

static char *read_all(const char *dir, const char *file, size_t *len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* Builds a tokenizer from tokenizer.json text j with ids. */
static sd_status build(cJSON *j, const sd_tok_hf_ids *ids, sd_tok **out) {
    char *text = cJSON_PrintUnformatted(j);
    sd_status s = sd_tok_from_hf_json(text, strlen(text), ids, out);
    free(text);
    return s;
}

static void test_tokenizer_json(void **state) {
    (void)state;
    if (!env.ok) skip();
    size_t len;
    char *text = read_all(PAIRS[0].hf, "tokenizer.json", &len);
    sd_tok *base = NULL;
    assert_int_equal(sd_tok_from_hf_json(text, len, NULL, &base), SD_OK);
    assert_int_equal(sd_tok_n_vocab(base), VOCAB);
    assert_int_equal(sd_tok_bos(base), -1); /* the ids live in config.json */
    uint64_t hash = sd_tok_vocab_hash(base);

    /* merges as [left, right] pairs (tokenizers >= 0.20 writes them so) */
    cJSON *j = cJSON_Parse(text);
    cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "merges");
    cJSON *pairs = cJSON_CreateArray();
    for (cJSON *m = merges->child; m; m = m->next) {
        const char *sp = strchr(m->valuestring + 1, ' ');
        char left[64];
        snprintf(left, sizeof left, "%.*s", (int)(sp - m->valuestring), m->valuestring);
        cJSON *pr = cJSON_CreateArray();
        cJSON_AddItemToArray(pr, cJSON_CreateString(left));
        cJSON_AddItemToArray(pr, cJSON_CreateString(sp + 1));
        cJSON_AddItemToArray(pairs, pr);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "merges", pairs);
    sd_tok *t = NULL;
    assert_int_equal(build(j, NULL, &t), SD_OK);
    assert_true(sd_tok_vocab_hash(t) == hash);
    int32_t *ia, *ib;
    size_t na, nb;
    const char *s = "then the rest of it";
    assert_int_equal(sd_tok_encode(base, s, strlen(s), false, &ia, &na), SD_OK);
    assert_int_equal(sd_tok_encode(t, s, strlen(s), false, &ib, &nb), SD_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na * sizeof *ia);
    assert_true(na < strlen(s)); /* merges applied */
    free(ia);
    free(ib);
    sd_tok_free(&t);
    cJSON_Delete(j);

    /* padded to vocab_size with unused [PAD] tokens; special ids by text, then by id */
    sd_tok_hf_ids ids = sd_tok_hf_ids_default();
    ids.n_vocab = VOCAB + 4;
    ids.bos_text = "<|im_start|>";
    ids.eos = 2;
    ids.eos_text = "<|not in the vocabulary|>";
    ids.add_bos = 1;
    assert_int_equal(sd_tok_from_hf_json(text, len, &ids, &t), SD_OK);
    assert_int_equal(sd_tok_n_vocab(t), VOCAB + 4);
    assert_int_equal(sd_tok_bos(t), 1);
    assert_int_equal(sd_tok_eos(t), 2);
    assert_true(sd_tok_add_bos(t));
    size_t pl;
    const char *piece = sd_tok_piece(t, VOCAB + 3, &pl);
    assert_non_null(piece);
    assert_int_equal(pl, strlen("[PAD303]"));
    sd_tok_free(&t);
    ids.n_vocab = VOCAB - 1; /* the file holds more ids than the config's vocabulary */
    assert_int_equal(sd_tok_from_hf_json(text, len, &ids, &t), SD_ERR_FORMAT);

    /* add_bos from a TemplateProcessing post-processor */
    j = cJSON_Parse(text);
    cJSON_ReplaceItemInObjectCaseSensitive(
        j, "post_processor",
        cJSON_Parse("{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},{\"type\":\"TemplateProcessing\","
                    "\"single\":[{\"SpecialToken\":{\"id\":\"<|im_start|>\",\"type_id\":0}},{\"Sequence\":{\"id\":"
                    "\"A\",\"type_id\":0}}]}]}"));
    ids = sd_tok_hf_ids_default();
    ids.bos = 1;
    assert_int_equal(build(j, &ids, &t), SD_OK);
    assert_true(sd_tok_add_bos(t));
    sd_tok_free(&t);
    cJSON_Delete(j);

    /* refusals: each a different kind of tokenizer */
    static const struct {
        const char *path[2]; /* object key, then optional sub-key */
        const char *json;
        sd_status want;
    } bad[] = {
        {{"normalizer", NULL}, "{\"type\":\"NFKC\"}", SD_ERR_UNSUPPORTED}, /* NFC (Qwen2) is accepted */
        {{"model", "type"}, "\"Unigram\"", SD_ERR_UNSUPPORTED},
        {{"model", "byte_fallback"}, "true", SD_ERR_UNSUPPORTED},
        {{"model", "dropout"}, "0.1", SD_ERR_UNSUPPORTED},
        {{"model", "ignore_merges"}, "true", SD_ERR_UNSUPPORTED}, /* not with the smollm pre-tokenizer */
        {{"model", "vocab"}, "[]", SD_ERR_FORMAT},
        {{"model", "merges"}, "[\"a\"]", SD_ERR_FORMAT},
        {{"model", "merges"}, "[[\"a\",\"b\",\"c\"]]", SD_ERR_FORMAT},
        {{"model", "vocab"}, "{\"a\":0,\"b\":-1}", SD_ERR_FORMAT},
        {{"model", "vocab"}, "{\"a\":0,\"b\":0}", SD_ERR_FORMAT},
        {{"decoder", NULL}, "{\"type\":\"Metaspace\"}", SD_ERR_UNSUPPORTED},
        {{"pre_tokenizer", NULL}, "null", SD_ERR_UNSUPPORTED},
        {{"pre_tokenizer", NULL}, "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", SD_ERR_UNSUPPORTED},
        {{"pre_tokenizer", NULL}, "{\"type\":\"Whitespace\"}", SD_ERR_UNSUPPORTED},
        {{"pre_tokenizer", NULL},
         "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\d+\"},"
         "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
         "\"use_regex\":false}]}",
         SD_ERR_UNSUPPORTED},
        {{"added_tokens", NULL}, "[{\"id\":\"x\",\"content\":\"y\"}]", SD_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = cJSON_Parse(text);
        cJSON *obj = bad[i].path[1] ? cJSON_GetObjectItemCaseSensitive(j, bad[i].path[0]) : j;
        const char *key = bad[i].path[1] ? bad[i].path[1] : bad[i].path[0];
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
        cJSON_AddItemToObject(obj, key, cJSON_Parse(bad[i].json));
        sd_status st = build(j, NULL, &t);
        if (st != bad[i].want)
            fail_msg("case %zu (%s.%s = %s): expected %s, got %s", i, bad[i].path[0],
                     bad[i].path[1] ? bad[i].path[1] : "", bad[i].json, sd_status_str(bad[i].want), sd_status_str(st));
        assert_null(t);
        cJSON_Delete(j);
    }
    assert_int_equal(sd_tok_from_hf_json("{\"model\":", 9, NULL, &t), SD_ERR_FORMAT);

    /* the llama3 split, with ignore_merges as Llama 3 writes it, is recognised */
    j = cJSON_Parse(text);
    cJSON_ReplaceItemInObjectCaseSensitive(
        j, "pre_tokenizer",
        cJSON_Parse("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
                    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                    "\"trim_offsets\":true,\"use_regex\":false}]}"));
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "ignore_merges",
                                           cJSON_CreateTrue());
    assert_int_equal(build(j, NULL, &t), SD_OK);
    sd_tok_free(&t);
    cJSON_Delete(j);

    sd_tok_free(&base);
    free(text);
}

/* A vocabulary with Llama 3's pre-tokenizer ("llama-bpe") survives
 * specd-mkmodel's tokenizer.json: the engine recognises the Split it writes,
 * with ignore_merges, and tokenizes digits in threes like the GGUF does. */
static void test_llama3_tokenizer_json(void **state) {
    (void)state;
    if (!env.ok) skip();
    char err[256], tok_gguf[256], d[256];
    sd_gguf *src = NULL;
    assert_int_equal(sd_gguf_open(PAIRS[0].gguf, &src, err, sizeof err), SD_OK);
    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_int_equal(sd_gguf_writer_copy_kv(w, src, "tokenizer."), SD_OK);
    assert_int_equal(sd_gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe"), SD_OK);
    snprintf(tok_gguf, sizeof tok_gguf, "%s/llama3-tok.gguf", env.dir);
    assert_int_equal(sd_gguf_writer_write(w, tok_gguf), SD_OK);
    sd_gguf_writer_free(&w);
    sd_gguf_close(&src);
    snprintf(d, sizeof d, "%s/llama3-hf", env.dir);
    assert_int_equal(run("'%s' -o '%s' --format hf --tokenizer-from '%s' --dim 32 --heads 2 --kv-heads 1 --ff 32 "
                         "--layers 1 >/dev/null 2>&1",
                         SPECD_MKMODEL, d, tok_gguf),
                     0);
    sd_weights *g = open_ok(tok_gguf), *h = open_ok(d);
    sd_tok *tg = NULL, *th = NULL;
    assert_int_equal(sd_weights_tokenizer(g, &tg), SD_OK);
    assert_int_equal(sd_weights_tokenizer(h, &th), SD_OK);
    assert_true(sd_tok_vocab_hash(tg) == sd_tok_vocab_hash(th));
    const char *text = "year 12345 then 7, theirs";
    int32_t *ia, *ib;
    size_t na, nb;
    assert_int_equal(sd_tok_encode(tg, text, strlen(text), false, &ia, &na), SD_OK);
    assert_int_equal(sd_tok_encode(th, text, strlen(text), false, &ib, &nb), SD_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na * sizeof *ia);
    free(ia);
    free(ib);
    sd_tok_free(&tg);
    sd_tok_free(&th);
    sd_weights_close(&g);
    sd_weights_close(&h);
}

/* --model: the demo model (SmolLM2-135M, Q4_1) converted by specd-mkmodel
 * --convert into a 2-shard f32 checkpoint: the dequantized weights are
 * exact in f32, so logits must be bit-identical with the GGUF's matrices
 * read as f32 (SD_CPU_WEIGHTS_F32, --cpu-weights f32); the tokenizer.json written
 * from the GGUF's vocabulary must give the same vocabulary hash (the
 * coordinator's compatibility check), special ids and encodings. */
static void test_demo_model(void **state) {
    (void)state;
    const char *model = getenv("SPECD_MODEL"); /* main checked it */
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-hf-XXXXXX");
    assert_non_null(mkdtemp(env.dir));
    char d[128];
    snprintf(d, sizeof d, "%s/smollm2-hf", env.dir);
    assert_int_equal(run("'%s' --format hf --convert '%s' -o '%s' --shards 2 >/dev/null 2>&1", SPECD_MKMODEL, model, d),
                     0);
    sd_weights *g = open_ok(model), *h = open_ok(d);
    sd_tok *tg = NULL, *th = NULL;
    assert_int_equal(sd_weights_tokenizer(g, &tg), SD_OK);
    assert_int_equal(sd_weights_tokenizer(h, &th), SD_OK);
    assert_true(sd_tok_vocab_hash(tg) == sd_tok_vocab_hash(th));
    assert_int_equal(sd_tok_bos(tg), sd_tok_bos(th));
    assert_int_equal(sd_tok_eos(tg), sd_tok_eos(th));
    assert_int_equal(sd_tok_add_bos(tg), sd_tok_add_bos(th));
    for (int32_t id = 0; id < 32; id++) assert_int_equal(sd_tok_is_eog(tg, id), sd_tok_is_eog(th, id));
    const char *text = "<|im_start|>user\nWhat is the capital of France? 12345<|im_end|>\n";
    int32_t *ia, *ib;
    size_t na, nb;
    assert_int_equal(sd_tok_encode(tg, text, strlen(text), true, &ia, &na), SD_OK);
    assert_int_equal(sd_tok_encode(th, text, strlen(text), true, &ib, &nb), SD_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na * sizeof *ia);

    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_model *mg = NULL, *mh = NULL;
    /* the GGUF's matrices read as f32, like the checkpoint's: kept as stored
     * (Q4_1) the CPU would round activations to 8 bits, which the f32
     * checkpoint's matmuls do not */
    sd_model_params mp_f32 = mp;
    mp_f32.backend.cpu_weights = SD_CPU_WEIGHTS_F32;
    assert_int_equal(sd_model_load_weights(g, &mp_f32, &mg), SD_OK);
    assert_int_equal(sd_model_load_weights(h, &mp, &mh), SD_OK);
    int32_t n = (int32_t)na, V = sd_model_config_of(mg)->n_vocab;
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = calloc((size_t)n, sizeof *seq);
    bool *want = malloc((size_t)n);
    float *a = malloc((size_t)n * (size_t)V * sizeof *a), *b = malloc((size_t)n * (size_t)V * sizeof *b);
    for (int32_t i = 0; i < n; i++) pos[i] = i, want[i] = true;
    sd_batch batch = {.n_tokens = n, .tokens = ia, .pos = pos, .seq = seq, .logits = want};
    sd_model *models[2] = {mg, mh};
    float *outs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        sd_kv *kv = NULL;
        assert_int_equal(sd_model_kv_create(models[k], 1, n / 16 + 2, 16, &kv), SD_OK);
        assert_int_equal(sd_model_forward(models[k], kv, &batch, outs[k]), SD_OK);
        sd_kv_free(&kv);
    }
    assert_memory_equal(a, b, (size_t)n * (size_t)V * sizeof *a);
    free(a);
    free(b);
    free(pos);
    free(seq);
    free(want);
    free(ia);
    free(ib);
    sd_model_free(&mg);
    sd_model_free(&mh);
    sd_tok_free(&tg);
    sd_tok_free(&th);
    sd_weights_close(&g);
    sd_weights_close(&h);
    run("rm -rf '%s'", d);
}

int main(int argc, char **argv) {
    sd_log_set(NULL, NULL, getenv("SPECD_TEST_LOG") ? SD_LOG_DEBUG : SD_LOG_OFF, NULL);
    if (argc > 1 && strcmp(argv[1], "--model") == 0) {
        const char *model = getenv("SPECD_MODEL");
        if (!model || access(model, R_OK) != 0) {
            printf("skip: SPECD_MODEL does not name the demo model (tools/fetch-model)\n");
            return 77;
        }
        const struct CMUnitTest model_tests[] = {cmocka_unit_test(test_demo_model)};
        return cmocka_run_group_tests(model_tests, NULL, teardown_model);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_numbers),    cmocka_unit_test(test_same_logits),
        cmocka_unit_test(test_bad_checkpoints), cmocka_unit_test(test_config_values),
        cmocka_unit_test(test_tokenizer_json),  cmocka_unit_test(test_llama3_tokenizer_json),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
