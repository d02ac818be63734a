/* fuzz_constrain.c — libFuzzer target for the constraint compilers and
 * the matcher, which see client text (a JSON Schema, a regex, a grammar).
 *
 * The first byte picks the compiler (GBNF, regex, JSON Schema); the rest is
 * the constraint text up to the first NUL and, after it, an output to match.
 * Checked: compiling never crashes and either succeeds or writes a message;
 * matching the output and each of its prefixes never crashes, and matching
 * is a function of its input (twice the same answer). Limits are small so
 * that every input runs in milliseconds. A violation prints what and
 * aborts; ASan/UBSan catch the rest. Linked with replay.c it runs each file
 * named on its command line (the CTest replay of fuzz/corpus/constrain). */
#include "specd/constrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t rest = size - 1;
    const char *nul = memchr(text, '\0', rest);
    size_t text_len = nul ? (size_t)(nul - text) : rest;
    const char *out = nul ? nul + 1 : text + rest;
    size_t out_len = nul ? rest - text_len - 1 : 0;

    sd_constrain_limits lim = sd_constrain_default_limits();
    lim.max_text = 1 << 16;
    lim.max_rules = 2000;
    lim.max_elems = 20000;
    lim.max_repeat = 64;
    lim.max_depth = 16;
    lim.max_enum = 64;
    lim.max_stacks = 256;
    lim.max_expansions = 20000;
    sd_grammar *g = NULL;
    char err[256] = "";
    sd_status st;
    switch (data[0] % 3) {
    case 0: st = sd_grammar_from_gbnf(text, text_len, &lim, &g, err, sizeof err); break;
    case 1: st = sd_grammar_from_regex(text, text_len, &lim, &g, err, sizeof err); break;
    default: st = sd_grammar_from_json_schema(text, text_len, &lim, &g, err, sizeof err); break;
    }
    if (st != SD_OK) {
        if (g || !err[0]) {
            fprintf(stderr, "fuzz_constrain: a refusal (%d) without its message or with a grammar\n", (int)st);
            abort();
        }
        return 0;
    }
    for (size_t n = 0; n <= out_len && n <= 256; n++) {
        bool a = sd_grammar_match(g, out, n), b = sd_grammar_match(g, out, n);
        if (a != b) {
            fprintf(stderr, "fuzz_constrain: matching %zu bytes gave two answers\n", n);
            abort();
        }
    }
    sd_grammar_free(&g);
    return 0;
}
