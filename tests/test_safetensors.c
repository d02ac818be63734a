/* test_safetensors.c — the safetensors reader and writer.
 *
 * Every validation rule of engine/safetensors.c gets at least one file that
 * breaks it and nothing else: each is built in memory from a header string
 * and a data length, copied into a buffer of exactly the file's size (so
 * AddressSanitizer sees any read past the end) and must fail with
 * SD_ERR_FORMAT and a message that starts with that rule's name. A table
 * test checks that the cases together name every rule, each its own. The
 * valid base file is checked to open (with the right views) first, so a
 * reader that rejected everything would fail; truncation is tried at every
 * byte; the writer's files read back identically. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_testbuf.h"
#include "specd/safetensors.h"

/* a: F32 [2, 3] at [0, 24); b: BF16 [4] at [24, 32). */
#define BASE_HEADER                                                                                            \
    "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," \
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}"

/* A file: length prefix (strlen(header) unless declared_len >= 0), header, data_len bytes. */
static tbuf make_file(const char *header, uint64_t data_len, int64_t declared_len) {
    tbuf b = {0};
    tb_u64(&b, declared_len >= 0 ? (uint64_t)declared_len : strlen(header));
    tb_put(&b, header, strlen(header));
    for (uint64_t i = 0; i < data_len; i++) tb_u8(&b, (uint8_t)(i * 13 + 1));
    return b;
}

/* Opens an exact-size private copy; err gets the message. */
static sd_status open_copy(const uint8_t *bytes, size_t size, char *err, size_t err_len) {
    uint8_t *copy = malloc(size ? size : 1);
    assert_non_null(copy);
    if (size) memcpy(copy, bytes, size);
    sd_safetensors *st = NULL;
    sd_status s = sd_safetensors_open_memory(copy, size, &st, err, err_len);
    if (s == SD_OK) {
        for (int64_t i = 0; i < sd_safetensors_n_tensors(st); i++) { /* touch every byte a caller could */
            const sd_safetensors_tensor *t = sd_safetensors_tensor_at(st, i);
            volatile uint8_t sink = 0;
            for (uint64_t j = 0; j < t->n_bytes; j++) sink ^= ((const uint8_t *)t->data)[j];
            (void)sink;
            assert_ptr_equal(sd_safetensors_find(st, t->name), t);
        }
        sd_safetensors_close(&st);
    } else {
        assert_null(st);
    }
    free(copy);
    return s;
}

static void expect_rule(const char *header, uint64_t data_len, int64_t declared_len, const char *rule) {
    tbuf b = make_file(header, data_len, declared_len);
    char err[512] = "";
    sd_status s = open_copy(b.p, b.n, err, sizeof err);
    free(b.p);
    if (s != SD_ERR_FORMAT) fail_msg("expected a format error (%s), got %s: %s", rule, sd_status_str(s), err);
    size_t n = strlen(rule);
    if (strncmp(err, rule, n) != 0 || err[n] != ':') fail_msg("message '%s' does not start with '%s:'", err, rule);
}

static void test_base_is_valid(void **state) {
    (void)state;
    tbuf b = make_file(BASE_HEADER, 32, -1);
    char err[256];
    assert_int_equal(open_copy(b.p, b.n, err, sizeof err), SD_OK);
    sd_safetensors *st = NULL;
    assert_int_equal(sd_safetensors_open_memory(b.p, b.n, &st, err, sizeof err), SD_OK);
    assert_int_equal(sd_safetensors_n_tensors(st), 2);
    const sd_safetensors_tensor *a = sd_safetensors_find(st, "a"), *bt = sd_safetensors_find(st, "b");
    assert_non_null(a);
    assert_non_null(bt);
    assert_null(sd_safetensors_find(st, "c"));
    assert_null(sd_safetensors_find(st, "__metadata__"));
    assert_int_equal(a->dtype, SD_SAFETENSORS_F32);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->n_elems, 6);
    assert_int_equal(a->n_bytes, 24);
    assert_ptr_equal(a->data, b.p + 8 + strlen(BASE_HEADER));
    assert_int_equal(bt->dtype, SD_SAFETENSORS_BF16);
    assert_ptr_equal(bt->data, b.p + 8 + strlen(BASE_HEADER) + 24);
    assert_ptr_equal(sd_safetensors_tensor_at(st, 0), a); /* data order */
    assert_int_equal(sd_safetensors_n_metadata(st), 1);
    assert_string_equal(sd_safetensors_metadata(st, "format"), "pt");
    const char *k, *v;
    assert_true(sd_safetensors_metadata_at(st, 0, &k, &v));
    assert_string_equal(k, "format");
    assert_false(sd_safetensors_metadata_at(st, 1, &k, &v));
    sd_dtype dt;
    assert_true(sd_safetensors_dtype_to_sd(SD_SAFETENSORS_BF16, &dt));
    assert_int_equal(dt, SD_DTYPE_BF16);
    assert_false(sd_safetensors_dtype_to_sd(SD_SAFETENSORS_I8, &dt));
    sd_safetensors_close(&st);
    assert_null(st);
    sd_safetensors_close(&st); /* NULL-safe */
    free(b.p);
}

