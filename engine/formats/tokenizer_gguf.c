/* tokenizer_gguf.c — sd_tok_from_gguf: gathers tokenizer.ggml.* into a spec.
 *
 * Model "gpt2" (byte-level BPE: tokens, merges, pre) and "llama"
 * (SentencePiece: tokens, scores, token types, add_space_prefix; merges
 * when a converter wrote them instead of scores).
 *
 * Only reads and type-checks GGUF metadata; every semantic check (ids in
 * range, merges well formed, model and pre-tokenizer supported) lives in
 * sd_tok_build so that other sources of vocabularies get the same checks. The
 * string views point into g's mapping and are used only during the build,
 * which copies what it keeps. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#define KEY_PREFIX "tokenizer.ggml."

static sd_status get_str_array(const sd_gguf *g, const char *key, bool required, sd_tok_text **out, size_t *n) {
    *out = NULL;
    *n = 0;
    sd_gguf_type et;
    uint64_t len;
    sd_status st = sd_gguf_get_arr(g, key, &et, &len);
    if (st == SD_ERR_NOT_FOUND && !required) return SD_OK;
    if (st != SD_OK || et != SD_GGUF_TYPE_STRING) {
        SD_ERROR("tokenizer: %s is %s", key, st == SD_ERR_NOT_FOUND ? "missing" : "not an array of strings");
        return st == SD_ERR_NOT_FOUND ? SD_ERR_FORMAT : (st != SD_OK ? st : SD_ERR_FORMAT);
    }
    if (len > (uint64_t)INT32_MAX) {
        SD_ERROR("tokenizer: %s has %llu entries, too many", key, (unsigned long long)len);
        return SD_ERR_FORMAT;
    }
    sd_tok_text *v = malloc((len ? len : 1) * sizeof *v);
    if (!v) return SD_ERR_NOMEM;
    for (uint64_t i = 0; i < len; i++) {
        sd_gguf_str s;
        st = sd_gguf_get_arr_str(g, key, i, &s);
        if (st != SD_OK) {
            free(v);
            return st;
        }
        v[i] = (sd_tok_text){s.ptr, (size_t)s.len};
    }
    *out = v;
    *n = (size_t)len;
    return SD_OK;
}

/* Token types: an array of any integer type, converted to int32. */
static sd_status get_types(const sd_gguf *g, size_t n_tokens, int32_t **out) {
    *out = NULL;
    const char *key = KEY_PREFIX "token_type";
    sd_gguf_type et;
    uint64_t len;
    sd_status st = sd_gguf_get_arr(g, key, &et, &len);
    if (st == SD_ERR_NOT_FOUND) return SD_OK; /* all normal */
    if (st != SD_OK) return st;
    if (len != n_tokens) {
        SD_ERROR("tokenizer: %s has %llu entries but there are %zu tokens", key, (unsigned long long)len, n_tokens);
        return SD_ERR_FORMAT;
    }
    size_t width;
    switch (et) {
    case SD_GGUF_TYPE_INT32:
    case SD_GGUF_TYPE_UINT32: width = 4; break;
    case SD_GGUF_TYPE_INT16:
    case SD_GGUF_TYPE_UINT16: width = 2; break;
    case SD_GGUF_TYPE_INT8:
    case SD_GGUF_TYPE_UINT8: width = 1; break;
    default: SD_ERROR("tokenizer: %s is not an integer array", key); return SD_ERR_FORMAT;
    }
    const void *data;
    SD_TRY(sd_gguf_get_arr_data(g, key, &data, &len));
    int32_t *types = malloc((n_tokens ? n_tokens : 1) * sizeof *types);
    if (!types) return SD_ERR_NOMEM;
    const unsigned char *p = data;
    for (size_t i = 0; i < n_tokens; i++) {
        int64_t sv = 0;
        uint64_t uv = 0;
        bool is_signed = false;
        sd_gguf_int_decode(et, p + width * i, &sv, &uv, &is_signed); /* et is one of the six above */
        int64_t v = is_signed ? sv : (uv > INT32_MAX ? -1 : (int64_t)uv);
        types[i] = v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v; /* out of range: rejected by build */
    }
    *out = types;
    return SD_OK;
}

