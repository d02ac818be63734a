/* model_impl.h — the model's internals, shared by model_load.c (loading,
 * tensor-parallel sharding, views, KV pools) and model_forward.c (the ragged
 * forward pass and the replay of plans on other ranks). Nothing outside
 * those two files includes it. */
#ifndef SPECD_MODEL_IMPL_H
#define SPECD_MODEL_IMPL_H

#include "specd/model.h"
#include "specd/weights.h"
#include "backend_impl.h"

/* A weight matrix [n_out][n_in] as matmul reads it. type F32: w is what
 * ops->matmul takes (f32, or the backend's weight_upload format); any other
 * type: w holds the rows as the file stores them (n_in / block elements'
 * blocks each), for ops->matmul_stored. */
typedef struct sd_mat {
    void *w;
    sd_dtype type;
    bool mapped; /* w points into the model file's mapping (m->maps): not freed */
} sd_mat;

#define SD_MODEL_MAX_MAPS 8 /* file mappings one model points into (one per GGUF file) */

/* Per rank (tp_size 1: the whole model): H, KV, F = this rank's heads, KV
 * heads and MLP columns. */
typedef struct layer_weights {
    float *attn_norm; /* [n_embd] */
    sd_mat wq;        /* [H*head_dim][n_embd]   rows of this rank's heads */
    sd_mat wk;        /* [KV*head_dim][n_embd] */
    sd_mat wv;        /* [KV*head_dim][n_embd] */
    sd_mat wo;        /* [n_embd][H*head_dim]   columns of this rank's heads */
    float *ffn_norm;  /* [n_embd] */
    sd_mat w_gate;    /* [F][n_embd] */
    sd_mat w_up;      /* [F][n_embd] */
    sd_mat w_down;    /* [n_embd][F]            columns of this rank's MLP slice */
    /* what an architecture adds (NULL when it does not; model_config.h) */
    float *bq, *bk, *bv;          /* qkv_bias: [H*head_dim], [KV*head_dim] x 2, this rank's heads */
    float *q_norm, *k_norm;       /* qk_norm: [head_dim] */
    float *post_attn_norm;        /* post_norms: [n_embd] */
    float *post_ffn_norm;         /* post_norms: [n_embd] */
    uint64_t bytes;   /* what a step streams of this layer (matrices as held, norms) */
} layer_weights;

/* Per-call activations, grown to the largest batch seen. */
typedef struct activations {
    int32_t cap_tokens;
    float *x;         /* [n_tokens][n_embd] residual stream */
    float *xb;        /* [n_tokens][n_embd] normed input / branch output */
    float *q;         /* [n_tokens][n_heads*head_dim] */
    float *k;         /* [n_tokens][n_kv_heads*head_dim] */
    float *v;         /* [n_tokens][n_kv_heads*head_dim] */
    float *att;       /* [n_tokens][n_heads*head_dim] */
    float *gate;      /* [n_tokens][n_ff] */
    float *up;        /* [n_tokens][n_ff] */
    float *logits;    /* [cap_logit_rows][n_vocab], only for backends without host memory (leader): sized
                       * by the wanted rows, not the tokens (a 512-token prefill of a 262k vocabulary
                       * wants 1 row, not 512 MiB) */
    int32_t cap_logit_rows;
    float *head_part; /* [n_tokens][n_vocab_l] split LM head: this rank's logits columns */
    float *head_all;  /* [tp][n_tokens][n_vocab_l] split LM head, leader: every rank's part */
} activations;

/* Host-side bookkeeping for one call, grown as needed. */
typedef struct batch_plan {
    int32_t cap_seqs;
    int32_t *seq_start; /* [max_seqs] length at call start, -1 = not in batch */
    int32_t *seq_next;  /* [max_seqs] next expected position */
    int32_t *seq_bt;    /* [max_seqs] offset of the seq's table in bt */
    int32_t *seq_order; /* [max_seqs] distinct seqs in order of first appearance */
    int32_t cap_tokens;
    int32_t *bt_off; /* [n_tokens] */
    int32_t *wanted; /* [n_tokens] rows whose logits are wanted */
    size_t cap_bt;
    int32_t *bt;     /* flat block tables of the batch's sequences */
    int32_t *bt_win; /* [cap_bt] their window-group tables at the same offsets (a cache with a window group) */
    int32_t cap_head;
    int32_t *head_ids; /* [n_wanted * tp] row of head_all for each row of the logits viewed as [.][n_vocab_l] */
} batch_plan;

/* The opt-in feature capture (sd_model_capture_set; model_capture.c). */
typedef struct model_capture {
    int32_t n_layers;
    int32_t layer_ids[SD_MODEL_CAPTURE_MAX];
    bool final;
    int32_t n_rows; /* rows captured by the last forward */
    int32_t cap_rows;
    float *aux;      /* [cap_rows][n_layers][n_embd] host */
    float *final_x;  /* [cap_rows][n_embd] host, when final */
    float *download; /* [cap_rows][n_embd] host copy of the residual stream (device backends) */
    float *norm_w;   /* [n_embd] host copy of the final norm's weight */
} model_capture;

