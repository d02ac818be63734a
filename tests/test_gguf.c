/* test_gguf.c — GGUF writer -> reader round trips, typed getters, dtypes.
 *
 * Metadata of every type (nested arrays and every scalar type come from a
 * hand-encoded source file copied with sd_gguf_writer_copy_kv, the rest from
 * the writer's setters) is written to a file, read back and compared. Tensors
 * of every dtype are quantized, written, read back (bytes identical, data
 * aligned) and dequantized within each type's error bound. Known encodings
 * (f16/bf16 rounding, an exactly representable Q4_0 block) pin the bit
 * layouts. `test_gguf --model` checks the demo model instead (label model). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gguf_testbuf.h"
#include "specd/gguf.h"

/* ---- helpers ---- */

static char *tmp_path(char *buf, size_t n) {
    snprintf(buf, n, "/tmp/test_gguf_%d_XXXXXX", (int)getpid());
    int fd = mkstemp(buf);
    assert_true(fd >= 0);
    close(fd);
    return buf;
}

static sd_gguf *write_and_open(const sd_gguf_writer *w, char *path, size_t path_len) {
    tmp_path(path, path_len);
    assert_int_equal(sd_gguf_writer_write(w, path), SD_OK);
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    return g;
}

static void str_equal(sd_gguf_str s, const char *expect) {
    assert_int_equal(s.len, strlen(expect));
    if (s.len) assert_memory_equal(s.ptr, expect, s.len);
}

/* Hand-encoded v2 source with every scalar type and nested arrays. */
static void build_source(tbuf *b) {
    tb_put(b, "GGUF", 4);
    tb_u32(b, 2);
    tb_u64(b, 0);  /* tensors */
    tb_u64(b, 13); /* kv */
    tb_key(b, "src.u8", SD_GGUF_TYPE_UINT8);
    tb_u8(b, 200);
    tb_key(b, "src.i8", SD_GGUF_TYPE_INT8);
    tb_u8(b, (uint8_t)-100);
    tb_key(b, "src.u16", SD_GGUF_TYPE_UINT16);
    tb_u16(b, 60000);
    tb_key(b, "src.i16", SD_GGUF_TYPE_INT16);
    tb_u16(b, (uint16_t)-30000);
    tb_key(b, "src.u64", SD_GGUF_TYPE_UINT64);
    tb_u64(b, UINT64_MAX);
    tb_key(b, "src.i64", SD_GGUF_TYPE_INT64);
    tb_u64(b, (uint64_t)INT64_MIN);
    tb_key(b, "src.f64", SD_GGUF_TYPE_FLOAT64);
    tb_f64(b, 2.5e300);
    tb_key(b, "src.u64small", SD_GGUF_TYPE_UINT64);
    tb_u64(b, 7);
    tb_key(b, "src.neg", SD_GGUF_TYPE_INT32);
    tb_u32(b, (uint32_t)-5);
    /* [[1, 2, 3] (u16), [] (str), [["x", ""]] (arr of arr of str)] */
    tb_key(b, "src.nested", SD_GGUF_TYPE_ARRAY);
    tb_u32(b, SD_GGUF_TYPE_ARRAY);
    tb_u64(b, 3);
    tb_u32(b, SD_GGUF_TYPE_UINT16);
    tb_u64(b, 3);
    tb_u16(b, 1);
    tb_u16(b, 2);
    tb_u16(b, 3);
    tb_u32(b, SD_GGUF_TYPE_STRING);
    tb_u64(b, 0);
    tb_u32(b, SD_GGUF_TYPE_ARRAY);
    tb_u64(b, 1);
    tb_u32(b, SD_GGUF_TYPE_STRING);
    tb_u64(b, 2);
    tb_str(b, "x");
    tb_str(b, "");
    tb_key(b, "src.f64arr", SD_GGUF_TYPE_ARRAY);
    tb_u32(b, SD_GGUF_TYPE_FLOAT64);
    tb_u64(b, 2);
    tb_f64(b, -1.0);
    tb_f64(b, 0.25);
    tb_key(b, "src.emptyarr", SD_GGUF_TYPE_ARRAY);
    tb_u32(b, SD_GGUF_TYPE_ARRAY);
    tb_u64(b, 0);
    tb_key(b, "other.key", SD_GGUF_TYPE_BOOL);
    tb_u8(b, 1);
}

/* ---- metadata ---- */

