/* bench_spec.c — `specd-bench spec`: plain decoding vs speculative decoding
 * (n-gram, self-draft, optional draft GGUF; K in {2, 4, 8} and adaptive) on
 * the committed prompt sets in bench/prompts/, side by side in one run.
 *
 * Every prompt is chat-formatted and run by every method in turn
 * (interleaved: machine noise hits all methods alike), greedy, for a fixed
 * number of new tokens; the prefill step (the first token) is not timed, so
 * the figure is decode tokens/s. Per method and prompt set: the median over
 * prompts of tokens/s, its ratio to plain decoding's median, acceptance
 * (accepted / drafted over the set) and tokens per target step.
 *
 * Each n-gram method has a drafter of its own, whose cache shared across
 * requests learns from the earlier prompts' outputs only: one drafter for
 * all methods would have fed each prompt's output to the methods that run
 * it after the first, crediting them with a copy of their own answer.
 *
 * Hygiene (bench_hygiene.h): each run is sampled for the CPU time other
 * processes used meanwhile; a prompt on which any method's run saw more
 * than --max-other-load cores is left out of every method's median (the
 * methods stay paired on the same prompts), and the table gives each
 * method's foreign load (median / max) and its runs over the limit.
 *
 * Adaptive K is the policy shared with the coordinator and specd-generate
 * (specd/spec_adapt.h through sd_spec_decoder_step_adaptive): K in 0..8 per
 * step from the sequence's acceptance and the decoder's own timings of the
 * drafter and the target, shadow drafts at K = 0. The extra cost of one
 * more verified token relative to a one-token step is still measured at
 * start-up and printed (c_verify).
 *
 * With --draft, the proposal top-N is measured twice: by sampling (4/16/64,
 * temperature 1, K = 4: acceptance and bytes per drafted token in a message,
 * n_q * 8 for an id and a probability per entry), and by exact acceptance
 * (1/4/16/64/256 and the dense q, at temperature 1 and at 0.7 with top-p
 * 0.9, on every prompt). The sampled figure rests on a few hundred drafted
 * tokens of one seeded continuation per prompt, so its sampling error (a
 * few points) is as large as the differences between N; the exact one has
 * no sampling error in the acceptance itself. */
#include "bench_spec.h"
#include "bench_hygiene.h"
#include "bench_stats.h"

#include "bench_prompts.h"

#include <getopt.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/spec.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

#define MAX_PROMPTS 64
#define MAX_SETS    8
#define MAX_METHODS 16
#define MAX_CTX     2048
#define ADAPTIVE    (-1)

typedef struct method {
    char name[32];
    int drafter;     /* index into drafters, -1 = plain */
    int k;           /* ADAPTIVE or a fixed K */
    sd_drafter *own; /* n-gram methods: a drafter of their own (its cache shared across requests must see only
                        the earlier prompts' outputs, not this prompt's from another method) */
    double tps[MAX_PROMPTS];
    double other[MAX_PROMPTS]; /* foreign CPU load during each run, cores (bench_hygiene.h) */
    long drafted, accepted, steps, tokens;
} method;

static double median_of(const double *v, int n) {
    double tmp[MAX_PROMPTS];
    memcpy(tmp, v, (size_t)n * sizeof *v);
    return sd_bench_median(tmp, n);
}

static double max_of(const double *v, int n) {
    double m = n > 0 ? v[0] : 0;
    for (int i = 1; i < n; i++)
        if (v[i] > m) m = v[i];
    return m;
}

/* Median of v over the prompts marked in keep. */
static double median_kept(const double *v, const bool *keep, int n) {
    double tmp[MAX_PROMPTS];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (keep[i]) tmp[m++] = v[i];
    return sd_bench_median(tmp, m);
}

/* Extra cost of one more token in a verification call, relative to a
 * one-token call: (t(1 + 8) - t(1)) / (8 t(1)), medians of 5. */
