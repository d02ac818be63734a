/* scheduler.c — continuous batching over one verifier leader and a drafter.
 *
 * Each worker has at most one step in flight. Sequences are not put into
 * fixed cohorts: a sequence that is in neither step is "idle", and pump()
 * sends the verifier every idle sequence that is ready to verify (drafts in
 * hand for its current committed length, or K = 0, or a prefix to refill)
 * and the drafter every idle sequence that wants drafts. Verify goes out
 * first in pump() so the coordinator's overhead (verify reply -> next
 * verify request) stays short.
 *
 * Two cohorts or one. Left alone that makes two cohorts fall out by
 * themselves: while cohort A is verified, cohort B (the sequences that came
 * back from the previous verify) is drafted. That pays when drafting is
 * slow next to verifying and runs on its own hardware; it halves the verify
 * batch, so every sequence pays the verifier's fixed cost twice as often,
 * and a sequence that leaves a step to be drafted (a K = 0 sequence probing
 * K = 1) waits out a whole verify step for a draft that took a millisecond.
 * Measured on a CPU at 64 sequences with the n-gram drafter (drafting
 * ~1 ms, a verify step ~300 ms) that lost 15-20% of the verify batch. So
 * when the verifier is free while some sequences wait only for their drafts
 * (pending) and others are ready, hold_for_drafts() compares the two
 * choices: send the ready ones now (the pending ones wait for that step,
 * T(ready) each) or wait W for the drafts and send one batch (everyone waits
 * W): hold when W * (n_ready + n_pending) < T(ready) * n_pending, with T
 * from the verify cost model and W from the measured draft round trip (a
 * draft later than expected is expected to take as long again, so a stuck
 * drafter releases the hold within one verify step; the draft timeout
 * then drops the step and backs the drafter off, liveness.c). A fast drafter thus merges the cohorts; a slow one keeps
 * them apart and overlapped.
 *
 * Beliefs: v_cached/d_cached say what each worker holds for a sequence; a
 * request appends committed[cached ..] after keep_len = cached. A verifier
 * that must be refilled (new request, CACHE_MISS, new verifier) gets the
 * whole missing prefix: in prefill_only chunks of --prefill-chunk tokens
 * while more than a chunk is missing, then a normal step (--prefill-chunk
 * is the budget of prompt tokens of a whole step: append_len); a new prompt also
 * goes to the drafter at once ("warm" draft: k = the first K; its drafts are
 * stale once the verifier commits and are dropped). Drafts are valid only
 * while the committed length equals the one they were drafted from.
 * A request that wants prompt logprobs (echo) sends every prompt token but
 * the last through prefill chunks of at most SD_MAX_PROMPT_LP_ROWS that ask
 * the verifier to score them (VerifySeq.prompt_logprobs), each answer
 * streamed at once as a PromptLogprobs; a prompt-only request then ends.
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

/* ---------------------------------------------------------------- helpers */

sd_session *sd_sched_find(sd_coord *c, uint64_t request_id) {
    for (int32_t i = 0; i < c->n_sessions; i++)
        if (c->sessions[i]->id == request_id) return c->sessions[i];
    return NULL;
}

sd_status sd_sched_add(sd_coord *c, sd_session *s) {
    if (c->n_sessions == c->cap_sessions) {
        int32_t ncap = c->cap_sessions ? c->cap_sessions * 2 : 64;
        sd_session **ns = realloc(c->sessions, (size_t)ncap * sizeof *ns);
        if (!ns) return SD_ERR_NOMEM;
        c->sessions = ns;
        c->cap_sessions = ncap;
    }
    s->state = SD_SESSION_QUEUED;
    s->draft_base = -1;
    s->group = s->drafter = -1;
    s->shadow_slot = -1;
    c->sessions[c->n_sessions++] = s;
    c->n_queued++;
    return SD_OK;
}

static void remove_session(sd_coord *c, sd_session *s) {
    sd_choice_forget(c, s);
    for (int32_t i = 0; i < c->n_sessions; i++) {
        if (c->sessions[i] == s) {
            memmove(c->sessions + i, c->sessions + i + 1, (size_t)(c->n_sessions - i - 1) * sizeof *c->sessions);
            c->n_sessions--;
            break;
        }
    }
    sd_session_free(&s);
}

/* Frees a finished session once no step refers to it any more. */
static void reap(sd_coord *c, sd_session *s) {
    if (s->state == SD_SESSION_FINISHED && !s->in_verify && !s->in_draft) remove_session(c, s);
}

static void flush_chunks(sd_coord *c, uint64_t now_us);

static bool drafted_now(const sd_session *s) { return s->draft_base == s->n_tokens && !s->in_draft; }

static bool step_reserve(sd_coord_worker *w, int32_t n) {
    if (n > w->cap_step) {
        uint64_t *r = realloc(w->step_rids, (size_t)n * sizeof *r);
        if (!r) return false;
        w->step_rids = r;
        int32_t *k = realloc(w->step_k, (size_t)n * sizeof *k);
        if (!k) return false;
        w->step_k = k;
        int32_t *e = realloc(w->step_end, (size_t)n * sizeof *e);
        if (!e) return false;
        w->step_end = e;
        bool *lp = realloc(w->step_lp, (size_t)n * sizeof *lp);
        if (!lp) return false;
        w->step_lp = lp;
        w->cap_step = n;
    }
    return true;
}

