/* weights_hf_config.c — a Hugging Face config.json as the engine's model
 * config, and the one table of HF tensor names.
 *
 * The architecture comes from config.json's "architectures" (the class
 * transformers would build), else from "model_type"; when both are there
 * they must agree. Each supported class fills the same sd_model_config the
 * GGUF reader fills (model_config.c), with the same meaning per field, so a
 * checkpoint and the GGUF that llama.cpp's converter makes of it run the
 * same forward pass:
 *   LlamaForCausalLM    llama; rotate-half q/k rows (un-permuted on read)
 *   MistralForCausalLM  llama with sliding_window on every layer
 *   Qwen2ForCausalLM    q/k/v biases, NeoX RoPE (q/k rows as stored)
 *   Qwen3ForCausalLM    per-head q_norm / k_norm, NeoX RoPE, free head_dim
 *   Gemma3ForCausalLM   see gemma3_features: GeGLU, four norms a layer
 *                       stored as w where the engine multiplies by 1 + w,
 *                       query_pre_attn_scalar, local / global layers
 *   Phi3ForCausalLM     fused qkv_proj and gate_up_proj, NeoX RoPE; like
 *                       the GGUF path, full attention; LongRoPE ("longrope"
 *                       / "su": long_factor, short_factor, attention_factor
 *                       or its transformers default) as the GGUF keys say it
 * Defaults for absent keys are each class's transformers defaults; the
 * bounds on values are the GGUF reader's (SD_MODEL_MAX_*, model_config.h).
 *   Gemma3ForConditionalGeneration  the multimodal 4B-27B checkpoints, as
 *                       text models: the Gemma3ForCausalLM read of their
 *                       text_config (Gemma3TextConfig's defaults for the
 *                       keys it leaves out, as transformers fills them),
 *                       the language model's tensors under their prefix
 *                       (weights_hf.c), the vision tower and projector
 *                       left unread: image inputs are not served. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "specd/weights.h"
#include "weights_hf_impl.h"

typedef struct hf_arch {
    const char *class_name; /* architectures[0] */
    const char *model_type;
    sd_model_arch id;
    bool window;         /* Mistral: llama with sliding_window */
    int32_t default_ctx; /* max_position_embeddings when absent */
    float default_eps;   /* rms_norm_eps when absent */
    float default_theta; /* rope_theta when absent */
    bool default_tied;   /* tie_word_embeddings when absent */
} hf_arch;

static const hf_arch ARCHS[] = {
    {"LlamaForCausalLM", "llama", SD_ARCH_LLAMA, false, 2048, 1e-6f, 10000.0f, false},
    {"MistralForCausalLM", "mistral", SD_ARCH_LLAMA, true, 4096 * 32, 1e-6f, 10000.0f, false},
    {"Qwen2ForCausalLM", "qwen2", SD_ARCH_QWEN2, false, 32768, 1e-6f, 10000.0f, false},
    {"Qwen3ForCausalLM", "qwen3", SD_ARCH_QWEN3, false, 32768, 1e-6f, 10000.0f, false},
    {"Gemma3ForCausalLM", "gemma3_text", SD_ARCH_GEMMA3, false, 131072, 1e-6f, 1000000.0f, true},
    {"Phi3ForCausalLM", "phi3", SD_ARCH_PHI3, false, 4096, 1e-5f, 10000.0f, false},
};

static const cJSON *field(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* An integer key in [1, max]; SD_ERR_NOT_FOUND when absent or null and not required. */
static sd_status get_int(const cJSON *cfg, const char *key, bool required, int64_t max, int32_t *out) {
    const cJSON *j = field(cfg, key);
    if (!j || cJSON_IsNull(j)) {
        if (!required) return SD_ERR_NOT_FOUND;
        SD_ERROR("weights: config.json lacks %s", key);
        return SD_ERR_FORMAT;
    }
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d >= 1.0) || d > (double)max || d != floor(d)) {
        SD_ERROR("weights: config.json %s must be an integer in 1..%lld", key, (long long)max);
        return SD_ERR_FORMAT;
    }
    *out = (int32_t)d;
    return SD_OK;
}

