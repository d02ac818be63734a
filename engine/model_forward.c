/* model_forward.c — the ragged batched forward pass of a Llama model (the
 * layers of other architectures, and windowed ones, are model_arch.c's).
 *
 * The whole model reads top to bottom in forward_layers(): per layer rmsnorm,
 * Q/K/V projections, RoPE, the K/V write into the paged cache, attention,
 * output projection, residual, rmsnorm, SwiGLU MLP, residual; then the final
 * norm and LM head for the wanted rows only. Every op goes through the backend
 * table (backend_impl.h), so this file never knows where the numbers live.
 *
 * The batch is validated completely and the KV cache grown for every sequence
 * before any op runs, so a rejected batch or an out-of-blocks cache leaves the
 * cache exactly as it was. Other tensor-parallel ranks replay the leader's
 * plan (sd_model_forward_plan) through the same code. Shapes are per rank, as
 * in model_load.c. */
#include "model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/spec.h"

void sd_model_free_activations(sd_model *m) {
    activations *a = &m->act;
    float **bufs[] = {&a->x,    &a->xb, &a->q,      &a->k,         &a->v,       &a->att,
                      &a->gate, &a->up, &a->logits, &a->head_part, &a->head_all};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) m->be.ops->buf_free(m->be.ctx, *bufs[i]);
        *bufs[i] = NULL;
    }
    a->cap_tokens = 0;
    a->cap_logit_rows = 0;
}

static sd_status reserve_activations(sd_model *m, int32_t n_tokens) {
    activations *a = &m->act;
    if (n_tokens <= a->cap_tokens) return SD_OK;
    if (m->be.ops->graph_reset) m->be.ops->graph_reset(m->be.ctx); /* recordings name the old buffers */
    sd_model_free_activations(m);
    const sd_model_config *c = &m->cfg;
    const sd_model_shard *sh = &m->shard;
    size_t n = (size_t)n_tokens, q = (size_t)sh->n_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)sh->n_kv_heads * (size_t)c->head_dim;
    /* the split LM head's buffers exist whenever a group is attached (or may
     * be later: sized from the shard, not from m->coll) */
    bool split = sh->lm_head == SD_TP_LM_HEAD_SPLIT && sh->n_vocab > 0;
    bool leader = sh->tp_rank == 0;
    struct {
        float **dst;
        size_t floats;
    } const want[] = {
        {&a->x, n * (size_t)c->n_embd},
        {&a->xb, n * (size_t)c->n_embd},
        {&a->q, n * q},
        {&a->k, n * kvd},
        {&a->v, n * kvd},
        {&a->att, n * q},
        {&a->gate, n * (size_t)sh->n_ff},
        {&a->up, n * (size_t)sh->n_ff},
        {&a->head_part, split ? n * (size_t)sh->n_vocab : 0},
        {&a->head_all, split && leader ? n * (size_t)sh->n_vocab * (size_t)sh->tp_size : 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!want[i].floats) continue;
        *want[i].dst = m->be.ops->buf_alloc(m->be.ctx, want[i].floats * sizeof(float));
        if (!*want[i].dst) {
            SD_ERROR("model: cannot allocate activations for %d tokens", (int)n_tokens);
            sd_model_free_activations(m);
            return SD_ERR_NOMEM;
        }
    }
    a->cap_tokens = n_tokens;
    return SD_OK;
}

static sd_status grow_i32(int32_t **p, size_t n) {
    int32_t *q = realloc(*p, (n ? n : 1) * sizeof(int32_t));
    if (!q) return SD_ERR_NOMEM;
    *p = q;
    return SD_OK;
}

static sd_status reserve_plan(batch_plan *pl, int32_t max_seqs, int32_t n_tokens) {
    if (max_seqs > pl->cap_seqs) {
        SD_TRY(grow_i32(&pl->seq_start, (size_t)max_seqs));
        SD_TRY(grow_i32(&pl->seq_next, (size_t)max_seqs));
        SD_TRY(grow_i32(&pl->seq_bt, (size_t)max_seqs));
        SD_TRY(grow_i32(&pl->seq_order, (size_t)max_seqs));
        pl->cap_seqs = max_seqs;
    }
    if (n_tokens > pl->cap_tokens) {
        SD_TRY(grow_i32(&pl->bt_off, (size_t)n_tokens));
        SD_TRY(grow_i32(&pl->wanted, (size_t)n_tokens));
        pl->cap_tokens = n_tokens;
    }
    return SD_OK;
}

/* Checks every token and fills seq_start/seq_next/seq_order; *n_seqs is the
 * number of distinct sequences, *n_wanted the number of logits rows. Touches
 * nothing outside the plan. */
