/* draft_serve.c — DraftRequest batches on one sd_drafter (see
 * draft_serve.h).
 *
 * The drafter interface (drafter.h) takes a sequence's whole committed
 * context on every call and keeps its own KV cache per slot (rolling back
 * to the common prefix by itself), so this layer's job is the cache
 * protocol: a slot per request_id holding the committed tokens received so
 * far, truncated to keep_len and extended by append, and the copy of each
 * proposal into the response. Drafts are never counted as held:
 * cached_len = keep_len + |append|, so the coordinator's next keep_len is at
 * most that and the drafter's own rollback happens on the next call.
 *
 * The proposals come from one sd_draft_batch call per request (spec_batch.h:
 * a model drafter runs one ragged forward per draft step across all the
 * request's sequences), which also truncates the drafter's own cache to
 * keep_len; the tokens held here serve the protocol checks, the stats and
 * an empty append (the last held token is fed again).
 *
 * Corner cases (chosen here): CACHE_MISS frees the slot and reports
 * cached_len 0; a sequence longer than max_ctx gets KV_FULL (the slots hold
 * max_ctx tokens), and so does a new id when every slot is taken; the
 * request's top_n is advisory: q is always exactly what the drafter sampled
 * from (its own top_n), which is what exactness needs.
 *
 * Padded vocabularies: the coordinator registers a draft whose tokenizer
 * hashes like the target's whatever its embedding rows; the Welcome's size
 * reaches sd_draft_server_pair_vocab (the socket thread) and is applied at
 * the next step (sd_drafter_pair_vocab: a wider draft drafts among the
 * target's ids only). A sequence whose context holds an id past the
 * draft's rows (a target padding id) gets OK with no drafts, every step,
 * without touching the drafter.
 *
 * An EAGLE-3 head (params.head_seq, specd-drafter --eagle) serves each
 * sequence on its own (draft_head.c): the features its DraftSeq carries are
 * fed to it, then it drafts on the held tokens.
 *
 * Structured output: with the target's tokenizer (params.tok), a
 * constrained sequence drafts first the tokens its constraint forces, then
 * the drafter's from there, masked (draft_constrain.h); the forced tokens
 * are fed to the drafter as context, written after the held tokens and not
 * counted as held. */
#include "draft_serve.h"
#include "draft_constrain.h"

#include "specd/slots.h"

#include "specd/sample.h"
#include "specd/spec_batch.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Block unit of the stats: the size of the verifier's and model drafter's KV blocks. */
#define STATS_BLOCK 16

struct sd_draft_server {
    sd_drafter *drafter;
    sd_draft_server_params p;
    _Atomic int32_t pair_to; /* the target's rows from the Welcome (sd_draft_server_pair_vocab); 0 = none */
    int32_t paired;          /* the rows the drafter was last paired with (the compute thread's) */
    int32_t embed_rows;      /* sd_drafter_embed_rows: a context holding an id past them drafts nothing */
    uint64_t steps;
    sd_slots slots;  /* request id -> slot (net/slots.c) */
    int32_t *held;   /* [max_seqs] committed tokens held per slot */
    int32_t *tokens; /* [max_seqs][max_ctx] committed tokens per slot */
    /* response storage */
    Specd__DraftResult *results;      /* [max_batch] */
    Specd__DraftResult **result_ptrs; /* [max_batch] */
    int32_t *draft;                   /* [max_batch][max_k] */
    Specd__SparseDist *dists;         /* [max_batch][max_k] */
    Specd__SparseDist **dist_ptrs;    /* [max_batch][max_k] */
    int32_t *q_ids;                   /* [max_batch][max_k][top_n] */
    float *q_probs;                   /* [max_batch][max_k][top_n] */
    /* sd_draft_batch's inputs and outputs, [max_batch] each */
    sd_draft_seq *dseqs;
    sd_draft_result *dresults;
    int32_t *dindex;   /* batch index of each dseq */
    sd_dcon_seq *dcon; /* [max_batch] each dseq's constraint (draft_constrain.h) */
    sd_con_slots *con; /* per-slot constraints; NULL without a tokenizer */
};

