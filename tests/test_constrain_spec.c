/* test_constrain_spec.c — speculative decoding under a constraint equals
 * constrained plain decoding, on a small random model (specd-mkmodel: no
 * demo model needed): greedy bit for bit and seeded identical, with the
 * n-gram drafter, the masked self-draft, and forced drafts alone; and the
 * output is a sentence of the constraint (or a prefix of one at the token
 * limit). With the demo model (SPECD_MODEL), forced drafts guessed at JSON's
 * optional whitespace: drafted and accepted where the forced bytes are
 * none (the old rule drafted nothing there), the output unchanged; and
 * the drafts stop after the encoder's piece of a word the model split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specd/constrain.h"
#include "specd/constrain_slots.h"
#include "specd/gguf.h"
#include "specd/sample.h"
#include "specd/spec_decode.h"

#define VOCAB   600
#define N_NEW   40
#define MAX_CTX 256

static struct {
    char dir[64], path[128];
    bool ok;
    sd_model *model;
    sd_tok *tok;
    sd_cvocab *vocab;
} env;

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-cspec-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 2 --vocab %d --seed 35 >/dev/null 2>&1", SPECD_MKMODEL, env.path,
             VOCAB);
    env.ok = system(cmd) == 0;
    if (!env.ok) return 0;
    sd_gguf *g = NULL;
    char err[128];
    if (sd_gguf_open(env.path, &g, err, sizeof err) != SD_OK) return -1;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_status st = sd_model_load(g, &mp, &env.model);
    if (st == SD_OK) st = sd_tok_from_gguf(g, &env.tok);
    if (st == SD_OK) st = sd_cvocab_create(env.tok, &env.vocab);
    sd_gguf_close(&g);
    return st == SD_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    sd_cvocab_free(&env.vocab);
    sd_tok_free(&env.tok);
    sd_model_free(&env.model);
    unlink(env.path);
    rmdir(env.dir);
    return 0;
}

/* Constrained plain decoding: mask, then the sampler. Returns the count. */
static int32_t plain(const sd_grammar *gr, const int32_t *prompt, int32_t n_prompt, const sd_sampling *s,
                     int32_t *out) {
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(gr, env.vocab, &c), SD_OK);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.model, 1, MAX_CTX / 16 + 2, 16, &kv), SD_OK);
    static float logits[VOCAB];
    int32_t pos[MAX_CTX], seq[MAX_CTX] = {0};
    bool want[MAX_CTX] = {false};
    for (int32_t i = 0; i < n_prompt; i++) pos[i] = i;
    want[n_prompt - 1] = true;
    sd_batch b = {n_prompt, prompt, pos, seq, want};
    assert_int_equal(sd_model_forward(env.model, kv, &b, logits), SD_OK);
    int32_t n = 0;
    while (n < N_NEW) {
        int32_t p = n_prompt + n;
        assert_int_equal(sd_constraint_apply(c, logits, VOCAB), SD_OK);
        assert_int_equal(sd_sample_token(logits, VOCAB, s, (uint64_t)p, &out[n]), SD_OK);
        assert_int_equal(sd_constraint_advance(c, out[n]), SD_OK);
        if (sd_tok_is_eog(env.tok, out[n++])) break;
        bool one = true;
        sd_batch step = {1, &out[n - 1], &p, seq, &one};
        assert_int_equal(sd_model_forward(env.model, kv, &step, logits), SD_OK);
    }
    sd_kv_free(&kv);
    sd_constraint_free(&c);
    return n;
}

