/* test_gguf_corrupt.c — the reader rejects every kind of broken GGUF cleanly.
 *
 * A small valid file is hand-encoded in memory (recording where each field
 * lies); each case copies it into a buffer of exactly the file's size (so
 * AddressSanitizer sees any read past the end), breaks one thing, and checks
 * that sd_gguf_open_memory fails with the expected status and a message
 * containing the expected text — never a crash, a leak or a bogus success.
 * Truncation is tried at every byte. The valid file is checked to open first,
 * so a reader that rejected everything would fail here. K-quant files: a
 * row that is not whole super-blocks, a super-block cut off by the end of the
 * file, and a NaN or infinite super-block scale (refused at load). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_testbuf.h"
#include "specd/gguf.h"
#include "specd/weights.h"

/* Where the fields of the base file lie. */
typedef struct layout {
    size_t version, n_tensors, n_kv;
    size_t first_key_len;
    size_t align_type, align_value;
    size_t arr_type, arr_elem_type, arr_len;
    size_t str_key, str_len; /* "test.str" key text, value length */
    size_t nested_len;
    size_t end_of_kv, end_of_infos, data_start;
    struct {
        size_t name, n_dims, ne[2], type, offset;
    } t[3];
} layout;

static tbuf base;
static layout L;

/* a: F32 [32, 2] at 0 (256 B); b: Q8_0 [64] at 256 (68 B); c: Q4_1 [32] at 352 (20 B). */
static void build_base(void) {
    tbuf *b = &base;
    tb_put(b, "GGUF", 4);
    L.version = tb_u32(b, 3);
    L.n_tensors = tb_u64(b, 3);
    L.n_kv = tb_u64(b, 5);
    L.first_key_len = b->n;
    tb_key(b, "general.architecture", SD_GGUF_TYPE_STRING);
    tb_str(b, "llama");
    L.align_type = tb_key(b, "general.alignment", SD_GGUF_TYPE_UINT32);
    L.align_value = tb_u32(b, 32);
    L.arr_type = tb_key(b, "test.arr", SD_GGUF_TYPE_ARRAY);
    L.arr_elem_type = tb_u32(b, SD_GGUF_TYPE_UINT32);
    L.arr_len = tb_u64(b, 3);
    tb_u32(b, 1);
    tb_u32(b, 2);
    tb_u32(b, 3);
    L.str_key = tb_str(b, "test.str") + 8;
    tb_u32(b, SD_GGUF_TYPE_STRING);
    L.str_len = tb_str(b, "value");
    tb_key(b, "test.nested", SD_GGUF_TYPE_ARRAY);
    tb_u32(b, SD_GGUF_TYPE_ARRAY);
    L.nested_len = tb_u64(b, 2);
    tb_u32(b, SD_GGUF_TYPE_UINT8);
    tb_u64(b, 2);
    tb_u8(b, 1);
    tb_u8(b, 2);
    tb_u32(b, SD_GGUF_TYPE_STRING);
    tb_u64(b, 1);
    tb_str(b, "s");
    L.end_of_kv = b->n;
    static const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[2];
        uint32_t type;
        uint64_t off;
    } infos[3] = {
        {"a", 2, {32, 2}, SD_DTYPE_F32, 0},
        {"b", 1, {64, 0}, SD_DTYPE_Q8_0, 256},
        {"c", 1, {32, 0}, SD_DTYPE_Q4_1, 352},
    };
    for (int i = 0; i < 3; i++) {
        L.t[i].name = tb_str(b, infos[i].name) + 8;
        L.t[i].n_dims = tb_u32(b, infos[i].n_dims);
        for (uint32_t d = 0; d < infos[i].n_dims; d++) L.t[i].ne[d] = tb_u64(b, infos[i].ne[d]);
        L.t[i].type = tb_u32(b, infos[i].type);
        L.t[i].offset = tb_u64(b, infos[i].off);
    }
    L.end_of_infos = b->n;
    tb_pad(b, 32);
    L.data_start = b->n;
    for (size_t i = 0; i < 352 + 20; i++) tb_u8(b, (uint8_t)(i * 7)); /* any bytes are valid data here */
}

