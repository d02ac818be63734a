/* verify_head.c — the EAGLE-3 head in the verifier process
 * (specd-verifier --eagle DIR; verify_head.h).
 *
 * The head is engine/spec's EAGLE drafter (drafter_eagle.c) with one slot
 * per KV slot of the verifier. The target captures the head's layers on
 * every forward (sd_model_capture_set); after each forward verify_serve.c
 * hands over the features of the rows that became committed positions
 * (prefill rows, a verify step's appended rows and accepted drafts: never
 * rejected drafts), and for each sequence whose step asked (next_k) the
 * drafter proposes on its committed tokens, the token the step just
 * sampled last. The drafter keeps the head's KV to the committed prefix:
 * its speculative chain rows are truncated at the next propose, and a
 * truncation of the verifier's cache (a keep_len below what it held, a
 * release) is passed on here, so the head's KV follows every rollback.
 *
 * Its time (fc over the new features, the chain) is measured apart: the
 * verify step's forward_us leaves it out and each result carries its own
 * (next_us), which the coordinator charges to the head as a drafter.
 *
 * With the prefix cache. A sequence that adopts cached KV blocks computes
 * none of their rows, so the target never captures their features. They
 * come with the blocks instead: the fused feature of every row the target
 * computes is also written into the KV cache's side row of that position
 * (sd_kv_side: kept, shared, copied and reused exactly as the row's K/V),
 * and a feed that starts past the positions the head has features of
 * first takes the missing ones from the side rows of the slot's blocks
 * (those positions are in the KV cache, adopted or computed, so their side
 * rows hold their features: a feature is a function of the position's
 * token prefix alone, the same bits in any batch). The head's own KV of
 * those rows is recomputed from the features at the next propose: one
 * head layer per adopted row, against the target's n_layers.
 *
 * Under a constraint (issue 35) verify_serve.c brings the sequence's
 * constraint past the step's committed tokens and the tokens it forces
 * (sd_vcon_head_begin); those go first with q = 1, and the head drafts on
 * from the context extended by them, masked at every drafted position
 * (sd_drafter_set_constraint: drafter_eagle.c feeds the forced tokens as
 * chain rows).
 *
 * In a TP group the head runs in the leader alone. Each layer ends with the
 * all-reduce of its row-parallel partial sums added into the residual
 * stream (engine/model_forward.c), so the leader's x after a layer is the
 * whole [n][n_embd] stream: the capture reads the same rows as at TP 1,
 * equal to them within the all-reduce's rounding (its partial sums are
 * added in another order; tests/test_tp_capture.c bounds the difference).
 * The ranks capture nothing and hold no head; the token embedding the head
 * reads is replicated on every rank, the leader's included. */
#include "verify_head.h"

#include "specd/drafter.h"
#include "specd/spec.h"

#include <stdlib.h>
#include <string.h>

struct sd_vhead {
    sd_model *target;
    sd_kv *kv; /* the verifier's; its side rows hold fused features when it has a prefix cache, else NULL */
    sd_drafter *drafter;
    int32_t max_seqs, max_ctx, max_batch, max_k;
    int32_t aux_width; /* floats per captured row: 3 x n_embd */
    int32_t *ctx;      /* [max_ctx + 1 + SD_MAX_K] one sequence's committed tokens (and forced drafts) */
    int32_t *tokens;   /* [max_batch][max_k] drafts of the step's results */
    Specd__SparseDist *dists;
    Specd__SparseDist **pdists; /* [max_batch][max_k] */
    int32_t *q_ids;             /* [max_batch][max_k][max_q] */
    float *q_probs;
    float *fused; /* [cap_fused][H] a feed's fused features, with the prefix cache */
    int32_t cap_fused;
    int32_t max_q;
    double seconds; /* since sd_vhead_take_seconds */
    double feed_s;  /* the last feed's: reported with the draft that follows it */
    int32_t feed_n; /* ... and its rows */
};

