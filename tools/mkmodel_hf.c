/* mkmodel_hf.c — a GGUF (llama, Mistral, qwen2, qwen3, gemma3, phi3)
 * written out as a Hugging Face checkpoint.
 *
 * The inverse of what engine/weights_hf.c reads, done the way the HF side
 * lays each family out (what llama.cpp's convert_hf_to_gguf.py undoes), so
 * that loading either file gives the engine the same f32 numbers:
 *   - config.json: the family's class (LlamaForCausalLM, MistralForCausalLM
 *     when a llama has a window, Qwen2/Qwen3/Gemma3/Phi3ForCausalLM) and its
 *     own keys (Gemma: query_pre_attn_scalar, sliding_window, layer_types,
 *     rope_local_base_freq, ...), and the tokenizer's ids;
 *   - tensors renamed by the engine's one table (sd_weights_hf_name:
 *     blk.N.attn_q -> model.layers.N.self_attn.q_proj, Gemma's ffn_norm ->
 *     pre_feedforward_layernorm, Phi-3's fused qkv_proj / gate_up_proj ...);
 *     llama's q/k rows permuted from adjacent-pair RoPE order back to
 *     rotate-half order (GGUF row h*hd + 2i + s -> HF row h*hd + s*hd/2 + i,
 *     the inverse of llama.cpp's convert permute); Gemma's norms stored as
 *     w where GGUF holds 1 + w; bytes otherwise untouched;
 *   - one model.safetensors, or N shards of about equal size in tensor
 *     order with model.safetensors.index.json, as transformers saves them;
 *   - tokenizer.json (BPE vocab, merges, control tokens as special added
 *     tokens, the pre-tokenizer that tokenizer.ggml.pre names: GPT-2,
 *     SmolLM, Llama 3, Qwen2) and tokenizer_config.json (add_bos_token,
 *     special token texts).
 * JSON is built with cJSON. Rejected: a Python converter (the test model
 * tool must run without the oracle venv). */
#include "mkmodel_hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "specd/model.h"
#include "specd/safetensors.h"
#include "specd/weights.h"
#include "tokenizer_impl.h" /* sd_tok_pre_def_at: the pre-tokenizer regexes */

/* ------------------------------------------------------------------ files */

static char *path_in(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) {
        memcpy(p, dir, strlen(dir));
        p[strlen(dir)] = '/';
        memcpy(p + strlen(dir) + 1, name, strlen(name) + 1);
    }
    return p;
}

/* Prints j into dir/name (takes nothing; j stays the caller's). */
static sd_status write_json(const char *dir, const char *name, const cJSON *j) {
    char *text = cJSON_Print(j);
    char *path = path_in(dir, name);
    sd_status s = text && path ? SD_OK : SD_ERR_NOMEM;
    FILE *f = s == SD_OK ? fopen(path, "w") : NULL;
    if (s == SD_OK && (!f || fputs(text, f) < 0 || fputc('\n', f) < 0)) s = SD_ERR_IO;
    if (f && fclose(f) != 0) s = SD_ERR_IO;
    if (s != SD_OK) fprintf(stderr, "specd-mkmodel: cannot write %s/%s\n", dir, name);
    free(text);
    free(path);
    return s;
}

/* ---------------------------------------------------------------- tensors */

typedef struct tensor_plan {
    const sd_gguf_tensor *t;
    char hf[128];
    sd_weights_hf_layout how;   /* q/k rows to rotate-half order; Gemma norms stored as w, not 1 + w */
    sd_safetensors_dtype dtype; /* as stored in the checkpoint */
    uint64_t n_bytes;
} tensor_plan;

static sd_safetensors_dtype st_dtype(sd_dtype t) {
    return t == SD_DTYPE_F16 ? SD_SAFETENSORS_F16 : t == SD_DTYPE_BF16 ? SD_SAFETENSORS_BF16 : SD_SAFETENSORS_F32;
}

/* The tensor's bytes as the checkpoint stores them (caller frees): rows
 * permuted for llama's q/k, 1 taken off a Gemma norm (exact for values in
 * [0.5, 2], the only ones the reader's + 1 gives back bit for bit),
 * converted when the stored type differs. */
