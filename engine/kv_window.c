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
 * The prefix cache (kv_prefix.c). A cached main block can keep a twin: the
 * window block with the same tokens' windowed rows (kv_block.wtwin). A
 * sequence that adopts a chain of n blocks continues at position n*bs and
 * reads the windowed layers from n*bs - window + 1 on, so a chain can be
 * adopted up to its n-th block only when the blocks from that position's
 * block to the n-th all have twins (sd_kv_window_adoptable_); the adopter's
 * wtable takes those twins, w_lo past the rest. Commit attaches every
 * registered block's window block still held (sd_kv_window_attach_). Window
 * blocks are reference-counted like main ones: a slot's grow or tail-drop
 * gives its reference back (with the cache on, a grow keeps the entries of
 * blocks not registered yet, up to the slot's share of the pool: a prompt
 * prefilled in one call is committed after it, drop_point), and a twin no
 * slot holds is idle, on an LRU
 * list of its own, and counts as free: a grow evicts the oldest when the
 * free stack is empty (the main block stays cached, without a twin). So
 * twins live only in the window pool's room that running slots do not use
 * (no memory of their own; the pool's sizing, model_window.c, is
 * unchanged), and a cold request never waits for them. A slot writes a
 * window block only where it writes the main block of the same entry,
 * which is never shared or cached there (kv.c's truncate); a twin is only
 * ever held together with its main block at the same entry, and a main
 * block that leaves the cache detaches its twin, so that window block is
 * then the writer's alone. */
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
    w->ref = calloc((size_t)nb, sizeof *w->ref);
    w->owner = malloc((size_t)nb * sizeof *w->owner);
    w->lru_prev = malloc((size_t)nb * sizeof *w->lru_prev);
    w->lru_next = malloc((size_t)nb * sizeof *w->lru_next);
    if (!w->windowed || !w->free_stack || !w->ref || !w->owner || !w->lru_prev || !w->lru_next)
        return SD_ERR_NOMEM; /* the caller frees kv */
    memcpy(w->windowed, p->windowed, (size_t)p->n_layers * sizeof *w->windowed);
    for (int32_t i = 0; i < nb; i++) {
        w->free_stack[i] = nb - 1 - i; /* block 0 on top */
        w->owner[i] = w->lru_prev[i] = w->lru_next[i] = -1;
    }
    w->n_free = nb;
    w->lru_old = w->lru_new = -1;
    return SD_OK;
}

