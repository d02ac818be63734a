/* regex.c — regular expressions translated to GBNF (and the text buffer
 * the translators share).
 *
 * The translation is syntax-directed: a literal becomes a one-character
 * class, [classes] become classes (their ranges computed here, so \d \w \s
 * and negation are exact), groups become GBNF groups and quantifiers stay
 * quantifiers. The GBNF parser then rewrites repetition into rules, and
 * the pushdown matcher runs the result as an NFA: no input can make it
 * backtrack. What is not a regular language (back-references,
 * look-around) or depends on context (\b, ^ / $ inside the pattern) is
 * refused with its construct named. The grammar parser's limits (repeat
 * counts, elements, nesting) bound the size of what a pattern expands to.
 *
 * For a JSON Schema "pattern" (json_string) every class is intersected with
 * the characters a JSON string holds unescaped (no '"', '\\' or control
 * character), so the generated text is the string's value as it is; and
 * the pattern is a search, not a full match: a side without its anchor is
 * extended by any run of such characters. */
#include "constrain_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- g_buf ---- */

void g_buf_add(g_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void g_buf_puts(g_buf *b, const char *s) { g_buf_add(b, s, strlen(s)); }

void g_buf_printf(g_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        g_buf_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    g_buf_add(b, big, (size_t)n);
    free(big);
}

void g_buf_escape_cp(g_buf *b, uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) {
        char c = (char)cp;
        g_buf_add(b, &c, 1);
    } else if (cp < 0x100) {
        g_buf_printf(b, "\\x%02X", cp);
    } else if (cp < 0x10000) {
        g_buf_printf(b, "\\u%04X", cp);
    } else {
        g_buf_printf(b, "\\U%08X", cp);
    }
}

/* ---- the regex translator ---- */

#define MAX_CP 0x10FFFFu

typedef struct rx {
    const char *p, *end;
    bool json;
    int depth, max_depth;
    char *err;
    size_t err_cap;
    sd_status status;
    bool failed;
    g_buf *out;
} rx;

