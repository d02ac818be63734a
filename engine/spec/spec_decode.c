/* spec_decode.c — one sequence, one process: draft, verify in one target
 * pass, roll back (see spec_decode.h).
 *
 * Row layout of a step's target batch: the context tokens the cache lacks
 * (always at least the last one, whose logits give p for the first draft
 * position), then the drafts y_1..y_n. Logits are wanted for the last
 * context row and every draft row: n + 1 rows, row i being the target's
 * distribution for the token at position n_ctx + i. After verification the
 * cache holds the context and all drafts; it is truncated to n_ctx +
 * n_accepted (the accepted drafts stay cached, the committed correction is
 * fed at the next step with the next drafts). Because the CPU forward is
 * batch invariant, the target's logits here equal plain decoding's bit for
 * bit, which is what makes greedy speculative output equal greedy plain
 * output exactly.
 *
 * With an EAGLE-3 head as the drafter (drafter_eagle.c) the target
 * captures the head's layers on every forward (sd_model_capture_set, set
 * at create, cleared at free), and after verification the features of the
 * positions just committed (the last context token and the accepted
 * drafts: batch rows 0 .. n_ctx - keep + n_accepted - 1) go to the head;
 * their fusing is counted as drafting time. */
#include "specd/constrain.h"
#include "specd/constrain_slots.h"
#include "specd/spec_decode.h"

#include <stdlib.h>
#include <string.h>

#include "specd/eagle.h"
#include "specd/spec_batch.h"
#include "specd/spec_tree.h"

#define ADAPT_START_ALPHA  0.6  /* acceptance assumed before a sequence has shown any */
#define ADAPT_START_TRIALS 2.0  /* ... worth two trials: the first drafts move it as a running mean */
#define ADAPT_MODEL_WEIGHT 0.05 /* a model drafter's trial weight: ~20 trials of memory (adapt_weight) */

struct sd_spec_decoder {
    sd_model *target;
    sd_drafter *drafter;
    sd_kv *kv;
    int32_t max_ctx;
    int32_t *cached; /* [max_ctx] tokens held in kv */
    sd_spec_scratch *scratch;
    sd_spec_stats stats;
    /* sd_spec_decoder_step_adaptive: the shared K policy's state */
    sd_cost_model cost;
    sd_adapt adapt;
    bool drafter_warm;       /* the last step drafted and carried no prefill: this step's draft time is a price */
    bool calibrated;         /* the target's step sizes have been timed (calibrate) */
    sd_spec_cost_fn cost_fn; /* NULL: the policy learns from measured times */
    void *cost_user;
    int32_t n_prompt; /* penalties count the context from here on */
    bool eagle;       /* an EAGLE head drafts: the target captures its layers, handed over after each step */
    /* structured output (sd_spec_decoder_set_constraint) */
    sd_constraint *constraint; /* borrowed; advanced over con_ids */
    const sd_tok *tok;         /* borrowed: encodes the forced bytes; NULL = no forced drafts */
    int32_t *con_ids;          /* [max_ctx] the generated tokens the constraint was advanced over */
    int32_t *ctx2;             /* [max_ctx + SD_MAX_K] context + forced drafts, for the drafter */
    int32_t forced_ids[SD_MAX_K];
    float forced_q[SD_MAX_K];
    int64_t forced_drafted;
    /* token trees (sd_spec_decoder_step_tree): grown to the largest step */
    float *tree_logits; /* [1 + nodes][n_vocab], then the probs row */
    int32_t *tree_counts; /* [n_vocab] zeros */
    int32_t *tree_hist;   /* [max_ctx + SD_MAX_K] */
    float *tree_aux;      /* [max_ctx... rows][aux width]: the committed rows' features */
    int32_t tree_cap;     /* rows tree_logits and tree_aux hold */
};

void sd_spec_decoder_set_prompt_len(sd_spec_decoder *d, int32_t n_prompt) {
    if (d) d->n_prompt = n_prompt > 0 ? n_prompt : 0;
}

void sd_spec_decoder_set_cost_fn(sd_spec_decoder *d, sd_spec_cost_fn fn, void *user) {
    if (!d) return;
    d->cost_fn = fn;
    d->cost_user = user;
}

void sd_spec_decoder_free(sd_spec_decoder **pd) {
    if (!pd || !*pd) return;
    sd_spec_decoder *d = *pd;
    sd_kv_free(&d->kv);
    free(d->cached);
    free(d->con_ids);
    free(d->ctx2);
    free(d->tree_logits);
    free(d->tree_counts);
    free(d->tree_hist);
    free(d->tree_aux);
    sd_spec_scratch_free(&d->scratch);
    if (d->eagle) sd_model_capture_set(d->target, 0, NULL, false);
    free(d);
    *pd = NULL;
}