static sd_status validate_batch(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t *n_seqs, int32_t *n_wanted) {
    batch_plan *pl = &m->plan;
    const sd_kv_params *kp = sd_kv_params_of(kv);
    for (int32_t s = 0; s < kp->max_seqs; s++) pl->seq_start[s] = -1;
    *n_seqs = 0;
    *n_wanted = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t id = b->tokens[t], s = b->seq[t], p = b->pos[t];
        if (id < 0 || id >= m->cfg.n_vocab) {
            SD_ERROR("model: batch token %d has id %d outside [0, %d)", (int)t, (int)id, (int)m->cfg.n_vocab);
            return SD_ERR_RANGE;
        }
        if (s < 0 || s >= kp->max_seqs) {
            SD_ERROR("model: batch token %d has sequence slot %d outside [0, %d)", (int)t, (int)s, (int)kp->max_seqs);
            return SD_ERR_RANGE;
        }
        if (pl->seq_start[s] < 0) {
            pl->seq_start[s] = sd_kv_seq_len(kv, s);
            pl->seq_next[s] = pl->seq_start[s];
            pl->seq_order[(*n_seqs)++] = s;
        }
        if (p != pl->seq_next[s]) {
            SD_ERROR("model: batch token %d of sequence %d has position %d, expected %d (positions must continue "
                     "the sequence)",
                     (int)t, (int)s, (int)p, (int)pl->seq_next[s]);
            return SD_ERR_INVALID_ARG;
        }
        if (p == INT32_MAX) {
            SD_ERROR("model: position %d overflows", (int)p);
            return SD_ERR_RANGE;
        }
        pl->seq_next[s] = p + 1;
        if (b->logits && b->logits[t]) pl->wanted[(*n_wanted)++] = t;
    }
    return SD_OK;
}

/* Grows every sequence of the batch; on failure shrinks back the ones already
 * grown so kv is unchanged. */
static sd_status grow_sequences(sd_model *m, sd_kv *kv, int32_t n_seqs) {
    batch_plan *pl = &m->plan;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t s = pl->seq_order[i];
        sd_status st = sd_kv_grow(kv, s, pl->seq_next[s]);
        if (st != SD_OK) {
            for (int32_t j = 0; j < i; j++) {
                int32_t r = pl->seq_order[j];
                sd_kv_truncate(kv, r, pl->seq_start[r]);
            }
            if (st == SD_ERR_OUT_OF_BLOCKS)
                SD_WARN("model: KV cache out of blocks growing sequence %d to %d tokens (%d free blocks)", (int)s,
                        (int)pl->seq_next[s], (int)sd_kv_n_free_blocks(kv));
            else
                SD_ERROR("model: growing sequence %d failed: %s", (int)s, sd_status_str(st));
            return st;
        }
    }
    return SD_OK;
}

/* Copies the block tables of the batch's sequences into one flat array and
 * points each token at its sequence's table. */
static sd_status gather_block_tables(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_seqs) {
    batch_plan *pl = &m->plan;
    size_t total = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t nb = 0;
        sd_kv_block_table(kv, pl->seq_order[i], &nb);
        total += (size_t)nb;
    }
    if (total > pl->cap_bt) {
        SD_TRY(grow_i32(&pl->bt, total));
        SD_TRY(grow_i32(&pl->bt_win, total));
        pl->cap_bt = total;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t s = pl->seq_order[i], nb = 0;
        const int32_t *table = sd_kv_block_table(kv, s, &nb);
        if (nb > 0) memcpy(pl->bt + off, table, (size_t)nb * sizeof(int32_t));
        const int32_t *wtable = sd_kv_window_table(kv, s, NULL); /* kv_window.c; NULL without one */
        if (nb > 0 && wtable) memcpy(pl->bt_win + off, wtable, (size_t)nb * sizeof(int32_t));
        pl->seq_bt[s] = (int32_t)off;
        off += (size_t)nb;
    }
    for (int32_t t = 0; t < b->n_tokens; t++) pl->bt_off[t] = pl->seq_bt[b->seq[t]];
    return SD_OK;
}

/* Sums a partial residual update over the group (nothing without one).
 * shm sums host buffers the ops before it finished writing, and returns
 * once the sum is in place; NCCL on the backend's stream (coll_on_stream) is
 * enqueued after the ops that wrote buf and before those that read it, and
 * returns at once (the time counted is then the enqueue's), the forward
 * waiting for it at its end (settle_coll). */
static sd_status tp_all_reduce(sd_model *m, float *buf, size_t n) {
    if (!m->coll) return SD_OK;
    double t0 = sd_now();
    sd_status s = sd_coll_all_reduce_sum(m->coll, buf, n);
    m->tp_stats.all_reduces++;
    m->tp_stats.all_reduce_s += sd_now() - t0;
    return s;
}

/* y = w x for a matrix as the model holds it (sd_mat): the f32 / backend
 * format matmul, or the backend's matmul on stored blocks. */
