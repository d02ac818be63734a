/* spec_adapt.c — adaptive draft length K and the step cost model behind it
 * (spec_adapt.h), shared by the coordinator's scheduler and single-process
 * decoding (spec_decode.c). It was the coordinator's adapt.c; the
 * single-process path had its own K rule, which never went below K = 1
 * and so drafted on even where a draft cost as much as the target step.
 *
 * In one process (sd_spec_decoder_step_adaptive) the same model is fed from
 * the decoder's own timings: a step's target forward over its rows as a
 * verify step of batch 1 (steps that carry a prefill are left out), seeded
 * once by timing the target at a few step sizes and the drafter (see
 * spec_decode.c), the drafter's time per draft token, and no round trip
 * (draft_step_us stays 0). A K = 0 sequence there re-measures by a K = 1
 * probe or a shadow, the cheaper (sd_adapt_inline_interval): nothing
 * overlaps a shadow in one process. A draft model as costly as the target
 * then prices a draft token at a whole target step, no K > 0 beats K = 0
 * at any acceptance, and the interval is at its maximum (SHADOW_MAX). The
 * n-gram drafter costs microseconds a token, so it is shadowed every step
 * and drafting resumes as soon as the text starts repeating.
 *
 * From the coordinator:  *
 * Each sequence keeps an EMA of its per-token acceptance rate a. With K
 * drafts a step commits (1 - a^(K+1)) / (1 - a) tokens on average (every
 * accepted draft plus the target's own token). The step costs drafting K
 * tokens plus the sequence's share of the verify forward, modelled as
 * fixed + per_token * tokens with the fixed part shared by the batch: as the
 * batch grows the fixed share shrinks, every extra draft token costs
 * relatively more, and K shrinks — on a batch-bound verifier (a CPU at 64
 * sequences: per_token is most of a sequence's share) to 0 unless the
 * drafter is nearly always right. The model's coefficients come from a
 * decaying least-squares fit of the verifiers' forward_us against the
 * tokens each verify step carried (the last committed token and the drafts
 * of each sequence; steps that refill a prefix are left out by the
 * scheduler), and from draft_us per draft token.
 *
 * A sequence at K = 0 still has to notice when its drafter starts
 * agreeing. Verifying a K = 1 probe now and then was the first design; it
 * is not free (one more verified token per probe, and the probing sequence
 * left the verify batch to be drafted): with the cost model measured on a
 * CPU at 64 sequences a probe every 8 steps cost ~10% of the throughput
 * when the drafter is rarely right. Instead the
 * scheduler shadow-drafts: while a K = 0 step of the sequence is verified,
 * the drafter proposes one token for the same position, and the token the
 * target commits says whether it would have been accepted. For a one-hot
 * proposal (n-gram, greedy) a match has exactly the acceptance probability;
 * for a sampled sparse q it is sum_y q(y) p(y) <= sum_y min(p, q), a lower
 * bound, which errs toward K = 0. The scheduler shadows every sequence due
 * at the same verify steps, one draft step for the batch every N verify
 * steps, the steps between carrying no draft traffic at all; N holds the
 * shadow steps to a budget of the verify time (0.25%, up to 2% where
 * drafting would pay at a low acceptance), a shadow step priced at
 * the measured draft round trip plus the drafter's own time per sequence.
 * The round trip is the right price where drafter and verifier share a
 * machine: on the 2-core CPU at 64 sequences a shadow of every sequence at
 * every step (then priced at the drafter's 5 us a token, under a 2%
 * budget) cost 0.8% of target-only tokens/s, more than the drafter's and
 * the coordinator's CPU time, while the shadows there never found a
 * sequence worth drafting. With a drafter on its own hardware it
 * overprices them, which only makes K = 0 slower to notice a drafter that
 * starts agreeing.

 * All of that is for greedy requests only. A sampled request's tokens
 * depend on where drafts were verified (after a rejection the token comes
 * from the residual max(0, p - q), not from p), so its seed promises the
 * same output only if its K schedule depends on nothing but its own
 * history: never on the batch, the measured costs or when a shadow draft
 * happened to come back, which all change with load and timing. A sampled
 * request's K therefore comes from its acceptance EMA against fixed
 * reference costs (the priors below, batch 1), and at K = 0 it verifies a
 * K = 1 probe every SAMPLED_PROBE_EVERY steps, starting from alpha 0.6.
 * Greedy output is the argmax whatever K is, so greedy requests get the
 * full policy, and start from the service's recent acceptance (a 64-token
 * chat request with the n-gram drafter spent a quarter of its verified rows
 * on drafts while unlearning a fixed start of 0.6 at 21% acceptance).
 *
 * K > 0 must promise SPEC_MARGIN more tokens per unit of cost than K = 0,
 * not merely more. Near break-even the choice is a coin toss on a noisy
 * estimate, and the coin is loaded: a sequence leaves K = 0 right after a
 * lucky run of matches has pushed its EMA up (on the CPU at 64 sequences,
 * break-even acceptance ~0.86, the sequences that crossed it went on to
 * accept 67-79% of their drafts: bench/results/serve-cpu.md). A 2% margin
 * costs at most 2% where speculation barely pays and nothing where it
 * pays well.
 *
 * Each sequence's K prices only its own rows. What it does not see is the
 * draft round trip: a step that verifies drafts has to wait for them after
 * the previous step committed (or the scheduler splits the batch into two
 * cohorts, one more fixed cost per round). Where a verify step costs little
 * more than that round trip (a GPU running a small target: a 4 ms step, a
 * ~1 ms round trip to a CPU drafter) the per-sequence choices add up to a
 * loss: SmolLM2 + n-gram at 64 on an H100 measured 0.82 of target-only
 * (bench/results/cuda-h100.md). So after each verify step the scheduler adds
 * up what the chosen Ks promise for the batch and lets greedy requests draft
 * only while that beats the batch without drafts, round trip included, by
 * SPEC_MARGIN (sd_adapt_drafting_pays). That comparison uses each step
 * size's own measured time where both sizes have been seen: a verifier's
 * cost is a line only roughly (a GPU kernel that takes tokens 8 at a time
 * costs a step at the 9th), and the line cannot see the step. */
