/* spec_tree.c — the coupled rule on a token tree (spec_tree.h).
 *
 * Only the rows the walk reaches are processed: the root's, then the
 * accepted nodes'. Row processing is spec_batch.c's for one chain row:
 * penalties over the generated tokens and the path so far (the tokens
 * committed before that position), then greedy argmax or the processed
 * distribution raced with the (seed, position) key. So the token committed
 * at each position is the one plain decoding commits there. */
#include "specd/spec_tree.h"

#include <string.h>

sd_status sd_spec_tree_accept(const sd_tree_verify *v, float *probs, int32_t *counts, int32_t *hist, int32_t *path,
                              int32_t *tokens, int32_t *n_accepted) {
    if (!v || !v->logits || !v->tree || !v->sampling || !probs || !counts || !path || !tokens || !n_accepted ||
        v->n_vocab < 1 || v->n_generated < 0 || (v->n_generated > 0 && !v->generated) ||
        (sd_sampling_has_penalties(v->sampling) && !hist))
        return SD_ERR_INVALID_ARG;
    const sd_draft_tree *t = v->tree;
    const size_t V = (size_t)v->n_vocab;
    const bool greedy = sd_sampling_is_greedy(v->sampling), penalties = sd_sampling_has_penalties(v->sampling);
    if (t->n_nodes < 0 || t->n_nodes > SD_TREE_MAX_NODES) return SD_ERR_RANGE;
    for (int32_t i = 0; i < t->n_nodes; i++)
        if (t->parent[i] < -1 || t->parent[i] >= i || t->tokens[i] < 0 || t->tokens[i] >= v->n_vocab) {
            SD_ERROR("spec: tree node %d (token %d, parent %d) is malformed", (int)i, (int)t->tokens[i],
                     (int)t->parent[i]);
            return SD_ERR_RANGE;
        }
    if (penalties && v->n_generated > 0) memcpy(hist, v->generated, (size_t)v->n_generated * sizeof *hist);
    int32_t cur = -1, acc = 0; /* cur: the node whose row gives the next position's p (-1: row 0) */
    for (;;) {
        float *row = v->logits + (size_t)(cur + 1) * V;
        if (penalties)
            SD_TRY(sd_sample_penalize(row, v->n_vocab, v->sampling, hist, v->n_generated + acc, counts));
        int32_t x;
        if (greedy) {
            x = sd_argmax(row, v->n_vocab);
        } else {
            SD_TRY(sd_sample_probs_given(row, v->n_vocab, v->sampling, probs));
            x = sd_sample_race(probs, v->n_vocab, v->sampling->seed, v->pos0 + (uint64_t)acc);
            if (x < 0) return SD_ERR_INTERNAL;
        }
        tokens[acc] = x;
        int32_t next = -1;
        for (int32_t i = cur + 1; i < t->n_nodes && next < 0; i++)
            if (t->parent[i] == cur && t->tokens[i] == x) next = i;
        if (next < 0) break;
        path[acc] = next;
        if (penalties) hist[v->n_generated + acc] = x;
        acc++;
        cur = next;
    }
    *n_accepted = acc;
    return SD_OK;
}
