/* sched_dispatch.c — continuous batching over one verifier leader and a drafter:
 * which sequences go in each verify and draft step, and when.
 *
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
 * is the budget of prompt tokens of a whole step: append_len; the part its
 * group's prefix cache likely holds, hinted(), does not count as missing
 * here, so a cached history costs no step of its own); a new prompt also
 * goes to the drafter at once ("warm" draft: k = the first K; its drafts are
 * stale once the verifier commits and are dropped). Drafts are valid only
 * while the committed length equals the one they were drafted from.
 * A request that wants prompt logprobs (echo) sends every prompt token but
 * the last through prefill chunks of at most SD_MAX_PROMPT_LP_ROWS that ask
 * the verifier to score them (VerifySeq.prompt_logprobs), each answer
 * streamed at once as a PromptLogprobs; a prompt-only request then ends.
 *
 * The scheduler is four files, one concern each, sharing the sd_sched_*
 * functions of coord.h: sched_dispatch.c (this one: the session table and
 * building and sending steps), sched_results.c (checking and applying
 * verify and draft results), sched_stream.c (committing tokens and
 * streaming them to the client) and sched_end.c (finishing and aborting
 * requests, failed steps, lost workers). */
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
void sd_sched_reap(sd_coord *c, sd_session *s) {
    if (s->state == SD_SESSION_FINISHED && !s->in_verify && !s->in_draft) remove_session(c, s);
}

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

/* Most tokens of a step taken on trust from hinted(), in --prefill-chunk
 * budgets: what a wrong hint can add to the rows one step computes. */
enum { SD_HINT_BUDGETS = 4 };

/* Tokens past what s's verifier holds that its group's prefix cache likely
 * holds: the placement's record of what was prefilled there (route_hint,
 * prefix_route.c). The verifier adopts those blocks instead of computing
 * them (verify_serve.c, in prefill chunks and in a normal step's append),
 * so they do not make a prompt go in prefill-only chunks: a conversation's
 * cached history goes in the step that computes its new turn. Trusted only
 * for a group whose heartbeats report prefix lookups (the record knows
 * nothing of a verifier started with --prefix-cache 0, which would compute
 * them all), never for a sequence whose features a head drafter reads (the
 * verifier computes those rows), and at most SD_HINT_BUDGETS budgets of it.
 * A wrong hint (the blocks were evicted there) never changes the output:
 * the verifier computes what it cannot adopt, in that one step. The last
 * token is always computed. */
static int32_t hinted(const sd_coord *c, const sd_session *s) {
    if (s->group < 0 || c->workers[s->group].prefix_query_tokens == 0 || sd_feat_wanted(c, s)) return 0;
    int32_t h = sd_imin(s->route_hint, s->n_tokens - 1) - s->v_cached;
    return h > 0 ? sd_imin(h, SD_HINT_BUDGETS * c->p.prefill_chunk) : 0;
}

