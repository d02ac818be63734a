/* greedy_util.c — the prompt set and the plain / speculative greedy loops
 * that test_spec_demo and test_cuda_model compare (see greedy_util.h). The
 * speculative loop runs sd_spec_decoder_step until n_new tokens are
 * committed; a context buffer with room for one more step's K + 1 tokens
 * keeps the last step from overflowing. */
#include "greedy_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prompts.h"
#include "specd/spec_decode.h"

int greedy_read_prompts(const char *source_dir, char **prompts, int max) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tests/data/spec_prompts.txt", source_dir) >= sizeof path) return -1;
    return sd_bench_read_prompts(path, prompts, max);
}

int greedy_plain(sd_model *m, const int32_t *prompt, int32_t n_prompt, int32_t n_new, int32_t max_ctx, int32_t *out) {
    if (n_prompt < 1 || n_new < 1 || n_prompt + n_new > max_ctx) return -1;
    sd_kv *kv = NULL;
    int32_t n_vocab = sd_model_config_of(m)->n_vocab;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int32_t *pos = malloc((size_t)n_prompt * sizeof *pos), *seq = calloc((size_t)n_prompt, sizeof *seq);
    bool *want = calloc((size_t)n_prompt, sizeof *want);
    int rc = -1;
    if (!logits || !pos || !seq || !want || sd_model_kv_create(m, 1, max_ctx / 16 + 2, 16, &kv) != SD_OK) goto out;
    for (int32_t i = 0; i < n_prompt; i++) pos[i] = i;
    want[n_prompt - 1] = true;
    sd_batch b = {n_prompt, prompt, pos, seq, want};
    if (sd_model_forward(m, kv, &b, logits) != SD_OK) goto out;
    for (int32_t i = 0; i < n_new; i++) {
        out[i] = sd_argmax(logits, n_vocab);
        if (i + 1 == n_new) break;
        int32_t p = n_prompt + i, s0 = 0;
        bool one = true;
        sd_batch step = {1, &out[i], &p, &s0, &one};
        if (sd_model_forward(m, kv, &step, logits) != SD_OK) goto out;
    }
    rc = 0;
out:
    sd_kv_free(&kv);
    free(logits);
    free(pos);
    free(seq);
    free(want);
    return rc;
}

int greedy_spec(sd_model *m, sd_drafter *d, int32_t k, const int32_t *prompt, int32_t n_prompt, int32_t n_new,
                int32_t max_ctx, int32_t *out, long *drafted, long *accepted) {
    if (n_prompt < 1 || n_new < 1 || n_prompt + n_new > max_ctx) return -1;
    sd_spec_decoder *dec = NULL;
    int32_t *ctx = malloc(((size_t)max_ctx + SD_MAX_K + 1) * sizeof *ctx);
    if (!ctx || sd_spec_decoder_create(m, d, max_ctx, &dec) != SD_OK) {
        free(ctx);
        return -1;
    }
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    int32_t n = n_prompt;
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.0f;
    int rc = 0;
    while (n < n_prompt + n_new) {
        int32_t step[SD_MAX_K + 1], n_step, nd, na;
        if (sd_spec_decoder_step(dec, ctx, n, k, &s, step, &n_step, &nd, &na) != SD_OK) {
            rc = -1;
            break;
        }
        memcpy(ctx + n, step, (size_t)n_step * sizeof *step);
        n += n_step;
        if (drafted) *drafted += nd;
        if (accepted) *accepted += na;
    }
    memcpy(out, ctx + n_prompt, (size_t)n_new * sizeof *out);
    sd_spec_decoder_free(&dec);
    free(ctx);
    return rc;
}
