/* bench_window.c — `specd-bench window`: decode at a long context on a
 * sliding-window model against a global-attention model of the same shape,
 * and the KV memory of each (engine/kv_window.c: a windowed layer holds
 * about a window per sequence, not the context).
 *
 * Each model gets a one-sequence cache from sd_model_kv_create (the
 * windowed one with its window group), a prompt of --ctx pseudo-random ids
 * (prefilled untimed, in chunks on the window group), then each repetition
 * times --decode-steps single-token forwards and truncates back to --ctx
 * (within the window's rollback slack, so the window survives). The models
 * take turns repetition by repetition, so a burst of load from another job
 * spoils one repetition of each rather than all of one; the figure is the
 * median tok/s, and the other processes' CPU use is reported beside it. */
#include "bench_hygiene.h"
#include "bench_stats.h"
#include "specd/common.h"
#include "specd/gguf.h"
#include "specd/kv.h"
#include "specd/model.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WIN_MAX_REPS = 64, WIN_MAX_STEPS = 32 };

typedef struct win_model {
    const char *path;
    sd_model *m;
    sd_kv *kv;
    double tok_s[WIN_MAX_REPS];
    int32_t window;
} win_model;

static bool load(win_model *w, int threads, int ctx, int steps) {
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(w->path, &g, err, sizeof err) != SD_OK) {
        fprintf(stderr, "specd-bench: %s: %s\n", w->path, err);
        return false;
    }
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = threads;
    sd_status s = sd_model_load(g, &mp, &w->m);
    sd_gguf_close(&g);
    if (s == SD_OK) s = sd_model_kv_create(w->m, 1, (ctx + steps + 15) / 16 + 1, 16, &w->kv);
    if (s != SD_OK) {
        fprintf(stderr, "specd-bench: cannot load %s or make its cache: %s\n", w->path, sd_status_str(s));
        return false;
    }
    w->window = sd_model_config_of(w->m)->sliding_window;
    return true;
}

static int32_t token_at(const sd_model *m, int i) {
    return (int32_t)(((uint32_t)i * 2654435761u + 12345u) % (uint32_t)sd_model_config_of(m)->n_vocab);
}

/* Forwards positions [from, to) one call each (decode), or in one call. */
static bool run(win_model *w, int from, int to, bool one_call, float *logits) {
    int n = one_call ? to - from : 1;
    int32_t *tok = malloc((size_t)n * sizeof *tok), *pos = malloc((size_t)n * sizeof *pos);
    int32_t *seq = calloc((size_t)n, sizeof *seq);
    bool *want = calloc((size_t)n, sizeof *want), ok = tok && pos && seq && want;
    for (int p = from; ok && p < to; p += n) {
        for (int i = 0; i < n; i++) tok[i] = token_at(w->m, p + i), pos[i] = p + i;
        want[n - 1] = true;
        sd_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
        ok = sd_model_forward(w->m, w->kv, &b, logits) == SD_OK;
    }
    free(tok), free(pos), free(seq), free(want);
    return ok;
}

static void write_table(FILE *f, win_model *w, int n_reps, int ctx, int steps, int threads, double other) {
    fprintf(f, "| model | window | KV pools (MiB) | decode tok/s at %d (median of %d x %d steps) |\n", ctx, n_reps,
            steps);
    fprintf(f, "| --- | --- | --- | --- |\n");
    for (int i = 0; i < 2; i++)
        fprintf(f, "| %s | %d | %.1f | %.2f |\n", w[i].path, (int)w[i].window,
                (double)sd_kv_pool_bytes(w[i].kv) / 1048576.0, sd_bench_median(w[i].tok_s, n_reps));
    fprintf(f, "\n%d threads; other processes used a median %.2f cores during the repetitions (noisy if > 0.25).\n",
            threads, other);
}

