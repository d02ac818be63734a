/* tokenizer_hf.c — sd_tok_from_hf_json: a Hugging Face tokenizer.json as an
 * sd_tok_spec for sd_tok_build.
 *
 * Two families are accepted. Byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2):
 * model "BPE" without byte fallback, dropout or subword affixes, no
 * normalizer (or Qwen2's NFC, not applied), a ByteLevel decoder.
 * SentencePiece-style BPE (Llama 2, Mistral, Gemma, Phi-3): model "BPE" with
 * byte_fallback, spaces replaced by "▁" by a normalizer or a Metaspace
 * pre-tokenizer (see classify_spm); it becomes model "llama" with the file's
 * merge list as ranks. The pre-tokenizer is recognised by what it does, not
 * by a name the file does not carry: each step contributes the regex it
 * splits with — Digits(individual_digits) "\p{N}", Split(Regex, Isolated)
 * its pattern, ByteLevel(use_regex) the GPT-2 regex — and the list must
 * equal one of the tokenizer's known sets (sd_tok_pre_def_at), which then
 * also fixes ignore_merges. So a file whose splitting we would get wrong is
 * refused instead of tokenized differently.
 *
 * Token ids come from model.vocab and added_tokens (added ones win and are
 * typed: special -> CONTROL, else USER_DEFINED, as llama.cpp's converter
 * types them, so the vocabulary hash equals that of the same model's GGUF).
 * Ids missing up to the config's vocab_size become "[PAD<id>]" unused
 * tokens. Merges are "left right" strings or, in newer files, [left, right]
 * pairs. BOS/EOS/PAD come from tokenizer_config.json's texts, else from
 * config.json's ids (sd_tok_hf_ids; tokenizer.json itself only names them in
 * the post-processor); add_bos from tokenizer_config.json, else from a
 * TemplateProcessing post-processor that starts with the BOS token.
 *
 * All views point into the cJSON tree or one arena, both freed after
 * sd_tok_build has copied what it keeps. */
#include "tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HF_VOCAB  (1 << 24)
#define MAX_PRE_STEPS 4

/* Regex i of the tokenizer's known set name (tokenizer.c holds the only
 * copy): ByteLevel(use_regex) splits with that of "gpt2", and
 * Digits(individual_digits) with the first of "smollm". */
static const char *known_regex(const char *set, int i) {
    const char *name;
    const char *const *re;
    int n;
    bool im;
    for (size_t k = 0; sd_tok_pre_def_at(k, &name, &re, &n, &im); k++)
        if (strcmp(name, set) == 0 && i < n) return re[i];
    return ""; /* not reached: both sets exist */
}

sd_tok_hf_ids sd_tok_hf_ids_default(void) {
    sd_tok_hf_ids ids;
    memset(&ids, 0, sizeof ids);
    ids.bos = ids.eos = ids.eot = ids.pad = -1;
    ids.add_bos = -1;
    return ids;
}

