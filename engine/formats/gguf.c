/* gguf.c — GGUF v2/v3 reader: validate once at open, then serve borrowed views.
 *
 * The whole file is memory-mapped (or a caller buffer is used as is) and the
 * header, metadata and tensor infos are parsed eagerly into an index owned by
 * the sd_gguf. Every count, length, offset and type id is checked against the
 * bytes that remain before it is used or allocated for: a count of N items
 * that each need at least k bytes is rejected when N > remaining / k, so a
 * hostile file can never make us allocate more than a small multiple of its
 * own size. Sizes are computed with sd_mul_ok/sd_add_ok. Each distinct
 * failure has its own message (tests/test_gguf_corrupt.c checks them).
 *
 * Keys and tensor names are copied into NUL-terminated strings (and rejected
 * if they contain a NUL byte) so that lookups can use plain C strings; both
 * are indexed by a small open-addressing hash table, which also finds
 * duplicates in linear time (a quadratic scan would let a fuzzer stall us).
 * String values stay views into the mapping. String arrays get an index of
 * element views so that element i (a tokenizer's token i) is O(1).
 *
 * Rejected: lazy parsing (every accessor would have to re-validate), and
 * copying tensor data (a 70B model does not fit twice). Only little-endian
 * files on little-endian hosts are handled. */
#include "gguf_impl.h"
#include "specd/weights.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian GGUF files and assumes a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT     32u
/* Smallest encoding of one metadata entry: key length, type id, 1-byte value. */
#define GGUF_MIN_KV_BYTES          13u
/* Smallest encoding of one tensor info: name length, n_dims, ne[0], type, offset. */
#define GGUF_MIN_TENSOR_INFO_BYTES 32u
/* Type ids below this are plausible ggml types we do not handle (UNSUPPORTED);
 * ids at or above it are garbage (FORMAT). */
#define GGUF_PLAUSIBLE_TYPE_IDS    64u

typedef struct kv_entry {
    char *key; /* owned, NUL-terminated */
    sd_gguf_type type;
    const uint8_t *raw; /* encoded value (after the type id), in the mapping */
    size_t raw_len;
    sd_gguf_type arr_type; /* arrays only */
    uint64_t arr_len;
    const uint8_t *arr_data; /* arrays: first element */
    sd_gguf_str *arr_strs;   /* string arrays: [arr_len] element views, owned */
} kv_entry;

typedef struct name_index {
    int64_t *slots; /* [cap] entry index or -1 */
    size_t cap;     /* power of two */
} name_index;

struct sd_gguf {
    const uint8_t *base;
    size_t size;
    sd_file_map *map; /* base was mmap'ed by us: its mapping, shared with models (NULL: a caller's buffer) */
    uint32_t version;
    uint64_t alignment;
    size_t data_start;
    int64_t n_kv;
    kv_entry *kv; /* [n_kv] */
    int64_t n_tensors;
    sd_gguf_tensor *tensors; /* [n_tensors] */
    uint64_t *tensor_off;    /* [n_tensors] offset relative to data_start */
    name_index kv_index;
    name_index tensor_index;
};

typedef struct parser {
    const uint8_t *base;
    size_t size;
    size_t pos;
    char *err;
    size_t err_len;
} parser;

/* ggml's name of a tensor type id, for the message that refuses one specd
 * does not read ("?" for ids ggml never used or no longer uses). */
static const char *ggml_type_name(uint32_t id) {
    static const char *const names[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "?",      "?",     "Q5_0",  "Q5_1",
                                        "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                        "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                        "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16",  "?",
                                        "?",       "?",      "TQ1_0",   "TQ2_0", "?",      "?",     "?",     "MXFP4"};
    return id < sizeof names / sizeof names[0] ? names[id] : "?";
}

/* ---- errors ---- */

__attribute__((format(printf, 3, 4))) static sd_status fail(parser *p, sd_status s, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->err && p->err_len > 0) snprintf(p->err, p->err_len, "gguf: %s", msg);
    SD_ERROR("gguf: %s", msg);
    return s;
}

static size_t remaining(const parser *p) { return p->size - p->pos; }

static sd_status need(parser *p, size_t n, const char *what) {
    if (n > remaining(p))
        return fail(p, SD_ERR_FORMAT, "truncated file: %s at offset %zu needs %zu bytes, only %zu left", what, p->pos,
                    n, remaining(p));
    return SD_OK;
}

