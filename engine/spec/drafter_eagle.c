/* drafter_eagle.c — the EAGLE-3 head as a drafter (drafter.h, eagle.h).
 *
 * The head reads the target's own hidden states, so whoever runs the target
 * hands them over: after each target forward over committed positions the
 * caller passes the captured features of those positions
 * (sd_drafter_eagle_features; spec_decode.c does it after every verify
 * step for the positions it committed). They are fused by fc at once and
 * kept per slot: feat[t] [H] for target positions t < n_feat, with the
 * token at each (a propose uses only the features of its context's tokens:
 * a slot reused for another sequence never drafts from stale ones).
 *
 * A propose on committed context x[0..n-1] (the target has run x[0..n-2];
 * x[n-1] is the correction it has not seen) needs feat[0..n-2]:
 *   1. head rows t = keep .. n-2 read (feat[t], x[t+1]) in one forward,
 *      keep being the rows already computed from target features whose
 *      token still matches (at least the last row is recomputed, for its
 *      logits); the last row's logits give the draft for position n;
 *   2. each further draft i feeds (the head's own pre-norm output of the
 *      row before, draft i-1) at head row n-2+i: a chain of K.
 * The rows fed from the head's own outputs are speculative: the next
 * propose truncates the head back to the rows of target features. Without
 * the features of x[0..n-2] (the first step, before the target has seen
 * the prompt) it drafts nothing.
 *
 * Drafting from the head's distribution over its draft vocabulary, mapped
 * to target ids by d2t (other ids get -inf): sd_spec_draft_step with the
 * request's sampling and the coupled race of (seed, position), like the
 * model drafter, so q is exact for the coupled rule (spec.h); a greedy
 * request drafts the argmax among the draft ids, mapped.
 *
 * Under a constraint (sd_drafter_set_constraint) the draft logits are
 * masked before each draw, in target ids through d2t, so q is the masked,
 * renormalised distribution (greedy: the argmax among the allowed draft
 * ids; where one token is allowed, q = 1 on it), and the constraint is
 * advanced along the chain and rolled back at the end. The caller's forced
 * drafts may end the context past the target's features: they are fed as
 * chain rows before the first draw. */
#include "drafter_eagle_impl.h"

#include "specd/constrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static sd_status reserve_hid(eagle_drafter *e, int32_t rows) {
    if (rows <= e->cap_hid) return SD_OK;
    float *p = realloc(e->hid, (size_t)rows * (size_t)e->H * sizeof *p);
    if (!p) return SD_ERR_NOMEM;
    e->hid = p;
    e->cap_hid = rows;
    return SD_OK;
}

/* e->logits [V] from the head's logits_d [Vd]. */
static void map_logits(eagle_drafter *e) {
    if (e->identity) {
        memcpy(e->logits, e->logits_d, (size_t)e->n_vocab * sizeof *e->logits);
        return;
    }
    for (int32_t i = 0; i < e->n_vocab; i++) e->logits[i] = -INFINITY;
    for (int32_t i = 0; i < e->n_draft; i++) e->logits[sd_eagle_head_target_id(e->head, i)] = e->logits_d[i];
}

