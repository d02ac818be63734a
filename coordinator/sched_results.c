/* sched_results.c — checking and applying verify and draft results (the
 * scheduler: sched_dispatch.c).
 *
 * Results are checked against the step that was sent (same request ids in
 * the same order, n_accepted <= drafts sent, the accepted drafts equal to
 * the drafts, exactly one more token committed, cached_len as the protocol
 * says); any mismatch fails the whole step for that worker: its sequences'
 * beliefs for it reset to 0 and they are resent in full. */
#include "coord.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks that a response has one result per sequence of the step. */
static bool same_count(const sd_coord_worker *w, size_t n, char *why, size_t why_len) {
    if ((int32_t)n != w->n_step) {
        snprintf(why, why_len, "%zu results for %d sequences", n, w->n_step);
        return false;
    }
    return true;
}

void sd_spec_counts_add(sd_spec_counts *t, int32_t k, int32_t n_accepted) {
    if (k < 0 || k > SD_MAX_K || n_accepted < 0 || n_accepted > k)
        return; /* the caller checked it against what was sent */
    t->seq_steps++;
    if (k == 0) return;
    t->drafts++;
    t->draft_tokens += (uint64_t)k;
    t->accepted += (uint64_t)n_accepted;
    for (int32_t i = 0; i < k; i++) t->draft_per_pos[i]++;
    for (int32_t i = 0; i < n_accepted; i++) t->accepted_per_pos[i]++;
    if (k > t->deepest) t->deepest = k;
}

int32_t sd_spec_counts_positions(const sd_spec_counts *t, int32_t max_k) {
    int32_t n = max_k > t->deepest ? max_k : t->deepest;
    return n < SD_MAX_K ? n : SD_MAX_K;
}

/* Checks results[i] of a verify response against what step i sent: false,
 * with why, when the verifier answered something it was not asked. */
static bool check_result(sd_coord *c, const sd_coord_worker *w, size_t i, const Specd__VerifyResult *vr, char *why,
                         size_t why_len) {
    if (vr->request_id != w->step_rids[i]) {
        snprintf(why, why_len, "results[%zu].request_id %llu, sent %llu", i, (unsigned long long)vr->request_id,
                 (unsigned long long)w->step_rids[i]);
        return false;
    }
    if (vr->code != SPECD__CODE__CODE_OK) return true;
    if (vr->n_next_draft > 0 && w->drafter_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE) {
        snprintf(why, why_len, "results[%zu]: %zu head drafts from a verifier that announced no head", i,
                 vr->n_next_draft);
        return false;
    }
    sd_session *s = sd_sched_find(c, vr->request_id);
    if (w->prefill_only) {
        if (vr->n_commit != 0 || (int64_t)vr->cached_len != w->step_end[i]) {
            snprintf(why, why_len, "prefill results[%zu]: %zu tokens committed, cached_len %u (expected 0, %d)", i,
                     vr->n_commit, vr->cached_len, w->step_end[i]);
            return false;
        }
        /* prompt logprobs exactly when asked: one per appended token */
        size_t n_lp = w->step_lp[i] && s ? (size_t)(w->step_end[i] - (s->prompt_lp_next - 1)) : 0;
        bool lp_bad = s && (vr->n_logprobs != n_lp || vr->n_top_ids != n_lp * (size_t)s->top_logprobs);
        for (size_t e = 0; s && !lp_bad && e < vr->n_top_ids; e++) lp_bad = vr->top_ids[e] >= c->n_vocab;
        if (lp_bad) {
            snprintf(why, why_len,
                     "prefill results[%zu]: %zu prompt logprobs and %zu alternatives (expected %zu, %d each)", i,
                     vr->n_logprobs, vr->n_top_ids, n_lp, s->top_logprobs);
            return false;
        }
        return true;
    }
    if ((int32_t)vr->n_accepted > w->step_k[i] || vr->n_commit != (size_t)vr->n_accepted + 1 ||
        (int64_t)vr->cached_len != (int64_t)w->step_end[i] + vr->n_accepted) {
        snprintf(why, why_len,
                 "results[%zu]: n_accepted %u of %d drafts, %zu tokens committed, cached_len %u (expected %lld)", i,
                 vr->n_accepted, w->step_k[i], vr->n_commit, vr->cached_len,
                 (long long)w->step_end[i] + vr->n_accepted);
        return false;
    }
    /* logprobs exactly when asked, each with the alternatives asked for */
    bool lp_bad =
        s && (s->logprobs ? vr->n_logprobs != vr->n_commit || vr->n_top_ids != vr->n_commit * (size_t)s->top_logprobs
                          : vr->n_logprobs != 0);
    for (size_t e = 0; s && !lp_bad && e < vr->n_top_ids; e++) lp_bad = vr->top_ids[e] >= c->n_vocab;
    if (lp_bad) {
        snprintf(why, why_len, "results[%zu]: %zu logprobs and %zu alternatives for %zu tokens (asked: %s, %d each)", i,
                 vr->n_logprobs, vr->n_top_ids, vr->n_commit, s->logprobs ? "yes" : "no", s->top_logprobs);
        return false;
    }
    for (size_t j = 0; s && j < vr->n_commit; j++) {
        bool bad =
            vr->commit[j] < 0 || vr->commit[j] >= c->n_vocab || (j < vr->n_accepted && vr->commit[j] != s->draft[j]);
        if (bad) {
            snprintf(why, why_len, "results[%zu].commit[%zu] = %d is not the draft or not a token", i, j,
                     vr->commit[j]);
            return false;
        }
    }
    return true;
}

