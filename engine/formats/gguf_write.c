/* gguf_write.c — GGUF v3 writer for tools and tests.
 *
 * Metadata values are encoded into their final byte form as soon as they are
 * set (so sd_gguf_writer_copy_kv can copy any value, nested arrays included,
 * as raw bytes from a reader), and tensors are copied. Setting a key that
 * already exists replaces its value, like a dictionary; adding a tensor whose
 * name exists is an error. sd_gguf_writer_write lays the file out in one pass:
 * header, metadata, tensor infos, padding to the alignment, then each
 * tensor's data at an aligned offset. It writes to PATH.tmp and renames, so a
 * reader never sees a half-written file. The alignment is 32 unless the
 * caller set general.alignment (a uint32 power of two). Not thread-safe. */
#include "gguf_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct writer_kv {
    char *key;
    sd_gguf_type type;
    uint8_t *value; /* encoded value, after the type id */
    size_t len;
} writer_kv;

typedef struct writer_tensor {
    char *name;
    sd_dtype type;
    uint32_t n_dims;
    uint64_t ne[SD_GGUF_MAX_DIMS];
    uint8_t *data;
    size_t n_bytes;
} writer_tensor;

struct sd_gguf_writer {
    writer_kv *kv;
    size_t n_kv, cap_kv;
    writer_tensor *tensors;
    size_t n_tensors, cap_tensors;
};

sd_gguf_writer *sd_gguf_writer_new(void) { return calloc(1, sizeof(sd_gguf_writer)); }

void sd_gguf_writer_free(sd_gguf_writer **w) {
    if (!w || !*w) return;
    for (size_t i = 0; i < (*w)->n_kv; i++) {
        free((*w)->kv[i].key);
        free((*w)->kv[i].value);
    }
    for (size_t i = 0; i < (*w)->n_tensors; i++) {
        free((*w)->tensors[i].name);
        free((*w)->tensors[i].data);
    }
    free((*w)->kv);
    free((*w)->tensors);
    free(*w);
    *w = NULL;
}

/* Grows an array of elem-sized items so that one more fits. */
static bool grow(void **items, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t new_cap = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, new_cap * elem);
    if (!p) return false;
    *items = p;
    *cap = new_cap;
    return true;
}

/* Takes ownership of value (len bytes) and stores it under key. */
static sd_status set_owned(sd_gguf_writer *w, const char *key, sd_gguf_type type, uint8_t *value, size_t len) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].value);
            w->kv[i].type = type;
            w->kv[i].value = value;
            w->kv[i].len = len;
            return SD_OK;
        }
    char *key_copy = strdup(key);
    if (!key_copy || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
        free(key_copy);
        free(value);
        return SD_ERR_NOMEM;
    }
    w->kv[w->n_kv++] = (writer_kv){key_copy, type, value, len};
    return SD_OK;
}

static sd_status set_bytes(sd_gguf_writer *w, const char *key, sd_gguf_type type, const void *bytes, size_t len) {
    if (!w || !key) return SD_ERR_INVALID_ARG;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return SD_ERR_NOMEM;
    if (len) memcpy(copy, bytes, len);
    return set_owned(w, key, type, copy, len);
}

sd_status sd_gguf_writer_set_u32(sd_gguf_writer *w, const char *key, uint32_t v) {
    return set_bytes(w, key, SD_GGUF_TYPE_UINT32, &v, 4);
}

sd_status sd_gguf_writer_set_i32(sd_gguf_writer *w, const char *key, int32_t v) {
    return set_bytes(w, key, SD_GGUF_TYPE_INT32, &v, 4);
}

sd_status sd_gguf_writer_set_f32(sd_gguf_writer *w, const char *key, float v) {
    return set_bytes(w, key, SD_GGUF_TYPE_FLOAT32, &v, 4);
}

sd_status sd_gguf_writer_set_bool(sd_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_bytes(w, key, SD_GGUF_TYPE_BOOL, &b, 1);
}

sd_status sd_gguf_writer_set_str(sd_gguf_writer *w, const char *key, const char *v) {
    if (!w || !key || !v) return SD_ERR_INVALID_ARG;
    uint64_t len = strlen(v);
    uint8_t *buf = malloc(8 + (size_t)len);
    if (!buf) return SD_ERR_NOMEM;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, v, (size_t)len);
    return set_owned(w, key, SD_GGUF_TYPE_STRING, buf, 8 + (size_t)len);
}

sd_status sd_gguf_writer_set_arr_str(sd_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    if (!w || !key || (n && !v)) return SD_ERR_INVALID_ARG;
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!v[i]) return SD_ERR_INVALID_ARG;
        if (!sd_add_ok(total, 8 + strlen(v[i]), &total)) return SD_ERR_RANGE;
    }
    uint8_t *buf = malloc(total);
    if (!buf) return SD_ERR_NOMEM;
    uint32_t et = SD_GGUF_TYPE_STRING;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &n, 8);
    size_t pos = 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = strlen(v[i]);
        memcpy(buf + pos, &len, 8);
        memcpy(buf + pos + 8, v[i], (size_t)len);
        pos += 8 + (size_t)len;
    }
    return set_owned(w, key, SD_GGUF_TYPE_ARRAY, buf, total);
}