sd_status sd_eagle_drafter_prepare(eagle_drafter *e, int32_t slot, const int32_t *ctx, int32_t n_ctx,
                                   int32_t step_rows, bool *ready) {
    *ready = false;
    for (int32_t i = 0; i < n_ctx; i++)
        if (ctx[i] < 0 || ctx[i] >= e->n_vocab) {
            SD_ERROR("drafter: context token %d at %d is outside [0, %d)", (int)ctx[i], (int)i, (int)e->n_vocab);
            return SD_ERR_RANGE;
        }
    const int32_t *ft = e->feat_tok + (size_t)slot * (size_t)e->max_ctx;
    int32_t have = 0; /* features of this context's positions (a feature depends on the tokens up to it) */
    while (have < e->n_feat[slot] && have < n_ctx - 1 && ft[have] == ctx[have]) have++;
    if (n_ctx < 2 || have < n_ctx - 1) {
        SD_DEBUG("eagle: slot %d: target features of %d of the %d positions drafting needs: no draft", (int)slot,
                 (int)have, (int)n_ctx - 1);
        return SD_OK;
    }
    if (n_ctx - 1 > e->max_ctx) return SD_OK; /* the context's head rows do not fit */
    int32_t *tok = e->head_tok + (size_t)slot * (size_t)e->max_ctx;
    int32_t keep = 0;
    while (keep < e->n_true[slot] && keep < n_ctx - 1 && tok[keep] == ctx[keep + 1]) keep++;
    if (keep == n_ctx - 1) keep = n_ctx - 2; /* the last row again: its logits */
    const int32_t rows = n_ctx - 1 - keep;
    SD_TRY(reserve_hid(e, rows));
    SD_TRY(sd_eagle_head_truncate(e->head, slot, keep));
    const float *g = e->feat + ((size_t)slot * (size_t)e->max_ctx + (size_t)keep) * (size_t)e->H;
    const double t0 = sd_now();
    SD_TRY(sd_eagle_head_forward(e->head, slot, keep, rows, ctx + keep + 1, g, NULL, e->logits_d, e->hid));
    if (step_rows >= 1 && rows > step_rows) {
        e->catchup_s += (sd_now() - t0) * (double)(rows - step_rows) / rows;
        e->catchup_rows += rows - step_rows;
    }
    memcpy(tok + keep, ctx + keep + 1, (size_t)rows * sizeof *tok);
    e->n_true[slot] = n_ctx - 1;
    memcpy(e->g_step, e->hid + (size_t)(rows - 1) * (size_t)e->H, (size_t)e->H * sizeof *e->g_step);
    *ready = true;
    return SD_OK;
}

/* The context's positions with target features (a feature depends on the
 * tokens up to it, so only those whose token still matches count). */
static int32_t featured(const eagle_drafter *e, int32_t slot, const int32_t *ctx, int32_t n_ctx) {
    const int32_t *ft = e->feat_tok + (size_t)slot * (size_t)e->max_ctx;
    int32_t have = 0;
    while (have < e->n_feat[slot] && have < n_ctx - 1 && ft[have] == ctx[have]) have++;
    return have;
}

/* Step 1 of a propose: the head's rows for the context. Under a constraint
 * the context may end with forced drafts the target has not run (at most
 * SD_MAX_K past the features): the rows of the featured part, then each
 * forced draft fed as a chain row, as the head's own drafts are. */
static sd_status prepare_ctx(sd_drafter *d, eagle_drafter *e, int32_t slot, const int32_t *ctx, int32_t n_ctx,
                             int32_t k, bool *ready) {
    int32_t f = d->constraint ? featured(e, slot, ctx, n_ctx) : n_ctx - 1;
    if (f < 1 || n_ctx - 1 - f > SD_MAX_K) f = n_ctx - 1; /* no forced tail: the plain rule */
    SD_TRY(sd_eagle_drafter_prepare(e, slot, ctx, f + 1, k + 1, ready));
    for (int32_t t = f; *ready && t < n_ctx - 1; t++) { /* head row t: (its own last output, forced draft) */
        SD_TRY(sd_eagle_head_forward(e->head, slot, t, 1, ctx + t + 1, e->g_step, NULL, e->logits_d, e->hid));
        memcpy(e->g_step, e->hid, (size_t)e->H * sizeof *e->g_step);
    }
    return SD_OK;
}

/* Draft i's token and q from e->logits_d (masked already, if at all). */
static sd_status draw(eagle_drafter *e, int32_t n_ctx, int32_t i, const sd_sampling *s, int32_t *ids_i, float *qp_i,
                      int32_t *n_q, int32_t *y) {
    if (sd_sampling_is_greedy(s)) { /* the argmax among the draft ids, mapped: no pass over the vocabulary */
        SD_TRY(sd_spec_draft_step(e->logits_d, e->n_draft, s, e->top_n, 0, e->probs, ids_i, qp_i, n_q, y));
        *y = ids_i[0] = sd_eagle_head_target_id(e->head, *y);
        return SD_OK;
    }
    const uint64_t position = (uint64_t)n_ctx + (uint64_t)i;
    if (e->sorted) { /* the distribution over the draft ids, scattered: the same as over the target's vocabulary,
                        whose other ids are -inf (probability 0), in the same order (ties rank by id), without a
                        softmax and a sort over all of it (2.4 ms a draft for 49,152 ids under top-p) */
        SD_TRY(sd_sample_probs_given(e->logits_d, e->n_draft, s, e->probs_d));
        memset(e->probs, 0, (size_t)e->n_vocab * sizeof *e->probs);
        for (int32_t d = 0; d < e->n_draft; d++) e->probs[e->d2t[d]] = e->probs_d[d];
        return sd_spec_draft_probs(e->probs, e->n_vocab, s, e->top_n, position, ids_i, qp_i, n_q, y);
    }
    map_logits(e);
    return sd_spec_draft_step(e->logits, e->n_vocab, s, e->top_n, position, e->probs, ids_i, qp_i, n_q, y);
}

