/* validate.c — decode and validate every envelope before a process acts on it.
 *
 * protobuf-c checks wire types and nothing else: lengths are unbounded,
 * strings are not checked for UTF-8, and a message of the wrong envelope
 * often decodes "successfully" into other fields. So after unpacking, each
 * decoder walks the tree and checks
 *   - no unknown fields anywhere (the bytes were some other message; all
 *     processes are built from the same proto, so a newer peer is not a
 *     case to support),
 *   - the oneof is set ("empty envelope"),
 *   - every repeated field against the limits (batch, draft, top-N, context),
 *   - token ids in [0, n_vocab), sparse distributions (distinct ids, finite
 *     positive probabilities summing to 1 within 1e-3), sampling ranges, text
 *     as UTF-8, Hello fields.
 * The first failure wins; its message names the field path, the limit and
 * the value ("verify.seqs[3].draft[1]: token id 70000 out of range
 * [0, 49152)"). Rejected: a schema-driven generic validator (descriptor
 * options would need a protoc plugin); the hand-written checks are short and
 * say exactly what each field means. */
#include "specd/net.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_BYTES 256 /* Hello.name, ModelIdentity strings */

/* Validation context: the limits in force and where to write the first error. */
typedef struct vctx {
    int32_t n_vocab;     /* 0 = token ranges unknown (only >= 0 checked) */
    int32_t max_context; /* INT32_MAX when unknown */
    int32_t max_batch;
    int32_t max_k;
    Specd__Code *code;
    char *err;
    size_t err_len;
} vctx;

__attribute__((format(printf, 3, 4))) static bool fail(vctx *v, Specd__Code code, const char *fmt, ...) {
    if (v->code) *v->code = code;
    if (v->err && v->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(v->err, v->err_len, fmt, ap);
        va_end(ap);
    }
    return false;
}

static vctx make_ctx(const sd_net_limits *lim, Specd__Code *code, char *err, size_t err_len) {
    vctx v = {0, INT32_MAX, SD_MAX_BATCH, SD_MAX_K, code, err, err_len};
    if (lim) {
        if (lim->n_vocab > 0) v.n_vocab = lim->n_vocab;
        if (lim->max_context > 0) v.max_context = lim->max_context;
        if (lim->max_batch > 0 && lim->max_batch < SD_MAX_BATCH) v.max_batch = lim->max_batch;
        if (lim->max_k > 0 && lim->max_k < SD_MAX_K) v.max_k = lim->max_k;
    }
    if (code) *code = SPECD__CODE__CODE_OK;
    if (err && err_len) err[0] = '\0';
    return v;
}

/* ---- generic pieces ---- */

/* Unpacks an envelope of type d within sd_net_unpack_budget(len); NULL +
 * MALFORMED when the bytes do not decode or would need more memory, NULL +
 * BAD_REQUEST when a string holds a NUL byte. */
static ProtobufCMessage *unpack_env(vctx *v, const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len) {
    bool over = false;
    const char *nul = NULL;
    size_t budget = sd_net_unpack_budget(len);
    ProtobufCMessage *m = sd_net_unpack(d, data, len, budget, &over, &nul);
    if (nul)
        fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: the text holds a NUL byte (refused rather than cut at it)", nul);
    else if (!m && over)
        fail(v, SPECD__CODE__CODE_MALFORMED,
             "%zu bytes would take more than their unpack budget (%zu bytes of memory, or too many fields) as a %s "
             "envelope",
             len, budget, d->short_name);
    else if (!m)
        fail(v, SPECD__CODE__CODE_MALFORMED, "%zu bytes do not decode as a %s envelope", len, d->short_name);
    return m;
}

/* Any unknown field in the tree means the bytes are not this envelope. */
static bool no_unknown_fields(vctx *v, const ProtobufCMessage *m) {
    if (m->n_unknown_fields > 0)
        return fail(v, SPECD__CODE__CODE_MALFORMED, "%s: unknown field tag %u (not a %s message)",
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
                if (arr[j] && !no_unknown_fields(v, arr[j])) return false;
        } else {
            /* A oneof member is only meaningful when its case is selected. */
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                uint32_t which = *(const uint32_t *)(base + f->quantifier_offset);
                if (which != f->id) continue;
            }
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
            if (sub && !no_unknown_fields(v, sub)) return false;
        }
    }
    return true;
}

static bool check_text(vctx *v, const char *path, const char *s, size_t max_bytes) {
    size_t n = strlen(s);
    if (n > max_bytes)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu bytes over the limit of %zu", path, n, max_bytes);
    size_t bad = sd_utf8_valid_len(s, n);
    if (bad < n)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: invalid UTF-8 at byte %zu (0x%02x)", path, bad,
                    (unsigned)(uint8_t)s[bad]);
    return true;
}

static bool check_tokens(vctx *v, const char *path, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (v->n_vocab > 0 && ids[i] >= v->n_vocab)) {
            if (v->n_vocab > 0)
                return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu]: token id %d out of range [0, %d)", path, i,
                            ids[i], v->n_vocab);
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu]: token id %d is negative", path, i, ids[i]);
        }
    }
    return true;
}

static bool check_logprobs_from(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n, bool first_none);

/* TokenChunk.logprobs: each entry with at most SD_MAX_TOP_LOGPROBS
 * alternatives (ids in range, one log-probability and one byte string
 * each), log-probabilities <= 0 and not NaN, token bytes at most
 * SD_MAX_TOKEN_BYTES. */
