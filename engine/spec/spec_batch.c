/* spec_batch.c — the batched verification step (spec_batch.h).
 *
 * Four passes over the request, so that a bad sequence never costs the
 * others their step:
 *   1. validate each sequence on its own (slot, lengths, ids, K, q present
 *      when sampling; the sampling parameters themselves were checked once,
 *      by the caller) and check that its cache holds keep_len
 *      tokens; failures become per-sequence outcomes;
 *   2. truncate each admitted sequence to keep_len and admit, in request
 *      order, those whose new tokens fit in the free KV blocks (the forward
 *      grows all or nothing, so a sequence that does not fit is answered
 *      OUT_OF_BLOCKS instead of failing the batch);
 *   3. one ragged forward: per sequence its append rows then its draft rows,
 *      logits for the last append row and every draft row;
 *   4. per sequence: greedy (argmax rows) or stochastic (sd_sample_probs on
 *      each row, sd_spec_verify) verification, then truncate the cache to
 *      n_ctx + n_accepted: the accepted drafts stay cached, the one emitted
 *      token is fed as the next step's append.
 * Verification of one sequence only ever reads its own rows, so the work of
 * pass 4 is the same whatever else is batched. p is processed one sequence
 * at a time into a [K+1][n_vocab] buffer: the logits of the whole batch are
 * needed anyway, a second batch-sized copy is not. */
#include "specd/constrain.h"
#include "specd/spec_batch.h"

#include <stdlib.h>
#include <string.h>

struct sd_spec_scratch {
    size_t cap_rows;
    int32_t *tokens; /* [cap_rows] batch rows */
    int32_t *pos;    /* [cap_rows] */
    int32_t *seq;    /* [cap_rows] */
    bool *want;      /* [cap_rows] */
    size_t cap_logits;
    float *logits; /* [cap_logits] wanted rows x n_vocab */
    size_t cap_vocab;
    float *p;         /* [(SD_MAX_K + 2) * cap_vocab] one sequence's processed rows, then the rejection residual */
    double *dscratch; /* [cap_vocab] */
    int32_t *counts;  /* [cap_vocab] zeros: sd_sample_penalize's scratch */
    int32_t *hist;    /* [cap_hist] one sequence's generated tokens + drafts (penalties) */
    size_t cap_hist;
    size_t cap_seqs;
    int32_t *row0;      /* [cap_seqs] first logits row of each sequence, -1 = not run */
    sd_spec_rows *rows; /* [cap_seqs] device verification of the sequences run */
    size_t cap_slots;
    uint8_t *slot_used; /* [cap_slots] duplicate-slot check */
};

sd_status sd_spec_scratch_create(sd_spec_scratch **out) {
    if (!out) return SD_ERR_INVALID_ARG;
    *out = calloc(1, sizeof **out);
    return *out ? SD_OK : SD_ERR_NOMEM;
}

void sd_spec_scratch_free(sd_spec_scratch **ps) {
    if (!ps || !*ps) return;
    sd_spec_scratch *s = *ps;
    free(s->tokens);
    free(s->pos);
    free(s->seq);
    free(s->want);
    free(s->logits);
    free(s->p);
    free(s->dscratch);
    free(s->counts);
    free(s->hist);
    free(s->row0);
    free(s->rows);
    free(s->slot_used);
    free(s);
    *ps = NULL;
}

/* Grows *buf to hold n elements of size elem (contents not kept). */
static sd_status grow(void **buf, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap) return SD_OK;
    size_t bytes;
    if (!sd_mul_ok(n, elem, &bytes)) return SD_ERR_NOMEM;
    void *p = realloc(*buf, bytes);
    if (!p) {
        SD_ERROR("spec: out of memory growing a batch buffer to %zu bytes", bytes);
        return SD_ERR_NOMEM;
    }
    *buf = p;
    *cap = n;
    return SD_OK;
}