/* At a verify send: splits the time since the last verify reply into the
 * time the step was held for drafts (reply -> the event that released it)
 * and the coordinator's own overhead (that event -> now). */
static void record_overhead(sd_coord *c, sd_coord_worker *g) {
    uint64_t held_from = g->hold_since_us, event = c->hold_event_us;
    g->hold_since_us = 0;
    if (g->verify_reply_us == 0) return;
    uint64_t now = c->clock_us();
    uint64_t from = g->verify_reply_us;
    double wait = 0.0;
    if (held_from && event > from) {
        wait = (double)(event - from);
        from = event;
    }
    c->overhead_us[c->overhead_pos] = now > from ? (double)(now - from) : 0.0;
    c->draft_wait_us[c->overhead_pos] = wait;
    c->overhead_pos = (c->overhead_pos + 1) % SD_COORD_OVERHEAD_WINDOW;
    if (c->n_overhead < SD_COORD_OVERHEAD_WINDOW) c->n_overhead++;
    g->verify_reply_us = 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void sd_sched_overhead(const sd_coord *c, double *p50, double *p99) {
    *p50 = *p99 = 0.0;
    if (c->n_overhead == 0) return;
    double *v = malloc((size_t)c->n_overhead * sizeof *v);
    if (!v) return;
    memcpy(v, c->overhead_us, (size_t)c->n_overhead * sizeof *v);
    qsort(v, (size_t)c->n_overhead, sizeof *v, cmp_double);
    *p50 = v[(c->n_overhead - 1) / 2];
    *p99 = v[(int32_t)((c->n_overhead - 1) * 0.99)];
    free(v);
}

void sd_sched_draft_wait(const sd_coord *c, double *mean, double *p99, double *held_share) {
    *mean = *p99 = *held_share = 0.0;
    if (c->n_overhead == 0) return;
    double *v = malloc((size_t)c->n_overhead * sizeof *v);
    if (!v) return;
    memcpy(v, c->draft_wait_us, (size_t)c->n_overhead * sizeof *v);
    double sum = 0.0;
    int32_t held = 0;
    for (int32_t i = 0; i < c->n_overhead; i++) {
        sum += v[i];
        held += v[i] > 0.0;
    }
    qsort(v, (size_t)c->n_overhead, sizeof *v, cmp_double);
    *mean = sum / c->n_overhead;
    *p99 = v[(int32_t)((c->n_overhead - 1) * 0.99)];
    *held_share = (double)held / c->n_overhead;
    free(v);
}

/* ---------------------------------------------------------------- dispatch */

static void admit(sd_coord *c) {
    for (int32_t i = 0; i < c->n_sessions && c->n_active < c->p.max_active; i++) {
        sd_session *s = c->sessions[i];
        if (s->state != SD_SESSION_QUEUED) continue;
        s->state = SD_SESSION_ACTIVE;
        if (sd_sampling_is_greedy(&s->sampling))
            s->adapt.alpha = c->alpha_prior; /* sampled: fixed start (spec_adapt.c) */
        c->n_queued--;
        c->n_active++;
        c->drafting_dirty = true; /* a new batch size */
    }
}

typedef enum { CAND_NONE, CAND_PREFILL, CAND_STEP } cand_kind;

/* What s wants from group g now. */
static cand_kind verify_candidate(const sd_coord *c, int32_t g, const sd_session *s) {
    if (s->state != SD_SESSION_ACTIVE || s->in_verify || s->group != g) return CAND_NONE;
    int32_t missing = s->n_tokens - s->v_cached;
    if (missing < 1) return CAND_NONE; /* cannot happen: the last token has no KV */
    if (missing > c->p.prefill_chunk) return CAND_PREFILL;
    /* prompt logprobs owed: prefill scores them; a prompt-only request
     * ends once scored (prompt_logprobs_applied) */
    if (s->prompt_lp_next < s->n_prompt && missing > 1) return CAND_PREFILL;
    if (s->prompt_only) return CAND_NONE;
    if (drafted_now(s)) return CAND_STEP;
    if (missing > 1) return CAND_STEP; /* refill now; the drafter warms up meanwhile */
    if (!s->in_draft && sd_k_want(c, s) == 0) return CAND_STEP;
    return CAND_NONE;
}

/* Whether s's prefill chunk starts where its prompt logprobs are owed. */
static bool prompt_lp_chunk(const sd_session *s, bool prefill) {
    return prefill && s->prompt_lp_next < s->n_prompt && s->v_cached + 1 == s->prompt_lp_next;
}

/* Tokens s appends to the verifier's cache in the step being built, or 0
 * when s stays out of it: every prompt token a step carries (new prompts,
 * refills, prefill chunks) comes out of *budget, the step's share of
 * --prefill-chunk, so a burst of new prompts cannot turn one step into
 * seconds of prefill while running sequences wait for their next token
 * (bench/results/http-cpu.md). A running sequence (one token to append)
 * always goes. In a normal step a prompt goes whole or waits for a later
 * step (it is never more than the chunk, verify_candidate); a prefill-only
 * step cuts its chunks to what is left. */
static int32_t append_len(const sd_session *s, bool prefill, int32_t *budget) {
    int32_t missing = s->n_tokens - s->v_cached;
    if (!prefill) {
        if (missing == 1) return 1;
        if (missing > *budget) return 0;
        *budget -= missing;
        return missing;
    }
    int32_t n_append = sd_imin(*budget, missing - 1);
    /* Prompt logprobs: a chunk that starts where they are owed scores its
     * tokens' successors (at most SD_MAX_PROMPT_LP_ROWS, the last one
     * prompt_next); a refill of what was scored already stops there. Every
     * prompt token but the last goes through prefill. */
    if (prompt_lp_chunk(s, prefill)) /* the prompt only: a resubmission's continuation follows it */
        n_append = sd_imin(sd_imin(n_append, SD_MAX_PROMPT_LP_ROWS), s->n_prompt - 1 - s->v_cached);
    else if (s->prompt_lp_next < s->n_prompt)
        n_append = sd_imin(n_append, s->prompt_lp_next - 1 - s->v_cached);
    if (n_append < 1) return 0;
    *budget -= n_append;
    return n_append;
}

static void send_verify(sd_coord *c, int32_t g, bool prefill, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[g];
    const cand_kind want = prefill ? CAND_PREFILL : CAND_STEP;
    int32_t n = 0, budget = c->p.prefill_chunk;
    for (int32_t i = 0; i < c->n_sessions && n < w->max_batch; i++)
        if (verify_candidate(c, g, c->sessions[i]) == want && append_len(c->sessions[i], prefill, &budget) > 0) n++;
    if (n == 0 || !step_reserve(w, n)) return;
    sd_verify_pack pk;
    if (sd_pack_verify_alloc(&pk, n) != SD_OK) {
        SD_ERROR("out of memory building a verify request");
        return;
    }
    int32_t m = 0, n_tokens = 0;
    bool refill = false;
    budget = c->p.prefill_chunk;
    for (int32_t i = 0; i < c->n_sessions && m < n; i++) {
        sd_session *s = c->sessions[i];
        if (verify_candidate(c, g, s) != want) continue;
        int32_t missing = s->n_tokens - s->v_cached;
        int32_t n_append = append_len(s, prefill, &budget);
        if (n_append == 0) continue;
        bool prompt_lp = prompt_lp_chunk(s, prefill);
        int32_t k = 0;
        /* A sampled request's refill step carries no drafts: whether its
         * warm-up drafts are back when the step goes depends on timing (a
         * busy verifier), and its draws depend on K (spec_adapt.c). */
        bool sampled_refill = missing > 1 && !sd_sampling_is_greedy(&s->sampling);
        if (!prefill && drafted_now(s) && !sampled_refill) {
            k = sd_imin(s->k, s->max_context - s->n_tokens - 1);
            k = sd_imin(k, s->max_tokens - sd_session_generated(s) - 1);
            k = sd_imin(k, w->max_k);
            if (k < 0) k = 0;
        }
        sd_pack_verify_seq(&pk, m, s, n_append, k);
        if (prompt_lp) {
            pk.seqs[m].prompt_logprobs = true;
            pk.seqs[m].prompt_next = s->tokens[s->v_cached + n_append];
            pk.seqs[m].top_logprobs = (uint32_t)s->top_logprobs;
        }
        w->step_lp[m] = prompt_lp;
        w->step_rids[m] = s->id;
        w->step_k[m] = k;
        s->verify_k = k;
        w->step_end[m] = s->v_cached + n_append;
        n_tokens += n_append + k;
        refill |= n_append > 1;
        s->in_verify = true;
        s->v_holds = true;
        if (s->t_sched_us == 0) s->t_sched_us = now_us;
        m++;
    }
    Specd__VerifyRequest req = SPECD__VERIFY_REQUEST__INIT;
    req.step_id = ++c->next_step_id;
    req.n_seqs = (size_t)m;
    req.seqs = pk.pseqs;
    req.prefill_only = prefill;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY;
    env.verify = &req;
    w->busy = true;
    w->prefill_only = prefill;
    w->step_id = req.step_id;
    w->step_sent_us = now_us;
    w->n_step = m;
    w->step_tokens = n_tokens;
    w->step_refill = refill;
    if (!prefill) c->verify_steps++;
    record_overhead(c, w);
    SD_DEBUG("verify step %llu: %d seqs, %d tokens%s (cost model: %.0f us + %.0f us/token, draft step %.0f us)",
             (unsigned long long)req.step_id, m, n_tokens, prefill ? " (prefill only)" : "", c->cost.verify_fixed_us,
             c->cost.verify_token_us, c->cost.draft_step_us);
    sd_outbox_worker(c, g, &env, now_us);
    sd_pack_verify_free(&pk);
}

/* Whether the free verifier should wait for drafts that are about to
 * arrive instead of verifying the ready sequences without them (see the
 * file comment). Pending: active sequences that wait only for drafts (their
 * verifier cache is current, they are in a draft step or about to be). */
/* W for one pending sequence: until its drafter's step with its drafts is in. */
static double draft_wait_us(const sd_coord *c, const sd_session *s, uint64_t now_us) {
    const sd_coord_worker *d = &c->workers[s->drafter];
    double est = d->cost.draft_step_us > 0.0 ? d->cost.draft_step_us : c->cost.draft_step_us, wait = est;
    if (d->busy) {
        double elapsed = now_us > d->step_sent_us ? (double)(now_us - d->step_sent_us) : 0.0;
        wait = elapsed < est ? est - elapsed : elapsed; /* late: expect as long again */
        if (!s->in_draft) wait += est;                  /* it goes in the next draft step */
    }
    return wait;
}

static bool hold_for_drafts(const sd_coord *c, int32_t g, uint64_t now_us) {
    const sd_coord_worker *v = &c->workers[g];
    int32_t n_ready = 0, n_pending = 0, ready_tokens = 0, budget = c->p.prefill_chunk;
    double wait = 0.0;
    for (int32_t i = 0; i < c->n_sessions; i++) {
        const sd_session *s = c->sessions[i];
        cand_kind kind = verify_candidate(c, g, s);
        int32_t missing = s->n_tokens - s->v_cached, n_append;
        if (kind == CAND_STEP) {
            if ((n_append = append_len(s, false, &budget)) > 0) { /* what the step would carry */
                n_ready++;
                ready_tokens += n_append + (drafted_now(s) ? s->k : 0);
            }
        } else if (kind == CAND_NONE && s->group == g && s->state == SD_SESSION_ACTIVE && !s->in_verify &&
                   missing == 1 && sd_coord_drafter_usable(c, s)) {
            n_pending++;
            double w = draft_wait_us(c, s, now_us);
            if (w > wait) wait = w;
        }
    }
    if (n_ready == 0 || n_pending == 0 || n_ready >= v->max_batch) return false;
    if (n_pending > v->max_batch - n_ready) n_pending = v->max_batch - n_ready;
    /* W: until the pending drafts are in; T from the group's own cost line
     * once it has one, else the service's */
    const sd_cost_model *cm = v->cost.verify_fit.w > 0.0 || v->cost.size_n[1] > 0 ? &v->cost : &c->cost;
    double t_ready = sd_cost_verify_us(cm, ready_tokens);
    return wait * (n_ready + n_pending) < t_ready * n_pending;
}

static void dispatch_verify(sd_coord *c, int32_t g, uint64_t now_us) {
    sd_coord_worker *v = &c->workers[g];
    if (!sd_coord_is_group(v) || v->busy) return;
    bool any_prefill = false, any_step = false;
    for (int32_t i = 0; i < c->n_sessions; i++) {
        cand_kind kind = verify_candidate(c, g, c->sessions[i]);
        any_prefill |= kind == CAND_PREFILL;
        any_step |= kind == CAND_STEP;
    }
    /* Prefill chunks alternate with normal steps so a long prompt does not
     * stall the running sequences. */
    if (any_prefill && (!any_step || !v->prefill_only)) {
        send_verify(c, g, true, now_us);
    } else if (any_step) {
        if (hold_for_drafts(c, g, now_us)) {
            if (v->hold_since_us == 0) v->hold_since_us = c->clock_us();
            return;
        }
        send_verify(c, g, false, now_us);
    } else {
        v->hold_since_us = 0; /* nothing left to hold for */
        /* an idle group (its requests all done, others still running) is
         * not coordinator overhead until its next request arrives */
        if (sd_place_group_load(c, g) == 0) v->verify_reply_us = 0;
    }
}

/* Drafts wanted: a normal draft for an idle sequence whose verifier is
 * current, a warm-up of a sequence being refilled, or a shadow draft of a
 * sequence whose K = 0 step is being verified. Returns k or 0. */
static int32_t draft_candidate(const sd_coord *c, int32_t d, const sd_session *s) {
    if (s->state != SD_SESSION_ACTIVE || s->drafter != d || s->in_draft || s->draft_base == s->n_tokens) return 0;
    int32_t missing = s->n_tokens - s->v_cached;
    if (missing == 1 && s->in_verify) return sd_k_shadow(c, s);
    if (missing > 1 && s->d_cached >= s->n_tokens) return 0;
    return sd_k_want(c, s);
}

/* Whether a draft candidate goes in the draft step being built. What the
 * drafter lacks beyond a running sequence's 1 + max_k tokens (a new
 * prompt's warm-up, a refill) comes out of *budget, the verify step's
 * budget (append_len): a burst of new prompts joins a budget's worth at a
 * time instead of holding every running sequence's drafts for the length of
 * all their prefills. The first such sequence always goes (the drafter
 * takes a prefix in one step, however long). */
/* Most tokens a running sequence's drafter lacks: the accepted drafts and
 * the target's token; more is a refill. */
static int32_t draft_running_append(const sd_coord *c) { return (c->p.max_k > 1 ? c->p.max_k : 1) + 1; }

static bool draft_fits(const sd_coord *c, const sd_session *s, int32_t *budget) {
    int32_t keep = s->d_cached < s->n_tokens ? s->d_cached : s->n_tokens - 1; /* sd_pack_draft_seq's */
    int32_t n_append = s->n_tokens - keep;
    if (n_append <= draft_running_append(c)) return true;
    if (n_append > *budget && *budget < c->p.prefill_chunk) return false;
    *budget -= n_append;
    return true;
}

static void dispatch_draft(sd_coord *c, int32_t d, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[d];
    if (!sd_coord_is_drafter(w) || w->busy || w->backed_off) return;
    int32_t n = 0, budget = c->p.prefill_chunk;
    for (int32_t i = 0; i < c->n_sessions && n < w->max_batch; i++)
        if (draft_candidate(c, d, c->sessions[i]) > 0 && draft_fits(c, c->sessions[i], &budget)) n++;
    if (n == 0 || !step_reserve(w, n)) return;
    sd_draft_pack pk;
    if (sd_pack_draft_alloc(&pk, n) != SD_OK) {
        SD_ERROR("out of memory building a draft request");
        return;
    }
    int32_t m = 0;
    w->step_refill = false;
    w->step_appended = 0;
    budget = c->p.prefill_chunk;
    for (int32_t i = 0; i < c->n_sessions && m < n; i++) {
        sd_session *s = c->sessions[i];
        int32_t k = draft_candidate(c, d, s);
        if (k <= 0 || !draft_fits(c, s, &budget)) continue;
        sd_pack_draft_seq(&pk, m, s, k);
        if ((int64_t)pk.seqs[m].n_append > draft_running_append(c)) w->step_refill = true;
        w->step_appended += (int32_t)pk.seqs[m].n_append;
        w->step_rids[m] = s->id;
        w->step_k[m] = k;
        w->step_end[m] = s->n_tokens;
        if (s->in_verify && s->n_tokens - s->v_cached == 1) { /* shadow */
            s->shadow_base = s->n_tokens;
            s->shadow_token = SD_SHADOW_PENDING;
            s->adapt.steps_at_zero = 0;
        }
        s->in_draft = true;
        s->d_holds = true;
        if (s->t_sched_us == 0) s->t_sched_us = now_us;
        m++;
    }
    Specd__DraftRequest req = SPECD__DRAFT_REQUEST__INIT;
    req.step_id = ++c->next_step_id;
    req.n_seqs = (size_t)m;
    req.seqs = pk.pseqs;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT;
    env.draft = &req;
    w->busy = true;
    w->step_id = req.step_id;
    w->step_sent_us = now_us;
    w->n_step = m;
    SD_DEBUG("draft step %llu: %d seqs", (unsigned long long)req.step_id, m);
    sd_outbox_worker(c, d, &env, now_us);
    sd_pack_draft_free(&pk);
}

void sd_sched_pump(sd_coord *c, uint64_t now_us) {
    /* a held verify step released by this event counts its overhead from here */
    if (!c->hold_event_us) {
        for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++) {
            if (c->workers[g].used && c->workers[g].hold_since_us) {
                c->hold_event_us = c->clock_us();
                break;
            }
        }
    }
    admit(c);
    sd_place_pending(c, now_us);
    if (c->drafting_dirty) sd_k_update_gate(c);
    for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++) dispatch_verify(c, g, now_us);
    for (int32_t d = 0; d < SD_COORD_MAX_WORKERS; d++) dispatch_draft(c, d, now_us);
    flush_chunks(c, now_us);
    c->hold_event_us = 0;
}