/* get_int with a default for an absent key. */
static sd_status get_int_or(const cJSON *cfg, const char *key, int64_t max, int32_t dflt, int32_t *out) {
    sd_status s = get_int(cfg, key, false, max, out);
    if (s == SD_ERR_NOT_FOUND) *out = dflt;
    return s == SD_ERR_NOT_FOUND ? SD_OK : s;
}

/* A positive finite number; SD_ERR_NOT_FOUND when absent or null. */
static sd_status get_pos_float(const cJSON *obj, const char *where, const char *key, float *out) {
    const cJSON *j = field(obj, key);
    if (!j || cJSON_IsNull(j)) return SD_ERR_NOT_FOUND;
    float f = cJSON_IsNumber(j) ? (float)j->valuedouble : NAN;
    if (!isfinite(f) || f <= 0.0f) {
        SD_ERROR("weights: %s %s must be a positive number", where, key);
        return SD_ERR_FORMAT;
    }
    *out = f;
    return SD_OK;
}

/* get_pos_float of config.json with a default for an absent key. */
static sd_status get_float_or(const cJSON *cfg, const char *key, float dflt, float *out) {
    sd_status s = get_pos_float(cfg, "config.json", key, out);
    if (s == SD_ERR_NOT_FOUND) *out = dflt;
    return s == SD_ERR_NOT_FOUND ? SD_OK : s;
}

/* A token id (or the first / last of a list of them); -1 when absent. */
static sd_status get_token_id(const cJSON *cfg, const char *key, bool last, int64_t *out) {
    const cJSON *j = field(cfg, key);
    *out = -1;
    if (cJSON_IsArray(j)) {
        int n = cJSON_GetArraySize(j);
        j = n ? cJSON_GetArrayItem(j, last ? n - 1 : 0) : NULL;
    }
    if (!j || cJSON_IsNull(j)) return SD_OK;
    double d = cJSON_IsNumber(j) ? j->valuedouble : -1.0;
    if (!(d >= 0.0) || d >= SD_MODEL_MAX_VOCAB || d != floor(d)) {
        SD_ERROR("weights: config.json %s is not a token id", key);
        return SD_ERR_FORMAT;
    }
    *out = (int64_t)d;
    return SD_OK;
}