static void slot_release(void *user, int32_t slot) {
    sd_draft_server *s = user;
    sd_drafter_release(s->drafter, slot);
    sd_con_slots_release(s->con, slot);
    s->held[slot] = 0;
}

static int32_t slot_held(void *user, int32_t slot) { return ((const sd_draft_server *)user)->held[slot]; }

sd_draft_server_params sd_draft_server_default_params(void) {
    sd_draft_server_params p = {
        .max_seqs = 64,
        .max_ctx = 4096,
        .max_batch = 64,
        .max_k = 16,
        .n_vocab = 0,
        .top_n = SD_SPEC_DEFAULT_TOP_N,
        .tok = NULL,
        .feature_width = 0,
        .head_seq = NULL,
        .head = NULL,
    };
    return p;
}

void sd_draft_server_free(sd_draft_server **ps) {
    if (!ps || !*ps) return;
    sd_draft_server *s = *ps;
    sd_slots_free(&s->slots);
    free(s->held);
    free(s->tokens);
    free(s->results);
    free(s->result_ptrs);
    free(s->draft);
    free(s->dists);
    free(s->dist_ptrs);
    free(s->q_ids);
    free(s->q_probs);
    free(s->dseqs);
    free(s->dresults);
    free(s->dindex);
    free(s->dcon);
    sd_con_slots_free(&s->con);
    free(s);
    *ps = NULL;
}