#include "specd/spec_adapt.h"

#include <math.h>

#define SPEC_MARGIN         0.02   /* predicted gain below which a greedy sequence stays at K = 0 */
#define COST_DECAY          0.99   /* ~100 steps of memory: spread over batch sizes for the fit */
#define SHADOW_BUDGET       0.0025 /* share of the verify time that shadow drafting may add, at least */
#define SHADOW_BUDGET_MAX   0.02   /* ... and at most, where drafting pays at any acceptance */
#define SHADOW_MAX          256
#define SHADOW_WEIGHT       0.15 /* EMA weight of one shadow observation (a 0/1 sample) */
#define SAMPLED_PROBE_EVERY 8
#define PRIOR_WEIGHT        0.02 /* per observation of any greedy request: ~50 observations of memory */
#define SIZE_WEIGHT         0.2  /* EMA weight of one step in its size's own time */
#define SIZE_MIN_OBS        3    /* steps of a size before its own time is used */

void sd_cost_init(sd_cost_model *c) {
    *c = (sd_cost_model){0};
    /* Priors until measurements arrive (and the fixed reference costs of
     * sampled requests): the fixed cost of a step twice a token's. */
    c->verify_fixed_us = 2000.0;
    c->verify_token_us = 1000.0;
    c->draft_token_us = 100.0;
}

/* Adds the point (x, y) to s, the older points' weight decayed by decay;
 * *mx, *my: the weighted means, *var: x's variance, *cov: the covariance. */
static void line_add(sd_line_sums *s, double decay, double x, double y, double *mx, double *my, double *var,
                     double *cov) {
    s->w = s->w * decay + 1.0;
    s->x = s->x * decay + x;
    s->y = s->y * decay + y;
    s->xx = s->xx * decay + x * x;
    s->xy = s->xy * decay + x * y;
    *mx = s->x / s->w;
    *my = s->y / s->w;
    *var = s->xx / s->w - *mx * *mx;
    *cov = s->xy / s->w - *mx * *my;
}

