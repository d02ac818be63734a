/* tokenizer_decode.c — decoding token ids to bytes, whole or streamed.
 *
 * Every token's bytes are precomputed at build time (sd_tok_piece), so
 * decoding is concatenation. The streaming decoder holds back the bytes of
 * an unfinished UTF-8 character so a stream never emits half a character;
 * SentencePiece byte-fallback tokens (<0xE4><0xB8><0xAD>) go through the same
 * path, one byte each. */
#include "tokenizer_core.h"

#include <stdlib.h>
#include <string.h>

/* ---- decoding ---- */
sd_status sd_tok_decode(const sd_tok *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    if (!t || (!ids && n) || !text) return SD_ERR_INVALID_ARG;
    *text = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        if (!sd_tok_piece(t, ids[i], &l)) {
            SD_ERROR("tokenizer: decode: token id %d at %zu is out of range", ids[i], i);
            return SD_ERR_RANGE;
        }
        if (!sd_add_ok(total, l, &total)) return SD_ERR_RANGE;
    }
    char *out = malloc(total + 1);
    if (!out) return SD_ERR_NOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = sd_tok_piece(t, ids[i], &l);
        memcpy(out + at, p, l);
        at += l;
    }
    out[at] = '\0';
    *text = out;
    if (len) *len = at;
    return SD_OK;
}

/* ---- streaming decoder ----
 * Holds at most 3 bytes: the valid start of a character whose remaining bytes
 * have not arrived yet. Everything else is emitted as soon as it is known:
 * complete characters as they are, each invalid maximal subpart as U+FFFD. */
struct sd_tok_stream {
    const sd_tok *t;
    unsigned char pending[4];
    size_t n_pending;
};

sd_tok_stream *sd_tok_stream_new(const sd_tok *t) {
    if (!t) return NULL;
    sd_tok_stream *s = calloc(1, sizeof *s);
    if (s) s->t = t;
    return s;
}

void sd_tok_stream_free(sd_tok_stream **s) {
    if (!s || !*s) return;
    free(*s);
    *s = NULL;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static bool out_put(char *out, size_t cap, size_t *at, const void *p, size_t n) {
    if (n > cap - *at) return false;
    memcpy(out + *at, p, n);
    *at += n;
    return true;
}

sd_status sd_tok_stream_push(sd_tok_stream *s, int32_t id, char *out, size_t cap, size_t *out_len) {
    if (!s || (!out && cap) || !out_len) return SD_ERR_INVALID_ARG;
    *out_len = 0;
    size_t plen;
    const unsigned char *piece = (const unsigned char *)sd_tok_piece(s->t, id, &plen);
    if (!piece) return SD_ERR_RANGE;
    size_t at = 0, k = 0; /* k: bytes of piece consumed */
    unsigned char pending[4];
    size_t n_pending = s->n_pending;
    memcpy(pending, s->pending, sizeof pending);
    if (n_pending) {
        /* Finish (or break) the held-back character with the piece's first bytes. */
        unsigned char head[8];
        size_t take = plen < 4 ? plen : 4;
        memcpy(head, pending, n_pending);
        memcpy(head + n_pending, piece, take);
        uint32_t cp;
        int r = sd_tok_utf8_scan(head, n_pending + take, &cp);
        if (r == 0) {
            memcpy(pending + n_pending, piece, plen); /* still unfinished: plen < 4 - n_pending */
            n_pending += plen;
            k = plen;
        } else if (r > 0) {
            if (!out_put(out, cap, &at, head, (size_t)r)) return SD_ERR_INVALID_ARG;
            k = (size_t)r - n_pending;
            n_pending = 0;
        } else {
            if (!out_put(out, cap, &at, REPLACEMENT, 3)) return SD_ERR_INVALID_ARG;
            k = (size_t)-r > n_pending ? (size_t)-r - n_pending : 0;
            n_pending = 0;
        }
    }
    while (k < plen) {
        uint32_t cp;
        int r = sd_tok_utf8_scan(piece + k, plen - k, &cp);
        if (r == 0) {
            n_pending = plen - k;
            memcpy(pending, piece + k, n_pending);
            break;
        }
        bool ok = r > 0 ? out_put(out, cap, &at, piece + k, (size_t)r) : out_put(out, cap, &at, REPLACEMENT, 3);
        if (!ok) return SD_ERR_INVALID_ARG;
        k += (size_t)(r > 0 ? r : -r);
    }
    memcpy(s->pending, pending, sizeof pending);
    s->n_pending = n_pending;
    *out_len = at;
    return SD_OK;
}

sd_status sd_tok_stream_flush(sd_tok_stream *s, char *out, size_t cap, size_t *out_len) {
    if (!s || (!out && cap) || !out_len) return SD_ERR_INVALID_ARG;
    *out_len = 0;
    if (!s->n_pending) return SD_OK;
    size_t at = 0;
    if (!out_put(out, cap, &at, REPLACEMENT, 3)) return SD_ERR_INVALID_ARG;
    s->n_pending = 0;
    *out_len = at;
    return SD_OK;
}
