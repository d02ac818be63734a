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

#define WALK_STATES 4096 /* distinct states one walk interns; beyond, it walks without (walk_direct) */
#define WALK_SLOTS  8192 /* their hash table (a power of two, 2x WALK_STATES) */
#define CACHE_SLOTS 1024 /* masks cached per sequence (a power of two; ~6 KiB each at 49k tokens) */

typedef struct trie_node {
    int32_t child, sibling;   /* first child, next sibling; -1 none */
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
    /* the trie again in depth-first order, which the walks scan: node i
     * (0 the root) has its byte, depth, tokens, and end[i], the index just
     * past its subtree (where a dead node jumps) */
    uint8_t *dfs_byte;
    uint16_t *dfs_depth;
    int32_t *dfs_end, *dfs_tok_first, *dfs_tok_n;
    /* the root's children packed (first bytes and dfs indices), so a dead
     * first byte costs a byte read, not a jump to a far cache line */
    int32_t n_top, top_node[256];
    uint8_t top_byte[256];
};

/* The root's packed children (after build_dfs). */
static void build_top(sd_cvocab *v) {
    v->n_top = 0;
    for (int32_t ch = 1; ch < v->n_nodes; ch = v->dfs_end[ch]) {
        v->top_byte[v->n_top] = v->dfs_byte[ch];
        v->top_node[v->n_top++] = ch;
    }
}

/* Lays the linked trie out in depth-first order (iteratively). */
static bool build_dfs(sd_cvocab *v) {
    int32_t n = v->n_nodes;
    v->dfs_byte = malloc((size_t)n);
    v->dfs_depth = malloc((size_t)n * sizeof *v->dfs_depth);
    v->dfs_end = malloc((size_t)n * sizeof *v->dfs_end);
    v->dfs_tok_first = malloc((size_t)n * sizeof *v->dfs_tok_first);
    v->dfs_tok_n = malloc((size_t)n * sizeof *v->dfs_tok_n);
    if (v->max_len > UINT16_MAX - 1) return false;                   /* depths are 16-bit */
    int32_t *stack = malloc(((size_t)n + 1) * sizeof *stack);        /* linked nodes to visit */
    int32_t *open = malloc(((size_t)v->max_len + 2) * sizeof *open); /* dfs index of the open ancestor per depth */
    bool ok = v->dfs_byte && v->dfs_depth && v->dfs_end && v->dfs_tok_first && v->dfs_tok_n && stack && open;
    int32_t sp = 0, at = 0;
    if (ok) stack[sp++] = 0;
    int32_t *dstack = ok ? malloc(((size_t)n + 1) * sizeof *dstack) : NULL;
    ok = ok && dstack;
    if (ok) dstack[0] = 0;
    while (ok && sp) {
        int32_t node = stack[--sp], d = dstack[sp];
        v->dfs_byte[at] = v->nodes[node].byte;
        v->dfs_depth[at] = (uint16_t)d;
        v->dfs_tok_first[at] = v->nodes[node].tok_first;
        v->dfs_tok_n[at] = v->nodes[node].tok_n;
        open[d] = at;
        at++;
        for (int32_t ch = v->nodes[node].child; ch >= 0; ch = v->nodes[ch].sibling) {
            stack[sp] = ch;
            dstack[sp++] = d + 1;
        }
    }
    /* end[i]: the first later node no deeper than i */
    if (ok) {
        int32_t *pending = open; /* a stack of nodes whose end is not known yet */
        int32_t np = 0;
        for (int32_t i = 0; i < at; i++) {
            while (np && v->dfs_depth[pending[np - 1]] >= v->dfs_depth[i]) v->dfs_end[pending[--np]] = i;
            pending[np++] = i;
        }
        while (np) v->dfs_end[pending[--np]] = at;
    }
    free(stack);
    free(dstack);
    free(open);
    return ok;
}

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
    if (!build_dfs(v)) {
        sd_cvocab_free(&v);
        return SD_ERR_NOMEM;
    }
    build_top(v);
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
    free(v->dfs_byte);
    free(v->dfs_depth);
    free(v->dfs_end);
    free(v->dfs_tok_first);
    free(v->dfs_tok_n);
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
    int32_t *toks; /* toks[i]: the token advanced past from hist[i] */
    int32_t n_hist, cap_hist;
    g_scratch sc;
    g_state *walk; /* [max_len + 1] per-depth states of a walk */
    cache_slot *cache;
    int32_t n_cached;
    uint32_t *bits; /* the mask last served when not from the cache */
    int64_t masks, hits;
    float *times;
    int32_t n_times;
    /* a mask walk's interned states and their transitions (walk_cached) */
    g_state *ws; /* [cap_ws] states met in this walk (buffers kept across walks) */
    int32_t n_ws, cap_ws;
    int32_t *ws_slot;  /* [WALK_SLOTS] hash table of ws indices, -1 empty */
    int32_t *ws_trans; /* [cap_ws * 256]: next state, -1 dead, -2 not computed */
    g_state tmp;
    int32_t *ws_at; /* [max_len + 1] */
};