/* ---------------------------------------------------------------- finishing */

static void fill_stats(const sd_coord *c, const sd_session *s, Specd__RequestStats *st, uint64_t now_us) {
    specd__request_stats__init(st);
    st->prompt_tokens = (uint32_t)s->n_prompt;
    st->generated_tokens = (uint32_t)sd_session_generated(s);
    st->drafted = s->drafted;
    st->accepted = s->accepted;
    st->target_steps = s->target_steps;
    uint64_t sched = s->t_sched_us ? s->t_sched_us : now_us;
    st->queued_ms = (double)(sched - s->t_submit_us) / 1000.0;
    st->drafting_ms = (double)s->drafting_us / 1000.0;
    st->verifying_ms = (double)s->verifying_us / 1000.0;
    st->first_token_ms = s->t_first_token_us ? (double)(s->t_first_token_us - s->t_submit_us) / 1000.0 : 0.0;
    st->total_ms = (double)(now_us - s->t_submit_us) / 1000.0;
    st->drafter_kind = s->want_kind;
    if (!st->drafter_kind && s->drafter >= 0 && c->workers[s->drafter].used)
        st->drafter_kind = c->workers[s->drafter].drafter_kind;
    st->drafter_switches = s->kind_switches;
}

static void release(sd_coord *c, sd_session *s, uint64_t now_us) {
    if (s->v_holds && sd_coord_group_ok(c, s)) {
        /* what it held stays in the group's prefix cache (placement.c) */
        sd_route_record(c->route, s->group, c->workers[s->group].worker_id, s->tokens, s->v_cached);
        sd_outbox_release(c, s->group, s->id, now_us);
    }
    if (s->d_holds && sd_coord_drafter_ok(c, s)) sd_outbox_release(c, s->drafter, s->id, now_us);
    s->v_holds = s->d_holds = false;
}