static sd_status hf_bytes(const tensor_plan *tp, int32_t head_dim, uint8_t **out) {
    const sd_gguf_tensor *t = tp->t;
    sd_dtype want = tp->dtype == SD_SAFETENSORS_F16    ? SD_DTYPE_F16
                    : tp->dtype == SD_SAFETENSORS_BF16 ? SD_DTYPE_BF16
                                                       : SD_DTYPE_F32;
    uint8_t *conv = NULL;
    const uint8_t *src = t->data;
    if (t->type != want || tp->how.plus_one) { /* dequantize, then encode as the stored type */
        float *f = malloc((size_t)t->n_elems * sizeof *f);
        conv = malloc((size_t)tp->n_bytes);
        sd_status s = f && conv ? sd_dequantize(t->type, t->data, t->n_elems, f) : SD_ERR_NOMEM;
        for (uint64_t i = 0; s == SD_OK && tp->how.plus_one && i < t->n_elems; i++) f[i] -= 1.0f;
        if (s == SD_OK) s = sd_quantize(want, f, t->n_elems, conv);
        free(f);
        if (s != SD_OK) {
            free(conv);
            return s;
        }
        src = conv;
    }
    uint8_t *dst = malloc((size_t)tp->n_bytes ? (size_t)tp->n_bytes : 1);
    if (!dst) {
        free(conv);
        return SD_ERR_NOMEM;
    }
    uint64_t rows = t->n_dims == 2 ? t->ne[1] : 1;
    size_t row_bytes = (size_t)(tp->n_bytes / rows);
    int64_t hd = head_dim, half = hd / 2;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t to = r;
        if (tp->how.rope_rows) { /* GGUF row h*hd + 2i + s goes to HF row h*hd + s*half + i */
            int64_t j = (int64_t)(r % (uint64_t)hd);
            to = r - (uint64_t)j + (uint64_t)((j % 2) * half + j / 2);
        }
        memcpy(dst + to * row_bytes, src + r * row_bytes, row_bytes);
    }
    free(conv);
    *out = dst;
    return SD_OK;
}

static sd_status write_shard(const char *dir, const char *file, const tensor_plan *plan, size_t from, size_t to,
                             int32_t head_dim) {
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    if (!w) return SD_ERR_NOMEM;
    sd_status s = sd_safetensors_writer_set_metadata(w, "format", "pt");
    for (size_t i = from; s == SD_OK && i < to; i++) {
        const sd_gguf_tensor *t = plan[i].t;
        uint64_t shape[2] = {t->n_dims == 2 ? t->ne[1] : t->ne[0], t->ne[0]};
        uint8_t *bytes = NULL;
        s = hf_bytes(&plan[i], head_dim, &bytes);
        if (s == SD_OK) s = sd_safetensors_writer_add_tensor(w, plan[i].hf, plan[i].dtype, t->n_dims, shape, bytes);
        free(bytes);
    }
    char *path = path_in(dir, file);
    if (s == SD_OK) s = path ? sd_safetensors_writer_write(w, path) : SD_ERR_NOMEM;
    if (s != SD_OK) fprintf(stderr, "specd-mkmodel: cannot write %s/%s: %s\n", dir, file, sd_status_str(s));
    free(path);
    sd_safetensors_writer_free(&w);
    return s;
}