sd_status sd_constraint_create(const sd_grammar *g, const sd_cvocab *v, sd_constraint **out) {
    *out = NULL;
    sd_constraint *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->g = g;
    c->v = v;
    c->cap_hist = 64;
    c->hist = calloc((size_t)c->cap_hist, sizeof *c->hist);
    c->toks = malloc((size_t)c->cap_hist * sizeof *c->toks);
    c->walk = calloc((size_t)v->max_len + 2, sizeof *c->walk);
    c->ws_at = malloc(((size_t)v->max_len + 2) * sizeof *c->ws_at);
    c->cache = calloc(CACHE_SLOTS, sizeof *c->cache);
    c->bits = malloc((size_t)v->n_words * sizeof *c->bits);
    c->times = malloc(SD_CONSTRAINT_MAX_TIMES * sizeof *c->times);
    if (!c->hist || !c->toks || !c->walk || !c->ws_at || !c->cache || !c->bits || !c->times) {
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
    for (int32_t i = 0; i < c->cap_ws; i++) g_state_free(&c->ws[i]);
    free(c->ws);
    free(c->ws_slot);
    free(c->ws_trans);
    free(c->ws_at);
    g_state_free(&c->tmp);
    g_scratch_free(&c->sc);
    free(c->hist);
    free(c->toks);
    free(c->walk);
    free(c->cache);
    free(c->bits);
    free(c->times);
    free(c);
    *pc = NULL;
}

static inline void allow_node(const sd_cvocab *v, int32_t i, uint32_t *bits) {
    for (int32_t k = 0; k < v->dfs_tok_n[i]; k++) {
        int32_t id = v->tok_ids[v->dfs_tok_first[i] + k];
        bits[id >> 5] |= 1u << (id & 31);
    }
}

/* The plain walk: one matcher step per trie node, c->walk[d] the state at
 * depth d (walk[0] set by the caller). */
static void walk_direct(sd_constraint *c, uint32_t *bits) {
    const sd_cvocab *v = c->v;
    for (int32_t i = 1; i < v->n_nodes;) {
        int32_t d = v->dfs_depth[i];
        if (!g_state_advance(c->g, &c->walk[d - 1], v->dfs_byte[i], &c->walk[d], &c->sc)) {
            i = v->dfs_end[i];
            continue;
        }
        allow_node(v, i, bits);
        i++;
    }
}

/* The index of state s among the walk's states, added if new; -1 when the
 * walk has met WALK_STATES states already (or out of memory). */
static int32_t ws_intern(sd_constraint *c, const g_state *s) {
    uint64_t h = g_state_hash(s);
    uint32_t slot = (uint32_t)(h ^ (h >> 29)) & (WALK_SLOTS - 1);
    for (; c->ws_slot[slot] >= 0; slot = (slot + 1) & (WALK_SLOTS - 1))
        if (g_state_equal(&c->ws[c->ws_slot[slot]], s)) return c->ws_slot[slot];
    if (c->n_ws >= WALK_STATES) return -1;
    if (c->n_ws == c->cap_ws) {
        int32_t nc = c->cap_ws ? c->cap_ws * 2 : 64;
        g_state *q = realloc(c->ws, (size_t)nc * sizeof *q);
        if (!q) return -1;
        c->ws = q;
        memset(c->ws + c->cap_ws, 0, (size_t)(nc - c->cap_ws) * sizeof *q);
        int32_t *t = realloc(c->ws_trans, (size_t)nc * 256 * sizeof *t);
        if (!t) return -1;
        c->ws_trans = t;
        c->cap_ws = nc;
    }
    int32_t id = c->n_ws;
    if (g_state_copy(&c->ws[id], s) != SD_OK) return -1;
    for (int b = 0; b < 256; b++) c->ws_trans[(size_t)id * 256 + (size_t)b] = -2;
    c->ws_slot[slot] = id;
    c->n_ws++;
    return id;
}

/* The interned state after byte from state `from` (-1: dead); false when
 * the walk outgrew WALK_STATES. */
static inline bool ws_next(sd_constraint *c, int32_t from, uint8_t byte, int32_t *out) {
    int32_t next = c->ws_trans[(size_t)from * 256 + byte];
    if (next == -2) {
        next = -1;
        if (g_state_advance(c->g, &c->ws[from], byte, &c->tmp, &c->sc) && (next = ws_intern(c, &c->tmp)) < 0)
            return false;
        c->ws_trans[(size_t)from * 256 + byte] = next;
    }
    *out = next;
    return true;
}

/* The walk over interned states: a node costs one table lookup once the
 * (state, byte) transition is known, and inside a JSON string or a
 * character loop most of the vocabulary meets a few states only. The
 * root's children are taken from their packed list (a dead first byte
 * costs a byte read, not a jump to a far cache line of the node arrays:
 * most first bytes are dead outside strings); below them the trie is
 * scanned in depth-first order, a dead node skipping its subtree.
 * Returns false when the walk outgrew WALK_STATES (the caller then walks
 * directly). */
static bool walk_cached(sd_constraint *c, int32_t root, uint32_t *bits) {
    const sd_cvocab *v = c->v;
    int32_t *sid_at = c->ws_at; /* the state at each depth of the current path */
    sid_at[0] = root;
    for (int32_t k = 0; k < v->n_top; k++) {
        int32_t top = v->top_node[k], next;
        if (!ws_next(c, root, v->top_byte[k], &next)) return false;
        if (next < 0) continue;
        allow_node(v, top, bits);
        sid_at[1] = next;
        for (int32_t i = top + 1, end = v->dfs_end[top]; i < end;) {
            int32_t d = v->dfs_depth[i];
            if (!ws_next(c, sid_at[d - 1], v->dfs_byte[i], &next)) return false;
            if (next < 0) {
                i = v->dfs_end[i];
                continue;
            }
            allow_node(v, i, bits);
            sid_at[d] = next;
            i++;
        }
    }
    return true;
}

/* The mask of state s into bits (computed, not cached). */
static void compute_mask(sd_constraint *c, const g_state *s, uint32_t *bits) {
    memset(bits, 0, (size_t)c->v->n_words * sizeof *bits);
    if (s->n_stacks == 0) return; /* ended */
    bool done = false;
    if (c->ws_slot || (c->ws_slot = malloc(WALK_SLOTS * sizeof *c->ws_slot))) {
        memset(c->ws_slot, 0xff, WALK_SLOTS * sizeof *c->ws_slot);
        c->n_ws = 0;
        int32_t root = ws_intern(c, s);
        done = root >= 0 && walk_cached(c, root, bits);
    }
    if (!done) {
        memset(bits, 0, (size_t)c->v->n_words * sizeof *bits);
        if (g_state_copy(&c->walk[0], s) != SD_OK) return;
        walk_direct(c, bits);
    }
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
    /* a word of the mask at a time: most words are all allowed (nothing to
     * do) or all refused (a fill); a mixed one goes bit by bit over its set
     * refused bits only */
    for (int32_t w = 0; w * 32 < n; w++) {
        int32_t lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
        uint32_t refused = ~bits[w];
        if (hi - lo < 32) refused &= (1u << (hi - lo)) - 1u;
        if (refused == 0xFFFFFFFFu) {
            for (int32_t i = lo; i < hi; i++) logits[i] = -INFINITY;
            continue;
        }
        for (; refused; refused &= refused - 1) logits[lo + __builtin_ctz(refused)] = -INFINITY;
    }
    for (int32_t i = n; i < n_vocab; i++) logits[i] = -INFINITY; /* padding rows of the LM head */
    return SD_OK;
}

sd_status sd_constraint_apply_ids(sd_constraint *c, float *logits, int32_t n, const int32_t *ids, bool *any) {
    const uint32_t *bits;
    *any = false;
    SD_TRY(sd_constraint_mask(c, &bits));
    const int32_t V = c->v->n_vocab;
    if (!ids) { /* the whole vocabulary: a word at a time (most words are all allowed or all refused) */
        int32_t m = n < V ? n : V;
        for (int32_t w = 0; w * 32 < m; w++) {
            int32_t lo = w * 32, hi = lo + 32 < m ? lo + 32 : m;
            uint32_t word = bits[w];
            if (word == 0xFFFFFFFFu && hi - lo == 32) {
                for (int32_t i = lo; i < hi && !*any; i++) *any = logits[i] > -INFINITY;
                continue;
            }
            if (word == 0) {
                for (int32_t i = lo; i < hi; i++) logits[i] = -INFINITY;
                continue;
            }
            for (int32_t i = lo; i < hi; i++) {
                if (!(word >> (i & 31) & 1u)) logits[i] = -INFINITY;
                *any = *any || logits[i] > -INFINITY;
            }
        }
        for (int32_t i = m; i < n; i++) logits[i] = -INFINITY;
        return SD_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t t = ids[i];
        if (t < 0 || t >= V || !(bits[t >> 5] >> (t & 31) & 1u)) logits[i] = -INFINITY;
        *any = *any || logits[i] > -INFINITY;
    }
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
        int32_t *tq = realloc(c->toks, (size_t)nc * sizeof *tq);
        if (!tq) return SD_ERR_NOMEM; /* hist grown, cap_hist not yet: consistent */
        c->toks = tq;
        c->cap_hist = nc;
    }
    if (!step_token(c, &c->hist[c->n_hist - 1], token, &c->hist[c->n_hist])) return SD_ERR_INVALID_ARG;
    c->toks[c->n_hist - 1] = token;
    c->n_hist++;
    return SD_OK;
}

int32_t sd_constraint_len(const sd_constraint *c) { return c->n_hist - 1; }

const int32_t *sd_constraint_tokens(const sd_constraint *c) { return c->toks; }

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

void sd_constraint_next_bytes(sd_constraint *c, uint32_t set[8]) {
    memset(set, 0, 8 * sizeof *set);
    const g_state *s = &c->hist[c->n_hist - 1];
    if (s->n_stacks == 0) return;
    for (int byte = 0; byte < 256; byte++)
        if (g_state_advance(c->g, s, (uint8_t)byte, &c->tmp, &c->sc)) set[byte >> 5] |= 1u << (byte & 31);
}

bool sd_constraint_ended(const sd_constraint *c) { return c->hist[c->n_hist - 1].n_stacks == 0; }

bool sd_constraint_accepting(const sd_constraint *c) { return g_state_accepting(&c->hist[c->n_hist - 1]); }

sd_constraint_stats sd_constraint_get_stats(const sd_constraint *c) {
    int32_t n = c->n_times < SD_CONSTRAINT_MAX_TIMES ? c->n_times : SD_CONSTRAINT_MAX_TIMES;
    return (sd_constraint_stats){.masks = c->masks, .hits = c->hits, .n_times = n, .mask_us = c->times};
}