static sd_status reserve(sd_spec_scratch *s, size_t rows, size_t logits, size_t n_vocab, size_t n_seqs,
                         size_t n_slots) {
    size_t cap = s->cap_rows;
    SD_TRY(grow((void **)&s->tokens, &cap, rows, sizeof *s->tokens));
    cap = s->cap_rows;
    SD_TRY(grow((void **)&s->pos, &cap, rows, sizeof *s->pos));
    cap = s->cap_rows;
    SD_TRY(grow((void **)&s->seq, &cap, rows, sizeof *s->seq));
    SD_TRY(grow((void **)&s->want, &s->cap_rows, rows, sizeof *s->want));
    SD_TRY(grow((void **)&s->logits, &s->cap_logits, logits, sizeof *s->logits));
    if (n_vocab > s->cap_vocab) {
        cap = 0;
        free(s->p);
        s->p = NULL;
        SD_TRY(grow((void **)&s->p, &cap, (SD_MAX_K + 2) * n_vocab, sizeof *s->p)); /* + the rejection residual */
        cap = 0;
        free(s->dscratch);
        s->dscratch = NULL;
        SD_TRY(grow((void **)&s->dscratch, &cap, n_vocab, sizeof *s->dscratch));
        free(s->counts);
        s->counts = calloc(n_vocab, sizeof *s->counts);
        if (!s->counts) return SD_ERR_NOMEM;
        s->cap_vocab = n_vocab;
    }
    cap = s->cap_seqs;
    SD_TRY(grow((void **)&s->rows, &cap, n_seqs, sizeof *s->rows));
    SD_TRY(grow((void **)&s->row0, &s->cap_seqs, n_seqs, sizeof *s->row0));
    SD_TRY(grow((void **)&s->slot_used, &s->cap_slots, n_slots, sizeof *s->slot_used));
    return SD_OK;
}

static bool ids_ok(const int32_t *ids, int32_t n, int32_t n_vocab) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) return false;
    return true;
}

/* Pass 1 for one sequence: SD_SEQ_OK or why not (logged). */
static sd_seq_outcome check_seq(const sd_verify_seq *v, int32_t i, const sd_kv *kv, int32_t n_vocab,
                                uint8_t *slot_used) {
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (v->slot < 0 || v->slot >= kp->max_seqs) {
        SD_WARN("spec: sequence %d: slot %d outside [0, %d)", (int)i, (int)v->slot, (int)kp->max_seqs);
        return SD_SEQ_INVALID;
    }
    if (slot_used[v->slot]) {
        SD_WARN("spec: sequence %d: slot %d appears twice in one batch", (int)i, (int)v->slot);
        return SD_SEQ_INVALID;
    }
    slot_used[v->slot] = 1;
    if (v->keep_len < 0 || v->n_append < 1 || !v->append || v->k < 0 || v->k > SD_MAX_K || (v->k > 0 && !v->draft)) {
        SD_WARN("spec: sequence %d: needs keep_len >= 0 (%d), n_append >= 1 (%d) with tokens, 0 <= k <= %d (%d) "
                "with draft tokens",
                (int)i, (int)v->keep_len, (int)v->n_append, SD_MAX_K, (int)v->k);
        return SD_SEQ_INVALID;
    }
    int64_t end = (int64_t)v->keep_len + v->n_append + v->k;
    if (end > (int64_t)kp->n_blocks * kp->block_size) {
        SD_WARN("spec: sequence %d: %lld tokens exceed the KV cache (%d blocks of %d)", (int)i, (long long)end,
                (int)kp->n_blocks, (int)kp->block_size);
        return SD_SEQ_INVALID;
    }
    if (!ids_ok(v->append, v->n_append, n_vocab) || (v->k > 0 && !ids_ok(v->draft, v->k, n_vocab))) {
        SD_WARN("spec: sequence %d: a token id is outside [0, %d)", (int)i, (int)n_vocab);
        return SD_SEQ_INVALID;
    }
    if (v->top_logprobs < 0 || v->top_logprobs > SD_MAX_TOP_LOGPROBS ||
        (sd_sampling_has_penalties(&v->sampling) &&
         (v->n_generated < 0 || (v->n_generated > 0 && !v->generated) || v->n_generated > v->keep_len + v->n_append ||
          !ids_ok(v->generated, v->n_generated, n_vocab)))) {
        SD_WARN("spec: sequence %d: top_logprobs %d outside [0, %d] or bad generated tokens (%d)", (int)i,
                (int)v->top_logprobs, SD_MAX_TOP_LOGPROBS, (int)v->n_generated);
        return SD_SEQ_INVALID;
    }
    if (v->k > 0 && !sd_sampling_is_greedy(&v->sampling) && !v->q) {
        SD_WARN("spec: sequence %d: stochastic verification of %d drafts needs their q", (int)i, (int)v->k);
        return SD_SEQ_INVALID;
    }
    if (sd_kv_seq_len(kv, v->slot) < v->keep_len) {
        SD_INFO("spec: sequence %d: slot %d holds %d tokens, the request assumes %d: cache miss", (int)i, (int)v->slot,
                (int)sd_kv_seq_len(kv, v->slot), (int)v->keep_len);
        return SD_SEQ_CACHE_MISS;
    }
    return SD_SEQ_OK;
}

