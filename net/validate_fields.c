/* validate_fields.c — the checks of single fields and of the messages
 * several links share (Error, Hello), for the decoders in validate.c (which
 * says what is checked and why); each writes the first failure with the
 * field's path (sd_nv_fail). */
#include "validate_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sd_nv_fail(vctx *v, Specd__Code code, const char *fmt, ...) {
    if (v->code) *v->code = code;
    if (v->err && v->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(v->err, v->err_len, fmt, ap);
        va_end(ap);
    }
    return false;
}

vctx sd_nv_make_ctx(const sd_net_limits *lim, Specd__Code *code, char *err, size_t err_len) {
    vctx v = {0, INT32_MAX, SD_MAX_BATCH, SD_MAX_K, 0, code, err, err_len};
    if (lim) {
        if (lim->n_vocab > 0) v.n_vocab = lim->n_vocab;
        if (lim->max_context > 0) v.max_context = lim->max_context;
        if (lim->max_batch > 0 && lim->max_batch < SD_MAX_BATCH) v.max_batch = lim->max_batch;
        if (lim->max_k > 0 && lim->max_k < SD_MAX_K) v.max_k = lim->max_k;
        if (lim->feature_width > 0 && lim->feature_width <= SD_MAX_FEATURE_WIDTH) v.feature_width = lim->feature_width;
    }
    if (code) *code = SPECD__CODE__CODE_OK;
    if (err && err_len) err[0] = '\0';
    return v;
}

/* ---- generic pieces ---- */

/* Unpacks an envelope of type d within sd_net_unpack_budget(len); NULL +
 * MALFORMED when the bytes do not decode or would need more memory, NULL +
 * BAD_REQUEST when a string holds a NUL byte. */
ProtobufCMessage *sd_nv_unpack_env(vctx *v, const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len) {
    bool over = false;
    const char *nul = NULL;
    size_t budget = sd_net_unpack_budget(len);
    ProtobufCMessage *m = sd_net_unpack(d, data, len, budget, &over, &nul);
    if (nul)
        sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: the text holds a NUL byte (refused rather than cut at it)",
                   nul);
    else if (!m && over)
        sd_nv_fail(
            v, SPECD__CODE__CODE_MALFORMED,
            "%zu bytes would take more than their unpack budget (%zu bytes of memory, or too many fields) as a %s "
            "envelope",
            len, budget, d->short_name);
    else if (!m)
        sd_nv_fail(v, SPECD__CODE__CODE_MALFORMED, "%zu bytes do not decode as a %s envelope", len, d->short_name);
    return m;
}

/* Any unknown field in the tree means the bytes are not this envelope. */
bool sd_nv_no_unknown_fields(vctx *v, const ProtobufCMessage *m) {
    if (m->n_unknown_fields > 0)
        return sd_nv_fail(v, SPECD__CODE__CODE_MALFORMED, "%s: unknown field tag %u (not a %s message)",
                          m->descriptor->short_name, m->unknown_fields[0].tag, m->descriptor->short_name);
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t j = 0; j < n; j++)
                if (arr[j] && !sd_nv_no_unknown_fields(v, arr[j])) return false;
        } else {
            /* A oneof member is only meaningful when its case is selected. */
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                uint32_t which = *(const uint32_t *)(base + f->quantifier_offset);
                if (which != f->id) continue;
            }
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
            if (sub && !sd_nv_no_unknown_fields(v, sub)) return false;
        }
    }
    return true;
}

bool sd_nv_check_text(vctx *v, const char *path, const char *s, size_t max_bytes) {
    size_t n = strlen(s);
    if (n > max_bytes)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu bytes over the limit of %zu", path, n, max_bytes);
    size_t bad = sd_utf8_valid_len(s, n);
    if (bad < n)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: invalid UTF-8 at byte %zu (0x%02x)", path, bad,
                          (unsigned)(uint8_t)s[bad]);
    return true;
}