static sd_status read_u32(parser *p, uint32_t *v, const char *what) {
    SD_TRY(need(p, 4, what));
    memcpy(v, p->base + p->pos, 4);
    p->pos += 4;
    return SD_OK;
}

static sd_status read_u64(parser *p, uint64_t *v, const char *what) {
    SD_TRY(need(p, 8, what));
    memcpy(v, p->base + p->pos, 8);
    p->pos += 8;
    return SD_OK;
}

/* Reads a length-prefixed string as a view into the buffer. */
static sd_status read_str(parser *p, sd_gguf_str *out, const char *what) {
    uint64_t len;
    SD_TRY(read_u64(p, &len, what));
    if (len > remaining(p))
        return fail(p, SD_ERR_FORMAT, "%s: string length %llu at offset %zu extends past end of file (size %zu)", what,
                    (unsigned long long)len, p->pos - 8, p->size);
    out->ptr = (const char *)(p->base + p->pos);
    out->len = len;
    p->pos += (size_t)len;
    return SD_OK;
}

/* Copies a key or tensor name into a NUL-terminated string (caller frees). */
static sd_status copy_name(parser *p, sd_gguf_str s, const char *what, char **out) {
    if (memchr(s.ptr, 0, (size_t)s.len) != NULL)
        return fail(p, SD_ERR_FORMAT, "%s at offset %zu contains a NUL byte", what,
                    (size_t)((const uint8_t *)s.ptr - p->base));
    char *copy = malloc((size_t)s.len + 1);
    if (!copy) return fail(p, SD_ERR_NOMEM, "out of memory copying %s", what);
    memcpy(copy, s.ptr, (size_t)s.len);
    copy[s.len] = '\0';
    *out = copy;
    return SD_OK;
}

/* ---- name index (open addressing, FNV-1a) ---- */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool index_init(name_index *ix, int64_t n) {
    size_t cap = 8;
    while (cap < (size_t)n * 2) cap *= 2;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return false;
    for (size_t i = 0; i < cap; i++) ix->slots[i] = -1;
    ix->cap = cap;
    return true;
}

/* Slot holding name (its value >= 0) or the empty slot where it would go. */
typedef const char *(*name_of_fn)(const sd_gguf *g, int64_t i);
static size_t index_slot(const sd_gguf *g, const name_index *ix, name_of_fn name_of, const char *name) {
    size_t mask = ix->cap - 1;
    size_t i = (size_t)hash_name(name) & mask;
    while (ix->slots[i] >= 0 && strcmp(name_of(g, ix->slots[i]), name) != 0) i = (i + 1) & mask;
    return i;
}

static const char *kv_name(const sd_gguf *g, int64_t i) { return g->kv[i].key; }
static const char *tensor_name(const sd_gguf *g, int64_t i) { return g->tensors[i].name; }

/* ---- metadata ---- */

