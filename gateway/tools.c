/* tools.c — OpenAI tool calls on chat completions (issue 35): `tools`,
 * `tool_choice`, `tool` turns and assistant `tool_calls` in the history, and
 * the output parsed back into `message.tool_calls`.
 *
 * The gateway holds no model: the tools (g->tools_json), each assistant
 * turn's calls ({"name", "arguments", "id"}) and each tool turn's
 * tool_call_id go over the wire to the coordinator, whose chat template
 * renders them (specd/chat.h: Llama 3.1 / 3.2, Qwen 2.5 and Mistral v3
 * exactly as their templates do, other families as Hermes text). The ids
 * of generated calls are 9 letters and digits (gw_tool_call_id), which
 * Mistral's template demands when they come back in the history.
 *
 * tool_choice:
 *   "none"      the tools are not described; plain text.
 *   "auto"      (the default with tools) described; the output's calls,
 *               in any family's syntax (tool_formats.c), become tool_calls.
 *   "required"  described, and the output constrained to one JSON object
 *               {"name": <one of the tools>, "arguments": <its parameters>}
 *               (a JSON Schema anyOf: enforced by the verifier, not hoped
 *               for).
 *   {"type": "function", "function": {"name": N}}   the same for N alone.
 * Streaming (tool_stream.c, any mode): content until a call marker, then
 * each call's head and its arguments as they are generated, finish_reason
 * "tool_calls". One call per answer when forced; in auto mode every call
 * the syntax holds (parallel calls). */
#include "gateway_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

static bool bad(gw_error *err, const char *param, const char *msg) {
    return gw_fail(err, 400, "invalid_request_error", NULL, param, "%s", msg);
}

void gw_tools_free(gw_tools **pt) {
    if (!pt || !*pt) return;
    for (size_t i = 0; i < (*pt)->n; i++) free((*pt)->names[i]);
    free(*pt);
    *pt = NULL;
}

gw_tools *gw_tools_dup(const gw_tools *t) {
    if (!t) return NULL;
    gw_tools *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->mode = t->mode;
    for (size_t i = 0; i < t->n; i++) {
        if (!(d->names[i] = strdup(t->names[i]))) {
            gw_tools_free(&d);
            return NULL;
        }
        d->n++;
    }
    return d;
}

static bool name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* The schemas of {"name": name, key: parameters} for key "arguments" (the
 * Hermes and Mistral forms) and "parameters" (Llama 3.1's), added to into:
 * the gateway does not know the model's family, so the call may take
 * either key; both parse alike (tool_formats.c). */
static void add_call_schema(cJSON *into, const char *name, const cJSON *params) {
    static const char *const keys[] = {"arguments", "parameters"};
    for (int k = 0; k < 2; k++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(o, "properties");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const", name);
        cJSON_AddItemToObject(props, keys[k], params ? cJSON_Duplicate(params, true) : cJSON_CreateObject());
        cJSON *req = cJSON_AddArrayToObject(o, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(keys[k]));
        cJSON_AddFalseToObject(o, "additionalProperties");
        cJSON_AddItemToArray(into, o);
    }
}

/* tool_choice into t->mode (and the forced name's index into *named). */
static bool parse_choice(const cJSON *tc, gw_tools *t, int *named, gw_error *err) {
    *named = -1;
    t->mode = GW_TOOLS_AUTO;
    if (!present(tc)) return true;
    if (cJSON_IsString(tc) && tc->valuestring) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "none")) t->mode = GW_TOOLS_OFF;
        else if (!strcmp(s, "required")) t->mode = GW_TOOLS_REQUIRED;
        else if (strcmp(s, "auto") != 0)
            return bad(err, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a named function");
        return true;
    }
    const cJSON *type = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "type") : NULL;
    const cJSON *fn = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "function") : NULL;
    const cJSON *name = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
        return bad(err, "tool_choice",
                   "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->names[i], name->valuestring)) *named = (int)i;
    if (*named < 0) return bad(err, "tool_choice", "'tool_choice' names a function that is not in 'tools'");
    t->mode = GW_TOOLS_NAMED;
    return true;
}

