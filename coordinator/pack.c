/* pack.c — the scheduler's step messages: one VerifySeq or DraftSeq per
 * sequence, filled from the session (its committed tokens, drafts and their
 * q), pointing into the session's arrays rather than copying them (the
 * envelope is packed and sent before any of them changes). The scheduler
 * decides what goes in a step (who, how many tokens, how many drafts);
 * this file only writes it down. */
#include "coord.h"

#include <stdlib.h>

sd_status sd_pack_verify_alloc(sd_verify_pack *pk, int32_t n) {
    pk->seqs = calloc((size_t)n, sizeof *pk->seqs);
    pk->pseqs = calloc((size_t)n, sizeof *pk->pseqs);
    pk->samp = calloc((size_t)n, sizeof *pk->samp);
    pk->dists = calloc((size_t)n * SD_MAX_K, sizeof *pk->dists);
    pk->pdists = calloc((size_t)n * SD_MAX_K, sizeof *pk->pdists);
    pk->cons = calloc((size_t)n, sizeof *pk->cons);
    if (pk->seqs && pk->pseqs && pk->samp && pk->dists && pk->pdists && pk->cons) return SD_OK;
    sd_pack_verify_free(pk);
    return SD_ERR_NOMEM;
}

void sd_pack_verify_free(sd_verify_pack *pk) {
    free(pk->seqs);
    free(pk->pseqs);
    free(pk->samp);
    free(pk->dists);
    free(pk->pdists);
    free(pk->cons);
    *pk = (sd_verify_pack){0};
}

/* The session's constraint in con, or NULL when it has none. */
static Specd__Constraint *pack_constraint(Specd__Constraint *con, const sd_session *s) {
    if (s->con_kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) return NULL;
    specd__constraint__init(con);
    con->kind = s->con_kind;
    if (s->con_text) con->text = s->con_text;
    return con;
}

static void fill_sampling(const sd_session *s, Specd__Sampling *pb) {
    specd__sampling__init(pb);
    sd_net_sampling_to_pb(&s->sampling, pb);
}

void sd_pack_verify_seq(sd_verify_pack *pk, int32_t m, sd_session *s, int32_t n_append, int32_t k) {
    Specd__VerifySeq *vs = &pk->seqs[m];
    specd__verify_seq__init(vs);
    pk->pseqs[m] = vs;
    vs->request_id = s->id;
    vs->keep_len = (uint32_t)s->v_cached;
    vs->n_append = (size_t)n_append;
    vs->append = s->tokens + s->v_cached;
    fill_sampling(s, &pk->samp[m]);
    vs->sampling = &pk->samp[m];
    vs->prompt_len = (uint32_t)s->n_prompt;
    vs->logprobs = s->logprobs;
    vs->top_logprobs = s->logprobs ? (uint32_t)s->top_logprobs : 0; /* prompt logprobs: set by the scheduler */
    vs->constraint = pack_constraint(&pk->cons[m], s);
    if (k <= 0) return;
    vs->n_draft = (size_t)k;
    vs->draft = s->draft;
    vs->n_q = (size_t)k;
    vs->q = pk->pdists + (size_t)m * SD_MAX_K;
    for (int32_t j = 0; j < k; j++) {
        Specd__SparseDist *d = &pk->dists[(size_t)m * SD_MAX_K + j];
        specd__sparse_dist__init(d);
        d->n_ids = d->n_probs = s->q_off[j + 1] - s->q_off[j];
        d->ids = s->q_ids + s->q_off[j];
        d->probs = s->q_probs + s->q_off[j];
        vs->q[j] = d;
    }
}

sd_status sd_pack_draft_alloc(sd_draft_pack *pk, int32_t n) {
    pk->seqs = calloc((size_t)n, sizeof *pk->seqs);
    pk->pseqs = calloc((size_t)n, sizeof *pk->pseqs);
    pk->samp = calloc((size_t)n, sizeof *pk->samp);
    pk->cons = calloc((size_t)n, sizeof *pk->cons);
    if (pk->seqs && pk->pseqs && pk->samp && pk->cons) return SD_OK;
    sd_pack_draft_free(pk);
    return SD_ERR_NOMEM;
}

void sd_pack_draft_free(sd_draft_pack *pk) {
    free(pk->seqs);
    free(pk->pseqs);
    free(pk->samp);
    free(pk->cons);
    *pk = (sd_draft_pack){0};
}

void sd_pack_draft_seq(sd_draft_pack *pk, int32_t m, sd_session *s, int32_t k) {
    Specd__DraftSeq *ds = &pk->seqs[m];
    specd__draft_seq__init(ds);
    pk->pseqs[m] = ds;
    /* the drafter gets what it lacks; with nothing new, the last token again */
    int32_t keep = s->d_cached < s->n_tokens ? s->d_cached : s->n_tokens - 1;
    ds->request_id = s->id;
    ds->keep_len = (uint32_t)keep;
    ds->n_append = (size_t)(s->n_tokens - keep);
    ds->append = s->tokens + keep;
    ds->k = (uint32_t)k;
    fill_sampling(s, &pk->samp[m]);
    ds->sampling = &pk->samp[m];
    ds->constraint = pack_constraint(&pk->cons[m], s); /* the drafter drafts under it (draft_constrain.h) */
    if (ds->constraint) ds->prompt_len = (uint32_t)s->n_prompt;
}