sd_status sd_draft_server_create(sd_drafter *drafter, const sd_draft_server_params *params, sd_draft_server **out) {
    if (!drafter || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_draft_server_params p = params ? *params : sd_draft_server_default_params();
    if (p.max_seqs <= 0 || p.max_seqs > 1 << 16 || p.max_ctx <= 0 || p.max_ctx > 1 << 24 || p.max_batch <= 0 ||
        p.max_batch > SD_MAX_BATCH || p.max_k <= 0 || p.max_k > SD_MAX_K || p.max_k > SD_MAX_K || p.n_vocab <= 0 ||
        p.top_n <= 0 || p.top_n > SD_MAX_TOP_N) {
        SD_ERROR("drafter: bad server parameters (max_seqs %d, max_ctx %d, max_batch %d in [1, %d], max_k %d in "
                 "[1, %d], n_vocab %d, top_n %d in [1, %d])",
                 (int)p.max_seqs, (int)p.max_ctx, (int)p.max_batch, SD_MAX_BATCH, (int)p.max_k, SD_MAX_K,
                 (int)p.n_vocab, (int)p.top_n, SD_MAX_TOP_N);
        return SD_ERR_INVALID_ARG;
    }
    if (p.feature_width < 0 || p.feature_width > SD_MAX_FEATURE_WIDTH || (p.feature_width > 0) != !!p.head_seq) {
        SD_ERROR("drafter: a head drafter needs both a feature width in [1, %d] and its path (width %d)",
                 SD_MAX_FEATURE_WIDTH, (int)p.feature_width);
        return SD_ERR_INVALID_ARG;
    }
    if (p.top_n < sd_drafter_max_q(drafter)) {
        /* fill_result would cut each q to top_n entries: a drafted token
         * could fall outside its q, and verification would not be exact */
        SD_ERROR("drafter: the server keeps %d entries of each q, the %s drafter makes up to %d", (int)p.top_n,
                 sd_drafter_name(drafter), (int)sd_drafter_max_q(drafter));
        return SD_ERR_INVALID_ARG;
    }
    sd_draft_server *s = calloc(1, sizeof *s);
    if (!s) return SD_ERR_NOMEM;
    s->drafter = drafter;
    s->p = p;
    s->embed_rows = sd_drafter_embed_rows(drafter);
    size_t nb = (size_t)p.max_batch, nd = (size_t)p.max_k, nq = nb * nd * (size_t)p.top_n;
    s->held = calloc((size_t)p.max_seqs, sizeof *s->held);
    sd_status sst = s->held ? sd_slots_init(&s->slots, p.max_seqs, slot_release, slot_held, s) : SD_ERR_NOMEM;
    s->tokens = malloc((size_t)p.max_seqs * (size_t)p.max_ctx * sizeof *s->tokens);
    s->results = calloc(nb, sizeof *s->results);
    s->result_ptrs = calloc(nb, sizeof *s->result_ptrs);
    s->draft = calloc(nb * nd, sizeof *s->draft);
    s->dists = calloc(nb * nd, sizeof *s->dists);
    s->dist_ptrs = calloc(nb * nd, sizeof *s->dist_ptrs);
    s->q_ids = calloc(nq, sizeof *s->q_ids);
    s->q_probs = calloc(nq, sizeof *s->q_probs);
    s->dseqs = calloc(nb, sizeof *s->dseqs);
    s->dresults = calloc(nb, sizeof *s->dresults);
    s->dindex = calloc(nb, sizeof *s->dindex);
    s->dcon = calloc(nb, sizeof *s->dcon);
    if (sst == SD_OK && p.tok) sst = sd_con_slots_create(p.tok, p.max_seqs, &s->con);
    if (!s->dcon || !s->dseqs || !s->dresults || !s->dindex || sst != SD_OK || !s->tokens || !s->results ||
        !s->result_ptrs || !s->draft || !s->dists || !s->dist_ptrs || !s->q_ids || !s->q_probs) {
        SD_ERROR("drafter: out of memory for %d slots of %d tokens", (int)p.max_seqs, (int)p.max_ctx);
        sd_draft_server_free(&s);
        return SD_ERR_NOMEM;
    }
    *out = s;
    return SD_OK;
}

sd_net_limits sd_draft_server_limits(const sd_draft_server *s) {
    sd_net_limits lim = {s->p.n_vocab, s->p.max_ctx, s->p.max_batch, s->p.max_k, s->p.feature_width};
    return lim;
}

/* Copies a proposal into response storage for batch entry i. */
static void fill_result(sd_draft_server *s, size_t i, const int32_t *tokens, const sd_spec_q *q, int32_t n,
                        Specd__DraftResult *res) {
    size_t nd = (size_t)s->p.max_k, tn = (size_t)s->p.top_n;
    int32_t *draft = s->draft + i * nd;
    Specd__SparseDist *dists = s->dists + i * nd;
    Specd__SparseDist **dptr = s->dist_ptrs + i * nd;
    for (int32_t j = 0; j < n; j++) {
        int32_t *ids = s->q_ids + (i * nd + (size_t)j) * tn;
        float *probs = s->q_probs + (i * nd + (size_t)j) * tn;
        double sum = 0;
        int32_t m = 0;
        for (int32_t e = 0; e < q[j].n && m < (int32_t)tn; e++) {
            if (!(q[j].probs[e] > 0)) continue; /* a zero entry carries no mass */
            ids[m] = q[j].ids[e];
            probs[m] = q[j].probs[e];
            sum += q[j].probs[e];
            m++;
        }
        for (int32_t e = 0; e < m; e++) probs[e] = (float)(probs[e] / sum);
        specd__sparse_dist__init(&dists[j]);
        dists[j].n_ids = (size_t)m;
        dists[j].ids = ids;
        dists[j].n_probs = (size_t)m;
        dists[j].probs = probs;
        dptr[j] = &dists[j];
        draft[j] = tokens[j];
    }
    res->n_tokens = (size_t)n;
    res->tokens = draft;
    res->n_q = (size_t)n;
    res->q = dptr;
}

/* An EAGLE head's sequence (params.head_seq): the constraint's forced
 * drafts first (written at held[len..]), then the head's, masked after
 * them, both cut as a model drafter's are (sd_dcon_finish). */
static void head_seq(sd_draft_server *s, size_t i, int32_t slot, const Specd__DraftSeq *sq, int32_t *held, int32_t len,
                     int32_t k, const sd_sampling *sampling, Specd__DraftResult *res, sd_head_catchup *cu) {
    sd_dcon_seq dc;
    sd_dcon_begin(s->con, s->p.tok, slot, sq, held, len, k, s->p.max_ctx - len, &dc);
    if (dc.n_forced > 0)
        SD_DEBUG("drafter: slot %d context %d: %d forced drafts", (int)slot, (int)len, (int)dc.n_forced);
    sd_draft_result dr = {.outcome = SD_SEQ_OK};
    s->p.head_seq(s->p.head, s->drafter, slot, sq, held, len, dc.n_forced, k - dc.n_forced, sampling, dc.con,
                  dr.tokens, dr.q, &dr.n_drafted, cu);
    int32_t tokens[SD_MAX_K];
    sd_spec_q q[SD_MAX_K];
    int32_t n = sd_dcon_finish(&dc, held + len, &dr, tokens, q);
    fill_result(s, i, tokens, q, n, res);
}

void sd_draft_server_pair_vocab(sd_draft_server *s, int32_t target_n_vocab) {
    if (s && target_n_vocab > 0) atomic_store(&s->pair_to, target_n_vocab);
}

/* Whether n tokens hold an id past the drafter's embedding (the target's
 * padding, when its rows pass the draft's). */
static bool unembeddable(const sd_draft_server *s, const int32_t *tokens, int64_t n) {
    if (s->paired <= s->embed_rows) return false;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] >= s->embed_rows) return true;
    return false;
}

