/* drafter_model.c — model drafters: a small model, or the target's own
 * first L layers (self-draft, early exit through the final norm + LM head).
 *
 * Each sequence slot has a KV cache in the drafter's own sd_kv and a copy of
 * the tokens whose K/V it holds. A propose call keeps the longest common
 * prefix of that copy and the committed context (so the drafts the target
 * rejected roll back by themselves), feeds the rest of the context in one
 * forward call, then drafts autoregressively: processed distribution with
 * the caller's sampling (the same processing the target applies), top_n
 * sparsification, a coupled draw (sd_spec_draft_coupled: the race of (seed, position)), feed the
 * token, repeat. The last draft token is never fed: if it is accepted the
 * next call feeds it with the target's correction. A greedy request skips
 * the distribution: its q is the one-hot of the argmax (sd_spec_draft_step).
 *
 * Vocabulary cut (sd_drafter_params.draft_vocab = N): the draft computes
 * only the first N rows of its LM head (sd_model_forward_head; BPE ids are
 * roughly ranked by merge frequency, so the frequent tokens come first) and
 * drafts among ids < N, its q being 0 above. Nothing else changes: the
 * target's own draw decides every committed token (spec.h), so the output
 * is exact at any N and only acceptance can drop, where the target's token
 * lies above N. On SmolLM2's 49,152 x 576 Q8_0 head (30 of the Q4_K_M
 * draft's 101 MB) the default N = 32,768 leaves 10 MB a token unread for
 * 1% of chat's acceptance; 16,384 lost a fifth of it (bench/results/spec-cpu.md).
 *
 * A draft model or target path is a GGUF file or a Hugging Face checkpoint
 * directory (weights.h). It pairs with the target when their tokenizers
 * hash alike (sd_tok_vocab_hash: the tokens before trailing unused
 * padding), whatever rows each embedding is padded to (Qwen2.5-0.5B has
 * 151,936, -72B 152,064): a draft padded further drafts among the target's
 * ids only (the cut above); a draft padded less drafts nothing once the
 * context holds one of the target's padding ids, which it cannot embed (a
 * trained target never emits one; random test models do). In the service
 * the Welcome says the target's rows (sd_drafter_pair_vocab), and the
 * batched path answers such a sequence SD_SEQ_UNEMBEDDABLE: no drafts.
 *
 * Self-draft memory. In a process that holds the target, sd_drafter_self_view
 * wraps sd_model_view_layers: the draft borrows the target's weights and
 * owns only its activations, threads and KV cache. sd_drafter_self_open
 * (from a path) loads just the first L layers, for a drafter process that
 * does not hold the target. */
#include "drafter_impl.h"

#include "specd/constrain.h"
#include "specd/weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct model_drafter {
    sd_model *model;
    bool owned; /* free the model with the drafter */
    sd_kv *kv;
    int32_t n_vocab;
    int32_t n_ctx_vocab; /* context ids allowed: the target's rows when they pass n_vocab (ids past n_vocab are
                          * its padding, which the draft cannot embed: model_propose drafts nothing then) */
    int32_t n_head; /* draft_vocab: logits of ids [0, n_head) are computed, the others never drafted */
    int32_t top_n;
    int32_t max_ctx;
    int32_t *cached; /* [max_seqs][max_ctx] tokens held in kv per slot */
    int32_t *q_ids;  /* [max_seqs][SD_MAX_K][top_n] */
    float *q_probs;  /* [max_seqs][SD_MAX_K][top_n] */
    float *logits;   /* [n_head] */
    float *probs;    /* [n_head] processed distribution */
    int32_t *pos;    /* [max_ctx] batch positions */
    int32_t *seq;    /* [max_ctx] batch slots */
    bool *want;      /* [max_ctx] batch rows whose logits are wanted */
    /* batched path (sd_draft_batch), grown on demand */
    size_t cap_rows;
    int32_t *b_tokens, *b_pos, *b_seq; /* [cap_rows] */
    bool *b_want;                      /* [cap_rows] */
    size_t cap_seqs;
    float *b_logits; /* [cap_seqs][n_head] */
    int32_t *b_row;  /* [cap_seqs] logits row of each sequence in the last forward */
} model_drafter;

