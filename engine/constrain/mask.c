/* mask.c — token masks: the vocabulary's byte trie, walked with the
 * matcher, and a per-sequence constraint with a per-state mask cache.
 *
 * The trie holds every text token's bytes (control tokens are never
 * allowed; end-of-generation tokens are added when the grammar accepts).
 * A mask is one depth-first walk: a node's byte advances the parent's
 * matcher state, a dead state prunes the whole subtree, and the tokens that
 * end at a live node are allowed. The matcher state at each depth is kept
 * in a per-depth buffer, so a walk allocates nothing once warm.
 *
 * The cache maps a state to its mask: open addressing on the state's hash,
 * a hit compared in full (state bytes and UTF-8 fields), so a collision
 * costs a walk, never a wrong mask. It is cleared when three quarters
 * full. A constraint keeps the state after each token it advanced past
 * (hist[i] after i tokens), so rolling back is truncating the history. */
#include "constrain_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CACHE_SLOTS 1024 /* masks cached per sequence (a power of two; ~6 KiB each at 49k tokens) */

typedef struct trie_node {
    int32_t child, sibling; /* first child, next sibling; -1 none */
    int32_t tok_first, tok_n; /* tokens ending here: tok_ids[tok_first ..] */
    uint8_t byte;
} trie_node;

struct sd_cvocab {
    int32_t n_vocab, n_words;
    trie_node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *tok_ids;
    int32_t *eog;
    int32_t n_eog;
    int32_t max_len; /* the longest token, in bytes */
    char *arena;     /* every token's bytes */
    size_t *off;     /* [n_vocab + 1] into arena */
    bool *is_text;   /* [n_vocab] */
};

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* ---- vocabulary ---- */

static int32_t node_new(sd_cvocab *v, uint8_t byte) {
    if (v->n_nodes == v->cap_nodes) {
        int32_t nc = v->cap_nodes ? v->cap_nodes * 2 : 1024;
        trie_node *q = realloc(v->nodes, (size_t)nc * sizeof *q);
        if (!q) return -1;
        v->nodes = q;
        v->cap_nodes = nc;
    }
    v->nodes[v->n_nodes] = (trie_node){-1, -1, 0, 0, byte};
    return v->n_nodes++;
}

static int32_t child_get(sd_cvocab *v, int32_t parent, uint8_t byte) {
    for (int32_t c = v->nodes[parent].child; c >= 0; c = v->nodes[c].sibling)
        if (v->nodes[c].byte == byte) return c;
    int32_t c = node_new(v, byte);
    if (c < 0) return -1;
    v->nodes[c].sibling = v->nodes[parent].child;
    v->nodes[parent].child = c;
    return c;
}

sd_status sd_cvocab_create(const sd_tok *t, sd_cvocab **out) {
    *out = NULL;
    sd_cvocab *v = calloc(1, sizeof *v);
    if (!v) return SD_ERR_NOMEM;
    int32_t n = sd_tok_n_vocab(t);
    v->n_vocab = n;
    v->n_words = (n + 31) / 32;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = 0;
        sd_tok_piece(t, i, &l);
        total += l;
    }
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->arena = malloc(total + 1);
    v->is_text = calloc((size_t)n, sizeof *v->is_text);
    v->eog = malloc((size_t)n * sizeof *v->eog);
    int32_t *end_node = malloc((size_t)n * sizeof *end_node);
    sd_status st = SD_ERR_NOMEM;
    if (!v->off || !v->arena || !v->is_text || !v->eog || !end_node || node_new(v, 0) < 0) goto fail;
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = 0;
        const char *p = sd_tok_piece(t, i, &l);
        v->off[i] = at;
        if (l) memcpy(v->arena + at, p, l);
        at += l;
        if (sd_tok_is_eog(t, i)) v->eog[v->n_eog++] = i;
        v->is_text[i] = l > 0 && sd_tok_is_text(t, i) && !sd_tok_is_eog(t, i);
        end_node[i] = -1;
        if (!v->is_text[i]) continue;
        if ((int32_t)l > v->max_len) v->max_len = (int32_t)l;
        int32_t node = 0;
        for (size_t k = 0; k < l && node >= 0; k++) node = child_get(v, node, (uint8_t)p[k]);
        if (node < 0) goto fail;
        end_node[i] = node;
        v->nodes[node].tok_n++;
    }
    v->off[n] = at;
    /* tokens per node: counts to offsets, then fill */
    int32_t sum = 0;
    for (int32_t k = 0; k < v->n_nodes; k++) {
        v->nodes[k].tok_first = sum;
        sum += v->nodes[k].tok_n;
        v->nodes[k].tok_n = 0;
    }
    if (!(v->tok_ids = malloc(((size_t)sum + 1) * sizeof *v->tok_ids))) goto fail;
    for (int32_t i = 0; i < n; i++) {
        if (end_node[i] < 0) continue;
        trie_node *nd = &v->nodes[end_node[i]];
        v->tok_ids[nd->tok_first + nd->tok_n++] = i;
    }
    free(end_node);
    *out = v;
    return SD_OK;
