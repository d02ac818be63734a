/* verify_serve.c — VerifyRequest batches on the target model (see
 * verify_serve.h).
 *
 * A sequence lives in one KV slot; the slot map is a flat array searched
 * linearly (max_seqs is tens to a few hundred: a hash table would buy
 * nothing next to a forward pass). A batch runs in two parts:
 *   1. admission, per sequence (here): validate, find or take a slot,
 *      CACHE_MISS when the slot holds fewer than keep_len tokens, truncate;
 *   2. a normal step goes to sd_spec_verify_batch (spec_batch.h): one ragged
 *      forward over every admitted sequence's [append, drafts], greedy or
 *      exact stochastic verification keyed by (seed, keep_len + |append| + i),
 *      rollback to the committed prefix without its last token, and a
 *      per-sequence OUT_OF_BLOCKS (-> KV_FULL) so one long sequence never
 *      fails the batch. A prefill_only chunk (which samples nothing, so
 *      spec_batch does not serve it) counts its blocks in batch order
 *      against the free pool and runs one forward with no logits here.
 *
 * Cache protocol corner cases (the brief leaves them open; chosen here):
 *   - CACHE_MISS frees the slot: the coordinator resends from keep_len 0,
 *     and the result says cached_len 0.
 *   - A sequence refused with KV_FULL keeps what it had up to keep_len and
 *     says so in cached_len; a new id refused with KV_FULL takes no slot.
 *   - A normal step needs append >= 1 (the last committed token has no K/V
 *     yet, its logits give p for the first draft): BAD_REQUEST otherwise.
 *   - keep_len + |append| + |draft| over the context: BAD_REQUEST.
 *
 * Penalties count the generated tokens, which the KV cache does not keep:
 * each slot also holds the token ids its cache holds (hist), truncated and
 * appended with it, so row i of a verify step is penalized over
 * hist[prompt_len .. n_ctx) and the drafts before it (spec_batch.h).
 * Logprobs (VerifySeq.logprobs) come back per commit token, computed on the
 * host from the target's logits (spec_batch.c). Prompt logprobs
 * (VerifySeq.prompt_logprobs, echo with logprobs) come from prefill chunks
 * only: such a sequence gets its own forward with logits at every row
 * (at most SD_MAX_PROMPT_LP_ROWS), scored on the host; other sequences'
 * prefill keeps running without the LM head. Any backend whose forward
 * returns logits serves it (the CUDA one copies those rows to the host).
 *
 * Prefix cache (kv.h, kv_prefix.c): a prefill chunk of a sequence whose
 * cache ends on a cached block boundary first adopts the cached blocks that
 * continue it (hist holds the tokens), and in a host cache outside a TP
 * group copies the rows of a cached block it ends or diverges inside, and
 * computes only the rest; the
 * answer is the same (cached_len keep_len + |append|), so the coordinator
 * needs no change. Full blocks are registered once their tokens are
 * committed (after a prefill chunk, after a verify step's rollback). A
 * keep_len inside a block another sequence shares cannot be kept (it is
 * never written again): that sequence gets CACHE_MISS and is resent, its
 * prefix then adopted. Chunks asking for prompt logprobs adopt nothing. */
#include "verify_serve.h"
#include "verify_constrain.h"
#include "verify_head.h"
#include "verify_feat.h"

#include "specd/slots.h"

#include "specd/sample.h"
#include "specd/spec.h"
#include "specd/spec_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Per sequence of the current batch. */
typedef struct seq_plan {
    int32_t slot; /* -1 when not admitted */
    int32_t keep_len;
    int32_t n_append;
    int32_t k;
    bool new_slot; /* the slot was taken by this request */
    sd_sampling sampling;
    int32_t row0, row_from; /* prefill: its first row in the step's forward (-1: none), that row's position */
} seq_plan;

struct sd_verifier {
    sd_model *target;
    sd_kv *kv;
    sd_verifier_params p;
    int32_t n_vocab;
    uint64_t steps;
    sd_slots slots; /* request id -> KV slot (net/slots.c) */
    seq_plan *plan; /* [max_batch] */
    /* response storage, [max_batch] each */
    Specd__VerifyResult *results;
    Specd__VerifyResult **result_ptrs;
    int32_t *commits; /* [max_batch][max_k + 1] */
    /* batch storage, grown on demand */
    int32_t *tokens, *pos, *seq; /* prefill chunks' batch rows */
    size_t cap_rows;
    /* sd_spec_verify_batch's inputs and outputs, [max_batch] each */
    sd_verify_seq *vseqs;
    sd_verify_result *vresults;
    sd_spec_q *vq;   /* [max_batch][max_k] */
    int32_t *vindex; /* batch index of each vseq */
    sd_spec_scratch *spec_scratch;
    /* per slot, [max_seqs]: the token ids its KV cache holds */
    int32_t **hist;
    int32_t *hist_len, *hist_cap;
    /* VerifyResult.logprobs / top_ids / top_logprobs storage: [max_batch]
     * x (max_k + 1) x (1, SD_MAX_TOP_LOGPROBS, SD_MAX_TOP_LOGPROBS) */
    float *lp_values;
    int32_t *lp_top_ids;
    float *lp_top_values;
    /* prompt logprobs of a prefill step (VerifySeq.prompt_logprobs),
     * allocated on first use: [max_batch] x SD_MAX_PROMPT_LP_ROWS x (1,
     * SD_MAX_TOP_LOGPROBS, SD_MAX_TOP_LOGPROBS), and one sequence's logits,
     * [SD_MAX_PROMPT_LP_ROWS][n_vocab] (the LM head runs over those rows) */
    float *pl_values;
    int32_t *pl_top_ids;
    float *pl_top_values;
    float *pl_logits;
    bool *pl_wanted; /* [SD_MAX_PROMPT_LP_ROWS], all true */
    sd_vcon *con;    /* per-slot constraints (verify_constrain.h); NULL without a tokenizer */
    sd_vhead *head;  /* --eagle: the head drafting in this process, or NULL */
    sd_vfeat *feat;  /* features for a head drafter in another process (verify_feat.h) */
};

