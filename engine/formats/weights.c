/* weights.c — the weights-source dispatch and the GGUF source.
 *
 * The GGUF source is thin: config and tokenizer come from the metadata
 * (model.c, tokenizer_gguf.c); a rectangle read dequantizes only the rows
 * asked for, starting at the block that holds col0, straight out of the
 * memory map. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf_impl.h"
#include "weights_impl.h"

typedef struct gguf_source {
    sd_gguf *owned; /* NULL when borrowed */
    const sd_gguf *g;
} gguf_source;

static void gguf_close(void *ctx) {
    gguf_source *s = ctx;
    sd_gguf_close(&s->owned);
    free(s);
}

static sd_status gguf_config(void *ctx, sd_model_config *cfg) {
    return sd_model_config_from_gguf(((gguf_source *)ctx)->g, cfg);
}

static sd_status gguf_tokenizer(void *ctx, sd_tok **out) { return sd_tok_from_gguf(((gguf_source *)ctx)->g, out); }

static bool gguf_find(void *ctx, const char *name, sd_weights_tensor *info) {
    const sd_gguf_tensor *t = sd_gguf_find_tensor(((gguf_source *)ctx)->g, name);
    if (!t || t->n_dims < 1 || t->n_dims > 2) return false;
    info->type = t->type;
    info->n_dims = t->n_dims;
    info->ne[0] = (int64_t)t->ne[0];
    info->ne[1] = t->n_dims == 2 ? (int64_t)t->ne[1] : 1;
    return true;
}

sd_status sd_weights_read_rows(sd_dtype t, const void *data, int64_t ne0, int64_t row0, int64_t n_rows, int64_t col0,
                               int64_t n_cols, float *dst) {
    size_t be, bb;
    if (!sd_dtype_block(t, &be, &bb)) return SD_ERR_UNSUPPORTED;
    if (ne0 % (int64_t)be != 0 || col0 % (int64_t)be != 0 || n_cols % (int64_t)be != 0) {
        SD_ERROR("weights: columns [%lld, %lld) of a %s row of %lld are not aligned to its %zu-element blocks",
                 (long long)col0, (long long)(col0 + n_cols), sd_dtype_name(t), (long long)ne0, be);
        return SD_ERR_UNSUPPORTED;
    }
    size_t row_bytes = (size_t)(ne0 / (int64_t)be) * bb;
    size_t skip = (size_t)(col0 / (int64_t)be) * bb;
    for (int64_t r = 0; r < n_rows; r++) {
        const unsigned char *src = (const unsigned char *)data + (size_t)(row0 + r) * row_bytes + skip;
        SD_TRY(sd_dequantize(t, src, (uint64_t)n_cols, dst + (size_t)r * (size_t)n_cols));
    }
    return SD_OK;
}

sd_status sd_weights_copy_rows(sd_dtype t, const void *data, int64_t ne0, int64_t row0, int64_t n_rows, int64_t col0,
                               int64_t n_cols, void *dst) {
    size_t be, bb;
    if (!sd_dtype_block(t, &be, &bb)) return SD_ERR_UNSUPPORTED;
    if (ne0 % (int64_t)be != 0 || col0 % (int64_t)be != 0 || n_cols % (int64_t)be != 0) return SD_ERR_UNSUPPORTED;
    size_t row_bytes = (size_t)(ne0 / (int64_t)be) * bb;
    size_t skip = (size_t)(col0 / (int64_t)be) * bb, out_bytes = (size_t)(n_cols / (int64_t)be) * bb;
    for (int64_t r = 0; r < n_rows; r++)
        memcpy((unsigned char *)dst + (size_t)r * out_bytes,
               (const unsigned char *)data + (size_t)(row0 + r) * row_bytes + skip, out_bytes);
    return SD_OK;
}

/* A K-quant super-block whose f16 scale (d or dmin) is NaN or infinite
 * poisons its 256 weights: named as its own corruption before any value is
 * read. row is the tensor row the blocks at data belong to. */
