/* bench_serve.c — `specd-bench serve`: throughput and latency through the
 * running service (start it with specd-launch; this mode only connects).
 *
 * For each concurrency (default 1, 8, 64) it runs rounds of that many
 * concurrent requests (prompts from a file, one per line, cycled), with
 * speculation on (max_k 0 = the coordinator's default) and off
 * (max_k -1: target-only), alternating spec/target rounds and which of
 * the two goes first (ABBA), so that drift of the machine hits both alike;
 * both rounds of a pair send the same prompts. Each concurrency starts with
 * --warmup unmeasured pairs: the first round of a run measured 5-6% slower
 * than the rest (first-touch costs, the cost model refitting to the batch),
 * and it was always a speculative one.
 * Reported per (concurrency, mode): tokens/s per round (generated tokens /
 * wall time of the round) as the median and range over the rounds, the
 * median of the per-round speculative/target-only ratios (each pair ran
 * back to back: the ratio is what a shared, drifting machine measures
 * best) and their geometric mean with a 95% confidence interval (Student's
 * t on the log ratios, the rounds taken as independent pairs), the ratio
 * the coordinator's verify cost model predicts from the load-independent
 * counts below (how a drift-free machine would see it), tokens committed per target step and rows verified per committed
 * token (1 + K rows a step: what speculation costs a batch-bound verifier,
 * whose step time grows with its rows, independent of the machine's load),
 * per-token latency p50/p99 (gap between successive token chunks divided
 * by the chunk's tokens; the first chunk, i.e. time to first token, is left
 * out), acceptance; after the
 * run the coordinator's own step overhead p50/p99 (ServiceStats); and how
 * much drafting overlapped verification: per request, drafting_ms +
 * verifying_ms - (total_ms - queued_ms) is time the two ran at once, given
 * as a share of drafting_ms.
 * Prompts repeat across rounds (both rounds of a pair send the same ones,
 * and the list is cycled): an n-gram drafter whose cache is shared across
 * requests then drafts a prompt's earlier answer. Start it with
 * --ngram-cache 0 for figures that credit no repetition.
 * Hygiene (bench_hygiene.h): each round is sampled for the CPU time used
 * by processes other than this one and the service's (named "specd-*");
 * a pair with a round over --max-other-load cores is left out of the
 * medians, the range and the ratios, and the table gives the share and
 * the pairs left out.
 * --modes A,B compares two ways of serving the same service instead:
 * "choice" (speculative, the coordinator picks each request's drafter kind),
 * "target" (max_k -1), or "ngram" / "model" / "self" (speculative with the
 * drafter kind pinned); e.g. --modes choice,ngram measures the per-request
 * choice against a fixed n-gram drafter in the same ABBA pairs. The notes
 * then list, per prompt, the kind each mode's requests were drafted by.
 * --versus ADDR compares two services instead of two modes: the one at
 * --coordinator (keyed with --curve-secret/--curve-server: CurveZMQ) and
 * the one at ADDR (plaintext), both speculative, in the same ABBA pairs;
 * the ratio columns are then CURVE / plaintext and the cost-model column is
 * empty. Start both with the same model and flags. Keys are optional:
 * with --labels A,B the two are any two services (e.g. an EAGLE head's
 * and a --no-draft one on the same target: bench/eagle_serve.py), named
 * A and B in the table, the ratio A / B.
 * --json-schema FILE sends every request under that JSON Schema
 * (SubmitRequest.constraint: structured output, issue 35), e.g. with
 * --modes ngram,target to measure what constrained drafting buys.
 * Rejected: starting the service here (the launcher does that, and a bench
 * that owns processes hides their start-up failures). */
#include "bench_serve.h"
#include "bench_hygiene.h"
#include "bench_stats.h"

#include "bench_prompts.h"

#include "specd/client.h"
#include "specd/client_opts.h"
#include "specd/curve.h"

#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PROMPTS 256
#define MAX_CONC    256

typedef struct serve_req {
    pthread_mutex_t mu;
    double t_last; /* time of the previous chunk, 0 before the first */
    double *lat;   /* per-token gaps, ms */
    size_t n_lat, cap;
} serve_req;

#define MAX_ROUNDS 100