/* Feeds tokens[n] at positions start.. of slot seq, logits of the last row to md->logits. */
static sd_status feed(model_drafter *md, int32_t slot, const int32_t *tokens, int32_t n, int32_t start) {
    for (int32_t i = 0; i < n; i++) {
        md->pos[i] = start + i;
        md->seq[i] = slot;
        md->want[i] = i == n - 1;
    }
    sd_batch b = {n, tokens, md->pos, md->seq, md->want};
    SD_TRY(sd_model_forward_head(md->model, md->kv, &b, md->n_head, md->logits));
    memcpy(md->cached + (size_t)slot * md->max_ctx + start, tokens, (size_t)n * sizeof *tokens);
    return SD_OK;
}

/* After a truncation to *keep tokens (which stops at the start of a block
 * another sequence shares): *keep becomes what the slot holds, plus the
 * cached blocks of context it adopts (all but the last token, whose logits
 * the draft needs); the slot's token copy follows. */
static sd_status adopt_prefix(model_drafter *md, int32_t slot, const int32_t *context, int32_t n_context,
                              int32_t *keep) {
    *keep = sd_kv_seq_len(md->kv, slot);
    int32_t got = 0;
    SD_TRY(sd_kv_prefix_adopt(md->kv, slot, context, n_context - 1, &got));
    memmove(md->cached + (size_t)slot * md->max_ctx + *keep, context + *keep, (size_t)got * sizeof *context);
    *keep += got;
    return SD_OK;
}

static sd_status model_propose(sd_drafter *d, int32_t slot, const int32_t *context, int32_t n_context, int32_t k,
                               const sd_sampling *s, int32_t *tokens, sd_spec_q *q, int32_t *n_drafted) {
    model_drafter *md = d->impl;
    for (int32_t i = 0; i < n_context; i++) {
        if (context[i] < 0 || context[i] >= md->n_ctx_vocab) {
            SD_ERROR("drafter: context token %d at %d is outside [0, %d)", (int)context[i], (int)i,
                     (int)md->n_ctx_vocab);
            return SD_ERR_RANGE;
        }
        if (context[i] >= md->n_vocab) return SD_OK; /* the target's padding id: nothing drafted */
    }
    /* The last draft token is not fed, so a full draft needs n_context + k - 1 slots. */
    if (n_context + k - 1 > md->max_ctx) k = md->max_ctx - n_context + 1;
    if (k <= 0) return SD_OK;

    const int32_t *cached = md->cached + (size_t)slot * md->max_ctx;
    int32_t n_cached = sd_kv_seq_len(md->kv, slot);
    int32_t keep = 0;
    while (keep < n_cached && keep < n_context && cached[keep] == context[keep]) keep++;
    if (keep == n_context) keep = n_context - 1; /* logits come from feeding at least one token */
    SD_TRY(sd_kv_truncate(md->kv, slot, keep));
    SD_TRY(adopt_prefix(md, slot, context, n_context, &keep));
    SD_TRY(feed(md, slot, context + keep, n_context - keep, keep));
    SD_TRY(sd_kv_prefix_commit(md->kv, slot, context, n_context));

    int32_t *ids = md->q_ids + (size_t)slot * SD_MAX_K * md->top_n;
    float *qp = md->q_probs + (size_t)slot * SD_MAX_K * md->top_n;
    sd_constraint *con = d->constraint;
    int32_t con_base = con ? sd_constraint_len(con) : 0;
    sd_status st = SD_OK;
    for (int32_t i = 0; i < k && st == SD_OK; i++) {
        if (con) { /* the drafter's distribution under the constraint: stop where it allows none of it */
            if ((st = sd_constraint_apply(con, md->logits, md->n_head)) != SD_OK) break;
            bool any = false;
            for (int32_t v = 0; v < md->n_head && !any; v++) any = md->logits[v] > -INFINITY;
            if (!any) break;
        }
        int32_t *ids_i = ids + (size_t)i * md->top_n;
        float *qp_i = qp + (size_t)i * md->top_n;
        int32_t n_q = 0;
        uint64_t position = (uint64_t)n_context + (uint64_t)i;
        int32_t y;
        st = sd_spec_draft_step(md->logits, md->n_head, s, md->top_n, position, md->probs, ids_i, qp_i, &n_q, &y);
        if (st != SD_OK) break;
        q[i] = (sd_spec_q){n_q, ids_i, qp_i};
        tokens[i] = y;
        *n_drafted = i + 1;
        if (con && (sd_constraint_advance(con, y) != SD_OK || sd_constraint_ended(con))) break;
        if (i + 1 < k) st = feed(md, slot, &tokens[i], 1, n_context + i);
    }
    if (con) sd_constraint_rollback(con, con_base);
    return st;
}

