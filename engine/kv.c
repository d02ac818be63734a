/* kv.c — paged KV cache: per-layer block pools, a block table per sequence
 * slot, and a stack of free blocks.
 *
 * Layout: for each layer one K pool and one V pool, each
 *   [n_blocks][block_size][n_kv_heads][head_dim] of the cache's type (f32,
 *   or f16: half the memory, each value rounded once when written),
 * so the n_kv_heads*head_dim values of one token are contiguous and a block is
 * one contiguous slab (what a paged-attention kernel wants). A sequence slot
 * owns an ordered list of block ids (its block table); token pos of the slot
 * lives in block table[pos / block_size] at row pos % block_size.
 *
 * Free blocks sit on a stack. Truncation pushes the freed tail blocks back so
 * that the block that was first in the sequence's order is on top: a
 * truncate followed by a regrow gets the very same blocks back in the same
 * order (good locality, and what speculative rollback does all the time).
 *
 * Each slot's table is a small growable array (capacity doubles) rather than
 * a [max_seqs][n_blocks] matrix, which would cost max_seqs*n_blocks ints for
 * a large pool. sd_kv_grow reserves table capacity before it takes any block,
 * so both out-of-blocks and out-of-memory leave the cache exactly as it was.
 *
 * Argument errors (each with one log line): a slot or layer outside its range
 * and a truncate to a length beyond the current one are SD_ERR_RANGE; a
 * negative length or a grow to a length shorter than the current one are
 * SD_ERR_INVALID_ARG. Accessors that return pointers return NULL on a bad
 * argument. Rejected: zeroing blocks on reuse — the forward pass writes every
 * entry before reading it, so the cost buys nothing.
 *
 * Blocks carry a reference count and a cached flag (kv_impl.h) for the
 * prefix cache (kv_prefix.c): grow takes blocks through it (a free one, else
 * an idle cached one, evicted), truncation and release drop references
 * through it. With the cache off every block is free or held by one slot,
 * and all of the above is exactly as described.
 *
 * A window group (kv_window.c) gives the windowed layers pools of their own
 * and each slot a second table (wtable) indexed like the first: grow,
 * truncate and release keep the two in step, and grow frees the window
 * blocks that have left every reachable window. */
#include "kv_impl.h"

#include "specd/sampling.h" /* SD_MAX_K */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The one process-wide counter: cache identities for sd_kv_uid. */
static atomic_uint_fast64_t next_uid = 1;

sd_kv_params sd_kv_default_params(void) {
    sd_kv_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    p.window_slack = SD_MAX_K;
    return p;
}

static sd_status check_params(const sd_kv_params *p) {
    const struct {
        const char *name;
        int32_t v;
    } fields[] = {
        {"n_layers", p->n_layers},     {"n_kv_heads", p->n_kv_heads}, {"head_dim", p->head_dim},
        {"block_size", p->block_size}, {"n_blocks", p->n_blocks},     {"max_seqs", p->max_seqs},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].v <= 0) {
            SD_ERROR("kv: %s must be > 0, got %d", fields[i].name, (int)fields[i].v);
            return SD_ERR_INVALID_ARG;
        }
    }
    return SD_OK;
}

