/* constrain_cli — the constraint engine driven from the Python oracles.
 *
 *   constrain_cli regex PATTERN   reads lines of hex-encoded bytes on stdin
 *   constrain_cli gbnf FILE       and prints 1 or 0 per line: the whole
 *   constrain_cli schema FILE     input matches (sd_grammar_match)
 *   constrain_cli gbnf-of FILE    prints the GBNF a JSON Schema compiles to
 *   constrain_cli mask-bench SCHEMA MODEL.gguf [STEPS]
 *                                 the mask cost on MODEL's vocabulary along a
 *                                 random path through SCHEMA's language: the
 *                                 schema's compile time, and p50 / p99 / max
 *                                 us of a mask computed (first visit of a
 *                                 state) and served from the cache, and of
 *                                 an EAGLE head's mask per drafted position
 *                                 (sd_constraint_apply_ids on a cached mask,
 *                                 the whole vocabulary and 8192 draft ids
 *                                 mapped), as JSON
 *   constrain_cli replay SCHEMA MODEL.gguf
 *                                 reads token ids (an output of specd-generate
 *                                 under SCHEMA) on stdin and replays them: per
 *                                 step the mask (sd_constraint_mask, first
 *                                 visit) and sd_constraint_apply on a logits
 *                                 row (the mask then cached), their sums and
 *                                 p50 / p99 us, as JSON
 *
 * A refused constraint prints "ERR <message>" and exits 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/constrain.h"
#include "specd/gguf.h"

#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void pct(const char *name, double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    printf("\"%s_p50_us\":%.2f,\"%s_p99_us\":%.2f,\"%s_max_us\":%.2f", name, n ? v[(n - 1) / 2] : 0, name,
           n ? v[(int)((n - 1) * 0.99)] : 0, name, n ? v[n - 1] : 0);
}

/* A random walk of steps tokens (a fixed seed) through the schema's
 * language; each state's mask timed when computed and again when cached. */
static int mask_bench(const char *text, size_t len, const char *model, int steps) {
    char err[512] = "";
    sd_gguf *gg = NULL;
    sd_tok *t = NULL;
    if (sd_gguf_open(model, &gg, err, sizeof err) != SD_OK || sd_tok_from_gguf(gg, &t) != SD_OK) {
        fprintf(stderr, "constrain_cli: cannot read the tokenizer of %s %s\n", model, err);
        return 2;
    }
    sd_gguf_close(&gg);
    double t0 = now_us();
    sd_grammar *g = NULL;
    if (sd_grammar_from_json_schema(text, len, NULL, &g, err, sizeof err) != SD_OK) {
        printf("ERR %s\n", err);
        sd_tok_free(&t);
        return 3;
    }
    double compile_us = now_us() - t0;
    t0 = now_us();
    sd_cvocab *v = NULL;
    sd_constraint *c = NULL;
    if (sd_cvocab_create(t, &v) != SD_OK || sd_constraint_create(g, v, &c) != SD_OK) return 2;
    double vocab_us = now_us() - t0;
    double *fresh = malloc((size_t)steps * sizeof *fresh), *hit = malloc((size_t)steps * sizeof *hit);
    double *head_full = malloc((size_t)steps * sizeof *head_full), *head_8k = malloc((size_t)steps * sizeof *head_8k);
    const int32_t V = sd_tok_n_vocab(t), VD = V < 8192 ? V : 8192;
    int32_t *allowed = malloc((size_t)V * sizeof *allowed), *d2t = malloc((size_t)VD * sizeof *d2t);
    float *logits = malloc((size_t)V * sizeof *logits);
    for (int32_t i = 0; d2t && i < VD; i++) d2t[i] = (int32_t)((int64_t)i * V / VD); /* draft ids spread over V */
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int n = 0;
    for (; n < steps && fresh && hit && allowed && head_full && head_8k && d2t && logits; n++) {
        const uint32_t *bits;
        sd_constraint_stats before = sd_constraint_get_stats(c);
        t0 = now_us();
        sd_constraint_mask(c, &bits);
        double first = now_us() - t0;
        t0 = now_us();
        sd_constraint_mask(c, &bits);
        hit[n] = now_us() - t0;
        fresh[n] = sd_constraint_get_stats(c).hits > before.hits + 1 ? -1 : first; /* -1: the state was cached */
        bool any;
        memset(logits, 0, (size_t)V * sizeof *logits);
        t0 = now_us();
        sd_constraint_apply_ids(c, logits, V, NULL, &any);
        head_full[n] = now_us() - t0;
        memset(logits, 0, (size_t)VD * sizeof *logits);
        t0 = now_us();
        sd_constraint_apply_ids(c, logits, VD, d2t, &any);
        head_8k[n] = now_us() - t0;
        int32_t n_allowed = 0;
        for (int32_t id = 0; id < sd_tok_n_vocab(t); id++)
            if (bits[id >> 5] >> (id & 31) & 1u && !sd_tok_is_eog(t, id)) allowed[n_allowed++] = id;
        if (!n_allowed) break;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        sd_constraint_advance(c, allowed[rng % (uint64_t)n_allowed]);
    }
    int n_fresh = 0;
    for (int i = 0; i < n; i++)
        if (fresh[i] >= 0) fresh[n_fresh++] = fresh[i];
    printf("{\"n_vocab\":%d,\"steps\":%d,\"compile_us\":%.1f,\"vocab_trie_us\":%.1f,\"computed\":%d,",
           (int)sd_tok_n_vocab(t), n, compile_us, vocab_us, n_fresh);
    pct("computed", fresh, n_fresh);
    printf(",");
    pct("cached", hit, n);
    printf(",");
    pct("head_mask_full", head_full, n);
    printf(",");
    pct("head_mask_8192", head_8k, n);
    printf("}\n");
    free(fresh);
    free(hit);
    free(head_full);
    free(head_8k);
    free(d2t);
    free(logits);
    free(allowed);
    sd_constraint_free(&c);
    sd_cvocab_free(&v);
    sd_grammar_free(&g);
    sd_tok_free(&t);
    return 0;
}

