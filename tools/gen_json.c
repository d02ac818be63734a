/* gen_json.c — specd-generate's --json report (moved out of
 * specd-generate.c, which was at the 800-line limit). */
#include "gen_result.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/common.h"
#include "specd/spec.h"

/* Measured acceptance rate and the i.i.d. expectation of tokens per step at
 * that rate with the mean draft length actually proposed. */
void gen_spec_summary(const gen_result *r, double *rate, double *per_step, double *expected) {
    const sd_spec_stats *ss = &r->spec_stats;
    *rate = ss->drafted ? (double)ss->accepted / (double)ss->drafted : 0;
    *per_step = ss->steps ? (double)ss->committed / (double)ss->steps : 0;
    double mean_drafted = ss->steps ? (double)ss->drafted / (double)ss->steps : 0;
    *expected = sd_spec_expected_tokens(*rate, (int32_t)(mean_drafted + 0.5));
}

static cJSON *ids_array(const int32_t *ids, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* A string member that is valid JSON whatever the bytes (sd_json_quote):
 * byte-level tokens can decode to invalid UTF-8, which cJSON writes as is. */
static void add_text(cJSON *obj, const char *name, const char *s, size_t len) {
    char *quoted = sd_json_quote(s, len);
    if (quoted) cJSON_AddRawToObject(obj, name, quoted);
    free(quoted);
}

int gen_print_json(const char *model_path, const sd_tok *tok, const char *prompt_text, const gen_result *r) {
    char *text = NULL;
    size_t text_len = 0;
    /* Leave an end-of-generation token out of the text, as the stream does. */
    size_t n_text = r->n_ids;
    if (!strcmp(r->stop_reason, "eos")) n_text--;
    if (sd_tok_decode(tok, r->ids, n_text, &text, &text_len) != SD_OK) return 1;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model_path);
    add_text(root, "prompt", prompt_text, strlen(prompt_text));
    cJSON_AddItemToObject(root, "prompt_ids", ids_array(r->prompt_ids, r->n_prompt));
    cJSON_AddItemToObject(root, "ids", ids_array(r->ids, r->n_ids));
    add_text(root, "text", text, text_len);
    cJSON_AddStringToObject(root, "stop_reason", r->stop_reason);
    if (r->logprobs) {
        cJSON *lps = cJSON_AddArrayToObject(root, "logprobs");
        for (size_t i = 0; i < r->n_ids; i++) {
            const sd_token_logprob *lp = &r->logprobs[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "id", r->ids[i]);
            cJSON_AddNumberToObject(e, "logprob", lp->logprob);
            cJSON *top = cJSON_AddArrayToObject(e, "top");
            for (int32_t j = 0; j < lp->n_top; j++) {
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(lp->top_ids[j]));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(lp->top_logprobs[j]));
                cJSON_AddItemToArray(top, pair);
            }
            cJSON_AddItemToArray(lps, e);
        }
    }
    cJSON *t = cJSON_AddObjectToObject(root, "timings");
    cJSON_AddNumberToObject(t, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(t, "prompt_ms", r->prompt_s * 1e3);
    cJSON_AddNumberToObject(t, "prompt_tok_s", r->prompt_s > 0 ? (double)r->n_prompt / r->prompt_s : 0);
    /* Decode figures count the tokens of the steps decode_ms times: plain, all
     * but the prefill's token; speculative, all but the first step's. */
    double steps = (double)r->decode_tokens;
    cJSON_AddNumberToObject(t, "generated_tokens", (double)r->n_ids);
    cJSON_AddNumberToObject(t, "decode_tokens", steps);
    cJSON_AddNumberToObject(t, "decode_ms", r->decode_s * 1e3);
    cJSON_AddNumberToObject(t, "decode_tok_s", r->decode_s > 0 ? steps / r->decode_s : 0);
    if (r->spec) {
        double rate, per_step, expected;
        gen_spec_summary(r, &rate, &per_step, &expected);
        cJSON *sp = cJSON_AddObjectToObject(root, "spec");
        cJSON_AddNumberToObject(sp, "target_steps", (double)r->spec_stats.steps);
        cJSON_AddNumberToObject(sp, "drafted", (double)r->spec_stats.drafted);
        cJSON_AddNumberToObject(sp, "accepted", (double)r->spec_stats.accepted);
        cJSON_AddNumberToObject(sp, "acceptance_rate", rate);
        cJSON_AddNumberToObject(sp, "tokens_per_step", per_step);
        cJSON_AddNumberToObject(sp, "expected_tokens_per_step", expected);
        cJSON_AddNumberToObject(sp, "mean_k", r->mean_k);
        cJSON_AddNumberToObject(sp, "draft_ms", r->spec_stats.draft_s * 1e3);
        cJSON_AddNumberToObject(sp, "target_ms", r->spec_stats.target_s * 1e3);
        /* per draft position: [drafted, reached, accepted] (sd_spec_stats) */
        cJSON *pos = cJSON_AddArrayToObject(sp, "per_position");
        for (int i = 0; pos && i < SD_MAX_K && r->spec_stats.drafted_at[i]; i++) {
            cJSON *e = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)r->spec_stats.drafted_at[i]));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)r->spec_stats.reached_at[i]));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)r->spec_stats.accepted_at[i]));
            cJSON_AddItemToArray(pos, e);
        }
        if (r->adaptive) { /* what the adaptive policy ended with (specd/spec_adapt.h) */
            cJSON *po = cJSON_AddObjectToObject(sp, "policy");
            cJSON_AddNumberToObject(po, "verify_fixed_us", r->cost.verify_fixed_us);
            cJSON_AddNumberToObject(po, "verify_token_us", r->cost.verify_token_us);
            cJSON_AddNumberToObject(po, "draft_token_us", r->cost.draft_token_us);
            cJSON_AddNumberToObject(po, "draft_fixed_us", r->cost.draft_fixed_us);
            cJSON_AddNumberToObject(po, "alpha", r->adapt.alpha);
        }
    }
    if (r->constrained) {
        cJSON *c = cJSON_AddObjectToObject(root, "constraint");
        cJSON_AddNumberToObject(c, "masks", (double)r->masks);
        cJSON_AddNumberToObject(c, "mask_cache_hits", (double)r->mask_hits);
        cJSON_AddNumberToObject(c, "mask_p50_us", r->mask_p50_us);
        cJSON_AddNumberToObject(c, "mask_mean_us", r->mask_mean_us);
        cJSON_AddNumberToObject(c, "mask_p99_us", r->mask_p99_us);
        cJSON_AddNumberToObject(c, "mask_max_us", r->mask_max_us);
        cJSON_AddNumberToObject(c, "forced_drafted", (double)r->forced_drafted);
    }
    char *out = cJSON_PrintUnformatted(root);
    int rc = out ? 0 : 1;
    if (out) puts(out);
    free(out);
    cJSON_Delete(root);
    free(text);
    return rc;
}