static sd_status write_tensors(const sd_gguf *g, const mk_hf_params *p, const sd_model_config *c) {
    int64_t n = sd_gguf_n_tensors(g);
    tensor_plan *plan = calloc((size_t)(n ? n : 1), sizeof *plan);
    if (!plan) return SD_ERR_NOMEM;
    size_t n_plan = 0;
    uint64_t total = 0;
    sd_status s = SD_OK;
    for (int64_t i = 0; i < n && s == SD_OK; i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
        tensor_plan *tp = &plan[n_plan];
        if (strcmp(t->name, "rope_freqs.weight") == 0) {
            fprintf(stderr, "specd-mkmodel: warning: rope_freqs.weight has no HF tensor; config.json's "
                            "rope_scaling stands for it\n");
            continue;
        }
        if (strncmp(t->name, "rope_factors_", 13) == 0) continue; /* LongRoPE's: config.json's rope_scaling */
        if (!sd_weights_hf_name(c->arch_id, t->name, c->n_layers, tp->hf, sizeof tp->hf, &tp->how) || t->n_dims > 2) {
            fprintf(stderr, "specd-mkmodel: tensor %s has no Hugging Face %s counterpart\n", t->name, c->arch);
            s = SD_ERR_UNSUPPORTED;
            break;
        }
        tp->t = t;
        sd_dtype stored = p->force_dtype                                          ? p->dtype
                          : (t->type == SD_DTYPE_F16 || t->type == SD_DTYPE_BF16) ? t->type
                                                                                  : SD_DTYPE_F32;
        tp->dtype = st_dtype(stored);
        tp->n_bytes = t->n_elems * (sd_safetensors_dtype_bits(tp->dtype) / 8);
        total += tp->n_bytes;
        n_plan++;
    }
    uint32_t shards = p->n_shards > n_plan ? (uint32_t)n_plan : p->n_shards;
    /* a stale file of the other layout would shadow this one (the index wins) */
    char *stale = path_in(p->dir, shards <= 1 ? "model.safetensors.index.json" : "model.safetensors");
    if (stale) unlink(stale);
    free(stale);
    if (s == SD_OK && shards <= 1) {
        s = write_shard(p->dir, "model.safetensors", plan, 0, n_plan, c->head_dim);
    } else if (s == SD_OK) {
        /* cut in tensor order where the running size passes k/shards of the total,
         * leaving at least one tensor for each remaining shard */
        cJSON *idx = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(idx, "metadata"),
              *map = cJSON_AddObjectToObject(idx, "weight_map");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        size_t from = 0;
        uint64_t acc = 0;
        for (uint32_t k = 0; k < shards && s == SD_OK; k++) {
            size_t to = from, last = n_plan - (shards - 1 - k); /* leave one tensor per later shard */
            uint64_t goal = total / shards * (k + 1);
            do {
                acc += plan[to].n_bytes;
                to++;
            } while (to < last && (acc < goal || k + 1 == shards));
            char file[64];
            snprintf(file, sizeof file, "model-%05u-of-%05u.safetensors", k + 1, shards);
            s = write_shard(p->dir, file, plan, from, to, c->head_dim);
            for (size_t i = from; i < to; i++) cJSON_AddStringToObject(map, plan[i].hf, file);
            from = to;
        }
        if (s == SD_OK) s = write_json(p->dir, "model.safetensors.index.json", idx);
        cJSON_Delete(idx);
    }
    free(plan);
    return s;
}

/* ----------------------------------------------------------------- config */

static int64_t get_id(const sd_gguf *g, const char *key) {
    int64_t v;
    return sd_gguf_get_i64(g, key, &v) == SD_OK ? v : -1;
}

/* The class and model_type config.json names for c (Mistral: llama with a window). */
static void arch_names(const sd_model_config *c, const char **cls, const char **type) {
    static const char *const names[][2] = {{"LlamaForCausalLM", "llama"},
                                           {"Qwen2ForCausalLM", "qwen2"},
                                           {"Qwen3ForCausalLM", "qwen3"},
                                           {"Gemma3ForCausalLM", "gemma3_text"},
                                           {"Phi3ForCausalLM", "phi3"}};
    bool mistral = c->arch_id == SD_ARCH_LLAMA && c->sliding_window > 0;
    *cls = mistral ? "MistralForCausalLM" : names[c->arch_id][0];
    *type = mistral ? "mistral" : names[c->arch_id][1];
}

/* LongRoPE as Phi-3's configs say it: the factors in rope_scaling, the
 * original context at the top level; attention_factor only when it is not
 * the value transformers would derive (the reader derives it the same way). */