static bool check_logprobs(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n) {
    return check_logprobs_from(v, path, lps, n, false);
}

/* As check_logprobs; with first_none, entry 0 is prompt position 0, which
 * has no logprob: NaN and no alternatives (PromptLogprobs). */
static bool check_logprobs_from(vctx *v, const char *path, Specd__TokenLogprob *const *lps, size_t n, bool first_none) {
    for (size_t i = 0; i < n; i++) {
        const Specd__TokenLogprob *lp = lps[i];
        if (i == 0 && first_none) {
            if (!isnan(lp->logprob) || lp->n_top_ids || lp->n_top_logprobs || lp->n_top_tokens)
                return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                            "%s[0]: prompt position 0 has no logprob (NaN, no alternatives), got %g and %zu", path,
                            (double)lp->logprob, lp->n_top_ids);
            if (lp->token.len > SD_MAX_TOKEN_BYTES)
                return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s[0].token: %zu bytes over the limit of %d", path,
                            lp->token.len, SD_MAX_TOKEN_BYTES);
            continue;
        }
        if (!(lp->logprob <= 0.0f))
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu].logprob: %g is not a log-probability", path, i,
                        (double)lp->logprob);
        if (lp->n_top_ids > SD_MAX_TOP_LOGPROBS || lp->n_top_logprobs != lp->n_top_ids ||
            lp->n_top_tokens != lp->n_top_ids)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                        "%s[%zu]: %zu top ids, %zu top logprobs and %zu top tokens (equal, at most %d)", path, i,
                        lp->n_top_ids, lp->n_top_logprobs, lp->n_top_tokens, SD_MAX_TOP_LOGPROBS);
        char sub[128];
        snprintf(sub, sizeof sub, "%s[%zu].top_ids", path, i);
        if (!check_tokens(v, sub, lp->top_ids, lp->n_top_ids)) return false;
        for (size_t j = 0; j < lp->n_top_logprobs; j++)
            if (!(lp->top_logprobs[j] <= 0.0f))
                return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu].top_logprobs[%zu]: %g is not a log-probability",
                            path, i, j, (double)lp->top_logprobs[j]);
        if (lp->token.len > SD_MAX_TOKEN_BYTES)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s[%zu].token: %zu bytes over the limit of %d", path, i,
                        lp->token.len, SD_MAX_TOKEN_BYTES);
        for (size_t j = 0; j < lp->n_top_tokens; j++)
            if (lp->top_tokens[j].len > SD_MAX_TOKEN_BYTES)
                return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s[%zu].top_tokens[%zu]: %zu bytes over the limit of %d",
                            path, i, j, lp->top_tokens[j].len, SD_MAX_TOKEN_BYTES);
    }
    return true;
}

/* logprobs / top_logprobs of a Submit or a VerifySeq. */
static bool check_logprob_request(vctx *v, const char *path, bool logprobs, uint32_t top_logprobs) {
    if (top_logprobs > SD_MAX_TOP_LOGPROBS)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.top_logprobs: %u over the limit of %d", path, top_logprobs,
                    SD_MAX_TOP_LOGPROBS);
    if (top_logprobs > 0 && !logprobs)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.top_logprobs: %u without logprobs", path, top_logprobs);
    return true;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A sparse q: 1..SD_MAX_TOP_N distinct ids in range, finite probs > 0,
 * sum 1 within 1e-3, and (when token >= 0) the drafted token in its support. */
static bool check_q(vctx *v, const char *path, const Specd__SparseDist *q, int32_t token) {
    if (!q) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: missing", path);
    if (q->n_ids != q->n_probs)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: %zu ids but %zu probs", path, q->n_ids, q->n_probs);
    if (q->n_ids == 0) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: empty distribution", path);
    if (q->n_ids > SD_MAX_TOP_N)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu entries over the limit of %d", path, q->n_ids,
                    SD_MAX_TOP_N);
    char sub[160];
    snprintf(sub, sizeof sub, "%s.ids", path);
    if (!check_tokens(v, sub, q->ids, q->n_ids)) return false;
    double sum = 0;
    bool has_token = token < 0;
    for (size_t i = 0; i < q->n_probs; i++) {
        float p = q->probs[i];
        if (!isfinite(p) || !(p > 0.0f))
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.probs[%zu]: %g is not a finite probability > 0", path, i,
                        (double)p);
        sum += p;
        if (q->ids[i] == token) has_token = true;
    }
    if (fabs(sum - 1.0) > 1e-3)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.probs: sum %.6f is not 1 (tolerance 1e-3)", path, sum);
    if (!has_token)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: drafted token %d is not in its support", path, token);
    /* Distinct ids: pairwise for small supports, sorted copy otherwise. */
    if (q->n_ids <= 16) {
        for (size_t i = 0; i < q->n_ids; i++)
            for (size_t j = i + 1; j < q->n_ids; j++)
                if (q->ids[i] == q->ids[j])
                    return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.ids[%zu]: duplicate token id %d", path, j,
                                q->ids[j]);
    } else {
        int32_t sorted[SD_MAX_TOP_N];
        memcpy(sorted, q->ids, q->n_ids * sizeof *sorted);
        qsort(sorted, q->n_ids, sizeof *sorted, cmp_i32);
        for (size_t i = 1; i < q->n_ids; i++)
            if (sorted[i] == sorted[i - 1])
                return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.ids: duplicate token id %d", path, sorted[i]);
    }
    return true;
}

