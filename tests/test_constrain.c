/* test_constrain.c — the constraint engine: the GBNF parser and matcher,
 * regex and JSON Schema translation, refusals of hostile inputs within
 * bounds, and token masks against brute force on the demo model's
 * vocabulary (skipped without SPECD_MODEL). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "specd/constrain.h"
#include "specd/constrain_cache.h"
#include "specd/gguf.h"
#include "specd/tokenizer.h"

static sd_grammar *gbnf(const char *text) {
    sd_grammar *g = NULL;
    char err[256];
    sd_status st = sd_grammar_from_gbnf(text, strlen(text), NULL, &g, err, sizeof err);
    if (st != SD_OK) fail_msg("grammar refused: %s\n%s", err, text);
    return g;
}

static bool m(const sd_grammar *g, const char *s) { return sd_grammar_match(g, s, strlen(s)); }

static void test_gbnf_basics(void **state) {
    (void)state;
    sd_grammar *g = gbnf("root ::= \"ab\" [0-9]+ ( \"x\" | \"yz\" )? tail\n"
                         "tail ::= [^a-c\\n]{1,2}  # a comment\n");
    assert_true(m(g, "ab1xq"));
    assert_true(m(g, "ab123yzqq"));
    assert_true(m(g, "ab9dd"));
    assert_false(m(g, "ab1xqqq")); /* {1,2} */
    assert_false(m(g, "abxq"));    /* + needs one digit */
    assert_false(m(g, "ab1xa"));   /* negated class */
    assert_false(m(g, "ab1"));
    sd_grammar_free(&g);
    /* recursion (balanced parentheses), empty alternatives, UTF-8 */
    g = gbnf("root ::= p\np ::= \"(\" p \")\" p | \"\"\n");
    assert_true(m(g, ""));
    assert_true(m(g, "(()())()"));
    assert_false(m(g, "(()"));
    assert_false(m(g, "())("));
    sd_grammar_free(&g);
    g = gbnf("root ::= [é-ë] \"ü\" .");
    assert_true(m(g, "éü\xe2\x82\xac"));
    assert_false(m(g, "eü!"));
    assert_false(m(g, "éü\xe2\x82")); /* a half character is not a sentence */
    assert_false(m(g, "éü\xc0\x80")); /* overlong */
    sd_grammar_free(&g);
    /* rules continue across lines; x{0} */
    g = gbnf("root ::= a\n  | b\na ::= \"a\"{2} \"q\"{0}\nb ::= \"b\"\n");
    assert_true(m(g, "aa"));
    assert_true(m(g, "b"));
    assert_false(m(g, "a"));
    sd_grammar_free(&g);
}

static void refused(sd_status (*fn)(const char *, size_t, const sd_constrain_limits *, sd_grammar **, char *, size_t),
                    const char *text, const char *needle) {
    sd_grammar *g = NULL;
    char err[256] = "";
    clock_t t0 = clock();
    sd_status st = fn(text, strlen(text), NULL, &g, err, sizeof err);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    if (st == SD_OK) fail_msg("accepted, expected a refusal naming '%s': %.200s", needle, text);
    assert_null(g);
    if (!strstr(err, needle)) fail_msg("refusal '%s' does not name '%s'", err, needle);
    if (s > 5.0) fail_msg("refusing took %.1f s", s); /* a hang guard, not a timing test */
}

