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
 *                x V(0) / (V(drafts) + k's drafting time + k's overhead)
 *
 * V(n) the verify time per sequence of a step with n drafts: tokens per
 * unit of time, in units of a step without drafts (so 1 is target-only).
 * Rejected: V(drafts) in the numerator, which priced each kind's step in
 * its own units: a kind drafting 1 token a step looked no worse for its
 * cheap short step, one drafting 4 no better for its long one, and on the
 * demo model the choice kept a draft model that committed 4.2 tokens in
 * 58 ms over n-gram lookup committing 1.3 in 14 ms.
 *
 * the tokens an EMA over the request's own steps, the times from the
 * cost models (the group's verify line at the request's share of the
 * batch, the drafter's measured time per draft token), and the overhead
 * what k's steps measured beyond those on the wall clock. The choice is
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
 * The n-gram kind is also priced without drafting: while another kind
 * drafts a request, a shadow lookup (the same n-gram drafter as
 * engine/spec/drafter.c, private to this file, no shared cache) proposes
 * what an n-gram drafter would have proposed at each step, and the step's
 * committed tokens say how many of those the verifier would have taken
 * (the matching prefix, plus the token the step commits after it; exactly
 * greedy verification, and for a sampled request one sample of the
 * acceptance). That is the n-gram kind's record on the request, so it is
 * never tried at a verify step's expense, and a request drafted by a model
 * that starts quoting its prompt moves to n-gram drafting as soon as the
 * shadow's goodput passes the model's by SD_CHOICE_SWITCH, without waiting
 * for the model's own acceptance to drop (a good draft model keeps
 * drafting a quotation well, only at a price n-gram lookup does not pay).
 * That verdict takes the mean of n-gram's tokens a step over its last
 * SD_CHOICE_WINDOW steps (shadowed or its own), not the EMA, and so does
 * the drop rule while n-gram drafts: n-gram hits come in bursts (1, 1, 5,
 * 1 tokens a step), and judging one burst made requests flap between the
 * kinds.
 *
 * A kind's trial costs the request a move (the kind's drafter prefills its
 * prefix) and steps at that kind's price. So a kind is tried only where it
 * may pay: its net goodput on the requests that tried it (an EMA over their
 * decisions) must beat what the request already gets from the kinds it
 * has seen (n-gram's shadow record included) by SD_CHOICE_PROMISE;
 * otherwise one request in
 * SD_CHOICE_SAMPLE of those asked (counted here: by request id, pinned
 * requests in between made it one in 4 or none) tries it, which keeps that
 * record current; its decision weighs as the SD_CHOICE_SAMPLE requests it
 * stands for. One in 16, not 8: with both models on two threads each
 * sample of the draft model cost its request 8-43% (the move, then steps
 * at the model's price; most on a summary: a long prefix to move, a short
 * answer), the rounds it landed on were most of what kept the choice
 * 2.7% under fixed n-gram, and halving them gave 0.994x (the old rule
 * 0.991x beside it: not told apart; routing-cpu.md). Only a request that
 * passes the can-pay rule below is asked, so the sample has room to repay
 * the move by that rule's measure (tokens left at the kind's ceiling); a
 * request that will end early on EOS cannot be told apart. And a due
 * sample is taken only by a request whose move is at most
 * SD_CHOICE_MOVE_SHARE of its remaining time (its tokens left at its
 * current time a token), else put off to the next such request: the
 * samples that landed on a summary (a prefix twice a chat prompt's to
 * move, a short answer) cost their rounds 0.57-0.68 of fixed n-gram, on
 * chat less. After SD_CHOICE_SAMPLE requests that passed it over the next
 * one takes it whatever its move, so a service of long prompts still
 * samples (a kind's record must recover after outside load).
 * On the demo model with both models on two threads, a
 * 4-bit draft of the target costs 0.74 of a target step a token and ties
 * with n-gram lookup on chat: trying it on every request made the choice
 * 0.78x of fixed n-gram (bench/results/routing-cpu.md). And a kind that
 * cannot pay on the request is not tried at all, not even to sample it:
 * with every draft accepted, at its measured drafting cost, over all the
 * tokens the request may still generate, it would save less time than
 * the move costs (the drafter's measured time to take in a prefix token,
 * times the prefix; what a summary that n-gram already copies would pay);
 * on a cold service the kind's first trial (admitted at a guessed price)
 * ends as soon as its measured cost shows it cannot pay.
 * The trials are judged without the step that carried the prompt (no
 * drafts yet: its 1 token sank the first kind's record), and a kind other
 * than the one drafting the request must beat it by SD_CHOICE_SWITCH to
 * take it over, as the shadow must (4 steps are a small sample, and a
 * wrong move to n-gram costs a move back: the model's prefill again).
 *
 * Rejected: a bandit over all requests together (the point is that the
 * best kind differs per request), and choosing from the prompt's text
 * (repetition in the prompt predicts copying badly in chat). */
#include "coord.h"
#include "specd/drafter.h"

#include <stdlib.h>

#define SD_CHOICE_TRIAL        4    /* verify steps per kind when trying */
#define SD_CHOICE_RECHECK      64   /* steps on the chosen kind before trying the others again */
#define SD_CHOICE_DROP         0.6  /* re-try when the chosen kind's tokens/step fall below this share */
#define SD_CHOICE_EMA          0.35 /* weight of a new step in a kind's record */
#define SD_CHOICE_RECHECK_MAX  1024
#define SD_CHOICE_USELESS      1.1 /* tokens per step: a kind no better than target-only */
#define SD_CHOICE_SAMPLE       16  /* one request in this many still tries a useless kind */
#define SD_CHOICE_SERVICE_EMA  0.02
#define SD_CHOICE_SWITCH       1.15 /* another kind's goodput over the drafting kind's that moves a request */
#define SD_CHOICE_WINDOW       8    /* shadow steps the move is judged on (sd_session.shadow_ring) */
#define SD_CHOICE_KIND_EMA     0.2  /* weight of one request's decision in a kind's service-wide goodput */
#define SD_CHOICE_OVERHEAD_EMA 0.1  /* weight of one step in a kind's measured overhead */
#define SD_CHOICE_PROMISE      1.3  /* a kind's record over the request's best that makes it worth a trial */
#define SD_CHOICE_SAMPLED_EMA  0.97 /* a sampling request's weight: 1 - (1 - SD_CHOICE_KIND_EMA)^SD_CHOICE_SAMPLE */
/* the most of a request's remaining time (at what it gets now) that its
 * move may take for it to take a due sample. Measured (coordinator DEBUG
 * log, both models on two threads, bench/prompts/mixed.txt): 0.064-0.106
 * on chat, 0.150-0.175 on the summaries asked (a prefix twice as long, on
 * the same 64 tokens of room); between them (routing-cpu.md) */
#define SD_CHOICE_MOVE_SHARE   0.125

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

/* The requests on s's verifier group (at least 1): the batch its steps share. */
static int32_t batch_of(const sd_coord *c, const sd_session *s) {
    int32_t batch = sd_coord_group_ok(c, s) ? sd_place_group_load(c, s->group) : c->n_active;
    return batch < 1 ? 1 : batch;
}

/* s's verifier cost line and its time per sequence of a step without
 * drafts (its share of the step's fixed cost at `batch`, batch_of(c, s):
 * a count over every session, so callers take it once). */
static const sd_cost_model *verify_cost(const sd_coord *c, const sd_session *s, int32_t batch, double *v0) {
    const sd_cost_model *v = sd_coord_group_ok(c, s) ? &c->workers[s->group].cost : &c->cost;
    *v0 = v->verify_fixed_us / batch + v->verify_token_us;
    return v;
}

/* What a step of s with k_draft drafts of kind k costs by the cost models
 * alone (its verify share and the drafting), us; *v0 as verify_cost's. */
static double modelled_step_us(const sd_coord *c, const sd_session *s, Specd__DrafterKind k, double k_draft,
                               int32_t batch, double *v0) {
    const sd_cost_model *v = verify_cost(c, s, batch, v0);
    double token_us = kind_token_us(c, k);
    return *v0 + v->verify_token_us * k_draft + (token_us > 0 ? token_us : 0.0) * k_draft;
}

/* Net goodput of kind k on s at `tokens` committed per step with k_draft
 * drafts: the step's modelled time plus the kind's measured overhead (a
 * step's, shared by the batch). */
static double goodput_at(const sd_coord *c, const sd_session *s, Specd__DrafterKind k, double tokens, double k_draft) {
    int32_t batch = batch_of(c, s);
    double v0;
    double step = modelled_step_us(c, s, k, k_draft, batch, &v0) + c->kind_overhead_us[k] / batch;
    return step > 0 ? tokens * v0 / step : tokens;
}

/* Measures the wall time of s's step that just committed (drafted by k
 * drafts of its drafter) against what the cost models make of it: the
 * excess feeds its kind's overhead. Only a step that verified s alone
 * (a batch's wall time is no one kind's), whose drafts and verify took in
 * no prefix (a prompt, a move: priced by refill_token_us), with the same
 * drafter as the step before. On the demo model (bench/results/routing-cpu.md) the
 * excess was 1-6 ms on a draft-model step of 45-60 ms (its round trip, its
 * threads waking), about none on an n-gram step: left out, the model's
 * goodput read 2-10% high against n-gram lookup's. */
static void observe_wall(sd_coord *c, sd_session *s, int32_t k, bool refill, uint64_t now_us) {
    uint64_t from = s->wall_from_us;
    int32_t was = s->wall_drafter;
    bool draft_refill = s->draft_refill;
    s->wall_from_us = now_us;
    s->wall_drafter = s->drafter;
    s->draft_refill = false;
    if (refill || draft_refill || from == 0 || now_us <= from || was != s->drafter || !sd_coord_drafter_ok(c, s) ||
        batch_of(c, s) != 1)
        return;
    Specd__DrafterKind kind = c->workers[s->drafter].drafter_kind;
    if (kind <= 0 || kind >= SD_DRAFTER_KINDS) return;
    double v0, modelled = modelled_step_us(c, s, kind, k, 1, &v0);
    double over = (double)(now_us - from) - modelled;
    if (over < 0) over = 0;
    double w = c->kind_overhead_steps[kind] == 0 ? 1.0 : SD_CHOICE_OVERHEAD_EMA;
    c->kind_overhead_us[kind] += w * (over - c->kind_overhead_us[kind]);
    if (c->kind_overhead_steps[kind] < UINT32_MAX) c->kind_overhead_steps[kind]++;
    SD_DEBUG("request %llu: a %s step of %d drafts took %.0f us, %.0f modelled", (unsigned long long)s->id,
             protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, (int)kind)->name, k,
             (double)(now_us - from), modelled);
}

double sd_choice_goodput(const sd_coord *c, const sd_session *s, Specd__DrafterKind k) {
    if (k <= 0 || k >= SD_DRAFTER_KINDS || s->kinds[k].steps == 0) return 0.0;
    return goodput_at(c, s, k, s->kinds[k].tokens, s->kinds[k].k);
}

/* A verify step's tokens committed and drafts in a kind's record on a request. */
static void record(struct sd_kind_record *r, int32_t tokens, int32_t k) {
    if (r->steps == 0) {
        r->tokens = tokens;
        r->k = k;
    } else {
        r->tokens += SD_CHOICE_EMA * (tokens - r->tokens);
        r->k += SD_CHOICE_EMA * (k - r->k);
    }
    r->steps++;
}

/* ---- the shadow n-gram lookup ---- */

/* s's slot in the shadow drafter, created (and the slot taken) on first
 * use; -1 when it cannot be had (no memory, every slot taken). */
static int32_t shadow_slot(sd_coord *c, sd_session *s) {
    if (s->shadow_slot >= 0) return s->shadow_slot;
    if (!c->shadow) {
        sd_drafter_params dp = sd_drafter_default_params();
        dp.max_seqs = c->p.max_active > 0 ? c->p.max_active : 1;
        dp.max_ctx = c->n_ctx;
        dp.top_n = 1;
        dp.ngram_cache_entries = -1; /* none: the request's own text only (a lower bound) */
        c->shadow_used = calloc((size_t)dp.max_seqs, 1);
        if (!c->shadow_used || sd_drafter_ngram_create(&dp, &c->shadow) != SD_OK) {
            sd_choice_free(c);
            return -1;
        }
        c->n_shadow_slots = dp.max_seqs;
    }
    for (int32_t i = 0; i < c->n_shadow_slots; i++) {
        if (!c->shadow_used[i]) {
            c->shadow_used[i] = 1;
            return s->shadow_slot = i;
        }
    }
    return -1;
}

void sd_choice_forget(sd_coord *c, sd_session *s) {
    if (s->shadow_slot < 0 || !c->shadow || s->shadow_slot >= c->n_shadow_slots) return;
    sd_drafter_release(c->shadow, s->shadow_slot);
    c->shadow_used[s->shadow_slot] = 0;
    s->shadow_slot = -1;
}

void sd_choice_free(sd_coord *c) {
    sd_drafter_free(&c->shadow);
    free(c->shadow_used);
    c->shadow_used = NULL;
    c->n_shadow_slots = 0;
}

/* What n-gram drafting would have given the step that is about to commit
 * commit[0..n_commit) after s's context: proposes up to k tokens from the
 * context and records the tokens it would have committed (the prefix of the
 * proposal that matches, plus one; at most n_commit, what the step shows)
 * in s's n-gram record. */
static void shadow_ngram(sd_coord *c, sd_session *s, int32_t k, const int32_t *commit, int32_t n_commit) {
    int32_t slot = shadow_slot(c, s);
    if (slot < 0 || n_commit < 1 || s->n_tokens < 1) return;
    int32_t prop[SD_MAX_K], nd = 0;
    sd_spec_q q[SD_MAX_K];
    /* s->sampling was converted and checked once, by sd_net_read_client */
    if (sd_drafter_propose_given(c->shadow, slot, s->tokens, s->n_tokens, sd_imin(k, SD_MAX_K), &s->sampling, prop, q,
                                 &nd) != SD_OK)
        return;
    int32_t match = 0;
    while (match < nd && match < n_commit && prop[match] == commit[match]) match++;
    int32_t tokens = match < n_commit ? match + 1 : n_commit;
    record(&s->kinds[SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM], tokens, nd);
    s->shadow_ring[s->shadow_steps++ % SD_CHOICE_WINDOW] = (uint8_t)tokens;
}

/* The shadow's mean tokens a step over its last SD_CHOICE_WINDOW steps
 * (-1 before it has that many). */
static double shadow_mean(const sd_session *s) {
    if (s->shadow_steps < SD_CHOICE_WINDOW) return -1.0;
    double sum = 0;
    for (int i = 0; i < SD_CHOICE_WINDOW; i++) sum += s->shadow_ring[i];
    return sum / SD_CHOICE_WINDOW;
}

/* What moving s to a drafter of kind k costs, microseconds: the cheapest
 * live one's measured time to take in s's prefix (0 until measured). */
static double move_us(const sd_coord *c, const sd_session *s, int k) {
    double best = -1.0;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &c->workers[i];
        if (sd_coord_is_drafter(w) && (int)w->drafter_kind == k && (best < 0 || w->refill_token_us < best))
            best = w->refill_token_us;
    }
    return best > 0 ? best * s->n_tokens : 0.0;
}

/* Kind k's net goodput on s with every draft accepted, at the K that
 * suits its measured drafting cost best. */
static double ceiling_of(const sd_coord *c, const sd_session *s, int k) {
    int32_t k_max = sd_max_k(c, s);
    if (k_max < 1) k_max = 1;
    if (k_max > SD_MAX_K) k_max = SD_MAX_K;
    double ceiling = 0.0;
    for (int32_t kd = 1; kd <= k_max; kd++) {
        double g = goodput_at(c, s, (Specd__DrafterKind)k, kd + 1, kd);
        if (g > ceiling) ceiling = g;
    }
    return ceiling;
}

/* Whether kind k could pay on s at all: at its ceiling, over every token s
 * may still generate, it would save more time than moving s to it costs,
 * against the best s already gets (best_g, net goodput; 0: nothing yet).
 * A trial of a kind that cannot pay is pure cost: its move, then steps at
 * its price, for a request that keeps what it had. */
static bool can_pay(const sd_coord *c, const sd_session *s, int k, double best_g) {
    if (best_g <= 0) return true;
    double ceiling = ceiling_of(c, s, k);
    if (ceiling <= best_g) return false;
    double v0;
    (void)verify_cost(c, s, batch_of(c, s), &v0);
    int32_t left = s->max_tokens - sd_session_generated(s);
    if (left < 1) return false;
    double saved = left * v0 * (1.0 / best_g - 1.0 / ceiling); /* time for `left` tokens: left * v0 / goodput */
    return saved > move_us(c, s, k);
}

/* Whether kind k's drafting cost has been measured (its first trial
 * measures it: until then its ceiling is a guess). */
static bool cost_known(const sd_coord *c, int k) {
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &c->workers[i];
        if (sd_coord_is_drafter(w) && (int)w->drafter_kind == k && w->cost.n_draft_obs > 0) return true;
    }
    return false;
}