void sd_kv_window_free_(sd_kv *kv) {
    if (!kv->win) return;
    free(kv->win->windowed);
    free(kv->win->free_stack);
    free(kv->win->ref);
    free(kv->win->owner);
    free(kv->win->lru_prev);
    free(kv->win->lru_next);
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

/* ---- window blocks: free, held, idle (the twin idle list) ---- */

static void idle_unlink(kv_window *w, int32_t b) {
    if (w->lru_prev[b] >= 0)
        w->lru_next[w->lru_prev[b]] = w->lru_next[b];
    else
        w->lru_old = w->lru_next[b];
    if (w->lru_next[b] >= 0)
        w->lru_prev[w->lru_next[b]] = w->lru_prev[b];
    else
        w->lru_new = w->lru_prev[b];
    w->lru_prev[b] = w->lru_next[b] = -1;
    w->n_idle--;
}

static void idle_push_new(kv_window *w, int32_t b) {
    w->lru_prev[b] = w->lru_new;
    w->lru_next[b] = -1;
    if (w->lru_new >= 0)
        w->lru_next[w->lru_new] = b;
    else
        w->lru_old = b;
    w->lru_new = b;
    w->n_idle++;
}

static void push_free(kv_window *w, int32_t b) { w->free_stack[w->n_free++] = b; }

/* A window block for a slot (ref 1): a free one, else the oldest idle twin
 * (its main block stays cached, without a twin). The caller checked that
 * n_free + n_idle > 0. */
static int32_t take(sd_kv *kv) {
    kv_window *w = kv->win;
    int32_t b;
    if (w->n_free > 0) {
        b = w->free_stack[--w->n_free];
    } else {
        b = w->lru_old;
        idle_unlink(w, b);
        kv->blocks[w->owner[b]].wtwin = -1;
        w->owner[b] = -1;
        kv->stats.twins_evicted++;
    }
    w->ref[b] = 1;
    return b;
}

static void hold(kv_window *w, int32_t b) {
    if (w->ref[b]++ == 0 && w->owner[b] >= 0) idle_unlink(w, b);
}

/* A slot gives b back: at 0 it is idle (a twin) or free. */
static void drop(kv_window *w, int32_t b) {
    if (--w->ref[b] > 0) return;
    if (w->owner[b] >= 0)
        idle_push_new(w, b);
    else
        push_free(w, b);
}

/* Window blocks a grow can use if it gives back sl's entries [w_lo, lo):
 * free, idle, and those entries no other slot holds. */
static int32_t available(const sd_kv *kv, const kv_slot *sl, int32_t lo) {
    int32_t n = kv->win->n_free + kv->win->n_idle;
    for (int32_t i = sl->w_lo; i < lo; i++) n += kv->win->ref[sl->wtable[i]] == 1;
    return n;
}

/* The entries a grow by extra blocks gives back: free_point's, but with the
 * prefix cache on, not those of blocks not yet registered (past n_chain: a
 * long prompt prefilled in one call, whose commit comes after it), so that
 * commit can still keep them as twins (the next grow gives them back):
 * while the pool can supply the grow without them, and only as far as the
 * slot then holds no more than its share of the pool (n_blocks / max_seqs,
 * the per-slot bound of the sizing, model_window.c), the newest kept, so
 * that every other slot still finds its own share. */
static int32_t drop_point(const sd_kv *kv, const kv_slot *sl, int32_t extra) {
    int32_t lo = free_point(kv, sl);
    if (kv->max_idle == 0 || lo <= sl->n_chain) return lo;
    int32_t keep = sl->n_chain > sl->w_lo ? sl->n_chain : sl->w_lo;
    int32_t over = sl->n_blocks + extra - keep - kv->win->n_blocks / kv->p.max_seqs;
    if (over > 0) keep += over;
    if (keep >= lo) return lo;
    return extra <= available(kv, sl, keep) ? keep : lo;
}

bool sd_kv_window_can_grow_(const sd_kv *kv, const kv_slot *sl, int32_t extra) {
    if (!kv->win || extra <= 0) return true;
    return extra <= available(kv, sl, free_point(kv, sl));
}

void sd_kv_window_grow_(sd_kv *kv, kv_slot *sl, int32_t extra) {
    kv_window *w = kv->win;
    if (!w) return;
    int32_t lo = drop_point(kv, sl, extra);
    for (int32_t i = sl->w_lo; i < lo; i++) {
        drop(w, sl->wtable[i]);
        sl->wtable[i] = -1;
    }
    if (lo > sl->w_lo) sl->w_lo = lo;
    for (int32_t i = 0; i < extra; i++) sl->wtable[sl->n_blocks + i] = take(kv);
}

void sd_kv_window_drop_tail_(sd_kv *kv, kv_slot *sl, int32_t keep) {
    kv_window *w = kv->win;
    if (!w) return;
    /* last first: a regrow takes the same blocks back in the same order */
    for (int32_t i = sl->n_blocks - 1; i >= keep && i >= sl->w_lo; i--) drop(w, sl->wtable[i]);
    if (sl->w_lo > keep) sl->w_lo = keep;
}

/* ---- twins of cached main blocks (the prefix cache) ---- */

/* The first wtable entry the token at position len reads. */
static int32_t window_entry(const sd_kv *kv, int64_t len) {
    int64_t first = len - kv->win->window + 1;
    return first > 0 ? (int32_t)(first / kv->p.block_size) : 0;
}

void sd_kv_window_attach_(sd_kv *kv, const kv_slot *sl, int32_t i) {
    kv_window *w = kv->win;
    if (!w || i < sl->w_lo) return;
    int32_t b = sl->table[i], wb = sl->wtable[i];
    if (kv->blocks[b].wtwin >= 0 || w->owner[wb] >= 0) return;
    kv->blocks[b].wtwin = wb;
    w->owner[wb] = b;
}

void sd_kv_window_detach_(sd_kv *kv, int32_t b) {
    kv_window *w = kv->win;
    int32_t wb = kv->blocks[b].wtwin;
    if (!w || wb < 0) return;
    kv->blocks[b].wtwin = -1;
    w->owner[wb] = -1;
    if (w->ref[wb] == 0) {
        idle_unlink(w, wb);
        push_free(w, wb);
    }
}

int32_t sd_kv_window_adoptable_(const sd_kv *kv, const kv_slot *sl, const int32_t *cand, int32_t n) {
    if (!kv->win) return n;
    int32_t missing = sl->w_lo - 1, best = 0; /* the last entry without a window block */
    for (int32_t k = 0; k < n; k++) {
        int32_t i = sl->n_blocks + k;
        if (kv->blocks[cand[k]].wtwin < 0) missing = i;
        if (window_entry(kv, (int64_t)(i + 1) * kv->p.block_size) > missing) best = k + 1;
    }
    return best;
}

void sd_kv_window_adopt_(sd_kv *kv, kv_slot *sl, int32_t n0) {
    kv_window *w = kv->win;
    if (!w || sl->n_blocks == n0) return;
    int32_t lo = window_entry(kv, (int64_t)sl->n_blocks * kv->p.block_size);
    for (int32_t i = sl->w_lo; i < lo && i < n0; i++) { /* own entries the window has left */
        drop(w, sl->wtable[i]);
        sl->wtable[i] = -1;
    }
    for (int32_t i = n0; i < sl->n_blocks; i++) {
        sl->wtable[i] = i < lo ? -1 : kv->blocks[sl->table[i]].wtwin;
        if (i >= lo) hold(w, sl->wtable[i]);
    }
    if (lo > sl->w_lo) sl->w_lo = lo;
}

bool sd_kv_window_copy_partial_(sd_kv *kv, kv_slot *sl, int32_t src, int32_t rows) {
    kv_window *w = kv->win;
    if (!w) return true;
    int32_t from = kv->blocks[src].wtwin;
    if (from < 0 || w->n_free + w->n_idle - (w->ref[from] == 0) < 1) return false;
    hold(w, from); /* not evicted by the take */
    int32_t to = take(kv);
    size_t blk = kv->block_floats * kv->elem_bytes, bytes = (size_t)rows * kv->token_floats * kv->elem_bytes;
    for (int32_t l = 0; l < kv->p.n_layers; l++) {
        if (!w->windowed[l]) continue;
        memcpy(kv->k_pools[l] + (size_t)to * blk, kv->k_pools[l] + (size_t)from * blk, bytes);
        memcpy(kv->v_pools[l] + (size_t)to * blk, kv->v_pools[l] + (size_t)from * blk, bytes);
    }
    drop(w, from);
    sl->wtable[sl->n_blocks] = to;
    return true;
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

/* Each window block's holders: wtable entries, a twin's owner. */
static const char *check_holders(const sd_kv *kv, int32_t *uses) {
    const kv_window *w = kv->win;
    for (int32_t s = 0; s < kv->p.max_seqs; s++) {
        const kv_slot *sl = &kv->slots[s];
        if (sl->w_lo < 0 || sl->w_lo > sl->n_blocks) return "a slot's freed window count";
        for (int32_t i = 0; i < sl->n_blocks; i++) {
            int32_t b = sl->wtable[i];
            if (i < sl->w_lo ? b != -1 : (b < 0 || b >= w->n_blocks)) return "a window table entry";
            if (i < sl->w_lo) continue;
            uses[b]++;
            if (w->owner[b] >= 0 && w->owner[b] != sl->table[i]) return "a twin held without its main block";
        }
    }
    for (int32_t b = 0; b < w->n_blocks; b++) {
        int32_t o = w->owner[b];
        if (uses[b] != w->ref[b]) return "a window block's reference count";
        if (o >= 0 && (o >= kv->p.n_blocks || !kv->blocks[o].cached || kv->blocks[o].wtwin != b))
            return "a twin's owner";
    }
    for (int32_t b = 0; b < kv->p.n_blocks; b++) {
        int32_t t = kv->blocks[b].wtwin;
        if (t >= 0 && (t >= w->n_blocks || w->owner[t] != b)) return "a cached block's twin";
    }
    return NULL;
}

const char *sd_kv_window_check_(const sd_kv *kv) {
    const kv_window *w = kv->win;
    if (!w) return NULL;
    int32_t *uses = calloc((size_t)w->n_blocks, sizeof *uses);
    if (!uses) return "memory for the window check";
    const char *bad = check_holders(kv, uses);
    int32_t n_idle = 0, held = 0;
    for (int32_t b = w->lru_old; b >= 0 && !bad && n_idle <= w->n_blocks; b = w->lru_next[b], n_idle++)
        if (w->ref[b] != 0 || w->owner[b] < 0) bad = "a held or unowned block on the window idle list";
    if (!bad && n_idle != w->n_idle) bad = "the window idle count";
    for (int32_t i = 0; i < w->n_free && !bad; i++) {
        int32_t b = w->free_stack[i];
        if (b < 0 || b >= w->n_blocks || w->ref[b] != 0 || w->owner[b] >= 0 || uses[b]++ != 0)
            bad = "a held, twin or doubled block on the window free stack";
    }
    for (int32_t b = 0; b < w->n_blocks; b++) held += w->ref[b] > 0;
    if (!bad && held + w->n_idle + w->n_free != w->n_blocks) bad = "the window block totals";
    free(uses);
    return bad;
}

int32_t sd_kv_window_idle(const sd_kv *kv) { return kv && kv->win ? kv->win->n_idle : 0; }