/* What s wants from group g now. */
static cand_kind verify_candidate(const sd_coord *c, int32_t g, const sd_session *s) {
    if (s->state != SD_SESSION_ACTIVE || s->in_verify || s->group != g) return CAND_NONE;
    int32_t missing = s->n_tokens - s->v_cached;
    if (missing < 1) return CAND_NONE; /* cannot happen: the last token has no KV */
    if (missing - hinted(c, s) > c->p.prefill_chunk) return CAND_PREFILL;
    /* a head drafter's sequence: a step carries at most the step's feature rows */
    if (missing > 1 && sd_feat_wanted(c, s) && missing > sd_feat_step_rows(c)) return CAND_PREFILL;
    /* prompt logprobs owed: prefill scores them; a prompt-only request
     * ends once scored (sd_sched_prompt_logprobs_applied) */
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

/* What a step being built has left: prompt tokens (the step's share of
 * --prefill-chunk) and committed positions whose features head drafters
 * in their own process read (sd_feat_step_rows: a big target's 3 x n_embd
 * floats a position fill SD_MAX_STEP_FEATURES in a few dozen rows). */
typedef struct step_budget {
    int32_t tokens;
    int32_t feat_rows;
} step_budget;

static step_budget step_budget_new(const sd_coord *c) {
    return (step_budget){.tokens = c->p.prefill_chunk, .feat_rows = sd_feat_step_rows(c)};
}

/* Tokens s appends to the verifier's cache in the step being built, or 0
 * when s stays out of it: every prompt token a step carries (new prompts,
 * refills, prefill chunks) comes out of b->tokens, the step's share of
 * --prefill-chunk, so a burst of new prompts cannot turn one step into
 * seconds of prefill while running sequences wait for their next token
 * (bench/results/http-cpu.md). A running sequence (one token to append)
 * always goes, but for the features' bound. In a normal step a prompt goes
 * whole or waits for a later step; a prefill-only step cuts its chunks to
 * what is left. A prompt is charged the tokens it sends, at most the whole
 * budget: one that is over the budget only by what its group likely holds
 * (hinted(), verify_candidate) goes alone, as the first prompt of a step,
 * and a prefill chunk extends over that part uncharged. Not charging a
 * hinted prompt only the rows it computes is deliberate: two computed
 * prompts in one step each wait for both, which made cached chat turns
 * slower (bench/results/prefix-cpu.md). So the prompt rows a step computes
 * stay within the budget while the hints hold, and a wrong hint adds at
 * most SD_HINT_BUDGETS budgets, in that one prompt's one step.
 * A sequence whose head drafter reads its features appends no more rows
 * than b->feat_rows has left (its accepted drafts come from what the
 * appends leave: send_verify), so each committed position's features
 * reach the drafter, a long prefill in several steps. */
static int32_t append_len(const sd_coord *c, const sd_session *s, bool prefill, step_budget *b) {
    int32_t missing = s->n_tokens - s->v_cached;
    const bool feat = sd_feat_wanted(c, s);
    if (!prefill) {
        if (feat && missing > b->feat_rows) return 0;
        const int32_t charge = sd_imin(missing, c->p.prefill_chunk);
        if (missing > 1 && charge > b->tokens) return 0;
        if (missing > 1) b->tokens -= charge;
        if (feat) b->feat_rows -= missing;
        return missing;
    }
    int32_t n_append = sd_imin(b->tokens > 0 ? b->tokens + hinted(c, s) : 0, missing - 1);
    if (feat) n_append = sd_imin(n_append, b->feat_rows);
    /* Prompt logprobs: a chunk that starts where they are owed scores its
     * tokens' successors (at most SD_MAX_PROMPT_LP_ROWS, the last one
     * prompt_next); a refill of what was scored already stops there. Every
     * prompt token but the last goes through prefill. */
    if (prompt_lp_chunk(s, prefill)) /* the prompt only: a resubmission's continuation follows it */
        n_append = sd_imin(sd_imin(n_append, SD_MAX_PROMPT_LP_ROWS), s->n_prompt - 1 - s->v_cached);
    else if (s->prompt_lp_next < s->n_prompt)
        n_append = sd_imin(n_append, s->prompt_lp_next - 1 - s->v_cached);
    if (n_append < 1) return 0;
    b->tokens -= sd_imin(n_append, b->tokens);
    if (feat) b->feat_rows -= n_append;
    return n_append;
}

static void send_verify(sd_coord *c, int32_t g, bool prefill, uint64_t now_us) {
    sd_coord_worker *w = &c->workers[g];
    const cand_kind want = prefill ? CAND_PREFILL : CAND_STEP;
    int32_t n = 0;
    step_budget b = step_budget_new(c);
    for (int32_t i = 0; i < c->n_sessions && n < w->max_batch; i++)
        if (verify_candidate(c, g, c->sessions[i]) == want && append_len(c, c->sessions[i], prefill, &b) > 0) n++;
    /* the feature rows the appends leave go to accepted drafts, first come
     * (the appends take the same rows below: the same sequences go) */
    int32_t draft_feat_rows = b.feat_rows;
    if (n == 0 || !step_reserve(w, n)) return;
    sd_verify_pack pk;
    if (sd_pack_verify_alloc(&pk, n) != SD_OK) {
        SD_ERROR("out of memory building a verify request");
        return;
    }
    int32_t m = 0, n_tokens = 0;
    bool refill = false;
    b = step_budget_new(c);
    for (int32_t i = 0; i < c->n_sessions && m < n; i++) {
        sd_session *s = c->sessions[i];
        if (verify_candidate(c, g, s) != want) continue;
        int32_t missing = s->n_tokens - s->v_cached;
        int32_t n_append = append_len(c, s, prefill, &b);
        if (n_append == 0) continue;
        bool prompt_lp = prompt_lp_chunk(s, prefill);
        int32_t k = 0;
        /* A sampled request's refill step carries no drafts: whether its
         * warm-up drafts are back when the step goes depends on timing (a
         * busy verifier), and its draws depend on K (spec_adapt.c). */
        bool sampled_refill = missing > 1 && !sd_sampling_is_greedy(&s->sampling);
        if (!prefill && drafted_now(s) && !sampled_refill) {
            k = sd_imin(s->k, sd_k_cap(c, s, g)); /* the cap the K policy drafted under, now */
        }
        const bool feat = sd_feat_wanted(c, s); /* for its head drafter (feat_relay.c) */
        if (feat) {
            k = sd_imin(k, draft_feat_rows); /* an accepted draft becomes a position with features */
            draft_feat_rows -= k;
        }
        sd_pack_verify_seq(&pk, m, s, n_append, k);
        pk.seqs[m].want_features = feat;
        if (!prefill && w->drafter_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE && sd_head_drafts_for(c, s)) {
            /* the head drafts the next step's K now, within what the
             * request has room for after this step's drafts and token */
            pk.seqs[m].next_k = (uint32_t)sd_k_head_next(c, s, k, sd_k_cap(c, s, g) - k - 1);
        }
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
    uint32_t layers[SD_MAX_FEATURE_LAYERS];
    req.n_feature_layers = sd_feat_request_layers(c, pk.seqs, m, layers);
    req.feature_layers = req.n_feature_layers > 0 ? layers : NULL;
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
    SD_DEBUG("verify step %llu: %d seqs, %d tokens%s (cost model: %.0f us + %.0f us/token, draft step %.0f us, "
             "catch-up %.0f us a row)",
             (unsigned long long)req.step_id, m, n_tokens, prefill ? " (prefill only)" : "", c->cost.verify_fixed_us,
             c->cost.verify_token_us, c->cost.draft_step_us, c->cost.catchup_row_us);
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
    int32_t n_ready = 0, n_pending = 0, ready_tokens = 0;
    step_budget b = step_budget_new(c);
    double wait = 0.0;
    for (int32_t i = 0; i < c->n_sessions; i++) {
        const sd_session *s = c->sessions[i];
        cand_kind kind = verify_candidate(c, g, s);
        int32_t missing = s->n_tokens - s->v_cached, n_append;
        if (kind == CAND_STEP) {
            if ((n_append = append_len(c, s, false, &b)) > 0) { /* what the step would carry */
                n_ready++;
                /* rows computed: the hinted part is adopted */
                ready_tokens += n_append - sd_imin(hinted(c, s), n_append - 1) + (drafted_now(s) ? s->k : 0);
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
    size_t feat_floats = 0; /* head drafters' features in the step */
    w->step_refill = false;
    w->step_appended = 0;
    budget = c->p.prefill_chunk;
    for (int32_t i = 0; i < c->n_sessions && m < n; i++) {
        sd_session *s = c->sessions[i];
        int32_t k = draft_candidate(c, d, s);
        if (k <= 0 || !draft_fits(c, s, &budget)) continue;
        sd_pack_draft_seq(&pk, m, s, k);
        sd_feat_draft_seq(c, d, s, &pk.seqs[m], &feat_floats);
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
    sd_sched_flush_chunks(c, now_us);
    c->hold_event_us = 0;
}