bool sd_nv_check_tokens(vctx *v, const char *path, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (v->n_vocab > 0 && ids[i] >= v->n_vocab)) {
            if (v->n_vocab > 0)
                return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu]: token id %d out of range [0, %d)", path,
                                  i, ids[i], v->n_vocab);
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu]: token id %d is negative", path, i, ids[i]);
        }
    }
    return true;
}

/* TokenChunk.logprobs: each entry with at most SD_MAX_TOP_LOGPROBS
 * alternatives (ids in range, one log-probability and one byte string
 * each), log-probabilities <= 0 and not NaN, token bytes at most
 * SD_MAX_TOKEN_BYTES. */
bool sd_nv_check_logprobs(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n) {
    return sd_nv_check_logprobs_from(v, path, lps, n, false);
}

/* As check_logprobs; with first_none, entry 0 is prompt position 0, which
 * has no logprob: NaN and no alternatives (PromptLogprobs). */
bool sd_nv_check_logprobs_from(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n, bool first_none) {
    for (size_t i = 0; i < n; i++) {
        const Specd__TokenLogprob *lp = lps[i];
        if (i == 0 && first_none) {
            if (!isnan(lp->logprob) || lp->n_top_ids || lp->n_top_logprobs || lp->n_top_tokens)
                return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                                  "%s[0]: prompt position 0 has no logprob (NaN, no alternatives), got %g and %zu",
                                  path, (double)lp->logprob, lp->n_top_ids);
            if (lp->token.len > SD_MAX_TOKEN_BYTES)
                return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s[0].token: %zu bytes over the limit of %d", path,
                                  lp->token.len, SD_MAX_TOKEN_BYTES);
            continue;
        }
        if (!(lp->logprob <= 0.0f))
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu].logprob: %g is not a log-probability", path, i,
                              (double)lp->logprob);
        if (lp->n_top_ids > SD_MAX_TOP_LOGPROBS || lp->n_top_logprobs != lp->n_top_ids ||
            lp->n_top_tokens != lp->n_top_ids)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "%s[%zu]: %zu top ids, %zu top logprobs and %zu top tokens (equal, at most %d)", path, i,
                              lp->n_top_ids, lp->n_top_logprobs, lp->n_top_tokens, SD_MAX_TOP_LOGPROBS);
        char sub[128];
        snprintf(sub, sizeof sub, "%s[%zu].top_ids", path, i);
        if (!sd_nv_check_tokens(v, sub, lp->top_ids, lp->n_top_ids)) return false;
        for (size_t j = 0; j < lp->n_top_logprobs; j++)
            if (!(lp->top_logprobs[j] <= 0.0f))
                return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                                  "%s[%zu].top_logprobs[%zu]: %g is not a log-probability", path, i, j,
                                  (double)lp->top_logprobs[j]);
        if (lp->token.len > SD_MAX_TOKEN_BYTES)
            return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s[%zu].token: %zu bytes over the limit of %d", path, i,
                              lp->token.len, SD_MAX_TOKEN_BYTES);
        for (size_t j = 0; j < lp->n_top_tokens; j++)
            if (lp->top_tokens[j].len > SD_MAX_TOKEN_BYTES)
                return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE,
                                  "%s[%zu].top_tokens[%zu]: %zu bytes over the limit of %d", path, i, j,
                                  lp->top_tokens[j].len, SD_MAX_TOKEN_BYTES);
    }
    return true;
}

/* logprobs / top_logprobs of a Submit or a VerifySeq. */
bool sd_nv_check_logprob_request(vctx *v, const char *path, bool logprobs, uint32_t top_logprobs) {
    if (top_logprobs > SD_MAX_TOP_LOGPROBS)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.top_logprobs: %u over the limit of %d", path,
                          top_logprobs, SD_MAX_TOP_LOGPROBS);
    if (top_logprobs > 0 && !logprobs)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.top_logprobs: %u without logprobs", path, top_logprobs);
    return true;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A sparse q: 1..SD_MAX_TOP_N distinct ids in range, finite probs > 0,
 * sum 1 within 1e-3, and (when token >= 0) the drafted token in its support. */