fail:
    free(end_node);
    sd_cvocab_free(&v);
    return st;
}

void sd_cvocab_free(sd_cvocab **pv) {
    if (!pv || !*pv) return;
    sd_cvocab *v = *pv;
    free(v->nodes);
    free(v->tok_ids);
    free(v->eog);
    free(v->arena);
    free(v->off);
    free(v->is_text);
    free(v);
    *pv = NULL;
}

int32_t sd_cvocab_n_vocab(const sd_cvocab *v) { return v->n_vocab; }

/* ---- a constraint ---- */

typedef struct cache_slot {
    uint64_t hash;
    bool used;
    g_state state;
    uint32_t *bits;
} cache_slot;

struct sd_constraint {
    const sd_grammar *g;
    const sd_cvocab *v;
    g_state *hist; /* hist[i]: after i tokens; n_stacks 0 after an end token */
    int32_t n_hist, cap_hist;
    g_scratch sc;
    g_state *walk; /* [max_len + 1] per-depth states of a walk */
    cache_slot *cache;
    int32_t n_cached;
    uint32_t *bits; /* the mask last served when not from the cache */
    int64_t masks, hits;
    float *times;
    int32_t n_times;
};

sd_status sd_constraint_create(const sd_grammar *g, const sd_cvocab *v, sd_constraint **out) {
    *out = NULL;
    sd_constraint *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->g = g;
    c->v = v;
    c->cap_hist = 64;
    c->hist = calloc((size_t)c->cap_hist, sizeof *c->hist);
    c->walk = calloc((size_t)v->max_len + 2, sizeof *c->walk);
    c->cache = calloc(CACHE_SLOTS, sizeof *c->cache);
    c->bits = malloc((size_t)v->n_words * sizeof *c->bits);
    c->times = malloc(SD_CONSTRAINT_MAX_TIMES * sizeof *c->times);
    if (!c->hist || !c->walk || !c->cache || !c->bits || !c->times) {
        sd_constraint_free(&c);
        return SD_ERR_NOMEM;
    }
    sd_status st = g_state_start(g, &c->hist[0], &c->sc);
    if (st != SD_OK) {
        sd_constraint_free(&c);
        return st;
    }
    c->n_hist = 1;
    *out = c;
    return SD_OK;
}

static void cache_clear(sd_constraint *c) {
    for (int32_t i = 0; i < CACHE_SLOTS; i++) {
        g_state_free(&c->cache[i].state);
        free(c->cache[i].bits);
        c->cache[i] = (cache_slot){0};
    }
    c->n_cached = 0;
}

void sd_constraint_free(sd_constraint **pc) {
    if (!pc || !*pc) return;
    sd_constraint *c = *pc;
    if (c->hist)
        for (int32_t i = 0; i < c->cap_hist; i++) g_state_free(&c->hist[i]);
    if (c->walk)
        for (int32_t i = 0; i <= c->v->max_len + 1; i++) g_state_free(&c->walk[i]);
    if (c->cache) cache_clear(c);
    g_scratch_free(&c->sc);
    free(c->hist);
    free(c->walk);
    free(c->cache);
    free(c->bits);
    free(c->times);
    free(c);
    *pc = NULL;
}