typedef struct serve_tally {
    double *lat;
    size_t n_lat, cap;
    double tokens, seconds;
    double round_tps[MAX_ROUNDS];   /* tokens/s of each round */
    double round_other[MAX_ROUNDS]; /* CPU cores used by processes outside the service during each round */
    /* decode only: tokens after each request's first and the time they took
     * (its total minus its time to the first token), per round */
    double round_dec_tokens[MAX_ROUNDS], round_dec_ms[MAX_ROUNDS];
    int n_rounds;
    /* the drafter kind of each prompt's latest request (Specd__DrafterKind) */
    unsigned char kind_by_prompt[MAX_PROMPTS];
    double drafted, accepted, drafting_ms, verifying_ms, busy_ms;
    double steps; /* target steps summed over requests */
    int failures;
} serve_tally;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void push_lat(double **a, size_t *n, size_t *cap, double v) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        double *p = realloc(*a, nc * sizeof *p);
        if (!p) return;
        *a = p, *cap = nc;
    }
    (*a)[(*n)++] = v;
}

static void on_chunk(const sd_client_chunk *ch, void *user) {
    serve_req *r = user;
    double t = now_s();
    pthread_mutex_lock(&r->mu);
    if (ch->n_ids > 0) {
        if (r->t_last > 0)
            for (size_t i = 0; i < ch->n_ids; i++)
                push_lat(&r->lat, &r->n_lat, &r->cap, (t - r->t_last) * 1e3 / (double)ch->n_ids);
        r->t_last = t;
    }
    pthread_mutex_unlock(&r->mu);
}

static double pct(double *v, size_t n, double p) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, sd_bench_cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* One round: conc requests at once, all with the same max_k, each ending
 * at `tokens` or (stop_at_eos) at the model's end of generation; the CPU
 * that processes other than the service's ("specd-*") and this one used
 * meanwhile goes to round_other. */
static void round_run(sd_client *c, char **prompts, int n_prompts, int *next_prompt, int conc, int tokens,
                      bool stop_at_eos, int32_t max_k, Specd__DrafterKind kind, const char *schema,
                      const sd_hyg_params *hyg, serve_tally *t) {
    serve_req *reqs = calloc((size_t)conc, sizeof *reqs);
    uint64_t *ids = calloc((size_t)conc, sizeof *ids);
    bool *ok = calloc((size_t)conc, sizeof *ok);
    int *prompt_of = calloc((size_t)conc, sizeof *prompt_of);
    if (!reqs || !ids || !ok || !prompt_of) goto done;
    sd_hyg_mark h0 = sd_hyg_now(hyg);
    double t0 = now_s();
    for (int i = 0; i < conc; i++) {
        pthread_mutex_init(&reqs[i].mu, NULL);
        sd_client_request q = sd_client_default_request();
        prompt_of[i] = (*next_prompt)++ % n_prompts;
        q.prompt = prompts[prompt_of[i]];
        q.chat = true;
        q.max_tokens = (uint32_t)tokens;
        q.ignore_eos = !stop_at_eos;
        q.max_k = max_k;
        q.drafter_kind = kind;
        if (schema) { /* --json-schema */
            q.constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA;
            q.constraint_text = schema;
        }
        ok[i] = sd_client_submit(c, &q, on_chunk, &reqs[i], &ids[i]) == SD_OK;
        if (!ok[i]) t->failures++;
    }
    double gen = 0, dec_tokens = 0, dec_ms = 0;
    for (int i = 0; i < conc; i++) {
        if (!ok[i]) continue;
        sd_client_result res = {0};
        if (sd_client_wait(c, ids[i], 600000, &res) != SD_OK || res.status != SD_OK) {
            t->failures++;
            sd_client_result_clear(&res);
            continue;
        }
        gen += (double)res.n_ids;
        if (res.n_ids > 1 && res.stats.total_ms > res.stats.first_token_ms) {
            dec_tokens += (double)(res.n_ids - 1);
            dec_ms += res.stats.total_ms - res.stats.first_token_ms;
        }
        t->drafted += res.stats.drafted;
        t->steps += res.stats.target_steps;
        t->accepted += res.stats.accepted;
        t->drafting_ms += res.stats.drafting_ms;
        t->verifying_ms += res.stats.verifying_ms;
        t->busy_ms += res.stats.total_ms - res.stats.queued_ms;
        t->kind_by_prompt[prompt_of[i]] = (unsigned char)res.stats.drafter_kind;
        sd_client_result_clear(&res);
    }
    double t1 = now_s();
    sd_hyg_mark h1 = sd_hyg_now(hyg);
    t->tokens += gen;
    t->seconds += t1 - t0;
    if (t->n_rounds < MAX_ROUNDS) {
        t->round_other[t->n_rounds] = sd_hyg_other_cores(&h0, &h1);
        t->round_dec_tokens[t->n_rounds] = dec_tokens;
        t->round_dec_ms[t->n_rounds] = dec_ms;
        t->round_tps[t->n_rounds++] = t1 > t0 ? gen / (t1 - t0) : 0;
    }
    for (int i = 0; i < conc; i++) {
        pthread_mutex_lock(&reqs[i].mu);
        for (size_t k = 0; k < reqs[i].n_lat; k++) push_lat(&t->lat, &t->n_lat, &t->cap, reqs[i].lat[k]);
        pthread_mutex_unlock(&reqs[i].mu);
        pthread_mutex_destroy(&reqs[i].mu);
        free(reqs[i].lat);
    }
done:
    free(reqs);
    free(ids);
    free(ok);
    free(prompt_of);
}