void sd_cost_observe_verify(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us) {
    if (n_tokens <= 0 || forward_us == 0) return;
    const double y = forward_us;
    double mx, my, var, cov;
    line_add(&c->verify_fit, COST_DECAY, n_tokens, y, &mx, &my, &var, &cov);
    double b, a;
    if (var > 0.25 && var > (0.1 * mx) * (0.1 * mx) && cov > 0) {
        b = cov / var;
        a = my - b * mx;
    } else {
        /* Too little spread in step sizes for a slope (a service steadily
         * at one batch size): keep the split between fixed and per-token
         * cost learned so far (or the prior's) and rescale it to the mean.
         * Splitting the mean evenly instead made K = 1 look worth it at
         * batch 64 with acceptance 0.5. */
        double scale = my / (c->verify_fixed_us + c->verify_token_us * mx);
        a = c->verify_fixed_us * scale;
        b = c->verify_token_us * scale;
    }
    if (a < 0) a = 0;
    if (b < 1e-3) b = 1e-3;
    c->verify_fixed_us = a;
    c->verify_token_us = b;
    if (n_tokens <= SD_COST_SIZES) {
        c->size_us[n_tokens] = c->size_n[n_tokens] ? (1.0 - SIZE_WEIGHT) * c->size_us[n_tokens] + SIZE_WEIGHT * y : y;
        if (c->size_n[n_tokens] < UINT16_MAX) c->size_n[n_tokens]++;
    }
}

void sd_cost_seed_size(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us) {
    if (n_tokens < 1 || forward_us == 0) return;
    sd_cost_observe_rows(c, n_tokens, forward_us);
    if (n_tokens > SD_COST_SIZES) return;
    sd_cost_observe_verify(c, n_tokens, forward_us);
    c->size_us[n_tokens] = forward_us;
    if (c->size_n[n_tokens] < SIZE_MIN_OBS) c->size_n[n_tokens] = SIZE_MIN_OBS;
}

double sd_cost_size_us(const sd_cost_model *c, int32_t n_tokens) {
    if (n_tokens < 1 || n_tokens > SD_COST_SIZES || c->size_n[n_tokens] < SIZE_MIN_OBS) return -1.0;
    return c->size_us[n_tokens];
}

void sd_cost_observe_draft(sd_cost_model *c, int32_t n_draft_tokens, uint32_t draft_us) {
    if (n_draft_tokens <= 0) return;
    double per = (double)draft_us / n_draft_tokens;
    /* the first measurement replaces the prior (100 us) outright: moved
     * toward it by a fifth a step, a draft model 100x dearer than the prior
     * looked half its price after three steps, and the drafter choice kept
     * it for a request that n-gram lookup copied for nothing */
    if (c->n_draft_obs++ == 0)
        c->draft_token_us = per;
    else
        c->draft_token_us = 0.8 * c->draft_token_us + 0.2 * per;
}

/* In one process a draft model's step costs about one forward per draft
 * token, and its first forward also takes in what was committed since
 * the last step (the correction, and the last accepted draft, which a
 * draft never feeds): a Q4 copy of SmolLM2 measured 8.1 ms for one draft
 * token and 7.1-7.4 ms a token for two to six. Priced per token only, a
 * K = 1 step looked ~1 ms (5%) cheaper than it was and won over K = 2
 * wherever the estimate sat at 0.8-0.9, where by its real cost it makes
 * 1.08x plain against 1.17x. So the decoder fits a line, as for verify
 * steps, over ~20 steps of memory. */
#define DRAFT_FIT_DECAY 0.95