/* The acceptance estimate's memory. The shared 0.15 a trial (~7 trials)
 * follows the n-gram drafter, whose acceptance switches between ~0 and ~1
 * as the text stops and starts copying. A draft model's drifts: a Q4 copy
 * of SmolLM2 on chat accepted ~93% of its drafts, and at 0.15 one rejection
 * took the estimate from 0.93 to 0.8, K from 3-4 to 1, and five to eight
 * accepted steps brought it back: a third of the steps ran at K = 1 (1.05x
 * plain by their own times) where K = 4 makes 1.15x. At 0.05 a rejection
 * moves it by 0.05. */
static double adapt_weight(const sd_drafter *drafter) {
    if (!drafter || sd_drafter_kind_of(drafter) == SD_DRAFTER_NGRAM) return 0.0;
    return ADAPT_MODEL_WEIGHT;
}

sd_status sd_spec_decoder_create(sd_model *target, sd_drafter *drafter, int32_t max_ctx, sd_spec_decoder **out) {
    if (!target || !out || max_ctx <= 0) {
        SD_ERROR("spec: decoder needs a target, an output and max_ctx > 0 (got %d)", (int)max_ctx);
        return SD_ERR_INVALID_ARG;
    }
    *out = NULL;
    sd_spec_decoder *d = calloc(1, sizeof *d);
    if (!d) return SD_ERR_NOMEM;
    d->target = target;
    d->drafter = drafter;
    d->max_ctx = max_ctx;
    sd_cost_init(&d->cost);
    d->adapt.alpha = ADAPT_START_ALPHA;
    d->adapt.start_trials = ADAPT_START_TRIALS;
    d->adapt.trial_weight = adapt_weight(drafter);
    d->adapt.steps_at_zero = 1 << 20; /* nothing measured yet: the first K = 0 step explores */
    d->cached = malloc((size_t)max_ctx * sizeof *d->cached);
    sd_status st = d->cached ? sd_spec_scratch_create(&d->scratch) : SD_ERR_NOMEM;
    if (st == SD_OK) {
        const int32_t block = 16;
        /* room past the context for a chain of K or a tree of nodes */
        const int32_t extra = SD_TREE_MAX_NODES > SD_MAX_K ? SD_TREE_MAX_NODES : SD_MAX_K;
        st = sd_model_kv_create(target, 1, (max_ctx + extra + block - 1) / block + 1, block, &d->kv);
    } else {
        SD_ERROR("spec: out of memory creating a decoder");
    }
    int32_t ids[SD_MODEL_CAPTURE_MAX];
    int32_t n_ids = st == SD_OK ? sd_drafter_eagle_layers(drafter, ids) : 0;
    if (n_ids > 0) { /* the head reads the target's hidden states: capture them on every forward */
        st = sd_model_capture_set(target, n_ids, ids, false);
        d->eagle = st == SD_OK;
    }
    if (st != SD_OK) {
        sd_spec_decoder_free(&d);
        return st;
    }
    *out = d;
    return SD_OK;
}

sd_status sd_spec_decoder_set_constraint(sd_spec_decoder *d, sd_constraint *c, const sd_tok *tok) {
    if (!d) return SD_ERR_INVALID_ARG;
    if (c && (!d->con_ids || !d->ctx2)) {
        free(d->con_ids);
        free(d->ctx2);
        d->con_ids = malloc((size_t)d->max_ctx * sizeof *d->con_ids);
        d->ctx2 = malloc(((size_t)d->max_ctx + SD_MAX_K) * sizeof *d->ctx2);
        if (!d->con_ids || !d->ctx2) return SD_ERR_NOMEM;
    }
    d->constraint = c;
    d->tok = tok;
    return c ? sd_constraint_rollback(c, 0) : SD_OK;
}

int64_t sd_spec_decoder_forced_drafted(const sd_spec_decoder *d) { return d ? d->forced_drafted : 0; }

/* Brings the constraint to the context's generated tokens: rolls back to
 * the common prefix with what it was advanced over, then advances. */
static sd_status sync_constraint(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx) {
    sd_constraint *c = d->constraint;
    int32_t n_gen = n_ctx - d->n_prompt, have = sd_constraint_len(c), keep = 0;
    if (n_gen < 0) {
        SD_ERROR("spec: a constrained context (%d tokens) is shorter than its prompt (%d)", (int)n_ctx,
                 (int)d->n_prompt);
        return SD_ERR_INVALID_ARG;
    }
    while (keep < have && keep < n_gen && d->con_ids[keep] == ctx[d->n_prompt + keep]) keep++;
    SD_TRY(sd_constraint_rollback(c, keep));
    for (int32_t i = keep; i < n_gen; i++) {
        if (sd_constraint_advance(c, ctx[d->n_prompt + i]) != SD_OK) {
            SD_ERROR("spec: generated token %d (id %d) breaks the constraint", (int)i, (int)ctx[d->n_prompt + i]);
            return SD_ERR_INVALID_ARG;
        }
        d->con_ids[i] = ctx[d->n_prompt + i];
    }
    return SD_OK;
}

