/* safetensors.c — .safetensors reader: validate the header once at open, then
 * serve borrowed views into the mapping.
 *
 * The checks follow the reference implementation (huggingface/safetensors,
 * tensor.rs: read_metadata and Metadata::validate), one named rule each, in
 * this order:
 *   HeaderTooSmall       fewer than 8 bytes
 *   HeaderTooLarge       N over 100 000 000
 *   InvalidHeaderLength  8 + N past the end of the file
 *   InvalidHeaderUtf8    header bytes not valid UTF-8
 *   HeaderTooComplex     more JSON values than MAX_JSON_VALUES (ours: bounds
 *                        the parse tree, see below)
 *   InvalidHeaderJson    not a JSON object (syntax, control bytes, trailing
 *                        garbage, another kind of value)
 *   InvalidMetadata      "__metadata__" not an object of strings (or null)
 *   InvalidTensorInfo    an entry not {dtype: str, shape: [uint], data_offsets:
 *                        [uint, uint]}
 *   UnknownDtype         dtype outside the format's list
 *   DuplicateName        a name (or "__metadata__") twice
 *   InvalidOffset        begin > end, or a hole / an overlap between tensors
 *                        sorted by offsets (the first must start at 0)
 *   ValidationOverflow   shape product x dtype bits overflows 64 bits
 *   MisalignedSlice      the tensor's bits are not a whole number of bytes
 *   TensorInvalidInfo    byte size differs from end - begin
 *   MetadataIncompleteBuffer  the tensors do not end exactly at the end of
 *                        the file
 * The reference learns about duplicate names only indirectly (its map keeps
 * the last entry, and the lost tensor's bytes then show up as a hole); here
 * a duplicate is its own, clearer error, even when both entries are the same
 * (which the reference accepts). Its InvalidHeaderStart rule (the header's
 * first byte must be '{') is written but commented out in the reference, and
 * its reader accepts JSON whitespace first; so does this one.
 * tests/ref/test_hf_oracle.py runs both readers over the same crafted files.
 *
 * JSON is parsed with cJSON after a single pre-scan that checks what cJSON
 * is lax about (raw control bytes inside strings, non-JSON whitespace) and
 * counts values: cJSON spends about 64 bytes per value, so a 100 MB header
 * of "[0,0,0,...]" would cost gigabytes; MAX_JSON_VALUES caps it (a 70B
 * checkpoint's shard header holds a few thousand values). cJSON stores
 * numbers as doubles, so shape dims and offsets must be integers no larger
 * than 2^53 (exact in a double; 8 PB, far past any file). Names and metadata
 * are copied out and the parse tree freed at open.
 *
 * Rejected: a hand-written JSON parser (cJSON is already a dependency and
 * well fuzzed), and lazy validation (every accessor would re-check). Only
 * little-endian hosts are handled, like the format itself. */
#include "specd/safetensors.h"

#include <cjson/cJSON.h>
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
#error "safetensors.c assumes a little-endian host"
#endif

#define MAX_JSON_VALUES (16u * 1024u * 1024u)
#define MAX_EXACT_INT   9007199254740992.0 /* 2^53 */

struct sd_safetensors {
    const uint8_t *base;
    size_t size;
    bool mapped;
    size_t data_start; /* 8 + N */
    int64_t n_tensors;
    sd_safetensors_tensor *tensors; /* [n_tensors] in data order */
    int64_t *by_name;               /* [n_tensors] indices sorted by name */
    uint64_t *dims;                 /* every tensor's shape, back to back */
    char **names;                   /* [n_tensors] owned */
    int64_t n_meta;
    char **meta_key;   /* [n_meta] owned */
    char **meta_value; /* [n_meta] owned */
};