static bool rfail(rx *r, sd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool rfail(rx *r, sd_status st, const char *fmt, ...) {
    if (r->failed) return false;
    r->failed = true;
    r->status = st;
    va_list ap;
    va_start(ap, fmt);
    if (r->err_cap) vsnprintf(r->err, r->err_cap, fmt, ap);
    va_end(ap);
    return false;
}

#define MAX_CLASS_RANGES 256 /* ranges written in one class (negation and JSON need room for ~2x) */

typedef struct ranges {
    g_range r[2 * MAX_CLASS_RANGES + 8];
    int n;
} ranges;

static bool add_range(rx *r, ranges *rs, uint32_t lo, uint32_t hi) {
    if (rs->n >= MAX_CLASS_RANGES) return rfail(r, SD_ERR_RANGE, "a class with too many ranges");
    rs->r[rs->n++] = (g_range){lo, hi};
    return true;
}

static int cmp_lo(const void *a, const void *b) {
    const g_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges rs; negates it when asked; intersects with the JSON
 * string characters in json mode. */
static void normalize(rx *r, ranges *rs, bool negate) {
    qsort(rs->r, (size_t)rs->n, sizeof rs->r[0], cmp_lo);
    int m = 0;
    for (int i = 0; i < rs->n; i++) {
        if (m && rs->r[i].lo <= rs->r[m - 1].hi + 1) {
            if (rs->r[i].hi > rs->r[m - 1].hi) rs->r[m - 1].hi = rs->r[i].hi;
        } else {
            rs->r[m++] = rs->r[i];
        }
    }
    rs->n = m;
    if (negate || r->json) {
        /* the complement of (negate ? rs : not-rs) union the excluded set */
        ranges ex = {.n = 0};
        if (r->json) {
            ex.r[ex.n++] = (g_range){0, 0x1F};
            ex.r[ex.n++] = (g_range){'"', '"'};
            ex.r[ex.n++] = (g_range){'\\', '\\'};
        }
        ranges keep = {.n = 0};
        if (negate) {
            for (int i = 0; i < rs->n; i++) ex.r[ex.n++] = rs->r[i];
        } else { /* keep rs minus ex: the complement of (not rs) union ex */
            uint32_t next = 0;
            for (int i = 0; i < rs->n; i++) {
                if (rs->r[i].lo > next) ex.r[ex.n++] = (g_range){next, rs->r[i].lo - 1};
                next = rs->r[i].hi + 1;
            }
            if (next <= MAX_CP) ex.r[ex.n++] = (g_range){next, MAX_CP};
        }
        qsort(ex.r, (size_t)ex.n, sizeof ex.r[0], cmp_lo);
        uint32_t next = 0;
        for (int i = 0; i < ex.n; i++) {
            if (ex.r[i].lo > next) keep.r[keep.n++] = (g_range){next, ex.r[i].lo - 1};
            if (ex.r[i].hi + 1 > next) next = ex.r[i].hi + 1;
        }
        if (next <= MAX_CP) keep.r[keep.n++] = (g_range){next, MAX_CP};
        *rs = keep;
    }
}

static bool emit_class(rx *r, ranges *rs, bool negate) {
    normalize(r, rs, negate);
    if (!rs->n)
        return rfail(r, SD_ERR_UNSUPPORTED, "a class that matches no character%s",
                     r->json ? " a JSON string holds unescaped" : "");
    g_buf_puts(r->out, "[");
    for (int i = 0; i < rs->n; i++) {
        g_buf_escape_cp(r->out, rs->r[i].lo);
        if (rs->r[i].hi != rs->r[i].lo) {
            g_buf_puts(r->out, "-");
            g_buf_escape_cp(r->out, rs->r[i].hi);
        }
    }
    g_buf_puts(r->out, "] ");
    return true;
}

/* The ranges of \d \w \s (ASCII); false for other letters. */
static bool class_escape(rx *r, char e, ranges *rs) {
    switch (e) {
    case 'd': return add_range(r, rs, '0', '9');
    case 'w':
        return add_range(r, rs, '0', '9') && add_range(r, rs, 'a', 'z') && add_range(r, rs, 'A', 'Z') &&
               add_range(r, rs, '_', '_');
    case 's': return add_range(r, rs, '\t', '\r') && add_range(r, rs, ' ', ' ');
    default: return false;
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One escaped character after '\\' (not a class escape). */
static bool escaped_char(rx *r, char e, uint32_t *cp) {
    int digits = 0;
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'b':
    case 'B': return rfail(r, SD_ERR_UNSUPPORTED, "the word boundary \\%c is not supported", e);
    case 'A':
    case 'Z':
    case 'z':
    case 'G': return rfail(r, SD_ERR_UNSUPPORTED, "the anchor \\%c is not supported", e);
    case 'p':
    case 'P':
    case 'k':
    case 'N': return rfail(r, SD_ERR_UNSUPPORTED, "the escape \\%c is not supported", e);
    default:
        if (e >= '1' && e <= '9') return rfail(r, SD_ERR_UNSUPPORTED, "back-references (\\%c) are not supported", e);
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return rfail(r, SD_ERR_UNSUPPORTED, "unknown escape \\%c", e);
        *cp = (unsigned char)e;
        return true;
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int d = r->p < r->end ? hexval(*r->p) : -1;
        if (d < 0) return rfail(r, SD_ERR_FORMAT, "\\%c needs %d hex digits", e, digits);
        v = v * 16 + (uint32_t)d;
        r->p++;
    }
    *cp = v;
    return true;
}

/* One literal character (UTF-8). */
static bool utf8_char(rx *r, uint32_t *cp) {
    unsigned char c = (unsigned char)*r->p++;
    int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (n < 0) return rfail(r, SD_ERR_FORMAT, "the pattern is not valid UTF-8");
    uint32_t v = n ? c & (0x3Fu >> n) : c;
    for (int i = 0; i < n; i++) {
        if (r->p >= r->end || ((unsigned char)*r->p & 0xC0) != 0x80)
            return rfail(r, SD_ERR_FORMAT, "the pattern is not valid UTF-8");
        v = (v << 6) | ((unsigned char)*r->p++ & 0x3F);
    }
    *cp = v;
    return true;
}

static bool parse_bracket(rx *r) {
    r->p++; /* '[' */
    bool negate = r->p < r->end && *r->p == '^';
    if (negate) r->p++;
    ranges rs = {.n = 0};
    bool first = true;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        uint32_t lo;
        if (*r->p == '\\') {
            if (++r->p >= r->end) return rfail(r, SD_ERR_FORMAT, "the pattern ends after a backslash");
            char e = *r->p++;
            if (e == 'd' || e == 'w' || e == 's') {
                if (!class_escape(r, e, &rs)) return false;
                continue;
            }
            if (e == 'D' || e == 'W' || e == 'S')
                return rfail(r, SD_ERR_UNSUPPORTED, "\\%c inside a [class] is not supported", e);
            if (e == 'b') {
                lo = '\b';
            } else if (!escaped_char(r, e, &lo)) {
                return false;
            }
        } else if (!utf8_char(r, &lo)) {
            return false;
        }
        uint32_t hi = lo;
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if (r->p >= r->end || !escaped_char(r, *r->p++, &hi)) return rfail(r, SD_ERR_FORMAT, "a bad range end");
            } else if (!utf8_char(r, &hi)) {
                return false;
            }
            if (hi < lo) return rfail(r, SD_ERR_FORMAT, "a class range runs backwards");
        }
        if (!add_range(r, &rs, lo, hi)) return false;
    }
    if (r->p >= r->end) return rfail(r, SD_ERR_FORMAT, "a '[' is not closed");
    r->p++;
    return emit_class(r, &rs, negate);
}

