/* model_window.c — the sliding window's part of the model: the window group
 * of the caches it makes (kv_window.c) and the chunked forward such a cache
 * needs.
 *
 * Sizing. A slot holds at most ceil((window + slack + bs - 1 + grown) / bs)
 * + 1 window blocks, grown being the most tokens one forward appends to it
 * (kv_window.c: a grow frees by the length before it). A forward on a
 * window-group cache appends at most WINDOW_CHUNK tokens (the chunks
 * below; a verify step's SD_MAX_K + 1 is fewer), so the window pools get
 * max_seqs times that bound with grown = WINDOW_CHUNK, never more than the
 * main pools (n_blocks). Gemma 3 270M (window 512) with one slot and
 * blocks of 16: 52 window blocks (832 positions) for its 15 local layers,
 * against 257 blocks for the 3 global ones at a 4k context. Not covered: a
 * device verify (keep) whose rows after the first wanted one exceed the
 * chunk (a long append in a verify step) may run out of window blocks
 * (SD_ERR_OUT_OF_BLOCKS). With the prefix cache on, the room that running
 * slots leave holds cached blocks' window twins (idle: a grow takes them),
 * and a slot may keep a prompt's unregistered entries up to its share of
 * the pool, window_blocks / max_seqs (kv_window.c): every slot's bound
 * stays covered.
 *
 * Tensor parallelism. Ranks keep pools only and write at the leader's block
 * ids (model.h), so a rank's window pool must be the leader's: the leader
 * tells its ranks sd_model_kv_window_blocks (GroupSetup.window_blocks), the
 * ranks make theirs with sd_model_kv_create_rank, and every plan carries
 * the window table beside the main one (GroupPlan.bt_win), which a rank
 * checks before it runs (sd_model_window_check_plan: no entry outside the
 * pool, none freed that a token reads). Rejected: ranks keeping their own
 * window bookkeeping (a second allocator that must stay in step).
 *
 * Chunks. A prompt prefilled in one call writes all its rows before any
 * attention reads them, so a window group could not hold it; a batch longer
 * than WINDOW_CHUNK tokens runs in consecutive chunks instead (the tokens
 * of a sequence stay in order, so every chunk continues its sequences).
 * Bit for bit the same logits: a token's result does not depend on the
 * batch (backend_impl.h). With keep (sd_model_forward_verify: the logits
 * stay in the activations for the device's verification) the rows from
 * the first wanted one on go in one last call. A chunk that fails gives
 * every sequence of the batch its starting length back (which may empty a
 * slot whose window has moved: sd_kv_truncate). Rejected: growing the
 * window pools on demand (a device pool cannot move under recorded graphs). */
#include "model_impl.h"

#include <stdlib.h>

enum { WINDOW_CHUNK = 256 }; /* most tokens one forward appends on a window-group cache */

static int32_t blocks_for(int64_t tokens, int32_t bs) { return (int32_t)((tokens + bs - 1) / bs); }

void sd_model_window_params(const sd_model *m, sd_kv_params *p, bool *windowed, int32_t window_blocks) {
    const sd_model_config *c = &m->cfg;
    if (c->sliding_window <= 0 || window_blocks == 0) return;
    for (int32_t l = 0; l < p->n_layers; l++) windowed[l] = sd_model_layer_swa(c, l);
    p->window = c->sliding_window;
    p->windowed = windowed;
    if (window_blocks > 0) { /* a TP rank: the leader's pool (sd_model_kv_create_rank) */
        p->window_blocks = window_blocks;
        return;
    }
    const int32_t bs = p->block_size;
    int64_t per_seq = blocks_for((int64_t)p->window + p->window_slack + bs - 1 + WINDOW_CHUNK, bs) + 1;
    int64_t n = (int64_t)p->max_seqs * per_seq;
    p->window_blocks = n < p->n_blocks ? (int32_t)n : p->n_blocks;
}

/* A rank's plan against its cache's window group (sd_model_plan.bt_win):
 * present exactly when the cache has one, every entry -1 (freed) or inside
 * the window pool, and every entry a token reads or writes (its window's
 * blocks, model_arch.c's attention) a block. */