sd_status sd_vhead_open(const char *dir, sd_model *target, sd_kv *kv, int32_t max_seqs, int32_t max_ctx,
                        int32_t max_batch, int32_t max_k, int32_t weights, sd_vhead **out) {
    if (!dir || !target || !kv || !out || max_seqs <= 0 || max_ctx <= 0 || max_batch <= 0 || max_k < 0 ||
        max_k > SD_MAX_K)
        return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_model_shard shard;
    sd_model_shard_of(target, &shard);
    if (shard.tp_rank != 0) { /* a rank > 0 runs the leader's plans: no forward of its own to capture */
        SD_ERROR("verifier: an EAGLE head runs on a TP group's leader, not on rank %d", (int)shard.tp_rank);
        return SD_ERR_INVALID_ARG;
    }
    sd_vhead *h = calloc(1, sizeof *h);
    if (!h) return SD_ERR_NOMEM;
    h->target = target;
    h->max_seqs = max_seqs;
    h->max_ctx = max_ctx;
    h->max_batch = max_batch;
    h->max_k = max_k > 0 ? max_k : 1;
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = max_seqs;
    dp.max_ctx = max_ctx;
    dp.eagle_weights = weights;
    sd_status st = sd_drafter_eagle_open(dir, target, &dp, &h->drafter);
    int32_t ids[SD_MODEL_CAPTURE_MAX];
    int32_t n_ids = st == SD_OK ? sd_drafter_eagle_layers(h->drafter, ids) : 0;
    if (st == SD_OK) st = sd_model_capture_set(target, n_ids, ids, false);
    if (st == SD_OK) {
        h->aux_width = n_ids * sd_model_config_of(target)->n_embd;
        h->max_q = sd_drafter_max_q(h->drafter);
        const size_t nk = (size_t)max_batch * (size_t)h->max_k;
        h->ctx = malloc(((size_t)max_ctx + 1 + SD_MAX_K) * sizeof *h->ctx);
        h->tokens = malloc(nk * sizeof *h->tokens);
        h->dists = malloc(nk * sizeof *h->dists);
        h->pdists = malloc(nk * sizeof *h->pdists);
        h->q_ids = malloc(nk * (size_t)h->max_q * sizeof *h->q_ids);
        h->q_probs = malloc(nk * (size_t)h->max_q * sizeof *h->q_probs);
        if (!h->ctx || !h->tokens || !h->dists || !h->pdists || !h->q_ids || !h->q_probs) st = SD_ERR_NOMEM;
    }
    if (st == SD_OK && sd_kv_prefix_enabled(kv)) { /* adopted rows' features come from the blocks' side rows */
        const int32_t width = sd_drafter_eagle_width(h->drafter);
        st = sd_kv_side_enable(kv, width);
        if (st == SD_OK) {
            h->kv = kv;
            const sd_kv_params *kp = sd_kv_params_of(kv);
            SD_INFO("verifier: the prefix cache keeps the head's features beside the KV: %d floats a row, %.1f MiB",
                    (int)width, (double)kp->n_blocks * kp->block_size * width * sizeof(float) / (1 << 20));
        }
    }
    if (st != SD_OK) {
        SD_ERROR("verifier: cannot use the EAGLE head in %s: %s", dir, sd_status_str(st));
        sd_vhead_free(&h);
        return st;
    }
    SD_INFO("verifier: EAGLE head %s drafts in this process (layers %d, %d, %d; %d slots of %d positions)", dir,
            (int)ids[0], (int)ids[1], (int)ids[2], (int)max_seqs, (int)max_ctx);
    *out = h;
    return SD_OK;
}

void sd_vhead_free(sd_vhead **hp) {
    if (!hp || !*hp) return;
    sd_vhead *h = *hp;
    if (h->drafter) sd_model_capture_set(h->target, 0, NULL, false);
    sd_drafter_free(&h->drafter);
    free(h->ctx);
    free(h->tokens);
    free(h->dists);
    free(h->pdists);
    free(h->q_ids);
    free(h->q_probs);
    free(h->fused);
    free(h);
    *hp = NULL;
}

void sd_vhead_rollback(sd_vhead *h, int32_t slot, int32_t len) {
    if (h && sd_drafter_rollback(h->drafter, slot, len) != SD_OK)
        SD_WARN("verifier: the head's slot %d could not be rolled back to %d positions", (int)slot, (int)len);
}

void sd_vhead_release(sd_vhead *h, int32_t slot) {
    if (h) sd_drafter_release(h->drafter, slot);
}

/* Slot's missing features, positions n_features .. pos0 - 1 (in the KV
 * cache: adopted, or computed while the head failed), from their side rows. */
static sd_status fill_from_side(sd_vhead *h, int32_t slot, const int32_t *hist, int32_t pos0) {
    for (int32_t p = sd_drafter_eagle_n_features(h->drafter, slot), m; p < pos0; p += m) {
        const float *side = sd_kv_side(h->kv, slot, p, &m);
        if (!side) return SD_ERR_RANGE;
        if (m > pos0 - p) m = pos0 - p;
        SD_TRY(sd_drafter_eagle_set_fused(h->drafter, slot, p, m, hist + p, side));
    }
    return SD_OK;
}