sd_status sd_gguf_writer_set_arr(sd_gguf_writer *w, const char *key, sd_gguf_type elem_type, const void *v,
                                 uint64_t n) {
    size_t elem = sd_gguf_type_size(elem_type);
    size_t n_bytes, total;
    if (!w || !key || elem == 0 || (n && !v)) return SD_ERR_INVALID_ARG;
    if (!sd_mul_ok((size_t)n, elem, &n_bytes) || !sd_add_ok(n_bytes, 12, &total)) return SD_ERR_RANGE;
    uint8_t *buf = malloc(total);
    if (!buf) return SD_ERR_NOMEM;
    uint32_t et = elem_type;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &n, 8);
    if (n_bytes) memcpy(buf + 12, v, n_bytes);
    return set_owned(w, key, SD_GGUF_TYPE_ARRAY, buf, total);
}

sd_status sd_gguf_writer_copy_kv(sd_gguf_writer *w, const sd_gguf *src, const char *prefix) {
    if (!w || !src || !prefix) return SD_ERR_INVALID_ARG;
    size_t plen = strlen(prefix);
    for (int64_t i = 0; i < sd_gguf_n_kv(src); i++) {
        const char *key = sd_gguf_key(src, i);
        if (strncmp(key, prefix, plen) != 0) continue;
        const uint8_t *raw;
        size_t len;
        if (!sd_gguf_kv_raw(src, i, &raw, &len)) return SD_ERR_INTERNAL;
        SD_TRY(set_bytes(w, key, sd_gguf_kv_type(src, i), raw, len));
    }
    return SD_OK;
}

sd_status sd_gguf_writer_add_tensor(sd_gguf_writer *w, const char *name, sd_dtype type, uint32_t n_dims,
                                    const uint64_t *ne, const void *data) {
    size_t be, bb;
    if (!w || !name || !ne || !data || n_dims < 1 || n_dims > SD_GGUF_MAX_DIMS || !sd_dtype_block(type, &be, &bb))
        return SD_ERR_INVALID_ARG;
    size_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0) return SD_ERR_INVALID_ARG;
        if (!sd_mul_ok(n, (size_t)ne[d], &n)) return SD_ERR_RANGE;
    }
    if (ne[0] % be != 0) {
        SD_ERROR("gguf writer: tensor '%s': ne[0]=%llu is not a multiple of the %s block size %zu", name,
                 (unsigned long long)ne[0], sd_dtype_name(type), be);
        return SD_ERR_INVALID_ARG;
    }
    size_t n_bytes;
    if (!sd_mul_ok(n / be, bb, &n_bytes)) return SD_ERR_RANGE;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) {
            SD_ERROR("gguf writer: duplicate tensor name '%s'", name);
            return SD_ERR_INVALID_ARG;
        }
    writer_tensor t = {
        .name = strdup(name), .type = type, .n_dims = n_dims, .data = malloc(n_bytes), .n_bytes = n_bytes};
    if (!t.name || !t.data || !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(t.name);
        free(t.data);
        return SD_ERR_NOMEM;
    }
    for (uint32_t d = 0; d < SD_GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    memcpy(t.data, data, n_bytes);
    w->tensors[w->n_tensors++] = t;
    return SD_OK;
}

/* ---- output ---- */

typedef struct out_file {
    FILE *f;
    size_t pos;
    bool ok;
} out_file;

static void put(out_file *o, const void *p, size_t n) {
    if (o->ok && n && fwrite(p, 1, n, o->f) != n) o->ok = false;
    o->pos += n;
}

static void put_u32(out_file *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(out_file *o, uint64_t v) { put(o, &v, 8); }

static void put_str(out_file *o, const char *s) {
    uint64_t len = strlen(s);
    put_u64(o, len);
    put(o, s, (size_t)len);
}

static void pad_to(out_file *o, size_t alignment) {
    static const uint8_t zeros[64] = {0};
    while (o->pos % alignment) {
        size_t n = alignment - o->pos % alignment;
        put(o, zeros, n < sizeof zeros ? n : sizeof zeros);
    }
}

static size_t writer_alignment(const sd_gguf_writer *w) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, "general.alignment") == 0 && w->kv[i].type == SD_GGUF_TYPE_UINT32) {
            uint32_t a;
            memcpy(&a, w->kv[i].value, 4);
            if (a && (a & (a - 1)) == 0) return a;
        }
    return 32;
}

sd_status sd_gguf_writer_write(const sd_gguf_writer *w, const char *path) {
    if (!w || !path) return SD_ERR_INVALID_ARG;
    size_t align = writer_alignment(w);
    size_t tmp_len = strlen(path) + 5;
    char *tmp = malloc(tmp_len);
    if (!tmp) return SD_ERR_NOMEM;
    snprintf(tmp, tmp_len, "%s.tmp", path);
    out_file o = {.f = fopen(tmp, "wb"), .pos = 0, .ok = true};
    if (!o.f) {
        SD_ERROR("gguf writer: cannot create %s", tmp);
        free(tmp);
        return SD_ERR_IO;
    }
    put(&o, "GGUF", 4);
    put_u32(&o, 3);
    put_u64(&o, w->n_tensors);
    put_u64(&o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(&o, w->kv[i].key);
        put_u32(&o, w->kv[i].type);
        put(&o, w->kv[i].value, w->kv[i].len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        put_str(&o, t->name);
        put_u32(&o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&o, t->ne[d]);
        put_u32(&o, t->type);
        put_u64(&o, offset);
        offset += (t->n_bytes + align - 1) / align * align;
    }
    pad_to(&o, align);
    for (size_t i = 0; i < w->n_tensors; i++) {
        put(&o, w->tensors[i].data, w->tensors[i].n_bytes);
        if (i + 1 < w->n_tensors) pad_to(&o, align);
    }
    int close_rc = fclose(o.f);
    bool ok = o.ok && close_rc == 0;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        SD_ERROR("gguf writer: failed writing %s", path);
        remove(tmp);
    }
    free(tmp);
    return ok ? SD_OK : SD_ERR_IO;
}
