/* eagle_head.c — the EAGLE-3 head's forward on the host (eagle.h).
 *
 * One row of the head, reading top to bottom (H its hidden size):
 *
 *   e   = embed(token)                       [H]  the head's table or the target's
 *   g                                        [H]  fc(target features) or its own last output
 *   res = g  (speculators' norm_before_residual: hidden_norm(g))
 *   a   = [input_layernorm(e) ; hidden_norm(g)]   [2H]  embedding first
 *   q, k, v = Wq a, Wk a, Wv a               RoPE (rotate-half, as the HF
 *                                            checkpoint's weights expect) at the row's position
 *   res += Wo attention(q, cached k/v of the slot's positions <= this one)
 *   res += down(silu(gate(n)) * up(n)),  n = post_attention_layernorm(res)
 *   hidden_out = res                         [H]  fed back as the next row's g
 *   logits = lm_head(norm(res))              [Vd] draft ids; target id = d2t[i]
 *
 * (SGLang's LlamaDecoderLayer for EAGLE-3 and its LlamaModel.forward; the
 * pre-norm output is what it returns as the aux state for the next draft
 * step.) Positions: the head's row for target position t reads the
 * target's feature of t and the token at t + 1 and predicts the token at
 * t + 2, so head position t holds the pair (feature t, token t + 1).
 *
 * Matmuls run on the CPU backend's threaded kernels (host_ops.h) on the
 * matrices as eagle_load.c packed them (Q8_0 by default, or as stored: F32,
 * F16 / BF16 read as they are), q/k/v and gate/up one matmul each; norms,
 * RoPE and the attention over a few thousand cached positions are plain
 * loops. */
#include "eagle_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sd_status sd_eagle_rope_init(sd_eagle_head *h, double theta, int32_t scaling, double factor, double low, double high,
                             double orig_ctx) {
    const int32_t half = h->head_dim / 2;
    h->inv_freq = malloc((size_t)half * sizeof *h->inv_freq);
    if (!h->inv_freq) return SD_ERR_NOMEM;
    for (int32_t i = 0; i < half; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)h->head_dim);
        if (scaling == 1 && factor > 0) {
            f /= factor;
        } else if (scaling == 2 && factor > 0 && high > low) { /* llama3: long wavelengths scaled, a smooth band */
            const double wavelen = 2.0 * M_PI / f, lo_wl = orig_ctx / low, hi_wl = orig_ctx / high;
            if (wavelen > lo_wl) {
                f /= factor;
            } else if (wavelen >= hi_wl) {
                double smooth = (orig_ctx / wavelen - low) / (high - low);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        h->inv_freq[i] = (float)f;
    }
    return SD_OK;
}

void sd_eagle_head_layers(const sd_eagle_head *h, int32_t *ids) { memcpy(ids, h->layer_ids, sizeof h->layer_ids); }
int32_t sd_eagle_head_hidden(const sd_eagle_head *h) { return h->H; }
int32_t sd_eagle_head_draft_vocab(const sd_eagle_head *h) { return h->draft_vocab; }
int32_t sd_eagle_head_target_id(const sd_eagle_head *h, int32_t i) { return h->d2t[i]; }

int32_t sd_eagle_head_len(const sd_eagle_head *h, int32_t seq) {
    return h && seq >= 0 && seq < h->params.max_seqs ? h->len[seq] : 0;
}

sd_status sd_eagle_head_truncate(sd_eagle_head *h, int32_t seq, int32_t len) {
    if (!h || seq < 0 || seq >= h->params.max_seqs || len < 0) return SD_ERR_INVALID_ARG;
    if (len < h->len[seq]) h->len[seq] = len;
    return SD_OK;
}

/* y [n][n_out] = m x as stored. */
static sd_status mm(sd_eagle_head *h, const eagle_mat *m, int32_t n_in, int32_t n_out, const float *x, int32_t n,
                    float *y) {
    return sd_host_matmul_stored(h->ops, m->type, m->w, n_in, n_out, x, n, y);
}