/* Fuses aux[n] of positions pos0.. (one matmul), copies them into their
 * side rows block by block, and hands them to the head. The side rows are
 * written even when the head refuses (a gap): they must hold every
 * computed row's feature. */
static sd_status feed_side(sd_vhead *h, int32_t slot, const int32_t *hist, int32_t pos0, int32_t n, const float *aux,
                           sd_status head_st) {
    const size_t H = (size_t)sd_drafter_eagle_width(h->drafter);
    if (n > h->cap_fused) {
        float *p = realloc(h->fused, (size_t)n * H * sizeof *p);
        if (!p) return SD_ERR_NOMEM;
        h->fused = p;
        h->cap_fused = n;
    }
    SD_TRY(sd_drafter_eagle_fuse(h->drafter, aux, n, h->fused));
    for (int32_t p = pos0, m; p < pos0 + n; p += m) {
        float *side = sd_kv_side(h->kv, slot, p, &m);
        if (!side) return SD_ERR_RANGE;
        if (m > pos0 + n - p) m = pos0 + n - p;
        memcpy(side, h->fused + (size_t)(p - pos0) * H, (size_t)m * H * sizeof *side);
    }
    if (head_st != SD_OK) return head_st;
    return sd_drafter_eagle_set_fused(h->drafter, slot, pos0, n, hist + pos0, h->fused);
}

/* At -v: the fed rows' positions and the norm of their captured layers
 * (in double), for tests that compare them with TP 1's within a tolerance. */
void sd_vhead_feed(sd_vhead *h, int32_t slot, const int32_t *hist, int32_t pos0, int32_t n, int32_t row0) {
    if (!h || n <= 0) return;
    double t0 = sd_now();
    int32_t n_rows = 0;
    const float *aux = sd_model_capture_aux(h->target, &n_rows);
    sd_status st = SD_ERR_INTERNAL;
    if (aux && row0 >= 0 && pos0 >= 0 && (int64_t)row0 + n <= n_rows) {
        aux += (size_t)row0 * (size_t)h->aux_width;
        if (sd_log_enabled(SD_LOG_DEBUG))
            SD_DEBUG("head features: slot %d positions %d..%d l2 %.9g", (int)slot, (int)pos0, (int)(pos0 + n - 1),
                     sd_l2_norm(aux, (size_t)n * (size_t)h->aux_width));
        if (h->kv)
            st = feed_side(h, slot, hist, pos0, n, aux, fill_from_side(h, slot, hist, pos0));
        else
            st = sd_drafter_eagle_features(h->drafter, slot, pos0, n, hist + pos0, aux);
    }
    if (st != SD_OK) {
        SD_WARN("verifier: the head's features of slot %d, positions %d..%d (rows %d.. of %d): %s; it drafts "
                "nothing for that sequence until it is refilled",
                (int)slot, (int)pos0, (int)(pos0 + n - 1), (int)row0, (int)n_rows, sd_status_str(st));
        sd_drafter_rollback(h->drafter, slot, pos0 < 0 ? 0 : pos0);
    }
    h->feed_s = sd_now() - t0;
    h->feed_n = n;
    h->seconds += h->feed_s;
}

/* The forced drafts of hc (q = 1) into tokens / q, then the head's,
 * masked under hc->con, on ctx[n_ctx] extended by them. Returns how many. */
static sd_status draft_constrained(sd_vhead *h, int32_t slot, int32_t n_ctx, int32_t k, const sd_sampling *s,
                                   const sd_vhead_con *hc, int32_t *tokens, sd_spec_q *q, int32_t *n) {
    static const float one = 1.0f;
    int32_t nf = hc->n_forced < k ? hc->n_forced : k;
    *n = 0;
    if (n_ctx + nf >= h->max_ctx) return SD_OK; /* con is past the forced drafts: no room, no drafts */
    for (int32_t j = 0; j < nf; j++) {
        tokens[j] = h->ctx[n_ctx + j] = hc->forced[j];
        q[j] = (sd_spec_q){1, &hc->forced[j], &one};
    }
    *n = nf;
    if (nf > 0) SD_DEBUG("verifier: slot %d context %d: %d forced drafts", (int)slot, (int)n_ctx, (int)nf);
    if (nf == k || sd_constraint_ended(hc->con)) return SD_OK;
    int32_t more = 0;
    sd_drafter_set_constraint(h->drafter, hc->con);
    sd_status st = sd_drafter_propose(h->drafter, slot, h->ctx, n_ctx + nf, k - nf, s, tokens + nf, q + nf, &more);
    sd_drafter_set_constraint(h->drafter, NULL);
    *n = nf + more;
    return st;
}

