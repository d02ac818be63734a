/* chat_tools.c — tools in a conversation, rendered as the model's chat
 * template does (issue 35; see sd_chat_tools in specd/chat.h).
 *
 * Llama 3.1's template writes JSON with transformers' tojson filter,
 * json.dumps(x, ensure_ascii=False, indent=...): keys in their order,
 * separators ", " / ": " (",\n" + indent with one), strings with only '"',
 * '\\' and control characters escaped, integers as written and floats as
 * Python's repr. sd_chat_pyjson re-serialises the client's JSON text so:
 * one pass over the text, a recursive descent bounded to 64 levels.
 *
 * Families whose template has no tools get the Hermes / Qwen 2.5 text the
 * gateway wrote before tools moved here (sd_chat_hermes): it works with any
 * instruct model and Qwen renders exactly this. */
#include "chat_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JSON_DEPTH 64

typedef struct jp {
    const char *s;
    size_t len, at;
    strbuf *b;
    int indent;
} jp;

static void jp_ws(jp *p) {
    while (p->at < p->len && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' || p->s[p->at] == '\r'))
        p->at++;
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static void put_cp(strbuf *b, unsigned cp) {
    char u[8];
    size_t n = 0;
    if (cp < 0x80) {
        u[n++] = (char)cp;
    } else if (cp < 0x800) {
        u[n++] = (char)(0xc0 | (cp >> 6));
        u[n++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        u[n++] = (char)(0xe0 | (cp >> 12));
        u[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[n++] = (char)(0x80 | (cp & 0x3f));
    } else {
        u[n++] = (char)(0xf0 | (cp >> 18));
        u[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[n++] = (char)(0x80 | (cp & 0x3f));
    }
    sd_sb_content(b, u, n);
}

/* A string at p->at ('"'), written as json.dumps(ensure_ascii=False) does. */
static bool jp_string(jp *p) {
    static const char hexd[] = "0123456789abcdef";
    p->at++;
    sd_sb_content(p->b, "\"", 1);
    while (p->at < p->len) {
        unsigned char c = (unsigned char)p->s[p->at];
        if (c == '"') {
            p->at++;
            sd_sb_content(p->b, "\"", 1);
            return true;
        }
        if (c < 0x20) return false; /* raw control characters are not JSON */
        unsigned cp = c;
        if (c == '\\') {
            if (p->at + 1 >= p->len) return false;
            char e = p->s[p->at + 1];
            p->at += 2;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u': {
                int v = p->at + 4 <= p->len ? hex4(p->s + p->at) : -1;
                if (v < 0) return false;
                p->at += 4;
                cp = (unsigned)v;
                if (cp >= 0xdc00 && cp < 0xe000) return false; /* a lone low surrogate */
                if (cp >= 0xd800 && cp < 0xdc00) {
                    int lo = p->at + 6 <= p->len && p->s[p->at] == '\\' && p->s[p->at + 1] == 'u'
                                 ? hex4(p->s + p->at + 2)
                                 : -1;
                    if (lo < 0xdc00 || lo >= 0xe000) return false;
                    p->at += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + ((unsigned)lo - 0xdc00);
                }
                break;
            }
            default: return false;
            }
        } else {
            size_t k = 1; /* a raw UTF-8 character (the caller checked the text is UTF-8) */
            while (p->at + k < p->len && ((unsigned char)p->s[p->at + k] & 0xc0) == 0x80) k++;
            sd_sb_content(p->b, p->s + p->at, k);
            p->at += k;
            continue;
        }
        char esc[8] = {'\\', 0};
        switch (cp) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            if (cp < 0x20) {
                memcpy(esc + 1, "u00", 3);
                esc[4] = hexd[cp >> 4];
                esc[5] = hexd[cp & 15];
                sd_sb_content(p->b, esc, 6);
            } else {
                put_cp(p->b, cp);
            }
            continue;
        }
        sd_sb_content(p->b, esc, 2);
    }
    return false;
}

/* A number at p->at: an integer as written ("-0" as "0"), a float as
 * Python's repr. */
static bool jp_number(jp *p) {
    size_t from = p->at;
    bool is_float = false;
    if (p->at < p->len && p->s[p->at] == '-') p->at++;
    size_t digits = p->at;
    while (p->at < p->len && strchr("0123456789.eE+-", p->s[p->at])) {
        if (strchr(".eE", p->s[p->at])) is_float = true;
        p->at++;
    }
    size_t n = p->at - from;
    if (n == 0 || n > 64 || p->at == digits || p->s[digits] < '0' || p->s[digits] > '9') return false;
    char num[72];
    memcpy(num, p->s + from, n);
    num[n] = '\0';
    if (!is_float) {
        if (n - (digits - from) > 1 && num[digits - from] == '0') return false; /* leading zeros are not JSON */
        if (!strcmp(num, "-0")) return sd_sb_content(p->b, "0", 1), true;
        sd_sb_content(p->b, num, n);
        return true;
    }
    char *end;
    double v = strtod(num, &end);
    if (*end || !isfinite(v)) return false;
    char sci[40];
    for (int prec = 0; prec < 17; prec++) { /* the shortest digits that read back as v */
        snprintf(sci, sizeof sci, "%.*e", prec, v);
        if (strtod(sci, NULL) == v) break;
    }
    char dig[24], out[64];
    size_t nd = 0, o = 0;
    const char *q = sci;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    int x = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) out[o++] = '-';
    if (x >= -4 && x < 16) {
        if (x < 0) {
            o += (size_t)snprintf(out + o, sizeof out - o, "0.%.*s%.*s", -x - 1, "0000", (int)nd, dig);
        } else {
            for (int i = 0; i <= x; i++) out[o++] = (size_t)i < nd ? dig[i] : '0';
            out[o++] = '.';
            if (nd > (size_t)x + 1)
                for (size_t i = (size_t)x + 1; i < nd; i++) out[o++] = dig[i];
            else
                out[o++] = '0';
        }
    } else {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++) out[o++] = dig[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", x < 0 ? '-' : '+', abs(x));
    }
    sd_sb_content(p->b, out, o);
    return true;
}

static void jp_newline(jp *p, int depth) {
    sd_sb_content(p->b, "\n", 1);
    for (int i = 0; i < depth * p->indent; i++) sd_sb_content(p->b, " ", 1);
}

static bool jp_value(jp *p, int depth);

/* An object or a list at p->at. */
static bool jp_container(jp *p, int depth) {
    bool obj = p->s[p->at] == '{';
    char close = obj ? '}' : ']';
    p->at++;
    sd_sb_content(p->b, obj ? "{" : "[", 1);
    jp_ws(p);
    if (p->at < p->len && p->s[p->at] == close) {
        p->at++;
        sd_sb_content(p->b, obj ? "}" : "]", 1);
        return true;
    }
    for (bool first = true;; first = false) {
        if (!first) sd_sb_content(p->b, p->indent ? "," : ", ", p->indent ? 1 : 2);
        if (p->indent) jp_newline(p, depth + 1);
        jp_ws(p);
        if (obj) {
            if (p->at >= p->len || p->s[p->at] != '"' || !jp_string(p)) return false;
            jp_ws(p);
            if (p->at >= p->len || p->s[p->at] != ':') return false;
            p->at++;
            sd_sb_content(p->b, ": ", 2);
        }
        if (!jp_value(p, depth + 1)) return false;
        jp_ws(p);
        if (p->at < p->len && p->s[p->at] == ',') {
            p->at++;
            continue;
        }
        if (p->at >= p->len || p->s[p->at] != close) return false;
        p->at++;
        if (p->indent) jp_newline(p, depth);
        sd_sb_content(p->b, obj ? "}" : "]", 1);
        return true;
    }
}

static bool jp_value(jp *p, int depth) {
    if (depth > MAX_JSON_DEPTH) return false;
    jp_ws(p);
    if (p->at >= p->len) return false;
    char c = p->s[p->at];
    if (c == '{' || c == '[') return jp_container(p, depth);
    if (c == '"') return jp_string(p);
    static const char *const lit[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lit[i]);
        if (p->len - p->at >= n && !memcmp(p->s + p->at, lit[i], n)) {
            p->at += n;
            sd_sb_content(p->b, lit[i], n);
            return true;
        }
    }
    return jp_number(p);
}