static bool check_sampling(vctx *v, const char *path, const Specd__Sampling *s) {
    if (!s) return true;
    sd_sampling out;
    char why[160];
    if (!sd_net_sampling_from_pb(s, &out, why, sizeof why))
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.%s", path, why);
    return true;
}

static bool check_distinct_ids(vctx *v, const char *path, const uint64_t *ids, size_t n) {
    uint64_t *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return fail(v, SPECD__CODE__CODE_INTERNAL, "%s: out of memory", path);
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
            ok = fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: request_id %llu appears twice in one batch", path,
                      (unsigned long long)sorted[i]);
    free(sorted);
    return ok;
}

static bool check_batch_size(vctx *v, const char *path, size_t n) {
    if (n == 0) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: empty batch", path);
    if (n > (size_t)v->max_batch)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu sequences over the limit of %d", path, n, v->max_batch);
    return true;
}

static bool check_code(vctx *v, const char *path, Specd__Code c) {
    if (!protobuf_c_enum_descriptor_get_value(&specd__code__descriptor, (int)c) || c == SPECD__CODE__CODE_UNSPECIFIED)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: code %d is not a valid result code", path, (int)c);
    return true;
}

/* ---- shared messages ---- */

static bool check_error(vctx *v, const char *path, const Specd__Error *e) {
    if (e->code == SPECD__CODE__CODE_OK)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.code: an Error cannot carry CODE_OK", path);
    char sub[64];
    snprintf(sub, sizeof sub, "%s.message", path);
    return check_code(v, path, e->code) && check_text(v, sub, e->message, 64 * 1024);
}

static bool check_hello(vctx *v, const char *path, const Specd__Hello *h, bool worker) {
    char sub[96];
    if (worker) {
        if (h->role != SPECD__ROLE__ROLE_DRAFTER && h->role != SPECD__ROLE__ROLE_VERIFIER)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.role: %d is not ROLE_DRAFTER (2) or ROLE_VERIFIER (3)",
                        path, (int)h->role);
        if (h->group_size < 1)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_size: %u, must be >= 1", path, h->group_size);
        if (h->role == SPECD__ROLE__ROLE_DRAFTER && h->drafter_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.drafter_kind: unspecified for a drafter", path);
        if (!h->model) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.model: missing for a worker", path);
        if (h->model->vocab_size < 1 || h->model->vocab_size > INT32_MAX)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.model.vocab_size: %u outside [1, %d]", path,
                        h->model->vocab_size, INT32_MAX);
    } else if (h->role != SPECD__ROLE__ROLE_CLIENT && h->role != SPECD__ROLE__ROLE_UNSPECIFIED) {
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.role: %d is not ROLE_CLIENT (1)", path, (int)h->role);
    }
    if (h->group_size > 0 && h->rank >= h->group_size)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.rank: %u not below group_size %u", path, h->rank,
                    h->group_size);
    if (h->group_size > 4096)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_size: %u over the limit of 4096", path, h->group_size);
    if (h->max_batch > SD_MAX_BATCH)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.max_batch: %u over the limit of %d", path, h->max_batch,
                    SD_MAX_BATCH);
    if (h->max_k > SD_MAX_K)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.max_k: %u over the limit of %d", path, h->max_k, SD_MAX_K);
    if (h->drafter_kind > SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.drafter_kind: %d is not a known kind", path,
                    (int)h->drafter_kind);
    if (h->group_id > SD_MAX_GROUP_ID)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_id: %u over the limit of %d", path, h->group_id,
                    SD_MAX_GROUP_ID);
    if (h->group_id != 0 && (h->role != SPECD__ROLE__ROLE_VERIFIER || h->rank != 0))
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.group_id: %u, but only a verifier leader names its group",
                    path, h->group_id);
    if (h->n_step_costs > SD_MAX_STEP_COSTS)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs: %zu entries over the limit of %d", path,
                    h->n_step_costs, SD_MAX_STEP_COSTS);
    if (h->n_step_costs > 0 && h->role != SPECD__ROLE__ROLE_VERIFIER)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs: only a verifier sends them", path);
    for (size_t i = 0; i < h->n_step_costs; i++) {
        const Specd__StepCost *sc = h->step_costs[i];
        if (!sc) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs[%zu]: missing", path, i);
        if (sc->tokens < 1 || sc->tokens > (uint32_t)SD_MAX_BATCH * (SD_MAX_K + 1))
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs[%zu].tokens: %u outside [1, %d]", path, i,
                        sc->tokens, SD_MAX_BATCH * (SD_MAX_K + 1));
        if (sc->forward_us < 1)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.step_costs[%zu].forward_us: 0", path, i);
    }
    snprintf(sub, sizeof sub, "%s.name", path);
    if (!check_text(v, sub, h->name, NAME_MAX_BYTES)) return false;
    if (h->model) {
        snprintf(sub, sizeof sub, "%s.model.architecture", path);
        if (!check_text(v, sub, h->model->architecture, NAME_MAX_BYTES)) return false;
        snprintf(sub, sizeof sub, "%s.model.name", path);
        if (!check_text(v, sub, h->model->name, 4096)) return false;
    }
    return true;
}

/* ---- client link ---- */

/* SubmitRequest.messages: roles known, content UTF-8, bounded in count and
 * in total size, and nothing else saying what the prompt is. */
