/* test_ngram_copy.c — the n-gram drafter on copy-heavy prompts
 * (bench/prompts/copy_heavy.txt: repeat, summarize with quotes, reformat a
 * list, edit code) with the demo model (SmolLM2-135M-Instruct), greedy.
 *
 * Usage: test_ngram_copy N_TOKENS [N_PROMPTS [equal-only]]
 * For every prompt (chat-wrapped) it decodes N_TOKENS + 8 tokens plainly
 * (one forward per token; the last 8 only for the replay), then for each K
 * in {2, 4, 8}, over the prompts in order with a new drafter (whose cache
 * shared across requests learns from the earlier prompts' outputs):
 *   - decodes speculatively with the n-gram drafter (sd_spec_decoder) and
 *     fails unless the first N_TOKENS equal plain decoding;
 *   - replays the same steps without the model for the drafter in the
 *     engine and for the previous drafter (BASELINE below: the single
 *     longest-then-most-recent lookup of n-grams 1..4 that specd had before,
 *     drafting K tokens whenever anything matched): with greedy decoding a
 *     step accepts the longest prefix of the draft that equals the plain
 *     output, then commits one more token, so the replay gives exactly the
 *     steps a speculative run takes. The replay of the engine's drafter must
 *     count exactly the drafted and accepted tokens of the real run (which
 *     checks the replay itself).
 * It fails when, summed over the prompts, the engine's drafter has a lower
 * acceptance rate (accepted / drafted) or fewer committed tokens per target
 * step than the baseline at any K (not with "equal-only": the quick run
 * under ASan is too short for the shared cache to have learnt anything, so
 * it checks equality and the replay only). Prints one line per (prompt, K)
 * and the totals. Skips (77) without the demo model. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

#include "bench_prompts.h"
#include "greedy_util.h"

#define MAX_PROMPTS 32
#define MAX_TOKENS  256
#define MAX_CTX     1024
#define N_K         3
#define K_MAX       8
static const int32_t ks[N_K] = {2, 4, K_MAX};

typedef struct run_stats {
    long steps, drafted, accepted;
} run_stats;

/* The previous n-gram drafter, kept here as the baseline: for n from 4
 * down to 1 the most recent earlier occurrence of the last n tokens, and up
 * to k of the tokens that followed it (never past the context's end). */
static int32_t baseline_propose(const int32_t *ctx, int32_t n_ctx, int32_t k, int32_t *draft) {
    int32_t n_max = 4 < n_ctx - 1 ? 4 : n_ctx - 1;
    for (int32_t n = n_max; n >= 1; n--) {
        const int32_t *suffix = ctx + n_ctx - n;
        for (int32_t j = n_ctx - n - 1; j >= 0; j--) {
            if (memcmp(ctx + j, suffix, (size_t)n * sizeof *ctx) != 0) continue;
            int32_t avail = n_ctx - (j + n), m = avail < k ? avail : k;
            memcpy(draft, ctx + j + n, (size_t)m * sizeof *draft);
            return m;
        }
    }
    return 0;
}

/* Replays greedy speculative decoding of n_new tokens whose plain output is
 * full[0..n_new + K_MAX) after prompt; d == NULL replays the
 * baseline. */
static int replay(sd_drafter *d, int32_t k, const int32_t *prompt, int32_t n_prompt, const int32_t *full, int32_t n_new,
                  run_stats *rs) {
    static int32_t ctx[MAX_CTX + SD_MAX_K + 1];
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    memcpy(ctx + n_prompt, full, (size_t)(n_new + K_MAX) * sizeof *ctx);
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.0f;
    int32_t i = 0;
    while (i < n_new) {
        int32_t draft[SD_MAX_K], nd = 0;
        sd_spec_q q[SD_MAX_K];
        if (d) {
            if (sd_drafter_propose(d, 0, ctx, n_prompt + i, k, &s, draft, q, &nd) != SD_OK) return -1;
        } else {
            nd = baseline_propose(ctx, n_prompt + i, k, draft);
        }
        int32_t acc = 0;
        while (acc < nd && draft[acc] == full[i + acc]) acc++;
        rs->steps++;
        rs->drafted += nd;
        rs->accepted += acc;
        i += acc + 1;
    }
    return 0;
}

