/* specd-quantize — rewrite a GGUF model with its matrices in another type.
 *
 *   specd-quantize [--pure] IN.gguf OUT.gguf TYPE
 *       TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m
 *
 * Every metadata entry is copied (general.file_type is set to TYPE's ggml
 * file type). Each 2-D tensor whose rows are whole blocks of TYPE is
 * dequantized to f32 (sd_dequantize) and encoded as TYPE (sd_quantize, the
 * round-to-nearest reference quantizers); 1-D tensors (norms) and matrices
 * whose rows are not whole blocks are written as F32. From the demo Q4_1
 * model it makes an F16 or Q8_0 target and a Q4_0 draft (re-quantizing an
 * already quantized file adds the new format's rounding to the old one's).
 *
 * The output matrix (the token embedding when it is tied) decides every
 * next token, and 4-bit rounding there moves a small model's argmax: the
 * demo model with a Q4_1 head answers "Der Spiess, der Spißfunk" to the
 * capital of Germany, with the file's own Q8_0 head "Berlin". So, as
 * llama.cpp's quantize does for its quantized types, every type below 8 bits
 * writes that matrix as Q6_K (then Q8_0 where rows are not whole
 * super-blocks, as in SmolLM2); f32, f16, bf16 and q8_0 keep it in TYPE.
 * `--pure` writes every matrix as TYPE (the tests use it to cover a 4-bit
 * LM head).
 *
 * K-quants store rows of whole 256-element super-blocks. A matrix whose rows
 * are not (e.g. SmolLM2-135M's 576-wide ones) takes a fallback in its place,
 * as llama.cpp's quantize does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, so
 * a Q4_K_M of SmolLM2 has the same type in every tensor as llama.cpp's. (Up
 * to 2026-11-29 specd had no Q5_0 / Q5_1 and fell back from Q4_K to Q4_1.)
 * The mixes q4_k_m / q5_k_m follow llama.cpp's
 * recipe for Q4_K_M / Q5_K_M: the output matrix at Q6_K (above), attn_v and
 * ffn_down at Q6_K in the layers where
 * more_bits() says (the first and last eighth and every third in between),
 * everything else at Q4_K / Q5_K.
 *
 * Rejected: importance-weighted encoders (llama.cpp's imatrix); this tool
 * exists so every format the CPU kernels compute on can be produced from a
 * file at hand, and its K-quant encoders are simple (engine/formats/quant_k.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/gguf.h"

static const struct {
    const char *name;
    sd_dtype type;
    bool mix;           /* the _m recipe: some matrices at Q6_K */
    uint32_t file_type; /* ggml's general.file_type (llama_ftype) */
} types[] = {
    {"f32", SD_DTYPE_F32, false, 0},     {"f16", SD_DTYPE_F16, false, 1},    {"bf16", SD_DTYPE_BF16, false, 32},
    {"q8_0", SD_DTYPE_Q8_0, false, 7},   {"q4_0", SD_DTYPE_Q4_0, false, 2},  {"q4_1", SD_DTYPE_Q4_1, false, 3},
    {"q5_0", SD_DTYPE_Q5_0, false, 8},   {"q5_1", SD_DTYPE_Q5_1, false, 9},  {"q4_k", SD_DTYPE_Q4_K, false, 14},
    {"q5_k", SD_DTYPE_Q5_K, false, 16},  {"q6_k", SD_DTYPE_Q6_K, false, 18}, {"q4_k_m", SD_DTYPE_Q4_K, true, 15},
    {"q5_k_m", SD_DTYPE_Q5_K, true, 17},
};

static void usage(FILE *f) {
    fprintf(f, "usage: specd-quantize [--pure] IN.gguf OUT.gguf TYPE\n"
               "  TYPE: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (the matrices; norms\n"
               "        stay f32),\n"
               "        q4_k_m or q5_k_m (Q4_K / Q5_K with attn_v and ffn_down of some layers at Q6_K,\n"
               "        llama.cpp's recipe). Below 8 bits the output matrix (the token embedding when\n"
               "        tied) is written as Q6_K, as llama.cpp does. K-quant matrices whose rows are not\n"
               "        whole 256-element super-blocks fall back as llama.cpp's do: Q4_K to Q5_0, Q5_K to\n"
               "        Q5_1, Q6_K to Q8_0.\n"
               "  --pure  every matrix as TYPE, the output matrix too (not for the _m mixes)\n");
}

