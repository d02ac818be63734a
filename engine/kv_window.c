/* kv_window.c — the KV cache's window group: the sliding-window layers'
 * K/V in pools of their own, freed block by block as they leave the window.
 *
 * Why a group of its own. A windowed layer reads a token's last `window`
 * positions only, a global one (Gemma 3: one layer in six) reads them all;
 * with one block table for all layers no block could ever be freed. So the
 * windowed layers get their own pools (window_blocks blocks, far fewer than
 * the context's) and every slot a second table, wtable, indexed like the
 * first (entry i holds positions i*bs .. i*bs+bs-1 of the windowed layers),
 * whose leading entries are -1 once freed. The forward hands the windowed
 * layers wtable instead of table (sd_model_plan.bt_win); attention reads
 * positions from max(0, pos - window + 1) on, so it never touches a freed
 * entry. For a model whose every layer is windowed (Mistral), the main
 * pools have no layer: the main blocks are bookkeeping only. Rejected: one
 * ring of blocks per slot (a prompt prefilled in one call writes more than
 * a window's rows before attention reads them), and per-layer tables (the
 * windowed layers share one window, so one table serves them all).
 *
 * When a block may go. A rollback only removes rows at the end, but it can
 * go below the length the window was last measured from: a verify step
 * grows a sequence from its committed length L and truncates back to at
 * least L; a model drafter grows one token at a time and truncates back up
 * to its draft length. So grow, before it extends a slot of length L, frees
 * the window blocks wholly before position L - slack - window + 1: every
 * length the slot can be truncated to, down to L - slack, keeps the whole
 * window of its next token (positions len - window + 1 .. len), and the
 * tokens the grow adds (positions >= L) read nothing older. slack is
 * params.window_slack (default SD_MAX_K, the longest draft). A deeper
 * truncation, whose window reaches a freed block, empties the slot (kv.c's
 * truncate): the caller sees the shorter length, as after a truncation into
 * a shared block, and recomputes. Freeing happens in grow only, so a slot
 * decoding one token at a time holds at most
 * ceil((window + slack + bs - 1) / bs) + 1 window blocks.
 *
 * Window blocks are private to their slot: the prefix cache is off on a
 * cache with a window group (kv_prefix.c: an adopted chain would lack the
 * windowed layers' rows, which left with their window). */
#include "kv_impl.h"

#include <stdlib.h>
#include <string.h>

sd_status sd_kv_window_init_(sd_kv *kv) {
    const sd_kv_params *p = &kv->p;
    if (p->window == 0) return SD_OK;
    if (p->window < 0 || !p->windowed || p->window_slack < 0) {
        SD_ERROR("kv: a window of %d needs the windowed layers and a slack >= 0 (got %d)", (int)p->window,
                 (int)p->window_slack);
        return SD_ERR_INVALID_ARG;
    }
    int32_t nb = p->window_blocks > 0 ? p->window_blocks : p->n_blocks;
    size_t bytes;
    if (!sd_mul_ok((size_t)nb, kv->block_floats * kv->elem_bytes, &bytes)) {
        SD_ERROR("kv: the window pool of %d blocks overflows", (int)nb);
        return SD_ERR_RANGE;
    }
    kv_window *w = calloc(1, sizeof *w);
    if (!w) return SD_ERR_NOMEM;
    kv->win = w;
    w->window = p->window;
    w->slack = p->window_slack;
    w->n_blocks = nb;
    w->windowed = malloc((size_t)p->n_layers * sizeof *w->windowed);
    w->free_stack = malloc((size_t)nb * sizeof *w->free_stack);
    if (!w->windowed || !w->free_stack) return SD_ERR_NOMEM; /* the caller frees kv */
    memcpy(w->windowed, p->windowed, (size_t)p->n_layers * sizeof *w->windowed);
    for (int32_t i = 0; i < nb; i++) w->free_stack[i] = nb - 1 - i; /* block 0 on top */
    w->n_free = nb;
    return SD_OK;
}

void sd_kv_window_free_(sd_kv *kv) {
    if (!kv->win) return;
    free(kv->win->windowed);
    free(kv->win->free_stack);
    free(kv->win);
    kv->win = NULL;
}

int32_t sd_kv_window(const sd_kv *kv) { return kv && kv->win ? kv->win->window : 0; }

bool sd_kv_layer_windowed(const sd_kv *kv, int32_t layer) {
    return kv && kv->win && layer >= 0 && layer < kv->p.n_layers && kv->win->windowed[layer];
}

int32_t sd_kv_window_pool_blocks_(const sd_kv *kv, int32_t layer) {
    return sd_kv_layer_windowed(kv, layer) ? kv->win->n_blocks : kv->p.n_blocks;
}