static void end_session(sd_coord *c, sd_session *s, uint64_t now_us) {
    if (s->state == SD_SESSION_ACTIVE)
        c->n_active--;
    else if (s->state == SD_SESSION_QUEUED)
        c->n_queued--;
    s->state = SD_SESSION_FINISHED;
    c->finished_requests++;
    release(c, s, now_us);
    sd_coord_client_request_done(c, s->client_ident, s->client_ident_len);
    reap(c, s);
}

void sd_sched_finish(sd_coord *c, sd_session *s, Specd__StopReason reason, const char *tail, size_t tail_len,
                     uint64_t now_us) {
    if (s->state == SD_SESSION_FINISHED) return;
    Specd__RequestStats st;
    fill_stats(c, s, &st, now_us);
    Specd__Finished fin = SPECD__FINISHED__INIT;
    fin.request_id = s->id;
    fin.reason = reason;
    fin.stats = &st;
    fin.text_tail.data = (uint8_t *)(uintptr_t)tail;
    fin.text_tail.len = tail ? tail_len : 0;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED;
    env.finished = &fin;
    SD_INFO("request %llu finished (%s): %d prompt + %d generated tokens, %u/%u drafts accepted, %u steps",
            (unsigned long long)s->id,
            protobuf_c_enum_descriptor_get_value(&specd__stop_reason__descriptor, (int)reason)->name, s->n_prompt,
            sd_session_generated(s), s->accepted, s->drafted, s->target_steps);
    sd_outbox_client(c, s->client_ident, s->client_ident_len, &env, now_us);
    end_session(c, s, now_us);
}