static int32_t blocks_for(int32_t len, int32_t block_size) { return (len + block_size - 1) / block_size; }

/* Penalizes the k + 1 rows of one sequence in place: row i over the
 * generated tokens and draft[0..i) (accepted if row i is reached). */
static sd_status penalize_rows(const sd_verify_seq *v, float *logits, int32_t n_vocab, sd_spec_scratch *s) {
    size_t need = (size_t)v->n_generated + (size_t)v->k;
    size_t cap = s->cap_hist;
    if (need > cap) {
        free(s->hist);
        s->hist = NULL;
        cap = 0;
        SD_TRY(grow((void **)&s->hist, &cap, need, sizeof *s->hist));
        s->cap_hist = cap;
    }
    if (v->n_generated > 0) memcpy(s->hist, v->generated, (size_t)v->n_generated * sizeof *s->hist);
    if (v->k > 0) memcpy(s->hist + v->n_generated, v->draft, (size_t)v->k * sizeof *s->hist);
    for (int32_t i = 0; i <= v->k; i++)
        SD_TRY(sd_sample_penalize(logits + (size_t)i * (size_t)n_vocab, n_vocab, &v->sampling, s->hist,
                                  v->n_generated + i, s->counts));
    return SD_OK;
}

/* Masks the k + 1 rows of one sequence under its constraint: row i under
 * the state after draft[0..i). A draft the constraint refuses is rejected
 * at its row whatever follows (the masked row cannot pick it), and after
 * a drafted end token nothing is generated: the rows past either stay as
 * they are, unused. The constraint is rolled back to where it was. */
static sd_status mask_rows(const sd_verify_seq *v, float *logits, int32_t n_vocab) {
    sd_constraint *c = v->constraint;
    int32_t base = sd_constraint_len(c);
    sd_status st = SD_OK;
    for (int32_t i = 0; i <= v->k && st == SD_OK; i++) {
        st = sd_constraint_apply(c, logits + (size_t)i * (size_t)n_vocab, n_vocab);
        if (st != SD_OK || i == v->k || sd_constraint_advance(c, v->draft[i]) != SD_OK || sd_constraint_ended(c)) break;
    }
    sd_status rb = sd_constraint_rollback(c, base);
    return st != SD_OK ? st : rb;
}

/* Pass 4 for one sequence whose logits rows start at row0 (penalized and
 * masked here in place). */
static sd_status verify_one(const sd_verify_seq *v, float *logits, int32_t n_vocab, sd_spec_scratch *s,
                            sd_verify_result *r) {
    size_t V = (size_t)n_vocab;
    int32_t acc = 0;
    if (sd_sampling_has_penalties(&v->sampling)) SD_TRY(penalize_rows(v, logits, n_vocab, s));
    if (v->constraint) SD_TRY(mask_rows(v, logits, n_vocab));
    if (sd_sampling_is_greedy(&v->sampling)) {
        int32_t target_argmax[SD_MAX_K + 1];
        for (int32_t i = 0; i <= v->k; i++) target_argmax[i] = sd_argmax(logits + (size_t)i * V, n_vocab);
        SD_TRY(sd_spec_verify_greedy(target_argmax, v->draft, v->k, r->tokens, &acc));
    } else {
        for (int32_t i = 0; i <= v->k; i++)
            SD_TRY(sd_sample_probs_given(logits + (size_t)i * V, n_vocab, &v->sampling, s->p + (size_t)i * V));
        if (v->sampling.rule == SD_RULE_REJECTION)
            SD_TRY(sd_spec_verify_rejection(s->p, n_vocab, v->draft, v->q, v->k, v->sampling.seed, (uint64_t)r->n_ctx,
                                            s->p + (size_t)(SD_MAX_K + 1) * V, r->tokens, &acc, &r->info));
        else
            SD_TRY(sd_spec_verify(s->p, n_vocab, v->draft, v->q, v->k, v->sampling.seed, (uint64_t)r->n_ctx, r->tokens,
                                  &acc, &r->info));
    }
    r->n_accepted = acc;
    r->n_tokens = acc + 1;
    for (int32_t i = 0; v->logprobs && i < r->n_tokens; i++)
        SD_TRY(sd_sample_logprobs(logits + (size_t)i * V, n_vocab, r->tokens[i], v->top_logprobs, &r->logprobs[i]));
    return SD_OK;
}

