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
 * entry before reading it, so the cost buys nothing. */
#include "specd/kv.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The one process-wide counter: cache identities for sd_kv_uid. */
static atomic_uint_fast64_t next_uid = 1;

typedef struct kv_slot {
    int32_t len;      /* tokens stored */
    int32_t n_blocks; /* blocks in table */
    int32_t cap;      /* capacity of table */
    int32_t *table;   /* [cap] block ids, first n_blocks valid */
} kv_slot;

struct sd_kv {
    sd_kv_params p;
    size_t elem_bytes;       /* 4 (f32) or 2 (f16) */
    size_t token_floats;     /* values per token: n_kv_heads * head_dim */
    size_t block_floats;     /* block_size * token_floats */
    unsigned char **k_pools; /* [n_layers] -> [n_blocks * block_floats] values */
    unsigned char **v_pools; /* [n_layers] -> [n_blocks * block_floats] values */
    int32_t *free_stack;     /* [n_blocks] free block ids; top at n_free-1 */
    int32_t n_free;
    kv_slot *slots; /* [max_seqs] */
    uint64_t uid;
};

sd_kv_params sd_kv_default_params(void) {
    sd_kv_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
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
    if (!kv->k_pools || !kv->v_pools || !kv->free_stack || !kv->slots) goto nomem;
    if ((p->pool_alloc == NULL) != (p->pool_free == NULL)) {
        SD_ERROR("kv: pool_alloc and pool_free go together");
        sd_kv_free(&kv);
        return SD_ERR_INVALID_ARG;
    }
    for (int32_t l = 0; l < p->n_layers; l++) {
        kv->k_pools[l] = p->pool_alloc ? p->pool_alloc(p->pool_ctx, pool_bytes) : malloc(pool_bytes);
        kv->v_pools[l] = p->pool_alloc ? p->pool_alloc(p->pool_ctx, pool_bytes) : malloc(pool_bytes);
        if (!kv->k_pools[l] || !kv->v_pools[l]) goto nomem;
    }
    kv->uid = atomic_fetch_add(&next_uid, 1);
    /* Block 0 on top: a fresh cache hands out blocks 0, 1, 2, ... */
    for (int32_t i = 0; i < p->n_blocks; i++) kv->free_stack[i] = p->n_blocks - 1 - i;
    kv->n_free = p->n_blocks;
    *out = kv;
    return SD_OK;

nomem:
    SD_ERROR("kv: cannot allocate the cache: %d layers x 2 pools of %.1f MiB (%.1f MiB in all, %s memory)",
             (int)p->n_layers, (double)pool_bytes / 1048576.0,
             2.0 * (double)p->n_layers * (double)pool_bytes / 1048576.0, p->pool_alloc ? "device" : "host");
    sd_kv_free(&kv);
    return SD_ERR_NOMEM;
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
        for (int32_t s = 0; s < kv->p.max_seqs; s++) free(kv->slots[s].table);
    free(kv->slots);
    free(kv->free_stack);
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

int32_t sd_kv_n_free_blocks(const sd_kv *kv) { return kv->n_free; }

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
    if (extra > kv->n_free) {
        SD_DEBUG("kv: grow: slot %d needs %d more blocks for length %d, %d free", (int)seq, (int)extra, (int)new_len,
                 (int)kv->n_free);
        return SD_ERR_OUT_OF_BLOCKS;
    }
    if (need > sl->cap) {
        /* need <= n_blocks of the pool (extra <= n_free), so doubling stays small. */
        int32_t cap = sl->cap ? sl->cap : 4;
        while (cap < need) cap = cap > kv->p.n_blocks / 2 ? kv->p.n_blocks : cap * 2;
        int32_t *table = realloc(sl->table, (size_t)cap * sizeof *table);
        if (!table) {
            SD_ERROR("kv: grow: cannot allocate a block table of %d entries", (int)cap);
            return SD_ERR_NOMEM;
        }
        sl->table = table;
        sl->cap = cap;
    }
    for (int32_t i = 0; i < extra; i++) sl->table[sl->n_blocks++] = kv->free_stack[--kv->n_free];
    sl->len = new_len;
    return SD_OK;
}

/* Pushes slot's blocks past the first keep back on the free stack, last
 * block first, so the earliest freed block ends on top. */
static void free_tail(sd_kv *kv, kv_slot *sl, int32_t keep) {
    for (int32_t b = sl->n_blocks - 1; b >= keep; b--) kv->free_stack[kv->n_free++] = sl->table[b];
    sl->n_blocks = keep;
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
    free_tail(kv, sl, blocks_for(kv, len));
    sl->len = len;
    return SD_OK;
}

void sd_kv_release(sd_kv *kv, int32_t seq) {
    if (!seq_ok(kv, seq, "release")) return;
    kv_slot *sl = &kv->slots[seq];
    free_tail(kv, sl, 0);
    sl->len = 0;
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
