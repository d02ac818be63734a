/* schema.c — JSON Schema (a subset, constrain.h) to GBNF.
 *
 * Each (sub)schema becomes one rule `sN`; the fixed JSON rules (j-value,
 * j-string, j-number ...) are appended once. Objects list their properties
 * in the schema's order: a required property is always written, an
 * optional one may be left out, and a chain of rules (rest-i: the
 * properties from i on, each after a comma) keeps the commas right with
 * O(properties) rules. Extra keys are generated only when
 * additionalProperties is true or a schema, never by default: the output
 * is then still an instance, and the keys stay the ones the schema names.
 * $ref to "#", "#/$defs/x" or "#/definitions/x" names the target's rule,
 * which is compiled once (a name is assigned before the body is compiled,
 * so recursion terminates). Numbers and whitespace are bounded (16 digits,
 * 3 exponent digits; one newline and 20 blanks) so a model cannot loop
 * inside a token-level sentence that never ends. Every keyword not
 * handled here is refused with its name; so are limits (nesting depth,
 * enum entries, array bounds above max_repeat). */
#include "constrain_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sref {
    const cJSON *node;
    int id;
} sref;

typedef struct sc {
    const cJSON *root;
    const sd_constrain_limits *lim;
    g_buf *out;
    int next_id;
    sref *refs;
    int n_refs, cap_refs;
    char *err;
    size_t err_cap;
    sd_status status;
    bool failed;
} sc;

static const char JSON_RULES[] =
    "ws ::= ( [ ] | [\\n] [ \\t]{0,20} )?\n"
    "j-value ::= j-object | j-array | j-string | j-number | j-bool | j-null\n"
    "j-object ::= \"{\" ws ( j-kv ( \",\" ws j-kv )* )? \"}\"\n"
    "j-kv ::= j-string ws \":\" ws j-value ws\n"
    "j-array ::= \"[\" ws ( j-value ws ( \",\" ws j-value ws )* )? \"]\"\n"
    "j-string ::= \"\\\"\" j-char* \"\\\"\"\n"
    "j-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "j-integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "j-number ::= j-integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "j-bool ::= \"true\" | \"false\"\n"
    "j-null ::= \"null\"\n";

static bool sfail(sc *c, sd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool sfail(sc *c, sd_status st, const char *fmt, ...) {
    if (c->failed) return false;
    c->failed = true;
    c->status = st;
    va_list ap;
    va_start(ap, fmt);
    if (c->err_cap) vsnprintf(c->err, c->err_cap, fmt, ap);
    va_end(ap);
    return false;
}

/* bytes[n] as a GBNF string literal. */
static void literal(g_buf *b, const char *s, size_t n) {
    g_buf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == '"' || ch == '\\' || ch == 0x7F)
            g_buf_printf(b, "\\x%02X", ch);
        else
            g_buf_add(b, (const char *)&ch, 1);
    }
    g_buf_puts(b, "\" ");
}

/* A JSON value's compact text as a literal (enum, const). */
static bool value_literal(sc *c, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return sfail(c, SD_ERR_NOMEM, "out of memory");
    literal(c->out, t, strlen(t));
    free(t);
    return true;
}

static bool gen(sc *c, const cJSON *s, int depth, int *id);

static bool known_keyword(const char *k) {
    static const char *const ok[] = {"type",        "properties", "required",    "additionalProperties",
                                     "items",       "minItems",   "maxItems",    "enum",
                                     "const",       "pattern",    "minLength",   "maxLength",
                                     "anyOf",       "oneOf",      "$ref",        "$defs",
                                     "definitions", "title",      "description", "$schema",
                                     "$id",         "$comment",   "default",     "examples"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(k, ok[i])) return true;
    return false;
}

/* A count keyword (minItems ...): absent -1, else a non-negative integer. */
static bool count_kw(sc *c, const cJSON *s, const char *k, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    *out = -1;
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return sfail(c, SD_ERR_FORMAT, "'%s' must be a non-negative integer", k);
    if (v->valuedouble > c->lim->max_repeat)
        return sfail(c, SD_ERR_RANGE, "'%s' is %.0f, at most %d", k, v->valuedouble, c->lim->max_repeat);
    *out = (long)v->valuedouble;
    return true;
}