bool sd_nv_check_q(vctx *v, const char *path, const Specd__SparseDist *q, int32_t token) {
    if (!q) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: missing", path);
    if (q->n_ids != q->n_probs)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: %zu ids but %zu probs", path, q->n_ids, q->n_probs);
    if (q->n_ids == 0) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: empty distribution", path);
    if (q->n_ids > SD_MAX_TOP_N)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu entries over the limit of %d", path, q->n_ids,
                          SD_MAX_TOP_N);
    char sub[160];
    snprintf(sub, sizeof sub, "%s.ids", path);
    if (!sd_nv_check_tokens(v, sub, q->ids, q->n_ids)) return false;
    double sum = 0;
    bool has_token = token < 0;
    for (size_t i = 0; i < q->n_probs; i++) {
        float p = q->probs[i];
        if (!isfinite(p) || !(p > 0.0f))
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.probs[%zu]: %g is not a finite probability > 0",
                              path, i, (double)p);
        sum += p;
        if (q->ids[i] == token) has_token = true;
    }
    if (fabs(sum - 1.0) > 1e-3)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.probs: sum %.6f is not 1 (tolerance 1e-3)", path, sum);
    if (!has_token)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: drafted token %d is not in its support", path, token);
    /* Distinct ids: pairwise for small supports, sorted copy otherwise. */
    if (q->n_ids <= 16) {
        for (size_t i = 0; i < q->n_ids; i++)
            for (size_t j = i + 1; j < q->n_ids; j++)
                if (q->ids[i] == q->ids[j])
                    return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.ids[%zu]: duplicate token id %d", path, j,
                                      q->ids[j]);
    } else {
        int32_t sorted[SD_MAX_TOP_N];
        memcpy(sorted, q->ids, q->n_ids * sizeof *sorted);
        qsort(sorted, q->n_ids, sizeof *sorted, cmp_i32);
        for (size_t i = 1; i < q->n_ids; i++)
            if (sorted[i] == sorted[i - 1])
                return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.ids: duplicate token id %d", path, sorted[i]);
    }
    return true;
}

bool sd_nv_check_distinct_ids(vctx *v, const char *path, const uint64_t *ids, size_t n) {
    uint64_t *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return sd_nv_fail(v, SPECD__CODE__CODE_INTERNAL, "%s: out of memory", path);
    memcpy(sorted, ids, n * sizeof *sorted);
    for (size_t i = 1; i < n; i++) { /* insertion sort: batches are <= SD_MAX_BATCH */
        uint64_t x = sorted[i];
        size_t j = i;
        while (j > 0 && sorted[j - 1] > x) {
            sorted[j] = sorted[j - 1];
            j--;
        }
        sorted[j] = x;
    }
    bool ok = true;
    for (size_t i = 1; i < n && ok; i++)
        if (sorted[i] == sorted[i - 1])
            ok = sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: request_id %llu appears twice in one batch", path,
                            (unsigned long long)sorted[i]);
    free(sorted);
    return ok;
}

bool sd_nv_check_batch_size(vctx *v, const char *path, size_t n) {
    if (n == 0) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: empty batch", path);
    if (n > (size_t)v->max_batch)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu sequences over the limit of %d", path, n,
                          v->max_batch);
    return true;
}

bool sd_nv_check_code(vctx *v, const char *path, Specd__Code c) {
    if (!protobuf_c_enum_descriptor_get_value(&specd__code__descriptor, (int)c) || c == SPECD__CODE__CODE_UNSPECIFIED)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: code %d is not a valid result code", path, (int)c);
    return true;
}

/* ---- shared messages ---- */

bool sd_nv_check_error(vctx *v, const char *path, const Specd__Error *e) {
    if (e->code == SPECD__CODE__CODE_OK)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.code: an Error cannot carry CODE_OK", path);
    char sub[64];
    snprintf(sub, sizeof sub, "%s.message", path);
    return sd_nv_check_code(v, path, e->code) && sd_nv_check_text(v, sub, e->message, 64 * 1024);
}