/* The same through the speculative decoder (drafter may be NULL: forced drafts alone). */
static int32_t spec(const sd_grammar *gr, sd_drafter *drafter, const int32_t *prompt, int32_t n_prompt,
                    const sd_sampling *s, int32_t *out, int64_t *forced) {
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(gr, env.vocab, &c), SD_OK);
    sd_spec_decoder *d = NULL;
    assert_int_equal(sd_spec_decoder_create(env.model, drafter, MAX_CTX, &d), SD_OK);
    sd_spec_decoder_set_prompt_len(d, n_prompt);
    assert_int_equal(sd_spec_decoder_set_constraint(d, c, env.tok), SD_OK);
    int32_t ctx[MAX_CTX + SD_MAX_K + 1];
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    int32_t n = 0;
    bool ended = false;
    while (n < N_NEW && !ended) {
        int32_t step[SD_MAX_K + 1], n_step = 0, left = N_NEW - n - 1;
        assert_int_equal(sd_spec_decoder_step(d, ctx, n_prompt + n, left < 4 ? left : 4, s, step, &n_step, NULL, NULL),
                         SD_OK);
        for (int32_t i = 0; i < n_step && n < N_NEW && !ended; i++) {
            ctx[n_prompt + n] = out[n] = step[i];
            ended = sd_tok_is_eog(env.tok, out[n++]);
        }
    }
    *forced = sd_spec_decoder_forced_drafted(d);
    sd_spec_decoder_free(&d);
    sd_constraint_free(&c);
    return n;
}

static void check_sentence(const sd_grammar *gr, const int32_t *ids, int32_t n) {
    if (!n || !sd_tok_is_eog(env.tok, ids[n - 1])) return; /* at the limit: a prefix, checked by the mask */
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(sd_tok_decode(env.tok, ids, (size_t)n - 1, &text, &len), SD_OK);
    if (!sd_grammar_match(gr, text, len)) fail_msg("output %.*s is not a sentence of the constraint", (int)len, text);
    free(text);
}

static void run_case(const sd_grammar *gr) {
    int32_t prompt[8];
    for (int32_t i = 0; i < 8; i++) prompt[i] = 3 + (i * 37) % (VOCAB - 3);
    sd_sampling greedy = sd_sampling_default();
    sd_sampling seeded = sd_sampling_default();
    seeded.temperature = 0.9f;
    seeded.seed = 35;
    const sd_sampling *modes[2] = {&greedy, &seeded};
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = MAX_CTX;
    dp.n_threads = 1;
    sd_drafter *ngram = NULL, *self = NULL;
    assert_int_equal(sd_drafter_ngram_create(&dp, &ngram), SD_OK);
    assert_int_equal(sd_drafter_self_view(env.model, 1, &dp, &self), SD_OK);
    sd_drafter *drafters[3] = {ngram, self, NULL};
    for (int m = 0; m < 2; m++) {
        int32_t ref[N_NEW], got[N_NEW];
        int32_t n_ref = plain(gr, prompt, 8, modes[m], ref);
        check_sentence(gr, ref, n_ref);
        for (int k = 0; k < 3; k++) {
            int64_t forced = 0;
            int32_t n = spec(gr, drafters[k], prompt, 8, modes[m], got, &forced);
            assert_int_equal(n, n_ref);
            assert_memory_equal(got, ref, (size_t)n * sizeof *got);
            if (k == 2 && m == 0) print_message("forced drafts alone: %lld proposed\n", (long long)forced);
        }
    }
    sd_drafter_free(&self);
    sd_drafter_free(&ngram);
}

static void test_schema_spec_equals_plain(void **state) {
    (void)state;
    if (!env.ok) skip();
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                         "\"kind\":{\"enum\":[\"alpha\",\"beta\"]},\"n\":{\"type\":\"integer\"}},"
                         "\"required\":[\"name\",\"kind\",\"n\"],\"additionalProperties\":false}";
    sd_grammar *gr = NULL;
    char err[256];
    assert_int_equal(sd_grammar_from_json_schema(schema, strlen(schema), NULL, &gr, err, sizeof err), SD_OK);
    run_case(gr);
    sd_grammar_free(&gr);
}

static void test_regex_spec_equals_plain(void **state) {
    (void)state;
    if (!env.ok) skip();
    const char *re = "(ab|cd)+ [a-z]{2,8}\\.";
    sd_grammar *gr = NULL;
    char err[256];
    assert_int_equal(sd_grammar_from_regex(re, strlen(re), NULL, &gr, err, sizeof err), SD_OK);
    run_case(gr);
    sd_grammar_free(&gr);
}

