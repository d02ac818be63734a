/* gen_constrain.h — specd-generate's structured output: the constraint
 * from --json-schema FILE, --regex RE, --grammar FILE or --response-json,
 * and its figures for the report. */
#ifndef SPECD_GEN_CONSTRAIN_H
#define SPECD_GEN_CONSTRAIN_H

#include "specd/constrain.h"

#include "gen_result.h"

typedef struct gen_constraint {
    sd_grammar *grammar;
    sd_cvocab *vocab;
    sd_constraint *c; /* NULL when no constraint was asked for */
} gen_constraint;

/* Compiles the one constraint asked for (at most one of the four; none:
 * out->c stays NULL) over tok's vocabulary. 0, or 2 with a message on
 * stderr naming what the compiler refused. */
int gen_constraint_open(const char *schema_path, const char *regex, const char *grammar_path, bool response_json,
                        const sd_tok *tok, gen_constraint *out);
void gen_constraint_close(gen_constraint *gc);

/* Copies c's mask figures (count, cache hits, p50 / p99 / max us) to r. */
void gen_constraint_report(const sd_constraint *c, gen_result *r);

#endif