/* Whether kind k has been useless over the service's recent requests. */
static bool useless(const sd_coord *c, int k) {
    return c->kind_steps[k] >= 4 * SD_CHOICE_TRIAL && c->kind_tokens[k] < SD_CHOICE_USELESS;
}

/* The best net goodput s has shown so far with any kind (0: none yet). */
static double best_known(const sd_coord *c, const sd_session *s) {
    double best = 0.0;
    for (int k = 1; k < SD_DRAFTER_KINDS; k++) {
        double g = sd_choice_goodput(c, s, (Specd__DrafterKind)k);
        if (g > best) best = g;
    }
    return best;
}

/* Whether kind k, on the requests that tried it, gave less than
 * SD_CHOICE_PROMISE times what s already gets: its trial would cost s
 * its move (the kind's drafter prefills the prefix) and steps at its price
 * for too little expected gain. The margin is measured: with both models
 * on two threads the draft model's record on chat was 1.0-1.3x n-gram's
 * on the request, and its trials there lost 8-13% of the request's time
 * where the request moved back (half of them: n-gram's hits come in
 * bursts) and changed it by -4% to +12% where it stayed, so the choice was 0.95x fixed
 * n-gram; with the verifier on one thread its record is 1.3-1.75x and
 * its trials pay (bench/results/routing-cpu.md). */