static void add_longrope(cJSON *j, const sd_model_config *c) {
    cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
    cJSON_AddStringToObject(rs, "type", "longrope");
    const char *keys[] = {"long_factor", "short_factor"};
    for (int set = 0; set < 2; set++) {
        cJSON *a = cJSON_AddArrayToObject(rs, keys[set]);
        const float *f = set == 0 ? c->rope_factors_long : c->rope_factors_short;
        for (int32_t i = 0; i < c->head_dim / 2; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)f[i]));
    }
    if ((float)mk_longrope_attn_factor((uint32_t)c->n_ctx_train, (uint32_t)c->rope_orig_ctx) != c->rope_attn_factor)
        cJSON_AddNumberToObject(rs, "attention_factor", (double)c->rope_attn_factor);
    cJSON_AddNumberToObject(j, "original_max_position_embeddings", c->rope_orig_ctx);
}

static void add_rope_scaling(cJSON *j, const sd_model_config *c) {
    if (c->rope_scaling_type == SD_ROPE_LONGROPE) {
        add_longrope(j, c);
        return;
    }
    if (c->rope_scaling_type == 0) {
        cJSON_AddNullToObject(j, "rope_scaling");
        return;
    }
    cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", c->rope_scaling_type == 1 ? "linear" : "llama3");
    cJSON_AddNumberToObject(rs, "factor", (double)c->rope_scale_factor);
    if (c->rope_scaling_type == 2) {
        cJSON_AddNumberToObject(rs, "low_freq_factor", (double)c->rope_low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", (double)c->rope_high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_ctx);
    }
}

/* The keys only some families' configs have, as their configs spell them. */
static void add_arch_keys(cJSON *j, const sd_model_config *c) {
    switch (c->arch_id) {
    case SD_ARCH_LLAMA:
        cJSON_AddBoolToObject(j, "attention_bias", false);
        if (c->sliding_window > 0)
            cJSON_AddNumberToObject(j, "sliding_window", c->sliding_window);
        else
            cJSON_AddBoolToObject(j, "mlp_bias", false);
        break;
    case SD_ARCH_QWEN2:
    case SD_ARCH_QWEN3:
        if (c->arch_id == SD_ARCH_QWEN3) cJSON_AddBoolToObject(j, "attention_bias", false);
        cJSON_AddBoolToObject(j, "use_sliding_window", false);
        cJSON_AddNumberToObject(j, "sliding_window", c->n_ctx_train);
        cJSON_AddNumberToObject(j, "max_window_layers", c->n_layers);
        break;
    case SD_ARCH_PHI3:
        cJSON_AddNullToObject(j, "sliding_window");
        break; /* llama.cpp and the reader run full attention */
    case SD_ARCH_GEMMA3: {
        cJSON_AddStringToObject(j, "hidden_activation", "gelu_pytorch_tanh");
        /* the scale the GGUF reader derived, as the scalar it is 1/sqrt of */
        double qpas = floor(1.0 / ((double)c->attn_scale * (double)c->attn_scale) + 0.5);
        cJSON_AddNumberToObject(j, "query_pre_attn_scalar", qpas);
        cJSON_AddNumberToObject(j, "sliding_window", c->sliding_window);
        cJSON_AddNumberToObject(j, "sliding_window_pattern", c->swa_pattern);
        cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
        for (int32_t l = 0; l < c->n_layers; l++)
            cJSON_AddItemToArray(lt,
                                 cJSON_CreateString(sd_model_layer_swa(c, l) ? "sliding_attention" : "full_attention"));
        cJSON_AddNumberToObject(j, "rope_local_base_freq", (double)c->rope_base_swa);
        cJSON_AddNullToObject(j, "final_logit_softcapping");
        cJSON_AddNullToObject(j, "attn_logit_softcapping");
        cJSON_AddBoolToObject(j, "attention_bias", false);
        break;
    }
    }
}

static sd_status write_config(const sd_gguf *g, const mk_hf_params *p, const sd_model_config *c) {
    cJSON *j = cJSON_CreateObject();
    const char *cls, *type;
    arch_names(c, &cls, &type);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "architectures"), cJSON_CreateString(cls));
    cJSON_AddStringToObject(j, "model_type", type);
    if (c->arch_id != SD_ARCH_GEMMA3) cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", c->n_embd);
    cJSON_AddNumberToObject(j, "intermediate_size", c->n_ff);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->n_ctx_train);
    cJSON_AddNumberToObject(j, "rms_norm_eps", (double)c->rms_eps);
    cJSON_AddNumberToObject(j, "rope_theta", (double)c->rope_base);
    add_rope_scaling(j, c);
    cJSON_AddNumberToObject(j, "vocab_size", c->n_vocab);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tied_output);
    add_arch_keys(j, c);
    static const char *const ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                         {"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                         {"tokenizer.ggml.padding_token_id", "pad_token_id"}};
    for (size_t i = 0; i < 3; i++) {
        int64_t id = get_id(g, ids[i][0]);
        if (id >= 0) cJSON_AddNumberToObject(j, ids[i][1], (double)id);
    }
    const sd_gguf_tensor *embd = sd_gguf_find_tensor(g, "token_embd.weight");
    sd_dtype t = p->force_dtype ? p->dtype : embd ? embd->type : SD_DTYPE_F32;
    cJSON_AddStringToObject(j, "torch_dtype",
                            t == SD_DTYPE_F16    ? "float16"
                            : t == SD_DTYPE_BF16 ? "bfloat16"
                                                 : "float32");
    sd_status s = write_json(p->dir, "config.json", j);
    cJSON_Delete(j);
    return s;
}

