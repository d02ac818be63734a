/* adapt.c — adaptive draft length K and the step cost model behind it.
 *
 * Each sequence keeps an EMA of its per-token acceptance rate a. With K
 * drafts a step commits (1 - a^(K+1)) / (1 - a) tokens on average (every
 * accepted draft plus the target's own token). The step costs drafting K
 * tokens plus the sequence's share of the verify forward, modelled as
 * fixed + per_token * tokens with the fixed part shared by the batch: as the
 * batch grows the fixed share shrinks, every extra draft token costs
 * relatively more, and K shrinks. The model's coefficients come from a
 * decaying least-squares fit of the verifiers' forward_us against the
 * tokens each step carried, and from draft_us per draft token. A sequence
 * whose K fell to 0 probes K = 1 every few steps so a drafter that starts
 * agreeing is noticed. */
#include "coord.h"

#include <math.h>

#define COST_DECAY 0.97
#define PROBE_EVERY 8

void sd_cost_init(sd_cost_model *c) {
    *c = (sd_cost_model){0};
    /* Priors until measurements arrive: a CPU forward is mostly per-token. */
    c->verify_fixed_us = 2000.0;
    c->verify_token_us = 1000.0;
    c->draft_token_us = 100.0;
}

void sd_cost_observe_verify(sd_cost_model *c, int32_t n_tokens, uint32_t forward_us) {
    if (n_tokens <= 0 || forward_us == 0) return;
    double x = n_tokens, y = forward_us;
    c->s_w = c->s_w * COST_DECAY + 1.0;
    c->s_x = c->s_x * COST_DECAY + x;
    c->s_y = c->s_y * COST_DECAY + y;
    c->s_xx = c->s_xx * COST_DECAY + x * x;
    c->s_xy = c->s_xy * COST_DECAY + x * y;
    double mx = c->s_x / c->s_w, my = c->s_y / c->s_w;
    double var = c->s_xx / c->s_w - mx * mx;
    double cov = c->s_xy / c->s_w - mx * my;
    double b, a;
    if (var > 0.25 && cov > 0) {
        b = cov / var;
        a = my - b * mx;
    } else {
        /* no spread in batch sizes yet: split the mean evenly */
        a = my * 0.5;
        b = my * 0.5 / mx;
    }
    if (a < 0) a = 0;
    if (b < 1e-3) b = 1e-3;
    c->verify_fixed_us = a;
    c->verify_token_us = b;
}

void sd_cost_observe_draft(sd_cost_model *c, int32_t n_draft_tokens, uint32_t draft_us) {
    if (n_draft_tokens <= 0) return;
    double per = (double)draft_us / n_draft_tokens;
    c->draft_token_us = 0.8 * c->draft_token_us + 0.2 * per;
}

static double expected_tokens(double a, int32_t k) {
    if (a >= 0.999) return k + 1.0;
    return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

int32_t sd_adapt_choose_k(double alpha, const sd_cost_model *c, int32_t batch, int32_t k_cap) {
    if (k_cap <= 0) return 0;
    if (batch < 1) batch = 1;
    if (alpha < 0) alpha = 0;
    if (alpha > 1) alpha = 1;
    int32_t best_k = 0;
    double best = -1.0;
    for (int32_t k = 0; k <= k_cap; k++) {
        double cost = c->draft_token_us * k + c->verify_fixed_us / batch + c->verify_token_us * (1 + k);
        double rate = expected_tokens(alpha, k) / cost;
        if (rate > best * (1.0 + 1e-9)) {
            best = rate;
            best_k = k;
        }
    }
    return best_k;
}

void sd_adapt_observe(sd_adapt *a, int32_t n_drafted, int32_t n_accepted) {
    if (n_drafted <= 0) return;
    /* Per-token rate: a run of n accepted then a rejection estimates
     * a = n / (n + 1); all accepted says at least n / (n + 1) too, nudged up. */
    double obs = n_accepted >= n_drafted ? (n_drafted + 0.5) / (n_drafted + 1.0)
                                         : (double)n_accepted / (n_accepted + 1.0);
    a->alpha = 0.7 * a->alpha + 0.3 * obs;
}

int32_t sd_adapt_next_k(const sd_adapt *a, const sd_cost_model *c, int32_t batch, int32_t k_cap) {
    int32_t k = sd_adapt_choose_k(a->alpha, c, batch, k_cap);
    if (k == 0 && k_cap > 0 && a->steps_at_zero >= PROBE_EVERY) k = 1;
    return k;
}