/* Forced drafts (sd_constraint_forced_tokens: the one rule for every
 * drafter) as up to k one-hot drafts (no drafter time). Returns how many. */
static int32_t forced_drafts(sd_spec_decoder *d, int32_t k, int32_t *draft, sd_spec_q *q) {
    int32_t nf = d->tok ? sd_constraint_forced_tokens(d->constraint, d->tok, k, d->forced_ids) : 0;
    for (int32_t i = 0; i < nf; i++) {
        d->forced_q[i] = 1.0f;
        draft[i] = d->forced_ids[i];
        q[i] = (sd_spec_q){1, &d->forced_ids[i], &d->forced_q[i]};
    }
    return nf;
}

/* Drafts under the constraint: the forced drafts, then the drafter's for
 * the rest from the context extended by them, cut before the first draft
 * the constraint refuses (a refused draft would be rejected anyway). */
static sd_status constrained_draft(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t k,
                                   const sd_sampling *s, int32_t *draft, sd_spec_q *q, int32_t *nd) {
    SD_TRY(sync_constraint(d, ctx, n_ctx));
    int32_t nf = forced_drafts(d, k, draft, q), more = 0;
    d->forced_drafted += nf;
    int32_t base = sd_constraint_len(d->constraint), ok = 0;
    if (d->drafter && k > nf) { /* the drafter continues after the forced drafts, masked from there */
        memcpy(d->ctx2, ctx, (size_t)n_ctx * sizeof *ctx);
        memcpy(d->ctx2 + n_ctx, draft, (size_t)nf * sizeof *draft);
        sd_status st = SD_OK;
        for (int32_t i = 0; i < nf && st == SD_OK; i++) st = sd_constraint_advance(d->constraint, draft[i]);
        sd_drafter_set_constraint(d->drafter, d->constraint);
        if (st == SD_OK)
            st = sd_drafter_propose_given(d->drafter, 0, d->ctx2, n_ctx + nf, k - nf, s, draft + nf, q + nf, &more);
        sd_drafter_set_constraint(d->drafter, NULL);
        SD_TRY(sd_constraint_rollback(d->constraint, base));
        SD_TRY(st);
    }
    while (ok < nf + more && !sd_constraint_ended(d->constraint) &&
           sd_constraint_advance(d->constraint, draft[ok]) == SD_OK)
        ok++;
    *nd = ok;
    return sd_constraint_rollback(d->constraint, base);
}

/* Per-position counts of a step that drafted n_pos positions (a chain's
 * length, a tree's depth) and accepted the first acc. */
static void count_positions(sd_spec_stats *st, int32_t n_pos, int32_t acc) {
    for (int32_t i = 0; i < n_pos && i < SD_MAX_K; i++) {
        st->drafted_at[i]++;
        st->reached_at[i] += i <= acc;
        st->accepted_at[i] += i < acc;
    }
}

/* How deep a draft tree goes (its nodes' parents come before them). */
static int32_t tree_depth(const sd_draft_tree *t) {
    int32_t dep[SD_TREE_MAX_NODES], most = 0;
    for (int32_t i = 0; i < t->n_nodes && i < SD_TREE_MAX_NODES; i++) {
        int32_t p = t->parent[i];
        dep[i] = p >= 0 && p < i ? dep[p] + 1 : 1;
        if (dep[i] > most) most = dep[i];
    }
    return most;
}

/* What one step did, for the adaptive policy. */
typedef struct step_report {
    int32_t n_drafted, n_accepted;
    int32_t n_proposed;   /* tokens the drafter returned (a shadow's one included) */
    int32_t shadow_token; /* the shadow draft, -1 if none */
    int32_t n_append;     /* context tokens the target had to take in (1 without a prefill) */
    double draft_s, target_s;
} step_report;

/* One step; with shadow (k is then 0) the drafter proposes one token that
 * is not verified, only reported. */