static sd_status eagle_propose(sd_drafter *d, int32_t slot, const int32_t *ctx, int32_t n_ctx, int32_t k,
                               const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    eagle_drafter *e = d->impl;
    if (n_ctx - 2 + k > e->max_ctx) k = e->max_ctx - n_ctx + 2; /* head rows up to n_ctx - 3 + k */
    if (k <= 0) return SD_OK;
    bool ready = false;
    SD_TRY(prepare_ctx(d, e, slot, ctx, n_ctx, k, &ready));
    if (!ready) return SD_OK;
    int32_t *ids = e->q_ids + (size_t)slot * SD_MAX_K * (size_t)e->top_n;
    float *qp = e->q_probs + (size_t)slot * SD_MAX_K * (size_t)e->top_n;
    sd_constraint *con = d->constraint; /* at the context's end; advanced along the chain, rolled back after */
    const int32_t con_base = con ? sd_constraint_len(con) : 0;
    sd_status st = SD_OK;
    for (int32_t i = 0; i < k && st == SD_OK; i++) {
        if (con) { /* the head's distribution under the constraint, in target ids through d2t: stop where it
                      allows none of the draft ids */
            bool any = false;
            if ((st = sd_constraint_apply_ids(con, e->logits_d, e->n_draft, e->d2t, &any)) != SD_OK || !any) break;
        }
        int32_t *ids_i = ids + (size_t)i * (size_t)e->top_n;
        float *qp_i = qp + (size_t)i * (size_t)e->top_n;
        int32_t n_q = 0, y;
        if ((st = draw(e, n_ctx, i, s, ids_i, qp_i, &n_q, &y)) != SD_OK) break;
        q[i] = (sd_spec_q){n_q, ids_i, qp_i};
        tokens[i] = y;
        *n_drafted = i + 1;
        if (con && (sd_constraint_advance(con, y) != SD_OK || sd_constraint_ended(con))) break;
        if (i + 1 < k) { /* head row n_ctx - 1 + i: (its own last output, draft i) */
            st = sd_eagle_head_forward(e->head, slot, n_ctx - 1 + i, 1, &y, e->g_step, NULL, e->logits_d, e->hid);
            memcpy(e->g_step, e->hid, (size_t)e->H * sizeof *e->g_step);
        }
    }
    if (con) sd_constraint_rollback(con, con_base);
    SD_TRY(st);
    if (sd_log_enabled(SD_LOG_DEBUG)) { /* tests/ref/test_eagle_head.py replays the chains from this line */
        char line[16 * SD_MAX_K] = "";
        for (int32_t i = 0; i < *n_drafted; i++)
            snprintf(line + strlen(line), sizeof line - strlen(line), " %d", (int)tokens[i]);
        SD_DEBUG("eagle: slot %d context %d drafted%s", (int)slot, (int)n_ctx, line);
    }
    return SD_OK;
}

static sd_status eagle_propose_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs,
                                     sd_draft_result *results) {
    (void)d;
    (void)seqs;
    (void)results;
    SD_ERROR("drafter: the EAGLE-3 head drafts in the process that runs its target (single-process) for now; "
             "%d sequences refused",
             (int)n_seqs);
    return SD_ERR_UNSUPPORTED;
}

static sd_status eagle_rollback(sd_drafter *d, int32_t seq, int32_t len) {
    eagle_drafter *e = d->impl;
    if (e->n_feat[seq] > len) e->n_feat[seq] = len;                       /* features of positions < len stand */
    if (e->n_true[seq] > len - 1) e->n_true[seq] = len > 0 ? len - 1 : 0; /* rows read tokens up to t + 1 */
    return sd_eagle_head_truncate(e->head, seq, e->n_true[seq]);
}

static void eagle_release(sd_drafter *d, int32_t seq) {
    eagle_drafter *e = d->impl;
    e->n_feat[seq] = 0;
    e->n_true[seq] = 0;
    sd_eagle_head_truncate(e->head, seq, 0);
}