/* The proposer alone (sd_constraint_forced_tokens), on the random model's
 * tokenizer: after `,` nothing is forced (optional whitespace), so the
 * encoder's forced tokens are none; the output so far wrote `\n  "` after
 * its earlier `,`, so that is guessed, then the forced key, then `": ` as
 * written before. The drafts are tokens the constraint allows in turn. */
static void test_spacing_guess_tokens(void **state) {
    (void)state;
    if (!env.ok) skip();
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
                         "\"integer\"},\"c\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\",\"c\"]}";
    sd_grammar *gr = NULL;
    char err[256];
    assert_int_equal(sd_grammar_from_json_schema(schema, strlen(schema), NULL, &gr, err, sizeof err), SD_OK);
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(gr, env.vocab, &c), SD_OK);
    const char *chunks[2] = {"{\n  \"a\": 1,", "\n  \"b\": 2,"};
    for (int i = 0; i < 2; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(sd_tok_encode(env.tok, chunks[i], strlen(chunks[i]), false, &ids, &n), SD_OK);
        for (size_t j = 0; j < n; j++) assert_int_equal(sd_constraint_advance(c, ids[j]), SD_OK);
        free(ids);
    }
    char fb[16];
    assert_int_equal(sd_constraint_forced_bytes(c, fb, sizeof fb), 0);
    int32_t drafts[SD_MAX_K], len = sd_constraint_len(c);
    int32_t nd = sd_constraint_forced_tokens(c, env.tok, SD_MAX_K, drafts);
    assert_int_equal(sd_constraint_len(c), len); /* left as it was */
    char text[256] = "";
    size_t at = 0;
    for (int32_t i = 0; i < nd; i++) {
        size_t l = 0;
        const char *p = sd_tok_piece(env.tok, drafts[i], &l);
        assert_true(at + l < sizeof text);
        memcpy(text + at, p, l);
        at += l;
        assert_int_equal(sd_constraint_advance(c, drafts[i]), SD_OK);
    }
    text[at] = '\0';
    print_message("drafted after `,`: %d tokens \"%s\"\n", (int)nd, text);
    const char *want = "\n  \"c\": ";
    assert_true(at >= 4 && at <= strlen(want) && memcmp(text, want, at) == 0);
    sd_constraint_free(&c);
    sd_grammar_free(&gr);
    /* a longer object, the proposer called after every token: its drafts
     * cross the constraint's history growth (64, 128 tokens; a first
     * string value of 0-11 letters moves where) and are tokens the
     * constraint allows in turn */
    for (int shift = 0; shift < 12; shift++) {
        char big[1024] = "{\"type\":\"object\",\"properties\":{", out[512] = "{";
        char pad[16] = "";
        memset(pad, 'x', (size_t)shift);
        for (int i = 0; i < 16; i++) {
            snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"k%d\":{\"type\":\"%s\"}", i ? "," : "", i,
                     i ? "integer" : "string");
            if (i)
                snprintf(out + strlen(out), sizeof out - strlen(out), ",\n  \"k%d\": %d", i, i * 7);
            else
                snprintf(out + strlen(out), sizeof out - strlen(out), "\n  \"k0\": \"%s\"", pad);
        }
        strcat(big, "}}");
        strcat(out, "\n}");
        assert_int_equal(sd_grammar_from_json_schema(big, strlen(big), NULL, &gr, err, sizeof err), SD_OK);
        assert_int_equal(sd_constraint_create(gr, env.vocab, &c), SD_OK);
        int32_t *ids = NULL;
        size_t n_ids = 0, guessed = 0;
        assert_int_equal(sd_tok_encode(env.tok, out, strlen(out), false, &ids, &n_ids), SD_OK);
        assert_true(n_ids > 140);
        for (size_t i = 0; i < n_ids; i++) {
            int32_t base = sd_constraint_len(c);
            nd = sd_constraint_forced_tokens(c, env.tok, SD_MAX_K, drafts);
            assert_int_equal(sd_constraint_len(c), base);
            for (int32_t j = 0; j < nd; j++) assert_int_equal(sd_constraint_advance(c, drafts[j]), SD_OK);
            assert_int_equal(sd_constraint_rollback(c, base), SD_OK);
            guessed += (size_t)nd;
            assert_int_equal(sd_constraint_advance(c, ids[i]), SD_OK);
        }
        assert_true(sd_constraint_accepting(c));
        assert_true(guessed > n_ids / 2);
        free(ids);
        sd_constraint_free(&c);
        sd_grammar_free(&gr);
    }
}