static double calibrate_verify_cost(sd_model *m, double *t1_out) {
    sd_kv *kv = NULL;
    if (sd_model_kv_create(m, 1, 64, 16, &kv) != SD_OK) return 0.05;
    int32_t n_vocab = sd_model_config_of(m)->n_vocab;
    float *logits = malloc((size_t)9 * (size_t)n_vocab * sizeof *logits);
    int32_t tok[64], pos[64], seq[64] = {0};
    bool want[64];
    for (int i = 0; i < 64; i++) {
        tok[i] = (i * 37 + 11) % n_vocab;
        pos[i] = i;
        want[i] = false;
    }
    sd_batch pre = {32, tok, pos, seq, want};
    double t1[5], t9[5];
    if (!logits || sd_model_forward(m, kv, &pre, NULL) != SD_OK) {
        free(logits);
        sd_kv_free(&kv);
        return 0.05;
    }
    for (int r = 0; r < 5; r++) {
        for (int n = 1; n <= 9; n += 8) {
            for (int i = 0; i < n; i++) want[32 + i] = true;
            sd_batch b = {n, tok + 32, pos + 32, seq, want + 32};
            double t0 = sd_now();
            sd_status st = sd_model_forward(m, kv, &b, logits);
            double dt = sd_now() - t0;
            sd_kv_truncate(kv, 0, 32);
            if (st != SD_OK) dt = 0;
            if (n == 1)
                t1[r] = dt;
            else
                t9[r] = dt;
        }
    }
    double a = median_of(t1, 5), b = median_of(t9, 5);
    free(logits);
    sd_kv_free(&kv);
    *t1_out = a;
    double c = a > 0 ? (b - a) / (8.0 * a) : 0.05;
    return c > 0 ? c : 0.0;
}

/* Generates n_new tokens after ids; returns decode seconds (first step untimed). */
static int run_one(sd_model *m, sd_drafter *d, int k_fixed, double c_verify, const int32_t *ids, int32_t n_ids,
                   int32_t n_new, const sd_sampling *s, method *meth, double *seconds, long *q_entries) {
    sd_spec_decoder *dec = NULL;
    if (sd_spec_decoder_create(m, d, MAX_CTX, &dec) != SD_OK) return -1;
    int32_t *ctx = malloc((size_t)(MAX_CTX + 80) * sizeof *ctx);
    if (!ctx) {
        sd_spec_decoder_free(&dec);
        return -1;
    }
    memcpy(ctx, ids, (size_t)n_ids * sizeof *ctx);
    int32_t n = n_ids;
    int32_t step[SD_MAX_K + 1], n_step, nd = 0, na = 0;
    /* prefill + first token, untimed */
    if (sd_spec_decoder_step(dec, ctx, n, 0, s, step, &n_step, NULL, NULL) != SD_OK) goto fail;
    ctx[n++] = step[0];
    double t0 = sd_now();
    long steps = 0, drafted = 0, accepted = 0;
    while (n < n_ids + n_new) {
        const sd_spec_stats *st0 = sd_spec_decoder_stats(dec);
        long d0 = (long)st0->drafted, a0 = (long)st0->accepted;
        sd_status st = d && k_fixed == ADAPTIVE /* the policy shared with the coordinator (spec_adapt.h) */
                           ? sd_spec_decoder_step_adaptive(dec, ctx, n, 8, s, step, &n_step, NULL)
                           : sd_spec_decoder_step(dec, ctx, n, d ? k_fixed : 0, s, step, &n_step, NULL, NULL);
        if (st != SD_OK) goto fail;
        const sd_spec_stats *st1 = sd_spec_decoder_stats(dec);
        nd = (int32_t)((long)st1->drafted - d0);
        na = (int32_t)((long)st1->accepted - a0);
        memcpy(ctx + n, step, (size_t)n_step * sizeof *step);
        n += n_step;
        steps++;
        drafted += nd;
        accepted += na;
        (void)q_entries;
        (void)c_verify;
    }
    *seconds = sd_now() - t0;
    meth->drafted += drafted;
    meth->accepted += accepted;
    meth->steps += steps;
    meth->tokens += n - n_ids - 1;
    free(ctx);
    sd_spec_decoder_free(&dec);
    return n - n_ids - 1;
fail:
    free(ctx);
    sd_spec_decoder_free(&dec);
    return -1;
}

