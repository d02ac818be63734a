/* weights_hf_impl.h — what the Hugging Face checkpoint source (weights_hf.c)
 * takes from config.json (weights_hf_config.c). */
#ifndef SPECD_WEIGHTS_HF_IMPL_H
#define SPECD_WEIGHTS_HF_IMPL_H

#include <cjson/cJSON.h>

#include "specd/model_config.h"

/* The config.json classes the source reads, for messages. */
#define SD_HF_ARCHS                                                                                                   \
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, "                     \
    "Gemma3ForConditionalGeneration (its text model), Phi3ForCausalLM"

typedef struct sd_hf_meta {
    sd_model_config cfg;
    const char *class_name;                 /* static: "Qwen2ForCausalLM", ... */
    int64_t bos_id, eos_id, eot_id, pad_id; /* config.json; -1 when absent */
    bool text_of_multimodal; /* Gemma3ForConditionalGeneration: the text model's tensors carry a
                                prefix (weights_hf.c finds which) and the vision tower is not read */
} sd_hf_meta;

/* Reads config.json (parsed) into out: the architecture from architectures
 * (or model_type), every value checked with the GGUF reader's bounds.
 * SD_ERR_UNSUPPORTED names what is not supported (an unknown class along
 * with SD_HF_ARCHS), SD_ERR_FORMAT a malformed value; both logged. */
sd_status sd_hf_config_parse(const cJSON *j, sd_hf_meta *out);

#endif