static char *model_path(void) {
    const char *env = getenv("SPECD_MODEL");
    if (env && *env) return strdup(env);
    FILE *p = popen(SPECD_SOURCE_DIR "/tools/fetch-model 2>/dev/null", "r");
    if (!p) return NULL;
    char buf[4096];
    char *res = fgets(buf, sizeof buf, p) ? strdup(buf) : NULL;
    if (pclose(p) != 0) {
        free(res);
        return NULL;
    }
    if (res) res[strcspn(res, "\n")] = '\0';
    return res;
}

static double rate(long num, long den) { return den ? (double)num / (double)den : 0.0; }

int main(int argc, char **argv) {
    int32_t n_new = argc > 1 ? atoi(argv[1]) : 0;
    int n_prompts = argc > 2 ? atoi(argv[2]) : MAX_PROMPTS;
    bool compare = !(argc > 3 && strcmp(argv[3], "equal-only") == 0);
    if (argc < 2 || n_new < 1 || n_new > MAX_TOKENS || n_prompts < 1 || n_prompts > MAX_PROMPTS) {
        fprintf(stderr, "usage: test_ngram_copy N_TOKENS [N_PROMPTS [equal-only]]\n");
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test");
    char *path = model_path();
    if (!path || access(path, R_OK) != 0) {
        printf("skipped: demo model not available (set SPECD_MODEL or run tools/fetch-model)\n");
        free(path);
        return 77;
    }
    char *prompts[MAX_PROMPTS];
    int got = sd_bench_read_prompts(SPECD_SOURCE_DIR "/bench/prompts/copy_heavy.txt", prompts, n_prompts);
    if (got < 1 || (n_prompts < MAX_PROMPTS && got != n_prompts)) {
        fprintf(stderr, "FAIL: read %d prompts from bench/prompts/copy_heavy.txt (asked for %d)\n", got, n_prompts);
        for (int i = 0; i < got; i++) free(prompts[i]);
        free(path);
        return 1;
    }
    int fail = 1;
    sd_gguf *g = NULL;
    sd_tok *tok = NULL;
    sd_model *m = NULL;
    char err[256];
    static int32_t *ids[MAX_PROMPTS], n_prompt[MAX_PROMPTS];
    static int32_t plain[MAX_PROMPTS][MAX_TOKENS + K_MAX], spec[MAX_TOKENS + K_MAX];
    run_stats old_tot[N_K] = {0}, new_tot[N_K] = {0};
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK || sd_tok_from_gguf(g, &tok) != SD_OK ||
        sd_model_load(g, &mp, &m) != SD_OK) {
        fprintf(stderr, "FAIL: cannot load %s\n", path);
        goto out;
    }
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = MAX_CTX + SD_MAX_K + 1;
    /* Every prompt's plain output first. */
    for (int p = 0; p < got; p++) {
        char *text = NULL;
        sd_chat_msg msg = {"user", prompts[p]};
        size_t n_ids = 0;
        if (sd_tok_chat_format(&msg, 1, NULL, true, &text) != SD_OK ||
            sd_tok_encode(tok, text, strlen(text), true, &ids[p], &n_ids) != SD_OK ||
            n_ids + (size_t)n_new + 2 * K_MAX > MAX_CTX) {
            fprintf(stderr, "FAIL: cannot encode prompt %d (or it is too long)\n", p);
            free(text);
            goto out;
        }
        free(text);
        n_prompt[p] = (int32_t)n_ids;
        if (greedy_plain(m, ids[p], n_prompt[p], n_new + K_MAX, MAX_CTX, plain[p]) != 0) {
            fprintf(stderr, "FAIL: plain decoding of prompt %d\n", p);
            goto out;
        }
    }
    /* Then each K over the prompts in order, with a new drafter for the
     * speculative runs and an identical one for the replays: the shared
     * cache holds what the earlier prompts' outputs taught it, the same in
     * both. */
    printf("%-3s %-2s  %-24s  %-24s\n", "p", "K", "baseline acc  tok/step", "ngram acc  tok/step");
    for (int ki = 0; ki < N_K; ki++) {
        int32_t k = ks[ki];
        sd_drafter *d = NULL, *d_replay = NULL;
        if (sd_drafter_ngram_create(&dp, &d) != SD_OK || sd_drafter_ngram_create(&dp, &d_replay) != SD_OK) {
            sd_drafter_free(&d);
            goto out;
        }
        bool ok = true;
        for (int p = 0; p < got && ok; p++) {
            long drafted = 0, accepted = 0;
            run_stats o = {0}, n = {0};
            sd_drafter_release(d, 0);
            sd_drafter_release(d_replay, 0);
            ok = false;
            if (greedy_spec(m, d, k, ids[p], n_prompt[p], n_new, MAX_CTX, spec, &drafted, &accepted) != 0) {
                fprintf(stderr, "FAIL: speculative decoding of prompt %d at K %d\n", p, (int)k);
            } else if (memcmp(spec, plain[p], (size_t)n_new * sizeof *spec) != 0) {
                int32_t i = 0;
                while (spec[i] == plain[p][i]) i++;
                fprintf(stderr, "FAIL: prompt %d, K %d: token %d is %d, plain greedy gives %d\n", p, (int)k, (int)i,
                        (int)spec[i], (int)plain[p][i]);
            } else if (replay(NULL, k, ids[p], n_prompt[p], plain[p], n_new, &o) != 0 ||
                       replay(d_replay, k, ids[p], n_prompt[p], plain[p], n_new, &n) != 0) {
                fprintf(stderr, "FAIL: replay of prompt %d at K %d\n", p, (int)k);
            } else if (n.drafted != drafted || n.accepted != accepted) {
                fprintf(stderr,
                        "FAIL: prompt %d, K %d: the replay drafted %ld and accepted %ld, the speculative "
                        "run %ld and %ld\n",
                        p, (int)k, n.drafted, n.accepted, drafted, accepted);
            } else {
                ok = true;
            }
            if (!ok) break;
            printf("%-3d %-2d  %5.3f (%4ld/%4ld) %5.2f  %5.3f (%4ld/%4ld) %5.2f\n", p, (int)k,
                   rate(o.accepted, o.drafted), o.accepted, o.drafted, rate(n_new, o.steps),
                   rate(n.accepted, n.drafted), n.accepted, n.drafted, rate(n_new, n.steps));
            old_tot[ki].steps += o.steps;
            old_tot[ki].drafted += o.drafted;
            old_tot[ki].accepted += o.accepted;
            new_tot[ki].steps += n.steps;
            new_tot[ki].drafted += n.drafted;
            new_tot[ki].accepted += n.accepted;
        }
        sd_drafter_free(&d);
        sd_drafter_free(&d_replay);
        if (!ok) goto out;
    }
    fail = 0;
    long total = (long)got * n_new;
    for (int ki = 0; ki < N_K; ki++) {
        const run_stats *o = &old_tot[ki], *n = &new_tot[ki];
        double oa = rate(o->accepted, o->drafted), na = rate(n->accepted, n->drafted);
        double ot = rate(total, o->steps), nt = rate(total, n->steps);
        printf("K %d: baseline acceptance %.3f, %.3f tokens/step; ngram acceptance %.3f, %.3f tokens/step\n",
               (int)ks[ki], oa, ot, na, nt);
        if (compare && (na < oa || nt < ot)) {
            fprintf(stderr, "FAIL: at K %d the n-gram drafter falls below the baseline\n", (int)ks[ki]);
            fail = 1;
        }
    }
    if (!fail)
        printf("OK: %d prompts x %d tokens at K 2, 4, 8 equal plain greedy output%s\n", got, (int)n_new,
               compare ? "; the n-gram drafter is at least the baseline" : "");
out:
    for (int i = 0; i < got; i++) free(ids[i]);
    sd_model_free(&m);
    sd_tok_free(&tok);
    sd_gguf_close(&g);
    for (int i = 0; i < got; i++) free(prompts[i]);
    free(path);
    return fail;
}