sd_status sd_eagle_head_fuse(sd_eagle_head *h, const float *aux, int32_t n, float *fused) {
    if (!h || n < 0 || (n > 0 && (!aux || !fused))) return SD_ERR_INVALID_ARG;
    return mm(h, &h->fc, SD_EAGLE_N_AUX * h->Ht, h->H, aux, n, fused);
}

static void rmsnorm_rows(const float *x, const float *w, int32_t n, int32_t dim, float eps, float *out,
                         size_t out_stride) {
    for (int32_t t = 0; t < n; t++) {
        const float *r = x + (size_t)t * (size_t)dim;
        double ss = 0;
        for (int32_t i = 0; i < dim; i++) ss += (double)r[i] * (double)r[i];
        const float s = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        float *o = out + (size_t)t * out_stride;
        for (int32_t i = 0; i < dim; i++) o[i] = r[i] * s * w[i];
    }
}

/* Rotate-half RoPE on n_heads heads of each row at its position: pos0 + t,
 * or a tree row's own (tr->pos). */
static void rope_rows(const sd_eagle_head *h, float *x, int32_t n, int32_t n_heads, int32_t pos0,
                      const sd_eagle_tree_rows *tr) {
    const int32_t D = h->head_dim, half = D / 2;
    for (int32_t t = 0; t < n; t++)
        for (int32_t j = 0; j < half; j++) {
            const double ang = (double)(tr ? tr->pos[t] : pos0 + t) * (double)h->inv_freq[j];
            const float c = (float)cos(ang), s = (float)sin(ang);
            for (int32_t hh = 0; hh < n_heads; hh++) {
                float *v = x + ((size_t)t * (size_t)n_heads + (size_t)hh) * (size_t)D;
                const float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
}

static sd_status reserve(sd_eagle_head *h, int32_t n) {
    if (n <= h->cap_rows) return SD_OK;
    const size_t N = (size_t)n, H = (size_t)h->H, QD = (size_t)h->n_heads * (size_t)h->head_dim;
    const size_t KD = (size_t)h->n_kv_heads * (size_t)h->head_dim, F = (size_t)h->n_ff;
    struct {
        float **p;
        size_t n;
    } bufs[] = {{&h->x_emb, N * H}, {&h->x_in, N * 2 * H}, {&h->qkv, N * (QD + 2 * KD)}, {&h->q, N * QD},
                {&h->k, N * KD},    {&h->v, N * KD},       {&h->att, N * QD},              {&h->h1, N * H},
                {&h->xn, N * H},    {&h->gu, N * 2 * F},   {&h->gate, N * F},              {&h->h2, N * H},
                {&h->scores, (size_t)h->params.max_ctx}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        float *p = realloc(*bufs[i].p, bufs[i].n * sizeof(float));
        if (!p) return SD_ERR_NOMEM;
        *bufs[i].p = p;
    }
    h->cap_rows = n;
    return SD_OK;
}

/* sum q[i] k[i] in 8 lanes (the compiler's vectors), then the lanes in a
 * fixed order: one scalar chain would run a key at a time. */
static float dot(const float *q, const float *k, int32_t D) {
    float l[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= D; i += 8)
        for (int j = 0; j < 8; j++) l[j] += q[i + j] * k[i + j];
    for (; i < D; i++) l[0] += q[i] * k[i];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* att[t] = softmax(q k^T / sqrt(D)) v over the slot's positions 0..pos0+t,
 * or for a tree row its logical positions 0..tr->pos[t]: those from
 * tr->base on read at its path's cache rows. */
static void attend(sd_eagle_head *h, int32_t seq, int32_t pos0, int32_t n, const sd_eagle_tree_rows *tr) {
    const int32_t D = h->head_dim, KVH = h->n_kv_heads, group = h->n_heads / KVH;
    const size_t KD = (size_t)KVH * (size_t)D;
    const float *kc = h->k_cache + (size_t)seq * (size_t)h->params.max_ctx * KD;
    const float *vc = h->v_cache + (size_t)seq * (size_t)h->params.max_ctx * KD;
    const float scale = 1.0f / sqrtf((float)D);
    for (int32_t t = 0; t < n; t++) {
        const int32_t n_keys = tr ? tr->pos[t] + 1 : pos0 + t + 1;
        const int32_t *path = tr ? tr->path + tr->path_off[t] : NULL;
        for (int32_t hh = 0; hh < h->n_heads; hh++) {
            const float *q = h->q + ((size_t)t * (size_t)h->n_heads + (size_t)hh) * (size_t)D;
            const size_t kh = (size_t)(hh / group) * (size_t)D;
            float mx = -INFINITY;
            for (int32_t p = 0; p < n_keys; p++) {
                const float *k = kc + (size_t)(path && p >= tr->base ? path[p - tr->base] : p) * KD + kh;
                h->scores[p] = dot(q, k, D) * scale;
                mx = h->scores[p] > mx ? h->scores[p] : mx;
            }
            double sum = 0;
            for (int32_t p = 0; p < n_keys; p++) {
                h->scores[p] = expf(h->scores[p] - mx);
                sum += h->scores[p];
            }
            float *o = h->att + ((size_t)t * (size_t)h->n_heads + (size_t)hh) * (size_t)D;
            memset(o, 0, (size_t)D * sizeof *o);
            for (int32_t p = 0; p < n_keys; p++) {
                const float w = (float)(h->scores[p] / sum);
                const float *v = vc + (size_t)(path && p >= tr->base ? path[p - tr->base] : p) * KD + kh;
                for (int32_t i = 0; i < D; i++) o[i] += w * v[i];
            }
        }
    }
}

static sd_status embed_rows(sd_eagle_head *h, const int32_t *tokens, int32_t n) {
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= h->n_vocab) {
            SD_ERROR("eagle: token id %d outside [0, %d)", (int)tokens[t], (int)h->n_vocab);
            return SD_ERR_RANGE;
        }
    if (h->target_model) return sd_model_embed_host(h->target_model, tokens, n, h->x_emb);
    for (int32_t t = 0; t < n; t++) sd_eagle_mat_row(&h->embed, tokens[t], h->H, h->x_emb + (size_t)t * (size_t)h->H);
    return SD_OK;
}

sd_status sd_eagle_head_forward(sd_eagle_head *h, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                const float *g, const bool *want, float *logits, float *hidden_out) {
    return sd_eagle_head_forward_tree(h, seq, pos0, n, tokens, g, NULL, want, logits, hidden_out);
}

sd_status sd_eagle_head_forward_tree(sd_eagle_head *h, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                     const float *g, const sd_eagle_tree_rows *tr, const bool *want, float *logits,
                                     float *hidden_out) {
    if (!h || !tokens || !g || !logits || n < 1 || seq < 0 || seq >= h->params.max_seqs) return SD_ERR_INVALID_ARG;
    for (int32_t t = 0; tr && t < n; t++) /* a tree row reads rows below it in the cache, or itself */
        for (int32_t p = tr->base; p <= tr->pos[t]; p++) {
            int32_t at = tr->path[tr->path_off[t] + p - tr->base];
            if (tr->base < 0 || tr->base > pos0 || at < tr->base || at > pos0 + t || (p == tr->pos[t]) != (at == pos0 + t)) {
                SD_ERROR("eagle: tree row %d reads cache row %d for its position %d (base %d, rows %d..)", (int)t,
                         (int)at, (int)p, (int)tr->base, (int)pos0);
                return SD_ERR_INVALID_ARG;
            }
        }
    if (pos0 != h->len[seq] || pos0 + n > h->params.max_ctx) {
        SD_ERROR("eagle: rows at %d..%d of slot %d, which holds %d of at most %d", (int)pos0, (int)(pos0 + n - 1),
                 (int)seq, (int)h->len[seq], (int)h->params.max_ctx);
        return SD_ERR_RANGE;
    }
    SD_TRY(reserve(h, n));
    const int32_t H = h->H, QD = h->n_heads * h->head_dim, KD = h->n_kv_heads * h->head_dim, F = h->n_ff;
    const size_t nH = (size_t)n * (size_t)H;
    SD_TRY(embed_rows(h, tokens, n)); /* x_emb [n][H] */
    /* x_in [n][2H] = [input_layernorm(e) ; hidden_norm(g)]; h1 = the residual */
    rmsnorm_rows(h->x_emb, h->input_norm, n, H, h->rms_eps, h->x_in, 2 * (size_t)H);
    rmsnorm_rows(g, h->hidden_norm, n, H, h->rms_eps, h->x_in + H, 2 * (size_t)H);
    if (h->norm_before_residual)
        for (int32_t t = 0; t < n; t++)
            memcpy(h->h1 + (size_t)t * (size_t)H, h->x_in + (size_t)t * 2 * (size_t)H + H, (size_t)H * sizeof(float));
    else
        memcpy(h->h1, g, nH * sizeof(float));
    SD_TRY(mm(h, &h->wqkv, 2 * H, QD + 2 * KD, h->x_in, n, h->qkv)); /* qkv [n][nh*hd + 2 nkv*hd] */
    /* q [n][nh*hd], k and v [n][nkv*hd] */
    for (int32_t t = 0; t < n; t++) {
        const float *r = h->qkv + (size_t)t * (size_t)(QD + 2 * KD);
        memcpy(h->q + (size_t)t * (size_t)QD, r, (size_t)QD * sizeof(float));
        memcpy(h->k + (size_t)t * (size_t)KD, r + QD, (size_t)KD * sizeof(float));
        memcpy(h->v + (size_t)t * (size_t)KD, r + QD + KD, (size_t)KD * sizeof(float));
    }
    rope_rows(h, h->q, n, h->n_heads, pos0, tr);
    rope_rows(h, h->k, n, h->n_kv_heads, pos0, tr);
    const size_t slot_off = ((size_t)seq * (size_t)h->params.max_ctx + (size_t)pos0) * (size_t)KD;
    memcpy(h->k_cache + slot_off, h->k, (size_t)n * (size_t)KD * sizeof(float));
    memcpy(h->v_cache + slot_off, h->v, (size_t)n * (size_t)KD * sizeof(float));
    h->len[seq] = pos0 + n;
    attend(h, seq, pos0, n, tr);                                             /* att [n][nh*hd] */
    SD_TRY(mm(h, &h->wo, QD, H, h->att, n, h->xn));                        /* xn [n][H] */
    for (size_t i = 0; i < nH; i++) h->h1[i] += h->xn[i];                  /* h1: after attention */
    rmsnorm_rows(h->h1, h->post_norm, n, H, h->rms_eps, h->xn, (size_t)H); /* xn: post_attention_layernorm */
    /* gu [n][2F]: gate, up */
    SD_TRY(mm(h, &h->w_gu, H, 2 * F, h->xn, n, h->gu));
    for (int32_t t = 0; t < n; t++) {
        const float *gt = h->gu + (size_t)t * 2 * (size_t)F, *up = gt + F;
        float *o = h->gate + (size_t)t * (size_t)F;
        for (int32_t i = 0; i < F; i++) o[i] = gt[i] / (1.0f + expf(-gt[i])) * up[i];
    }
    SD_TRY(mm(h, &h->w_down, F, H, h->gate, n, h->h2));   /* h2 [n][H] */
    for (size_t i = 0; i < nH; i++) h->h2[i] += h->h1[i]; /* the pre-norm output */
    if (hidden_out) memcpy(hidden_out, h->h2, nH * sizeof(float));
    /* the wanted rows, normed, packed into xn, then the LM head */
    int32_t n_wanted = 0;
    for (int32_t t = 0; t < n; t++) {
        if (want ? !want[t] : t != n - 1) continue;
        rmsnorm_rows(h->h2 + (size_t)t * (size_t)H, h->final_norm, 1, H, h->rms_eps,
                     h->xn + (size_t)n_wanted * (size_t)H, (size_t)H);
        n_wanted++;
    }
    return mm(h, &h->lm_head, H, h->draft_vocab, h->xn, n_wanted, logits);
}