static sd_status decoder_step(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t k, bool shadow,
                              const sd_sampling *s, int32_t *out, int32_t *n_out, step_report *rep) {
    if (!d || !ctx || !s || !out || !n_out || n_ctx <= 0 || k < 0 || k > SD_MAX_K) {
        SD_ERROR("spec: step needs a decoder, a non-empty context, sampling, outputs and 0 <= k <= %d", SD_MAX_K);
        return SD_ERR_INVALID_ARG;
    }
    if (n_ctx >= d->max_ctx) {
        SD_ERROR("spec: context of %d tokens is at the decoder's limit %d", (int)n_ctx, (int)d->max_ctx);
        return SD_ERR_RANGE;
    }
    if (k > d->max_ctx - n_ctx) k = d->max_ctx - n_ctx; /* s: checked by the public entry (one check) */
    /* Draft. */
    int32_t draft[SD_MAX_K];
    sd_spec_q q[SD_MAX_K];
    int32_t nd = 0;
    rep->shadow_token = -1;
    double t0 = sd_now();
    if (d->constraint)
        SD_TRY(constrained_draft(d, ctx, n_ctx, k, s, draft, q, &nd));
    else if (d->drafter && k > 0)
        SD_TRY(sd_drafter_propose_given(d->drafter, 0, ctx, n_ctx, k, s, draft, q, &nd));
    rep->n_proposed = nd;
    if (d->drafter && shadow && k == 0 && n_ctx < d->max_ctx - 1) {
        int32_t n_shadow = 0;
        SD_TRY(sd_drafter_propose_given(d->drafter, 0, ctx, n_ctx, 1, s, draft, q, &n_shadow));
        if (n_shadow == 1) rep->shadow_token = draft[0];
        rep->n_proposed = n_shadow;
    }
    double t1 = sd_now();

    /* Verify: one sequence of the batched step, keeping the longest common
     * prefix of what the cache holds and the context. */
    int32_t n_cached = sd_kv_seq_len(d->kv, 0), keep = 0;
    while (keep < n_cached && keep < n_ctx && d->cached[keep] == ctx[keep]) keep++;
    if (keep == n_ctx) keep = n_ctx - 1;
    sd_verify_seq v = {
        .slot = 0,
        .keep_len = keep,
        .n_append = n_ctx - keep,
        .append = ctx + keep,
        .k = nd,
        .draft = draft,
        .q = q,
        .sampling = *s,
        .constraint = d->constraint,
    };
    if (sd_sampling_has_penalties(s) && n_ctx > d->n_prompt) {
        v.generated = ctx + d->n_prompt;
        v.n_generated = n_ctx - d->n_prompt;
    }
    sd_verify_result r;
    SD_TRY(sd_spec_verify_batch(d->target, d->kv, 1, &v, &r, d->scratch));
    if (r.outcome != SD_SEQ_OK) {
        SD_ERROR("spec: verification step failed: %s", sd_seq_outcome_str(r.outcome));
        return r.outcome == SD_SEQ_OUT_OF_BLOCKS ? SD_ERR_OUT_OF_BLOCKS : SD_ERR_INVALID_ARG;
    }
    /* The cache now holds the context and the accepted drafts. */
    memcpy(d->cached + keep, ctx + keep, (size_t)(n_ctx - keep) * sizeof *ctx);
    memcpy(d->cached + n_ctx, draft, (size_t)r.n_accepted * sizeof *draft);
    int32_t acc = r.n_accepted;
    double feed_s = 0; /* the head's fc over the new features: drafting time, not the target's */
    if (d->eagle) {    /* rows 0 .. n_ctx - keep + acc - 1 of the batch are committed positions keep.. */
        double f0 = sd_now();
        int32_t n_rows = 0;
        const float *aux = sd_model_capture_aux(d->target, &n_rows);
        if (!aux || n_rows < n_ctx - keep + acc) return SD_ERR_INTERNAL;
        SD_TRY(sd_drafter_eagle_features(d->drafter, 0, keep, n_ctx - keep + acc, d->cached + keep, aux));
        feed_s = sd_now() - f0;
    }
    memcpy(out, r.tokens, (size_t)r.n_tokens * sizeof *out);
    *n_out = r.n_tokens;
    double t2 = sd_now();
    rep->n_drafted = nd;
    rep->n_accepted = acc;
    rep->n_append = n_ctx - keep;
    rep->draft_s = t1 - t0 + feed_s;
    rep->target_s = t2 - t1 - feed_s;
    d->stats.steps++;
    d->stats.drafted += nd;
    d->stats.accepted += acc;
    count_positions(&d->stats, nd, acc);
    d->stats.committed += acc + 1;
    d->stats.draft_s += rep->draft_s;
    d->stats.target_s += rep->target_s;
    /* what the policy learns from: the measured times, or the cost function's */
    if (d->cost_fn) d->cost_fn(d->cost_user, rep->n_append + nd, rep->n_proposed, &rep->target_s, &rep->draft_s);
    return SD_OK;
}