static bool check_messages(vctx *v, const Specd__SubmitRequest *s) {
    char path[96];
    if (s->n_messages > SD_MAX_CHAT_MESSAGES)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.messages: %zu messages over the limit of %d", s->n_messages,
                    SD_MAX_CHAT_MESSAGES);
    if (s->n_prompt_ids > 0 || s->prompt[0] || s->system[0] || s->chat)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                    "submit.messages: give the conversation alone (prompt, prompt_ids, chat and system empty)");
    size_t total = 0;
    for (size_t i = 0; i < s->n_messages; i++) {
        const Specd__ChatMessage *m = s->messages[i];
        snprintf(path, sizeof path, "submit.messages[%zu].role", i);
        if (m->role != SPECD__CHAT_ROLE__CHAT_ROLE_SYSTEM && m->role != SPECD__CHAT_ROLE__CHAT_ROLE_USER &&
            m->role != SPECD__CHAT_ROLE__CHAT_ROLE_ASSISTANT)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: %d is not a role (system, user, assistant)", path,
                        (int)m->role);
        snprintf(path, sizeof path, "submit.messages[%zu].content", i);
        if (!check_text(v, path, m->content, SD_MAX_PROMPT_BYTES)) return false;
        total += strlen(m->content);
        if (total > SD_MAX_PROMPT_BYTES)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.messages: more than %d bytes of content in all",
                        SD_MAX_PROMPT_BYTES);
    }
    return true;
}

static bool check_submit(vctx *v, const Specd__SubmitRequest *s) {
    char path[96];
    if (s->n_messages > 0) {
        if (!check_messages(v, s)) return false;
    } else if (s->n_prompt_ids > 0) {
        if (s->n_prompt_ids > (size_t)v->max_context)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.prompt_ids: %zu tokens over the context of %d",
                        s->n_prompt_ids, v->max_context);
        if (!check_tokens(v, "submit.prompt_ids", s->prompt_ids, s->n_prompt_ids)) return false;
    } else {
        if (s->prompt[0] == '\0')
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt: empty (need text or prompt_ids)");
        if (!check_text(v, "submit.prompt", s->prompt, SD_MAX_PROMPT_BYTES)) return false;
    }
    if (!check_text(v, "submit.system", s->system, SD_MAX_PROMPT_BYTES)) return false;
    if (s->n_continuation > 0) {
        if (s->n_continuation + s->n_prompt_ids > (size_t)v->max_context)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.continuation: %zu tokens over the context of %d",
                        s->n_continuation, v->max_context);
        if (s->max_tokens > 0 && s->n_continuation >= s->max_tokens)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                        "submit.continuation: %zu tokens already reach max_tokens %u: nothing is left to generate",
                        s->n_continuation, s->max_tokens);
        if (!check_tokens(v, "submit.continuation", s->continuation, s->n_continuation)) return false;
    }
    if (v->max_context < INT32_MAX && s->max_tokens > (uint32_t)v->max_context)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.max_tokens: %u over the context of %d", s->max_tokens,
                    v->max_context);
    if (!check_sampling(v, "submit.sampling", s->sampling)) return false;
    if (!check_logprob_request(v, "submit", s->logprobs || s->prompt_logprobs, s->top_logprobs)) return false;
    if (s->prompt_only && s->max_tokens != 0)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt_only: with max_tokens %u (must be 0)",
                    s->max_tokens);
    if (s->prompt_only && s->n_continuation > 0)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.prompt_only: with a continuation (nothing is generated)");
    if (s->n_stop > SD_MAX_STOP_STRINGS)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "submit.stop: %zu strings over the limit of %d", s->n_stop,
                    SD_MAX_STOP_STRINGS);
    for (size_t i = 0; i < s->n_stop; i++) {
        snprintf(path, sizeof path, "submit.stop[%zu]", i);
        if (s->stop[i][0] == '\0') return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s: empty stop string", path);
        if (!check_text(v, path, s->stop[i], SD_MAX_STOP_BYTES)) return false;
    }
    if (s->max_k < -1 || s->max_k > SD_MAX_K)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.max_k: %d outside [-1, %d]", s->max_k, SD_MAX_K);
    if (s->drafter_kind > SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "submit.drafter_kind: %d is not a known kind (0..3)",
                    (int)s->drafter_kind);
    return true;
}

Specd__ClientToCoordinator *sd_net_decode_client(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                 Specd__Code *code, char *err, size_t err_len) {
    vctx v = make_ctx(lim, code, err, err_len);
    Specd__ClientToCoordinator *env =
        (Specd__ClientToCoordinator *)unpack_env(&v, &specd__client_to_coordinator__descriptor, data, len);
    if (!env) return NULL;
    bool ok = no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__CLIENT_TO_COORDINATOR__BODY_HELLO: ok = check_hello(&v, "hello", env->hello, false); break;
        case SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT: ok = check_submit(&v, env->submit); break;
        case SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL:
        case SPECD__CLIENT_TO_COORDINATOR__BODY_STATS:
        case SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT: break;
        default: ok = fail(&v, SPECD__CODE__CODE_MALFORMED, "ClientToCoordinator: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__client_to_coordinator__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* The per-position counters: one entry per draft position at most, the
 * two arrays as long as each other. */
static bool check_service_stats(vctx *v, const Specd__ServiceStats *s) {
    if (s->n_draft_tokens_per_pos > SD_MAX_K || s->n_accepted_tokens_per_pos > SD_MAX_K)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE,
                    "stats.draft_tokens_per_pos / accepted_tokens_per_pos: %zu / %zu entries, over the limit of %d",
                    s->n_draft_tokens_per_pos, s->n_accepted_tokens_per_pos, SD_MAX_K);
    if (s->n_draft_tokens_per_pos != s->n_accepted_tokens_per_pos)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                    "stats.draft_tokens_per_pos: %zu entries but accepted_tokens_per_pos %zu",
                    s->n_draft_tokens_per_pos, s->n_accepted_tokens_per_pos);
    return true;
}