static void walk(sd_constraint *c, int32_t node, int32_t depth, uint32_t *bits) {
    const sd_cvocab *v = c->v;
    for (int32_t ch = v->nodes[node].child; ch >= 0; ch = v->nodes[ch].sibling) {
        const trie_node *nd = &v->nodes[ch];
        if (!g_state_advance(c->g, &c->walk[depth], nd->byte, &c->walk[depth + 1], &c->sc)) continue;
        for (int32_t k = 0; k < nd->tok_n; k++) {
            int32_t id = v->tok_ids[nd->tok_first + k];
            bits[id >> 5] |= 1u << (id & 31);
        }
        if (nd->child >= 0) walk(c, ch, depth + 1, bits);
    }
}

/* The mask of state s into bits (computed, not cached). */
static void compute_mask(sd_constraint *c, const g_state *s, uint32_t *bits) {
    memset(bits, 0, (size_t)c->v->n_words * sizeof *bits);
    if (s->n_stacks == 0) return; /* ended */
    if (g_state_copy(&c->walk[0], s) != SD_OK) return;
    walk(c, 0, 0, bits);
    if (g_state_accepting(s))
        for (int32_t i = 0; i < c->v->n_eog; i++) bits[c->v->eog[i] >> 5] |= 1u << (c->v->eog[i] & 31);
}

sd_status sd_constraint_mask(sd_constraint *c, const uint32_t **out) {
    double t0 = now_us();
    const g_state *s = &c->hist[c->n_hist - 1];
    uint64_t h = g_state_hash(s);
    uint32_t slot = (uint32_t)h & (CACHE_SLOTS - 1);
    const uint32_t *res = NULL;
    for (uint32_t probe = 0; probe < CACHE_SLOTS; probe++, slot = (slot + 1) & (CACHE_SLOTS - 1)) {
        cache_slot *e = &c->cache[slot];
        if (!e->used) break;
        if (e->hash == h && g_state_equal(&e->state, s)) {
            res = e->bits;
            c->hits++;
            break;
        }
    }
    if (!res) {
        if (c->n_cached >= CACHE_SLOTS * 3 / 4) cache_clear(c);
        slot = (uint32_t)h & (CACHE_SLOTS - 1);
        while (c->cache[slot].used) slot = (slot + 1) & (CACHE_SLOTS - 1);
        cache_slot *e = &c->cache[slot];
        e->bits = malloc((size_t)c->v->n_words * sizeof *e->bits);
        if (e->bits && g_state_copy(&e->state, s) == SD_OK) {
            compute_mask(c, s, e->bits);
            e->hash = h;
            e->used = true;
            c->n_cached++;
            res = e->bits;
        } else { /* no room to cache: serve it uncached */
            free(e->bits);
            e->bits = NULL;
            compute_mask(c, s, c->bits);
            res = c->bits;
        }
    }
    c->masks++;
    c->times[c->n_times++ % SD_CONSTRAINT_MAX_TIMES] = (float)(now_us() - t0);
    *out = res;
    return SD_OK;
}

sd_status sd_constraint_apply(sd_constraint *c, float *logits, int32_t n_vocab) {
    const uint32_t *bits;
    SD_TRY(sd_constraint_mask(c, &bits));
    int32_t n = n_vocab < c->v->n_vocab ? n_vocab : c->v->n_vocab;
    for (int32_t i = 0; i < n; i++)
        if (!(bits[i >> 5] >> (i & 31) & 1u)) logits[i] = -INFINITY;
    for (int32_t i = n; i < n_vocab; i++) logits[i] = -INFINITY; /* padding rows of the LM head */
    return SD_OK;
}