/* True when some sequence needs what only the host path does. */
static bool needs_host(int32_t n_seqs, const sd_verify_seq *seqs, const sd_verify_result *results) {
    for (int32_t i = 0; i < n_seqs; i++)
        if (results[i].outcome == SD_SEQ_OK &&
            (sd_sampling_has_penalties(&seqs[i].sampling) || seqs[i].logprobs || seqs[i].constraint ||
             (seqs[i].sampling.rule == SD_RULE_REJECTION && !sd_sampling_is_greedy(&seqs[i].sampling))))
            return true;
    return false;
}

/* Step 2 of sd_spec_verify_batch: each valid sequence's cache truncated to
 * its keep_len (CACHE_MISS where that reached a shared block or a freed
 * window), then the sequences admitted in order while the free blocks last
 * (OUT_OF_BLOCKS for the rest, not run this step). */
static sd_status admit(sd_kv *kv, int32_t n_seqs, const sd_verify_seq *seqs, sd_verify_result *results) {
    const sd_kv_params *kp = sd_kv_params_of(kv);
    for (int32_t i = 0; i < n_seqs; i++) {
        if (results[i].outcome != SD_SEQ_OK) continue;
        SD_TRY(sd_kv_truncate(kv, seqs[i].slot, seqs[i].keep_len));
        if (sd_kv_seq_len(kv, seqs[i].slot) < seqs[i].keep_len) { /* a shared block, or a window freed (kv.h) */
            results[i].outcome = SD_SEQ_CACHE_MISS;
            results[i].cache_len = sd_kv_seq_len(kv, seqs[i].slot);
        }
    }
    int32_t free_blocks = sd_kv_n_free_blocks(kv);
    for (int32_t i = 0; i < n_seqs; i++) {
        if (results[i].outcome != SD_SEQ_OK) continue;
        const sd_verify_seq *v = &seqs[i];
        int32_t need =
            blocks_for(v->keep_len + v->n_append + v->k, kp->block_size) - blocks_for(v->keep_len, kp->block_size);
        if (need > free_blocks) {
            SD_WARN("spec: sequence %d (slot %d) needs %d KV blocks, %d free: not run this step", (int)i, (int)v->slot,
                    (int)need, (int)free_blocks);
            results[i].outcome = SD_SEQ_OUT_OF_BLOCKS;
            results[i].cache_len = v->keep_len;
            continue;
        }
        free_blocks -= need;
    }
    return SD_OK;
}

/* Step 4 of sd_spec_verify_batch: each run sequence's drafts verified
 * (on the device's answers, or on the host from its logits rows), its result
 * filled in and its cache rolled back to what was committed. */
static sd_status finish(sd_kv *kv, int32_t n_seqs, const sd_verify_seq *seqs, sd_verify_result *results,
                        sd_spec_scratch *scratch, bool on_device, int32_t n_vocab) {
    int32_t run_i = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        sd_verify_result *r = &results[i];
        if (r->outcome != SD_SEQ_OK) continue;
        const sd_verify_seq *v = &seqs[i];
        sd_status st;
        if (on_device) {
            const sd_spec_rows *sr = &scratch->rows[run_i++];
            st = sr->status;
            if (st == SD_OK) {
                r->n_accepted = sr->n_accepted;
                r->n_tokens = sr->n_accepted + 1;
                memcpy(r->tokens, sr->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
                r->info = sr->info;
            }
        } else {
            float *logits = scratch->logits + (size_t)scratch->row0[i] * (size_t)n_vocab;
            st = verify_one(v, logits, n_vocab, scratch, r);
        }
        if (st != SD_OK) {
            /* malformed q (logged by sd_spec_verify): the append is committed, the drafts are not */
            SD_WARN("spec: sequence %d (slot %d): verification refused: %s", (int)i, (int)v->slot, sd_status_str(st));
            r->outcome = SD_SEQ_INVALID;
            r->n_accepted = r->n_tokens = 0;
        }
        r->cache_len = r->n_ctx + r->n_accepted;
        SD_TRY(sd_kv_truncate(kv, v->slot, r->cache_len));
    }
    return SD_OK;
}