sd_status sd_kv_create(const sd_kv_params *p, sd_kv **out) {
    if (!p || !out) {
        SD_ERROR("kv: create needs params and an out pointer");
        return SD_ERR_INVALID_ARG;
    }
    *out = NULL;
    SD_TRY(check_params(p));
    if (p->type != SD_DTYPE_F32 && p->type != SD_DTYPE_F16) {
        SD_ERROR("kv: the cache holds f32 or f16, not %s", sd_dtype_name(p->type));
        return SD_ERR_INVALID_ARG;
    }
    size_t elem = p->type == SD_DTYPE_F16 ? 2 : 4;

    size_t token_floats, block_floats, pool_floats, pool_bytes;
    if (!sd_mul_ok((size_t)p->n_kv_heads, (size_t)p->head_dim, &token_floats) ||
        !sd_mul_ok(token_floats, (size_t)p->block_size, &block_floats) ||
        !sd_mul_ok(block_floats, (size_t)p->n_blocks, &pool_floats) || !sd_mul_ok(pool_floats, elem, &pool_bytes)) {
        SD_ERROR("kv: pool size overflows (n_blocks %d x block_size %d x n_kv_heads %d x head_dim %d floats)",
                 (int)p->n_blocks, (int)p->block_size, (int)p->n_kv_heads, (int)p->head_dim);
        return SD_ERR_RANGE;
    }

    sd_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return SD_ERR_NOMEM;
    kv->p = *p;
    kv->elem_bytes = elem;
    kv->token_floats = token_floats;
    kv->block_floats = block_floats;
    kv->k_pools = calloc((size_t)p->n_layers, sizeof *kv->k_pools);
    kv->v_pools = calloc((size_t)p->n_layers, sizeof *kv->v_pools);
    kv->free_stack = malloc((size_t)p->n_blocks * sizeof *kv->free_stack);
    kv->slots = calloc((size_t)p->max_seqs, sizeof *kv->slots);
    kv->blocks = calloc((size_t)p->n_blocks, sizeof *kv->blocks);
    if (!kv->k_pools || !kv->v_pools || !kv->free_stack || !kv->slots || !kv->blocks) goto nomem;
    if ((p->pool_alloc == NULL) != (p->pool_free == NULL)) {
        SD_ERROR("kv: pool_alloc and pool_free go together");
        sd_kv_free(&kv);
        return SD_ERR_INVALID_ARG;
    }
    sd_status ws = sd_kv_window_init_(kv);
    if (ws != SD_OK) {
        sd_kv_free(&kv);
        return ws;
    }
    for (int32_t l = 0; l < p->n_layers; l++) {
        /* a windowed layer's pool: window_blocks blocks (checked by init) */
        size_t bytes = (size_t)sd_kv_window_pool_blocks_(kv, l) * block_floats * elem;
        kv->k_pools[l] = p->pool_alloc ? p->pool_alloc(p->pool_ctx, bytes) : malloc(bytes);
        kv->v_pools[l] = p->pool_alloc ? p->pool_alloc(p->pool_ctx, bytes) : malloc(bytes);
        if (!kv->k_pools[l] || !kv->v_pools[l]) goto nomem;
    }
    kv->uid = atomic_fetch_add(&next_uid, 1);
    /* Block 0 on top: a fresh cache hands out blocks 0, 1, 2, ... */
    for (int32_t i = 0; i < p->n_blocks; i++) kv->free_stack[i] = p->n_blocks - 1 - i;
    kv->n_free = p->n_blocks;
    for (int32_t i = 0; i < p->n_blocks; i++)
        kv->blocks[i] = (kv_block){.parent = -1,
                                   .hnext = -1,
                                   .lru_prev = -1,
                                   .lru_next = -1,
                                   .first_child = -1,
                                   .sib_prev = -1,
                                   .sib_next = -1,
                                   .wtwin = -1};
    kv->lru_old = kv->lru_new = kv->first_root = -1;
    *out = kv;
    return SD_OK;

nomem:
    SD_ERROR("kv: cannot allocate the cache: %d layers x 2 pools of %.1f MiB (%.1f MiB in all, %s memory)",
             (int)p->n_layers, (double)pool_bytes / 1048576.0,
             2.0 * (double)p->n_layers * (double)pool_bytes / 1048576.0, p->pool_alloc ? "device" : "host");
    sd_kv_free(&kv);
    return SD_ERR_NOMEM;
}

sd_status sd_kv_prefault(sd_kv *kv, size_t *bytes) {
    if (bytes) *bytes = 0;
    if (!kv) return SD_ERR_INVALID_ARG;
    if (kv->p.pool_alloc) return SD_OK; /* device memory */
    for (int32_t i = 0; i < kv->p.max_seqs; i++)
        if (kv->slots[i].len > 0 || kv->slots[i].n_blocks > 0) {
            SD_ERROR("kv: prefault: sequence %d holds blocks (a cache is prefaulted before it is used)", (int)i);
            return SD_ERR_INVALID_ARG;
        }
    if (kv->n_free != kv->p.n_blocks) {
        SD_ERROR("kv: prefault: %d of %d blocks are cached (a cache is prefaulted before it is used)",
                 (int)(kv->p.n_blocks - kv->n_free), (int)kv->p.n_blocks);
        return SD_ERR_INVALID_ARG;
    }
    size_t total = 0;
    for (int32_t l = 0; l < kv->p.n_layers; l++) {
        size_t n = (size_t)sd_kv_window_pool_blocks_(kv, l) * kv->block_floats * kv->elem_bytes;
        memset(kv->k_pools[l], 0, n);
        memset(kv->v_pools[l], 0, n);
        total += 2 * n;
    }
    if (bytes) *bytes = total;
    return SD_OK;
}

