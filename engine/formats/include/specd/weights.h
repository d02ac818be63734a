/* weights.h — where a model's config, tokenizer and tensors come from.
 *
 * A weights source is a GGUF file or a Hugging Face checkpoint directory
 * (config.json, *.safetensors, tokenizer.json). Callers see one interface:
 * the llama config, the tokenizer, and tensors by their GGUF names
 * ("token_embd.weight", "blk.3.attn_q.weight", ...), read as f32 one
 * rectangle at a time. A rectangle (a row range and a column range of a 2-D
 * weight [rows][cols], GGUF ne = [cols, rows]) is what a tensor-parallel rank
 * loads: only those bytes of the memory-mapped file are touched.
 *
 * A source translates its own layout: a safetensors source maps HF names to
 * GGUF names and un-permutes the Q/K rows (HF rotates half-split pairs, GGUF
 * adjacent pairs), so the model sees the same f32 numbers from either file.
 *
 * Rejected: converting a checkpoint into an in-memory GGUF. It would copy
 * every weight once more and hide which slice a rank really reads. */
#ifndef SPECD_WEIGHTS_H
#define SPECD_WEIGHTS_H

#include "specd/common.h"
#include "specd/identity.h"
#include "specd/gguf.h"
#include "specd/model_config.h"
#include "specd/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_weights sd_weights;

/* Shape and stored type of one tensor. For a 2-D tensor ne[0] is the row
 * length (columns) and ne[1] the number of rows; 1-D tensors have ne[1] = 1. */
typedef struct sd_weights_tensor {
    sd_dtype type;   /* type as stored in the file */
    uint32_t n_dims; /* 1 or 2 */
    int64_t ne[2];
} sd_weights_tensor;

/* Opens path: a GGUF file, or a directory holding a Hugging Face checkpoint.
 * Validates the container; tensors are memory-mapped, not read. Caller
 * frees with sd_weights_close. */
sd_status sd_weights_open(const char *path, sd_weights **out);

/* A source over an already open GGUF (borrowed: g must outlive *out). */
sd_status sd_weights_from_gguf(const sd_gguf *g, sd_weights **out);

void sd_weights_close(sd_weights **w);

/* "gguf" or "safetensors". */
const char *sd_weights_format(const sd_weights *w);

/* The underlying GGUF when the source is one, else NULL (borrowed). */
const sd_gguf *sd_weights_gguf(const sd_weights *w);

/* The llama config, validated (see sd_model_config_from_gguf). */
sd_status sd_weights_config(const sd_weights *w, sd_model_config *cfg);

/* A new tokenizer built from the source's vocabulary. Caller frees it. */
sd_status sd_weights_tokenizer(const sd_weights *w, sd_tok **out);

/* Looks up a tensor by GGUF name; false (info untouched) when absent. */
bool sd_weights_find(const sd_weights *w, const char *name, sd_weights_tensor *info);

/* Reads rows [row0, row0+n_rows) x columns [col0, col0+n_cols) of tensor
 * name as f32 into dst [n_rows][n_cols]. For quantized types col0 and n_cols
 * must be multiples of the type's block size (SD_ERR_UNSUPPORTED otherwise,
 * with a log line). SD_ERR_NOT_FOUND / SD_ERR_RANGE for a bad name or
 * rectangle; SD_ERR_FORMAT, naming the tensor, row and column, when a value
 * read is NaN or infinite. Thread-safe: ranks may read concurrently. */
sd_status sd_weights_read(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                          int64_t n_cols, float *dst);

/* Copies the same rectangle as sd_weights_read in its stored type (info's
 * type from sd_weights_find): n_rows rows of n_cols / block_elems blocks of
 * block_bytes (sd_dtype_block), into dst of dst_bytes (at least that much).
 * col0 and n_cols must be multiples of the block size, and the source must
 * be able to hand out stored bytes (GGUF and safetensors can);
 * SD_ERR_UNSUPPORTED otherwise, and the caller falls back to
 * sd_weights_read. Every value is checked as sd_weights_read checks it
 * (the rows are dequantized one at a time to scan them): SD_ERR_FORMAT on a
 * NaN or an infinity. Thread-safe like sd_weights_read. */
sd_status sd_weights_read_stored(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                                 int64_t n_cols, void *dst, size_t dst_bytes);

/* A read-only file mapping with a count of references (file_map.c): the
 * weights source holds one, and whoever points into it takes one more, so
 * the mapping outlives the source. The last release unmaps. */
typedef struct sd_file_map sd_file_map;

/* Takes ownership of an mmap'ed [base, base + size) with one reference;
 * NULL when out of memory (the mapping is then still the caller's). */
sd_file_map *sd_file_map_adopt(const void *base, size_t size);
sd_file_map *sd_file_map_retain(sd_file_map *m);
void sd_file_map_release(sd_file_map **m);
size_t sd_file_map_size(const sd_file_map *m);

/* Points *ptr at the same rectangle as sd_weights_read_stored, inside the
 * source's file mapping, without copying, and gives *keep a reference to
 * that mapping (release it with sd_file_map_release after the last use of
 * *ptr). Only whole rows are contiguous in the file: col0 must be 0 and
 * n_cols the tensor's row length. Values are checked as
 * sd_weights_read_stored checks them. SD_ERR_UNSUPPORTED (nothing taken)
 * when the source is not a mapped file or the rectangle is not whole rows:
 * the caller then copies with sd_weights_read_stored. */
sd_status sd_weights_map_stored(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                                int64_t n_cols, const void **ptr, sd_file_map **keep);

/* Reads the identity of the model at path (a GGUF file or a Hugging Face
 * checkpoint directory) from its config and tokenizer only (no weights are
 * read): what a worker reports in Hello. Errors are logged with the path. */
sd_status sd_weights_identity(const char *path, sd_model_identity *id);

/* How a Hugging Face checkpoint stores a tensor other than the engine
 * (and GGUF) holds it. */
typedef struct sd_weights_hf_layout {
    bool rope_rows; /* llama q/k: rows in rotate-half order within each head (un-permuted on read) */
    bool plus_one;  /* a Gemma 3 norm weight: HF stores w, the engine multiplies by 1 + w */
} sd_weights_hf_layout;

/* The one GGUF -> Hugging Face tensor-name table: writes the HF name of the
 * GGUF tensor gguf of an arch model of n_layers layers into out, and how
 * its stored values differ (*how); false for a name the architecture's
 * checkpoints do not have or that does not fit in cap. */
bool sd_weights_hf_name(sd_model_arch arch, const char *gguf, int32_t n_layers, char *out, size_t cap,
                        sd_weights_hf_layout *how);

#ifdef __cplusplus
}
#endif
#endif