/* The demo model writes JSON with the same spacing after every `,`: the
 * forced-draft proposer guesses it from the output so far. Greedy, forced
 * drafts alone: the output equals constrained plain decoding, and some
 * step where nothing is forced (sd_constraint_forced_bytes: none, so the
 * encoder's forced tokens were none) drafted and had drafts accepted. */
static void test_spacing_guess_demo(void **state) {
    (void)state;
    const char *path = getenv("SPECD_MODEL");
    if (!path || !*path) skip();
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_model *m = NULL;
    sd_tok *tok = NULL;
    sd_cvocab *v = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    assert_int_equal(sd_tok_from_gguf(g, &tok), SD_OK);
    sd_gguf_close(&g);
    assert_int_equal(sd_cvocab_create(tok, &v), SD_OK);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"
                         "\"age\":{\"type\":\"integer\"},\"city\":{\"type\":\"string\",\"maxLength\":24},"
                         "\"role\":{\"enum\":[\"engineer\",\"doctor\",\"teacher\"]}},"
                         "\"required\":[\"name\",\"age\",\"city\",\"role\"],\"additionalProperties\":false}";
    sd_grammar *gr = NULL;
    assert_int_equal(sd_grammar_from_json_schema(schema, strlen(schema), NULL, &gr, err, sizeof err), SD_OK);
    const char *text = "Describe a fictional person as JSON.\n";
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    assert_int_equal(sd_tok_encode(tok, text, strlen(text), true, &prompt, &n_prompt), SD_OK);
    enum { N = 48, CTX = 256 };
    const int32_t V = sd_tok_n_vocab(tok);
    sd_sampling greedy = sd_sampling_default();
    /* constrained plain decoding */
    int32_t ref[N], n_ref = 0;
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(gr, v, &c), SD_OK);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, CTX / 16 + 2, 16, &kv), SD_OK);
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t pos[CTX], seq[CTX] = {0};
    bool want[CTX] = {false};
    for (int32_t i = 0; i < (int32_t)n_prompt; i++) pos[i] = i;
    want[n_prompt - 1] = true;
    sd_batch b = {(int32_t)n_prompt, prompt, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, logits), SD_OK);
    while (n_ref < N) {
        int32_t p = (int32_t)n_prompt + n_ref;
        assert_int_equal(sd_constraint_apply(c, logits, V), SD_OK);
        assert_int_equal(sd_sample_token(logits, V, &greedy, (uint64_t)p, &ref[n_ref]), SD_OK);
        assert_int_equal(sd_constraint_advance(c, ref[n_ref]), SD_OK);
        if (sd_tok_is_eog(tok, ref[n_ref++])) break;
        bool one = true;
        sd_batch step = {1, &ref[n_ref - 1], &p, seq, &one};
        assert_int_equal(sd_model_forward(m, kv, &step, logits), SD_OK);
    }
    sd_kv_free(&kv);
    sd_constraint_free(&c);
    /* forced drafts alone, and a probe constraint over the committed tokens */
    sd_constraint *probe = NULL;
    assert_int_equal(sd_constraint_create(gr, v, &c), SD_OK);
    assert_int_equal(sd_constraint_create(gr, v, &probe), SD_OK);
    sd_spec_decoder *d = NULL;
    assert_int_equal(sd_spec_decoder_create(m, NULL, CTX, &d), SD_OK);
    sd_spec_decoder_set_prompt_len(d, (int32_t)n_prompt);
    assert_int_equal(sd_spec_decoder_set_constraint(d, c, tok), SD_OK);
    int32_t ctx[CTX + SD_MAX_K + 1], n = 0, guessed_steps = 0;
    memcpy(ctx, prompt, n_prompt * sizeof *ctx);
    bool ended = false;
    while (n < n_ref && !ended) {
        char fb[64];
        bool none_forced = sd_constraint_forced_bytes(probe, fb, sizeof fb) == 0;
        int32_t out[SD_MAX_K + 1], n_out = 0, nd = 0, na = 0, left = N - n - 1;
        assert_int_equal(
            sd_spec_decoder_step(d, ctx, (int32_t)n_prompt + n, left < 8 ? left : 8, &greedy, out, &n_out, &nd, &na),
            SD_OK);
        guessed_steps += none_forced && nd > 0 && na > 0;
        for (int32_t i = 0; i < n_out && n < N && !ended; i++) {
            ctx[n_prompt + (size_t)n] = out[i];
            assert_int_equal(out[i], ref[n]); /* the output unchanged */
            assert_int_equal(sd_constraint_advance(probe, out[i]), SD_OK);
            ended = sd_tok_is_eog(tok, out[i]);
            n++;
        }
    }
    assert_int_equal(n, n_ref);
    print_message("spacing guesses accepted at %d steps where nothing was forced\n", (int)guessed_steps);
    assert_true(guessed_steps > 0);
    sd_spec_decoder_free(&d);
    sd_constraint_free(&probe);
    sd_constraint_free(&c);
    free(logits);
    free(prompt);
    sd_grammar_free(&gr);
    sd_cvocab_free(&v);
    sd_tok_free(&tok);
    sd_model_free(&m);
}