/* Each tool's shape; its name into t. */
static bool parse_tool_list(const cJSON *tools, gw_tools *t, gw_error *err) {
    if (!cJSON_IsArray(tools)) return bad(err, "tools", "'tools' must be a list of functions");
    if (cJSON_GetArraySize(tools) > GW_MAX_TOOLS) return bad(err, "tools", "'tools' holds more than 128 functions");
    char param[64];
    int i = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        snprintf(param, sizeof param, "tools[%d]", i++);
        const cJSON *type = cJSON_IsObject(tool) ? cJSON_GetObjectItemCaseSensitive(tool, "type") : NULL;
        const cJSON *fn = cJSON_IsObject(tool) ? cJSON_GetObjectItemCaseSensitive(tool, "function") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(fn))
            return bad(err, param, "each tool must be {\"type\": \"function\", \"function\": {...}}");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(name) || !name_ok(name->valuestring))
            return bad(err, param, "a function's 'name' must be 1 to 64 letters, digits, '_' or '-'");
        if (present(params) && !cJSON_IsObject(params))
            return bad(err, param, "a function's 'parameters' must be a JSON Schema object");
        for (size_t k = 0; k < t->n; k++)
            if (!strcmp(t->names[k], name->valuestring)) return bad(err, param, "two tools have the same name");
        if (!(t->names[t->n] = strdup(name->valuestring)))
            return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        t->n++;
    }
    return true;
}

/* The forced call's schema as g's constraint. */
static bool force(gw_gen *g, const cJSON *tools, int named, gw_error *err) {
    cJSON *alts = cJSON_CreateArray();
    int i = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        if (named < 0 || named == i)
            add_call_schema(alts, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring,
                            cJSON_GetObjectItemCaseSensitive(fn, "parameters"));
        i++;
    }
    cJSON *schema = cJSON_CreateObject();
    if (cJSON_IsArray(alts) && cJSON_GetArraySize(alts) > 0) cJSON_AddItemToObject(schema, "anyOf", alts);
    else cJSON_Delete(alts);
    g->constraint_text = cJSON_PrintUnformatted(schema);
    cJSON_Delete(schema);
    if (!g->constraint_text) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    if (strlen(g->constraint_text) > SD_MAX_CONSTRAINT_BYTES)
        return bad(err, "tools", "the tools' parameter schemas are too large to enforce");
    g->constraint_kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA;
    return true;
}

bool gw_parse_tools(const struct cJSON *root, gw_gen *g, gw_error *err) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    bool any = present(tools) && !(cJSON_IsArray(tools) && !tools->child);
    if (!any) {
        if (present(tc) && !(cJSON_IsString(tc) && (!strcmp(tc->valuestring, "none") ||
                                                   !strcmp(tc->valuestring, "auto"))))
            return bad(err, "tool_choice", "'tool_choice' needs 'tools'");
        return true;
    }
    if (g->endpoint != GW_EP_CHAT)
        return gw_fail(err, 400, "invalid_request_error", "unsupported_parameter", "tools",
                       "'tools' are for /v1/chat/completions");
    gw_tools *t = calloc(1, sizeof *t);
    if (!t) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    g->tools = t;
    int named;
    if (!parse_tool_list(tools, t, err) || !parse_choice(tc, t, &named, err)) return false;
    if (t->mode == GW_TOOLS_OFF) {
        gw_tools_free(&g->tools);
        return true;
    }
    if (g->constraint_kind != SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE)
        return bad(err, "response_format", "'response_format' cannot go with 'tools' (unless tool_choice is 'none')");
    /* the model's chat template renders them, on the coordinator */
    if (!(g->tools_json = cJSON_PrintUnformatted(tools)))
        return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    return t->mode == GW_TOOLS_AUTO || force(g, tools, named, err);
}

/* ---- history turns ---- */