static sd_status get_id(const sd_gguf *g, const char *key, int64_t *out) {
    *out = -1;
    int64_t v;
    sd_status st = sd_gguf_get_i64(g, key, &v);
    if (st == SD_ERR_NOT_FOUND) return SD_OK;
    if (st != SD_OK) {
        SD_ERROR("tokenizer: %s is not an integer", key);
        return st;
    }
    *out = v < -1 ? -2 : v; /* -2 is reported as out of range by build */
    return SD_OK;
}

static sd_status get_text(const sd_gguf *g, const char *key, bool required, sd_tok_text *out) {
    sd_gguf_str s;
    sd_status st = sd_gguf_get_str(g, key, &s);
    if (st == SD_ERR_NOT_FOUND && !required) {
        *out = (sd_tok_text){"", 0};
        return SD_OK;
    }
    if (st != SD_OK) {
        SD_ERROR("tokenizer: %s is %s", key, st == SD_ERR_NOT_FOUND ? "missing" : "not a string");
        return st == SD_ERR_NOT_FOUND ? SD_ERR_FORMAT : st;
    }
    *out = (sd_tok_text){s.ptr, (size_t)s.len};
    return SD_OK;
}

/* A bool flag; def when absent. */
static sd_status get_flag(const sd_gguf *g, const char *key, bool def, bool *out) {
    bool v = def;
    sd_status st = sd_gguf_get_bool(g, key, &v);
    if (st == SD_ERR_NOT_FOUND)
        v = def;
    else if (st != SD_OK) {
        SD_ERROR("tokenizer: %s is not a bool", key);
        return st;
    }
    *out = v;
    return SD_OK;
}

/* SentencePiece scores: a float32 array of one entry per token (required:
 * without scores or merges nothing can merge). Caller frees *out. */
static sd_status get_scores(const sd_gguf *g, size_t n_tokens, float **out) {
    *out = NULL;
    const char *key = KEY_PREFIX "scores";
    sd_gguf_type et;
    uint64_t len;
    sd_status st = sd_gguf_get_arr(g, key, &et, &len);
    if (st != SD_OK || et != SD_GGUF_TYPE_FLOAT32 || len != n_tokens) {
        SD_ERROR("tokenizer: %s must be a float32 array of %zu entries (one per token)", key, n_tokens);
        return st == SD_OK || st == SD_ERR_NOT_FOUND ? SD_ERR_FORMAT : st;
    }
    const void *data;
    SD_TRY(sd_gguf_get_arr_data(g, key, &data, &len));
    float *scores = malloc((n_tokens ? n_tokens : 1) * sizeof *scores);
    if (!scores) return SD_ERR_NOMEM;
    if (n_tokens) memcpy(scores, data, n_tokens * sizeof *scores);
    *out = scores;
    return SD_OK;
}

/* Phi-3's special tokens swallow the whitespace after them (rstrip in its
 * tokenizer.json); a GGUF does not store that, so llama.cpp sets it by the
 * model's name, and so does this: every control, user-defined and unknown
 * token and </s>, except <unk>, <s> and <|endoftext|>. NULL otherwise. */