static sd_status reserve_batch(model_drafter *md, size_t rows, size_t n_seqs) {
    if (rows > md->cap_rows) {
        int32_t *t = realloc(md->b_tokens, rows * sizeof *t);
        if (t) md->b_tokens = t;
        int32_t *p = realloc(md->b_pos, rows * sizeof *p);
        if (p) md->b_pos = p;
        int32_t *q = realloc(md->b_seq, rows * sizeof *q);
        if (q) md->b_seq = q;
        bool *w = realloc(md->b_want, rows * sizeof *w);
        if (w) md->b_want = w;
        if (!t || !p || !q || !w) return SD_ERR_NOMEM;
        md->cap_rows = rows;
    }
    if (n_seqs > md->cap_seqs) {
        float *l = realloc(md->b_logits, n_seqs * (size_t)md->n_head * sizeof *l);
        if (l) md->b_logits = l;
        int32_t *r = realloc(md->b_row, n_seqs * sizeof *r);
        if (r) md->b_row = r;
        if (!l || !r) return SD_ERR_NOMEM;
        md->cap_seqs = n_seqs;
    }
    return SD_OK;
}

/* Runs md's batch of n rows (b_* arrays) into b_logits; records the tokens in the slots' copies. */
static sd_status feed_batch(model_drafter *md, int32_t n) {
    if (n == 0) return SD_OK;
    sd_batch b = {n, md->b_tokens, md->b_pos, md->b_seq, md->b_want};
    SD_TRY(sd_model_forward_head(md->model, md->kv, &b, md->n_head, md->b_logits));
    for (int32_t i = 0; i < n; i++) md->cached[(size_t)md->b_seq[i] * md->max_ctx + md->b_pos[i]] = md->b_tokens[i];
    return SD_OK;
}

/* Whether the draft embeds every id of v's append (ids past its rows, up
 * to the target's, are the target's padding: the sequence drafts nothing). */
static bool embeds(const model_drafter *md, const sd_draft_seq *v) {
    for (int32_t j = 0; j < v->n_append; j++)
        if (v->append[j] >= md->n_vocab) return false;
    return true;
}

/* Masks logits[n] with con; false when it allows none of them (the
 * draft stops there). */
static bool masked_any(sd_constraint *con, float *logits, int32_t n) {
    if (sd_constraint_apply(con, logits, n) != SD_OK) return false;
    for (int32_t v = 0; v < n; v++)
        if (logits[v] > -INFINITY) return true;
    return false;
}

/* The batched draft: step 0 feeds every sequence's append in one forward
 * (logits of each last row), then each step drafts one token for every
 * sequence still short of its k and feeds those tokens in the next forward.
 * The draws are those of model_propose (same logits by batch invariance,
 * same keys), so a sequence drafts the same alone or batched. */