static void test_metadata_roundtrip(void **state) {
    (void)state;
    tbuf src_bytes = {0};
    build_source(&src_bytes);
    sd_gguf *src = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open_memory(src_bytes.p, src_bytes.n, &src, err, sizeof err), SD_OK);
    assert_int_equal(sd_gguf_version(src), 2);

    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(sd_gguf_writer_copy_kv(w, src, "src."), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "w.u32", 4000000000u), SD_OK);
    assert_int_equal(sd_gguf_writer_set_i32(w, "w.i32", -123456), SD_OK);
    assert_int_equal(sd_gguf_writer_set_f32(w, "w.f32", 1.5e-5f), SD_OK);
    assert_int_equal(sd_gguf_writer_set_bool(w, "w.bool", true), SD_OK);
    assert_int_equal(sd_gguf_writer_set_str(w, "w.str", "héllo"), SD_OK);
    assert_int_equal(sd_gguf_writer_set_str(w, "w.empty", ""), SD_OK);
    assert_int_equal(sd_gguf_writer_set_str(w, "w.replaced", "first"), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "w.replaced", 9), SD_OK); /* replaces, no duplicate */
    const char *strs[] = {"a", "", "<|im_end|>"};
    assert_int_equal(sd_gguf_writer_set_arr_str(w, "w.strs", strs, 3), SD_OK);
    assert_int_equal(sd_gguf_writer_set_arr_str(w, "w.nostrs", NULL, 0), SD_OK);
    const uint8_t u8s[] = {0, 255};
    const int8_t i8s[] = {-128, 127};
    const uint16_t u16s[] = {65535};
    const int16_t i16s[] = {-32768, 5};
    const uint32_t u32s[] = {1, 2, 4294967295u};
    const int32_t i32s[] = {-1, 3};
    const float f32s[] = {0.5f, -2.0f};
    const uint8_t bools[] = {1, 0, 1};
    const uint64_t u64s[] = {UINT64_MAX, 0};
    const int64_t i64s[] = {INT64_MIN};
    const double f64s[] = {3.25};
    struct {
        const char *key;
        sd_gguf_type t;
        const void *v;
        uint64_t n;
        size_t size;
    } arrs[] = {
        {"a.u8", SD_GGUF_TYPE_UINT8, u8s, 2, 1},     {"a.i8", SD_GGUF_TYPE_INT8, i8s, 2, 1},
        {"a.u16", SD_GGUF_TYPE_UINT16, u16s, 1, 2},  {"a.i16", SD_GGUF_TYPE_INT16, i16s, 2, 2},
        {"a.u32", SD_GGUF_TYPE_UINT32, u32s, 3, 4},  {"a.i32", SD_GGUF_TYPE_INT32, i32s, 2, 4},
        {"a.f32", SD_GGUF_TYPE_FLOAT32, f32s, 2, 4}, {"a.bool", SD_GGUF_TYPE_BOOL, bools, 3, 1},
        {"a.u64", SD_GGUF_TYPE_UINT64, u64s, 2, 8},  {"a.i64", SD_GGUF_TYPE_INT64, i64s, 1, 8},
        {"a.f64", SD_GGUF_TYPE_FLOAT64, f64s, 1, 8}, {"a.empty", SD_GGUF_TYPE_INT32, NULL, 0, 4},
    };
    const size_t n_arrs = sizeof arrs / sizeof arrs[0];
    for (size_t i = 0; i < n_arrs; i++)
        assert_int_equal(sd_gguf_writer_set_arr(w, arrs[i].key, arrs[i].t, arrs[i].v, arrs[i].n), SD_OK);
    assert_int_equal(sd_gguf_writer_set_arr(w, "bad", SD_GGUF_TYPE_STRING, strs, 1), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_gguf_writer_set_arr(w, "bad", SD_GGUF_TYPE_ARRAY, strs, 1), SD_ERR_INVALID_ARG);

    char path[128];
    sd_gguf *g = write_and_open(w, path, sizeof path);
    assert_int_equal(sd_gguf_version(g), 3);
    assert_int_equal(sd_gguf_n_kv(g), 12 + 9 + (int64_t)n_arrs); /* copied (not other.key) + set + arrays */
    assert_int_equal(sd_gguf_find_key(g, "other.key"), -1);
    assert_int_equal(sd_gguf_n_tensors(g), 0);

    uint64_t u64;
    int64_t i64;
    uint32_t u32;
    float f;
    bool b;
    sd_gguf_str s;
    assert_int_equal(sd_gguf_get_u64(g, "src.u8", &u64), SD_OK);
    assert_int_equal(u64, 200);
    assert_int_equal(sd_gguf_get_i64(g, "src.i8", &i64), SD_OK);
    assert_int_equal(i64, -100);
    assert_int_equal(sd_gguf_get_u32(g, "src.u16", &u32), SD_OK);
    assert_int_equal(u32, 60000);
    assert_int_equal(sd_gguf_get_i64(g, "src.i16", &i64), SD_OK);
    assert_int_equal(i64, -30000);
    assert_int_equal(sd_gguf_get_u64(g, "src.u64", &u64), SD_OK);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(sd_gguf_get_i64(g, "src.i64", &i64), SD_OK);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(sd_gguf_get_f32(g, "src.f64", &f), SD_OK);
    assert_true(isinf(f)); /* 2.5e300 as f32 */
    assert_int_equal(sd_gguf_get_u32(g, "src.u64small", &u32), SD_OK);
    assert_int_equal(u32, 7);
    assert_int_equal(sd_gguf_get_u32(g, "w.u32", &u32), SD_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(sd_gguf_get_i64(g, "w.i32", &i64), SD_OK);
    assert_int_equal(i64, -123456);
    assert_int_equal(sd_gguf_get_f32(g, "w.f32", &f), SD_OK);
    assert_true(f == 1.5e-5f);
    assert_int_equal(sd_gguf_get_bool(g, "w.bool", &b), SD_OK);
    assert_true(b);
    assert_int_equal(sd_gguf_get_str(g, "w.str", &s), SD_OK);
    str_equal(s, "héllo");
    assert_int_equal(sd_gguf_get_str(g, "w.empty", &s), SD_OK);
    str_equal(s, "");
    assert_int_equal(sd_gguf_get_u32(g, "w.replaced", &u32), SD_OK);
    assert_int_equal(u32, 9);
    int64_t idx = sd_gguf_find_key(g, "w.str");
    assert_true(idx >= 0);
    assert_string_equal(sd_gguf_key(g, idx), "w.str");
    assert_int_equal(sd_gguf_kv_type(g, idx), SD_GGUF_TYPE_STRING);
    assert_null(sd_gguf_key(g, sd_gguf_n_kv(g)));
    assert_int_equal(sd_gguf_kv_type(g, -1), SD_GGUF_TYPE_COUNT);

    sd_gguf_type et;
    uint64_t len;
    assert_int_equal(sd_gguf_get_arr(g, "w.strs", &et, &len), SD_OK);
    assert_int_equal(et, SD_GGUF_TYPE_STRING);
    assert_int_equal(len, 3);
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(sd_gguf_get_arr_str(g, "w.strs", i, &s), SD_OK);
        str_equal(s, strs[i]);
    }
    assert_int_equal(sd_gguf_get_arr_str(g, "w.strs", 3, &s), SD_ERR_RANGE);
    assert_int_equal(sd_gguf_get_arr(g, "w.nostrs", &et, &len), SD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(sd_gguf_get_arr_str(g, "w.nostrs", 0, &s), SD_ERR_RANGE);
    for (size_t i = 0; i < n_arrs; i++) {
        const void *data;
        assert_int_equal(sd_gguf_get_arr(g, arrs[i].key, &et, &len), SD_OK);
        assert_int_equal(et, arrs[i].t);
        assert_int_equal(sd_gguf_get_arr_data(g, arrs[i].key, &data, &len), SD_OK);
        assert_int_equal(len, arrs[i].n);
        if (len) assert_memory_equal(data, arrs[i].v, len * arrs[i].size);
    }
    /* Nested arrays survive the copy; their element type reads as ARRAY. */
    assert_int_equal(sd_gguf_get_arr(g, "src.nested", &et, &len), SD_OK);
    assert_int_equal(et, SD_GGUF_TYPE_ARRAY);
    assert_int_equal(len, 3);
    assert_int_equal(sd_gguf_get_arr(g, "src.emptyarr", &et, &len), SD_OK);
    assert_int_equal(et, SD_GGUF_TYPE_ARRAY);
    assert_int_equal(len, 0);
    const void *data;
    assert_int_equal(sd_gguf_get_arr_data(g, "src.nested", &data, &len), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_arr_str(g, "src.nested", 0, &s), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_arr_data(g, "src.f64arr", &data, &len), SD_OK);
    double d2[2];
    memcpy(d2, data, sizeof d2);
    assert_true(d2[0] == -1.0 && d2[1] == 0.25);

    sd_gguf_close(&g);
    assert_null(g);
    sd_gguf_close(&g); /* NULL-safe */
    unlink(path);
    sd_gguf_writer_free(&w);
    assert_null(w);
    sd_gguf_close(&src);
    tb_free(&src_bytes);
}