bool gw_tool_turn(const struct cJSON *m, char **calls_json, const char *param, gw_error *err) {
    *calls_json = NULL;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!present(calls)) return true;
    if (!cJSON_IsArray(calls)) return bad(err, param, "'tool_calls' must be a list");
    cJSON *list = cJSON_CreateArray();
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const cJSON *fn = cJSON_IsObject(call) ? cJSON_GetObjectItemCaseSensitive(call, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        const cJSON *args = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
        const cJSON *id = cJSON_IsObject(call) ? cJSON_GetObjectItemCaseSensitive(call, "id") : NULL;
        if (!cJSON_IsString(name) || !cJSON_IsString(args) || (present(id) && !cJSON_IsString(id))) {
            cJSON_Delete(list);
            return bad(err, param,
                       "each tool call needs 'function' with 'name' and 'arguments' strings (and an 'id' "
                       "string, if any)");
        }
        /* the arguments' own text when it is one JSON value (the template
         * re-serialises it: 21.0 stays 21.0), else the string itself */
        cJSON *o = cJSON_CreateObject(), *parsed = cJSON_ParseWithOpts(args->valuestring, NULL, true);
        cJSON_AddItemToArray(list, o);
        cJSON_AddStringToObject(o, "name", name->valuestring);
        if (parsed)
            cJSON_AddRawToObject(o, "arguments", args->valuestring);
        else
            cJSON_AddStringToObject(o, "arguments", args->valuestring);
        if (cJSON_IsString(id)) cJSON_AddStringToObject(o, "id", id->valuestring); /* Mistral's template writes it */
        cJSON_Delete(parsed);
    }
    *calls_json = cJSON_GetArraySize(list) > 0 ? cJSON_PrintUnformatted(list) : NULL;
    bool empty = cJSON_GetArraySize(list) == 0;
    cJSON_Delete(list);
    if (!*calls_json && !empty) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

bool gw_tool_result_id(const struct cJSON *m, int i, char **id, gw_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    char param[64];
    *id = NULL;
    if (!present(v)) return true;
    snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) > SD_MAX_CALL_ID_BYTES)
        return gw_fail(err, 400, "invalid_request_error", NULL, param, "'%s' must be a string of 1 to %d bytes", param,
                       SD_MAX_CALL_ID_BYTES);
    if (!(*id = strdup(v->valuestring))) return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

/* ---- the answer ---- */

/* 9 letters and digits, as Mistral's template demands of every id (and any
 * other family takes): FNV-1a of the job's id, the choice and the call,
 * written in base 62. */
void gw_tool_call_id(const gw_job *job, size_t ci, int k, char *out, size_t cap) {
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    char key[160];
    int n = snprintf(key, sizeof key, "%s/%zu/%d", job->id, ci, k);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n && i < (int)sizeof key - 1; i++) h = (h ^ (uint8_t)key[i]) * 0x100000001b3ull;
    if (cap < 10) {
        if (cap) out[0] = '\0';
        return;
    }
    for (int i = 0; i < 9; i++, h /= 62) out[i] = digits[h % 62];
    out[9] = '\0';
}

struct cJSON *gw_tool_calls(const gw_job *job, size_t ci) {
    const gw_choice *c = &job->choices[ci];
    if (!job->tools || !c->text) return NULL;
    size_t content_len;
    cJSON *parsed = gw_tool_parse(job->tools, c->text, c->text_len, &content_len); /* tool_formats.c */
    if (!parsed) return NULL;
    cJSON *calls = cJSON_CreateArray();
    bool ok = calls != NULL;
    int k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, parsed) {
        char id[96], *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(p, "arguments"));
        cJSON *call = cJSON_CreateObject(), *fn = NULL;
        if (!call || !ok || !cJSON_AddItemToArray(calls, call)) { /* calls owns call from here */
            cJSON_Delete(call);
            ok = false;
        }
        gw_tool_call_id(job, ci, k, id, sizeof id);
        ok = ok && a && cJSON_AddNumberToObject(call, "index", k) && cJSON_AddStringToObject(call, "id", id) &&
             cJSON_AddStringToObject(call, "type", "function") && (fn = cJSON_AddObjectToObject(call, "function")) &&
             cJSON_AddStringToObject(fn, "name", cJSON_GetObjectItemCaseSensitive(p, "name")->valuestring) &&
             cJSON_AddStringToObject(fn, "arguments", a);
        free(a);
        k++;
    }
    cJSON_Delete(parsed);
    if (!ok) {
        cJSON_Delete(calls);
        return NULL;
    }
    return calls;
}