/* Applies a checked OK result of a verify step to its request: counters,
 * the K policy's and the drafter choice's observations, and the commit. k:
 * the drafts the step carried for it. */
static void apply_ok(sd_coord *c, sd_coord_worker *w, sd_session *s, int32_t k, const Specd__VerifyResult *vr,
                     uint64_t now_us) {
    s->verify_failures = 0;
    bool refill = s->n_tokens - s->v_cached > 1; /* the step appended more than the last token */
    sd_feat_store(c, s, vr, s->v_cached);        /* a head drafter's features, when asked (feat_relay.c) */
    s->v_cached = (int32_t)vr->cached_len;
    if (refill) /* the group's prefix cache now holds these (placement.c) */
        sd_route_record(c->route, s->group, c->workers[s->group].worker_id, s->tokens, s->v_cached);
    if (w->prefill_only) {
        if (vr->n_logprobs > 0) sd_sched_prompt_logprobs_applied(c, s, vr, now_us);
        return;
    }
    s->target_steps++;
    s->drafted += (uint32_t)k;
    s->accepted += vr->n_accepted;
    sd_spec_counts_add(&c->spec, k, (int32_t)vr->n_accepted);
    w->committed += vr->n_commit;
    w->drafted += (uint32_t)k;
    w->accepted += vr->n_accepted;
    if (s->drafter >= 0) {
        /* the drafts came from the drafter the request has now:
         * a move drops any drafts in hand (placement.c) */
        c->workers[s->drafter].drafted += (uint32_t)k;
        c->workers[s->drafter].accepted += vr->n_accepted;
    }
    if (k > 0) {
        sd_adapt_observe(&s->adapt, k, (int32_t)vr->n_accepted);
        if (sd_sampling_is_greedy(&s->sampling)) sd_adapt_prior_update(&c->alpha_prior, &s->adapt);
        s->adapt.steps_at_zero = 0;
    } else if (sd_max_k(c, s) > 0) {
        s->adapt.steps_at_zero++;
    }
    s->draft_base = -1;
    s->k = 0;
    /* the head's drafts for the next step, handed out by its relay; the
     * rows it had to catch up on priced apart (what shadowing costs) */
    if (vr->n_next_draft == 0 || !sd_head_store(s, vr)) s->head_base = -1;
    sd_cost_observe_catchup(&c->cost, (int32_t)vr->next_catchup_rows, vr->next_catchup_us);
    sd_choice_observe(c, s, k, refill, vr->commit, (int32_t)vr->n_commit, now_us);
    sd_k_shadow_settle(c, s, vr->commit, (int32_t)vr->n_commit);
    {
        sd_token_logprob lps[SD_MAX_K + 1];
        bool with_lp = s->logprobs && vr->n_logprobs == vr->n_commit && vr->n_commit <= SD_MAX_K + 1;
        const size_t per = (size_t)s->top_logprobs; /* checked by check_result, <= SD_MAX_TOP_LOGPROBS */
        for (size_t t = 0; with_lp && t < vr->n_commit; t++) {
            lps[t].logprob = vr->logprobs[t];
            lps[t].n_top = (int32_t)per;
            memcpy(lps[t].top_ids, vr->top_ids + t * per, per * sizeof *vr->top_ids);
            memcpy(lps[t].top_logprobs, vr->top_logprobs + t * per, per * sizeof *vr->top_logprobs);
        }
        sd_sched_commit_step(c, s, vr->commit, (int32_t)vr->n_commit, with_lp ? lps : NULL, now_us);
    }
}

