/* chat_json.c — JSON as chat templates write it (issue 35): transformers'
 * tojson filter, json.dumps(x, ensure_ascii=False, indent=...): keys in
 * their order, separators ", " / ": " (",\n" + indent with one), strings
 * with only '"', '\\' and control characters escaped (sd_json_quote's
 * escapes: one function for both), integers as written and floats as
 * Python's repr. sd_chat_pyjson re-serialises the client's JSON text so:
 * one pass over the text, a recursive descent bounded to 64 levels. The
 * walkers (sd_chat_json_item, _member, _string) let the renderers take a
 * list or an object apart without losing the text of its values. */
#include "chat_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JSON_DEPTH 64

typedef struct jp {
    const char *s;
    size_t len, at;
    strbuf *b; /* NULL: only checked */
    int indent;
    bool raw; /* strings decoded, without quotes (a key, a value used as text) */
} jp;

static void jp_put(jp *p, const char *s, size_t n) {
    if (p->b) sd_sb_content(p->b, s, n);
}

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
    sd_sb_addn(b, u, n);
}

/* The escape at p->at ('\\') decoded into d. */
static bool jp_escape(jp *p, strbuf *d) {
    if (p->at + 1 >= p->len) return false;
    char e = p->s[p->at + 1];
    p->at += 2;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *k = e ? strchr(from, e) : NULL;
    if (k) {
        sd_sb_addn(d, to + (k - from), 1);
        return true;
    }
    int v = e == 'u' && p->at + 4 <= p->len ? hex4(p->s + p->at) : -1;
    if (v < 0) return false;
    p->at += 4;
    unsigned cp = (unsigned)v;
    if (cp >= 0xdc00 && cp < 0xe000) return false; /* a lone low surrogate */
    if (cp >= 0xd800 && cp < 0xdc00) {
        int lo = p->at + 6 <= p->len && p->s[p->at] == '\\' && p->s[p->at + 1] == 'u' ? hex4(p->s + p->at + 2) : -1;
        if (lo < 0xdc00 || lo >= 0xe000) return false;
        p->at += 6;
        cp = 0x10000 + ((cp - 0xd800) << 10) + ((unsigned)lo - 0xdc00);
    }
    put_cp(d, cp);
    return true;
}

/* A string at p->at ('"'): decoded, then written as json.dumps(ensure_ascii=
 * False) does (sd_json_quote: the text is UTF-8, checked by the caller), or
 * as it is when p->raw. */
static bool jp_string(jp *p) {
    strbuf d = {0};
    bool ok = false;
    p->at++;
    while (p->at < p->len) {
        unsigned char c = (unsigned char)p->s[p->at];
        if (c == '"') {
            p->at++;
            ok = !d.failed;
            break;
        }
        if (c < 0x20) break; /* raw control characters are not JSON */
        if (c == '\\') {
            if (!jp_escape(p, &d)) break;
            continue;
        }
        size_t k = 1; /* a raw UTF-8 character */
        while (p->at + k < p->len && ((unsigned char)p->s[p->at + k] & 0xc0) == 0x80) k++;
        sd_sb_addn(&d, p->s + p->at, k);
        p->at += k;
    }
    if (ok && p->b && p->raw) {
        jp_put(p, d.data ? d.data : "", d.len);
    } else if (ok && p->b) {
        sd_chat_pystr(p->b, d.data ? d.data : "", d.len);
    }
    free(d.data);
    return ok;
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
        if (!strcmp(num, "-0")) return jp_put(p, "0", 1), true;
        jp_put(p, num, n);
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
    jp_put(p, out, o);
    return true;
}

static void jp_newline(jp *p, int depth) {
    jp_put(p, "\n", 1);
    for (int i = 0; i < depth * p->indent; i++) jp_put(p, " ", 1);
}

static bool jp_value(jp *p, int depth);