/* -------------------------------------------------------------- tokenizer */

static cJSON *byte_level(bool use_regex) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", false);
    cJSON_AddBoolToObject(b, "trim_offsets", true);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

/* The HF pre-tokenizer for tokenizer.ggml.pre, or NULL when unknown. */
static cJSON *pre_tokenizer(const char *pre, bool *ignore_merges) {
    *ignore_merges = false;
    if (!*pre || strcmp(pre, "default") == 0 || strcmp(pre, "gpt2") == 0) return byte_level(true);
    cJSON *seq = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    if (strcmp(pre, "smollm") == 0 || strcmp(pre, "starcoder") == 0 || strcmp(pre, "refact") == 0) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Digits");
        cJSON_AddBoolToObject(d, "individual_digits", true);
        cJSON_AddItemToArray(list, d);
        cJSON_AddItemToArray(list, byte_level(true));
        return seq;
    }
    /* one regex of the tokenizer's own table (llama-bpe / llama3, qwen2), then bytes */
    const char *name, *const *re;
    int n_re;
    bool im;
    for (size_t k = 0; sd_tok_pre_def_at(k, &name, &re, &n_re, &im); k++) {
        if (strcmp(pre, name) != 0 || n_re != 1) continue;
        cJSON *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(sp, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "pattern"), "Regex", re[0]);
        cJSON_AddStringToObject(sp, "behavior", "Isolated");
        cJSON_AddBoolToObject(sp, "invert", false);
        cJSON_AddItemToArray(list, sp);
        cJSON_AddItemToArray(list, byte_level(false));
        *ignore_merges = im;
        return seq;
    }
    cJSON_Delete(seq);
    return NULL;
}

/* Borrowed NUL-terminated copy of a GGUF string (into buf, truncated to cap). */
static const char *gguf_text(const sd_gguf *g, const char *key, uint64_t i, bool array, char *buf, size_t cap) {
    sd_gguf_str s;
    if ((array ? sd_gguf_get_arr_str(g, key, i, &s) : sd_gguf_get_str(g, key, &s)) != SD_OK) return NULL;
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = '\0';
    return buf;
}

static sd_status token_types(const sd_gguf *g, uint64_t n, int32_t *types) {
    for (uint64_t i = 0; i < n; i++) types[i] = 1;
    sd_gguf_type et;
    uint64_t len;
    const void *data;
    if (sd_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &len) != SD_OK) return SD_OK;
    if (len != n || (et != SD_GGUF_TYPE_INT32 && et != SD_GGUF_TYPE_UINT32) ||
        sd_gguf_get_arr_data(g, "tokenizer.ggml.token_type", &data, &len) != SD_OK)
        return SD_ERR_FORMAT;
    memcpy(types, data, (size_t)n * sizeof *types);
    return SD_OK;
}

