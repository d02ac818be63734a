/* test_kv_side.c — the KV cache's side rows (engine/kv_side.c): per-row
 * floats that live exactly as the row's K/V (the EAGLE head in the
 * verifier keeps each position's fused features there, verify_head.c).
 *
 * Each row is written with a function of its token prefix and position
 * (like a fused feature), then: an adopter of cached blocks reads the very
 * rows (the same storage); a partial block copied at adoption carries its
 * rows' side values; an evicted block reused by another sequence holds
 * that sequence's values once written, and adopting the old prompt no
 * longer finds it; the accessor's bounds and contiguity; enabling twice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "specd/kv.h"

enum { BS = 4, W = 3 };

/* What a feature is: a function of the tokens up to and including pos. */
static float value_of(const int32_t *tok, int32_t pos, int32_t i) {
    uint32_t h = 2166136261u;
    for (int32_t t = 0; t <= pos; t++) h = (h ^ (uint32_t)tok[t]) * 16777619u;
    h = (h ^ (uint32_t)i) * 16777619u;
    return (float)(h % 100000u) / 7.0f + (float)pos;
}

static sd_kv *make_kv(int32_t n_blocks, int32_t max_seqs, int32_t max_idle) {
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.block_size = BS;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    assert_int_equal(sd_kv_prefix_enable(kv, max_idle), SD_OK);
    assert_int_equal(sd_kv_side_enable(kv, W), SD_OK);
    return kv;
}

/* Writes seq's side rows [from, to) through the accessor, block by block. */
static void write_rows(sd_kv *kv, int32_t seq, const int32_t *tok, int32_t from, int32_t to) {
    for (int32_t p = from, m; p < to; p += m) {
        float *row = sd_kv_side(kv, seq, p, &m);
        assert_non_null(row);
        assert_true(m >= 1);
        if (m > to - p) m = to - p;
        for (int32_t r = 0; r < m; r++)
            for (int32_t i = 0; i < W; i++) row[(size_t)r * W + (size_t)i] = value_of(tok, p + r, i);
    }
}

/* Computes seq's rows [len, n): grow, write, commit (a verifier's step). */
static void compute(sd_kv *kv, int32_t seq, const int32_t *tok, int32_t n) {
    int32_t from = sd_kv_seq_len(kv, seq);
    assert_int_equal(sd_kv_grow(kv, seq, n), SD_OK);
    write_rows(kv, seq, tok, from, n);
    assert_int_equal(sd_kv_prefix_commit(kv, seq, tok, n), SD_OK);
    assert_int_equal(sd_kv_check(kv), SD_OK);
}

static void expect_rows(sd_kv *kv, int32_t seq, const int32_t *tok, int32_t from, int32_t to) {
    for (int32_t p = from; p < to; p++) {
        const float *row = sd_kv_side(kv, seq, p, NULL);
        assert_non_null(row);
        for (int32_t i = 0; i < W; i++) assert_true(row[i] == value_of(tok, p, i));
    }
}

static void test_adopt_shares_rows(void **state) {
    (void)state;
    sd_kv *kv = make_kv(16, 3, 16);
    int32_t a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, got = -1, m = -1;
    compute(kv, 0, a, 10);
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, a, 9, &got), SD_OK); /* two whole blocks */
    assert_int_equal(got, 8);
    expect_rows(kv, 1, a, 0, 8);
    for (int32_t p = 0; p < 8; p++) assert_ptr_equal(sd_kv_side(kv, 1, p, NULL), sd_kv_side(kv, 0, p, NULL));
    /* contiguity: to the block's end, within the length */
    assert_non_null(sd_kv_side(kv, 0, 5, &m));
    assert_int_equal(m, 3);
    assert_non_null(sd_kv_side(kv, 0, 9, &m));
    assert_int_equal(m, 1);
    /* the adopter computes on: its own rows, the shared ones unchanged */
    compute(kv, 1, a, 10);
    expect_rows(kv, 1, a, 0, 10);
    expect_rows(kv, 0, a, 0, 10);
    /* the rows outlive their sequences while the blocks stay cached */
    sd_kv_release(kv, 0);
    sd_kv_release(kv, 1);
    assert_int_equal(sd_kv_prefix_adopt(kv, 2, a, 10, &got), SD_OK);
    assert_int_equal(got, 8);
    expect_rows(kv, 2, a, 0, 8);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_free(&kv);
}

