/* chat_buf.c — the chat formatter's output buffer: the formatted text and,
 * when tracked, which of its bytes are user content (chat_impl.h). */
#include "chat_impl.h"

#include <stdlib.h>
#include <string.h>

void sd_sb_addn(strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    size_t need;
    if (!sd_add_ok(b->len, n, &need) || !sd_add_ok(need, 1, &need)) {
        b->failed = true;
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) {
            if (cap > SIZE_MAX / 2) {
                b->failed = true;
                return;
            }
            cap *= 2;
        }
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        if (b->track) {
            uint8_t *mk = realloc(b->mask, cap);
            if (!mk) {
                b->failed = true;
                return;
            }
            b->mask = mk;
        }
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    if (n && b->track) memset(b->mask + b->len, b->content ? 1 : 0, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sd_sb_add(strbuf *b, const char *s) { sd_sb_addn(b, s, strlen(s)); }

/* Appends user content (marked in the mask). */
void sd_sb_content(strbuf *b, const char *s, size_t n) {
    bool was = b->content;
    b->content = true;
    sd_sb_addn(b, s, n);
    b->content = was;
}

/* ---- Python's str.strip() (Jinja's trim filter): Unicode whitespace ---- */

/* Bytes of the whitespace character that starts at s (n bytes left), or 0. */
static size_t ws_at(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2; /* U+0085, U+00A0 */
    if (n >= 3) {
        if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3; /* U+1680 */
        if (s[0] == 0xe2 && s[1] == 0x80 &&
            ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
            return 3;                                               /* U+2000..200A, U+2028, U+2029, U+202F */
        if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3; /* U+205F */
        if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3; /* U+3000 */
    }
    return 0;
}

/* Bytes of the whitespace character that ends s (n bytes), or 0. */
static size_t ws_before(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (ws_at(s + n - k, k) == k) return k;
    return 0;
}

/* Appends user content s (n bytes) with leading and trailing whitespace removed. */
void sd_sb_content_stripped(strbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k;
    while (n > 0 && (k = ws_at(u, n)) > 0) u += k, n -= k;
    while (n > 0 && (k = ws_before(u, n)) > 0) n -= k;
    sd_sb_content(b, (const char *)u, n);
}
