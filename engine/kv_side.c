/* kv_side.c — side rows: a caller's per-token floats kept beside the K/V
 * of the same row (kv.h, "side rows").
 *
 * Why here. Some state is, like K/V, a deterministic function of a
 * position's token prefix: the EAGLE-3 head's fused target features
 * (drafter_eagle.c) are. A sequence that adopts cached blocks computes none
 * of their rows, so that state must come with the blocks, and the cache
 * already knows exactly how long a block lives, who shares it and where a
 * partial block is copied from. A side store indexed by physical block
 * rides on all of it: side[b][row][n_floats] for block b, written by the
 * caller when it computes the row (through sd_kv_side), shared with the
 * block, kept while a cached block is kept, copied by adopt_partial
 * (kv_prefix.c) with the K/V rows, overwritten when a reused block's rows
 * are computed again. The cache never reads, clears or checks the values.
 *
 * Host memory whatever the pools' placement (the head runs on the host):
 * n_blocks * block_size * n_floats floats, allocated when enabled. */
#include "kv_impl.h"

#include <stdlib.h>
#include <string.h>

sd_status sd_kv_side_enable(sd_kv *kv, int32_t n_floats) {
    if (!kv || n_floats <= 0) return SD_ERR_INVALID_ARG;
    if (kv->side_floats == n_floats) return SD_OK;
    if (kv->side_floats) {
        SD_ERROR("kv: side rows are already %d floats wide, not %d", (int)kv->side_floats, (int)n_floats);
        return SD_ERR_INVALID_ARG;
    }
    const size_t n = (size_t)kv->p.n_blocks * (size_t)kv->p.block_size * (size_t)n_floats;
    kv->side = malloc(n * sizeof *kv->side);
    if (!kv->side) {
        SD_ERROR("kv: cannot allocate side rows of %d floats for %d blocks (%zu MiB)", (int)n_floats,
                 (int)kv->p.n_blocks, n * sizeof *kv->side >> 20);
        return SD_ERR_NOMEM;
    }
    kv->side_floats = n_floats;
    return SD_OK;
}

int32_t sd_kv_side_floats(const sd_kv *kv) { return kv ? kv->side_floats : 0; }

float *sd_kv_side(sd_kv *kv, int32_t seq, int32_t pos, int32_t *n_rows) {
    if (n_rows) *n_rows = 0;
    if (!kv || !kv->side || seq < 0 || seq >= kv->p.max_seqs) return NULL;
    const kv_slot *sl = &kv->slots[seq];
    if (pos < 0 || pos >= sl->len) {
        SD_ERROR("kv: side: position %d of slot %d outside [0, %d)", (int)pos, (int)seq, (int)sl->len);
        return NULL;
    }
    const int32_t bs = kv->p.block_size, row = pos % bs, end = sl->len - pos, b = sl->table[pos / bs];
    if (b < 0 || b >= kv->p.n_blocks) return NULL; /* a block no longer held (none today) */
    if (n_rows) *n_rows = bs - row < end ? bs - row : end;
    const size_t at = (size_t)b * (size_t)bs + (size_t)row;
    return kv->side + at * (size_t)kv->side_floats;
}

void sd_kv_side_copy_(sd_kv *kv, int32_t dst, int32_t src, int32_t rows) {
    if (!kv->side || rows <= 0) return;
    const size_t block = (size_t)kv->p.block_size * (size_t)kv->side_floats;
    memcpy(kv->side + (size_t)dst * block, kv->side + (size_t)src * block,
           (size_t)rows * (size_t)kv->side_floats * sizeof *kv->side);
}

void sd_kv_side_free_(sd_kv *kv) {
    free(kv->side);
    kv->side = NULL;
    kv->side_floats = 0;
}