static void repeat_suffix(g_buf *b, long lo, long hi) {
    if (hi < 0)
        g_buf_printf(b, "{%ld,} ", lo);
    else
        g_buf_printf(b, "{%ld,%ld} ", lo, hi);
}

static bool gen_string(sc *c, const cJSON *s, int id) {
    long lo, hi;
    if (!count_kw(c, s, "minLength", &lo) || !count_kw(c, s, "maxLength", &hi)) return false;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    if (pat) {
        if (!cJSON_IsString(pat)) return sfail(c, SD_ERR_FORMAT, "'pattern' must be a string");
        if (lo >= 0 || hi >= 0) return sfail(c, SD_ERR_UNSUPPORTED, "'pattern' together with minLength/maxLength");
        char prefix[32], top[32];
        snprintf(prefix, sizeof prefix, "p%d", id);
        g_buf rb = {0};
        sd_status st = g_regex_to_gbnf(pat->valuestring, strlen(pat->valuestring), prefix, true, c->lim, &rb, top,
                                       sizeof top, c->err, c->err_cap);
        if (st != SD_OK) {
            free(rb.p);
            char why[256];
            snprintf(why, sizeof why, "%s", c->err);
            return sfail(c, st, "'pattern': %s", why);
        }
        g_buf_add(c->out, rb.p, rb.len);
        free(rb.p);
        g_buf_printf(c->out, "s%d ::= \"\\\"\" %s \"\\\"\"\n", id, top);
        return true;
    }
    if (hi >= 0 && lo > hi) return sfail(c, SD_ERR_FORMAT, "'minLength' is above 'maxLength'");
    g_buf_printf(c->out, "s%d ::= \"\\\"\" j-char", id);
    repeat_suffix(c->out, lo < 0 ? 0 : lo, hi);
    g_buf_puts(c->out, "\"\\\"\"\n");
    return true;
}