static const struct {
    const char *name;
    uint32_t bits;
} DTYPES[SD_SAFETENSORS_DTYPE_COUNT] = {
    [SD_SAFETENSORS_BOOL] = {"BOOL", 8},       [SD_SAFETENSORS_U8] = {"U8", 8},
    [SD_SAFETENSORS_I8] = {"I8", 8},           [SD_SAFETENSORS_F8_E5M2] = {"F8_E5M2", 8},
    [SD_SAFETENSORS_F8_E4M3] = {"F8_E4M3", 8}, [SD_SAFETENSORS_F8_E8M0] = {"F8_E8M0", 8},
    [SD_SAFETENSORS_F4] = {"F4", 4},           [SD_SAFETENSORS_F6_E2M3] = {"F6_E2M3", 6},
    [SD_SAFETENSORS_F6_E3M2] = {"F6_E3M2", 6}, [SD_SAFETENSORS_I16] = {"I16", 16},
    [SD_SAFETENSORS_U16] = {"U16", 16},        [SD_SAFETENSORS_F16] = {"F16", 16},
    [SD_SAFETENSORS_BF16] = {"BF16", 16},      [SD_SAFETENSORS_I32] = {"I32", 32},
    [SD_SAFETENSORS_U32] = {"U32", 32},        [SD_SAFETENSORS_F32] = {"F32", 32},
    [SD_SAFETENSORS_F64] = {"F64", 64},        [SD_SAFETENSORS_I64] = {"I64", 64},
    [SD_SAFETENSORS_U64] = {"U64", 64},
};

const char *sd_safetensors_dtype_name(sd_safetensors_dtype t) {
    return (unsigned)t < SD_SAFETENSORS_DTYPE_COUNT ? DTYPES[t].name : "?";
}

uint32_t sd_safetensors_dtype_bits(sd_safetensors_dtype t) {
    return (unsigned)t < SD_SAFETENSORS_DTYPE_COUNT ? DTYPES[t].bits : 0;
}

bool sd_safetensors_dtype_to_sd(sd_safetensors_dtype t, sd_dtype *out) {
    switch (t) {
    case SD_SAFETENSORS_F32: *out = SD_DTYPE_F32; return true;
    case SD_SAFETENSORS_F16: *out = SD_DTYPE_F16; return true;
    case SD_SAFETENSORS_BF16: *out = SD_DTYPE_BF16; return true;
    default: return false;
    }
}

typedef struct parser {
    char *err;
    size_t err_len;
} parser;

/* Logs and reports "rule: message"; returns s. */
__attribute__((format(printf, 4, 5))) static sd_status fail(const parser *p, sd_status s, const char *rule,
                                                            const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->err && p->err_len > 0) snprintf(p->err, p->err_len, "%s: %s", rule, msg);
    SD_ERROR("safetensors: %s: %s", rule, msg);
    return s;
}

/* ---- header text checks ---- */

/* What cJSON does not check: raw control bytes inside strings and
 * whitespace other than space, tab, LF, CR outside them. Counts values
 * (roughly: commas and container openings) into *n_values. Returns the
 * offset of the first bad byte, or len. */
static size_t json_prescan(const uint8_t *s, size_t len, uint64_t *n_values) {
    bool in_string = false, escaped = false;
    uint64_t n = 1;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = s[i];
        if (in_string) {
            if (c < 0x20) return i;
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"')
            in_string = true;
        else if (c == ',' || c == '[' || c == '{')
            n++;
        else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
            return i;
    }
    *n_values = n;
    return len;
}

/* A JSON number that is an integer in [0, 2^53]. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d > MAX_EXACT_INT || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- the entries ---- */

typedef struct entry {
    const char *name; /* borrowed from the parse tree */
    const cJSON *shape;
    sd_safetensors_dtype dtype;
    uint32_t n_dims;
    uint64_t begin, end;
} entry;

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* First name that appears twice among n (sorted in place), or NULL. */
static const char *find_duplicate(const char **names, size_t n) {
    qsort(names, n, sizeof *names, cmp_str_ptr);
    for (size_t k = 1; k < n; k++)
        if (strcmp(names[k - 1], names[k]) == 0) return names[k];
    return NULL;
}