void sd_sched_abort(sd_coord *c, sd_session *s, Specd__Code code, const char *msg, bool notify, uint64_t now_us) {
    if (s->state == SD_SESSION_FINISHED) return;
    SD_WARN("request %llu aborted (%s): %s", (unsigned long long)s->id, sd_net_code_name(code), msg);
    if (notify)
        sd_outbox_client_error(c, s->client_ident, s->client_ident_len, code, s->id, s->client_tag, msg, now_us);
    end_session(c, s, now_us);
}

/* ---------------------------------------------------------------- results */

void sd_sched_fail_step(sd_coord *c, int32_t wi, const char *why) {
    sd_coord_worker *w = &c->workers[wi];
    bool verifier = w->role == SPECD__ROLE__ROLE_VERIFIER;
    SD_WARN("%s %s failed step %llu: %s", verifier ? "verifier" : "drafter", w->name, (unsigned long long)w->step_id,
            why);
    if (!w->busy) return;
    w->busy = false;
    for (int32_t i = 0; i < w->n_step; i++) {
        sd_session *s = sd_sched_find(c, w->step_rids[i]);
        if (!s) continue;
        if (verifier) {
            s->in_verify = false;
            s->v_cached = 0;
            if (++s->verify_failures > 3 && s->state != SD_SESSION_FINISHED) {
                sd_sched_abort(c, s, SPECD__CODE__CODE_INTERNAL, "the verifier failed this request's step 4 times",
                               true, 0);
                continue;
            }
        } else {
            s->in_draft = false;
            s->d_cached = 0;
            if (s->shadow_token == SD_SHADOW_PENDING) s->shadow_token = SD_SHADOW_NONE; /* lost with the step */
            /* no drafts at this length: verify with K = 0 rather than retry at once */
            s->draft_base = s->n_tokens;
            s->k = 0;
        }
        reap(c, s);
    }
    w->n_step = 0;
    if (verifier) w->verify_reply_us = w->hold_since_us = 0;
}