static void test_gbnf_refusals(void **state) {
    (void)state;
    refused(sd_grammar_from_gbnf, "root ::= x", "'x' is used but not defined");
    refused(sd_grammar_from_gbnf, "a ::= \"a\"", "no 'root'");
    refused(sd_grammar_from_gbnf, "root ::= root \"a\" | \"b\"", "left recursive");
    refused(sd_grammar_from_gbnf, "root ::= a\na ::= b? a \"x\"\nb ::= \"b\"", "left recursive");
    refused(sd_grammar_from_gbnf, "root ::= \"a\"{5000}", "repetition count");
    /* repetition of a group is one rule used many times: compact, accepted */
    sd_grammar *rep = gbnf("root ::= ( \"a\"{1000} ){1000}");
    sd_grammar_free(&rep);
    char many[2048] = "root ::= ";
    for (int i = 0; i < 120; i++) strcat(many, "[a-z]{0,1000} ");
    refused(sd_grammar_from_gbnf, many, "more than");
    /* a chain of 12,000 references at the rules' starts; empty rules whose
     * nullability would take thousands of passes to settle */
    char *big = malloc(1 << 20);
    assert_non_null(big);
    size_t n = (size_t)sprintf(big, "root ::= r0 \"x\"\n");
    for (int i = 0; i < 12000; i++) n += (size_t)sprintf(big + n, "r%d ::= r%d \"a\"\n", i, i + 1);
    sprintf(big + n, "r12000 ::= \"c\"\n");
    refused(sd_grammar_from_gbnf, big, "nest deeper");
    n = (size_t)sprintf(big, "root ::= r0\n");
    for (int i = 0; i < 3000; i++) { /* defined in an order no pass direction follows */
        int r = (i * 1237) % 3000;
        n += (size_t)sprintf(big + n, "r%d ::= r%d r%d\n", r, r + 1, r + 1);
    }
    sprintf(big + n, "r3000 ::= \"\" | \"c\"\n");
    refused(sd_grammar_from_gbnf, big, "too deeply");
    free(big);
    refused(sd_grammar_from_gbnf, "root ::= \"a", "ends inside");
    refused(sd_grammar_from_gbnf, "root ::= ( \"a\"", "not closed");
    refused(sd_grammar_from_gbnf, "root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    char deep[600] = "root ::= ";
    for (int i = 0; i < 100; i++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int i = 0; i < 100; i++) strcat(deep, ")");
    refused(sd_grammar_from_gbnf, deep, "nested deeper");
}

static sd_grammar *regex(const char *re) {
    sd_grammar *g = NULL;
    char err[256];
    if (sd_grammar_from_regex(re, strlen(re), NULL, &g, err, sizeof err) != SD_OK)
        fail_msg("regex refused: %s (%s)", err, re);
    return g;
}

static void test_regex(void **state) {
    (void)state;
    sd_grammar *g = regex("^(ab|c)*d{2,3}[^x-z\\d]\\.?$");
    assert_true(m(g, "ddq"));
    assert_true(m(g, "abcabdddq."));
    assert_false(m(g, "ddx"));
    assert_false(m(g, "dd5"));
    assert_false(m(g, "ddddd"));
    sd_grammar_free(&g);
    g = regex("\\w+@\\w+\\.(com|org)");
    assert_true(m(g, "a_1@b.org"));
    assert_false(m(g, "a@b.net"));
    sd_grammar_free(&g);
    g = regex("(a+)+$"); /* catastrophic for a backtracker: linear here */
    char s[4100];
    memset(s, 'a', 4096);
    s[4096] = 'b';
    s[4097] = '\0';
    assert_false(sd_grammar_match(g, s, 4097));
    assert_true(sd_grammar_match(g, s, 4096));
    sd_grammar_free(&g);
    g = regex(".{3}"); /* '.' is any character but a newline */
    assert_true(m(g, "a\xc3\xa9z"));
    assert_false(m(g, "a\nz"));
    sd_grammar_free(&g);
    refused(sd_grammar_from_regex, "(a)\\1", "back-references");
    refused(sd_grammar_from_regex, "(?=a)a", "look-around");
    refused(sd_grammar_from_regex, "\\bfoo", "word boundary");
    refused(sd_grammar_from_regex, "a^b", "anchor");
    refused(sd_grammar_from_regex, "*a", "nothing to repeat");
    char many[1200] = "";
    for (int i = 0; i < 110; i++) strcat(many, "a{,1000}");
    refused(sd_grammar_from_regex, many, "more than");
    refused(sd_grammar_from_regex, "a{99999}", "repetition count");
}

static sd_grammar *schema(const char *s) {
    sd_grammar *g = NULL;
    char err[256];
    if (sd_grammar_from_json_schema(s, strlen(s), NULL, &g, err, sizeof err) != SD_OK)
        fail_msg("schema refused: %s (%s)", err, s);
    return g;
}

static void test_schema(void **state) {
    (void)state;
    sd_grammar *g =
        schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
               "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",1,null]},"
               "\"maxItems\":2}},\"required\":[\"name\"],\"additionalProperties\":false}");
    assert_true(m(g, "{\"name\":\"bob\"}"));
    assert_true(m(g, "{\"name\": \"bob\", \"age\": -12, \"tags\": [\"a\", null]}"));
    assert_true(m(g, "{ \"name\":\"\",\"tags\":[]}"));
    assert_false(m(g, "{\"age\":3}"));                         /* name is required */
    assert_false(m(g, "{\"name\":\"bobbie\"}"));               /* maxLength */
    assert_false(m(g, "{\"name\":\"b\",\"tags\":[1,1,1]}"));   /* maxItems */
    assert_false(m(g, "{\"name\":\"b\",\"extra\":1}"));        /* additionalProperties false */
    assert_false(m(g, "{\"name\":\"b\",\"age\":1.5}"));        /* integer */
    assert_false(m(g, "{\"name\":\"b\"}                   ")); /* nothing after the value */
    sd_grammar_free(&g);
    /* $ref recursion, anyOf, const, pattern (a search unless anchored) */
    g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"const\":7},"
               "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
               "\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"},"
               "{\"type\":[\"boolean\",\"null\"]}]}");
    assert_true(m(g, "{\"v\":7,\"kids\":[{\"v\":7},{\"v\":7,\"kids\":[]}]}"));
    assert_true(m(g, "\"AB-12\""));
    assert_true(m(g, "null"));
    assert_true(m(g, "false"));
    assert_false(m(g, "{\"v\":8}"));
    assert_false(m(g, "\"A-12\""));
    sd_grammar_free(&g);
    g = schema("{\"type\":\"string\",\"pattern\":\"ab\"}");
    assert_true(m(g, "\"xxabyy\""));
    assert_false(m(g, "\"xxa\""));
    sd_grammar_free(&g);
    g = schema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}");
    assert_true(m(g, "{\"a\":1,\"b\":2.5e3}"));
    assert_false(m(g, "{\"a\":\"x\"}"));
    sd_grammar_free(&g);
    g = schema("{}");
    assert_true(m(g, "[1,{\"a\":[true]},\"\\u00e9\"]"));
    sd_grammar_free(&g);
    sd_grammar *any = NULL;
    assert_int_equal(sd_grammar_json_any(true, &any), SD_OK);
    assert_true(m(any, "{\"a\": [1, 2]}"));
    assert_false(m(any, "[1]"));
    char spaces[64] = "{";
    memset(spaces + 1, ' ', 40);
    strcpy(spaces + 41, "}");
    assert_false(m(any, spaces)); /* whitespace is bounded */
    sd_grammar_free(&any);
}

