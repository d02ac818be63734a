/* tool_stream.c — a chat answer with tools streamed as OpenAI deltas
 * (issue 35), for every tool_choice that describes tools:
 *
 *   - Until a call marker of one of the families (tool_formats.c:
 *     <tool_call>, [TOOL_CALLS], <|python_tag|>, or an answer opening with
 *     '{') shows up, the text streams as content deltas, as without tools;
 *     only the bytes that may begin a marker are held back until the next
 *     chunk tells. An answer with no marker streams exactly as before.
 *   - From the marker on, no content delta goes out. Each call object is
 *     lexed as it arrives: once its name is whole (and a function of the
 *     request) and its arguments object has begun, a first delta carries
 *     the call's index, id, type and name with empty arguments, and every
 *     later one the argument bytes that arrived since (the model's own text
 *     of the object, whitespace included), up to the object's closing
 *     brace; calls are numbered 0, 1, ... in order (parallel calls).
 *   - The finish chunk (gw_tool_finish_delta) parses the whole answer:
 *     calls the lexer could not stream (arguments before the name do
 *     stream, once the name is whole) go out whole there; an answer that
 *     turned out to be no call gives the content held back; finish_reason
 *     is "tool_calls" when calls went out (unless cut: "length").
 *
 * Forced calls (required, named) are the case of an answer opening with
 * '{'. The lexer is a small JSON scanner, once per byte: depth, inside a
 * string, after a backslash; at depth 1 the last string before a ':' is
 * the key, and a string value of "name" is the function's name. It does
 * not validate: a model that writes a broken object under "auto" (nothing
 * constrains it) streams broken arguments, and the finish then finds no
 * valid call (finish_reason "tool_calls" all the same, since a call's head
 * went out). */
#include "gateway_impl.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* Where the content ends: at the first marker (calls from there on), or
 * before bytes that may begin one. */
static void detect(gw_tool_stream *t, const char *text, size_t len) {
    if (t->calls) return;
    size_t first = 0;
    while (first < len && (text[first] == ' ' || text[first] == '\t' || text[first] == '\n' || text[first] == '\r'))
        first++;
    if (first == len) return; /* leading whitespace: held until the answer tells */
    if (text[first] == '{') {
        t->calls = true;
        t->scanned = first;
        return;
    }
    int which;
    size_t at = gw_tool_marker_find(text, len, t->content_end, &which);
    if (which >= 0) {
        t->calls = true;
        t->content_end = at;
        t->scanned = at + strlen(GW_TOOL_MARKERS[which]);
        return;
    }
    size_t end = len - gw_tool_marker_tail(text, len);
    if (end > t->content_end) t->content_end = end;
}

/* Lexes text up to len, or to the end of the call object being read. */
static void scan(gw_tool_stream *t, const char *text, size_t len) {
    for (; t->scanned < len && !t->closed; t->scanned++) {
        char ch = text[t->scanned];
        if (t->depth == 0) { /* between calls: markers, separators, whitespace */
            if (ch == '{') t->depth = 1;
            continue;
        }
        if (t->in_str) {
            if (t->esc)
                t->esc = false;
            else if (ch == '\\')
                t->esc = true;
            else if (ch == '"') {
                t->in_str = false;
                if (t->depth == 1) t->str_end = t->scanned;
                if (t->depth == 1 && t->after_colon && t->key == 1 && !t->name_done) {
                    t->name_done = true;
                    t->name_from = t->str_from;
                    t->name_len = t->str_end - t->str_from;
                }
            }
            continue;
        }
        if (ch == '"') {
            t->in_str = true;
            if (t->depth == 1) t->str_from = t->scanned + 1;
        } else if (ch == ':' && t->depth == 1) {
            size_t n = t->str_end > t->str_from ? t->str_end - t->str_from : 0;
            const char *k = text + t->str_from;
            t->key = n == 4 && !memcmp(k, "name", 4)                                                       ? 1
                     : (n == 9 && !memcmp(k, "arguments", 9)) || (n == 10 && !memcmp(k, "parameters", 10)) ? 2
                                                                                                           : 0;
            t->after_colon = true;
        } else if (ch == '{' || ch == '[') {
            if (++t->depth == 2 && t->key == 2 && t->after_colon && ch == '{' && !t->args_from)
                t->args_from = t->scanned;
        } else if (ch == '}' || ch == ']') {
            if (--t->depth == 1 && t->args_from && !t->args_end) t->args_end = t->scanned + 1;
            if (t->depth == 0) t->closed = true; /* the loop's increment takes the brace in */
        } else if (ch == ',' && t->depth == 1) {
            t->key = 0;
            t->after_colon = false;
        }
    }
}