static bool unpromising(const sd_coord *c, const sd_session *s, int k) {
    return c->kind_decisions[k] >= SD_CHOICE_TRIAL && c->kind_goodput[k] < SD_CHOICE_PROMISE * best_known(c, s);
}

/* What moving s to kind k would cost as a share of the time s still needs
 * at what it gets now (best_g, net goodput, > 0): the time of its tokens
 * left is left x V(0) / best_g. */
static double move_share(const sd_coord *c, const sd_session *s, int k, double best_g) {
    double v0;
    (void)verify_cost(c, s, batch_of(c, s), &v0);
    int32_t left = s->max_tokens - sd_session_generated(s);
    double rest_us = left > 0 && best_g > 0 ? left * v0 / best_g : 0.0;
    double move = move_us(c, s, k);
    return rest_us > 0 ? move / rest_us : move > 0 ? 1e9 : 0.0;
}

/* Whether s is one of the requests that try kinds that look unpromising,
 * kind k the first it is asked about (decided once per request). Every
 * SD_CHOICE_SAMPLE-th request asked makes a sample due; the first request
 * from then on whose move to k is at most SD_CHOICE_MOVE_SHARE of its
 * remaining time takes it, or, after SD_CHOICE_SAMPLE requests that
 * passed it over, the next one whatever its move costs (a service of
 * long prompts keeps sampling, one in 2 x SD_CHOICE_SAMPLE at the least). */
