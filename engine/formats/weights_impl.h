/* weights_impl.h — the table a weights source implements (weights.h).
 *
 * sd_weights is a vtable plus context. weights.c dispatches and checks the
 * arguments every source shares (name, rectangle inside the tensor); each
 * source only translates its own container. */
#ifndef SPECD_WEIGHTS_IMPL_H
#define SPECD_WEIGHTS_IMPL_H

#include "specd/weights.h"

typedef struct sd_weights_ops {
    const char *format; /* "gguf", "safetensors" */
    void (*close)(void *ctx);
    sd_status (*config)(void *ctx, sd_model_config *cfg);
    sd_status (*tokenizer)(void *ctx, sd_tok **out);
    bool (*find)(void *ctx, const char *name, sd_weights_tensor *info);
    /* The rectangle was checked against find()'s shape; quantized block
     * alignment is the source's to check. dst [n_rows][n_cols]. */
    sd_status (*read)(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                      float *dst);
    /* Optional (NULL: sd_weights_read_stored answers SD_ERR_UNSUPPORTED):
     * the same rectangle as stored, rows of n_cols/block elements' blocks,
     * in the same row order read() gives. col0 and n_cols are block-aligned
     * (checked by weights.c). */
    sd_status (*read_stored)(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                             void *dst);
    /* Optional (NULL: SD_ERR_UNSUPPORTED): where the tensor's stored bytes
     * lie in a file mapping the source can share, and a new reference to it. */
    sd_status (*map_stored)(void *ctx, const char *name, const void **data, sd_file_map **keep);
} sd_weights_ops;

struct sd_weights {
    const sd_weights_ops *ops;
    void *ctx;
    const sd_gguf *gguf; /* when the source is a GGUF (borrowed or owned by ctx) */
};

/* Opens a Hugging Face checkpoint directory (weights_hf.c). */
sd_status sd_weights_hf_open(const char *dir, sd_weights **out);

/* Reads a rectangle of a row-major [rows][ne0] tensor of type t stored at
 * data into dst [n_rows][n_cols]: the shared dequantizing row reader. */
sd_status sd_weights_read_rows(sd_dtype t, const void *data, int64_t ne0, int64_t row0, int64_t n_rows, int64_t col0,
                               int64_t n_cols, float *dst);

/* The same rectangle as sd_weights_read_rows, copied as stored (col0 and
 * n_cols multiples of the type's block; SD_ERR_UNSUPPORTED otherwise). */
sd_status sd_weights_copy_rows(sd_dtype t, const void *data, int64_t ne0, int64_t row0, int64_t n_rows, int64_t col0,
                               int64_t n_cols, void *dst);

#endif
