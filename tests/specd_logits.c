/* specd_logits — dump the engine's logits for a few token sequences, for the
 * forward-pass oracle (tests/ref/test_forward_oracle.py).
 *
 *   specd_logits -m MODEL.gguf|HF_DIR --out FILE.bin [--threads N] [--chunk N]
 *                [--layers N] [--max-ctx N] --seq 1,2,3 --seq 4,5 ...
 *
 * All sequences run as ONE ragged batch (sequence s in KV slot s, positions
 * from 0), their tokens interleaved round-robin — s0p0, s1p0, s2p0, s0p1, ...
 * — so the forward pass sees sequences of different lengths mixed together.
 * With --chunk N the same interleaved token list is cut into successive
 * forward calls of at most N tokens, which also exercises attention over
 * K/V written by earlier calls. Logits are asked for on every token and the
 * file holds raw little-endian f32 [total_tokens][n_vocab], ordered by
 * sequence, then position (not batch order). --layers N runs only the first N
 * blocks (then the final norm and LM head), as sd_model_params.n_layers_used;
 * --max-ctx N loads the model for sequences of at most N tokens
 * (sd_model_params.max_ctx: a LongRoPE model's factor set). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/gguf.h"
#include "specd/cli.h"
#include "specd/kv.h"
#include "specd/model.h"
#include "specd/backend_opts.h"
#include "specd/weights.h"

#define MAX_SEQS 64

typedef struct seq_list {
    int32_t n_seqs;
    int32_t len[MAX_SEQS];
    int32_t *ids[MAX_SEQS];
} seq_list;

static void usage(FILE *f) {
    fprintf(f, "usage: specd_logits -m MODEL.gguf|HF_DIR --out FILE.bin [--threads N] [--chunk N] [--layers N] "
               "[--max-ctx N] --seq 1,2,3 [--seq ...] [backend switches]\n\n" SD_BACKEND_OPTIONS_USAGE);
}

/* Parses "1,2,3" into a new array (caller frees). */
static bool parse_ids(const char *s, int32_t **ids, int32_t *n) {
    int32_t cap = 1;
    for (const char *c = s; *c; c++) cap += *c == ',';
    int32_t *out = malloc((size_t)cap * sizeof *out);
    if (!out) return false;
    int32_t k = 0;
    const char *c = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (errno || end == c || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(out);
            return false;
        }
        out[k++] = (int32_t)v;
        if (!*end) break;
        c = end + 1;
    }
    *ids = out;
    *n = k;
    return true;
}

/* Writes n floats little-endian, whatever the host's byte order. */
static bool write_f32le(FILE *f, const float *x, size_t n) {
    unsigned char buf[4096];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        buf[used++] = (unsigned char)u;
        buf[used++] = (unsigned char)(u >> 8);
        buf[used++] = (unsigned char)(u >> 16);
        buf[used++] = (unsigned char)(u >> 24);
        if (used == sizeof buf || i + 1 == n) {
            if (fwrite(buf, 1, used, f) != used) return false;
            used = 0;
        }
    }
    return true;
}

static int run(const char *model_path, const char *out_path, int threads, int chunk, const int layers_ctx[2],
               const seq_list *sl, const sd_backend_opts *backend) {
    int rc = 1;
    sd_weights *w = NULL;
    sd_model *m = NULL;
    sd_kv *kv = NULL;
    int32_t *tokens = NULL, *pos = NULL, *seq = NULL, *row_of = NULL;
    bool *want = NULL;
    float *logits = NULL, *ordered = NULL;
    FILE *f = NULL;
    sd_status st;

    if ((st = sd_weights_open(model_path, &w)) != SD_OK) {
        fprintf(stderr, "specd_logits: %s: %s (see the log above)\n", model_path, sd_status_str(st));
        goto done;
    }
    sd_model_params mp = sd_model_default_params();
    mp.backend = *backend;
    mp.n_threads = threads;
    mp.n_layers_used = layers_ctx[0];
    mp.max_ctx = layers_ctx[1];
    if ((st = sd_model_load_weights(w, &mp, &m)) != SD_OK) {
        fprintf(stderr, "specd_logits: loading %s: %s\n", model_path, sd_status_str(st));
        goto done;
    }
    sd_weights_close(&w);
    const int32_t n_vocab = sd_model_config_of(m)->n_vocab;

    /* Batch order: round-robin over sequences; row_of maps (seq, pos) order
     * to batch order. */
    int32_t total = 0, max_len = 0, n_blocks = 0;
    int32_t first_row[MAX_SEQS];
    for (int32_t s = 0; s < sl->n_seqs; s++) {
        first_row[s] = total;
        total += sl->len[s];
        if (sl->len[s] > max_len) max_len = sl->len[s];
        n_blocks += (sl->len[s] + 15) / 16;
    }
    tokens = malloc((size_t)total * sizeof *tokens);
    pos = malloc((size_t)total * sizeof *pos);
    seq = malloc((size_t)total * sizeof *seq);
    row_of = malloc((size_t)total * sizeof *row_of);
    want = malloc((size_t)total * sizeof *want);
    logits = malloc((size_t)total * (size_t)n_vocab * sizeof *logits);   /* [total][n_vocab], batch order */
    ordered = malloc((size_t)total * (size_t)n_vocab * sizeof *ordered); /* [total][n_vocab], seq order */
    if (!tokens || !pos || !seq || !row_of || !want || !logits || !ordered) {
        fprintf(stderr, "specd_logits: out of memory for %d tokens x %d logits\n", (int)total, (int)n_vocab);
        goto done;
    }
    int32_t b = 0;
    for (int32_t p = 0; p < max_len; p++)
        for (int32_t s = 0; s < sl->n_seqs; s++) {
            if (p >= sl->len[s]) continue;
            tokens[b] = sl->ids[s][p];
            pos[b] = p;
            seq[b] = s;
            want[b] = true;
            row_of[first_row[s] + p] = b;
            b++;
        }

    if ((st = sd_model_kv_create(m, sl->n_seqs, n_blocks + sl->n_seqs, 16, &kv)) != SD_OK) {
        fprintf(stderr, "specd_logits: KV cache: %s\n", sd_status_str(st));
        goto done;
    }
    int32_t step = chunk > 0 ? chunk : total;
    for (int32_t start = 0; start < total; start += step) {
        int32_t n = total - start < step ? total - start : step;
        sd_batch batch = {
            .n_tokens = n, .tokens = tokens + start, .pos = pos + start, .seq = seq + start, .logits = want + start};
        if ((st = sd_model_forward(m, kv, &batch, logits + (size_t)start * (size_t)n_vocab)) != SD_OK) {
            fprintf(stderr, "specd_logits: forward of tokens %d..%d: %s\n", (int)start, (int)(start + n),
                    sd_status_str(st));
            goto done;
        }
    }
    for (int32_t r = 0; r < total; r++)
        memcpy(ordered + (size_t)r * (size_t)n_vocab, logits + (size_t)row_of[r] * (size_t)n_vocab,
               (size_t)n_vocab * sizeof *ordered);

    f = fopen(out_path, "wb");
    if (!f || !write_f32le(f, ordered, (size_t)total * (size_t)n_vocab)) {
        fprintf(stderr, "specd_logits: cannot write %s: %s\n", out_path, strerror(errno));
        goto done;
    }
    if (fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "specd_logits: cannot write %s: %s\n", out_path, strerror(errno));
        goto done;
    }
    f = NULL;
    fprintf(stderr, "specd_logits: %d sequences, %d tokens, %d vocab -> %s\n", (int)sl->n_seqs, (int)total,
            (int)n_vocab, out_path);
    rc = 0;