/* The worker's requests keep their committed tokens and lose it: the next
 * pump places them on the other groups / drafters (placement.c), where they
 * are refilled from keep_len 0. */
void sd_sched_on_worker_lost(sd_coord *c, int32_t wi) {
    sd_coord_worker *w = &c->workers[wi];
    w->busy = false;
    w->n_step = 0;
    w->verify_reply_us = w->hold_since_us = 0;
    int32_t moved = 0;
    for (int32_t i = c->n_sessions - 1; i >= 0; i--) {
        sd_session *s = c->sessions[i];
        if (s->group == wi) {
            s->in_verify = false;
            s->v_cached = 0;
            s->v_holds = false;
            s->group = -1;
            moved += s->state == SD_SESSION_ACTIVE;
        }
        if (s->drafter == wi) {
            s->in_draft = false;
            s->d_cached = 0;
            s->d_holds = false;
            s->drafter = -1;
            if (s->shadow_token == SD_SHADOW_PENDING) s->shadow_token = SD_SHADOW_NONE;
            moved += s->state == SD_SESSION_ACTIVE;
        }
        reap(c, s);
    }
    c->drafting_dirty = true;
    if (moved > 0)
        SD_INFO("%s %s: %d requests move to the others",
                w->role == SPECD__ROLE__ROLE_VERIFIER ? "verifier group" : "drafter", w->name, moved);
}

/* Checks that a response has one result per sequence of the step. */
static bool same_count(const sd_coord_worker *w, size_t n, char *why, size_t why_len) {
    if ((int32_t)n != w->n_step) {
        snprintf(why, why_len, "%zu results for %d sequences", n, w->n_step);
        return false;
    }
    return true;
}

/* A step's chunk holds at most SD_MAX_K + 1 tokens, so its logprobs are
 * laid out on the stack. */
typedef struct chunk_logprobs {
    Specd__TokenLogprob msgs[SD_MAX_K + 1];
    Specd__TokenLogprob *ptrs[SD_MAX_K + 1];
    ProtobufCBinaryData tops[SD_MAX_K + 1][SD_MAX_TOP_LOGPROBS];
} chunk_logprobs;