sd_status sd_spec_decoder_step(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t k, const sd_sampling *s,
                               int32_t *out, int32_t *n_out, int32_t *n_drafted, int32_t *n_accepted) {
    SD_TRY(sd_sampling_validate(s)); /* a public entry point: the one check */
    step_report rep;
    SD_TRY(decoder_step(d, ctx, n_ctx, k, false, s, out, n_out, &rep));
    if (n_drafted) *n_drafted = rep.n_drafted;
    if (n_accepted) *n_accepted = rep.n_accepted;
    return SD_OK;
}

/* The decoder's timings fed to the shared policy as a batch of one: the
 * target forward over its rows as a verify step (not when it carried a
 * prefill: that is no step a K decides), the drafter's time per token only
 * when the drafter also drafted in the step before, which carried no
 * prefill. Otherwise the draft time holds a catch-up: the draft model
 * takes in every token committed since it last drafted (the prompt after a
 * prefill, a stretch of K = 0 steps before a probe) in one forward, and
 * even its first one-token step after the prompt measured twice its later
 * ones. Priced as drafting, the prompt's prefill made a draft token cost
 * 2-10x its price, and as the first observation sets that price outright,
 * adaptive K fell to 0 with a draft model accepted 90% of the time. */
static void adapt_learn(sd_spec_decoder *d, const step_report *rep, bool greedy, int32_t first_out) {
    if (rep->n_append == 1) {
        double us = rep->target_s * 1e6;
        sd_cost_observe_verify(&d->cost, 1 + rep->n_drafted, us >= 1.0 ? (uint32_t)(us < 4e9 ? us : 4e9) : 1u);
    }
    const bool warm = d->drafter_warm;
    d->drafter_warm = rep->n_proposed > 0 && rep->n_append == 1;
    if (rep->n_proposed > 0 && rep->n_append == 1 && warm) {
        double us = rep->draft_s * 1e6;
        sd_cost_observe_draft_fit(&d->cost, rep->n_proposed, us < 4e9 ? (uint32_t)us : UINT32_MAX);
    }
    if (rep->n_drafted > 0) {
        sd_adapt_observe(&d->adapt, rep->n_drafted, rep->n_accepted);
        d->adapt.steps_at_zero = 0;
    } else if (rep->shadow_token >= 0) {
        if (greedy) sd_adapt_observe_shadow(&d->adapt, first_out == rep->shadow_token);
        d->adapt.steps_at_zero = 0;
    } else {
        d->adapt.steps_at_zero++;
    }
}

/* The verify cost's split between a step's fixed part and each row's is
 * what decides K at batch 1, and a decoder that mostly runs steps of one
 * row cannot learn it from its own steps: the fit kept the priors' split
 * (two thirds fixed), which priced a verified row of the F16 SmolLM2 at a
 * third of a step where it costs about a seventh, put break-even above an
 * acceptance of 0.9 and kept a Q4 draft accepted 87% of the time at K = 0.
 * So once, after the decoder's first step (threads warm, the prompt in the
 * cache), the target runs steps of 1, 2 and 1 + max_k rows at the end of
 * the cached context, twice each (the faster kept: on a shared machine a
 * preempted sample is the usual error), and those times seed the cost
 * model as a verifier's warm-up seeds the coordinator's
 * (sd_cost_seed_size); the cache is then truncated back, so no committed
 * token sees them. Three sizes: 1 and 2 rows are the choice at the margin
 * (K = 0 or a probe), the largest sets the slope: on SmolLM2 F16's step
 * times of 1, 2, 3, 5 and 9 rows a line through all five is 10.8 ms + 1.63
 * ms a row, through these three 11.2 + 1.64, and timing five sizes cost
 * 0.17 s instead of 0.11.
 * The drafter then drafts two tokens after the context, twice (the faster
 * kept), which prices a draft token before the first drafted step does:
 * at the prior (100 us) a Q4 draft model was asked for 8 tokens in its
 * second step. ~0.14 s for SmolLM2 F16 and its Q4 draft at max_k 8, once
 * per decoder, inside its first step (specd-generate counts it in the
 * prompt's time, not the decode rate).
 * Rejected: learning the split from the first drafted steps, one noisy
 * sample per size, which is what the runs that never drafted had. With a
 * cost function (tests) its times are used and nothing runs. */
