/* tokenizer.c — building the tokenizer's tables; accessors.
 *
 * Built once by sd_tok_build from a validated sd_tok_spec, then immutable:
 *  - token texts and their decoded byte pieces live in two arenas;
 *  - text -> id and (left id, right id) -> (rank, merged id) are open-
 *    addressing hash maps, so BPE never compares strings;
 *  - control/user-defined tokens are bucketed by first byte, longest first,
 *    so special-token matching is one bucket probe per input byte;
 *  - the pre-tokenizer (byte-level BPE only) is a sequence of PCRE2 regexes
 *    (UTF + UCP, invalid UTF-8 tolerated, JIT when available).
 * Two algorithms share these tables: byte-level BPE (model "gpt2",
 * tokenizer_encode.c) and SentencePiece-style BPE over characters with byte
 * fallback (model "llama", tokenizer_spm.c, which adds its own tables).
 * Nothing here depends on the vocabulary size beyond linear work: a 262k
 * vocabulary (Gemma 3) builds in one pass plus one sort. */
#include "tokenizer_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BYTE_CPS 324 /* bytes_to_unicode maps every byte below U+0144 */

/* ---- byte-level symbol table (GPT-2 bytes_to_unicode) ----
 * Printable Latin-1 bytes stand for themselves; the other 68 bytes are mapped
 * in order to U+0100.. so every byte has a visible, non-space symbol. */
static bool byte_is_printable(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void byte_level_tables(uint32_t cp_of_byte[256], int16_t byte_of_cp[N_BYTE_CPS]) {
    for (int i = 0; i < N_BYTE_CPS; i++) byte_of_cp[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        cp_of_byte[b] = byte_is_printable(b) ? (uint32_t)b : next++;
        byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    }
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int sd_tok_utf8_scan(const unsigned char *s, size_t len, uint32_t *cp) {
    unsigned b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF)
        need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else
        return -1;
    uint32_t v = b0 & (need == 2 ? 0x1Fu : need == 3 ? 0x0Fu : 0x07u);
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= len) return 0;
        unsigned b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need;
}
/* ---- hashing ---- */
static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ULL

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static size_t table_size(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

int32_t sd_tok_lookup_text(const sd_tok *t, const char *s, size_t len) {
    size_t i = (size_t)fnv1a(FNV_OFFSET, s, len) & t->tok_mask;
    for (;;) {
        int32_t id = t->tok_slots[i];
        if (id < 0) return -1;
        size_t l;
        const char *txt = sd_tok_text_of(t, id, &l);
        if (l == len && memcmp(txt, s, len) == 0) return id;
        i = (i + 1) & t->tok_mask;
    }
}

const merge_slot *sd_tok_lookup_merge(const sd_tok *t, int32_t left, int32_t right) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t i = (size_t)mix64(key) & t->merge_mask;
    for (;;) {
        const merge_slot *s = &t->merge_slots[i];
        if (s->rank < 0) return NULL;
        if (s->key == key) return s;
        i = (i + 1) & t->merge_mask;
    }
}
/* ---- pre-tokenizer definitions ---- */
static const char RE_DIGITS[] = "\\p{N}";
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Qwen2 / Qwen2.5 / Qwen3: Llama 3's regex with single digits. */
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct pre_def {
    const char *name;
    const char *re[MAX_PRE_REGEX];
    int n_re;
    bool ignore_merges;
} pre_def;

static const pre_def PRE_DEFS[] = {
    {"default", {RE_GPT2}, 1, false},           {"gpt2", {RE_GPT2}, 1, false},
    {"smollm", {RE_DIGITS, RE_GPT2}, 2, false}, {"starcoder", {RE_DIGITS, RE_GPT2}, 2, false},
    {"refact", {RE_DIGITS, RE_GPT2}, 2, false}, {"llama-bpe", {RE_LLAMA3}, 1, true},
    {"llama3", {RE_LLAMA3}, 1, true},           {"qwen2", {RE_QWEN2}, 1, false},
};
#define N_PRE_DEFS (sizeof PRE_DEFS / sizeof PRE_DEFS[0])

bool sd_tok_pre_def_at(size_t i, const char **name, const char *const **regexes, int *n_regexes, bool *ignore_merges) {
    if (i >= N_PRE_DEFS) return false;
    *name = PRE_DEFS[i].name;
    *regexes = PRE_DEFS[i].re;
    *n_regexes = PRE_DEFS[i].n_re;
    *ignore_merges = PRE_DEFS[i].ignore_merges;
    return true;
}

