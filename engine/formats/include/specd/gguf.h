/* gguf.h — read-only access to a GGUF v2/v3 file (and a writer for tools).
 *
 * The file is memory-mapped; metadata is parsed eagerly into an index at open
 * so that every count, length, offset and type id is validated once, before
 * any of it is used. A file that fails validation is rejected with
 * SD_ERR_FORMAT and a message naming what is wrong (written to the caller's
 * err buffer and to the log). Tensor data is never copied by the reader:
 * sd_gguf_tensor.data points into the mapping. */
#ifndef SPECD_GGUF_H
#define SPECD_GGUF_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_gguf sd_gguf;

/* GGUF metadata value types (values fixed by the format). */
typedef enum sd_gguf_type {
    SD_GGUF_TYPE_UINT8 = 0,
    SD_GGUF_TYPE_INT8 = 1,
    SD_GGUF_TYPE_UINT16 = 2,
    SD_GGUF_TYPE_INT16 = 3,
    SD_GGUF_TYPE_UINT32 = 4,
    SD_GGUF_TYPE_INT32 = 5,
    SD_GGUF_TYPE_FLOAT32 = 6,
    SD_GGUF_TYPE_BOOL = 7,
    SD_GGUF_TYPE_STRING = 8,
    SD_GGUF_TYPE_ARRAY = 9,
    SD_GGUF_TYPE_UINT64 = 10,
    SD_GGUF_TYPE_INT64 = 11,
    SD_GGUF_TYPE_FLOAT64 = 12,
    SD_GGUF_TYPE_COUNT
} sd_gguf_type;

/* Tensor element types (ggml type ids). Only these are accepted. */
typedef enum sd_dtype {
    SD_DTYPE_F32 = 0,
    SD_DTYPE_F16 = 1,
    SD_DTYPE_Q4_0 = 2,
    SD_DTYPE_Q4_1 = 3,
    SD_DTYPE_Q5_0 = 6,
    SD_DTYPE_Q5_1 = 7,
    SD_DTYPE_Q8_0 = 8,
    SD_DTYPE_Q4_K = 12, /* super-blocks of 256 (quant_k.c has the layouts) */
    SD_DTYPE_Q5_K = 13,
    SD_DTYPE_Q6_K = 14,
    SD_DTYPE_BF16 = 30,
} sd_dtype;

/* Name of a dtype ("Q4_1"), or "?" for an unknown id. */
const char *sd_dtype_name(sd_dtype t);
/* Elements per block and bytes per block for t; false for unknown types. */
bool sd_dtype_block(sd_dtype t, size_t *block_elems, size_t *block_bytes);

#define SD_GGUF_MAX_DIMS 4

typedef struct sd_gguf_tensor {
    const char *name; /* borrowed: valid while the sd_gguf is open */
    sd_dtype type;
    uint32_t n_dims;
    uint64_t ne[SD_GGUF_MAX_DIMS]; /* ne[0] is the fastest-varying (row length) */
    uint64_t n_elems;
    uint64_t n_bytes;
    const void *data; /* borrowed: points into the mapping */
} sd_gguf_tensor;

/* A string view into the mapping (not NUL-terminated). */
typedef struct sd_gguf_str {
    const char *ptr;
    uint64_t len;
} sd_gguf_str;

/* Opens and validates path. On success *out owns the mapping; the caller
 * frees it with sd_gguf_close. On failure returns SD_ERR_IO / SD_ERR_FORMAT /
 * SD_ERR_UNSUPPORTED and, when err != NULL, writes a one-line reason into
 * err (err_len bytes, NUL-terminated). */
sd_status sd_gguf_open(const char *path, sd_gguf **out, char *err, size_t err_len);

/* Same as sd_gguf_open but over a caller-owned buffer (fuzzing, tests). The
 * buffer must outlive the returned handle. */
sd_status sd_gguf_open_memory(const void *data, size_t size, sd_gguf **out, char *err, size_t err_len);

/* Unmaps and frees *g, sets *g = NULL. NULL-safe. */
void sd_gguf_close(sd_gguf **g);

uint32_t sd_gguf_version(const sd_gguf *g);

/* ---- metadata ---- */
int64_t sd_gguf_n_kv(const sd_gguf *g);
/* Index of key, or -1. */
int64_t sd_gguf_find_key(const sd_gguf *g, const char *key);
/* Borrowed key name of entry i (NUL-terminated copy owned by g). */
const char *sd_gguf_key(const sd_gguf *g, int64_t i);
sd_gguf_type sd_gguf_kv_type(const sd_gguf *g, int64_t i);

/* Typed scalar getters. Integer getters accept any integer type whose value
 * fits; return SD_ERR_NOT_FOUND when the key is absent and SD_ERR_FORMAT when
 * it has an incompatible type or value. */
sd_status sd_gguf_get_u64(const sd_gguf *g, const char *key, uint64_t *out);
sd_status sd_gguf_get_u32(const sd_gguf *g, const char *key, uint32_t *out);
sd_status sd_gguf_get_i64(const sd_gguf *g, const char *key, int64_t *out);
sd_status sd_gguf_get_f32(const sd_gguf *g, const char *key, float *out); /* f32 or f64 */
sd_status sd_gguf_get_bool(const sd_gguf *g, const char *key, bool *out);
sd_status sd_gguf_get_str(const sd_gguf *g, const char *key, sd_gguf_str *out);

/* Arrays: element type and length of an array-valued key. Nested arrays
 * report SD_GGUF_TYPE_ARRAY as the element type. */
