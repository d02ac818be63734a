/* drafter.c — the drafter interface (drafter.h) and the n-gram drafter.
 *
 * The n-gram drafter is prompt lookup: code edits, summaries that quote
 * their source and repetitive chat reuse long runs of the context, so the
 * tokens that followed an earlier occurrence of the context's suffix are a
 * free draft. For n from ngram_max down to ngram_min it looks for the most
 * recent earlier position whose n tokens equal the last n of the context and
 * proposes what followed (up to k tokens, possibly running into the suffix
 * itself, never past the context's end). Longest n first: a longer match
 * predicts better; most recent first: generation repeats what it just did.
 * q is one-hot (the draft is deterministic), so verification accepts y with
 * probability p(y) and is exact. The scan is O(n_context * n) per call with
 * no state, which is nothing next to a forward pass at the context sizes we
 * serve; a suffix index was rejected as complexity without a measured need.
 * Model drafters live in drafter_model.c. */
#include "drafter_impl.h"

#include <stdlib.h>
#include <string.h>

sd_drafter_params sd_drafter_default_params(void) {
    sd_drafter_params p = {
        .max_seqs = 1, .max_ctx = 4096, .top_n = SD_SPEC_DEFAULT_TOP_N, .ngram_min = 1, .ngram_max = 4,
        .n_threads = 0, .device = -1,
    };
    return p;
}

sd_status drafter_params_check(const sd_drafter_params *in, sd_drafter_params *out) {
    sd_drafter_params p = in ? *in : sd_drafter_default_params();
    sd_drafter_params def = sd_drafter_default_params();
    if (p.max_seqs == 0) p.max_seqs = def.max_seqs;
    if (p.max_ctx == 0) p.max_ctx = def.max_ctx;
    if (p.top_n == 0) p.top_n = def.top_n;
    if (p.ngram_min == 0) p.ngram_min = def.ngram_min;
    if (p.ngram_max == 0) p.ngram_max = p.ngram_min > def.ngram_max ? p.ngram_min : def.ngram_max;
    if (p.max_seqs < 0 || p.max_ctx < 0 || p.top_n < 0 || p.ngram_min < 0 || p.ngram_max < p.ngram_min ||
        p.n_threads < 0 || p.max_seqs > 1 << 16 || p.max_ctx > 1 << 24 || p.top_n > 1 << 16) {
        SD_ERROR("drafter: bad parameters (max_seqs %d, max_ctx %d, top_n %d, ngram %d..%d, threads %d)",
                 (int)p.max_seqs, (int)p.max_ctx, (int)p.top_n, (int)p.ngram_min, (int)p.ngram_max,
                 (int)p.n_threads);
        return SD_ERR_INVALID_ARG;
    }
    *out = p;
    return SD_OK;
}

void sd_drafter_free(sd_drafter **pd) {
    if (!pd || !*pd) return;
    sd_drafter *d = *pd;
    if (d->ops && d->ops->destroy) d->ops->destroy(d);
    free(d);
    *pd = NULL;
}

sd_drafter_kind sd_drafter_kind_of(const sd_drafter *d) { return d ? d->kind : 0; }

const char *sd_drafter_name(const sd_drafter *d) { return d && d->ops ? d->ops->name : "none"; }

int32_t sd_drafter_max_q(const sd_drafter *d) {
    if (!d) return 0;
    return d->kind == SD_DRAFTER_NGRAM ? 1 : d->params.top_n;
}

sd_status sd_drafter_propose(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                             const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    if (!d || !context || !s || !tokens || !q || !n_drafted || n_context <= 0 || k < 0 || k > SD_SPEC_MAX_K) {
        SD_ERROR("drafter: propose needs a drafter, a non-empty context, sampling, outputs and 0 <= k <= %d "
                 "(n_context %d, k %d)", SD_SPEC_MAX_K, (int)n_context, (int)k);
        return SD_ERR_INVALID_ARG;
    }
    if (seq < 0 || seq >= d->params.max_seqs) {
        SD_ERROR("drafter: sequence slot %d outside [0, %d)", (int)seq, (int)d->params.max_seqs);
        return SD_ERR_RANGE;
    }
    SD_TRY(sd_sampling_validate(s));
    *n_drafted = 0;
    if (k == 0) return SD_OK;
    return d->ops->propose(d, seq, context, n_context, k, s, tokens, q, n_drafted);
}

sd_status sd_drafter_rollback(sd_drafter *d, int32_t seq, int32_t len) {
    if (!d || seq < 0 || seq >= d->params.max_seqs || len < 0) {
        SD_ERROR("drafter: rollback of slot %d to %d is out of range", (int)seq, (int)len);
        return SD_ERR_RANGE;
    }
    return d->ops->rollback ? d->ops->rollback(d, seq, len) : SD_OK;
}

void sd_drafter_release(sd_drafter *d, int32_t seq) {
    if (!d || seq < 0 || seq >= d->params.max_seqs) return;
    if (d->ops->release) d->ops->release(d, seq);
}

sd_status sd_draft_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs, sd_draft_result *results) {
    if (!d || n_seqs < 0 || (n_seqs > 0 && (!seqs || !results))) {
        SD_ERROR("drafter: draft_batch needs a drafter, sequences and results (n_seqs %d)", (int)n_seqs);
        return SD_ERR_INVALID_ARG;
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        const sd_draft_seq *v = &seqs[i];
        sd_draft_result *r = &results[i];
        r->outcome = SD_SEQ_OK;
        r->n_drafted = 0;
        bool dup = false;
        for (int32_t j = 0; j < i && !dup; j++) dup = seqs[j].slot == v->slot;
        if (v->slot < 0 || v->slot >= d->params.max_seqs || dup || v->keep_len < 0 || v->n_append < 1 ||
            !v->append || v->k < 0 || v->k > SD_SPEC_MAX_K ||
            (int64_t)v->keep_len + v->n_append > d->params.max_ctx) {
            SD_WARN("drafter: sequence %d: bad request (slot %d%s, keep_len %d, n_append %d, k %d, max_ctx %d)",
                    (int)i, (int)v->slot, dup ? " repeated" : "", (int)v->keep_len, (int)v->n_append, (int)v->k,
                    (int)d->params.max_ctx);
            r->outcome = SD_SEQ_INVALID;
        } else if (sd_sampling_validate(&v->sampling) != SD_OK) {
            r->outcome = SD_SEQ_INVALID;
        }
    }
    return d->ops->propose_batch(d, n_seqs, seqs, results);
}

