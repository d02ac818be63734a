/* tokenizer_spm.c — SentencePiece-style BPE (GGUF tokenizer model "llama").
 *
 * The model of Llama 2, Mistral, Gemma and Phi-3. A fragment of text (no
 * special token in it; tokenizer_encode.c has matched those) has each space
 * replaced by "▁" (U+2581), optionally gets a "▁" in front (add_space_prefix),
 * and is split into characters. Adjacent symbols merge while their
 * concatenation is a piece of the vocabulary:
 *  - GGUF (scores): the pair whose merged piece has the highest score first,
 *    the leftmost among equals (llama.cpp's llm_tokenizer_spm). Scores are
 *    turned into dense ranks once at build time so the heap compares ints;
 *  - tokenizer.json (a merge list): the pair with the lowest merge rank
 *    first, as Hugging Face's BPE model does.
 * A symbol left that is not a piece (a character outside the vocabulary)
 * becomes its bytes' <0xNN> tokens (byte fallback), or the unknown token
 * where the vocabulary has no byte token. Control tokens are never produced
 * by merging or lookup, so text can only become a control token through the
 * special-token matcher, which the caller controls.
 *
 * The same heap of (rank, position) candidates as byte-level BPE, with stale
 * entries detected by the symbols' byte lengths (a symbol only grows): a
 * fragment of n characters costs O(n log n) hash lookups, whatever the
 * vocabulary size. Where the vocabulary shows that no merge can cross the
 * gap before a "▁" (joins_mark), the fragment is merged word by word: the
 * same result, but a 200 KB paragraph no longer drives one heap of 200k
 * entries out of cache (0.5 -> several MB/s). Splitting characters follows
 * llama.cpp: the length comes from the lead byte alone, so invalid UTF-8
 * still tokenizes (as bytes).
 *
 * Not reproduced: decoding keeps the space that the space prefix put before
 * the first word (HF's Strip decoder and llama.cpp's detokenizer drop it);
 * generated text, which follows the prompt, is not affected. */
#include "tokenizer_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char SPACE_MARK[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* "▁" U+2581 */