/* Entries of sl's wtable that a grow from length len may free: those wholly
 * before position len - slack - window + 1 (see the top of the file). */
static int32_t free_point(const sd_kv *kv, const kv_slot *sl) {
    int64_t first = (int64_t)sl->len - kv->win->slack - kv->win->window + 1;
    int64_t n = first > 0 ? first / kv->p.block_size : 0;
    return n < sl->n_blocks ? (int32_t)n : sl->n_blocks;
}

bool sd_kv_window_can_grow_(const sd_kv *kv, const kv_slot *sl, int32_t extra) {
    if (!kv->win || extra <= 0) return true;
    int32_t lo = free_point(kv, sl);
    return extra <= kv->win->n_free + (lo > sl->w_lo ? lo - sl->w_lo : 0);
}

static void push_free(kv_window *w, int32_t b) { w->free_stack[w->n_free++] = b; }

void sd_kv_window_grow_(sd_kv *kv, kv_slot *sl, int32_t extra) {
    kv_window *w = kv->win;
    if (!w) return;
    int32_t lo = free_point(kv, sl);
    for (int32_t i = sl->w_lo; i < lo; i++) {
        push_free(w, sl->wtable[i]);
        sl->wtable[i] = -1;
    }
    if (lo > sl->w_lo) sl->w_lo = lo;
    for (int32_t i = 0; i < extra; i++) sl->wtable[sl->n_blocks + i] = w->free_stack[--w->n_free];
}

void sd_kv_window_drop_tail_(sd_kv *kv, kv_slot *sl, int32_t keep) {
    kv_window *w = kv->win;
    if (!w) return;
    /* last first: a regrow takes the same blocks back in the same order */
    for (int32_t i = sl->n_blocks - 1; i >= keep && i >= sl->w_lo; i--) push_free(w, sl->wtable[i]);
    if (sl->w_lo > keep) sl->w_lo = keep;
}

bool sd_kv_window_reaches_(const sd_kv *kv, const kv_slot *sl, int32_t len) {
    if (!kv->win || sl->w_lo == 0 || len == 0) return true;
    int64_t first = (int64_t)len - kv->win->window + 1; /* the next token's window starts here */
    return first > 0 && first / kv->p.block_size >= sl->w_lo;
}

const int32_t *sd_kv_window_table(const sd_kv *kv, int32_t seq, int32_t *n_blocks) {
    if (n_blocks) *n_blocks = 0;
    if (!kv || !kv->win || seq < 0 || seq >= kv->p.max_seqs) return NULL;
    if (n_blocks) *n_blocks = kv->slots[seq].n_blocks;
    return kv->slots[seq].wtable;
}

int32_t sd_kv_window_held(const sd_kv *kv, int32_t seq) {
    if (!kv || !kv->win || seq < 0 || seq >= kv->p.max_seqs) return 0;
    return kv->slots[seq].n_blocks - kv->slots[seq].w_lo;
}

size_t sd_kv_pool_bytes(const sd_kv *kv) {
    if (!kv) return 0;
    size_t total = 0;
    for (int32_t l = 0; l < kv->p.n_layers; l++)
        total += 2 * (size_t)sd_kv_window_pool_blocks_(kv, l) * kv->block_floats * kv->elem_bytes;
    return total;
}

const char *sd_kv_window_check_(const sd_kv *kv) {
    const kv_window *w = kv->win;
    if (!w) return NULL;
    char *seen = calloc((size_t)w->n_blocks, 1);
    if (!seen) return "memory for the window check";
    const char *bad = NULL;
    int32_t held = 0;
    for (int32_t s = 0; s < kv->p.max_seqs && !bad; s++) {
        const kv_slot *sl = &kv->slots[s];
        if (sl->w_lo < 0 || sl->w_lo > sl->n_blocks) bad = "a slot's freed window count";
        for (int32_t i = 0; i < sl->n_blocks && !bad; i++) {
            int32_t b = sl->wtable[i];
            if (i < sl->w_lo ? b != -1 : (b < 0 || b >= w->n_blocks || seen[b]++)) bad = "a window table entry";
            held += i >= sl->w_lo;
        }
    }
    for (int32_t i = 0; i < w->n_free && !bad; i++) {
        int32_t b = w->free_stack[i];
        if (b < 0 || b >= w->n_blocks || seen[b]++) bad = "a held or doubled block on the window free stack";
    }
    if (!bad && held + w->n_free != w->n_blocks) bad = "the window block totals";
    free(seen);
    return bad;
}