static sd_status model_propose_batch(sd_drafter *d, int32_t n_seqs, const sd_draft_seq *seqs,
                                     sd_draft_result *results) {
    model_drafter *md = d->impl;
    size_t rows = 0;
    int32_t max_k = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const sd_draft_seq *v = &seqs[i];
        sd_draft_result *r = &results[i];
        if (r->outcome != SD_SEQ_OK) continue;
        bool ids_ok = true;
        for (int32_t j = 0; j < v->n_append && ids_ok; j++)
            ids_ok = v->append[j] >= 0 && v->append[j] < md->n_ctx_vocab;
        if (!ids_ok) {
            SD_WARN("drafter: sequence %d: a token id is outside [0, %d)", (int)i, (int)md->n_ctx_vocab);
            r->outcome = SD_SEQ_INVALID;
        } else if (!embeds(md, v)) {
            continue; /* the target's padding id, past this draft's rows: OK, nothing drafted, nothing fed */
        } else if (sd_kv_seq_len(md->kv, v->slot) < v->keep_len ||
                   (sd_kv_truncate(md->kv, v->slot, v->keep_len) == SD_OK &&
                    sd_kv_seq_len(md->kv, v->slot) < v->keep_len)) { /* inside a shared block */
            r->outcome = SD_SEQ_CACHE_MISS;
        } else {
            rows += (size_t)v->n_append;
            int32_t k = v->k, n_ctx = v->keep_len + v->n_append;
            if (n_ctx + k - 1 > md->max_ctx) k = md->max_ctx - n_ctx + 1; /* the last draft is not fed */
            max_k = k > max_k ? k : max_k;
        }
    }
    SD_TRY(reserve_batch(md, rows > (size_t)n_seqs ? rows : (size_t)n_seqs, (size_t)n_seqs));
    int32_t n = 0, n_rows = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const sd_draft_seq *v = &seqs[i];
        md->b_row[i] = -1;
        if (results[i].outcome != SD_SEQ_OK || !embeds(md, v)) continue;
        /* the whole context in the slot's token copy, for the prefix cache */
        int32_t *ctx = md->cached + (size_t)v->slot * md->max_ctx, held = v->keep_len;
        memcpy(ctx + v->keep_len, v->append, (size_t)v->n_append * sizeof *ctx);
        SD_TRY(adopt_prefix(md, v->slot, ctx, v->keep_len + v->n_append, &held));
        for (int32_t j = held - v->keep_len; j < v->n_append; j++, n++) {
            md->b_tokens[n] = v->append[j];
            md->b_pos[n] = v->keep_len + j;
            md->b_seq[n] = v->slot;
            md->b_want[n] = j == v->n_append - 1 && v->k > 0;
        }
        if (v->k > 0) md->b_row[i] = n_rows++;
    }
    SD_TRY(feed_batch(md, n));
    for (int32_t i = 0; i < n_seqs; i++)
        if (results[i].outcome == SD_SEQ_OK && embeds(md, &seqs[i]))
            SD_TRY(sd_kv_prefix_commit(md->kv, seqs[i].slot, md->cached + (size_t)seqs[i].slot * md->max_ctx,
                                       seqs[i].keep_len + seqs[i].n_append));
    for (int32_t step = 0; step < max_k; step++) {
        n = 0;
        n_rows = 0;
        for (int32_t i = 0; i < n_seqs; i++) {
            const sd_draft_seq *v = &seqs[i];
            sd_draft_result *r = &results[i];
            if (md->b_row[i] < 0) continue;
            int32_t n_ctx = v->keep_len + v->n_append;
            int32_t k = n_ctx + v->k - 1 > md->max_ctx ? md->max_ctx - n_ctx + 1 : v->k;
            int32_t *ids = md->q_ids + ((size_t)v->slot * SD_MAX_K + (size_t)step) * (size_t)md->top_n;
            float *qp = md->q_probs + ((size_t)v->slot * SD_MAX_K + (size_t)step) * (size_t)md->top_n;
            float *logits = md->b_logits + (size_t)md->b_row[i] * (size_t)md->n_head;
            md->b_row[i] = -1;
            if (v->constraint && !masked_any(v->constraint, logits, md->n_head)) continue;
            int32_t n_q = 0;
            uint64_t position = (uint64_t)n_ctx + (uint64_t)step;
            int32_t y;
            SD_TRY(sd_spec_draft_step(logits, md->n_head, &v->sampling, md->top_n, position, md->probs, ids, qp, &n_q,
                                      &y));
            r->q[step] = (sd_spec_q){n_q, ids, qp};
            r->tokens[step] = y;
            r->n_drafted = step + 1;
            sd_constraint *con = v->constraint;
            if (con && (sd_constraint_advance(con, y) != SD_OK || sd_constraint_ended(con))) continue;
            if (step + 1 < k) {
                md->b_tokens[n] = y;
                md->b_pos[n] = n_ctx + step;
                md->b_seq[n] = v->slot;
                md->b_want[n] = true;
                md->b_row[i] = n_rows++;
                n++;
            }
        }
        SD_TRY(feed_batch(md, n));
    }
    return SD_OK;
}