void sd_cost_observe_draft_fit(sd_cost_model *c, int32_t n_draft_tokens, uint32_t draft_us) {
    if (n_draft_tokens <= 0) return;
    double x = n_draft_tokens, y = draft_us;
    if (c->n_draft_obs++ == 0) { /* the first replaces the prior outright (sd_cost_observe_draft) */
        c->draft_fixed_us = 0;
        c->draft_token_us = y / x;
        c->draft_fit = (sd_line_sums){0};
    }
    double mx, my, var, cov;
    line_add(&c->draft_fit, DRAFT_FIT_DECAY, x, y, &mx, &my, &var, &cov);
    double a = c->draft_fixed_us, b;
    if (var > 0.1 && cov > 0) {
        b = cov / var;
        a = my - b * mx;
        if (a < 0) a = 0;
        if (a > my) a = my;
        b = (my - a) / mx;
    } else {
        if (a > my) a = my;
        b = (my - a) / mx;
    }
    c->draft_fixed_us = a;
    c->draft_token_us = b > 0 ? b : 0;
}

void sd_cost_observe_catchup(sd_cost_model *c, int32_t rows, uint32_t us) {
    if (rows <= 0) return;
    double per = (double)us / rows;
    c->catchup_row_us = c->catchup_row_us > 0 ? 0.8 * c->catchup_row_us + 0.2 * per : per;
}

/* Step timeouts. A fixed one (30 s) turned a slow machine into a livelock:
 * under ASan on 2 cores, 64 SmolLM2 prompts arriving together made a
 * ~3,600-row refill step that took longer, the verifier was declared dead,
 * re-registered, and was sent the same step again. The timeout is for
 * hangs (the worker's I/O thread heartbeats separately), so it scales with
 * the step's tokens at the slowest per-token time seen recently, and
 * doubles after a step that timed out. */
#define ROW_PEAK_DECAY 0.98
#define TIMEOUT_FACTOR 8.0

void sd_cost_observe_rows(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us) {
    if (n_tokens <= 0 || forward_us == 0) return;
    double per = (double)forward_us / n_tokens;
    c->row_us_peak *= ROW_PEAK_DECAY;
    if (per > c->row_us_peak) c->row_us_peak = per;
}

uint64_t sd_cost_verify_timeout_us(const sd_cost_model *c, int32_t n_tokens, uint64_t floor_us) {
    double t = TIMEOUT_FACTOR * c->row_us_peak * (n_tokens > 0 ? n_tokens : 1);
    return t > (double)floor_us ? (uint64_t)t : floor_us;
}

void sd_cost_verify_timed_out(sd_cost_model *c, int32_t n_tokens, uint64_t timeout_us) {
    if (n_tokens <= 0) n_tokens = 1;
    double per = 2.0 * (double)timeout_us / TIMEOUT_FACTOR / n_tokens;
    if (per > c->row_us_peak) c->row_us_peak = per;
}

void sd_cost_observe_draft_step(sd_cost_model *c, uint64_t round_trip_us) {
    double x = (double)round_trip_us;
    c->draft_step_us = c->draft_step_us > 0 ? 0.8 * c->draft_step_us + 0.2 * x : x;
}

double sd_cost_verify_us(const sd_cost_model *c, int32_t n_tokens) {
    return c->verify_fixed_us + c->verify_token_us * (n_tokens > 0 ? n_tokens : 0);
}

/* A verify step of n tokens as best known: its own measured time; between
 * the nearest measured sizes below and above it (that one looked for up to
 * SIZE_REACH away), the line through them; above the nearest one below,
 * that one plus the fitted slope (a step of more tokens costs no less than
 * a smaller one seen); else the fitted line. The fitted line alone
 * overpriced a row at batch 1 on the CPU: through a CPU verifier's warm-up
 * sizes (1 to 16 tokens) it put a row at ~3.3 ms where steps of 1 and 2
 * tokens differ by 1.8-2.0 ms, and a head accepted 33% of the time, at
 * K = 1 1.05x plain (measured), was kept at K = 0
 * (bench/results/eagle-cpu.md, session 44). */
#define SIZE_REACH 8