static sd_status check_scales(const char *name, sd_dtype t, const void *data, int64_t row, int64_t col0,
                              int64_t n_cols) {
    size_t be, bb;
    if (!sd_dtype_is_k(t) || !sd_dtype_block(t, &be, &bb)) return SD_OK;
    int64_t bad = sd_dtype_first_bad_scale(t, data, (uint64_t)(n_cols / (int64_t)be));
    if (bad < 0) return SD_OK;
    SD_ERROR("weights: %s: the %s super-block at row %lld, columns [%lld, %lld) has a NaN or infinite scale (d or "
             "dmin): the file is corrupt",
             name, sd_dtype_name(t), (long long)row, (long long)(col0 + bad * (int64_t)be),
             (long long)(col0 + (bad + 1) * (int64_t)be));
    return SD_ERR_FORMAT;
}

static sd_status gguf_read_stored(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                                  int64_t n_cols, void *dst) {
    const sd_gguf_tensor *t = sd_gguf_find_tensor(((gguf_source *)ctx)->g, name);
    return sd_weights_copy_rows(t->type, t->data, (int64_t)t->ne[0], row0, n_rows, col0, n_cols, dst);
}

static sd_status gguf_read(void *ctx, const char *name, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols,
                           float *dst) {
    const sd_gguf_tensor *t = sd_gguf_find_tensor(((gguf_source *)ctx)->g, name);
    if (sd_dtype_is_k(t->type)) {
        size_t be, bb;
        sd_dtype_block(t->type, &be, &bb);
        const size_t row_bytes = (size_t)t->ne[0] / be * bb, skip = (size_t)(col0 / (int64_t)be) * bb;
        for (int64_t r = 0; r < n_rows; r++)
            SD_TRY(check_scales(name, t->type, (const unsigned char *)t->data + (size_t)(row0 + r) * row_bytes + skip,
                                row0 + r, col0, n_cols));
    }
    return sd_weights_read_rows(t->type, t->data, (int64_t)t->ne[0], row0, n_rows, col0, n_cols, dst);
}

static sd_status gguf_map_stored(void *ctx, const char *name, const void **data, sd_file_map **keep) {
    const sd_gguf *g = ((gguf_source *)ctx)->g;
    sd_file_map *m = sd_gguf_file_map(g);
    if (!m) return SD_ERR_UNSUPPORTED;
    *data = sd_gguf_find_tensor(g, name)->data;
    *keep = m;
    return SD_OK;
}

static const sd_weights_ops gguf_ops = {
    .format = "gguf",
    .close = gguf_close,
    .config = gguf_config,
    .tokenizer = gguf_tokenizer,
    .find = gguf_find,
    .read = gguf_read,
    .read_stored = gguf_read_stored,
    .map_stored = gguf_map_stored,
};

static sd_status wrap_gguf(sd_gguf *owned, const sd_gguf *g, sd_weights **out) {
    sd_weights *w = calloc(1, sizeof *w);
    gguf_source *s = calloc(1, sizeof *s);
    if (!w || !s) {
        free(w);
        free(s);
        return SD_ERR_NOMEM;
    }
    s->owned = owned;
    s->g = g;
    w->ops = &gguf_ops;
    w->ctx = s;
    w->gguf = g;
    *out = w;
    return SD_OK;
}