void sd_sched_on_verify(sd_coord *c, int32_t wi, const Specd__VerifyResponse *r, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[wi];
    char why[256];
    if (!w->busy || r->step_id != w->step_id) {
        SD_WARN("verifier %s: response to step %llu, expected %llu; ignored", w->name, (unsigned long long)r->step_id,
                (unsigned long long)(w->busy ? w->step_id : 0));
        return;
    }
    w->verify_reply_us = c->clock_us();
    if (!same_count(w, r->n_results, why, sizeof why)) {
        sd_sched_fail_step(c, wi, why);
        return;
    }
    /* Pass 1: check every result against what was sent. */
    for (size_t i = 0; i < r->n_results; i++) {
        if (!check_result(c, w, i, r->results[i], why, sizeof why)) {
            sd_sched_fail_step(c, wi, why);
            return;
        }
    }
    /* Pass 2: apply. */
    w->busy = false;
    w->steps++;
    uint64_t took = now_us > w->step_sent_us ? now_us - w->step_sent_us : 0;
    /* The model is of verify steps (1 + K rows per sequence, all with
     * logits). A step that also refills a prefix is left out: its prompt
     * rows cost less each (no LM head, bigger matmuls; measured 1.5 vs
     * 3.5 ms a row on a CPU) and, many times more numerous, they dragged the
     * fit to a large fixed cost and a small per-token cost, which made K > 0
     * look cheap at batch 64. */
    if (!w->prefill_only && !w->step_refill) {
        sd_cost_observe_verify(&c->cost, w->step_tokens, r->forward_us);
        sd_cost_observe_verify(&w->cost, w->step_tokens, r->forward_us);
    }
    sd_cost_observe_rows(&c->cost, w->step_tokens, r->forward_us);
    sd_cost_observe_rows(&w->cost, w->step_tokens, r->forward_us);
    int32_t n_step = w->n_step;
    w->n_step = 0;
    c->defer_chunks = true; /* streamed after the next verify request (sd_sched_pump) */
    c->drafting_dirty = true;
    for (int32_t i = 0; i < n_step; i++) {
        const Specd__VerifyResult *vr = r->results[i];
        sd_session *s = sd_sched_find(c, vr->request_id);
        if (!s) continue;
        s->in_verify = false;
        s->verifying_us += took;
        if (s->state == SD_SESSION_FINISHED) {
            sd_sched_reap(c, s);
            continue;
        }
        switch (vr->code) {
        case SPECD__CODE__CODE_OK: apply_ok(c, w, s, w->step_k[i], vr, now_us); break;
        case SPECD__CODE__CODE_CACHE_MISS:
            SD_INFO("request %llu: verifier cache miss at keep_len %d; resending the prefix", (unsigned long long)s->id,
                    s->v_cached);
            s->v_cached = 0;
            break;
        case SPECD__CODE__CODE_KV_FULL:
            s->v_cached = 0;
            if (c->n_active <= 1) {
                sd_sched_abort(c, s, SPECD__CODE__CODE_KV_FULL, "the verifier has no KV blocks for this request", true,
                               now_us);
            }
            break;
        default:
            /* A refusal of the request itself reaches the client as such;
             * any other code (UNKNOWN_REQUEST, CANCELLED...) would tell the
             * client something false about its own request, so it is the
             * verifier's failure: INTERNAL, naming the code. */
            snprintf(why, sizeof why, "the verifier answered %s for this request", sd_net_code_name(vr->code));
            sd_sched_abort(c, s,
                           vr->code == SPECD__CODE__CODE_BAD_REQUEST || vr->code == SPECD__CODE__CODE_TOO_LARGE
                               ? vr->code
                               : SPECD__CODE__CODE_INTERNAL,
                           why, true, now_us);
            break;
        }
    }
    c->defer_chunks = false;
}