static bool gen_array(sc *c, const cJSON *s, int id, int depth) {
    long lo, hi;
    if (!count_kw(c, s, "minItems", &lo) || !count_kw(c, s, "maxItems", &hi)) return false;
    if (lo < 0) lo = 0;
    if (hi >= 0 && lo > hi) return sfail(c, SD_ERR_FORMAT, "'minItems' is above 'maxItems'");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    char item[32] = "j-value";
    if (items) {
        if (!cJSON_IsObject(items) && !cJSON_IsBool(items))
            return sfail(c, SD_ERR_UNSUPPORTED, "'items' must be a schema (a list is prefixItems' old form)");
        int iid;
        if (!gen(c, items, depth + 1, &iid)) return false;
        snprintf(item, sizeof item, "s%d", iid);
    }
    if (hi == 0) {
        g_buf_printf(c->out, "s%d ::= \"[\" ws \"]\"\n", id);
        return true;
    }
    g_buf_printf(c->out, "s%d ::= \"[\" ws %s%s ws ( \",\" ws %s ws )", id, lo == 0 ? "( " : "", item, item);
    repeat_suffix(c->out, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    g_buf_printf(c->out, "%s\"]\"\n", lo == 0 ? ")? " : "");
    return true;
}

static bool gen_object(sc *c, const cJSON *s, int id, int depth) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return sfail(c, SD_ERR_FORMAT, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return sfail(c, SD_ERR_FORMAT, "'required' must be a list of names");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return sfail(c, SD_ERR_FORMAT, "'additionalProperties' must be a boolean or a schema");
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return sfail(c, SD_ERR_FORMAT, "'required' must be a list of names");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return sfail(c, SD_ERR_UNSUPPORTED, "'required' names '%s', which is not in 'properties'", r->valuestring);
    }
    /* extra keys: only when asked for; with no properties at all, any object */
    bool extra = (addl && !cJSON_IsFalse(addl)) || (!props && !addl);
    char extra_val[32] = "j-value";
    if (addl && cJSON_IsObject(addl)) {
        int aid;
        if (!gen(c, addl, depth + 1, &aid)) return false;
        snprintf(extra_val, sizeof extra_val, "s%d", aid);
    }
    int k = props ? cJSON_GetArraySize(props) : 0;
    int *vid = k ? malloc((size_t)k * sizeof *vid) : NULL;
    bool *required = k ? calloc((size_t)k, 1) : NULL;
    if (k && (!vid || !required)) {
        free(vid);
        free(required);
        return sfail(c, SD_ERR_NOMEM, "out of memory");
    }
    int i = 0;
    const cJSON *p;
    bool ok = true;
    cJSON_ArrayForEach(p, props) {
        cJSON_ArrayForEach(r, req) if (!strcmp(r->valuestring, p->string)) required[i] = true;
        if (!(ok = gen(c, p, depth + 1, &vid[i]))) break;
        i++;
    }
    if (ok) {
        g_buf *b = c->out;
        if (extra) g_buf_printf(b, "s%d-x ::= j-string ws \":\" ws %s ws\n", id, extra_val);
        i = 0;
        cJSON_ArrayForEach(p, props) {
            g_buf_printf(b, "s%d-k%d ::= ", id, i);
            cJSON *ks = cJSON_CreateString(p->string); /* the key's JSON text, quotes and escapes included */
            char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
            cJSON_Delete(ks);
            if (!kt) {
                ok = sfail(c, SD_ERR_NOMEM, "out of memory");
                break;
            }
            literal(b, kt, strlen(kt));
            free(kt);
            g_buf_printf(b, "ws \":\" ws s%d ws\n", vid[i]);
            i++;
        }
        /* rest-i: the properties from i on, each after a comma; rest-k the extra keys */
        if (extra)
            g_buf_printf(b, "s%d-r%d ::= ( \",\" ws s%d-x )*\n", id, k, id);
        else
            g_buf_printf(b, "s%d-r%d ::= \"\"\n", id, k);
        for (int j = k - 1; j >= 0; j--) {
            g_buf_printf(b, "s%d-r%d ::= \",\" ws s%d-k%d s%d-r%d", id, j, id, j, id, j + 1);
            if (!required[j]) g_buf_printf(b, " | s%d-r%d", id, j + 1);
            g_buf_puts(b, "\n");
        }
        /* the first property written: i, when every one before it is optional */
        g_buf_printf(b, "s%d ::= \"{\" ws ( ", id);
        bool all_optional = true;
        for (int j = 0; j < k && all_optional; j++) {
            g_buf_printf(b, "%ss%d-k%d s%d-r%d ", j ? "| " : "", id, j, id, j + 1);
            all_optional = !required[j];
        }
        if (all_optional) {
            if (extra) g_buf_printf(b, "%ss%d-x s%d-r%d ", k ? "| " : "", id, id, k);
            g_buf_puts(b, (k || extra) ? "| \"\" " : "\"\" ");
        }
        g_buf_puts(b, ") \"}\"\n");
    }
    free(vid);
    free(required);
    return ok;
}

/* $ref: the rule of its target, assigned once. */
static bool gen_ref(sc *c, const cJSON *s, int depth, int *id) {
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (!cJSON_IsString(ref)) return sfail(c, SD_ERR_FORMAT, "'$ref' must be a string");
    const char *t = ref->valuestring;
    const cJSON *target = NULL;
    if (!strcmp(t, "#")) {
        target = c->root;
    } else if (!strncmp(t, "#/$defs/", 8) || !strncmp(t, "#/definitions/", 14)) {
        bool defs = t[2] == '$';
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c->root, defs ? "$defs" : "definitions");
        target = d ? cJSON_GetObjectItemCaseSensitive(d, t + (defs ? 8 : 14)) : NULL;
        if (!target) return sfail(c, SD_ERR_FORMAT, "'$ref' '%s' names no definition", t);
    } else {
        return sfail(c, SD_ERR_UNSUPPORTED, "'$ref' '%s': only \"#\", \"#/$defs/x\" and \"#/definitions/x\"", t);
    }
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == target) return *id = c->refs[i].id, true;
    return gen(c, target, depth + 1, id);
}

static bool check_keywords(sc *c, const cJSON *s) {
    const cJSON *kv;
    cJSON_ArrayForEach(kv, s) if (!known_keyword(kv->string)) return sfail(
        c, SD_ERR_UNSUPPORTED, "the JSON Schema keyword '%s' is not supported", kv->string);
    return true;
}

