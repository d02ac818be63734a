/* bench_prompts.c — reads the prompt files of bench/prompts/ (and the tests'
 * tests/data/spec_prompts.txt): one prompt per
 * line, "\n" written as backslash-n so a multi-line prompt (a function to
 * edit, a text to summarize) stays on one line. Shared by `specd-bench spec`
 * and `specd-bench serve`, so both modes send the same text, and by the
 * greedy tests (tests/greedy_util.c); specd-generate --prompt-file unescapes its
 * lines with sd_bench_unescape_newlines. */
#include "bench_prompts.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sd_bench_unescape_newlines(char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] == 'n') {
            *w++ = '\n';
            r++;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

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
        sd_bench_unescape_newlines(line);
        char *s = strdup(line);
        if (!s) break;
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
