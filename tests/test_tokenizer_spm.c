/* test_tokenizer_spm.c — unit tests of the SentencePiece-style tokenizer.
 *
 * A tiny SPM vocabulary is written out in C (control tokens, the 256
 * <0xNN> byte tokens, a few scored pieces, user-defined tokens), so the
 * expected ids follow by hand from the rules: merge by score (leftmost on
 * ties), byte fallback, "▁" for spaces, the space prefix, control tokens
 * matched only when allowed and never produced by merging. The same
 * vocabulary goes through sd_tok_from_gguf and through a merge list instead
 * of scores (the tokenizer.json form). Gemma 3's real vocabulary is
 * compared with Hugging Face and llama.cpp in ref/test_tokenizer_spm.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specd/gguf.h"
#include "specd/tokenizer.h"
#include "tokenizer_impl.h"

#define SP "\xe2\x96\x81" /* "▁" */

enum { UNK = 0, BOS = 1, EOS = 2, BYTE0 = 3 }; /* ids; bytes are 3..258 */

typedef struct spm_fixture {
    sd_tok_text toks[400];
    int32_t types[400];
    float scores[400];
    size_t n;
    char bytes[256][7];
    sd_tok_spec spec;
} spm_fixture;

static int32_t add(spm_fixture *f, const char *text, int32_t type, float score) {
    assert_true(f->n < 400);
    f->toks[f->n] = (sd_tok_text){text, strlen(text)};
    f->types[f->n] = type;
    f->scores[f->n] = score;
    return (int32_t)f->n++;
}

/* Piece ids of the standard vocabulary, set by spm_init. */
static int32_t P_SP, P_A, P_B, P_C, P_AB, P_BC, P_SPA, P_LT, P_S, P_GT, P_LTS, P_NL2, P_NL, P_TOOL, P_SPSP, P_ABC;

static void spm_init(spm_fixture *f, bool prefix) {
    memset(f, 0, sizeof *f);
    add(f, "<unk>", 2, 0);
    add(f, "<s>", 3, 0);
    add(f, "</s>", 3, 0);
    for (int b = 0; b < 256; b++) {
        snprintf(f->bytes[b], sizeof f->bytes[b], "<0x%02X>", b);
        add(f, f->bytes[b], 6, 0);
    }
    P_SP = add(f, SP, 1, -1);
    P_A = add(f, "a", 1, -2);
    P_B = add(f, "b", 1, -3);
    P_C = add(f, "c", 1, -4);
    P_AB = add(f, "ab", 1, -5); /* "ab" scores above "bc": "abc" -> ab c */
    P_BC = add(f, "bc", 1, -6);
    P_SPA = add(f, SP "a", 1, -7);
    P_LT = add(f, "<", 1, -8);
    P_S = add(f, "s", 1, -9);
    P_GT = add(f, ">", 1, -10);
    P_LTS = add(f, "<s", 1, -11); /* "<s" + ">" would be the control token <s>: never merged */
    P_NL = add(f, "\n", 4, 0);
    P_NL2 = add(f, "\n\n", 4, 0);
    P_TOOL = add(f, "<tool>", 4, 0);
    P_SPSP = add(f, SP SP, 1, -12);
    P_ABC = add(f, "abc", 1, -13); /* reachable only as ab+c or a+bc */
    f->spec = sd_tok_spec_default();
    f->spec.model = (sd_tok_text){"llama", 5};
    f->spec.bos = BOS;
    f->spec.eos = EOS;
    f->spec.unk = UNK;
    f->spec.add_bos = true;
    f->spec.space_prefix = prefix ? SD_TOK_SPACE_PREFIX_ALWAYS : SD_TOK_SPACE_PREFIX_NONE;
}

static sd_tok *spm_build(spm_fixture *f) {
    f->spec.tokens = f->toks;
    f->spec.types = f->types;
    f->spec.scores = f->scores;
    f->spec.n_tokens = f->n;
    sd_tok *t = NULL;
    assert_int_equal(sd_tok_build(&f->spec, &t), SD_OK);
    return t;
}