static bool copy_drafts(sd_session *s, const Specd__DraftResult *dr) {
    size_t total = 0;
    for (size_t j = 0; j < dr->n_q; j++) total += dr->q[j]->n_ids;
    if (!s->q_off) {
        s->q_off = malloc((SD_MAX_K + 1) * sizeof *s->q_off);
        if (!s->q_off) return false;
    }
    if (total > s->q_cap) {
        int32_t *ids = realloc(s->q_ids, total * sizeof *ids);
        if (!ids) return false;
        s->q_ids = ids;
        float *pr = realloc(s->q_probs, total * sizeof *pr);
        if (!pr) return false;
        s->q_probs = pr;
        s->q_cap = total;
    }
    size_t off = 0;
    s->q_off[0] = 0;
    for (size_t j = 0; j < dr->n_tokens; j++) {
        s->draft[j] = dr->tokens[j];
        memcpy(s->q_ids + off, dr->q[j]->ids, dr->q[j]->n_ids * sizeof *s->q_ids);
        memcpy(s->q_probs + off, dr->q[j]->probs, dr->q[j]->n_ids * sizeof *s->q_probs);
        off += dr->q[j]->n_ids;
        s->q_off[j + 1] = (uint32_t)off;
    }
    s->k = (int32_t)dr->n_tokens;
    return true;
}

