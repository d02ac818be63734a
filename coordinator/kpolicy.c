/* kpolicy.c — the coordinator's side of the draft-length (K) policy: which
 * K each sequence may use given its request and the workers registered
 * (sd_max_k, within sd_k_cap: the one cap, which the scheduler also puts on
 * the drafts a verify step carries), the K it asks for (sd_k_want), whether
 * drafting pays for the batch at all (sd_k_update_gate), and the shadow
 * drafts that let a K = 0 sequence notice when drafting starts to pay
 * again. The policy's arithmetic (cost model, acceptance estimates,
 * choosing K) is the engine's (engine/spec/spec_adapt.c), shared with
 * single-process decoding; the scheduler calls these and only sends. */
#include "coord.h"

/* The batch s will be verified in: the active requests of its group
 * (hold_for_drafts keeps them together), as far as the group takes. */
static int32_t group_batch(const sd_coord *c, const sd_session *s) {
    if (!sd_coord_group_ok(c, s)) return c->n_active;
    int32_t n = sd_place_group_load(c, s->group);
    return sd_imin(n > 0 ? n : 1, c->workers[s->group].max_batch);
}

int32_t sd_k_cap(const sd_coord *c, const sd_session *s, int32_t g) {
    int32_t cap = sd_imin(s->max_tokens - sd_session_generated(s) - 1, /* the target adds one */
                          s->max_context - s->n_tokens - 1);
    if (g >= 0) cap = sd_imin(cap, c->workers[g].max_k);
    return cap < 0 ? 0 : cap;
}

/* Largest K the sequence may use now: the request's and the service's
 * --max-k, its drafter's max_k and context, and sd_k_cap. */
int32_t sd_max_k(const sd_coord *c, const sd_session *s) {
    if (!sd_coord_drafter_usable(c, s) || s->max_k < 0) return 0;
    int32_t cap = c->p.max_k;
    if (s->max_k > 0) cap = sd_imin(cap, s->max_k);
    cap = sd_imin(cap, c->workers[s->drafter].max_k);
    cap = sd_imin(cap, SD_MAX_K);
    cap = sd_imin(cap, sd_k_cap(c, s, sd_coord_group_ok(c, s) ? s->group : -1));
    int32_t d_ctx = c->workers[s->drafter].n_ctx;
    if (d_ctx > 0) cap = sd_imin(cap, d_ctx - s->n_tokens - 1); /* the drafter's own context */
    return cap < 0 ? 0 : cap;
}

int32_t sd_k_want(const sd_coord *c, const sd_session *s) {
    int32_t cap = sd_max_k(c, s);
    if (cap == 0) return 0;
    if (!c->p.adaptive_k) return sd_imin(c->p.default_k, cap);
    /* a sampled request's draws depend on its K schedule: sd_adapt_next_k
     * keeps that independent of load and timing (engine/spec/spec_adapt.c) */
    const bool greedy = sd_sampling_is_greedy(&s->sampling);
    if (greedy && !c->drafting_pays) return 0;
    int32_t batch = group_batch(c, s);
    return sd_adapt_next_k(&s->adapt, &c->cost, greedy, batch, cap);
}

/* Recomputes c->drafting_pays: the K each greedy sequence would choose,
 * added up for the batch, against the batch without drafts (spec_adapt.c). */
void sd_k_update_gate(sd_coord *c) {
    c->drafting_dirty = false;
    c->drafting_pays = true;
    if (!c->p.adaptive_k) return;
    /* one gate for the service, judged at the largest group's batch */
    int32_t batch = 0;
    for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++) {
        if (!sd_coord_is_group(&c->workers[g])) continue;
        int32_t b = sd_imin(sd_place_group_load(c, g), c->workers[g].max_batch);
        if (b > batch) batch = b;
    }
    if (batch == 0) batch = c->n_active;
    double extra_tokens = 0;
    int32_t extra_rows = 0;
    for (int32_t i = 0; i < c->n_sessions; i++) {
        const sd_session *s = c->sessions[i];
        if (s->state != SD_SESSION_ACTIVE || !sd_sampling_is_greedy(&s->sampling)) continue;
        int32_t cap = sd_max_k(c, s);
        if (cap == 0) continue;
        int32_t k = sd_adapt_choose_k(s->adapt.alpha, &c->cost, batch, cap);
        if (k == 0) continue;
        extra_tokens += sd_adapt_expected_tokens(s->adapt.alpha, k) - 1.0;
        extra_rows += k;
    }
    bool pays = sd_adapt_drafting_pays(&c->cost, batch, extra_tokens, extra_rows);
    if (!pays)
        SD_DEBUG("drafting paused for the batch of %d: +%.2f tokens for +%d rows and a %.0f us round trip", batch,
                 extra_tokens, extra_rows, c->cost.draft_step_us);
    c->drafting_pays = pays;
}

