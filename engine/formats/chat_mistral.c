/* chat_mistral.c — Mistral's v3 chat template (Mistral-7B-Instruct-v0.3,
 * Mistral-Large-Instruct-2407; tests/data/chat_templates/mistral-v0.3.jinja),
 * tools included, statement by statement (see sd_chat_format_mistral3).
 *
 * What the template does, and so does this:
 *   - a first system message is taken out; it opens the last message when
 *     that one is a user turn ("[INST] " + system + "\n\n" + content), and
 *     is dropped otherwise;
 *   - the other turns alternate user/assistant, tool turns and turns with
 *     calls aside;
 *   - the tools go before every user turn equal to the last one, each as
 *     {"type": "function", "function": {...}} with its string members
 *     written as they are (no escaping: the template concatenates them) and
 *     the others as tojson, "return" left out;
 *   - a turn with calls is "[TOOL_CALLS] [" + each call's tojson less its
 *     '}' + ', "id": "' + id + '"}' ... "]" + eos; its content is dropped;
 *   - a tool turn is '[TOOL_RESULTS] {"content": ' + content (as it is) +
 *     ', "call_id": "' + tool_call_id + '"}[/TOOL_RESULTS]';
 *   - an id that is not 9 characters long (Unicode characters, as Jinja's
 *     length counts) is refused, as the template raises.
 * add_generation_prompt is not read: the last [/INST] opens the answer.
 * Mistral-Nemo-Instruct-2407's template (tests/data/chat_templates/
 * mistral-nemo.jinja, Mistral's "v3 tekken" tokenizer) is the same text
 * without the spaces: "[INST]", "[AVAILABLE_TOOLS][", "[TOOL_CALLS][",
 * '[TOOL_RESULTS]{"content": ' and an answer's content + eos as it is. */
#include "chat_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD_ID "Tool call IDs should be alphanumeric strings with length 9!"

static sd_status refuse(char *err, size_t err_cap, size_t i, const char *msg) {
    if (err_cap) snprintf(err, err_cap, "messages[%zu]: the model's chat template (mistral v3 / nemo): %s", i, msg);
    return SD_ERR_INVALID_ARG;
}

/* Jinja's length of UTF-8 text: its characters. */
static size_t n_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

/* One tool's {"type": "function", "function": {...}} from its "function". */
static bool tool_text(strbuf *out, const char *tool, size_t len, strbuf *key) {
    size_t ff, ft, at = 0, vf, vt;
    if (!sd_chat_json_find(tool, len, "function", &ff, &ft)) return false;
    const char *f = tool + ff;
    int r;
    bool first = true;
    sd_sb_add(out, "{\"type\": \"function\", \"function\": {");
    while ((r = sd_chat_json_member(f, ft - ff, &at, key, &vf, &vt)) == 1) {
        if (key->len == 6 && !memcmp(key->data, "return", 6)) continue;
        if (!first) sd_sb_add(out, ", ");
        first = false;
        sd_sb_add(out, "\"");
        sd_sb_content(out, key->data ? key->data : "", key->len);
        if (f[vf] == '"') {
            sd_sb_add(out, "\": \"");
            if (!sd_chat_json_string(out, f + vf, vt - vf)) return false;
            sd_sb_add(out, "\"");
        } else {
            sd_sb_add(out, "\": ");
            if (!sd_chat_pyjson(out, f + vf, vt - vf, 0)) return false;
        }
    }
    sd_sb_add(out, "}}");
    return r == 0;
}

/* "[AVAILABLE_TOOLS] [" + the tools, ", " between, "]" after the last +
 * "[/AVAILABLE_TOOLS]" (an empty list: no "]"). */
static bool tools_text(strbuf *out, const char *tools, bool tekken) {
    strbuf key = {0};
    size_t len = strlen(tools), at = 0, vf, vt;
    int r;
    bool ok = true, any = false;
    sd_sb_add(out, tekken ? "[AVAILABLE_TOOLS][" : "[AVAILABLE_TOOLS] [");
    while (ok && (r = sd_chat_json_item(tools, len, &at, &vf, &vt)) == 1) {
        if (any) sd_sb_add(out, ", ");
        any = true;
        ok = tool_text(out, tools + vf, vt - vf, &key);
    }
    free(key.data);
    if (any) sd_sb_add(out, "]");
    sd_sb_add(out, "[/AVAILABLE_TOOLS]");
    return ok && r == 0;
}

/* An id that the template takes: a string of 9 characters, written into
 * out as it is. */
static bool id_text(strbuf *out, const char *id, size_t len, bool json) {
    strbuf d = {0};
    bool ok = json ? sd_chat_json_string(&d, id, len) : (sd_sb_addn(&d, id, len), !d.failed);
    ok = ok && n_chars(d.data ? d.data : "", d.len) == 9;
    if (ok) sd_sb_content(out, d.data, d.len);
    free(d.data);
    return ok;
}

/* "[TOOL_CALLS] [" + each call (a JSON list of objects) as tojson of its
 * members but "id", less the closing '}', + ', "id": "' + id + '"}', ", "
 * between, "]" + eos after the last. */