static sd_status parse_metadata(const parser *p, sd_safetensors *st, const cJSON *m) {
    if (cJSON_IsNull(m)) return SD_OK; /* Option<HashMap> in the reference */
    if (!cJSON_IsObject(m))
        return fail(p, SD_ERR_FORMAT, "InvalidMetadata", "__metadata__ is not an object of strings");
    int64_t n = 0;
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return fail(p, SD_ERR_FORMAT, "InvalidMetadata", "__metadata__ entry '%.64s' is not a string",
                        c->string ? c->string : "");
        n++;
    }
    size_t cap = (size_t)(n ? n : 1);
    st->meta_key = calloc(cap, sizeof *st->meta_key);
    st->meta_value = calloc(cap, sizeof *st->meta_value);
    if (!st->meta_key || !st->meta_value) return fail(p, SD_ERR_NOMEM, "OutOfMemory", "metadata");
    for (const cJSON *c = m->child; c; c = c->next) {
        st->meta_key[st->n_meta] = dup_str(c->string ? c->string : "");
        st->meta_value[st->n_meta] = dup_str(c->valuestring);
        st->n_meta++;
        if (!st->meta_key[st->n_meta - 1] || !st->meta_value[st->n_meta - 1])
            return fail(p, SD_ERR_NOMEM, "OutOfMemory", "metadata");
    }
    const char **keys = malloc(cap * sizeof *keys);
    if (!keys) return fail(p, SD_ERR_NOMEM, "OutOfMemory", "metadata");
    memcpy(keys, st->meta_key, (size_t)n * sizeof *keys);
    const char *dup = find_duplicate(keys, (size_t)n);
    sd_status s = dup ? fail(p, SD_ERR_FORMAT, "DuplicateName", "__metadata__ key '%.64s' appears twice", dup) : SD_OK;
    free(keys);
    return s;
}

/* Checks the form of one tensor entry e into *out. */
static sd_status parse_entry(const parser *p, const cJSON *e, entry *out) {
    const char *name = e->string ? e->string : "";
    if (!cJSON_IsObject(e)) return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo", "tensor '%.64s' is not an object", name);
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (c->string && strcmp(c->string, "dtype") == 0) slot = &jd;
        if (c->string && strcmp(c->string, "shape") == 0) slot = &js;
        if (c->string && strcmp(c->string, "data_offsets") == 0) slot = &jo;
        if (!slot) continue; /* unknown fields are ignored, as serde does */
        if (*slot)
            return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo", "tensor '%.64s' has field %s twice", name, c->string);
        *slot = c;
    }
    if (!cJSON_IsString(jd))
        return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo", "tensor '%.64s' has no dtype string", name);
    if (!cJSON_IsArray(js))
        return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo", "tensor '%.64s' has no shape array", name);
    if (!cJSON_IsArray(jo))
        return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo", "tensor '%.64s' has no data_offsets array", name);
    uint32_t nd = 0;
    for (const cJSON *c = js->child; c; c = c->next) {
        uint64_t v;
        if (!json_uint(c, &v))
            return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo",
                        "tensor '%.64s': shape dim %u is not an integer in [0, 2^53]", name, nd);
        nd++; /* cannot wrap: MAX_JSON_VALUES bounds the dims */
    }
    const cJSON *b = jo->child, *en = b ? b->next : NULL;
    if (!b || !en || en->next || !json_uint(b, &out->begin) || !json_uint(en, &out->end))
        return fail(p, SD_ERR_FORMAT, "InvalidTensorInfo",
                    "tensor '%.64s': data_offsets is not [begin, end] with integers in [0, 2^53]", name);
    int t = 0;
    while (t < SD_SAFETENSORS_DTYPE_COUNT && strcmp(DTYPES[t].name, jd->valuestring) != 0) t++;
    if (t == SD_SAFETENSORS_DTYPE_COUNT)
        return fail(p, SD_ERR_FORMAT, "UnknownDtype", "tensor '%.64s' has unknown dtype '%.32s'", name,
                    jd->valuestring);
    out->name = name;
    out->shape = js;
    out->dtype = (sd_safetensors_dtype)t;
    out->n_dims = nd;
    return SD_OK;
}

