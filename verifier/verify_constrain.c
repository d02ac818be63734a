/* verify_constrain.c — per-slot constraint state of the verifier (see
 * verify_constrain.h). */
#include "verify_constrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One slot's constraint: the grammar (pinned in the cache) and the state
 * advanced over ids[0..n_ids) = the slot's generated tokens it has seen. */
typedef struct slot_con {
    const sd_grammar *g;
    sd_constraint *con;
    int32_t prompt_len;
    int32_t *ids;
    int32_t n_ids, cap_ids;
} slot_con;

struct sd_vcon {
    sd_cvocab *vocab;
    sd_grammar_cache *cache;
    slot_con *slots;
    int32_t max_seqs;
};

sd_status sd_vcon_create(const sd_tok *tok, int32_t max_seqs, sd_vcon **out) {
    if (!tok || !out || max_seqs < 1) return SD_ERR_INVALID_ARG;
    sd_vcon *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->max_seqs = max_seqs;
    c->slots = calloc((size_t)max_seqs, sizeof *c->slots);
    sd_status st = c->slots ? SD_OK : SD_ERR_NOMEM;
    if (st == SD_OK) st = sd_cvocab_create(tok, &c->vocab);
    if (st == SD_OK) st = sd_grammar_cache_create(SD_VCON_CACHE_GRAMMARS, NULL, &c->cache);
    if (st != SD_OK) {
        sd_vcon_free(&c);
        return st;
    }
    *out = c;
    return SD_OK;
}

void sd_vcon_release(sd_vcon *c, int32_t slot) {
    if (!c || slot < 0 || slot >= c->max_seqs) return;
    slot_con *s = &c->slots[slot];
    sd_constraint_free(&s->con);
    sd_grammar_cache_put(c->cache, s->g);
    s->g = NULL;
    s->n_ids = 0;
}

void sd_vcon_free(sd_vcon **pc) {
    if (!pc || !*pc) return;
    sd_vcon *c = *pc;
    for (int32_t i = 0; c->slots && i < c->max_seqs; i++) {
        sd_vcon_release(c, i);
        free(c->slots[i].ids);
    }
    free(c->slots);
    sd_grammar_cache_free(&c->cache);
    sd_cvocab_free(&c->vocab);
    free(c);
    *pc = NULL;
}

/* Points slot s at the grammar of pc (a fresh state when it changed). */
static sd_status bind_grammar(sd_vcon *c, slot_con *s, const Specd__Constraint *pc, int32_t prompt_len, char *err,
                              size_t err_cap) {
    const sd_grammar *g = NULL;
    const char *text = pc->text ? pc->text : "";
    SD_TRY(sd_grammar_cache_get(c->cache, (sd_constraint_kind)pc->kind, text, strlen(text), &g, err, err_cap));
    if (g == s->g && s->con && s->prompt_len == prompt_len) {
        sd_grammar_cache_put(c->cache, g); /* the slot holds its pin already */
        return SD_OK;
    }
    sd_constraint_free(&s->con);
    sd_grammar_cache_put(c->cache, s->g);
    s->g = g;
    s->n_ids = 0;
    s->prompt_len = prompt_len;
    return sd_constraint_create(g, c->vocab, &s->con);
}

sd_status sd_vcon_sync(sd_vcon *c, int32_t slot, const Specd__Constraint *pc, const int32_t *hist,
                       int32_t prompt_len, int32_t n_ctx, sd_constraint **out, char *err, size_t err_cap) {
    *out = NULL;
    if (err_cap) err[0] = '\0';
    if (!pc || pc->kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) {
        if (c) sd_vcon_release(c, slot);
        return SD_OK;
    }
    if (!c) {
        snprintf(err, err_cap, "this verifier has no tokenizer: constraints are not served");
        return SD_ERR_UNSUPPORTED;
    }
    if (slot < 0 || slot >= c->max_seqs || prompt_len < 0 || n_ctx < prompt_len) return SD_ERR_INVALID_ARG;
    slot_con *s = &c->slots[slot];
    SD_TRY(bind_grammar(c, s, pc, prompt_len, err, err_cap));
    const int32_t *gen = hist + prompt_len;
    int32_t n_gen = n_ctx - prompt_len, keep = 0;
    while (keep < s->n_ids && keep < n_gen && s->ids[keep] == gen[keep]) keep++;
    SD_TRY(sd_constraint_rollback(s->con, keep));
    s->n_ids = keep;
    if (n_gen > s->cap_ids) {
        int32_t cap = s->cap_ids ? s->cap_ids : 256;
        while (cap < n_gen) cap *= 2;
        int32_t *ids = realloc(s->ids, (size_t)cap * sizeof *ids);
        if (!ids) return SD_ERR_NOMEM;
        s->ids = ids;
        s->cap_ids = cap;
    }
    for (int32_t i = keep; i < n_gen; i++) {
        if (sd_constraint_advance(s->con, gen[i]) != SD_OK) {
            snprintf(err, err_cap, "generated token %d (position %d) is not allowed by the %s constraint", (int)gen[i],
                     (int)(prompt_len + i), sd_constraint_kind_name((sd_constraint_kind)pc->kind));
            return SD_ERR_INVALID_ARG;
        }
        s->ids[s->n_ids++] = gen[i];
    }
    *out = s->con;
    return SD_OK;
}

sd_grammar_cache_stats sd_vcon_cache_stats(const sd_vcon *c) {
    sd_grammar_cache_stats st = {0};
    return c ? sd_grammar_cache_get_stats(c->cache) : st;
}