/* An object or a list at p->at. */
static bool jp_container(jp *p, int depth) {
    bool obj = p->s[p->at] == '{';
    char close = obj ? '}' : ']';
    p->at++;
    jp_put(p, obj ? "{" : "[", 1);
    jp_ws(p);
    if (p->at < p->len && p->s[p->at] == close) {
        p->at++;
        jp_put(p, obj ? "}" : "]", 1);
        return true;
    }
    for (bool first = true;; first = false) {
        if (!first) jp_put(p, p->indent ? "," : ", ", p->indent ? 1 : 2);
        if (p->indent) jp_newline(p, depth + 1);
        jp_ws(p);
        if (obj) {
            if (p->at >= p->len || p->s[p->at] != '"' || !jp_string(p)) return false;
            jp_ws(p);
            if (p->at >= p->len || p->s[p->at] != ':') return false;
            p->at++;
            jp_put(p, ": ", 2);
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
        jp_put(p, obj ? "}" : "]", 1);
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
            jp_put(p, lit[i], n);
            return true;
        }
    }
    return jp_number(p);
}

bool sd_chat_pyjson(strbuf *b, const char *text, size_t len, int indent) {
    jp p = {text, len, 0, b, indent, false};
    if (!text || !jp_value(&p, 0)) return false;
    jp_ws(&p);
    return p.at == len;
}

void sd_chat_pystr(strbuf *b, const char *s, size_t n) {
    char *q = sd_json_quote(s, n);
    if (!q) {
        b->failed = true;
        return;
    }
    sd_sb_content(b, q, strlen(q));
    free(q);
}

bool sd_chat_json_string(strbuf *b, const char *text, size_t len) {
    jp p = {text, len, 0, b, 0, true};
    jp_ws(&p);
    if (p.at >= len || text[p.at] != '"' || !jp_string(&p)) return false;
    jp_ws(&p);
    return p.at == len;
}

/* The next entry of the list or object at text (open '[' or '{'): *at 0
 * before the first; key (objects) gets the entry's key decoded. */
static int next_entry(const char *text, size_t len, size_t *at, char open, strbuf *key, size_t *vf, size_t *vt) {
    jp p = {text, len, *at, NULL, 0, false};
    char close = open == '[' ? ']' : '}';
    jp_ws(&p);
    if (*at == 0) {
        if (p.at >= len || text[p.at] != open) return -1;
        p.at++;
        jp_ws(&p);
    }
    if (p.at < len && text[p.at] == close) {
        p.at++;
        jp_ws(&p);
        *at = p.at;
        return p.at == len ? 0 : -1;
    }
    if (*at != 0) {
        if (p.at >= len || text[p.at] != ',') return -1;
        p.at++;
        jp_ws(&p);
    }
    if (key) {
        jp k = {text, len, p.at, key, 0, true};
        key->len = 0;
        if (p.at >= len || text[p.at] != '"' || !jp_string(&k)) return -1;
        p.at = k.at;
        jp_ws(&p);
        if (p.at >= len || text[p.at] != ':') return -1;
        p.at++;
        jp_ws(&p);
    }
    *vf = p.at;
    if (!jp_value(&p, 1)) return -1;
    *vt = p.at;
    jp_ws(&p);
    *at = p.at;
    return 1;
}

int sd_chat_json_item(const char *text, size_t len, size_t *at, size_t *vf, size_t *vt) {
    return next_entry(text, len, at, '[', NULL, vf, vt);
}

int sd_chat_json_member(const char *text, size_t len, size_t *at, strbuf *key, size_t *vf, size_t *vt) {
    return next_entry(text, len, at, '{', key, vf, vt);
}

bool sd_chat_json_find(const char *text, size_t len, const char *key, size_t *vf, size_t *vt) {
    strbuf k = {0};
    size_t at = 0, f, t;
    bool found = false;
    int r;
    while ((r = sd_chat_json_member(text, len, &at, &k, &f, &t)) == 1)
        if (k.len == strlen(key) && !memcmp(k.data, key, k.len)) { /* the last one wins, as in Python's dict */
            *vf = f;
            *vt = t;
            found = true;
        }
    free(k.data);
    free(k.mask);
    return found && r == 0;
}
