/* chat_tools.c — tools in a conversation, rendered as the model's chat
 * template does (issue 35; see sd_chat_tools in specd/chat.h): Llama 3.1's
 * and Qwen 2.5's templates statement by statement (their JSON as tojson
 * writes it: chat_json.c; Mistral's: chat_mistral.c).
 *
 * Families whose template has no tools get the Hermes text the gateway
 * wrote before tools moved here (sd_chat_hermes): Qwen 2.5's form with
 * compact JSON, as a system turn of its own when there is no system
 * message; it works with any instruct model. */
#include "chat_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sd_chat_has_tools(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt) {
    if (tt && tt->tools) return true;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m[i].role, "tool") || (tt && tt->tool_calls && tt->tool_calls[i])) return true;
    return false;
}

static sd_status refuse(char *err, size_t err_cap, const char *msg) {
    if (err_cap) snprintf(err, err_cap, "%s", msg);
    return SD_ERR_INVALID_ARG;
}

/* Each element of the JSON list text, tojson(indent=4) + "\n\n". */
static bool llama31_tools(strbuf *out, const char *text) {
    size_t len = strlen(text), at = 0, vf, vt;
    int r;
    while ((r = sd_chat_json_item(text, len, &at, &vf, &vt)) == 1) {
        if (!sd_chat_pyjson(out, text + vf, vt - vf, 4)) return false;
        sd_sb_add(out, "\n\n");
    }
    return r == 0;
}

/* The one call of calls (a JSON list) as Llama 3.1 writes it:
 * {"name": "N", "parameters": tojson(arguments)} (the arguments' own text
 * re-serialised, so 2.0 stays 2.0). */
static sd_status llama31_call(strbuf *out, const char *calls, char *err, size_t err_cap) {
    cJSON *list = cJSON_Parse(calls);
    const cJSON *c = cJSON_IsArray(list) ? list->child : NULL;
    const cJSON *name = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "name") : NULL;
    size_t len = strlen(calls), at = 0, cf = 0, ct = 0, vf = 0, vt = 0;
    sd_status st = SD_OK;
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != 1)
        st = refuse(err, err_cap,
                    "the model's chat template (llama3.1) takes one tool call per assistant turn "
                    "(\"This model only supports single tool-calls at once!\")");
    else if (!cJSON_IsString(name) || sd_chat_json_item(calls, len, &at, &cf, &ct) != 1 ||
             !sd_chat_json_find(calls + cf, ct - cf, "arguments", &vf, &vt))
        st = refuse(err, err_cap, "a tool call needs a 'name' string and 'arguments'");
    if (st == SD_OK) {
        sd_sb_add(out, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
        sd_sb_content(out, name->valuestring, strlen(name->valuestring));
        sd_sb_add(out, "\", \"parameters\": ");
        if (!sd_chat_pyjson(out, calls + cf + vf, vt - vf, 0))
            st = refuse(err, err_cap, "a tool call's 'arguments' is not JSON");
        sd_sb_add(out, "}<|eot_id|>");
    }
    cJSON_Delete(list);
    return st;
}