static sd_status mat_mul(sd_model *m, const sd_mat *w, int32_t n_in, int32_t n_out, const float *x, int32_t n,
                         float *y) {
    const sd_backend_ops *op = m->be.ops;
    if (w->type == SD_DTYPE_F32) return op->matmul(m->be.ctx, w->w, n_in, n_out, x, n, y);
    return op->matmul_stored(m->be.ctx, w->type, w->w, n_in, n_out, x, n, y);
}

sd_status sd_model_mat_mul(sd_model *m, const sd_mat *w, int32_t n_in, int32_t n_out, const float *x, int32_t n,
                           float *y) {
    return mat_mul(m, w, n_in, n_out, x, n, y);
}

sd_status sd_model_tp_all_reduce(sd_model *m, float *buf, size_t n) { return tp_all_reduce(m, buf, n); }

/* out [n][E] = rows ids of the embedding table: the backend's lookup for an
 * f32 table; a stored table (host memory, see model_impl.h) has each
 * looked-up row dequantized on the host. ids were range-checked. */
static sd_status embed_tokens(sd_model *m, const int32_t *ids, int32_t n, float *out) {
    const int32_t E = m->cfg.n_embd;
    if (m->tok_embd.type == SD_DTYPE_F32) return m->be.ops->embed(m->be.ctx, m->tok_embd.w, E, ids, n, out);
    size_t be, bb;
    if (!sd_dtype_block(m->tok_embd.type, &be, &bb)) return SD_ERR_INTERNAL;
    const size_t row_bytes = (size_t)E / be * bb;
    for (int32_t t = 0; t < n; t++)
        SD_TRY(sd_dequantize(m->tok_embd.type, (const unsigned char *)m->tok_embd.w + (size_t)ids[t] * row_bytes,
                             (uint64_t)E, out + (size_t)t * (size_t)E));
    return SD_OK;
}

/* Layer l's K and V rows of the plan's tokens into the cache, at their
 * (storage) positions, as f16 or f32. */
static sd_status write_kv(sd_model *m, sd_kv *kv, int32_t l, const sd_model_plan *b, bool f16) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const int32_t bs = sd_kv_params_of(kv)->block_size, KD = m->shard.n_kv_heads * m->cfg.head_dim;
    float *k = m->act.k, *v = m->act.v;
    if (f16) {
        SD_TRY(op->kv_write_f16(be, sd_kv_k_pool(kv, l), bs, KD, k, b->n_tokens, b->pos, b->bt, b->bt_off));
        return op->kv_write_f16(be, sd_kv_v_pool(kv, l), bs, KD, v, b->n_tokens, b->pos, b->bt, b->bt_off);
    }
    SD_TRY(op->kv_write(be, sd_kv_k_pool(kv, l), bs, KD, k, b->n_tokens, b->pos, b->bt, b->bt_off));
    return op->kv_write(be, sd_kv_v_pool(kv, l), bs, KD, v, b->n_tokens, b->pos, b->bt, b->bt_off);
}

/* Layer l's attention on the plan's tokens, from q, k and v in the
 * activations to att [n][H*D]: RoPE, the K/V rows written into the cache
 * (f32 or f16), then causal attention over it (a token tree's nodes at their
 * logical positions, their rows at their storage positions). */
static sd_status attend(sd_model *m, sd_kv *kv, const sd_model_plan *b, int32_t l) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    activations *a = &m->act;
    const int32_t n = b->n_tokens, D = m->cfg.head_dim;
    const int32_t H = m->shard.n_heads, KV = m->shard.n_kv_heads;
    const int32_t bs = sd_kv_params_of(kv)->block_size;
    const bool kv_f16 = sd_kv_params_of(kv)->type == SD_DTYPE_F16; /* checked by sd_model_kv_create */
    const float scale = 1.0f / sqrtf((float)D);
    const int32_t *bt = b->bt, *bt_off = b->bt_off;
    const int32_t *pos = m->tree ? m->tree_pos : b->pos;
    if (m->tree) { /* the tree's nodes (model_tree.c checked the ops and the layers) */
        SD_TRY(op->rope(be, a->q, n, H, D, pos, m->inv_freq));
        SD_TRY(op->rope(be, a->k, n, KV, D, pos, m->inv_freq));
        SD_TRY(write_kv(m, kv, l, b, kv_f16));
        SD_TRY(op->attention_tree(be, a->q, sd_kv_k_pool(kv, l), sd_kv_v_pool(kv, l), kv_f16, n, H, KV, D, bs, pos,
                                  bt, bt_off, m->tree, scale, a->att));
    } else if (kv_f16) {
        SD_TRY(op->rope(be, a->q, n, H, D, b->pos, m->inv_freq));
        SD_TRY(op->rope(be, a->k, n, KV, D, b->pos, m->inv_freq));
        SD_TRY(write_kv(m, kv, l, b, true));
        SD_TRY(op->attention_f16(be, a->q, sd_kv_k_pool(kv, l), sd_kv_v_pool(kv, l), n, H, KV, D, bs, b->pos, bt,
                                 bt_off, scale, a->att));
    } else {
        if (op->rope_kv) {
            SD_TRY(op->rope_kv(be, a->q, a->k, a->v, n, H, KV, D, b->pos, m->inv_freq, sd_kv_k_pool(kv, l),
                               sd_kv_v_pool(kv, l), bs, bt, bt_off));
        } else {
            SD_TRY(op->rope(be, a->q, n, H, D, b->pos, m->inv_freq));
            SD_TRY(op->rope(be, a->k, n, KV, D, b->pos, m->inv_freq));
            SD_TRY(write_kv(m, kv, l, b, false));
        }
        SD_TRY(op->attention(be, a->q, sd_kv_k_pool(kv, l), sd_kv_v_pool(kv, l), n, H, KV, D, bs, b->pos, bt,
                             bt_off, scale, a->att));
    }
    return SD_OK;
}