/* config.json's rope_scaling object (rope_type, or the older type). */
static sd_status hf_rope_type(const void *src, char *out, size_t n) {
    const cJSON *rs = field(src, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return SD_ERR_NOT_FOUND;
    const cJSON *type = field(rs, "rope_type");
    if (!type) type = field(rs, "type");
    if (!cJSON_IsObject(rs) || !cJSON_IsString(type)) {
        SD_ERROR("weights: config.json rope_scaling must be null or an object with rope_type");
        return SD_ERR_FORMAT;
    }
    snprintf(out, n, "%s", type->valuestring);
    return SD_OK;
}

/* LongRoPE's original context: rope_scaling's original_max_position_embeddings, else
 * the top level's (Phi-3's configs keep it there); SD_ERR_NOT_FOUND when neither has it. */
static sd_status hf_orig_ctx(const cJSON *j, int32_t *out) {
    sd_status s = get_int(field(j, "rope_scaling"), "original_max_position_embeddings", false, SD_MODEL_MAX_CTX, out);
    return s == SD_ERR_NOT_FOUND ? get_int(j, "original_max_position_embeddings", false, SD_MODEL_MAX_CTX, out) : s;
}

/* LongRoPE's attention factor: rope_scaling.attention_factor, else as
 * transformers (and llama.cpp's converter) compute it from the context's
 * growth s = max_position_embeddings / original (rope_scaling.factor
 * without an original context): sqrt(1 + ln s / ln original), 1 when s <= 1. */
static sd_status hf_attn_factor(const cJSON *j, double *out) {
    const cJSON *rs = field(j, "rope_scaling");
    float f;
    sd_status s = get_pos_float(rs, "rope_scaling", "attention_factor", &f);
    if (s != SD_ERR_NOT_FOUND) {
        if (s == SD_OK) *out = f;
        return s;
    }
    int32_t max_pos = 0, orig = 0;
    SD_TRY(get_int_or(j, "max_position_embeddings", SD_MODEL_MAX_CTX, 4096, &max_pos));
    s = hf_orig_ctx(j, &orig);
    double scale = 1.0;
    if (s == SD_OK) {
        scale = (double)max_pos / (double)orig;
    } else if (s == SD_ERR_NOT_FOUND) {
        orig = max_pos;
        s = get_pos_float(rs, "rope_scaling", "factor", &f);
        if (s == SD_OK) scale = f;
        if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    } else {
        return s;
    }
    *out = scale > 1.0 && orig > 1 ? sqrt(1.0 + log(scale) / log((double)orig)) : 1.0;
    return SD_OK;
}

static sd_status hf_rope_number(const void *src, sd_rope_key key, double *out) {
    const cJSON *rs = field(src, "rope_scaling");
    static const char *const names[] = {"factor", "low_freq_factor", "high_freq_factor"};
    if (key == SD_ROPE_ORIG_CTX) {
        int32_t v;
        sd_status s = hf_orig_ctx(src, &v);
        if (s == SD_OK) *out = v;
        return s;
    }
    if (key == SD_ROPE_ATTN_FACTOR) return hf_attn_factor(src, out);
    if ((int)key < 0 || (size_t)key >= sizeof names / sizeof names[0]) return SD_ERR_INVALID_ARG;
    float f;
    sd_status s = get_pos_float(rs, "rope_scaling", names[key], &f);
    if (s == SD_OK) *out = f;
    return s;
}

/* LongRoPE's factors: rope_scaling.long_factor or short_factor, an array of
 * n finite positive numbers. */
static sd_status hf_rope_factors(const void *src, bool long_set, int32_t n, float *out) {
    const char *key = long_set ? "long_factor" : "short_factor";
    const cJSON *a = field(field(src, "rope_scaling"), key);
    if (!a || cJSON_IsNull(a)) return SD_ERR_NOT_FOUND;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) {
        SD_ERROR("weights: config.json rope_scaling.%s must be an array of %d numbers (head_dim / 2), it has %d", key,
                 (int)n, cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1);
        return SD_ERR_FORMAT;
    }
    int32_t i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        out[i] = (float)d;
        if (!isfinite(out[i]) || out[i] <= 0.0f) {
            SD_ERROR("weights: config.json rope_scaling.%s[%d] must be a finite positive number", key, (int)i);
            return SD_ERR_FORMAT;
        }
    }
    return SD_OK;
}

/* A boolean key that must be false (or absent) for this architecture. */
static sd_status require_false(const cJSON *cfg, const hf_arch *a, const char *key) {
    if (cJSON_IsTrue(field(cfg, key))) {
        SD_ERROR("weights: config.json %s = true is not supported for %s", key, a->class_name);
        return SD_ERR_UNSUPPORTED;
    }
    return SD_OK;
}

/* A key that must be absent or null (a feature the engine does not run). */
static sd_status require_null(const cJSON *cfg, const hf_arch *a, const char *key) {
    const cJSON *j = field(cfg, key);
    if (j && !cJSON_IsNull(j)) {
        SD_ERROR("weights: config.json %s is set; %s with %s is not supported", key, a->class_name, key);
        return SD_ERR_UNSUPPORTED;
    }
    return SD_OK;
}

/* A string key that must be absent or one of want (NULL-terminated). */
static sd_status require_str(const cJSON *cfg, const char *key, const char *const *want) {
    const cJSON *j = field(cfg, key);
    if (!j) return SD_OK;
    for (size_t i = 0; cJSON_IsString(j) && want[i]; i++)
        if (strcmp(j->valuestring, want[i]) == 0) return SD_OK;
    SD_ERROR("weights: %s '%.32s' is not supported (%s)", key, cJSON_IsString(j) ? j->valuestring : "?", want[0]);
    return SD_ERR_UNSUPPORTED;
}

