/* response_format.c — structured output on the OpenAI wire: a request's
 * `response_format` (and llama.cpp's `grammar` / `json_schema` extension
 * fields) becomes the constraint the coordinator compiles and the verifier
 * enforces (SubmitRequest.constraint, issue 35).
 *
 *   {"type": "text"}                       none (the default)
 *   {"type": "json_object"}                any JSON object
 *   {"type": "json_schema", "json_schema": {"name": "...", "schema": {...},
 *    "strict": true}}                      an instance of the schema
 *   "grammar": "root ::= ..."              a GBNF grammar (llama.cpp's field)
 *   "json_schema": {...}                   a JSON Schema (llama.cpp's field)
 *
 * The shape is checked here (a 400 naming the field); whether the schema is
 * one specd handles is the constraint engine's call on the coordinator,
 * whose refusal names the unsupported keyword and comes back as a 400 on
 * `response_format`. `strict` is accepted either way: the output is always
 * held to the schema. At most one of the three may be given, and none
 * with vLLM's guided_* fields (guided.c). */
#include "gateway_impl.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

static bool bad(gw_error *err, const char *param, const char *msg) {
    return gw_fail(err, 400, "invalid_request_error", NULL, param, "%s", msg);
}

/* Takes the schema's text (compact JSON) as g's constraint. */
static bool take_schema(const cJSON *schema, const char *param, gw_gen *g, gw_error *err) {
    if (!cJSON_IsObject(schema))
        return bad(err, param, "the JSON Schema must be an object");
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    if (strlen(text) > SD_MAX_CONSTRAINT_BYTES) {
        free(text);
        return gw_fail(err, 400, "invalid_request_error", NULL, param, "the JSON Schema is over %d bytes",
                       SD_MAX_CONSTRAINT_BYTES);
    }
    g->constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA;
    g->constraint_text = text;
    return true;
}

static bool parse_response_format(const cJSON *rf, gw_gen *g, gw_error *err) {
    if (!cJSON_IsObject(rf)) return bad(err, "response_format", "'response_format' must be an object with a 'type'");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(type) || !type->valuestring)
        return bad(err, "response_format.type", "'response_format.type' must be a string");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return true;
    if (!strcmp(t, "json_object")) {
        g->constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT;
        return true;
    }
    if (strcmp(t, "json_schema") != 0)
        return gw_fail(err, 400, "invalid_request_error", "unsupported_parameter", "response_format.type",
                       "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '%.64s'", t);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return bad(err, "response_format.json_schema",
                   "'response_format.json_schema' must be an object with 'name' and 'schema'");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!cJSON_IsString(name) || !name->valuestring || !name->valuestring[0] || strlen(name->valuestring) > 64)
        return bad(err, "response_format.json_schema.name",
                   "'response_format.json_schema.name' must be a string of 1 to 64 characters");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (present(strict) && !cJSON_IsBool(strict))
        return bad(err, "response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!present(schema))
        return bad(err, "response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
    return take_schema(schema, "response_format.json_schema.schema", g, err);
}

bool gw_parse_constraint(const struct cJSON *root, gw_gen *g, gw_error *err) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    const cJSON *grammar = cJSON_GetObjectItemCaseSensitive(root, "grammar");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(root, "json_schema");
    bool rf_on = present(rf);
    if (rf_on && !parse_response_format(rf, g, err)) return false;
    rf_on = g->constraint_kind != SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE;
    if ((rf_on + present(grammar) + present(schema)) > 1)
        return bad(err, rf_on ? "response_format" : "grammar",
                   "give at most one of 'response_format' (json_object or json_schema), 'grammar' and "
                   "'json_schema'");
    const char *other = rf_on ? "response_format" : present(grammar) ? "grammar" : "json_schema";
    if (!gw_parse_guided(root, rf_on || present(grammar) || present(schema), other, g, err)) return false;
    if (present(schema)) return take_schema(schema, "json_schema", g, err);
    if (present(grammar)) {
        if (!cJSON_IsString(grammar) || !grammar->valuestring || !grammar->valuestring[0])
            return bad(err, "grammar", "'grammar' must be a non-empty string (GBNF)");
        size_t len = strlen(grammar->valuestring);
        if (len > SD_MAX_CONSTRAINT_BYTES)
            return gw_fail(err, 400, "invalid_request_error", NULL, "grammar", "'grammar' is over %d bytes",
                           SD_MAX_CONSTRAINT_BYTES);
        if (!(g->constraint_text = strdup(grammar->valuestring)))
            return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        g->constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR;
    }
    if (g->constraint_kind != SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE && g->ignore_eos)
        return bad(err, "ignore_eos", "'ignore_eos' cannot go with a structured output constraint");
    return true;
}