sd_status sd_gguf_get_arr(const sd_gguf *g, const char *key, sd_gguf_type *elem_type, uint64_t *len);
/* Element i of a string array. */
sd_status sd_gguf_get_arr_str(const sd_gguf *g, const char *key, uint64_t i, sd_gguf_str *out);
/* Raw element data of a fixed-size-element array (borrowed, unaligned). */
sd_status sd_gguf_get_arr_data(const sd_gguf *g, const char *key, const void **data, uint64_t *len);

/* ---- tensors ---- */
int64_t sd_gguf_n_tensors(const sd_gguf *g);
/* Borrowed info for tensor i (0 <= i < n_tensors), valid while g is open. */
const sd_gguf_tensor *sd_gguf_tensor_at(const sd_gguf *g, int64_t i);
/* Borrowed info for the tensor named name, or NULL. */
const sd_gguf_tensor *sd_gguf_find_tensor(const sd_gguf *g, const char *name);

/* Dequantizes n_elems elements of type t starting at data into out (f32).
 * n_elems must be a multiple of the type's block size. Thread-safe. */
sd_status sd_dequantize(sd_dtype t, const void *data, uint64_t n_elems, float *out);

/* One IEEE half to float (exact), and float to half rounded to nearest,
 * ties to even (overflow to infinity, NaN stays NaN): what F16C's
 * vcvtph2ps / vcvtps2ph do. */
float sd_f16_to_f32(uint16_t h);

/* Decodes one integer of GGUF type `type` (UINT8..INT64; false for any
 * other type) from p, little-endian and possibly unaligned: *is_signed for
 * the INT types; *s the value (a UINT64 above INT64_MAX: INT64_MAX), *u the
 * value or, for a negative one, 0. The one integer decoder of the
 * metadata and of integer arrays (token types). */
bool sd_gguf_int_decode(sd_gguf_type type, const void *p, int64_t *s, uint64_t *u, bool *is_signed);

/* Elements per K-quant super-block (Q4_K, Q5_K, Q6_K, and the CPU's K-quant
 * activation blocks): one definition for the formats and the kernels. */
#define SD_QK_K 256

/* A 16-bit little-endian load from block data, which may be unaligned (the
 * scales of every quantized format). */
static inline uint16_t sd_load_u16(const uint8_t *p) {
    uint16_t v;
    __builtin_memcpy(&v, p, 2);
    return v;
}
uint16_t sd_f32_to_f16(float f);

/* Quantizes n_elems f32 values into out, encoded as type t (the inverse of
 * sd_dequantize; out holds n_elems / block_elems * block_bytes bytes). Rounds
 * to nearest like ggml's reference quantizers (the K-quants: least-squares
 * scales of this project's own, quant_k.c); n_elems must be a multiple of
 * the type's block size. For tools and tests that write models. Thread-safe. */
sd_status sd_quantize(sd_dtype t, const float *in, uint64_t n_elems, void *out);

/* True for the K-quant types (Q4_K, Q5_K, Q6_K: 256-element super-blocks). */
bool sd_dtype_is_k(sd_dtype t);

/* Index of the first of n_blocks blocks of type t at data whose f16 scale
 * (d, and dmin where the type has one) is NaN or infinite, or -1 when all are
 * finite (always -1 for types without such scales). Thread-safe. */
int64_t sd_dtype_first_bad_scale(sd_dtype t, const void *data, uint64_t n_blocks);

/* The first of n_elems stored values of type t at data (a multiple of the
 * block size) that is or dequantizes to NaN or an infinity, as an element
 * index (for the block types: the first element of the block whose f16 scale
 * d, dmin or m is NaN or infinite: with finite scales every value of those
 * formats is finite), or -1. Reads the raw bits only, no dequantization.
 * Thread-safe. */
int64_t sd_dtype_first_non_finite(sd_dtype t, const void *data, uint64_t n_elems);

/* ---- writer (tools and tests) ----
 * Accumulates metadata and tensors in memory and writes a GGUF v3 file. */
typedef struct sd_gguf_writer sd_gguf_writer;

/* Returns a new writer (caller frees with sd_gguf_writer_free), or NULL. */
sd_gguf_writer *sd_gguf_writer_new(void);
void sd_gguf_writer_free(sd_gguf_writer **w);
sd_status sd_gguf_writer_set_u32(sd_gguf_writer *w, const char *key, uint32_t v);
sd_status sd_gguf_writer_set_i32(sd_gguf_writer *w, const char *key, int32_t v);
sd_status sd_gguf_writer_set_f32(sd_gguf_writer *w, const char *key, float v);
sd_status sd_gguf_writer_set_bool(sd_gguf_writer *w, const char *key, bool v);
sd_status sd_gguf_writer_set_str(sd_gguf_writer *w, const char *key, const char *v);
/* Array of n strings (copied). */
sd_status sd_gguf_writer_set_arr_str(sd_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* Array of n fixed-size elements of elem_type (copied). */
sd_status sd_gguf_writer_set_arr(sd_gguf_writer *w, const char *key, sd_gguf_type elem_type, const void *v, uint64_t n);
/* Copies every metadata entry of src whose key starts with prefix. */
sd_status sd_gguf_writer_copy_kv(sd_gguf_writer *w, const sd_gguf *src, const char *prefix);
/* Adds a tensor; data (n_bytes as implied by type and ne) is copied. */
sd_status sd_gguf_writer_add_tensor(sd_gguf_writer *w, const char *name, sd_dtype type, uint32_t n_dims,
                                    const uint64_t *ne, const void *data);
/* Writes the file (alignment 32). */
sd_status sd_gguf_writer_write(const sd_gguf_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