/* Opens a private copy of bytes [0, size) and returns the status; err gets the message. */
static sd_status open_copy(const uint8_t *bytes, size_t size, char *err, size_t err_len) {
    uint8_t *copy = malloc(size ? size : 1);
    assert_non_null(copy);
    memcpy(copy, bytes, size);
    sd_gguf *g = NULL;
    sd_status s = sd_gguf_open_memory(copy, size, &g, err, err_len);
    if (s == SD_OK) {
        /* Touch everything a caller could, so ASan checks it. */
        for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
            const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
            volatile uint8_t sink = 0;
            for (uint64_t j = 0; j < t->n_bytes; j++) sink ^= ((const uint8_t *)t->data)[j];
            (void)sink;
        }
        sd_gguf_close(&g);
    } else {
        assert_null(g);
    }
    free(copy);
    return s;
}

static void expect(const tbuf *b, sd_status want, const char *substr) {
    char err[512];
    sd_status s = open_copy(b->p, b->n, err, sizeof err);
    if (s != want) fail_msg("expected %s (%s), got %s: %s", sd_status_str(want), substr, sd_status_str(s), err);
    if (!strstr(err, substr)) fail_msg("message '%s' lacks '%s'", err, substr);
}

/* A modified copy of the base file. */
static tbuf mutant(void) {
    tbuf b = {0};
    tb_put(&b, base.p, base.n);
    return b;
}

static void test_base_is_valid(void **state) {
    (void)state;
    char err[256];
    assert_int_equal(open_copy(base.p, base.n, err, sizeof err), SD_OK);
    sd_gguf *g = NULL;
    assert_int_equal(sd_gguf_open_memory(base.p, base.n, &g, err, sizeof err), SD_OK);
    assert_int_equal(sd_gguf_n_kv(g), 5);
    assert_int_equal(sd_gguf_n_tensors(g), 3);
    const sd_gguf_tensor *c = sd_gguf_find_tensor(g, "c");
    assert_non_null(c);
    assert_ptr_equal(c->data, base.p + L.data_start + 352);
    sd_gguf_close(&g);
    /* Version 2 is the same layout and is accepted. */
    tbuf b = mutant();
    tb_set_u32(&b, L.version, 2);
    assert_int_equal(open_copy(b.p, b.n, err, sizeof err), SD_OK);
    tb_free(&b);
}

static void test_truncated_everywhere(void **state) {
    (void)state;
    char err[512];
    for (size_t cut = 0; cut < base.n; cut++) {
        sd_status s = open_copy(base.p, cut, err, sizeof err);
        if (s != SD_ERR_FORMAT) fail_msg("cut at %zu: status %s", cut, sd_status_str(s));
        if (cut < 24) {
            if (!strstr(err, "truncated file")) fail_msg("cut at %zu (header): '%s'", cut, err);
        } else if (cut < L.end_of_infos) {
            if (!strstr(err, "truncated file") && !strstr(err, "extends past end of file") && !strstr(err, "exceeds"))
                fail_msg("cut at %zu (metadata/tensor infos): '%s'", cut, err);
        } else if (!strstr(err, "data [") || !strstr(err, "extends past end of file")) {
            fail_msg("cut at %zu (data): '%s'", cut, err);
        }
    }
}

