/* mkmodel_hf.h — writes a GGUF of any architecture the engine reads as a
 * Hugging Face checkpoint directory
 * (specd-mkmodel --format hf, --convert). */
#ifndef SPECD_MKMODEL_HF_H
#define SPECD_MKMODEL_HF_H

#include <cjson/cJSON.h>

#include "specd/gguf.h"

typedef struct mk_hf_params {
    const char *dir;   /* created when missing */
    uint32_t n_shards; /* 1: model.safetensors; N > 1: N shards and model.safetensors.index.json */
    bool force_dtype;  /* store every tensor as dtype (f32, f16, bf16) */
    sd_dtype dtype;
} mk_hf_params;

/* Writes g into p->dir: config.json of its family's class, the safetensors
 * file(s) with HF tensor names and values (llama q/k rows in rotate-half
 * order, Gemma norms as w),
 * tokenizer.json and tokenizer_config.json (from tokenizer.ggml.*). F32, F16
 * and BF16 tensors keep their bytes; quantized ones are dequantized to F32
 * (or p->dtype). Messages go to stderr. */
sd_status mk_write_hf(const sd_gguf *g, const mk_hf_params *p);

/* Appends to merges (a cJSON array) the [left, right] merges of g's
 * SentencePiece vocabulary (tokenizer.ggml.model "llama": pieces and
 * scores), derived as transformers' converter derives them
 * (mkmodel_hf_spm.c). */
sd_status mk_spm_merges(const sd_gguf *g, uint64_t n_tokens, cJSON *merges);

/* LongRoPE (mkmodel_rope.c): the attention factor llama.cpp's converter
 * and transformers derive for a context of ctx over the original orig
 * (sqrt(1 + ln(ctx / orig) / ln orig), 1 when ctx <= orig); and writes
 * <arch>.rope.scaling.attn_factor (that value) and .original_context_length
 * (orig), and random factor tensors rope_factors_long / rope_factors_short
 * of head_dim / 2 floats (1 at the highest frequency, up to 3 and 1.5). */
double mk_longrope_attn_factor(uint32_t ctx, uint32_t orig);
sd_status mk_write_longrope(sd_gguf_writer *w, const char *arch, uint32_t head_dim, uint32_t ctx, uint32_t orig,
                            uint64_t seed);

#endif
