/* draft_head.h — an EAGLE-3 head as a draft server's drafter
 * (specd-drafter --eagle DIR; draft_head.c): each sequence's features from
 * the DraftSeq are fed to the head before it drafts on the whole context. */
#ifndef SPECD_DRAFT_HEAD_H
#define SPECD_DRAFT_HEAD_H

#include "draft_serve.h"

/* The head's state beside the drafter: the features' width and what they
 * cost since start (sd_draft_head_log). */
typedef struct sd_draft_head {
    int32_t width;   /* floats a position (DraftSeq.features) */
    uint64_t rows;   /* positions whose features arrived */
    uint64_t bytes;  /* their floats' bytes */
    uint64_t gaps;   /* feature runs that did not continue what the head had (no drafts for that sequence) */
    double feed_s;   /* seconds fusing them (the head's fc) */
    double draft_s;  /* seconds drafting */
    uint64_t drafts; /* sequences drafted for (n > 0) */
} sd_draft_head;

/* An sd_draft_head_fn (head: an sd_draft_head). Slot's sequence: held[len]
 * its committed tokens (what the coordinator sent, keep_len then the
 * append), sq the step's entry. Rolls the head back to keep_len, feeds sq's
 * features (head->width floats a position; a run that
 * starts past what the head holds is a gap: counted, not fed), then
 * drafts up to k tokens with sampling s into tokens / q / *n (q borrowed
 * from the drafter until its next call for slot), after the n_forced
 * forced drafts at held[len..] and masked by con when it is not NULL
 * (sd_drafter_set_constraint; con at the end of the forced drafts). A head
 * failure is logged and drafts nothing. Adds to *cu what it spent on rows
 * past the 1 + k a drafting step takes in: its share of the features fed
 * past them, and the head's own catch-up (sd_drafter_eagle_take_catchup_s). */
void sd_draft_head_seq(void *head, sd_drafter *d, int32_t slot, const Specd__DraftSeq *sq, const int32_t *held,
                       int32_t len, int32_t n_forced, int32_t k, const sd_sampling *s, sd_constraint *con,
                       int32_t *tokens, sd_spec_q *q, int32_t *n, sd_head_catchup *cu);

/* Logs what the features cost (INFO), when some arrived. */
void sd_draft_head_log(const sd_draft_head *h);

#endif
