/* kv.h — paged KV cache: fixed-size blocks, a block table per sequence.
 *
 * Storage is one pool per layer for K and one for V, laid out
 * [n_blocks][block_size][n_kv_heads][head_dim] of the cache's type: f32, or
 * f16 (half the memory; every value rounded once, when written, so a
 * token's K/V and everything computed from them stay independent of the
 * batch). A sequence is a slot id
 * in [0, max_seqs) with a length and a block table; appending grows the table
 * from a free list, truncating to a shorter length is O(1) bookkeeping plus
 * returning whole blocks no longer needed (how rejected draft tokens roll
 * back). Not thread-safe: the owner serializes calls (the forward pass only
 * reads/writes entries through the pointers it is given). */
#ifndef SPECD_KV_H
#define SPECD_KV_H

#include "specd/common.h"
#include "specd/gguf.h" /* sd_dtype */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_kv sd_kv;

typedef struct sd_kv_params {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_size; /* tokens per block (default 16) */
    int32_t n_blocks;   /* blocks in the pool (shared by all sequences) */
    int32_t max_seqs;   /* number of sequence slots */
    sd_dtype type;      /* SD_DTYPE_F32 (the default, 0) or SD_DTYPE_F16 */
    /* Where the pools live. NULL: host memory (malloc). sd_model_kv_create
     * sets its backend's allocator here for a device-resident cache, which
     * must then be freed before the model. */
    void *(*pool_alloc)(void *ctx, size_t bytes);
    void (*pool_free)(void *ctx, void *pool);
    void *pool_ctx;
} sd_kv_params;

/* Defaults: block_size 16, everything else 0 (must be set). */
sd_kv_params sd_kv_default_params(void);

/* Allocates the pools. Caller frees with sd_kv_free. */
sd_status sd_kv_create(const sd_kv_params *p, sd_kv **out);
void sd_kv_free(sd_kv **kv);

const sd_kv_params *sd_kv_params_of(const sd_kv *kv);
/* A number no other cache of this process has had (recorded forwards are
 * keyed by it: a cache freed and another made at the same address must not
 * replay the old one's pools). */
uint64_t sd_kv_uid(const sd_kv *kv);
/* Current length (tokens stored) of seq; 0 for an unused slot. */
int32_t sd_kv_seq_len(const sd_kv *kv, int32_t seq);
int32_t sd_kv_n_free_blocks(const sd_kv *kv);

/* Makes room for seq to hold new_len tokens (allocating blocks); the length
 * is set to new_len. On SD_ERR_OUT_OF_BLOCKS nothing changes. */
sd_status sd_kv_grow(sd_kv *kv, int32_t seq, int32_t new_len);
/* Sets seq's length to len <= current length and frees blocks past it. */
sd_status sd_kv_truncate(sd_kv *kv, int32_t seq, int32_t len);
/* Frees all of seq's blocks (length 0). */
void sd_kv_release(sd_kv *kv, int32_t seq);

/* Pointer to the K (or V) vector of kv head 0 at (layer, seq, pos): the
 * n_kv_heads*head_dim values (float or uint16_t f16, per the type) of that
 * token are contiguous. pos < length. Borrowed; valid until the next
 * grow/truncate/release of seq. */
void *sd_kv_k(sd_kv *kv, int32_t layer, int32_t seq, int32_t pos);
void *sd_kv_v(sd_kv *kv, int32_t layer, int32_t seq, int32_t pos);
/* Block table of seq (borrowed) and its length in blocks. */
const int32_t *sd_kv_block_table(const sd_kv *kv, int32_t seq, int32_t *n_blocks);
/* Base of layer's K/V pool (block b starts at value b*block_size*n_kv_heads*head_dim). */
void *sd_kv_k_pool(sd_kv *kv, int32_t layer);
void *sd_kv_v_pool(sd_kv *kv, int32_t layer);

#ifdef __cplusplus
}
#endif
#endif