/* The MLP block: x += w_down (silu(w_gate xb) * (w_up xb)) with xb the
 * normed x, the partial sums all-reduced first in a group. */
static sd_status mlp_block(sd_model *m, const layer_weights *L, int32_t n, bool fused) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    activations *a = &m->act;
    const int32_t E = m->cfg.n_embd, F = m->shard.n_ff;
    const size_t nE = (size_t)n * (size_t)E;
    SD_TRY(op->rmsnorm(be, a->x, L->ffn_norm, n, E, m->cfg.rms_eps, a->xb));
    if (fused) {
        const sd_matmul_job gu = {.n_mats = 2,
                                  .w = {L->w_gate.w, L->w_up.w},
                                  .n_out = {F, F},
                                  .y = {a->gate, a->up},
                                  .n_in = E,
                                  .n_tokens = n,
                                  .x = a->xb};
        SD_TRY(op->matmul_fused(be, &gu));
        /* x += w_down (silu(gate) * up), or xb = that partial in a group */
        const sd_matmul_job down = {.n_mats = 1,
                                    .w = {L->w_down.w},
                                    .n_out = {E},
                                    .y = {m->coll ? a->xb : a->x},
                                    .n_in = F,
                                    .n_tokens = n,
                                    .x = a->gate,
                                    .up = a->up,
                                    .accumulate = !m->coll};
        SD_TRY(op->matmul_fused(be, &down));
    } else {
        SD_TRY(mat_mul(m, &L->w_gate, E, F, a->xb, n, a->gate)); /* gate [n][F] */
        SD_TRY(mat_mul(m, &L->w_up, E, F, a->xb, n, a->up));     /* up [n][F] */
        SD_TRY(op->swiglu(be, a->gate, a->up, (size_t)n * (size_t)F, a->gate));
        SD_TRY(mat_mul(m, &L->w_down, F, E, a->gate, n, a->xb)); /* xb [n][E] (partial) */
    }
    if (!fused || m->coll) {
        SD_TRY(tp_all_reduce(m, a->xb, nE));
        SD_TRY(op->add(be, a->x, a->xb, nE, a->x));
    }
    return SD_OK;
}

/* The transformer: embeddings, then n_layers_used blocks, on all n tokens
 * of the plan. Shapes per rank: H, KV heads and F MLP columns of its shard;
 * the two row-parallel matmuls leave partial sums that the all-reduces
 * complete. */
