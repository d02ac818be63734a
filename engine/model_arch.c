/* model_arch.c — the layers of the architectures beyond plain Llama (Qwen2,
 * Qwen3, Gemma 3, and Llama with a sliding window: Mistral), and the
 * loading of what they add (model_config.h names each addition).
 *
 * One layer, op by op (no fused jobs: those take Llama's shape):
 *   xb = rmsnorm(x, attn_norm)
 *   q, k, v = wq xb, wk xb, wv xb            (+ bq, bk, bv: qkv_bias)
 *   q, k = rmsnorm of each head (q_norm, k_norm: qk_norm)
 *   q, k = rope (NeoX halves: rope_neox), the windowed layers with their own
 *          frequencies (inv_freq_swa)
 *   K/V cache write; attention, over the window on a windowed layer, scores
 *          scaled by attn_scale
 *   xb = wo att (all-reduced in a group); xb = rmsnorm(xb, post_attn_norm)
 *   (post_norms); x += xb
 *   xb = rmsnorm(x, ffn_norm); gate, up; gelu(gate) * up (gelu) or
 *   silu(gate) * up; xb = w_down that (all-reduced); xb = rmsnorm(xb,
 *   post_ffn_norm) (post_norms); x += xb.
 * The embedding scale (Gemma's sqrt(n_embd)) is model_forward.c's, right
 * after the lookup. Every op is batch-invariant (backend_impl.h), so this
 * path keeps the engine's guarantees: a token's logits do not depend on the
 * batch, and a truncated sequence recomputes exactly.
 *
 * Tensor parallelism: the biases are split with their heads, the per-head
 * norms and the post-norms replicated; a post-norm reads the whole branch
 * output, so it runs after the all-reduce (on every rank, on the same sum).
 *
 * The sliding window weighs the positions outside the window 0
 * (attention_window) and reads none of them. With a cache whose window group
 * holds the windowed layers (kv_window.c: blocks that left every reachable
 * window are freed), those layers read and write through the plan's bt_win;
 * without one (a cache made by hand, a model without a window) the whole
 * context stays and bt serves every layer. */
#include "model_impl.h"

#include <stdio.h>
#include <string.h>

bool sd_model_layer_is_arch(const sd_model *m, int32_t l) {
    const sd_model_config *c = &m->cfg;
    return c->arch_id != SD_ARCH_LLAMA || sd_model_layer_swa(c, l);
}

sd_status sd_model_arch_check_ops(const sd_model *m) {
    const sd_model_config *c = &m->cfg;
    const sd_backend_ops *op = m->be.ops;
    struct {
        bool needed, present;
        const char *name;
    } const need[] = {
        {c->rope_neox, op->rope_neox != NULL, "rope_neox"},
        {c->sliding_window > 0, op->attention_window != NULL, "attention_window"},
        {c->sliding_window > 0 && m->params.kv_type == SD_DTYPE_F16, op->attention_window_f16 != NULL,
         "attention_window_f16 (an f16 KV cache)"},
        {c->gelu, op->geglu != NULL, "geglu"},
        {c->qkv_bias, op->add_rows != NULL, "add_rows"},
        {c->embd_scale != 1.0f, op->scale != NULL, "scale"},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i].needed && !need[i].present) {
            SD_ERROR("model: the %s backend lacks the op %s that architecture %s needs", op->name, need[i].name,
                     c->arch);
            return SD_ERR_UNSUPPORTED;
        }
    return SD_OK;
}