void sd_kv_free(sd_kv **kvp) {
    if (!kvp || !*kvp) return;
    sd_kv *kv = *kvp;
    for (int32_t l = 0; l < kv->p.n_layers; l++) {
        unsigned char *pools[2] = {kv->k_pools ? kv->k_pools[l] : NULL, kv->v_pools ? kv->v_pools[l] : NULL};
        for (int i = 0; i < 2; i++) {
            if (!pools[i]) continue;
            if (kv->p.pool_free)
                kv->p.pool_free(kv->p.pool_ctx, pools[i]);
            else
                free(pools[i]);
        }
    }
    free(kv->k_pools);
    free(kv->v_pools);
    if (kv->slots)
        for (int32_t s = 0; s < kv->p.max_seqs; s++) free(kv->slots[s].table), free(kv->slots[s].wtable);
    free(kv->slots);
    sd_kv_window_free_(kv);
    free(kv->free_stack);
    sd_kv_prefix_free_(kv);
    free(kv->blocks);
    free(kv);
    *kvp = NULL;
}

const sd_kv_params *sd_kv_params_of(const sd_kv *kv) { return &kv->p; }

uint64_t sd_kv_uid(const sd_kv *kv) { return kv ? kv->uid : 0; }

static bool seq_ok(const sd_kv *kv, int32_t seq, const char *what) {
    if (seq < 0 || seq >= kv->p.max_seqs) {
        SD_ERROR("kv: %s: sequence slot %d outside [0, %d)", what, (int)seq, (int)kv->p.max_seqs);
        return false;
    }
    return true;
}

int32_t sd_kv_seq_len(const sd_kv *kv, int32_t seq) {
    if (!seq_ok(kv, seq, "seq_len")) return 0;
    return kv->slots[seq].len;
}

/* The main group's count: a window group sized by sd_model_kv_create
 * holds every slot's bound (model_window.c), so it runs short only for a
 * grow longer than it was sized for, which grow refuses (OUT_OF_BLOCKS). */
int32_t sd_kv_n_free_blocks(const sd_kv *kv) { return kv->n_free + kv->n_idle; }

/* Blocks needed to hold len tokens. */
static int32_t blocks_for(const sd_kv *kv, int32_t len) {
    return (int32_t)(((int64_t)len + kv->p.block_size - 1) / kv->p.block_size);
}

sd_status sd_kv_grow(sd_kv *kv, int32_t seq, int32_t new_len) {
    if (!seq_ok(kv, seq, "grow")) return SD_ERR_RANGE;
    kv_slot *sl = &kv->slots[seq];
    if (new_len < 0 || new_len < sl->len) {
        SD_ERROR("kv: grow: new length %d of slot %d is below its current length %d (use truncate)", (int)new_len,
                 (int)seq, (int)sl->len);
        return SD_ERR_INVALID_ARG;
    }
    int32_t need = blocks_for(kv, new_len);
    int32_t extra = need - sl->n_blocks;
    if (extra > kv->n_free + kv->n_idle || !sd_kv_window_can_grow_(kv, sl, extra)) {
        SD_DEBUG("kv: grow: slot %d needs %d more blocks for length %d, %d free", (int)seq, (int)extra, (int)new_len,
                 (int)(kv->n_free + kv->n_idle));
        return SD_ERR_OUT_OF_BLOCKS;
    }
    if (need > sl->cap) {
        /* need <= n_blocks of the pool (extra <= n_free), so doubling stays small. */
        int32_t cap = sl->cap ? sl->cap : 4;
        while (cap < need) cap = cap > kv->p.n_blocks / 2 ? kv->p.n_blocks : cap * 2;
        int32_t *table = realloc(sl->table, (size_t)cap * sizeof *table);
        if (table) sl->table = table;
        int32_t *wtable = table && kv->win ? realloc(sl->wtable, (size_t)cap * sizeof *wtable) : NULL;
        if (wtable) sl->wtable = wtable;
        if (!table || (kv->win && !wtable)) {
            SD_ERROR("kv: grow: cannot allocate a block table of %d entries", (int)cap);
            return SD_ERR_NOMEM;
        }
        sl->cap = cap;
    }
    sd_kv_window_grow_(kv, sl, extra); /* before n_blocks moves: it frees by the old length */
    for (int32_t i = 0; i < extra; i++) {
        int32_t b = sd_kv_take_block_(kv);
        kv->blocks[b].ref = 1;
        sl->table[sl->n_blocks++] = b;
    }
    sl->len = new_len;
    return SD_OK;
}