static sd_status forward_layers(sd_model *m, sd_kv *kv, const sd_model_plan *b) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    activations *a = &m->act;
    const int32_t n = b->n_tokens, E = c->n_embd, D = c->head_dim;
    const int32_t QD = m->shard.n_heads * D, KD = m->shard.n_kv_heads * D;
    const size_t nE = (size_t)n * (size_t)E;
    /* a backend with matmul_fused gets Q/K/V and gate/up in one job each,
     * the residual adds inside the o and down projections' jobs and the
     * SwiGLU as part of the down projection's (the adds stay separate in a
     * group: the partial sums are all-reduced first) */
    const bool fused = op->matmul_fused != NULL && op->matmul_stored == NULL; /* fused jobs take f32-format matrices */

    SD_TRY(embed_tokens(m, b->tokens, n, a->x)); /* x [n][E] */
    if (c->embd_scale != 1.0f) SD_TRY(op->scale(be, a->x, nE, c->embd_scale, a->x)); /* Gemma */
    for (int32_t l = 0; l < m->n_layers_used; l++) {
        if (sd_model_layer_is_arch(m, l)) { /* another architecture's layer (model_arch.c) */
            SD_TRY(sd_model_layer_arch(m, kv, b, l));
            goto layer_done;
        }
        const layer_weights *L = &m->layers[l];
        /* attention block */
        SD_TRY(op->rmsnorm(be, a->x, L->attn_norm, n, E, c->rms_eps, a->xb)); /* xb [n][E] */
        if (fused) {
            const sd_matmul_job qkv = {.n_mats = 3,
                                       .w = {L->wq.w, L->wk.w, L->wv.w},
                                       .n_out = {QD, KD, KD},
                                       .y = {a->q, a->k, a->v},
                                       .n_in = E,
                                       .n_tokens = n,
                                       .x = a->xb};
            SD_TRY(op->matmul_fused(be, &qkv));
        } else {
            SD_TRY(mat_mul(m, &L->wq, E, QD, a->xb, n, a->q)); /* q [n][H*D] */
            SD_TRY(mat_mul(m, &L->wk, E, KD, a->xb, n, a->k)); /* k [n][KV*D] */
            SD_TRY(mat_mul(m, &L->wv, E, KD, a->xb, n, a->v)); /* v [n][KV*D] */
        }
        SD_TRY(attend(m, kv, b, l)); /* att [n][H*D] */
        if (fused && !m->coll) { /* x += wo att */
            const sd_matmul_job o = {.n_mats = 1,
                                     .w = {L->wo.w},
                                     .n_out = {E},
                                     .y = {a->x},
                                     .n_in = QD,
                                     .n_tokens = n,
                                     .x = a->att,
                                     .accumulate = true};
            SD_TRY(op->matmul_fused(be, &o));
        } else {
            SD_TRY(mat_mul(m, &L->wo, QD, E, a->att, n, a->xb)); /* xb [n][E] (partial) */
            SD_TRY(tp_all_reduce(m, a->xb, nE));
            SD_TRY(op->add(be, a->x, a->xb, nE, a->x));
        }
        SD_TRY(mlp_block(m, L, n, fused));
    layer_done:; /* every layer, Llama's or model_arch.c's, ends here: what follows a layer goes below */
        if (m->capture) SD_TRY(sd_model_capture_layer(m, l, n)); /* opt-in: model_capture.c */
    }
    return SD_OK;
}

/* forward_layers, replayed from a recording when the backend keeps them
 * (CUDA graphs): the key names the batch shape and the cache, which fix
 * every buffer and launch shape; what changes between steps (ids,
 * positions, block tables) was copied by host_arrays into buffers that stay
 * where they are. A backend that declines to record, or drops a recording
 * that failed, gets the ops run one by one. A model in a group never
 * records: collectives are not part of a recording (shm ones run on the
 * host; NCCL's non-blocking communicators may answer "in progress" to an
 * enqueue, which a capture cannot wait for). */
static sd_status run_layers(sd_model *m, sd_kv *kv, const sd_model_plan *b) {
    const sd_backend_ops *op = m->be.ops;
    if (!op->graph_launch || m->coll || m->capture || m->tree) return forward_layers(m, kv, b);
    uint64_t key = sd_kv_uid(kv) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)b->n_tokens;
    sd_status s = op->graph_launch(m->be.ctx, key);
    if (s != SD_ERR_NOT_FOUND) return s;
    if (op->graph_begin(m->be.ctx, key) != SD_OK) return forward_layers(m, kv, b);
    s = forward_layers(m, kv, b);
    sd_status e = op->graph_end(m->be.ctx, s == SD_OK);
    if (e == SD_ERR_NOT_FOUND) return forward_layers(m, kv, b); /* recording dropped: nothing ran yet */
    return s != SD_OK ? s : e;
}

/* The split LM head: every rank computes its vocabulary columns for the
 * wanted rows (xb, normed), the leader gathers them, [tp][n_wanted][Vl],
 * and reorders them into dst [n_wanted][V]: viewed as rows of Vl floats,
 * row t*tp + r of dst is row r*n_wanted + t of the gathered buffer (the
 * embedding lookup does that row gather on any backend). */
static sd_status split_head(sd_model *m, int32_t n_wanted, float *dst) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    activations *a = &m->act;
    const sd_model_shard *sh = &m->shard;
    const size_t part = (size_t)n_wanted * (size_t)sh->n_vocab;
    SD_TRY(mat_mul(m, &m->output, m->cfg.n_embd, sh->n_vocab, a->xb, n_wanted, a->head_part));
    double t0 = sd_now();
    SD_TRY(sd_coll_gather(m->coll, a->head_part, part, a->head_all, 0));
    m->tp_stats.gathers++;
    m->tp_stats.gather_s += sd_now() - t0;
    if (sh->tp_rank != 0 || !dst) return SD_OK;
    batch_plan *pl = &m->plan;
    int32_t n_rows = n_wanted * sh->tp_size;
    if (n_rows > pl->cap_head) {
        SD_TRY(grow_i32(&pl->head_ids, (size_t)n_rows));
        pl->cap_head = n_rows;
    }
    for (int32_t t = 0; t < n_wanted; t++)
        for (int32_t r = 0; r < sh->tp_size; r++) pl->head_ids[t * sh->tp_size + r] = r * n_wanted + t;
    return op->embed(be, a->head_all, sh->n_vocab, pl->head_ids, n_rows, dst);
}