static void test_header(void **state) {
    (void)state;
    tbuf b = mutant();
    b.p[0] = 'X';
    expect(&b, SD_ERR_FORMAT, "bad magic");
    tb_free(&b);
    const struct {
        uint32_t v;
        sd_status s;
        const char *msg;
    } versions[] = {
        {1, SD_ERR_UNSUPPORTED, "GGUF version 1 is not supported"},
        {4, SD_ERR_UNSUPPORTED, "GGUF version 4 is newer than supported"},
        {0, SD_ERR_FORMAT, "bad version 0"},
    };
    for (size_t i = 0; i < 3; i++) {
        b = mutant();
        tb_set_u32(&b, L.version, versions[i].v);
        expect(&b, versions[i].s, versions[i].msg);
        tb_free(&b);
    }
    const uint64_t huge[] = {UINT64_MAX, 1ull << 62, 100000};
    for (size_t i = 0; i < 3; i++) {
        b = mutant();
        tb_set_u64(&b, L.n_kv, huge[i]);
        expect(&b, SD_ERR_FORMAT, "metadata count");
        tb_free(&b);
        b = mutant();
        tb_set_u64(&b, L.n_tensors, huge[i]);
        expect(&b, SD_ERR_FORMAT, "tensor count");
        tb_free(&b);
    }
}

static void test_metadata(void **state) {
    (void)state;
    tbuf b = mutant();
    tb_set_u64(&b, L.first_key_len, UINT64_MAX - 3);
    expect(&b, SD_ERR_FORMAT, "metadata key: string length");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.str_len, UINT64_MAX);
    expect(&b, SD_ERR_FORMAT, "string value: string length 18446744073709551615");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.arr_len, UINT64_MAX);
    expect(&b, SD_ERR_FORMAT, "key 'test.arr': array length 18446744073709551615 exceeds");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.arr_len, (1ull << 62) + 1); /* * 4 bytes wraps to 4 */
    expect(&b, SD_ERR_FORMAT, "key 'test.arr': array length 4611686018427387905 exceeds");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.nested_len, 1ull << 40);
    expect(&b, SD_ERR_FORMAT, "key 'test.nested': array length");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.arr_type, 13);
    expect(&b, SD_ERR_FORMAT, "key 'test.arr': bad value type id 13");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.arr_type, UINT32_MAX);
    expect(&b, SD_ERR_FORMAT, "key 'test.arr': bad value type id 4294967295");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.arr_elem_type, 77);
    expect(&b, SD_ERR_FORMAT, "key 'test.arr': bad array element type id 77");
    tb_free(&b);
    b = mutant();
    memcpy(b.p + L.str_key, "test.arr", 8);
    expect(&b, SD_ERR_FORMAT, "duplicate key 'test.arr'");
    tb_free(&b);
    b = mutant();
    b.p[L.str_key + 4] = 0;
    expect(&b, SD_ERR_FORMAT, "metadata key at offset");
    tb_free(&b);
    const uint32_t bad_align[] = {0, 3, 48};
    for (size_t i = 0; i < 3; i++) {
        char msg[64];
        snprintf(msg, sizeof msg, "general.alignment %u is not a power of two", bad_align[i]);
        b = mutant();
        tb_set_u32(&b, L.align_value, bad_align[i]);
        expect(&b, SD_ERR_FORMAT, msg);
        tb_free(&b);
    }
    b = mutant();
    tb_set_u32(&b, L.align_type, SD_GGUF_TYPE_INT32);
    expect(&b, SD_ERR_FORMAT, "general.alignment must be a uint32");
    tb_free(&b);
}

/* A file whose only key is an array nested depth levels deep (innermost: empty u8 array). */
static void build_nested(tbuf *b, int depth) {
    tb_put(b, "GGUF", 4);
    tb_u32(b, 3);
    tb_u64(b, 0);
    tb_u64(b, 1);
    tb_key(b, "deep", SD_GGUF_TYPE_ARRAY);
    for (int d = 1; d < depth; d++) {
        tb_u32(b, SD_GGUF_TYPE_ARRAY);
        tb_u64(b, 1);
    }
    tb_u32(b, SD_GGUF_TYPE_UINT8);
    tb_u64(b, 0);
}

static void test_nesting_limit(void **state) {
    (void)state;
    char err[256];
    tbuf b = {0};
    build_nested(&b, 8);
    assert_int_equal(open_copy(b.p, b.n, err, sizeof err), SD_OK);
    tb_free(&b);
    build_nested(&b, 9);
    expect(&b, SD_ERR_FORMAT, "key 'deep': arrays nested deeper than 8");
    tb_free(&b);
    build_nested(&b, 100000);
    expect(&b, SD_ERR_FORMAT, "key 'deep': arrays nested deeper than 8");
    tb_free(&b);
}