sd_status sd_draft_server_handle(sd_draft_server *s, const sd_net_draft_step *step, Specd__DraftResponse *resp) {
    if (!s || !step || !step->req || !resp) return SD_ERR_INVALID_ARG;
    const Specd__DraftRequest *req = step->req;
    int32_t pair_to = atomic_load(&s->pair_to);
    if (pair_to > 0 && pair_to != s->paired) {
        SD_TRY(sd_drafter_pair_vocab(s->drafter, pair_to));
        s->paired = pair_to;
    }
    if (req->n_seqs > (size_t)s->p.max_batch) {
        SD_ERROR("drafter: step %llu has %zu sequences, more than max_batch %d", (unsigned long long)req->step_id,
                 req->n_seqs, (int)s->p.max_batch);
        return SD_ERR_RANGE;
    }
    double t0 = sd_now();
    int32_t n_batch = 0;
    sd_head_catchup cu = {0};
    for (size_t i = 0; i < req->n_seqs; i++) {
        const Specd__DraftSeq *sq = req->seqs[i];
        Specd__DraftResult *res = &s->results[i];
        specd__draft_result__init(res);
        res->request_id = sq->request_id;
        res->code = SPECD__CODE__CODE_BAD_REQUEST;
        s->result_ptrs[i] = res;
        bool dup = false;
        for (size_t j = 0; j < i; j++) dup = dup || req->seqs[j]->request_id == sq->request_id;
        if (dup) {
            SD_WARN("drafter: request %llu: appears twice in the batch", (unsigned long long)sq->request_id);
            continue;
        }
        int64_t len = (int64_t)sq->keep_len + (int64_t)sq->n_append;
        int32_t slot;
        bool taken;
        res->code =
            sd_slots_admit(&s->slots, sq->request_id, (int32_t)sq->keep_len, len <= s->p.max_ctx, &slot, &taken);
        if (res->code == SPECD__CODE__CODE_KV_FULL && len > s->p.max_ctx)
            SD_WARN("drafter: request %llu: %lld tokens do not fit a slot of %d", (unsigned long long)sq->request_id,
                    (long long)len, (int)s->p.max_ctx);
        if (res->code != SPECD__CODE__CODE_OK) continue;
        int32_t *held = s->tokens + (size_t)slot * (size_t)s->p.max_ctx;
        if (sq->n_append > 0) memcpy(held + sq->keep_len, sq->append, sq->n_append * sizeof *held);
        s->held[slot] = (int32_t)len;
        res->cached_len = (uint32_t)len;
        int32_t k = (int32_t)sq->k < s->p.max_k ? (int32_t)sq->k : s->p.max_k;
        if (len == 0) continue;                   /* nothing to continue from: no drafts */
        if (unembeddable(s, held, len)) continue; /* an id the draft cannot embed: no drafts (K = 0) */
        if (s->p.head_seq) { /* an EAGLE head: its features fed, then drafts on the whole context */
            head_seq(s, i, slot, sq, held, (int32_t)len, k, &step->sampling[i], res, &cu);
            continue;
        }
        /* sd_draft_batch wants at least one new token: with an empty append,
         * feed the last held token again (keep one less). */
        int32_t keep = (int32_t)sq->keep_len, n_new = (int32_t)sq->n_append;
        if (n_new == 0) {
            keep = (int32_t)len - 1;
            n_new = 1;
        }
        /* forced drafts (at held[len..]) are context for the drafter */
        sd_dcon_seq *dc = &s->dcon[n_batch];
        sd_dcon_begin(s->con, s->p.tok, slot, sq, held, (int32_t)len, k, s->p.max_ctx - (int32_t)len, dc);
        s->dseqs[n_batch] = (sd_draft_seq){
            .slot = slot,
            .keep_len = keep,
            .n_append = n_new + dc->n_forced,
            .append = held + keep,
            .k = k - dc->n_forced,
            .sampling = step->sampling[i], /* converted and checked where the step came in */
            .constraint = dc->con,
        };
        s->dindex[n_batch++] = (int32_t)i;
    }
    if (n_batch > 0) {
        sd_status st = sd_draft_batch(s->drafter, n_batch, s->dseqs, s->dresults);
        if (st != SD_OK) {
            SD_ERROR("drafter: step %llu: the draft batch failed: %s", (unsigned long long)req->step_id,
                     sd_status_str(st));
            return st;
        }
    }
    for (int32_t j = 0; j < n_batch; j++) {
        size_t i = (size_t)s->dindex[j];
        const sd_draft_result *dr = &s->dresults[j];
        Specd__DraftResult *res = &s->results[i];
        int32_t slot = s->dseqs[j].slot;
        const int32_t *held = s->tokens + (size_t)slot * (size_t)s->p.max_ctx;
        int32_t tokens[SD_MAX_K];
        sd_spec_q q[SD_MAX_K];
        int32_t n = sd_dcon_finish(&s->dcon[j], held + s->held[slot], dr, tokens, q);
        switch (dr->outcome) {
        case SD_SEQ_OK: fill_result(s, i, tokens, q, n, res); break;
        case SD_SEQ_CACHE_MISS:
        case SD_SEQ_OUT_OF_BLOCKS:
            SD_DEBUG("drafter: request %llu: %s", (unsigned long long)res->request_id, sd_seq_outcome_str(dr->outcome));
            res->code = dr->outcome == SD_SEQ_CACHE_MISS ? SPECD__CODE__CODE_CACHE_MISS : SPECD__CODE__CODE_KV_FULL;
            res->cached_len = 0;
            sd_slots_release(&s->slots, slot);
            break;
        default:
            SD_WARN("drafter: request %llu: %s", (unsigned long long)res->request_id, sd_seq_outcome_str(dr->outcome));
            res->code = SPECD__CODE__CODE_BAD_REQUEST;
            res->cached_len = 0;
            sd_slots_release(&s->slots, slot);
            break;
        }
    }
    s->steps++;
    specd__draft_response__init(resp);
    resp->step_id = req->step_id;
    resp->n_results = req->n_seqs;
    resp->results = s->result_ptrs;
    const double took = sd_now() - t0;
    resp->draft_us = (uint32_t)(took * 1e6 < 4e9 ? took * 1e6 : 4e9);
    /* within the step's time and its sequences' contexts (net/validate.c) */
    double cu_us = cu.s * 1e6 < resp->draft_us ? cu.s * 1e6 : resp->draft_us;
    resp->catchup_us = cu_us > 0 ? (uint32_t)cu_us : 0;
    resp->catchup_rows = cu.rows > 0 ? (uint32_t)(cu.rows < UINT32_MAX ? cu.rows : UINT32_MAX) : 0;
    return SD_OK;
}