static cJSON *post_processor(bool add_bos, const char *bos, int64_t bos_id) {
    if (!add_bos || !bos) {
        cJSON *b = byte_level(true);
        cJSON_ReplaceItemInObject(b, "trim_offsets", cJSON_CreateBool(false));
        return b;
    }
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "type", "TemplateProcessing");
    static const char *const seqs[] = {"single", "pair"};
    for (int k = 0; k < 2; k++) {
        cJSON *arr = cJSON_AddArrayToObject(t, seqs[k]);
        for (int part = 0; part <= k; part++) {
            cJSON *sp = cJSON_CreateObject(), *inner = cJSON_AddObjectToObject(sp, "SpecialToken");
            cJSON_AddStringToObject(inner, "id", bos);
            cJSON_AddNumberToObject(inner, "type_id", part);
            cJSON_AddItemToArray(arr, sp);
            cJSON *sq = cJSON_CreateObject(), *si = cJSON_AddObjectToObject(sq, "Sequence");
            cJSON_AddStringToObject(si, "id", part ? "B" : "A");
            cJSON_AddNumberToObject(si, "type_id", part);
            cJSON_AddItemToArray(arr, sq);
        }
    }
    /* the token table HF tokenizers requires beside the template */
    cJSON *st = cJSON_AddObjectToObject(cJSON_AddObjectToObject(t, "special_tokens"), bos);
    cJSON_AddStringToObject(st, "id", bos);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(st, "ids"), cJSON_CreateNumber((double)bos_id));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(st, "tokens"), cJSON_CreateString(bos));
    return t;
}

/* tokenizer_config.json: what transformers keeps outside tokenizer.json
 * (add_bos, the special tokens' text, the chat template). buf: scratch
 * of 1 << 16 bytes. */
static sd_status write_tokenizer_config(const sd_gguf *g, const mk_hf_params *p, const sd_model_config *c, bool add_bos,
                                        uint64_t n_tokens, char *buf, const char *tokenizer_class) {
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddBoolToObject(tc, "add_bos_token", add_bos);
    cJSON_AddBoolToObject(tc, "add_eos_token", false);
    static const char *const specials[][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                              {"eos_token", "tokenizer.ggml.eos_token_id"},
                                              {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                              {"pad_token", "tokenizer.ggml.padding_token_id"}};
    for (size_t k = 0; k < 4; k++) {
        int64_t id = get_id(g, specials[k][1]);
        const char *text = id >= 0 && (uint64_t)id < n_tokens
                               ? gguf_text(g, "tokenizer.ggml.tokens", (uint64_t)id, true, buf, 1 << 16)
                               : NULL;
        if (text) cJSON_AddStringToObject(tc, specials[k][0], text);
    }
    cJSON_AddBoolToObject(tc, "clean_up_tokenization_spaces", false);
    cJSON_AddNumberToObject(tc, "model_max_length", c->n_ctx_train);
    cJSON_AddStringToObject(tc, "tokenizer_class", tokenizer_class);
    sd_gguf_str tmpl;
    if (sd_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == SD_OK) {
        char *t = strndup(tmpl.ptr, (size_t)tmpl.len);
        if (t) cJSON_AddStringToObject(tc, "chat_template", t);
        free(t);
    }
    sd_status s = write_json(p->dir, "tokenizer_config.json", tc);
    cJSON_Delete(tc);
    return s;
}

#define SPACE_MARK "\xe2\x96\x81" /* "▁", SentencePiece's space */

/* A {"type": type, key: value} object (value a string). */
static cJSON *typed(const char *type, const char *key, const char *value) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    if (key) cJSON_AddStringToObject(o, key, value);
    return o;
}

/* SentencePiece-style BPE as transformers saves Llama 2 / Gemma: spaces
 * replaced by "▁" (after a prepended one when add_space_prefix), no
 * pre-tokenizer, a decoder back to text and bytes. */
