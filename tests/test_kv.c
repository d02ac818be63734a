/* test_kv.c — unit tests of the paged KV cache (engine/kv.c).
 *
 * Checks exact free-block accounting through grow/truncate/release, the
 * all-or-nothing contract of a grow that runs out of blocks, that data stored
 * at a position survives other sequences growing, that truncate+regrow gets
 * the same blocks back, that bad arguments are refused with a log line, and
 * that a prefault touches every pool byte of an unused cache only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "specd/kv.h"

/* Counts ERROR lines so tests can demand that a refusal was logged. */
static int n_error_lines;
static void count_sink(sd_log_level level, const char *line, void *user) {
    (void)line;
    (void)user;
    if (level == SD_LOG_ERROR) n_error_lines++;
}

static int setup(void **state) {
    (void)state;
    n_error_lines = 0;
    sd_log_set(count_sink, NULL, SD_LOG_WARN, "test_kv");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    sd_log_set(NULL, NULL, SD_LOG_INFO, "test_kv");
    return 0;
}

/* 2 layers, 2 kv heads x 3 dims, blocks of 4 tokens, 10 blocks, 3 slots. */
static sd_kv *make_kv(void) {
    sd_kv_params p = sd_kv_default_params();
    assert_int_equal(p.block_size, 16);
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim = 3;
    p.block_size = 4;
    p.n_blocks = 10;
    p.max_seqs = 3;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    assert_non_null(kv);
    return kv;
}

static void test_accounting(void **state) {
    (void)state;
    sd_kv *kv = make_kv();
    assert_int_equal(sd_kv_n_free_blocks(kv), 10);
    assert_int_equal(sd_kv_seq_len(kv, 0), 0);

    assert_int_equal(sd_kv_grow(kv, 0, 1), SD_OK); /* 1 block */
    assert_int_equal(sd_kv_n_free_blocks(kv), 9);
    assert_int_equal(sd_kv_grow(kv, 0, 4), SD_OK); /* still 1 block */
    assert_int_equal(sd_kv_n_free_blocks(kv), 9);
    assert_int_equal(sd_kv_grow(kv, 0, 5), SD_OK); /* 2 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 8);
    assert_int_equal(sd_kv_grow(kv, 0, 5), SD_OK); /* same length: no-op */
    assert_int_equal(sd_kv_n_free_blocks(kv), 8);
    assert_int_equal(sd_kv_seq_len(kv, 0), 5);

    assert_int_equal(sd_kv_grow(kv, 1, 13), SD_OK); /* 4 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 4);
    int32_t nb = -1;
    const int32_t *table = sd_kv_block_table(kv, 1, &nb);
    assert_non_null(table);
    assert_int_equal(nb, 4);

    assert_int_equal(sd_kv_truncate(kv, 1, 8), SD_OK); /* 2 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 6);
    assert_int_equal(sd_kv_seq_len(kv, 1), 8);
    assert_int_equal(sd_kv_truncate(kv, 1, 7), SD_OK); /* still 2 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 6);
    assert_int_equal(sd_kv_truncate(kv, 1, 0), SD_OK); /* no blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 8);
    sd_kv_block_table(kv, 1, &nb);
    assert_int_equal(nb, 0);

    sd_kv_release(kv, 0);
    assert_int_equal(sd_kv_seq_len(kv, 0), 0);
    assert_int_equal(sd_kv_n_free_blocks(kv), 10);
    sd_kv_release(kv, 0); /* releasing an empty slot is harmless */
    assert_int_equal(sd_kv_n_free_blocks(kv), 10);

    /* Every block id handed out is distinct and in range. */
    assert_int_equal(sd_kv_grow(kv, 0, 20), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 2, 20), SD_OK);
    assert_int_equal(sd_kv_n_free_blocks(kv), 0);
    int seen[10] = {0};
    for (int32_t s = 0; s < 3; s += 2) {
        table = sd_kv_block_table(kv, s, &nb);
        assert_int_equal(nb, 5);
        for (int32_t i = 0; i < nb; i++) {
            assert_in_range(table[i], 0, 9);
            seen[table[i]]++;
        }
    }
    for (int i = 0; i < 10; i++) assert_int_equal(seen[i], 1);
    assert_int_equal(n_error_lines, 0);
    sd_kv_free(&kv);
    assert_null(kv);
    sd_kv_free(&kv); /* freeing NULL is harmless */
}