/* One warm-up batch (sd_warmup_step_fn) of n_tokens appended tokens over
 * slots 0..; *fits is false when the slots are too short for it. */
static sd_status warmup_batch(void *user, int32_t n_tokens, const sd_sampling *sampling, const int32_t *toks,
                              bool *fits) {
    sd_draft_server *s = user;
    int32_t n_seqs = n_tokens;
    if (n_seqs > s->p.max_batch) n_seqs = s->p.max_batch;
    if (n_seqs > s->p.max_seqs) n_seqs = s->p.max_seqs;
    const int32_t per = (n_tokens + n_seqs - 1) / n_seqs;
    *fits = per + 2 <= s->p.max_ctx;
    if (!*fits) return SD_OK;
    int32_t off = 0;
    for (int32_t q = 0; q < n_seqs; q++) {
        const int32_t len = n_tokens / n_seqs + (q < n_tokens % n_seqs ? 1 : 0);
        s->dseqs[q] = (sd_draft_seq){.slot = q,
                                     .keep_len = 0,
                                     .n_append = len,
                                     .append = toks + off,
                                     .k = s->p.max_k < 2 ? s->p.max_k : 2,
                                     .sampling = *sampling};
        off += len;
    }
    sd_status st = sd_draft_batch(s->drafter, n_seqs, s->dseqs, s->dresults);
    for (int32_t q = 0; q < n_seqs; q++) sd_drafter_release(s->drafter, q);
    SD_TRY(st);
    for (int32_t q = 0; q < n_seqs; q++)
        SD_TRY(sd_warmup_outcome("drafter", n_tokens, q, s->dresults[q].outcome, fits));
    return SD_OK;
}