static bool text_eq(sd_tok_text a, const char *s) {
    size_t n = strlen(s);
    return a.len == n && memcmp(a.ptr, s, n) == 0;
}

/* ---- construction ---- */
sd_tok_spec sd_tok_spec_default(void) {
    sd_tok_spec s;
    memset(&s, 0, sizeof s);
    s.model = (sd_tok_text){"gpt2", 4};
    s.pre = (sd_tok_text){"default", 7};
    s.bos = s.eos = s.unk = s.pad = s.eot = -1;
    return s;
}

void sd_tok_free(sd_tok **tp) {
    if (!tp || !*tp) return;
    sd_tok *t = *tp;
    free(t->text_arena);
    free(t->text_off);
    free(t->piece_arena);
    free(t->piece_off);
    free(t->types);
    free(t->tok_slots);
    free(t->merge_slots);
    free(t->special_ids);
    free(t->special_lens);
    free(t->rstrip);
    free(t->score_rank);
    for (int i = 0; i < t->n_pre_re; i++) pcre2_code_free(t->pre_re[i]);
    free(t);
    *tp = NULL;
}

static sd_status build_texts(sd_tok *t, const sd_tok_spec *spec) {
    size_t n = spec->n_tokens, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!spec->tokens[i].ptr && spec->tokens[i].len) return SD_ERR_INVALID_ARG;
        if (!sd_add_ok(total, spec->tokens[i].len, &total)) return SD_ERR_RANGE;
    }
    size_t piece_total;
    if (!sd_add_ok(total, n, &piece_total)) return SD_ERR_RANGE;
    t->text_arena = malloc(total ? total : 1);
    t->piece_arena = malloc(piece_total ? piece_total : 1);
    t->text_off = malloc((n + 1) * sizeof *t->text_off);
    t->piece_off = malloc((n + 1) * sizeof *t->piece_off);
    t->types = malloc(n * sizeof *t->types);
    if (!t->text_arena || !t->piece_arena || !t->text_off || !t->piece_off || !t->types) return SD_ERR_NOMEM;

    uint32_t cp_of_byte[256];
    int16_t byte_of_cp[N_BYTE_CPS];
    byte_level_tables(cp_of_byte, byte_of_cp);
    size_t to = 0, po = 0;
    for (size_t i = 0; i < n; i++) {
        sd_tok_text tx = spec->tokens[i];
        int32_t type = spec->types ? spec->types[i] : SD_TOK_TYPE_NORMAL;
        if (type < SD_TOK_TYPE_UNDEFINED || type > SD_TOK_TYPE_BYTE) {
            SD_ERROR("tokenizer: token %zu '%.*s' has unknown type %d", i, PREVIEW(tx), (int)type);
            return SD_ERR_FORMAT;
        }
        t->types[i] = type;
        t->text_off[i] = to;
        if (tx.len) memcpy(t->text_arena + to, tx.ptr, tx.len);
        to += tx.len;
        t->piece_off[i] = po;
        bool verbatim = type == SD_TOK_TYPE_CONTROL || type == SD_TOK_TYPE_USER_DEFINED || type == SD_TOK_TYPE_UNKNOWN;
        if (t->algo == SD_TOK_ALGO_SPM) {
            po += sd_tok_spm_piece(tx, type, t->piece_arena + po);
        } else if (verbatim) {
            if (tx.len) memcpy(t->piece_arena + po, tx.ptr, tx.len);
            po += tx.len;
        } else {
            /* Each symbol maps back to one byte; anything outside the table
             * (not produced by a byte-level model) is kept as it is. */
            const unsigned char *s = (const unsigned char *)tx.ptr;
            size_t k = 0;
            while (k < tx.len) {
                uint32_t cp = 0;
                int r = sd_tok_utf8_scan(s + k, tx.len - k, &cp);
                if (r > 0 && cp < N_BYTE_CPS && byte_of_cp[cp] >= 0) {
                    t->piece_arena[po++] = (char)byte_of_cp[cp];
                    k += (size_t)r;
                } else {
                    size_t step = r > 0 ? (size_t)r : r < 0 ? (size_t)-r : tx.len - k;
                    memcpy(t->piece_arena + po, s + k, step);
                    po += step;
                    k += step;
                }
            }
        }
        t->piece_arena[po++] = '\0';
    }
    t->text_off[n] = to;
    t->piece_off[n] = po;

    t->tok_mask = table_size(n) - 1;
    t->tok_slots = malloc((t->tok_mask + 1) * sizeof *t->tok_slots);
    if (!t->tok_slots) return SD_ERR_NOMEM;
    memset(t->tok_slots, 0xFF, (t->tok_mask + 1) * sizeof *t->tok_slots);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *s = sd_tok_text_of(t, (int32_t)i, &len);
        size_t h = (size_t)fnv1a(FNV_OFFSET, s, len) & t->tok_mask;
        bool dup = false;
        while (t->tok_slots[h] >= 0) {
            size_t l2;
            const char *s2 = sd_tok_text_of(t, t->tok_slots[h], &l2);
            if (l2 == len && memcmp(s, s2, len) == 0) {
                dup = true;
                break;
            }
            h = (h + 1) & t->tok_mask;
        }
        if (dup)
            SD_DEBUG("tokenizer: token %zu duplicates token %d; the first wins", i, t->tok_slots[h]);
        else
            t->tok_slots[h] = (int32_t)i;
    }

    if (t->algo == SD_TOK_ALGO_SPM) return SD_OK; /* byte fallback: sd_tok_spm_build */
    /* Real vocabularies lack some bytes (SmolLM2 has no symbol for 0x04 or
     * for bytes that never occur in UTF-8, like 0xFF); those encode as the
     * unknown token, as Hugging Face's BPE does with an unk_token set. */
    int n_missing = 0;
    for (int b = 0; b < 256; b++) {
        char sym[4];
        size_t l = utf8_put(cp_of_byte[b], sym);
        memcpy(t->byte_sym[b], sym, l);
        t->byte_sym_len[b] = (uint8_t)l;
        t->byte_token[b] = sd_tok_lookup_text(t, sym, l);
        if (t->byte_token[b] >= 0) continue;
        if (spec->unk < 0) {
            SD_ERROR("tokenizer: byte-level vocabulary lacks the symbol '%.*s' for byte 0x%02x and has no "
                     "unknown token",
                     (int)l, sym, b);
            return SD_ERR_FORMAT;
        }
        t->byte_token[b] = (int32_t)spec->unk;
        n_missing++;
    }
    if (n_missing) SD_DEBUG("tokenizer: %d bytes have no symbol token and encode as unknown", n_missing);
    return SD_OK;
}