static bool is_eog(const sd_cvocab *v, int32_t id) {
    for (int32_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return true;
    return false;
}

/* The state after token from s into out; false when not allowed. */
static bool step_token(sd_constraint *c, const g_state *s, int32_t token, g_state *out) {
    const sd_cvocab *v = c->v;
    if (token < 0 || token >= v->n_vocab || s->n_stacks == 0) return false;
    if (is_eog(v, token)) {
        if (!g_state_accepting(s)) return false;
        out->len = 0;
        out->n_stacks = 0;
        out->utf8_need = out->utf8_len = 0;
        out->utf8_cp = 0;
        return true;
    }
    if (!v->is_text[token]) return false;
    g_state a, b;
    g_state_init(&a);
    g_state_init(&b);
    bool ok = g_state_copy(&a, s) == SD_OK;
    for (size_t k = v->off[token]; ok && k < v->off[token + 1]; k++) {
        ok = g_state_advance(c->g, &a, (uint8_t)v->arena[k], &b, &c->sc);
        g_state t = a;
        a = b;
        b = t;
    }
    ok = ok && g_state_copy(out, &a) == SD_OK;
    g_state_free(&a);
    g_state_free(&b);
    return ok;
}

bool sd_constraint_allows(sd_constraint *c, int32_t token) {
    g_state tmp;
    g_state_init(&tmp);
    bool ok = step_token(c, &c->hist[c->n_hist - 1], token, &tmp);
    g_state_free(&tmp);
    return ok;
}

sd_status sd_constraint_advance(sd_constraint *c, int32_t token) {
    if (c->n_hist == c->cap_hist) {
        int32_t nc = c->cap_hist * 2;
        g_state *q = realloc(c->hist, (size_t)nc * sizeof *q);
        if (!q) return SD_ERR_NOMEM;
        memset(q + c->cap_hist, 0, (size_t)(nc - c->cap_hist) * sizeof *q);
        c->hist = q;
        c->cap_hist = nc;
    }
    if (!step_token(c, &c->hist[c->n_hist - 1], token, &c->hist[c->n_hist])) return SD_ERR_INVALID_ARG;
    c->n_hist++;
    return SD_OK;
}

int32_t sd_constraint_len(const sd_constraint *c) { return c->n_hist - 1; }

sd_status sd_constraint_rollback(sd_constraint *c, int32_t n) {
    if (n < 0 || n > c->n_hist - 1) return SD_ERR_RANGE;
    c->n_hist = n + 1;
    return SD_OK;
}

int32_t sd_constraint_forced(sd_constraint *c) {
    const uint32_t *bits;
    if (sd_constraint_mask(c, &bits) != SD_OK) return -1;
    int32_t found = -1;
    for (int32_t w = 0; w < c->v->n_words; w++) {
        if (!bits[w]) continue;
        if (found >= 0 || (bits[w] & (bits[w] - 1))) return -1;
        found = w * 32 + __builtin_ctz(bits[w]);
    }
    return found;
}

size_t sd_constraint_forced_bytes(sd_constraint *c, char *buf, size_t cap) {
    g_state a, b;
    g_state_init(&a);
    g_state_init(&b);
    size_t n = 0;
    bool ok = g_state_copy(&a, &c->hist[c->n_hist - 1]) == SD_OK && a.n_stacks > 0;
    while (ok && n < cap && !g_state_accepting(&a)) {
        int only = -1;
        for (int byte = 0; byte < 256; byte++) {
            if (!g_state_advance(c->g, &a, (uint8_t)byte, &b, &c->sc)) continue;
            if (only >= 0) {
                only = -2;
                break;
            }
            only = byte;
        }
        if (only < 0) break;
        ok = g_state_advance(c->g, &a, (uint8_t)only, &b, &c->sc);
        buf[n++] = (char)only;
        g_state t = a;
        a = b;
        b = t;
    }
    g_state_free(&a);
    g_state_free(&b);
    return n;
}

bool sd_constraint_ended(const sd_constraint *c) { return c->hist[c->n_hist - 1].n_stacks == 0; }

bool sd_constraint_accepting(const sd_constraint *c) { return g_state_accepting(&c->hist[c->n_hist - 1]); }

sd_constraint_stats sd_constraint_get_stats(const sd_constraint *c) {
    int32_t n = c->n_times < SD_CONSTRAINT_MAX_TIMES ? c->n_times : SD_CONSTRAINT_MAX_TIMES;
    return (sd_constraint_stats){.masks = c->masks, .hits = c->hits, .n_times = n, .mask_us = c->times};
}
