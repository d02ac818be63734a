/* model_config.h — a model's hyper-parameters, read from a file: Llama and
 * the architectures that differ from it in a few named ways (Qwen2, Qwen3,
 * Gemma 3, Phi-3; sd_model_arch), each difference a field below.
 *
 * The config is what every layer above needs to know about a model before
 * (or without) loading its weights: the coordinator sizes prompts with it,
 * a worker reports its identity from it, the loader shapes tensors by it.
 * It is read from GGUF metadata here (sd_model_config_from_gguf) and from a
 * Hugging Face config.json by the weights source (weights_hf.c); both end in
 * the same checks (sd_model_config_rope_scaling for RoPE scaling). */
#ifndef SPECD_MODEL_CONFIG_H
#define SPECD_MODEL_CONFIG_H

#include "specd/common.h"
#include "specd/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sanity bounds on hyper-parameters (far above any real Llama). */
enum {
    SD_MODEL_MAX_EMBD = 1 << 16,
    SD_MODEL_MAX_LAYERS = 1024,
    SD_MODEL_MAX_FF = 1 << 20,
    SD_MODEL_MAX_HEADS = 1024,
    SD_MODEL_MAX_HEAD_DIM = 1024,
    SD_MODEL_MAX_VOCAB = 1 << 24,
    SD_MODEL_MAX_CTX = 1 << 30, /* context length, in tokens */
};

/* The architectures the engine runs (GGUF general.architecture). */
typedef enum sd_model_arch {
    SD_ARCH_LLAMA = 0, /* "llama" (also Mistral: llama with a sliding window) */
    SD_ARCH_QWEN2,     /* "qwen2": Q/K/V biases, NeoX RoPE */
    SD_ARCH_QWEN3,     /* "qwen3": per-head q/k RMSNorm, NeoX RoPE */
    SD_ARCH_GEMMA3,    /* "gemma3": see the fields below */
    SD_ARCH_PHI3,      /* "phi3": fused QKV and gate/up matrices, NeoX RoPE, LongRoPE in the 128k models */
} sd_model_arch;

/* The architectures' names, comma-separated, for messages. */
#define SD_MODEL_ARCHS "llama, qwen2, qwen3, gemma3, phi3"

/* Hyper-parameters read from <arch>.* metadata (the keys below name the
 * llama.* ones; every architecture has the same under its own prefix). */
typedef struct sd_model_config {
    char arch[32]; /* "llama", "qwen2", "qwen3", "gemma3", "phi3" */
    sd_model_arch arch_id;
    int32_t n_vocab;
    int32_t n_ctx_train; /* llama.context_length */
    int32_t n_embd;      /* llama.embedding_length */
    int32_t n_layers;    /* llama.block_count */
    int32_t n_ff;        /* llama.feed_forward_length */
    int32_t n_heads;     /* llama.attention.head_count */
    int32_t n_kv_heads;  /* llama.attention.head_count_kv (defaults to n_heads) */
    int32_t head_dim;    /* n_embd / n_heads (llama.rope.dimension_count when present) */
    float rms_eps;       /* llama.attention.layer_norm_rms_epsilon */
    float rope_base;     /* llama.rope.freq_base (default 10000) */
    /* rope scaling (llama.rope.scaling.*): SD_ROPE_NONE, _LINEAR, _LLAMA3, _LONGROPE */
    int32_t rope_scaling_type;
    float rope_scale_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int32_t rope_orig_ctx; /* llama3: the context the scaling was fitted to; LongRoPE: the original context
                            * (rope.scaling.original_context_length, default n_ctx_train), which picks the factors */
    /* LongRoPE (phi3 128k: GGUF rope_factors_long / rope_factors_short, HF rope_scaling long_factor /
     * short_factor): per-frequency divisors of the inverse frequencies, head_dim/2 of each, finite and
     * positive; sd_model_rope_factors says which set a model uses. rope_attn_factor multiplies RoPE's cos
     * and sin (llama.cpp's attn_factor), so the scores by its square: attn_scale includes that square. */
    float rope_attn_factor; /* 1 without LongRoPE */
    float rope_factors_long[SD_MODEL_MAX_HEAD_DIM / 2];
    float rope_factors_short[SD_MODEL_MAX_HEAD_DIM / 2];
    bool tied_output; /* output.weight absent: LM head = token_embd */
    /* what an architecture adds over Llama (all off for llama) */
    bool qkv_bias;     /* blk.N.attn_{q,k,v}.bias added after the projections (qwen2) */
    bool qk_norm;      /* blk.N.attn_{q,k}_norm.weight [head_dim]: RMSNorm of each head before RoPE */
    bool post_norms;   /* blk.N.post_attention_norm / post_ffw_norm on each branch before its residual add */
    bool rope_neox;    /* RoPE rotates (x[i], x[i + head_dim/2]), not adjacent pairs */
    bool gelu;         /* GeGLU (tanh gelu) instead of SwiGLU */
    bool fused_qkv;    /* blk.N.attn_qkv.weight [n_embd, q + 2 kv rows]: Q, K, V stacked by rows (phi3) */
    bool fused_gate_up; /* blk.N.ffn_up.weight [n_embd, 2 n_ff]: the gate's rows, then the up's (phi3) */
    float embd_scale;  /* embeddings multiplied by this (gemma3: sqrt(n_embd)); 1 otherwise */
    float attn_scale;  /* the scores' scale: 1/sqrt(head_dim), gemma3 1/sqrt(query_pre_attn_scalar);
                        * times rope_attn_factor^2 (LongRoPE) */
    int32_t sliding_window; /* <arch>.attention.sliding_window; 0: every layer attends to all positions */
    int32_t swa_pattern;    /* with a window: layer l is global when l % swa_pattern == swa_pattern - 1
                             * (gemma3: 6); 0: every layer is windowed (Mistral) */
    float rope_base_swa;    /* RoPE base of the windowed layers (gemma3: 10000, no scaling); rope_base otherwise */
} sd_model_config;