static sd_status build_merges(sd_tok *t, const sd_tok_spec *spec) {
    if (spec->n_merges > (size_t)INT32_MAX) return SD_ERR_RANGE;
    t->merge_mask = table_size(spec->n_merges) - 1;
    t->merge_slots = malloc((t->merge_mask + 1) * sizeof *t->merge_slots);
    if (!t->merge_slots) return SD_ERR_NOMEM;
    for (size_t i = 0; i <= t->merge_mask; i++) t->merge_slots[i].rank = -1;

    char *joined = NULL;
    size_t joined_cap = 0;
    sd_status st = SD_OK;
    for (size_t r = 0; r < spec->n_merges && st == SD_OK; r++) {
        sd_tok_text m = spec->merges[r];
        /* The separator is the first space after the first byte, so a left
         * part may itself start with a space (as llama.cpp reads them). */
        const char *sp = m.len > 1 && m.ptr ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (spec->merge_left_len) {
            uint32_t ll = spec->merge_left_len[r];
            sp = m.ptr && ll > 0 && (size_t)ll + 1 < m.len && m.ptr[ll] == ' ' ? m.ptr + ll : NULL;
        }
        if (!sp || sp + 1 == m.ptr + m.len) {
            SD_ERROR("tokenizer: merge %zu '%.*s' is not of the form 'left right'", r, PREVIEW(m));
            st = SD_ERR_FORMAT;
            break;
        }
        size_t ll = (size_t)(sp - m.ptr), rl = m.len - ll - 1;
        int32_t left = sd_tok_lookup_text(t, m.ptr, ll), right = sd_tok_lookup_text(t, sp + 1, rl);
        if (left < 0 || right < 0) {
            SD_ERROR("tokenizer: merge %zu '%.*s': %s part not in the vocabulary", r, PREVIEW(m),
                     left < 0 ? "left" : "right");
            st = SD_ERR_FORMAT;
            break;
        }
        if (ll + rl > joined_cap) {
            joined_cap = 2 * (ll + rl);
            char *nj = realloc(joined, joined_cap);
            if (!nj) {
                st = SD_ERR_NOMEM;
                break;
            }
            joined = nj;
        }
        memcpy(joined, m.ptr, ll);
        memcpy(joined + ll, sp + 1, rl);
        int32_t result = sd_tok_lookup_text(t, joined, ll + rl);
        if (result < 0) {
            SD_ERROR("tokenizer: merge %zu '%.*s': result '%.*s' not in the vocabulary", r, PREVIEW(m),
                     (int)(ll + rl > 48 ? 48 : ll + rl), joined);
            st = SD_ERR_FORMAT;
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
        size_t h = (size_t)mix64(key) & t->merge_mask;
        while (t->merge_slots[h].rank >= 0 && t->merge_slots[h].key != key) h = (h + 1) & t->merge_mask;
        if (t->merge_slots[h].rank < 0) /* a repeated pair keeps its first (lowest) rank */
            t->merge_slots[h] = (merge_slot){key, (int32_t)r, result};
    }
    free(joined);
    return st;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const sd_tok *t = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    size_t la, lb;
    const unsigned char *ta = (const unsigned char *)sd_tok_text_of(t, ia, &la);
    const unsigned char *tb = (const unsigned char *)sd_tok_text_of(t, ib, &lb);
    if (ta[0] != tb[0]) return ta[0] < tb[0] ? -1 : 1;
    if (la != lb) return la > lb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

/* For each first byte with many special tokens (Gemma 3 has 6,321 starting
 * with '<'), their distinct lengths, longest first: the matcher then does a
 * hash lookup per length instead of comparing every token of the bucket. */
static sd_status build_special_lens(sd_tok *t) {
    t->special_lens = malloc((t->n_special ? t->n_special : 1) * sizeof *t->special_lens);
    if (!t->special_lens) return SD_ERR_NOMEM;
    size_t n = 0;
    for (int b = 0; b < 256; b++) {
        t->lens_start[b] = n;
        size_t lo = t->special_start[b], hi = t->special_start[b + 1];
        if (hi - lo <= SPECIAL_SCAN_MAX) continue;
        for (size_t k = lo; k < hi; k++) { /* the bucket is sorted longest first */
            size_t l;
            sd_tok_text_of(t, t->special_ids[k], &l);
            if (n == t->lens_start[b] || t->special_lens[n - 1] != l) t->special_lens[n++] = l;
        }
    }
    t->lens_start[256] = n;
    return SD_OK;
}

/* Tokens matched as whole strings before the model's algorithm runs:
 * user-defined ones always, control and unknown-type ones (<unk>) only
 * where special tokens are allowed (tokenizer_encode.c). */
static bool is_special_type(int32_t type) {
    return type == SD_TOK_TYPE_CONTROL || type == SD_TOK_TYPE_USER_DEFINED || type == SD_TOK_TYPE_UNKNOWN;
}

static sd_status build_specials(sd_tok *t) {
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t l;
        sd_tok_text_of(t, i, &l);
        if (is_special_type(t->types[i]) && l > 0) n++;
    }
    t->special_ids = malloc((n ? n : 1) * sizeof *t->special_ids);
    if (!t->special_ids) return SD_ERR_NOMEM;
    t->n_special = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t l;
        sd_tok_text_of(t, i, &l);
        if (is_special_type(t->types[i]) && l > 0) t->special_ids[t->n_special++] = i;
    }
    qsort_r(t->special_ids, t->n_special, sizeof *t->special_ids, cmp_special, t);
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->special_start[b] = k;
        while (k < t->n_special) {
            size_t l;
            const unsigned char *s = (const unsigned char *)sd_tok_text_of(t, t->special_ids[k], &l);
            if (s[0] != b) break;
            k++;
        }
    }
    t->special_start[256] = k;
    return build_special_lens(t);
}

