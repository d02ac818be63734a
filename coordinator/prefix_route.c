/* prefix_route.c — the coordinator's own record of which token prefixes
 * each verifier group holds in its prefix cache, for placement.
 *
 * Where it comes from. The coordinator records what it sent: a request's
 * prompt when it is placed on a group, and the tokens the group held for it
 * when it is released there (the verifier registers committed full blocks,
 * kv_prefix.c). Rejected: the workers reporting their block identities —
 * a hash per block per heartbeat, late by a heartbeat, and a second notion
 * of block identity in the protocol. Our own record is immediate and costs
 * no message; what it cannot see is an eviction on the worker, which only
 * makes a hint wrong: the verifier then computes the prefix (its own cache
 * decides, token by token), so a stale record costs time, never output.
 *
 * What it is. Per group slot, chained 64-bit hashes of the full
 * SD_ROUTE_BLOCK-token blocks of recorded prefixes, in two generations of
 * open-addressed sets: inserts go to the current one, and when it
 * is half full the previous one is dropped and the current one becomes the
 * previous (an LRU approximation in bounded memory, 2 x SD_ROUTE_CAP
 * hashes a group). A slot whose worker registration changed (a new
 * verifier in the slot, or the old one restarted) starts empty: a restarted
 * verifier's cache is empty. The block size is the verifiers' default
 * (16); a verifier with other blocks only gets rounder estimates. */
#include "coord.h"

#include <stdlib.h>
#include <string.h>

enum { SD_ROUTE_BLOCK = 16, SD_ROUTE_CAP = 8192 /* a power of two */ };

typedef struct route_set {
    uint64_t keys[SD_ROUTE_CAP]; /* 0 = empty */
    int32_t n;
} route_set;

typedef struct route_group {
    uint64_t worker_id; /* the registration recorded for */
    route_set gen[2];
    int cur;
} route_group;

struct sd_route {
    route_group *groups[SD_COORD_MAX_WORKERS]; /* allocated on first use */
};

sd_route *sd_route_create(void) { return calloc(1, sizeof(sd_route)); }

void sd_route_free(sd_route **r) {
    if (!r || !*r) return;
    for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++) free((*r)->groups[g]);
    free(*r);
    *r = NULL;
}

static uint64_t chain(uint64_t h, const int32_t *tokens) {
    for (int32_t i = 0; i < SD_ROUTE_BLOCK; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001B3ull; /* FNV-1a's prime */
        h ^= h >> 29;
    }
    return h | 1; /* never 0 (the empty key) */
}

static bool set_has(const route_set *s, uint64_t k) {
    for (uint32_t i = (uint32_t)k & (SD_ROUTE_CAP - 1);; i = (i + 1) & (SD_ROUTE_CAP - 1)) {
        if (s->keys[i] == k) return true;
        if (s->keys[i] == 0) return false;
    }
}

static void set_put(route_group *rg, uint64_t k) {
    route_set *s = &rg->gen[rg->cur];
    if (set_has(s, k)) return;
    if (s->n >= SD_ROUTE_CAP / 2) { /* rotate: the older generation is forgotten */
        rg->cur ^= 1;
        s = &rg->gen[rg->cur];
        memset(s, 0, sizeof *s);
    }
    uint32_t i = (uint32_t)k & (SD_ROUTE_CAP - 1);
    while (s->keys[i] != 0) i = (i + 1) & (SD_ROUTE_CAP - 1);
    s->keys[i] = k;
    s->n++;
}

/* Group g's record for registration worker_id (NULL when none and !make). */
static route_group *group_of(sd_route *r, int32_t g, uint64_t worker_id, bool make) {
    if (!r || g < 0 || g >= SD_COORD_MAX_WORKERS) return NULL;
    route_group *rg = r->groups[g];
    if (rg && rg->worker_id != worker_id) {
        memset(rg, 0, sizeof *rg); /* another registration: its cache starts empty */
        rg->worker_id = worker_id;
    }
    if (!rg && make) {
        rg = r->groups[g] = calloc(1, sizeof *rg);
        if (rg) rg->worker_id = worker_id;
    }
    return rg;
}

void sd_route_record(sd_route *r, int32_t g, uint64_t worker_id, const int32_t *tokens, int32_t n) {
    route_group *rg = group_of(r, g, worker_id, true);
    if (!rg || !tokens) return;
    uint64_t h = 0xCBF29CE484222325ull;
    for (int32_t b = 0; (int64_t)(b + 1) * SD_ROUTE_BLOCK <= n; b++) {
        h = chain(h, tokens + (size_t)b * SD_ROUTE_BLOCK);
        set_put(rg, h);
    }
}

int32_t sd_route_cached(sd_route *r, int32_t g, uint64_t worker_id, const int32_t *tokens, int32_t n) {
    route_group *rg = group_of(r, g, worker_id, false);
    if (!rg || !tokens) return 0;
    uint64_t h = 0xCBF29CE484222325ull;
    int32_t hit = 0;
    /* the last token is always computed (its logits are wanted) */
    for (int32_t b = 0; (int64_t)(b + 1) * SD_ROUTE_BLOCK <= n - 1; b++) {
        h = chain(h, tokens + (size_t)b * SD_ROUTE_BLOCK);
        if (!set_has(&rg->gen[0], h) && !set_has(&rg->gen[1], h)) break;
        hit += SD_ROUTE_BLOCK;
    }
    return hit;
}