/* A constraint of the JSON Schema text over v (its grammar in *gr). */
static sd_constraint *schema_constraint(const char *schema, const sd_cvocab *v, sd_grammar **gr) {
    char err[256];
    sd_constraint *c = NULL;
    assert_int_equal(sd_grammar_from_json_schema(schema, strlen(schema), NULL, gr, err, sizeof err), SD_OK);
    assert_int_equal(sd_constraint_create(*gr, v, &c), SD_OK);
    return c;
}

/* The demo model's tokenizer and constraint vocabulary (SPECD_MODEL);
 * false when the model is not given. */
static bool demo_vocab(sd_tok **tok, sd_cvocab **v) {
    const char *path = getenv("SPECD_MODEL");
    if (!path || !*path) return false;
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    assert_int_equal(sd_tok_from_gguf(g, tok), SD_OK);
    sd_gguf_close(&g);
    assert_int_equal(sd_cvocab_create(*tok, v), SD_OK);
    return true;
}

/* Forced drafts stop after a word the model split its own way: with the
 * demo tokenizer, after `{"c` (the model wrote `c` alone) the forced
 * `ontinent":` is drafted as the encoder's first token only (the model
 * goes on `ont` `in` `en` `t`, not as the encoder), while after `{"` the
 * whole key and more are drafted. Every draft is allowed in turn. */
static void test_split_word_stops(void **state) {
    (void)state;
    sd_tok *tok = NULL;
    sd_cvocab *v = NULL;
    if (!demo_vocab(&tok, &v)) skip();
    const char *schema = "{\"type\":\"object\",\"properties\":{\"continent\":{\"type\":\"integer\"}},"
                         "\"required\":[\"continent\"],\"additionalProperties\":false}";
    sd_grammar *gr = NULL;
    sd_constraint *c = NULL;
    c = schema_constraint(schema, v, &gr);
    const char *pieces[3] = {"{", "\"", "c"};
    int32_t drafts[SD_MAX_K], nd_start = 0;
    for (int i = 0; i < 3; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(sd_tok_encode(tok, pieces[i], strlen(pieces[i]), false, &ids, &n), SD_OK);
        assert_int_equal(n, 1);
        assert_int_equal(sd_constraint_advance(c, ids[0]), SD_OK);
        free(ids);
        if (i == 1) { /* at the key's start: the key and past it */
            int32_t base = sd_constraint_len(c);
            nd_start = sd_constraint_forced_tokens(c, tok, SD_MAX_K, drafts);
            assert_int_equal(sd_constraint_len(c), base);
        }
    }
    assert_true(nd_start >= 2);
    char fb[32];
    size_t n_fb = sd_constraint_forced_bytes(c, fb, sizeof fb);
    assert_true(n_fb >= 9 && memcmp(fb, "ontinent\"", 9) == 0);
    int32_t *enc = NULL;
    size_t n_enc = 0;
    assert_int_equal(sd_tok_encode(tok, fb, n_fb, false, &enc, &n_enc), SD_OK);
    size_t l0 = 0;
    sd_tok_piece(tok, enc[0], &l0);
    assert_true(n_enc >= 3 && l0 >= 2); /* the encoder's first token is a multi-byte piece of the word */
    int32_t base = sd_constraint_len(c);
    int32_t nd = sd_constraint_forced_tokens(c, tok, SD_MAX_K, drafts);
    assert_int_equal(sd_constraint_len(c), base);
    print_message("after `{\"`: %d drafts; after `{\"c`: %d\n", (int)nd_start, (int)nd);
    assert_int_equal(nd, 1);
    assert_int_equal(drafts[0], enc[0]);
    assert_int_equal(sd_constraint_advance(c, drafts[0]), SD_OK);
    free(enc);
    sd_constraint_free(&c);
    sd_grammar_free(&gr);
    sd_cvocab_free(&v);
    sd_tok_free(&tok);
}

