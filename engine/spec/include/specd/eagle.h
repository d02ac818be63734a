/* eagle.h — EAGLE-3 draft heads: one decoder layer that reads the target's
 * own hidden states and drafts the next tokens (eagle_head.c: the format
 * and the forward; drafter_eagle.c: the drafter kind).
 *
 * A head is a Hugging Face directory (config.json + model.safetensors, F32 /
 * F16 / BF16) in one of two layouts:
 *   - published EAGLE-3 (SafeAILab, SGLang): architectures
 *     ["LlamaForCausalLMEagle3"], the layer's tensors under "midlayer.";
 *     eagle_config.eagle_aux_hidden_state_layer_ids id j = the output of
 *     target layer j (SGLang captures before layer j + 1);
 *   - speculators "eagle3" (vLLM): speculators_model_type "eagle3", the
 *     layer's settings in transformer_layer_config and its tensors under
 *     "layers.0."; eagle_aux_hidden_state_layer_ids id j = the input of
 *     layer j, i.e. the output of layer j - 1 (vLLM captures before layer j);
 *     norm_before_residual honoured.
 * Without ids the EAGLE-3 default: the inputs of target layers 2, L/2 and
 * L - 3 (outputs of 1, L/2 - 1, L - 4), as SafeAILab's and both servers'.
 * Tensors (H the head's hidden size, Ht the target's, Vd the draft vocabulary):
 *   fc.weight [H][3 Ht]; midlayer.hidden_norm / input_layernorm /
 *   post_attention_layernorm .weight [H]; midlayer.self_attn.q_proj [nh*hd][2H],
 *   k_proj / v_proj [nkv*hd][2H], o_proj [H][nh*hd]; midlayer.mlp.gate_proj /
 *   up_proj [F][H], down_proj [H][F]; norm.weight [H]; lm_head.weight [Vd][H];
 *   d2t I64 [Vd] (target id = draft id + d2t[draft id]); t2d BOOL [V]
 *   (optional, unused); embed_tokens.weight [V][H] optional (else the
 *   target's embedding, which needs H == Ht). */
#ifndef SPECD_EAGLE_H
#define SPECD_EAGLE_H

#include "specd/common.h"
#include "specd/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_EAGLE_N_AUX 3 /* target layers fc reads */

/* The EAGLE-3 default for a target of n_layers layers, as capture ids
 * (outputs of layers 1, L/2 - 1, L - 4, floored at 0) into ids[3]. */
void sd_eagle_default_layers(int32_t n_layers, int32_t *ids);

typedef struct sd_eagle_head sd_eagle_head;

/* What a head is checked against: the target's shape, and the model whose
 * embedding a head without one borrows (may be NULL when the head has its
 * own). */
typedef struct sd_eagle_target {
    int32_t hidden_size;
    int32_t n_vocab;
    int32_t n_layers;
    const sd_model *model; /* borrowed, must outlive the head */
} sd_eagle_target;

/* The target description of a loaded model. */
sd_eagle_target sd_eagle_target_of(const sd_model *m);

/* How the head keeps its matrices (fc, the layer's, the LM head; its own
 * embedding stays as stored). */
typedef enum sd_eagle_weights {
    SD_EAGLE_WEIGHTS_DEFAULT = 0, /* SD_EAGLE_WEIGHTS_Q8_0 */
    SD_EAGLE_WEIGHTS_Q8_0 = 1,    /* quantized to Q8_0 at load (blocks of 32, an f16 scale each; a matrix whose
                                     rows are not a multiple of 32 stays as stored): a bit over half the bytes of
                                     F16, on the CPU backend's integer dot kernels. The head's outputs move by
                                     about 1% of their range (tests/ref/test_eagle_head.py bounds it); drafts
                                     never change the output, only how many are accepted */
    SD_EAGLE_WEIGHTS_STORED = 2,  /* as the file stores them (F32 / F16 / BF16, read as they are) */
} sd_eagle_weights;

/* "q8_0" / "stored" into *out; false for any other name. */
bool sd_eagle_weights_parse(const char *name, sd_eagle_weights *out);
const char *sd_eagle_weights_name(sd_eagle_weights w);

