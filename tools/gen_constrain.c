/* gen_constrain.c — specd-generate's structured output (gen_constrain.h). */
#include "gen_constrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file, malloc'd and NUL-terminated; NULL with a message. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "specd-generate: cannot open %s\n", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        if (cap >= (64u << 20)) { /* far above the compilers' own limit: they refuse it by size */
            break;
        }
        char *q = realloc(buf, cap * 2 + 1);
        if (!q) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = q;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "specd-generate: out of memory reading %s\n", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int gen_constraint_open(const char *schema_path, const char *regex, const char *grammar_path, bool response_json,
                        const sd_tok *tok, gen_constraint *out) {
    memset(out, 0, sizeof *out);
    int n_asked = (schema_path != NULL) + (regex != NULL) + (grammar_path != NULL) + response_json;
    if (n_asked == 0) return 0;
    if (n_asked > 1) {
        fprintf(stderr, "specd-generate: --json-schema, --regex, --grammar and --response-json exclude each other\n");
        return 2;
    }
    char err[512] = "";
    sd_status st;
    const char *what;
    if (response_json) {
        what = "--response-json";
        st = sd_grammar_json_any(true, &out->grammar);
    } else if (regex) {
        what = "--regex";
        st = sd_grammar_from_regex(regex, strlen(regex), NULL, &out->grammar, err, sizeof err);
    } else {
        what = schema_path ? "--json-schema" : "--grammar";
        size_t len = 0;
        char *text = read_file(schema_path ? schema_path : grammar_path, &len);
        if (!text) return 2;
        st = schema_path ? sd_grammar_from_json_schema(text, len, NULL, &out->grammar, err, sizeof err)
                         : sd_grammar_from_gbnf(text, len, NULL, &out->grammar, err, sizeof err);
        free(text);
    }
    if (st == SD_OK) st = sd_cvocab_create(tok, &out->vocab);
    if (st == SD_OK) st = sd_constraint_create(out->grammar, out->vocab, &out->c);
    if (st != SD_OK) {
        fprintf(stderr, "specd-generate: %s refused: %s\n", what, err[0] ? err : sd_status_str(st));
        gen_constraint_close(out);
        return 2;
    }
    return 0;
}

void gen_constraint_close(gen_constraint *gc) {
    sd_constraint_free(&gc->c);
    sd_cvocab_free(&gc->vocab);
    sd_grammar_free(&gc->grammar);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

void gen_constraint_report(const sd_constraint *c, gen_result *r) {
    if (!c) return;
    sd_constraint_stats st = sd_constraint_get_stats(c);
    r->constrained = true;
    r->masks = st.masks;
    r->mask_hits = st.hits;
    if (st.n_times <= 0) return;
    float *t = malloc((size_t)st.n_times * sizeof *t);
    if (!t) return;
    memcpy(t, st.mask_us, (size_t)st.n_times * sizeof *t);
    qsort(t, (size_t)st.n_times, sizeof *t, cmp_float);
    r->mask_p50_us = t[(st.n_times - 1) / 2];
    r->mask_p99_us = t[(int32_t)((st.n_times - 1) * 0.99)];
    r->mask_max_us = t[st.n_times - 1];
    double sum = 0;
    for (int32_t i = 0; i < st.n_times; i++) sum += t[i];
    r->mask_mean_us = sum / st.n_times;
    free(t);
}