/* Feeds the constraint each piece as the tokenizer encodes it alone (the
 * output's own split of the bytes). */
static void feed_pieces(sd_constraint *c, const sd_tok *tok, const char *const *pieces, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(sd_tok_encode(tok, pieces[i], strlen(pieces[i]), false, &ids, &n_ids), SD_OK);
        for (size_t j = 0; j < n_ids; j++) assert_int_equal(sd_constraint_advance(c, ids[j]), SD_OK);
        free(ids);
    }
}

/* The forced drafts' text after the output so far (each draft allowed in
 * turn; c left as it was). */
static void forced_text(sd_constraint *c, const sd_tok *tok, char *text, size_t cap, int32_t *first) {
    int32_t drafts[SD_MAX_K], base = sd_constraint_len(c);
    int32_t nd = sd_constraint_forced_tokens(c, tok, SD_MAX_K, drafts);
    assert_int_equal(sd_constraint_len(c), base);
    size_t at = 0;
    for (int32_t i = 0; i < nd; i++) {
        size_t l = 0;
        const char *p = sd_tok_piece(tok, drafts[i], &l);
        assert_true(at + l < cap);
        memcpy(text + at, p, l);
        at += l;
        assert_int_equal(sd_constraint_advance(c, drafts[i]), SD_OK);
    }
    text[at] = '\0';
    *first = nd ? drafts[0] : -1;
    assert_int_equal(sd_constraint_rollback(c, base), SD_OK);
}

/* Feeds pieces (feed_pieces), then the forced drafts' text (forced_text). */
static void forced_after(sd_constraint *c, const sd_tok *tok, const char *const *pieces, size_t n, char *text,
                         size_t cap, int32_t *first) {
    feed_pieces(c, tok, pieces, n);
    forced_text(c, tok, text, cap, first);
}

/* The forced drafts follow the output's own split and spacing (the demo
 * tokenizer; SmolLM2 wrote both, bench/results/constrain-cpu.md):
 * - a forced key the output wrote before as `s` `ku` is drafted so again,
 *   not as the encoder's `sk` `u`, while a key that only starts as an
 *   earlier one did (`s` `ale`, forced `sku`) keeps the encoder's;
 * - after a number, the spacing written after an earlier number (` ` after
 *   `1\n `) is guessed after another one (`2\n `), the digits counting as
 *   one context;
 * - a line is indented as the output indented lines at the same bracket
 *   depth. */