static void spm_text_steps(cJSON *j, bool space_prefix) {
    cJSON *norm = typed("Sequence", NULL, NULL), *steps = cJSON_AddArrayToObject(norm, "normalizers");
    if (space_prefix) cJSON_AddItemToArray(steps, typed("Prepend", "prepend", SPACE_MARK));
    cJSON *rep = typed("Replace", "content", SPACE_MARK);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(rep, "pattern"), "String", " ");
    cJSON_AddItemToArray(steps, rep);
    cJSON_AddItemToObject(j, "normalizer", norm);
    cJSON_AddNullToObject(j, "pre_tokenizer");
    cJSON *dec = typed("Sequence", NULL, NULL), *dsteps = cJSON_AddArrayToObject(dec, "decoders");
    cJSON *back = typed("Replace", "content", " ");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(back, "pattern"), "String", SPACE_MARK);
    cJSON_AddItemToArray(dsteps, back);
    cJSON_AddItemToArray(dsteps, typed("ByteFallback", NULL, NULL));
    cJSON_AddItemToArray(dsteps, typed("Fuse", NULL, NULL));
    cJSON_AddItemToObject(j, "decoder", dec);
}

/* model.vocab and added_tokens from tokenizer.ggml.tokens / token_type.
 * Byte-level BPE leaves unused tokens out (they read back as [PAD] holes);
 * SentencePiece keeps every piece, as its tokenizer.json does. */
static sd_status add_vocab(const sd_gguf *g, uint64_t n_tokens, const int32_t *types, bool spm, cJSON *vocab,
                           cJSON *added, char *buf) {
    uint64_t n_lost = 0;
    for (uint64_t i = 0; i < n_tokens; i++) {
        const char *text = gguf_text(g, "tokenizer.ggml.tokens", i, true, buf, 1 << 16);
        if (!text) return SD_ERR_FORMAT;
        if (types[i] == 5 && !spm) continue;
        if (types[i] == 3 || types[i] == 4) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", text);
            cJSON_AddBoolToObject(a, "single_word", false);
            cJSON_AddBoolToObject(a, "lstrip", false);
            cJSON_AddBoolToObject(a, "rstrip", false);
            cJSON_AddBoolToObject(a, "normalized", false);
            cJSON_AddBoolToObject(a, "special", types[i] == 3);
            cJSON_AddItemToArray(added, a);
        } else if (types[i] != 1 && !spm) {
            n_lost++;
        }
        cJSON_AddNumberToObject(vocab, text, (double)i);
    }
    if (n_lost)
        fprintf(stderr,
                "specd-mkmodel: warning: %llu tokens of types other than normal/control/user-defined are "
                "written as normal tokens (the vocabulary hash will differ)\n",
                (unsigned long long)n_lost);
    return SD_OK;
}

/* model.merges: the GGUF's list (byte-level BPE) or one derived from the
 * SentencePiece scores (mkmodel_hf_spm.c). */
static sd_status add_merges(const sd_gguf *g, uint64_t n_tokens, bool spm, cJSON *merges, char *buf) {
    if (spm) return mk_spm_merges(g, n_tokens, merges);
    sd_gguf_type et;
    uint64_t n_merges = 0;
    (void)sd_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges);
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *text = gguf_text(g, "tokenizer.ggml.merges", i, true, buf, 1 << 16);
        if (!text) return SD_ERR_FORMAT;
        cJSON_AddItemToArray(merges, cJSON_CreateString(text));
    }
    return SD_OK;
}

/* The BPE model object: its unk token and flags; vocab and merges empty. */
static cJSON *bpe_model(const sd_gguf *g, uint64_t n_tokens, bool spm, bool ignore_merges) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    int64_t unk = get_id(g, "tokenizer.ggml.unknown_token_id");
    char unk_text[256] = "";
    if (unk >= 0 && (uint64_t)unk < n_tokens)
        gguf_text(g, "tokenizer.ggml.tokens", (uint64_t)unk, true, unk_text, sizeof unk_text);
    if (unk_text[0])
        cJSON_AddStringToObject(m, "unk_token", unk_text);
    else
        cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", spm);
    cJSON_AddBoolToObject(m, "byte_fallback", spm);
    cJSON_AddBoolToObject(m, "ignore_merges", ignore_merges);
    cJSON_AddObjectToObject(m, "vocab");
    cJSON_AddArrayToObject(m, "merges");
    return m;
}