sd_status sd_model_load_arch_layer(sd_model *m, const sd_weights *w, int32_t l, sd_model_vec_loader load) {
    const sd_model_config *c = &m->cfg;
    const sd_model_shard *sh = &m->shard;
    const int64_t D = c->head_dim, E = c->n_embd;
    char name[96];
    layer_weights *L = &m->layers[l];
    if (c->qkv_bias) {
        struct {
            const char *suffix;
            int64_t n, col0, n_cols;
            float **dst;
        } const b[] = {
            {"attn_q.bias", c->n_heads * D, sh->head0 * D, sh->n_heads * D, &L->bq},
            {"attn_k.bias", c->n_kv_heads * D, sh->kv_head0 * D, sh->n_kv_heads * D, &L->bk},
            {"attn_v.bias", c->n_kv_heads * D, sh->kv_head0 * D, sh->n_kv_heads * D, &L->bv},
        };
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", (int)l, b[i].suffix);
            SD_TRY(load(m, w, name, b[i].n, b[i].col0, b[i].n_cols, b[i].dst));
        }
    }
    struct {
        bool on;
        const char *suffix;
        int64_t n;
        float **dst;
    } const v[] = {
        {c->qk_norm, "attn_q_norm.weight", D, &L->q_norm},
        {c->qk_norm, "attn_k_norm.weight", D, &L->k_norm},
        {c->post_norms, "post_attention_norm.weight", E, &L->post_attn_norm},
        {c->post_norms, "post_ffw_norm.weight", E, &L->post_ffn_norm},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (!v[i].on) continue;
        snprintf(name, sizeof name, "blk.%d.%s", (int)l, v[i].suffix);
        SD_TRY(load(m, w, name, v[i].n, 0, v[i].n, v[i].dst));
    }
    return SD_OK;
}

void sd_model_free_arch_layer(sd_model *m, layer_weights *L) {
    float **bufs[] = {&L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm, &L->post_attn_norm, &L->post_ffn_norm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) m->be.ops->buf_free(m->be.ctx, *bufs[i]);
        *bufs[i] = NULL;
    }
}

/* Q/K/V projections with their biases and per-head norms, RoPE, the cache
 * write and attention: att [n][H*D]. */
static sd_status attention_block(sd_model *m, sd_kv *kv, const sd_model_plan *b, int32_t l) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    const layer_weights *L = &m->layers[l];
    activations *a = &m->act;
    const int32_t n = b->n_tokens, E = c->n_embd, D = c->head_dim;
    const int32_t H = m->shard.n_heads, KV = m->shard.n_kv_heads, QD = H * D, KD = KV * D;
    const int32_t bs = sd_kv_params_of(kv)->block_size;
    const bool kv_f16 = sd_kv_params_of(kv)->type == SD_DTYPE_F16;
    SD_TRY(sd_model_mat_mul(m, &L->wq, E, QD, a->xb, n, a->q));
    SD_TRY(sd_model_mat_mul(m, &L->wk, E, KD, a->xb, n, a->k));
    SD_TRY(sd_model_mat_mul(m, &L->wv, E, KD, a->xb, n, a->v));
    if (L->bq) {
        SD_TRY(op->add_rows(be, a->q, L->bq, n, QD, a->q));
        SD_TRY(op->add_rows(be, a->k, L->bk, n, KD, a->k));
        SD_TRY(op->add_rows(be, a->v, L->bv, n, KD, a->v));
    }
    if (L->q_norm) { /* each head a row of D */
        SD_TRY(op->rmsnorm(be, a->q, L->q_norm, n * H, D, c->rms_eps, a->q));
        SD_TRY(op->rmsnorm(be, a->k, L->k_norm, n * KV, D, c->rms_eps, a->k));
    }
    const bool swa = sd_model_layer_swa(c, l);
    const float *inv_freq = swa && m->inv_freq_swa ? m->inv_freq_swa : m->inv_freq;
    sd_status (*rope)(sd_backend *, float *, int32_t, int32_t, int32_t, const int32_t *, const float *) =
        c->rope_neox ? op->rope_neox : op->rope;
    SD_TRY(rope(be, a->q, n, H, D, b->pos, inv_freq));
    SD_TRY(rope(be, a->k, n, KV, D, b->pos, inv_freq));
    /* a windowed layer of a cache with a window group: its own blocks (kv_window.c) */
    const int32_t *bt = swa && b->bt_win ? b->bt_win : b->bt, *bt_off = b->bt_off;
    if (kv_f16) {
        uint16_t *kp = sd_kv_k_pool(kv, l), *vp = sd_kv_v_pool(kv, l);
        SD_TRY(op->kv_write_f16(be, kp, bs, KD, a->k, n, b->pos, bt, bt_off));
        SD_TRY(op->kv_write_f16(be, vp, bs, KD, a->v, n, b->pos, bt, bt_off));
        if (swa)
            return op->attention_window_f16(be, a->q, kp, vp, n, H, KV, D, bs, b->pos, bt, bt_off, c->sliding_window,
                                            c->attn_scale, a->att);
        return op->attention_f16(be, a->q, kp, vp, n, H, KV, D, bs, b->pos, bt, bt_off, c->attn_scale, a->att);
    }
    float *kp = sd_kv_k_pool(kv, l), *vp = sd_kv_v_pool(kv, l);
    SD_TRY(op->kv_write(be, kp, bs, KD, a->k, n, b->pos, bt, bt_off));
    SD_TRY(op->kv_write(be, vp, bs, KD, a->v, n, b->pos, bt, bt_off));
    if (swa)
        return op->attention_window(be, a->q, kp, vp, n, H, KV, D, bs, b->pos, bt, bt_off, c->sliding_window,
                                    c->attn_scale, a->att);
    return op->attention(be, a->q, kp, vp, n, H, KV, D, bs, b->pos, bt, bt_off, c->attn_scale, a->att);
}