static void test_schema_refusals(void **state) {
    (void)state;
    refused(sd_grammar_from_json_schema, "{\"type\":\"number\",\"minimum\":0}", "'minimum'");
    refused(sd_grammar_from_json_schema, "{\"type\":\"string\",\"format\":\"date\"}", "'format'");
    refused(sd_grammar_from_json_schema, "{\"allOf\":[{}]}", "'allOf'");
    refused(sd_grammar_from_json_schema, "{\"$ref\":\"#/$defs/missing\"}", "names no definition");
    refused(sd_grammar_from_json_schema, "{\"$ref\":\"#\"}", "deeper");
    refused(sd_grammar_from_json_schema, "{\"type\":\"array\",\"maxItems\":100000}", "'maxItems'");
    refused(sd_grammar_from_json_schema, "{\"type\":\"strin\"}", "'strin'");
    refused(sd_grammar_from_json_schema, "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "back-references");
    refused(sd_grammar_from_json_schema, "not json", "not valid JSON");
    /* a 100,000-entry enum */
    size_t cap = 100000 * 8 + 64;
    char *big = malloc(cap);
    assert_non_null(big);
    size_t n = (size_t)sprintf(big, "{\"enum\":[");
    for (int i = 0; i < 100000; i++) n += (size_t)sprintf(big + n, "%s%d", i ? "," : "", i);
    strcpy(big + n, "]}");
    refused(sd_grammar_from_json_schema, big, "'enum' has 100000 entries");
    /* nesting 200 deep */
    n = 0;
    for (int i = 0; i < 200; i++) n += (size_t)sprintf(big + n, "{\"type\":\"array\",\"items\":");
    n += (size_t)sprintf(big + n, "{}");
    for (int i = 0; i < 200; i++) big[n++] = '}';
    big[n] = '\0';
    refused(sd_grammar_from_json_schema, big, "deeper");
    free(big);
}

/* ---- masks against brute force, on the demo model's vocabulary ---- */

static sd_tok *demo_tok(void) {
    const char *path = getenv("SPECD_MODEL");
    if (!path || !*path) return NULL;
    sd_gguf *gg = NULL;
    char err[256];
    if (sd_gguf_open(path, &gg, err, sizeof err) != SD_OK) return NULL;
    sd_tok *t = NULL;
    sd_tok_from_gguf(gg, &t);
    sd_gguf_close(&gg);
    return t;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Walks random paths through g's language: at each state the trie-walk mask
 * (cached or not) must equal running every token through the matcher. */
static void masks_vs_brute(const sd_tok *t, const sd_cvocab *v, const sd_grammar *g, int steps, uint64_t seed) {
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(g, v, &c), SD_OK);
    int32_t n = sd_tok_n_vocab(t);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    assert_non_null(allowed);
    for (int s = 0; s < steps; s++) {
        const uint32_t *bits;
        assert_int_equal(sd_constraint_mask(c, &bits), SD_OK);
        int32_t n_allowed = 0;
        for (int32_t id = 0; id < n; id++) {
            bool brute = sd_constraint_allows(c, id);
            bool mask = bits[id >> 5] >> (id & 31) & 1u;
            if (brute != mask) fail_msg("step %d token %d: mask %d, brute force %d", s, id, mask, brute);
            if (brute) allowed[n_allowed++] = id;
        }
        if (!n_allowed) break;
        int32_t pick = allowed[rng_next(&seed) % (uint64_t)n_allowed];
        if (sd_tok_is_eog(t, pick)) break;
        assert_int_equal(sd_constraint_advance(c, pick), SD_OK);
        if (s % 3 == 2) { /* roll one back now and then: the state must come back */
            int32_t len = sd_constraint_len(c);
            assert_int_equal(sd_constraint_rollback(c, len - 1), SD_OK);
            assert_int_equal(sd_constraint_advance(c, pick), SD_OK);
        }
    }
    /* every cached mask again: a hit must give the same */
    sd_constraint_stats st = sd_constraint_get_stats(c);
    assert_true(st.masks >= 1);
    free(allowed);
    sd_constraint_free(&c);
}

static void test_masks_brute_force(void **state) {
    (void)state;
    sd_tok *t = demo_tok();
    if (!t) skip();
    sd_cvocab *v = NULL;
    assert_int_equal(sd_cvocab_create(t, &v), SD_OK);
    sd_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                           "\"kind\":{\"enum\":[\"cat\",\"dog\",\"caterpillar\"]},\"n\":{\"type\":\"integer\"},"
                           "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}}},"
                           "\"required\":[\"name\",\"kind\"]}");
    for (uint64_t seed = 1; seed <= 3; seed++) masks_vs_brute(t, v, g, 12, seed * 0x9E3779B97F4A7C15ull);
    sd_grammar_free(&g);
    g = regex("(\\d{3}-)?[A-Za-z\xc3\xa9]{2,6} ?(x|yz)*");
    masks_vs_brute(t, v, g, 10, 42);
    sd_grammar_free(&g);
    sd_cvocab_free(&v);
    sd_tok_free(&t);
}