static void test_getter_type_checks(void **state) {
    (void)state;
    tbuf src_bytes = {0};
    build_source(&src_bytes);
    sd_gguf *g = NULL;
    assert_int_equal(sd_gguf_open_memory(src_bytes.p, src_bytes.n, &g, NULL, 0), SD_OK);
    uint64_t u64;
    int64_t i64;
    uint32_t u32;
    float f;
    bool b;
    sd_gguf_str s;
    sd_gguf_type et;
    uint64_t len;
    const void *data;
    assert_int_equal(sd_gguf_get_u64(g, "nope", &u64), SD_ERR_NOT_FOUND);
    assert_int_equal(sd_gguf_get_str(g, "nope", &s), SD_ERR_NOT_FOUND);
    assert_int_equal(sd_gguf_get_arr(g, "nope", &et, &len), SD_ERR_NOT_FOUND);
    assert_int_equal(sd_gguf_get_u32(g, "src.u64", &u32), SD_ERR_FORMAT); /* does not fit */
    assert_int_equal(sd_gguf_get_i64(g, "src.u64", &i64), SD_ERR_FORMAT); /* does not fit */
    assert_int_equal(sd_gguf_get_u64(g, "src.neg", &u64), SD_ERR_FORMAT); /* negative */
    assert_int_equal(sd_gguf_get_u64(g, "src.i64", &u64), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_u64(g, "src.f64", &u64), SD_ERR_FORMAT);   /* float is not an integer */
    assert_int_equal(sd_gguf_get_u64(g, "other.key", &u64), SD_ERR_FORMAT); /* bool is not an integer */
    assert_int_equal(sd_gguf_get_f32(g, "src.u8", &f), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_bool(g, "src.u8", &b), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_bool(g, "other.key", &b), SD_OK);
    assert_true(b);
    assert_int_equal(sd_gguf_get_str(g, "src.u8", &s), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_arr(g, "src.u8", &et, &len), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_arr_str(g, "src.f64arr", 0, &s), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_arr_data(g, "src.u8", &data, &len), SD_ERR_FORMAT);
    assert_int_equal(sd_gguf_get_i64(g, "src.neg", &i64), SD_OK);
    assert_int_equal(i64, -5);
    sd_gguf_close(&g);
    tb_free(&src_bytes);
}