sd_status sd_model_layer_arch(sd_model *m, sd_kv *kv, const sd_model_plan *b, int32_t l) {
    const sd_backend_ops *op = m->be.ops;
    sd_backend *be = m->be.ctx;
    const sd_model_config *c = &m->cfg;
    const layer_weights *L = &m->layers[l];
    activations *a = &m->act;
    const int32_t n = b->n_tokens, E = c->n_embd, QD = m->shard.n_heads * c->head_dim, F = m->shard.n_ff;
    const size_t nE = (size_t)n * (size_t)E;
    /* attention block */
    SD_TRY(op->rmsnorm(be, a->x, L->attn_norm, n, E, c->rms_eps, a->xb));
    SD_TRY(attention_block(m, kv, b, l));
    SD_TRY(sd_model_mat_mul(m, &L->wo, QD, E, a->att, n, a->xb)); /* partial in a group */
    SD_TRY(sd_model_tp_all_reduce(m, a->xb, nE));
    if (L->post_attn_norm) SD_TRY(op->rmsnorm(be, a->xb, L->post_attn_norm, n, E, c->rms_eps, a->xb));
    SD_TRY(op->add(be, a->x, a->xb, nE, a->x));
    /* MLP block */
    SD_TRY(op->rmsnorm(be, a->x, L->ffn_norm, n, E, c->rms_eps, a->xb));
    SD_TRY(sd_model_mat_mul(m, &L->w_gate, E, F, a->xb, n, a->gate));
    SD_TRY(sd_model_mat_mul(m, &L->w_up, E, F, a->xb, n, a->up));
    const size_t nF = (size_t)n * (size_t)F;
    SD_TRY(c->gelu ? op->geglu(be, a->gate, a->up, nF, a->gate) : op->swiglu(be, a->gate, a->up, nF, a->gate));
    SD_TRY(sd_model_mat_mul(m, &L->w_down, F, E, a->gate, n, a->xb));
    SD_TRY(sd_model_tp_all_reduce(m, a->xb, nE));
    if (L->post_ffn_norm) SD_TRY(op->rmsnorm(be, a->xb, L->post_ffn_norm, n, E, c->rms_eps, a->xb));
    return op->add(be, a->x, a->xb, nE, a->x);
}