static void expect(const sd_tok *t, const char *text, bool special, const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sd_tok_encode(t, text, strlen(text), special, &ids, &n), SD_OK);
    if (n != n_want || (n_want && memcmp(ids, want, n * sizeof *ids) != 0)) {
        fprintf(stderr, "encode('%s'): got", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        fail();
    }
    free(ids);
}
#define EXPECT(t, text, special, ...)                                          \
    do {                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                 \
        expect((t), (text), (special), want_, sizeof want_ / sizeof want_[0]); \
    } while (0)

static void expect_decode(const sd_tok *t, const char *text, bool special, const char *want) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sd_tok_encode(t, text, strlen(text), special, &ids, &n), SD_OK);
    char *back = NULL;
    size_t len = 0;
    assert_int_equal(sd_tok_decode(t, ids, n, &back, &len), SD_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(back, want, len);
    free(back);
    free(ids);
}

static void test_merges_by_score(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    sd_tok *t = spm_build(&f);
    assert_true(sd_tok_is_spm(t));
    EXPECT(t, "abc", false, P_ABC); /* ab, then ab+c */
    EXPECT(t, "ab ab", false, P_AB, P_SP, P_AB);
    EXPECT(t, "a  b", false, P_A, P_SPSP, P_B);
    expect(t, "", false, NULL, 0);
    sd_tok_free(&t);

    /* without "abc" the order shows: ab (-5) before bc (-6) ... */
    f.n--; /* "abc" is the last token */
    t = spm_build(&f);
    EXPECT(t, "abc", false, P_AB, P_C);
    sd_tok_free(&t);
    /* ... and with the scores swapped, bc first */
    f.scores[P_AB] = -6;
    f.scores[P_BC] = -5;
    t = spm_build(&f);
    EXPECT(t, "abc", false, P_A, P_BC);
    /* equal scores: the leftmost pair first */
    sd_tok_free(&t);
    f.scores[P_AB] = -5;
    t = spm_build(&f);
    EXPECT(t, "abc", false, P_AB, P_C);
    sd_tok_free(&t);
}