/* sd_constraint_apply keeps exactly the logits the mask allows (rows
 * longer and shorter than the vocabulary); sd_constraint_apply_ids (an
 * EAGLE head's mask, drafter_eagle.c): over the whole vocabulary it equals
 * sd_constraint_apply; through an id map each
 * entry is kept exactly when its target id is allowed (ids outside the
 * vocabulary refused); *any says whether a finite logit is left. */
static void test_apply_ids(void **state) {
    (void)state;
    sd_tok *t = demo_tok();
    if (!t) skip();
    sd_cvocab *v = NULL;
    assert_int_equal(sd_cvocab_create(t, &v), SD_OK);
    sd_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"cat\",\"dog\"]},"
                           "\"name\":{\"type\":\"string\",\"maxLength\":8}},\"required\":[\"kind\",\"name\"]}");
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(g, v, &c), SD_OK);
    const int32_t V = sd_tok_n_vocab(t), VD = 4099;
    float *a = malloc((size_t)(V + 7) * sizeof *a), *b = malloc((size_t)(V + 7) * sizeof *b);
    int32_t *ids = malloc((size_t)VD * sizeof *ids);
    assert_true(a && b && ids);
    for (int32_t i = 0; i < VD; i++) ids[i] = i == 5 ? V + 3 : (int32_t)(((int64_t)i * 7919) % V);
    const char *text = "{\"kind\":\"cat\",\"name\":\"ab\"}";
    int32_t *toks = NULL;
    size_t n_toks = 0;
    assert_int_equal(sd_tok_encode(t, text, strlen(text), false, &toks, &n_toks), SD_OK);
    for (size_t step = 0; step <= n_toks; step++) {
        for (int32_t i = 0; i < V + 7; i++) a[i] = b[i] = (float)(i % 13);
        bool any = false;
        assert_int_equal(sd_constraint_apply(c, a, V + 7), SD_OK);
        const uint32_t *bits; /* apply (a word at a time) against the mask bit by bit, padding refused */
        assert_int_equal(sd_constraint_mask(c, &bits), SD_OK);
        for (int32_t i = 0; i < V + 7; i++)
            if (a[i] != (i < V && (bits[i >> 5] >> (i & 31) & 1u) ? (float)(i % 13) : -INFINITY))
                fail_msg("step %d logit %d: %g after apply", (int)step, (int)i, (double)a[i]);
        for (int32_t i = 0; i < V; i++) b[i] = (float)(i % 13); /* a row shorter than the vocabulary */
        assert_int_equal(sd_constraint_apply(c, b, V - 37), SD_OK);
        for (int32_t i = 0; i < V; i++)
            if (b[i] != (i >= V - 37 || (bits[i >> 5] >> (i & 31) & 1u) ? (float)(i % 13) : -INFINITY))
                fail_msg("step %d logit %d of a short row: %g after apply", (int)step, (int)i, (double)b[i]);
        for (int32_t i = 0; i < V + 7; i++) b[i] = (float)(i % 13);
        assert_int_equal(sd_constraint_apply_ids(c, b, V + 7, NULL, &any), SD_OK);
        assert_memory_equal(a, b, (size_t)(V + 7) * sizeof *a);
        bool want = false;
        for (int32_t i = 0; i < V + 7; i++) want = want || a[i] > -INFINITY;
        assert_int_equal(any, want);
        for (int32_t i = 0; i < VD; i++) b[i] = 1.0f;
        assert_int_equal(sd_constraint_apply_ids(c, b, VD, ids, &any), SD_OK);
        want = false;
        for (int32_t i = 0; i < VD; i++) {
            bool ok = ids[i] < V && sd_constraint_allows(c, ids[i]);
            assert_int_equal(b[i] > -INFINITY, ok);
            want = want || ok;
        }
        assert_int_equal(any, want);
        for (int32_t i = 0; i < V; i++) b[i] = -INFINITY; /* allowed entries already -inf: none left */
        assert_int_equal(sd_constraint_apply_ids(c, b, V, NULL, &any), SD_OK);
        assert_false(any);
        if (step < n_toks) assert_int_equal(sd_constraint_advance(c, toks[step]), SD_OK);
    }
    free(toks);
    free(ids);
    free(a);
    free(b);
    sd_constraint_free(&c);
    sd_grammar_free(&g);
    sd_cvocab_free(&v);
    sd_tok_free(&t);
}

