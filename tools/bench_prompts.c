/* bench_prompts.c — reads the prompt files of bench/prompts/ (and the tests'
 * tests/data/spec_prompts.txt): one prompt per
 * line, "\n" written as backslash-n so a multi-line prompt (a function to
 * edit, a text to summarize) stays on one line. Shared by `specd-bench spec`
 * and `specd-bench serve`, so both modes send the same text, and by the
 * greedy tests (tests/greedy_util.c). */
#include "bench_prompts.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sd_bench_read_prompts(const char *path, char **out, int max) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "specd-bench: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    while (n < max && (len = getline(&line, &cap, f)) >= 0) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0]) continue;
        char *s = malloc(strlen(line) + 1), *o = s;
        if (!s) break;
        for (const char *c = line; *c; c++) {
            if (c[0] == '\\' && c[1] == 'n') {
                *o++ = '\n';
                c++;
            } else {
                *o++ = *c;
            }
        }
        *o = '\0';
        out[n++] = s;
    }
    bool failed = ferror(f);
    free(line);
    fclose(f);
    if (failed) {
        fprintf(stderr, "specd-bench: reading %s failed\n", path);
        for (int i = 0; i < n; i++) free(out[i]);
        return -1;
    }
    return n;
}