/* The bounded wait for collectives enqueued on the backend's stream (and
 * the compute before them): before the host reads results, and at the end
 * of every forward, so a rank whose peer died fails here instead of
 * blocking in a download. */
static sd_status settle_coll(sd_model *m) { return m->coll_on_stream ? sd_coll_wait(m->coll) : SD_OK; }

/* Final norm and LM head for the n_wanted rows listed in wanted, logits of
 * the first n_head token ids ([n_wanted][n_head]; n_head < n_vocab only
 * without a group: the head's rows are a prefix of its matrix); out NULL
 * keeps them in the activations (a->logits on a device backend). In a
 * group every rank with LM head rows takes part; only the leader ends up
 * with logits. */
static sd_status forward_logits(sd_model *m, const int32_t *wanted, int32_t n_wanted, int32_t n_head, float *out) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    const sd_model_shard *sh = &m->shard;
    activations *a = &m->act;
    bool split = m->coll && sh->lm_head == SD_TP_LM_HEAD_SPLIT;
    if (!split && sh->tp_rank != 0) return SD_OK; /* the leader holds the whole head */
    /* gather wanted rows of x into xb [n_wanted][E], norm in place */
    SD_TRY(op->embed(be, a->x, c->n_embd, wanted, n_wanted, a->xb));
    SD_TRY(op->rmsnorm(be, a->xb, m->output_norm, n_wanted, c->n_embd, c->rms_eps, a->xb));
    if (!op->host_memory && sh->tp_rank == 0 && n_wanted > a->cap_logit_rows) { /* on the device: n_wanted rows */
        if (a->logits) op->buf_free(be, a->logits);
        a->logits = op->buf_alloc(be, (size_t)n_wanted * (size_t)c->n_vocab * sizeof(float));
        a->cap_logit_rows = a->logits ? n_wanted : 0;
        if (!a->logits) {
            SD_ERROR("model: cannot allocate logits for %d rows", (int)n_wanted);
            return SD_ERR_NOMEM;
        }
    }
    float *dst = op->host_memory ? out : a->logits; /* [n_wanted][n_head] */
    if (split)
        SD_TRY(split_head(m, n_wanted, dst));
    else
        SD_TRY(mat_mul(m, &m->output, c->n_embd, n_head, a->xb, n_wanted, dst));
    if (sh->tp_rank == 0 && !op->host_memory && out) {
        SD_TRY(settle_coll(m)); /* bounded, before a download that would wait without a bound */
        SD_TRY(op->buf_download(be, out, a->logits, (size_t)n_wanted * (size_t)n_head * sizeof(float)));
    }
    return SD_OK;
}

/* Everything after the batch was planned: the arrays to the device, the
 * layers, the LM head. */
static sd_status run_plan(sd_model *m, sd_kv *kv, const sd_model_plan *p, int32_t n_head, float *out) {
    sd_status s = SD_OK;
    if (m->be.ops->host_arrays) {
        /* the order is fixed: a recorded forward reads the same slots */
        const sd_host_array arrays[] = {
            {p->tokens, (size_t)p->n_tokens}, {p->pos, (size_t)p->n_tokens},
            {p->bt, (size_t)p->n_bt},         {p->bt_off, (size_t)p->n_tokens},
            {p->wanted, (size_t)p->n_wanted}, {p->bt_win, p->bt_win ? (size_t)p->n_bt : 0},
        };
        s = m->be.ops->host_arrays(m->be.ctx, arrays, (int32_t)(sizeof arrays / sizeof arrays[0]));
    }
    if (s == SD_OK) s = run_layers(m, kv, p);
    if (s == SD_OK && p->n_wanted > 0) s = forward_logits(m, p->wanted, p->n_wanted, n_head, out);
    if (s == SD_OK) s = settle_coll(m);
    return s;
}

static sd_status forward(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out, bool keep);

/* forward, a long batch on a cache with a window group in chunks
 * (model_window.c: its pools hold about a window per sequence). */
static sd_status forward_any(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out, bool keep) {
    if (m && sd_model_window_chunked(kv, b)) return sd_model_forward_chunks(m, kv, b, n_head, out, keep, forward);
    return forward(m, kv, b, n_head, out, keep);
}