/* Top-N study: stochastic (T = 1, seeded) K = 4 with the draft GGUF at top_n. */
static void top_n_study(FILE *out, sd_model *m, const char *draft_path, uint64_t hash, int32_t n_vocab, int32_t **ids,
                        int32_t *n_ids, int n_prompts, int32_t n_new) {
    const int32_t tops[3] = {4, 16, 64};
    fprintf(out, "\nProposal top-N by sampling (draft GGUF, temperature 1, K = 4, seeded; %d prompts x %d tokens):\n\n",
            n_prompts, (int)n_new);
    fprintf(out,
            "| top-N | acceptance | tokens / step | q bytes per drafted token (mean) |\n| --- | --- | --- | --- |\n");
    for (int t = 0; t < 3; t++) {
        sd_drafter_params dp = sd_drafter_default_params();
        dp.max_ctx = MAX_CTX;
        dp.top_n = tops[t];
        sd_drafter *d = NULL;
        if (sd_drafter_model_open(draft_path, hash, n_vocab, &dp, &d) != SD_OK) return;
        long drafted = 0, accepted = 0, steps = 0, entries = 0;
        for (int p = 0; p < n_prompts; p++) {
            sd_spec_decoder *dec = NULL;
            if (sd_spec_decoder_create(m, d, MAX_CTX, &dec) != SD_OK) break;
            int32_t *ctx = malloc((size_t)(MAX_CTX + 80) * sizeof *ctx);
            if (!ctx) {
                sd_spec_decoder_free(&dec);
                break;
            }
            memcpy(ctx, ids[p], (size_t)n_ids[p] * sizeof *ctx);
            int32_t n = n_ids[p];
            sd_sampling s = sd_sampling_default();
            s.temperature = 1.0f; /* sampled (the default is greedy) */
            s.seed = 100 + (uint64_t)p;
            while (n < n_ids[p] + n_new) {
                int32_t step[SD_MAX_K + 1], n_step, nd = 0, na = 0;
                int32_t drafts[SD_MAX_K];
                sd_spec_q q[SD_MAX_K];
                int32_t nq = 0;
                /* the message size: what the drafter reports for this context */
                if (sd_drafter_propose(d, 0, ctx, n, 4, &s, drafts, q, &nq) == SD_OK)
                    for (int i = 0; i < nq; i++) entries += q[i].n;
                if (sd_spec_decoder_step(dec, ctx, n, 4, &s, step, &n_step, &nd, &na) != SD_OK) break;
                memcpy(ctx + n, step, (size_t)n_step * sizeof *step);
                n += n_step;
                steps++;
                drafted += nd;
                accepted += na;
            }
            free(ctx);
            sd_spec_decoder_free(&dec);
        }
        fprintf(out, "| %d | %.3f | %.2f | %.1f |\n", (int)tops[t], drafted ? (double)accepted / drafted : 0.0,
                steps ? (double)(accepted + steps) / steps : 0.0, drafted ? 8.0 * entries / drafted : 0.0);
        fflush(out);
        sd_drafter_free(&d);
    }
}

/* ---- top-N by exact acceptance ---- */

#define ALPHA_N_TOPS  5
#define ALPHA_MAX_TOP 256
static const int32_t alpha_tops[ALPHA_N_TOPS] = {1, 4, 16, 64, ALPHA_MAX_TOP};

typedef struct alpha_sums {
    double alpha[ALPHA_N_TOPS + 1]; /* summed per-position acceptance; last entry: q not sparsified */
    double entries[ALPHA_N_TOPS];   /* summed entries of the sparse q */
    long positions;
} alpha_sums;

/* The target samples n_new tokens after ids (plain decoding with s, keeping
 * each step's logits: p_1..p_n); the draft model then reads the same tokens
 * in one call, giving q at the same positions. At each position the exact
 * acceptance of a proposal, sum_v min(p(v), q_N(v)) (sd_spec_alpha), is
 * added for every top-N and for the dense q. Returns false on an engine
 * error. */