static void eagle_destroy(sd_drafter *d) {
    eagle_drafter *e = d->impl;
    if (!e) return;
    sd_eagle_head_free(&e->head);
    free(e->feat);
    free(e->feat_tok);
    free(e->n_feat);
    free(e->head_tok);
    free(e->n_true);
    free(e->logits_d);
    free(e->logits);
    free(e->probs);
    free(e->probs_d);
    free(e->hid);
    free(e->g_step);
    free(e->q_ids);
    free(e->q_probs);
    free(e->d2t);
    free(e);
    d->impl = NULL;
}

static const drafter_ops eagle_ops = {
    .name = "eagle",
    .propose = eagle_propose,
    .propose_batch = eagle_propose_batch,
    .rollback = eagle_rollback,
    .release = eagle_release,
    .destroy = eagle_destroy,
};

static sd_status eagle_alloc(eagle_drafter *e, const sd_drafter_params *p) {
    const size_t S = (size_t)p->max_seqs, C = (size_t)p->max_ctx, H = (size_t)e->H, V = (size_t)e->n_vocab;
    e->feat = malloc(S * C * H * sizeof *e->feat);
    e->feat_tok = malloc(S * C * sizeof *e->feat_tok);
    e->n_feat = calloc(S, sizeof *e->n_feat);
    e->head_tok = malloc(S * C * sizeof *e->head_tok);
    e->n_true = calloc(S, sizeof *e->n_true);
    e->logits_d = malloc((size_t)e->n_draft * sizeof *e->logits_d);
    e->logits = malloc(V * sizeof *e->logits);
    e->probs = malloc(V * sizeof *e->probs);
    e->g_step = malloc(H * sizeof *e->g_step);
    e->q_ids = malloc(S * SD_MAX_K * (size_t)e->top_n * sizeof *e->q_ids);
    e->q_probs = malloc(S * SD_MAX_K * (size_t)e->top_n * sizeof *e->q_probs);
    bool ok = e->feat && e->feat_tok && e->n_feat && e->head_tok && e->n_true && e->logits_d && e->logits && e->probs &&
              e->g_step && e->q_ids && e->q_probs;
    return ok ? SD_OK : SD_ERR_NOMEM;
}