/* Two-sided 95% quantile of Student's t with df degrees of freedom. */
static double t975(int df) {
    static const double t[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                 2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                 2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
    if (df < 1) return NAN;
    if (df <= 30) return t[df - 1];
    return df <= 60 ? 2.000 : df <= 120 ? 1.980 : 1.960;
}

/* Geometric mean of the per-round ratios r[0..n) and its 95% confidence
 * interval, from the t interval of the mean log ratio (the rounds as
 * independent paired samples); lo = hi = NAN with fewer than 2 rounds. */
static void ratio_ci(const double *r, int n, double *gm, double *lo, double *hi) {
    double sum = 0, sq = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!(r[i] > 0)) continue;
        double l = log(r[i]);
        sum += l, sq += l * l, k++;
    }
    *gm = *lo = *hi = NAN;
    if (k == 0) return;
    double mean = sum / k;
    *gm = exp(mean);
    if (k < 2) return;
    double var = (sq - k * mean * mean) / (k - 1);
    double half = t975(k - 1) * sqrt(var > 0 ? var / k : 0);
    *lo = exp(mean - half);
    *hi = exp(mean + half);
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd-bench serve [--coordinator ADDR] [--prompts FILE] [--conc 1,8,64] [-n TOKENS]\n"
               "                        [--rounds R] [--warmup W] [--eos] [--max-other-load CORES] [-o OUT.md]\n"
               "Start the service first (specd-launch --target ... --ngram). Each concurrency runs R rounds\n"
               "of speculative and R of target-only (max_k -1) requests, alternating.\n"
               "  --coordinator ADDR  client address (default tcp://127.0.0.1:7700)\n"
               "  --prompts FILE      one prompt per line (\\n a newline, # lines skipped), sent as chat turns\n"
               "                      (default bench/prompts/chat.txt)\n"
               "  --conc LIST         concurrencies (default 1,8,64)\n"
               "  -n TOKENS           new tokens per request (default 64; EOS ignored)\n"
               "  --eos               a request also ends at the model's end of generation, as users'\n"
               "                      requests do (tokens/s counts the tokens generated)\n"
               "  --rounds R          rounds per mode and concurrency (default 4)\n"
               "  --warmup W          unmeasured rounds per mode before them (default 1)\n"
               "  --max-other-load C  leave out pairs of rounds during which processes other than the\n"
               "                      service's (specd-*) used more than C cores (default 0.25)\n"
               "  -o FILE             also write the markdown table to FILE\n"
               "  --curve-secret FILE, --curve-server FILE\n"
               "                      CurveZMQ keys for the service at --coordinator (specd-keygen files)\n"
               "  --json-schema FILE  every request constrained to that JSON Schema (structured output)\n"
               "  --modes A,B         compare two modes of the one service (default choice,target): choice\n"
               "                      (speculative, the coordinator picks each request's drafter kind),\n"
               "                      target (no speculation), or ngram / model / self (speculative with\n"
               "                      that drafter kind pinned); the notes list each prompt's drafter kind\n"
               "  --versus ADDR       compare the service at --coordinator (keyed) with a plaintext one at ADDR\n"
               "                      (same model and flags) instead of speculative with target-only; both\n"
               "                      speculative, rounds alternating between the two\n"
               "  --labels A,B        with --versus: the two services' names in the table (default\n"
               "                      'speculative, CurveZMQ' and 'speculative, plaintext')\n");
}

/* One concurrency's spec / target comparison (the first row's columns). */
typedef struct serve_ratios {
    double median, gm, ci_lo, ci_hi, model;
} serve_ratios;

/* Prints (and writes to out, when set) the table row of mode m (0:
 * speculative, 1: target-only) at concurrency conc, from the kept pairs. */