/* ---- tensors ---- */

static float rand_normal(uint64_t *st) {
    double u1, u2;
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    u1 = ((double)(*st >> 11) + 1.0) * 0x1.0p-53;
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    u2 = ((double)(*st >> 11) + 1.0) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Largest error each type may make on block b of x (32 values, or 1 for float types). */
static double error_bound(sd_dtype t, const float *x, size_t n) {
    float amax = 0, min = x[0], max = x[0];
    for (size_t j = 0; j < n; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
        min = fminf(min, x[j]);
        max = fmaxf(max, x[j]);
    }
    switch (t) {
    case SD_DTYPE_F32: return 0.0;
    case SD_DTYPE_F16: return amax * 0x1.0p-11 + 0x1.0p-25;
    case SD_DTYPE_BF16: return amax * 0x1.0p-8;
    case SD_DTYPE_Q8_0: return amax / 127.0 * (0.5 + 127 * 0x1.0p-11) + 1e-7;
    case SD_DTYPE_Q4_0: return amax / 8.0 * (1.0 + 8 * 0x1.0p-11) + 1e-7;
    case SD_DTYPE_Q4_1: return (max - min) / 15.0 * (0.5 + 15 * 0x1.0p-11) + fabsf(min) * 0x1.0p-11 + 1e-7;
    case SD_DTYPE_Q5_0: return amax / 16.0 * (1.0 + 16 * 0x1.0p-11) + 1e-7;
    case SD_DTYPE_Q5_1: return (max - min) / 31.0 * (0.5 + 31 * 0x1.0p-11) + fabsf(min) * 0x1.0p-11 + 1e-7;
    default: break; /* the K-quants: test_k_quant_error */
    }
    return -1;
}

static void test_tensors_every_dtype(void **state) {
    (void)state;
    const sd_dtype types[] = {SD_DTYPE_F32,  SD_DTYPE_F16,  SD_DTYPE_BF16, SD_DTYPE_Q8_0,
                              SD_DTYPE_Q4_0, SD_DTYPE_Q4_1, SD_DTYPE_Q5_0, SD_DTYPE_Q5_1};
    const size_t n_types = sizeof types / sizeof types[0];
    const uint64_t ne[3] = {64, 3, 2};
    const size_t n = 64 * 3 * 2;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    void *enc[sizeof types / sizeof types[0]];
    uint64_t st = 42;
    for (size_t i = 0; i < n; i++) x[i] = rand_normal(&st) * (i % 64 < 32 ? 1.0f : 0.01f) + (i % 7 == 0 ? 0.3f : 0);
    sd_gguf_writer *w = sd_gguf_writer_new();
    for (size_t k = 0; k < n_types; k++) {
        size_t be, bb;
        assert_true(sd_dtype_block(types[k], &be, &bb));
        enc[k] = malloc(n / be * bb);
        assert_int_equal(sd_quantize(types[k], x, n, enc[k]), SD_OK);
        char name[32];
        snprintf(name, sizeof name, "t.%s", sd_dtype_name(types[k]));
        assert_int_equal(sd_gguf_writer_add_tensor(w, name, types[k], 3, ne, enc[k]), SD_OK);
    }
    assert_int_equal(sd_gguf_writer_add_tensor(w, "t.F32", SD_DTYPE_F32, 3, ne, enc[0]), SD_ERR_INVALID_ARG);
    const uint64_t bad_ne[1] = {48};
    assert_int_equal(sd_gguf_writer_add_tensor(w, "t.bad", SD_DTYPE_Q8_0, 1, bad_ne, enc[3]), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_gguf_writer_add_tensor(w, "t.bad", SD_DTYPE_F32, 0, bad_ne, enc[0]), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_gguf_writer_add_tensor(w, "t.bad", (sd_dtype)9, 1, bad_ne, enc[0]), SD_ERR_INVALID_ARG);

    char path[128];
    sd_gguf *g = write_and_open(w, path, sizeof path);
    assert_int_equal(sd_gguf_n_tensors(g), (int64_t)n_types);
    assert_null(sd_gguf_find_tensor(g, "t.bad"));
    assert_null(sd_gguf_tensor_at(g, (int64_t)n_types));
    assert_null(sd_gguf_tensor_at(g, -1));
    for (size_t k = 0; k < n_types; k++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", sd_dtype_name(types[k]));
        const sd_gguf_tensor *t = sd_gguf_find_tensor(g, name);
        assert_non_null(t);
        assert_ptr_equal(t, sd_gguf_tensor_at(g, (int64_t)k));
        assert_string_equal(t->name, name);
        assert_int_equal(t->type, types[k]);
        assert_int_equal(t->n_dims, 3);
        assert_int_equal(t->ne[0], 64);
        assert_int_equal(t->ne[1], 3);
        assert_int_equal(t->ne[2], 2);
        assert_int_equal(t->ne[3], 1);
        assert_int_equal(t->n_elems, n);
        size_t be, bb;
        sd_dtype_block(types[k], &be, &bb);
        assert_int_equal(t->n_bytes, n / be * bb);
        assert_int_equal((uintptr_t)t->data % 32, 0);
        assert_memory_equal(t->data, enc[k], t->n_bytes);
        assert_int_equal(sd_dequantize(t->type, t->data, t->n_elems, y), SD_OK);
        for (size_t b0 = 0; b0 < n; b0 += 32) {
            double bound = error_bound(types[k], x + b0, 32);
            for (size_t j = b0; j < b0 + 32; j++) {
                double e = fabs((double)y[j] - (double)x[j]);
                double lim =
                    types[k] == SD_DTYPE_F16 || types[k] == SD_DTYPE_BF16 ? error_bound(types[k], x + j, 1) : bound;
                if (e > lim) fail_msg("%s element %zu: %g vs %g (error %g > %g)", name, j, y[j], x[j], e, lim);
            }
        }
        free(enc[k]);
    }
    assert_int_equal(sd_dequantize(SD_DTYPE_Q4_0, enc[0], 31, y), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_quantize((sd_dtype)9, x, 32, y), SD_ERR_INVALID_ARG); /* Q8_1: not a stored type */
    sd_gguf_close(&g);
    unlink(path);
    sd_gguf_writer_free(&w);
    free(x);
    free(y);
}

static uint16_t f16_of(float v) {
    uint16_t h;
    assert_int_equal(sd_quantize(SD_DTYPE_F16, &v, 1, &h), SD_OK);
    return h;
}

static uint16_t bf16_of(float v) {
    uint16_t h;
    assert_int_equal(sd_quantize(SD_DTYPE_BF16, &v, 1, &h), SD_OK);
    return h;
}

static float from16(sd_dtype t, uint16_t h) {
    float v;
    assert_int_equal(sd_dequantize(t, &h, 1, &v), SD_OK);
    return v;
}

/* The K-quants round-trip (sd_quantize then sd_dequantize): the relative RMS
 * error on normal data with scales varying by sub-block and a few outliers
 * stays under its bound (a 4-bit uniform grid over a 32-value range of
 * about 4.5 sigma is 0.09 sigma RMS; 5 bits half that; Q6_K's 6 bits over
 * 16 values about 0.02), Q4_K is no worse than Q4_1 on the same data,
 * constant and all-zero super-blocks come back exactly or nearly, and a
 * hand-decoded element checks the layout. */
static void test_k_quant_error(void **state) {
    (void)state;
    enum { N = 256 * 16 };
    static float x[N], y[N];
    uint64_t st = 7;
    for (size_t i = 0; i < N; i++)
        x[i] = rand_normal(&st) * (0.02f + (float)(i / 32 % 5)) + (i % 211 == 0 ? 9.0f : 0.0f);
    static uint8_t q[N / 256 * 210], q41[N / 32 * 20];
    const struct {
        sd_dtype type;
        double max_rel_rms;
    } cases[] = {{SD_DTYPE_Q4_K, 0.10}, {SD_DTYPE_Q5_K, 0.05}, {SD_DTYPE_Q6_K, 0.03}};
    double rms41 = 0, sx = 0;
    assert_int_equal(sd_quantize(SD_DTYPE_Q4_1, x, N, q41), SD_OK);
    assert_int_equal(sd_dequantize(SD_DTYPE_Q4_1, q41, N, y), SD_OK);
    for (size_t i = 0; i < N; i++) {
        rms41 += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    for (size_t c = 0; c < 3; c++) {
        assert_true(sd_dtype_is_k(cases[c].type));
        assert_int_equal(sd_quantize(cases[c].type, x, N, q), SD_OK);
        assert_int_equal(sd_dequantize(cases[c].type, q, N, y), SD_OK);
        double se = 0;
        for (size_t i = 0; i < N; i++) se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        double rel = sqrt(se / sx);
        print_message("%s: relative RMS error %.4f (Q4_1: %.4f)\n", sd_dtype_name(cases[c].type), rel,
                      sqrt(rms41 / sx));
        if (!(rel <= cases[c].max_rel_rms))
            fail_msg("%s: relative RMS error %g > %g", sd_dtype_name(cases[c].type), rel, cases[c].max_rel_rms);
        if (cases[c].type == SD_DTYPE_Q4_K) assert_true(se <= rms41 * 1.05);
        /* an all-zero super-block and a constant one */
        float z[512];
        for (int i = 0; i < 256; i++) z[i] = 0.0f;
        for (int i = 256; i < 512; i++) z[i] = -0.75f;
        assert_int_equal(sd_quantize(cases[c].type, z, 512, q), SD_OK);
        assert_int_equal(sd_dequantize(cases[c].type, q, 512, y), SD_OK);
        for (int i = 0; i < 512; i++)
            if (!(fabsf(y[i] - z[i]) <= 0.75f * 0x1.0p-9))
                fail_msg("%s: element %d: %g for %g", sd_dtype_name(cases[c].type), i, y[i], z[i]);
    }
    /* Q4_K by hand: d = 0.5, dmin = 0.25, sub-block 5 has sc = 0x23, m = 0x11
     * (s >= 4: low nibbles in scales[9], top bits in scales[1], scales[5]);
     * its element 7 is the high nibble of qs[32 * 2 + 7] = 0xA -> 0.5 * 35 * 10
     * - 0.25 * 17 */
    uint8_t blk[144] = {0};
    const uint16_t d = 0x3800, dmin = 0x3400; /* 0.5, 0.25 */
    memcpy(blk, &d, 2);
    memcpy(blk + 2, &dmin, 2);
    blk[4 + 9] = 0x13;    /* sc low 3, m low 1 */
    blk[4 + 1] = 2u << 6; /* sc top 2 -> 0x23 */
    blk[4 + 5] = 1u << 6; /* m top 1 -> 0x11 */
    blk[16 + 64 + 7] = 0xA0;
    assert_int_equal(sd_dequantize(SD_DTYPE_Q4_K, blk, 256, y), SD_OK);
    assert_true(y[5 * 32 + 7] == 0.5f * 35.0f * 10.0f - 0.25f * 17.0f);
    assert_string_equal(sd_dtype_name(SD_DTYPE_Q5_K), "Q5_K");
}

static void test_known_encodings(void **state) {
    (void)state;
    assert_int_equal(f16_of(1.0f), 0x3c00);
    assert_int_equal(f16_of(-2.0f), 0xc000);
    assert_int_equal(f16_of(0.1f), 0x2e66);
    assert_int_equal(f16_of(65504.0f), 0x7bff);
    assert_int_equal(f16_of(65519.0f), 0x7bff);
    assert_int_equal(f16_of(65520.0f), 0x7c00);   /* tie rounds to even: infinity */
    assert_int_equal(f16_of(0x1.0p-24f), 0x0001); /* smallest subnormal */
    assert_int_equal(f16_of(0x1.0p-25f), 0x0000); /* tie to even */
    assert_int_equal(f16_of(0x1.8p-25f), 0x0001);
    assert_int_equal(f16_of(0x1.0p-14f), 0x0400);        /* smallest normal */
    assert_int_equal(f16_of(0x1.ff8p-15f), 0x03ff);      /* largest subnormal */
    assert_int_equal(f16_of(0x1.ffcp-15f), 0x0400);      /* tie to even: smallest normal */
    assert_int_equal(f16_of(1.0f + 0x1.0p-11f), 0x3c00); /* tie to even */
    assert_int_equal(f16_of(1.0f + 0x1.8p-10f), 0x3c02); /* tie to even, up */
    assert_int_equal(f16_of(INFINITY), 0x7c00);
    assert_int_equal(f16_of(-0.0f), 0x8000);
    assert_int_equal(f16_of(NAN) & 0x7c00, 0x7c00);
    assert_true(from16(SD_DTYPE_F16, 0x0001) == 0x1.0p-24f);
    assert_true(from16(SD_DTYPE_F16, 0x03ff) == 0x1.ff8p-15f);
    assert_true(from16(SD_DTYPE_F16, 0xfbff) == -65504.0f);
    assert_true(isinf(from16(SD_DTYPE_F16, 0x7c00)));
    assert_true(isnan(from16(SD_DTYPE_F16, 0x7e00)));
    assert_int_equal(bf16_of(1.0f), 0x3f80);
    assert_int_equal(bf16_of(1.0f + 0x1.0p-8f), 0x3f80); /* tie to even */
    assert_int_equal(bf16_of(1.0f + 0x1.8p-7f), 0x3f82); /* tie to even, up */
    assert_int_equal(bf16_of(-3.0f), 0xc040);
    assert_true(isnan(from16(SD_DTYPE_BF16, bf16_of(NAN))));
    assert_true(from16(SD_DTYPE_BF16, 0x4049) == 3.140625f);

    /* Q4_0 block of the integers -8..7 (twice) is exact: d = 1. */
    float x[32], y[32];
    uint8_t q[18];
    for (int j = 0; j < 32; j++) x[j] = (float)(j % 16 - 8);
    assert_int_equal(sd_quantize(SD_DTYPE_Q4_0, x, 32, q), SD_OK);
    assert_int_equal(q[0] | q[1] << 8, 0x3c00);
    for (int j = 0; j < 16; j++) assert_int_equal(q[2 + j], j | j << 4);
    assert_int_equal(sd_dequantize(SD_DTYPE_Q4_0, q, 32, y), SD_OK);
    assert_memory_equal(x, y, sizeof x);
    /* Q4_1: low nibbles are elements 0..15, high nibbles 16..31; x = q*d + m. */
    uint8_t q1[20] = {0x00, 0x40, 0x00, 0xbc}; /* d = 2, m = -1 */
    for (int j = 0; j < 16; j++) q1[4 + j] = (uint8_t)(j | (15 - j) << 4);
    assert_int_equal(sd_dequantize(SD_DTYPE_Q4_1, q1, 32, y), SD_OK);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)j - 1.0f);
        assert_true(y[16 + j] == 2.0f * (float)(15 - j) - 1.0f);
    }
    /* Q5_0 block of the integers -16..15: d = 1, v = x + 16; elements 0..15
     * (v < 16) have no fifth bit, 16..31 have it (qh = 0xffff0000). */
    uint8_t q5[22];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    assert_int_equal(sd_quantize(SD_DTYPE_Q5_0, x, 32, q5), SD_OK);
    assert_int_equal(q5[0] | q5[1] << 8, 0x3c00);
    assert_int_equal((uint32_t)q5[2] | (uint32_t)q5[3] << 8 | (uint32_t)q5[4] << 16 | (uint32_t)q5[5] << 24,
                     0xffff0000u);
    for (int j = 0; j < 16; j++) assert_int_equal(q5[6 + j], j | j << 4);
    assert_int_equal(sd_dequantize(SD_DTYPE_Q5_0, q5, 32, y), SD_OK);
    assert_memory_equal(x, y, sizeof x);
    /* Q5_1: x = v d + m with v's fifth bit from qh (bit j for element j). */
    uint8_t q51[24] = {0x00, 0x40, 0x00, 0xbc, 0x0f, 0xf0, 0x00, 0x80}; /* d = 2, m = -1, qh = 0x8000f00f */
    for (int j = 0; j < 16; j++) q51[8 + j] = (uint8_t)(j | (15 - j) << 4);
    assert_int_equal(sd_dequantize(SD_DTYPE_Q5_1, q51, 32, y), SD_OK);
    const uint32_t qh51 = 0x8000f00fu;
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)(j | (int)((qh51 >> j) & 1) << 4) - 1.0f);
        assert_true(y[16 + j] == 2.0f * (float)((15 - j) | (int)((qh51 >> (16 + j)) & 1) << 4) - 1.0f);
    }
    assert_true(y[0] == 31.0f && y[4] == 7.0f && y[31] == 31.0f && y[30] == 1.0f);
    assert_string_equal(sd_dtype_name(SD_DTYPE_Q5_0), "Q5_0");
    assert_string_equal(sd_dtype_name(SD_DTYPE_Q5_1), "Q5_1");
    /* Q8_0: x = q * d. */
    uint8_t q8[34] = {0x00, 0x38}; /* d = 0.5 */
    for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(j * 8 - 127);
    assert_int_equal(sd_dequantize(SD_DTYPE_Q8_0, q8, 32, y), SD_OK);
    for (int j = 0; j < 32; j++) assert_true(y[j] == 0.5f * (float)(j * 8 - 127));
    assert_string_equal(sd_dtype_name(SD_DTYPE_Q4_1), "Q4_1");
    assert_string_equal(sd_dtype_name((sd_dtype)99), "?");
    assert_false(sd_dtype_block((sd_dtype)10, NULL, NULL));
}