static sd_status write_tokenizer(const sd_gguf *g, const mk_hf_params *p, const sd_model_config *c) {
    char model[16], pre[64] = "";
    bool spm = gguf_text(g, "tokenizer.ggml.model", 0, false, model, sizeof model) && strcmp(model, "llama") == 0;
    if (!spm && (!gguf_text(g, "tokenizer.ggml.model", 0, false, model, sizeof model) || strcmp(model, "gpt2") != 0)) {
        fprintf(stderr, "specd-mkmodel: warning: no BPE or SentencePiece tokenizer in the GGUF; no tokenizer.json "
                        "written\n");
        return SD_OK;
    }
    gguf_text(g, "tokenizer.ggml.pre", 0, false, pre, sizeof pre);
    bool ignore_merges = false;
    cJSON *pt = spm ? NULL : pre_tokenizer(pre, &ignore_merges);
    if (!spm && !pt) {
        fprintf(stderr, "specd-mkmodel: pre-tokenizer '%s' has no tokenizer.json form here\n", pre);
        return SD_ERR_UNSUPPORTED;
    }
    sd_gguf_type et;
    uint64_t n_tokens = 0;
    if (sd_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tokens) != SD_OK || n_tokens > (uint64_t)c->n_vocab) {
        cJSON_Delete(pt);
        fprintf(stderr, "specd-mkmodel: tokenizer.ggml.tokens is missing or longer than the vocabulary\n");
        return SD_ERR_FORMAT;
    }
    int32_t *types = malloc((size_t)(n_tokens ? n_tokens : 1) * sizeof *types);
    sd_status s = types ? token_types(g, n_tokens, types) : SD_ERR_NOMEM;
    char *buf = malloc(1 << 16);
    if (!buf) s = SD_ERR_NOMEM;

    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    bool space_prefix = true; /* llama.cpp's default for SentencePiece */
    (void)sd_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &space_prefix);
    if (spm) {
        spm_text_steps(j, space_prefix);
    } else {
        cJSON_AddNullToObject(j, "normalizer");
        cJSON_AddItemToObject(j, "pre_tokenizer", pt);
        cJSON_AddItemToObject(j, "decoder", byte_level(true));
    }
    int64_t bos = get_id(g, "tokenizer.ggml.bos_token_id");
    bool add_bos = false;
    (void)sd_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    char bos_text[256] = "";
    if (bos >= 0 && (uint64_t)bos < n_tokens)
        gguf_text(g, "tokenizer.ggml.tokens", (uint64_t)bos, true, bos_text, sizeof bos_text);
    cJSON_AddItemToObject(j, "post_processor", post_processor(add_bos, bos_text[0] ? bos_text : NULL, bos));
    cJSON *m = bpe_model(g, n_tokens, spm, ignore_merges);
    cJSON_AddItemToObject(j, "model", m);
    if (s == SD_OK) s = add_vocab(g, n_tokens, types, spm, cJSON_GetObjectItem(m, "vocab"), added, buf);
    if (s == SD_OK) s = add_merges(g, n_tokens, spm, cJSON_GetObjectItem(m, "merges"), buf);
    if (s == SD_OK) s = write_json(p->dir, "tokenizer.json", j);
    cJSON_Delete(j);
    const char *cls = spm ? (c->arch_id == SD_ARCH_GEMMA3 ? "GemmaTokenizer" : "LlamaTokenizer")
                          : (strcmp(pre, "qwen2") == 0 ? "Qwen2Tokenizer" : "GPT2Tokenizer");
    if (s == SD_OK) s = write_tokenizer_config(g, p, c, add_bos, n_tokens, buf, cls);
    free(buf);
    free(types);
    return s;
}

sd_status mk_write_hf(const sd_gguf *g, const mk_hf_params *p) {
    sd_model_config c;
    SD_TRY(sd_model_config_from_gguf(g, &c));
    if (mkdir(p->dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "specd-mkmodel: cannot create %s: %s\n", p->dir, strerror(errno));
        return SD_ERR_IO;
    }
    SD_TRY(write_config(g, p, &c));
    SD_TRY(write_tensors(g, p, &c));
    return write_tokenizer(g, p, &c);
}