size_t sd_gguf_type_size(sd_gguf_type t) {
    switch (t) {
    case SD_GGUF_TYPE_UINT8:
    case SD_GGUF_TYPE_INT8:
    case SD_GGUF_TYPE_BOOL: return 1;
    case SD_GGUF_TYPE_UINT16:
    case SD_GGUF_TYPE_INT16: return 2;
    case SD_GGUF_TYPE_UINT32:
    case SD_GGUF_TYPE_INT32:
    case SD_GGUF_TYPE_FLOAT32: return 4;
    case SD_GGUF_TYPE_UINT64:
    case SD_GGUF_TYPE_INT64:
    case SD_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Bytes at least one element of type t occupies (its size, or its length/header fields). */
static size_t min_elem_bytes(sd_gguf_type t) {
    if (t == SD_GGUF_TYPE_STRING) return 8;
    if (t == SD_GGUF_TYPE_ARRAY) return 12;
    return sd_gguf_type_size(t);
}

/* Reads an array header (element type, length) for key and checks the length
 * against the bytes left. depth is the nesting level of this array (1 = top). */
static sd_status read_arr_header(parser *p, const char *key, int depth, sd_gguf_type *elem, uint64_t *len) {
    uint32_t t;
    SD_TRY(read_u32(p, &t, "array element type"));
    if (t >= SD_GGUF_TYPE_COUNT) return fail(p, SD_ERR_FORMAT, "key '%s': bad array element type id %u", key, t);
    if (t == SD_GGUF_TYPE_ARRAY && depth + 1 > SD_GGUF_MAX_ARRAY_DEPTH)
        return fail(p, SD_ERR_FORMAT, "key '%s': arrays nested deeper than %d", key, SD_GGUF_MAX_ARRAY_DEPTH);
    SD_TRY(read_u64(p, len, "array length"));
    size_t per = min_elem_bytes((sd_gguf_type)t);
    if (*len > remaining(p) / per)
        return fail(p, SD_ERR_FORMAT, "key '%s': array length %llu exceeds the %zu bytes left in the file", key,
                    (unsigned long long)*len, remaining(p));
    *elem = (sd_gguf_type)t;
    return SD_OK;
}

/* Validates and skips one value of type t; depth as in read_arr_header. */
static sd_status skip_value(parser *p, const char *key, sd_gguf_type t, int depth) {
    if (t == SD_GGUF_TYPE_STRING) {
        sd_gguf_str s;
        return read_str(p, &s, "string value");
    }
    if (t != SD_GGUF_TYPE_ARRAY) {
        SD_TRY(need(p, sd_gguf_type_size(t), "metadata value"));
        p->pos += sd_gguf_type_size(t);
        return SD_OK;
    }
    sd_gguf_type elem;
    uint64_t len;
    SD_TRY(read_arr_header(p, key, depth, &elem, &len));
    if (elem != SD_GGUF_TYPE_STRING && elem != SD_GGUF_TYPE_ARRAY) {
        p->pos += (size_t)len * sd_gguf_type_size(elem); /* checked by read_arr_header */
        return SD_OK;
    }
    for (uint64_t i = 0; i < len; i++) SD_TRY(skip_value(p, key, elem, depth + 1));
    return SD_OK;
}

static sd_status parse_kv(parser *p, sd_gguf *g, int64_t idx) {
    kv_entry *e = &g->kv[idx];
    sd_gguf_str name;
    SD_TRY(read_str(p, &name, "metadata key"));
    SD_TRY(copy_name(p, name, "metadata key", &e->key));
    g->n_kv = idx + 1; /* owns the key from here on */
    size_t slot = index_slot(g, &g->kv_index, kv_name, e->key);
    if (g->kv_index.slots[slot] >= 0) return fail(p, SD_ERR_FORMAT, "duplicate key '%s'", e->key);
    g->kv_index.slots[slot] = idx;

    uint32_t t;
    SD_TRY(read_u32(p, &t, "metadata value type"));
    if (t >= SD_GGUF_TYPE_COUNT) return fail(p, SD_ERR_FORMAT, "key '%s': bad value type id %u", e->key, t);
    e->type = (sd_gguf_type)t;
    e->raw = p->base + p->pos;
    if (e->type != SD_GGUF_TYPE_ARRAY) {
        SD_TRY(skip_value(p, e->key, e->type, 0));
    } else {
        SD_TRY(read_arr_header(p, e->key, 1, &e->arr_type, &e->arr_len));
        e->arr_data = p->base + p->pos;
        if (e->arr_type == SD_GGUF_TYPE_STRING) {
            /* arr_len <= remaining / 8, so this allocation is bounded by 2x the file. */
            e->arr_strs = malloc(e->arr_len ? (size_t)e->arr_len * sizeof *e->arr_strs : 1);
            if (!e->arr_strs) return fail(p, SD_ERR_NOMEM, "out of memory indexing key '%s'", e->key);
            for (uint64_t i = 0; i < e->arr_len; i++) SD_TRY(read_str(p, &e->arr_strs[i], "string array element"));
        } else if (e->arr_type == SD_GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < e->arr_len; i++) SD_TRY(skip_value(p, e->key, SD_GGUF_TYPE_ARRAY, 2));
        } else {
            p->pos += (size_t)e->arr_len * sd_gguf_type_size(e->arr_type);
        }
    }
    e->raw_len = (size_t)(p->base + p->pos - e->raw);
    return SD_OK;
}

static kv_entry *find_entry(const sd_gguf *g, const char *key) {
    if (!g || !key || !g->kv_index.slots) return NULL;
    int64_t i = g->kv_index.slots[index_slot(g, &g->kv_index, kv_name, key)];
    return i >= 0 ? &g->kv[i] : NULL;
}

static sd_status parse_alignment(parser *p, sd_gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const kv_entry *e = find_entry(g, "general.alignment");
    if (!e) return SD_OK;
    if (e->type != SD_GGUF_TYPE_UINT32)
        return fail(p, SD_ERR_FORMAT, "general.alignment must be a uint32 (got type id %d)", (int)e->type);
    uint32_t a;
    memcpy(&a, e->raw, 4);
    if (a == 0 || (a & (a - 1)) != 0) return fail(p, SD_ERR_FORMAT, "general.alignment %u is not a power of two", a);
    g->alignment = a;
    return SD_OK;
}

/* ---- tensor infos ---- */

static sd_status parse_tensor_info(parser *p, sd_gguf *g, int64_t idx) {
    sd_gguf_tensor *t = &g->tensors[idx];
    sd_gguf_str name;
    SD_TRY(read_str(p, &name, "tensor name"));
    char *copy = NULL;
    SD_TRY(copy_name(p, name, "tensor name", &copy));
    t->name = copy;
    g->n_tensors = idx + 1; /* owns the name from here on */
    size_t slot = index_slot(g, &g->tensor_index, tensor_name, t->name);
    if (g->tensor_index.slots[slot] >= 0) return fail(p, SD_ERR_FORMAT, "duplicate tensor name '%s'", t->name);
    g->tensor_index.slots[slot] = idx;

    SD_TRY(read_u32(p, &t->n_dims, "tensor n_dims"));
    if (t->n_dims < 1 || t->n_dims > SD_GGUF_MAX_DIMS)
        return fail(p, SD_ERR_FORMAT, "tensor '%s': n_dims %u outside 1..%d", t->name, t->n_dims, SD_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < SD_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) SD_TRY(read_u64(p, &t->ne[d], "tensor dimension"));
    uint32_t type_id;
    SD_TRY(read_u32(p, &type_id, "tensor type"));
    uint64_t off;
    SD_TRY(read_u64(p, &off, "tensor offset"));
    g->tensor_off[idx] = off;

    for (uint32_t d = 0; d < t->n_dims; d++)
        if (t->ne[d] == 0) return fail(p, SD_ERR_FORMAT, "tensor '%s': ne[%u] is 0", t->name, d);
    size_t blk_elems, blk_bytes;
    if (!sd_dtype_block((sd_dtype)type_id, &blk_elems, &blk_bytes)) {
        if (type_id < GGUF_PLAUSIBLE_TYPE_IDS)
            return fail(p, SD_ERR_UNSUPPORTED,
                        "tensor '%s': tensor type id %u (%s) is not supported; specd reads F32, F16, BF16, Q8_0, "
                        "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K",
                        t->name, type_id, ggml_type_name(type_id));
        return fail(p, SD_ERR_FORMAT, "tensor '%s': bad tensor type id %u", t->name, type_id);
    }
    t->type = (sd_dtype)type_id;
    if (t->ne[0] % blk_elems != 0)
        return fail(p, SD_ERR_FORMAT, "tensor '%s': ne[0]=%llu is not a multiple of the %s block size %zu", t->name,
                    (unsigned long long)t->ne[0], sd_dtype_name(t->type), blk_elems);
    size_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (!sd_mul_ok(n, (size_t)t->ne[d], &n))
            return fail(p, SD_ERR_FORMAT, "tensor '%s': element count overflows", t->name);
    size_t n_bytes;
    if (!sd_mul_ok(n / blk_elems, blk_bytes, &n_bytes))
        return fail(p, SD_ERR_FORMAT, "tensor '%s': byte size overflows", t->name);
    t->n_elems = n;
    t->n_bytes = n_bytes;
    if (off % g->alignment != 0)
        return fail(p, SD_ERR_FORMAT, "tensor '%s': offset %llu is not a multiple of the alignment %llu", t->name,
                    (unsigned long long)off, (unsigned long long)g->alignment);
    return SD_OK;
}

typedef struct extent {
    size_t begin, end;
    int64_t idx;
} extent;

static int cmp_extent(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Places every tensor's data in the file and checks bounds and overlaps. */
static sd_status place_tensors(parser *p, sd_gguf *g) {
    if (g->n_tensors == 0) return SD_OK;
    extent *ext = malloc((size_t)g->n_tensors * sizeof *ext);
    if (!ext) return fail(p, SD_ERR_NOMEM, "out of memory placing tensors");
    sd_status s = SD_OK;
    for (int64_t i = 0; i < g->n_tensors && s == SD_OK; i++) {
        sd_gguf_tensor *t = &g->tensors[i];
        size_t begin, end;
        if (!sd_add_ok(g->data_start, (size_t)g->tensor_off[i], &begin) || !sd_add_ok(begin, t->n_bytes, &end)) {
            s = fail(p, SD_ERR_FORMAT, "tensor '%s': data offset %llu overflows", t->name,
                     (unsigned long long)g->tensor_off[i]);
        } else if (end > g->size) {
            s = fail(p, SD_ERR_FORMAT, "tensor '%s': data [%zu, %zu) extends past end of file (size %zu)", t->name,
                     begin, end, g->size);
        } else {
            t->data = g->base + begin;
            ext[i] = (extent){begin, end, i};
        }
    }
    if (s == SD_OK) {
        qsort(ext, (size_t)g->n_tensors, sizeof *ext, cmp_extent);
        for (int64_t i = 1; i < g->n_tensors; i++)
            if (ext[i].begin < ext[i - 1].end) {
                s = fail(p, SD_ERR_FORMAT, "tensors '%s' and '%s' overlap", g->tensors[ext[i - 1].idx].name,
                         g->tensors[ext[i].idx].name);
                break;
            }
    }
    free(ext);
    return s;
}

/* ---- open / close ---- */

static sd_status parse(parser *p, sd_gguf *g) {
    static const uint8_t magic[4] = {'G', 'G', 'U', 'F'};
    SD_TRY(need(p, 4, "magic"));
    if (memcmp(p->base, magic, 4) != 0)
        return fail(p, SD_ERR_FORMAT, "bad magic %02x %02x %02x %02x (not a GGUF file)", p->base[0], p->base[1],
                    p->base[2], p->base[3]);
    p->pos = 4;
    SD_TRY(read_u32(p, &g->version, "version"));
    if (g->version == 1) return fail(p, SD_ERR_UNSUPPORTED, "GGUF version 1 is not supported (convert the file to v3)");
    if (g->version == 0) return fail(p, SD_ERR_FORMAT, "bad version 0");
    if (g->version > 3) return fail(p, SD_ERR_UNSUPPORTED, "GGUF version %u is newer than supported (3)", g->version);
    uint64_t n_tensors, n_kv;
    SD_TRY(read_u64(p, &n_tensors, "tensor count"));
    SD_TRY(read_u64(p, &n_kv, "metadata count"));
    if (n_kv > remaining(p) / GGUF_MIN_KV_BYTES)
        return fail(p, SD_ERR_FORMAT, "metadata count %llu exceeds what the remaining %zu bytes can hold",
                    (unsigned long long)n_kv, remaining(p));
    if (n_tensors > remaining(p) / GGUF_MIN_TENSOR_INFO_BYTES)
        return fail(p, SD_ERR_FORMAT, "tensor count %llu exceeds what the remaining %zu bytes can hold",
                    (unsigned long long)n_tensors, remaining(p));

    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    g->tensor_off = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensor_off);
    if (!g->kv || !g->tensors || !g->tensor_off || !index_init(&g->kv_index, (int64_t)n_kv) ||
        !index_init(&g->tensor_index, (int64_t)n_tensors))
        return fail(p, SD_ERR_NOMEM, "out of memory for the index");

    for (uint64_t i = 0; i < n_kv; i++) SD_TRY(parse_kv(p, g, (int64_t)i));
    SD_TRY(parse_alignment(p, g));
    for (uint64_t i = 0; i < n_tensors; i++) SD_TRY(parse_tensor_info(p, g, (int64_t)i));
    /* p->pos <= size, so rounding up cannot overflow size_t. */
    g->data_start = (p->pos + (size_t)g->alignment - 1) / (size_t)g->alignment * (size_t)g->alignment;
    return place_tensors(p, g);
}

static void free_index(sd_gguf *g) {
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].arr_strs);
        }
    if (g->tensors)
        for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->tensor_off);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
}