static void test_tensor_infos(void **state) {
    (void)state;
    tbuf b = mutant();
    tb_set_u32(&b, L.t[0].n_dims, 0);
    expect(&b, SD_ERR_FORMAT, "tensor 'a': n_dims 0 outside 1..4");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.t[0].n_dims, 5);
    expect(&b, SD_ERR_FORMAT, "tensor 'a': n_dims 5 outside 1..4");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[0].ne[1], 0);
    expect(&b, SD_ERR_FORMAT, "tensor 'a': ne[1] is 0");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[1].ne[0], 48);
    expect(&b, SD_ERR_FORMAT, "tensor 'b': ne[0]=48 is not a multiple of the Q8_0 block size 32");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[0].ne[1], 1ull << 62);
    expect(&b, SD_ERR_FORMAT, "tensor 'a': element count overflows");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[0].ne[1], 1ull << 58); /* 2^63 elements fit, 2^65 bytes do not */
    expect(&b, SD_ERR_FORMAT, "tensor 'a': byte size overflows");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[0].ne[1], 1ull << 40);
    expect(&b, SD_ERR_FORMAT, "tensor 'a': data [");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.t[2].type, 0xffff);
    expect(&b, SD_ERR_FORMAT, "tensor 'c': bad tensor type id 65535");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.t[2].type, 10); /* Q2_K: real, but not ours */
    expect(&b, SD_ERR_UNSUPPORTED, "tensor 'c': tensor type id 10 (Q2_K) is not supported; specd reads F32");
    tb_free(&b);
    /* K-quants: rows of whole 256-element super-blocks, all of them in the file */
    b = mutant();
    tb_set_u32(&b, L.t[2].type, SD_DTYPE_Q4_K);
    expect(&b, SD_ERR_FORMAT, "tensor 'c': ne[0]=32 is not a multiple of the Q4_K block size 256");
    tb_free(&b);
    b = mutant();
    tb_set_u32(&b, L.t[0].type, SD_DTYPE_Q6_K);
    expect(&b, SD_ERR_FORMAT, "tensor 'a': ne[0]=32 is not a multiple of the Q6_K block size 256");
    tb_free(&b);
    const struct {
        sd_dtype type;
        size_t bytes;
    } ks[] = {{SD_DTYPE_Q4_K, 144}, {SD_DTYPE_Q5_K, 176}, {SD_DTYPE_Q6_K, 210}};
    for (int k = 0; k < 3; k++) { /* c as one super-block: it runs past the end of the file */
        b = mutant();
        tb_set_u32(&b, L.t[2].type, ks[k].type);
        tb_set_u64(&b, L.t[2].ne[0], 256);
        char kmsg[128];
        snprintf(kmsg, sizeof kmsg, "tensor 'c': data [%zu, %zu) extends past end of file (size %zu)",
                 L.data_start + 352, L.data_start + 352 + ks[k].bytes, base.n);
        expect(&b, SD_ERR_FORMAT, kmsg);
        tb_free(&b);
    }
    b = mutant();
    tb_set_u64(&b, L.t[1].offset, 260);
    expect(&b, SD_ERR_FORMAT, "tensor 'b': offset 260 is not a multiple of the alignment 32");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[2].offset, 384);
    char msg[128];
    snprintf(msg, sizeof msg, "tensor 'c': data [%zu, %zu) extends past end of file (size %zu)", L.data_start + 384,
             L.data_start + 404, base.n);
    expect(&b, SD_ERR_FORMAT, msg);
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[2].offset, UINT64_MAX - 31);
    expect(&b, SD_ERR_FORMAT, "tensor 'c': data offset 18446744073709551584 overflows");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[1].offset, 224); /* b [224, 292) overlaps a [0, 256) */
    expect(&b, SD_ERR_FORMAT, "tensors 'a' and 'b' overlap");
    tb_free(&b);
    b = mutant();
    tb_set_u64(&b, L.t[2].offset, 288); /* c [288, 308) overlaps b [256, 324) */
    expect(&b, SD_ERR_FORMAT, "tensors 'b' and 'c' overlap");
    tb_free(&b);
    b = mutant();
    b.p[L.t[1].name] = 'a';
    expect(&b, SD_ERR_FORMAT, "duplicate tensor name 'a'");
    tb_free(&b);
    b = mutant();
    b.p[L.t[1].name] = 0;
    expect(&b, SD_ERR_FORMAT, "tensor name at offset");
    tb_free(&b);
}

