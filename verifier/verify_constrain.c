/* verify_constrain.c — per-slot constraint state of the verifier (see
 * verify_constrain.h): the protocol's Constraint handed to the engine's
 * per-slot constraints (specd/constrain_slots.h), which the drafters use
 * too. */
#include "verify_constrain.h"

#include "specd/constrain_slots.h"

#include <stdio.h>
#include <stdlib.h>

struct sd_vcon {
    sd_con_slots *slots;
    const sd_tok *tok; /* borrowed: the head's forced drafts */
};

sd_status sd_vcon_create(const sd_tok *tok, int32_t max_seqs, sd_vcon **out) {
    if (!tok || !out || max_seqs < 1) return SD_ERR_INVALID_ARG;
    sd_vcon *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->tok = tok;
    sd_status st = sd_con_slots_create(tok, max_seqs, &c->slots);
    if (st != SD_OK) {
        free(c);
        return st;
    }
    *out = c;
    return SD_OK;
}

void sd_vcon_release(sd_vcon *c, int32_t slot) {
    if (c) sd_con_slots_release(c->slots, slot);
}

void sd_vcon_free(sd_vcon **pc) {
    if (!pc || !*pc) return;
    sd_con_slots_free(&(*pc)->slots);
    free(*pc);
    *pc = NULL;
}

sd_status sd_vcon_sync(sd_vcon *c, int32_t slot, const Specd__Constraint *pc, const int32_t *hist, int32_t prompt_len,
                       int32_t n_ctx, sd_constraint **out, char *err, size_t err_cap) {
    *out = NULL;
    if (err_cap) err[0] = '\0';
    if (!pc || pc->kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) {
        sd_vcon_release(c, slot);
        return SD_OK;
    }
    if (!c) {
        snprintf(err, err_cap, "this verifier has no tokenizer: constraints are not served");
        return SD_ERR_UNSUPPORTED;
    }
    return sd_con_slots_sync(c->slots, slot, (sd_constraint_kind)pc->kind, pc->text, hist, prompt_len, n_ctx, out, err,
                             err_cap);
}

sd_grammar_cache_stats sd_vcon_cache_stats(const sd_vcon *c) {
    sd_grammar_cache_stats st = {0};
    return c ? sd_con_slots_cache_stats(c->slots) : st;
}

size_t sd_vcon_cut_drafts(sd_constraint *con, const int32_t *hist, int32_t from, int32_t hist_len, int32_t next,
                          const int32_t *drafts, size_t n) {
    if (!con || n == 0) return n;
    int32_t base = sd_constraint_len(con);
    bool ok = true;
    for (int32_t i = from; i < hist_len && ok; i++) ok = sd_constraint_advance(con, hist[i]) == SD_OK;
    ok = ok && sd_constraint_advance(con, next) == SD_OK;
    size_t keep = 0;
    while (ok && keep < n && !sd_constraint_ended(con) && sd_constraint_advance(con, drafts[keep]) == SD_OK) keep++;
    sd_constraint_rollback(con, base);
    return keep;
}

int32_t sd_vcon_head_begin(const sd_vcon *c, sd_constraint *con, const int32_t *hist, int32_t from, int32_t hist_len,
                           int32_t next, int32_t k, int32_t *forced) {
    if (!c || !con) return -1;
    for (int32_t i = from; i < hist_len; i++)
        if (sd_constraint_advance(con, hist[i]) != SD_OK) return -1;
    if (sd_constraint_advance(con, next) != SD_OK || sd_constraint_ended(con)) return -1;
    int32_t nf = sd_constraint_forced_tokens(con, c->tok, k, forced);
    for (int32_t i = 0; i < nf; i++)
        if (sd_constraint_advance(con, forced[i]) != SD_OK) return i; /* cannot happen: forced_tokens checked them */
    return nf;
}
