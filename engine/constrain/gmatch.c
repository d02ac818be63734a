/* gmatch.c — the matcher: a set of pushdown stacks over a grammar,
 * advanced one byte at a time (see constrain_impl.h for the encoding).
 *
 * A step on a whole character c: every stack whose top class holds c pops
 * it, pushes the next element of the same alternative (unless that is the
 * alternative's end: the continuation below is already on the stack, which
 * makes right recursion free), and is expanded: while the top is a rule
 * reference it is replaced by one stack per alternative of the rule. The
 * expansion uses a worklist, not recursion, and counts its steps against
 * max_expansions; the stacks that come out are sorted and made unique.
 *
 * Bytes: a character of several UTF-8 bytes is read into utf8_cp first;
 * its first bytes are accepted only while some stack's top class holds a
 * code point they can still become (so a mask never lets a token end in a
 * byte no character can complete). Overlong forms and surrogates are
 * refused, so the output is always valid UTF-8. */
#include "constrain_impl.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void g_state_init(g_state *s) { memset(s, 0, sizeof *s); }

void g_state_free(g_state *s) {
    free(s->data);
    memset(s, 0, sizeof *s);
}

static bool reserve(int32_t **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    int32_t *q = realloc(*p, nc * sizeof *q);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

sd_status g_state_copy(g_state *dst, const g_state *src) {
    if (!reserve(&dst->data, &dst->cap, src->len)) return SD_ERR_NOMEM;
    if (src->len) memcpy(dst->data, src->data, src->len * sizeof *src->data);
    dst->len = src->len;
    dst->n_stacks = src->n_stacks;
    dst->utf8_cp = src->utf8_cp;
    dst->utf8_need = src->utf8_need;
    dst->utf8_len = src->utf8_len;
    return SD_OK;
}

bool g_state_equal(const g_state *a, const g_state *b) {
    return a->len == b->len && a->n_stacks == b->n_stacks && a->utf8_cp == b->utf8_cp && a->utf8_need == b->utf8_need &&
           a->utf8_len == b->utf8_len && (!a->len || !memcmp(a->data, b->data, a->len * sizeof *a->data));
}

uint64_t g_state_hash(const g_state *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)s->data;
    for (size_t i = 0; i < s->len * sizeof *s->data; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    uint32_t extra[3] = {(uint32_t)s->n_stacks, s->utf8_cp, (uint32_t)s->utf8_need << 8 | s->utf8_len};
    p = (const unsigned char *)extra;
    for (size_t i = 0; i < sizeof extra; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

bool g_state_accepting(const g_state *s) { return s->utf8_need == 0 && s->n_stacks > 0 && s->data[0] == 0; }

void g_scratch_free(g_scratch *sc) {
    free(sc->seen);
    free(sc->seen_tab);
    free(sc->work);
    free(sc->done);
    free(sc->offs);
    memset(sc, 0, sizeof *sc);
}

static int32_t max_stack(const sd_grammar *g) { return g->limits.max_depth * 4; }

/* Pushes a stack on the worklist: len elements from elems (src_off < 0)
 * or from the worklist itself at src_off (read after any reallocation),
 * plus one more element when extra >= 0. */
static bool work_push(g_scratch *sc, const int32_t *elems, ptrdiff_t src_off, int32_t len, int32_t extra) {
    int32_t n = len + (extra >= 0);
    if (!reserve(&sc->work, &sc->cap_work, sc->n_work + (size_t)n + 1)) return false;
    int32_t *w = sc->work + sc->n_work;
    const int32_t *src = src_off >= 0 ? sc->work + src_off : elems;
    if (len) memmove(w, src, (size_t)len * sizeof *src);
    if (extra >= 0) w[len] = extra;
    w[n] = n; /* the length last, so the worklist pops from its end */
    sc->n_work += (size_t)n + 1;
    return true;
}

#define SEEN_SLOTS 4096u /* a power of two */

/* True when stk[len] was already expanded in this step; else records it
 * (when the table has room: past that, max_expansions still bounds). */
static bool seen_before(g_scratch *sc, const int32_t *stk, int32_t len) {
    if (!sc->seen_tab && !(sc->seen_tab = calloc(2 * SEEN_SLOTS, sizeof *sc->seen_tab))) return false;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < len; i++) h = (h ^ (uint32_t)stk[i]) * 0x100000001b3ull;
    uint32_t slot = (uint32_t)(h ^ (h >> 32)) & (SEEN_SLOTS - 1);
    for (;;) {
        uint32_t *e = sc->seen_tab + 2 * slot;
        if (e[0] != sc->gen) break;
        const int32_t *o = sc->seen + e[1];
        if (o[0] == len && !memcmp(o + 1, stk, (size_t)len * sizeof *stk)) return true;
        slot = (slot + 1) & (SEEN_SLOTS - 1);
    }
    if (sc->n_tab >= SEEN_SLOTS / 2 || !reserve(&sc->seen, &sc->cap_seen, sc->n_seen + (size_t)len + 1)) return false;
    uint32_t *e = sc->seen_tab + 2 * slot;
    e[0] = sc->gen;
    e[1] = (uint32_t)sc->n_seen;
    sc->seen[sc->n_seen] = len;
    memcpy(sc->seen + sc->n_seen + 1, stk, (size_t)len * sizeof *stk);
    sc->n_seen += (size_t)len + 1;
    sc->n_tab++;
    return false;
}

/* Expands the worklist into finished stacks (top a class, or empty). */
static bool expand_all(const sd_grammar *g, g_scratch *sc) {
    int32_t budget = g->limits.max_expansions;
    int32_t limit = max_stack(g);
    if (++sc->gen == 0) { /* a new generation empties the seen table; on wrap, clear it */
        if (sc->seen_tab) memset(sc->seen_tab, 0, 2 * SEEN_SLOTS * sizeof *sc->seen_tab);
        sc->gen = 1;
    }
    sc->n_tab = 0;
    sc->n_seen = 0;
    while (sc->n_work) {
        int32_t len = sc->work[sc->n_work - 1];
        sc->n_work -= (size_t)len + 1;
        int32_t *stk = sc->work + sc->n_work;
        if (--budget < 0 || len > limit) return false;
        if (len == 0 || g->elems[stk[len - 1]].type == G_CLASS) {
            if (!reserve(&sc->done, &sc->cap_done, sc->n_done + (size_t)len + 1)) return false;
            if (sc->n_offs == sc->cap_offs) {
                size_t nc = sc->cap_offs ? sc->cap_offs * 2 : 64;
                size_t *q = realloc(sc->offs, nc * sizeof *q);
                if (!q) return false;
                sc->offs = q;
                sc->cap_offs = nc;
            }
            sc->offs[sc->n_offs++] = sc->n_done;
            sc->done[sc->n_done] = len;
            memcpy(sc->done + sc->n_done + 1, stk, (size_t)len * sizeof *stk);
            sc->n_done += (size_t)len + 1;
            continue;
        }
        if (seen_before(sc, stk, len)) continue;
        int32_t top = stk[len - 1];
        const g_rule *r = &g->rules[g->elems[top].arg];
        int32_t base = len - 1;
        int32_t next = g->elems[top + 1].type != G_END ? top + 1 : -1;
        /* copy the base first: pushing may move it */
        if (next >= 0) stk[base++] = next;
        /* the popped stack still lies at n_work: the first push copies it onto
         * itself, the others from there (the first writes only past base) */
        ptrdiff_t base_at = (ptrdiff_t)sc->n_work;
        for (int32_t a = 0; a < r->n_alts; a++) {
            int32_t first = r->alts[a];
            int32_t extra = g->elems[first].type == G_END ? -1 : first;
            if (!work_push(sc, NULL, base_at, base, extra)) return false;
        }
    }
    return true;
}

static int cmp_stack(const void *a, const void *b, void *done) {
    const int32_t *x = (const int32_t *)done + *(const size_t *)a, *y = (const int32_t *)done + *(const size_t *)b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    for (int32_t i = 1; i <= x[0]; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

/* Sorts and dedups the finished stacks into out's data. */
static bool finish(const sd_grammar *g, g_scratch *sc, g_state *out) {
    if (!sc->n_offs) return false;
    qsort_r(sc->offs, sc->n_offs, sizeof *sc->offs, cmp_stack, sc->done);
    out->len = 0;
    out->n_stacks = 0;
    for (size_t i = 0; i < sc->n_offs; i++) {
        const int32_t *s = sc->done + sc->offs[i];
        if (i && cmp_stack(&sc->offs[i - 1], &sc->offs[i], sc->done) == 0) continue;
        if (out->n_stacks >= g->limits.max_stacks) return false;
        if (!reserve(&out->data, &out->cap, out->len + (size_t)s[0] + 1)) return false;
        memcpy(out->data + out->len, s, ((size_t)s[0] + 1) * sizeof *s);
        out->len += (size_t)s[0] + 1;
        out->n_stacks++;
    }
    return true;
}

static void scratch_reset(g_scratch *sc) { sc->n_work = sc->n_done = sc->n_offs = 0; }

sd_status g_state_start(const sd_grammar *g, g_state *out, g_scratch *sc) {
    scratch_reset(sc);
    const g_rule *root = &g->rules[g->root];
    for (int32_t a = 0; a < root->n_alts; a++) {
        int32_t first = root->alts[a];
        if (!work_push(sc, NULL, -1, 0, g->elems[first].type == G_END ? -1 : first)) return SD_ERR_NOMEM;
    }
    out->utf8_cp = 0;
    out->utf8_need = out->utf8_len = 0;
    if (!expand_all(g, sc) || !finish(g, sc, out)) return SD_ERR_RANGE;
    return SD_OK;
}

static bool class_has(const sd_grammar *g, int32_t cl, uint32_t lo, uint32_t hi) {
    const g_class *c = &g->classes[cl];
    for (int32_t i = 0; i < c->n; i++) {
        const g_range *r = &g->ranges[c->first + i];
        if (r->lo <= hi && lo <= r->hi) return true;
    }
    return false;
}

/* Some stack's top can still take a character in [lo, hi]. */
static bool any_top_has(const sd_grammar *g, const g_state *s, uint32_t lo, uint32_t hi) {
    size_t at = 0;
    for (int32_t i = 0; i < s->n_stacks; i++) {
        int32_t len = s->data[at];
        if (len && class_has(g, g->elems[s->data[at + (size_t)len]].arg, lo, hi)) return true;
        at += (size_t)len + 1;
    }
    return false;
}

static const uint32_t utf8_min[5] = {0, 0, 0x80, 0x800, 0x10000};

bool g_state_advance(const sd_grammar *g, const g_state *in, uint8_t b, g_state *out, g_scratch *sc) {
    uint32_t cp;
    uint8_t need, clen;
    if (in->utf8_need == 0) {
        if (b < 0x80)
            cp = b, need = 0, clen = 1;
        else if (b >= 0xC2 && b <= 0xDF)
            cp = b & 0x1Fu, need = 1, clen = 2;
        else if (b >= 0xE0 && b <= 0xEF)
            cp = b & 0x0Fu, need = 2, clen = 3;
        else if (b >= 0xF0 && b <= 0xF4)
            cp = b & 0x07u, need = 3, clen = 4;
        else
            return false;
    } else {
        if ((b & 0xC0) != 0x80) return false;
        cp = (in->utf8_cp << 6) | (b & 0x3Fu);
        need = (uint8_t)(in->utf8_need - 1);
        clen = in->utf8_len;
    }
    if (need) { /* a character half read: keep the stacks, check it can finish */
        uint32_t lo = cp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
        if (lo < utf8_min[clen]) lo = utf8_min[clen];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi || !any_top_has(g, in, lo, hi)) return false;
        if (g_state_copy(out, in) != SD_OK) return false;
        out->utf8_cp = cp;
        out->utf8_need = need;
        out->utf8_len = clen;
        return true;
    }
    if (cp < utf8_min[clen] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    scratch_reset(sc);
    size_t at = 0;
    for (int32_t i = 0; i < in->n_stacks; i++) {
        const int32_t *s = in->data + at;
        int32_t len = s[0];
        at += (size_t)len + 1;
        if (!len) continue;
        int32_t top = s[len];
        if (!class_has(g, g->elems[top].arg, cp, cp)) continue;
        int32_t next = g->elems[top + 1].type != G_END ? top + 1 : -1;
        if (!work_push(sc, s + 1, -1, len - 1, next)) return false;
    }
    out->utf8_cp = 0;
    out->utf8_need = out->utf8_len = 0;
    return expand_all(g, sc) && finish(g, sc, out);
}

bool sd_grammar_match(const sd_grammar *g, const char *bytes, size_t len) {
    g_state a, b;
    g_scratch sc = {0};
    g_state_init(&a);
    g_state_init(&b);
    bool ok = g_state_start(g, &a, &sc) == SD_OK;
    for (size_t i = 0; ok && i < len; i++) {
        ok = g_state_advance(g, &a, (uint8_t)bytes[i], &b, &sc);
        g_state t = a;
        a = b;
        b = t;
    }
    ok = ok && g_state_accepting(&a);
    g_state_free(&a);
    g_state_free(&b);
    g_scratch_free(&sc);
    return ok;
}
