/* tool_stream.c — a forced tool call's arguments streamed as they are
 * generated (issue 35), OpenAI style: under tool_choice "required" or a
 * named function the answer is constrained to one JSON object
 * {"name": N, "arguments": {...}} (tools.c), keys in that order, so once
 * the name is whole and the arguments object has begun, a first delta
 * carries the call's index, id, type and name with empty arguments, and
 * every later one the argument bytes that arrived since (the model's own
 * text of the object, whitespace included). The closing brace of the outer
 * object is never sent. The finish chunk then carries finish_reason
 * "tool_calls" when the whole answer parses as the call, "length" when it
 * was cut (openai.c's gw_chunk_json).
 *
 * The text is scanned incrementally, once per byte, with a small JSON
 * lexer: depth, inside a string, after a backslash; at depth 1 the last
 * string before a ':' is the key, and a string value of "name" is the
 * function's name. "auto" keeps the old behaviour (its text may or may not
 * hold calls: sent whole at the end). */
#include "gateway_impl.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* Feeds the choice's new bytes to its lexer, up to the end of the
 * arguments object. */
static void scan(gw_choice *c) {
    gw_tool_stream *t = &c->ts;
    for (; t->scanned < c->text_len && !t->args_done; t->scanned++) {
        char ch = c->text[t->scanned];
        if (t->in_str) {
            if (t->esc)
                t->esc = false;
            else if (ch == '\\')
                t->esc = true;
            else if (ch == '"') {
                t->in_str = false;
                if (t->depth == 1) t->str_end = t->scanned;
            }
            continue;
        }
        if (ch == '"') {
            t->in_str = true;
            if (t->depth == 1) t->str_from = t->scanned + 1;
        } else if (ch == ':' && t->depth == 1) {
            size_t n = t->str_end - t->str_from;
            t->key = n == 4 && !memcmp(c->text + t->str_from, "name", 4)        ? 1
                     : n == 9 && !memcmp(c->text + t->str_from, "arguments", 9) ? 2
                                                                                : 0;
            t->str_end = t->str_from = 0;
        } else if (ch == '{' || ch == '[') {
            if (++t->depth == 2 && t->key == 2 && ch == '{') t->args_from = t->scanned;
        } else if (ch == '}' || ch == ']') {
            /* the arguments' closing brace: the loop's increment takes it in */
            if (t->depth-- == 2 && t->args_from) t->args_done = true;
        } else if (ch == ',' && t->depth == 1) {
            if (t->key == 1 && t->str_end > t->str_from) { /* the name's string just ended */
                t->name_from = t->str_from;
                t->name_len = t->str_end - t->str_from;
            }
            t->key = 0;
        }
    }
}

/* The chunk {"choices": [{"index", "delta": {"tool_calls": [call]}}]}. */
static char *call_chunk(const gw_job *job, const char *model, size_t ci, cJSON *call, bool include_usage) {
    const gw_choice *c = &job->choices[ci];
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", job->id);
    cJSON_AddStringToObject(root, "object", "chat.completion.chunk");
    cJSON_AddNumberToObject(root, "created", (double)job->created);
    cJSON_AddStringToObject(root, "model", model);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", (double)c->index);
    cJSON *calls = cJSON_AddArrayToObject(cJSON_AddObjectToObject(ch, "delta"), "tool_calls");
    cJSON_AddItemToArray(calls, call);
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), ch);
    if (include_usage) cJSON_AddNullToObject(root, "usage");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* A string item of n bytes (not NUL-terminated) added to o; false when out of memory. */
static bool add_bytes(cJSON *o, const char *key, const char *s, size_t n) {
    char *z = malloc(n + 1);
    if (!z) return false;
    memcpy(z, s, n);
    z[n] = '\0';
    bool ok = cJSON_AddStringToObject(o, key, z) != NULL;
    free(z);
    return ok;
}

bool gw_tool_stream_on(const gw_job *job) {
    return job->endpoint == GW_EP_CHAT && job->tools &&
           (job->tools->mode == GW_TOOLS_REQUIRED || job->tools->mode == GW_TOOLS_NAMED);
}

bool gw_tool_stream_chunk(gw_job *job, const char *model, size_t ci, bool include_usage, char **out) {
    *out = NULL;
    gw_choice *c = &job->choices[ci];
    gw_tool_stream *t = &c->ts;
    if (!c->text) return true;
    scan(c);
    if (!t->args_from || !t->name_len) return true; /* the call's head is not whole yet */
    size_t end = t->args_done ? t->scanned : c->text_len, from = t->sent ? t->sent : t->args_from;
    if (t->head_sent && end <= from) return true;
    cJSON *call = cJSON_CreateObject(), *fn = NULL;
    bool ok = call && cJSON_AddNumberToObject(call, "index", 0);
    if (ok && !t->head_sent) {
        char id[96];
        gw_tool_call_id(job, ci, 0, id, sizeof id);
        ok = cJSON_AddStringToObject(call, "id", id) && cJSON_AddStringToObject(call, "type", "function");
        ok = ok && (fn = cJSON_AddObjectToObject(call, "function")) &&
             add_bytes(fn, "name", c->text + t->name_from, t->name_len);
    } else if (ok) {
        ok = (fn = cJSON_AddObjectToObject(call, "function")) != NULL;
    }
    ok = ok && add_bytes(fn, "arguments", c->text + from, end > from ? end - from : 0);
    if (!ok) {
        cJSON_Delete(call);
        return false;
    }
    *out = call_chunk(job, model, ci, call, include_usage);
    if (!*out) return false;
    t->head_sent = true;
    t->sent = end;
    return true;
}
