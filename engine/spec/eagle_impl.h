/* eagle_impl.h — the EAGLE-3 head's internals, shared by eagle_load.c (the
 * format: config, tensors, refusals) and eagle_head.c (the forward). */
#ifndef SPECD_EAGLE_IMPL_H
#define SPECD_EAGLE_IMPL_H

#include "specd/eagle.h"
#include "specd/host_ops.h"

/* A matrix [n_out][n_in]: F32, F16 or BF16 as stored (the CPU backend's
 * stored matmul reads the half types as they are), or Q8_0 quantized at
 * load (sd_eagle_params.weights). */
typedef struct eagle_mat {
    sd_dtype type;
    void *w;
} eagle_mat;

struct sd_eagle_head {
    /* shape */
    int32_t H, Ht; /* the head's hidden size, the target's */
    int32_t n_heads, n_kv_heads, head_dim, n_ff;
    int32_t n_vocab;     /* the target's vocabulary (embedding rows) */
    int32_t draft_vocab; /* lm_head rows */
    float rms_eps;
    bool norm_before_residual;         /* speculators: the residual is hidden_norm(g), not g */
    int32_t layer_ids[SD_EAGLE_N_AUX]; /* capture ids (output of target layer id) */
    float *inv_freq;                   /* [head_dim/2] RoPE frequencies, scaling applied */
    /* weights on the host: norms f32, matrices as sd_eagle_params.weights
     * says (eagle_load.c: pack_matrices); q/k/v and gate/up stacked into one
     * matrix each, one matmul a row instead of three and two */
    float *hidden_norm, *input_norm, *post_norm, *final_norm; /* [H] */
    eagle_mat fc;                                             /* [H][3 Ht] */
    eagle_mat wqkv;                                           /* [nh*hd + 2 nkv*hd][2H]: q rows, k rows, v rows */
    eagle_mat wo;                                             /* [H][nh*hd] */
    eagle_mat w_gu;                                           /* [2F][H]: gate rows, then up rows */
    eagle_mat w_down;                                         /* [H][F] */
    eagle_mat lm_head;                                        /* [Vd][H] */
    eagle_mat embed;                                          /* [V][H], or w NULL: the target's (target_model) */
    int32_t *d2t;                                             /* [Vd] target id of each draft id (offsets applied) */
    const sd_model *target_model;                             /* borrowed, for the embedding */
    /* per slot caches */
    sd_eagle_params params;
    float *k_cache, *v_cache; /* [max_seqs][max_ctx][nkv*hd] */
    int32_t *len;             /* [max_seqs] entries held */
    /* scratch, grown to the largest call */
    int32_t cap_rows;
    float *x_emb, *x_in, *qkv, *q, *k, *v, *att, *h1, *xn, *gu, *gate, *h2, *scores;
    sd_host_ops *ops;
};

/* out[n] = row i of m (n elements) as f32. */
void sd_eagle_mat_row(const eagle_mat *m, int64_t i, int32_t n, float *out);

/* Builds inv_freq for the head's RoPE (eagle_head.c). */
sd_status sd_eagle_rope_init(sd_eagle_head *h, double theta, int32_t scaling, double factor, double low, double high,
                             double orig_ctx);

#endif
