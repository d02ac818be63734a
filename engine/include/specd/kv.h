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
 * reads/writes entries through the pointers it is given).
 *
 * Prefix cache (off until sd_kv_prefix_enable; kv_prefix.c): a full block
 * whose tokens are final can be registered under its identity (its parent
 * block, its tokens, the cache's salt); a new sequence adopts the longest
 * chain of registered blocks matching its prompt instead of computing it.
 * Blocks are reference-counted; a block any other sequence or the cache can
 * see is never written again (truncating into one stops at its start, and
 * the caller recomputes the rest; a prompt's partial block is recomputed,
 * or with sd_kv_prefix_set_partial_copy copied from a cached block). Registered blocks that no sequence holds
 * are kept, up to a bound, and evicted least recently used first whenever a
 * grow needs a block: they count as free.
 *
 * Sliding window (kv_window.c; off unless params.window is set): the
 * windowed layers keep their K/V in a group of their own whose blocks are
 * freed once they left the window of every position the sequence can still
 * be truncated to. With the prefix cache, a cached block keeps its window
 * block while the window pool has room (an LRU twin, kv_window.c), and a
 * chain is adopted as far as the window of its next token is kept. */
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
    /* Prefix cache identity: everything outside the tokens that changes a
     * block's contents (the model, a TP rank's slice). sd_model_kv_create
     * sets it; the geometry and the type are mixed in by the cache. */
    uint64_t prefix_salt;
    /* Test hook: every block hashes alike, so only the token and parent
     * comparisons keep lookups right (the forced-collision test). */
    bool prefix_hash_collide;
    /* Sliding window (kv_window.c). window > 0 and windowed[l] true: layer l
     * reads only the last `window` positions of a token, and its K/V live in
     * the window group: pools of window_blocks blocks of their own, a second
     * block table per slot whose blocks that left every reachable window are
     * freed (a local layer holds a window's worth, not a context's). The
     * other layers keep the whole context in the n_blocks pools (for a model
     * whose every layer is windowed they are bookkeeping only: no memory).
     * windowed: [n_layers], borrowed during sd_kv_create only. window_slack:
     * how far below a grow's starting length the sequence may still be
     * truncated with its window intact (a drafter's rollback; default
     * SD_MAX_K); a deeper truncation empties the slot (sd_kv_truncate). */
    int32_t window;
    const bool *windowed;
    int32_t window_slack;
    int32_t window_blocks;
} sd_kv_params;

/* Prefix cache counters (since creation). */
typedef struct sd_kv_prefix_stats {
    uint64_t query_tokens;   /* prompt tokens looked up by sd_kv_prefix_adopt */
    uint64_t hit_tokens;     /* of those, found cached (adopted) */
    uint64_t blocks_evicted; /* registered blocks dropped to make room or keep the bound */
    uint64_t twins_evicted;  /* window group: window blocks of cached blocks taken by a grow */
    int32_t blocks_cached;   /* registered blocks now (held by a sequence or not) */
    int32_t blocks_idle;     /* of those, held by no sequence (evictable) */
} sd_kv_prefix_stats;

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
/* Blocks a grow can take: free ones and cached ones no sequence holds (the
 * main group's; a window group's own bound is its sizing's, kv_window.c). */
int32_t sd_kv_n_free_blocks(const sd_kv *kv);

/* Writes every byte of a host cache's pools once (their values are
 * undefined until a row is written, so nothing is lost), so that no request
 * pays for the pages' first touch: a fault every 4 KiB, which in a virtual
 * machine also exits to the host (bench/results/prefix-cpu.md measured
 * ~2.3 ms per MiB there). With the prefix cache on, blocks keep coming from
 * untouched memory until the cache's share of the pool has been used once.
 * Call it before the cache holds anything. *bytes (may be NULL): what was
 * touched; 0 for a device cache (its memory is resident when allocated). */
sd_status sd_kv_prefault(sd_kv *kv, size_t *bytes);

/* Makes room for seq to hold new_len tokens (allocating blocks); the length
 * is set to new_len. On SD_ERR_OUT_OF_BLOCKS nothing changes. */
sd_status sd_kv_grow(sd_kv *kv, int32_t seq, int32_t new_len);
/* Sets seq's length to len <= current length and frees blocks past it.
 * When len falls inside a block that another sequence or the prefix cache
 * can see, the length stops at that block's start instead (never below the
 * requested len's block): the caller reads sd_kv_seq_len and recomputes the
 * rest. With a window group, a len whose window reaches blocks already freed
 * (a rollback deeper than window_slack below the last grow's start) empties
 * the slot (length 0: the caller recomputes everything). Otherwise the
 * length is always len. */
sd_status sd_kv_truncate(sd_kv *kv, int32_t seq, int32_t len);
/* Frees all of seq's blocks (length 0). */
void sd_kv_release(sd_kv *kv, int32_t seq);