/* The class config.json names: architectures[0], else model_type. */
static sd_status find_arch(const cJSON *j, const hf_arch **out) {
    const cJSON *archs = field(j, "architectures"), *mt = field(j, "model_type");
    const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
    if (a0 && !cJSON_IsString(a0)) a0 = NULL;
    if (mt && !cJSON_IsString(mt)) {
        SD_ERROR("weights: config.json model_type is not a string");
        return SD_ERR_FORMAT;
    }
    if (!a0 && !mt) {
        SD_ERROR("weights: config.json names no architectures and no model_type (supported: " SD_HF_ARCHS ")");
        return SD_ERR_UNSUPPORTED;
    }
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) {
        const hf_arch *a = &ARCHS[i];
        if (a0 ? strcmp(a0->valuestring, a->class_name) != 0 : strcmp(mt->valuestring, a->model_type) != 0) continue;
        if (mt && strcmp(mt->valuestring, a->model_type) != 0) {
            SD_ERROR("weights: config.json model_type '%.32s' does not match architectures %s (model_type %s)",
                     mt->valuestring, a->class_name, a->model_type);
            return SD_ERR_UNSUPPORTED;
        }
        *out = a;
        return SD_OK;
    }
    SD_ERROR("weights: architecture '%.64s' is not supported (supported: " SD_HF_ARCHS ")",
             a0 ? a0->valuestring : mt->valuestring);
    return SD_ERR_UNSUPPORTED;
}

/* The sizes every architecture has: hidden, layers, heads, head_dim, ... */
static sd_status shape(const cJSON *j, const hf_arch *a, sd_model_config *c) {
    SD_TRY(get_int(j, "hidden_size", true, SD_MODEL_MAX_EMBD, &c->n_embd));
    SD_TRY(get_int(j, "num_hidden_layers", true, SD_MODEL_MAX_LAYERS, &c->n_layers));
    SD_TRY(get_int(j, "intermediate_size", true, SD_MODEL_MAX_FF, &c->n_ff));
    SD_TRY(get_int(j, "num_attention_heads", true, SD_MODEL_MAX_HEADS, &c->n_heads));
    SD_TRY(get_int(j, "vocab_size", true, SD_MODEL_MAX_VOCAB, &c->n_vocab));
    SD_TRY(get_int_or(j, "num_key_value_heads", SD_MODEL_MAX_HEADS, c->n_heads, &c->n_kv_heads));
    if (c->n_heads % c->n_kv_heads != 0) {
        SD_ERROR("weights: num_attention_heads %d is not a multiple of num_key_value_heads %d", (int)c->n_heads,
                 (int)c->n_kv_heads);
        return SD_ERR_FORMAT;
    }
    SD_TRY(get_int_or(j, "max_position_embeddings", SD_MODEL_MAX_CTX, a->default_ctx, &c->n_ctx_train));
    /* Qwen3 and Gemma 3 heads are wider than hidden / heads; the others' are not */
    const bool free_hd = a->id == SD_ARCH_QWEN3 || a->id == SD_ARCH_GEMMA3;
    int32_t hd = 0;
    sd_status s = get_int(j, "head_dim", false, SD_MODEL_MAX_HEAD_DIM, &hd);
    if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
    int32_t even = c->n_embd / c->n_heads;
    c->head_dim = hd ? hd : a->id == SD_ARCH_GEMMA3 ? 256 : a->id == SD_ARCH_QWEN3 ? 128 : even;
    if (!free_hd && (c->n_heads * even != c->n_embd || c->head_dim != even)) {
        SD_ERROR("weights: hidden_size %d != num_attention_heads %d * head_dim %d (odd head sizes are not supported "
                 "for %s)",
                 (int)c->n_embd, (int)c->n_heads, (int)c->head_dim, a->class_name);
        return SD_ERR_UNSUPPORTED;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > SD_MODEL_MAX_HEAD_DIM) {
        SD_ERROR("weights: head_dim %d must be even and <= %d", (int)c->head_dim, SD_MODEL_MAX_HEAD_DIM);
        return SD_ERR_FORMAT;
    }
    SD_TRY(get_float_or(j, "rms_norm_eps", a->default_eps, &c->rms_eps));
    if (c->rms_eps >= 1.0f) {
        SD_ERROR("weights: rms_norm_eps %g is not plausible", (double)c->rms_eps);
        return SD_ERR_FORMAT;
    }
    return get_float_or(j, "rope_theta", a->default_theta, &c->rope_base);
}