static sd_status calibrate_forward(sd_spec_decoder *d, int32_t n_cached, int32_t n_rows, double *seconds) {
    static const float one = 1.0f;
    int32_t toks[SD_MAX_K + 1];
    sd_spec_q q[SD_MAX_K];
    for (int32_t i = 0; i < n_rows; i++) toks[i] = d->cached[(n_cached - 1 - i % n_cached)];
    for (int32_t i = 0; i + 1 < n_rows; i++) q[i] = (sd_spec_q){1, &toks[1 + i], &one};
    sd_verify_seq v = {.slot = 0,
                       .keep_len = n_cached,
                       .n_append = 1,
                       .append = toks,
                       .k = n_rows - 1,
                       .draft = toks + 1,
                       .q = q,
                       .sampling = sd_sampling_default()};
    v.sampling.temperature = 0.0f;
    sd_verify_result r;
    double t0 = sd_now();
    sd_status st = sd_spec_verify_batch(d->target, d->kv, 1, &v, &r, d->scratch);
    *seconds = sd_now() - t0;
    sd_status tr = sd_kv_truncate(d->kv, 0, n_cached);
    SD_TRY(st);
    SD_TRY(tr);
    return r.outcome == SD_SEQ_OK ? SD_OK : SD_ERR_INTERNAL;
}

/* Times the drafter proposing up to n_draft tokens after ctx[n_ctx] (its
 * cache keeps them; the next step's proposal keeps what matches); *n_out:
 * how many it proposed (the n-gram drafter may find none). */
static sd_status calibrate_draft(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t n_draft,
                                 double *seconds, int32_t *n_out) {
    int32_t draft[SD_MAX_K];
    sd_spec_q q[SD_MAX_K];
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.0f;
    double t0 = sd_now();
    SD_TRY(sd_drafter_propose_given(d->drafter, 0, ctx, n_ctx, n_draft, &s, draft, q, n_out));
    *seconds = sd_now() - t0;
    return SD_OK;
}

static void calibrate(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t max_k) {
    d->calibrated = true;
    const int32_t n_cached = sd_kv_seq_len(d->kv, 0);
    const int32_t top = max_k + 1;
    if (max_k < 1 || n_cached < 1 || n_cached + top > d->max_ctx) return; /* no room: the steps teach it */
    int32_t sizes[3] = {1, 2, top}, n_sizes = top > 2 ? 3 : 2;
    double best[3];
    for (int32_t pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < n_sizes; i++) {
            double s = 0, draft_s = 0;
            if (d->cost_fn) {
                d->cost_fn(d->cost_user, sizes[i], 0, &s, &draft_s);
            } else if (calibrate_forward(d, n_cached, sizes[i], &s) != SD_OK) {
                SD_WARN("spec: timing a %d-row step failed; adaptive K learns the costs from its steps", (int)sizes[i]);
                return;
            }
            if (pass == 0 || s < best[i]) best[i] = s;
        }
    }
    for (int32_t i = 0; i < n_sizes; i++) {
        double us = best[i] * 1e6;
        sd_cost_seed_size(&d->cost, sizes[i], us >= 1.0 ? (uint32_t)(us < 4e9 ? us : 4e9) : 1u);
        SD_DEBUG("spec: calibration: a step of %d rows %.2f ms", (int)sizes[i], best[i] * 1e3);
    }
    if (!d->drafter || n_ctx + 2 > d->max_ctx) return;
    double per_best = 0; /* seconds per proposed token */
    for (int32_t pass = 0; pass < 2; pass++) {
        double s = 0, target_s = 0;
        int32_t nd = 2;
        if (d->cost_fn) {
            d->cost_fn(d->cost_user, 0, nd, &target_s, &s);
        } else if (calibrate_draft(d, ctx, n_ctx, 2, &s, &nd) != SD_OK) {
            SD_WARN("spec: timing the drafter failed; adaptive K prices a draft token from its steps");
            return;
        }
        if (nd < 1) return; /* nothing proposed here (n-gram): its steps price it */
        if (pass == 0 || s / nd < per_best) per_best = s / nd;
    }
    double us = per_best * 1e6;
    sd_cost_observe_draft_fit(&d->cost, 1, us < 4e9 ? (uint32_t)us : UINT32_MAX);
    SD_DEBUG("spec: calibration: a draft token %.3f ms", per_best * 1e3);
}