/* TokenChunk.logprobs for ids[n] from lps[n], with each token's bytes from
 * the tokenizer (the client has none); pointers into lps and the
 * tokenizer, valid while both are. */
/* One TokenLogprob for token id from *lp, with the bytes of the token and
 * its alternatives (tops[lp->n_top]) from the tokenizer (the client has
 * none); pointers into lp and the tokenizer, valid while both are. */
static void fill_logprob_msg(const sd_tok *tok, int32_t id, const sd_token_logprob *lp, Specd__TokenLogprob *m,
                             ProtobufCBinaryData *tops) {
    specd__token_logprob__init(m);
    size_t len = 0;
    const char *piece = sd_tok_piece(tok, id, &len);
    m->token.data = (uint8_t *)(uintptr_t)(piece ? piece : "");
    m->token.len = piece && len <= SD_MAX_TOKEN_BYTES ? len : 0;
    m->logprob = lp->logprob;
    m->n_top_ids = m->n_top_logprobs = m->n_top_tokens = (size_t)lp->n_top;
    m->top_ids = (int32_t *)(uintptr_t)lp->top_ids;
    m->top_logprobs = (float *)(uintptr_t)lp->top_logprobs;
    m->top_tokens = tops;
    for (int32_t j = 0; j < lp->n_top; j++) {
        piece = sd_tok_piece(tok, lp->top_ids[j], &len);
        tops[j].data = (uint8_t *)(uintptr_t)(piece ? piece : "");
        tops[j].len = piece && len <= SD_MAX_TOKEN_BYTES ? len : 0;
    }
}

static void fill_chunk_logprobs(const sd_tok *tok, const int32_t *ids, const sd_token_logprob *lps, int32_t n,
                                chunk_logprobs *out, Specd__TokenChunk *chunk) {
    for (int32_t t = 0; t < n; t++) {
        fill_logprob_msg(tok, ids[t], &lps[t], &out->msgs[t], out->tops[t]);
        out->ptrs[t] = &out->msgs[t];
    }
    chunk->n_logprobs = (size_t)n;
    chunk->logprobs = out->ptrs;
}

static void send_chunk(sd_coord *c, const sd_session *s, int32_t from, int32_t n, int32_t n_generated, const char *text,
                       size_t text_len, const sd_token_logprob *lps, uint64_t now_us) {
    Specd__TokenChunk chunk = SPECD__TOKEN_CHUNK__INIT;
    chunk.request_id = s->id;
    chunk.n_tokens = (size_t)n;
    chunk.tokens = (int32_t *)(uintptr_t)(s->tokens + from);
    chunk_logprobs clp;
    if (lps && n <= SD_MAX_K + 1) fill_chunk_logprobs(c->tok, chunk.tokens, lps, n, &clp, &chunk);
    chunk.text.data = (uint8_t *)(uintptr_t)text;
    chunk.text.len = text_len;
    chunk.n_generated = (uint32_t)n_generated;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS;
    env.tokens = &chunk;
    sd_outbox_client(c, s->client_ident, s->client_ident_len, &env, now_us);
}

/* Streams the chunks a verify reply committed (sd_sched_pump calls this
 * after dispatching: packing and sending 64 chunks took ~50 of the ~100 us
 * between a verify reply and the next request). A request that ended
 * meanwhile has had its Finished or error: its chunk is dropped. */