/* ---- sliding window (kv_window.c) ---- */

/* The window group's window in tokens; 0 without a window group. */
int32_t sd_kv_window(const sd_kv *kv);
/* Whether layer's K/V live in the window group (false without one). */
bool sd_kv_layer_windowed(const sd_kv *kv, int32_t layer);
/* seq's window-group table (borrowed, valid until the next grow / truncate /
 * release of seq): one entry per block of sd_kv_block_table, -1 for blocks
 * freed because they left the window; NULL (and *n_blocks 0) without a
 * window group. */
const int32_t *sd_kv_window_table(const sd_kv *kv, int32_t seq, int32_t *n_blocks);
/* Window-group blocks seq holds now (0 without a window group). */
int32_t sd_kv_window_held(const sd_kv *kv, int32_t seq);
/* Window-group blocks that the prefix cache keeps and no sequence holds
 * (evictable: a grow takes them when the pool has no free block). */
int32_t sd_kv_window_idle(const sd_kv *kv);
/* Bytes of every pool (K and V, all layers, both groups): the cache's memory. */
size_t sd_kv_pool_bytes(const sd_kv *kv);

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

/* ---- prefix cache (kv_prefix.c) ---- */

/* Turns the prefix cache on with at most max_idle_blocks registered blocks
 * that no sequence holds (the cache's share of the pool; <= n_blocks), or
 * off with 0 (every idle cached block is freed). */
sd_status sd_kv_prefix_enable(sd_kv *kv, int32_t max_idle_blocks);
bool sd_kv_prefix_enabled(const sd_kv *kv);
/* Adoption also copies the matching first rows of a cached block a prompt
 * ends or diverges inside (instead of the caller recomputing them). Host
 * pools only (SD_ERR_UNSUPPORTED for a device cache); not for the leader of
 * a TP group, whose ranks would not see the copy. Off by default. */
sd_status sd_kv_prefix_set_partial_copy(sd_kv *kv, bool on);

/* Extends seq with the longest chain of cached full blocks that continue it
 * with tokens[len .. n_tokens), where tokens[0 .. n_tokens) is the whole
 * sequence and len its current length; *n_adopted (may be NULL) gets the
 * tokens gained and seq's length grows by that: whole blocks, then, with
 * sd_kv_prefix_set_partial_copy on, the longest run of a cached block that
 * continues them, copied into a block of seq's own.
 * Adopts only while seq's length is a block boundary and every block of it
 * is cached (otherwise, and with the cache off, it adopts nothing). The
 * caller keeps at least one token out of tokens when it needs that token's
 * logits. Hits and lookups count in the stats. */
sd_status sd_kv_prefix_adopt(sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t n_tokens, int32_t *n_adopted);

/* Registers seq's full blocks within its first min(n_tokens, length) tokens
 * whose K/V are final (tokens: those tokens); a block already cached with
 * the same parent and tokens replaces seq's own (the same values, bit for
 * bit: a token's K/V do not depend on the batch or the chunking). No-op
 * with the cache off. */
sd_status sd_kv_prefix_commit(sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t n_tokens);

void sd_kv_prefix_stats_get(const sd_kv *kv, sd_kv_prefix_stats *out);

/* ---- side rows (kv_side.c) ---- */

/* Gives every row of the pool n_floats host floats beside its K/V: a
 * caller's per-token data that lives exactly as the row's K/V do (shared
 * with its block, kept while a cached block is kept, copied with a partial
 * block, overwritten when a reused block is computed again). The EAGLE head
 * in the verifier keeps each position's fused target features there, so a
 * sequence that adopts cached blocks finds their features too
 * (verify_head.c). The cache never reads or clears them. Costs n_blocks *
 * block_size * n_floats floats; enabling again with the same width is a
 * no-op, another width SD_ERR_INVALID_ARG. */
sd_status sd_kv_side_enable(sd_kv *kv, int32_t n_floats);
/* The side rows' width (0: none). */
int32_t sd_kv_side_floats(const sd_kv *kv);
/* seq's side row at pos (< its length), and in *n_rows (may be NULL) how
 * many rows from pos on follow it contiguously (to its block's end, within
 * the length). NULL without side rows or out of range (logged). Borrowed,
 * valid until seq's next grow, truncate, release or adoption. A row in a
 * block that others can see (adopted or registered) is the same for all of
 * them: write it only with what it holds (the same function of the same
 * tokens). */
float *sd_kv_side(sd_kv *kv, int32_t seq, int32_t pos, int32_t *n_rows);

/* Checks every invariant of the block accounting (reference counts equal
 * the block tables' uses, no held or cached block on the free stack, the
 * idle list and the hash table consistent): SD_OK or SD_ERR_INTERNAL with a
 * log line. O(n_blocks + the tables), for tests. */
sd_status sd_kv_check(const sd_kv *kv);

#ifdef __cplusplus
}
#endif
#endif