static bool alpha_one(sd_model *target, sd_model *draft, const int32_t *ids, int32_t n_ids, int32_t n_new,
                      const sd_sampling *s, alpha_sums *sum) {
    int32_t V = sd_model_config_of(target)->n_vocab, L = n_ids + n_new;
    sd_kv *kv_t = NULL, *kv_d = NULL;
    float *p_logits = malloc((size_t)n_new * (size_t)V * sizeof *p_logits); /* [n_new][V] */
    float *q_logits = malloc((size_t)n_new * (size_t)V * sizeof *q_logits); /* [n_new][V] */
    float *p = malloc((size_t)V * sizeof *p), *q = malloc((size_t)V * sizeof *q);
    float *q_probs = malloc(ALPHA_MAX_TOP * sizeof *q_probs);
    int32_t *seq_tokens = malloc((size_t)L * sizeof *seq_tokens), *pos = malloc((size_t)L * sizeof *pos);
    int32_t *slot = calloc((size_t)L, sizeof *slot), *q_ids = malloc(ALPHA_MAX_TOP * sizeof *q_ids);
    bool *want = calloc((size_t)L, sizeof *want);
    bool ok = false;
    if (!p_logits || !q_logits || !p || !q || !q_probs || !seq_tokens || !pos || !slot || !q_ids || !want) goto out;
    if (sd_model_kv_create(target, 1, L / 16 + 2, 16, &kv_t) != SD_OK ||
        sd_model_kv_create(draft, 1, L / 16 + 2, 16, &kv_d) != SD_OK)
        goto out;
    memcpy(seq_tokens, ids, (size_t)n_ids * sizeof *seq_tokens);
    for (int32_t i = 0; i < L; i++) pos[i] = i;
    /* target: the prompt, then one token at a time; row i of p_logits
     * predicts the token at position n_ids + i */
    want[n_ids - 1] = true;
    sd_batch prompt = {n_ids, seq_tokens, pos, slot, want};
    if (sd_model_forward(target, kv_t, &prompt, p_logits) != SD_OK) goto out;
    want[n_ids - 1] = false;
    for (int32_t i = 0; i < n_new; i++) {
        const float *row = p_logits + (size_t)i * (size_t)V;
        if (sd_sample_token(row, V, s, (uint64_t)(n_ids + i), &seq_tokens[n_ids + i]) != SD_OK) goto out;
        if (i + 1 == n_new) break;
        bool one = true;
        sd_batch step = {1, &seq_tokens[n_ids + i], &pos[n_ids + i], slot, &one};
        if (sd_model_forward(target, kv_t, &step, p_logits + (size_t)(i + 1) * (size_t)V) != SD_OK) goto out;
    }
    /* draft: every token but the last in one call, the last n_new rows wanted */
    for (int32_t i = n_ids - 1; i < L - 1; i++) want[i] = true;
    sd_batch all = {L - 1, seq_tokens, pos, slot, want};
    if (sd_model_forward(draft, kv_d, &all, q_logits) != SD_OK) goto out;
    for (int32_t i = 0; i < n_new; i++) {
        if (sd_sample_probs(p_logits + (size_t)i * (size_t)V, V, s, p) != SD_OK ||
            sd_sample_probs(q_logits + (size_t)i * (size_t)V, V, s, q) != SD_OK)
            goto out;
        double dense = 0;
        for (int32_t v = 0; v < V; v++) dense += p[v] < q[v] ? p[v] : q[v];
        sum->alpha[ALPHA_N_TOPS] += dense;
        for (int t = 0; t < ALPHA_N_TOPS; t++) {
            int32_t n_q = 0;
            if (sd_spec_sparsify(q, V, alpha_tops[t], q_ids, q_probs, &n_q) != SD_OK) goto out;
            sd_spec_q sparse = {n_q, q_ids, q_probs};
            sum->alpha[t] += sd_spec_alpha(p, V, &sparse);
            sum->entries[t] += n_q;
        }
        sum->positions++;
    }
    ok = true;
out:
    sd_kv_free(&kv_t);
    sd_kv_free(&kv_d);
    free(p_logits);
    free(q_logits);
    free(p);
    free(q);
    free(q_probs);
    free(q_ids);
    free(seq_tokens);
    free(pos);
    free(slot);
    free(want);
    return ok;
}

