/* drafter_impl.h — the table of functions behind sd_drafter (drafter.h).
 * Private to engine/drafter*.c. */
#ifndef SPECD_DRAFTER_IMPL_H
#define SPECD_DRAFTER_IMPL_H

#include "specd/drafter.h"
#include "specd/spec_batch.h"

typedef struct drafter_ops {
    const char *name;
    sd_status (*propose)(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                         const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted);
    /* sd_draft_batch after the common checks: only sequences whose result
     * outcome is SD_SEQ_OK are to be served (n_drafted already 0). */
    sd_status (*propose_batch)(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs, sd_draft_result *results);
    sd_status (*rollback)(sd_drafter *d, int32_t seq, int32_t len);
    void (*release)(sd_drafter *d, int32_t seq);
    void (*destroy)(sd_drafter *d); /* frees impl, not d */
    /* optional (model drafters): sd_drafter_pair_vocab, sd_drafter_embed_rows */
    sd_status (*pair_vocab)(sd_drafter *d, int32_t target_n_vocab);
    int32_t (*embed_rows)(const sd_drafter *d);
} drafter_ops;

struct sd_drafter {
    sd_drafter_kind kind;
    const drafter_ops *ops;
    sd_drafter_params params;
    void *impl;
    sd_constraint *constraint; /* sd_drafter_set_constraint: masks a model or EAGLE drafter's draws; borrowed */
};

/* Checks params and fills defaults for zero fields; logs what is wrong. */
sd_status drafter_params_check(const sd_drafter_params *in, sd_drafter_params *out);

#endif
