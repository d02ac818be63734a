/* guided.c — vLLM's structured-output extension fields (issue 35), which
 * clients send through the openai client's extra_body, mapped onto the same
 * constraint as response_format (response_format.c):
 *
 *   "guided_json": {...} or "{...}"   a JSON Schema (object, or its text)
 *   "guided_regex": "..."             a regular expression
 *   "guided_grammar": "root ::= ..."  a GBNF grammar (llama.cpp's form; vLLM's
 *                                     xgrammar backend reads GBNF too)
 *   "guided_choice": ["a", "b", ...]  exactly one of the strings: a GBNF
 *                                     alternation of them, each a quoted
 *                                     literal (quote, backslash and control
 *                                     characters escaped)
 *
 * At most one guided_* field, and none with response_format (other than
 * text), grammar or json_schema: a 400 naming both. guided_decoding_backend
 * only picks vLLM's engine and is ignored; guided_whitespace_pattern would
 * change the output and is refused (specd's JSON whitespace is its own). */
#include "gateway_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Choices at most (each one alternative of the grammar). */
#define GUIDED_MAX_CHOICES 4096

static const char *const GUIDED[] = {"guided_json", "guided_regex", "guided_grammar", "guided_choice"};

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

static bool bad(gw_error *err, const char *param, const char *msg) {
    return gw_fail(err, 400, "invalid_request_error", NULL, param, "%s", msg);
}

static bool too_long(gw_error *err, const char *param) {
    return gw_fail(err, 400, "invalid_request_error", NULL, param, "'%s' is over %d bytes", param,
                   SD_MAX_CONSTRAINT_BYTES);
}

static bool take(gw_gen *g, Specd__ConstraintKind kind, char *text, gw_error *err) {
    if (!text) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    g->constraint_kind = kind;
    g->constraint_text = text;
    return true;
}

static bool take_json(const cJSON *v, gw_gen *g, gw_error *err) {
    cJSON *parsed = NULL;
    if (cJSON_IsString(v) && v->valuestring) v = parsed = cJSON_Parse(v->valuestring);
    if (!cJSON_IsObject(v)) {
        cJSON_Delete(parsed);
        return bad(err, "guided_json", "'guided_json' must be a JSON Schema (an object, or its text)");
    }
    char *text = cJSON_PrintUnformatted(v);
    cJSON_Delete(parsed);
    if (text && strlen(text) > SD_MAX_CONSTRAINT_BYTES) {
        free(text);
        return too_long(err, "guided_json");
    }
    return take(g, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA, text, err);
}

static bool take_text(const cJSON *v, const char *param, Specd__ConstraintKind kind, gw_gen *g, gw_error *err) {
    if (!cJSON_IsString(v) || !v->valuestring || !v->valuestring[0])
        return gw_fail(err, 400, "invalid_request_error", NULL, param, "'%s' must be a non-empty string", param);
    if (strlen(v->valuestring) > SD_MAX_CONSTRAINT_BYTES) return too_long(err, param);
    return take(g, kind, strdup(v->valuestring), err);
}

/* Appends s as a GBNF string literal to buf (at most cap bytes with its
 * NUL); false when it does not fit. */
static bool append_literal(char *buf, size_t cap, size_t *len, const char *s) {
    if (*len + 1 >= cap) return false;
    buf[(*len)++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        size_t n = 0;
        if (*p == '"' || *p == '\\') {
            esc[n++] = '\\';
            esc[n++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            n = (size_t)snprintf(esc, sizeof esc, "\\x%02X", *p);
        } else {
            esc[n++] = (char)*p; /* UTF-8 passes through: the grammar reads characters */
        }
        if (*len + n + 1 >= cap) return false;
        memcpy(buf + *len, esc, n);
        *len += n;
    }
    if (*len + 2 >= cap) return false;
    buf[(*len)++] = '"';
    buf[*len] = '\0';
    return true;
}

/* guided_choice: root ::= "a" | "b" | ... */
static bool take_choice(const cJSON *v, gw_gen *g, gw_error *err) {
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > GUIDED_MAX_CHOICES)
        return gw_fail(err, 400, "invalid_request_error", NULL, "guided_choice",
                       "'guided_choice' must be an array of 1 to %d strings", GUIDED_MAX_CHOICES);
    size_t cap = SD_MAX_CONSTRAINT_BYTES + 1, len = 0;
    char *gbnf = malloc(cap);
    if (!gbnf) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    len = (size_t)snprintf(gbnf, cap, "root ::= ");
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        if (!cJSON_IsString(c) || !c->valuestring || !c->valuestring[0]) {
            free(gbnf);
            return gw_fail(err, 400, "invalid_request_error", NULL, "guided_choice",
                           "'guided_choice[%d]' must be a non-empty string", i);
        }
        bool fits = i == 0 || len + 3 < cap;
        if (fits && i > 0) len += (size_t)snprintf(gbnf + len, cap - len, " | ");
        if (!fits || !append_literal(gbnf, cap, &len, c->valuestring)) {
            free(gbnf);
            return gw_fail(err, 400, "invalid_request_error", NULL, "guided_choice",
                           "'guided_choice' makes a grammar over %d bytes", SD_MAX_CONSTRAINT_BYTES);
        }
    }
    return take(g, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR, gbnf, err);
}

bool gw_parse_guided(const struct cJSON *root, bool other, const char *other_name, gw_gen *g, gw_error *err) {
    const char *name = NULL;
    const cJSON *v = NULL;
    for (size_t i = 0; i < sizeof GUIDED / sizeof GUIDED[0]; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, GUIDED[i]);
        if (!present(f)) continue;
        if (name)
            return gw_fail(err, 400, "invalid_request_error", NULL, GUIDED[i],
                           "'%s' conflicts with '%s': give one guided_* field", GUIDED[i], name);
        name = GUIDED[i];
        v = f;
    }
    if (present(cJSON_GetObjectItemCaseSensitive(root, "guided_whitespace_pattern")))
        return gw_fail(err, 400, "invalid_request_error", "unsupported_parameter", "guided_whitespace_pattern",
                       "'guided_whitespace_pattern' is not supported by specd (JSON whitespace is fixed)");
    if (!name) return true;
    if (other)
        return gw_fail(err, 400, "invalid_request_error", NULL, name,
                       "'%s' conflicts with '%s': give one structured output constraint", name, other_name);
    if (!strcmp(name, "guided_json")) return take_json(v, g, err);
    if (!strcmp(name, "guided_regex")) return take_text(v, name, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX, g, err);
    if (!strcmp(name, "guided_grammar"))
        return take_text(v, name, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR, g, err);
    return take_choice(v, g, err);
}