static sd_status phi3_rstrip(const sd_gguf *g, const sd_tok_text *tokens, const int32_t *types, size_t n,
                             uint8_t **out) {
    *out = NULL;
    sd_gguf_str name;
    if (sd_gguf_get_str(g, "general.name", &name) != SD_OK) return SD_OK;
    char low[256];
    size_t l = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
    for (size_t i = 0; i < l; i++)
        low[i] = (char)(name.ptr[i] >= 'A' && name.ptr[i] <= 'Z' ? name.ptr[i] + 32 : name.ptr[i]);
    low[l] = '\0';
    if (!strstr(low, "phi-3") && !strstr(low, "phi3")) return SD_OK;
    uint8_t *r = calloc(n ? n : 1, 1);
    if (!r) return SD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        sd_tok_text tx = tokens[i];
        int32_t ty = types ? types[i] : SD_TOK_TYPE_NORMAL;
        bool eq_unk = tx.len == 5 && memcmp(tx.ptr, "<unk>", 5) == 0,
             eq_s = tx.len == 3 && memcmp(tx.ptr, "<s>", 3) == 0;
        bool eq_eot = tx.len == 13 && memcmp(tx.ptr, "<|endoftext|>", 13) == 0;
        bool eq_eos = tx.len == 4 && memcmp(tx.ptr, "</s>", 4) == 0;
        bool special = ty == SD_TOK_TYPE_CONTROL || ty == SD_TOK_TYPE_USER_DEFINED || ty == SD_TOK_TYPE_UNKNOWN;
        r[i] = (special || eq_eos) && !eq_unk && !eq_s && !eq_eot;
    }
    *out = r;
    return SD_OK;
}

static sd_status gather_and_build(const sd_gguf *g, sd_tok_spec *spec, sd_tok **out) {
    SD_TRY(get_text(g, KEY_PREFIX "model", true, &spec->model));
    SD_TRY(get_text(g, KEY_PREFIX "pre", false, &spec->pre));
    SD_TRY(get_id(g, KEY_PREFIX "bos_token_id", &spec->bos));
    SD_TRY(get_id(g, KEY_PREFIX "eos_token_id", &spec->eos));
    SD_TRY(get_id(g, KEY_PREFIX "unknown_token_id", &spec->unk));
    SD_TRY(get_id(g, KEY_PREFIX "padding_token_id", &spec->pad));
    SD_TRY(get_id(g, KEY_PREFIX "eot_token_id", &spec->eot));
    bool spm = spec->model.len == 5 && memcmp(spec->model.ptr, "llama", 5) == 0;
    bool gpt2 = spec->model.len == 4 && memcmp(spec->model.ptr, "gpt2", 4) == 0;
    /* llama.cpp's defaults: SentencePiece adds BOS and a space prefix unless
     * the file says otherwise; byte-level BPE adds neither. */
    bool add_space_prefix = spm;
    SD_TRY(get_flag(g, KEY_PREFIX "add_bos_token", spm, &spec->add_bos));
    SD_TRY(get_flag(g, KEY_PREFIX "add_eos_token", false, &spec->add_eos));
    SD_TRY(get_flag(g, KEY_PREFIX "add_space_prefix", spm, &add_space_prefix));
    spec->space_prefix = add_space_prefix ? SD_TOK_SPACE_PREFIX_ALWAYS : SD_TOK_SPACE_PREFIX_NONE;
    /* Check the model before the big arrays so an unsupported tokenizer gets
     * the clear "unsupported" error, not a complaint about missing merges. */
    if (!spm && !gpt2) return sd_tok_build(spec, out);

    sd_tok_text *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    size_t n_tokens = 0, n_merges = 0;
    sd_status st = get_str_array(g, KEY_PREFIX "tokens", true, &tokens, &n_tokens);
    if (st == SD_OK) st = get_str_array(g, KEY_PREFIX "merges", gpt2, &merges, &n_merges);
    if (st == SD_OK) st = get_types(g, n_tokens, &types);
    if (st == SD_OK && spm && n_merges == 0) st = get_scores(g, n_tokens, &scores);
    uint8_t *rstrip = NULL;
    if (st == SD_OK) st = phi3_rstrip(g, tokens, types, n_tokens, &rstrip);
    spec->rstrip = rstrip;
    if (st == SD_OK) {
        spec->tokens = tokens;
        spec->n_tokens = n_tokens;
        spec->merges = merges;
        spec->n_merges = n_merges;
        spec->types = types;
        spec->scores = scores;
        st = sd_tok_build(spec, out);
    }
    free(tokens);
    free(merges);
    free(types);
    free(scores);
    free(rstrip);
    return st;
}

sd_status sd_tok_from_gguf(const sd_gguf *g, sd_tok **out) {
    if (!g || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_tok_spec spec = sd_tok_spec_default();
    return gather_and_build(g, &spec, out);
}