typedef struct log_capture {
    char text[1024];
} log_capture;

static void capture(sd_log_level level, const char *line, void *user) {
    (void)level;
    log_capture *c = user;
    size_t n = strlen(c->text);
    snprintf(c->text + n, sizeof c->text - n, "%s\n", line);
}

/* A K-quant super-block whose f16 scale d or dmin is NaN or infinite is
 * refused at load with its own message, by the f32 read and the stored read,
 * naming the row and the super-block's columns. */
static void test_k_bad_scales(void **state) {
    (void)state;
    const struct {
        sd_dtype type;
        size_t scale_off; /* bytes into the super-block */
        uint16_t bits;
    } cases[] = {
        {SD_DTYPE_Q4_K, 0, 0x7e00},   /* d NaN */
        {SD_DTYPE_Q4_K, 2, 0x7c00},   /* dmin +inf */
        {SD_DTYPE_Q5_K, 2, 0xfc00},   /* dmin -inf */
        {SD_DTYPE_Q6_K, 208, 0x7e01}, /* d NaN */
    };
    float x[512 * 3];
    for (size_t i = 0; i < 512 * 3; i++) x[i] = (float)((int)(i * 37 % 101) - 50) / 64.0f;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t be, bb;
        assert_true(sd_dtype_block(cases[c].type, &be, &bb));
        uint8_t q[6 * 210];
        assert_int_equal(sd_quantize(cases[c].type, x, 512 * 3, q), SD_OK);
        assert_int_equal(sd_dtype_first_bad_scale(cases[c].type, q, 6), -1);
        memcpy(q + 3 * bb + cases[c].scale_off, &cases[c].bits, 2); /* row 1, second super-block */
        assert_int_equal(sd_dtype_first_bad_scale(cases[c].type, q, 6), 3);
        sd_gguf_writer *w = sd_gguf_writer_new();
        assert_non_null(w);
        assert_int_equal(sd_gguf_writer_set_str(w, "general.architecture", "llama"), SD_OK);
        const uint64_t ne[2] = {512, 3};
        assert_int_equal(sd_gguf_writer_add_tensor(w, "m.weight", cases[c].type, 2, ne, q), SD_OK);
        char path[] = "/tmp/specd-kscale-XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(sd_gguf_writer_write(w, path), SD_OK);
        sd_gguf_writer_free(&w);
        char err[256];
        sd_gguf *g = NULL;
        assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK); /* the reader does not read data */
        sd_weights *src = NULL;
        assert_int_equal(sd_weights_from_gguf(g, &src), SD_OK);
        float out[512 * 3];
        uint8_t stored[6 * 210];
        log_capture cap = {{0}};
        sd_log_set(capture, &cap, SD_LOG_ERROR, NULL);
        assert_int_equal(sd_weights_read(src, "m.weight", 0, 1, 0, 512, out), SD_OK); /* row 0 is sound */
        assert_int_equal(sd_weights_read(src, "m.weight", 0, 3, 0, 512, out), SD_ERR_FORMAT);
        assert_int_equal(sd_weights_read_stored(src, "m.weight", 1, 2, 0, 512, stored, sizeof stored), SD_ERR_FORMAT);
        sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
        char want[160];
        snprintf(want, sizeof want, "m.weight: the %s super-block at row 1, columns [256, 512) has a NaN or infinite",
                 sd_dtype_name(cases[c].type));
        if (!strstr(cap.text, want)) fail_msg("log '%s' lacks '%s'", cap.text, want);
        sd_weights_close(&src);
        sd_gguf_close(&g);
        unlink(path);
    }
}