/* Gemma 3's local / global layers: layer_types (newer configs), else
 * sliding_window_pattern (or _sliding_window_pattern), else 6. The engine
 * runs "every p-th layer global" (sd_model_layer_swa): another layout is
 * refused. */
static sd_status gemma3_pattern(const cJSON *j, sd_model_config *c) {
    const cJSON *lt = field(j, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        int n = cJSON_IsArray(lt) ? cJSON_GetArraySize(lt) : -1;
        int32_t p = 0;
        for (int l = 0; l < n && !p; l++) {
            const cJSON *t = cJSON_GetArrayItem(lt, l);
            if (cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0) p = l + 1;
        }
        c->swa_pattern = p ? p : c->n_layers + 1; /* no global layer at all */
        bool ok = n == c->n_layers;
        for (int l = 0; ok && l < n; l++) {
            const cJSON *t = cJSON_GetArrayItem(lt, l);
            const char *want = sd_model_layer_swa(c, l) ? "sliding_attention" : "full_attention";
            ok = cJSON_IsString(t) && strcmp(t->valuestring, want) == 0;
        }
        if (!ok) {
            SD_ERROR("weights: config.json layer_types is not %d layers with every %d-th full_attention (the only "
                     "layout supported)",
                     (int)c->n_layers, (int)c->swa_pattern);
            return SD_ERR_UNSUPPORTED;
        }
        return SD_OK;
    }
    sd_status s = get_int(j, "sliding_window_pattern", false, SD_MODEL_MAX_LAYERS, &c->swa_pattern);
    if (s == SD_ERR_NOT_FOUND) s = get_int(j, "_sliding_window_pattern", false, SD_MODEL_MAX_LAYERS, &c->swa_pattern);
    if (s == SD_ERR_NOT_FOUND) c->swa_pattern = 6;
    return s == SD_ERR_NOT_FOUND ? SD_OK : s;
}

/* Gemma3TextConfig: what Gemma 3 adds (model_config.h's fields). */
static sd_status gemma3_features(const cJSON *j, const hf_arch *a, sd_model_config *c) {
    static const char *const gelu[] = {"gelu_pytorch_tanh", NULL};
    SD_TRY(require_str(j, "hidden_activation", gelu));
    SD_TRY(require_str(j, "hidden_act", gelu));
    SD_TRY(require_null(j, a, "final_logit_softcapping"));
    SD_TRY(require_null(j, a, "attn_logit_softcapping"));
    SD_TRY(require_false(j, a, "attention_bias"));
    SD_TRY(require_false(j, a, "use_bidirectional_attention"));
    c->qk_norm = c->post_norms = c->rope_neox = c->gelu = true;
    c->embd_scale = sqrtf((float)c->n_embd);
    float qpas;
    SD_TRY(get_float_or(j, "query_pre_attn_scalar", 256.0f, &qpas));
    c->attn_scale = 1.0f / sqrtf(qpas);
    SD_TRY(get_int_or(j, "sliding_window", SD_MODEL_MAX_CTX, 4096, &c->sliding_window));
    SD_TRY(gemma3_pattern(j, c));
    return get_float_or(j, "rope_local_base_freq", 10000.0f, &c->rope_base_swa);
}