/* The byte of a "<0xNN>" token text, or -1. */
static int byte_of_text(sd_tok_text tx) {
    if (tx.len != 6 || memcmp(tx.ptr, "<0x", 3) != 0 || tx.ptr[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char ch = tx.ptr[i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                         : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

size_t sd_tok_spm_piece(sd_tok_text tx, int32_t type, char *out) {
    if (type == SD_TOK_TYPE_BYTE) {
        int b = byte_of_text(tx);
        if (b >= 0) {
            out[0] = (char)b;
            return 1;
        }
    }
    if (type == SD_TOK_TYPE_CONTROL || type == SD_TOK_TYPE_USER_DEFINED || type == SD_TOK_TYPE_UNKNOWN ||
        type == SD_TOK_TYPE_BYTE) {
        if (tx.len) memcpy(out, tx.ptr, tx.len);
        return tx.len;
    }
    size_t n = 0;
    for (size_t i = 0; i < tx.len;) {
        if (tx.len - i >= 3 && memcmp(tx.ptr + i, SPACE_MARK, 3) == 0) {
            out[n++] = ' ';
            i += 3;
        } else {
            out[n++] = tx.ptr[i++];
        }
    }
    return n;
}

static int cmp_score(const void *a, const void *b, void *ctx) {
    const float *score = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (score[ia] != score[ib]) return score[ia] > score[ib] ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

static sd_status build_score_ranks(sd_tok *t, const float *scores) {
    size_t n = (size_t)t->n_vocab;
    for (size_t i = 0; i < n; i++) {
        if (isnan(scores[i])) {
            SD_ERROR("tokenizer: token %zu has a NaN score", i);
            return SD_ERR_FORMAT;
        }
    }
    int32_t *order = malloc(n * sizeof *order);
    t->score_rank = malloc(n * sizeof *t->score_rank);
    if (!order || !t->score_rank) {
        free(order);
        return SD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) order[i] = (int32_t)i;
    qsort_r(order, n, sizeof *order, cmp_score, (void *)scores);
    int32_t rank = 0;
    for (size_t k = 0; k < n; k++) {
        if (k > 0 && scores[order[k]] != scores[order[k - 1]]) rank++;
        t->score_rank[order[k]] = rank;
    }
    free(order);
    return SD_OK;
}

sd_status sd_tok_spm_build(sd_tok *t, const sd_tok_spec *spec) {
    int n_missing = 0;
    for (int b = 0; b < 256; b++) {
        char name[7];
        static const char hex[] = "0123456789ABCDEF";
        memcpy(name, "<0x", 3);
        name[3] = hex[b >> 4];
        name[4] = hex[b & 15];
        name[5] = '>';
        int32_t id = sd_tok_lookup_text(t, name, 6);
        if (id < 0 && b < 0x80) { /* llama.cpp's fallback: the byte as a one-byte piece */
            char one = (char)b;
            id = sd_tok_lookup_text(t, &one, 1);
        }
        if (id < 0) {
            if (t->unk < 0) {
                SD_ERROR("tokenizer: SentencePiece vocabulary has no token for byte 0x%02X and no unknown token", b);
                return SD_ERR_FORMAT;
            }
            id = t->unk;
            n_missing++;
        }
        t->byte_token[b] = id;
    }
    if (n_missing) SD_DEBUG("tokenizer: %d bytes have no <0xNN> token and encode as unknown", n_missing);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->types[id] == SD_TOK_TYPE_CONTROL) continue;
        size_t len;
        const char *txt = sd_tok_text_of(t, id, &len);
        for (const char *p = len > 3 ? memmem(txt + 1, len - 1, SPACE_MARK, 3) : NULL; p;
             p = (size_t)(txt + len - p) > 3 ? memmem(p + 1, (size_t)(txt + len - p - 1), SPACE_MARK, 3) : NULL)
            t->joins_mark[(unsigned char)p[-1]] = true;
    }
    if (spec->scores) return build_score_ranks(t, spec->scores);
    return SD_OK;
}

/* ---- encoding ---- */

/* Pushes the candidate merge of adjacent symbols l and r, if their
 * concatenation may be formed. syms[i].id holds symbol i's byte length. */
static sd_status try_pair(enc_ctx *c, int32_t l, int32_t r) {
    const sd_tok *t = c->t;
    const char *s = c->symtext + c->sym_start[l];
    int32_t ll = c->syms[l].id, rl = c->syms[r].id;
    int32_t rank, result;
    if (t->score_rank) {
        result = sd_tok_lookup_text(t, s, (size_t)ll + (size_t)rl);
        if (result < 0 || t->types[result] == SD_TOK_TYPE_CONTROL) return SD_OK;
        rank = t->score_rank[result];
    } else {
        int32_t left = sd_tok_lookup_text(t, s, (size_t)ll), right = sd_tok_lookup_text(t, s + ll, (size_t)rl);
        if (left < 0 || right < 0) return SD_OK;
        const merge_slot *m = sd_tok_lookup_merge(t, left, right);
        if (!m || t->types[m->result] == SD_TOK_TYPE_CONTROL) return SD_OK;
        rank = m->rank;
        result = m->result;
    }
    return sd_tok_heap_push(c, (bpe_cand){rank, l, r, ll, rl, result});
}

/* Escapes s[0..len) into c->symtext ("▁" for each space, one in front when
 * prefix) and splits it into character symbols; returns their count. */
static sd_status split_symbols(enc_ctx *c, const char *s, size_t len, bool prefix, size_t *n_syms) {
    size_t n_space = 0;
    for (size_t i = 0; i < len; i++) n_space += s[i] == ' ';
    size_t esc_len = len + 2 * n_space + (prefix ? 3 : 0);
    if (len > (size_t)INT32_MAX / 4) return SD_ERR_RANGE;
    SD_TRY(sd_tok_grow((void **)&c->symtext, &c->cap_symtext, esc_len, 1));
    size_t at = 0;
    if (prefix) {
        memcpy(c->symtext, SPACE_MARK, 3);
        at = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(c->symtext + at, SPACE_MARK, 3);
            at += 3;
        } else {
            c->symtext[at++] = s[i];
        }
    }
    SD_TRY(sd_tok_grow((void **)&c->syms, &c->cap_syms, esc_len, sizeof *c->syms));
    SD_TRY(sd_tok_grow((void **)&c->sym_start, &c->cap_sym_start, esc_len, sizeof *c->sym_start));
    static const uint8_t lead_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t n = 0;
    for (size_t off = 0; off < esc_len; n++) {
        size_t cl = lead_len[(unsigned char)c->symtext[off] >> 4];
        if (cl > esc_len - off) cl = esc_len - off;
        c->sym_start[n] = (int32_t)off;
        c->syms[n] = (bpe_sym){(int32_t)cl, (int32_t)n - 1, -1};
        if (n) c->syms[n - 1].next = (int32_t)n;
        off += cl;
    }
    *n_syms = n;
    return SD_OK;
}

/* Merges symbols [a, b), linked among themselves, until no pair merges. */
static sd_status merge_range(enc_ctx *c, int32_t a, int32_t b) {
    c->n_heap = 0;
    for (int32_t i = a; i + 1 < b; i++) SD_TRY(try_pair(c, i, i + 1));
    while (c->n_heap) {
        bpe_cand m = sd_tok_heap_pop(c);
        bpe_sym *l = &c->syms[m.pos], *r = &c->syms[m.right_pos];
        if (l->id != m.left || l->next != m.right_pos || r->id != m.right) continue; /* stale */
        l->id += r->id;
        l->next = r->next;
        if (r->next >= 0) c->syms[r->next].prev = m.pos;
        r->id = -1;
        if (l->prev >= 0) SD_TRY(try_pair(c, l->prev, m.pos));
        if (c->syms[m.pos].next >= 0) SD_TRY(try_pair(c, m.pos, c->syms[m.pos].next));
    }
    return SD_OK;
}

/* True when no merge can join symbol i - 1 and symbol i: i is a "▁" whose
 * preceding byte never precedes a "▁" inside a token (see joins_mark). */
static bool word_starts_at(const enc_ctx *c, int32_t i) {
    const char *s = c->symtext + c->sym_start[i];
    return c->syms[i].id == 3 && memcmp(s, SPACE_MARK, 3) == 0 && !c->t->joins_mark[(unsigned char)s[-1]];
}

sd_status sd_tok_spm_fragment(enc_ctx *c, const char *s, size_t len, bool prefix) {
    const sd_tok *t = c->t;
    if (len == 0) return SD_OK;
    size_t n;
    SD_TRY(split_symbols(c, s, len, prefix, &n));
    /* Word by word where no merge can cross: the same result as one heap
     * over the fragment, with a heap that stays in cache. */
    int32_t a = 0;
    for (int32_t i = 1; i <= (int32_t)n; i++) {
        if (i < (int32_t)n && !word_starts_at(c, i)) continue;
        c->syms[i - 1].next = -1;
        if (i < (int32_t)n) c->syms[i].prev = -1;
        SD_TRY(merge_range(c, a, i));
        a = i;
    }
    for (size_t i = 0; i < n; i++) {
        if (c->syms[i].id < 0) continue; /* merged into its left neighbour */
        const char *sym = c->symtext + c->sym_start[i];
        size_t sl = (size_t)c->syms[i].id;
        int32_t id = sd_tok_lookup_text(t, sym, sl);
        if (id >= 0 && t->types[id] != SD_TOK_TYPE_CONTROL) {
            SD_TRY(sd_tok_push_id(c, id));
            continue;
        }
        for (size_t k = 0; k < sl; k++) SD_TRY(sd_tok_push_id(c, t->byte_token[(unsigned char)sym[k]]));
    }
    return SD_OK;
}