static void test_out_of_blocks_all_or_nothing(void **state) {
    (void)state;
    sd_kv *kv = make_kv();
    assert_int_equal(sd_kv_grow(kv, 0, 30), SD_OK); /* 8 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 2);
    assert_int_equal(sd_kv_grow(kv, 1, 6), SD_OK); /* 2 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 0);
    int32_t nb0 = 0;
    const int32_t *t0 = sd_kv_block_table(kv, 0, &nb0);
    int32_t before[8];
    memcpy(before, t0, sizeof before);

    /* Slot 1 at length 6 holds 2 blocks: up to 8 fits, 9 needs a third. */
    assert_int_equal(sd_kv_grow(kv, 1, 8), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 1, 9), SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(sd_kv_seq_len(kv, 1), 8);
    assert_int_equal(sd_kv_grow(kv, 2, 1), SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(sd_kv_seq_len(kv, 2), 0);
    assert_int_equal(sd_kv_n_free_blocks(kv), 0);

    /* With 3 free blocks, a request for 4 more changes nothing. */
    assert_int_equal(sd_kv_truncate(kv, 0, 20), SD_OK); /* 5 blocks: frees 3 */
    assert_int_equal(sd_kv_n_free_blocks(kv), 3);
    assert_int_equal(sd_kv_grow(kv, 2, 13), SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(sd_kv_n_free_blocks(kv), 3);
    assert_int_equal(sd_kv_seq_len(kv, 2), 0);
    int32_t nb2 = -1;
    sd_kv_block_table(kv, 2, &nb2);
    assert_int_equal(nb2, 0);
    assert_int_equal(sd_kv_grow(kv, 0, 33), SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(sd_kv_seq_len(kv, 0), 20);
    t0 = sd_kv_block_table(kv, 0, &nb0);
    assert_int_equal(nb0, 5);
    assert_memory_equal(t0, before, 5 * sizeof(int32_t));
    /* Exactly what is free can still be taken. */
    assert_int_equal(sd_kv_grow(kv, 2, 12), SD_OK);
    assert_int_equal(sd_kv_n_free_blocks(kv), 0);
    sd_kv_free(&kv);
}

/* A value that identifies (layer, k/v, seq, pos, element). */
static float tag(int32_t layer, int kind, int32_t seq, int32_t pos, int e) {
    return (float)(layer * 100000 + kind * 10000 + seq * 1000 + pos * 10 + e);
}

static void fill(sd_kv *kv, int32_t seq, int32_t from, int32_t to) {
    for (int32_t l = 0; l < 2; l++)
        for (int32_t pos = from; pos < to; pos++) {
            float *k = sd_kv_k(kv, l, seq, pos);
            float *v = sd_kv_v(kv, l, seq, pos);
            assert_non_null(k);
            assert_non_null(v);
            for (int e = 0; e < 6; e++) {
                k[e] = tag(l, 0, seq, pos, e);
                v[e] = tag(l, 1, seq, pos, e);
            }
        }
}

static void check(sd_kv *kv, int32_t seq, int32_t from, int32_t to) {
    for (int32_t l = 0; l < 2; l++)
        for (int32_t pos = from; pos < to; pos++) {
            const float *k = sd_kv_k(kv, l, seq, pos);
            const float *v = sd_kv_v(kv, l, seq, pos);
            for (int e = 0; e < 6; e++) {
                assert_true(k[e] == tag(l, 0, seq, pos, e));
                assert_true(v[e] == tag(l, 1, seq, pos, e));
            }
        }
}

static void test_data_survives_and_pointers_follow_table(void **state) {
    (void)state;
    sd_kv *kv = make_kv();
    /* Interleave growth so the slots' blocks alternate in the pool. */
    for (int32_t step = 1; step <= 3; step++) {
        for (int32_t s = 0; s < 3; s++) {
            int32_t old = sd_kv_seq_len(kv, s);
            assert_int_equal(sd_kv_grow(kv, s, step * 3), SD_OK);
            fill(kv, s, old, step * 3);
        }
        for (int32_t s = 0; s < 3; s++) check(kv, s, 0, step * 3);
    }
    /* The pointer is pool + block*block_floats + row*token_floats. */
    const sd_kv_params *p = sd_kv_params_of(kv);
    size_t token_floats = (size_t)p->n_kv_heads * (size_t)p->head_dim;
    size_t block_floats = token_floats * (size_t)p->block_size;
    for (int32_t s = 0; s < 3; s++) {
        int32_t nb = 0;
        const int32_t *table = sd_kv_block_table(kv, s, &nb);
        for (int32_t pos = 0; pos < sd_kv_seq_len(kv, s); pos++) {
            size_t off =
                (size_t)table[pos / p->block_size] * block_floats + (size_t)(pos % p->block_size) * token_floats;
            assert_ptr_equal(sd_kv_k(kv, 1, s, pos), (float *)sd_kv_k_pool(kv, 1) + off);
            assert_ptr_equal(sd_kv_v(kv, 0, s, pos), (float *)sd_kv_v_pool(kv, 0) + off);
        }
    }
    /* Truncating and releasing others leaves slot 1's data intact. */
    assert_int_equal(sd_kv_truncate(kv, 0, 2), SD_OK);
    sd_kv_release(kv, 2);
    assert_int_equal(sd_kv_grow(kv, 0, 9), SD_OK);
    fill(kv, 0, 2, 9);
    check(kv, 1, 0, 9);
    check(kv, 0, 0, 9);
    sd_kv_free(&kv);
}

static void test_truncate_regrow_reuses_blocks(void **state) {
    (void)state;
    sd_kv *kv = make_kv();
    assert_int_equal(sd_kv_grow(kv, 0, 3), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 1, 17), SD_OK); /* 5 blocks */
    int32_t nb = 0;
    const int32_t *t = sd_kv_block_table(kv, 1, &nb);
    int32_t before[5];
    memcpy(before, t, sizeof before);
    fill(kv, 1, 0, 17);

    assert_int_equal(sd_kv_truncate(kv, 1, 5), SD_OK); /* keeps 2 blocks */
    assert_int_equal(sd_kv_n_free_blocks(kv), 10 - 1 - 2);
    check(kv, 1, 0, 5);
    assert_int_equal(sd_kv_grow(kv, 1, 17), SD_OK);
    t = sd_kv_block_table(kv, 1, &nb);
    assert_int_equal(nb, 5);
    assert_memory_equal(t, before, sizeof before);
    check(kv, 1, 0, 5);
    assert_int_equal(sd_kv_n_free_blocks(kv), 10 - 1 - 5);

    /* A released slot's blocks go to the next sequence that grows. */
    sd_kv_release(kv, 1);
    assert_int_equal(sd_kv_grow(kv, 2, 20), SD_OK);
    t = sd_kv_block_table(kv, 2, &nb);
    assert_memory_equal(t, before, sizeof before);
    sd_kv_free(&kv);
}

static void test_invalid_args(void **state) {
    (void)state;
    sd_kv *kv = NULL;
    sd_kv_params p = sd_kv_default_params();
    assert_int_equal(sd_kv_create(&p, &kv), SD_ERR_INVALID_ARG); /* zeros */
    assert_null(kv);
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 64;
    p.n_blocks = 4;
    p.max_seqs = 1;
    p.block_size = -1;
    assert_int_equal(sd_kv_create(&p, &kv), SD_ERR_INVALID_ARG);
    assert_null(kv);
    /* 2^31 * 2^31 * 2^6 * 2^4 * 4 bytes overflows size_t. */
    p.block_size = INT32_MAX;
    p.n_blocks = INT32_MAX;
    p.n_kv_heads = 64;
    p.head_dim = 16;
    assert_int_equal(sd_kv_create(&p, &kv), SD_ERR_RANGE);
    assert_null(kv);
    assert_int_equal(sd_kv_create(NULL, &kv), SD_ERR_INVALID_ARG);
    int errors = n_error_lines;
    assert_true(errors >= 4);

    kv = make_kv();
    assert_int_equal(sd_kv_grow(kv, -1, 1), SD_ERR_RANGE);
    assert_int_equal(sd_kv_grow(kv, 3, 1), SD_ERR_RANGE);
    assert_int_equal(sd_kv_grow(kv, 0, -1), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_kv_grow(kv, 0, 6), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 0, 5), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_kv_truncate(kv, 0, 7), SD_ERR_RANGE);
    assert_int_equal(sd_kv_truncate(kv, 0, -1), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_kv_truncate(kv, 5, 0), SD_ERR_RANGE);
    assert_int_equal(sd_kv_seq_len(kv, 0), 6);
    assert_int_equal(sd_kv_n_free_blocks(kv), 8);
    assert_int_equal(n_error_lines - errors, 7);

    errors = n_error_lines;
    sd_kv_release(kv, 99);
    assert_int_equal(sd_kv_n_free_blocks(kv), 8);
    assert_null(sd_kv_k(kv, 0, 0, 6)); /* pos == len */
    assert_null(sd_kv_k(kv, 0, 0, -1));
    assert_null(sd_kv_v(kv, 2, 0, 0)); /* layer */
    assert_null(sd_kv_v(kv, 0, 3, 0)); /* slot */
    assert_null(sd_kv_k(kv, 0, 1, 0)); /* empty slot */
    assert_null(sd_kv_k_pool(kv, 2));
    assert_null(sd_kv_v_pool(kv, -1));
    int32_t nb = 123;
    assert_null(sd_kv_block_table(kv, 3, &nb));
    assert_int_equal(nb, 0);
    assert_int_equal(n_error_lines - errors, 9);
    assert_non_null(sd_kv_k(kv, 1, 0, 5));
    sd_kv_free(&kv);
}

/* An f16 cache: two bytes a value, the same table walk; only f32 and f16
 * are accepted; the half conversions round to nearest even and widen
 * exactly (every half round-trips; ties go to the even neighbour). */
static void test_f16_cache(void **state) {
    (void)state;
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim = 3;
    p.block_size = 4;
    p.n_blocks = 10;
    p.max_seqs = 3;
    p.type = SD_DTYPE_F16;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 1, 9), SD_OK);
    int32_t nb = 0;
    const int32_t *table = sd_kv_block_table(kv, 1, &nb);
    size_t token = 6, block = token * 4;
    for (int32_t pos = 0; pos < 9; pos++) {
        size_t off = (size_t)table[pos / 4] * block + (size_t)(pos % 4) * token;
        assert_ptr_equal(sd_kv_k(kv, 1, 1, pos), (uint16_t *)sd_kv_k_pool(kv, 1) + off);
        assert_ptr_equal(sd_kv_v(kv, 0, 1, pos), (uint16_t *)sd_kv_v_pool(kv, 0) + off);
    }
    sd_kv_free(&kv);
    p.type = SD_DTYPE_Q8_0;
    assert_int_equal(sd_kv_create(&p, &kv), SD_ERR_INVALID_ARG);
    assert_null(kv);
    assert_true(n_error_lines >= 1);
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue; /* NaN payloads */
        assert_int_equal(sd_f32_to_f16(sd_f16_to_f32((uint16_t)h)), h);
    }
    assert_int_equal(sd_f32_to_f16(1.0f + 0x1p-11f), 0x3c00u);     /* tie: to even (1.0) */
    assert_int_equal(sd_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02u); /* tie: to even (up) */
    assert_int_equal(sd_f32_to_f16(65520.0f), 0x7c00u);            /* overflow */
    assert_int_equal(sd_f32_to_f16(0x1p-25f), 0x0000u);            /* half the smallest: even (0) */
    assert_int_equal(sd_f32_to_f16(0x1p-25f + 0x1p-40f), 0x0001u); /* just above: up */
    assert_true(sd_f16_to_f32(sd_f32_to_f16(__builtin_nanf(""))) != sd_f16_to_f32(sd_f32_to_f16(__builtin_nanf(""))));
}

