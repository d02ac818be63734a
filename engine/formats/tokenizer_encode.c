/* tokenizer_encode.c — encoding: special tokens, pre-tokenizer, byte-level BPE.
 *
 * Text is first partitioned by special tokens (leftmost, longest first):
 * user-defined tokens are matched everywhere, as Hugging Face's added tokens
 * and llama.cpp are; control tokens only when the caller allows them and
 * never on a byte the user supplied. Each fragment between them goes to the
 * model's algorithm: byte-level BPE here, SentencePiece in tokenizer_spm.c.
 * The byte-level pre-tokenizer is a sequence of regexes; each splits every
 * piece the previous one produced, keeping matches and the gaps between
 * them ("isolated"), which is what Hugging Face's Split/ByteLevel/Digits do.
 * BPE merges one piece with a linked list of symbols and a binary heap of
 * candidate pairs ordered by (rank, position); stale heap entries are detected
 * by re-checking ids, so a piece of n bytes costs O(n log n). The naive
 * "rescan for the best pair after every merge" was rejected: it is quadratic
 * and a 100 KB word without spaces is a legal prompt. No cache is kept between
 * calls: every encode allocates its own workspace, so the tokenizer is
 * thread-safe without locks. */
#include "tokenizer_core.h"

#include <stdlib.h>
#include <string.h>

sd_status sd_tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return SD_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (!sd_mul_ok(nc, 2, &nc)) return SD_ERR_NOMEM;
    }
    size_t bytes;
    if (!sd_mul_ok(nc, elem, &bytes)) return SD_ERR_NOMEM;
    void *np = realloc(*p, bytes);
    if (!np) return SD_ERR_NOMEM;
    *p = np;
    *cap = nc;
    return SD_OK;
}

sd_status sd_tok_push_id(enc_ctx *c, int32_t id) {
    SD_TRY(sd_tok_grow((void **)&c->ids, &c->cap_ids, c->n_ids + 1, sizeof *c->ids));
    c->ids[c->n_ids++] = id;
    return SD_OK;
}

static bool cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

sd_status sd_tok_heap_push(enc_ctx *c, bpe_cand cand) {
    SD_TRY(sd_tok_grow((void **)&c->heap, &c->cap_heap, c->n_heap + 1, sizeof *c->heap));
    size_t i = c->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&cand, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = cand;
    return SD_OK;
}

static sd_status heap_push_pair(enc_ctx *c, int32_t l, int32_t r) {
    const merge_slot *m = sd_tok_lookup_merge(c->t, c->syms[l].id, c->syms[r].id);
    if (!m) return SD_OK;
    return sd_tok_heap_push(c, (bpe_cand){m->rank, l, r, c->syms[l].id, c->syms[r].id, m->result});
}