sd_status sd_draft_server_warmup(sd_draft_server *s, int32_t max_tokens, sd_warmup_report *rep) {
    if (rep) memset(rep, 0, sizeof *rep);
    if (!s || max_tokens < 0) return SD_ERR_INVALID_ARG;
    if (sd_slots_used(&s->slots) > 0) {
        SD_ERROR("drafter: warm-up is for a drafter that has not served yet (%d slots are in use)",
                 (int)sd_slots_used(&s->slots));
        return SD_ERR_INVALID_ARG;
    }
    return sd_warmup_run("drafter", SD_WARMUP_FULL, max_tokens, s->p.n_vocab, warmup_batch, s, rep);
}

void sd_draft_server_release(sd_draft_server *s, const uint64_t *request_ids, size_t n) {
    if (s) sd_slots_release_ids(&s->slots, request_ids, n);
}

void sd_draft_server_reset(sd_draft_server *s) {
    if (s) sd_slots_reset(&s->slots);
}

void sd_draft_server_stats(const sd_draft_server *s, Specd__WorkerStats *stats) {
    if (!s || !stats) return;
    uint32_t per_slot = (uint32_t)((s->p.max_ctx + STATS_BLOCK - 1) / STATS_BLOCK);
    uint32_t used = 0, n_seqs = 0;
    for (int32_t i = 0; i < s->p.max_seqs; i++) {
        if (!s->slots.used[i]) continue;
        n_seqs++;
        used += (uint32_t)((s->held[i] + STATS_BLOCK - 1) / STATS_BLOCK);
    }
    stats->kv_blocks_total = per_slot * (uint32_t)s->p.max_seqs;
    stats->kv_blocks_free = stats->kv_blocks_total - used;
    stats->n_sequences = n_seqs;
    stats->steps = s->steps;
}
