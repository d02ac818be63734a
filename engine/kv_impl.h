/* kv_impl.h — the paged KV cache's state, shared by kv.c (pools, slots,
 * grow/truncate) and kv_prefix.c (block identities, adoption, eviction).
 * Internal to engine/. */
#ifndef SPECD_KV_IMPL_H
#define SPECD_KV_IMPL_H

#include "specd/kv.h"

typedef struct kv_slot {
    int32_t len;      /* tokens stored */
    int32_t n_blocks; /* blocks in table */
    int32_t cap;      /* capacity of table */
    int32_t *table;   /* [cap] block ids, first n_blocks valid */
    int32_t n_chain;  /* the first n_chain blocks of table are cached (registered) */
    /* window group (kv_window.c; NULL / 0 without one): */
    int32_t *wtable; /* [cap] window-group block of each block of table, -1 once freed */
    int32_t w_lo;    /* wtable[0 .. w_lo) were freed (left the window) */
} kv_slot;

/* The window group (kv_window.c): the windowed layers' pools hold n_blocks
 * blocks of their own. A window block is free, held (ref > 0: in ref slots'
 * wtables) or idle (ref 0, the twin of a cached main block: on the window
 * idle list, evicted least recently used first when a grow needs it). */
typedef struct kv_window {
    int32_t window, slack, n_blocks;
    bool *windowed;      /* [n_layers] */
    int32_t *free_stack; /* [n_blocks]; top at n_free-1 */
    int32_t n_free;
    /* prefix cache twins: per window block */
    int32_t *ref;      /* [n_blocks] wtables holding it */
    int32_t *owner;    /* [n_blocks] the cached main block it is the twin of, -1 */
    int32_t *lru_prev; /* [n_blocks] idle list neighbours (older / newer), -1 */
    int32_t *lru_next;
    int32_t lru_old, lru_new, n_idle;
} kv_window;

/* One block's bookkeeping. A block is in exactly one of three states:
 * free (on the free stack: ref 0, not cached), held (ref > 0; cached or
 * private to its one holder) or idle (cached, ref 0: on the LRU list). */
typedef struct kv_block {
    int32_t ref;    /* block tables that hold it */
    bool cached;    /* registered in the hash table */
    uint32_t gen;   /* bumped whenever the block stops being cached: a
                          child registered under (parent, parent_gen) is
                          then unreachable */
    uint64_t hash;  /* identity (valid while cached) */
    int32_t parent; /* block before it in its chain, -1 for a first block */
    uint32_t parent_gen;
    int32_t hnext;    /* next block in its hash bucket, -1 */
    int32_t lru_prev; /* idle list neighbours (older / newer), -1 */
    int32_t lru_next;
    /* cached children, for partial matches (kv_prefix.c): the first child,
     * and this block's neighbours among its parent's children (or the
     * first blocks); linked while it is cached under a cached parent */
    int32_t first_child, sib_prev, sib_next;
    bool linked;
    int32_t wtwin; /* window group: the window block with this cached block's
                      windowed rows (kv_window.c), -1 */
} kv_block;

struct sd_kv {
    sd_kv_params p;
    size_t elem_bytes;       /* 4 (f32) or 2 (f16) */
    size_t token_floats;     /* values per token: n_kv_heads * head_dim */
    size_t block_floats;     /* block_size * token_floats */
    unsigned char **k_pools; /* [n_layers] -> [n_blocks * block_floats] values */
    unsigned char **v_pools; /* [n_layers] -> [n_blocks * block_floats] values */
    int32_t *free_stack;     /* [n_blocks] free block ids; top at n_free-1 */
    int32_t n_free;
    kv_slot *slots;   /* [max_seqs] */
    kv_block *blocks; /* [n_blocks] */
    uint64_t uid;
    /* prefix cache (kv_prefix.c); all zero / NULL while it is off */
    int32_t max_idle;         /* bound on idle blocks; 0: the cache is off */
    int32_t *block_tokens;    /* [n_blocks][block_size] tokens of each cached block */
    int32_t *buckets;         /* [n_buckets] first block of each hash chain, -1 */
    uint32_t n_buckets;       /* a power of two */
    int32_t lru_old, lru_new; /* idle list ends (least / most recently used), -1 */
    int32_t first_root;       /* cached first blocks (parent -1), linked like children, -1 */
    bool partial_copy;        /* sd_kv_prefix_set_partial_copy */
    int32_t n_idle;
    int32_t n_cached;
    sd_kv_prefix_stats stats;
    kv_window *win; /* NULL: no window group */
    /* side rows (kv_side.c); NULL / 0 until sd_kv_side_enable */
    float *side;         /* [n_blocks][block_size][side_floats] */
    int32_t side_floats; /* per row */
};