sd_status sd_weights_from_gguf(const sd_gguf *g, sd_weights **out) {
    if (!g || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    return wrap_gguf(NULL, g, out);
}

sd_status sd_weights_open(const char *path, sd_weights **out) {
    if (!path || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        SD_ERROR("weights: cannot open %s: no such file or directory", path);
        return SD_ERR_IO;
    }
    if (S_ISDIR(st.st_mode)) return sd_weights_hf_open(path, out);
    sd_gguf *g = NULL;
    char err[256];
    sd_status s = sd_gguf_open(path, &g, err, sizeof err);
    if (s != SD_OK) {
        SD_ERROR("weights: %s: %s", path, err);
        return s;
    }
    s = wrap_gguf(g, g, out);
    if (s != SD_OK) sd_gguf_close(&g);
    return s;
}

void sd_weights_close(sd_weights **w) {
    if (!w || !*w) return;
    (*w)->ops->close((*w)->ctx);
    free(*w);
    *w = NULL;
}

const char *sd_weights_format(const sd_weights *w) { return w ? w->ops->format : "none"; }

const sd_gguf *sd_weights_gguf(const sd_weights *w) { return w ? w->gguf : NULL; }

sd_status sd_weights_config(const sd_weights *w, sd_model_config *cfg) {
    if (!w || !cfg) return SD_ERR_INVALID_ARG;
    return w->ops->config(w->ctx, cfg);
}

sd_status sd_weights_tokenizer(const sd_weights *w, sd_tok **out) {
    if (!w || !out) return SD_ERR_INVALID_ARG;
    return w->ops->tokenizer(w->ctx, out);
}

bool sd_weights_find(const sd_weights *w, const char *name, sd_weights_tensor *info) {
    sd_weights_tensor tmp;
    if (!w || !name) return false;
    return w->ops->find(w->ctx, name, info ? info : &tmp);
}

/* Finds name and checks the rectangle is inside it; *t gets its info. */
static sd_status check_rect(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                            int64_t n_cols, sd_weights_tensor *t) {
    if (!w->ops->find(w->ctx, name, t)) {
        SD_ERROR("weights: tensor %s is missing", name);
        return SD_ERR_NOT_FOUND;
    }
    if (row0 < 0 || n_rows <= 0 || col0 < 0 || n_cols <= 0 || row0 > t->ne[1] - n_rows || col0 > t->ne[0] - n_cols) {
        SD_ERROR("weights: rectangle rows [%lld, +%lld) cols [%lld, +%lld) is outside %s [%lld][%lld]", (long long)row0,
                 (long long)n_rows, (long long)col0, (long long)n_cols, name, (long long)t->ne[1], (long long)t->ne[0]);
        return SD_ERR_RANGE;
    }
    return SD_OK;
}

/* A NaN or an infinity in the weights poisons every logit that reads it, at
 * whatever step first touches that row: refuse the file at load. The scan
 * tests exponent bits (all ones: NaN or infinite) with integer ops the
 * compiler vectorizes; only a hit looks for where. v holds n values of a
 * [.][n_cols] rectangle starting at (row0, col0). */
static sd_status check_finite(const char *name, int64_t row0, int64_t col0, int64_t n_cols, const float *v, size_t n) {
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof bits);
        any |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    for (size_t i = 0; any && i < n; i++) {
        if (!isfinite(v[i])) {
            SD_ERROR("weights: %s holds %s at row %lld, column %lld: the file is corrupt", name,
                     isnan(v[i]) ? "NaN" : "an infinity", (long long)(row0 + (int64_t)(i / (size_t)n_cols)),
                     (long long)(col0 + (int64_t)(i % (size_t)n_cols)));
            return SD_ERR_FORMAT;
        }
    }
    return SD_OK;
}

sd_status sd_weights_read(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                          int64_t n_cols, float *dst) {
    if (!w || !name || !dst) return SD_ERR_INVALID_ARG;
    sd_weights_tensor t;
    SD_TRY(check_rect(w, name, row0, n_rows, col0, n_cols, &t));
    SD_TRY(w->ops->read(w->ctx, name, row0, n_rows, col0, n_cols, dst));
    return check_finite(name, row0, col0, n_cols, dst, (size_t)n_rows * (size_t)n_cols);
}

/* Refuses a NaN or an infinity in n_rows stored rows of row_bytes each,
 * naming the tensor, row and column (for the block types, the block whose
 * scale is not finite: sd_dtype_first_non_finite). It reads the raw bits, so
 * loading is bound by reading the file: replaced, by measurement, a scan that
 * dequantized every row to f32 first, 85% of the time to load a 2.1 GB F16
 * file and answer one token (bench/results/quant-cpu.md, "load"). */
static sd_status scan_stored(const char *name, sd_dtype type, const void *rows, size_t row_bytes, int64_t row0,
                             int64_t n_rows, int64_t col0, int64_t n_cols) {
    size_t be, bb;
    if (!sd_dtype_block(type, &be, &bb)) return SD_ERR_UNSUPPORTED;
    for (int64_t r = 0; r < n_rows; r++) {
        const unsigned char *at = (const unsigned char *)rows + (size_t)r * row_bytes;
        const int64_t bad = sd_dtype_first_non_finite(type, at, (uint64_t)n_cols);
        if (bad < 0) continue;
        if (be == 1) {
            float v;
            SD_TRY(sd_dequantize(type, at + (size_t)bad * bb, 1, &v));
            SD_ERROR("weights: %s holds %s at row %lld, column %lld: the file is corrupt", name,
                     isnan(v) ? "NaN" : "an infinity", (long long)(row0 + r), (long long)(col0 + bad));
        } else {
            SD_ERROR("weights: %s: the %s %s at row %lld, columns [%lld, %lld) has a NaN or infinite scale: the file "
                     "is corrupt",
                     name, sd_dtype_name(type), sd_dtype_is_k(type) ? "super-block" : "block", (long long)(row0 + r),
                     (long long)(col0 + bad), (long long)(col0 + bad + (int64_t)be));
        }
        return SD_ERR_FORMAT;
    }
    return SD_OK;
}

