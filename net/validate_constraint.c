/* validate_constraint.c — the checks of a Constraint (structured output,
 * issue 35) where it enters a process: on a SubmitRequest (the client
 * link) and on a VerifySeq or DraftSeq (the worker link). The decoder checks its shape
 * only: a known kind, text present exactly when the kind has one, UTF-8,
 * at most SD_MAX_CONSTRAINT_BYTES. Whether the text compiles is the
 * constraint engine's to say (engine/constrain), which the coordinator asks
 * before admitting the request. */
#include "validate_impl.h"

#include <stdio.h>
#include <string.h>

bool sd_nv_check_constraint(vctx *v, const char *path, const Specd__Constraint *c) {
    if (!c) return true;
    char tpath[96];
    size_t len = c->text ? strlen(c->text) : 0;
    switch (c->kind) {
    case SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE:
    case SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT:
        if (len > 0)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.text: %zu bytes for kind %d, which takes none", path,
                              len, (int)c->kind);
        return true;
    case SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA:
    case SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX:
    case SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR:
        if (len == 0) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.text: empty", path);
        snprintf(tpath, sizeof tpath, "%s.text", path);
        return sd_nv_check_text(v, tpath, c->text, SD_MAX_CONSTRAINT_BYTES);
    default:
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.kind: %d is not a known kind (0..4)", path,
                          (int)c->kind);
    }
}

bool sd_nv_check_submit_constraint(vctx *v, const Specd__SubmitRequest *s) {
    if (!sd_nv_check_constraint(v, "submit.constraint", s->constraint)) return false;
    if (!s->constraint || s->constraint->kind == SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE) return true;
    if (s->ignore_eos)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "submit.constraint: with ignore_eos (a constrained output ends where its language does)");
    if (s->prompt_only)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "submit.constraint: with prompt_only (nothing is generated)");
    return true;
}

bool sd_nv_check_draft_constraint(vctx *v, size_t i, const Specd__DraftSeq *s) {
    char path[64];
    snprintf(path, sizeof path, "draft.seqs[%zu].constraint", i);
    if (!sd_nv_check_constraint(v, path, s->constraint)) return false;
    uint64_t n_ctx = (uint64_t)s->keep_len + s->n_append;
    bool constrained = s->constraint && s->constraint->kind != SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE;
    if (s->prompt_len > (constrained ? n_ctx : 0))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "draft.seqs[%zu].prompt_len: %u (at most the %llu tokens of the context, and 0 without a "
                          "constraint)",
                          i, s->prompt_len, (unsigned long long)n_ctx);
    return true;
}