/* Top-N by exact acceptance: no sampling noise in the acceptance itself
 * (only in which continuation is scored), so top-N values can be told apart
 * on a few thousand positions where a sampled study needs far more. Two
 * sampling settings (temperature 1; temperature 0.7 with top-p 0.9), every
 * prompt of the run. Greedy is left out: there only the argmax of q counts. */
static void top_n_alpha_study(FILE *out, sd_model *target, const char *draft_path, int32_t **ids, const int32_t *n_ids,
                              int n_prompts, int32_t n_new, int32_t n_threads) {
    sd_gguf *g = NULL;
    sd_model *draft = NULL;
    char err[256];
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = n_threads;
    if (sd_gguf_open(draft_path, &g, err, sizeof err) != SD_OK || sd_model_load(g, &mp, &draft) != SD_OK) {
        fprintf(stderr, "specd-bench: top-N study: cannot load %s\n", draft_path);
        sd_gguf_close(&g);
        return;
    }
    sd_gguf_close(&g);
    sd_sampling settings[2] = {sd_sampling_default(), sd_sampling_default()};
    settings[0].temperature = 1.0f;
    settings[1].temperature = 0.7f;
    settings[1].top_p = 0.9f;
    alpha_sums sums[2];
    memset(sums, 0, sizeof sums);
    for (int si = 0; si < 2; si++)
        for (int p = 0; p < n_prompts; p++) {
            settings[si].seed = 300 + (uint64_t)p;
            if (!alpha_one(target, draft, ids[p], n_ids[p], n_new, &settings[si], &sums[si])) {
                fprintf(stderr, "specd-bench: top-N study failed on prompt %d\n", p);
                sd_model_free(&draft);
                return;
            }
        }
    fprintf(out,
            "\nProposal top-N by exact acceptance (draft GGUF; for each of %d prompts the target samples "
            "%d tokens, and at each of those positions the acceptance of a proposal, sum_v min(p(v), "
            "q_N(v)), is computed exactly; %ld and %ld positions):\n\n",
            n_prompts, (int)n_new, sums[0].positions, sums[1].positions);
    fprintf(out, "| top-N | acceptance, T = 1 | q bytes / drafted token | acceptance, T = 0.7 top-p 0.9 "
                 "| q bytes / drafted token |\n| --- | --- | --- | --- | --- |\n");
    for (int t = 0; t < ALPHA_N_TOPS; t++)
        fprintf(out, "| %d | %.4f | %.1f | %.4f | %.1f |\n", (int)alpha_tops[t],
                sums[0].alpha[t] / (double)sums[0].positions, 8.0 * sums[0].entries[t] / (double)sums[0].positions,
                sums[1].alpha[t] / (double)sums[1].positions, 8.0 * sums[1].entries[t] / (double)sums[1].positions);
    fprintf(out, "| all (dense q) | %.4f | — | %.4f | — |\n", sums[0].alpha[ALPHA_N_TOPS] / (double)sums[0].positions,
            sums[1].alpha[ALPHA_N_TOPS] / (double)sums[1].positions);
    fflush(out);
    sd_model_free(&draft);
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd-bench spec -m TARGET [--draft FILE] [--draft-layers L] [--prompts FILE]...\n"
               "                        [--tokens N] [--max-prompts N] [-t THREADS] [--max-other-load CORES]\n"
               "                        [-o OUT.md]\n"
               "  default prompts: bench/prompts/*.txt; default --tokens 48, --draft-layers 8\n"
               "  a prompt whose run of any method saw other processes use more than CORES (default 0.25)\n"
               "  is left out of the medians (all prompts are kept if none is clean)\n");
}

/* The table of one prompt set: each method's median tokens/s over the
 * prompts whose runs all stayed under the hygiene limit (all of them,
 * marked unreliable, when none did), acceptance and tokens per step. */
