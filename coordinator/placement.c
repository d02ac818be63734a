/* placement.c — which verifier group and which drafter serve a request.
 *
 * Several verifier groups (data-parallel replicas, each a TP group with its
 * own leader) and several drafters serve at once. Every active request has
 * one group and at most one drafter (sd_session.group, .drafter: worker
 * slots). The scheduler sends each group the requests placed on it and
 * each drafter those assigned to it, so different groups verify, and
 * different drafters draft, in parallel.
 *
 * Groups. A request is placed when it is admitted, on the group where it
 * would wait least: the group's verify step as it would be with the
 * request added (its own measured cost line, sd_coord_worker.cost, seeded
 * from the Hello's warm-up step times and then from every verify reply,
 * over the tokens its requests have in flight: prefill still to do plus one
 * row per running request), times the steps needed when the batch exceeds
 * the group's max_batch, and four times that for a group with no free KV
 * block. Groups of different speed thus get requests in proportion to
 * their speed; a round robin would leave the slow group's requests
 * behind. The request then stays on that group while the group lives (its
 * KV cache is warm there: moving it costs a whole prefill). A group that
 * dies or drains (it reports itself UNAVAILABLE) loses its requests: they
 * keep their committed tokens, are placed again on the others at the next
 * pump and re-prefilled from those tokens (sd_sched_on_worker_lost).
 * Cached prefixes. A group's verifier keeps the KV of prompts it served
 * (its prefix cache), so a request whose prompt starts with one (a shared
 * system prompt, a conversation's earlier turns) costs that group only the
 * rest: a request not yet cached anywhere counts, per group, the tokens
 * the group likely lacks (prefix_route.c's record of what was sent where)
 * in the same cost line. A cache hit is thus worth the prefill it saves,
 * weighed against the group's load in the same units. The cost line
 * prices the new request's wait only, not the slowdown of the requests
 * already there, so the credit is given only to a group holding no more
 * than an even share of the active requests (rounded up): a popular prefix
 * (one system prompt for everyone) cannot pile every request onto the
 * group that cached it first; the next goes elsewhere by load and caches
 * the prefix there too.
 * Rejected: moving running requests to a newly registered group; its
 * prefill would cost more than the step it saves, except for long
 * requests, and new requests fill it anyway.
 *
 * Drafters. A request gets the drafter with the least load: requests
 * assigned times the drafter's measured time per draft token. A request
 * may pin a drafter kind (Submit.drafter_kind): then only drafters of that
 * kind serve it, and it runs with K = 0 while none is alive. A drafter
 * that registers takes a share of the running requests at once (moved
 * between draft steps: Release on the old drafter, a full prefix on the
 * new); one that dies or drains hands its requests to the others at the
 * next pump, or to K = 0 when none is left. Drafts are proposals only:
 * whichever drafter made them, the verifier's rejection sampling decides
 * (exact), so moving a request between drafters never changes its text.
 *
 * The loads are tallied from the sessions on each call (at most
 * SD_COORD_MAX_WORKERS x sessions), not kept as counters that every path
 * would have to update. */
#include "coord.h"

#include <float.h>
#include <string.h>

typedef struct load {
    int32_t n[SD_COORD_MAX_WORKERS];      /* active requests on the worker */
    int64_t tokens[SD_COORD_MAX_WORKERS]; /* verify rows in flight (groups) */
} load;

static void tally(sd_coord *c, load *l) {
    memset(l, 0, sizeof *l);
    for (int32_t i = 0; i < c->n_sessions; i++) {
        const sd_session *s = c->sessions[i];
        if (s->state != SD_SESSION_ACTIVE) continue;
        if (sd_coord_group_ok(c, s)) {
            l->n[s->group]++;
            int32_t missing = s->n_tokens - s->v_cached;
            if (s->v_cached == 0) /* not prefilled yet: its group's cache may hold a prefix */
                missing -= sd_route_cached(c->route, s->group, c->workers[s->group].worker_id, s->tokens, s->n_tokens);
            l->tokens[s->group] += missing > 1 ? missing : 1;
        }
        if (sd_coord_drafter_ok(c, s)) l->n[s->drafter]++;
    }
}