/* Drops slot's blocks past the first keep, last block first, so the
 * earliest freed block ends on top of the free stack (and a cached tail is
 * older on the idle list than the blocks before it: evicted first). */
static void free_tail(sd_kv *kv, kv_slot *sl, int32_t keep) {
    sd_kv_window_drop_tail_(kv, sl, keep);
    for (int32_t b = sl->n_blocks - 1; b >= keep; b--) sd_kv_drop_block_(kv, sl->table[b]);
    sl->n_blocks = keep;
    if (sl->n_chain > keep) sl->n_chain = keep;
}

sd_status sd_kv_truncate(sd_kv *kv, int32_t seq, int32_t len) {
    if (!seq_ok(kv, seq, "truncate")) return SD_ERR_RANGE;
    kv_slot *sl = &kv->slots[seq];
    if (len < 0) {
        SD_ERROR("kv: truncate: negative length %d for slot %d", (int)len, (int)seq);
        return SD_ERR_INVALID_ARG;
    }
    if (len > sl->len) {
        SD_ERROR("kv: truncate: length %d of slot %d exceeds its current length %d", (int)len, (int)seq, (int)sl->len);
        return SD_ERR_RANGE;
    }
    int32_t keep = blocks_for(kv, len);
    if (len % kv->p.block_size != 0 && keep <= sl->n_blocks) {
        /* the new last block is partial: later appends write into it */
        int32_t b = sl->table[keep - 1];
        if (kv->blocks[b].ref > 1) {
            keep--; /* seen by another sequence: stop at its start */
            len = keep * kv->p.block_size;
        } else if (kv->blocks[b].cached) {
            sd_kv_uncache_block_(kv, b); /* ours alone: it leaves the cache */
        }
    }
    if (!sd_kv_window_reaches_(kv, sl, len)) keep = len = 0; /* the window was freed: start over */
    free_tail(kv, sl, keep);
    if (sl->n_chain > len / kv->p.block_size) sl->n_chain = len / kv->p.block_size;
    sl->len = len;
    return SD_OK;
}

void sd_kv_release(sd_kv *kv, int32_t seq) {
    if (!seq_ok(kv, seq, "release")) return;
    kv_slot *sl = &kv->slots[seq];
    free_tail(kv, sl, 0);
    sl->len = 0;
}

