/* drafter_eagle_tree.c — token trees drafted by an EAGLE-3 head
 * (drafter.h, sd_drafter_eagle_propose_tree).
 *
 * EAGLE-2's dynamic tree, read from SafeAILab's and SGLang's descriptions
 * (nothing copied): the root is the context's last token, whose head row
 * (sd_eagle_drafter_prepare) gives the first draft logits. Each candidate
 * node carries the sum of the head's log-probabilities along its path. At
 * depth 1 the root's topk most probable draft ids become nodes; at each
 * later depth the topk best nodes of the depth before are expanded in one
 * head forward (their rows attend to the context's head rows and their own
 * ancestors' rows only, sd_eagle_head_forward_tree) and each gets its topk
 * children. In the end the n_nodes best candidates are kept. A child's
 * score is at most its parent's (log-probabilities are <= 0) and ties go to
 * the shallower node, so the kept set holds every kept node's ancestors.
 *
 * The head row of a node at depth d reads the node's token and the
 * pre-norm output of its parent's row (the root's: the context's last head
 * row), at head position n_ctx - 2 + d, exactly as drafter_eagle.c's chain
 * rows do: a tree whose every node has one child is the chain. The
 * ranking uses the head's raw distribution; for a sampled request each
 * expanded node's first child is the chain drafter's draft there (the
 * coupled race of the head's processed q with the target's uniforms at
 * that position, which the target's own draw meets most often), ranked as
 * its most probable child. Under the coupled rule any tree is exact (the
 * target's own draws decide): the choice of nodes only decides acceptance. */
#include "drafter_eagle_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sd_status sd_tree_shape_check(const sd_tree_shape *t) {
    if (!t) return SD_ERR_INVALID_ARG;
    if (t->topk < 1 || t->topk > SD_TREE_MAX_TOPK || t->n_nodes < 1 || t->n_nodes > SD_TREE_MAX_NODES ||
        t->depth < 1 || t->depth > SD_MAX_K) {
        SD_ERROR("drafter: a tree of top-k %d, %d nodes, depth %d (top-k in [1, %d], nodes in [1, %d], depth in [1, "
                 "%d])",
                 (int)t->topk, (int)t->n_nodes, (int)t->depth, SD_TREE_MAX_TOPK, SD_TREE_MAX_NODES, SD_MAX_K);
        return SD_ERR_RANGE;
    }
    return SD_OK;
}

/* The candidates: every node ever made, in order of creation. */
typedef struct pool {
    int32_t n, cap;
    int32_t *tok, *parent, *depth, *row; /* row: the node's head row once expanded, else -1 */
    double *score;
} pool;

static sd_status pool_init(pool *p, int32_t cap) {
    p->n = 0;
    p->cap = cap;
    p->tok = malloc((size_t)cap * sizeof *p->tok);
    p->parent = malloc((size_t)cap * sizeof *p->parent);
    p->depth = malloc((size_t)cap * sizeof *p->depth);
    p->row = malloc((size_t)cap * sizeof *p->row);
    p->score = malloc((size_t)cap * sizeof *p->score);
    return p->tok && p->parent && p->depth && p->row && p->score ? SD_OK : SD_ERR_NOMEM;
}

static void pool_free(pool *p) {
    free(p->tok);
    free(p->parent);
    free(p->depth);
    free(p->row);
    free(p->score);
}

/* True when candidate a ranks before b: higher score, then shallower, then older. */
static bool ranks_before(const pool *p, int32_t a, int32_t b) {
    if (p->score[a] != p->score[b]) return p->score[a] > p->score[b];
    if (p->depth[a] != p->depth[b]) return p->depth[a] < p->depth[b];
    return a < b;
}

/* best[0..k) = the k best of candidates [from, to) (fewer if there are fewer); returns how many. */
static int32_t best_of(const pool *p, int32_t from, int32_t to, int32_t k, int32_t *best) {
    int32_t n = 0;
    for (int32_t c = from; c < to; c++) {
        int32_t at = n < k ? n++ : k;
        if (at == k && !ranks_before(p, c, best[k - 1])) continue;
        if (at == k) at = k - 1;
        while (at > 0 && ranks_before(p, c, best[at - 1])) {
            best[at] = best[at - 1];
            at--;
        }
        best[at] = c;
    }
    return n;
}

/* The draft id whose target id is token the coupled race picks at
 * position from the head's logits[Vd] processed by s: what the chain
 * drafter drafts there (sd_spec_draft_step), so a sampled request's tree
 * holds the chain's draft. -1 when the race picks nothing. */
