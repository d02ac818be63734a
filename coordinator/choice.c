/* choice.c — which drafter kind drafts a request, by measured goodput.
 *
 * Drafter kinds suit different text: prompt lookup (n-gram) wins where the
 * output copies the prompt ("repeat or summarise this"), a draft model in
 * open chat, and neither is known in advance. So when drafters of several
 * kinds serve, each request (unless it pins a kind: Submit.drafter_kind)
 * tries them in turn, SD_CHOICE_TRIAL verify steps each, and then keeps the
 * kind whose net goodput on it is best:
 *
 *   goodput(k) = tokens committed per verify step with k's drafts
 *                x verify time per sequence / (verify time + k's drafting time)
 *
 * the tokens an EMA over the request's own steps, the times from the
 * cost models (the group's verify line at the request's share of the
 * batch, the drafter's measured time per draft token). The choice is
 * revisited when the request's text changes character, seen as the chosen
 * kind's tokens per step falling below SD_CHOICE_DROP of what they were
 * when it was chosen (a chat turn that starts quoting a document raises
 * another kind's, which the re-trial finds), and every SD_CHOICE_RECHECK
 * steps (doubling each time the same kind wins again, up to
 * SD_CHOICE_RECHECK_MAX). A kind that commits under SD_CHOICE_USELESS
 * tokens a step over the service's recent requests is tried on only one
 * request in SD_CHOICE_SAMPLE (which keeps its record current): on a CPU
 * under load a trial of a useless draft model cost more than the
 * choice gained (bench/results/routing-cpu.md). Moving a request between drafters changes no token: whatever
 * drafts, the verifier's rejection sampling decides (exact); it costs the
 * new drafter a prefill of the request's prefix.
 *
 * Rejected: a bandit over all requests together (the point is that the
 * best kind differs per request), and choosing from the prompt's text
 * (repetition in the prompt predicts copying badly in chat). */
#include "coord.h"

#define SD_CHOICE_TRIAL       4    /* verify steps per kind when trying */
#define SD_CHOICE_RECHECK     64   /* steps on the chosen kind before trying the others again */
#define SD_CHOICE_DROP        0.6  /* re-try when the chosen kind's tokens/step fall below this share */
#define SD_CHOICE_EMA         0.35 /* weight of a new step in a kind's record */
#define SD_CHOICE_RECHECK_MAX 1024
#define SD_CHOICE_USELESS     1.1 /* tokens per step: a kind no better than target-only */
#define SD_CHOICE_SAMPLE      8   /* one request in this many still tries a useless kind */
#define SD_CHOICE_SERVICE_EMA 0.02

/* Kinds with a live drafter, as a bit set over Specd__DrafterKind. */
static unsigned live_kinds(const sd_coord *c) {
    unsigned set = 0;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &c->workers[i];
        if (sd_coord_is_drafter(w) && w->drafter_kind > 0 && w->drafter_kind < SD_DRAFTER_KINDS)
            set |= 1u << w->drafter_kind;
    }
    return set;
}

/* The fastest live drafter of kind k's time per draft token (-1 none). */
static double kind_token_us(const sd_coord *c, Specd__DrafterKind k) {
    double best = -1.0;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &c->workers[i];
        if (sd_coord_is_drafter(w) && w->drafter_kind == k && (best < 0 || w->cost.draft_token_us < best))
            best = w->cost.draft_token_us;
    }
    return best;
}

double sd_choice_goodput(const sd_coord *c, const sd_session *s, Specd__DrafterKind k) {
    if (k <= 0 || k >= SD_DRAFTER_KINDS || s->kinds[k].steps == 0) return 0.0;
    const struct sd_kind_record *r = &s->kinds[k];
    const sd_cost_model *v = sd_coord_group_ok(c, s) ? &c->workers[s->group].cost : &c->cost;
    int32_t batch = sd_coord_group_ok(c, s) ? sd_place_group_load(c, s->group) : c->n_active;
    if (batch < 1) batch = 1;
    double verify = v->verify_fixed_us / batch + v->verify_token_us * (1.0 + r->k);
    double token_us = kind_token_us(c, k);
    double draft = (token_us > 0 ? token_us : 0.0) * r->k;
    return r->tokens * verify / (verify + draft);
}

/* Whether kind k has been useless over the service's recent requests. */
static bool useless(const sd_coord *c, int k) {
    return c->kind_steps[k] >= 4 * SD_CHOICE_TRIAL && c->kind_tokens[k] < SD_CHOICE_USELESS;
}