/* llama.cpp's use_more_bits: layer i of n gets more bits in the _M mixes. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The layer of a "blk.N.*" tensor name, or -1. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && v >= 0 && v < 1 << 20 ? (int)v : -1;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Below 8 bits per weight: the types whose output matrix goes to Q6_K. */
static bool below_8_bits(sd_dtype t) {
    return t == SD_DTYPE_Q4_0 || t == SD_DTYPE_Q4_1 || t == SD_DTYPE_Q5_0 || t == SD_DTYPE_Q5_1 || t == SD_DTYPE_Q4_K ||
           t == SD_DTYPE_Q5_K;
}

/* The type tensor t of g is written as: base, or Q6_K for the output matrix
 * below 8 bits and where the mix says, then the K fallback when its rows are
 * not whole super-blocks, F32 for 1-D tensors and rows that are not whole
 * blocks (see the file comment). */
static sd_dtype target_type(const sd_gguf *g, const sd_gguf_tensor *t, sd_dtype base, bool mix, bool pure,
                            int n_layers) {
    if (t->n_dims != 2) return SD_DTYPE_F32;
    sd_dtype type = base;
    const bool tied = sd_gguf_find_tensor(g, "output.weight") == NULL;
    const bool output = !strcmp(t->name, "output.weight") || (tied && !strcmp(t->name, "token_embd.weight"));
    const int layer = layer_of(t->name);
    if (!pure && output && below_8_bits(base))
        type = SD_DTYPE_Q6_K;
    else if (mix && layer >= 0 && (ends_with(t->name, ".attn_v.weight") || ends_with(t->name, ".ffn_down.weight")) &&
             more_bits(layer, n_layers))
        type = SD_DTYPE_Q6_K;
    size_t be, bb;
    if (sd_dtype_is_k(type) && t->ne[0] % 256 != 0)
        type = type == SD_DTYPE_Q4_K ? SD_DTYPE_Q5_0 : type == SD_DTYPE_Q5_K ? SD_DTYPE_Q5_1 : SD_DTYPE_Q8_0;
    if (!sd_dtype_block(type, &be, &bb) || t->ne[0] % be != 0) return SD_DTYPE_F32;
    return type;
}

/* Converts tensor t into out_type and adds it to w. *bytes_out gets the
 * size written. */
static sd_status convert_tensor(sd_gguf_writer *w, const sd_gguf_tensor *t, sd_dtype out_type, size_t *bytes_out) {
    uint64_t n = t->n_elems; /* checked against the file at open */
    size_t be, bb;
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
    const bool pure = argc > 1 && !strcmp(argv[1], "--pure");
    if (pure) {
        argv++;
        argc--;
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
    if (pure && types[ti].mix) {
        fprintf(stderr, "specd-quantize: --pure and the mix %s exclude each other (use %.4s)\n", types[ti].name,
                types[ti].name);
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
    int n_layers = 0;
    for (int64_t i = 0; i < sd_gguf_n_tensors(g); i++) {
        int layer = layer_of(sd_gguf_tensor_at(g, i)->name);
        if (layer >= n_layers) n_layers = layer + 1;
    }
    size_t total = 0, count[64] = {0};
    for (int64_t i = 0; s == SD_OK && i < sd_gguf_n_tensors(g); i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(g, i);
        size_t bytes = 0;
        sd_dtype out = target_type(g, t, types[ti].type, types[ti].mix, pure, n_layers);
        s = convert_tensor(w, t, out, &bytes);
        if (s != SD_OK)
            fprintf(stderr, "specd-quantize: %s (%s): %s\n", t->name, sd_dtype_name(t->type), sd_status_str(s));
        if ((unsigned)out < 64) count[out]++;
        total += bytes;
    }
    if (s == SD_OK) s = sd_gguf_writer_write(w, argv[2]);
    if (s == SD_OK) {
        printf("specd-quantize: wrote %s: %lld tensors, %.1f MB of tensor data, matrices as %s (tensors:", argv[2],
               (long long)sd_gguf_n_tensors(g), (double)total / 1e6, types[ti].name);
        for (int k = 0; k < 64; k++)
            if (count[k]) printf(" %zu %s", count[k], sd_dtype_name((sd_dtype)k));
        printf(")\n");
    } else
        fprintf(stderr, "specd-quantize: cannot write %s: %s\n", argv[2], sd_status_str(s));
    sd_gguf_writer_free(&w);
    sd_gguf_close(&g);
    return s == SD_OK ? 0 : 1;
}