sd_status sd_chat_format_llama31(strbuf *out, const char *bos, const char *date, const sd_chat_msg *m, size_t n,
                                 const sd_chat_tools *tt, bool gen, char *err, size_t err_cap) {
    const char *tools = tt ? tt->tools : NULL;
    size_t i = 0;
    if (bos) sd_sb_add(out, bos);
    sd_sb_add(out, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (tools) sd_sb_add(out, "Environment: ipython\n");
    sd_sb_add(out, "Cutting Knowledge Date: December 2023\nToday Date: ");
    sd_sb_add(out, date);
    sd_sb_add(out, "\n\n");
    if (n > 0 && !strcmp(m[0].role, "system")) {
        sd_sb_content_stripped(out, m[0].content, strlen(m[0].content));
        i = 1;
    }
    sd_sb_add(out, "<|eot_id|>");
    if (tools) { /* the functions go in the first message after the system one, whatever its role */
        if (i >= n)
            return refuse(err, err_cap,
                          "the model's chat template (llama3.1) puts the tools in the first user "
                          "message, and there is none");
        sd_sb_add(out, "<|start_header_id|>user<|end_header_id|>\n\n"
                       "Given the following functions, please respond with a JSON for a function call with its "
                       "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
                       "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
                       "variables.\n\n");
        if (!llama31_tools(out, tools)) return refuse(err, err_cap, "tools: not a JSON list");
        sd_sb_content_stripped(out, m[i].content, strlen(m[i].content));
        sd_sb_add(out, "<|eot_id|>");
        i++;
    }
    for (; i < n; i++) {
        const char *calls = tt && tt->tool_calls ? tt->tool_calls[i] : NULL;
        if (calls) {
            sd_status st = llama31_call(out, calls, err, err_cap);
            if (st != SD_OK) return st;
        } else if (!strcmp(m[i].role, "tool")) {
            sd_sb_add(out, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            sd_chat_pystr(out, m[i].content, strlen(m[i].content)); /* a string is iterable: tojson */
            sd_sb_add(out, "<|eot_id|>");
        } else {
            sd_sb_add(out, "<|start_header_id|>");
            sd_sb_add(out, m[i].role);
            sd_sb_add(out, "<|end_header_id|>\n\n");
            sd_sb_content_stripped(out, m[i].content, strlen(m[i].content));
            sd_sb_add(out, "<|eot_id|>");
        }
    }
    if (gen) sd_sb_add(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return SD_OK;
}

/* ---- Qwen 2.5 ---- */

static const char QWEN_TOOLS_HEAD[] = "\n\n# Tools\n\nYou may call one or more functions to assist with the user "
                                      "query.\n\nYou are provided with function signatures within <tools></tools> "
                                      "XML tags:\n<tools>";
static const char QWEN_TOOLS_TAIL[] = "\n</tools>\n\nFor each function call, return a json object with function name "
                                      "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                                      "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/* The system turn: `if tools` (a list that is not empty) the tools' text
 * after the system prompt (messages[0]'s or the default). */
static sd_status qwen25_system(strbuf *out, const char *default_system, const sd_chat_msg *m, const char *tools,
                               char *err, size_t err_cap) {
    size_t len = tools ? strlen(tools) : 0, at = 0, vf, vt;
    int r = tools ? sd_chat_json_item(tools, len, &at, &vf, &vt) : 0;
    if (r < 0) return refuse(err, err_cap, "tools: not a JSON list");
    const char *sys = !strcmp(m[0].role, "system") ? m[0].content : default_system ? default_system : "";
    sd_sb_add(out, "<|im_start|>system\n");
    sd_sb_content(out, sys, strlen(sys));
    if (r == 1) {
        sd_sb_add(out, QWEN_TOOLS_HEAD);
        for (; r == 1; r = sd_chat_json_item(tools, len, &at, &vf, &vt)) {
            sd_sb_add(out, "\n");
            if (!sd_chat_pyjson(out, tools + vf, vt - vf, 0)) return refuse(err, err_cap, "tools: not JSON");
        }
        if (r < 0) return refuse(err, err_cap, "tools: not a JSON list");
        sd_sb_add(out, QWEN_TOOLS_TAIL);
    }
    sd_sb_add(out, "<|im_end|>\n");
    return SD_OK;
}

/* An assistant turn with calls (a JSON list, not empty): each one as
 * '\n<tool_call>\n{"name": "' + name + '", "arguments": ' + tojson + '}\n</tool_call>'. */
static sd_status qwen25_calls(strbuf *out, const char *content, const char *calls, size_t i, char *err,
                              size_t err_cap) {
    size_t len = strlen(calls), at = 0, cf, ct, nf, nt, af, at2;
    int r;
    sd_sb_add(out, "<|im_start|>assistant");
    if (content[0]) {
        sd_sb_add(out, "\n");
        sd_sb_content(out, content, strlen(content));
    }
    while ((r = sd_chat_json_item(calls, len, &at, &cf, &ct)) == 1) {
        const char *c = calls + cf;
        sd_sb_add(out, "\n<tool_call>\n{\"name\": \"");
        if (!sd_chat_json_find(c, ct - cf, "name", &nf, &nt) || !sd_chat_json_string(out, c + nf, nt - nf) ||
            !sd_chat_json_find(c, ct - cf, "arguments", &af, &at2))
            break;
        sd_sb_add(out, "\", \"arguments\": ");
        if (!sd_chat_pyjson(out, c + af, at2 - af, 0)) break;
        sd_sb_add(out, "}\n</tool_call>");
    }
    if (r != 0) {
        if (err_cap)
            snprintf(err, err_cap, "messages[%zu].tool_calls: not a JSON list of {\"name\": ..., \"arguments\": ...}",
                     i);
        return SD_ERR_INVALID_ARG;
    }
    sd_sb_add(out, "<|im_end|>\n");
    return SD_OK;
}

sd_status sd_chat_format_qwen25(strbuf *out, const char *default_system, const sd_chat_msg *m, size_t n,
                                const sd_chat_tools *tt, bool gen, char *err, size_t err_cap) {
    sd_status st = qwen25_system(out, default_system, m, tt ? tt->tools : NULL, err, err_cap);
    for (size_t i = 0; i < n && st == SD_OK; i++) {
        const char *calls = tt && tt->tool_calls ? tt->tool_calls[i] : NULL;
        size_t at = 0, vf, vt;
        if (calls && sd_chat_json_item(calls, strlen(calls), &at, &vf, &vt) == 0) calls = NULL; /* [] is false */
        bool is_tool = !strcmp(m[i].role, "tool");
        if (!strcmp(m[i].role, "user") || (!strcmp(m[i].role, "system") && i > 0) ||
            (!strcmp(m[i].role, "assistant") && !calls)) {
            sd_sb_add(out, "<|im_start|>");
            sd_sb_add(out, m[i].role);
            sd_sb_add(out, "\n");
            sd_sb_content(out, m[i].content, strlen(m[i].content));
            sd_sb_add(out, "<|im_end|>\n");
        } else if (!strcmp(m[i].role, "assistant")) {
            st = qwen25_calls(out, m[i].content, calls, i, err, err_cap);
        } else if (is_tool) {
            if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) sd_sb_add(out, "<|im_start|>user");
            sd_sb_add(out, "\n<tool_response>\n");
            sd_sb_content(out, m[i].content, strlen(m[i].content));
            sd_sb_add(out, "\n</tool_response>");
            if (i + 1 == n || strcmp(m[i + 1].role, "tool") != 0) sd_sb_add(out, "<|im_end|>\n");
        }
    }
    if (st == SD_OK && gen) sd_sb_add(out, "<|im_start|>assistant\n");
    return st;
}

/* ---- Hermes text (Qwen 2.5's form, compact JSON), for the other families ---- */

/* The system text describing tools (a JSON list), malloc'd; NULL when it is not a list. */
static char *hermes_tools(const char *tools) {
    cJSON *list = cJSON_Parse(tools);
    strbuf b = {0};
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(list);
        return NULL;
    }
    sd_sb_add(&b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    const cJSON *t;
    cJSON_ArrayForEach(t, list) {
        char *s = cJSON_PrintUnformatted(t);
        sd_sb_add(&b, "\n");
        if (s) sd_sb_add(&b, s);
        b.failed = b.failed || !s;
        free(s);
    }
    sd_sb_add(&b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                  "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                  "\"arguments\": <args-json-object>}\n</tool_call>");
    cJSON_Delete(list);
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* content followed by each call of calls (a JSON list) as a <tool_call> block, malloc'd. */
static char *hermes_calls(const char *content, const char *calls) {
    cJSON *list = cJSON_Parse(calls);
    strbuf b = {0};
    sd_sb_add(&b, content);
    b.failed = b.failed || !cJSON_IsArray(list);
    const cJSON *c;
    cJSON_ArrayForEach(c, list) {
        const cJSON *name = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "name") : NULL;
        const cJSON *args = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "arguments") : NULL;
        cJSON *o = cJSON_CreateObject();
        char *s = NULL;
        if (o && cJSON_IsString(name) && args && cJSON_AddStringToObject(o, "name", name->valuestring) &&
            cJSON_AddItemToObject(o, "arguments", cJSON_Duplicate(args, true)))
            s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (b.len) sd_sb_add(&b, "\n");
        sd_sb_add(&b, "<tool_call>\n");
        if (s) sd_sb_add(&b, s);
        sd_sb_add(&b, "\n</tool_call>");
        b.failed = b.failed || !s;
        free(s);
    }
    cJSON_Delete(list);
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

void sd_chat_hermes_free(sd_chat_msg **out, char ***owned, size_t n_out) {
    if (owned && *owned)
        for (size_t i = 0; i < n_out; i++) free((*owned)[i]);
    if (owned) free(*owned), *owned = NULL;
    if (out) free(*out), *out = NULL;
}

sd_status sd_chat_hermes(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt, sd_chat_msg **out, size_t *n_out,
                         char ***owned, char *err, size_t err_cap) {
    const char *tools = tt ? tt->tools : NULL;
    size_t extra = tools && !(n > 0 && !strcmp(m[0].role, "system")) ? 1 : 0;
    *n_out = n + extra;
    *out = calloc(*n_out, sizeof **out);
    *owned = calloc(*n_out, sizeof **owned); /* owned[i]: the text of (*out)[i] when it was rewritten */
    if (!*out || !*owned) {
        sd_chat_hermes_free(out, owned, *n_out);
        return SD_ERR_NOMEM;
    }
    char *desc = tools ? hermes_tools(tools) : NULL;
    if (tools && !desc) {
        sd_chat_hermes_free(out, owned, *n_out);
        return refuse(err, err_cap, "tools: not a JSON list");
    }
    if (extra) {
        (*out)[0] = (sd_chat_msg){"system", desc};
        (*owned)[0] = desc;
    }
    size_t bad = n; /* the message whose calls are not a JSON list of calls (n: none, out of memory) */
    for (size_t i = 0; i < n; i++) {
        sd_chat_msg *o = &(*out)[i + extra];
        const char *calls = tt && tt->tool_calls ? tt->tool_calls[i] : NULL;
        char *text = NULL;
        *o = m[i];
        if (i == 0 && desc && !extra) {
            strbuf b = {0};
            sd_sb_add(&b, m[0].content);
            sd_sb_add(&b, "\n\n");
            sd_sb_add(&b, desc);
            free(desc);
            text = b.failed ? (free(b.data), NULL) : b.data;
            if (!text) break;
        } else if (calls) {
            if (!(text = hermes_calls(m[i].content, calls))) {
                bad = i;
                break;
            }
        } else if (!strcmp(m[i].role, "tool")) {
            strbuf b = {0};
            sd_sb_add(&b, "<tool_response>\n");
            sd_sb_add(&b, m[i].content);
            sd_sb_add(&b, "\n</tool_response>");
            if (!(text = b.failed ? (free(b.data), NULL) : b.data)) break;
            o->role = "user";
        }
        if (text) o->content = (*owned)[i + extra] = text;
        if (i + 1 == n) return SD_OK;
    }
    sd_chat_hermes_free(out, owned, *n_out);
    if (bad == n) return SD_ERR_NOMEM;
    if (err_cap)
        snprintf(err, err_cap, "messages[%zu].tool_calls: not a JSON list of {\"name\": ..., \"arguments\": ...}", bad);
    return SD_ERR_INVALID_ARG;
}