static sd_status race_child(eagle_drafter *e, const float *logits, const sd_sampling *s, uint64_t position,
                            int32_t *draft_id) {
    *draft_id = -1;
    if (e->identity) {
        memcpy(e->logits, logits, (size_t)e->n_vocab * sizeof *e->logits);
    } else {
        for (int32_t i = 0; i < e->n_vocab; i++) e->logits[i] = -INFINITY;
        for (int32_t i = 0; i < e->n_draft; i++) e->logits[sd_eagle_head_target_id(e->head, i)] = logits[i];
    }
    SD_TRY(sd_sample_probs_given(e->logits, e->n_vocab, s, e->probs));
    int32_t y = sd_sample_race(e->probs, e->n_vocab, s->seed, position);
    for (int32_t i = 0; y >= 0 && i < e->n_draft && *draft_id < 0; i++)
        if (sd_eagle_head_target_id(e->head, i) == y) *draft_id = i;
    return SD_OK;
}

/* Adds the topk most probable draft ids of logits[Vd] as children of
 * parent (pool index or -1) at depth, scores parent_score + log-probability.
 * A sampled request's race child (race_child, position: the children's)
 * is always among them, first, ranked as the most probable one. */
static sd_status add_children(eagle_drafter *e, pool *p, const float *logits, int32_t parent, int32_t depth,
                              double parent_score, int32_t topk, const sd_sampling *s, uint64_t position) {
    const int32_t Vd = e->n_draft;
    float mx = -INFINITY;
    for (int32_t i = 0; i < Vd; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < Vd; i++) sum += exp((double)logits[i] - (double)mx);
    const double lse = (double)mx + log(sum);
    int32_t ids[SD_TREE_MAX_TOPK], n = 0;
    for (int32_t i = 0; i < Vd; i++) { /* top-k, ties to the lower id */
        if (n == topk && !(logits[i] > logits[ids[n - 1]])) continue;
        int32_t at = n < topk ? n++ : topk - 1;
        while (at > 0 && logits[i] > logits[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
    }
    int32_t race = -1;
    if (!sd_sampling_is_greedy(s)) SD_TRY(race_child(e, logits, s, position, &race));
    if (race >= 0) { /* first; the least probable child makes room when it is not among them */
        int32_t at = 0;
        while (at < n && ids[at] != race) at++;
        if (at == n) at = n - 1;
        for (; at > 0; at--) ids[at] = ids[at - 1];
        ids[0] = race;
    }
    const double best = n > 0 ? (double)logits[ids[race >= 0 && n > 1 ? 1 : 0]] - lse : 0.0;
    for (int32_t j = 0; j < n && p->n < p->cap; j++) {
        const int32_t c = p->n++;
        p->tok[c] = sd_eagle_head_target_id(e->head, ids[j]);
        p->parent[c] = parent;
        p->depth[c] = depth;
        p->row[c] = -1;
        double lp = (double)logits[ids[j]] - lse;
        p->score[c] = parent_score + (j == 0 && race >= 0 && best > lp ? best : lp);
    }
    return SD_OK;
}

/* Keeps the n_nodes best candidates, in order of depth, into out. */
static void keep_best(const pool *p, int32_t n_nodes, int32_t *scratch, sd_draft_tree *out) {
    int32_t sel[SD_TREE_MAX_NODES];
    int32_t n = best_of(p, 0, p->n, n_nodes, sel);
    for (int32_t i = 1; i < n; i++) { /* by depth, the rank kept within one */
        int32_t c = sel[i], j = i;
        while (j > 0 && p->depth[sel[j - 1]] > p->depth[c]) {
            sel[j] = sel[j - 1];
            j--;
        }
        sel[j] = c;
    }
    for (int32_t i = 0; i < p->n; i++) scratch[i] = -1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t c = sel[i];
        scratch[c] = i;
        out->tokens[i] = p->tok[c];
        out->parent[i] = p->parent[c] < 0 ? -1 : scratch[p->parent[c]]; /* a kept parent comes first */
        out->depth[i] = p->depth[c];
    }
    out->n_nodes = n;
}

/* Expands the frontier (pool indices) in one head forward at storage rows
 * head_len.., their logits into logits[n][Vd], their outputs into hid. */
static sd_status expand(eagle_drafter *e, int32_t slot, pool *p, const int32_t *front, int32_t n_front, int32_t n_ctx,
                        int32_t head_len, const float *hid_all, float *hid_out, float *logits, int32_t *path,
                        float *g) {
    const int32_t H = e->H;
    int32_t tokens[SD_TREE_MAX_TOPK], pos[SD_TREE_MAX_TOPK], path_off[SD_TREE_MAX_TOPK];
    bool want[SD_TREE_MAX_TOPK];
    int32_t n_path = 0;
    const int32_t base = n_ctx - 1; /* head rows 0 .. n_ctx - 2 read target features */
    for (int32_t j = 0; j < n_front; j++) {
        const int32_t c = front[j], d = p->depth[c];
        tokens[j] = p->tok[c];
        pos[j] = n_ctx - 2 + d;
        want[j] = true;
        path_off[j] = n_path;
        p->row[c] = head_len + j;
        for (int32_t v = c, k = d - 1; v >= 0; v = p->parent[v], k--) path[n_path + k] = p->row[v];
        n_path += d;
        const int32_t par = p->parent[c];
        const float *src = par < 0 ? e->g_step : hid_all + (size_t)(p->row[par] - base) * (size_t)H;
        memcpy(g + (size_t)j * (size_t)H, src, (size_t)H * sizeof *g);
    }
    const sd_eagle_tree_rows tr = {.pos = pos, .base = base, .path_off = path_off, .path = path};
    return sd_eagle_head_forward_tree(e->head, slot, head_len, n_front, tokens, g, &tr, want, logits, hid_out);
}

sd_status sd_drafter_eagle_propose_tree(sd_drafter *d, int32_t slot, const int32_t *ctx, int32_t n_ctx,
                                        const sd_tree_shape *shape, const sd_sampling *smp, sd_draft_tree *out) {
    if (!d || d->kind != SD_DRAFTER_EAGLE || !ctx || !out || !smp || slot < 0 || slot >= d->params.max_seqs) {
        SD_ERROR("drafter: token trees are drafted by an EAGLE head (slot %d)", (int)slot);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(sd_tree_shape_check(shape));
    out->n_nodes = 0;
    eagle_drafter *e = d->impl;
    bool ready = false;
    SD_TRY(sd_eagle_drafter_prepare(e, slot, ctx, n_ctx, shape->depth + 1, &ready));
    if (!ready) return SD_OK;
    const int32_t K = shape->topk, H = e->H, base = n_ctx - 1;
    /* head rows: the tree's go after the context's, as many as fit */
    const int32_t max_rows = e->max_ctx - base;
    const int32_t cap = K + (shape->depth - 1) * K * K;
    pool p = {0};
    float *logits = malloc((size_t)K * (size_t)e->n_draft * sizeof *logits);
    float *hid = malloc(((size_t)(shape->depth - 1) * (size_t)K + 1) * (size_t)H * sizeof *hid);
    float *g = malloc((size_t)K * (size_t)H * sizeof *g);
    int32_t *path = malloc((size_t)K * (size_t)shape->depth * sizeof *path);
    int32_t *scratch = malloc((size_t)cap * sizeof *scratch);
    sd_status s = logits && hid && g && path && scratch ? pool_init(&p, cap) : SD_ERR_NOMEM;
    if (s == SD_OK) s = add_children(e, &p, e->logits_d, -1, 1, 0.0, K, smp, (uint64_t)n_ctx);
    int32_t level0 = 0, level1 = p.n, n_rows = 0;
    for (int32_t depth = 1; s == SD_OK && depth < shape->depth; depth++) {
        int32_t front[SD_TREE_MAX_TOPK];
        int32_t n_front = best_of(&p, level0, level1, K, front);
        if (n_front > max_rows - n_rows) n_front = max_rows - n_rows;
        if (n_front <= 0) break;
        s = expand(e, slot, &p, front, n_front, n_ctx, base + n_rows, hid, hid + (size_t)n_rows * (size_t)H, logits,
                   path, g);
        for (int32_t j = 0; s == SD_OK && j < n_front; j++)
            s = add_children(e, &p, logits + (size_t)j * (size_t)e->n_draft, front[j], depth + 1, p.score[front[j]], K,
                             smp, (uint64_t)n_ctx + (uint64_t)depth);
        n_rows += n_front;
        level0 = level1;
        level1 = p.n;
    }
    if (s == SD_OK) keep_best(&p, shape->n_nodes, scratch, out);
    pool_free(&p);
    free(logits);
    free(hid);
    free(g);
    free(path);
    free(scratch);
    if (s == SD_OK)
        SD_DEBUG("eagle: slot %d context %d: a tree of %d nodes, %d head rows", (int)slot, (int)n_ctx,
                 (int)out->n_nodes, (int)n_rows);
    return s;
}