static void flush_chunks(sd_coord *c, uint64_t now_us) {
    for (int32_t i = 0; i < c->n_chunks; i++) {
        sd_pending_chunk *p = &c->chunks[i];
        const sd_session *s = sd_sched_find(c, p->request_id);
        if (s && s->state != SD_SESSION_FINISHED && p->from + p->n <= s->n_tokens)
            send_chunk(c, s, p->from, p->n, p->n_generated, p->text, p->text_len, p->logprobs, now_us);
        free(p->text);
        free(p->logprobs);
    }
    c->n_chunks = 0;
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

void sd_sched_prompt_logprobs(sd_coord *c, const sd_session *s, int32_t from, int32_t n, const sd_token_logprob *lps,
                              uint64_t now_us) {
    if (n < 1 || n > SD_MAX_PROMPT_LP_ROWS || from < 0 || from + n > s->n_prompt || (!lps && (from != 0 || n != 1)))
        return; /* the callers' invariants */
    /* on the stack (about 30 KiB): nothing here can fail, so the session
     * outlives the call for the callers */
    Specd__TokenLogprob msgs[SD_MAX_PROMPT_LP_ROWS], *ptrs[SD_MAX_PROMPT_LP_ROWS];
    ProtobufCBinaryData tops[SD_MAX_PROMPT_LP_ROWS][SD_MAX_TOP_LOGPROBS];
    sd_token_logprob none = {.logprob = NAN, .n_top = 0};
    for (int32_t t = 0; t < n; t++) {
        fill_logprob_msg(c->tok, s->tokens[from + t], lps ? &lps[t] : &none, &msgs[t], tops[t]);
        ptrs[t] = &msgs[t];
    }
    Specd__PromptLogprobs pl = SPECD__PROMPT_LOGPROBS__INIT;
    pl.request_id = s->id;
    pl.from = (uint32_t)from;
    pl.n_tokens = (size_t)n;
    pl.tokens = s->tokens + from;
    pl.n_logprobs = (size_t)n;
    pl.logprobs = ptrs;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS;
    env.prompt_logprobs = &pl;
    sd_outbox_client(c, s->client_ident, s->client_ident_len, &env, now_us);
}

/* A checked prefill result with prompt logprobs: the scored positions go
 * to the client; a prompt-only request whose prompt is all scored ends. */
static void prompt_logprobs_applied(sd_coord *c, sd_session *s, const Specd__VerifyResult *vr, uint64_t now_us) {
    const int32_t n = (int32_t)vr->n_logprobs, from = s->prompt_lp_next; /* checked: n <= SD_MAX_PROMPT_LP_ROWS */
    const size_t per = (size_t)s->top_logprobs;
    sd_token_logprob lps[SD_MAX_PROMPT_LP_ROWS];
    for (int32_t t = 0; t < n; t++) {
        lps[t].logprob = vr->logprobs[t];
        lps[t].n_top = (int32_t)per;
        memcpy(lps[t].top_ids, vr->top_ids + (size_t)t * per, per * sizeof *vr->top_ids);
        memcpy(lps[t].top_logprobs, vr->top_logprobs + (size_t)t * per, per * sizeof *vr->top_logprobs);
    }
    sd_sched_prompt_logprobs(c, s, from, n, lps, now_us);
    s->prompt_lp_next = from + n;
    if (s->prompt_only && s->prompt_lp_next >= s->n_prompt && s->state != SD_SESSION_FINISHED)
        sd_sched_finish(c, s, SPECD__STOP_REASON__STOP_REASON_LENGTH, NULL, 0, now_us);
}

/* Commits a verify step's tokens[n]; lps[n] their logprobs when the
 * request asked for them, else NULL. */
static void commit_step(sd_coord *c, sd_session *s, const int32_t *tokens, int32_t n, const sd_token_logprob *lps,
                        uint64_t now_us) {
    sd_commit_out out;
    sd_status st = sd_session_commit(s, c->tok, tokens, n, &out);
    if (st != SD_OK) {
        free(out.text);
        free(out.tail);
        sd_sched_abort(c, s, SPECD__CODE__CODE_INTERNAL, "committing tokens failed", true, now_us);
        return;
    }
    if (s->t_first_token_us == 0 && out.n_taken > 0) s->t_first_token_us = now_us;
    c->committed_tokens += (uint64_t)out.n_taken;
    int32_t from = s->n_tokens - out.n_taken, n_gen = sd_session_generated(s);
    if (out.n_taken > 0 && c->defer_chunks && !out.finished) {
        if (c->n_chunks == c->cap_chunks) {
            int32_t cap = c->cap_chunks ? 2 * c->cap_chunks : 64;
            sd_pending_chunk *p = realloc(c->chunks, (size_t)cap * sizeof *p);
            if (p) c->chunks = p, c->cap_chunks = cap;
        }
        sd_token_logprob *kept = NULL;
        if (lps && (kept = malloc((size_t)out.n_taken * sizeof *kept)))
            memcpy(kept, lps, (size_t)out.n_taken * sizeof *kept);
        if (c->n_chunks < c->cap_chunks && (!lps || kept)) {
            c->chunks[c->n_chunks++] =
                (sd_pending_chunk){s->id, from, out.n_taken, n_gen, out.text, out.text_len, kept};
            return; /* the text and logprobs are the chunk's now */
        }
        free(kept);
    }
    /* now: not deferring, no room to defer, or the last chunk before Finished */
    if (out.n_taken > 0) send_chunk(c, s, from, out.n_taken, n_gen, out.text, out.text_len, lps, now_us);
    if (out.finished) sd_sched_finish(c, s, out.reason, out.tail, out.tail_len, now_us);
    free(out.text);
    free(out.tail);
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
    s->v_cached = (int32_t)vr->cached_len;
    if (refill) /* the group's prefix cache now holds these (placement.c) */
        sd_route_record(c->route, s->group, c->workers[s->group].worker_id, s->tokens, s->v_cached);
    if (w->prefill_only) {
        if (vr->n_logprobs > 0) prompt_logprobs_applied(c, s, vr, now_us);
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
        commit_step(c, s, vr->commit, (int32_t)vr->n_commit, with_lp ? lps : NULL, now_us);
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
            reap(c, s);
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
    sd_cost_observe_draft_step(&c->cost, took);
    sd_cost_observe_draft_step(&w->cost, took);
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
            reap(c, s);
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
    if (!w->step_refill) { /* a prefill's time is not what a draft token costs */
        sd_cost_observe_draft(&c->cost, n_drafted, r->draft_us);
        sd_cost_observe_draft(&w->cost, n_drafted, r->draft_us);
    } else if (w->step_appended > 0 && w->cost.n_draft_obs > 0) {
        /* what taking in a prefix token costs it (moving a request to it:
         * choice.c), its drafts' measured cost taken off */
        double per = ((double)r->draft_us - n_drafted * w->cost.draft_token_us) / w->step_appended;
        if (per < 0) per = 0;
        w->refill_token_us = w->refill_token_us > 0 ? 0.8 * w->refill_token_us + 0.2 * per : per;
    }
}