bool sd_nv_check_hello(vctx *v, const char *path, const Specd__Hello *h, bool worker) {
    char sub[96];
    if (worker) {
        if (h->role != SPECD__ROLE__ROLE_DRAFTER && h->role != SPECD__ROLE__ROLE_VERIFIER)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                              "%s.role: %d is not ROLE_DRAFTER (2) or ROLE_VERIFIER (3)", path, (int)h->role);
        if (h->group_size < 1)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_size: %u, must be >= 1", path, h->group_size);
        if (h->role == SPECD__ROLE__ROLE_DRAFTER && h->drafter_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.drafter_kind: unspecified for a drafter", path);
        if (!h->model) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.model: missing for a worker", path);
        if (h->model->vocab_size < 1 || h->model->vocab_size > INT32_MAX)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.model.vocab_size: %u outside [1, %d]", path,
                              h->model->vocab_size, INT32_MAX);
    } else if (h->role != SPECD__ROLE__ROLE_CLIENT && h->role != SPECD__ROLE__ROLE_UNSPECIFIED) {
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.role: %d is not ROLE_CLIENT (1)", path, (int)h->role);
    }
    if (h->group_size > 0 && h->rank >= h->group_size)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.rank: %u not below group_size %u", path, h->rank,
                          h->group_size);
    if (h->group_size > 4096)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_size: %u over the limit of 4096", path,
                          h->group_size);
    if (h->max_batch > SD_MAX_BATCH)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.max_batch: %u over the limit of %d", path, h->max_batch,
                          SD_MAX_BATCH);
    if (h->max_k > SD_MAX_K)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.max_k: %u over the limit of %d", path, h->max_k,
                          SD_MAX_K);
    if (h->drafter_kind > SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.drafter_kind: %d is not a known kind", path,
                          (int)h->drafter_kind);
    if (h->role == SPECD__ROLE__ROLE_VERIFIER && h->drafter_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED &&
        h->drafter_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "%s.drafter_kind: %d for a verifier (only DRAFTER_KIND_EAGLE, a head in the verifier)", path,
                          (int)h->drafter_kind);
    if (h->group_id > SD_MAX_GROUP_ID)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_id: %u over the limit of %d", path, h->group_id,
                          SD_MAX_GROUP_ID);
    if (h->group_id != 0 && (h->role != SPECD__ROLE__ROLE_VERIFIER || h->rank != 0))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "%s.group_id: %u, but only a verifier leader names its group", path, h->group_id);
    if (h->n_step_costs > SD_MAX_STEP_COSTS)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs: %zu entries over the limit of %d", path,
                          h->n_step_costs, SD_MAX_STEP_COSTS);
    if (h->n_step_costs > 0 && h->role != SPECD__ROLE__ROLE_VERIFIER)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs: only a verifier sends them", path);
    for (size_t i = 0; i < h->n_step_costs; i++) {
        const Specd__StepCost *sc = h->step_costs[i];
        if (!sc) return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs[%zu]: missing", path, i);
        if (sc->tokens < 1 || sc->tokens > (uint32_t)SD_MAX_BATCH * (SD_MAX_K + 1))
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs[%zu].tokens: %u outside [1, %d]", path,
                              i, sc->tokens, SD_MAX_BATCH * (SD_MAX_K + 1));
        if (sc->forward_us < 1)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs[%zu].forward_us: 0", path, i);
    }
    if (!sd_nv_check_hello_features(v, path, h)) return false;
    snprintf(sub, sizeof sub, "%s.name", path);
    if (!sd_nv_check_text(v, sub, h->name, NAME_MAX_BYTES)) return false;
    if (h->model) {
        snprintf(sub, sizeof sub, "%s.model.architecture", path);
        if (!sd_nv_check_text(v, sub, h->model->architecture, NAME_MAX_BYTES)) return false;
        snprintf(sub, sizeof sub, "%s.model.name", path);
        if (!sd_nv_check_text(v, sub, h->model->name, 4096)) return false;
    }
    return true;
}
