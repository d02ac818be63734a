/* safetensors.h — read-only access to one .safetensors file (and a writer
 * for tools and tests).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * UTF-8 JSON mapping tensor names to {dtype, shape, data_offsets} (plus an
 * optional "__metadata__" map of strings), then the data section: every
 * tensor's bytes, row-major, back to back. The file is memory-mapped and the
 * header validated completely at open, with the rules of the reference
 * implementation (huggingface/safetensors): header size cap, UTF-8 JSON
 * object, known dtypes, overflow-checked sizes equal to the offsets' span,
 * offsets contiguous from 0 without holes or overlaps covering the whole data
 * section, no duplicate names, "__metadata__" a string map. A file that
 * breaks a rule is rejected with SD_ERR_FORMAT and a message that starts with
 * the rule's name ("InvalidOffset: ..."), written to the caller's err buffer
 * and to the log. Tensor data is never copied: sd_safetensors_tensor.data points into
 * the mapping. */
#ifndef SPECD_SAFETENSORS_H
#define SPECD_SAFETENSORS_H

#include "specd/common.h"
#include "specd/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The reference implementation's cap on the header length N. */
#define SD_SAFETENSORS_MAX_HEADER 100000000ull

/* Every dtype the format defines (sizes in bits: the F4/F6 types pack
 * below a byte). Only F32, F16 and BF16 hold model weights here. */
typedef enum sd_safetensors_dtype {
    SD_SAFETENSORS_BOOL,
    SD_SAFETENSORS_U8,
    SD_SAFETENSORS_I8,
    SD_SAFETENSORS_F8_E5M2,
    SD_SAFETENSORS_F8_E4M3,
    SD_SAFETENSORS_F8_E8M0,
    SD_SAFETENSORS_F4,
    SD_SAFETENSORS_F6_E2M3,
    SD_SAFETENSORS_F6_E3M2,
    SD_SAFETENSORS_I16,
    SD_SAFETENSORS_U16,
    SD_SAFETENSORS_F16,
    SD_SAFETENSORS_BF16,
    SD_SAFETENSORS_I32,
    SD_SAFETENSORS_U32,
    SD_SAFETENSORS_F32,
    SD_SAFETENSORS_F64,
    SD_SAFETENSORS_I64,
    SD_SAFETENSORS_U64,
    SD_SAFETENSORS_DTYPE_COUNT
} sd_safetensors_dtype;

/* The format's name of t ("BF16"), or "?" out of range. */
const char *sd_safetensors_dtype_name(sd_safetensors_dtype t);
/* Bits per element of t (0 out of range). */
uint32_t sd_safetensors_dtype_bits(sd_safetensors_dtype t);
/* The engine type of t: true for F32, F16, BF16 (*out set), else false. */
bool sd_safetensors_dtype_to_sd(sd_safetensors_dtype t, sd_dtype *out);

typedef struct sd_safetensors sd_safetensors;

typedef struct sd_safetensors_tensor {
    const char *name; /* borrowed: valid while the sd_safetensors is open */
    sd_safetensors_dtype dtype;
    uint32_t n_dims;       /* 0 for a scalar */
    const uint64_t *shape; /* [n_dims], outermost first (row-major), borrowed */
    uint64_t n_elems;
    uint64_t n_bytes;
    const void *data; /* borrowed: points into the mapping (any alignment) */
} sd_safetensors_tensor;

/* Opens and validates path. On success *out owns the mapping; the caller
 * frees it with sd_safetensors_close. On failure returns SD_ERR_IO / SD_ERR_FORMAT /
 * SD_ERR_NOMEM and, when err != NULL, writes a one-line reason starting with
 * the broken rule's name into err (err_len bytes, NUL-terminated). */
sd_status sd_safetensors_open(const char *path, sd_safetensors **out, char *err, size_t err_len);

/* Same as sd_safetensors_open over a caller-owned buffer (fuzzing, tests); the
 * buffer must outlive the returned handle. */
sd_status sd_safetensors_open_memory(const void *data, size_t size, sd_safetensors **out, char *err, size_t err_len);

/* Unmaps and frees *st, sets *st = NULL. NULL-safe. */
void sd_safetensors_close(sd_safetensors **st);

/* Tensors in data-section order. */
int64_t sd_safetensors_n_tensors(const sd_safetensors *st);
/* Borrowed info for tensor i (0 <= i < n_tensors), or NULL. */
const sd_safetensors_tensor *sd_safetensors_tensor_at(const sd_safetensors *st, int64_t i);
/* Borrowed info for the tensor named name, or NULL (O(log n)). */
const sd_safetensors_tensor *sd_safetensors_find(const sd_safetensors *st, const char *name);

/* "__metadata__" entries, in file order. */
int64_t sd_safetensors_n_metadata(const sd_safetensors *st);
/* Borrowed key and value of entry i; false when i is out of range. */
bool sd_safetensors_metadata_at(const sd_safetensors *st, int64_t i, const char **key, const char **value);
/* Borrowed value of key, or NULL. */
const char *sd_safetensors_metadata(const sd_safetensors *st, const char *key);

/* ---- writer (tools and tests) ----
 * Accumulates tensors (copied) and metadata in memory and writes a file the
 * way the reference does: header padded with spaces to a multiple of 8,
 * tensors in the order added. Not thread-safe. */
typedef struct sd_safetensors_writer sd_safetensors_writer;

/* Returns a new writer (caller frees with sd_safetensors_writer_free), or NULL. */
sd_safetensors_writer *sd_safetensors_writer_new(void);
void sd_safetensors_writer_free(sd_safetensors_writer **w);
/* Sets "__metadata__"[key] = value (both copied; an existing key is replaced). */
sd_status sd_safetensors_writer_set_metadata(sd_safetensors_writer *w, const char *key, const char *value);
/* Adds a tensor of shape [n_dims] (outermost first) whose bytes, as implied
 * by dtype and shape, are copied from data. SD_ERR_INVALID_ARG for a name
 * already added, "__metadata__", or a sub-byte total. */
sd_status sd_safetensors_writer_add_tensor(sd_safetensors_writer *w, const char *name, sd_safetensors_dtype dtype,
                                           uint32_t n_dims, const uint64_t *shape, const void *data);
/* Bytes of tensor data added so far. */
uint64_t sd_safetensors_writer_data_bytes(const sd_safetensors_writer *w);
/* Writes the file (to PATH.tmp, then renamed). */
sd_status sd_safetensors_writer_write(const sd_safetensors_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