int bench_window_main(int argc, char **argv) {
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"global", required_argument, 0, 'g'},
                                          {"ctx", required_argument, 0, 'c'},
                                          {"decode-steps", required_argument, 0, 'D'},
                                          {"reps", required_argument, 0, 'r'},
                                          {"threads", required_argument, 0, 't'},
                                          {"out", required_argument, 0, 'o'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    win_model w[2] = {{0}};
    int ctx = 4096, steps = 16, reps = 5, threads = 0, c;
    const char *out_path = NULL;
    optind = 2;
    while ((c = getopt_long(argc, argv, "m:g:c:D:r:t:o:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': w[0].path = optarg; break;
        case 'g': w[1].path = optarg; break;
        case 'c': ctx = atoi(optarg); break;
        case 'D': steps = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'o': out_path = optarg; break;
        case 'h':
            printf("usage: specd-bench window -m WINDOWED.gguf -g GLOBAL.gguf [--ctx N (4096)] [--decode-steps N "
                   "(16, <= %d)] [-r REPS (5)] [-t THREADS] [-o FILE]\n",
                   WIN_MAX_STEPS);
            return 0;
        default: return 2;
        }
    }
    if (!w[0].path || !w[1].path || ctx < 1 || ctx > (1 << 20) || steps < 1 || steps > WIN_MAX_STEPS || reps < 1 ||
        reps > WIN_MAX_REPS || threads < 0) {
        fprintf(stderr,
                "specd-bench window: needs -m and -g, --ctx in [1, 2^20], --decode-steps in [1, %d], "
                "-r in [1, %d] (see --help)\n",
                WIN_MAX_STEPS, WIN_MAX_REPS);
        return 2;
    }
    int rc = 1;
    float *logits = NULL;
    double other[WIN_MAX_REPS];
    for (int i = 0; i < 2; i++)
        if (!load(&w[i], threads, ctx, steps)) goto done;
    size_t vocab = (size_t)sd_model_config_of(w[0].m)->n_vocab;
    if ((size_t)sd_model_config_of(w[1].m)->n_vocab > vocab) vocab = (size_t)sd_model_config_of(w[1].m)->n_vocab;
    logits = malloc(vocab * sizeof *logits);
    if (!logits) goto done;
    for (int i = 0; i < 2; i++) {
        fprintf(stderr, "specd-bench: prefilling %d tokens on %s\n", ctx, w[i].path);
        if (!run(&w[i], 0, ctx, true, logits)) goto done;
    }
    for (int r = 0; r < reps; r++) {
        sd_hyg_mark h0 = sd_hyg_now(NULL);
        for (int i = 0; i < 2; i++) {
            double t0 = sd_now();
            if (!run(&w[i], ctx, ctx + steps, false, logits)) goto done;
            w[i].tok_s[r] = steps / (sd_now() - t0);
            if (sd_kv_truncate(w[i].kv, 0, ctx) != SD_OK || sd_kv_seq_len(w[i].kv, 0) != ctx) goto done;
        }
        sd_hyg_mark h1 = sd_hyg_now(NULL);
        other[r] = sd_hyg_other_cores(&h0, &h1);
        fprintf(stderr, "specd-bench: repetition %d/%d: %.2f vs %.2f tok/s\n", r + 1, reps, w[0].tok_s[r],
                w[1].tok_s[r]);
    }
    double other_med = sd_bench_median(other, reps);
    write_table(stdout, w, reps, ctx, steps, threads, other_med);
    if (out_path) {
        FILE *f = fopen(out_path, "w");
        if (!f) {
            fprintf(stderr, "specd-bench: cannot write %s: %s\n", out_path, strerror(errno));
            goto done;
        }
        write_table(f, w, reps, ctx, steps, threads, other_med);
        fclose(f);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "specd-bench: window benchmark failed (see the log above)\n");
    for (int i = 0; i < 2; i++) sd_kv_free(&w[i].kv), sd_model_free(&w[i].m);
    free(logits);
    return rc;
}
