/* bench_prompts.c — reads the prompt files of bench/prompts/, the tests'
 * tests/data/spec_prompts.txt and tools/eagle/prompts/train.txt: one prompt
 * per line, "\n" written as backslash-n so a multi-line prompt (a function
 * to edit, a text to summarize) stays on one line; empty lines and lines
 * starting with "#" (a file's header) are skipped. One reader for
 * `specd-bench spec` and `specd-bench serve`, so both modes send the same
 * text, for specd-generate --prompt-file (tools/gen_features.c) and for the
 * greedy tests (tests/greedy_util.c). */
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

void sd_bench_prompts_free(char **lines, size_t n) {
    for (size_t i = 0; lines && i < n; i++) free(lines[i]);
    free(lines);
}

int sd_bench_read_prompt_file(const char *path, char ***out, size_t *n) {
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open the prompt file %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **lines = NULL, *line = NULL;
    size_t cap = 0, lcap = 0;
    ssize_t len;
    bool nomem = false;
    while (!nomem && (len = getline(&line, &lcap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0 || line[0] == '#') continue;
        sd_bench_unescape_newlines(line);
        if (*n == cap) {
            char **bigger = realloc(lines, (cap ? cap * 2 : 64) * sizeof *bigger);
            if (!bigger) {
                nomem = true;
                break;
            }
            lines = bigger;
            cap = cap ? cap * 2 : 64;
        }
        if (!(lines[*n] = strdup(line)))
            nomem = true;
        else
            (*n)++;
    }
    const bool failed = ferror(f);
    free(line);
    fclose(f);
    if (failed || nomem) {
        fprintf(stderr, "reading the prompt file %s failed: %s\n", path, nomem ? "out of memory" : "read error");
        sd_bench_prompts_free(lines, *n);
        *n = 0;
        return -1;
    }
    *out = lines;
    return 0;
}

int sd_bench_read_prompts(const char *path, char **out, int max) {
    char **all = NULL;
    size_t n = 0;
    if (sd_bench_read_prompt_file(path, &all, &n) != 0) return -1;
    const size_t keep = max <= 0 ? 0 : n < (size_t)max ? n : (size_t)max;
    if (keep > 0) memcpy(out, all, keep * sizeof *out);
    for (size_t i = keep; i < n; i++) free(all[i]);
    free(all);
    return (int)keep;
}