static bool parse_alt(rx *r);

/* A quantifier after an atom, copied to GBNF; false without one. */
static bool quantifier(rx *r, char *q, size_t cap) {
    if (r->p >= r->end) return false;
    char c = *r->p;
    if (c == '{') { /* {m} {m,} {m,n} {,n}: else Python reads a literal '{' */
        const char *s = r->p + 1, *m0 = s;
        while (s < r->end && *s >= '0' && *s <= '9') s++;
        size_t m_len = (size_t)(s - m0), n_len = 0;
        bool comma = s < r->end && *s == ',';
        const char *n0 = s + comma;
        if (comma) {
            s++;
            while (s < r->end && *s >= '0' && *s <= '9') s++;
            n_len = (size_t)(s - n0);
        }
        if (s >= r->end || *s != '}' || (!m_len && !n_len) || m_len > 9 || n_len > 9) return false;
        snprintf(q, cap, "{%.*s%s%.*s}", m_len ? (int)m_len : 1, m_len ? m0 : "0", comma ? "," : "", (int)n_len, n0);
        r->p = s + 1;
        if (r->p < r->end && *r->p == '?') r->p++; /* lazy: the same language */
        return true;
    }
    if (c != '*' && c != '+' && c != '?') return false;
    memcpy(q, r->p, 1);
    q[1] = '\0';
    r->p += 1;
    if (r->p < r->end && *r->p == '?') r->p++; /* lazy: the same language */
    return true;
}