static bool explores(sd_coord *c, sd_session *s, int k, double best_g) {
    if (s->explore != 0) return s->explore > 0;
    if (c->explore_asked++ % SD_CHOICE_SAMPLE == 0 && c->sample_due == 0) c->sample_due = 1;
    double share = move_share(c, s, k, best_g);
    bool take = c->sample_due > 0 && (share <= SD_CHOICE_MOVE_SHARE || c->sample_due > SD_CHOICE_SAMPLE);
    SD_DEBUG("request %llu: asked to sample %s (%s): its move %.0f us, %.3f of its remaining time",
             (unsigned long long)s->id, protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, k)->name,
             take                ? "samples"
             : c->sample_due > 0 ? "a sample is due, put off"
                                 : "no sample due",
             move_us(c, s, k), share);
    if (c->sample_due > 0) c->sample_due = take ? 0 : c->sample_due + 1;
    s->explore = take ? 1 : -1;
    return take;
}

/* The next kind to try on s (steps < SD_CHOICE_TRIAL), or UNSPECIFIED:
 * never one that cannot pay on s; a useless or unpromising kind only on
 * one request in SD_CHOICE_SAMPLE (marked in s->sampled_kinds). */
static Specd__DrafterKind next_untried(sd_coord *c, sd_session *s, unsigned live) {
    double best_g = best_known(c, s);
    for (int k = 1; k < SD_DRAFTER_KINDS; k++) {
        if (!(live & (1u << k)) || s->kinds[k].steps >= SD_CHOICE_TRIAL || !can_pay(c, s, k, best_g)) continue;
        if (!useless(c, k) && !unpromising(c, s, k)) return (Specd__DrafterKind)k;
        if (explores(c, s, k, best_g)) {
            s->sampled_kinds |= 1u << k;
            return (Specd__DrafterKind)k;
        }
    }
    return SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED;
}

