/* constrain_check.c — a submitted constraint is compiled once before the
 * request is admitted, so a schema, regex or grammar the engine refuses is
 * a BAD_REQUEST naming the construct, before any work (issue 35). The
 * grammar is thrown away: the verifier compiles (and caches) its own. The
 * constraint engine is a library of its own (engine/constrain: no model
 * code), so the coordinator's link stays free of forward passes. */
#include "specd/constrain_cache.h"
#include "tokq.h"

#include <stdio.h>
#include <string.h>

bool sd_submit_check_constraint(sd_submit_job *j) {
    if (j->con_kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) return true;
    sd_constraint_kind kind = (sd_constraint_kind)j->con_kind;
    const char *text = j->con_text ? j->con_text : "";
    char err[400];
    sd_grammar *g = NULL;
    sd_status st = sd_grammar_compile(kind, text, strlen(text), NULL, &g, err, sizeof err);
    sd_grammar_free(&g);
    if (st == SD_OK) return true;
    j->code = st == SD_ERR_NOMEM ? SPECD__CODE__CODE_INTERNAL : SPECD__CODE__CODE_BAD_REQUEST;
    snprintf(j->msg, sizeof j->msg, "submit.constraint: the %s does not compile: %s", sd_constraint_kind_name(kind),
             err[0] ? err : sd_status_str(st));
    return false;
}