void sd_vhead_draft(sd_vhead *h, size_t i, int32_t slot, const int32_t *cached, int32_t n_cached, int32_t next,
                    int32_t k, const sd_sampling *s, const sd_vhead_con *hc, Specd__VerifyResult *res) {
    if (!h || k <= 0 || i >= (size_t)h->max_batch || n_cached < 0 || n_cached >= h->max_ctx) return;
    double t0 = sd_now();
    const int32_t n_ctx = n_cached + 1;
    memcpy(h->ctx, cached, (size_t)n_cached * sizeof *h->ctx);
    h->ctx[n_cached] = next;
    if (k > h->max_k) k = h->max_k;
    int32_t *tokens = h->tokens + i * (size_t)h->max_k, n = 0;
    sd_spec_q q[SD_MAX_K];
    sd_status st = hc && hc->con ? draft_constrained(h, slot, n_ctx, k, s, hc, tokens, q, &n)
                                 : sd_drafter_propose(h->drafter, slot, h->ctx, n_ctx, k, s, tokens, q, &n);
    if (st != SD_OK) {
        SD_WARN("verifier: the head could not draft for slot %d: %s", (int)slot, sd_status_str(st));
        n = 0;
    }
    Specd__SparseDist *dists = h->dists + i * (size_t)h->max_k;
    Specd__SparseDist **pdists = h->pdists + i * (size_t)h->max_k;
    for (int32_t j = 0; j < n; j++) {
        /* q is the drafter's until its next propose on this slot: copied */
        size_t at = (i * (size_t)h->max_k + (size_t)j) * (size_t)h->max_q;
        int32_t m = q[j].n < h->max_q ? q[j].n : h->max_q;
        memcpy(h->q_ids + at, q[j].ids, (size_t)m * sizeof *h->q_ids);
        memcpy(h->q_probs + at, q[j].probs, (size_t)m * sizeof *h->q_probs);
        specd__sparse_dist__init(&dists[j]);
        dists[j].n_ids = dists[j].n_probs = (size_t)m;
        dists[j].ids = h->q_ids + at;
        dists[j].probs = h->q_probs + at;
        pdists[j] = &dists[j];
    }
    res->n_next_draft = res->n_next_q = (size_t)n;
    res->next_draft = n > 0 ? tokens : NULL;
    res->next_q = n > 0 ? pdists : NULL;
    double took = sd_now() - t0;
    h->seconds += took;
    /* All of it in next_us; apart, in next_catchup_us / _rows, the rows of
     * a context the head fell behind on (the prompt, steps at K = 0, which
     * run no head rows), past the 1 + k a drafting step takes in: a one-off
     * as a prefill is for the target, which the coordinator leaves out of
     * a draft token's price. Charged to the k drafts of a probe after a
     * stretch at K = 0 (or the prompt's), they priced a head draft token at
     * 4.7 ms against ~0.5 and kept the coordinator's K at 0 for good; the
     * coordinator prices them as what shadowing costs instead
     * (bench/results/eagle-cpu.md, 2026-12-03 session 43). */
    int64_t rows = 0;
    double catchup = sd_drafter_eagle_take_catchup_s(h->drafter, &rows);
    if (h->feed_n > k + 1) catchup += h->feed_s * (double)(h->feed_n - k - 1) / h->feed_n;
    const double all = took + h->feed_s;
    if (catchup > all) catchup = all;
    res->next_us = (uint32_t)(all * 1e6 < 4e9 ? all * 1e6 : 4e9);
    res->next_catchup_us = (uint32_t)(catchup * 1e6 < 4e9 ? catchup * 1e6 : 4e9);
    if (res->next_catchup_us > res->next_us) res->next_catchup_us = res->next_us;
    res->next_catchup_rows = (uint32_t)(rows < n_ctx ? rows : n_ctx);
    h->feed_s = 0.0;
    h->feed_n = 0;
}

int32_t sd_vhead_layers(const sd_vhead *h, int32_t *ids) { return h ? sd_drafter_eagle_layers(h->drafter, ids) : 0; }

double sd_vhead_take_seconds(sd_vhead *h) {
    if (!h) return 0.0;
    double s = h->seconds;
    h->seconds = 0.0;
    return s;
}
