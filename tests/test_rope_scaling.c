/* test_rope_scaling.c — the one RoPE scaling reader (formats/model_config.c,
 * sd_model_config_rope_scaling) through a fake source, so each rule is seen
 * once whatever the file format; test_model and test_weights_hf read real
 * GGUF and config.json files through it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "specd/model_config.h"

typedef struct fake {
    const char *type; /* NULL: no scaling */
    double num[4];    /* by sd_rope_key; 0 = absent */
} fake;

static sd_status fake_type(const void *src, char *out, size_t n) {
    const fake *f = src;
    if (!f->type) return SD_ERR_NOT_FOUND;
    snprintf(out, n, "%s", f->type);
    return SD_OK;
}

static sd_status fake_number(const void *src, sd_rope_key key, double *out) {
    const fake *f = src;
    if (f->num[key] == 0) return SD_ERR_NOT_FOUND;
    *out = f->num[key];
    return SD_OK;
}

static sd_status read_scaling(const fake *f, sd_model_config *c) {
    sd_rope_source s = {.where = "test", .type_none = "none", .type = fake_type, .number = fake_number, .src = f};
    memset(c, 0x5a, sizeof *c);
    return sd_model_config_rope_scaling(&s, c);
}

static void test_rope_scaling(void **state) {
    (void)state;
    sd_model_config c;
    fake none = {NULL, {0}}, named_none = {"none", {2, 0, 0, 0}};
    assert_int_equal(read_scaling(&none, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 0);
    assert_true(c.rope_scale_factor == 1.0f);
    assert_int_equal(read_scaling(&named_none, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 0);

    fake linear = {"linear", {4, 0, 0, 0}};
    assert_int_equal(read_scaling(&linear, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 1);
    assert_true(c.rope_scale_factor == 4.0f);

    /* llama3: given values, and llama3's defaults for the absent ones */
    fake l3 = {"llama3", {8, 2, 6, 65536}}, l3_defaults = {"llama3", {8, 0, 0, 0}};
    assert_int_equal(read_scaling(&l3, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 2);
    assert_true(c.rope_scale_factor == 8.0f && c.rope_low_freq_factor == 2.0f && c.rope_high_freq_factor == 6.0f);
    assert_int_equal(c.rope_orig_ctx, 65536);
    assert_int_equal(read_scaling(&l3_defaults, &c), SD_OK);
    assert_true(c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_orig_ctx, 8192);

    fake yarn = {"yarn", {4, 0, 0, 0}}, no_factor = {"linear", {0}}, inverted = {"llama3", {8, 4, 2, 0}};
    assert_int_equal(read_scaling(&yarn, &c), SD_ERR_UNSUPPORTED);
    assert_int_equal(read_scaling(&no_factor, &c), SD_ERR_FORMAT);
    assert_int_equal(read_scaling(&inverted, &c), SD_ERR_FORMAT);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rope_scaling)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