static void test_guess_follows_output(void **state) {
    (void)state;
    sd_tok *tok = NULL;
    sd_cvocab *v = NULL;
    if (!demo_vocab(&tok, &v)) skip();
    int32_t *s_id = NULL, *sk = NULL, *sp = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0;
    assert_int_equal(sd_tok_encode(tok, "s", 1, false, &s_id, &n1), SD_OK);
    assert_int_equal(sd_tok_encode(tok, "sku\":", 5, false, &sk, &n2), SD_OK);
    assert_int_equal(sd_tok_encode(tok, " ", 1, false, &sp, &n3), SD_OK);
    assert_true(n1 == 1 && n2 >= 2 && n3 == 1 && sk[0] != s_id[0]); /* the encoder splits `sku` otherwise */
    const char *schema = "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":"
                         "\"integer\"},\"sale\":{\"type\":\"integer\"}},\"required\":[\"sku\",\"sale\"],"
                         "\"additionalProperties\":false}}";
    sd_grammar *gr = NULL;
    sd_constraint *c = NULL;
    c = schema_constraint(schema, v, &gr);
    char text[256];
    int32_t first = -1;
    const char *out[] = {"[", "{\"", "s", "ku", "\": ", "1", "\n ", " ", ",\"", "sale", "\": ", "4", "}, ", "{\""};
    forced_after(c, tok, out, sizeof out / sizeof *out, text, sizeof text, &first);
    print_message("after `{\"` (the output wrote `s` `ku` before): \"%s\"\n", text);
    assert_int_equal(first, s_id[0]);
    assert_true(strncmp(text, "sku\":", 5) == 0);
    const char *more[] = {"s", "ku", "\": ", "2", "\n "};
    forced_after(c, tok, more, sizeof more / sizeof *more, text, sizeof text, &first);
    print_message("after `2\\n ` (the output wrote `1\\n ` ` `): \"%s\"\n", text);
    assert_int_equal(first, sp[0]);
    sd_constraint_free(&c);
    sd_grammar_free(&gr);
    /* `sku` forced after another key written `s` `ale`: that `s` went on
     * otherwise, so the encoder's split is drafted */
    const char *schema2 = "{\"type\":\"object\",\"properties\":{\"sale\":{\"type\":\"integer\"},\"sku\":{\"type\":"
                          "\"integer\"}},\"required\":[\"sale\",\"sku\"],\"additionalProperties\":false}";
    c = schema_constraint(schema2, v, &gr);
    const char *out2[] = {"{\"", "s", "ale", "\": ", "1", ", \""};
    forced_after(c, tok, out2, sizeof out2 / sizeof *out2, text, sizeof text, &first);
    print_message("after `, \"` (the output wrote `s` `ale` before): \"%s\"\n", text);
    assert_int_equal(first, sk[0]);
    sd_constraint_free(&c);
    sd_grammar_free(&gr);
    /* indentation by depth: after `},` the line is indented as the output
     * did under `[` (depth 1), not as after the last `,` (depth 2); after
     * `:` nothing that starts a line is guessed */
    const char *schema3 = "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                          "\"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"],"
                          "\"additionalProperties\":false}}";
    c = schema_constraint(schema3, v, &gr);
    const char *out3[] = {"[",   "\n   ",  " {", "\n       ", " \"", "a",     "\":", " ", "1", ",",
                          "\n       ", " \"", "b", "\":",        " ",   "2",     "\n   ", " },"};
    forced_after(c, tok, out3, sizeof out3 / sizeof *out3, text, sizeof text, &first);
    print_message("after ` },` (depth 1): \"%s\"\n", text);
    assert_true(strncmp(text, "\n   ", 4) == 0 && (text[4] != ' ' || text[5] != ' ')); /* not `\n       ` */
    const char *out4[] = {"\n   ", " {", "\n       ", " \"", "a", "\":"};
    forced_after(c, tok, out4, sizeof out4 / sizeof *out4, text, sizeof text, &first);
    print_message("after `\"a\":`: \"%s\"\n", text);
    assert_null(strchr(text, '\n'));
    sd_constraint_free(&c);
    sd_grammar_free(&gr);
    free(s_id);
    free(sk);
    free(sp);
    sd_cvocab_free(&v);
    sd_tok_free(&tok);
}

int main(void) {
    sd_log_set(NULL, NULL, getenv("SPECD_TEST_LOG") ? SD_LOG_DEBUG : SD_LOG_OFF, "test_constrain_spec");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_spec_equals_plain),
        cmocka_unit_test(test_regex_spec_equals_plain),
        cmocka_unit_test(test_spacing_guess_tokens),
        cmocka_unit_test(test_spacing_guess_demo),
        cmocka_unit_test(test_split_word_stops),
        cmocka_unit_test(test_guess_follows_output),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