sd_status sd_spec_decoder_step_adaptive(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, int32_t max_k,
                                        const sd_sampling *s, int32_t *out, int32_t *n_out, int32_t *k_used) {
    if (!d || !s || max_k < 0 || max_k > SD_MAX_K) {
        SD_ERROR("spec: adaptive step needs a decoder, sampling and 0 <= max_k <= %d", SD_MAX_K);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(sd_sampling_validate(s));
    const bool greedy = sd_sampling_is_greedy(s);
    if (!d->drafter) max_k = 0;
    int32_t k = sd_adapt_next_k(&d->adapt, &d->cost, greedy, 1, max_k);
    bool shadow = false;
    if (k == 0 && max_k > 0 && greedy) { /* re-measure the acceptance now and then (sd_adapt_inline_interval) */
        bool probe = false;
        if (d->adapt.steps_at_zero + 1 >= sd_adapt_inline_interval(&d->adapt, &d->cost, &probe)) {
            if (probe)
                k = 1;
            else
                shadow = true;
        }
    }
    step_report rep;
    SD_TRY(decoder_step(d, ctx, n_ctx, k, shadow, s, out, n_out, &rep));
    adapt_learn(d, &rep, greedy, out[0]);
    if (!d->calibrated && max_k > 0) calibrate(d, ctx, n_ctx, max_k);
    SD_DEBUG("spec: adaptive step: K %d%s, %d of %d accepted, %d rows %.2f ms, %d proposed %.2f ms; alpha %.3f, "
             "verify %.0f + %.0f us a row, draft %.0f us a token",
             (int)k, shadow ? " (shadow)" : "", (int)rep.n_accepted, (int)rep.n_drafted,
             (int)(rep.n_append + rep.n_drafted), rep.target_s * 1e3, (int)rep.n_proposed, rep.draft_s * 1e3,
             d->adapt.alpha, d->cost.verify_fixed_us, d->cost.verify_token_us, d->cost.draft_token_us);
    if (k_used) *k_used = k;
    return SD_OK;
}

const sd_adapt *sd_spec_decoder_adapt(const sd_spec_decoder *d) { return d ? &d->adapt : NULL; }

const sd_cost_model *sd_spec_decoder_cost(const sd_spec_decoder *d) { return d ? &d->cost : NULL; }

const sd_spec_stats *sd_spec_decoder_stats(const sd_spec_decoder *d) { return d ? &d->stats : NULL; }

void sd_spec_decoder_reset_stats(sd_spec_decoder *d) {
    if (d) memset(&d->stats, 0, sizeof d->stats);
}

/* ---- token trees ---- */

/* Grows the tree buffers to rows rows (+ one probs row) of n_vocab. */
static sd_status tree_reserve(sd_spec_decoder *d, int32_t rows, int32_t n_vocab, int32_t aux_width) {
    if (!d->tree_counts) {
        d->tree_counts = calloc((size_t)n_vocab, sizeof *d->tree_counts);
        d->tree_hist = malloc(((size_t)d->max_ctx + SD_MAX_K) * sizeof *d->tree_hist);
        if (!d->tree_counts || !d->tree_hist) return SD_ERR_NOMEM;
    }
    if (rows <= d->tree_cap) return SD_OK;
    free(d->tree_logits);
    free(d->tree_aux);
    d->tree_logits = malloc(((size_t)rows + 1) * (size_t)n_vocab * sizeof *d->tree_logits);
    d->tree_aux = malloc((size_t)rows * (size_t)(aux_width > 0 ? aux_width : 1) * sizeof *d->tree_aux);
    if (!d->tree_logits || !d->tree_aux) return SD_ERR_NOMEM;
    d->tree_cap = rows;
    return SD_OK;
}

sd_status sd_spec_decoder_step_tree(sd_spec_decoder *d, const int32_t *ctx, int32_t n_ctx, const sd_tree_shape *shape,
                                    const sd_sampling *s, int32_t *out, int32_t *n_out, int32_t *n_drafted,
                                    int32_t *n_accepted) {
    SD_TRY(sd_sampling_validate(s));
    SD_TRY(sd_tree_shape_check(shape));
    if (!d || !ctx || !out || !n_out || n_ctx <= 0 || n_ctx >= d->max_ctx) {
        SD_ERROR("spec: a tree step needs a decoder, a non-empty context below max_ctx and outputs");
        return SD_ERR_INVALID_ARG;
    }
    if (!d->eagle || d->constraint || (s->rule == SD_RULE_REJECTION && !sd_sampling_is_greedy(s))) {
        SD_ERROR("spec: token trees are drafted by an EAGLE head and verified under the coupled rule only (%s)",
                 !d->eagle ? "the drafter is no head" : d->constraint ? "a constraint is set" : "rejection rule asked");
        return SD_ERR_UNSUPPORTED;
    }
    sd_tree_shape sh = *shape;
    if (sh.depth > d->max_ctx - n_ctx) sh.depth = d->max_ctx - n_ctx; /* room for the path and the bonus */
    sd_draft_tree tree;
    double t0 = sd_now();
    SD_TRY(sd_drafter_eagle_propose_tree(d->drafter, 0, ctx, n_ctx, &sh, s, &tree));
    double t1 = sd_now();
    if (tree.n_nodes == 0) { /* no features yet (the prompt's step): a plain step */
        step_report rep;
        SD_TRY(decoder_step(d, ctx, n_ctx, 0, false, s, out, n_out, &rep));
        if (n_drafted) *n_drafted = 0;
        if (n_accepted) *n_accepted = 0;
        return SD_OK;
    }
    /* the cache keeps the common prefix; the rest of the context is a
     * chain of nodes before the tree's (at least the last token: the root) */
    int32_t n_cached = sd_kv_seq_len(d->kv, 0), keep = 0;
    while (keep < n_cached && keep < n_ctx && d->cached[keep] == ctx[keep]) keep++;
    if (keep == n_ctx) keep = n_ctx - 1;
    SD_TRY(sd_kv_truncate(d->kv, 0, keep));
    const int32_t n_app = n_ctx - keep, n = n_app + tree.n_nodes, V = sd_model_config_of(d->target)->n_vocab;
    const int32_t aux_w = SD_EAGLE_N_AUX * sd_model_config_of(d->target)->n_embd;
    SD_TRY(tree_reserve(d, n, V, aux_w));
    int32_t *toks = malloc((size_t)n * sizeof *toks), *par = malloc((size_t)n * sizeof *par);
    bool *want = malloc((size_t)n * sizeof *want);
    sd_status st = toks && par && want ? SD_OK : SD_ERR_NOMEM;
    for (int32_t i = 0; st == SD_OK && i < n; i++) {
        bool node = i >= n_app;
        toks[i] = node ? tree.tokens[i - n_app] : ctx[keep + i];
        par[i] = !node ? i - 1 : tree.parent[i - n_app] < 0 ? n_app - 1 : n_app + tree.parent[i - n_app];
        want[i] = i >= n_app - 1;
    }
    const sd_tree_batch tb = {.seq = 0, .n_nodes = n, .tokens = toks, .parent = par, .logits = want};
    if (st == SD_OK) st = sd_model_forward_tree(d->target, d->kv, &tb, d->tree_logits);
    int32_t path[SD_MAX_K + 1], acc = 0;
    if (st == SD_OK) {
        const bool pen = sd_sampling_has_penalties(s) && n_ctx > d->n_prompt;
        const sd_tree_verify v = {.logits = d->tree_logits,
                                  .n_vocab = V,
                                  .tree = &tree,
                                  .sampling = s,
                                  .pos0 = (uint64_t)n_ctx,
                                  .generated = pen ? ctx + d->n_prompt : NULL,
                                  .n_generated = pen ? n_ctx - d->n_prompt : 0};
        st = sd_spec_tree_accept(&v, d->tree_logits + (size_t)(tree.n_nodes + 1) * (size_t)V, d->tree_counts,
                                 d->tree_hist, path, out, &acc);
    }
    /* keep the context's rows and the accepted path, as a chain */
    const float *aux = NULL;
    int32_t n_aux = 0;
    if (st == SD_OK) aux = sd_model_capture_aux(d->target, &n_aux);
    for (int32_t j = 0; st == SD_OK && j < n_app + acc; j++) { /* the committed rows' features, in order */
        int32_t r = j < n_app ? j : n_app + path[j - n_app];
        if (!aux || r >= n_aux) {
            st = SD_ERR_INTERNAL;
            break;
        }
        memcpy(d->tree_aux + (size_t)j * (size_t)aux_w, aux + (size_t)r * (size_t)aux_w, (size_t)aux_w * sizeof(float));
    }
    free(toks);
    free(par);
    free(want);
    if (st != SD_OK) {
        sd_kv_truncate(d->kv, 0, keep);
        return st;
    }
    /* the context's rows stay where they are; the path's nodes (node i of
     * the tree is stored at n_ctx + i) go down to n_ctx, n_ctx + 1, ... */
    SD_TRY(sd_model_tree_keep(d->target, d->kv, 0, n_ctx, acc, path));
    memcpy(d->cached + keep, ctx + keep, (size_t)n_app * sizeof *ctx);
    memcpy(d->cached + n_ctx, out, (size_t)acc * sizeof *out);
    double f0 = sd_now();
    SD_TRY(sd_drafter_eagle_features(d->drafter, 0, keep, n_app + acc, d->cached + keep, d->tree_aux));
    double t2 = sd_now();
    *n_out = acc + 1;
    if (n_drafted) *n_drafted = tree.n_nodes;
    if (n_accepted) *n_accepted = acc;
    d->stats.steps++;
    d->stats.drafted += tree.n_nodes;
    d->stats.accepted += acc;
    count_positions(&d->stats, tree_depth(&tree), acc);
    d->stats.committed += acc + 1;
    d->stats.draft_s += t1 - t0 + (t2 - f0);
    d->stats.target_s += f0 - t1;
    return SD_OK;
}