static void write_set_table(FILE *out, const char *set, int np, method *methods, int n_methods,
                            const sd_hyg_params *hyg_p) {
    const sd_hyg_params hyg = *hyg_p;
    /* hygiene: a prompt is clean when every method's run of it was */
    bool keep[MAX_PROMPTS];
    int n_keep = 0;
    for (int p = 0; p < np; p++) {
        keep[p] = true;
        for (int mi = 0; mi < n_methods; mi++) keep[p] = keep[p] && sd_hyg_clean(&hyg, methods[mi].other[p]);
        n_keep += keep[p];
    }
    bool noisy = n_keep == 0;
    if (noisy)
        for (int p = 0; p < np; p++) keep[p] = true;
    double plain_med = median_kept(methods[0].tps, keep, np);
    fprintf(out, "\n### %s (%d prompts)\n\n", set, np);
    if (noisy)
        fprintf(out,
                "No prompt ran with other processes using at most %.2f of a core throughout: medians over "
                "all %d prompts, and unreliable.\n\n",
                hyg.max_other_cores, np);
    else
        fprintf(out,
                "Medians over the %d of %d prompts whose runs all saw other processes use at most %.2f of "
                "a core.\n\n",
                n_keep, np, hyg.max_other_cores);
    char cpus[256];
    sd_hyg_affinity_text(cpus, sizeof cpus);
    fprintf(out, "CPUs: %s (process affinity, no thread pinned to one core).\n\n", cpus);
    fprintf(out, "| method | tokens/s (median) | vs plain | acceptance | tokens / target step "
                 "| other CPU, cores: median / max | runs over the limit |\n");
    fprintf(out, "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (int mi = 0; mi < n_methods; mi++) {
        method *mt = &methods[mi];
        double med = median_kept(mt->tps, keep, np);
        int dirty = 0;
        for (int p = 0; p < np; p++) dirty += !sd_hyg_clean(&hyg, mt->other[p]);
        fprintf(out, "| %s | %.2f | %.2fx | %.3f | %.2f | %.2f / %.2f | %d of %d |\n", mt->name, med,
                plain_med > 0 ? med / plain_med : 0, mt->drafted ? (double)mt->accepted / mt->drafted : 0.0,
                mt->steps ? (double)mt->tokens / mt->steps : 1.0, median_of(mt->other, np), max_of(mt->other, np),
                dirty, np);
    }
}

/* specd-bench spec's options. */
typedef struct spec_opts {
    const char *model_path, *draft_path, *out_path;
    const char *sets[MAX_SETS]; /* prompt files: --prompts, else those in bench/prompts */
    int n_sets, n_tokens, layers, n_threads, max_prompts;
    sd_hyg_params hyg;
} spec_opts;

/* -1: run; 0: --help printed; 2: bad options (usage on stderr). *gl holds
 * the default prompt files' names (o->sets borrows them): the caller frees
 * it with globfree whatever this returns. */