static double step_us(const sd_cost_model *c, int32_t n) {
    double own = sd_cost_size_us(c, n);
    if (own > 0) return own;
    int32_t lo = 0, hi = 0;
    double t_lo = -1.0, t_hi = -1.0;
    for (int32_t m = (n <= SD_COST_SIZES ? n : SD_COST_SIZES + 1) - 1; m >= 1 && lo == 0; m--)
        if ((t_lo = sd_cost_size_us(c, m)) > 0) lo = m;
    for (int32_t m = n + 1; m <= n + SIZE_REACH && m <= SD_COST_SIZES && hi == 0; m++)
        if ((t_hi = sd_cost_size_us(c, m)) > 0) hi = m;
    if (lo > 0 && hi > 0) {
        double t = t_lo + (t_hi - t_lo) * (n - lo) / (hi - lo);
        return t > t_lo ? t : t_lo; /* a noisy larger size never makes this one cheaper than a smaller one */
    }
    if (lo > 0) return t_lo + c->verify_token_us * (n - lo);
    return sd_cost_verify_us(c, n);
}

/* A sequence's part of a verify step of `batch` sequences in which it
 * carries k drafts and the others none: its share of the step, and the
 * rows its drafts add (never less than nothing). Without measured sizes
 * this is the line's fixed / batch + per_token * (1 + k). */
static double seq_step_us(const sd_cost_model *c, int32_t batch, int32_t k) {
    double t0 = step_us(c, batch);
    if (k <= 0) return t0 / batch;
    double tk = step_us(c, batch + k);
    return t0 / batch + (tk > t0 ? tk - t0 : 0.0);
}

int32_t sd_adapt_choose_k(double alpha, const sd_cost_model *c, int32_t batch, int32_t max_k) {
    if (max_k <= 0) return 0;
    if (batch < 1) batch = 1;
    if (alpha < 0) alpha = 0;
    if (alpha > 1) alpha = 1;
    double rate0 = 1.0 / seq_step_us(c, batch, 0);
    int32_t best_k = 0;
    double best = -1.0, verify = 0.0;
    /* expected tokens of K drafts, 1 + a + ... + a^K, summed as K grows
     * (the scheduler asks for every K = 0 sequence several times a step:
     * pow() here cost ~20 us between a verify reply and the next request
     * at 64 sequences) */
    double term = 1.0, tokens = 1.0;
    for (int32_t k = 1; k <= max_k; k++) {
        term *= alpha;
        tokens += term;
        double v = seq_step_us(c, batch, k);
        if (v > verify) verify = v; /* more rows never cost less (measured sizes are noisy) */
        double cost = c->draft_fixed_us + c->draft_token_us * k + verify;
        double rate = tokens / cost;
        if (rate > best * (1.0 + 1e-9)) {
            best = rate;
            best_k = k;
        }
    }
    return best >= rate0 * (1.0 + SPEC_MARGIN) ? best_k : 0;
}

double sd_adapt_expected_tokens(double alpha, int32_t k) {
    double term = 1.0, tokens = 1.0;
    for (int32_t i = 1; i <= k; i++) {
        term *= alpha;
        tokens += term;
    }
    return tokens;
}

bool sd_adapt_drafting_pays(const sd_cost_model *c, int32_t batch, double extra_tokens, int32_t extra_rows) {
    if (extra_rows <= 0) return true; /* nobody drafts: nothing to decide */
    if (batch < 1) batch = 1;
    /* the two step sizes as measured, or from the nearest measured ones
     * (step_us): the line misses steps in the cost (on an H100 a SmolLM2
     * step of 9 tokens costs 9% more than one of 8, the line said 2.5%,
     * and speculation at 8 concurrent requests measured 0.935 of
     * target-only) */
    double t0 = step_us(c, batch), t1 = step_us(c, batch + extra_rows);
    if (t1 < t0) t1 = t0;
    double wait = c->draft_step_us < c->verify_fixed_us ? c->draft_step_us : c->verify_fixed_us;
    t1 += wait;
    return (batch + extra_tokens) / t1 >= batch / t0 * (1.0 + SPEC_MARGIN);
}

/* Folds `trials` Bernoulli trials whose mean is `rate` into the estimate:
 * each moves it by SHADOW_WEIGHT, or more while the start value has not
 * yet been outweighed (sd_adapt.start_trials); sd_adapt.trial_weight in
 * place of SHADOW_WEIGHT where set. With start_trials 0 this is
 * alpha += (1 - (1 - w)^trials) (rate - alpha). */