static void start_trial(sd_session *s) {
    s->kind_chosen = false;
    for (int k = 0; k < SD_DRAFTER_KINDS; k++) s->kinds[k].steps = 0;
}

/* Chooses kind best for s now (after trials, or the shadow's verdict). */
static void choose(sd_session *s, Specd__DrafterKind best, double best_g) {
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

void sd_choice_observe(sd_coord *c, sd_session *s, int32_t k, bool refill, const int32_t *commit, int32_t n_commit,
                       uint64_t now_us) {
    observe_wall(c, s, k, refill, now_us); /* pinned requests' steps price their kind too */
    if (s->pin_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED || !sd_coord_drafter_ok(c, s)) return;
    /* a refill without drafts (the prompt's step: its drafts were not
     * there yet) says nothing of the drafter; counted, its 1 token sank
     * the first kind's 4-step trial record by a quarter */
    if (refill && k == 0) return;
    Specd__DrafterKind cur = c->workers[s->drafter].drafter_kind;
    if (cur <= 0 || cur >= SD_DRAFTER_KINDS) return;
    struct sd_kind_record *r = &s->kinds[cur];
    record(r, n_commit, k);
    /* the window of n-gram steps, real ones too, also those it proposed
     * nothing for (1 token, as the shadow counts them): left out, a
     * request whose lookup found nothing for 30 steps was judged on the
     * burst before them */
    if (cur == SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM)
        s->shadow_ring[s->shadow_steps++ % SD_CHOICE_WINDOW] = (uint8_t)sd_imin(n_commit, 255);
    double w = c->kind_steps[cur] == 0 ? 1.0 : SD_CHOICE_SERVICE_EMA;
    c->kind_tokens[cur] += w * (n_commit - c->kind_tokens[cur]);
    if (c->kind_steps[cur] < UINT32_MAX) c->kind_steps[cur]++;
    unsigned live = live_kinds(c);
    if ((live & (live - 1)) == 0) { /* one kind or none: nothing to choose */
        s->want_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED;
        return;
    }
    const Specd__DrafterKind ngram = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    if (cur != ngram && k > 0 && (live & (1u << ngram))) shadow_ngram(c, s, k, commit, n_commit);
    if (s->want_kind != 0 && !(live & (1u << s->want_kind))) start_trial(s);               /* its kind is gone */
    if (s->want_kind != 0 && s->want_kind != cur && (live & (1u << s->want_kind))) return; /* a move is due */
    double mean = shadow_mean(s);
    if (s->kind_chosen && cur != ngram && cur == s->want_kind && mean > 0 && (live & (1u << ngram))) {
        double g_cur = sd_choice_goodput(c, s, cur), g_ng = goodput_at(c, s, ngram, mean, s->kinds[ngram].k);
        if (g_ng > SD_CHOICE_SWITCH * g_cur) {
            SD_DEBUG("request %llu: the shadow n-gram lookup would commit %.2f tokens a step net, its drafter %.2f",
                     (unsigned long long)s->id, g_ng, g_cur);
            choose(s, ngram, g_ng);
            s->chosen_tokens = mean; /* what the drop rule compares with: not one burst */
            s->shadow_steps = 0;
            return;
        }
    }
    if (s->kind_chosen) {
        s->steps_since_choice++;
        if (s->recheck_steps < SD_CHOICE_RECHECK) s->recheck_steps = SD_CHOICE_RECHECK;
        /* n-gram's own tokens a step judged over the window too (bursts) */
        double now = cur == ngram && mean > 0 ? mean : r->tokens;
        if (cur == s->want_kind && s->steps_since_choice >= 2 * SD_CHOICE_TRIAL &&
            (now < SD_CHOICE_DROP * s->chosen_tokens || s->steps_since_choice >= s->recheck_steps)) {
            SD_DEBUG("request %llu: %s drafts now give %.2f tokens a step (%.2f when chosen): trying the kinds again",
                     (unsigned long long)s->id,
                     protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, (int)cur)->name, now,
                     s->chosen_tokens);
            start_trial(s);
            s->kinds[cur].steps = SD_CHOICE_TRIAL; /* just measured: try the others first */
        } else {
            return;
        }
    }
    if (!s->kind_chosen && r->steps < SD_CHOICE_TRIAL && s->want_kind == cur && c->kind_decisions[cur] == 0 &&
        cost_known(c, cur)) {
        /* the kind's first trial on a cold service (it was tried at a
         * guessed price): once its cost is measured, a trial that cannot
         * pay ends at once. Only then: later trials were admitted at the
         * measured price, and ending them on a record of a few noisy
         * steps sent chat requests back to n-gram (3-4% on chat) */
        double others = 0.0;
        for (int kd = 1; kd < SD_DRAFTER_KINDS; kd++) {
            double g = kd == (int)cur ? 0.0 : sd_choice_goodput(c, s, (Specd__DrafterKind)kd);
            if (g > others) others = g;
        }
        if (others > 0 && ceiling_of(c, s, cur) <= others) r->steps = SD_CHOICE_TRIAL;
    }
    if (r->steps < SD_CHOICE_TRIAL && (s->want_kind == cur || s->want_kind == 0)) {
        s->want_kind = cur; /* finish this kind's trial */
        return;
    }
    Specd__DrafterKind next = next_untried(c, s, live);
    if (next != SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED) {
        if (next != cur)
            SD_DEBUG("request %llu: trying %s (%.2f tokens a step net where tried, %u decisions, %.0f us a step "
                     "overhead; the request's best %.2f)",
                     (unsigned long long)s->id,
                     protobuf_c_enum_descriptor_get_value(&specd__drafter_kind__descriptor, (int)next)->name,
                     c->kind_goodput[next], c->kind_decisions[next], c->kind_overhead_us[next], best_known(c, s));
        s->want_kind = next;
        return;
    }
    /* every live kind tried (or passed over): keep the best; another kind
     * than the one drafting s must beat it by SD_CHOICE_SWITCH, as the
     * shadow must (a 4-step trial is noisy, and a wrong move costs a move
     * back: the model's prefill of the whole prefix) */
    Specd__DrafterKind best = cur;
    double best_g = -1.0, best_score = -1.0;
    for (int kd = 1; kd < SD_DRAFTER_KINDS; kd++) {
        if (!(live & (1u << kd))) continue;
        double g = kd == (int)ngram && mean > 0 && s->kinds[ngram].steps > 0
                       ? goodput_at(c, s, ngram, mean, s->kinds[ngram].k)
                       : sd_choice_goodput(c, s, (Specd__DrafterKind)kd);
        if (s->kinds[kd].steps >= SD_CHOICE_TRIAL) { /* what the kind gives where it is tried */
            /* a sample stands for the SD_CHOICE_SAMPLE requests asked: at
             * the weight of one, a draft model's record depressed under
             * outside load needs ~5 samples (~40 requests) to pass the
             * promise margin again once the load is gone; meanwhile the
             * choice kept chat on n-gram (routing-cpu.md) */
            double wt = c->kind_decisions[kd] == 0             ? 1.0
                        : (s->sampled_kinds & (1u << kd)) != 0 ? SD_CHOICE_SAMPLED_EMA
                                                               : SD_CHOICE_KIND_EMA;
            c->kind_goodput[kd] += wt * (g - c->kind_goodput[kd]);
            if (c->kind_decisions[kd] < UINT32_MAX) c->kind_decisions[kd]++;
        }
        double score = kd == (int)cur ? SD_CHOICE_SWITCH * g : g;
        if (score > best_score) best = (Specd__DrafterKind)kd, best_g = g, best_score = score;
    }
    choose(s, best, best_g);
}