Specd__CoordinatorToClient *sd_net_decode_to_client(const uint8_t *data, size_t len, Specd__Code *code, char *err,
                                                    size_t err_len) {
    vctx v = make_ctx(NULL, code, err, err_len);
    Specd__CoordinatorToClient *env =
        (Specd__CoordinatorToClient *)unpack_env(&v, &specd__coordinator_to_client__descriptor, data, len);
    if (!env) return NULL;
    bool ok = no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS:
            ok = check_tokens(&v, "tokens.tokens", env->tokens->tokens, env->tokens->n_tokens);
            if (ok && env->tokens->n_logprobs != 0 && env->tokens->n_logprobs != env->tokens->n_tokens)
                ok = fail(&v, SPECD__CODE__CODE_BAD_REQUEST, "tokens.logprobs: %zu entries for %zu tokens",
                          env->tokens->n_logprobs, env->tokens->n_tokens);
            if (ok) ok = check_logprobs(&v, "tokens.logprobs", env->tokens->logprobs, env->tokens->n_logprobs);
            break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS: {
            const Specd__PromptLogprobs *p = env->prompt_logprobs;
            ok = check_tokens(&v, "prompt_logprobs.tokens", p->tokens, p->n_tokens);
            if (ok && (p->n_logprobs != p->n_tokens || p->n_tokens == 0 || p->n_tokens > SD_MAX_PROMPT_LP_ROWS ||
                       (p->from == 0 && p->n_tokens != 1)))
                ok = fail(&v, SPECD__CODE__CODE_BAD_REQUEST,
                          "prompt_logprobs: %zu entries for %zu tokens from %u (1..%d, one for position 0)",
                          p->n_logprobs, p->n_tokens, p->from, SD_MAX_PROMPT_LP_ROWS);
            if (ok) ok = check_logprobs_from(&v, "prompt_logprobs.logprobs", p->logprobs, p->n_logprobs, p->from == 0);
            break;
        }
        case SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED:
            if (env->finished->reason > SPECD__STOP_REASON__STOP_REASON_CANCELLED)
                ok = fail(&v, SPECD__CODE__CODE_BAD_REQUEST, "finished.reason: %d is not a stop reason",
                          (int)env->finished->reason);
            break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR: ok = check_error(&v, "error", env->error); break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_STATS: ok = check_service_stats(&v, env->stats); break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED:
            if (env->accepted->prompt_text.len > SD_MAX_PROMPT_BYTES)
                ok = fail(&v, SPECD__CODE__CODE_TOO_LARGE, "accepted.prompt_text: %zu bytes over the limit of %d",
                          env->accepted->prompt_text.len, SD_MAX_PROMPT_BYTES);
            break;
        case SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT: break;
        default: ok = fail(&v, SPECD__CODE__CODE_MALFORMED, "CoordinatorToClient: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__coordinator_to_client__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* ---- worker link ---- */

static bool check_draft_response(vctx *v, const Specd__DraftResponse *r) {
    char path[96];
    if (r->n_results > (size_t)v->max_batch)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "draft.results: %zu results over the limit of %d", r->n_results,
                    v->max_batch);
    for (size_t i = 0; i < r->n_results; i++) {
        const Specd__DraftResult *d = r->results[i];
        snprintf(path, sizeof path, "draft.results[%zu].code", i);
        if (!check_code(v, path, d->code)) return false;
        if (d->n_tokens > (size_t)v->max_k)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "draft.results[%zu].tokens: %zu tokens over the limit of %d", i,
                        d->n_tokens, v->max_k);
        if (d->n_q != d->n_tokens)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.results[%zu].q: %zu distributions for %zu tokens", i,
                        d->n_q, d->n_tokens);
        snprintf(path, sizeof path, "draft.results[%zu].tokens", i);
        if (!check_tokens(v, path, d->tokens, d->n_tokens)) return false;
        for (size_t j = 0; j < d->n_q; j++) {
            snprintf(path, sizeof path, "draft.results[%zu].q[%zu]", i, j);
            if (!check_q(v, path, d->q[j], d->tokens[j])) return false;
        }
        if (d->cached_len > (uint32_t)v->max_context)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.results[%zu].cached_len: %u over the context of %d", i,
                        d->cached_len, v->max_context);
    }
    return true;
}