static void fold_trials(sd_adapt *a, int32_t trials, double rate) {
    for (int32_t i = 0; i < trials; i++) {
        double w = a->trial_weight > 0 && a->trial_weight <= 1 ? a->trial_weight : SHADOW_WEIGHT;
        if (a->start_trials > 0) {
            double mean_w = 1.0 / (a->start_trials + a->n_trials + 1.0);
            if (mean_w > w) w = mean_w;
        }
        a->alpha += w * (rate - a->alpha);
        if (a->n_trials < UINT32_MAX) a->n_trials++;
    }
}

void sd_adapt_observe(sd_adapt *a, int32_t n_drafted, int32_t n_accepted) {
    if (n_drafted <= 0) return;
    /* Each draft token verified is a Bernoulli trial of the per-token rate
     * until the first rejection (the tokens after it say nothing): n
     * accepted of k is n successes and, when n < k, one failure. The
     * estimate moves by SHADOW_WEIGHT per trial, as for a shadow draft.
     * Rejected: reading a run as n / (n + 1), nudged up when all were
     * accepted. It capped the estimate at (k + 0.5) / (k + 1): at K = 1 a
     * draft model accepted 95% of the time read as 0.75, too low for K to
     * grow, so K stayed small however often its drafts were taken. */
    if (n_accepted > n_drafted) n_accepted = n_drafted;
    int32_t trials = n_accepted + (n_accepted < n_drafted);
    fold_trials(a, trials, (double)n_accepted / trials);
}

void sd_adapt_observe_shadow(sd_adapt *a, bool match) {
    /* one Bernoulli sample of the acceptance rate, as each draft token is */
    fold_trials(a, 1, match ? 1.0 : 0.0);
}

void sd_adapt_prior_update(double *prior, const sd_adapt *a) { *prior += PRIOR_WEIGHT * (a->alpha - *prior); }

int32_t sd_adapt_sampled_k(const sd_adapt *a, int32_t max_k) {
    sd_cost_model ref;
    sd_cost_init(&ref);
    int32_t k = sd_adapt_choose_k(a->alpha, &ref, 1, max_k);
    if (k == 0 && max_k > 0 && a->steps_at_zero >= SAMPLED_PROBE_EVERY) k = 1;
    return k;
}

/* The acceptance rate at which one draft token starts to pay for a
 * sequence in a batch of `batch` (sd_adapt_choose_k's test for K = 1), in
 * [0, 1]: 1 where no acceptance makes it pay. */
static double break_even_alpha(const sd_cost_model *c, int32_t batch) {
    double v0 = seq_step_us(c, batch, 0), v1 = seq_step_us(c, batch, 1);
    if (!(v0 > 0)) return 1.0;
    double a = (1.0 + SPEC_MARGIN) * (c->draft_fixed_us + c->draft_token_us + v1) / v0 - 1.0;
    return a < 0 ? 0.0 : a > 1 ? 1.0 : a;
}