/* Parses [base, base + size); the caller sets g->map afterwards when it
 * mapped the file (and unmaps on failure). */
static sd_status open_buffer(const uint8_t *base, size_t size, sd_gguf **out, char *err, size_t err_len) {
    sd_gguf *g = calloc(1, sizeof *g);
    parser p = {.base = base, .size = size, .pos = 0, .err = err, .err_len = err_len};
    if (!g) return fail(&p, SD_ERR_NOMEM, "out of memory");
    g->base = base;
    g->size = size;
    sd_status s = parse(&p, g);
    if (s != SD_OK) {
        sd_gguf_close(&g);
        return s;
    }
    *out = g;
    return SD_OK;
}

sd_status sd_gguf_open_memory(const void *data, size_t size, sd_gguf **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!out || (!data && size)) return SD_ERR_INVALID_ARG;
    *out = NULL;
    static const uint8_t empty[1] = {0};
    return open_buffer(data ? data : empty, size, out, err, err_len);
}

sd_status sd_gguf_open(const char *path, sd_gguf **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!path || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    parser p = {.err = err, .err_len = err_len};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(&p, SD_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(&p, SD_ERR_IO, "%s is not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        return fail(&p, SD_ERR_FORMAT, "truncated file: %s is empty", path);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return fail(&p, SD_ERR_IO, "cannot map %s: %s", path, strerror(map_errno));
    sd_file_map *fm = sd_file_map_adopt(map, size);
    if (!fm) {
        munmap(map, size);
        return fail(&p, SD_ERR_NOMEM, "out of memory opening %s", path);
    }
    sd_status s = open_buffer(map, size, out, err, err_len);
    if (s != SD_OK) {
        sd_file_map_release(&fm);
        return s;
    }
    (*out)->map = fm;
    return s;
}

sd_file_map *sd_gguf_file_map(const sd_gguf *g) { return g ? sd_file_map_retain(g->map) : NULL; }

void sd_gguf_close(sd_gguf **g) {
    if (!g || !*g) return;
    free_index(*g);
    sd_file_map_release(&(*g)->map);
    free(*g);
    *g = NULL;
}

uint32_t sd_gguf_version(const sd_gguf *g) { return g ? g->version : 0; }

bool sd_gguf_kv_raw(const sd_gguf *g, int64_t i, const uint8_t **bytes, size_t *n_bytes) {
    if (!g || i < 0 || i >= g->n_kv) return false;
    *bytes = g->kv[i].raw;
    *n_bytes = g->kv[i].raw_len;
    return true;
}

/* ---- metadata accessors ---- */

int64_t sd_gguf_n_kv(const sd_gguf *g) { return g ? g->n_kv : 0; }

int64_t sd_gguf_find_key(const sd_gguf *g, const char *key) {
    const kv_entry *e = find_entry(g, key);
    return e ? e - g->kv : -1;
}

const char *sd_gguf_key(const sd_gguf *g, int64_t i) { return g && i >= 0 && i < g->n_kv ? g->kv[i].key : NULL; }

sd_gguf_type sd_gguf_kv_type(const sd_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? g->kv[i].type : SD_GGUF_TYPE_COUNT;
}

bool sd_gguf_int_decode(sd_gguf_type type, const void *p, int64_t *s, uint64_t *u, bool *is_signed) {
    const uint8_t *b = p;
    switch (type) {
    case SD_GGUF_TYPE_UINT8: *u = b[0]; break;
    case SD_GGUF_TYPE_UINT16: *u = sd_load_u16(b); break;
    case SD_GGUF_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, b, 4);
        *u = v;
        break;
    }
    case SD_GGUF_TYPE_UINT64: memcpy(u, b, 8); break;
    case SD_GGUF_TYPE_INT8: *s = (int8_t)b[0]; break;
    case SD_GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, b, 2);
        *s = v;
        break;
    }
    case SD_GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, b, 4);
        *s = v;
        break;
    }
    case SD_GGUF_TYPE_INT64: memcpy(s, b, 8); break;
    default: return false;
    }
    *is_signed = type == SD_GGUF_TYPE_INT8 || type == SD_GGUF_TYPE_INT16 || type == SD_GGUF_TYPE_INT32 ||
                 type == SD_GGUF_TYPE_INT64;
    if (*is_signed)
        *u = *s < 0 ? 0 : (uint64_t)*s;
    else
        *s = *u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)*u;
    return true;
}