/* Forced tokens and bytes; EOS exactly when the grammar accepts. */
static void test_forced(void **state) {
    (void)state;
    sd_tok *t = demo_tok();
    if (!t) skip();
    sd_cvocab *v = NULL;
    assert_int_equal(sd_cvocab_create(t, &v), SD_OK);
    sd_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"answer\":{\"enum\":[\"yes\",\"no\"]}},"
                           "\"required\":[\"answer\"],\"additionalProperties\":false}");
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(g, v, &c), SD_OK);
    char buf[64];
    size_t n = sd_constraint_forced_bytes(c, buf, sizeof buf);
    assert_int_equal(n, 1);
    assert_memory_equal(buf, "{", 1);
    int32_t brace = sd_constraint_forced(c);
    assert_int_equal(brace, -1); /* "{" and "{\"" are both tokens */
    const char *text = "{\"answer\":\"yes\"}";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(sd_tok_encode(t, text, strlen(text), false, &ids, &n_ids), SD_OK);
    for (size_t i = 0; i < n_ids; i++) {
        assert_false(sd_constraint_accepting(c));
        assert_int_equal(sd_constraint_advance(c, ids[i]), SD_OK);
    }
    assert_true(sd_constraint_accepting(c));
    int32_t eos = sd_tok_eos(t);
    assert_true(sd_constraint_allows(c, eos));
    const uint32_t *bits;
    assert_int_equal(sd_constraint_mask(c, &bits), SD_OK);
    for (int32_t id = 0; id < sd_tok_n_vocab(t); id++) /* nothing may follow but an end */
        if (bits[id >> 5] >> (id & 31) & 1u) assert_true(sd_tok_is_eog(t, id));
    assert_true(bits[eos >> 5] >> (eos & 31) & 1u);
    assert_int_equal(sd_constraint_advance(c, eos), SD_OK);
    assert_int_equal(sd_constraint_mask(c, &bits), SD_OK);
    for (int32_t w = 0; w < (sd_tok_n_vocab(t) + 31) / 32; w++) assert_int_equal(bits[w], 0);
    free(ids);
    sd_constraint_free(&c);
    sd_grammar_free(&g);
    sd_cvocab_free(&v);
    sd_tok_free(&t);
}