/* What the class adds over Llama, after the shape and RoPE are read. */
static sd_status arch_features(const cJSON *j, const hf_arch *a, sd_model_config *c) {
    static const char *const silu[] = {"silu", NULL};
    c->embd_scale = 1.0f;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->rope_base_swa = c->rope_base;
    if (a->id != SD_ARCH_GEMMA3) SD_TRY(require_str(j, "hidden_act", silu));
    switch (a->id) {
    case SD_ARCH_LLAMA:
        SD_TRY(require_false(j, a, "attention_bias"));
        SD_TRY(require_false(j, a, "mlp_bias"));
        if (a->window) { /* null: Mistral 7B v0.2 and later attend to everything */
            sd_status s = get_int(j, "sliding_window", false, SD_MODEL_MAX_CTX, &c->sliding_window);
            if (s != SD_ERR_NOT_FOUND) SD_TRY(s);
        }
        return SD_OK;
    case SD_ARCH_QWEN2:
    case SD_ARCH_QWEN3:
        SD_TRY(require_false(j, a, "use_sliding_window"));
        if (a->id == SD_ARCH_QWEN3) SD_TRY(require_false(j, a, "attention_bias"));
        c->qkv_bias = a->id == SD_ARCH_QWEN2; /* Qwen2's q/k/v always have biases */
        c->qk_norm = a->id == SD_ARCH_QWEN3;
        c->rope_neox = true;
        return SD_OK;
    case SD_ARCH_PHI3: {
        const cJSON *prf = field(j, "partial_rotary_factor");
        if (prf && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0)) {
            SD_ERROR("weights: Phi3ForCausalLM with partial_rotary_factor != 1 is not supported");
            return SD_ERR_UNSUPPORTED;
        }
        /* sliding_window is ignored, as llama.cpp's phi3 does (model_config.c) */
        c->fused_qkv = c->fused_gate_up = c->rope_neox = true;
        c->attn_scale *= c->rope_attn_factor * c->rope_attn_factor; /* LongRoPE's (1 without it) */
        return SD_OK;
    }
    case SD_ARCH_GEMMA3: return gemma3_features(j, a, c);
    }
    return SD_ERR_INTERNAL;
}

/* A text model's config of class a. */
static sd_status parse_text(const cJSON *j, const hf_arch *a, sd_hf_meta *out) {
    sd_model_config c;
    memset(&c, 0, sizeof c);
    c.arch_id = a->id;
    static const char *const names[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"}; /* by sd_model_arch */
    snprintf(c.arch, sizeof c.arch, "%s", names[a->id]);
    SD_TRY(shape(j, a, &c));
    sd_rope_source rope = {.where = "weights: config.json",
                           .type_none = "default",
                           .type = hf_rope_type,
                           .number = hf_rope_number,
                           .factors = hf_rope_factors,
                           .src = j};
    SD_TRY(sd_model_config_rope_scaling(&rope, &c));
    SD_TRY(arch_features(j, a, &c));
    const cJSON *tie = field(j, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie)) {
        SD_ERROR("weights: config.json tie_word_embeddings is not a boolean");
        return SD_ERR_FORMAT;
    }
    c.tied_output = tie ? cJSON_IsTrue(tie) : a->default_tied;
    SD_TRY(get_token_id(j, "bos_token_id", false, &out->bos_id));
    SD_TRY(get_token_id(j, "eos_token_id", false, &out->eos_id));
    const cJSON *eos = field(j, "eos_token_id");
    out->eot_id = -1;
    if (cJSON_IsArray(eos) && cJSON_GetArraySize(eos) > 1) SD_TRY(get_token_id(j, "eos_token_id", true, &out->eot_id));
    SD_TRY(get_token_id(j, "pad_token_id", false, &out->pad_id));
    out->class_name = a->class_name;
    out->cfg = c;
    return SD_OK;
}

/* The multimodal Gemma 3 class's top level: architectures and model_type
 * "gemma3"; its text model is text_config. */