static bool check_verify_response(vctx *v, const Specd__VerifyResponse *r) {
    char path[96];
    if (r->n_results > (size_t)v->max_batch)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "verify.results: %zu results over the limit of %d", r->n_results,
                    v->max_batch);
    for (size_t i = 0; i < r->n_results; i++) {
        const Specd__VerifyResult *d = r->results[i];
        snprintf(path, sizeof path, "verify.results[%zu].code", i);
        if (!check_code(v, path, d->code)) return false;
        if (d->n_commit > (size_t)v->max_k + 1)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "verify.results[%zu].commit: %zu tokens over the limit of %d",
                        i, d->n_commit, v->max_k + 1);
        if (d->n_accepted > (uint32_t)v->max_k)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.results[%zu].n_accepted: %u over the limit of %d", i,
                        d->n_accepted, v->max_k);
        if (d->n_commit > 0 && d->n_accepted + 1 != d->n_commit)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                        "verify.results[%zu].commit: %zu tokens, expected n_accepted + 1 = %u", i, d->n_commit,
                        d->n_accepted + 1);
        snprintf(path, sizeof path, "verify.results[%zu].commit", i);
        if (!check_tokens(v, path, d->commit, d->n_commit)) return false;
        /* logprobs: one per commit token, or (nothing committed: a
         * prefill chunk's prompt logprobs) one per appended token */
        if ((d->n_logprobs != 0 && d->n_logprobs != d->n_commit &&
             !(d->n_commit == 0 && d->n_logprobs <= SD_MAX_PROMPT_LP_ROWS)) ||
            d->n_top_ids != d->n_top_logprobs ||
            (d->n_logprobs == 0
                 ? d->n_top_ids != 0
                 : d->n_top_ids % d->n_logprobs != 0 || d->n_top_ids / d->n_logprobs > SD_MAX_TOP_LOGPROBS))
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                        "verify.results[%zu]: %zu logprobs, %zu top ids and %zu top logprobs for %zu tokens "
                        "(one logprob per token, at most %d alternatives each)",
                        i, d->n_logprobs, d->n_top_ids, d->n_top_logprobs, d->n_commit, SD_MAX_TOP_LOGPROBS);
        snprintf(path, sizeof path, "verify.results[%zu].top_ids", i);
        if (!check_tokens(v, path, d->top_ids, d->n_top_ids)) return false;
        for (size_t j = 0; j < d->n_logprobs + d->n_top_logprobs; j++) {
            float x = j < d->n_logprobs ? d->logprobs[j] : d->top_logprobs[j - d->n_logprobs];
            if (!(x <= 0.0f))
                return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.results[%zu]: %g is not a log-probability", i,
                            (double)x);
        }
        if (d->cached_len > (uint32_t)v->max_context)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.results[%zu].cached_len: %u over the context of %d",
                        i, d->cached_len, v->max_context);
    }
    return true;
}

Specd__WorkerToCoordinator *sd_net_decode_worker(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                 Specd__Code *code, char *err, size_t err_len) {
    vctx v = make_ctx(lim, code, err, err_len);
    Specd__WorkerToCoordinator *env =
        (Specd__WorkerToCoordinator *)unpack_env(&v, &specd__worker_to_coordinator__descriptor, data, len);
    if (!env) return NULL;
    bool ok = no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__WORKER_TO_COORDINATOR__BODY_HELLO: ok = check_hello(&v, "hello", env->hello, true); break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_ERROR: ok = check_error(&v, "error", env->error); break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT: break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT: ok = check_draft_response(&v, env->draft); break;
        case SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY: ok = check_verify_response(&v, env->verify); break;
        default: ok = fail(&v, SPECD__CODE__CODE_MALFORMED, "WorkerToCoordinator: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__worker_to_coordinator__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* keep_len + appended (+ drafts) must fit the context. */
static bool check_context(vctx *v, const char *path, uint64_t keep_len, uint64_t total) {
    if (total > (uint64_t)v->max_context)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: keep_len %llu + new tokens = %llu over the context of %d",
                    path, (unsigned long long)keep_len, (unsigned long long)total, v->max_context);
    return true;
}

static bool check_draft_request(vctx *v, const Specd__DraftRequest *r) {
    char path[96];
    if (!check_batch_size(v, "draft.seqs", r->n_seqs)) return false;
    uint64_t ids[SD_MAX_BATCH];
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Specd__DraftSeq *s = r->seqs[i];
        ids[i] = s->request_id;
        if (s->n_append > (size_t)v->max_context)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "draft.seqs[%zu].append: %zu tokens over the context of %d", i,
                        s->n_append, v->max_context);
        snprintf(path, sizeof path, "draft.seqs[%zu].append", i);
        if (!check_tokens(v, path, s->append, s->n_append)) return false;
        if (s->k < 1 || s->k > (uint32_t)v->max_k)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[%zu].k: %u outside [1, %d]", i, s->k, v->max_k);
        if (s->top_n > SD_MAX_TOP_N)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "draft.seqs[%zu].top_n: %u over the limit of %d", i, s->top_n,
                        SD_MAX_TOP_N);
        snprintf(path, sizeof path, "draft.seqs[%zu]", i);
        if (!check_context(v, path, s->keep_len, (uint64_t)s->keep_len + s->n_append)) return false;
        snprintf(path, sizeof path, "draft.seqs[%zu].sampling", i);
        if (!check_sampling(v, path, s->sampling)) return false;
    }
    return check_distinct_ids(v, "draft.seqs", ids, r->n_seqs);
}

