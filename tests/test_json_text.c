/* test_json_text.c — sd_json_quote and sd_json_has_nul (engine/base):
 * model text into JSON that is valid whatever the bytes, and JSON input
 * that would be cut at a NUL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "specd/common.h"

static void expect_quote(const char *in, size_t len, const char *want) {
    char *q = sd_json_quote(in, len);
    assert_non_null(q);
    assert_string_equal(q, want);
    assert_int_equal(sd_utf8_valid_len(q, strlen(q)), strlen(q));
    free(q);
}

static void test_quote(void **state) {
    (void)state;
    expect_quote("", 0, "\"\"");
    expect_quote("caf\xc3\xa9 \xf0\x9f\x98\x80", 10, "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
    expect_quote("a\"b\\c\n\t\x01", 8, "\"a\\\"b\\\\c\\n\\t\\u0001\"");
    expect_quote("a\0b", 3, "\"a\\u0000b\""); /* kept, not cut */
    /* one U+FFFD per maximal subpart, as Python's errors="replace" */
    expect_quote("\x80\x80", 2, "\"\xef\xbf\xbd\xef\xbf\xbd\"");
    expect_quote("x\xe2\x82", 3, "\"x\xef\xbf\xbd\"");
    expect_quote("\xe0\x80z", 3, "\"\xef\xbf\xbd\xef\xbf\xbdz\"");
    expect_quote("\xed\xa0\x80", 3, "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""); /* a surrogate */
    expect_quote("\xf4\x90\x80\x80", 4, "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");
    expect_quote("\xff"
                 "ok",
                 3, "\"\xef\xbf\xbdok\"");
    /* every byte string gives valid UTF-8 */
    unsigned char all[512];
    for (int i = 0; i < 512; i++) all[i] = (unsigned char)(i * 7 + (i >> 3));
    char *q = sd_json_quote(all, sizeof all);
    assert_non_null(q);
    assert_int_equal(sd_utf8_valid_len(q, strlen(q)), strlen(q));
    free(q);
}

static void test_has_nul(void **state) {
    (void)state;
    const char *ok = "{\"prompt\": \"a\\\\u0000b \\u0001\"}";
    assert_false(sd_json_has_nul(ok, strlen(ok)));
    const char *esc = "{\"prompt\": \"a\\u0000b\"}";
    assert_true(sd_json_has_nul(esc, strlen(esc)));
    const char *raw = "{\"p\": \"a\0b\"}";
    assert_true(sd_json_has_nul(raw, 12));
    const char *tail = "\\u000";
    assert_false(sd_json_has_nul(tail, strlen(tail)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote),
        cmocka_unit_test(test_has_nul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