sd_status sd_model_forward(sd_model *m, sd_kv *kv, const sd_batch *b, float *out) {
    return forward_any(m, kv, b, m ? m->cfg.n_vocab : 0, out, false);
}

sd_status sd_model_forward_head(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out) {
    if (!m) return SD_ERR_INVALID_ARG;
    if (n_head < 1 || n_head > m->cfg.n_vocab) {
        SD_ERROR("model: logits for the first %d token ids asked, the vocabulary has %d", (int)n_head,
                 (int)m->cfg.n_vocab);
        return SD_ERR_RANGE;
    }
    if (n_head < m->cfg.n_vocab && (m->coll || m->shard.tp_size > 1)) {
        SD_ERROR("model: a cut LM head (%d of %d ids) is not supported in a tensor-parallel group", (int)n_head,
                 (int)m->cfg.n_vocab);
        return SD_ERR_UNSUPPORTED;
    }
    return forward_any(m, kv, b, n_head, out, false);
}

bool sd_model_verifies_on_device(const sd_model *m) { return m && m->be.ops->spec_verify && !m->host_verify; }

sd_status sd_model_forward_verify(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_seqs, sd_spec_rows *seqs) {
    if (!sd_model_verifies_on_device(m)) {
        SD_ERROR("model: backend %s does not verify on the device", m ? m->be.ops->name : "(none)");
        return SD_ERR_UNSUPPORTED;
    }
    if (n_seqs < 0 || (n_seqs > 0 && !seqs)) return SD_ERR_INVALID_ARG;
    SD_TRY(forward_any(m, kv, b, m->cfg.n_vocab, NULL, true));
    int32_t n_wanted = 0;
    for (int32_t t = 0; b->logits && t < b->n_tokens; t++) n_wanted += b->logits[t];
    for (int32_t i = 0; i < n_seqs; i++)
        if (seqs[i].row0 < 0 || seqs[i].k < 0 || seqs[i].row0 + seqs[i].k >= n_wanted) {
            SD_ERROR("model: verification of sequence %d reads rows %d..%d of %d wanted", (int)i, (int)seqs[i].row0,
                     (int)(seqs[i].row0 + seqs[i].k), (int)n_wanted);
            return SD_ERR_INVALID_ARG;
        }
    return m->be.ops->spec_verify(m->be.ctx, m->act.logits, m->cfg.n_vocab, n_seqs, seqs);
}

/* The forward: out receives the wanted rows' logits of the first n_head
 * ids (host), or with keep they stay in the activations for spec_verify. */