bool sd_chat_pyjson(strbuf *b, const char *text, size_t len, int indent) {
    jp p = {text, len, 0, b, indent};
    if (!text || !jp_value(&p, 0)) return false;
    jp_ws(&p);
    return p.at == len;
}

bool sd_chat_has_tools(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt) {
    if (tt && tt->tools) return true;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m[i].role, "tool") || (tt && tt->tool_calls && tt->tool_calls[i])) return true;
    return false;
}

/* s (n bytes of UTF-8) as a JSON string, json.dumps(ensure_ascii=False). */
static void py_str(strbuf *b, const char *s, size_t n) {
    static const char hexd[] = "0123456789abcdef";
    sd_sb_content(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8] = {'\\', 0};
        size_t k = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            if (c >= 0x20) {
                sd_sb_content(b, s + i, 1);
                continue;
            }
            memcpy(esc + 1, "u00", 3);
            esc[4] = hexd[c >> 4];
            esc[5] = hexd[c & 15];
            k = 6;
        }
        sd_sb_content(b, esc, k);
    }
    sd_sb_content(b, "\"", 1);
}

static sd_status refuse(char *err, size_t err_cap, const char *msg) {
    if (err_cap) snprintf(err, err_cap, "%s", msg);
    return SD_ERR_INVALID_ARG;
}