static int parse_spec_opts(int argc, char **argv, spec_opts *o, glob_t *gl) {
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"draft", required_argument, 0, 'd'},
                                          {"draft-layers", required_argument, 0, 'L'},
                                          {"prompts", required_argument, 0, 'p'},
                                          {"tokens", required_argument, 0, 'n'},
                                          {"max-prompts", required_argument, 0, 'M'},
                                          {"threads", required_argument, 0, 't'},
                                          {"out", required_argument, 0, 'o'},
                                          {"max-other-load", required_argument, 0, 'X'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    *o = (spec_opts){.n_tokens = 48, .layers = 8, .max_prompts = MAX_PROMPTS, .hyg = sd_hyg_default_params()};
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "m:t:o:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'd': o->draft_path = optarg; break;
        case 'L': o->layers = atoi(optarg); break;
        case 'p':
            if (o->n_sets < MAX_SETS) o->sets[o->n_sets++] = optarg;
            break;
        case 'n': o->n_tokens = atoi(optarg); break;
        case 'M': o->max_prompts = atoi(optarg); break;
        case 't': o->n_threads = atoi(optarg); break;
        case 'o': o->out_path = optarg; break;
        case 'X': o->hyg.max_other_cores = atof(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (o->n_sets == 0 && glob("bench/prompts/*.txt", 0, NULL, gl) == 0)
        for (size_t i = 0; i < gl->gl_pathc && o->n_sets < MAX_SETS; i++) o->sets[o->n_sets++] = gl->gl_pathv[i];
    if (!o->model_path || o->n_sets == 0 || o->n_tokens < 2 || o->n_tokens > 512 || o->layers < 1 ||
        o->max_prompts < 1 || !(o->hyg.max_other_cores > 0)) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The target, its tokenizer, the drafters and the methods compared; the
 * prompts' token ids kept for the top-N studies. All owned. */
typedef struct spec_bench {
    sd_gguf *g;
    sd_tok *tok;
    sd_model *m;
    sd_drafter_params dp;
    sd_drafter *drafters[3]; /* n-gram, self-draft, draft model (NULL without --draft) */
    method *methods;         /* MAX_METHODS */
    int n_methods;
    double c_verify; /* an extra verified token's cost relative to a one-token step */
    int32_t *all_ids[MAX_PROMPTS];
    int32_t all_n[MAX_PROMPTS];
    int n_all;
} spec_bench;

static const char *const drafter_names[3] = {"ngram", "self", "draft"};

/* Loads the target and creates the drafters; false (said) on failure. */
static bool load_models(const spec_opts *o, spec_bench *b) {
    char err[256];
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = o->n_threads;
    if (sd_gguf_open(o->model_path, &b->g, err, sizeof err) != SD_OK || sd_tok_from_gguf(b->g, &b->tok) != SD_OK ||
        sd_model_load(b->g, &mp, &b->m) != SD_OK) {
        fprintf(stderr, "specd-bench: cannot load %s\n", o->model_path);
        return false;
    }
    b->dp = sd_drafter_default_params();
    b->dp.max_ctx = MAX_CTX;
    b->dp.n_threads = o->n_threads;
    if (sd_drafter_ngram_create(&b->dp, &b->drafters[0]) != SD_OK ||
        sd_drafter_self_view(b->m, o->layers, &b->dp, &b->drafters[1]) != SD_OK ||
        (o->draft_path && sd_drafter_model_open(o->draft_path, sd_tok_vocab_hash(b->tok), sd_tok_n_vocab(b->tok),
                                                &b->dp, &b->drafters[2]) != SD_OK)) {
        fprintf(stderr, "specd-bench: cannot create the drafters\n");
        return false;
    }
    return true;
}

/* The methods: plain, then each drafter at K = 2, 4, 8 and adaptive. */
static bool add_methods(spec_bench *b) {
    const int ks[4] = {2, 4, 8, ADAPTIVE};
    method *methods = b->methods;
    snprintf(methods[b->n_methods].name, sizeof methods[0].name, "plain");
    methods[b->n_methods++].drafter = -1;
    for (int di = 0; di < 3; di++) {
        if (!b->drafters[di]) continue;
        for (int j = 0; j < 4; j++) {
            method *mt = &methods[b->n_methods++];
            mt->drafter = di;
            if (di == 0 && sd_drafter_ngram_create(&b->dp, &mt->own) != SD_OK) return false;
            mt->k = ks[j];
            if (ks[j] == ADAPTIVE)
                snprintf(mt->name, sizeof mt->name, "%s K adaptive", drafter_names[di]);
            else
                snprintf(mt->name, sizeof mt->name, "%s K=%d", drafter_names[di], ks[j]);
        }
    }
    return true;
}

/* Runs every method on prompt p of a set (its chat-formatted text), each
 * run's tokens/s and hygiene into the method; keeps the ids for the
 * studies. False on a failure. */
static bool run_prompt(const spec_opts *o, spec_bench *b, const char *prompt, int p) {
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    sd_chat_msg msg = {"user", prompt};
    if (sd_tok_chat_format(&msg, 1, NULL, true, &text) != SD_OK ||
        sd_tok_encode(b->tok, text, strlen(text), true, &ids, &n_ids) != SD_OK || n_ids + 600 > MAX_CTX) {
        free(text);
        free(ids);
        return false;
    }
    free(text);
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    for (int mi = 0; mi < b->n_methods; mi++) {
        method *mt = &b->methods[mi];
        double secs = 0;
        sd_drafter *d = mt->own ? mt->own : mt->drafter >= 0 ? b->drafters[mt->drafter] : NULL;
        sd_hyg_mark h0 = sd_hyg_now(&o->hyg);
        int got = run_one(b->m, d, mt->k, b->c_verify, ids, (int32_t)n_ids, o->n_tokens, &greedy, mt, &secs, NULL);
        sd_hyg_mark h1 = sd_hyg_now(&o->hyg);
        mt->other[p] = sd_hyg_other_cores(&h0, &h1);
        if (got < 0) {
            free(ids);
            return false;
        }
        mt->tps[p] = secs > 0 ? got / secs : 0;
    }
    if (b->n_all < MAX_PROMPTS) {
        b->all_ids[b->n_all] = ids;
        b->all_n[b->n_all++] = (int32_t)n_ids;
    } else {
        free(ids);
    }
    return true;
}

/* One prompt set: every method on every prompt, then its table. */
static bool run_set(const spec_opts *o, spec_bench *b, const char *set, FILE *out) {
    char *prompts[MAX_PROMPTS];
    int np = sd_bench_read_prompts(set, prompts, o->max_prompts < MAX_PROMPTS ? o->max_prompts : MAX_PROMPTS);
    if (np <= 0) {
        if (np == 0) fprintf(stderr, "specd-bench: no prompts in %s\n", set);
        return false;
    }
    for (int mi = 0; mi < b->n_methods; mi++) {
        b->methods[mi].drafted = b->methods[mi].accepted = b->methods[mi].steps = b->methods[mi].tokens = 0;
    }
    bool ok = true;
    for (int p = 0; p < np && ok; p++) {
        ok = run_prompt(o, b, prompts[p], p);
        if (ok) fprintf(stderr, "%s: prompt %d/%d done\n", set, p + 1, np);
    }
    if (ok) {
        write_set_table(out, set, np, b->methods, b->n_methods, &o->hyg);
        fflush(out);
    }
    for (int p = 0; p < np; p++) free(prompts[p]);
    return ok;
}

int bench_spec_main(int argc, char **argv) {
    spec_opts o;
    glob_t gl = {0};
    int rc = parse_spec_opts(argc, argv, &o, &gl);
    if (rc >= 0) {
        globfree(&gl);
        return rc;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "bench");
    rc = 1;
    static method methods[MAX_METHODS];
    memset(methods, 0, sizeof methods);
    spec_bench b = {.methods = methods};
    FILE *out = o.out_path ? fopen(o.out_path, "w") : stdout;
    if (!out || !load_models(&o, &b)) goto done;
    double t1 = 0;
    b.c_verify = calibrate_verify_cost(b.m, &t1);
    fprintf(out, "Target %s; %d-token greedy continuations; self-draft = first %d of %d layers%s%s.\n", o.model_path,
            o.n_tokens, o.layers, (int)sd_model_config_of(b.m)->n_layers, o.draft_path ? "; draft GGUF " : "",
            o.draft_path ? o.draft_path : "");
    fprintf(out,
            "Verification cost calibrated at start-up: one-token step %.1f ms, each extra verified token "
            "+%.3f of it (adaptive K used to assume 0.05).\n",
            t1 * 1e3, b.c_verify);
    if (!add_methods(&b)) goto done;
    for (int si = 0; si < o.n_sets; si++)
        if (!run_set(&o, &b, o.sets[si], out)) goto done;
    if (b.drafters[2]) {
        top_n_study(out, b.m, o.draft_path, sd_tok_vocab_hash(b.tok), sd_tok_n_vocab(b.tok), b.all_ids, b.all_n,
                    b.n_all < 8 ? b.n_all : 8, o.n_tokens);
        top_n_alpha_study(out, b.m, o.draft_path, b.all_ids, b.all_n, b.n_all, o.n_tokens, o.n_threads);
    }
    rc = 0;
done:
    for (int i = 0; i < b.n_all; i++) free(b.all_ids[i]);
    for (int i = 0; i < 3; i++) sd_drafter_free(&b.drafters[i]);
    for (int i = 0; i < b.n_methods; i++) sd_drafter_free(&methods[i].own);
    sd_model_free(&b.m);
    sd_tok_free(&b.tok);
    sd_gguf_close(&b.g);
    if (out && out != stdout) fclose(out);
    globfree(&gl);
    return rc;
}