/* 1 when the sequence should be shadow-drafted now: it is greedy (sampled
 * requests keep a load-independent K, spec_adapt.c), its K = 0 step is being
 * verified, speculation is possible, and its interval has come. */
int32_t sd_k_shadow(const sd_coord *c, const sd_session *s) {
    if (!c->p.adaptive_k || !sd_sampling_is_greedy(&s->sampling)) return 0;
    if (!s->in_verify || s->verify_k > 0 || s->shadow_base == s->n_tokens) return 0;
    if (sd_max_k(c, s) == 0) return 0;
    int32_t batch = group_batch(c, s);
    int32_t every = sd_adapt_shadow_interval(&c->cost, batch);
    /* one phase for all: the verify steps in between send no drafts. Not
     * for a verifier's head: its shadow reads what it drafted in the step
     * before (sd_k_head_next), which must know a step ahead that the
     * shadow comes, and a head's cost is per sequence, not per step. */
    if (every > 1 && !sd_head_drafts_for(c, s) && c->verify_steps % (uint64_t)every != 0) return 0;
    return s->adapt.steps_at_zero + 1 >= every ? 1 : 0;
}

/* The drafts a verifier's head makes, in a verify step carrying k drafts
 * for s, for the step after (VerifySeq.next_k), within room. The K the
 * policy wants; at K = 0, one only where the next step reads it: the shadow
 * due while that step is verified (sd_k_shadow, with s->adapt as
 * sched_results.c will leave it after this step) or a sampled request's
 * probe. Drafting one anyway would cost every K = 0 sequence a head forward
 * each step (~8% of a target token on the CPU) for nothing. Deterministic
 * in the request's own history, so a sampled request's K schedule stays
 * independent of load. A sequence whose K rises from 0 on a shadow's
 * evidence finds no head drafts for one step. */
int32_t sd_k_head_next(const sd_coord *c, const sd_session *s, int32_t k, int32_t room) {
    int32_t want = sd_k_want(c, s), cap;
    if (want == 0 && c->p.adaptive_k && (cap = sd_max_k(c, s)) > 0) {
        sd_adapt after = s->adapt;
        int32_t batch = group_batch(c, s);
        if (!sd_sampling_is_greedy(&s->sampling)) {
            after.steps_at_zero = k > 0 ? 0 : after.steps_at_zero + 1;
            want = sd_adapt_sampled_k(&after, cap);
        } else {
            /* a shadow of this step, sent once it is, starts the count again */
            bool shadow_now = k == 0 && sd_adapt_shadow_due(&s->adapt, &c->cost, batch);
            after.steps_at_zero = k > 0 ? 0 : shadow_now ? 1 : after.steps_at_zero + 1;
            want = sd_adapt_shadow_due(&after, &c->cost, batch) ? 1 : 0;
        }
    }
    want = sd_imin(want, room);
    return want > 0 ? want : 0;
}

/* Folds a shadow draft into the acceptance EMA once both the draft and the
 * committed token at its position are known (tokens: what is committed at
 * s->n_tokens onward, n of them, about to be appended). */
void sd_k_shadow_settle(sd_coord *c, sd_session *s, const int32_t *tokens, int32_t n) {
    if (s->shadow_base < 0 || s->shadow_token == SD_SHADOW_PENDING) return;
    int32_t at = s->shadow_base;
    int32_t committed;
    if (at < s->n_tokens)
        committed = s->tokens[at];
    else if (at - s->n_tokens < n)
        committed = tokens[at - s->n_tokens];
    else
        return; /* the position is not committed yet; the shadow stays (no second one for it) */
    if (s->shadow_token >= 0) {
        sd_adapt_observe_shadow(&s->adapt, committed == s->shadow_token);
        sd_adapt_prior_update(&c->alpha_prior, &s->adapt); /* shadows are greedy only */
    }
    s->shadow_base = -1;
}
