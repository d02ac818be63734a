/* cache.c — constraints by kind and text, and the cache of their compiled
 * grammars (constrain_cache.h).
 *
 * The cache is a small array searched linearly (a verifier sees a handful
 * of distinct constraints at once; a lookup hashes the text, FNV-1a, and
 * compares it in full on a hash hit). Eviction takes the least recently
 * used entry that no one holds. */
#include "specd/constrain_cache.h"

#include <stdlib.h>
#include <string.h>

const char *sd_constraint_kind_name(sd_constraint_kind kind) {
    switch (kind) {
    case SD_CONSTRAINT_NONE: return "none";
    case SD_CONSTRAINT_JSON_OBJECT: return "json_object";
    case SD_CONSTRAINT_JSON_SCHEMA: return "json_schema";
    case SD_CONSTRAINT_REGEX: return "regex";
    case SD_CONSTRAINT_GRAMMAR: return "grammar";
    }
    return "?";
}

sd_status sd_grammar_compile(sd_constraint_kind kind, const char *text, size_t len, const sd_constrain_limits *lim,
                             sd_grammar **out, char *err, size_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    switch (kind) {
    case SD_CONSTRAINT_JSON_OBJECT: return sd_grammar_json_any(true, out);
    case SD_CONSTRAINT_JSON_SCHEMA: return sd_grammar_from_json_schema(text, len, lim, out, err, err_cap);
    case SD_CONSTRAINT_REGEX: return sd_grammar_from_regex(text, len, lim, out, err, err_cap);
    case SD_CONSTRAINT_GRAMMAR: return sd_grammar_from_gbnf(text, len, lim, out, err, err_cap);
    case SD_CONSTRAINT_NONE: break;
    }
    return SD_ERR_INVALID_ARG;
}

typedef struct cache_entry {
    sd_constraint_kind kind;
    char *text; /* owned, len bytes */
    size_t len;
    uint64_t hash;
    sd_grammar *g; /* owned */
    int32_t users; /* pins */
    uint64_t used; /* the cache's clock at the last get */
} cache_entry;

struct sd_grammar_cache {
    sd_constrain_limits lim;
    int32_t capacity;
    cache_entry *e;
    int32_t n, cap_e;
    uint64_t clock;
    int64_t hits, misses;
};

static uint64_t text_hash(sd_constraint_kind kind, const char *text, size_t len) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)text[i]) * 1099511628211ull;
    return h;
}

sd_status sd_grammar_cache_create(int32_t capacity, const sd_constrain_limits *lim, sd_grammar_cache **out) {
    if (!out || capacity < 1) return SD_ERR_INVALID_ARG;
    sd_grammar_cache *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->lim = lim ? *lim : sd_constrain_default_limits();
    c->capacity = capacity;
    *out = c;
    return SD_OK;
}

static void entry_drop(cache_entry *e) {
    free(e->text);
    sd_grammar_free(&e->g);
}

void sd_grammar_cache_free(sd_grammar_cache **pc) {
    if (!pc || !*pc) return;
    sd_grammar_cache *c = *pc;
    for (int32_t i = 0; i < c->n; i++) entry_drop(&c->e[i]);
    free(c->e);
    free(c);
    *pc = NULL;
}

/* A free entry for a new grammar: a new one below capacity (or when every
 * entry is pinned), else the least recently used unpinned one, emptied. */
static cache_entry *entry_for_new(sd_grammar_cache *c) {
    int32_t victim = -1;
    if (c->n >= c->capacity)
        for (int32_t i = 0; i < c->n; i++)
            if (c->e[i].users == 0 && (victim < 0 || c->e[i].used < c->e[victim].used)) victim = i;
    if (victim >= 0) {
        entry_drop(&c->e[victim]);
        memset(&c->e[victim], 0, sizeof c->e[victim]);
        return &c->e[victim];
    }
    if (c->n == c->cap_e) {
        int32_t cap = c->cap_e ? c->cap_e * 2 : 8;
        cache_entry *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (!e) return NULL;
        c->e = e;
        c->cap_e = cap;
    }
    cache_entry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    return e;
}

sd_status sd_grammar_cache_get(sd_grammar_cache *c, sd_constraint_kind kind, const char *text, size_t len,
                               const sd_grammar **out, char *err, size_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    if (!c || !out || (len > 0 && !text)) return SD_ERR_INVALID_ARG;
    uint64_t h = text_hash(kind, text, len);
    c->clock++;
    for (int32_t i = 0; i < c->n; i++) {
        cache_entry *e = &c->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && (len == 0 || memcmp(e->text, text, len) == 0)) {
            e->users++;
            e->used = c->clock;
            c->hits++;
            *out = e->g;
            return SD_OK;
        }
    }
    c->misses++;
    sd_grammar *g = NULL;
    SD_TRY(sd_grammar_compile(kind, text, len, &c->lim, &g, err, err_cap));
    char *copy = malloc(len + 1);
    cache_entry *e = copy ? entry_for_new(c) : NULL;
    if (!e) {
        free(copy);
        sd_grammar_free(&g);
        return SD_ERR_NOMEM;
    }
    if (len > 0) memcpy(copy, text, len);
    copy[len] = '\0';
    *e = (cache_entry){.kind = kind, .text = copy, .len = len, .hash = h, .g = g, .users = 1, .used = c->clock};
    *out = g;
    return SD_OK;
}

void sd_grammar_cache_put(sd_grammar_cache *c, const sd_grammar *g) {
    if (!c || !g) return;
    for (int32_t i = 0; i < c->n; i++)
        if (c->e[i].g == g && c->e[i].users > 0) {
            c->e[i].users--;
            return;
        }
}

sd_grammar_cache_stats sd_grammar_cache_get_stats(const sd_grammar_cache *c) {
    sd_grammar_cache_stats st = {0};
    if (!c) return st;
    st.hits = c->hits;
    st.misses = c->misses;
    st.entries = c->n;
    for (int32_t i = 0; i < c->n; i++) st.pinned += c->e[i].users > 0;
    return st;
}
