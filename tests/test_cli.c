/* test_cli.c — the one command-line number parser (engine/base/cli.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>

#include "specd/cli.h"

static void test_integers(void **state) {
    (void)state;
    int v = -7;
    int32_t v32 = -7;
    long vl = -7;
    assert_true(sd_cli_parse_int("42", 0, 100, &v));
    assert_int_equal(v, 42);
    assert_true(sd_cli_parse_int("-3", -5, 5, &v));
    assert_int_equal(v, -3);
    assert_true(sd_cli_parse_i32("0", 0, 0, &v32));
    assert_int_equal(v32, 0);
    /* out of range, trailing text, empty, not a number, overflow: refused, *out untouched */
    v = 99;
    const char *bad[] = {"101", "-1", "12x", "", " ", "x", "1.5", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_false(sd_cli_parse_int(bad[i], 0, 100, &v));
        assert_int_equal(v, 99);
    }
    assert_false(sd_cli_parse_int(NULL, 0, 100, &v));
    assert_true(sd_cli_parse_long("4294967295", 0, 4294967295L, &vl));
    assert_true(vl == 4294967295L);
    assert_false(sd_cli_parse_i32("2147483648", INT32_MIN, INT32_MAX, &v32));
}

static void test_reals(void **state) {
    (void)state;
    double d = 0;
    float f = 0;
    assert_true(sd_cli_parse_double("0.25", 0, 1, &d));
    assert_true(d == 0.25);
    assert_false(sd_cli_parse_double("1.5", 0, 1, &d));
    assert_false(sd_cli_parse_double("nan", -1e9, 1e9, &d));
    assert_false(sd_cli_parse_double("0.5s", 0, 1, &d));
    assert_true(sd_cli_parse_float("0.7", &f));
    assert_true(f == 0.7f);
    assert_false(sd_cli_parse_float("", &f));
    assert_false(sd_cli_parse_float("1e99", &f)); /* overflows a float */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integers),
        cmocka_unit_test(test_reals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