/* sd_dtype_first_non_finite, the load scan, against its oracle: dequantize
 * and look for the first value that is not finite. Random bytes, with
 * exponent bits forced full now and then, for every stored type; the scan
 * must give the first such element (block types: the start of its block). */
static void test_first_non_finite(void **state) {
    (void)state;
    const sd_dtype types[] = {SD_DTYPE_F32,  SD_DTYPE_F16,  SD_DTYPE_BF16, SD_DTYPE_Q8_0, SD_DTYPE_Q4_0, SD_DTYPE_Q4_1,
                              SD_DTYPE_Q5_0, SD_DTYPE_Q5_1, SD_DTYPE_Q4_K, SD_DTYPE_Q5_K, SD_DTYPE_Q6_K};
    enum { N = 1024 };
    static uint8_t raw[N * 4];
    static float out[N];
    uint64_t rng = 0x9e3779b97f4a7c15u;
    int hits = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        size_t be, bb;
        assert_true(sd_dtype_block(types[ti], &be, &bb));
        const size_t bytes = N / be * bb;
        for (int trial = 0; trial < 200; trial++) {
            for (size_t i = 0; i < bytes; i++) {
                rng = rng * 6364136223846793005u + 1442695040888963407u;
                raw[i] = (uint8_t)(rng >> 56);
            }
            /* random bytes are mostly finite for the 16-bit types' low
             * exponents, and mostly not for scales: clear the top exponent
             * bit of every 16-bit field, then set one in a random place */
            for (size_t i = 1; i < bytes; i += 2) raw[i] &= 0xbf;
            if (types[ti] == SD_DTYPE_F32)
                for (size_t i = 3; i < bytes; i += 4) raw[i] &= 0xbf;
            if (trial % 3) {
                rng = rng * 6364136223846793005u + 1442695040888963407u;
                size_t at = (size_t)(rng >> 33) % bytes;
                raw[at | 1] |= 0x7f; /* a 16-bit field's high byte: exponent full */
                if (types[ti] == SD_DTYPE_F32) raw[(at & ~(size_t)3) + 3] |= 0x7f, raw[(at & ~(size_t)3) + 2] |= 0x80;
                if (types[ti] == SD_DTYPE_BF16) raw[(at | 1) - 1] |= 0x80;
            }
            assert_int_equal(sd_dequantize(types[ti], raw, N, out), SD_OK);
            int64_t want = -1;
            for (int64_t i = 0; i < N && want < 0; i++)
                if (!isfinite(out[i])) want = i / (int64_t)be * (int64_t)be;
            const int64_t got = sd_dtype_first_non_finite(types[ti], raw, N);
            if (got != want) fail_msg("%s trial %d: first non-finite %lld, dequantized %lld", sd_dtype_name(types[ti]),
                                      trial, (long long)got, (long long)want);
            hits += want >= 0;
        }
    }
    assert_true(hits > 400); /* the poisoned trials were found (2 of 3 of 2200) */
}

static void test_open_errors(void **state) {
    (void)state;
    char err[256];
    sd_gguf *g = NULL;
    assert_int_equal(sd_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err), SD_ERR_IO);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(sd_gguf_open("/tmp", &g, err, sizeof err), SD_ERR_IO);
    assert_non_null(strstr(err, "not a regular file"));
    assert_int_equal(sd_gguf_open_memory(NULL, 0, &g, err, sizeof err), SD_ERR_FORMAT);
    assert_null(g);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
    build_base();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_is_valid), cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_header),        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_nesting_limit), cmocka_unit_test(test_tensor_infos),
        cmocka_unit_test(test_open_errors),   cmocka_unit_test(test_k_bad_scales),
        cmocka_unit_test(test_first_non_finite),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tb_free(&base);
    return rc;
}
