/* gen_spec.c — specd-generate's speculative decoding loop (see gen_spec.h
 * for the timing contract).
 *
 * The loop used to live in specd-generate.c, timing decode from the end of
 * the first step while dividing by every generated token but one: the
 * first step's accepted drafts were counted as decode tokens without their
 * time (about 3% at 128 tokens, K = 4, on copy-heavy text more). Here each
 * step's tokens go to the phase whose clock covered that step, and the
 * clock is a parameter so that tests/test_gen_timing.c can count steps
 * with a fake one. */
#include "gen_spec.h"

#include <string.h>

static double default_clock(void *user) {
    (void)user;
    return sd_now();
}

sd_status sd_gen_spec_run(sd_spec_decoder *dec, const int32_t *prompt, int32_t n_prompt, const sd_gen_spec_params *p,
                          int32_t *ctx, int32_t *ids, sd_gen_spec_result *r) {
    if (!dec || !prompt || n_prompt < 1 || !p || p->n_predict < 1 || p->k < 0 || p->k > SD_MAX_K || !ctx || !ids ||
        !r) {
        SD_ERROR("generate: the speculative loop needs a decoder, a prompt, 1 <= n_predict and 0 <= k <= %d", SD_MAX_K);
        return SD_ERR_INVALID_ARG;
    }
    double (*clock)(void *) = p->clock ? p->clock : default_clock;
    memset(r, 0, sizeof *r);
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    sd_spec_decoder_set_prompt_len(dec, n_prompt);
    double t_prev = clock(p->user);
    while (r->n_ids < p->n_predict) {
        /* the target adds one token to the drafts: leave room for it */
        int32_t left = p->n_predict - r->n_ids - 1;
        int32_t k = p->k < left ? p->k : left;
        int32_t step[SD_MAX_K + 1], n_step = 0;
        sd_tree_shape shape = p->tree;
        shape.depth = k;
        sd_status st =
            p->tree.topk > 0 && k > 0
                ? sd_spec_decoder_step_tree(dec, ctx, n_prompt + r->n_ids, &shape, &p->sampling, step, &n_step, NULL,
                                            NULL)
            : p->adaptive_k
                ? sd_spec_decoder_step_adaptive(dec, ctx, n_prompt + r->n_ids, k, &p->sampling, step, &n_step, &k)
                : sd_spec_decoder_step(dec, ctx, n_prompt + r->n_ids, k, &p->sampling, step, &n_step, NULL, NULL);
        if (st != SD_OK) return st;
        double t_now = clock(p->user);
        int32_t used = 0;
        for (int32_t i = 0; i < n_step && r->n_ids < p->n_predict && !r->ended; i++) {
            int32_t next = step[i];
            ctx[n_prompt + r->n_ids] = next;
            ids[r->n_ids++] = next;
            used++;
            if (p->on_token) p->on_token(p->user, next);
            if (p->is_end && p->is_end(p->user, next)) r->ended = true;
        }
        if (r->n_steps == 0) {
            r->prompt_s = t_now - t_prev;
            r->prompt_step_tokens = used;
        } else {
            r->decode_s += t_now - t_prev;
            r->decode_tokens += used;
            r->decode_steps++;
        }
        r->k_sum += k;
        r->n_steps++;
        t_prev = t_now;
        if (r->ended) break;
    }
    return SD_OK;
}

double sd_gen_spec_decode_tok_s(const sd_gen_spec_result *r) {
    return r && r->decode_s > 0 ? r->decode_tokens / r->decode_s : 0.0;
}