static bool gen_one_type(sc *c, const cJSON *s, const char *type, int id, int depth) {
    if (!strcmp(type, "object")) return gen_object(c, s, id, depth);
    if (!strcmp(type, "array")) return gen_array(c, s, id, depth);
    if (!strcmp(type, "string")) return gen_string(c, s, id);
    const char *rule = !strcmp(type, "number")    ? "j-number"
                       : !strcmp(type, "integer") ? "j-integer"
                       : !strcmp(type, "boolean") ? "j-bool"
                       : !strcmp(type, "null")    ? "j-null"
                                                  : NULL;
    if (!rule) return sfail(c, SD_ERR_FORMAT, "'type' '%s' is not a JSON Schema type", type);
    g_buf_printf(c->out, "s%d ::= %s\n", id, rule);
    return true;
}

static bool gen_body(sc *c, const cJSON *s, int id, int depth) {
    if (cJSON_IsBool(s)) {
        if (cJSON_IsFalse(s)) return sfail(c, SD_ERR_UNSUPPORTED, "the schema false (no instance) is not supported");
        g_buf_printf(c->out, "s%d ::= j-value\n", id);
        return true;
    }
    if (!cJSON_IsObject(s)) return sfail(c, SD_ERR_FORMAT, "a schema must be an object or a boolean");
    if (!check_keywords(c, s)) return false;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    g_buf *b = c->out;
    if (cst) {
        g_buf_printf(b, "s%d ::= ", id);
        if (!value_literal(c, cst)) return false;
        g_buf_puts(b, "\n");
        return true;
    }
    if (en) {
        int n = cJSON_IsArray(en) ? cJSON_GetArraySize(en) : 0;
        if (n == 0) return sfail(c, SD_ERR_FORMAT, "'enum' must be a non-empty list");
        if (n > c->lim->max_enum)
            return sfail(c, SD_ERR_RANGE, "'enum' has %d entries, at most %d", n, c->lim->max_enum);
        g_buf_printf(b, "s%d ::= ", id);
        const cJSON *v;
        int i = 0;
        cJSON_ArrayForEach(v, en) {
            if (i++) g_buf_puts(b, "| ");
            if (!value_literal(c, v)) return false;
        }
        g_buf_puts(b, "\n");
        return true;
    }
    if (any) {
        int n = cJSON_IsArray(any) ? cJSON_GetArraySize(any) : 0;
        if (n == 0) return sfail(c, SD_ERR_FORMAT, "'anyOf' / 'oneOf' must be a non-empty list of schemas");
        if (type || cJSON_GetObjectItemCaseSensitive(s, "properties"))
            return sfail(c, SD_ERR_UNSUPPORTED, "'anyOf' / 'oneOf' next to 'type' or 'properties'");
        int *ids = malloc((size_t)n * sizeof *ids);
        if (!ids) return sfail(c, SD_ERR_NOMEM, "out of memory");
        int i = 0;
        const cJSON *v;
        bool ok = true;
        cJSON_ArrayForEach(v, any) if (ok) ok = gen(c, v, depth + 1, &ids[i++]);
        if (ok) {
            g_buf_printf(b, "s%d ::= ", id);
            for (i = 0; i < n; i++) g_buf_printf(b, "%ss%d ", i ? "| " : "", ids[i]);
            g_buf_puts(b, "\n");
        }
        free(ids);
        return ok;
    }
    if (!type) { /* inferred from the keywords, else any value */
        const char *t = cJSON_GetObjectItemCaseSensitive(s, "properties") ||
                                cJSON_GetObjectItemCaseSensitive(s, "additionalProperties") ||
                                cJSON_GetObjectItemCaseSensitive(s, "required")
                            ? "object"
                        : cJSON_GetObjectItemCaseSensitive(s, "items") ? "array"
                        : cJSON_GetObjectItemCaseSensitive(s, "pattern") ||
                                cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                                cJSON_GetObjectItemCaseSensitive(s, "maxLength")
                            ? "string"
                            : NULL;
        if (t) return gen_one_type(c, s, t, id, depth);
        g_buf_printf(b, "s%d ::= j-value\n", id);
        return true;
    }
    if (cJSON_IsString(type)) return gen_one_type(c, s, type->valuestring, id, depth);
    int n = cJSON_IsArray(type) ? cJSON_GetArraySize(type) : 0;
    if (n == 0) return sfail(c, SD_ERR_FORMAT, "'type' must be a type name or a non-empty list of them");
    int first = c->next_id;
    c->next_id += n;
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, type) {
        if (!cJSON_IsString(t)) return sfail(c, SD_ERR_FORMAT, "'type' must be a type name or a list of them");
        if (!gen_one_type(c, s, t->valuestring, first + i++, depth)) return false;
    }
    g_buf_printf(b, "s%d ::= ", id);
    for (i = 0; i < n; i++) g_buf_printf(b, "%ss%d ", i ? "| " : "", first + i);
    g_buf_puts(b, "\n");
    return true;
}