typedef struct sd_eagle_params {
    int32_t max_seqs;         /* sequence slots (default 1) */
    int32_t max_ctx;          /* most positions a slot holds (default 4096) */
    int32_t n_threads;        /* the head's matmul workers, 0 = all cores */
    sd_eagle_weights weights; /* default (0): Q8_0 */
} sd_eagle_params;

sd_eagle_params sd_eagle_default_params(void);

/* Loads the head in dir for target t. Refusals (SD_ERR_FORMAT unless said,
 * each with its own log line): config.json or model.safetensors missing or
 * unreadable (SD_ERR_IO), an unknown layout, a tensor missing or
 * mis-shaped, a dtype other than F32/F16/BF16 (d2t: I64), a hidden size
 * that does not fit the target (SD_ERR_UNSUPPORTED), aux layer ids out of
 * the target's range (SD_ERR_RANGE), a vocabulary that differs from the
 * target's (SD_ERR_UNSUPPORTED), a d2t entry mapping outside it
 * (SD_ERR_RANGE). Caller frees with sd_eagle_head_free. */
sd_status sd_eagle_head_load(const char *dir, const sd_eagle_target *t, const sd_eagle_params *p, sd_eagle_head **out);
void sd_eagle_head_free(sd_eagle_head **h);

/* The target layers whose outputs (model.h's capture ids) fc reads, in
 * order: ids[SD_EAGLE_N_AUX]. */
void sd_eagle_head_layers(const sd_eagle_head *h, int32_t *ids);
int32_t sd_eagle_head_hidden(const sd_eagle_head *h);
int32_t sd_eagle_head_draft_vocab(const sd_eagle_head *h);
/* The target id of draft id i (i in [0, draft vocab)). */
int32_t sd_eagle_head_target_id(const sd_eagle_head *h, int32_t i);

/* fused[n][H] = fc(aux[n][3 Ht]): the target's features as the head's input. */
sd_status sd_eagle_head_fuse(sd_eagle_head *h, const float *aux, int32_t n, float *fused);

/* Runs n rows of slot seq at head positions pos0 .. pos0 + n - 1 (the
 * slot's cache must hold exactly pos0 entries: sd_eagle_head_truncate
 * first). Row i reads token ids tokens[i] (the token after the position
 * whose feature it is) and g[i][H] (a fused target feature or the head's own
 * previous output). Writes hidden_out[n][H] (the pre-norm output, the next
 * step's g; may be NULL) and, for the rows listed in want (NULL: the last
 * only), logits over the draft vocabulary to logits[n_wanted][Vd]. */
sd_status sd_eagle_head_forward(sd_eagle_head *h, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                const float *g, const bool *want, float *logits, float *hidden_out);

/* Tree rows (drafting a token tree): row t sits at logical position pos[t]
 * (RoPE's) and attends to the slot's cache rows below base in place, then
 * to logical positions base .. pos[t] at the cache rows path[path_off[t] +
 * p - base] (its ancestors' rows, then its own: pos0 + t). */
typedef struct sd_eagle_tree_rows {
    const int32_t *pos;      /* [n] */
    int32_t base;            /* <= pos0 */
    const int32_t *path_off; /* [n] */
    const int32_t *path;     /* rows in [base, pos0 + t] */
} sd_eagle_tree_rows;

/* sd_eagle_head_forward with tree rows (tr NULL: the plain rows). The rows
 * are still stored at pos0 .. pos0 + n - 1. A path outside its bounds is
 * SD_ERR_INVALID_ARG. */
sd_status sd_eagle_head_forward_tree(sd_eagle_head *h, int32_t seq, int32_t pos0, int32_t n, const int32_t *tokens,
                                     const float *g, const sd_eagle_tree_rows *tr, const bool *want, float *logits,
                                     float *hidden_out);

/* Entries the slot's cache holds; truncation to len <= that. */
int32_t sd_eagle_head_len(const sd_eagle_head *h, int32_t seq);
sd_status sd_eagle_head_truncate(sd_eagle_head *h, int32_t seq, int32_t len);

#ifdef __cplusplus
}
#endif
#endif