/* ---- demo model (label model) ---- */

static bool model_path(char *buf, size_t n) {
    const char *env = getenv("SPECD_MODEL");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return access(buf, R_OK) == 0;
    }
    FILE *p = popen(SPECD_SOURCE_DIR "/tools/fetch-model 2>/dev/null", "r");
    if (!p) return false;
    bool ok = fgets(buf, (int)n, p) != NULL;
    int rc = pclose(p);
    if (!ok || rc != 0) return false;
    buf[strcspn(buf, "\n")] = 0;
    return access(buf, R_OK) == 0;
}

static int run_model_test(void) {
    char path[4096];
    if (!model_path(path, sizeof path)) {
        printf("skipped: demo model not available (set SPECD_MODEL or run tools/fetch-model)\n");
        return 77;
    }
    char err[256];
    sd_gguf *g = NULL;
    int bad = 0;
#define CHECK(c)                                                         \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
            bad++;                                                       \
        }                                                                \
    } while (0)
    CHECK(sd_gguf_open(path, &g, err, sizeof err) == SD_OK);
    if (!g) return 1;
    CHECK(sd_gguf_version(g) == 3);
    CHECK(sd_gguf_n_kv(g) == 33);
    CHECK(sd_gguf_n_tensors(g) == 272);
    uint32_t u32 = 0;
    CHECK(sd_gguf_get_u32(g, "llama.block_count", &u32) == SD_OK && u32 == 30);
    CHECK(sd_gguf_get_u32(g, "llama.embedding_length", &u32) == SD_OK && u32 == 576);
    sd_gguf_str s;
    CHECK(sd_gguf_get_str(g, "general.architecture", &s) == SD_OK && s.len == 5 && memcmp(s.ptr, "llama", 5) == 0);
    sd_gguf_type et;
    uint64_t len = 0;
    CHECK(sd_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &len) == SD_OK && et == SD_GGUF_TYPE_STRING && len == 49152);
    CHECK(sd_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 2, &s) == SD_OK && s.len == 10 &&
          memcmp(s.ptr, "<|im_end|>", 10) == 0);
    CHECK(sd_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &len) == SD_OK && len == 48900);
    const sd_gguf_tensor *t = sd_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == SD_DTYPE_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152);
    int n_q41 = 0, n_f32 = 0, n_q80 = 0;
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
        const sd_gguf_tensor *ti = sd_gguf_tensor_at(g, i);
        n_q41 += ti->type == SD_DTYPE_Q4_1;
        n_f32 += ti->type == SD_DTYPE_F32;
        n_q80 += ti->type == SD_DTYPE_Q8_0;
        CHECK(sd_gguf_find_tensor(g, ti->name) == ti);
    }
    CHECK(n_q41 == 210 && n_f32 == 61 && n_q80 == 1);
    CHECK(sd_gguf_find_tensor(g, "blk.29.ffn_down.weight") != NULL);
    CHECK(sd_gguf_find_tensor(g, "blk.30.ffn_down.weight") == NULL);
    sd_gguf_close(&g);
    printf("%s: %d failures\n", path, bad);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--model") == 0) return run_model_test();
    sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metadata_roundtrip),  cmocka_unit_test(test_getter_type_checks),
        cmocka_unit_test(test_tensors_every_dtype), cmocka_unit_test(test_known_encodings),
        cmocka_unit_test(test_k_quant_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
