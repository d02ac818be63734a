/* gguf_dump.c — test helper: list a GGUF file, or dump tensors as f32.
 *
 *   gguf_dump FILE                 prints version, every key (type, value or
 *                                  array summary) and every tensor (name, type,
 *                                  dims, bytes)
 *   gguf_dump FILE TENSOR OUT      writes TENSOR dequantized to raw
 *                                  little-endian f32 in OUT
 *   gguf_dump FILE --to DIR [TENSOR...]
 *                                  writes the named tensors (all if none) so,
 *                                  the i-th of the file (from 0) to DIR/i.f32
 *
 * Used by tests/ref/test_dequant.py to compare sd_dequantize with the gguf
 * Python package (--to: one process per file, not per tensor; under ASan
 * the process starts were most of that test's time), and by hand to inspect
 * files. */
#include "specd/gguf.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_name(sd_gguf_type t) {
    static const char *names[] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
                                  "bool", "str", "arr", "u64", "i64", "f64"};
    return t < SD_GGUF_TYPE_COUNT ? names[t] : "?";
}

static void print_kv(const sd_gguf *g, int64_t i) {
    const char *key = sd_gguf_key(g, i);
    sd_gguf_type t = sd_gguf_kv_type(g, i);
    printf("kv %s %s", key, type_name(t));
    uint64_t u;
    int64_t s;
    float f;
    bool b;
    sd_gguf_str str;
    sd_gguf_type et;
    if (t == SD_GGUF_TYPE_STRING && sd_gguf_get_str(g, key, &str) == SD_OK)
        printf(" %.*s", str.len > 60 ? 60 : (int)str.len, str.ptr);
    else if (t == SD_GGUF_TYPE_ARRAY && sd_gguf_get_arr(g, key, &et, &u) == SD_OK)
        printf(" [%s x %" PRIu64 "]", type_name(et), u);
    else if (sd_gguf_get_u64(g, key, &u) == SD_OK)
        printf(" %" PRIu64, u);
    else if (sd_gguf_get_i64(g, key, &s) == SD_OK)
        printf(" %" PRId64, s);
    else if (sd_gguf_get_f32(g, key, &f) == SD_OK)
        printf(" %g", (double)f);
    else if (sd_gguf_get_bool(g, key, &b) == SD_OK)
        printf(" %s", b ? "true" : "false");
    printf("\n");
}

/* Writes tensor t dequantized to raw f32 in path; 0 or 1 (said on stderr). */
static int dump_tensor(const sd_gguf_tensor *t, const char *path) {
    float *buf = malloc(t->n_elems ? (size_t)t->n_elems * sizeof(float) : 1);
    FILE *f = NULL;
    int rc = 0;
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", t->name);
        rc = 1;
    } else if (sd_dequantize(t->type, t->data, t->n_elems, buf) != SD_OK) {
        fprintf(stderr, "%s: dequantize failed\n", t->name);
        rc = 1;
    } else if (!(f = fopen(path, "wb")) || fwrite(buf, sizeof(float), (size_t)t->n_elems, f) != t->n_elems) {
        fprintf(stderr, "cannot write %s\n", path);
        rc = 1;
    }
    if (f && fclose(f) != 0) rc = 1;
    free(buf);
    return rc;
}

int main(int argc, char **argv) {
    const bool to_dir = argc >= 4 && strcmp(argv[2], "--to") == 0;
    if (argc != 2 && argc != 4 && !to_dir) {
        fprintf(stderr, "usage: %s FILE [TENSOR OUT.f32 | --to DIR [TENSOR...]]\n", argv[0]);
        return 2;
    }
    char err[512];
    sd_gguf *g = NULL;
    sd_status s = sd_gguf_open(argv[1], &g, err, sizeof err);
    if (s != SD_OK) {
        fprintf(stderr, "%s: %s (%s)\n", argv[1], err, sd_status_str(s));
        return 1;
    }
    int rc = 0;
    if (argc == 2) {
        printf("version %u\nn_kv %" PRId64 "\nn_tensors %" PRId64 "\n", sd_gguf_version(g), sd_gguf_n_kv(g),
               sd_gguf_n_tensors(g));
        for (int64_t i = 0; i < sd_gguf_n_kv(g); i++) print_kv(g, i);
        for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
            const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
            printf("tensor %s %s [", t->name, sd_dtype_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ",%" PRIu64 : "%" PRIu64, t->ne[d]);
            printf("] %" PRIu64 " bytes\n", t->n_bytes);
        }
    } else if (to_dir) {
        for (int a = 4; a < argc && rc == 0; a++)
            if (!sd_gguf_find_tensor(g, argv[a])) {
                fprintf(stderr, "no tensor '%s'\n", argv[a]);
                rc = 1;
            }
        for (int64_t i = 0; i < sd_gguf_n_tensors(g) && rc == 0; i++) {
            const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
            bool named = argc == 4;
            for (int a = 4; a < argc && !named; a++) named = strcmp(argv[a], t->name) == 0;
            if (!named) continue;
            char path[4096];
            if (snprintf(path, sizeof path, "%s/%" PRId64 ".f32", argv[3], i) >= (int)sizeof path) {
                fprintf(stderr, "%s: path too long\n", argv[3]);
                rc = 1;
            } else {
                rc = dump_tensor(t, path);
            }
        }
    } else {
        const sd_gguf_tensor *t = sd_gguf_find_tensor(g, argv[2]);
        if (!t) {
            fprintf(stderr, "no tensor '%s'\n", argv[2]);
            rc = 1;
        } else {
            rc = dump_tensor(t, argv[3]);
        }
    }
    sd_gguf_close(&g);
    return rc;
}