static void test_byte_fallback(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    sd_tok *t = spm_build(&f);
    /* é = C3 A9 and 😀 = F0 9F 98 80 are not pieces: their bytes */
    EXPECT(t, "a\xc3\xa9", false, P_A, BYTE0 + 0xC3, BYTE0 + 0xA9);
    EXPECT(t,
           "\xf0\x9f\x98\x80"
           "b",
           false, BYTE0 + 0xF0, BYTE0 + 0x9F, BYTE0 + 0x98, BYTE0 + 0x80, P_B);
    expect_decode(t, "a\xc3\xa9 \xf0\x9f\x98\x80 abc", false, "a\xc3\xa9 \xf0\x9f\x98\x80 abc");
    /* invalid UTF-8 still round-trips, byte by byte */
    expect_decode(t, "\xff\x80x\xe2", false, "\xff\x80x\xe2");

    /* the stream decoder never cuts the character the byte tokens spell */
    sd_tok_stream *s = sd_tok_stream_new(t);
    char out[256];
    size_t n = 0;
    assert_int_equal(sd_tok_stream_push(s, BYTE0 + 0xC3, out, sizeof out, &n), SD_OK);
    assert_int_equal(n, 0);
    assert_int_equal(sd_tok_stream_push(s, BYTE0 + 0xA9, out, sizeof out, &n), SD_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(out, "\xc3\xa9", 2);
    assert_int_equal(sd_tok_stream_push(s, P_SPA, out, sizeof out, &n), SD_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(out, " a", 2);
    sd_tok_stream_free(&s);
    size_t len;
    assert_string_equal(sd_tok_piece(t, P_SPA, &len), " a");
    assert_string_equal(sd_tok_piece(t, BYTE0 + 'A', &len), "A");
    sd_tok_free(&t);
}

static void test_space_prefix(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, true);
    sd_tok *t = spm_build(&f);
    EXPECT(t, "a b", false, P_SPA, P_SP, P_B);
    /* after every special token, as llama.cpp and HF's Prepend normalizer */
    EXPECT(t, "a<s>a", true, P_SPA, BOS, P_SPA);
    EXPECT(t, "a\n\na", false, P_SPA, P_NL2, P_SPA);
    expect_decode(t, "a b", false, " a b");
    sd_tok_free(&t);

    /* "first": only the fragment at the start of the text */
    f.spec.space_prefix = SD_TOK_SPACE_PREFIX_FIRST;
    t = spm_build(&f);
    EXPECT(t, "a<s>a", true, P_SPA, BOS, P_A);
    EXPECT(t, "<s>a", true, BOS, P_A);
    sd_tok_free(&t);
}

static void test_special_tokens(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    sd_tok *t = spm_build(&f);
    /* control tokens only with parse_special, and never by merging "<s"+">" */
    EXPECT(t, "<s>a", true, BOS, P_A);
    EXPECT(t, "<s>a", false, P_LTS, P_GT, P_A);
    EXPECT(t, "</s>", false, P_LT, BYTE0 + '/', P_S, P_GT);
    /* user-defined tokens always, longest first */
    EXPECT(t, "\n\n\na<tool>", false, P_NL2, P_NL, P_A, P_TOOL);
    /* masked: the user's bytes cannot become a control token */
    const char *text = "<s>a<s>";
    uint8_t mask[] = {0, 0, 0, 0, 1, 1, 1};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sd_tok_encode_masked(t, text, strlen(text), mask, &ids, &n), SD_OK);
    int32_t want[] = {BOS, P_A, P_LTS, P_GT};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    assert_true(sd_tok_is_eog(t, EOS));
    assert_true(sd_tok_add_bos(t));
    sd_tok_free(&t);
}

/* A piece with "▁" inside (Gemma 3 has ">▁</") must still be reached:
 * text is merged word by word only where no piece crosses the gap. */
static void test_piece_across_space(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    int32_t gt_sp = add(&f, ">" SP, 1, -1), gt_sp_lt = add(&f, ">" SP "<", 1, -1);
    sd_tok *t = spm_build(&f);
    EXPECT(t, "a> <b", false, P_A, gt_sp_lt, P_B);
    EXPECT(t, "a> b", false, P_A, gt_sp, P_B);
    EXPECT(t, "ab ab", false, P_AB, P_SP, P_AB);
    sd_tok_free(&t);
}

/* Padding to the embedding size (unused tokens at the end) leaves the
 * vocabulary hash alone: Qwen2.5-0.5B and -72B pair. */
static void test_hash_ignores_padding(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    sd_tok *a = spm_build(&f);
    add(&f, "[PAD300]", 5, 0);
    add(&f, "[PAD301]", 5, 0);
    sd_tok *b = spm_build(&f);
    assert_int_equal(sd_tok_n_vocab(b), sd_tok_n_vocab(a) + 2);
    assert_int_equal(sd_tok_n_core(b), sd_tok_n_vocab(a));
    assert_int_equal(sd_tok_n_core(a), sd_tok_n_vocab(a));
    assert_true(sd_tok_vocab_hash(a) == sd_tok_vocab_hash(b));
    f.types[P_C] = 4; /* any real difference still shows */
    sd_tok *c = spm_build(&f);
    assert_true(sd_tok_vocab_hash(c) != sd_tok_vocab_hash(b));
    sd_tok_free(&a);
    sd_tok_free(&b);
    sd_tok_free(&c);
}