static void slot_release(void *user, int32_t slot) {
    sd_verifier *v = user;
    sd_kv_release(v->kv, slot);
    sd_vhead_release(v->head, slot);
    v->hist_len[slot] = 0;
    sd_vcon_release(v->con, slot);
}

/* Truncates slot's token history to keep (it holds at least that many)
 * and appends add[n]. */
static sd_status hist_put(sd_verifier *v, int32_t slot, int32_t keep, const int32_t *add, int32_t n) {
    if (v->hist_len[slot] < keep) {
        SD_ERROR("verifier: slot %d's token history holds %d tokens, its cache %d", (int)slot, (int)v->hist_len[slot],
                 (int)keep);
        return SD_ERR_INTERNAL;
    }
    int64_t need = (int64_t)keep + n;
    if (need > v->hist_cap[slot]) {
        int64_t cap = v->hist_cap[slot] ? v->hist_cap[slot] : 256;
        while (cap < need) cap *= 2;
        int32_t *h = realloc(v->hist[slot], (size_t)cap * sizeof *h);
        if (!h) return SD_ERR_NOMEM;
        v->hist[slot] = h;
        v->hist_cap[slot] = (int32_t)cap;
    }
    if (n > 0) memcpy(v->hist[slot] + keep, add, (size_t)n * sizeof *add);
    v->hist_len[slot] = (int32_t)need;
    return SD_OK;
}

static int32_t slot_held(void *user, int32_t slot) { return sd_kv_seq_len(((sd_verifier *)user)->kv, slot); }

/* sd_verifier_params.kv_prefault: the pool touched once, timed. */
static sd_status prefault(sd_kv *kv) {
    size_t bytes = 0;
    const double t0 = sd_now();
    sd_status st = sd_kv_prefault(kv, &bytes);
    if (st == SD_OK && bytes)
        SD_INFO("verifier: KV pool prefaulted: %.2f GiB in %.1f s", (double)bytes / 1073741824.0, sd_now() - t0);
    return st;
}

sd_verifier_params sd_verifier_default_params(void) {
    sd_verifier_params p = {
        .max_seqs = 64,
        .kv_blocks = 0,
        .block_size = 16,
        .max_batch = 64,
        .max_k = 16,
        .max_ctx = 0,
        .prefix_cache_pct = 50,
    };
    return p;
}

int32_t sd_verifier_default_kv_blocks(const sd_model_config *cfg, int32_t max_seqs, int32_t block_size,
                                      int32_t max_ctx) {
    if (block_size <= 0) block_size = 16;
    int32_t ctx = max_ctx > 0 ? max_ctx : cfg->n_ctx_train;
    int64_t per_seq = ((int64_t)ctx / 4 + block_size - 1) / block_size;
    int64_t want = per_seq * max_seqs;
    int64_t one_ctx = ((int64_t)ctx + block_size - 1) / block_size + 1;
    if (want < one_ctx) want = one_ctx;
    /* K and V, every layer, f32. */
    int64_t block_bytes = (int64_t)cfg->n_layers * 2 * block_size * cfg->n_kv_heads * cfg->head_dim * 4;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && block_bytes > 0) {
        int64_t cap = (int64_t)pages * page / 4 / block_bytes;
        if (cap < one_ctx) cap = one_ctx;
        if (want > cap) {
            SD_WARN("verifier: KV pool capped at %lld blocks (a quarter of available memory) instead of %lld",
                    (long long)cap, (long long)want);
            want = cap;
        }
    }
    return want > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)want;
}

void sd_verifier_free(sd_verifier **pv) {
    if (!pv || !*pv) return;
    sd_verifier *v = *pv;
    sd_vfeat_free(&v->feat);
    sd_vhead_free(&v->head);
    sd_kv_free(&v->kv);
    sd_slots_free(&v->slots);
    free(v->plan);
    free(v->results);
    free(v->result_ptrs);
    free(v->commits);
    free(v->tokens);
    free(v->pos);
    free(v->seq);
    free(v->vseqs);
    free(v->vresults);
    free(v->vq);
    free(v->vindex);
    for (int32_t i = 0; v->hist && i < v->p.max_seqs; i++) free(v->hist[i]);
    free(v->hist);
    free(v->hist_len);
    free(v->hist_cap);
    free(v->lp_values);
    free(v->lp_top_ids);
    free(v->lp_top_values);
    free(v->pl_values);
    free(v->pl_top_ids);
    free(v->pl_top_values);
    free(v->pl_logits);
    free(v->pl_wanted);
    sd_spec_scratch_free(&v->spec_scratch);
    sd_vcon_free(&v->con);
    free(v);
    *pv = NULL;
}