static sd_status model_rollback(sd_drafter *d, int32_t slot, int32_t len) {
    model_drafter *md = d->impl;
    int32_t n = sd_kv_seq_len(md->kv, slot);
    return len < n ? sd_kv_truncate(md->kv, slot, len) : SD_OK;
}

static void model_release(sd_drafter *d, int32_t slot) {
    model_drafter *md = d->impl;
    sd_kv_release(md->kv, slot);
}

static void model_destroy(sd_drafter *d) {
    model_drafter *md = d->impl;
    if (!md) return;
    sd_kv_free(&md->kv);
    if (md->owned) sd_model_free(&md->model);
    free(md->cached);
    free(md->q_ids);
    free(md->q_probs);
    free(md->logits);
    free(md->probs);
    free(md->pos);
    free(md->seq);
    free(md->want);
    free(md->b_tokens);
    free(md->b_pos);
    free(md->b_seq);
    free(md->b_want);
    free(md->b_logits);
    free(md->b_row);
    free(md);
    d->impl = NULL;
}

static sd_status model_pair_vocab(sd_drafter *d, int32_t target_n_vocab);
static int32_t model_embed_rows(const sd_drafter *d) { return ((const model_drafter *)d->impl)->n_vocab; }

static const drafter_ops model_ops = {
    .name = "model",
    .propose = model_propose,
    .propose_batch = model_propose_batch,
    .rollback = model_rollback,
    .release = model_release,
    .destroy = model_destroy,
    .pair_vocab = model_pair_vocab,
    .embed_rows = model_embed_rows,
};
static const drafter_ops self_ops = {
    .name = "self",
    .propose = model_propose,
    .propose_batch = model_propose_batch,
    .rollback = model_rollback,
    .release = model_release,
    .destroy = model_destroy,
    .pair_vocab = model_pair_vocab,
    .embed_rows = model_embed_rows,
};