static sd_status calls_text(strbuf *out, const char *calls, const char *eos, bool tekken, size_t i, char *err,
                            size_t err_cap) {
    strbuf key = {0};
    size_t len = strlen(calls), at = 0, cf, ct;
    int r;
    sd_status st = SD_OK;
    bool any = false;
    sd_sb_add(out, tekken ? "[TOOL_CALLS][" : "[TOOL_CALLS] [");
    while (st == SD_OK && (r = sd_chat_json_item(calls, len, &at, &cf, &ct)) == 1) {
        const char *c = calls + cf;
        size_t m = 0, vf, vt, idf = 0, idt = 0;
        int q;
        bool first = true;
        if (any) sd_sb_add(out, ", ");
        any = true;
        sd_sb_add(out, "{");
        while ((q = sd_chat_json_member(c, ct - cf, &m, &key, &vf, &vt)) == 1) {
            if (key.len == 2 && !memcmp(key.data, "id", 2)) {
                idf = vf, idt = vt;
                continue;
            }
            if (!first) sd_sb_add(out, ", ");
            first = false;
            sd_chat_pystr(out, key.data ? key.data : "", key.len);
            sd_sb_add(out, ": ");
            if (!sd_chat_pyjson(out, c + vf, vt - vf, 0)) q = -1;
            if (q < 0) break;
        }
        if (q != 0) st = refuse(err, err_cap, i, "tool_calls: not a JSON list of {\"name\": ..., \"arguments\": ...}");
        sd_sb_add(out, ", \"id\": \"");
        if (st == SD_OK && !(idt > idf && id_text(out, c + idf, idt - idf, true))) st = refuse(err, err_cap, i, BAD_ID);
        sd_sb_add(out, "\"}");
    }
    free(key.data);
    if (st == SD_OK && r != 0) st = refuse(err, err_cap, i, "tool_calls: not a JSON list");
    if (any) {
        sd_sb_add(out, "]");
        sd_sb_add(out, eos);
    }
    return st;
}

/* The template's first loop: turns but tool turns and turns with calls alternate user/assistant. */
static sd_status check_alternation(const sd_chat_msg *m, size_t n, size_t from, const sd_chat_tools *tt, char *err,
                                   size_t err_cap) {
    size_t index = 0;
    for (size_t i = from; i < n; i++) {
        if (!strcmp(m[i].role, "tool") || (tt && tt->tool_calls && tt->tool_calls[i])) continue;
        if (!strcmp(m[i].role, "user") != (index % 2 == 0))
            return refuse(err, err_cap, i,
                          "after the optional system message, conversation roles must alternate "
                          "user/assistant/user/assistant/...");
        index++;
    }
    return SD_OK;
}

sd_status sd_chat_format_mistral3(strbuf *out, const char *bos, const char *eos, bool tekken, const sd_chat_msg *m,
                                  size_t n, const sd_chat_tools *tt, char *err, size_t err_cap) {
    const char *sys = n > 0 && !strcmp(m[0].role, "system") ? m[0].content : NULL, *last_user = NULL;
    const char *tools = tt ? tt->tools : NULL;
    size_t from = sys ? 1 : 0;
    sd_status st = check_alternation(m, n, from, tt, err, err_cap);
    if (st != SD_OK) return st;
    for (size_t i = from; i < n; i++)
        if (!strcmp(m[i].role, "user")) last_user = m[i].content;
    if (bos) sd_sb_add(out, bos);
    for (size_t i = from; i < n && st == SD_OK; i++) {
        const char *calls = tt && tt->tool_calls ? tt->tool_calls[i] : NULL;
        const char *id = tt && tt->tool_call_ids ? tt->tool_call_ids[i] : NULL;
        if (!strcmp(m[i].role, "user")) {
            if (tools && !strcmp(m[i].content, last_user) && !tools_text(out, tools, tekken))
                return refuse(err, err_cap, i,
                              "tools: not a JSON list of {\"type\": \"function\", \"function\": {...}}");
            sd_sb_add(out, tekken ? "[INST]" : "[INST] ");
            if (i + 1 == n && sys) {
                sd_sb_content(out, sys, strlen(sys));
                sd_sb_add(out, "\n\n");
            }
            sd_sb_content(out, m[i].content, strlen(m[i].content));
            sd_sb_add(out, "[/INST]");
        } else if (calls) {
            st = calls_text(out, calls, eos, tekken, i, err, err_cap);
        } else if (!strcmp(m[i].role, "assistant")) {
            if (tekken) {
                sd_sb_content(out, m[i].content, strlen(m[i].content));
            } else {
                sd_sb_add(out, " ");
                sd_sb_content_stripped(out, m[i].content, strlen(m[i].content));
            }
            sd_sb_add(out, eos);
        } else if (!strcmp(m[i].role, "tool")) {
            sd_sb_add(out, tekken ? "[TOOL_RESULTS]{\"content\": " : "[TOOL_RESULTS] {\"content\": ");
            sd_sb_content(out, m[i].content, strlen(m[i].content));
            sd_sb_add(out, ", \"call_id\": \"");
            if (!id || !id_text(out, id, strlen(id), false)) return refuse(err, err_cap, i, BAD_ID);
            sd_sb_add(out, "\"}[/TOOL_RESULTS]");
        } else {
            return refuse(err, err_cap, i,
                          "only user and assistant roles are supported, with the exception of an initial optional "
                          "system message");
        }
    }
    return st;
}
