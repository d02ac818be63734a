/* constrain_cli — the constraint engine driven from the Python oracles.
 *
 *   constrain_cli regex PATTERN   reads lines of hex-encoded bytes on stdin
 *   constrain_cli gbnf FILE       and prints 1 or 0 per line: the whole
 *   constrain_cli schema FILE     input matches (sd_grammar_match)
 *   constrain_cli gbnf-of FILE    prints the GBNF a JSON Schema compiles to
 *
 * A refused constraint prints "ERR <message>" and exits 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/constrain.h"

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
    if (argc != 3) {
        fprintf(stderr, "usage: constrain_cli regex|gbnf|schema|gbnf-of ARG\n");
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
    if (!strcmp(mode, "regex")) st = sd_grammar_from_regex(argv[2], strlen(argv[2]), NULL, &g, err, sizeof err);
    else if (!strcmp(mode, "gbnf")) st = sd_grammar_from_gbnf(text, len, NULL, &g, err, sizeof err);
    else st = sd_grammar_from_json_schema(text, len, NULL, &g, err, sizeof err);
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