static bool check_verify_request(vctx *v, const Specd__VerifyRequest *r) {
    char path[96];
    if (!check_batch_size(v, "verify.seqs", r->n_seqs)) return false;
    uint64_t ids[SD_MAX_BATCH];
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Specd__VerifySeq *s = r->seqs[i];
        ids[i] = s->request_id;
        if (s->n_append > (size_t)v->max_context)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "verify.seqs[%zu].append: %zu tokens over the context of %d", i,
                        s->n_append, v->max_context);
        snprintf(path, sizeof path, "verify.seqs[%zu].append", i);
        if (!check_tokens(v, path, s->append, s->n_append)) return false;
        if (s->n_draft > (size_t)v->max_k)
            return fail(v, SPECD__CODE__CODE_TOO_LARGE, "verify.seqs[%zu].draft: %zu tokens over the limit of %d", i,
                        s->n_draft, v->max_k);
        if (r->prefill_only && s->n_draft > 0)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.seqs[%zu].draft: %zu drafts in a prefill_only batch",
                        i, s->n_draft);
        if (s->n_append == 0 && s->n_draft == 0)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.seqs[%zu].append: empty with no drafts", i);
        if (s->n_q != s->n_draft)
            return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.seqs[%zu].q: %zu distributions for %zu drafts", i,
                        s->n_q, s->n_draft);
        snprintf(path, sizeof path, "verify.seqs[%zu].draft", i);
        if (!check_tokens(v, path, s->draft, s->n_draft)) return false;
        for (size_t j = 0; j < s->n_q; j++) {
            snprintf(path, sizeof path, "verify.seqs[%zu].q[%zu]", i, j);
            if (!check_q(v, path, s->q[j], s->draft[j])) return false;
        }
        snprintf(path, sizeof path, "verify.seqs[%zu]", i);
        if (!check_context(v, path, s->keep_len, (uint64_t)s->keep_len + s->n_append + s->n_draft)) return false;
        snprintf(path, sizeof path, "verify.seqs[%zu].sampling", i);
        if (!check_sampling(v, path, s->sampling)) return false;
        snprintf(path, sizeof path, "verify.seqs[%zu]", i);
        if (!check_logprob_request(v, path, s->logprobs || s->prompt_logprobs, s->top_logprobs)) return false;
        if (s->prompt_logprobs && (!r->prefill_only || s->n_append > SD_MAX_PROMPT_LP_ROWS))
            return fail(
                v, SPECD__CODE__CODE_BAD_REQUEST,
                "verify.seqs[%zu].prompt_logprobs: %s with %zu appended tokens (prefill_only steps, at most %d)", i,
                r->prefill_only ? "prefill" : "a normal step", s->n_append, SD_MAX_PROMPT_LP_ROWS);
        if (s->prompt_logprobs) {
            snprintf(path, sizeof path, "verify.seqs[%zu].prompt_next", i);
            if (!check_tokens(v, path, &s->prompt_next, 1)) return false;
            if ((uint64_t)s->keep_len + s->n_append + 1 > (uint64_t)v->max_context)
                return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                            "verify.seqs[%zu].prompt_next: position %zu past the context of %d", i,
                            (size_t)s->keep_len + s->n_append, v->max_context);
        }
    }
    return check_distinct_ids(v, "verify.seqs", ids, r->n_seqs);
}

Specd__CoordinatorToWorker *sd_net_decode_to_worker(const uint8_t *data, size_t len, const sd_net_limits *lim,
                                                    Specd__Code *code, char *err, size_t err_len) {
    vctx v = make_ctx(lim, code, err, err_len);
    Specd__CoordinatorToWorker *env =
        (Specd__CoordinatorToWorker *)unpack_env(&v, &specd__coordinator_to_worker__descriptor, data, len);
    if (!env) return NULL;
    bool ok = no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME:
        case SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT:
        case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE: break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_ERROR: ok = check_error(&v, "error", env->error); break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT: ok = check_draft_request(&v, env->draft); break;
        case SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY: ok = check_verify_request(&v, env->verify); break;
        default: ok = fail(&v, SPECD__CODE__CODE_MALFORMED, "CoordinatorToWorker: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__coordinator_to_worker__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* ---- the verifier group's own link (verifier/group.c) ---- */

static bool check_group_join(vctx *v, const Specd__GroupJoin *j) {
    if (j->group_size < 2 || j->group_size > SD_MAX_GROUP_SIZE)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.group_size: %u outside [2, %d]", j->group_size,
                    SD_MAX_GROUP_SIZE);
    if (j->rank < 1 || j->rank >= j->group_size)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.rank: %u outside [1, %u) (rank 0 is the leader)", j->rank,
                    j->group_size);
    if (j->lm_head > 1) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.lm_head: %u is not 0 or 1", j->lm_head);
    if (!j->model) return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "join.model: missing");
    return check_text(v, "join.host", j->host, NAME_MAX_BYTES) &&
           check_text(v, "join.model.architecture", j->model->architecture, NAME_MAX_BYTES) &&
           check_text(v, "join.model.name", j->model->name, 4096);
}

static bool check_group_setup(vctx *v, const Specd__GroupSetup *s) {
    size_t name_len = strlen(s->shm_name);
    if (name_len > 200 || strchr(s->shm_name, '/'))
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.shm_name: %zu bytes (at most 200, no '/')", name_len);
    if ((name_len == 0) == (s->nccl_id.len == 0))
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup: exactly one of shm_name and nccl_id must be set");
    if (s->nccl_id.len > 1024)
        return fail(v, SPECD__CODE__CODE_TOO_LARGE, "setup.nccl_id: %zu bytes over the limit of 1024", s->nccl_id.len);
    if (s->coll_timeout_ms < 1 || s->coll_timeout_ms > 3600000)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.coll_timeout_ms: %u outside [1, 3600000]",
                    s->coll_timeout_ms);
    if (s->coll_max_bytes < 64 || s->coll_max_bytes > ((uint64_t)1 << 34))
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "setup.coll_max_bytes: %llu outside [64, 2^34]",
                    (unsigned long long)s->coll_max_bytes);
    if (s->kv_blocks < 1 || s->kv_blocks > (1u << 28) || s->block_size < 1 || s->block_size > 4096)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                    "setup: kv_blocks %u outside [1, 2^28] or block_size %u "
                    "outside [1, 4096]",
                    s->kv_blocks, s->block_size);
    if (s->heartbeat_interval_ms < 1 || s->heartbeat_interval_ms > 60000 || s->heartbeat_liveness < 1 ||
        s->heartbeat_liveness > 1000)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                    "setup: heartbeat interval %u ms outside [1, 60000] or "
                    "liveness %u outside [1, 1000]",
                    s->heartbeat_interval_ms, s->heartbeat_liveness);
    return true;
}