/* The next kind to try on s (steps < SD_CHOICE_TRIAL), or UNSPECIFIED;
 * a useless kind only on one request in SD_CHOICE_SAMPLE. */
static Specd__DrafterKind next_untried(const sd_coord *c, const sd_session *s, unsigned live) {
    for (int k = 1; k < SD_DRAFTER_KINDS; k++)
        if ((live & (1u << k)) && s->kinds[k].steps < SD_CHOICE_TRIAL &&
            (!useless(c, k) || s->id % SD_CHOICE_SAMPLE == 0))
            return (Specd__DrafterKind)k;
    return SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED;
}

static void start_trial(sd_session *s) {
    s->kind_chosen = false;
    for (int k = 0; k < SD_DRAFTER_KINDS; k++) s->kinds[k].steps = 0;
}

void sd_choice_observe(sd_coord *c, sd_session *s, int32_t k, int32_t n_commit) {
    if (s->pin_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED || !sd_coord_drafter_ok(c, s)) return;
    Specd__DrafterKind cur = c->workers[s->drafter].drafter_kind;
    if (cur <= 0 || cur >= SD_DRAFTER_KINDS) return;
    struct sd_kind_record *r = &s->kinds[cur];
    if (r->steps == 0) {
        r->tokens = n_commit;
        r->k = k;
    } else {
        r->tokens += SD_CHOICE_EMA * (n_commit - r->tokens);
        r->k += SD_CHOICE_EMA * (k - r->k);
    }
    r->steps++;
    double w = c->kind_steps[cur] == 0 ? 1.0 : SD_CHOICE_SERVICE_EMA;
    c->kind_tokens[cur] += w * (n_commit - c->kind_tokens[cur]);
    if (c->kind_steps[cur] < UINT32_MAX) c->kind_steps[cur]++;
    unsigned live = live_kinds(c);
    if ((live & (live - 1)) == 0) { /* one kind or none: nothing to choose */
        s->want_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED;
        return;
    }
    if (s->want_kind != 0 && !(live & (1u << s->want_kind))) start_trial(s);               /* its kind is gone */
    if (s->want_kind != 0 && s->want_kind != cur && (live & (1u << s->want_kind))) return; /* a move is due */
    if (s->kind_chosen) {
        s->steps_since_choice++;
        if (s->recheck_steps < SD_CHOICE_RECHECK) s->recheck_steps = SD_CHOICE_RECHECK;
        if (cur == s->want_kind && s->steps_since_choice >= 2 * SD_CHOICE_TRIAL &&
            (r->tokens < SD_CHOICE_DROP * s->chosen_tokens || s->steps_since_choice >= s->recheck_steps)) {
            SD_DEBUG("request %llu: %s drafts now give %.2f tokens a step (%.2f when chosen): trying the kinds again",
                     (unsigned long long)s->id,
                     protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, (int)cur)->name, r->tokens,
                     s->chosen_tokens);
            start_trial(s);
            s->kinds[cur].steps = SD_CHOICE_TRIAL; /* just measured: try the others first */
        } else {
            return;
        }
    }
    if (r->steps < SD_CHOICE_TRIAL && (s->want_kind == cur || s->want_kind == 0)) {
        s->want_kind = cur; /* finish this kind's trial */
        return;
    }
    Specd__DrafterKind next = next_untried(c, s, live);
    if (next != SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED) {
        s->want_kind = next;
        return;
    }
    /* every live kind tried: keep the best */
    Specd__DrafterKind best = cur;
    double best_g = -1.0;
    for (int kd = 1; kd < SD_DRAFTER_KINDS; kd++) {
        if (!(live & (1u << kd))) continue;
        double g = sd_choice_goodput(c, s, (Specd__DrafterKind)kd);
        if (g > best_g) best = (Specd__DrafterKind)kd, best_g = g;
    }
    if (best == s->last_choice && s->recheck_steps < SD_CHOICE_RECHECK_MAX)
        s->recheck_steps *= 2; /* the same kind again: look less often */
    s->last_choice = best;
    s->want_kind = best;
    s->kind_chosen = true;
    s->steps_since_choice = 0;
    s->chosen_tokens = s->kinds[best].tokens;
    SD_DEBUG("request %llu: drafted by %s (%.2f tokens a step net)", (unsigned long long)s->id,
             protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, (int)best)->name, best_g);
}