/* rope_scaling_type's values. */
enum { SD_ROPE_NONE = 0, SD_ROPE_LINEAR = 1, SD_ROPE_LLAMA3 = 2, SD_ROPE_LONGROPE = 3 };

/* LongRoPE's factors for a model whose sequences hold at most max_ctx
 * tokens (0: the model's context length, n_ctx_train): the long ones when
 * that context is larger than the original context (rope_orig_ctx), else
 * the short ones; NULL without LongRoPE. llama.cpp's rule, with its
 * per-sequence context (n_ctx / n_seq_max) in max_ctx's place. */
static inline const float *sd_model_rope_factors(const sd_model_config *c, int32_t max_ctx) {
    if (c->rope_scaling_type != SD_ROPE_LONGROPE) return NULL;
    int32_t ctx = max_ctx > 0 ? max_ctx : c->n_ctx_train;
    return ctx > c->rope_orig_ctx ? c->rope_factors_long : c->rope_factors_short;
}

/* Whether layer l of c attends through the sliding window. */
static inline bool sd_model_layer_swa(const sd_model_config *c, int32_t l) {
    return c->sliding_window > 0 && (c->swa_pattern == 0 || l % c->swa_pattern != c->swa_pattern - 1);
}

/* Reads the config of g (validating every value: positive, divisible, sane
 * bounds, every tensor the architecture needs present with its shape);
 * SD_ERR_UNSUPPORTED for an architecture not in SD_MODEL_ARCHS (named in
 * the message with that list). */
sd_status sd_model_config_from_gguf(const sd_gguf *g, sd_model_config *cfg);

/* One tensor a model reads: its GGUF name, and its shape as GGUF says it
 * (ne0 the row length; ne1 the rows, 0 for a 1-D tensor). */
typedef struct sd_model_tensor {
    char name[64];
    uint32_t n_dims; /* 1 or 2 */
    uint64_t ne0, ne1;
} sd_model_tensor;

typedef sd_status (*sd_model_tensor_fn)(const sd_model_tensor *t, void *ctx);

/* The one list of the tensors a model of config c needs (llama's, less
 * output.weight when tied, with what c's architecture adds or fuses):
 * calls visit on each in a fixed order and returns the first status other
 * than SD_OK that visit returns. Each file format checks its tensors by it. */
sd_status sd_model_config_tensors(const sd_model_config *c, sd_model_tensor_fn visit, void *ctx);

/* The numbers of RoPE scaling, named apart from how a format spells them. */
typedef enum sd_rope_key {
    SD_ROPE_FACTOR,
    SD_ROPE_LOW_FREQ_FACTOR,
    SD_ROPE_HIGH_FREQ_FACTOR,
    SD_ROPE_ORIG_CTX,    /* the context the scaling was fitted to, in tokens */
    SD_ROPE_ATTN_FACTOR, /* LongRoPE's cos / sin multiplier (GGUF: 1 when absent; HF: computed) */
} sd_rope_key;

/* Where a model file keeps its RoPE scaling: GGUF's llama.rope.scaling.*
 * keys or config.json's rope_scaling object. type() writes the scaling type
 * (SD_ERR_NOT_FOUND: no scaling); number() reads one value, which must be
 * positive and finite, and SD_ROPE_ORIG_CTX an integer in 1..2^30
 * (SD_ERR_NOT_FOUND when absent); both log a malformed
 * value and return SD_ERR_FORMAT. */
typedef struct sd_rope_source {
    const char *where;     /* for messages: "model", "weights: config.json" */
    const char *type_none; /* the type name meaning no scaling: "none" (GGUF), "default" (HF) */
    sd_status (*type)(const void *src, char *out, size_t n);
    sd_status (*number)(const void *src, sd_rope_key key, double *out);
    /* LongRoPE's factors (long_set: the long ones, else the short ones): n
     * values into out, each checked finite and positive and the count n;
     * SD_ERR_NOT_FOUND when absent, SD_ERR_FORMAT (logged, naming the
     * tensor or key) when malformed. */
    sd_status (*factors)(const void *src, bool long_set, int32_t n, float *out);
    const void *src;
} sd_rope_source;

/* The one RoPE scaling reader: sets c's rope_scaling_* fields from src
 * (none, linear, llama3 with its defaults for what is absent, or LongRoPE:
 * "longrope" / "su", phi3 only, both factor sets required, the original
 * context defaulting to c->n_ctx_train, which must be set), or
 * SD_ERR_UNSUPPORTED for another type, SD_ERR_FORMAT for a missing factor or
 * inconsistent values, each logged. c->arch_id and c->head_dim must be set. */
sd_status sd_model_config_rope_scaling(const sd_rope_source *src, sd_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