static const cJSON *field(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

static bool is_null_or_absent(const cJSON *j) { return !j || cJSON_IsNull(j); }

static bool str_is(const cJSON *j, const char *s) { return cJSON_IsString(j) && strcmp(j->valuestring, s) == 0; }

/* A JSON boolean, or def when absent/null; false (and *ok = false) otherwise. */
static bool bool_or(const cJSON *j, bool def, bool *ok) {
    if (is_null_or_absent(j)) return def;
    if (cJSON_IsBool(j)) return cJSON_IsTrue(j);
    *ok = false;
    return false;
}

/* A JSON number that is an integer in [0, max). */
static bool json_id(const cJSON *j, int64_t max, int64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d >= (double)max || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

/* ---- pre-tokenizer ---- */

typedef struct pre_steps {
    const char *re[MAX_PRE_STEPS];
    int n;
    bool byte_level;
} pre_steps;

static sd_status unsupported_pre(const char *why) {
    SD_ERROR("tokenizer.json: pre-tokenizer %s is not supported (byte-level BPE: ByteLevel, optionally after "
             "Digits(individual_digits) or a Split(Regex, Isolated) of a known set)",
             why);
    return SD_ERR_UNSUPPORTED;
}

static sd_status add_step(const cJSON *step, pre_steps *ps) {
    const cJSON *type = field(step, "type");
    if (!cJSON_IsString(type)) return unsupported_pre("without a type");
    if (ps->byte_level) return unsupported_pre("with steps after ByteLevel");
    bool ok = true;
    const char *t = type->valuestring;
    if (strcmp(t, "ByteLevel") == 0) {
        /* HF's defaults: add_prefix_space true, use_regex true */
        if (bool_or(field(step, "add_prefix_space"), true, &ok) || !ok)
            return unsupported_pre("ByteLevel with add_prefix_space");
        bool use_regex = bool_or(field(step, "use_regex"), true, &ok);
        if (!ok) return unsupported_pre("ByteLevel with a non-boolean use_regex");
        ps->byte_level = true;
        if (use_regex) {
            if (ps->n == MAX_PRE_STEPS) return unsupported_pre("with too many steps");
            ps->re[ps->n++] = known_regex("gpt2", 0);
        }
        return SD_OK;
    }
    if (ps->n == MAX_PRE_STEPS) return unsupported_pre("with too many steps");
    if (strcmp(t, "Digits") == 0) {
        if (!bool_or(field(step, "individual_digits"), false, &ok) || !ok)
            return unsupported_pre("Digits without individual_digits");
        ps->re[ps->n++] = known_regex("smollm", 0);
        return SD_OK;
    }
    if (strcmp(t, "Split") == 0) {
        const cJSON *re = field(field(step, "pattern"), "Regex");
        if (!cJSON_IsString(re)) return unsupported_pre("Split without a Regex pattern");
        if (!str_is(field(step, "behavior"), "Isolated"))
            return unsupported_pre("Split with a behavior other than Isolated");
        if (bool_or(field(step, "invert"), false, &ok) || !ok) return unsupported_pre("Split with invert");
        ps->re[ps->n++] = re->valuestring;
        return SD_OK;
    }
    SD_ERROR("tokenizer.json: pre-tokenizer step '%.32s' is not supported", t);
    return SD_ERR_UNSUPPORTED;
}

/* Finds the known set whose regexes equal the file's steps. */
static sd_status classify_pre(const cJSON *pre, const char **name, bool *ignore_merges) {
    pre_steps ps = {0};
    if (is_null_or_absent(pre)) return unsupported_pre("(none; byte-level BPE needs ByteLevel)");
    if (str_is(field(pre, "type"), "Sequence")) {
        const cJSON *list = field(pre, "pretokenizers");
        if (!cJSON_IsArray(list)) return unsupported_pre("Sequence without a list");
        for (const cJSON *s = list->child; s; s = s->next) SD_TRY(add_step(s, &ps));
    } else {
        SD_TRY(add_step(pre, &ps));
    }
    if (!ps.byte_level) return unsupported_pre("without ByteLevel");
    const char *dname;
    const char *const *dre;
    int dn;
    bool dim;
    for (size_t i = 0; sd_tok_pre_def_at(i, &dname, &dre, &dn, &dim); i++) {
        bool same = dn == ps.n;
        for (int k = 0; same && k < dn; k++) same = strcmp(dre[k], ps.re[k]) == 0;
        if (same) {
            *name = dname;
            *ignore_merges = dim;
            return SD_OK;
        }
    }
    return unsupported_pre("with these regexes (not one of the known sets)");
}

/* ---- the rest of the file ---- */

static sd_status check_model(const cJSON *model, bool *byte_fallback) {
    if (!cJSON_IsObject(model)) {
        SD_ERROR("tokenizer.json: no model object");
        return SD_ERR_FORMAT;
    }
    const cJSON *type = field(model, "type");
    if (type && !str_is(type, "BPE")) {
        SD_ERROR("tokenizer.json: model type '%.32s' is not supported (byte-level BPE only)",
                 cJSON_IsString(type) ? type->valuestring : "?");
        return SD_ERR_UNSUPPORTED;
    }
    bool ok = true;
    *byte_fallback = bool_or(field(model, "byte_fallback"), false, &ok);
    if (!ok) {
        SD_ERROR("tokenizer.json: BPE byte_fallback is not a boolean");
        return SD_ERR_FORMAT;
    }
    const cJSON *dropout = field(model, "dropout");
    if (!is_null_or_absent(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0)) {
        SD_ERROR("tokenizer.json: BPE dropout is not supported");
        return SD_ERR_UNSUPPORTED;
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *a = field(model, affixes[i]);
        if (!is_null_or_absent(a) && !str_is(a, "")) {
            SD_ERROR("tokenizer.json: BPE %s is not supported", affixes[i]);
            return SD_ERR_UNSUPPORTED;
        }
    }
    return SD_OK;
}

static sd_status check_normalizer_decoder(const cJSON *root) {
    const cJSON *norm = field(root, "normalizer");
    /* Qwen2's NFC: accepted but not applied (as llama.cpp does not): text
     * already in NFC, which is nearly all text, tokenizes the same. */
    if (!is_null_or_absent(norm) && !str_is(field(norm, "type"), "NFC")) {
        const cJSON *t = field(norm, "type");
        SD_ERROR("tokenizer.json: normalizer '%.32s' is not supported (byte-level BPE has none)",
                 cJSON_IsString(t) ? t->valuestring : "?");
        return SD_ERR_UNSUPPORTED;
    }
    const cJSON *dec = field(root, "decoder");
    if (!is_null_or_absent(dec) && !str_is(field(dec, "type"), "ByteLevel")) {
        const cJSON *t = field(dec, "type");
        SD_ERROR("tokenizer.json: decoder '%.32s' is not supported (ByteLevel only)",
                 cJSON_IsString(t) ? t->valuestring : "?");
        return SD_ERR_UNSUPPORTED;
    }
    return SD_OK;
}

/* True when a TemplateProcessing (alone or in a Sequence) starts the single
 * sequence with the special token bos_text. */
static bool template_adds_bos(const cJSON *pp, const char *bos_text, int depth) {
    if (!pp || !bos_text || depth > 4) return false;
    if (str_is(field(pp, "type"), "Sequence")) {
        const cJSON *list = field(pp, "processors");
        for (const cJSON *p = cJSON_IsArray(list) ? list->child : NULL; p; p = p->next)
            if (template_adds_bos(p, bos_text, depth + 1)) return true;
        return false;
    }
    if (!str_is(field(pp, "type"), "TemplateProcessing")) return false;
    const cJSON *single = field(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    return first && str_is(field(field(first, "SpecialToken"), "id"), bos_text);
}

typedef struct vocab {
    size_t n;
    sd_tok_text *texts; /* [n] */
    int32_t *types;     /* [n] */
    uint8_t *rstrip;    /* [n]: added tokens with rstrip (Phi-3's) */
    bool any_rstrip;
    size_t n_merges;
    sd_tok_text *merges;
    uint32_t *merge_left_len; /* [n_merges] */
    char *arena;              /* pair merges and PAD names */
    size_t arena_used, arena_cap;
} vocab;

static void vocab_free(vocab *v) {
    free(v->texts);
    free(v->types);
    free(v->rstrip);
    free(v->merges);
    free(v->merge_left_len);
    free(v->arena);
}

/* ---- SentencePiece-style BPE (byte_fallback) ----
 * Llama 2 / Mistral: normalizer Sequence[Prepend("▁"), Replace(" ", "▁")];
 * Gemma: normalizer Replace(" ", "▁") (and a Split on " " that then finds
 * nothing); newer Llama / Mistral files: no normalizer, a Metaspace
 * pre-tokenizer (split off) with prepend_scheme always / first / never.
 * Anything else that touches the text is refused. Decoders only change how
 * text is shown: every one the family uses is accepted (specd's pieces are
 * "▁" -> " " and <0xNN> -> the byte; Strip's one leading space is not
 * removed). */

static sd_status unsupported_spm(const char *what, const cJSON *j) {
    const cJSON *t = field(j, "type");
    SD_ERROR("tokenizer.json: SentencePiece-style %s '%.32s' is not supported", what,
             cJSON_IsString(t) ? t->valuestring : "?");
    return SD_ERR_UNSUPPORTED;
}

#define SPACE_MARK "\xe2\x96\x81" /* "▁" */

static sd_status spm_normalizer(const cJSON *norm, sd_tok_space_prefix *sp, bool *replaced) {
    if (is_null_or_absent(norm)) return SD_OK;
    const cJSON *list = str_is(field(norm, "type"), "Sequence") ? field(norm, "normalizers") : NULL;
    const cJSON *step = list ? (cJSON_IsArray(list) ? list->child : NULL) : norm;
    for (; step; step = list ? step->next : NULL) {
        if (str_is(field(step, "type"), "Prepend") && str_is(field(step, "prepend"), SPACE_MARK) && !*replaced)
            *sp = SD_TOK_SPACE_PREFIX_ALWAYS;
        else if (str_is(field(step, "type"), "Replace") && str_is(field(field(step, "pattern"), "String"), " ") &&
                 str_is(field(step, "content"), SPACE_MARK))
            *replaced = true;
        else
            return unsupported_spm("normalizer step", step);
    }
    return SD_OK;
}

static sd_status spm_pre_tokenizer(const cJSON *pre, sd_tok_space_prefix *sp, bool *replaced) {
    if (is_null_or_absent(pre)) return SD_OK;
    bool ok = true;
    if (str_is(field(pre, "type"), "Metaspace") && !*replaced) {
        const cJSON *scheme = field(pre, "prepend_scheme");
        if (!str_is(field(pre, "replacement"), SPACE_MARK) || bool_or(field(pre, "split"), true, &ok) || !ok)
            return unsupported_spm("pre-tokenizer (split, or another replacement)", pre);
        if (is_null_or_absent(scheme))
            *sp = bool_or(field(pre, "add_prefix_space"), true, &ok) ? SD_TOK_SPACE_PREFIX_META_ALWAYS
                                                                     : SD_TOK_SPACE_PREFIX_NONE;
        else if (str_is(scheme, "always"))
            *sp = SD_TOK_SPACE_PREFIX_META_ALWAYS;
        else if (str_is(scheme, "first"))
            *sp = SD_TOK_SPACE_PREFIX_FIRST;
        else if (str_is(scheme, "never"))
            *sp = SD_TOK_SPACE_PREFIX_NONE;
        else
            return unsupported_spm("Metaspace prepend_scheme of pre-tokenizer", pre);
        *replaced = ok;
        return ok ? SD_OK : unsupported_spm("pre-tokenizer", pre);
    }
    /* Gemma: a Split on " " after the normalizer replaced every space. */
    if (*replaced && str_is(field(pre, "type"), "Split") && str_is(field(field(pre, "pattern"), "String"), " "))
        return SD_OK;
    return unsupported_spm("pre-tokenizer", pre);
}

static sd_status spm_decoder(const cJSON *dec) {
    if (is_null_or_absent(dec)) return SD_OK;
    static const char *const known[] = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    const cJSON *list = str_is(field(dec, "type"), "Sequence") ? field(dec, "decoders") : NULL;
    const cJSON *step = list ? (cJSON_IsArray(list) ? list->child : NULL) : dec;
    for (; step; step = list ? step->next : NULL) {
        bool found = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) found |= str_is(field(step, "type"), known[i]);
        if (!found) return unsupported_spm("decoder", step);
    }
    return SD_OK;
}

/* The space rule of a SentencePiece-style tokenizer.json, or a refusal. */
static sd_status classify_spm(const cJSON *root, sd_tok_space_prefix *sp) {
    bool replaced = false;
    *sp = SD_TOK_SPACE_PREFIX_NONE;
    SD_TRY(spm_normalizer(field(root, "normalizer"), sp, &replaced));
    SD_TRY(spm_pre_tokenizer(field(root, "pre_tokenizer"), sp, &replaced));
    if (!replaced) {
        SD_ERROR("tokenizer.json: byte_fallback BPE whose spaces are not replaced by U+2581 is not supported");
        return SD_ERR_UNSUPPORTED;
    }
    return spm_decoder(field(root, "decoder"));
}

/* The <0xNN> entries of a SentencePiece vocabulary are byte tokens (the
 * type llama.cpp's converter gives them, so the vocabulary hash matches). */
static void type_byte_tokens(vocab *v) {
    for (size_t i = 0; i < v->n; i++) {
        const char *s = v->texts[i].ptr;
        if (v->types[i] != SD_TOK_TYPE_NORMAL || v->texts[i].len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
            continue;
        bool hex = true;
        for (int k = 3; k < 5; k++) hex &= (s[k] >= '0' && s[k] <= '9') || (s[k] >= 'A' && s[k] <= 'F');
        if (hex) v->types[i] = SD_TOK_TYPE_BYTE;
    }
}

/* Ids in [0, limit); returns the vocabulary size (max id + 1, at least n_vocab). */
static sd_status collect_ids(const cJSON *vmap, const cJSON *added, int64_t limit, int32_t n_vocab, size_t *n) {
    int64_t max_id = -1, id;
    for (const cJSON *e = vmap->child; e; e = e->next) {
        if (!json_id(e, limit, &id)) {
            SD_ERROR("tokenizer.json: vocab entry '%.48s' has id outside [0, %lld)", e->string ? e->string : "",
                     (long long)limit);
            return SD_ERR_FORMAT;
        }
        if (id > max_id) max_id = id;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        if (!json_id(field(a, "id"), limit, &id) || !cJSON_IsString(field(a, "content"))) {
            SD_ERROR("tokenizer.json: an added token lacks content or an id in [0, %lld)", (long long)limit);
            return SD_ERR_FORMAT;
        }
        if (id > max_id) max_id = id;
    }
    size_t count = (size_t)(max_id + 1);
    if (n_vocab > 0 && count < (size_t)n_vocab) count = (size_t)n_vocab;
    if (count == 0) {
        SD_ERROR("tokenizer.json: the vocabulary is empty");
        return SD_ERR_FORMAT;
    }
    *n = count;
    return SD_OK;
}

static char *arena_take(vocab *v, size_t len) {
    if (v->arena_cap - v->arena_used < len) return NULL;
    char *p = v->arena + v->arena_used;
    v->arena_used += len;
    return p;
}

static sd_status fill_tokens(vocab *v, const cJSON *vmap, const cJSON *added) {
    for (const cJSON *e = vmap->child; e; e = e->next) {
        size_t id = (size_t)e->valuedouble;
        if (v->types[id] != SD_TOK_TYPE_UNDEFINED) {
            SD_ERROR("tokenizer.json: id %zu is given to both '%.48s' and '%.*s'", id, e->string,
                     (int)(v->texts[id].len > 48 ? 48 : v->texts[id].len), v->texts[id].ptr);
            return SD_ERR_FORMAT;
        }
        v->texts[id] = (sd_tok_text){e->string, strlen(e->string)};
        v->types[id] = SD_TOK_TYPE_NORMAL;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        size_t id = (size_t)field(a, "id")->valuedouble;
        const char *content = field(a, "content")->valuestring;
        bool ok = true;
        bool special = bool_or(field(a, "special"), false, &ok);
        if (!ok) {
            SD_ERROR("tokenizer.json: added token %zu has a non-boolean 'special'", id);
            return SD_ERR_FORMAT;
        }
        v->texts[id] = (sd_tok_text){content, strlen(content)};
        v->types[id] = special ? SD_TOK_TYPE_CONTROL : SD_TOK_TYPE_USER_DEFINED;
        v->rstrip[id] = bool_or(field(a, "rstrip"), false, &ok);
        v->any_rstrip |= v->rstrip[id];
        if (!ok) {
            SD_ERROR("tokenizer.json: added token %zu has a non-boolean 'rstrip'", id);
            return SD_ERR_FORMAT;
        }
    }
    for (size_t id = 0; id < v->n; id++) {
        if (v->types[id] != SD_TOK_TYPE_UNDEFINED) continue;
        char *name = arena_take(v, 24);
        if (!name) return SD_ERR_INTERNAL;
        int len = snprintf(name, 24, "[PAD%zu]", id);
        v->texts[id] = (sd_tok_text){name, (size_t)len};
        v->types[id] = SD_TOK_TYPE_UNUSED;
    }
    return SD_OK;
}

static sd_status fill_merges(vocab *v, const cJSON *merges) {
    size_t r = 0;
    for (const cJSON *m = merges->child; m; m = m->next, r++) {
        if (cJSON_IsString(m)) {
            v->merges[r] = (sd_tok_text){m->valuestring, strlen(m->valuestring)};
            const char *sp = v->merges[r].len > 1 ? strchr(m->valuestring + 1, ' ') : NULL;
            v->merge_left_len[r] = sp ? (uint32_t)(sp - m->valuestring) : 0; /* 0: refused by the build */
            continue;
        }
        /* A [left, right] pair may hold spaces (Gemma's "  " pieces): the
         * left part's length says where it ends. */
        const cJSON *l = cJSON_IsArray(m) ? m->child : NULL, *rt = l ? l->next : NULL;
        if (!cJSON_IsString(l) || !cJSON_IsString(rt) || rt->next || !l->valuestring[0] || !rt->valuestring[0]) {
            SD_ERROR("tokenizer.json: merge %zu is neither \"left right\" nor a [left, right] pair of non-empty "
                     "strings",
                     r);
            return SD_ERR_FORMAT;
        }
        size_t ll = strlen(l->valuestring), rl = strlen(rt->valuestring);
        if (ll > UINT32_MAX - 1) return SD_ERR_RANGE;
        char *s = arena_take(v, ll + rl + 1);
        if (!s) return SD_ERR_INTERNAL;
        memcpy(s, l->valuestring, ll);
        s[ll] = ' ';
        memcpy(s + ll + 1, rt->valuestring, rl);
        v->merges[r] = (sd_tok_text){s, ll + rl + 1};
        v->merge_left_len[r] = (uint32_t)ll;
    }
    return SD_OK;
}

/* Sizes and fills v from the model's vocab, merges and added tokens. */
static sd_status build_vocab(vocab *v, const cJSON *model, const cJSON *added, int32_t n_vocab) {
    const cJSON *vmap = field(model, "vocab"), *merges = field(model, "merges");
    if (!cJSON_IsObject(vmap) || !cJSON_IsArray(merges) || (added && !cJSON_IsArray(added))) {
        SD_ERROR("tokenizer.json: model.vocab must be an object, model.merges and added_tokens arrays");
        return SD_ERR_FORMAT;
    }
    int64_t limit = n_vocab > 0 ? n_vocab : MAX_HF_VOCAB;
    SD_TRY(collect_ids(vmap, added, limit, n_vocab, &v->n));
    v->n_merges = (size_t)cJSON_GetArraySize(merges);
    size_t arena = 0;
    for (const cJSON *m = merges->child; m; m = m->next)
        if (cJSON_IsArray(m))
            for (const cJSON *p = m->child; p; p = p->next)
                if (cJSON_IsString(p) && !sd_add_ok(arena, strlen(p->valuestring) + 1, &arena)) return SD_ERR_RANGE;
    size_t pads;
    if (!sd_mul_ok(v->n, 24, &pads) || !sd_add_ok(arena, pads, &arena)) return SD_ERR_RANGE;
    v->texts = calloc(v->n, sizeof *v->texts);
    v->types = calloc(v->n, sizeof *v->types); /* 0 = UNDEFINED: not given yet */
    v->rstrip = calloc(v->n, 1);
    v->merges = calloc(v->n_merges ? v->n_merges : 1, sizeof *v->merges);
    v->merge_left_len = calloc(v->n_merges ? v->n_merges : 1, sizeof *v->merge_left_len);
    v->arena = malloc(arena ? arena : 1);
    v->arena_cap = arena;
    if (!v->texts || !v->types || !v->rstrip || !v->merges || !v->merge_left_len || !v->arena) return SD_ERR_NOMEM;
    SD_TRY(fill_tokens(v, vmap, added));
    return fill_merges(v, merges);
}

/* Id of the token whose text is s, or -1. */
static int64_t find_text(const vocab *v, const char *s) {
    if (!s) return -1;
    size_t len = strlen(s);
    for (size_t i = 0; i < v->n; i++)
        if (v->texts[i].len == len && memcmp(v->texts[i].ptr, s, len) == 0) return (int64_t)i;
    return -1;
}

static sd_status build_from_tree(const cJSON *root, const sd_tok_hf_ids *ids, sd_tok **out) {
    if (!cJSON_IsObject(root)) {
        SD_ERROR("tokenizer.json: not a JSON object");
        return SD_ERR_FORMAT;
    }
    const cJSON *model = field(root, "model");
    bool spm = false;
    SD_TRY(check_model(model, &spm));
    sd_tok_spec spec = sd_tok_spec_default();
    const char *pre_name = NULL;
    bool ignore_merges = false;
    if (spm) {
        SD_TRY(classify_spm(root, &spec.space_prefix));
        spec.model = (sd_tok_text){"llama", 5};
        pre_name = "default";
    } else {
        SD_TRY(check_normalizer_decoder(root));
        SD_TRY(classify_pre(field(root, "pre_tokenizer"), &pre_name, &ignore_merges));
    }
    bool ok = true;
    bool file_ignore = bool_or(field(model, "ignore_merges"), ignore_merges, &ok);
    if (!ok || file_ignore != ignore_merges) {
        SD_ERROR("tokenizer.json: ignore_merges %s does not go with the '%s' pre-tokenizer",
                 file_ignore ? "true" : "false", pre_name);
        return SD_ERR_UNSUPPORTED;
    }
    const cJSON *added = field(root, "added_tokens");
    if (cJSON_IsNull(added)) added = NULL;
    vocab v = {0};
    sd_status st = build_vocab(&v, model, added, ids->n_vocab);
    if (st == SD_OK && spm) type_byte_tokens(&v);
    if (st == SD_OK) {
        spec.pre = (sd_tok_text){pre_name, strlen(pre_name)};
        spec.n_tokens = v.n;
        spec.tokens = v.texts;
        spec.types = v.types;
        spec.n_merges = v.n_merges;
        spec.merges = v.merges;
        spec.merge_left_len = v.merge_left_len;
        spec.rstrip = v.any_rstrip ? v.rstrip : NULL;
        int64_t bos = find_text(&v, ids->bos_text), eos = find_text(&v, ids->eos_text);
        int64_t pad = find_text(&v, ids->pad_text);
        spec.bos = bos >= 0 ? bos : ids->bos;
        spec.eos = eos >= 0 ? eos : ids->eos;
        spec.pad = pad >= 0 ? pad : ids->pad;
        spec.eot = ids->eot;
        const cJSON *unk = field(model, "unk_token");
        spec.unk = cJSON_IsString(unk) ? find_text(&v, unk->valuestring) : -1;
        const char *bos_text = NULL;
        char bos_buf[256];
        if (spec.bos >= 0 && (size_t)spec.bos < v.n && v.texts[spec.bos].len < sizeof bos_buf) {
            memcpy(bos_buf, v.texts[spec.bos].ptr, v.texts[spec.bos].len);
            bos_buf[v.texts[spec.bos].len] = '\0';
            bos_text = bos_buf;
        }
        spec.add_bos =
            ids->add_bos >= 0 ? ids->add_bos != 0 : template_adds_bos(field(root, "post_processor"), bos_text, 0);
        st = sd_tok_build(&spec, out);
    }
    vocab_free(&v);
    return st;
}

sd_status sd_tok_from_hf_json(const char *json, size_t len, const sd_tok_hf_ids *ids, sd_tok **out) {
    if (!json || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_tok_hf_ids none = sd_tok_hf_ids_default();
    if (!ids) ids = &none;
    if (ids->n_vocab < 0 || ids->n_vocab > MAX_HF_VOCAB) return SD_ERR_INVALID_ARG;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        SD_ERROR("tokenizer.json: not valid JSON");
        return SD_ERR_FORMAT;
    }
    sd_status st = build_from_tree(root, ids, out);
    cJSON_Delete(root);
    return st;
}
