/* draft_constrain.h — structured output in the draft server (issue 35):
 * a constrained DraftSeq's drafts are the tokens its constraint forces
 * (one-hot q, no drafter time), then the drafter's from the context
 * extended by them (a model drafter masked at each step), cut before the
 * first draft the constraint refuses. The slot's constraint state is the
 * engine's per-slot one (specd/constrain_slots.h), synced to the slot's
 * history every step as the verifier's is, so rejections, resends and
 * failover need no special case. Private to draft_serve.c. */
#ifndef SPECD_DRAFT_CONSTRAIN_H
#define SPECD_DRAFT_CONSTRAIN_H

#include "specd/constrain_slots.h"
#include "specd/net.h"
#include "specd/spec_batch.h"

/* One constrained sequence of a draft batch between dcon_begin and
 * dcon_finish. */
typedef struct sd_dcon_seq {
    sd_constraint *con; /* NULL: unconstrained (no constraint, or it could not be followed) */
    int32_t base;       /* con's length at the context's end (rolled back to it at the end) */
    int32_t n_forced;   /* forced drafts, written after the context in the slot's token buffer */
} sd_dcon_seq;

/* Syncs slot's constraint to ctx[0..len) (sq->prompt_len on) and writes
 * the forced drafts (at most min(k, room)) at ctx[len..); con is left
 * advanced over them, so a model drafter continues masked after them. A
 * sequence without a constraint, or cs NULL / tok NULL, gets con NULL. A
 * failure to follow the constraint is logged and drafts unconstrained
 * (the verifier masks and refuses). */
void sd_dcon_begin(sd_con_slots *cs, const sd_tok *tok, int32_t slot, const Specd__DraftSeq *sq, int32_t *ctx,
                   int32_t len, int32_t k, int32_t room, sd_dcon_seq *out);

/* The sequence's drafts: the forced ones (ctx[len..len + n_forced), q one-hot
 * from ids/probs storage of n_forced entries each) then the drafter's dr,
 * cut before the first the constraint refuses or after it ends; con rolled
 * back to base. Returns the count written to tokens / q (<= SD_MAX_K). */
int32_t sd_dcon_finish(sd_dcon_seq *ds, const int32_t *forced, const sd_draft_result *dr, int32_t *tokens,
                       sd_spec_q *q);

#endif