/* Expected wait of a request added to group g with `missing` tokens to
 * verify (see the file comment). */
static double group_score(const sd_coord *c, int32_t g, const load *l, int32_t missing) {
    const sd_coord_worker *w = &c->workers[g];
    int64_t tokens = l->tokens[g] + (missing > 1 ? missing : 1);
    if (tokens > INT32_MAX) tokens = INT32_MAX;
    double step = sd_cost_verify_us(&w->cost, (int32_t)tokens);
    int32_t batch = w->max_batch > 0 ? w->max_batch : 1;
    int32_t steps = (l->n[g] + 1 + batch - 1) / batch;
    double score = step * steps;
    if (w->kv_blocks_total > 0 && w->kv_blocks_free == 0) score *= 4.0;
    return score;
}

/* The group where s waits least; *missing gets the tokens it lacks there. */
static int32_t best_group(sd_coord *c, const load *l, const sd_session *s, int32_t *missing) {
    int32_t best = -1, n_groups = 0, n_active = 0;
    for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++)
        if (sd_coord_is_group(&c->workers[g])) n_groups++, n_active += l->n[g];
    const int32_t even_share = n_groups > 0 ? (n_active + n_groups - 1) / n_groups : 0;
    double best_score = DBL_MAX;
    for (int32_t g = 0; g < SD_COORD_MAX_WORKERS; g++) {
        if (!sd_coord_is_group(&c->workers[g])) continue;
        int32_t m = s->n_tokens - s->v_cached;
        if (s->v_cached == 0 && l->n[g] <= even_share)
            m -= sd_route_cached(c->route, g, c->workers[g].worker_id, s->tokens, s->n_tokens);
        double sc = group_score(c, g, l, m);
        if (sc < best_score) best = g, best_score = sc, *missing = m;
    }
    return best;
}

/* Time a drafter spends per draft token (its prior until measured). */
static double drafter_unit_us(const sd_coord_worker *w) {
    return w->cost.draft_token_us > 1.0 ? w->cost.draft_token_us : 1.0;
}

static bool drafter_fits(const sd_coord_worker *w, const sd_session *s) {
    return sd_coord_is_drafter(w) && (!w->head_relay || w->head_group == s->group) &&
           (s->pin_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED || s->pin_kind == w->drafter_kind);
}

/* The kind s should be drafted by (choice.c) when a drafter of it is alive. */
static bool wanted_kind_live(const sd_coord *c, const sd_session *s) {
    if (s->want_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED) return false;
    for (int32_t d = 0; d < SD_COORD_MAX_WORKERS; d++)
        if (drafter_fits(&c->workers[d], s) && c->workers[d].drafter_kind == s->want_kind) return true;
    return false;
}

static int32_t best_drafter(const sd_coord *c, const load *l, const sd_session *s) {
    int32_t best = -1;
    double best_score = DBL_MAX;
    bool by_kind = wanted_kind_live(c, s);
    for (int32_t d = 0; d < SD_COORD_MAX_WORKERS; d++) {
        const sd_coord_worker *w = &c->workers[d];
        if (!drafter_fits(w, s) || (by_kind && w->drafter_kind != s->want_kind)) continue;
        double sc = (l->n[d] + 1) * drafter_unit_us(w);
        if (sc < best_score) best = d, best_score = sc;
    }
    return best;
}

static void move_drafter(sd_coord *c, sd_session *s, int32_t to, uint64_t now_us);