static bool known(const gw_tools *tools, const char *name, size_t n) {
    for (size_t i = 0; i < tools->n; i++)
        if (strlen(tools->names[i]) == n && !memcmp(tools->names[i], name, n)) return true;
    return false;
}

/* Forgets the call object just read (its deltas are out). */
static void next_call(gw_tool_stream *t) {
    size_t scanned = t->scanned, content_end = t->content_end;
    int n_heads = t->n_heads;
    memset(t, 0, sizeof *t);
    t->calls = true;
    t->scanned = scanned;
    t->content_end = content_end;
    t->n_heads = n_heads;
}

bool gw_tool_stream_next(gw_tool_stream *t, const gw_tools *tools, const char *text, size_t len, gw_tool_delta *d) {
    detect(t, text, len);
    while (t->calls && !t->stopped) {
        scan(t, text, len);
        if (t->name_done && !known(tools, text + t->name_from, t->name_len)) {
            t->stopped = true; /* no function of the request: the finish tells what it was */
            return false;
        }
        if (t->name_done && t->args_from) {
            size_t end = t->args_end ? t->args_end : t->scanned, from = t->sent ? t->sent : t->args_from;
            if (!t->head_sent || end > from) {
                *d = (gw_tool_delta){.index = t->head_sent ? t->n_heads - 1 : t->n_heads, .head = !t->head_sent};
                d->name_from = t->name_from;
                d->name_len = t->name_len;
                d->args_from = from;
                d->args_len = end > from ? end - from : 0;
                if (!t->head_sent) t->n_heads++;
                t->head_sent = true;
                t->sent = end;
                return true;
            }
        }
        if (!t->closed) return false;
        next_call(t);
    }
    return false;
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

bool gw_tool_stream_on(const gw_job *job) { return job->endpoint == GW_EP_CHAT && job->tools; }

bool gw_tool_stream_chunk(gw_job *job, const char *model, size_t ci, bool include_usage, char **out) {
    *out = NULL;
    gw_choice *c = &job->choices[ci];
    if (!c->text) return true;
    detect(&c->ts, c->text, c->text_len);
    if (c->ts.content_end > c->streamed) { /* the content before a marker goes first */
        *out = gw_chunk_json(job, model, ci, false, c->text + c->streamed, c->ts.content_end - c->streamed, 0, 0, false,
                             include_usage);
        c->streamed = c->ts.content_end;
        return *out != NULL;
    }
    gw_tool_delta d;
    if (!gw_tool_stream_next(&c->ts, job->tools, c->text, c->text_len, &d)) return true;
    cJSON *call = cJSON_CreateObject(), *fn = NULL;
    bool ok = call && cJSON_AddNumberToObject(call, "index", d.index);
    if (ok && d.head) {
        char id[96];
        gw_tool_call_id(job, ci, d.index, id, sizeof id);
        ok = cJSON_AddStringToObject(call, "id", id) && cJSON_AddStringToObject(call, "type", "function");
        ok = ok && (fn = cJSON_AddObjectToObject(call, "function")) &&
             add_bytes(fn, "name", c->text + d.name_from, d.name_len);
    } else if (ok) {
        ok = (fn = cJSON_AddObjectToObject(call, "function")) != NULL;
    }
    ok = ok && add_bytes(fn, "arguments", c->text + d.args_from, d.args_len);
    if (!ok) {
        cJSON_Delete(call);
        return false;
    }
    *out = call_chunk(job, model, ci, call, include_usage);
    return *out != NULL;
}

void gw_tool_finish_delta(const gw_job *job, size_t ci, cJSON *delta, const char **finish_reason) {
    const gw_choice *c = &job->choices[ci];
    cJSON *calls = gw_tool_calls(job, ci);
    int streamed = c->ts.n_heads;
    if (calls || (streamed > 0 && strcmp(*finish_reason, "length") != 0)) *finish_reason = "tool_calls";
    if (calls) {
        for (int k = 0; k < streamed && cJSON_GetArraySize(calls) > 0; k++) cJSON_DeleteItemFromArray(calls, 0);
        if (cJSON_GetArraySize(calls) > 0)
            cJSON_AddItemToObject(delta, "tool_calls", calls);
        else
            cJSON_Delete(calls);
    } else if (streamed == 0 && c->text_len > c->streamed) {
        char *rest = malloc(c->text_len - c->streamed + 1);
        if (rest) {
            memcpy(rest, c->text + c->streamed, c->text_len - c->streamed);
            rest[c->text_len - c->streamed] = '\0';
            cJSON_AddStringToObject(delta, "content", rest);
            free(rest);
        }
    }
}