/* Reads an integer-typed scalar as (negative?, magnitude-or-value). */
static bool read_int(const kv_entry *e, bool *neg, uint64_t *u, int64_t *s) {
    bool is_signed;
    if (!sd_gguf_int_decode(e->type, e->raw, s, u, &is_signed)) return false;
    *neg = is_signed && *s < 0;
    return true;
}

sd_status sd_gguf_get_u64(const sd_gguf *g, const char *key, uint64_t *out) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    bool neg;
    uint64_t u;
    int64_t s;
    if (!read_int(e, &neg, &u, &s) || neg) return SD_ERR_FORMAT;
    *out = u;
    return SD_OK;
}

sd_status sd_gguf_get_u32(const sd_gguf *g, const char *key, uint32_t *out) {
    uint64_t v;
    SD_TRY(sd_gguf_get_u64(g, key, &v));
    if (v > UINT32_MAX) return SD_ERR_FORMAT;
    *out = (uint32_t)v;
    return SD_OK;
}

sd_status sd_gguf_get_i64(const sd_gguf *g, const char *key, int64_t *out) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    bool neg;
    uint64_t u;
    int64_t s;
    if (!read_int(e, &neg, &u, &s)) return SD_ERR_FORMAT;
    if (!neg && u > (uint64_t)INT64_MAX) return SD_ERR_FORMAT;
    *out = s;
    return SD_OK;
}