/* The token ids on stdin replayed under the schema: what a constrained
 * decode spends per step on the mask and on applying it. */
static int replay(const char *text, size_t len, const char *model) {
    char err[512] = "";
    sd_gguf *gg = NULL;
    sd_tok *t = NULL;
    if (sd_gguf_open(model, &gg, err, sizeof err) != SD_OK || sd_tok_from_gguf(gg, &t) != SD_OK) {
        fprintf(stderr, "constrain_cli: cannot read the tokenizer of %s %s\n", model, err);
        return 2;
    }
    sd_gguf_close(&gg);
    sd_grammar *g = NULL;
    sd_cvocab *v = NULL;
    sd_constraint *c = NULL;
    if (sd_grammar_from_json_schema(text, len, NULL, &g, err, sizeof err) != SD_OK) {
        printf("ERR %s\n", err);
        sd_tok_free(&t);
        return 3;
    }
    if (sd_cvocab_create(t, &v) != SD_OK || sd_constraint_create(g, v, &c) != SD_OK) return 2;
    const int32_t V = sd_tok_n_vocab(t);
    enum { MAX_STEPS = 65536 };
    double *mask = malloc(MAX_STEPS * sizeof *mask), *apply = malloc(MAX_STEPS * sizeof *apply);
    float *logits = malloc((size_t)V * sizeof *logits);
    int n = 0, id, rc = 0;
    double sum_mask = 0, sum_apply = 0;
    while (mask && apply && logits && n < MAX_STEPS && scanf("%d", &id) == 1) {
        const uint32_t *bits;
        double t0 = now_us();
        sd_constraint_mask(c, &bits);
        mask[n] = now_us() - t0;
        for (int32_t i = 0; i < V; i++) logits[i] = (float)(i & 7);
        t0 = now_us();
        sd_constraint_apply(c, logits, V);
        apply[n] = now_us() - t0;
        sum_mask += mask[n];
        sum_apply += apply[n];
        n++;
        if (sd_constraint_advance(c, id) != SD_OK) {
            fprintf(stderr, "constrain_cli: token %d (id %d) breaks the constraint\n", n - 1, id);
            rc = 1;
            break;
        }
    }
    printf("{\"steps\":%d,\"mask_sum_us\":%.1f,\"apply_sum_us\":%.1f,", n, sum_mask, sum_apply);
    pct("mask", mask, n);
    printf(",");
    pct("apply", apply, n);
    printf("}\n");
    free(mask);
    free(apply);
    free(logits);
    sd_constraint_free(&c);
    sd_cvocab_free(&v);
    sd_grammar_free(&g);
    sd_tok_free(&t);
    return rc;
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *q = realloc(buf, cap * 2 + 1);
            if (!q) {
                free(buf);
                return NULL;
            }
            buf = q;
            cap *= 2;
        }
    }
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

int main(int argc, char **argv) {
    if (argc < 3 || (argc > 3 && strcmp(argv[1], "mask-bench") != 0 && strcmp(argv[1], "replay") != 0)) {
        fprintf(stderr, "usage: constrain_cli regex|gbnf|schema|gbnf-of ARG | mask-bench SCHEMA MODEL [STEPS] | replay "
                        "SCHEMA MODEL\n");
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_OFF, "constrain_cli");
    const char *mode = argv[1];
    char *text = NULL;
    size_t len = 0;
    if (strcmp(mode, "regex") != 0) {
        FILE *f = fopen(argv[2], "rb");
        if (!f || !(text = read_all(f, &len))) {
            fprintf(stderr, "constrain_cli: cannot read %s\n", argv[2]);
            return 2;
        }
        fclose(f);
    }
    if (!strcmp(mode, "mask-bench")) {
        int rc = argc >= 4 ? mask_bench(text, len, argv[3], argc >= 5 ? atoi(argv[4]) : 200) : 2;
        free(text);
        return rc;
    }
    if (!strcmp(mode, "replay")) {
        int rc = argc >= 4 ? replay(text, len, argv[3]) : 2;
        free(text);
        return rc;
    }
    char err[512] = "";
    sd_grammar *g = NULL;
    sd_status st;
    if (!strcmp(mode, "gbnf-of")) {
        char *gbnf = NULL;
        st = sd_json_schema_to_gbnf(text, len, NULL, &gbnf, err, sizeof err);
        if (st == SD_OK) fputs(gbnf, stdout);
        free(gbnf);
        free(text);
        if (st != SD_OK) printf("ERR %s\n", err);
        return st == SD_OK ? 0 : 3;
    }
    if (!strcmp(mode, "regex"))
        st = sd_grammar_from_regex(argv[2], strlen(argv[2]), NULL, &g, err, sizeof err);
    else if (!strcmp(mode, "gbnf"))
        st = sd_grammar_from_gbnf(text, len, NULL, &g, err, sizeof err);
    else
        st = sd_grammar_from_json_schema(text, len, NULL, &g, err, sizeof err);
    free(text);
    if (st != SD_OK) {
        printf("ERR %s\n", err);
        return 3;
    }
    char line[65536], bytes[32768];
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        for (size_t i = 0; line[i] && line[i + 1] && hexval(line[i]) >= 0 && n < sizeof bytes; i += 2)
            bytes[n++] = (char)(hexval(line[i]) * 16 + hexval(line[i + 1]));
        printf("%d\n", sd_grammar_match(g, bytes, n) ? 1 : 0);
    }
    sd_grammar_free(&g);
    return 0;
}