sd_status sd_spec_verify_batch(sd_model *m, sd_kv *kv, int32_t n_seqs, const sd_verify_seq *seqs,
                               sd_verify_result *results, sd_spec_scratch *scratch) {
    if (!m || !kv || n_seqs < 0 || (n_seqs > 0 && (!seqs || !results)) || !scratch) {
        SD_ERROR("spec: verify_batch needs a model, a cache, sequences, results and scratch (n_seqs %d)", (int)n_seqs);
        return SD_ERR_INVALID_ARG;
    }
    const sd_kv_params *kp = sd_kv_params_of(kv);
    const int32_t n_vocab = sd_model_config_of(m)->n_vocab;
    /* Sizes: rows and wanted rows are bounded per sequence only after
     * validation, so count them with the same clamps. */
    size_t rows = 0, wanted = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t na = seqs[i].n_append > 0 ? seqs[i].n_append : 0;
        int32_t k = seqs[i].k > 0 && seqs[i].k <= SD_MAX_K ? seqs[i].k : 0;
        rows += (size_t)na + (size_t)k;
        wanted += (size_t)k + 1;
    }
    size_t logit_floats;
    if (!sd_mul_ok(wanted, (size_t)n_vocab, &logit_floats)) return SD_ERR_NOMEM;
    SD_TRY(reserve(scratch, rows, logit_floats, (size_t)n_vocab, (size_t)n_seqs, (size_t)kp->max_seqs));
    memset(scratch->slot_used, 0, (size_t)kp->max_seqs);

    /* 1. validate */
    for (int32_t i = 0; i < n_seqs; i++) {
        sd_verify_result *r = &results[i];
        memset(r, 0, sizeof *r);
        r->outcome = check_seq(&seqs[i], i, kv, n_vocab, scratch->slot_used);
        r->n_ctx = r->outcome == SD_SEQ_OK ? seqs[i].keep_len + seqs[i].n_append : 0;
        r->cache_len = r->outcome == SD_SEQ_INVALID ? 0 : sd_kv_seq_len(kv, seqs[i].slot);
        r->batch_row0 = -1;
        scratch->row0[i] = -1;
    }
    /* 2. truncate, then admit what fits */
    SD_TRY(admit(kv, n_seqs, seqs, results));
    /* 3. one forward */
    int32_t n_rows = 0, n_wanted = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (results[i].outcome != SD_SEQ_OK) continue;
        const sd_verify_seq *v = &seqs[i];
        scratch->row0[i] = n_wanted;
        results[i].batch_row0 = n_rows;
        int32_t n = v->n_append + v->k;
        for (int32_t j = 0; j < n; j++) {
            int32_t r = n_rows + j;
            scratch->tokens[r] = j < v->n_append ? v->append[j] : v->draft[j - v->n_append];
            scratch->pos[r] = v->keep_len + j;
            scratch->seq[r] = v->slot;
            scratch->want[r] = j >= v->n_append - 1;
        }
        n_rows += n;
        n_wanted += v->k + 1;
    }
    bool on_device = n_rows > 0 && sd_model_verifies_on_device(m) && !needs_host(n_seqs, seqs, results);
    if (on_device) {
        /* 3+4 on the device: p never leaves it */
        int32_t n_run = 0;
        for (int32_t i = 0; i < n_seqs; i++) {
            if (results[i].outcome != SD_SEQ_OK) continue;
            sd_spec_rows *sr = &scratch->rows[n_run++];
            memset(sr, 0, sizeof *sr);
            sr->row0 = scratch->row0[i];
            sr->k = seqs[i].k;
            sr->draft = seqs[i].draft;
            sr->q = seqs[i].q;
            sr->sampling = &seqs[i].sampling;
            sr->pos0 = (uint64_t)results[i].n_ctx;
        }
        sd_batch b = {n_rows, scratch->tokens, scratch->pos, scratch->seq, scratch->want};
        SD_TRY(sd_model_forward_verify(m, kv, &b, n_run, scratch->rows));
    } else if (n_rows > 0) {
        sd_batch b = {n_rows, scratch->tokens, scratch->pos, scratch->seq, scratch->want};
        SD_TRY(sd_model_forward(m, kv, &b, scratch->logits));
    }
    /* 4. verify and roll back */
    return finish(kv, n_seqs, seqs, results, scratch, on_device, n_vocab);
}