/* Valid corner cases the reference accepts too. */
static void test_valid_corners(void **state) {
    (void)state;
    char err[256];
    static const struct {
        const char *header;
        uint64_t data_len;
    } ok[] = {
        {"{}", 0},
        {"{}      ", 0},  /* trailing spaces: the reference pads the header to 8 bytes */
        {" \t\r\n{}", 0}, /* leading JSON whitespace: the reference reads it too */
        {"{\"__metadata__\":null}", 0},
        {"{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8}, /* scalar */
        {"{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
         "\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
         0},                                                                                     /* empty tensors */
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,2],\"dtype\":\"I8\",\"extra\":[1,{}]}}", 2}, /* unknown field */
        {"{\"f\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]}}", 2},                  /* sub-byte, whole */
        {"{\"\\u00e9t\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1},    /* escaped name */
        {"{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
         2}, /* any key order */
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tbuf b = make_file(ok[i].header, ok[i].data_len, -1);
        sd_status s = open_copy(b.p, b.n, err, sizeof err);
        if (s != SD_OK) fail_msg("case %zu (%s) rejected: %s", i, ok[i].header, err);
        free(b.p);
    }
    tbuf b = make_file("{\"\\u00e9t\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1);
    sd_safetensors *st = NULL;
    assert_int_equal(sd_safetensors_open_memory(b.p, b.n, &st, err, sizeof err), SD_OK);
    assert_non_null(sd_safetensors_find(st, "\xc3\xa9t\xc3\xa9"));
    sd_safetensors_close(&st);
    free(b.p);
}

/* One file per rule; each must name its rule. */
typedef struct rule_case {
    const char *rule;
    const char *header;
    uint64_t data_len;
    int64_t declared_len; /* -1: strlen(header) */
} rule_case;

#define T(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static const rule_case CASES[] = {
    {"HeaderTooSmall", "", 0, -2}, /* special: a 7-byte file (see test_rules) */
    {"HeaderTooLarge", "{}", 0, 100000001},
    {"InvalidHeaderLength", "{}", 0, 3},
    {"InvalidHeaderUtf8", "{" T("a\xff", "U8", "[1]", 0, 1) "}", 1, -1},
    {"InvalidHeaderUtf8", "{" T("a\xed\xa0\x80", "U8", "[1]", 0, 1) "}", 1, -1}, /* a UTF-16 surrogate */
    {"InvalidHeaderUtf8", "{" T("a\xc0\xaf", "U8", "[1]", 0, 1) "}", 1, -1},     /* overlong '/' */
    {"InvalidHeaderJson", "[]", 0, -1},
    {"InvalidHeaderJson", "", 0, -1},
    {"InvalidHeaderJson", "\"{}\"", 0, -1},
    {"InvalidHeaderJson", "{\"a\":", 0, -1},
    {"InvalidHeaderJson", "{}x", 0, -1},
    {"InvalidHeaderJson", "{}\x01", 0, -1},
    {"InvalidHeaderJson", "{\"a\x01\":{}}", 0, -1},
    {"InvalidHeaderJson", "{} {}", 0, -1},
    {"InvalidMetadata", "{\"__metadata__\":{\"k\":1}}", 0, -1},
    {"InvalidMetadata", "{\"__metadata__\":[\"k\"]}", 0, -1},
    {"InvalidTensorInfo", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1},
    {"InvalidTensorInfo", "{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, -1},
    {"InvalidTensorInfo", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, -1},
    {"InvalidTensorInfo", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, -1},
    {"InvalidTensorInfo", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, -1},
    {"InvalidTensorInfo", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, -1},
    {"InvalidTensorInfo", "{\"a\":[1]}", 0, -1},
    {"InvalidTensorInfo", "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1},
    {"UnknownDtype", "{" T("a", "F31", "[1]", 0, 4) "}", 4, -1},
    {"UnknownDtype", "{" T("a", "f32", "[1]", 0, 4) "}", 4, -1},
    {"DuplicateName", "{" T("a", "U8", "[1]", 0, 1) "," T("a", "U8", "[1]", 1, 2) "}", 2, -1},
    {"DuplicateName", "{" T("a", "U8", "[1]", 0, 1) "," T("a", "U8", "[1]", 0, 1) "}", 1, -1},
    {"DuplicateName", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, -1},
    {"DuplicateName", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, -1},
    {"InvalidOffset", "{" T("a", "U8", "[1]", 0, 1) "," T("b", "U8", "[0]", 2, 1) "}", 2, -1}, /* end < begin */
    {"InvalidOffset", "{" T("a", "U8", "[1]", 1, 2) "}", 2, -1},                               /* hole at 0 */
    {"InvalidOffset", "{" T("a", "U8", "[1]", 0, 1) "," T("b", "U8", "[1]", 2, 3) "}", 3, -1}, /* hole */
    {"InvalidOffset", "{" T("a", "U8", "[2]", 0, 2) "," T("b", "U8", "[2]", 1, 3) "}", 3, -1}, /* overlap */
    {"ValidationOverflow", "{" T("a", "U8", "[4294967296,4294967296]", 0, 1) "}", 1, -1},
    {"ValidationOverflow", "{" T("a", "F64", "[9007199254740992,256]", 0, 1) "}", 1, -1}, /* 2^61 x 64 bits */
    {"MisalignedSlice", "{" T("a", "F4", "[3]", 0, 2) "}", 2, -1},
    {"MisalignedSlice", "{" T("a", "F6_E2M3", "[2]", 0, 2) "}", 2, -1},
    {"TensorInvalidInfo", "{" T("a", "F32", "[2,3]", 0, 20) "}", 20, -1},
    {"TensorInvalidInfo", "{" T("a", "BF16", "[4]", 0, 16) "}", 16, -1},
    {"MetadataIncompleteBuffer", "{" T("a", "U8", "[4]", 0, 4) "}", 5, -1}, /* a trailing byte */
    {"MetadataIncompleteBuffer", "{" T("a", "U8", "[4]", 0, 4) "}", 3, -1}, /* truncated data */
    {"MetadataIncompleteBuffer", "{}", 1, -1},
};

static const char *const RULES[] = {
    "HeaderTooSmall",    "HeaderTooLarge",     "InvalidHeaderLength", "InvalidHeaderUtf8", "HeaderTooComplex",
    "InvalidHeaderJson", "InvalidMetadata",    "InvalidTensorInfo",   "UnknownDtype",      "DuplicateName",
    "InvalidOffset",     "ValidationOverflow", "MisalignedSlice",     "TensorInvalidInfo", "MetadataIncompleteBuffer",
};

static void test_rules(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const rule_case *c = &CASES[i];
        if (c->declared_len == -2) { /* a 7-byte file */
            char err[256];
            static const uint8_t seven[7] = {2, 0, 0, 0, 0, 0, 0};
            assert_int_equal(open_copy(seven, 7, err, sizeof err), SD_ERR_FORMAT);
            assert_memory_equal(err, "HeaderTooSmall:", 15);
            assert_int_equal(open_copy(NULL, 0, err, sizeof err), SD_ERR_FORMAT);
            assert_memory_equal(err, "HeaderTooSmall:", 15);
            continue;
        }
        expect_rule(c->header, c->data_len, c->declared_len, c->rule);
    }
}

/* Every rule has a case (HeaderTooComplex: test_too_complex), and every
 * case names a rule from the list: the rules are distinct errors. */
static void test_rules_are_covered(void **state) {
    (void)state;
    size_t n_rules = sizeof RULES / sizeof RULES[0];
    for (size_t r = 0; r < n_rules; r++) {
        bool seen = strcmp(RULES[r], "HeaderTooComplex") == 0;
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) seen |= strcmp(CASES[i].rule, RULES[r]) == 0;
        if (!seen) fail_msg("rule %s has no corrupt file", RULES[r]);
        for (size_t k = r + 1; k < n_rules; k++) assert_string_not_equal(RULES[r], RULES[k]);
    }
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        bool known = false;
        for (size_t r = 0; r < n_rules; r++) known |= strcmp(CASES[i].rule, RULES[r]) == 0;
        assert_true(known);
    }
}