/* sd_kv_prefault: every byte of each pool written (zero), its count
 * reported; refused, with a log line and nothing written, once a sequence
 * holds blocks; allowed again after the release. */
static void test_prefault(void **state) {
    (void)state;
    sd_kv *kv = make_kv();
    const size_t pool_floats = 10 * 4 * 6; /* n_blocks x block_size x (2 heads x 3 dims) */
    for (int32_t l = 0; l < 2; l++) {
        float *k = sd_kv_k_pool(kv, l), *v = sd_kv_v_pool(kv, l);
        for (size_t i = 0; i < pool_floats; i++) k[i] = v[i] = 7.0f;
    }
    size_t bytes = 1;
    assert_int_equal(sd_kv_prefault(kv, &bytes), SD_OK);
    assert_int_equal(bytes, 2 * 2 * pool_floats * sizeof(float));
    for (int32_t l = 0; l < 2; l++) {
        const float *k = sd_kv_k_pool(kv, l), *v = sd_kv_v_pool(kv, l);
        for (size_t i = 0; i < pool_floats; i++) {
            assert_true(k[i] == 0.0f);
            assert_true(v[i] == 0.0f);
        }
    }
    assert_int_equal(sd_kv_grow(kv, 1, 5), SD_OK);
    fill(kv, 1, 0, 5);
    const int errors = n_error_lines;
    assert_int_equal(sd_kv_prefault(kv, &bytes), SD_ERR_INVALID_ARG);
    assert_int_equal(bytes, 0);
    assert_int_equal(n_error_lines - errors, 1);
    check(kv, 1, 0, 5);
    sd_kv_release(kv, 1);
    assert_int_equal(sd_kv_prefault(kv, NULL), SD_OK);
    assert_int_equal(sd_kv_prefault(NULL, NULL), SD_ERR_INVALID_ARG);
    sd_kv_free(&kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_accounting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_blocks_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_data_survives_and_pointers_follow_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncate_regrow_reuses_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_f16_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefault, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