/* kv_prefix.c, for kv.c: */
/* Takes a block for a grow: a free one, else the least recently used idle
 * one (evicted). The caller has checked that one exists. */
int32_t sd_kv_take_block_(sd_kv *kv);
/* Drops one reference of block b: at 0 it becomes idle (cached) or free. */
void sd_kv_drop_block_(sd_kv *kv, int32_t b);
/* Removes cached block b from the cache (hash table; and the idle list when
 * idle, the caller then owning it). */
void sd_kv_uncache_block_(sd_kv *kv, int32_t b);
void sd_kv_prefix_free_(sd_kv *kv);

/* kv_window.c, for kv.c (all no-ops, or true, without a window group): */
/* Sets up kv->win from kv->p (after the pools' geometry is known). */
sd_status sd_kv_window_init_(sd_kv *kv);
void sd_kv_window_free_(sd_kv *kv);
/* Blocks of layer's pool. */
int32_t sd_kv_window_pool_blocks_(const sd_kv *kv, int32_t layer);
/* Before a grow of sl from its length by extra blocks: whether the window
 * group can supply them (counting the blocks this grow frees first). */
bool sd_kv_window_can_grow_(const sd_kv *kv, const kv_slot *sl, int32_t extra);
/* Frees the blocks that left the window and takes extra new ones (the table
 * capacity is reserved; can_grow said yes). */
void sd_kv_window_grow_(sd_kv *kv, kv_slot *sl, int32_t extra);
/* Frees the window blocks of sl's table entries keep and beyond. */
void sd_kv_window_drop_tail_(sd_kv *kv, kv_slot *sl, int32_t keep);
/* Whether a sequence of length len still has the window of its next token. */
bool sd_kv_window_reaches_(const sd_kv *kv, const kv_slot *sl, int32_t len);
/* Prefix cache twins (kv_window.c): */
/* Makes sl's window entry i the twin of its cached main block table[i]
 * when that block has none and the entry is still held (commit). */
void sd_kv_window_attach_(sd_kv *kv, const kv_slot *sl, int32_t i);
/* Cached main block b leaves the cache: its twin is no longer kept. */
void sd_kv_window_detach_(sd_kv *kv, int32_t b);
/* Adoption: of the main blocks cand[0 .. n) that would follow sl's n_blocks
 * blocks, how many can be adopted with the window of the next token (every
 * entry from the window's start on held by sl or a twin). */
int32_t sd_kv_window_adoptable_(const sd_kv *kv, const kv_slot *sl, const int32_t *cand, int32_t n);
/* Adoption: sl's table grew from n0 blocks by adopted ones: its wtable
 * takes their twins from the next token's window on (adoptable said so). */
void sd_kv_window_adopt_(sd_kv *kv, kv_slot *sl, int32_t n0);
/* Partial copy: a window block for sl's new last entry with the first rows
 * rows of cached main block src's twin; false (nothing changed) when src
 * has no twin or the pool has no block. */
bool sd_kv_window_copy_partial_(sd_kv *kv, kv_slot *sl, int32_t src, int32_t rows);
/* sd_kv_check's part for the window group: NULL or what is wrong. */
const char *sd_kv_window_check_(const sd_kv *kv);
/* kv_side.c, for kv.c and kv_prefix.c: */
/* Copies the first rows side rows of block src into block dst (no-op
 * without side rows). */
void sd_kv_side_copy_(sd_kv *kv, int32_t dst, int32_t src, int32_t rows);
void sd_kv_side_free_(sd_kv *kv);

#endif