static bool is_gemma3_multimodal(const cJSON *j) {
    const cJSON *archs = field(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
    return cJSON_IsString(a0) && strcmp(a0->valuestring, "Gemma3ForConditionalGeneration") == 0;
}

/* Gemma3ForConditionalGeneration: text_config read as a Gemma3ForCausalLM
 * config. Published configs leave out the keys whose value is
 * Gemma3TextConfig's default (the 4B's has no vocab_size nor head counts),
 * so those defaults fill a copy first; the tensors' shapes are checked
 * against the result as for any checkpoint. Token ids absent from
 * text_config are taken from the top level. */
static sd_status parse_gemma3_multimodal(const cJSON *j, sd_hf_meta *out) {
    const cJSON *mt = field(j, "model_type"), *tc = field(j, "text_config");
    if (mt && !(cJSON_IsString(mt) && strcmp(mt->valuestring, "gemma3") == 0)) {
        SD_ERROR("weights: config.json model_type '%.32s' does not match architectures "
                 "Gemma3ForConditionalGeneration (model_type gemma3)",
                 cJSON_IsString(mt) ? mt->valuestring : "?");
        return SD_ERR_UNSUPPORTED;
    }
    if (!cJSON_IsObject(tc)) {
        SD_ERROR("weights: config.json of Gemma3ForConditionalGeneration has no text_config object");
        return SD_ERR_FORMAT;
    }
    static const struct {
        const char *key;
        double value;
    } defaults[] = {{"vocab_size", 262208},     {"hidden_size", 2304},        {"intermediate_size", 9216},
                    {"num_hidden_layers", 26},  {"num_attention_heads", 8},   {"num_key_value_heads", 4},
                    {"head_dim", 256},          {"sliding_window", 4096},     {"rope_local_base_freq", 10000},
                    {"query_pre_attn_scalar", 256}};
    static const char *const ids[] = {"bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"};
    cJSON *t = cJSON_Duplicate(tc, true);
    bool ok = t != NULL;
    for (size_t i = 0; ok && i < sizeof defaults / sizeof defaults[0]; i++)
        if (!field(t, defaults[i].key)) ok = cJSON_AddNumberToObject(t, defaults[i].key, defaults[i].value) != NULL;
    for (size_t i = 0; ok && i < sizeof ids / sizeof ids[0]; i++)
        if (!field(t, ids[i]) && field(j, ids[i]))
            ok = cJSON_AddItemToObject(t, ids[i], cJSON_Duplicate(field(j, ids[i]), true));
    cJSON_DeleteItemFromObjectCaseSensitive(t, "architectures"); /* the text model's class is fixed */
    if (ok && !field(t, "model_type")) ok = cJSON_AddStringToObject(t, "model_type", "gemma3_text") != NULL;
    if (!ok) {
        cJSON_Delete(t);
        return SD_ERR_NOMEM;
    }
    const hf_arch *a = NULL;
    sd_status s = find_arch(t, &a);
    if (s == SD_OK && a->id != SD_ARCH_GEMMA3) {
        SD_ERROR("weights: Gemma3ForConditionalGeneration's text_config is model_type %s, not gemma3_text",
                 a->model_type);
        s = SD_ERR_UNSUPPORTED;
    }
    if (s == SD_OK) s = parse_text(t, a, out);
    cJSON_Delete(t);
    if (s != SD_OK) return s;
    out->class_name = "Gemma3ForConditionalGeneration";
    out->text_of_multimodal = true;
    return SD_OK;
}

sd_status sd_hf_config_parse(const cJSON *j, sd_hf_meta *out) {
    if (!cJSON_IsObject(j)) {
        SD_ERROR("weights: config.json is not an object");
        return SD_ERR_FORMAT;
    }
    out->text_of_multimodal = false;
    if (is_gemma3_multimodal(j)) return parse_gemma3_multimodal(j, out);
    const hf_arch *a = NULL;
    SD_TRY(find_arch(j, &a));
    return parse_text(j, a, out);
}


/* ------------------------------------------------------------------ names */

/* One layer tensor: its GGUF part and HF name, for the architectures that
 * have it in this form (arch_mask: bit per sd_model_arch; 0: all). */
typedef struct hf_part {
    const char *gguf, *hf;
    unsigned arch_mask;
    bool rope_llama; /* q/k rows rotate-half in llama's checkpoints */
    bool gemma_norm; /* a Gemma3RMSNorm weight: the engine's is 1 + w */
} hf_part;

#define ARCH_BIT(a) (1u << (a))
#define GEMMA       ARCH_BIT(SD_ARCH_GEMMA3)
#define NOT_GEMMA   (~GEMMA)
#define PHI3        ARCH_BIT(SD_ARCH_PHI3)
#define NOT_PHI3    (~PHI3)

static const hf_part PARTS[] = {
    {"attn_norm.weight", "input_layernorm.weight", 0, false, true},
    {"attn_q.weight", "self_attn.q_proj.weight", NOT_PHI3, true, false},
    {"attn_k.weight", "self_attn.k_proj.weight", NOT_PHI3, true, false},
    {"attn_v.weight", "self_attn.v_proj.weight", NOT_PHI3, false, false},
    {"attn_qkv.weight", "self_attn.qkv_proj.weight", PHI3, false, false},
    {"attn_q.bias", "self_attn.q_proj.bias", ARCH_BIT(SD_ARCH_QWEN2), false, false},
    {"attn_k.bias", "self_attn.k_proj.bias", ARCH_BIT(SD_ARCH_QWEN2), false, false},
    {"attn_v.bias", "self_attn.v_proj.bias", ARCH_BIT(SD_ARCH_QWEN2), false, false},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", ARCH_BIT(SD_ARCH_QWEN3) | GEMMA, false, true},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", ARCH_BIT(SD_ARCH_QWEN3) | GEMMA, false, true},
    {"attn_output.weight", "self_attn.o_proj.weight", 0, false, false},
    {"ffn_norm.weight", "post_attention_layernorm.weight", NOT_GEMMA, false, false},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight", GEMMA, false, true},
    {"post_attention_norm.weight", "post_attention_layernorm.weight", GEMMA, false, true},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", GEMMA, false, true},
    {"ffn_gate.weight", "mlp.gate_proj.weight", NOT_PHI3, false, false},
    {"ffn_up.weight", "mlp.up_proj.weight", NOT_PHI3, false, false},
    {"ffn_up.weight", "mlp.gate_up_proj.weight", PHI3, false, false},
    {"ffn_down.weight", "mlp.down_proj.weight", 0, false, false},
};