static void test_partial_copy_carries_rows(void **state) {
    (void)state;
    sd_kv *kv = make_kv(16, 3, 16);
    assert_int_equal(sd_kv_prefix_set_partial_copy(kv, true), SD_OK);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 4, 5, 6, 99, 98}, got = -1;
    compute(kv, 0, a, 8);
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, b, 8, &got), SD_OK); /* block 0 whole, rows 4, 5 copied */
    assert_int_equal(got, 6);
    expect_rows(kv, 1, a, 0, 6); /* b's prefix up to 5 is a's: the same features */
    assert_ptr_equal(sd_kv_side(kv, 1, 0, NULL), sd_kv_side(kv, 0, 0, NULL));
    assert_ptr_not_equal(sd_kv_side(kv, 1, 4, NULL), sd_kv_side(kv, 0, 4, NULL)); /* a copy of its own */
    compute(kv, 1, b, 8);
    expect_rows(kv, 1, b, 0, 8);
    expect_rows(kv, 0, a, 0, 8); /* the cached block the rows came from is untouched */
    sd_kv_free(&kv);
}

static void test_evicted_block_reused(void **state) {
    (void)state;
    sd_kv *kv = make_kv(4, 2, 4); /* a pool of 4 blocks: a second prompt evicts the first */
    int32_t a[12], c[16], got = -1;
    for (int32_t i = 0; i < 12; i++) a[i] = 100 + i;
    for (int32_t i = 0; i < 16; i++) c[i] = 200 + i;
    compute(kv, 0, a, 12);
    sd_kv_release(kv, 0);  /* three cached idle blocks */
    compute(kv, 1, c, 16); /* takes the free block, then evicts all three */
    expect_rows(kv, 1, c, 0, 16);
    sd_kv_prefix_stats st;
    sd_kv_prefix_stats_get(kv, &st);
    assert_int_equal((int)st.blocks_evicted, 3);
    sd_kv_release(kv, 1);
    assert_int_equal(sd_kv_prefix_adopt(kv, 0, a, 12, &got), SD_OK);
    assert_int_equal(got, 0); /* evicted: a's rows are gone, never served */
    assert_int_equal(sd_kv_prefix_adopt(kv, 0, c, 16, &got), SD_OK);
    assert_int_equal(got, 16);
    expect_rows(kv, 0, c, 0, 16); /* the reused blocks hold c's rows */
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_free(&kv);
}

static void test_bounds(void **state) {
    (void)state;
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = p.n_kv_heads = p.head_dim = 1;
    p.block_size = BS;
    p.n_blocks = 4;
    p.max_seqs = 2;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 0, 3), SD_OK);
    int32_t m = -1;
    assert_null(sd_kv_side(kv, 0, 0, &m)); /* not enabled */
    assert_int_equal(m, 0);
    assert_int_equal(sd_kv_side_floats(kv), 0);
    assert_int_equal(sd_kv_side_enable(kv, 0), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_kv_side_enable(kv, W), SD_OK);
    assert_int_equal(sd_kv_side_enable(kv, W), SD_OK);
    assert_int_equal(sd_kv_side_enable(kv, W + 1), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_kv_side_floats(kv), W);
    assert_non_null(sd_kv_side(kv, 0, 2, &m));
    assert_int_equal(m, 1);
    assert_null(sd_kv_side(kv, 0, 3, NULL)); /* past the length */
    assert_null(sd_kv_side(kv, 0, -1, NULL));
    assert_null(sd_kv_side(kv, 1, 0, NULL)); /* an empty slot */
    assert_null(sd_kv_side(kv, 2, 0, NULL)); /* no such slot */
    sd_kv_free(&kv);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_kv_side");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adopt_shares_rows),
        cmocka_unit_test(test_partial_copy_carries_rows),
        cmocka_unit_test(test_evicted_block_reused),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
