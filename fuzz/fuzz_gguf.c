/* fuzz_gguf.c — libFuzzer target for the GGUF reader, sd_dequantize and
 * what is built from a GGUF: the model config, the tokenizer, a small model.
 *
 * Opens the input with sd_gguf_open_memory; when it is accepted, walks every
 * key through every typed getter, every string array element (up to a cap),
 * every tensor (lookup by name must find the same entry) and dequantizes the
 * small tensors, so that a file which passes validation but lies somewhere
 * is caught by ASan/UBSan. Then it reads the file as a model file would be
 * read: the config (refused or sane), the tokenizer (refused, or one whose
 * every piece can be looked up and which encodes a text), and, when the
 * tensors are small, the whole model (refused with a message, or loaded and
 * run for one token). Linked with replay.c it becomes a plain
 * program that runs each file named on its command line (the CTest replay of
 * fuzz/corpus/gguf, built by every compiler). */
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEQUANT_ELEMS (1u << 16)
#define MAX_ARRAY_WALK    256

static void walk_kv(const sd_gguf *g, int64_t i) {
    const char *key = sd_gguf_key(g, i);
    if (!key || sd_gguf_find_key(g, key) != i) abort(); /* lookups must agree with the index */
    uint64_t u64;
    uint32_t u32;
    int64_t i64;
    float f;
    bool b;
    sd_gguf_str s;
    sd_gguf_type et;
    uint64_t len;
    const void *data;
    volatile uint8_t sink = 0;
    (void)sd_gguf_get_u64(g, key, &u64);
    (void)sd_gguf_get_u32(g, key, &u32);
    (void)sd_gguf_get_i64(g, key, &i64);
    (void)sd_gguf_get_f32(g, key, &f);
    (void)sd_gguf_get_bool(g, key, &b);
    if (sd_gguf_get_str(g, key, &s) == SD_OK)
        for (uint64_t j = 0; j < s.len; j++) sink ^= (uint8_t)s.ptr[j];
    if (sd_gguf_get_arr(g, key, &et, &len) == SD_OK) {
        for (uint64_t j = 0; j < len && j < MAX_ARRAY_WALK; j++)
            if (sd_gguf_get_arr_str(g, key, j, &s) == SD_OK && s.len) sink ^= (uint8_t)s.ptr[s.len - 1];
        if (sd_gguf_get_arr_data(g, key, &data, &len) == SD_OK && len) sink ^= ((const uint8_t *)data)[0];
    }
    (void)sink;
}

static void walk_tensor(const sd_gguf *g, int64_t i) {
    const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
    if (!t || sd_gguf_find_tensor(g, t->name) != t) abort();
    if (t->n_elems > MAX_DEQUANT_ELEMS) return;
    float *out = malloc((size_t)t->n_elems * sizeof *out);
    if (!out) return;
    if (sd_dequantize(t->type, t->data, t->n_elems, out) != SD_OK) abort(); /* validated tensors must decode */
    free(out);
}

#define MAX_LOAD_ELEMS (1u << 20) /* weights the model load may take (f32: 4 MB) */

static void as_model_file(const sd_gguf *g) {
    sd_model_config c;
    if (sd_model_config_from_gguf(g, &c) == SD_OK) {
        if (c.n_vocab < 1 || c.n_embd < 1 || c.n_layers < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.head_dim < 1 ||
            c.n_heads % c.n_kv_heads != 0)
            abort(); /* an accepted config is a usable one */
    }
    sd_tok *tok = NULL;
    if (sd_tok_from_gguf(g, &tok) == SD_OK) {
        int32_t n = sd_tok_n_vocab(tok);
        if (n < 1) abort();
        for (int32_t i = 0; i < n && i < MAX_ARRAY_WALK; i++) {
            size_t len = 0;
            if (!sd_tok_piece(tok, i, &len)) abort();
        }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        static const char text[] = "Hello <|im_start|>world \xff\x04 12345";
        if (sd_tok_encode(tok, text, sizeof text - 1, true, &ids, &n_ids) == SD_OK) {
            for (size_t i = 0; i < n_ids; i++)
                if (ids[i] < 0 || ids[i] >= n) abort();
            free(ids);
        }
        sd_tok_free(&tok);
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) total += sd_gguf_tensor_at(g, i)->n_elems;
    if (total > MAX_LOAD_ELEMS) return;
    sd_model_params p = sd_model_default_params();
    p.n_threads = 1;
    sd_model *m = NULL;
    if (sd_model_load(g, &p, &m) != SD_OK) {
        if (m) abort(); /* a refusal returns no model */
        return;
    }
    /* one token through the loaded model */
    sd_kv *kv = NULL;
    if (sd_model_kv_create(m, 1, 2, 16, &kv) == SD_OK) {
        int32_t token = 0, pos = 0, seq = 0;
        bool want = true;
        sd_batch b = {.n_tokens = 1, .tokens = &token, .pos = &pos, .seq = &seq, .logits = &want};
        float *logits = malloc((size_t)sd_model_config_of(m)->n_vocab * sizeof *logits);
        if (logits && sd_model_forward(m, kv, &b, logits) != SD_OK) abort(); /* a loaded model runs */
        free(logits);
        sd_kv_free(&kv);
    }
    sd_model_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool quiet;
    if (!quiet) {
        sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
        quiet = true;
    }
    char err[256];
    sd_gguf *g = NULL;
    if (sd_gguf_open_memory(data, size, &g, err, sizeof err) != SD_OK) {
        if (g || err[0] == '\0') abort(); /* a failure must say why and return no handle */
        return 0;
    }
    for (int64_t i = 0; i < sd_gguf_n_kv(g); i++) walk_kv(g, i);
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) walk_tensor(g, i);
    as_model_file(g);
    sd_gguf_close(&g);
    return 0;
}