sd_status sd_gguf_get_f32(const sd_gguf *g, const char *key, float *out) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    if (e->type == SD_GGUF_TYPE_FLOAT32) {
        memcpy(out, e->raw, 4);
    } else if (e->type == SD_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, e->raw, 8);
        *out = (float)d;
    } else {
        return SD_ERR_FORMAT;
    }
    return SD_OK;
}

sd_status sd_gguf_get_bool(const sd_gguf *g, const char *key, bool *out) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    if (e->type != SD_GGUF_TYPE_BOOL) return SD_ERR_FORMAT;
    *out = e->raw[0] != 0;
    return SD_OK;
}

sd_status sd_gguf_get_str(const sd_gguf *g, const char *key, sd_gguf_str *out) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    if (e->type != SD_GGUF_TYPE_STRING) return SD_ERR_FORMAT;
    uint64_t len;
    memcpy(&len, e->raw, 8);
    out->ptr = (const char *)e->raw + 8;
    out->len = len;
    return SD_OK;
}

sd_status sd_gguf_get_arr(const sd_gguf *g, const char *key, sd_gguf_type *elem_type, uint64_t *len) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    if (e->type != SD_GGUF_TYPE_ARRAY) return SD_ERR_FORMAT;
    if (elem_type) *elem_type = e->arr_type;
    if (len) *len = e->arr_len;
    return SD_OK;
}