bool sd_weights_hf_name(sd_model_arch arch, const char *gguf, int32_t n_layers, char *out, size_t cap,
                        sd_weights_hf_layout *how) {
    static const char *const globals[][2] = {
        {"token_embd.weight", "model.embed_tokens.weight"},
        {"output_norm.weight", "model.norm.weight"},
        {"output.weight", "lm_head.weight"},
    };
    const bool gemma = arch == SD_ARCH_GEMMA3;
    how->rope_rows = how->plus_one = false;
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strcmp(gguf, globals[i][0]) == 0) {
            how->plus_one = gemma && i == 1;
            return (size_t)snprintf(out, cap, "%s", globals[i][1]) < cap;
        }
    if (strncmp(gguf, "blk.", 4) != 0 || (unsigned)arch > SD_ARCH_PHI3) return false;
    const char *p = gguf + 4;
    int64_t layer = 0;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] != '.')) return false;
    while (*p >= '0' && *p <= '9' && layer < SD_MODEL_MAX_LAYERS) layer = layer * 10 + (*p++ - '0');
    if (*p != '.' || layer >= n_layers) return false;
    p++;
    for (size_t i = 0; i < sizeof PARTS / sizeof PARTS[0]; i++) {
        const hf_part *pt = &PARTS[i];
        if (strcmp(p, pt->gguf) != 0 || (pt->arch_mask && !(pt->arch_mask & ARCH_BIT(arch)))) continue;
        how->rope_rows = pt->rope_llama && arch == SD_ARCH_LLAMA;
        how->plus_one = pt->gemma_norm && gemma;
        return (size_t)snprintf(out, cap, "model.layers.%lld.%s", (long long)layer, pt->hf) < cap;
    }
    return false;
}