void sd_sched_on_draft(sd_coord *c, int32_t wi, const Specd__DraftResponse *r, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[wi];
    char why[256];
    if (!c->hold_event_us) c->hold_event_us = c->clock_us();
    if (!w->busy || r->step_id != w->step_id) {
        SD_WARN("drafter %s: response to step %llu, expected %llu; ignored", w->name, (unsigned long long)r->step_id,
                (unsigned long long)(w->busy ? w->step_id : 0));
        return;
    }
    if (!same_count(w, r->n_results, why, sizeof why)) {
        sd_sched_fail_step(c, wi, why);
        return;
    }
    for (size_t i = 0; i < r->n_results; i++) {
        const Specd__DraftResult *dr = r->results[i];
        bool ok = dr->request_id == w->step_rids[i];
        if (ok && dr->code == SPECD__CODE__CODE_OK)
            ok = (int32_t)dr->n_tokens <= w->step_k[i] && dr->n_q == dr->n_tokens &&
                 (int64_t)dr->cached_len == w->step_end[i];
        for (size_t j = 0; ok && j < dr->n_q; j++) ok = dr->q[j]->n_ids == dr->q[j]->n_probs;
        if (!ok) {
            snprintf(why, sizeof why,
                     "results[%zu]: request %llu (sent %llu), %zu tokens for k %d, %zu q, cached_len %u (expected %d)",
                     i, (unsigned long long)dr->request_id, (unsigned long long)w->step_rids[i], dr->n_tokens,
                     w->step_k[i], dr->n_q, dr->cached_len, w->step_end[i]);
            sd_sched_fail_step(c, wi, why);
            return;
        }
    }
    w->busy = false;
    w->steps++;
    uint64_t took = now_us > w->step_sent_us ? now_us - w->step_sent_us : 0;
    /* a head drafter's catch-up is priced apart (below), out of the round
     * trip as out of the draft token */
    uint64_t trip = took > r->catchup_us ? took - r->catchup_us : 0;
    sd_cost_observe_draft_step(&c->cost, trip);
    sd_cost_observe_draft_step(&w->cost, trip);
    int32_t n_drafted = 0;
    int32_t n_step = w->n_step;
    w->n_step = 0;
    for (int32_t i = 0; i < n_step; i++) {
        const Specd__DraftResult *dr = r->results[i];
        sd_session *s = sd_sched_find(c, dr->request_id);
        if (!s) continue;
        s->in_draft = false;
        s->drafting_us += took;
        s->draft_refill = w->step_refill;
        if (s->state == SD_SESSION_FINISHED) {
            sd_sched_reap(c, s);
            continue;
        }
        bool shadow = s->shadow_base == w->step_end[i] && s->shadow_token == SD_SHADOW_PENDING;
        if (dr->code == SPECD__CODE__CODE_OK) {
            s->d_cached = (int32_t)dr->cached_len;
            n_drafted += (int32_t)dr->n_tokens;
            if (shadow) {
                /* never used as drafts: K = 0 was chosen for this position */
                s->shadow_token = dr->n_tokens > 0 ? dr->tokens[0] : SD_SHADOW_NONE;
                sd_k_shadow_settle(c, s, NULL, 0);
            } else if (w->step_end[i] == s->n_tokens) {
                if (copy_drafts(s, dr)) s->draft_base = s->n_tokens;
            }
        } else {
            if (shadow) s->shadow_token = SD_SHADOW_NONE;
            if (dr->code != SPECD__CODE__CODE_CACHE_MISS)
                SD_WARN("drafter %s: %s for request %llu", w->name, sd_net_code_name(dr->code),
                        (unsigned long long)s->id);
            s->d_cached = 0;
            /* no drafts for this length: verify with K = 0 rather than loop */
            s->draft_base = s->n_tokens;
            s->k = 0;
        }
    }
    /* A head drafter reports apart what it spent on the rows past its
     * drafting steps' (catchup_us, validated within draft_us): the features
     * of the positions it skipped at K = 0, a new request's prompt. That is
     * the catch-up's price a row, not a draft token's: charged to a
     * shadow's one draft after a stretch at K = 0, a head drafter's token
     * was priced at 2.6 ms against ~0.5 at batch 1
     * (bench/results/eagle-cpu.md, session 44). With it taken off, a step
     * that took in a long append (step_refill) prices its drafts too. */
    sd_cost_observe_catchup(&c->cost, (int32_t)(r->catchup_rows < INT32_MAX ? r->catchup_rows : INT32_MAX),
                            r->catchup_us);
    if (!w->step_refill || r->catchup_rows > 0) { /* a prefill's time is not what a draft token costs */
        uint32_t us = r->draft_us - (r->catchup_us < r->draft_us ? r->catchup_us : r->draft_us);
        sd_cost_observe_draft(&c->cost, n_drafted, us);
        sd_cost_observe_draft(&w->cost, n_drafted, us);
    } else if (w->step_appended > 0 && w->cost.n_draft_obs > 0) {
        /* what taking in a prefix token costs it (moving a request to it:
         * choice.c), its drafts' measured cost taken off */
        double per = ((double)r->draft_us - n_drafted * w->cost.draft_token_us) / w->step_appended;
        if (per < 0) per = 0;
        w->refill_token_us = w->refill_token_us > 0 ? 0.8 * w->refill_token_us + 0.2 * per : per;
    }
}
