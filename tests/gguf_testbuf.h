/* gguf_testbuf.h — a byte builder for hand-encoding GGUF files in tests.
 *
 * The writer can only produce well-formed files; tests of the reader need to
 * place every field themselves (nested arrays, every scalar type, corrupt
 * values), and to know where each field lies so they can change it. Each
 * put function returns the offset at which it wrote. Aborts on allocation
 * failure (tests only). */
#ifndef SPECD_TESTS_GGUF_TESTBUF_H
#define SPECD_TESTS_GGUF_TESTBUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct tbuf {
    uint8_t *p;
    size_t n, cap;
} tbuf;

static inline size_t tb_put(tbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    size_t at = b->n;
    if (n) memcpy(b->p + at, src, n);
    b->n += n;
    return at;
}

static inline size_t tb_u8(tbuf *b, uint8_t v) { return tb_put(b, &v, 1); }
static inline size_t tb_u16(tbuf *b, uint16_t v) { return tb_put(b, &v, 2); }
static inline size_t tb_u32(tbuf *b, uint32_t v) { return tb_put(b, &v, 4); }
static inline size_t tb_u64(tbuf *b, uint64_t v) { return tb_put(b, &v, 8); }
static inline size_t tb_f32(tbuf *b, float v) { return tb_put(b, &v, 4); }
static inline size_t tb_f64(tbuf *b, double v) { return tb_put(b, &v, 8); }

/* Length-prefixed string; returns the offset of the length field. */
static inline size_t tb_str(tbuf *b, const char *s) {
    size_t at = tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
    return at;
}

/* Key and value type id; returns the offset of the type id. */
static inline size_t tb_key(tbuf *b, const char *key, uint32_t type) {
    tb_str(b, key);
    return tb_u32(b, type);
}

static inline void tb_pad(tbuf *b, size_t align) {
    while (b->n % align) tb_u8(b, 0);
}

static inline void tb_set_u32(tbuf *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static inline void tb_set_u64(tbuf *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

static inline void tb_free(tbuf *b) {
    free(b->p);
    *b = (tbuf){0};
}

#endif