static bool check_group_plan(vctx *v, const Specd__GroupPlan *p) {
    if (p->n_tokens < 1 || p->n_tokens > SD_MAX_GROUP_ROWS)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.tokens: %zu rows outside [1, %d]", p->n_tokens,
                    SD_MAX_GROUP_ROWS);
    if (p->n_pos != p->n_tokens || p->n_bt_off != p->n_tokens)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan: %zu tokens but %zu positions and %zu table offsets",
                    p->n_tokens, p->n_pos, p->n_bt_off);
    if (p->n_bt < 1 || p->n_bt > (1u << 28))
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.bt: %zu entries outside [1, 2^28]", p->n_bt);
    if (p->n_wanted > p->n_tokens)
        return fail(v, SPECD__CODE__CODE_BAD_REQUEST, "plan.wanted: %zu rows of %zu", p->n_wanted, p->n_tokens);
    return check_tokens(v, "plan.tokens", p->tokens, p->n_tokens);
}

Specd__RankToLeader *sd_net_decode_rank(const uint8_t *data, size_t len, Specd__Code *code, char *err, size_t err_len) {
    vctx v = make_ctx(NULL, code, err, err_len);
    Specd__RankToLeader *env = (Specd__RankToLeader *)unpack_env(&v, &specd__rank_to_leader__descriptor, data, len);
    if (!env) return NULL;
    bool ok = no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__RANK_TO_LEADER__BODY_JOIN: ok = check_group_join(&v, env->join); break;
        case SPECD__RANK_TO_LEADER__BODY_READY:
        case SPECD__RANK_TO_LEADER__BODY_HEARTBEAT: break;
        case SPECD__RANK_TO_LEADER__BODY_ERROR: ok = check_error(&v, "error", env->error); break;
        default: ok = fail(&v, SPECD__CODE__CODE_MALFORMED, "RankToLeader: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__rank_to_leader__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

Specd__LeaderToRank *sd_net_decode_leader(const uint8_t *data, size_t len, const sd_net_limits *lim, Specd__Code *code,
                                          char *err, size_t err_len) {
    vctx v = make_ctx(lim, code, err, err_len);
    Specd__LeaderToRank *env = (Specd__LeaderToRank *)unpack_env(&v, &specd__leader_to_rank__descriptor, data, len);
    if (!env) return NULL;
    bool ok = no_unknown_fields(&v, &env->base);
    if (ok) {
        switch (env->body_case) {
        case SPECD__LEADER_TO_RANK__BODY_SETUP: ok = check_group_setup(&v, env->setup); break;
        case SPECD__LEADER_TO_RANK__BODY_PLAN: ok = check_group_plan(&v, env->plan); break;
        case SPECD__LEADER_TO_RANK__BODY_HEARTBEAT: break;
        case SPECD__LEADER_TO_RANK__BODY_STOP: ok = check_text(&v, "stop.reason", env->stop->reason, 4096); break;
        case SPECD__LEADER_TO_RANK__BODY_ERROR: ok = check_error(&v, "error", env->error); break;
        default: ok = fail(&v, SPECD__CODE__CODE_MALFORMED, "LeaderToRank: empty envelope"); break;
        }
    }
    if (!ok) {
        specd__leader_to_rank__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

/* ---- sampling ---- */

bool sd_net_sampling_from_pb(const Specd__Sampling *msg, sd_sampling *out, char *err, size_t err_len) {
    sd_sampling s = sd_sampling_default(); /* no sampling message: greedy */
    if (err && err_len) err[0] = '\0';
    if (msg) {
        if (msg->top_k > (uint32_t)INT32_MAX) {
            if (err && err_len) snprintf(err, err_len, "top_k: %u over the limit of %d", msg->top_k, INT32_MAX);
            return false;
        }
        s.temperature = msg->temperature;
        s.top_k = (int32_t)msg->top_k;
        s.top_p = msg->top_p == 0.0f ? 1.0f : msg->top_p; /* proto3's unset 0 is "off" */
        s.min_p = msg->min_p;
        s.seed = msg->seed;
        s.presence_penalty = msg->presence_penalty;
        s.frequency_penalty = msg->frequency_penalty;
    }
    if (sd_sampling_check(&s, err, err_len) != SD_OK) return false;
    *out = s;
    return true;
}

void sd_net_sampling_to_pb(const sd_sampling *s, Specd__Sampling *msg) {
    msg->temperature = s->temperature;
    msg->top_k = s->top_k > 0 ? (uint32_t)s->top_k : 0;
    msg->top_p = s->top_p >= 1.0f ? 0.0f : s->top_p;
    msg->min_p = s->min_p;
    msg->seed = s->seed;
    msg->presence_penalty = s->presence_penalty;
    msg->frequency_penalty = s->frequency_penalty;
}