/* The service's compile path: a kind and a text compile as the matching
 * compiler does; the cache hands back the same grammar for the same
 * (kind, text), pins what it hands out (never evicted while pinned),
 * evicts the least recently used unpinned one at capacity, and does not
 * cache a failure. */
static void test_grammar_cache(void **state) {
    (void)state;
    char err[256];
    sd_grammar *g = NULL;
    assert_int_equal(sd_grammar_compile(SD_CONSTRAINT_NONE, "", 0, NULL, &g, err, sizeof err), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_grammar_compile(SD_CONSTRAINT_JSON_OBJECT, "", 0, NULL, &g, err, sizeof err), SD_OK);
    assert_true(sd_grammar_match(g, "{\"a\": [1, 2]}", 13));
    assert_false(sd_grammar_match(g, "[1]", 3));
    sd_grammar_free(&g);
    const char *sch = "{\"type\": \"object\", \"patternProperties\": {}}";
    assert_int_not_equal(sd_grammar_compile(SD_CONSTRAINT_JSON_SCHEMA, sch, strlen(sch), NULL, &g, err, sizeof err),
                         SD_OK);
    assert_non_null(strstr(err, "patternProperties"));
    assert_string_equal(sd_constraint_kind_name(SD_CONSTRAINT_REGEX), "regex");

    sd_grammar_cache *c = NULL;
    assert_int_equal(sd_grammar_cache_create(2, NULL, &c), SD_OK);
    const sd_grammar *a = NULL, *a2 = NULL, *b = NULL, *d = NULL, *e = NULL;
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_REGEX, "a+", 2, &a, err, sizeof err), SD_OK);
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_REGEX, "a+", 2, &a2, err, sizeof err), SD_OK);
    assert_ptr_equal(a, a2);
    assert_true(sd_grammar_match(a, "aaa", 3));
    /* the same text under another kind is another grammar */
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_GRAMMAR, "root ::= \"b\"", 12, &b, err, sizeof err),
                     SD_OK);
    assert_ptr_not_equal(a, b);
    sd_grammar_cache_stats st = sd_grammar_cache_get_stats(c);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 2);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.pinned, 2);
    /* both pinned: a third goes past capacity rather than evict */
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_REGEX, "c", 1, &d, err, sizeof err), SD_OK);
    assert_int_equal(sd_grammar_cache_get_stats(c).entries, 3);
    assert_true(sd_grammar_match(a, "a", 1) && sd_grammar_match(b, "b", 1) && sd_grammar_match(d, "c", 1));
    /* a failure is reported, not cached */
    assert_int_not_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_REGEX, "(a)\\1", 5, &e, err, sizeof err), SD_OK);
    assert_true(err[0] != '\0');
    assert_int_equal(sd_grammar_cache_get_stats(c).entries, 3);
    /* unpinned: the least recently used goes first (b, then d) */
    sd_grammar_cache_put(c, a);
    sd_grammar_cache_put(c, a2);
    sd_grammar_cache_put(c, b);
    sd_grammar_cache_put(c, d);
    assert_int_equal(sd_grammar_cache_get_stats(c).pinned, 0);
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_REGEX, "a+", 2, &a, err, sizeof err), SD_OK); /* hit */
    sd_grammar_cache_put(c, a);
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_REGEX, "e", 1, &e, err, sizeof err), SD_OK);
    st = sd_grammar_cache_get_stats(c);
    assert_int_equal(st.entries, 3); /* b's entry was reused */
    assert_int_equal(st.hits, 2);
    const sd_grammar *b2 = NULL;
    assert_int_equal(sd_grammar_cache_get(c, SD_CONSTRAINT_GRAMMAR, "root ::= \"b\"", 12, &b2, err, sizeof err),
                     SD_OK);
    assert_int_equal(sd_grammar_cache_get_stats(c).misses, 6); /* b was evicted: compiled again (misses: a b d, the failure, e, b) */
    sd_grammar_cache_put(c, b2);
    sd_grammar_cache_put(c, e);
    sd_grammar_cache_free(&c);
    assert_null(c);
}

int main(void) {
    sd_log_set(NULL, NULL, getenv("SPECD_TEST_LOG") ? SD_LOG_DEBUG : SD_LOG_OFF, "test_constrain");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_basics),     cmocka_unit_test(test_gbnf_refusals),
        cmocka_unit_test(test_regex),           cmocka_unit_test(test_schema),
        cmocka_unit_test(test_schema_refusals), cmocka_unit_test(test_masks_brute_force),
        cmocka_unit_test(test_forced),          cmocka_unit_test(test_grammar_cache),
        cmocka_unit_test(test_apply_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
