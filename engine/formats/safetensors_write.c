/* safetensors_write.c — .safetensors writer for tools and tests.
 *
 * Tensors are copied in as they are added and laid out in that order, back
 * to back from offset 0. The header JSON is printed here rather than through
 * cJSON because cJSON prints numbers from doubles; sizes and offsets are
 * printed as exact integers, names and metadata escaped as JSON strings. Like
 * the reference writer, the header is padded with spaces to a multiple of 8
 * so that the data section starts aligned. The file is written to PATH.tmp
 * and renamed, so a reader never sees half a file. */
#include "specd/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct st_wtensor {
    char *name;
    sd_safetensors_dtype dtype;
    uint32_t n_dims;
    uint64_t *shape;
    uint8_t *data;
    uint64_t n_bytes;
} st_wtensor;

struct sd_safetensors_writer {
    st_wtensor *tensors;
    size_t n_tensors, cap_tensors;
    char **meta_key, **meta_value;
    size_t n_meta, cap_meta;
    uint64_t data_bytes;
};

/* A growing string for the header. */
typedef struct strbuf {
    char *p;
    size_t n, cap;
    bool oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->cap - b->n < len + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < len + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(strbuf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* s as a JSON string literal (UTF-8 passed through, controls escaped). */
static void sb_json_str(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", *c);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

sd_safetensors_writer *sd_safetensors_writer_new(void) { return calloc(1, sizeof(sd_safetensors_writer)); }

void sd_safetensors_writer_free(sd_safetensors_writer **wp) {
    if (!wp || !*wp) return;
    sd_safetensors_writer *w = *wp;
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].shape);
        free(w->tensors[i].data);
    }
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta_key[i]);
        free(w->meta_value[i]);
    }
    free(w->tensors);
    free(w->meta_key);
    free(w->meta_value);
    free(w);
    *wp = NULL;
}

sd_status sd_safetensors_writer_set_metadata(sd_safetensors_writer *w, const char *key, const char *value) {
    if (!w || !key || !value) return SD_ERR_INVALID_ARG;
    char *v = strdup(value);
    if (!v) return SD_ERR_NOMEM;
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_key[i], key) == 0) {
            free(w->meta_value[i]);
            w->meta_value[i] = v;
            return SD_OK;
        }
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? w->cap_meta * 2 : 8;
        char **k = realloc(w->meta_key, cap * sizeof *k);
        if (k) w->meta_key = k;
        char **vv = realloc(w->meta_value, cap * sizeof *vv);
        if (vv) w->meta_value = vv;
        if (!k || !vv) {
            free(v);
            return SD_ERR_NOMEM;
        }
        w->cap_meta = cap;
    }
    w->meta_key[w->n_meta] = strdup(key);
    if (!w->meta_key[w->n_meta]) {
        free(v);
        return SD_ERR_NOMEM;
    }
    w->meta_value[w->n_meta++] = v;
    return SD_OK;
}

sd_status sd_safetensors_writer_add_tensor(sd_safetensors_writer *w, const char *name, sd_safetensors_dtype dtype,
                                           uint32_t n_dims, const uint64_t *shape, const void *data) {
    if (!w || !name || (unsigned)dtype >= SD_SAFETENSORS_DTYPE_COUNT || (n_dims && !shape)) return SD_ERR_INVALID_ARG;
    if (strcmp(name, "__metadata__") == 0) return SD_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) {
            SD_ERROR("safetensors writer: tensor %s added twice", name);
            return SD_ERR_INVALID_ARG;
        }
    uint64_t n = 1, bits;
    for (uint32_t d = 0; d < n_dims; d++)
        if (__builtin_mul_overflow(n, shape[d], &n)) return SD_ERR_RANGE;
    if (__builtin_mul_overflow(n, (uint64_t)sd_safetensors_dtype_bits(dtype), &bits) || bits % 8 != 0 ||
        bits / 8 > SIZE_MAX)
        return SD_ERR_INVALID_ARG;
    uint64_t n_bytes = bits / 8;
    if (n_bytes && !data) return SD_ERR_INVALID_ARG;
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        st_wtensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return SD_ERR_NOMEM;
        w->tensors = t;
        w->cap_tensors = cap;
    }
    st_wtensor t = {.name = strdup(name),
                    .dtype = dtype,
                    .n_dims = n_dims,
                    .shape = malloc((n_dims ? n_dims : 1) * sizeof(uint64_t)),
                    .data = malloc(n_bytes ? (size_t)n_bytes : 1),
                    .n_bytes = n_bytes};
    if (!t.name || !t.shape || !t.data) {
        free(t.name);
        free(t.shape);
        free(t.data);
        return SD_ERR_NOMEM;
    }
    if (n_dims) memcpy(t.shape, shape, n_dims * sizeof(uint64_t));
    if (n_bytes) memcpy(t.data, data, (size_t)n_bytes);
    w->tensors[w->n_tensors++] = t;
    w->data_bytes += n_bytes;
    return SD_OK;
}

uint64_t sd_safetensors_writer_data_bytes(const sd_safetensors_writer *w) { return w ? w->data_bytes : 0; }

sd_status sd_safetensors_writer_write(const sd_safetensors_writer *w, const char *path) {
    if (!w || !path) return SD_ERR_INVALID_ARG;
    strbuf h = {0};
    sb_str(&h, "{");
    bool first = true;
    if (w->n_meta) {
        sb_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i) sb_str(&h, ",");
            sb_json_str(&h, w->meta_key[i]);
            sb_str(&h, ":");
            sb_json_str(&h, w->meta_value[i]);
        }
        sb_str(&h, "}");
        first = false;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const st_wtensor *t = &w->tensors[i];
        if (!first) sb_str(&h, ",");
        first = false;
        sb_json_str(&h, t->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, sd_safetensors_dtype_name(t->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (d) sb_str(&h, ",");
            sb_u64(&h, t->shape[d]);
        }
        sb_str(&h, "],\"data_offsets\":[");
        sb_u64(&h, off);
        sb_str(&h, ",");
        sb_u64(&h, off + t->n_bytes);
        sb_str(&h, "]}");
        off += t->n_bytes;
    }
    sb_str(&h, "}");
    while (!h.oom && h.n % 8 != 0) sb_str(&h, " ");
    if (h.oom) {
        free(h.p);
        return SD_ERR_NOMEM;
    }
    size_t tmp_len = strlen(path) + 5;
    char *tmp = malloc(tmp_len);
    if (!tmp) {
        free(h.p);
        return SD_ERR_NOMEM;
    }
    snprintf(tmp, tmp_len, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    sd_status s = f ? SD_OK : SD_ERR_IO;
    uint64_t n = h.n;
    uint8_t len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)(n >> (8 * i));
    if (s == SD_OK && (fwrite(len_le, 1, 8, f) != 8 || fwrite(h.p, 1, h.n, f) != h.n)) s = SD_ERR_IO;
    for (size_t i = 0; s == SD_OK && i < w->n_tensors; i++)
        if (w->tensors[i].n_bytes &&
            fwrite(w->tensors[i].data, 1, (size_t)w->tensors[i].n_bytes, f) != (size_t)w->tensors[i].n_bytes)
            s = SD_ERR_IO;
    if (f && fclose(f) != 0) s = SD_ERR_IO;
    if (s == SD_OK && rename(tmp, path) != 0) s = SD_ERR_IO;
    if (s != SD_OK) {
        SD_ERROR("safetensors writer: cannot write %s", path);
        remove(tmp);
    }
    free(tmp);
    free(h.p);
    return s;
}