/* Compiles schema s into a new rule; *id its number. */
static bool gen(sc *c, const cJSON *s, int depth, int *id) {
    if (c->failed) return false;
    if (depth > c->lim->max_depth) return sfail(c, SD_ERR_RANGE, "the schema nests deeper than %d", c->lim->max_depth);
    if (c->out->len > c->lim->max_text * 4)
        return sfail(c, SD_ERR_RANGE, "the schema's grammar exceeds %zu bytes", c->lim->max_text * 4);
    if (cJSON_IsObject(s) && cJSON_GetObjectItemCaseSensitive(s, "$ref")) {
        const cJSON *kv;
        cJSON_ArrayForEach(kv, s) if (strcmp(kv->string, "$ref") && strcmp(kv->string, "$defs") &&
                                      strcmp(kv->string, "definitions") && known_keyword(kv->string) &&
                                      strcmp(kv->string, "description") &&
                                      strcmp(kv->string, "title")) return sfail(c, SD_ERR_UNSUPPORTED,
                                                                                "'%s' next to '$ref'", kv->string);
        return gen_ref(c, s, depth, id);
    }
    *id = c->next_id++;
    if (c->n_refs == c->cap_refs) {
        int nc = c->cap_refs ? c->cap_refs * 2 : 16;
        sref *q = realloc(c->refs, (size_t)nc * sizeof *q);
        if (!q) return sfail(c, SD_ERR_NOMEM, "out of memory");
        c->refs = q;
        c->cap_refs = nc;
    }
    c->refs[c->n_refs++] = (sref){s, *id};
    return gen_body(c, s, *id, depth);
}

sd_status sd_json_schema_to_gbnf(const char *schema, size_t len, const sd_constrain_limits *lim, char **gbnf, char *err,
                                 size_t err_cap) {
    sd_constrain_limits l = lim ? *lim : sd_constrain_default_limits();
    *gbnf = NULL;
    if (err_cap) err[0] = '\0';
    if (len > l.max_text) {
        snprintf(err, err_cap, "the schema is %zu bytes, at most %zu", len, l.max_text);
        return SD_ERR_RANGE;
    }
    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (!root) {
        snprintf(err, err_cap, "the schema is not valid JSON");
        return SD_ERR_FORMAT;
    }
    g_buf b = {0};
    sc c = {.root = root, .lim = &l, .out = &b, .err = err, .err_cap = err_cap};
    int id;
    if (gen(&c, root, 0, &id)) g_buf_printf(&b, "root ::= s%d\n", id);
    g_buf_puts(&b, JSON_RULES);
    free(c.refs);
    cJSON_Delete(root);
    if (c.failed || b.oom) {
        free(b.p);
        return c.failed ? c.status : SD_ERR_NOMEM;
    }
    *gbnf = b.p;
    return SD_OK;
}

sd_status sd_grammar_from_json_schema(const char *schema, size_t len, const sd_constrain_limits *lim, sd_grammar **out,
                                      char *err, size_t err_cap) {
    char *text;
    *out = NULL;
    SD_TRY(sd_json_schema_to_gbnf(schema, len, lim, &text, err, err_cap));
    sd_constrain_limits l = lim ? *lim : sd_constrain_default_limits();
    l.max_text = strlen(text) + 1; /* its own size was bounded above */
    sd_status st = sd_grammar_parse_gbnf(text, strlen(text), &l, out, err, err_cap);
    free(text);
    return st;
}

sd_status sd_grammar_json_any(bool object_only, sd_grammar **out) {
    g_buf b = {0};
    g_buf_printf(&b, "root ::= %s\n", object_only ? "j-object" : "j-value");
    g_buf_puts(&b, JSON_RULES);
    if (b.oom) return SD_ERR_NOMEM;
    char err[128];
    sd_status st = sd_grammar_parse_gbnf(b.p, b.len, NULL, out, err, sizeof err);
    free(b.p);
    return st;
}