struct sd_model {
    sd_model_config cfg;
    sd_model_params params;
    int32_t n_layers_used;
    sd_backend_handle be;
    sd_mat tok_embd;        /* [n_vocab][n_embd]; stored (not F32) only on a host-memory backend with
                         * matmul_stored: looked-up rows are then dequantized on the host */
    float *output_norm;     /* [n_embd] */
    sd_mat output;          /* [n_vocab_l][n_embd] this rank's LM head rows; rows of tok_embd when tied */
    float *inv_freq;        /* [head_dim/2] rope frequencies, scaling applied */
    float *inv_freq_swa;    /* [head_dim/2] the windowed layers' (rope_base_swa, no scaling); NULL without a window */
    layer_weights *layers;  /* [n_layers_used] */
    const sd_model *parent; /* non-NULL for a view: every weight above is borrowed from it */
    bool host_verify;       /* --host-verify: verification on the host even on a device */
    bool f32_matrices;      /* --cpu-weights f32: every matrix read as f32 (see model_load.c) */
    bool copy_matrices;     /* --cpu-weights copy: stored matrices copied, not mapped (see model_load.c) */
    sd_file_map *maps[SD_MODEL_MAX_MAPS]; /* mappings the matrices point into, one reference each */
    int n_maps;
    uint64_t mapped_bytes; /* of weight_bytes, those read from the file mapping in place */
    uint64_t weight_bytes;
    uint64_t resident_bytes;
    activations act;
    batch_plan plan;
    /* tensor parallelism (see the file comment); tp_size 1: the whole model */
    sd_model_shard shard;
    bool output_borrowed; /* output points into tok_embd (tied head, host memory) */
    sd_coll *coll;        /* borrowed; NULL: no collectives */
    bool coll_on_stream;  /* coll enqueues on the backend's stream: wait with sd_coll_wait */
    sd_model_plan_fn plan_sink;
    void *plan_user;
    sd_model_tp_stats tp_stats;
    model_capture *capture; /* NULL: no capture (the default, no cost) */
    /* Set only during sd_model_forward_tree (model_tree.c): the batch's pos
     * are then storage positions (where each node's K/V row goes) and
     * these the logical ones (RoPE, attention), with the nodes' paths. */
    const int32_t *tree_pos;
    const sd_attn_tree *tree;
};

/* Called by forward_layers after layer l ran over n rows: copies the rows
 * out when l is captured. */
sd_status sd_model_capture_layer(sd_model *m, int32_t l, int32_t n);
void sd_model_capture_free(sd_model *m);

/* Frees the activation buffers (they are grown again on the next forward). */
void sd_model_free_activations(sd_model *m);

/* y = w x for a matrix as the model holds it (model_forward.c). */
sd_status sd_model_mat_mul(sd_model *m, const sd_mat *w, int32_t n_in, int32_t n_out, const float *x, int32_t n,
                           float *y);
/* Sums a partial residual update over the group, nothing without one (model_forward.c). */
sd_status sd_model_tp_all_reduce(sd_model *m, float *buf, size_t n);

/* Layer l of an architecture other than plain Llama on the plan's tokens,
 * op by op (model_arch.c): the residual stream m->act.x in, updated in place. */
sd_status sd_model_layer_arch(sd_model *m, sd_kv *kv, const sd_model_plan *b, int32_t l);

/* model_window.c: the sliding window's part of the forward and the cache. */
/* Whether b must run in chunks on kv (a window group, a long batch). */
bool sd_model_window_chunked(const sd_kv *kv, const sd_batch *b);
typedef sd_status (*sd_model_chunk_fn)(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out,
                                       bool keep);
/* Runs b in chunks through fn (model_forward.c's forward), out's rows
 * following the wanted rows; with keep the rows from the first wanted one
 * on go in one last call (their logits stay in the activations). */
sd_status sd_model_forward_chunks(sd_model *m, sd_kv *kv, const sd_batch *b, int32_t n_head, float *out, bool keep,
                                  sd_model_chunk_fn fn);
/* Sets p's window group for m's sliding window (nothing without one):
 * window_blocks < 0 sizes its pools from p (model_window.c), > 0 takes that
 * many (a TP rank: the leader's), 0 makes none. */
void sd_model_window_params(const sd_model *m, sd_kv_params *p, bool *windowed, int32_t window_blocks);
/* A rank's check of a plan's window table against kv (model_window.c);
 * SD_ERR_RANGE with a log line. Runs after check_plan's. */
sd_status sd_model_window_check_plan(const sd_kv *kv, const sd_model_plan *p);
/* Whether layer l needs the general path (an architecture's additions or
 * a sliding window) rather than Llama's (model_arch.c). */
bool sd_model_layer_is_arch(const sd_model *m, int32_t l);
/* Refuses, naming it, an op the model's architecture needs that the backend lacks (model_arch.c). */
sd_status sd_model_arch_check_ops(const sd_model *m);
/* Loads and frees layer l's additional tensors (model_arch.c); load_norm
 * reads a replicated 1-D tensor, load_part a slice [col0, col0 + n) of one. */
typedef sd_status (*sd_model_vec_loader)(sd_model *m, const sd_weights *w, const char *name, int64_t n, int64_t col0,
                                         int64_t n_cols, float **out);
sd_status sd_model_load_arch_layer(sd_model *m, const sd_weights *w, int32_t l, sd_model_vec_loader load);
/* Computes and uploads m->inv_freq (and m->inv_freq_swa for windowed layers
 * with a base of their own), with rope_freqs.weight's divisors from w when
 * it has them (checked: head_dim/2 of them, positive), or LongRoPE's set
 * for m->params.max_ctx (sd_model_rope_factors; model_rope.c). */
sd_status sd_model_load_freqs(sd_model *m, const sd_weights *w);
void sd_model_free_arch_layer(sd_model *m, layer_weights *L);

#endif