sd_status sd_gguf_get_arr_str(const sd_gguf *g, const char *key, uint64_t i, sd_gguf_str *out) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    if (e->type != SD_GGUF_TYPE_ARRAY || e->arr_type != SD_GGUF_TYPE_STRING) return SD_ERR_FORMAT;
    if (i >= e->arr_len) return SD_ERR_RANGE;
    *out = e->arr_strs[i];
    return SD_OK;
}

sd_status sd_gguf_get_arr_data(const sd_gguf *g, const char *key, const void **data, uint64_t *len) {
    const kv_entry *e = find_entry(g, key);
    if (!e) return SD_ERR_NOT_FOUND;
    if (e->type != SD_GGUF_TYPE_ARRAY || sd_gguf_type_size(e->arr_type) == 0) return SD_ERR_FORMAT;
    *data = e->arr_data;
    *len = e->arr_len;
    return SD_OK;
}

/* ---- tensors ---- */

int64_t sd_gguf_n_tensors(const sd_gguf *g) { return g ? g->n_tensors : 0; }

const sd_gguf_tensor *sd_gguf_tensor_at(const sd_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const sd_gguf_tensor *sd_gguf_find_tensor(const sd_gguf *g, const char *name) {
    if (!g || !name || !g->tensor_index.slots) return NULL;
    int64_t i = g->tensor_index.slots[index_slot(g, &g->tensor_index, tensor_name, name)];
    return i >= 0 ? &g->tensors[i] : NULL;
}