static bool parse_seq(rx *r) {
    bool any = false;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        char c = *r->p;
        size_t mark = r->out->len;
        g_buf_puts(r->out, "( ");
        bool ok;
        if (c == '(') {
            r->p++;
            if (r->p < r->end && *r->p == '?') {
                if (r->end - r->p >= 2 && r->p[1] == ':')
                    r->p += 2;
                else
                    return rfail(r, SD_ERR_UNSUPPORTED, "look-around and inline flags '(?' are not supported");
            }
            if (++r->depth > r->max_depth) return rfail(r, SD_ERR_RANGE, "groups nested deeper than %d", r->max_depth);
            ok = parse_alt(r);
            r->depth--;
            if (ok && !(r->p < r->end && *r->p == ')')) ok = rfail(r, SD_ERR_FORMAT, "a '(' is not closed");
            if (ok) r->p++;
        } else if (c == '[') {
            ok = parse_bracket(r);
        } else if (c == '.') {
            r->p++;
            ranges rs = {.n = 1, .r = {{'\n', '\n'}}};
            ok = emit_class(r, &rs, true);
        } else if (c == '*' || c == '+' || c == '?' || (c == '{' && quantifier(r, (char[4]){0}, 4))) {
            return rfail(r, SD_ERR_FORMAT, "'%c' has nothing to repeat", c);
        } else if (c == '^' || c == '$') {
            return rfail(r, SD_ERR_UNSUPPORTED, "the anchor '%c' is supported only at the pattern's ends", c);
        } else {
            uint32_t cp;
            ranges rs = {.n = 0};
            if (c == '\\') {
                if (++r->p >= r->end) return rfail(r, SD_ERR_FORMAT, "the pattern ends after a backslash");
                char e = *r->p++;
                bool neg = e == 'D' || e == 'W' || e == 'S';
                if (class_escape(r, neg ? (char)(e + 32) : e, &rs)) {
                    ok = emit_class(r, &rs, neg);
                } else {
                    ok =
                        !r->failed && escaped_char(r, e, &cp) && add_range(r, &rs, cp, cp) && emit_class(r, &rs, false);
                }
            } else {
                ok = utf8_char(r, &cp) && add_range(r, &rs, cp, cp) && emit_class(r, &rs, false);
            }
        }
        if (!ok) return false;
        g_buf_puts(r->out, ")");
        char q[32];
        if (quantifier(r, q, sizeof q)) g_buf_puts(r->out, q);
        g_buf_puts(r->out, " ");
        (void)mark;
        any = true;
    }
    if (!any) g_buf_puts(r->out, "\"\" ");
    return true;
}

static bool parse_alt(rx *r) {
    g_buf_puts(r->out, "( ");
    for (;;) {
        if (!parse_seq(r)) return false;
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            g_buf_puts(r->out, "| ");
            continue;
        }
        break;
    }
    g_buf_puts(r->out, ") ");
    return true;
}

sd_status g_regex_to_gbnf(const char *re, size_t len, const char *prefix, bool json_string,
                          const sd_constrain_limits *lim, g_buf *b, char *top, size_t top_cap, char *err,
                          size_t err_cap) {
    if (err_cap) err[0] = '\0';
    if (len > lim->max_text) {
        snprintf(err, err_cap, "the pattern is %zu bytes, at most %zu", len, lim->max_text);
        return SD_ERR_RANGE;
    }
    bool head = len && re[0] == '^';
    bool tail = len > (size_t)head && re[len - 1] == '$' && (len < 2 || re[len - 2] != '\\');
    rx r = {.p = re + head,
            .end = re + len - tail,
            .json = json_string,
            .max_depth = lim->max_depth,
            .err = err,
            .err_cap = err_cap,
            .out = b};
    snprintf(top, top_cap, "%s", prefix);
    g_buf_printf(b, "%s ::= ", prefix);
    const char *any = json_string ? "[^\"\\\\\\x00-\\x1F]* " : "";
    if (!head) g_buf_puts(b, any);
    bool ok = parse_alt(&r);
    if (ok && r.p < r.end) ok = rfail(&r, SD_ERR_FORMAT, "a ')' without its '('");
    if (!tail) g_buf_puts(b, any);
    g_buf_puts(b, "\n");
    if (b->oom) return SD_ERR_NOMEM;
    return ok ? SD_OK : r.status;
}

sd_status sd_grammar_from_regex(const char *re, size_t len, const sd_constrain_limits *lim, sd_grammar **out, char *err,
                                size_t err_cap) {
    sd_constrain_limits l = lim ? *lim : sd_constrain_default_limits();
    g_buf b = {0};
    char top[16];
    *out = NULL;
    sd_status st = g_regex_to_gbnf(re, len, "root", false, &l, &b, top, sizeof top, err, err_cap);
    if (st == SD_OK) st = sd_grammar_parse_gbnf(b.p, b.len, &l, out, err, err_cap);
    free(b.p);
    return st;
}