static int cmp_entry_offsets(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Writes "[d0, d1, ...]" of t into buf for messages. */
static const char *shape_str(const sd_safetensors_tensor *t, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < t->n_dims && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Offsets and sizes of every tensor, in data order (Metadata::validate). */
static sd_status check_layout(const parser *p, sd_safetensors *st, const entry *ents, uint64_t data_len) {
    uint64_t expect = 0;
    char sh[160];
    for (int64_t i = 0; i < st->n_tensors; i++) {
        sd_safetensors_tensor *t = &st->tensors[i];
        const entry *e = &ents[i];
        if (e->end < e->begin)
            return fail(p, SD_ERR_FORMAT, "InvalidOffset",
                        "tensor '%.64s': data_offsets [%llu, %llu] end before they begin", t->name,
                        (unsigned long long)e->begin, (unsigned long long)e->end);
        if (e->begin > expect)
            return fail(p, SD_ERR_FORMAT, "InvalidOffset",
                        "tensor '%.64s' begins at %llu but the bytes before it end at %llu: a hole in the data",
                        t->name, (unsigned long long)e->begin, (unsigned long long)expect);
        if (e->begin < expect)
            return fail(p, SD_ERR_FORMAT, "InvalidOffset",
                        "tensor '%.64s' begins at %llu, inside the previous tensor (which ends at %llu): an overlap",
                        t->name, (unsigned long long)e->begin, (unsigned long long)expect);
        expect = e->end;
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (__builtin_mul_overflow(n, t->shape[d], &n))
                return fail(p, SD_ERR_FORMAT, "ValidationOverflow", "tensor '%.64s': shape %s has too many elements",
                            t->name, shape_str(t, sh, sizeof sh));
        uint64_t bits;
        if (__builtin_mul_overflow(n, (uint64_t)sd_safetensors_dtype_bits(t->dtype), &bits))
            return fail(p, SD_ERR_FORMAT, "ValidationOverflow", "tensor '%.64s': shape %s of %s overflows in bits",
                        t->name, shape_str(t, sh, sizeof sh), sd_safetensors_dtype_name(t->dtype));
        if (bits % 8 != 0)
            return fail(p, SD_ERR_FORMAT, "MisalignedSlice",
                        "tensor '%.64s': %llu elements of %s are not a whole number of bytes", t->name,
                        (unsigned long long)n, sd_safetensors_dtype_name(t->dtype));
        if (bits / 8 != e->end - e->begin)
            return fail(p, SD_ERR_FORMAT, "TensorInvalidInfo",
                        "tensor '%.64s': shape %s of %s is %llu bytes but data_offsets [%llu, %llu] span %llu", t->name,
                        shape_str(t, sh, sizeof sh), sd_safetensors_dtype_name(t->dtype),
                        (unsigned long long)(bits / 8), (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)(e->end - e->begin));
        t->n_elems = n;
        t->n_bytes = bits / 8;
    }
    if (expect > data_len)
        return fail(p, SD_ERR_FORMAT, "MetadataIncompleteBuffer",
                    "the tensors end at byte %llu of the data section but it holds only %llu (truncated file?)",
                    (unsigned long long)expect, (unsigned long long)data_len);
    if (expect < data_len)
        return fail(p, SD_ERR_FORMAT, "MetadataIncompleteBuffer",
                    "the tensors end at byte %llu of the data section but it holds %llu: %llu trailing bytes",
                    (unsigned long long)expect, (unsigned long long)data_len, (unsigned long long)(data_len - expect));
    return SD_OK;
}

/* Copies the entries (in data order) into st's tensors. */
static sd_status build_tensors(const parser *p, sd_safetensors *st, const entry *ents, int64_t n, uint64_t total_dims) {
    size_t cap = (size_t)(n ? n : 1);
    st->tensors = calloc(cap, sizeof *st->tensors);
    st->names = calloc(cap, sizeof *st->names);
    st->by_name = calloc(cap, sizeof *st->by_name);
    st->dims = calloc((size_t)(total_dims ? total_dims : 1), sizeof *st->dims);
    if (!st->tensors || !st->names || !st->by_name || !st->dims)
        return fail(p, SD_ERR_NOMEM, "OutOfMemory", "%lld tensors", (long long)n);
    st->n_tensors = n;
    uint64_t at = 0;
    for (int64_t k = 0; k < n; k++) {
        sd_safetensors_tensor *t = &st->tensors[k];
        if (!(st->names[k] = dup_str(ents[k].name))) return fail(p, SD_ERR_NOMEM, "OutOfMemory", "names");
        t->name = st->names[k];
        t->dtype = ents[k].dtype;
        t->n_dims = ents[k].n_dims;
        t->shape = st->dims + at;
        for (const cJSON *c = ents[k].shape->child; c; c = c->next) json_uint(c, &st->dims[at++]);
        st->by_name[k] = k;
    }
    return SD_OK;
}

/* Everything after the JSON parse: entries, duplicates, layout. */
static sd_status parse_entries(const parser *p, sd_safetensors *st, const cJSON *root) {
    int64_t n = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c->string && strcmp(c->string, "__metadata__") == 0) {
            if (meta) return fail(p, SD_ERR_FORMAT, "DuplicateName", "__metadata__ appears twice");
            meta = c;
        } else {
            n++;
        }
    }
    if (meta) SD_TRY(parse_metadata(p, st, meta));
    size_t cap = (size_t)(n ? n : 1);
    entry *ents = calloc(cap, sizeof *ents);
    const char **names = calloc(cap, sizeof *names);
    sd_status s = ents && names ? SD_OK : fail(p, SD_ERR_NOMEM, "OutOfMemory", "%lld tensors", (long long)n);
    int64_t i = 0;
    uint64_t total_dims = 0;
    for (const cJSON *c = root->child; s == SD_OK && c; c = c->next) {
        if (c == meta) continue;
        s = parse_entry(p, c, &ents[i]);
        names[i] = ents[i].name;
        total_dims += ents[i].n_dims;
        i++;
    }
    if (s == SD_OK) {
        const char *dup = find_duplicate(names, (size_t)n);
        if (dup) s = fail(p, SD_ERR_FORMAT, "DuplicateName", "tensor name '%.64s' appears twice", dup);
    }
    if (s == SD_OK) {
        qsort(ents, (size_t)n, sizeof *ents, cmp_entry_offsets);
        s = build_tensors(p, st, ents, n, total_dims);
    }
    if (s == SD_OK) s = check_layout(p, st, ents, (uint64_t)(st->size - st->data_start));
    for (int64_t k = 0; s == SD_OK && k < n; k++) st->tensors[k].data = st->base + st->data_start + ents[k].begin;
    free(ents);
    free(names);
    return s;
}