/* Builds the drafter around m; on failure m is freed when owned. */
static sd_status wrap(sd_model *m, bool owned, sd_drafter_kind kind, const sd_drafter_params *p, sd_drafter **out) {
    *out = NULL;
    sd_drafter_params params;
    sd_status st = drafter_params_check(p, &params);
    sd_drafter *d = NULL;
    model_drafter *md = NULL;
    if (st != SD_OK) goto fail;
    st = SD_ERR_NOMEM;
    d = calloc(1, sizeof *d);
    md = calloc(1, sizeof *md);
    if (!d || !md) goto fail;
    md->model = m;
    md->owned = owned;
    md->n_vocab = md->n_ctx_vocab = sd_model_config_of(m)->n_vocab;
    md->n_head = params.draft_vocab > 0 && params.draft_vocab < md->n_vocab ? params.draft_vocab : md->n_vocab;
    md->top_n = params.top_n < md->n_head ? params.top_n : md->n_head;
    md->max_ctx = params.max_ctx;
    size_t seqs = (size_t)params.max_seqs, ctx = (size_t)params.max_ctx;
    size_t q_entries = seqs * SD_MAX_K * (size_t)md->top_n;
    md->cached = malloc(seqs * ctx * sizeof *md->cached);
    md->q_ids = malloc(q_entries * sizeof *md->q_ids);
    md->q_probs = malloc(q_entries * sizeof *md->q_probs);
    md->logits = malloc((size_t)md->n_head * sizeof *md->logits);
    md->probs = malloc((size_t)md->n_head * sizeof *md->probs);
    md->pos = malloc(ctx * sizeof *md->pos);
    md->seq = malloc(ctx * sizeof *md->seq);
    md->want = malloc(ctx * sizeof *md->want);
    if (!md->cached || !md->q_ids || !md->q_probs || !md->logits || !md->probs || !md->pos || !md->seq || !md->want)
        goto fail;
    const int32_t block = 16;
    int32_t per_seq = (params.max_ctx + block - 1) / block + 1;
    st = sd_model_kv_create(m, params.max_seqs, per_seq * params.max_seqs, block, &md->kv);
    if (st == SD_OK && params.prefix_cache_pct > 0)
        st = sd_kv_prefix_enable(md->kv, (int32_t)((int64_t)per_seq * params.max_seqs * params.prefix_cache_pct / 100));
    if (st == SD_OK && params.prefix_cache_pct > 0 && !sd_kv_params_of(md->kv)->pool_alloc)
        st = sd_kv_prefix_set_partial_copy(md->kv, true); /* a host cache: copy, not recompute */
    if (st != SD_OK) goto fail;
    d->kind = kind;
    d->ops = kind == SD_DRAFTER_SELF ? &self_ops : &model_ops;
    d->params = params;
    d->impl = md;
    *out = d;
    return SD_OK;
fail:
    if (st == SD_ERR_NOMEM) SD_ERROR("drafter: out of memory creating a model drafter");
    if (d && md) {
        d->impl = md;
        model_destroy(d);
    } else {
        free(md);
        if (owned) sd_model_free(&m);
    }
    free(d);
    return st;
}

sd_status sd_drafter_model_wrap(sd_model *m, sd_drafter_kind kind, const sd_drafter_params *p, sd_drafter **out) {
    if (!m || !out || (kind != SD_DRAFTER_MODEL && kind != SD_DRAFTER_SELF)) {
        SD_ERROR("drafter: wrap needs a model, an output and kind MODEL or SELF");
        return SD_ERR_INVALID_ARG;
    }
    return wrap(m, false, kind, p, out);
}

/* Opens path (a GGUF file or a Hugging Face checkpoint directory) and loads
 * it with n_layers_used (0 = all) on p's device with p's backend switches;
 * hash/n_vocab of its vocabulary when asked. */
static sd_status load_model(const char *path, int32_t n_layers_used, const sd_drafter_params *p, uint64_t *vocab_hash,
                            int32_t *n_vocab, sd_model **out) {
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(path, &w);
    if (st != SD_OK) {
        SD_ERROR("drafter: cannot open %s: %s", path, sd_status_str(st));
        return st;
    }
    if (vocab_hash) {
        sd_tok *tok = NULL;
        st = sd_weights_tokenizer(w, &tok);
        if (st != SD_OK) {
            SD_ERROR("drafter: cannot read the tokenizer of %s", path);
            sd_weights_close(&w);
            return st;
        }
        *vocab_hash = sd_tok_vocab_hash(tok);
        *n_vocab = sd_tok_n_vocab(tok);
        sd_tok_free(&tok);
    }
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = p ? p->n_threads : 0;
    mp.n_layers_used = n_layers_used;
    mp.device = p ? p->device : -1;
    if (p && p->backend) mp.backend = *p->backend;
    st = sd_model_load_weights(w, &mp, out);
    sd_weights_close(&w);
    if (st != SD_OK) SD_ERROR("drafter: cannot load the model in %s: %s", path, sd_status_str(st));
    return st;
}

