/* fuzz_safetensors.c — libFuzzer target for the safetensors header reader.
 *
 * Opens the input with sd_safetensors_open_memory. A refusal must say why and return
 * no handle; an accepted file is walked completely — every tensor found
 * again by name, its first and last byte read, F32/F16/BF16 tensors
 * converted to f32, every metadata entry looked up — so a header that
 * passes validation but lies about where its bytes are is caught by
 * ASan/UBSan. Linked with replay.c it is a plain program that runs
 * each file named on its command line (the CTest replay of
 * fuzz/corpus/safetensors, built by every compiler). */
#include "specd/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONVERT_ELEMS (1u << 16)

static void walk_tensor(const sd_safetensors *st, int64_t i) {
    const sd_safetensors_tensor *t = sd_safetensors_tensor_at(st, i);
    if (!t || sd_safetensors_find(st, t->name) != t) abort(); /* names are unique and indexed */
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= t->shape[d];
    if (n != t->n_elems) abort();
    volatile uint8_t sink = 0;
    if (t->n_bytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->n_bytes - 1];
    (void)sink;
    sd_dtype dt;
    if (!sd_safetensors_dtype_to_sd(t->dtype, &dt) || t->n_elems > MAX_CONVERT_ELEMS || t->n_elems == 0) return;
    float *out = malloc((size_t)t->n_elems * sizeof *out);
    if (!out) return;
    if (sd_dequantize(dt, t->data, t->n_elems, out) != SD_OK) abort();
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
    sd_safetensors *st = NULL;
    if (sd_safetensors_open_memory(data, size, &st, err, sizeof err) != SD_OK) {
        if (st || err[0] == '\0' || !strchr(err, ':')) abort(); /* "Rule: why", and no handle */
        return 0;
    }
    for (int64_t i = 0; i < sd_safetensors_n_tensors(st); i++) walk_tensor(st, i);
    const char *key, *value;
    for (int64_t i = 0; sd_safetensors_metadata_at(st, i, &key, &value); i++)
        if (!sd_safetensors_metadata(st, key)) abort();
    sd_safetensors_close(&st);
    return 0;
}
