/* tool_formats.c — the tool-call syntaxes of the chat families specd
 * recognises, read from a model's answer (issue 35).
 *
 * An answer is a tool call when it holds one of the families' opening
 * markers, or when it is one bare JSON object:
 *   Hermes / Qwen 2.5   <tool_call>{"name": N, "arguments": {...}}</tool_call>,
 *                       one block per call (parallel calls: several blocks);
 *   Llama 3.1 / 3.2     {"name": N, "parameters": {...}}, bare or after
 *                       <|python_tag|>; several separated by ';' (as vLLM's
 *                       llama3_json parser reads them);
 *   Mistral             [TOOL_CALLS] [{"name": N, "arguments": {...}}, ...]
 *                       (a JSON list: parallel calls; one object is accepted);
 *   bare                the whole answer one {"name", "arguments"} object
 *                       (what a forced call, tool_choice required or named,
 *                       generates), whitespace around it allowed.
 * "arguments" and "parameters" are read alike in every syntax. A call must
 * name a function of the request's tools and carry an object; one bad call
 * and the answer is no tool call at all: it is delivered as content (the
 * gateway's policy since tools landed: nothing is dropped or guessed).
 *
 * The special tokens (<|python_tag|>, [TOOL_CALLS]) reach the gateway as
 * their text: the coordinator detokenizes every token to its piece.
 * Text before the marker is the answer's content (streamed as such); text
 * after the calls is dropped. */
#include "gateway_impl.h"

#include <cjson/cJSON.h>
#include <string.h>

const char *const GW_TOOL_MARKERS[GW_TOOL_N_MARKERS] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t len, size_t i) {
    while (i < len && is_ws(s[i])) i++;
    return i;
}

size_t gw_tool_marker_find(const char *text, size_t len, size_t from, int *which) {
    size_t best = len;
    *which = -1;
    for (int m = 0; m < GW_TOOL_N_MARKERS; m++) {
        const char *p =
            from < len ? memmem(text + from, len - from, GW_TOOL_MARKERS[m], strlen(GW_TOOL_MARKERS[m])) : NULL;
        if (p && (size_t)(p - text) < best) {
            best = (size_t)(p - text);
            *which = m;
        }
    }
    return best;
}

size_t gw_tool_marker_tail(const char *text, size_t len) {
    size_t hold = 0;
    for (int m = 0; m < GW_TOOL_N_MARKERS; m++) {
        size_t ml = strlen(GW_TOOL_MARKERS[m]);
        for (size_t k = ml - 1; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, GW_TOOL_MARKERS[m], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

static bool known(const gw_tools *t, const char *name) {
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->names[i], name)) return true;
    return false;
}

/* Appends j ({"name", "arguments" | "parameters"}) to calls as
 * {"name", "arguments"}; false when it is not a call of a known tool. */
static bool add_call(const gw_tools *t, const cJSON *j, cJSON *calls) {
    const cJSON *name = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "name") : NULL;
    const cJSON *args = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "arguments") : NULL;
    if (!args && cJSON_IsObject(j)) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    if (!cJSON_IsString(name) || !known(t, name->valuestring) || !cJSON_IsObject(args)) return false;
    cJSON *c = cJSON_CreateObject();
    if (!c) return false;
    cJSON_AddItemToArray(calls, c);
    return cJSON_AddStringToObject(c, "name", name->valuestring) &&
           cJSON_AddItemToObject(c, "arguments", cJSON_Duplicate(args, true));
}

/* One JSON value at text[*at, end) (NUL-terminated text); *at moves past it. */
static cJSON *parse_one(const char *text, size_t end, size_t *at) {
    const char *stop = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text + *at, end - *at, &stop, false);
    if (j) *at = (size_t)(stop - text);
    return j;
}

/* <tool_call> blocks from at on. */
static bool parse_hermes(const gw_tools *t, const char *text, size_t len, size_t at, cJSON *calls) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *p = text + at;
    while ((p = memmem(p, len - (size_t)(p - text), open, sizeof open - 1)) != NULL) {
        const char *body = p + sizeof open - 1;
        const char *end = memmem(body, len - (size_t)(body - text), close, sizeof close - 1);
        if (!end) return false; /* cut inside a block */
        cJSON *j = cJSON_ParseWithLength(body, (size_t)(end - body));
        bool ok = j && add_call(t, j, calls);
        cJSON_Delete(j);
        if (!ok) return false;
        p = end + sizeof close - 1;
    }
    return true;
}

/* A JSON list of calls, or one call object, at at. */
static bool parse_mistral(const gw_tools *t, const char *text, size_t len, size_t at, cJSON *calls) {
    at = skip_ws(text, len, at);
    cJSON *j = parse_one(text, len, &at);
    bool ok = j != NULL;
    if (cJSON_IsArray(j) && cJSON_GetArraySize(j) > 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, j) ok = ok && add_call(t, e, calls);
    } else {
        ok = ok && add_call(t, j, calls);
    }
    cJSON_Delete(j);
    return ok;
}

/* Call objects separated by ';' at at; whole: nothing but whitespace may
 * follow them. */
static bool parse_objects(const gw_tools *t, const char *text, size_t len, size_t at, bool whole, cJSON *calls) {
    for (;;) {
        at = skip_ws(text, len, at);
        if (at >= len || text[at] != '{') return false;
        cJSON *j = parse_one(text, len, &at);
        bool ok = j && add_call(t, j, calls);
        cJSON_Delete(j);
        if (!ok) return false;
        at = skip_ws(text, len, at);
        if (at < len && text[at] == ';') {
            at++;
            continue;
        }
        return !whole || at == len;
    }
}

cJSON *gw_tool_parse(const gw_tools *t, const char *text, size_t len, size_t *content_len) {
    *content_len = len;
    if (!t || !text) return NULL;
    int which;
    size_t at = gw_tool_marker_find(text, len, 0, &which);
    size_t first = skip_ws(text, len, 0);
    bool bare = which < 0 && first < len && text[first] == '{';
    if (which < 0 && !bare) return NULL;
    cJSON *calls = cJSON_CreateArray();
    if (!calls) return NULL;
    bool ok;
    if (bare)
        ok = parse_objects(t, text, len, first, true, calls);
    else if (which == 0)
        ok = parse_hermes(t, text, len, at, calls);
    else if (which == 1)
        ok = parse_mistral(t, text, len, at + strlen(GW_TOOL_MARKERS[1]), calls);
    else
        ok = parse_objects(t, text, len, at + strlen(GW_TOOL_MARKERS[2]), false, calls);
    if (!ok || cJSON_GetArraySize(calls) == 0) {
        cJSON_Delete(calls);
        return NULL;
    }
    *content_len = bare ? 0 : at;
    return calls;
}