done:
    if (f) fclose(f);
    free(tokens);
    free(pos);
    free(seq);
    free(row_of);
    free(want);
    free(logits);
    free(ordered);
    sd_kv_free(&kv);
    sd_model_free(&m);
    sd_weights_close(&w);
    return rc;
}

int main(int argc, char **argv) {
    enum { O_OUT = 256, O_THREADS, O_SEQ, O_CHUNK, O_LAYERS, O_MAX_CTX };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"out", required_argument, NULL, O_OUT},
        {"threads", required_argument, NULL, O_THREADS},
        {"seq", required_argument, NULL, O_SEQ},
        {"chunk", required_argument, NULL, O_CHUNK},
        {"layers", required_argument, NULL, O_LAYERS},
        {"max-ctx", required_argument, NULL, O_MAX_CTX},
        {"help", no_argument, NULL, 'h'},
        SD_BACKEND_LONG_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *out = NULL;
    int threads = 0, chunk = 0, layers_ctx[2] = {0, 0}, rc = 2, c; /* --layers, --max-ctx */
    seq_list sl = {0};
    sd_backend_opts backend = sd_backend_default_opts();
    int li = 0;
    while ((c = getopt_long(argc, argv, "m:h", opts, &li)) != -1) {
        switch (c) {
        case SD_BACKEND_OPTION:
            if (!sd_backend_opts_parse(&backend, opts[li].name, optarg, "specd_logits")) goto done;
            break;
        case 'm': model = optarg; break;
        case O_OUT: out = optarg; break;
        case O_THREADS:
            if (!sd_cli_parse_int(optarg, 0, 1024, &threads)) {
                fprintf(stderr, "specd_logits: --threads must be in 0..1024 (got '%s')\n", optarg);
                goto done;
            }
            break;
        case O_CHUNK:
            if (!sd_cli_parse_int(optarg, 1, 1 << 20, &chunk)) {
                fprintf(stderr, "specd_logits: --chunk must be in 1..1048576 (got '%s')\n", optarg);
                goto done;
            }
            break;
        case O_LAYERS:
        case O_MAX_CTX:
            if (!sd_cli_parse_int(optarg, 0, 1 << 30, &layers_ctx[c == O_MAX_CTX])) {
                fprintf(stderr, "specd_logits: --%s must be >= 0 (got '%s')\n", opts[li].name, optarg);
                goto done;
            }
            break;
        case O_SEQ:
            if (sl.n_seqs == MAX_SEQS) {
                fprintf(stderr, "specd_logits: at most %d --seq\n", MAX_SEQS);
                goto done;
            }
            if (!parse_ids(optarg, &sl.ids[sl.n_seqs], &sl.len[sl.n_seqs])) {
                fprintf(stderr, "specd_logits: --seq wants comma-separated token ids (got '%s')\n", optarg);
                goto done;
            }
            sl.n_seqs++;
            break;
        case 'h':
            usage(stdout);
            rc = 0;
            goto done;
        default: usage(stderr); goto done;
        }
    }
    if (!model || !out || sl.n_seqs == 0 || optind != argc) {
        usage(stderr);
        goto done;
    }
    rc = run(model, out, threads, chunk, layers_ctx, &sl, &backend);
done:
    for (int32_t s = 0; s < sl.n_seqs; s++) free(sl.ids[s]);
    return rc;
}