sd_status sd_drafter_eagle_open(const char *dir, const sd_model *target, const sd_drafter_params *p, sd_drafter **out) {
    if (!dir || !target || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_drafter_params prm;
    SD_TRY(drafter_params_check(p, &prm));
    sd_drafter *d = calloc(1, sizeof *d);
    eagle_drafter *e = calloc(1, sizeof *e);
    if (!d || !e) {
        free(d);
        free(e);
        return SD_ERR_NOMEM;
    }
    d->kind = SD_DRAFTER_EAGLE;
    d->ops = &eagle_ops;
    d->params = prm;
    d->impl = e;
    sd_eagle_target t = sd_eagle_target_of(target);
    sd_eagle_params hp = {.max_seqs = prm.max_seqs,
                          .max_ctx = prm.max_ctx,
                          .n_threads = prm.n_threads,
                          .weights = (sd_eagle_weights)prm.eagle_weights};
    sd_status s = sd_eagle_head_load(dir, &t, &hp, &e->head);
    if (s == SD_OK) {
        e->H = sd_eagle_head_hidden(e->head);
        e->n_vocab = t.n_vocab;
        e->n_draft = sd_eagle_head_draft_vocab(e->head);
        e->top_n = prm.top_n;
        e->max_ctx = prm.max_ctx;
        e->identity = e->n_draft == e->n_vocab;
        for (int32_t i = 0; e->identity && i < e->n_draft; i++) e->identity = sd_eagle_head_target_id(e->head, i) == i;
        s = eagle_alloc(e, &prm);
        if (s == SD_OK && !e->identity && !(e->d2t = malloc((size_t)e->n_draft * sizeof *e->d2t))) s = SD_ERR_NOMEM;
        for (int32_t i = 0; s == SD_OK && e->d2t && i < e->n_draft; i++)
            e->d2t[i] = sd_eagle_head_target_id(e->head, i);
        e->sorted = e->d2t != NULL;
        for (int32_t i = 1; e->sorted && i < e->n_draft; i++) e->sorted = e->d2t[i] > e->d2t[i - 1];
        if (s == SD_OK && e->sorted && !(e->probs_d = malloc((size_t)e->n_draft * sizeof *e->probs_d)))
            s = SD_ERR_NOMEM;
    }
    if (s != SD_OK) {
        sd_drafter_free(&d);
        return s;
    }
    *out = d;
    return SD_OK;
}

int32_t sd_drafter_eagle_layers(const sd_drafter *d, int32_t *ids) {
    if (!d || d->kind != SD_DRAFTER_EAGLE) return 0;
    const eagle_drafter *e = d->impl;
    sd_eagle_head_layers(e->head, ids);
    return SD_EAGLE_N_AUX;
}

double sd_drafter_eagle_take_catchup_s(sd_drafter *d, int64_t *rows) {
    if (rows) *rows = 0;
    if (!d || d->kind != SD_DRAFTER_EAGLE) return 0.0;
    eagle_drafter *e = d->impl;
    const double s = e->catchup_s;
    if (rows) *rows = e->catchup_rows;
    e->catchup_s = 0.0;
    e->catchup_rows = 0;
    return s;
}

sd_status sd_drafter_eagle_features(sd_drafter *d, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                    const float *aux) {
    if (!d || d->kind != SD_DRAFTER_EAGLE || seq < 0 || seq >= d->params.max_seqs || n < 0 ||
        (n > 0 && (!aux || !tokens)))
        return SD_ERR_INVALID_ARG;
    eagle_drafter *e = d->impl;
    if (pos0 < 0 || pos0 > e->n_feat[seq] || (int64_t)pos0 + n > e->max_ctx) {
        SD_ERROR("eagle: features of positions %d..%d for slot %d, which has %d (no gaps, at most %d)", (int)pos0,
                 (int)(pos0 + n - 1), (int)seq, (int)e->n_feat[seq], (int)e->max_ctx);
        return SD_ERR_RANGE;
    }
    float *dst = e->feat + ((size_t)seq * (size_t)e->max_ctx + (size_t)pos0) * (size_t)e->H;
    SD_TRY(sd_eagle_head_fuse(e->head, aux, n, dst));
    memcpy(e->feat_tok + (size_t)seq * (size_t)e->max_ctx + pos0, tokens, (size_t)n * sizeof *tokens);
    e->n_feat[seq] = pos0 + n;
    if (e->n_true[seq] > pos0) e->n_true[seq] = pos0;
    return SD_OK;
}

/* ---- features fused ahead (the verifier's prefix cache keeps them beside
 * cached KV blocks: verify_head.c, kv_side.c) ---- */

int32_t sd_drafter_eagle_width(const sd_drafter *d) {
    return d && d->kind == SD_DRAFTER_EAGLE ? ((const eagle_drafter *)d->impl)->H : 0;
}

int32_t sd_drafter_eagle_n_features(const sd_drafter *d, int32_t seq) {
    if (!d || d->kind != SD_DRAFTER_EAGLE || seq < 0 || seq >= d->params.max_seqs) return 0;
    return ((const eagle_drafter *)d->impl)->n_feat[seq];
}

sd_status sd_drafter_eagle_fuse(sd_drafter *d, const float *aux, int32_t n, float *fused) {
    if (!d || d->kind != SD_DRAFTER_EAGLE) return SD_ERR_INVALID_ARG;
    return sd_eagle_head_fuse(((eagle_drafter *)d->impl)->head, aux, n, fused);
}

sd_status sd_drafter_eagle_set_fused(sd_drafter *d, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                     const float *fused) {
    if (!d || d->kind != SD_DRAFTER_EAGLE || seq < 0 || seq >= d->params.max_seqs || n < 0 ||
        (n > 0 && (!fused || !tokens)))
        return SD_ERR_INVALID_ARG;
    eagle_drafter *e = d->impl;
    if (pos0 < 0 || pos0 > e->n_feat[seq] || (int64_t)pos0 + n > e->max_ctx) {
        SD_ERROR("eagle: fused features of positions %d..%d for slot %d, which has %d (no gaps, at most %d)", (int)pos0,
                 (int)(pos0 + n - 1), (int)seq, (int)e->n_feat[seq], (int)e->max_ctx);
        return SD_ERR_RANGE;
    }
    const size_t at = (size_t)seq * (size_t)e->max_ctx + (size_t)pos0;
    memcpy(e->feat + at * (size_t)e->H, fused, (size_t)n * (size_t)e->H * sizeof *e->feat);
    memcpy(e->feat_tok + at, tokens, (size_t)n * sizeof *tokens);
    e->n_feat[seq] = pos0 + n;
    if (e->n_true[seq] > pos0) e->n_true[seq] = pos0; /* the head's rows from pos0 on are recomputed */
    return SD_OK;
}
