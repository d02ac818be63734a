/* drafter_eagle_impl.h — the EAGLE drafter's state, shared by
 * drafter_eagle.c (chains) and drafter_eagle_tree.c (token trees). */
#ifndef SPECD_DRAFTER_EAGLE_IMPL_H
#define SPECD_DRAFTER_EAGLE_IMPL_H

#include "drafter_impl.h"

#include "specd/eagle.h"

typedef struct eagle_drafter {
    sd_eagle_head *head;
    int32_t H, n_vocab, n_draft, top_n, max_ctx;
    bool identity;     /* draft id == target id for all ids */
    int32_t *d2t;      /* [n_draft] the target id of each draft id (the constraint's mask reads it); NULL: identity */
    float *feat;       /* [max_seqs][max_ctx][H] fused target features */
    int32_t *feat_tok; /* [max_seqs][max_ctx] the token at each featured position */
    int32_t *n_feat;   /* [max_seqs] */
    int32_t *head_tok; /* [max_seqs][max_ctx] the token each true head row read */
    int32_t *n_true;   /* [max_seqs] head rows computed from target features */
    float *logits_d;   /* [Vd] */
    float *logits;     /* [V] mapped */
    float *probs;      /* [V] */
    float *probs_d;    /* [Vd], when sorted */
    bool sorted;       /* d2t strictly increasing: a sampled draw is computed over the draft ids (draw()) */
    float *hid;        /* [cap_hid][H] */
    int32_t cap_hid;
    float *g_step;  /* [H] */
    int32_t *q_ids; /* [max_seqs][SD_MAX_K][top_n] */
    float *q_probs; /* [max_seqs][SD_MAX_K][top_n] */
    double catchup_s;     /* head rows past a drafting step's own, since sd_drafter_eagle_take_catchup_s */
    int64_t catchup_rows; /* ... and how many */
} eagle_drafter;

/* Runs the head over the context's rows whose target features are new
 * (drafter_eagle.c's step 1): then e->logits_d holds the draft logits for
 * position n_ctx, e->g_step the last row's output and the head's cache
 * n_ctx - 1 rows. *ready false (SD_OK): no features for this context, or no
 * head row left, nothing to draft. step_rows: the rows a drafting step
 * brings at most (1 + the drafts it verified); the time of rows past them
 * (a context the head fell behind on) goes to e->catchup_s and their
 * count to e->catchup_rows. */
sd_status sd_eagle_drafter_prepare(eagle_drafter *e, int32_t slot, const int32_t *ctx, int32_t n_ctx,
                                   int32_t step_rows, bool *ready);

#endif
