/* fuzz_gguf.c — libFuzzer target for the GGUF reader and sd_dequantize.
 *
 * Opens the input with sd_gguf_open_memory; when it is accepted, walks every
 * key through every typed getter, every string array element (up to a cap),
 * every tensor (lookup by name must find the same entry) and dequantizes the
 * small tensors, so that a file which passes validation but lies somewhere
 * is caught by ASan/UBSan. Linked with replay.c it becomes a plain
 * program that runs each file named on its command line (the CTest replay of
 * fuzz/corpus/gguf, built by every compiler). */
#include "specd/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEQUANT_ELEMS (1u << 16)
#define MAX_ARRAY_WALK 256

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
    sd_gguf_close(&g);
    return 0;
}