int32_t sd_adapt_shadow_interval(const sd_cost_model *c, int32_t batch) {
    if (batch < 1) batch = 1;
    /* a shadow step for the whole batch: its round trip (messages, both
     * processes waking up) and the drafter's time per sequence, against
     * one verify step of the batch. The budget is worth more where a
     * drafter needs less to pay: from SHADOW_BUDGET_MAX where any
     * acceptance pays down to SHADOW_BUDGET where only a drafter that is
     * nearly always right would (a CPU at 64 sequences, where a shadow of
     * every sequence at every step measured 0.8% of the throughput). At
     * batch 1 on the CPU with the n-gram drafter in its own process, the
     * fixed 0.25% allowed a shadow every ~11 steps: a request that had
     * dropped to K = 0 in a stretch of new text noticed a copied stretch
     * late, and the service committed 1.28 tokens a step on the
     * copy-heavy prompts where one process, shadowing every step,
     * committed 1.90 (bench/results/ngram-cpu.md). */
    double budget = SHADOW_BUDGET_MAX * (1.0 - break_even_alpha(c, batch));
    if (budget < SHADOW_BUDGET) budget = SHADOW_BUDGET;
    double shadow = c->draft_step_us + c->draft_token_us * batch;
    double step = step_us(c, batch);
    /* A drafter that runs nothing at K = 0 (an EAGLE head: "only where
     * read") takes in every position it skipped at the next shadow: at any
     * interval shorter than the request, shadowing costs it a row per
     * sequence and step besides the shadows. Where that alone is over the
     * budget there are none. Unpriced, frequent shadows made the head
     * compute every row: the service at 8 and 32 requests ran 0.91x plain
     * with nothing drafted (bench/results/eagle-cpu.md, session 43). */
    double room = budget * step - c->catchup_row_us * batch;
    if (!(room > 0)) return SHADOW_MAX;
    double steps = step > 0 ? ceil(shadow / room) : SHADOW_MAX;
    if (!(steps >= 1)) steps = 1; /* also NaN */
    if (steps > SHADOW_MAX) steps = SHADOW_MAX;
    return (int32_t)steps;
}

/* In one process nothing overlaps a shadow draft: it costs a draft token
 * on the critical path, as much as the draft of a K = 1 probe, which also
 * verifies a row and saves a step when its draft is accepted. So a probe
 * is the cheaper way to re-measure wherever the estimate says a draft is
 * accepted more often than a verified row costs a step (~0.15-0.2 on the
 * CPU), and a shadow only below that, which with a costly draft model is
 * rare and with the n-gram drafter (microseconds a token) is every step.
 * The interval keeps the expected cost, net of the expected gain, under
 * EXPLORE_BUDGET of a step: the nearer the estimate to break-even, the
 * cheaper a probe and the sooner it comes, which is what pulls a sequence
 * out of K = 0 when one unlucky rejection pushed an EMA at 0.9 below a
 * break-even of 0.8. With the old rule (shadows only, priced at a whole
 * draft token against 0.25% of a step) a Q4 copy of SmolLM2 drafting for
 * its F16 target was re-measured every ~220 steps and adaptive K
 * decoded chat at 1.02x plain where K = 4 gave 1.16x
 * (bench/results/spec-cpu.md). Where no acceptance makes a draft pay (a
 * draft token as dear as a target step) there is nothing to find out and
 * the interval is SHADOW_MAX. */
#define EXPLORE_BUDGET 0.02

int32_t sd_adapt_inline_interval(const sd_adapt *a, const sd_cost_model *c, bool *probe) {
    if (probe) *probe = false;
    double step = seq_step_us(c, 1, 0);
    if (!(step > 0) || break_even_alpha(c, 1) >= 1.0) return SHADOW_MAX;
    double alpha = a->alpha < 0 ? 0 : a->alpha > 1 ? 1 : a->alpha;
    double shadow_us = c->draft_fixed_us + c->draft_token_us;
    double probe_us = shadow_us + (seq_step_us(c, 1, 1) - step) - alpha * step;
    if (probe_us < 0) probe_us = 0;
    const bool use_probe = probe_us < shadow_us;
    if (probe) *probe = use_probe;
    double steps = ceil((use_probe ? probe_us : shadow_us) / (EXPLORE_BUDGET * step));
    if (!(steps >= 1)) steps = 1; /* also NaN */
    if (steps > SHADOW_MAX) steps = SHADOW_MAX;
    return (int32_t)steps;
}

int32_t sd_adapt_next_k(const sd_adapt *a, const sd_cost_model *c, bool greedy, int32_t batch, int32_t max_k) {
    if (max_k <= 0) return 0;
    if (!greedy) return sd_adapt_sampled_k(a, max_k);
    return sd_adapt_choose_k(a->alpha, c, batch, max_k);
}

bool sd_adapt_shadow_due(const sd_adapt *a, const sd_cost_model *c, int32_t batch) {
    return a->steps_at_zero + 1 >= sd_adapt_shadow_interval(c, batch);
}
