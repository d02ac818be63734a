/* kv_prefix.c — the KV cache's prefix cache: full blocks identified by
 * content, shared by reference, kept after their sequences end and evicted
 * least recently used first.
 *
 * Identity. A full block's hash chains its parent's hash (the cache's salt
 * for a first block: the model, the TP slice, the geometry and the KV type),
 * and its block_size tokens. The hash only finds candidates: a lookup
 * accepts a cached block only when its tokens equal the wanted ones and its
 * parent is the very block the sequence holds before it, at the same
 * generation (kv_block.gen is bumped whenever a block stops being cached, so
 * a child whose parent was evicted or rewritten is unreachable). Two
 * prompts whose hashes collide therefore never share K/V; the test hook
 * prefix_hash_collide makes every hash equal to show it.
 *
 * Sharing. A block is shared only through the cache (adopted, or swapped in
 * at registration), and a shared block is never written: grow appends fresh
 * blocks, and truncation into a block that another sequence holds stops at
 * its start (kv.c). A sequence's chain (kv_slot.n_chain) is its leading run
 * of cached blocks; registration and adoption continue it.
 *
 * Registration (sd_kv_prefix_commit) happens once the tokens of a full
 * block are final (the verifier commits them); if an equal block is already
 * cached, the sequence drops its own copy and holds the cached one, whose
 * values are the same bit for bit (a token's K/V do not depend on the batch
 * or the chunking: the exactness every warm-equals-cold test checks).
 *
 * Eviction. A cached block no sequence holds is idle, on a doubly linked
 * list from least to most recently used. A grow takes a free block first,
 * then the oldest idle one (so a cold request never waits or fails because
 * of the cache: idle blocks count as free), and the idle list never holds
 * more than max_idle blocks (the bound the verifier's --prefix-cache-blocks
 * sets). A sequence's blocks go idle last block first, so a chain's tail is
 * evicted before its head.
 *
 * Partial blocks are never shared. A prompt that ends or diverges inside a
 * cached block either recomputes its rows there (up to block_size - 1) or,
 * with partial_copy on, copies them into a block of its own: the cached
 * children of each block are linked (first_child / sib_*) so the one with
 * the longest matching run is found without hashing. Copying is far
 * cheaper (SmolLM2: at most 737 KB, ~32 us at the measured 23 GB/s, against
 * ~1.8 ms per recomputed row of a prefill, bench/results/forward-cpu.md),
 * but only a host cache of a single process can do it: a device cache
 * would need a copy op, and the ranks of a TP group write and read the
 * leader's block ids without seeing its copies.
 *
 * Sliding-window layers (kv_window.c). On a cache with a window group a
 * cached block keeps its windowed rows in a window block of its own (its
 * twin) while the window pool has room; adoption stops where the next
 * token's window is not kept, and a partial copy takes its windowed rows
 * from the child's twin. */
#include "kv_impl.h"

#include <stdlib.h>
#include <string.h>