/* A header of tens of millions of tiny values is refused before cJSON
 * builds a tree of gigabytes for it. */
static void test_too_complex(void **state) {
    (void)state;
    size_t n = 17u * 1024u * 1024u;
    char *h = malloc(2 * n + 16);
    assert_non_null(h);
    size_t at = (size_t)sprintf(h, "{\"x\":[");
    for (size_t i = 0; i < n; i++) {
        h[at++] = '0';
        h[at++] = ',';
    }
    h[at - 1] = ']';
    h[at++] = '}';
    h[at] = '\0';
    expect_rule(h, 0, -1, "HeaderTooComplex");
    free(h);
}

/* Every prefix of the base file is refused, whatever the rule. */
static void test_truncated_everywhere(void **state) {
    (void)state;
    tbuf b = make_file(BASE_HEADER, 32, -1);
    char err[256];
    for (size_t n = 0; n < b.n; n++) {
        sd_status s = open_copy(b.p, n, err, sizeof err);
        if (s != SD_ERR_FORMAT) fail_msg("prefix of %zu bytes: %s", n, sd_status_str(s));
        assert_true(err[0] != '\0');
    }
    free(b.p);
}

static void test_writer_round_trip(void **state) {
    (void)state;
    char path[] = "/tmp/specd-test-st-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    assert_non_null(w);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc000};
    uint64_t sa[2] = {2, 3}, sb[1] = {3};
    assert_int_equal(sd_safetensors_writer_set_metadata(w, "format", "pt"), SD_OK);
    assert_int_equal(sd_safetensors_writer_set_metadata(w, "note", "quote \" and\ttab"), SD_OK);
    assert_int_equal(sd_safetensors_writer_set_metadata(w, "format", "np"), SD_OK); /* replaced */
    assert_int_equal(sd_safetensors_writer_add_tensor(w, "model.a", SD_SAFETENSORS_F32, 2, sa, a), SD_OK);
    assert_int_equal(sd_safetensors_writer_add_tensor(w, "b\"\\", SD_SAFETENSORS_BF16, 1, sb, b), SD_OK);
    assert_int_equal(sd_safetensors_writer_add_tensor(w, "model.a", SD_SAFETENSORS_F32, 2, sa, a), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_safetensors_writer_add_tensor(w, "__metadata__", SD_SAFETENSORS_F32, 2, sa, a),
                     SD_ERR_INVALID_ARG);
    assert_int_equal(sd_safetensors_writer_add_tensor(w, "f4", SD_SAFETENSORS_F4, 1, sb, b),
                     SD_ERR_INVALID_ARG); /* 12 bits */
    assert_int_equal(sd_safetensors_writer_data_bytes(w), 30);
    assert_int_equal(sd_safetensors_writer_write(w, path), SD_OK);
    sd_safetensors_writer_free(&w);
    assert_null(w);

    sd_safetensors *st = NULL;
    char err[256];
    assert_int_equal(sd_safetensors_open(path, &st, err, sizeof err), SD_OK);
    assert_int_equal(sd_safetensors_n_tensors(st), 2);
    const sd_safetensors_tensor *ta = sd_safetensors_find(st, "model.a"), *tb = sd_safetensors_find(st, "b\"\\");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_memory_equal(ta->data, a, sizeof a);
    assert_memory_equal(tb->data, b, sizeof b);
    assert_string_equal(sd_safetensors_metadata(st, "format"), "np");
    assert_string_equal(sd_safetensors_metadata(st, "note"), "quote \" and\ttab");
    /* the header is padded to 8 bytes, as the reference writes it */
    FILE *f = fopen(path, "rb");
    uint64_t hlen = 0;
    assert_int_equal(fread(&hlen, 8, 1, f), 1);
    fclose(f);
    assert_int_equal(hlen % 8, 0);
    sd_safetensors_close(&st);
    unlink(path);
}

static void test_open_errors(void **state) {
    (void)state;
    sd_safetensors *st = NULL;
    char err[256];
    assert_int_equal(sd_safetensors_open("/nonexistent/model.safetensors", &st, err, sizeof err), SD_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/model.safetensors"));
    assert_int_equal(sd_safetensors_open("/tmp", &st, err, sizeof err), SD_ERR_IO);
    assert_int_equal(sd_safetensors_open(NULL, &st, err, sizeof err), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_safetensors_open_memory(NULL, 5, &st, err, sizeof err), SD_ERR_INVALID_ARG);
    assert_null(st);
    assert_string_equal(sd_safetensors_dtype_name(SD_SAFETENSORS_F8_E4M3), "F8_E4M3");
    assert_string_equal(sd_safetensors_dtype_name((sd_safetensors_dtype)99), "?");
}

int main(void) {
    /* SPECD_TEST_LOG=1 shows each rejection's message */
    sd_log_set(NULL, NULL, getenv("SPECD_TEST_LOG") ? SD_LOG_ERROR : SD_LOG_OFF, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_is_valid),
        cmocka_unit_test(test_valid_corners),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_rules_are_covered),
        cmocka_unit_test(test_too_complex),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
