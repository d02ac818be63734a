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
    const char *type;        /* NULL: no scaling */
    double num[5];           /* by sd_rope_key; 0 = absent */
    int32_t n_long, n_short; /* LongRoPE factors the source has (value 1 + i / 8); 0 = absent */
    bool llama;              /* the model's architecture llama, else phi3 */
} fake;

static sd_status fake_factors(const void *src, bool long_set, int32_t n, float *out) {
    const fake *f = src;
    int32_t have = long_set ? f->n_long : f->n_short;
    if (!have) return SD_ERR_NOT_FOUND;
    if (have != n) return SD_ERR_FORMAT; /* a real source logs which key or tensor */
    for (int32_t i = 0; i < n; i++) out[i] = (long_set ? 2.0f : 1.0f) + (float)i / 8.0f;
    return SD_OK;
}

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
    sd_rope_source s = {.where = "test",
                        .type_none = "none",
                        .type = fake_type,
                        .number = fake_number,
                        .factors = fake_factors,
                        .src = f};
    memset(c, 0x5a, sizeof *c);
    c->arch_id = f->llama ? SD_ARCH_LLAMA : SD_ARCH_PHI3;
    snprintf(c->arch, sizeof c->arch, "%s", f->llama ? "llama" : "phi3");
    c->head_dim = 16;
    c->n_ctx_train = 131072;
    return sd_model_config_rope_scaling(&s, c);
}

static void test_rope_scaling(void **state) {
    (void)state;
    sd_model_config c;
    fake none = {NULL, {0}, 0, 0, false}, named_none = {"none", {2, 0, 0, 0}, 0, 0, false};
    assert_int_equal(read_scaling(&none, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 0);
    assert_true(c.rope_scale_factor == 1.0f);
    assert_int_equal(read_scaling(&named_none, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 0);

    fake linear = {"linear", {4, 0, 0, 0}, 0, 0, false};
    assert_int_equal(read_scaling(&linear, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 1);
    assert_true(c.rope_scale_factor == 4.0f);

    /* llama3: given values, and llama3's defaults for the absent ones */
    fake l3 = {"llama3", {8, 2, 6, 65536}, 0, 0, false}, l3_defaults = {"llama3", {8, 0, 0, 0}, 0, 0, false};
    assert_int_equal(read_scaling(&l3, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 2);
    assert_true(c.rope_scale_factor == 8.0f && c.rope_low_freq_factor == 2.0f && c.rope_high_freq_factor == 6.0f);
    assert_int_equal(c.rope_orig_ctx, 65536);
    assert_int_equal(read_scaling(&l3_defaults, &c), SD_OK);
    assert_true(c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_orig_ctx, 8192);

    fake yarn = {"yarn", {4, 0, 0, 0}, 0, 0, false}, no_factor = {"linear", {0}, 0, 0, false},
         inverted = {"llama3", {8, 4, 2, 0}, 0, 0, false};
    assert_int_equal(read_scaling(&yarn, &c), SD_ERR_UNSUPPORTED);
    assert_int_equal(read_scaling(&no_factor, &c), SD_ERR_FORMAT);
    assert_int_equal(read_scaling(&inverted, &c), SD_ERR_FORMAT);
}

/* LongRoPE: both factor sets, the original context (default: the model's),
 * the attention factor (default 1: a source answers for its own default),
 * and the choice between the sets by the context served */
static void test_longrope(void **state) {
    (void)state;
    sd_model_config c;
    fake lr = {"longrope", {0, 0, 0, 4096, 1.19}, 8, 8, false};
    assert_int_equal(read_scaling(&lr, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, SD_ROPE_LONGROPE);
    assert_int_equal(c.rope_orig_ctx, 4096);
    assert_true(c.rope_attn_factor == 1.19f);
    assert_true(c.rope_factors_long[3] == 2.375f && c.rope_factors_short[7] == 1.875f);
    assert_ptr_equal(sd_model_rope_factors(&c, 0), c.rope_factors_long); /* 131072 > 4096 */
    assert_ptr_equal(sd_model_rope_factors(&c, 4097), c.rope_factors_long);
    assert_ptr_equal(sd_model_rope_factors(&c, 4096), c.rope_factors_short);
    assert_ptr_equal(sd_model_rope_factors(&c, 16), c.rope_factors_short);
    fake su = {"su", {0}, 8, 8, false};
    assert_int_equal(read_scaling(&su, &c), SD_OK);
    assert_int_equal(c.rope_orig_ctx, 131072); /* absent: the model's context, so the short set serves it */
    assert_true(c.rope_attn_factor == 1.0f);
    assert_ptr_equal(sd_model_rope_factors(&c, 0), c.rope_factors_short);
    fake no_short = {"longrope", {0}, 8, 0, false}, no_long = {"longrope", {0}, 0, 8, false};
    fake wrong_len = {"longrope", {0}, 8, 7, false}, on_llama = {"longrope", {0}, 8, 8, true};
    assert_int_equal(read_scaling(&no_short, &c), SD_ERR_FORMAT);
    assert_int_equal(read_scaling(&no_long, &c), SD_ERR_FORMAT);
    assert_int_equal(read_scaling(&wrong_len, &c), SD_ERR_FORMAT);
    assert_int_equal(read_scaling(&on_llama, &c), SD_ERR_UNSUPPORTED);
    /* no LongRoPE: no factors */
    fake none = {NULL, {0}, 0, 0, false};
    assert_int_equal(read_scaling(&none, &c), SD_OK);
    assert_null(sd_model_rope_factors(&c, 0));
    assert_true(c.rope_attn_factor == 1.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rope_scaling), cmocka_unit_test(test_longrope)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