static void write_mode_row(FILE *out, int conc, int m, const char *label, const serve_tally *t, const bool *keep,
                           int n_pairs, int n_dirty, const serve_ratios *rt) {
    double overlap = t->drafting_ms > 0 ? (t->drafting_ms + t->verifying_ms - t->busy_ms) / t->drafting_ms : 0;
    double lo = 0, hi = 0, kept_tps[MAX_ROUNDS], other[MAX_ROUNDS], other_max = 0;
    int n_kept_tps = 0;
    for (int r = 0; r < n_pairs; r++) {
        other[r] = t->round_other[r];
        if (other[r] > other_max) other_max = other[r];
        if (!keep[r]) continue;
        if (n_kept_tps == 0 || t->round_tps[r] < lo) lo = t->round_tps[r];
        if (n_kept_tps == 0 || t->round_tps[r] > hi) hi = t->round_tps[r];
        kept_tps[n_kept_tps++] = t->round_tps[r];
    }
    double med = sd_bench_median(kept_tps, n_kept_tps);
    double other_med = sd_bench_median(other, n_pairs);
    char ratio_txt[32] = "", ci_txt[48] = "", model_txt[32] = "";
    if (m == 0) {
        snprintf(ratio_txt, sizeof ratio_txt, "%.2f", rt->median);
        if (!isnan(rt->ci_lo))
            snprintf(ci_txt, sizeof ci_txt, "%.3f [%.3f, %.3f]", rt->gm, rt->ci_lo, rt->ci_hi);
        else if (!isnan(rt->gm))
            snprintf(ci_txt, sizeof ci_txt, "%.3f", rt->gm);
        if (!isnan(rt->model)) snprintf(model_txt, sizeof model_txt, "%.3f", rt->model);
    }
    char line[768];
    snprintf(line, sizeof line,
             "| %d | %s | %.1f | %.1f-%.1f | %s | %s | %s | %.3f | %.3f | %.2f | %.2f | %.0f%% | %.0f%% "
             "| %.2f / %.2f | %d of %d%s |%s\n",
             conc, label, med, lo, hi, ratio_txt, ci_txt, model_txt, t->steps > 0 ? t->tokens / t->steps : 0,
             t->tokens > 0 ? (t->steps + t->drafted) / t->tokens : 0, pct(t->lat, t->n_lat, 0.5),
             pct(t->lat, t->n_lat, 0.99), t->drafted > 0 ? 100.0 * t->accepted / t->drafted : 0,
             overlap < 0 ? 0 : 100.0 * overlap, other_med, other_max, n_dirty, n_pairs,
             n_dirty == n_pairs ? ", all kept: unreliable" : "", t->failures ? " (failures!)" : "");
    printf("%s", line);
    fflush(stdout);
    if (out) fprintf(out, "%s", line);
}

/* specd-bench serve's options. */
typedef struct serve_opts {
    sd_client_link_opts link; /* --coordinator and its keys (client_opts.h) */
    const char *prompts_path, *out_path;
    const char *versus; /* a second (plaintext) service to compare with */
    char labels[2][48]; /* --labels: the two services' names with --versus ("" = the default) */
    int mode[2];        /* --modes: indices into serve_mode_names */
    char conc_list[128];
    int tokens, rounds, warmup;
    bool eos;     /* --eos: requests end at EOS too */
    char *schema; /* --json-schema: the file's text (owned), or NULL */
    sd_hyg_params hyg;
} serve_opts;

/* --modes: what each name sends (max_k, drafter kind). */
static const struct {
    const char *name, *label;
    int32_t max_k;
    Specd__DrafterKind kind;
} serve_mode_names[] = {
    {"choice", "speculative", 0, SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED},
    {"target", "target-only", -1, SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED},
    {"ngram", "n-gram drafter", 0, SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM},
    {"model", "model drafter", 0, SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL},
    {"self", "self-draft", 0, SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF},
};
#define N_SERVE_MODES ((int)(sizeof serve_mode_names / sizeof serve_mode_names[0]))

/* "A,B" into two mode indices; false when either name is unknown or they are equal. */
static bool parse_modes(const char *arg, int mode[2]) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", arg);
    char *comma = strchr(buf, ',');
    if (!comma) return false;
    *comma = '\0';
    const char *names[2] = {buf, comma + 1};
    for (int m = 0; m < 2; m++) {
        mode[m] = -1;
        for (int i = 0; i < N_SERVE_MODES; i++)
            if (strcmp(names[m], serve_mode_names[i].name) == 0) mode[m] = i;
        if (mode[m] < 0) return false;
    }
    return mode[0] != mode[1];
}

/* "A,B" into two service names; false when either is empty or too long. */
static bool parse_labels(const char *arg, char labels[2][48]) {
    const char *comma = strchr(arg, ',');
    if (!comma) return false;
    size_t n0 = (size_t)(comma - arg), n1 = strlen(comma + 1);
    if (n0 == 0 || n1 == 0 || n0 >= sizeof labels[0] || n1 >= sizeof labels[1]) return false;
    memcpy(labels[0], arg, n0);
    labels[0][n0] = '\0';
    memcpy(labels[1], comma + 1, n1 + 1);
    return true;
}