void sd_place_pending(sd_coord *c, uint64_t now_us) {
    if (!c->route) c->route = sd_route_create(); /* NULL (out of memory): placement by load alone */
    load l;
    bool tallied = false;
    for (int32_t i = 0; i < c->n_sessions; i++) {
        sd_session *s = c->sessions[i];
        if (s->state != SD_SESSION_ACTIVE) continue;
        bool need_group = !sd_coord_group_ok(c, s), need_drafter = !sd_coord_drafter_ok(c, s);
        if (!need_drafter && !s->in_draft && wanted_kind_live(c, s) &&
            c->workers[s->drafter].drafter_kind != s->want_kind) {
            /* its kind was chosen (choice.c): move it between draft steps */
            if (!tallied) tally(c, &l), tallied = true;
            int32_t d = best_drafter(c, &l, s);
            if (d >= 0) {
                s->kind_switches++;
                l.n[s->drafter]--;
                l.n[d]++;
                move_drafter(c, s, d, now_us);
            }
        }
        if (!need_group && !need_drafter) continue;
        if (!tallied) tally(c, &l), tallied = true;
        if (need_group) {
            int32_t missing = s->n_tokens;
            int32_t g = best_group(c, &l, s, &missing);
            if (g >= 0 && !s->in_verify) {
                s->group = g;
                s->v_cached = 0;
                s->route_hint = s->prompt_lp_next < s->n_prompt /* chunks that score the prompt adopt nothing */
                                    ? 0
                                    : sd_route_cached(c->route, g, c->workers[g].worker_id, s->tokens, s->n_tokens);
                s->v_holds = false;
                c->workers[g].served_requests++;
                l.n[g]++;
                l.tokens[g] += missing > 1 ? missing : 1;
                c->drafting_dirty = true;
            }
        }
        if (need_drafter && !s->in_draft) {
            int32_t d = best_drafter(c, &l, s);
            s->drafter = d;
            s->d_cached = 0;
            s->d_holds = false;
            if (d >= 0) {
                c->workers[d].served_requests++;
                l.n[d]++;
            }
        }
    }
}

/* Moves s off its (live) drafter between steps: the old one releases it. */
static void move_drafter(sd_coord *c, sd_session *s, int32_t to, uint64_t now_us) {
    if (s->d_holds && sd_coord_drafter_ok(c, s)) sd_outbox_release(c, s->drafter, s->id, now_us);
    s->drafter = to;
    s->d_cached = 0;
    s->d_holds = false;
    if (s->draft_base != s->n_tokens || s->k == 0) s->draft_base = -1; /* drafts in hand stay valid */
    c->workers[to].served_requests++;
}

void sd_place_share_drafter(sd_coord *c, int32_t d, uint64_t now_us) {
    if (!sd_coord_is_drafter(&c->workers[d])) return;
    load l;
    tally(c, &l);
    for (int32_t moves = 0; moves < c->n_sessions; moves++) {
        /* the most loaded other drafter whose requests d may take */
        double new_score = (l.n[d] + 1) * drafter_unit_us(&c->workers[d]);
        sd_session *pick = NULL;
        double pick_score = new_score;
        for (int32_t i = 0; i < c->n_sessions; i++) {
            sd_session *s = c->sessions[i];
            if (s->state != SD_SESSION_ACTIVE || s->in_draft || s->drafter == d || !sd_coord_drafter_ok(c, s) ||
                !drafter_fits(&c->workers[d], s) || (s->want_kind && s->want_kind != c->workers[d].drafter_kind))
                continue;
            double sc = l.n[s->drafter] * drafter_unit_us(&c->workers[s->drafter]);
            if (sc > pick_score) pick = s, pick_score = sc;
        }
        if (!pick) break;
        l.n[pick->drafter]--;
        l.n[d]++;
        move_drafter(c, pick, d, now_us);
    }
}

int32_t sd_place_count(const sd_coord *c, Specd__Role role) {
    int32_t n = 0;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++)
        n += c->workers[i].used && c->workers[i].alive && c->workers[i].role == role;
    return n;
}

int32_t sd_place_group_load(const sd_coord *c, int32_t g) {
    int32_t n = 0;
    for (int32_t i = 0; i < c->n_sessions; i++) {
        const sd_session *s = c->sessions[i];
        n += s->state == SD_SESSION_ACTIVE && (s->group == g || s->drafter == g);
    }
    return n;
}