sd_status sd_weights_read_stored(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                                 int64_t n_cols, void *dst, size_t dst_bytes) {
    if (!w || !name || !dst) return SD_ERR_INVALID_ARG;
    sd_weights_tensor t;
    SD_TRY(check_rect(w, name, row0, n_rows, col0, n_cols, &t));
    size_t be, bb, need;
    if (!w->ops->read_stored || !sd_dtype_block(t.type, &be, &bb) || col0 % (int64_t)be || n_cols % (int64_t)be)
        return SD_ERR_UNSUPPORTED;
    size_t row_bytes = (size_t)(n_cols / (int64_t)be) * bb;
    if (!sd_mul_ok(row_bytes, (size_t)n_rows, &need) || need > dst_bytes) return SD_ERR_INVALID_ARG;
    SD_TRY(w->ops->read_stored(w->ctx, name, row0, n_rows, col0, n_cols, dst));
    return scan_stored(name, t.type, dst, row_bytes, row0, n_rows, col0, n_cols);
}

sd_status sd_weights_map_stored(const sd_weights *w, const char *name, int64_t row0, int64_t n_rows, int64_t col0,
                                int64_t n_cols, const void **ptr, sd_file_map **keep) {
    if (!w || !name || !ptr || !keep) return SD_ERR_INVALID_ARG;
    sd_weights_tensor t;
    SD_TRY(check_rect(w, name, row0, n_rows, col0, n_cols, &t));
    size_t be, bb;
    if (!w->ops->map_stored || !sd_dtype_block(t.type, &be, &bb) || col0 != 0 || n_cols != t.ne[0] ||
        n_cols % (int64_t)be)
        return SD_ERR_UNSUPPORTED;
    const void *data = NULL;
    sd_file_map *m = NULL;
    SD_TRY(w->ops->map_stored(w->ctx, name, &data, &m));
    size_t row_bytes = (size_t)(n_cols / (int64_t)be) * bb;
    const unsigned char *first = (const unsigned char *)data + (size_t)row0 * row_bytes;
    sd_status s = scan_stored(name, t.type, first, row_bytes, row0, n_rows, col0, n_cols);
    if (s != SD_OK) {
        sd_file_map_release(&m);
        return s;
    }
    *ptr = first;
    *keep = m;
    return SD_OK;
}

sd_status sd_weights_identity(const char *path, sd_model_identity *id) {
    if (!path || !id) return SD_ERR_INVALID_ARG;
    memset(id, 0, sizeof *id);
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(path, &w);
    if (st != SD_OK) {
        SD_ERROR("weights: cannot open %s: %s", path, sd_status_str(st));
        return st;
    }
    sd_model_config cfg;
    sd_tok *tok = NULL;
    st = sd_weights_config(w, &cfg);
    if (st == SD_OK) st = sd_weights_tokenizer(w, &tok);
    if (st == SD_OK) {
        snprintf(id->architecture, sizeof id->architecture, "%s", cfg.arch);
        /* the last path component, "dir/" and "dir" alike */
        size_t end = strlen(path);
        while (end > 1 && path[end - 1] == '/') end--;
        size_t start = end;
        while (start > 0 && path[start - 1] != '/') start--;
        snprintf(id->name, sizeof id->name, "%.*s", (int)(end - start), path + start);
        id->vocab_size = (uint32_t)sd_tok_n_vocab(tok);
        id->vocab_hash = sd_tok_vocab_hash(tok);
        id->context_length = (uint32_t)cfg.n_ctx_train;
        id->n_layers = (uint32_t)cfg.n_layers;
    } else {
        SD_ERROR("weights: cannot read the model identity (config and tokenizer) of %s: %s", path, sd_status_str(st));
    }
    sd_tok_free(&tok);
    sd_weights_close(&w);
    return st;
}