sd_status sd_model_window_check_plan(const sd_kv *kv, const sd_model_plan *p) {
    const int32_t window = sd_kv_window(kv);
    if ((window > 0) != (p->bt_win != NULL)) {
        SD_ERROR("model: a plan %s a window table, the rank's cache %s a window group", p->bt_win ? "with" : "without",
                 window > 0 ? "has" : "lacks");
        return SD_ERR_RANGE;
    }
    if (!p->bt_win) return SD_OK;
    const sd_kv_params *kp = sd_kv_params_of(kv);
    for (int32_t i = 0; i < p->n_bt; i++)
        if (p->bt_win[i] < -1 || p->bt_win[i] >= kp->window_blocks) {
            SD_ERROR("model: plan window entry %d is block %d, outside the window pool [0, %d)", (int)i,
                     (int)p->bt_win[i], (int)kp->window_blocks);
            return SD_ERR_RANGE;
        }
    for (int32_t t = 0; t < p->n_tokens; t++) { /* check_plan checked pos and bt_off against n_bt */
        int32_t first = p->pos[t] - window + 1;
        for (int32_t e = (first > 0 ? first : 0) / kp->block_size; e <= p->pos[t] / kp->block_size; e++)
            if (p->bt_win[p->bt_off[t] + e] < 0) {
                SD_ERROR("model: plan token %d (position %d) reads window entry %d, which is freed", (int)t,
                         (int)p->pos[t], (int)e);
                return SD_ERR_RANGE;
            }
    }
    return SD_OK;
}

int32_t sd_model_kv_window_blocks(const sd_model *m, int32_t max_seqs, int32_t n_blocks, int32_t block_size) {
    if (!m) return 0;
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = m->n_layers_used;
    if (block_size) p.block_size = block_size;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    bool windowed[SD_MODEL_MAX_LAYERS] = {false};
    sd_model_window_params(m, &p, windowed, -1); /* sd_model_kv_create's sizing */
    return p.window > 0 ? p.window_blocks : 0;
}

bool sd_model_window_chunked(const sd_kv *kv, const sd_batch *b) {
    return kv && b && sd_kv_window(kv) > 0 && b->n_tokens > WINDOW_CHUNK;
}

/* b's tokens [t0, t0 + n) as a batch of their own. */
static sd_batch slice(const sd_batch *b, int32_t t0, int32_t n) {
    return (sd_batch){.n_tokens = n,
                      .tokens = b->tokens + t0,
                      .pos = b->pos + t0,
                      .seq = b->seq + t0,
                      .logits = b->logits ? b->logits + t0 : NULL};
}

static int32_t wanted_in(const sd_batch *b, int32_t t0, int32_t n) {
    int32_t k = 0;
    for (int32_t t = t0; b->logits && t < t0 + n; t++) k += b->logits[t];
    return k;
}

sd_status sd_model_forward_chunks(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out, bool keep,
                                  sd_model_chunk_fn fn) {
    if (!b->tokens || !b->pos || !b->seq) return fn(m, kv, b, n_head, out, keep); /* it says what is missing */
    const int32_t n = b->n_tokens, max_seqs = sd_kv_params_of(kv)->max_seqs;
    int32_t end = n; /* tokens [0, end) in chunks; with keep, [end, n) in one call */
    if (keep)
        for (end = 0; end < n && !(b->logits && b->logits[end]);) end++;
    int32_t *start = malloc((size_t)max_seqs * sizeof *start);
    if (!start) return SD_ERR_NOMEM;
    for (int32_t s = 0; s < max_seqs; s++) start[s] = -1;
    for (int32_t t = 0; t < n; t++)
        if (b->seq[t] >= 0 && b->seq[t] < max_seqs && start[b->seq[t]] < 0)
            start[b->seq[t]] = sd_kv_seq_len(kv, b->seq[t]);
    sd_status s = SD_OK;
    size_t row = 0;
    for (int32_t t0 = 0; s == SD_OK && t0 < end; t0 += WINDOW_CHUNK) {
        int32_t len = end - t0 < WINDOW_CHUNK ? end - t0 : WINDOW_CHUNK;
        sd_batch c = slice(b, t0, len);
        int32_t k = wanted_in(b, t0, len);
        s = fn(m, kv, &c, n_head, k && out ? out + row * (size_t)n_head : out, false);
        row += (size_t)k;
    }
    if (s == SD_OK && end < n) {
        sd_batch c = slice(b, end, n - end);
        s = fn(m, kv, &c, n_head, out, true);
    }
    if (s != SD_OK) /* give the batch's new positions back */
        for (int32_t q = 0; q < max_seqs; q++)
            if (start[q] >= 0 && sd_kv_seq_len(kv, q) > start[q]) sd_kv_truncate(kv, q, start[q]);
    free(start);
    return s;
}