static int cmp_by_name(const void *a, const void *b, void *ctx) {
    const sd_safetensors *st = ctx;
    return strcmp(st->tensors[*(const int64_t *)a].name, st->tensors[*(const int64_t *)b].name);
}

static sd_status parse(const parser *p, sd_safetensors *st) {
    if (st->size < 8)
        return fail(p, SD_ERR_FORMAT, "HeaderTooSmall", "file of %zu bytes is shorter than the 8-byte header length",
                    st->size);
    uint64_t n;
    memcpy(&n, st->base, 8);
    if (n > SD_SAFETENSORS_MAX_HEADER)
        return fail(p, SD_ERR_FORMAT, "HeaderTooLarge", "header length %llu is over the cap of %llu bytes",
                    (unsigned long long)n, (unsigned long long)SD_SAFETENSORS_MAX_HEADER);
    if (n > st->size - 8)
        return fail(p, SD_ERR_FORMAT, "InvalidHeaderLength",
                    "header length %llu runs past the end of the file (%zu bytes after the length)",
                    (unsigned long long)n, st->size - 8);
    const uint8_t *h = st->base + 8;
    size_t len = (size_t)n;
    st->data_start = 8 + len;
    size_t bad = sd_utf8_valid_len(h, len);
    if (bad < len)
        return fail(p, SD_ERR_FORMAT, "InvalidHeaderUtf8", "header byte %zu (0x%02x) is not valid UTF-8", bad, h[bad]);
    uint64_t n_values = 0;
    bad = json_prescan(h, len, &n_values);
    if (bad < len)
        return fail(p, SD_ERR_FORMAT, "InvalidHeaderJson", "header byte %zu is a raw control character (0x%02x)", bad,
                    h[bad]);
    if (n_values > MAX_JSON_VALUES)
        return fail(p, SD_ERR_FORMAT, "HeaderTooComplex", "header holds about %llu JSON values, over the limit of %u",
                    (unsigned long long)n_values, MAX_JSON_VALUES);
    /* cJSON wants the NUL inside the length to reject trailing garbage */
    char *text = malloc(len + 1);
    if (!text) return fail(p, SD_ERR_NOMEM, "OutOfMemory", "header of %zu bytes", len);
    memcpy(text, h, len);
    text[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    sd_status s;
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        s = fail(p, SD_ERR_FORMAT, "InvalidHeaderJson", "header is not valid JSON (error near byte %zu)", at);
    } else if (!cJSON_IsObject(root)) {
        s = fail(p, SD_ERR_FORMAT, "InvalidHeaderJson", "header is not a JSON object");
    } else {
        s = parse_entries(p, st, root);
    }
    cJSON_Delete(root);
    free(text);
    if (s == SD_OK) qsort_r(st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, cmp_by_name, st);
    return s;
}