sd_status sd_kv_check(const sd_kv *kv) {
    const int32_t nb = kv->p.n_blocks;
    int32_t *uses = calloc((size_t)nb, sizeof *uses);
    if (!uses) return SD_ERR_NOMEM;
    const char *bad = NULL;
    int32_t where = -1;
    for (int32_t s = 0; s < kv->p.max_seqs && !bad; s++) {
        const kv_slot *sl = &kv->slots[s];
        if (sl->n_blocks != blocks_for(kv, sl->len) || sl->n_chain > sl->n_blocks) bad = "a slot's table length";
        for (int32_t i = 0; i < sl->n_blocks && !bad; i++) {
            int32_t b = sl->table[i];
            if (b < 0 || b >= nb)
                bad = "a block id in a table";
            else if (i < sl->n_chain && !kv->blocks[b].cached)
                bad = "an uncached block in a slot's chain";
            else
                uses[b]++;
            where = s;
        }
    }
    for (int32_t b = 0; b < nb && !bad; b++) {
        where = b;
        if (uses[b] != kv->blocks[b].ref) bad = "a reference count";
    }
    int32_t n_idle = 0;
    for (int32_t b = kv->lru_old; b >= 0 && !bad && n_idle <= nb; b = kv->blocks[b].lru_next, n_idle++) {
        where = b;
        if (kv->blocks[b].ref != 0 || !kv->blocks[b].cached) bad = "a held or uncached block on the idle list";
    }
    if (!bad && n_idle != kv->n_idle) bad = "the idle count";
    for (int32_t i = 0; i < kv->n_free && !bad; i++) {
        int32_t b = kv->free_stack[i];
        where = b;
        if (b < 0 || b >= nb || kv->blocks[b].ref != 0 || kv->blocks[b].cached || uses[b]++ != 0)
            bad = "a held, cached or doubled block on the free stack";
    }
    int32_t n_held = 0, n_cached = 0;
    for (int32_t b = 0; b < nb; b++) {
        n_held += kv->blocks[b].ref > 0;
        n_cached += kv->blocks[b].cached;
    }
    if (!bad && (n_held + kv->n_free + kv->n_idle != nb || n_cached != kv->n_cached)) bad = "the block totals";
    if (!bad) bad = sd_kv_window_check_(kv);
    free(uses);
    if (bad) {
        SD_ERROR("kv: check: %s is wrong (at %d)", bad, (int)where);
        return SD_ERR_INTERNAL;
    }
    return SD_OK;
}

static void *entry(sd_kv *kv, unsigned char **pools, int32_t layer, int32_t seq, int32_t pos, const char *what) {
    if (layer < 0 || layer >= kv->p.n_layers) {
        SD_ERROR("kv: %s: layer %d outside [0, %d)", what, (int)layer, (int)kv->p.n_layers);
        return NULL;
    }
    if (!seq_ok(kv, seq, what)) return NULL;
    const kv_slot *sl = &kv->slots[seq];
    if (pos < 0 || pos >= sl->len) {
        SD_ERROR("kv: %s: position %d of slot %d outside [0, %d)", what, (int)pos, (int)seq, (int)sl->len);
        return NULL;
    }
    int32_t block = sl->table[pos / kv->p.block_size];
    if (sd_kv_layer_windowed(kv, layer)) {
        block = sl->wtable[pos / kv->p.block_size];
        if (block < 0) {
            SD_ERROR("kv: %s: position %d of slot %d has left the window (layer %d)", what, (int)pos, (int)seq,
                     (int)layer);
            return NULL;
        }
    }
    size_t row = (size_t)(pos % kv->p.block_size);
    return pools[layer] + ((size_t)block * kv->block_floats + row * kv->token_floats) * kv->elem_bytes;
}

void *sd_kv_k(sd_kv *kv, int32_t layer, int32_t seq, int32_t pos) {
    return entry(kv, kv->k_pools, layer, seq, pos, "k");
}

void *sd_kv_v(sd_kv *kv, int32_t layer, int32_t seq, int32_t pos) {
    return entry(kv, kv->v_pools, layer, seq, pos, "v");
}

const int32_t *sd_kv_block_table(const sd_kv *kv, int32_t seq, int32_t *n_blocks) {
    if (!seq_ok(kv, seq, "block_table")) {
        if (n_blocks) *n_blocks = 0;
        return NULL;
    }
    if (n_blocks) *n_blocks = kv->slots[seq].n_blocks;
    return kv->slots[seq].table;
}

static void *pool_of(sd_kv *kv, unsigned char **pools, int32_t layer) {
    if (layer < 0 || layer >= kv->p.n_layers) {
        SD_ERROR("kv: pool: layer %d outside [0, %d)", (int)layer, (int)kv->p.n_layers);
        return NULL;
    }
    return pools[layer];
}

void *sd_kv_k_pool(sd_kv *kv, int32_t layer) { return pool_of(kv, kv->k_pools, layer); }
void *sd_kv_v_pool(sd_kv *kv, int32_t layer) { return pool_of(kv, kv->v_pools, layer); }
