/* mkmodel_hf.h — writes a llama GGUF as a Hugging Face checkpoint directory
 * (specd-mkmodel --format hf, --convert). */
#ifndef SPECD_MKMODEL_HF_H
#define SPECD_MKMODEL_HF_H

#include "specd/gguf.h"

typedef struct mk_hf_params {
    const char *dir;   /* created when missing */
    uint32_t n_shards; /* 1: model.safetensors; N > 1: N shards and model.safetensors.index.json */
    bool force_dtype;  /* store every tensor as dtype (f32, f16, bf16) */
    sd_dtype dtype;
} mk_hf_params;

/* Writes g (llama architecture) into p->dir: config.json, the safetensors
 * file(s) with HF tensor names and q/k rows in rotate-half order,
 * tokenizer.json and tokenizer_config.json (from tokenizer.ggml.*). F32, F16
 * and BF16 tensors keep their bytes; quantized ones are dequantized to F32
 * (or p->dtype). Messages go to stderr. */
sd_status mk_write_hf(const sd_gguf *g, const mk_hf_params *p);

#endif