sd_status sd_drafter_model_open(const char *path, uint64_t target_vocab_hash, int32_t target_n_vocab,
                                const sd_drafter_params *p, sd_drafter **out) {
    if (!path || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    uint64_t hash = 0;
    int32_t n_vocab = 0;
    sd_model *m = NULL;
    SD_TRY(load_model(path, 0, p, &hash, &n_vocab, &m));
    /* the hash covers the tokenizer's tokens before its trailing unused
     * padding (tokenizer.c): equal hashes are the same tokenizer, whatever
     * rows each embedding is padded to */
    if (hash != target_vocab_hash) {
        SD_ERROR("drafter: the vocabulary of %s (%d tokens, hash %016llx) differs from the target's (%d tokens, "
                 "hash %016llx): a draft model must share the target's tokenizer (only trailing unused padding "
                 "tokens may differ)",
                 path, (int)n_vocab, (unsigned long long)hash, (int)target_n_vocab,
                 (unsigned long long)target_vocab_hash);
        sd_model_free(&m);
        return SD_ERR_UNSUPPORTED;
    }
    /* a draft padded further than the target drafts among the target's ids
     * only (the vocabulary cut: exact, see the top of this file) */
    sd_drafter_params q = p ? *p : sd_drafter_default_params();
    int32_t rows = sd_model_config_of(m)->n_vocab;
    if (rows > target_n_vocab && (q.draft_vocab <= 0 || q.draft_vocab > target_n_vocab)) q.draft_vocab = target_n_vocab;
    if (rows != target_n_vocab)
        SD_INFO("drafter: %s pads the shared vocabulary to %d rows, the target to %d", path, (int)rows,
                (int)target_n_vocab);
    SD_TRY(wrap(m, true, SD_DRAFTER_MODEL, &q, out));
    model_drafter *md = (*out)->impl;
    if (target_n_vocab > md->n_ctx_vocab) md->n_ctx_vocab = target_n_vocab;
    return SD_OK;
}

static sd_status model_pair_vocab(sd_drafter *d, int32_t target_n_vocab) {
    model_drafter *md = d->impl;
    if (md->n_head > target_n_vocab) {
        SD_INFO("drafter: the draft's %d rows pass the target's %d: drafting among the target's ids only",
                (int)md->n_vocab, (int)target_n_vocab);
        md->n_head = target_n_vocab; /* the buffers sized for the wider head still fit */
        if (md->top_n > md->n_head) md->top_n = md->n_head;
    }
    md->n_ctx_vocab = target_n_vocab > md->n_vocab ? target_n_vocab : md->n_vocab;
    return SD_OK;
}

sd_status sd_drafter_self_open(const char *path, int32_t n_layers, const sd_drafter_params *p, sd_drafter **out) {
    if (!path || !out || n_layers <= 0) {
        SD_ERROR("drafter: self-draft needs the target's path and n_layers > 0 (got %d)", (int)n_layers);
        return SD_ERR_INVALID_ARG;
    }
    *out = NULL;
    sd_model *m = NULL;
    SD_TRY(load_model(path, n_layers, p, NULL, NULL, &m));
    return wrap(m, true, SD_DRAFTER_SELF, p, out);
}

sd_status sd_drafter_self_view(const sd_model *target, int32_t n_layers, const sd_drafter_params *p, sd_drafter **out) {
    if (!target || !out || n_layers <= 0) {
        SD_ERROR("drafter: self-draft view needs the target and n_layers > 0 (got %d)", (int)n_layers);
        return SD_ERR_INVALID_ARG;
    }
    *out = NULL;
    sd_model *view = NULL;
    SD_TRY(sd_model_view_layers(target, n_layers, &view));
    return wrap(view, true, SD_DRAFTER_SELF, p, out);
}
