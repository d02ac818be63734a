/* specd-quantize — rewrite a GGUF model with its matrices in another type.
 *
 *   specd-quantize IN.gguf OUT.gguf TYPE      TYPE: f32 f16 bf16 q8_0 q4_0 q4_1
 *
 * Every metadata entry is copied (general.file_type is set to TYPE's ggml
 * file type). Each 2-D tensor whose rows are whole blocks of TYPE is
 * dequantized to f32 (sd_dequantize) and encoded as TYPE (sd_quantize, the
 * round-to-nearest reference quantizers); 1-D tensors (norms) and matrices
 * whose rows are not whole blocks are written as F32. From the demo Q4_1
 * model it makes an F16 or Q8_0 target and a Q4_0 draft (re-quantizing an
 * already quantized file adds the new format's rounding to the old one's).
 *
 * Rejected: importance-weighted or K-quant encoders (llama.cpp's quantize
 * does those); this tool exists so every format the CPU kernels compute on
 * can be produced from a file at hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/gguf.h"

static const struct {
    const char *name;
    sd_dtype type;
    uint32_t file_type; /* ggml's general.file_type (llama_ftype) */
} types[] = {
    {"f32", SD_DTYPE_F32, 0},   {"f16", SD_DTYPE_F16, 1},   {"bf16", SD_DTYPE_BF16, 32},
    {"q8_0", SD_DTYPE_Q8_0, 7}, {"q4_0", SD_DTYPE_Q4_0, 2}, {"q4_1", SD_DTYPE_Q4_1, 3},
};

static void usage(FILE *f) {
    fprintf(f, "usage: specd-quantize IN.gguf OUT.gguf TYPE\n"
               "  TYPE: f32, f16, bf16, q8_0, q4_0 or q4_1 (the matrices; norms stay f32)\n");
}

/* Converts tensor t of g into type (or F32, see the file comment) and adds
 * it to w. *bytes_out gets the size written. */
static sd_status convert_tensor(sd_gguf_writer *w, const sd_gguf_tensor *t, sd_dtype type, size_t *bytes_out) {
    uint64_t n = t->n_elems; /* checked against the file at open */
    size_t be, bb;
    sd_dtype out_type = type;
    if (t->n_dims != 2 || !sd_dtype_block(type, &be, &bb) || t->ne[0] % be != 0) out_type = SD_DTYPE_F32;
    sd_dtype_block(out_type, &be, &bb);
    size_t f32_bytes, q_bytes;
    if (!sd_mul_ok((size_t)n, sizeof(float), &f32_bytes) || !sd_mul_ok((size_t)(n / be), bb, &q_bytes))
        return SD_ERR_NOMEM;
    float *f = malloc(f32_bytes ? f32_bytes : 1);
    void *q = malloc(q_bytes ? q_bytes : 1);
    sd_status s = f && q ? SD_OK : SD_ERR_NOMEM;
    if (s == SD_OK) s = sd_dequantize(t->type, t->data, n, f);
    if (s == SD_OK) s = sd_quantize(out_type, f, n, q);
    if (s == SD_OK) s = sd_gguf_writer_add_tensor(w, t->name, out_type, t->n_dims, t->ne, q);
    free(f);
    free(q);
    *bytes_out = q_bytes;
    return s;
}

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 4) {
        usage(stderr);
        return 2;
    }
    int ti = -1;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(argv[3], types[i].name)) ti = (int)i;
    if (ti < 0) {
        fprintf(stderr, "specd-quantize: unknown type '%s'\n", argv[3]);
        usage(stderr);
        return 2;
    }
    char err[256];
    sd_gguf *g = NULL;
    sd_status s = sd_gguf_open(argv[1], &g, err, sizeof err);
    if (s != SD_OK) {
        fprintf(stderr, "specd-quantize: %s: %s\n", argv[1], err);
        return 1;
    }
    sd_gguf_writer *w = sd_gguf_writer_new();
    s = w ? sd_gguf_writer_copy_kv(w, g, "") : SD_ERR_NOMEM;
    if (s == SD_OK) s = sd_gguf_writer_set_u32(w, "general.file_type", types[ti].file_type);
    size_t total = 0;
    for (int64_t i = 0; s == SD_OK && i < sd_gguf_n_tensors(g); i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
        size_t bytes = 0;
        s = convert_tensor(w, t, types[ti].type, &bytes);
        if (s != SD_OK)
            fprintf(stderr, "specd-quantize: %s (%s): %s\n", t->name, sd_dtype_name(t->type), sd_status_str(s));
        total += bytes;
    }
    if (s == SD_OK) s = sd_gguf_writer_write(w, argv[2]);
    if (s == SD_OK)
        printf("specd-quantize: wrote %s: %lld tensors, %.1f MB of tensor data, matrices as %s\n", argv[2],
               (long long)sd_gguf_n_tensors(g), (double)total / 1e6, sd_dtype_name(types[ti].type));
    else
        fprintf(stderr, "specd-quantize: cannot write %s: %s\n", argv[2], sd_status_str(s));
    sd_gguf_writer_free(&w);
    sd_gguf_close(&g);
    return s == SD_OK ? 0 : 1;
}