static sd_status forward(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out, bool keep) {
    if (!m || !kv || !b || b->n_tokens < 0) return SD_ERR_INVALID_ARG;
    if (b->n_tokens == 0) return SD_OK;
    if (!b->tokens || !b->pos || !b->seq) {
        SD_ERROR("model: batch with %d tokens lacks tokens/pos/seq arrays", (int)b->n_tokens);
        return SD_ERR_INVALID_ARG;
    }
    if (m->shard.tp_size > 1 && (!m->coll || m->shard.tp_rank != 0)) {
        SD_ERROR("model: rank %d of a %d-rank group %s", (int)m->shard.tp_rank, (int)m->shard.tp_size,
                 m->coll ? "runs the leader's plans (sd_model_forward_plan), not batches of its own"
                         : "has no collectives yet (sd_model_set_coll)");
        return SD_ERR_INVALID_ARG;
    }
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (kp->n_layers < m->n_layers_used || kp->n_kv_heads != m->shard.n_kv_heads || kp->head_dim != m->cfg.head_dim) {
        SD_ERROR("model: KV cache shape (%d layers, %d kv heads, head_dim %d) does not fit the model (%d, %d, %d)",
                 (int)kp->n_layers, (int)kp->n_kv_heads, (int)kp->head_dim, (int)m->n_layers_used,
                 (int)m->shard.n_kv_heads, (int)m->cfg.head_dim);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(reserve_plan(&m->plan, kp->max_seqs, b->n_tokens));
    int32_t n_seqs, n_wanted;
    SD_TRY(validate_batch(m, kv, b, &n_seqs, &n_wanted));
    if (n_wanted > 0 && !out && !keep) {
        SD_ERROR("model: %d logits rows wanted but out is NULL", (int)n_wanted);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(reserve_activations(m, b->n_tokens));
    SD_TRY(grow_sequences(m, kv, n_seqs));
    sd_status s = gather_block_tables(m, kv, b, n_seqs);
    size_t n_bt = 0;
    for (int32_t i = 0; s == SD_OK && i < n_seqs; i++) {
        int32_t nb = 0;
        sd_kv_block_table(kv, m->plan.seq_order[i], &nb);
        n_bt += (size_t)nb;
    }
    sd_model_plan plan = {
        .bt_win = sd_kv_window(kv) > 0 ? m->plan.bt_win : NULL,
        .n_tokens = b->n_tokens,
        .tokens = b->tokens,
        .pos = b->pos,
        .bt_off = m->plan.bt_off,
        .n_bt = (int32_t)n_bt,
        .bt = m->plan.bt,
        .n_wanted = n_wanted,
        .wanted = m->plan.wanted,
    };
    /* the other ranks run the same plan at the same time */
    if (s == SD_OK && m->plan_sink) s = m->plan_sink(m->plan_user, &plan);
    if (s == SD_OK) s = run_plan(m, kv, &plan, n_head, keep ? NULL : out);
    if (s != SD_OK) {
        /* the cache holds partial entries: give the new positions back */
        for (int32_t i = 0; i < n_seqs; i++) {
            int32_t q = m->plan.seq_order[i];
            sd_kv_truncate(kv, q, m->plan.seq_start[q]);
        }
        SD_ERROR("model: forward failed: %s", sd_status_str(s));
    }
    return s;
}

/* Checks a plan from the leader against this rank's cache and vocabulary:
 * every array present, ids in the vocabulary, each token's block entry
 * (and every entry before it, which attention reads) inside bt, every block
 * id inside the pool, wanted rows increasing. */
static sd_status check_plan(const sd_model *m, const sd_kv *kv, const sd_model_plan *p) {
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (p->n_tokens < 1 || p->n_bt < 1 || p->n_wanted < 0 || p->n_wanted > p->n_tokens || !p->tokens || !p->pos ||
        !p->bt_off || !p->bt || (p->n_wanted > 0 && !p->wanted)) {
        SD_ERROR("model: plan with %d tokens, %d block entries, %d wanted rows, or an array missing", (int)p->n_tokens,
                 (int)p->n_bt, (int)p->n_wanted);
        return SD_ERR_RANGE;
    }
    for (int32_t i = 0; i < p->n_bt; i++)
        if (p->bt[i] < 0 || p->bt[i] >= kp->n_blocks) {
            SD_ERROR("model: plan block entry %d is block %d, outside the pool [0, %d)", (int)i, (int)p->bt[i],
                     (int)kp->n_blocks);
            return SD_ERR_RANGE;
        }
    for (int32_t t = 0; t < p->n_tokens; t++) {
        if (p->tokens[t] < 0 || p->tokens[t] >= m->cfg.n_vocab || p->pos[t] < 0 || p->bt_off[t] < 0 ||
            (int64_t)p->bt_off[t] + p->pos[t] / kp->block_size >= p->n_bt) {
            SD_ERROR("model: plan token %d (id %d, position %d, table at %d) is outside the vocabulary %d or the "
                     "%d block entries",
                     (int)t, (int)p->tokens[t], (int)p->pos[t], (int)p->bt_off[t], (int)m->cfg.n_vocab, (int)p->n_bt);
            return SD_ERR_RANGE;
        }
    }
    for (int32_t i = 0; i < p->n_wanted; i++)
        if (p->wanted[i] < 0 || p->wanted[i] >= p->n_tokens || (i > 0 && p->wanted[i] <= p->wanted[i - 1])) {
            SD_ERROR("model: plan wanted row %d is %d (rows must increase inside [0, %d))", (int)i, (int)p->wanted[i],
                     (int)p->n_tokens);
            return SD_ERR_RANGE;
        }
    return SD_OK;
}

sd_status sd_model_forward_plan(sd_model *m, sd_kv *kv, const sd_model_plan *plan) {
    if (!m || !kv || !plan) return SD_ERR_INVALID_ARG;
    if (!m->coll || m->shard.tp_rank == 0) {
        SD_ERROR("model: only a rank > 0 of a group with its collectives runs the leader's plans");
        return SD_ERR_INVALID_ARG;
    }
    const sd_kv_params *kp = sd_kv_params_of(kv);
    if (kp->n_layers < m->n_layers_used || kp->n_kv_heads != m->shard.n_kv_heads || kp->head_dim != m->cfg.head_dim) {
        SD_ERROR("model: KV cache shape (%d layers, %d kv heads, head_dim %d) does not fit the shard (%d, %d, %d)",
                 (int)kp->n_layers, (int)kp->n_kv_heads, (int)kp->head_dim, (int)m->n_layers_used,
                 (int)m->shard.n_kv_heads, (int)m->cfg.head_dim);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(check_plan(m, kv, plan));
    SD_TRY(sd_model_window_check_plan(kv, plan)); /* model_window.c */
    SD_TRY(reserve_activations(m, plan->n_tokens));
    sd_status s = run_plan(m, kv, plan, m->cfg.n_vocab, NULL);
    if (s != SD_OK)
        SD_ERROR("model: rank %d: forward of the leader's plan failed: %s", (int)m->shard.tp_rank, sd_status_str(s));
    return s;
}