/* splitmix64's finalizer: a fast, well-mixed 64-bit step. */
static uint64_t mix(uint64_t h, uint64_t x) {
    uint64_t z = h ^ (x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t salt_of(const sd_kv *kv) {
    const sd_kv_params *p = &kv->p;
    uint64_t h = mix(0, p->prefix_salt);
    h = mix(h, (uint64_t)p->n_layers);
    h = mix(h, (uint64_t)p->n_kv_heads);
    h = mix(h, (uint64_t)p->head_dim);
    h = mix(h, (uint64_t)p->block_size);
    return mix(h, (uint64_t)p->type);
}

static uint64_t block_hash(const sd_kv *kv, uint64_t parent_hash, const int32_t *tokens) {
    if (kv->p.prefix_hash_collide) return 0;
    uint64_t h = parent_hash;
    for (int32_t i = 0; i < kv->p.block_size; i++) h = mix(h, (uint32_t)tokens[i]);
    return h;
}

static int32_t *tokens_of(sd_kv *kv, int32_t b) { return kv->block_tokens + (size_t)b * (size_t)kv->p.block_size; }

/* ---- the idle list ---- */

static void idle_unlink(sd_kv *kv, int32_t b) {
    kv_block *k = &kv->blocks[b];
    if (k->lru_prev >= 0)
        kv->blocks[k->lru_prev].lru_next = k->lru_next;
    else
        kv->lru_old = k->lru_next;
    if (k->lru_next >= 0)
        kv->blocks[k->lru_next].lru_prev = k->lru_prev;
    else
        kv->lru_new = k->lru_prev;
    k->lru_prev = k->lru_next = -1;
    kv->n_idle--;
}

static void idle_push_new(sd_kv *kv, int32_t b) {
    kv_block *k = &kv->blocks[b];
    k->lru_prev = kv->lru_new;
    k->lru_next = -1;
    if (kv->lru_new >= 0)
        kv->blocks[kv->lru_new].lru_next = b;
    else
        kv->lru_old = b;
    kv->lru_new = b;
    kv->n_idle++;
}

/* ---- the hash table ---- */

static void hash_insert(sd_kv *kv, int32_t b) {
    uint32_t i = (uint32_t)kv->blocks[b].hash & (kv->n_buckets - 1);
    kv->blocks[b].hnext = kv->buckets[i];
    kv->buckets[i] = b;
}

static void hash_remove(sd_kv *kv, int32_t b) {
    int32_t *at = &kv->buckets[(uint32_t)kv->blocks[b].hash & (kv->n_buckets - 1)];
    while (*at >= 0 && *at != b) at = &kv->blocks[*at].hnext;
    if (*at == b) *at = kv->blocks[b].hnext;
    kv->blocks[b].hnext = -1;
}

/* The cached block that follows parent (-1: a first block) with tokens. */
static int32_t lookup(sd_kv *kv, int32_t parent, uint64_t hash, const int32_t *tokens) {
    uint32_t parent_gen = parent >= 0 ? kv->blocks[parent].gen : 0;
    size_t bytes = (size_t)kv->p.block_size * sizeof *tokens;
    for (int32_t b = kv->buckets[(uint32_t)hash & (kv->n_buckets - 1)]; b >= 0; b = kv->blocks[b].hnext) {
        const kv_block *k = &kv->blocks[b];
        if (k->hash == hash && k->parent == parent && k->parent_gen == parent_gen &&
            memcmp(tokens_of(kv, b), tokens, bytes) == 0)
            return b;
    }
    return -1;
}

/* ---- the tree of cached children ---- */

static int32_t *children_of(sd_kv *kv, int32_t parent) {
    return parent >= 0 ? &kv->blocks[parent].first_child : &kv->first_root;
}

static void tree_link(sd_kv *kv, int32_t b, int32_t parent) {
    kv_block *k = &kv->blocks[b];
    int32_t *head = children_of(kv, parent);
    k->sib_prev = -1;
    k->sib_next = *head;
    if (*head >= 0) kv->blocks[*head].sib_prev = b;
    *head = b;
    k->linked = true;
}

/* Takes b out of its parent's children and detaches its own children (they
 * stay cached, unreachable: their parent's generation changes). */
static void tree_unlink(sd_kv *kv, int32_t b) {
    kv_block *k = &kv->blocks[b];
    if (k->linked) {
        if (k->sib_prev >= 0)
            kv->blocks[k->sib_prev].sib_next = k->sib_next;
        else
            *children_of(kv, k->parent) = k->sib_next;
        if (k->sib_next >= 0) kv->blocks[k->sib_next].sib_prev = k->sib_prev;
    }
    k->sib_prev = k->sib_next = -1;
    k->linked = false;
    for (int32_t c = k->first_child, next; c >= 0; c = next) {
        next = kv->blocks[c].sib_next;
        kv->blocks[c].sib_prev = kv->blocks[c].sib_next = -1;
        kv->blocks[c].linked = false;
    }
    k->first_child = -1;
}

void sd_kv_uncache_block_(sd_kv *kv, int32_t b) {
    kv_block *k = &kv->blocks[b];
    if (!k->cached) return;
    tree_unlink(kv, b);
    hash_remove(kv, b);
    sd_kv_window_detach_(kv, b);
    if (k->ref == 0) idle_unlink(kv, b);
    k->cached = false;
    k->gen++;
    k->parent = -1;
    kv->n_cached--;
}

/* Evicts the least recently used idle block onto the free stack. */
static void evict_oldest(sd_kv *kv) {
    int32_t b = kv->lru_old;
    sd_kv_uncache_block_(kv, b);
    kv->stats.blocks_evicted++;
    kv->free_stack[kv->n_free++] = b;
}

int32_t sd_kv_take_block_(sd_kv *kv) {
    if (kv->n_free == 0) evict_oldest(kv); /* the caller checked n_free + n_idle */
    return kv->free_stack[--kv->n_free];
}

void sd_kv_drop_block_(sd_kv *kv, int32_t b) {
    kv_block *k = &kv->blocks[b];
    if (--k->ref > 0) return;
    if (!k->cached) {
        kv->free_stack[kv->n_free++] = b;
        return;
    }
    idle_push_new(kv, b);
    while (kv->n_idle > kv->max_idle) evict_oldest(kv);
}

static void tables_free(sd_kv *kv) {
    free(kv->block_tokens);
    free(kv->buckets);
    kv->block_tokens = NULL;
    kv->buckets = NULL;
}

void sd_kv_prefix_free_(sd_kv *kv) {
    tables_free(kv);
    sd_kv_side_free_(kv); /* the rows cached blocks carry beside their K/V */
}

sd_status sd_kv_prefix_enable(sd_kv *kv, int32_t max_idle_blocks) {
    if (!kv || max_idle_blocks < 0 || max_idle_blocks > kv->p.n_blocks) {
        SD_ERROR("kv: the prefix cache's bound must be in [0, %d] blocks, got %d", kv ? (int)kv->p.n_blocks : 0,
                 (int)max_idle_blocks);
        return SD_ERR_INVALID_ARG;
    }
    if (max_idle_blocks > 0 && !kv->buckets) {
        uint32_t n = 1;
        while (n < (uint32_t)kv->p.n_blocks) n *= 2;
        kv->block_tokens = malloc((size_t)kv->p.n_blocks * (size_t)kv->p.block_size * sizeof *kv->block_tokens);
        kv->buckets = malloc((size_t)n * sizeof *kv->buckets);
        if (!kv->block_tokens || !kv->buckets) {
            tables_free(kv);
            SD_ERROR("kv: cannot allocate the prefix cache's tables (%d blocks)", (int)kv->p.n_blocks);
            return SD_ERR_NOMEM;
        }
        for (uint32_t i = 0; i < n; i++) kv->buckets[i] = -1;
        kv->n_buckets = n;
    }
    kv->max_idle = max_idle_blocks;
    while (kv->n_idle > kv->max_idle) evict_oldest(kv);
    if (max_idle_blocks == 0) {
        /* off: held blocks leave the cache too (their holders keep them) */
        for (int32_t b = 0; b < kv->p.n_blocks; b++) sd_kv_uncache_block_(kv, b);
        for (int32_t s = 0; s < kv->p.max_seqs; s++) kv->slots[s].n_chain = 0;
    }
    return SD_OK;
}

bool sd_kv_prefix_enabled(const sd_kv *kv) { return kv && kv->max_idle > 0; }

static bool prefix_args_ok(const sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t n_tokens, const char *what) {
    if (!kv || seq < 0 || seq >= kv->p.max_seqs || n_tokens < 0 || (n_tokens > 0 && !tokens)) {
        SD_ERROR("kv: %s: bad arguments (slot %d, %d tokens)", what, (int)seq, (int)n_tokens);
        return false;
    }
    return true;
}

/* Makes room for n more entries in slot's table. */
static sd_status table_reserve(sd_kv *kv, kv_slot *sl, int32_t n) {
    if (sl->n_blocks + n <= sl->cap) return SD_OK;
    int32_t cap = sl->cap ? sl->cap : 4;
    while (cap < sl->n_blocks + n) cap *= 2;
    int32_t *table = realloc(sl->table, (size_t)cap * sizeof *table);
    if (table) sl->table = table;
    int32_t *wtable = table && kv->win ? realloc(sl->wtable, (size_t)cap * sizeof *wtable) : NULL;
    if (wtable) sl->wtable = wtable;
    if (!table || (kv->win && !wtable)) {
        SD_ERROR("kv: cannot allocate a block table of %d entries", (int)cap);
        return SD_ERR_NOMEM;
    }
    sl->cap = cap;
    return SD_OK;
}

sd_status sd_kv_prefix_set_partial_copy(sd_kv *kv, bool on) {
    if (!kv) return SD_ERR_INVALID_ARG;
    if (on && kv->p.pool_alloc) {
        SD_ERROR("kv: partial blocks are copied only in host memory (a device cache recomputes them)");
        return SD_ERR_UNSUPPORTED;
    }
    kv->partial_copy = on;
    return SD_OK;
}

/* After seq's chain (last block parent, -1: none): the cached child of
 * parent sharing the longest run of tokens[0 .. n) (n < block_size), its
 * first j rows copied into a fresh block of seq. Returns j (0: none). */
static int32_t adopt_partial(sd_kv *kv, kv_slot *sl, int32_t parent, const int32_t *tokens, int32_t n) {
    int32_t best = -1, best_j = 0;
    for (int32_t c = *children_of(kv, parent); c >= 0; c = kv->blocks[c].sib_next) {
        const int32_t *ct = tokens_of(kv, c);
        int32_t j = 0;
        while (j < n && ct[j] == tokens[j]) j++;
        if (j > best_j) best = c, best_j = j;
    }
    if (best < 0 || kv->n_free + kv->n_idle - (kv->blocks[best].ref == 0) < 1) return 0; /* no room beside it */
    if (kv->blocks[best].ref++ == 0) idle_unlink(kv, best);  /* held: not evicted by the take below */
    if (!sd_kv_window_copy_partial_(kv, sl, best, best_j)) { /* its windowed rows are not kept */
        sd_kv_drop_block_(kv, best);
        return 0;
    }
    int32_t b = sd_kv_take_block_(kv);
    kv->blocks[b].ref = 1;
    size_t off_dst = (size_t)b * kv->block_floats * kv->elem_bytes,
           off_src = (size_t)best * kv->block_floats * kv->elem_bytes;
    size_t bytes = (size_t)best_j * kv->token_floats * kv->elem_bytes;
    for (int32_t l = 0; l < kv->p.n_layers; l++) {
        if (sd_kv_layer_windowed(kv, l)) continue; /* copied from the twin above */
        memcpy(kv->k_pools[l] + off_dst, kv->k_pools[l] + off_src, bytes);
        memcpy(kv->v_pools[l] + off_dst, kv->v_pools[l] + off_src, bytes);
    }
    sd_kv_side_copy_(kv, b, best, best_j);
    sd_kv_drop_block_(kv, best);
    sl->table[sl->n_blocks++] = b;
    return best_j;
}

sd_status sd_kv_prefix_adopt(sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t n_tokens, int32_t *n_adopted) {
    if (n_adopted) *n_adopted = 0;
    if (!prefix_args_ok(kv, seq, tokens, n_tokens, "prefix_adopt")) return SD_ERR_INVALID_ARG;
    kv_slot *sl = &kv->slots[seq];
    const int32_t bs = kv->p.block_size;
    if (kv->max_idle == 0 || n_tokens <= sl->len) return SD_OK;
    kv->stats.query_tokens += (uint64_t)(n_tokens - sl->len);
    if (sl->len != sl->n_chain * bs) return SD_OK; /* a partial or private block ends it */
    int32_t want = n_tokens / bs - sl->n_blocks;
    SD_TRY(table_reserve(kv, sl, (want > 0 ? want : 0) + 1));
    int32_t parent = sl->n_blocks > 0 ? sl->table[sl->n_blocks - 1] : -1;
    uint64_t h = parent >= 0 ? kv->blocks[parent].hash : salt_of(kv);
    int32_t got = 0, n0 = sl->n_blocks, *cand = sl->table + n0; /* matches, not yet held */
    for (; got < want; got++) {
        const int32_t *bt = tokens + (size_t)(n0 + got) * (size_t)bs;
        uint64_t bh = block_hash(kv, h, bt);
        int32_t b = lookup(kv, parent, bh, bt);
        if (b < 0) break;
        cand[got] = b;
        parent = b;
        h = bh;
    }
    got = sd_kv_window_adoptable_(kv, sl, cand, got); /* as far as the windowed rows are kept */
    for (int32_t i = 0; i < got; i++)
        if (kv->blocks[cand[i]].ref++ == 0) idle_unlink(kv, cand[i]);
    sl->n_blocks += got;
    parent = sl->n_blocks > 0 ? sl->table[sl->n_blocks - 1] : -1;
    sd_kv_window_adopt_(kv, sl, n0);
    sl->n_chain = sl->n_blocks;
    sl->len = sl->n_blocks * bs;
    int32_t rest = n_tokens - sl->len, partial = 0;
    if (kv->partial_copy && rest > 0)
        partial = adopt_partial(kv, sl, parent, tokens + sl->len, rest < bs ? rest : bs - 1);
    sl->len += partial;
    kv->stats.hit_tokens += (uint64_t)got * (uint64_t)bs + (uint64_t)partial;
    if (n_adopted) *n_adopted = got * bs + partial;
    return SD_OK;
}

sd_status sd_kv_prefix_commit(sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t n_tokens) {
    if (!prefix_args_ok(kv, seq, tokens, n_tokens, "prefix_commit")) return SD_ERR_INVALID_ARG;
    if (kv->max_idle == 0) return SD_OK;
    kv_slot *sl = &kv->slots[seq];
    const int32_t bs = kv->p.block_size;
    int32_t n = n_tokens < sl->len ? n_tokens : sl->len;
    int32_t n_full = n / bs;
    for (int32_t i = sl->n_chain; i < n_full; i++) {
        int32_t parent = i > 0 ? sl->table[i - 1] : -1;
        uint64_t ph = parent >= 0 ? kv->blocks[parent].hash : salt_of(kv);
        const int32_t *bt = tokens + (size_t)i * (size_t)bs;
        uint64_t bh = block_hash(kv, ph, bt);
        int32_t own = sl->table[i], b = lookup(kv, parent, bh, bt);
        if (b >= 0) {
            /* already cached (another sequence computed it): hold that one */
            if (kv->blocks[b].ref++ == 0) idle_unlink(kv, b);
            sl->table[i] = b;
            sd_kv_drop_block_(kv, own);
        } else {
            kv_block *k = &kv->blocks[own];
            k->cached = true;
            k->hash = bh;
            k->parent = parent;
            k->parent_gen = parent >= 0 ? kv->blocks[parent].gen : 0;
            memcpy(tokens_of(kv, own), bt, (size_t)bs * sizeof *bt);
            hash_insert(kv, own);
            tree_link(kv, own, parent);
            kv->n_cached++;
        }
        sd_kv_window_attach_(kv, sl, i); /* its windowed rows, while the slot holds them */
        sl->n_chain = i + 1;
    }
    return SD_OK;
}

void sd_kv_prefix_stats_get(const sd_kv *kv, sd_kv_prefix_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!kv) return;
    *out = kv->stats;
    out->blocks_cached = kv->n_cached;
    out->blocks_idle = kv->n_idle;
}
