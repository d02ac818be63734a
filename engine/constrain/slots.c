/* slots.c — per-slot constraints synced to a slot's history, and forced
 * drafts (constrain_slots.h).
 *
 * A slot keeps the grammar (pinned in the shared cache), its sd_constraint
 * and the generated tokens the constraint advanced over. A sync compares
 * those with the slot's history, rolls back to the common prefix and
 * advances over the rest; a different grammar or prompt length starts the
 * slot afresh (a new request in the slot). */
#include "specd/constrain_slots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct con_slot {
    const sd_grammar *g;
    sd_constraint *con;
    int32_t prompt_len;
    int32_t *ids; /* [cap_ids] the generated tokens con advanced over: n_ids of them */
    int32_t n_ids, cap_ids;
} con_slot;

struct sd_con_slots {
    sd_cvocab *vocab;
    sd_grammar_cache *cache;
    con_slot *slots;
    int32_t max_seqs;
};

sd_status sd_con_slots_create(const sd_tok *tok, int32_t max_seqs, sd_con_slots **out) {
    if (!tok || !out || max_seqs < 1) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_con_slots *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->max_seqs = max_seqs;
    c->slots = calloc((size_t)max_seqs, sizeof *c->slots);
    sd_status st = c->slots ? SD_OK : SD_ERR_NOMEM;
    if (st == SD_OK) st = sd_cvocab_create(tok, &c->vocab);
    if (st == SD_OK) st = sd_grammar_cache_create(SD_CON_SLOTS_CACHE_GRAMMARS, NULL, &c->cache);
    if (st != SD_OK) {
        sd_con_slots_free(&c);
        return st;
    }
    *out = c;
    return SD_OK;
}

void sd_con_slots_release(sd_con_slots *c, int32_t slot) {
    if (!c || slot < 0 || slot >= c->max_seqs) return;
    con_slot *s = &c->slots[slot];
    sd_constraint_free(&s->con);
    sd_grammar_cache_put(c->cache, s->g);
    s->g = NULL;
    s->n_ids = 0;
}

void sd_con_slots_free(sd_con_slots **pc) {
    if (!pc || !*pc) return;
    sd_con_slots *c = *pc;
    for (int32_t i = 0; c->slots && i < c->max_seqs; i++) {
        sd_con_slots_release(c, i);
        free(c->slots[i].ids);
    }
    free(c->slots);
    sd_grammar_cache_free(&c->cache);
    sd_cvocab_free(&c->vocab);
    free(c);
    *pc = NULL;
}

/* Points slot s at the grammar of (kind, text) (a fresh state when it or
 * the prompt changed). */
static sd_status bind_grammar(sd_con_slots *c, con_slot *s, sd_constraint_kind kind, const char *text,
                              int32_t prompt_len, char *err, size_t err_cap) {
    const sd_grammar *g = NULL;
    SD_TRY(sd_grammar_cache_get(c->cache, kind, text, strlen(text), &g, err, err_cap));
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

static sd_status reserve_ids(con_slot *s, int32_t n) {
    if (n <= s->cap_ids) return SD_OK;
    int32_t cap = s->cap_ids ? s->cap_ids : 256;
    while (cap < n) cap *= 2;
    int32_t *ids = realloc(s->ids, (size_t)cap * sizeof *ids);
    if (!ids) return SD_ERR_NOMEM;
    s->ids = ids;
    s->cap_ids = cap;
    return SD_OK;
}

sd_status sd_con_slots_sync(sd_con_slots *c, int32_t slot, sd_constraint_kind kind, const char *text,
                            const int32_t *hist, int32_t prompt_len, int32_t n_ctx, sd_constraint **out, char *err,
                            size_t err_cap) {
    *out = NULL;
    if (err_cap) err[0] = '\0';
    if (kind == SD_CONSTRAINT_NONE) {
        sd_con_slots_release(c, slot);
        return SD_OK;
    }
    if (!c || slot < 0 || slot >= c->max_seqs || prompt_len < 0 || n_ctx < prompt_len || (n_ctx > 0 && !hist))
        return SD_ERR_INVALID_ARG;
    con_slot *s = &c->slots[slot];
    SD_TRY(bind_grammar(c, s, kind, text ? text : "", prompt_len, err, err_cap));
    const int32_t *gen = hist + prompt_len;
    int32_t n_gen = n_ctx - prompt_len, keep = 0;
    while (keep < s->n_ids && keep < n_gen && s->ids[keep] == gen[keep]) keep++;
    SD_TRY(sd_constraint_rollback(s->con, keep));
    s->n_ids = keep;
    SD_TRY(reserve_ids(s, n_gen));
    for (int32_t i = keep; i < n_gen; i++) {
        if (sd_constraint_advance(s->con, gen[i]) != SD_OK) {
            snprintf(err, err_cap, "generated token %d (position %d) is not allowed by the %s constraint", (int)gen[i],
                     (int)(prompt_len + i), sd_constraint_kind_name(kind));
            return SD_ERR_INVALID_ARG;
        }
        s->ids[s->n_ids++] = gen[i];
    }
    *out = s->con;
    return SD_OK;
}

sd_grammar_cache_stats sd_con_slots_cache_stats(const sd_con_slots *c) {
    sd_grammar_cache_stats st = {0};
    return c ? sd_grammar_cache_get_stats(c->cache) : st;
}

int32_t sd_constraint_forced_tokens(sd_constraint *c, const sd_tok *tok, int32_t k, int32_t *ids) {
    char bytes[256];
    size_t n = c && tok && ids && k > 0 ? sd_constraint_forced_bytes(c, bytes, sizeof bytes) : 0;
    int32_t *enc = NULL;
    size_t n_enc = 0;
    if (!n || sd_tok_encode(tok, bytes, n, false, &enc, &n_enc) != SD_OK) return 0;
    int32_t nf = 0, base = sd_constraint_len(c);
    while (nf < k && (size_t)nf + 1 < n_enc && sd_constraint_advance(c, enc[nf]) == SD_OK) {
        ids[nf] = enc[nf];
        nf++;
    }
    free(enc);
    return sd_constraint_rollback(c, base) == SD_OK ? nf : 0;
}