bpe_cand sd_tok_heap_pop(enc_ctx *c) {
    bpe_cand top = c->heap[0];
    bpe_cand last = c->heap[--c->n_heap];
    size_t i = 0, n = c->n_heap;
    for (;;) {
        size_t kid = 2 * i + 1;
        if (kid >= n) break;
        if (kid + 1 < n && cand_less(&c->heap[kid + 1], &c->heap[kid])) kid++;
        if (!cand_less(&c->heap[kid], &last)) break;
        c->heap[i] = c->heap[kid];
        i = kid;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* BPE over one pre-tokenized piece of raw bytes; appends its ids. */
static sd_status bpe_piece(enc_ctx *c, const unsigned char *s, size_t len) {
    const sd_tok *t = c->t;
    if (len == 1) return sd_tok_push_id(c, t->byte_token[s[0]]);
    if (len > (size_t)INT32_MAX / 4) return SD_ERR_RANGE;
    if (t->ignore_merges) {
        SD_TRY(sd_tok_grow((void **)&c->symtext, &c->cap_symtext, 2 * len, 1));
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            memcpy(c->symtext + n, t->byte_sym[s[i]], t->byte_sym_len[s[i]]);
            n += t->byte_sym_len[s[i]];
        }
        int32_t whole = sd_tok_lookup_text(t, c->symtext, n);
        if (whole >= 0) return sd_tok_push_id(c, whole);
    }
    SD_TRY(sd_tok_grow((void **)&c->syms, &c->cap_syms, len, sizeof *c->syms));
    for (size_t i = 0; i < len; i++)
        c->syms[i] = (bpe_sym){t->byte_token[s[i]], (int32_t)i - 1, i + 1 < len ? (int32_t)i + 1 : -1};
    c->n_heap = 0;
    for (size_t i = 0; i + 1 < len; i++) SD_TRY(heap_push_pair(c, (int32_t)i, (int32_t)i + 1));
    while (c->n_heap) {
        bpe_cand m = sd_tok_heap_pop(c);
        bpe_sym *l = &c->syms[m.pos];
        /* Stale when either side has merged since: a symbol only ever grows,
         * so an unchanged id at an unchanged position means unchanged. */
        if (l->id != m.left || l->next != m.right_pos || c->syms[m.right_pos].id != m.right) continue;
        bpe_sym *r = &c->syms[m.right_pos];
        l->id = m.result;
        l->next = r->next;
        if (r->next >= 0) c->syms[r->next].prev = m.pos;
        r->id = -1;
        if (l->prev >= 0) SD_TRY(heap_push_pair(c, l->prev, m.pos));
        if (c->syms[m.pos].next >= 0) SD_TRY(heap_push_pair(c, m.pos, c->syms[m.pos].next));
    }
    for (int32_t i = 0; i >= 0; i = c->syms[i].next) SD_TRY(sd_tok_push_id(c, c->syms[i].id));
    return SD_OK;
}

/* Splits s[0..len) with pre-tokenizer regex `level`, passing every match and
 * every gap between matches on to the next level; the last level runs BPE. */
static sd_status pre_split(enc_ctx *c, int level, const char *s, size_t len) {
    if (len == 0) return SD_OK;
    if (level == c->t->n_pre_re) return bpe_piece(c, (const unsigned char *)s, len);
    const pcre2_code *re = c->t->pre_re[level];
    pcre2_match_data *md = c->md[level];
    size_t off = 0;
    while (off < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, off, 0, md, NULL);
        /* JIT runs on a small fixed stack; the interpreter's heap frames
         * take over for the rare match that needs more. */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(re, (PCRE2_SPTR)s, len, off, PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            SD_ERROR("tokenizer: pre-tokenizer match failed: %s", (const char *)msg);
            return SD_ERR_INTERNAL;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        if (end <= start || start < off || end > len) {
            SD_ERROR("tokenizer: pre-tokenizer produced an empty or misplaced match");
            return SD_ERR_INTERNAL;
        }
        SD_TRY(pre_split(c, level + 1, s + off, start - off));
        SD_TRY(pre_split(c, level + 1, s + start, end - start));
        off = end;
    }
    return pre_split(c, level + 1, s + off, len - off);
}

/* Longest special token starting at s[0..len): a user-defined one may run
 * to len, a control (or unknown-type) one only to ctl_len (0: none). -1 when
 * none matches. */
static int32_t match_special(const sd_tok *t, const unsigned char *s, size_t len, size_t ctl_len, size_t *match_len) {
    for (size_t k = t->lens_start[s[0]]; k < t->lens_start[s[0] + 1]; k++) { /* a big bucket: by length */
        size_t l = t->special_lens[k];
        if (l > len) continue;
        int32_t id = sd_tok_lookup_text(t, (const char *)s, l);
        if (id < 0 || l > (t->types[id] == SD_TOK_TYPE_USER_DEFINED ? len : ctl_len)) continue;
        if (t->types[id] != SD_TOK_TYPE_USER_DEFINED && t->types[id] != SD_TOK_TYPE_CONTROL &&
            t->types[id] != SD_TOK_TYPE_UNKNOWN)
            continue; /* the text belongs to an ordinary token (a duplicate) */
        *match_len = l;
        return id;
    }
    if (t->lens_start[s[0]] < t->lens_start[s[0] + 1]) return -1;
    for (size_t k = t->special_start[s[0]]; k < t->special_start[s[0] + 1]; k++) {
        int32_t id = t->special_ids[k];
        size_t l;
        const char *txt = sd_tok_text_of(t, id, &l);
        if (l > (t->types[id] == SD_TOK_TYPE_USER_DEFINED ? len : ctl_len)) continue;
        if (memcmp(txt, s, l) == 0) {
            *match_len = l;
            return id;
        }
    }
    return -1;
}

/* Encodes one fragment of text that holds no special token (so it starts
 * the text or follows one); off is where it starts in the whole text. */
static sd_status fragment(enc_ctx *c, const char *s, size_t len, size_t off) {
    if (len == 0) return SD_OK;
    if (c->t->algo == SD_TOK_ALGO_SPM) {
        sd_tok_space_prefix sp = c->t->space_prefix;
        bool prefix = sp == SD_TOK_SPACE_PREFIX_ALWAYS || (sp == SD_TOK_SPACE_PREFIX_META_ALWAYS && s[0] != ' ') ||
                      (sp == SD_TOK_SPACE_PREFIX_FIRST && off == 0 && s[0] != ' ');
        return sd_tok_spm_fragment(c, s, len, prefix);
    }
    return pre_split(c, 0, s, len);
}

/* End of the run of whitespace (Unicode White_Space, as Hugging Face's
 * char::is_whitespace) that starts at text[pos]. */
static size_t whitespace_end(const char *text, size_t len, size_t pos) {
    while (pos < len) {
        uint32_t cp = 0;
        int n = sd_tok_utf8_scan((const unsigned char *)text + pos, len - pos, &cp);
        if (n <= 0) break;
        bool ws = (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
                  (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
                  cp == 0x3000;
        if (!ws) break;
        pos += (size_t)n;
    }
    return pos;
}

/* Encodes text: user-defined tokens are matched everywhere; with
 * parse_special, control tokens are matched wherever a whole match lies in
 * bytes where no_special is 0 (no_special NULL: all). A token with rstrip
 * (Phi-3's) drops the whitespace after it up to the next special token, as
 * Hugging Face does: a special token inside that whitespace still counts. */
static sd_status encode(enc_ctx *c, const char *text, size_t len, bool parse_special, const uint8_t *no_special) {
    for (int i = 0; i < c->t->n_pre_re; i++) {
        c->md[i] = pcre2_match_data_create_from_pattern(c->t->pre_re[i], NULL);
        if (!c->md[i]) return SD_ERR_NOMEM;
    }
    size_t seg = 0;
    size_t markup_end = 0; /* markup (no_special 0) runs from pos to markup_end */
    size_t strip_end = 0;  /* after an rstrip token: the text up to here is dropped */
    for (size_t pos = 0; pos < len && c->t->n_special;) {
        size_t ctl_len = 0;
        if (parse_special && !(no_special && no_special[pos])) {
            if (markup_end <= pos) {
                markup_end = pos;
                while (markup_end < len && !(no_special && no_special[markup_end])) markup_end++;
            }
            ctl_len = markup_end - pos;
        }
        size_t ml = 0;
        int32_t id = match_special(c->t, (const unsigned char *)text + pos, len - pos, ctl_len, &ml);
        if (id < 0) {
            pos++;
            continue;
        }
        if (strip_end > seg) seg = strip_end < pos ? strip_end : pos;
        SD_TRY(fragment(c, text + seg, pos - seg, seg));
        SD_TRY(sd_tok_push_id(c, id));
        pos += ml;
        seg = pos;
        strip_end = c->t->rstrip && c->t->rstrip[id] ? whitespace_end(text, len, pos) : 0;
    }
    if (strip_end > seg) seg = strip_end;
    return fragment(c, text + seg, len - seg, seg);
}

static sd_status encode_text(const sd_tok *t, const char *text, size_t len, bool parse_special,
                             const uint8_t *no_special, int32_t **ids, size_t *n_ids) {
    if (!t || (!text && len) || !ids || !n_ids) return SD_ERR_INVALID_ARG;
    *ids = NULL;
    *n_ids = 0;
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    sd_status st = encode(&c, text ? text : "", len, parse_special, no_special);
    for (int i = 0; i < t->n_pre_re; i++) pcre2_match_data_free(c.md[i]);
    free(c.syms);
    free(c.heap);
    free(c.symtext);
    free(c.sym_start);
    if (st != SD_OK) {
        free(c.ids);
        return st;
    }
    if (!c.ids) { /* empty text: still hand back a freeable array */
        c.ids = malloc(sizeof *c.ids);
        if (!c.ids) return SD_ERR_NOMEM;
    }
    *ids = c.ids;
    *n_ids = c.n_ids;
    return SD_OK;
}

sd_status sd_tok_encode(const sd_tok *t, const char *text, size_t len, bool parse_special, int32_t **ids,
                        size_t *n_ids) {
    return encode_text(t, text, len, parse_special, NULL, ids, n_ids);
}

sd_status sd_tok_encode_masked(const sd_tok *t, const char *text, size_t len, const uint8_t *no_special, int32_t **ids,
                               size_t *n_ids) {
    return encode_text(t, text, len, true, no_special, ids, n_ids);
}