/* The text of a --json-schema file (caller frees), NULL (said) when it
 * cannot be read or is over SD_MAX_CONSTRAINT_BYTES. */
static char *read_schema(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = f ? malloc(SD_MAX_CONSTRAINT_BYTES + 2) : NULL;
    size_t n = buf ? fread(buf, 1, SD_MAX_CONSTRAINT_BYTES + 1, f) : 0;
    if (f) fclose(f);
    if (!buf || n == 0 || n > SD_MAX_CONSTRAINT_BYTES) {
        fprintf(stderr, "specd-bench serve: --json-schema %s: cannot read it, or empty, or over %d bytes\n", path,
                SD_MAX_CONSTRAINT_BYTES);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* -1: run; 0: --help printed; 2: bad options (said on stderr). */
static int parse_serve_opts(int argc, char **argv, serve_opts *o) {
    *o = (serve_opts){.link = {.coordinator = "tcp://127.0.0.1:7700"},
                      .prompts_path = "bench/prompts/chat.txt",
                      .conc_list = "1,8,64",
                      .tokens = 64,
                      .rounds = 4,
                      .warmup = 1,
                      .mode = {0, 1},
                      .hyg = sd_hyg_default_params()};
    static const struct option longs[] = {SD_CLIENT_LINK_LONG_OPTIONS,
                                          {"prompts", required_argument, 0, 'p'},
                                          {"conc", required_argument, 0, 'C'},
                                          {"rounds", required_argument, 0, 'r'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {"out", required_argument, 0, 'o'},
                                          {"max-other-load", required_argument, 0, 'X'},
                                          {"versus", required_argument, 0, 'V'},
                                          {"modes", required_argument, 0, 'M'},
                                          {"labels", required_argument, 0, 'L'},
                                          {"eos", no_argument, 0, 'E'},
                                          {"json-schema", required_argument, 0, 'J'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    o->hyg.exclude_prefix = "specd-"; /* the service's processes do the work measured */
    int ch;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "n:o:h", longs, NULL)) != -1) {
        switch (ch) {
        case 'p': o->prompts_path = optarg; break;
        case 'C': snprintf(o->conc_list, sizeof o->conc_list, "%s", optarg); break;
        case 'r': o->rounds = atoi(optarg); break;
        case 'w': o->warmup = atoi(optarg); break;
        case 'n': o->tokens = atoi(optarg); break;
        case 'o': o->out_path = optarg; break;
        case 'X': o->hyg.max_other_cores = atof(optarg); break;
        case 'V': o->versus = optarg; break;
        case 'M':
            if (!parse_modes(optarg, o->mode)) {
                fprintf(stderr,
                        "specd-bench serve: --modes takes two different names of choice, target, ngram, "
                        "model, self (e.g. choice,ngram), not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'L':
            if (!parse_labels(optarg, o->labels)) {
                fprintf(stderr,
                        "specd-bench serve: --labels takes two non-empty names, A,B, each under 48 bytes, "
                        "not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'E': o->eos = true; break;
        case 'J':
            free(o->schema);
            if (!(o->schema = read_schema(optarg))) return 2;
            break;
        case 'h': usage(stdout); return 0;
        default:
            if (sd_client_link_opts_apply(&o->link, ch, optarg)) break;
            usage(stderr);
            return 2;
        }
    }
    if (o->labels[0][0] && !o->versus) {
        fprintf(stderr, "specd-bench serve: --labels names the two services of --versus\n");
        return 2;
    }
    if (o->versus && (o->mode[0] != 0 || o->mode[1] != 1)) {
        fprintf(stderr, "specd-bench serve: --versus compares two services, --modes two modes of one: not both\n");
        return 2;
    }
    if (o->tokens < 1 || o->tokens > 4096 || o->rounds < 1 || o->rounds > MAX_ROUNDS || o->warmup < 0 ||
        o->warmup > 10 || !(o->hyg.max_other_cores > 0)) {
        fprintf(stderr, "specd-bench serve: -n in [1, 4096], --rounds in [1, 100], --warmup in [0, 10], "
                        "--max-other-load > 0\n");
        return 2;
    }
    return -1;
}

/* The services compared: mode m's client and max_k (versus: both
 * speculative), with the labels of the table. */
typedef struct serve_modes {
    sd_client *client[2];
    int32_t draft[2];
    Specd__DrafterKind kind[2];
    const char *label[2];
    const char *ratio_name;
    bool versus;     /* client[1] is the --versus service: no cost-model column */
    bool vs_target;  /* mode 1 is target-only: the cost-model column applies */
    bool list_kinds; /* --modes given: the notes list each prompt's drafter kind */
} serve_modes;

/* Appends to the per-round notes, a bounded buffer (cut when full). */
static void notes_add(char *notes, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void notes_add(char *notes, size_t cap, const char *fmt, ...) {
    size_t len = strlen(notes);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + len, cap - len, fmt, ap);
    va_end(ap);
}

/* Prints a line to stdout and, when set, to out. */
static void emit(FILE *out, const char *text) {
    printf("%s", text);
    if (out) fprintf(out, "%s", text);
}

/* Connects to the service at o->link.coordinator (with its keys) and, with --versus,
 * to the plaintext one. False when either cannot be reached. */
static bool connect_services(const serve_opts *o, sd_curve_id *curve, sd_client **c, sd_client **cv) {
    sd_client_params cp = sd_client_default_params();
    cp.coordinator = o->link.coordinator;
    cp.name = "specd-bench";
    if (sd_curve_id_load(o->link.curve_secret, o->link.curve_server, curve) != SD_OK) return false;
    sd_client_params_set_curve(&cp, curve);
    if (sd_client_connect(&cp, c) != SD_OK) return false;
    if (o->versus) {
        sd_client_params vp = sd_client_default_params();
        vp.coordinator = o->versus;
        vp.name = "specd-bench";
        if (sd_client_connect(&vp, cv) != SD_OK) return false;
    }
    return true;
}

/* The table's header row with the CPUs this process may use above it. */
static void write_header(FILE *out, const serve_modes *md) {
    char hdr[1024];
    snprintf(hdr, sizeof hdr,
             "| concurrency | mode | tokens/s (median of rounds) | range | %s: median of rounds | "
             "geometric mean [95%% CI] | by the cost model | tokens / step | rows / token | latency p50 ms | "
             "latency p99 ms | acceptance | drafting overlapped | other CPU, cores: median / max | "
             "pairs over the limit |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
             md->ratio_name);
    char cpus[256];
    sd_hyg_affinity_text(cpus, sizeof cpus);
    printf("CPUs of specd-bench: %s (the service runs on its own affinity, set where it was started)\n\n%s", cpus, hdr);
    if (out)
        fprintf(out, "CPUs of specd-bench: %s (the service runs on its own affinity, set where it was started)\n\n%s",
                cpus, hdr);
}

/* The rounds at one concurrency: o->warmup unmeasured ones, then o->rounds
 * pairs of measured ones (ABBA order, both modes on the same prompts). */
static void run_rounds(const serve_opts *o, const serve_modes *md, char **prompts, int n_prompts, int *next_prompt,
                       int conc, serve_tally tl[2]) {
    for (int r = 0; r < o->warmup; r++) { /* unmeasured: first-touch costs, the cost model's fit at this batch */
        for (int m = 0; m < 2; m++) {
            serve_tally w = {0};
            int first_prompt = *next_prompt;
            round_run(md->client[m], prompts, n_prompts, next_prompt, conc, o->tokens, o->eos, md->draft[m],
                      md->kind[m], o->schema, &o->hyg, &w);
            if (m == 0) *next_prompt = first_prompt;
            free(w.lat);
        }
    }
    for (int r = 0; r < o->rounds; r++) {
        int first_prompt = *next_prompt;
        for (int i = 0; i < 2; i++) { /* m 0: speculative, 1: target-only; ABBA order */
            int m = (r % 2) ? 1 - i : i;
            *next_prompt = first_prompt; /* the pair sends the same prompts */
            round_run(md->client[m], prompts, n_prompts, next_prompt, conc, o->tokens, o->eos, md->draft[m],
                      md->kind[m], o->schema, &o->hyg, &tl[m]);
        }
    }
}

/* Hygiene: a pair is kept when both its rounds were clean; with no clean
 * pair all are kept (and the rows say so). keep[0..*n_pairs); returns the
 * number of pairs over the limit. */
static int keep_clean_pairs(const sd_hyg_params *hyg, const serve_tally tl[2], bool keep[MAX_ROUNDS], int *n_pairs) {
    *n_pairs = tl[0].n_rounds < tl[1].n_rounds ? tl[0].n_rounds : tl[1].n_rounds;
    int n_keep = 0;
    for (int r = 0; r < *n_pairs; r++) {
        keep[r] = sd_hyg_clean(hyg, tl[0].round_other[r]) && sd_hyg_clean(hyg, tl[1].round_other[r]);
        n_keep += keep[r];
    }
    if (n_keep == 0)
        for (int r = 0; r < *n_pairs; r++) keep[r] = true;
    return *n_pairs - n_keep;
}

/* What the load-independent counts imply for a verify step costing
 * F + t * rows (the coordinator's fit, read after these rounds): a
 * committed token costs F / B / (tokens per step) + t * (rows per token)
 * of verifier time at batch B. Drafting is not in it. NAN when the fit or
 * the counts are missing; the fit goes to the notes. */
static double cost_model_ratio(sd_client *c, int conc, const serve_tally tl[2], char *notes, size_t notes_cap) {
    sd_client_service_stats cs;
    if (sd_client_stats(c, 10000, &cs) != SD_OK || !(tl[0].tokens > 0) || !(tl[1].tokens > 0) || !(tl[0].steps > 0) ||
        !(tl[1].steps > 0))
        return NAN;
    double model = NAN;
    double fb = cs.verify_fixed_us / conc, tk = cs.verify_token_us;
    double per_spec = fb * tl[0].steps / tl[0].tokens + tk * (tl[0].steps + tl[0].drafted) / tl[0].tokens;
    double per_tgt = fb * tl[1].steps / tl[1].tokens + tk * (tl[1].steps + tl[1].drafted) / tl[1].tokens;
    if (per_spec > 0) model = per_tgt / per_spec;
    notes_add(notes, notes_cap,
              "  cost model after these rounds: verify step %.0f us + %.0f us per token; "
              "draft round trip %.0f us\n",
              cs.verify_fixed_us, cs.verify_token_us, cs.draft_step_us);
    return model;
}

/* One concurrency: its rounds, the ratios of the kept pairs (into the
 * notes, by round) and the table's two rows. */
/* Per mode, the drafter kind of each prompt's latest request, as one
 * letter a prompt: n(gram), m(odel), s(elf), - (none drafted). */
static void notes_kinds(const serve_modes *md, const serve_tally tl[2], int n_prompts, char *notes, size_t cap) {
    for (int m = 0; m < 2; m++) {
        notes_add(notes, cap, "  drafter kind by prompt, %s: ", md->label[m]);
        for (int i = 0; i < n_prompts; i++) {
            switch (tl[m].kind_by_prompt[i]) {
            case SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM: notes_add(notes, cap, "n"); break;
            case SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL: notes_add(notes, cap, "m"); break;
            case SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF: notes_add(notes, cap, "s"); break;
            default: notes_add(notes, cap, "-"); break;
            }
        }
        notes_add(notes, cap, "\n");
    }
}

static void run_concurrency(const serve_opts *o, const serve_modes *md, FILE *out, char **prompts, int n_prompts,
                            int *next_prompt, int conc, char *notes, size_t notes_cap) {
    serve_tally tl[2] = {{0}};
    run_rounds(o, md, prompts, n_prompts, next_prompt, conc, tl);
    bool keep[MAX_ROUNDS];
    int n_pairs;
    int n_dirty = keep_clean_pairs(&o->hyg, tl, keep, &n_pairs);
    double ratio[MAX_ROUNDS];
    int n_ratio = 0;
    for (int r = 0; r < n_pairs; r++)
        if (keep[r]) ratio[n_ratio++] = tl[1].round_tps[r] > 0 ? tl[0].round_tps[r] / tl[1].round_tps[r] : 0;
    notes_add(notes, notes_cap, "- concurrency %d, %s by round:", conc, md->ratio_name);
    for (int r = 0; r < n_ratio; r++) notes_add(notes, notes_cap, " %.3f", ratio[r]);
    notes_add(notes, notes_cap, "\n");
    /* decode only, over the kept pairs: how specd-generate and llama.cpp
     * report decode speed (prefill and the first token left out) */
    double dec[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        double tok = 0, ms = 0;
        for (int r = 0; r < n_pairs; r++)
            if (keep[r]) tok += tl[m].round_dec_tokens[r], ms += tl[m].round_dec_ms[r];
        dec[m] = ms > 0 ? tok * 1e3 / ms : 0;
    }
    if (dec[0] > 0 && dec[1] > 0)
        notes_add(notes, notes_cap,
                  "  decode only (each request's tokens after its first, over its time after the first; prefill "
                  "left out): %s %.1f tok/s, %s %.1f tok/s per request: %.2fx\n",
                  md->label[0], dec[0], md->label[1], dec[1], dec[0] / dec[1]);
    serve_ratios sr;
    ratio_ci(ratio, n_ratio, &sr.gm, &sr.ci_lo, &sr.ci_hi);
    sr.median = sd_bench_median(ratio, n_ratio);
    sr.model = md->vs_target ? cost_model_ratio(md->client[0], conc, tl, notes, notes_cap) : NAN;
    if (md->list_kinds) notes_kinds(md, tl, n_prompts, notes, notes_cap);
    for (int m = 0; m < 2; m++) {
        write_mode_row(out, conc, m, md->label[m], &tl[m], keep, n_pairs, n_dirty, &sr);
        free(tl[m].lat);
    }
}

/* The coordinator's own step figures after the run, when it answers. */
static void write_step_overhead(FILE *out, sd_client *c) {
    sd_client_service_stats ss;
    if (sd_client_stats(c, 10000, &ss) != SD_OK) return;
    char line[512];
    snprintf(line, sizeof line,
             "\ncoordinator step overhead (verify reply, or the draft reply it waited for -> next verify "
             "request): p50 %.1f us, p99 %.1f us\n"
             "verify steps held for drafts: %.0f%%, wait per step mean %.1f us, p99 %.1f us\n",
             ss.step_overhead_p50_us, ss.step_overhead_p99_us, 100.0 * ss.draft_wait_share, ss.draft_wait_mean_us,
             ss.draft_wait_p99_us);
    emit(out, line);
}

int bench_serve_main(int argc, char **argv) {
    serve_opts o;
    int prc = parse_serve_opts(argc, argv, &o);
    if (prc >= 0) {
        free(o.schema);
        return prc;
    }
    char *prompts[MAX_PROMPTS];
    int n_prompts = sd_bench_read_prompts(o.prompts_path, prompts, MAX_PROMPTS);
    if (n_prompts <= 0) {
        if (n_prompts == 0) fprintf(stderr, "specd-bench serve: no prompts in %s\n", o.prompts_path);
        free(o.schema);
        return 1;
    }
    int rc = 1;
    sd_client *c = NULL, *cv = NULL; /* cv: the --versus service */
    FILE *out = o.out_path ? fopen(o.out_path, "w") : NULL;
    sd_curve_id curve;
    memset(&curve, 0, sizeof curve);
    if (!connect_services(&o, &curve, &c, &cv)) goto done;
    char ratio_name[104];
    const bool modes_given = o.mode[0] != 0 || o.mode[1] != 1, labelled = o.labels[0][0] != '\0';
    if (labelled)
        snprintf(ratio_name, sizeof ratio_name, "%s / %s", o.labels[0], o.labels[1]);
    else
        snprintf(ratio_name, sizeof ratio_name, "%s / %s", serve_mode_names[o.mode[0]].name,
                 serve_mode_names[o.mode[1]].name);
    const serve_modes md = {
        .client = {c, cv ? cv : c},
        .draft = {cv ? 0 : serve_mode_names[o.mode[0]].max_k, cv ? 0 : serve_mode_names[o.mode[1]].max_k},
        .kind = {cv ? 0 : serve_mode_names[o.mode[0]].kind, cv ? 0 : serve_mode_names[o.mode[1]].kind},
        .label = {labelled ? o.labels[0]
                  : cv     ? "speculative, CurveZMQ"
                           : serve_mode_names[o.mode[0]].label,
                  labelled ? o.labels[1]
                  : cv     ? "speculative, plaintext"
                           : serve_mode_names[o.mode[1]].label},
        .ratio_name = labelled      ? ratio_name
                      : cv          ? "CURVE / plaintext"
                      : modes_given ? ratio_name
                                    : "spec / target",
        .versus = cv != NULL,
        .vs_target = cv == NULL && serve_mode_names[o.mode[1]].max_k < 0,
        .list_kinds = cv == NULL && modes_given};
    sd_client_service_stats ss;
    if (sd_client_stats(c, 10000, &ss) != SD_OK) {
        fprintf(stderr, "specd-bench serve: no answer from %s (is the service running?)\n", o.link.coordinator);
        goto done;
    }
    write_header(out, &md);
    int next_prompt = 0;
    char notes[8192] = ""; /* the ratios by round and the cost model's fit, under the table */
    for (char *tok = strtok(o.conc_list, ","); tok; tok = strtok(NULL, ",")) {
        int conc = atoi(tok);
        if (conc < 1 || conc > MAX_CONC) continue;
        run_concurrency(&o, &md, out, prompts, n_prompts, &next_prompt, conc, notes, sizeof notes);
    }
    printf("\n%s", notes);
    if (out) fprintf(out, "\n%s", notes);
    write_step_overhead(out, c);
    rc = 0;
done:
    sd_client_close(&c);
    sd_client_close(&cv);
    memset(&curve, 0, sizeof curve);
    if (out) fclose(out);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(o.schema);
    return rc;
}