/* ---- n-gram drafter ---- */

/* One-hot q storage, per sequence slot. */
typedef struct ngram_state {
    float one;                 /* 1.0f, what every q.probs points at */
    int32_t *draft;            /* [max_seqs][SD_SPEC_MAX_K] the ids q.ids point into */
    int32_t *history;          /* [max_seqs][max_ctx] committed tokens per slot (batched path), lazily */
    int32_t *history_len;      /* [max_seqs] */
} ngram_state;

static sd_status ngram_propose(sd_drafter *d, int32_t seq, const int32_t *context, int32_t n_context, int32_t k,
                               const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    (void)s;
    ngram_state *st = d->impl;
    int32_t *ids = st->draft + (size_t)seq * SD_SPEC_MAX_K;
    int32_t n_max = d->params.ngram_max < n_context - 1 ? d->params.ngram_max : n_context - 1;
    for (int32_t n = n_max; n >= d->params.ngram_min; n--) {
        const int32_t *suffix = context + n_context - n;
        /* Most recent earlier start j (j + n <= n_context - 1: at least one token follows). */
        for (int32_t j = n_context - n - 1; j >= 0; j--) {
            if (context[j] != suffix[0] || memcmp(context + j, suffix, (size_t)n * sizeof *context) != 0) continue;
            int32_t avail = n_context - (j + n);
            int32_t m = avail < k ? avail : k;
            for (int32_t i = 0; i < m; i++) {
                ids[i] = context[j + n + i];
                tokens[i] = ids[i];
                q[i] = (sd_spec_q){1, &ids[i], &st->one};
            }
            *n_drafted = m;
            return SD_OK;
        }
    }
    *n_drafted = 0;
    return SD_OK;
}

/* The batched path: the drafter keeps each slot's committed tokens (the
 * protocol sends only what is new), then looks up as ngram_propose does. */
static sd_status ngram_propose_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs,
                                     sd_draft_result *results) {
    ngram_state *st = d->impl;
    const size_t max_ctx = (size_t)d->params.max_ctx;
    if (!st->history) {
        st->history = malloc((size_t)d->params.max_seqs * max_ctx * sizeof *st->history);
        st->history_len = calloc((size_t)d->params.max_seqs, sizeof *st->history_len);
        if (!st->history || !st->history_len) {
            free(st->history);
            free(st->history_len);
            st->history = st->history_len = NULL;
            SD_ERROR("drafter: out of memory for the n-gram drafter's histories");
            return SD_ERR_NOMEM;
        }
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        const sd_draft_seq *v = &seqs[i];
        sd_draft_result *r = &results[i];
        if (r->outcome != SD_SEQ_OK) continue;
        if (st->history_len[v->slot] < v->keep_len) {
            r->outcome = SD_SEQ_CACHE_MISS;
            continue;
        }
        int32_t *h = st->history + (size_t)v->slot * max_ctx;
        memcpy(h + v->keep_len, v->append, (size_t)v->n_append * sizeof *h);
        int32_t n = v->keep_len + v->n_append;
        st->history_len[v->slot] = n;
        if (v->k > 0) SD_TRY(ngram_propose(d, v->slot, h, n, v->k, &v->sampling, r->tokens, r->q, &r->n_drafted));
    }
    return SD_OK;
}

static sd_status ngram_rollback(sd_drafter *d, int32_t seq, int32_t len) {
    ngram_state *st = d->impl;
    if (st->history_len && st->history_len[seq] > len) st->history_len[seq] = len;
    return SD_OK;
}

static void ngram_release(sd_drafter *d, int32_t seq) {
    ngram_state *st = d->impl;
    if (st->history_len) st->history_len[seq] = 0;
}

static void ngram_destroy(sd_drafter *d) {
    ngram_state *st = d->impl;
    if (st) {
        free(st->draft);
        free(st->history);
        free(st->history_len);
    }
    free(st);
    d->impl = NULL;
}

static const drafter_ops ngram_ops = {
    .name = "ngram", .propose = ngram_propose, .propose_batch = ngram_propose_batch, .rollback = ngram_rollback,
    .release = ngram_release, .destroy = ngram_destroy,
};

sd_status sd_drafter_ngram_create(const sd_drafter_params *p, sd_drafter **out) {
    if (!out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_drafter_params params;
    SD_TRY(drafter_params_check(p, &params));
    sd_drafter *d = calloc(1, sizeof *d);
    ngram_state *st = calloc(1, sizeof *st);
    int32_t *draft = calloc((size_t)params.max_seqs * SD_SPEC_MAX_K, sizeof *draft);
    if (!d || !st || !draft) {
        free(d);
        free(st);
        free(draft);
        SD_ERROR("drafter: out of memory creating the n-gram drafter");
        return SD_ERR_NOMEM;
    }
    st->one = 1.0f;
    st->draft = draft;
    d->kind = SD_DRAFTER_NGRAM;
    d->ops = &ngram_ops;
    d->params = params;
    d->impl = st;
    *out = d;
    return SD_OK;
}