void sd_safetensors_close(sd_safetensors **stp) {
    if (!stp || !*stp) return;
    sd_safetensors *st = *stp;
    for (int64_t i = 0; st->names && i < st->n_tensors; i++) free(st->names[i]);
    for (int64_t i = 0; i < st->n_meta; i++) {
        free(st->meta_key[i]);
        free(st->meta_value[i]);
    }
    free(st->names);
    free(st->meta_key);
    free(st->meta_value);
    free(st->tensors);
    free(st->by_name);
    free(st->dims);
    if (st->mapped) munmap((void *)st->base, st->size);
    free(st);
    *stp = NULL;
}

static sd_status open_buffer(const uint8_t *base, size_t size, bool mapped, sd_safetensors **out, char *err,
                             size_t err_len) {
    parser p = {.err = err, .err_len = err_len};
    sd_safetensors *st = calloc(1, sizeof *st);
    if (!st) return fail(&p, SD_ERR_NOMEM, "OutOfMemory", "handle");
    st->base = base;
    st->size = size;
    st->mapped = mapped;
    sd_status s = parse(&p, st);
    if (s != SD_OK) {
        st->mapped = false; /* the caller unmaps on failure */
        sd_safetensors_close(&st);
        return s;
    }
    *out = st;
    return SD_OK;
}

sd_status sd_safetensors_open_memory(const void *data, size_t size, sd_safetensors **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!out || (!data && size)) return SD_ERR_INVALID_ARG;
    *out = NULL;
    static const uint8_t empty[1] = {0};
    return open_buffer(data ? data : empty, size, false, out, err, err_len);
}

sd_status sd_safetensors_open(const char *path, sd_safetensors **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!path || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    parser p = {.err = err, .err_len = err_len};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(&p, SD_ERR_IO, "IoError", "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return fail(&p, SD_ERR_IO, "IoError", "%s is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) { /* nothing to map; the parser names the rule */
        close(fd);
        uint8_t small[8];
        return open_buffer(small, size, false, out, err, err_len);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return fail(&p, SD_ERR_IO, "IoError", "cannot map %s: %s", path, strerror(map_errno));
    sd_status s = open_buffer(map, size, true, out, err, err_len);
    if (s != SD_OK) munmap(map, size);
    return s;
}

int64_t sd_safetensors_n_tensors(const sd_safetensors *st) { return st ? st->n_tensors : 0; }

const sd_safetensors_tensor *sd_safetensors_tensor_at(const sd_safetensors *st, int64_t i) {
    return st && i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const sd_safetensors_tensor *sd_safetensors_find(const sd_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int64_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const sd_safetensors_tensor *t = &st->tensors[st->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int64_t sd_safetensors_n_metadata(const sd_safetensors *st) { return st ? st->n_meta : 0; }

bool sd_safetensors_metadata_at(const sd_safetensors *st, int64_t i, const char **key, const char **value) {
    if (!st || i < 0 || i >= st->n_meta) return false;
    if (key) *key = st->meta_key[i];
    if (value) *value = st->meta_value[i];
    return true;
}

const char *sd_safetensors_metadata(const sd_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int64_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_key[i], key) == 0) return st->meta_value[i];
    return NULL;
}