/* Each element of the JSON list text, tojson(indent=4) + "\n\n". */
static bool llama31_tools(strbuf *out, const char *text) {
    jp p = {text, strlen(text), 0, out, 4};
    jp_ws(&p);
    if (p.at >= p.len || text[p.at] != '[') return false;
    p.at++;
    jp_ws(&p);
    if (p.at < p.len && text[p.at] == ']') return (p.at++, jp_ws(&p), p.at == p.len);
    for (;;) {
        if (!jp_value(&p, 0)) return false;
        sd_sb_add(out, "\n\n");
        jp_ws(&p);
        if (p.at < p.len && text[p.at] == ',') {
            p.at++;
            continue;
        }
        if (p.at >= p.len || text[p.at] != ']') return false;
        p.at++;
        jp_ws(&p);
        return p.at == p.len;
    }
}

/* The text span [*vf, *vt) of member key of the object at text[at] (a
 * value that is not an object: not found). */
static bool member_span(const char *text, size_t len, size_t at, const char *key, size_t *vf, size_t *vt) {
    strbuf scratch = {0};
    jp p = {text, len, at, &scratch, 0};
    bool found = false;
    jp_ws(&p);
    if (p.at >= len || text[p.at] != '{') return false;
    p.at++;
    for (;;) {
        jp_ws(&p);
        if (p.at >= len || text[p.at] != '"') break;
        scratch.len = 0;
        if (!jp_string(&p)) break;
        bool match = scratch.data && scratch.len == strlen(key) + 2 && !memcmp(scratch.data + 1, key, strlen(key));
        jp_ws(&p);
        if (p.at >= len || text[p.at] != ':') break;
        p.at++;
        jp_ws(&p);
        size_t from = p.at;
        if (!jp_value(&p, 1)) break;
        if (match) {
            *vf = from;
            *vt = p.at;
            found = true;
        }
        jp_ws(&p);
        if (p.at < len && text[p.at] == ',') {
            p.at++;
            continue;
        }
        break;
    }
    free(scratch.data);
    free(scratch.mask);
    return found;
}

/* The one call of calls (a JSON list) as Llama 3.1 writes it:
 * {"name": "N", "parameters": tojson(arguments)} (the arguments' own text
 * re-serialised, so 2.0 stays 2.0). */
static sd_status llama31_call(strbuf *out, const char *calls, char *err, size_t err_cap) {
    cJSON *list = cJSON_Parse(calls);
    const cJSON *c = cJSON_IsArray(list) ? list->child : NULL;
    const cJSON *name = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "name") : NULL;
    size_t len = strlen(calls), at = 0, vf = 0, vt = 0;
    while (at < len && calls[at] != '[') at++;
    sd_status st = SD_OK;
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != 1)
        st = refuse(err, err_cap,
                    "the model's chat template (llama3.1) takes one tool call per assistant turn "
                    "(\"This model only supports single tool-calls at once!\")");
    else if (!cJSON_IsString(name) || !member_span(calls, len, at + 1, "arguments", &vf, &vt))
        st = refuse(err, err_cap, "a tool call needs a 'name' string and 'arguments'");
    if (st == SD_OK) {
        sd_sb_add(out, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
        sd_sb_content(out, name->valuestring, strlen(name->valuestring));
        sd_sb_add(out, "\", \"parameters\": ");
        if (!sd_chat_pyjson(out, calls + vf, vt - vf, 0))
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
            py_str(out, m[i].content, strlen(m[i].content)); /* a string is iterable: tojson */
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

/* ---- Hermes / Qwen 2.5 text, for the other families ---- */

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