/* Phi-3: special tokens that swallow the whitespace after them. */
static void test_rstrip(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    uint8_t rstrip[400] = {0};
    rstrip[EOS] = 1;
    f.spec.rstrip = rstrip;
    sd_tok *t = spm_build(&f);
    EXPECT(t, "a</s>  \t b", true, P_A, EOS, P_B);
    /* as Hugging Face: a special token inside the whitespace still counts,
     * and the whitespace after it is kept */
    EXPECT(t, "a</s> \n\tb", true, P_A, EOS, P_NL, BYTE0 + '\t', P_B);
    EXPECT(t, "a<s> b", true, P_A, BOS, P_SP, P_B);
    sd_tok_free(&t);
}

static void test_merge_list(void **state) {
    (void)state;
    /* tokenizer.json form: no scores, merges ranked by their order */
    spm_fixture f;
    spm_init(&f, false);
    sd_tok_text merges[] = {{"b c", 3}, {"a b", 3}, {"a bc", 4}, {SP " a", 5}};
    f.spec.merges = merges;
    f.spec.n_merges = 4;
    f.spec.tokens = f.toks;
    f.spec.types = f.types;
    f.spec.n_tokens = f.n;
    sd_tok *t = NULL;
    assert_int_equal(sd_tok_build(&f.spec, &t), SD_OK);
    EXPECT(t, "abc", false, P_ABC); /* b c first (rank 0), then a bc */
    EXPECT(t, "ab a", false, P_AB, P_SPA);
    EXPECT(t, "a\xc3\xa9", false, P_A, BYTE0 + 0xC3, BYTE0 + 0xA9);
    sd_tok_free(&t);
}

static void test_long_input(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, true);
    sd_tok *t = spm_build(&f);
    size_t n = 200000; /* one 200 KB word: fine for an O(n log n) merge */
    char *s = malloc(n + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) s[i] = "ab"[i % 2];
    s[n] = '\0';
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(sd_tok_encode(t, s, n, false, &ids, &n_ids), SD_OK);
    /* every "ab" (-5) merges before the prefix's "▁a" (-7) could */
    assert_int_equal(n_ids, n / 2 + 1);
    assert_int_equal(ids[0], P_SP);
    for (size_t i = 1; i < n_ids; i++) assert_int_equal(ids[i], P_AB);
    free(ids);
    free(s);
    sd_tok_free(&t);
}

static void test_from_gguf(void **state) {
    (void)state;
    spm_fixture f;
    spm_init(&f, false);
    sd_gguf_writer *w = sd_gguf_writer_new();
    const char *toks[400];
    for (size_t i = 0; i < f.n; i++) toks[i] = f.toks[i].ptr;
    assert_int_equal(sd_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"), SD_OK);
    assert_int_equal(sd_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, f.n), SD_OK);
    assert_int_equal(sd_gguf_writer_set_arr(w, "tokenizer.ggml.scores", SD_GGUF_TYPE_FLOAT32, f.scores, f.n), SD_OK);
    assert_int_equal(sd_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", SD_GGUF_TYPE_INT32, f.types, f.n), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", BOS), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", UNK), SD_OK);
    char path[] = "/tmp/specd_spm_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(sd_gguf_writer_write(w, path), SD_OK);
    sd_gguf_writer_free(&w);
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    sd_tok *t = NULL;
    assert_int_equal(sd_tok_from_gguf(g, &t), SD_OK);
    sd_gguf_close(&g);
    unlink(path);
    /* llama.cpp's defaults when the file is silent: BOS and a space prefix */
    assert_true(sd_tok_add_bos(t));
    assert_false(sd_tok_add_eos(t));
    EXPECT(t, "a b", false, P_SPA, P_SP, P_B);
    assert_int_equal(sd_tok_bos(t), BOS);
    sd_tok_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_by_score),      cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_space_prefix),         cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_hash_ignores_padding), cmocka_unit_test(test_rstrip),
        cmocka_unit_test(test_merge_list),           cmocka_unit_test(test_piece_across_space),
        cmocka_unit_test(test_long_input),           cmocka_unit_test(test_from_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