sd_status sd_verifier_create(sd_model *target, const sd_verifier_params *params, sd_verifier **out) {
    if (!target || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_verifier_params p = params ? *params : sd_verifier_default_params();
    const sd_model_config *cfg = sd_model_config_of(target);
    if (p.block_size <= 0) p.block_size = 16;
    if (p.max_ctx <= 0 || p.max_ctx > cfg->n_ctx_train) p.max_ctx = cfg->n_ctx_train;
    if (p.max_seqs <= 0 || p.max_seqs > 1 << 16 || p.kv_blocks <= 0 || p.max_batch <= 0 || p.max_batch > SD_MAX_BATCH ||
        p.max_k < 0 || p.max_k > SD_MAX_K || p.prefix_cache_pct < 0 || p.prefix_cache_pct > 100) {
        SD_ERROR("verifier: bad parameters (max_seqs %d, kv_blocks %d, max_batch %d in [1, %d], max_k %d in "
                 "[0, %d], prefix_cache_pct %d in [0, 100])",
                 (int)p.max_seqs, (int)p.kv_blocks, (int)p.max_batch, SD_MAX_BATCH, (int)p.max_k, SD_MAX_K,
                 (int)p.prefix_cache_pct);
        return SD_ERR_INVALID_ARG;
    }
    sd_verifier *v = calloc(1, sizeof *v);
    if (!v) return SD_ERR_NOMEM;
    v->target = target;
    v->p = p;
    v->n_vocab = cfg->n_vocab;
    size_t nb = (size_t)p.max_batch, rows = (size_t)p.max_k + 1;
    sd_status sst = sd_slots_init(&v->slots, p.max_seqs, slot_release, slot_held, v);
    v->plan = calloc(nb, sizeof *v->plan);
    v->results = calloc(nb, sizeof *v->results);
    v->result_ptrs = calloc(nb, sizeof *v->result_ptrs);
    v->commits = calloc(nb * rows, sizeof *v->commits);
    v->vseqs = calloc(nb, sizeof *v->vseqs);
    v->vresults = calloc(nb, sizeof *v->vresults);
    v->vq = calloc(nb * rows, sizeof *v->vq);
    v->vindex = calloc(nb, sizeof *v->vindex);
    v->hist = calloc((size_t)p.max_seqs, sizeof *v->hist);
    v->hist_len = calloc((size_t)p.max_seqs, sizeof *v->hist_len);
    v->hist_cap = calloc((size_t)p.max_seqs, sizeof *v->hist_cap);
    v->lp_values = calloc(nb * rows, sizeof *v->lp_values);
    v->lp_top_ids = calloc(nb * rows * SD_MAX_TOP_LOGPROBS, sizeof *v->lp_top_ids);
    v->lp_top_values = calloc(nb * rows * SD_MAX_TOP_LOGPROBS, sizeof *v->lp_top_values);
    sd_status st = SD_ERR_NOMEM;
    if (sst == SD_OK && v->plan && v->results && v->result_ptrs && v->commits && v->vseqs && v->vresults && v->vq &&
        v->vindex && v->hist && v->hist_len && v->hist_cap && v->lp_values && v->lp_top_ids && v->lp_top_values &&
        sd_spec_scratch_create(&v->spec_scratch) == SD_OK)
        st = sd_model_kv_create(target, p.max_seqs, p.kv_blocks, p.block_size, &v->kv);
    else
        SD_ERROR("verifier: out of memory");
    if (st == SD_OK && p.kv_prefault) st = prefault(v->kv);
    if (st == SD_OK && p.tok) st = sd_vcon_create(p.tok, p.max_seqs, &v->con);
    if (st == SD_OK) st = sd_kv_prefix_enable(v->kv, (int32_t)((int64_t)p.kv_blocks * p.prefix_cache_pct / 100));
    sd_model_shard shard;
    sd_model_shard_of(target, &shard);
    if (st == SD_OK && shard.tp_size <= 1 && !sd_kv_params_of(v->kv)->pool_alloc)
        st = sd_kv_prefix_set_partial_copy(v->kv, true); /* a host cache alone: copy, not recompute (kv.h) */
    if (st == SD_OK && p.eagle_dir)
        st = sd_vhead_open(p.eagle_dir, target, v->kv, p.max_seqs, p.max_ctx, p.max_batch, p.max_k, p.eagle_weights,
                           &v->head);
    if (st == SD_OK) {
        int32_t ids[SD_MODEL_CAPTURE_MAX];
        int32_t n_ids = sd_vhead_layers(v->head, ids);
        st = sd_vfeat_create(target, p.max_batch, ids, n_ids, &v->feat);
    }
    if (st != SD_OK) {
        sd_verifier_free(&v);
        return st;
    }
    *out = v;
    return SD_OK;
}

sd_net_limits sd_verifier_limits(const sd_verifier *v) {
    sd_net_limits lim = {v->n_vocab, v->p.max_ctx, v->p.max_batch, v->p.max_k, 0};
    return lim;
}

static sd_status grow_rows(sd_verifier *v, size_t rows) {
    if (rows <= v->cap_rows) return SD_OK;
    int32_t *t = realloc(v->tokens, rows * sizeof *t);
    if (t) v->tokens = t;
    int32_t *ps = realloc(v->pos, rows * sizeof *ps);
    if (ps) v->pos = ps;
    int32_t *sq = realloc(v->seq, rows * sizeof *sq);
    if (sq) v->seq = sq;
    if (!t || !ps || !sq) return SD_ERR_NOMEM;
    v->cap_rows = rows;
    return SD_OK;
}

static int32_t blocks_for(int32_t len, int32_t block_size) { return (len + block_size - 1) / block_size; }

/* Pass 1 for sequence i: sets plan->slot (or -1 with res->code set). */
static void admit(sd_verifier *v, const sd_net_verify_step *step, size_t i, seq_plan *plan, Specd__VerifyResult *res) {
    const Specd__VerifyRequest *req = step->req;
    const Specd__VerifySeq *s = req->seqs[i];
    plan->slot = -1;
    plan->keep_len = (int32_t)s->keep_len;
    plan->n_append = (int32_t)s->n_append;
    plan->k = (int32_t)s->n_draft;
    plan->new_slot = false;
    res->code = SPECD__CODE__CODE_BAD_REQUEST;
    for (size_t j = 0; j < i; j++) {
        if (req->seqs[j]->request_id == s->request_id) {
            SD_WARN("verifier: request %llu appears twice in step %llu", (unsigned long long)s->request_id,
                    (unsigned long long)req->step_id);
            return;
        }
    }
    plan->sampling = step->sampling[i]; /* converted and checked where the step came in */
    int64_t total = (int64_t)s->keep_len + (int64_t)s->n_append + (int64_t)s->n_draft;
    if (s->n_q != s->n_draft || s->n_draft > (size_t)v->p.max_k || total > v->p.max_ctx ||
        (req->prefill_only && s->n_draft > 0) || (!req->prefill_only && s->n_append == 0) ||
        (s->prompt_logprobs && (!req->prefill_only || s->n_append > SD_MAX_PROMPT_LP_ROWS || total >= v->p.max_ctx ||
                                s->prompt_next < 0 || s->prompt_next >= v->n_vocab))) {
        SD_WARN("verifier: request %llu: keep_len %u + append %zu + draft %zu (q %zu, max_k %d) does not fit "
                "the context %d or is not a valid %s step (prompt logprobs: prefill only, at most %d tokens)",
                (unsigned long long)s->request_id, s->keep_len, s->n_append, s->n_draft, s->n_q, (int)v->p.max_k,
                (int)v->p.max_ctx, req->prefill_only ? "prefill" : "verify", SD_MAX_PROMPT_LP_ROWS);
        return;
    }
    int32_t slot;
    res->code = sd_slots_admit(&v->slots, s->request_id, plan->keep_len, true, &slot, &plan->new_slot);
    if (res->code != SPECD__CODE__CODE_OK) return;
    if (sd_kv_truncate(v->kv, slot, plan->keep_len) != SD_OK ||
        hist_put(v, slot, plan->keep_len, s->append, plan->n_append) != SD_OK) {
        res->code = SPECD__CODE__CODE_INTERNAL;
        if (plan->new_slot) sd_slots_release(&v->slots, slot);
        return;
    }
    if (sd_kv_seq_len(v->kv, slot) < plan->keep_len) { /* keep_len is inside a shared block */
        res->code = SPECD__CODE__CODE_CACHE_MISS;
        sd_slots_release(&v->slots, slot);
        return;
    }
    res->code = SPECD__CODE__CODE_OK;
    plan->slot = slot;
    sd_vhead_rollback(v->head, slot, plan->keep_len); /* the head's KV follows the cache */
}

static sd_status finish(sd_verifier *v, const Specd__VerifyRequest *req, Specd__VerifyResponse *resp, double t0) {
    v->steps++;
    specd__verify_response__init(resp);
    resp->step_id = req->step_id;
    resp->n_results = req->n_seqs;
    resp->results = v->result_ptrs;
    double forward_s = sd_now() - t0 - sd_vhead_take_seconds(v->head); /* the head's time is a drafter's */
    resp->forward_us = forward_s > 0 ? (uint32_t)(forward_s * 1e6) : 0;
    return SD_OK;
}

/* The sequence's constraint, brought to its n_ctx committed tokens, into
 * vs; false (the sequence answered BAD_REQUEST, a new slot freed) when it
 * does not compile or its tokens leave its language. */
static bool constrain_seq(sd_verifier *v, const Specd__VerifySeq *s, const seq_plan *pl, int32_t n_ctx,
                          sd_verify_seq *vs, Specd__VerifyResult *res) {
    char err[256];
    sd_status st = sd_vcon_sync(v->con, pl->slot, s->constraint, v->hist[pl->slot], (int32_t)s->prompt_len, n_ctx,
                                &vs->constraint, err, sizeof err);
    if (st == SD_OK) return true;
    SD_WARN("verifier: request %llu: constraint refused: %s", (unsigned long long)s->request_id,
            err[0] ? err : sd_status_str(st));
    res->code = SPECD__CODE__CODE_BAD_REQUEST;
    if (pl->new_slot) sd_slots_release(&v->slots, pl->slot);
    return false;
}

/* The head after a verify step of sequence i (its vseq vs, result vr):
 * the features of the rows now committed (the appended ones and the
 * accepted drafts), then, when asked, the next step's drafts on the
 * committed tokens, the sampled one last. */
static void head_step(sd_verifier *v, size_t i, const sd_verify_seq *vs, const sd_verify_result *vr,
                      const Specd__VerifySeq *s, Specd__VerifyResult *res) {
    const int32_t slot = vs->slot, n_rows = vs->n_append + vr->n_accepted;
    sd_vfeat_put(v->feat, i, s, vs->keep_len, n_rows, vr->batch_row0, res); /* a head drafter's, when it asked */
    if (!v->head) return;
    const uint32_t next_k = s->next_k;
    sd_vhead_feed(v->head, slot, v->hist[slot], vs->keep_len, n_rows, vr->batch_row0);
    const int32_t next = vr->tokens[vr->n_tokens - 1];
    if (next_k > 0 && vs->constraint) { /* forced drafts first, then the head's, masked (verify_head.h) */
        int32_t forced[SD_MAX_K], base = sd_constraint_len(vs->constraint);
        int32_t nf = sd_vcon_head_begin(v->con, vs->constraint, v->hist[slot], vs->keep_len + vs->n_append,
                                        v->hist_len[slot], next, (int32_t)next_k, forced);
        const sd_vhead_con hc = {vs->constraint, forced, nf};
        if (nf >= 0)
            sd_vhead_draft(v->head, i, slot, v->hist[slot], v->hist_len[slot], next, (int32_t)next_k, &vs->sampling,
                           &hc, res);
        sd_constraint_rollback(vs->constraint, base);
    } else if (next_k > 0) {
        sd_vhead_draft(v->head, i, slot, v->hist[slot], v->hist_len[slot], next, (int32_t)next_k, &vs->sampling, NULL,
                       res);
    }
    if (vs->constraint) /* drafts the constraint refuses would be rejected: not sent */
        res->n_next_draft = res->n_next_q =
            sd_vcon_cut_drafts(vs->constraint, v->hist[slot], vs->keep_len + vs->n_append, v->hist_len[slot], next,
                               res->next_draft, res->n_next_draft);
}

/* Passes 2-4 of a normal step through spec2's sd_spec_verify_batch: one
 * ragged forward, verification, rollback, per-sequence outcomes. */
static sd_status verify_with_spec_batch(sd_verifier *v, const Specd__VerifyRequest *req) {
    const size_t stride = (size_t)v->p.max_k + 1;
    int32_t n_v = 0;
    for (size_t i = 0; i < req->n_seqs; i++) {
        const seq_plan *pl = &v->plan[i];
        if (pl->slot < 0) continue;
        const Specd__VerifySeq *s = req->seqs[i];
        sd_spec_q *q = v->vq + i * (size_t)v->p.max_k;
        for (int32_t r = 0; r < pl->k; r++) q[r] = (sd_spec_q){(int32_t)s->q[r]->n_ids, s->q[r]->ids, s->q[r]->probs};
        /* a cached prefix of the append (all but its last token, whose
         * logits score the first draft) is adopted, not computed */
        int32_t adopted = 0;
        if (sd_kv_prefix_enabled(v->kv) && !sd_vfeat_wanted(v->feat, s)) /* wanted features: computed rows */
            SD_TRY(sd_kv_prefix_adopt(v->kv, pl->slot, v->hist[pl->slot], pl->keep_len + pl->n_append - 1, &adopted));
        v->vseqs[n_v] = (sd_verify_seq){
            .slot = pl->slot,
            .keep_len = pl->keep_len + adopted,
            .n_append = pl->n_append - adopted,
            .append = s->append + adopted,
            .k = pl->k,
            .draft = s->draft,
            .q = q,
            .sampling = pl->sampling,
            .logprobs = s->logprobs,
            .top_logprobs = (int32_t)s->top_logprobs,
        };
        int32_t n_ctx = pl->keep_len + pl->n_append;
        if (sd_sampling_has_penalties(&pl->sampling) && (int64_t)s->prompt_len < n_ctx) {
            v->vseqs[n_v].generated = v->hist[pl->slot] + s->prompt_len;
            v->vseqs[n_v].n_generated = n_ctx - (int32_t)s->prompt_len;
        }
        if (s->constraint && !constrain_seq(v, s, pl, n_ctx, &v->vseqs[n_v], &v->results[i])) continue;
        v->vindex[n_v++] = (int32_t)i;
    }
    if (n_v > 0) SD_TRY(sd_spec_verify_batch(v->target, v->kv, n_v, v->vseqs, v->vresults, v->spec_scratch));
    for (int32_t j = 0; j < n_v; j++) {
        size_t i = (size_t)v->vindex[j];
        const seq_plan *pl = &v->plan[i];
        const sd_verify_result *vr = &v->vresults[j];
        Specd__VerifyResult *res = &v->results[i];
        switch (vr->outcome) {
        case SD_SEQ_OK: {
            int32_t *commit = v->commits + i * stride;
            memcpy(commit, vr->tokens, (size_t)vr->n_tokens * sizeof *commit);
            res->code = SPECD__CODE__CODE_OK;
            res->n_accepted = (uint32_t)vr->n_accepted;
            res->n_commit = (size_t)vr->n_tokens;
            res->commit = commit;
            res->cached_len = (uint32_t)vr->cache_len;
            /* the accepted drafts stay cached: the history follows */
            if (hist_put(v, pl->slot, pl->keep_len + pl->n_append, req->seqs[i]->draft, vr->n_accepted) != SD_OK ||
                sd_kv_prefix_commit(v->kv, pl->slot, v->hist[pl->slot], v->hist_len[pl->slot]) != SD_OK) {
                res->code = SPECD__CODE__CODE_INTERNAL;
                sd_slots_release(&v->slots, pl->slot);
                break;
            }
            head_step(v, i, &v->vseqs[j], vr, req->seqs[i], res);
            if (req->seqs[i]->logprobs) {
                float *values = v->lp_values + i * stride;
                int32_t *top_ids = v->lp_top_ids + i * stride * SD_MAX_TOP_LOGPROBS;
                float *top_values = v->lp_top_values + i * stride * SD_MAX_TOP_LOGPROBS;
                size_t n_top = 0;
                for (int32_t t = 0; t < vr->n_tokens; t++) {
                    const sd_token_logprob *lp = &vr->logprobs[t];
                    values[t] = lp->logprob;
                    memcpy(top_ids + n_top, lp->top_ids, (size_t)lp->n_top * sizeof *top_ids);
                    memcpy(top_values + n_top, lp->top_logprobs, (size_t)lp->n_top * sizeof *top_values);
                    n_top += (size_t)lp->n_top;
                }
                res->n_logprobs = (size_t)vr->n_tokens;
                res->logprobs = values;
                res->n_top_ids = res->n_top_logprobs = n_top;
                res->top_ids = top_ids;
                res->top_logprobs = top_values;
            }
            break;
        }
        case SD_SEQ_OUT_OF_BLOCKS:
            res->code = SPECD__CODE__CODE_KV_FULL;
            if (pl->new_slot) {
                sd_slots_release(&v->slots, pl->slot);
            } else {
                res->cached_len = (uint32_t)sd_kv_seq_len(v->kv, pl->slot);
                v->hist_len[pl->slot] = (int32_t)res->cached_len;
            }
            break;
        case SD_SEQ_CACHE_MISS:
            res->code = SPECD__CODE__CODE_CACHE_MISS;
            sd_slots_release(&v->slots, pl->slot);
            break;
        default:
            SD_WARN("verifier: request %llu: %s", (unsigned long long)res->request_id, sd_seq_outcome_str(vr->outcome));
            res->code = SPECD__CODE__CODE_BAD_REQUEST;
            if (pl->new_slot) sd_slots_release(&v->slots, pl->slot);
            break;
        }
    }
    return SD_OK;
}

/* Prefill chunks that continue a cached chain adopt the cached blocks of
 * their tokens (the whole chunk may be cached: a prefill samples nothing). */
static sd_status adopt_prefixes(sd_verifier *v, const Specd__VerifyRequest *req) {
    if (!sd_kv_prefix_enabled(v->kv)) return SD_OK;
    for (size_t i = 0; i < req->n_seqs; i++) {
        const seq_plan *pl = &v->plan[i];
        if (pl->slot < 0 || req->seqs[i]->prompt_logprobs || sd_vfeat_wanted(v->feat, req->seqs[i])) continue;
        SD_TRY(sd_kv_prefix_adopt(v->kv, pl->slot, v->hist[pl->slot], pl->keep_len + pl->n_append, NULL));
    }
    return SD_OK;
}

/* The prompt-logprob buffers, on first use. */
static sd_status prompt_lp_alloc(sd_verifier *v) {
    if (v->pl_logits) return SD_OK;
    size_t rows = (size_t)v->p.max_batch * SD_MAX_PROMPT_LP_ROWS;
    v->pl_values = malloc(rows * sizeof *v->pl_values);
    v->pl_top_ids = malloc(rows * SD_MAX_TOP_LOGPROBS * sizeof *v->pl_top_ids);
    v->pl_top_values = malloc(rows * SD_MAX_TOP_LOGPROBS * sizeof *v->pl_top_values);
    v->pl_wanted = malloc(SD_MAX_PROMPT_LP_ROWS * sizeof *v->pl_wanted);
    float *logits = malloc((size_t)SD_MAX_PROMPT_LP_ROWS * (size_t)v->n_vocab * sizeof *logits);
    if (!v->pl_values || !v->pl_top_ids || !v->pl_top_values || !v->pl_wanted || !logits) {
        free(logits);
        return SD_ERR_NOMEM;
    }
    for (int32_t j = 0; j < SD_MAX_PROMPT_LP_ROWS; j++) v->pl_wanted[j] = true;
    v->pl_logits = logits;
    return SD_OK;
}

/* Prefill chunk i (admitted, its blocks counted) with the target's logits
 * at every appended row: row j scores the prompt token after it (append[j
 * + 1], the last row prompt_next) into results[i].logprobs / top_ids /
 * top_logprobs. The raw model's log-softmax: no penalties (they count
 * generated tokens, and a prompt has none), no temperature. One forward of
 * at most SD_MAX_PROMPT_LP_ROWS rows: the LM head runs over every row only
 * here, for the sequences that asked. */
static sd_status prefill_prompt_logprobs(sd_verifier *v, const Specd__VerifyRequest *req, size_t i) {
    const Specd__VerifySeq *s = req->seqs[i];
    const seq_plan *pl = &v->plan[i];
    const int32_t n = pl->n_append, top = (int32_t)s->top_logprobs;
    SD_TRY(prompt_lp_alloc(v));
    for (int32_t j = 0; j < n; j++) {
        v->pos[j] = pl->keep_len + j;
        v->seq[j] = pl->slot;
    }
    sd_batch b = {n, s->append, v->pos, v->seq, v->pl_wanted};
    SD_TRY(sd_model_forward(v->target, v->kv, &b, v->pl_logits));
    sd_vhead_feed(v->head, pl->slot, v->hist[pl->slot], pl->keep_len, n, 0);
    sd_vfeat_put(v->feat, i, s, pl->keep_len, n, 0, &v->results[i]);
    size_t base = i * SD_MAX_PROMPT_LP_ROWS;
    float *values = v->pl_values + base;
    int32_t *top_ids = v->pl_top_ids + base * SD_MAX_TOP_LOGPROBS;
    float *top_values = v->pl_top_values + base * SD_MAX_TOP_LOGPROBS;
    for (int32_t j = 0; j < n; j++) {
        int32_t next = j + 1 < n ? s->append[j + 1] : s->prompt_next;
        sd_token_logprob lp;
        SD_TRY(sd_sample_logprobs(v->pl_logits + (size_t)j * (size_t)v->n_vocab, v->n_vocab, next, top, &lp));
        values[j] = lp.logprob;
        memcpy(top_ids + (size_t)j * top, lp.top_ids, (size_t)top * sizeof *top_ids);
        memcpy(top_values + (size_t)j * top, lp.top_logprobs, (size_t)top * sizeof *top_values);
    }
    Specd__VerifyResult *res = &v->results[i];
    res->n_logprobs = (size_t)n;
    res->logprobs = values;
    res->n_top_ids = res->n_top_logprobs = (size_t)n * (size_t)top;
    res->top_ids = top_ids;
    res->top_logprobs = top_values;
    return SD_OK;
}

sd_status sd_verifier_handle(sd_verifier *v, const sd_net_verify_step *step, Specd__VerifyResponse *resp) {
    if (!v || !step || !step->req || !resp) return SD_ERR_INVALID_ARG;
    const Specd__VerifyRequest *req = step->req;
    if (req->n_seqs > (size_t)v->p.max_batch) {
        SD_ERROR("verifier: step %llu has %zu sequences, more than max_batch %d", (unsigned long long)req->step_id,
                 req->n_seqs, (int)v->p.max_batch);
        return SD_ERR_RANGE;
    }
    double t0 = sd_now();
    size_t n = req->n_seqs;
    int32_t bs = v->p.block_size;

    sd_vfeat_begin(v->feat, req); /* a head drafter's layers, captured when asked */
    /* 1. Admission. */
    for (size_t i = 0; i < n; i++) {
        Specd__VerifyResult *res = &v->results[i];
        specd__verify_result__init(res);
        res->request_id = req->seqs[i]->request_id;
        v->result_ptrs[i] = res;
        admit(v, step, i, &v->plan[i], res);
    }
    if (!req->prefill_only) {
        SD_TRY(verify_with_spec_batch(v, req));
        return finish(v, req, resp, t0);
    }
    /* Prefill chunks: sd_spec_verify_batch always samples, so they take this
     * path: block budget in batch order, one forward without logits. */
    SD_TRY(adopt_prefixes(v, req));
    int32_t free_blocks = sd_kv_n_free_blocks(v->kv);
    size_t n_rows = 0;
    for (size_t i = 0; i < n; i++) {
        seq_plan *pl = &v->plan[i];
        if (pl->slot < 0) continue;
        int32_t held = sd_kv_seq_len(v->kv, pl->slot); /* keep_len, more when a prefix was adopted */
        int32_t need = blocks_for(pl->keep_len + pl->n_append, bs) - blocks_for(held, bs);
        if (need > free_blocks) {
            v->results[i].code = SPECD__CODE__CODE_KV_FULL;
            v->results[i].cached_len = pl->new_slot ? 0 : (uint32_t)pl->keep_len;
            v->hist_len[pl->slot] = pl->keep_len;
            if (pl->new_slot)
                sd_slots_release(&v->slots, pl->slot);
            else
                sd_kv_truncate(v->kv, pl->slot, pl->keep_len); /* a block boundary: exact */
            pl->slot = -1;
            continue;
        }
        free_blocks -= need;
        n_rows += (size_t)(pl->keep_len + pl->n_append - held);
    }
    sd_status st = grow_rows(v, n_rows > SD_MAX_PROMPT_LP_ROWS ? n_rows : SD_MAX_PROMPT_LP_ROWS);
    if (st != SD_OK) {
        SD_ERROR("verifier: out of memory for a batch of %zu rows", n_rows);
        return st;
    }
    size_t r = 0;
    for (size_t i = 0; i < n; i++) {
        seq_plan *pl = &v->plan[i];
        pl->row0 = -1;
        if (pl->slot < 0 || req->seqs[i]->prompt_logprobs) continue;
        pl->row0 = (int32_t)r;
        pl->row_from = sd_kv_seq_len(v->kv, pl->slot);
        for (int32_t j = sd_kv_seq_len(v->kv, pl->slot) - pl->keep_len; j < pl->n_append; j++, r++) {
            v->tokens[r] = req->seqs[i]->append[j];
            v->pos[r] = pl->keep_len + j;
            v->seq[r] = pl->slot;
        }
    }
    n_rows = r; /* the sequences that want prompt logprobs run below, one forward each */
    if (n_rows > 0) {
        sd_batch b = {(int32_t)n_rows, v->tokens, v->pos, v->seq, NULL};
        float unused = 0;
        st = sd_model_forward(v->target, v->kv, &b, &unused);
        if (st != SD_OK) {
            SD_ERROR("verifier: prefill step %llu failed: %s", (unsigned long long)req->step_id, sd_status_str(st));
            return st;
        }
        for (size_t i = 0; i < n; i++) { /* the heads' features of the rows computed */
            const seq_plan *pl = &v->plan[i];
            if (pl->row0 < 0) continue;
            int32_t rows = pl->keep_len + pl->n_append - pl->row_from;
            sd_vhead_feed(v->head, pl->slot, v->hist[pl->slot], pl->row_from, rows, pl->row0);
            sd_vfeat_put(v->feat, i, req->seqs[i], pl->row_from, rows, pl->row0, &v->results[i]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (v->plan[i].slot < 0 || !req->seqs[i]->prompt_logprobs) continue;
        st = prefill_prompt_logprobs(v, req, i);
        if (st != SD_OK) {
            SD_ERROR("verifier: prefill step %llu (prompt logprobs of request %llu) failed: %s",
                     (unsigned long long)req->step_id, (unsigned long long)req->seqs[i]->request_id, sd_status_str(st));
            return st;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const seq_plan *pl = &v->plan[i];
        if (pl->slot < 0) continue;
        v->results[i].cached_len = (uint32_t)(pl->keep_len + pl->n_append);
        SD_TRY(sd_kv_prefix_commit(v->kv, pl->slot, v->hist[pl->slot], v->hist_len[pl->slot]));
    }
    return finish(v, req, resp, t0);
}

/* One warm-up step (sd_warmup_step_fn) of n_tokens tokens over slots 0..:
 * each sequence one appended token and up to max_k drafts. */
static sd_status warmup_step(void *user, int32_t n_tokens, const sd_sampling *sampling, const int32_t *toks,
                             bool *fits) {
    static const float one = 1.0f;
    sd_verifier *v = user;
    int32_t per = v->p.max_k + 1;
    if (per > v->p.max_ctx) per = v->p.max_ctx;
    const int32_t n_seqs = (n_tokens + per - 1) / per;
    *fits = n_seqs <= v->p.max_batch && n_seqs <= v->p.max_seqs;
    if (!*fits) return SD_OK;
    int32_t off = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const int32_t len = n_tokens - off < per ? n_tokens - off : per;
        sd_spec_q *q = v->vq + (size_t)s * (size_t)v->p.max_k;
        for (int32_t r = 0; r < len - 1; r++) q[r] = (sd_spec_q){1, toks + off + 1 + r, &one};
        v->vseqs[s] = (sd_verify_seq){.slot = s,
                                      .keep_len = 0,
                                      .n_append = 1,
                                      .append = toks + off,
                                      .k = len - 1,
                                      .draft = toks + off + 1,
                                      .q = q,
                                      .sampling = *sampling};
        off += len;
    }
    sd_status st = sd_spec_verify_batch(v->target, v->kv, n_seqs, v->vseqs, v->vresults, v->spec_scratch);
    for (int32_t s = 0; s < n_seqs; s++) sd_kv_release(v->kv, s);
    SD_TRY(st);
    for (int32_t s = 0; s < n_seqs; s++)
        SD_TRY(sd_warmup_outcome("verifier", n_tokens, s, v->vresults[s].outcome, fits));
    return SD_OK;
}

sd_status sd_verifier_warmup(sd_verifier *v, sd_warmup_mode mode, int32_t max_tokens, sd_warmup_report *rep) {
    if (rep) memset(rep, 0, sizeof *rep);
    if (!v || max_tokens < 0) return SD_ERR_INVALID_ARG;
    if (sd_slots_used(&v->slots) > 0) {
        SD_ERROR("verifier: warm-up is for a verifier that has not served yet (%d slots are in use)",
                 (int)sd_slots_used(&v->slots));
        return SD_ERR_INVALID_ARG;
    }
    return sd_warmup_run("verifier", mode, max_tokens, v->n_vocab, warmup_step, v, rep);
}

void sd_verifier_release(sd_verifier *v, const uint64_t *request_ids, size_t n) {
    if (v) sd_slots_release_ids(&v->slots, request_ids, n);
}

void sd_verifier_reset(sd_verifier *v) {
    if (v) sd_slots_reset(&v->slots);
}

void sd_verifier_stats(const sd_verifier *v, Specd__WorkerStats *stats) {
    if (!v || !stats) return;
    uint32_t n_seqs = (uint32_t)sd_slots_used(&v->slots);
    stats->kv_blocks_total = (uint32_t)v->p.kv_blocks;
    stats->kv_blocks_free = (uint32_t)sd_kv_n_free_blocks(v->kv);
    stats->n_sequences = n_seqs;
    stats->steps = v->steps;
    sd_kv_prefix_stats ps;
    sd_kv_prefix_stats_get(v->kv, &ps);
    stats->prefix_query_tokens = ps.query_tokens;
    stats->prefix_hit_tokens = ps.hit_tokens;
    stats->prefix_blocks_cached = (uint32_t)ps.blocks_cached;
    stats->prefix_blocks_evicted = ps.blocks_evicted;
}
