/* draft_constrain.c — constrained drafting in the draft server (see
 * draft_constrain.h). */
#include "draft_constrain.h"

#include <stdio.h>

static const float one = 1.0f;

void sd_dcon_begin(sd_con_slots *cs, const sd_tok *tok, int32_t slot, const Specd__DraftSeq *sq, int32_t *ctx,
                   int32_t len, int32_t k, int32_t room, sd_dcon_seq *out) {
    *out = (sd_dcon_seq){0};
    const Specd__Constraint *pc = sq->constraint;
    if (!pc || pc->kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE || !cs || !tok) {
        sd_con_slots_release(cs, slot);
        return;
    }
    char err[256];
    sd_constraint *con = NULL;
    int32_t plen = (int32_t)sq->prompt_len; /* <= len: checked by the decoder */
    sd_status st =
        sd_con_slots_sync(cs, slot, (sd_constraint_kind)pc->kind, pc->text, ctx, plen, len, &con, err, sizeof err);
    if (st != SD_OK) {
        SD_WARN("drafter: request %llu: the constraint cannot be followed (%s: %s); drafting without it",
                (unsigned long long)sq->request_id, sd_status_str(st), err);
        sd_con_slots_release(cs, slot);
        return;
    }
    out->con = con;
    out->base = sd_constraint_len(con);
    if (k > room) k = room;
    out->n_forced = sd_constraint_forced_tokens(con, tok, k, ctx + len);
    for (int32_t i = 0; i < out->n_forced; i++)
        if (sd_constraint_advance(con, ctx[len + i]) != SD_OK) { /* cannot happen: forced_tokens checked them */
            out->n_forced = i;
            break;
        }
}

int32_t sd_dcon_finish(sd_dcon_seq *ds, const int32_t *forced, const sd_draft_result *dr, int32_t *tokens,
                       sd_spec_q *q) {
    int32_t n = 0;
    for (int32_t i = 0; i < ds->n_forced && n < SD_MAX_K; i++, n++) {
        tokens[n] = forced[i];
        q[n] = (sd_spec_q){1, &forced[i], &one};
    }
    for (int32_t i = 0; dr && i < dr->n_drafted && n < SD_MAX_K; i++, n++) {
        tokens[n] = dr->tokens[i];
        q[n] = dr->q[i];
    }
    if (!ds->con) return n;
    /* the model drafter left con advanced over its drafts: replay all from base */
    sd_constraint_rollback(ds->con, ds->base);
    int32_t ok = 0;
    while (ok < n && !sd_constraint_ended(ds->con) && sd_constraint_advance(ds->con, tokens[ok]) == SD_OK) ok++;
    sd_constraint_rollback(ds->con, ds->base);
    return ok;
}
