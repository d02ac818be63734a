/* spec_tree.h — verification of a drafted token tree (spec_tree.c).
 *
 * The coupled rule on a tree: the committed token at every position is the
 * target's own (its argmax, or its draw sd_sample_race with the request's
 * (seed, position) key), so at each depth the one child whose token equals
 * it is accepted and the walk goes on from there; the first position with
 * no such child commits the target's token and ends the step. The longest
 * accepted path is the only one: the committed tokens equal plain
 * decoding's whatever the tree holds. */
#ifndef SPECD_SPEC_TREE_H
#define SPECD_SPEC_TREE_H

#include "specd/drafter.h"
#include "specd/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tree's verification over its target logits: row 0 is the context's
 * last token (p for the root's children), row 1 + i node i. */
typedef struct sd_tree_verify {
    float *logits; /* [1 + n_nodes][n_vocab], penalized in place along the walk */
    int32_t n_vocab;
    const sd_draft_tree *tree;
    const sd_sampling *sampling;
    uint64_t pos0;             /* position of the root's children (the random key) */
    const int32_t *generated;  /* [n_generated] for penalties (NULL without) */
    int32_t n_generated;
} sd_tree_verify;

/* Walks v: path[0..*n_accepted) the accepted nodes, tokens[0..*n_accepted]
 * the tokens to commit (the accepted nodes' and the target's next one).
 * Scratch: probs [n_vocab], counts [n_vocab] zeros (left zeroed), hist
 * [n_generated + depth]. SD_ERR_RANGE for a malformed tree. */
sd_status sd_spec_tree_accept(const sd_tree_verify *v, float *probs, int32_t *counts, int32_t *hist, int32_t *path,
                              int32_t *tokens, int32_t *n_accepted);

#ifdef __cplusplus
}
#endif
#endif