static sd_status build_regexes(sd_tok *t, const pre_def *def) {
    for (int i = 0; i < def->n_re; i++) {
        int err = 0;
        PCRE2_SIZE off = 0;
        t->pre_re[i] = pcre2_compile((PCRE2_SPTR)def->re[i], PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
        if (!t->pre_re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            SD_ERROR("tokenizer: pre-tokenizer regex %d of '%s' does not compile at %zu: %s", i, def->name, (size_t)off,
                     (const char *)msg);
            return SD_ERR_INTERNAL;
        }
        t->n_pre_re = i + 1;
        /* JIT is an optimization only: without it pcre2_match interprets. */
        (void)pcre2_jit_compile(t->pre_re[i], PCRE2_JIT_COMPLETE);
    }
    t->ignore_merges = def->ignore_merges;
    return SD_OK;
}

static sd_status check_id(const char *what, int64_t id, size_t n, int32_t *out) {
    if (id < -1 || id >= (int64_t)n) {
        SD_ERROR("tokenizer: %s token id %lld is out of range (vocabulary of %zu)", what, (long long)id, n);
        return SD_ERR_FORMAT;
    }
    *out = (int32_t)id;
    return SD_OK;
}

static void add_eog(sd_tok *t, int32_t id) {
    if (id < 0 || t->n_eog >= (int)(sizeof t->eog / sizeof t->eog[0])) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

/* The pre-tokenizer set of a byte-level spec (logged and NULL when unknown). */
static const pre_def *find_pre(const sd_tok_spec *spec) {
    sd_tok_text pre = spec->pre.len ? spec->pre : (sd_tok_text){"default", 7};
    for (size_t i = 0; i < N_PRE_DEFS; i++)
        if (text_eq(pre, PRE_DEFS[i].name)) return &PRE_DEFS[i];
    char names[256] = "";
    size_t at = 0;
    for (size_t i = 0; i < N_PRE_DEFS && at < sizeof names; i++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", PRE_DEFS[i].name);
    SD_ERROR("tokenizer: pre-tokenizer '%.*s' is not supported (supported: %s)", PREVIEW(pre), names);
    return NULL;
}

static sd_status build(sd_tok *t, const sd_tok_spec *spec) {
    const pre_def *def = NULL;
    if (text_eq(spec->model, "gpt2")) {
        t->algo = SD_TOK_ALGO_BYTE_BPE;
        if (!(def = find_pre(spec))) return SD_ERR_UNSUPPORTED;
    } else if (text_eq(spec->model, "llama")) {
        /* SentencePiece has no pre-tokenizer: tokenizer.ggml.pre is ignored,
         * as llama.cpp ignores it for this model. */
        t->algo = SD_TOK_ALGO_SPM;
        if (!spec->scores && !spec->n_merges) {
            SD_ERROR("tokenizer: SentencePiece vocabulary has neither scores nor merges");
            return SD_ERR_FORMAT;
        }
    } else {
        SD_ERROR("tokenizer: model '%.*s' is not supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece "
                 "BPE)",
                 PREVIEW(spec->model));
        return SD_ERR_UNSUPPORTED;
    }
    if (spec->n_tokens == 0 || spec->n_tokens > (size_t)INT32_MAX || !spec->tokens) {
        SD_ERROR("tokenizer: vocabulary size %zu is out of range", spec->n_tokens);
        return SD_ERR_FORMAT;
    }
    if (spec->n_merges && !spec->merges) return SD_ERR_INVALID_ARG;
    t->n_vocab = (int32_t)spec->n_tokens;
    int32_t eot;
    SD_TRY(check_id("bos", spec->bos, spec->n_tokens, &t->bos));
    SD_TRY(check_id("eos", spec->eos, spec->n_tokens, &t->eos));
    SD_TRY(check_id("unknown", spec->unk, spec->n_tokens, &t->unk));
    SD_TRY(check_id("padding", spec->pad, spec->n_tokens, &t->pad));
    SD_TRY(check_id("eot", spec->eot, spec->n_tokens, &eot));
    t->add_bos = spec->add_bos;
    t->add_eos = spec->add_eos;
    t->space_prefix = t->algo == SD_TOK_ALGO_SPM ? spec->space_prefix : SD_TOK_SPACE_PREFIX_NONE;

    SD_TRY(build_texts(t, spec));
    if (t->algo == SD_TOK_ALGO_SPM) SD_TRY(sd_tok_spm_build(t, spec));
    if (!t->score_rank) SD_TRY(build_merges(t, spec));
    SD_TRY(build_specials(t));
    if (spec->rstrip) {
        if (!(t->rstrip = malloc(spec->n_tokens))) return SD_ERR_NOMEM;
        memcpy(t->rstrip, spec->rstrip, spec->n_tokens);
    }
    if (def) SD_TRY(build_regexes(t, def));

    add_eog(t, t->eos);
    add_eog(t, eot);
    static const char *const eog_texts[] = {"<|im_end|>",      "<|eot_id|>",    "<|endoftext|>", "<|eom_id|>",
                                            "<|end_of_text|>", "<end_of_turn>", "<|end|>"};
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++)
        add_eog(t, sd_tok_lookup_text(t, eog_texts[i], strlen(eog_texts[i])));

    /* Hash: per token, its length (u32 LE), its text, its type (u32 LE),
     * over the core: trailing unused tokens are padding of the embedding
     * table to a round size (Qwen2.5-0.5B has 151,936 rows, -72B 152,064),
     * not part of the tokenizer. */
    t->n_core = t->n_vocab;
    while (t->n_core > 1 && t->types[t->n_core - 1] == SD_TOK_TYPE_UNUSED) t->n_core--;
    uint64_t h = FNV_OFFSET;
    for (int32_t i = 0; i < t->n_core; i++) {
        size_t len;
        const char *s = sd_tok_text_of(t, i, &len);
        uint32_t l32 = (uint32_t)len, ty = (uint32_t)t->types[i];
        unsigned char le[4] = {(unsigned char)l32, (unsigned char)(l32 >> 8), (unsigned char)(l32 >> 16),
                               (unsigned char)(l32 >> 24)};
        h = fnv1a(h, le, 4);
        h = fnv1a(h, s, len);
        unsigned char tle[4] = {(unsigned char)ty, (unsigned char)(ty >> 8), (unsigned char)(ty >> 16),
                                (unsigned char)(ty >> 24)};
        h = fnv1a(h, tle, 4);
    }
    t->vocab_hash = h;
    return SD_OK;
}

sd_status sd_tok_build(const sd_tok_spec *spec, sd_tok **out) {
    if (!spec || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_tok *t = calloc(1, sizeof *t);
    if (!t) return SD_ERR_NOMEM;
    sd_status st = build(t, spec);
    if (st != SD_OK) {
        sd_tok_free(&t);
        return st;
    }
    SD_DEBUG("tokenizer: %d tokens, %zu merges, %zu special tokens, pre '%.*s'", t->n_vocab, spec->n_merges,
             t->n_special, PREVIEW(spec->pre));
    *out = t;
    return SD_OK;
}

/* ---- accessors ---- */
int32_t sd_tok_n_vocab(const sd_tok *t) { return t->n_vocab; }
int32_t sd_tok_bos(const sd_tok *t) { return t->bos; }
int32_t sd_tok_eos(const sd_tok *t) { return t->eos; }
bool sd_tok_add_bos(const sd_tok *t) { return t->add_bos; }
bool sd_tok_add_eos(const sd_tok *t) { return t->add_eos; }
bool sd_tok_is_spm(const sd_tok *t) { return t->algo == SD_TOK_ALGO_SPM; }
uint64_t sd_tok_vocab_hash(const sd_tok *t) { return t->vocab_hash; }
int32_t sd_tok_n_core(const sd_tok *t) { return t->n_core; }

size_t sd_tok_memory_bytes(const sd_tok *t) {
    size_t n = (size_t)t->n_vocab, b = sizeof *t;
    b += t->text_off[n] + t->piece_off[n];                   /* the two arenas */
    b += 2 * (n + 1) * sizeof(size_t) + n * sizeof(int32_t); /* offsets, types */
    b += (t->tok_mask + 1) * sizeof *t->tok_slots;
    if (t->merge_slots) b += (t->merge_mask + 1) * sizeof *t->merge_slots;
    if (t->score_rank) b += n * sizeof *t->score_rank;
    b += t->n_special * (sizeof *t->special_ids + sizeof *t->special_lens);
    return b;
}

bool sd_tok_is_eog(const sd_tok *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

bool sd_tok_is_text(const sd_tok *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return false;
    int32_t ty = t->types[id];
    return ty != SD_TOK_TYPE_CONTROL && ty != SD_TOK_TYPE_UNUSED && ty != SD_TOK_TYPE_UNKNOWN;
}

int32_t sd_tok_find(const sd_tok *t, const char *text) {
    if (!text) return -1;
    return sd_tok_lookup_text(t, text, strlen(text));
}

const char *sd_tok_piece(const sd_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_off[id + 1] - t->piece_off[id] - 1;
    return t->piece_arena + t->piece_off[id];
}
