/* gbnf.c — the GBNF parser: text to the rules of constrain_impl.h.
 *
 * Syntax (llama.cpp's GBNF): `name ::= alt | alt ...`, a rule ending where
 * the next `name ::=` starts or at the end; items are "strings", [classes]
 * ([^...] negated, a-z ranges), `.` (any character), rule names and
 * ( groups ), each optionally followed by * + ? {m} {m,} {m,n}; escapes
 * \n \r \t \\ \" \] \[ \- \xHH \uHHHH \UHHHHHHHH; `#` starts a comment.
 *
 * Rewriting: a multi-character string or a group becomes an anonymous
 * rule, so every item is one element; then X* becomes R ::= X R | (empty),
 * X+ is X X*, X? is R ::= X | (empty), X{m,n} is m copies of X and a chain
 * of n - m optional ones. The right recursion costs nothing at run time:
 * the matcher pushes no continuation for a reference in last position.
 *
 * Checks after parsing: every referenced rule is defined, `root` exists,
 * no rule is left recursive (the matcher would expand it forever: found
 * with the nullable rules, through the references each rule can start
 * with), and the sizes are within the limits. */
#include "constrain_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CP 0x10FFFFu

typedef struct parser {
    sd_grammar *g;
    const char *p, *end;
    int depth;
    int anon;
    char *err;
    size_t err_cap;
    bool failed;
    sd_status status;
} parser;

/* A growing element list: one alternative under construction. */
typedef struct seq {
    g_elem *e;
    int32_t n, cap;
} seq;

static bool fail(parser *ps, sd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(parser *ps, sd_status st, const char *fmt, ...) {
    if (ps->failed) return false;
    ps->failed = true;
    ps->status = st;
    va_list ap;
    va_start(ap, fmt);
    if (ps->err_cap) vsnprintf(ps->err, ps->err_cap, fmt, ap);
    va_end(ap);
    return false;
}

static bool grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static bool seq_push(parser *ps, seq *s, uint8_t type, int32_t arg) {
    if (!grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e)) return fail(ps, SD_ERR_NOMEM, "out of memory");
    s->e[s->n++] = (g_elem){type, arg};
    return true;
}

/* ---- grammar building ---- */

static uint32_t name_hash(const char *name, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)name[i]) * 16777619u;
    return h;
}

/* The rule named name[n], or -1; *slot gets its place in the name table
 * (where to insert it when absent). */
static int32_t rule_lookup(const sd_grammar *g, const char *name, size_t n, uint32_t *slot) {
    if (!g->name_cap) return -1;
    uint32_t i = name_hash(name, n) & (g->name_cap - 1);
    for (; g->name_tab[i] >= 0; i = (i + 1) & (g->name_cap - 1)) {
        const char *rn = g->rules[g->name_tab[i]].name;
        if (strlen(rn) == n && !memcmp(rn, name, n)) return g->name_tab[i];
    }
    if (slot) *slot = i;
    return -1;
}

static int32_t rule_find(const sd_grammar *g, const char *name, size_t n) { return rule_lookup(g, name, n, NULL); }

/* Keeps the name table at most half full (rehashing every rule). */
static bool names_reserve(sd_grammar *g) {
    if ((uint32_t)(g->n_rules + 1) * 2 <= g->name_cap) return true;
    uint32_t cap = g->name_cap ? g->name_cap * 2 : 256;
    int32_t *tab = malloc(cap * sizeof *tab);
    if (!tab) return false;
    memset(tab, 0xff, cap * sizeof *tab);
    for (int32_t r = 0; r < g->n_rules; r++) {
        uint32_t i = name_hash(g->rules[r].name, strlen(g->rules[r].name)) & (cap - 1);
        while (tab[i] >= 0) i = (i + 1) & (cap - 1);
        tab[i] = r;
    }
    free(g->name_tab);
    g->name_tab = tab;
    g->name_cap = cap;
    return true;
}

static int32_t rule_get(parser *ps, const char *name, size_t n) {
    sd_grammar *g = ps->g;
    int32_t r = rule_find(g, name, n);
    if (r >= 0) return r;
    if (g->n_rules >= g->limits.max_rules)
        return fail(ps, SD_ERR_RANGE, "the grammar needs more than %d rules", g->limits.max_rules), -1;
    if (!names_reserve(g) || !grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules))
        return fail(ps, SD_ERR_NOMEM, "out of memory"), -1;
    g_rule *rl = &g->rules[g->n_rules];
    memset(rl, 0, sizeof *rl);
    if (!(rl->name = malloc(n + 1))) return fail(ps, SD_ERR_NOMEM, "out of memory"), -1;
    memcpy(rl->name, name, n);
    rl->name[n] = '\0';
    uint32_t slot = 0;
    rule_lookup(g, name, n, &slot);
    g->name_tab[slot] = g->n_rules;
    return g->n_rules++;
}

static int32_t rule_anon(parser *ps) {
    char name[32];
    int n = snprintf(name, sizeof name, "~%d", ps->anon++);
    return rule_get(ps, name, (size_t)n);
}

/* Appends s (plus G_END) as an alternative of rule r. */
static bool rule_add_alt(parser *ps, int32_t r, const seq *s) {
    sd_grammar *g = ps->g;
    if (g->n_elems + s->n + 1 > g->limits.max_elems)
        return fail(ps, SD_ERR_RANGE, "the grammar needs more than %d elements", g->limits.max_elems);
    if (!grow((void **)&g->elems, &g->cap_elems, g->n_elems + s->n + 1, sizeof *g->elems))
        return fail(ps, SD_ERR_NOMEM, "out of memory");
    g_rule *rl = &g->rules[r];
    if (!grow((void **)&rl->alts, &rl->cap_alts, rl->n_alts + 1, sizeof *rl->alts))
        return fail(ps, SD_ERR_NOMEM, "out of memory");
    rl->alts[rl->n_alts++] = g->n_elems;
    if (s->n) memcpy(g->elems + g->n_elems, s->e, (size_t)s->n * sizeof *s->e);
    g->n_elems += s->n;
    g->elems[g->n_elems++] = (g_elem){G_END, 0};
    return true;
}

static int cmp_range(const void *a, const void *b) {
    const g_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Adds a class from n ranges (any order, may overlap), negated when asked. */
static int32_t class_add(parser *ps, g_range *r, int32_t n, bool negate) {
    sd_grammar *g = ps->g;
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int32_t m = 0; /* merge in place */
    for (int32_t i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    if (!grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + m + 1, sizeof *g->ranges) ||
        !grow((void **)&g->classes, &g->cap_classes, g->n_classes + 1, sizeof *g->classes))
        return fail(ps, SD_ERR_NOMEM, "out of memory"), -1;
    int32_t first = g->n_ranges;
    if (!negate) {
        memcpy(g->ranges + first, r, (size_t)m * sizeof *r);
        g->n_ranges += m;
    } else {
        uint32_t next = 0;
        for (int32_t i = 0; i < m; i++) {
            if (r[i].lo > next) g->ranges[g->n_ranges++] = (g_range){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= MAX_CP) g->ranges[g->n_ranges++] = (g_range){next, MAX_CP};
    }
    g->classes[g->n_classes] = (g_class){first, g->n_ranges - first};
    return g->n_classes++;
}

/* ---- lexing ---- */

static void skip_space(parser *ps) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            ps->p++;
        } else {
            break;
        }
    }
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t name_len(const char *p, const char *end) {
    size_t n = 0;
    while (p + n < end && is_name_char(p[n])) n++;
    return n;
}

/* True when the text at p is `name ::=` (a new rule starts). */
static bool at_rule_start(const parser *ps) {
    size_t n = name_len(ps->p, ps->end);
    if (!n) return false;
    const char *q = ps->p + n;
    while (q < ps->end && (*q == ' ' || *q == '\t')) q++;
    return ps->end - q >= 3 && !memcmp(q, "::=", 3);
}

static bool hex_value(parser *ps, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (ps->p >= ps->end) return fail(ps, SD_ERR_FORMAT, "a \\x/\\u escape ends early");
        char c = *ps->p++;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(ps, SD_ERR_FORMAT, "'%c' is not a hex digit in an escape", c);
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return true;
}

/* One character of a string or class: an escape or a UTF-8 character. */
static bool read_char(parser *ps, uint32_t *cp) {
    if (ps->p >= ps->end) return fail(ps, SD_ERR_FORMAT, "the grammar ends inside a string or class");
    unsigned char c = (unsigned char)*ps->p++;
    if (c == '\\') {
        if (ps->p >= ps->end) return fail(ps, SD_ERR_FORMAT, "the grammar ends after a backslash");
        char e = *ps->p++;
        switch (e) {
        case 'n': *cp = '\n'; return true;
        case 'r': *cp = '\r'; return true;
        case 't': *cp = '\t'; return true;
        case 'x': return hex_value(ps, 2, cp);
        case 'u': return hex_value(ps, 4, cp) && (*cp <= MAX_CP || fail(ps, SD_ERR_FORMAT, "escape out of range"));
        case 'U': return hex_value(ps, 8, cp) && (*cp <= MAX_CP || fail(ps, SD_ERR_FORMAT, "escape out of range"));
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/': *cp = (uint32_t)e; return true;
        default: return fail(ps, SD_ERR_FORMAT, "unknown escape '\\%c'", e);
        }
    }
    int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (n < 0) return fail(ps, SD_ERR_FORMAT, "the grammar is not valid UTF-8");
    uint32_t v = n ? c & (0x3Fu >> n) : c;
    for (int i = 0; i < n; i++) {
        if (ps->p >= ps->end || ((unsigned char)*ps->p & 0xC0) != 0x80)
            return fail(ps, SD_ERR_FORMAT, "the grammar is not valid UTF-8");
        v = (v << 6) | ((unsigned char)*ps->p++ & 0x3F);
    }
    *cp = v;
    return true;
}

static int32_t single_class(parser *ps, uint32_t cp) {
    g_range r = {cp, cp};
    return class_add(ps, &r, 1, false);
}

/* ---- items ---- */

static bool parse_alternates(parser *ps, int32_t rule);

static bool parse_string(parser *ps, seq *out) {
    ps->p++; /* the opening quote */
    seq lit = {0};
    bool ok = true;
    while (ok && !(ps->p < ps->end && *ps->p == '"')) {
        uint32_t cp;
        int32_t cl;
        ok = read_char(ps, &cp) && (cl = single_class(ps, cp)) >= 0 && seq_push(ps, &lit, G_CLASS, cl);
    }
    if (ok) ps->p++;
    if (ok && lit.n == 1) {
        ok = seq_push(ps, out, G_CLASS, lit.e[0].arg);
    } else if (ok) { /* empty or several characters: a rule of its own */
        int32_t r = rule_anon(ps);
        ok = r >= 0 && rule_add_alt(ps, r, &lit) && seq_push(ps, out, G_REF, r);
    }
    free(lit.e);
    return ok;
}

static bool parse_class(parser *ps, seq *out) {
    ps->p++; /* '[' */
    bool negate = ps->p < ps->end && *ps->p == '^';
    if (negate) ps->p++;
    g_range *r = NULL;
    int32_t n = 0, cap = 0;
    bool ok = true;
    while (ok && !(ps->p < ps->end && *ps->p == ']')) {
        uint32_t lo, hi;
        ok = read_char(ps, &lo);
        hi = lo;
        if (ok && ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            ok = read_char(ps, &hi) && (hi >= lo || fail(ps, SD_ERR_FORMAT, "a class range runs backwards"));
        }
        if (ok && !grow((void **)&r, &cap, n + 1, sizeof *r)) ok = fail(ps, SD_ERR_NOMEM, "out of memory");
        if (ok) r[n++] = (g_range){lo, hi};
    }
    if (ok) ps->p++;
    int32_t cl = ok ? class_add(ps, r, n, negate) : -1;
    free(r);
    return cl >= 0 && seq_push(ps, out, G_CLASS, cl);
}

static bool parse_count(parser *ps, long *v) {
    const char *q = ps->p;
    long x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > ps->g->limits.max_repeat)
            return fail(ps, SD_ERR_RANGE, "a repetition count above %d", ps->g->limits.max_repeat);
    }
    if (ps->p == q) return fail(ps, SD_ERR_FORMAT, "a number expected in {m,n}");
    *v = x;
    return true;
}

/* Rewrites the last element of out (the item just parsed) with its
 * repetition m..n (n < 0: unbounded). */
static bool repeat_last(parser *ps, seq *out, long m, long n) {
    g_elem x = out->e[--out->n];
    for (long i = 0; i < m; i++)
        if (!seq_push(ps, out, x.type, x.arg)) return false;
    if (n == m) return true;
    seq a = {0};
    bool ok = true;
    int32_t prev = -1;
    if (n < 0) { /* R ::= X R | (empty) */
        int32_t r = rule_anon(ps);
        seq empty = {0};
        ok = r >= 0 && seq_push(ps, &a, x.type, x.arg) && seq_push(ps, &a, G_REF, r) && rule_add_alt(ps, r, &a) &&
             rule_add_alt(ps, r, &empty);
        prev = r;
    } else { /* R_k ::= X R_{k-1} | (empty), R_1 ::= X | (empty) */
        for (long k = 0; ok && k < n - m; k++) {
            int32_t r = rule_anon(ps);
            seq empty = {0};
            a.n = 0;
            ok = r >= 0 && seq_push(ps, &a, x.type, x.arg) && (prev < 0 || seq_push(ps, &a, G_REF, prev)) &&
                 rule_add_alt(ps, r, &a) && rule_add_alt(ps, r, &empty);
            prev = r;
        }
    }
    free(a.e);
    return ok && seq_push(ps, out, G_REF, prev);
}

static bool parse_sequence(parser *ps, seq *out) {
    for (;;) {
        skip_space(ps);
        if (ps->p >= ps->end || *ps->p == '|' || *ps->p == ')' || at_rule_start(ps)) return true;
        char c = *ps->p;
        bool ok;
        if (c == '"') {
            ok = parse_string(ps, out);
        } else if (c == '[') {
            ok = parse_class(ps, out);
        } else if (c == '.') {
            ps->p++;
            g_range r = {0, MAX_CP};
            int32_t cl = class_add(ps, &r, 1, false);
            ok = cl >= 0 && seq_push(ps, out, G_CLASS, cl);
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > ps->g->limits.max_depth)
                return fail(ps, SD_ERR_RANGE, "groups nested deeper than %d", ps->g->limits.max_depth);
            int32_t r = rule_anon(ps);
            ok = r >= 0 && parse_alternates(ps, r);
            skip_space(ps);
            if (ok && !(ps->p < ps->end && *ps->p == ')')) ok = fail(ps, SD_ERR_FORMAT, "a '(' is not closed");
            if (ok) ps->p++;
            ps->depth--;
            ok = ok && seq_push(ps, out, G_REF, r);
        } else if (is_name_char(c)) {
            size_t n = name_len(ps->p, ps->end);
            int32_t r = rule_get(ps, ps->p, n);
            ps->p += n;
            ok = r >= 0 && seq_push(ps, out, G_REF, r);
        } else {
            return fail(ps, SD_ERR_FORMAT, "unexpected '%c' in the grammar", c);
        }
        if (!ok) return false;
        /* a repetition binds to the item just parsed */
        if (ps->p < ps->end && (*ps->p == '*' || *ps->p == '+' || *ps->p == '?')) {
            char q = *ps->p++;
            ok = repeat_last(ps, out, q == '+' ? 1 : 0, q == '?' ? 1 : -1);
        } else if (ps->p < ps->end && *ps->p == '{') {
            ps->p++;
            long m = 0, n = 0;
            ok = parse_count(ps, &m);
            n = m;
            if (ok && ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                n = -1;
                if (ps->p < ps->end && *ps->p != '}') ok = parse_count(ps, &n);
            }
            if (ok && !(ps->p < ps->end && *ps->p == '}')) ok = fail(ps, SD_ERR_FORMAT, "a '{' is not closed");
            if (ok) ps->p++;
            if (ok && n >= 0 && n < m) ok = fail(ps, SD_ERR_FORMAT, "{m,n} with n < m");
            ok = ok && repeat_last(ps, out, m, n);
        }
        if (!ok) return false;
    }
}

static bool parse_alternates(parser *ps, int32_t rule) {
    seq s = {0};
    bool ok = true;
    for (;;) {
        s.n = 0;
        ok = parse_sequence(ps, &s) && rule_add_alt(ps, rule, &s);
        if (!ok || !(ps->p < ps->end && *ps->p == '|')) break;
        ps->p++;
    }
    free(s.e);
    return ok;
}

/* ---- checks ---- */

/* nullable[r]: rule r can match the empty string (fixpoint). */
#define NULLABLE_PASSES 100   /* passes of the fixpoint before a grammar is refused (a time bound) */
#define START_DEPTH     10000 /* chains of "starts with" references the analysis follows */

/* Returns false when the fixpoint needs more than NULLABLE_PASSES passes
 * (they alternate direction, so a chain in either order converges fast). */
static bool find_nullable(const sd_grammar *g, bool *nullable) {
    int passes = 0;
    for (bool changed = true; changed; passes++) {
        if (passes >= NULLABLE_PASSES) return false;
        changed = false;
        for (int32_t i = 0; i < g->n_rules; i++) {
            int32_t r = passes % 2 ? g->n_rules - 1 - i : i;
            if (nullable[r]) continue;
            for (int32_t a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
                const g_elem *e = g->elems + g->rules[r].alts[a];
                while (e->type == G_REF && nullable[e->arg]) e++;
                if (e->type == G_END) nullable[r] = changed = true;
            }
        }
    }
    return true;
}

/* Left recursion. Rule r "starts with" s when an alternative of r holds a
 * reference to s after nothing but nullable references. Such an edge is a
 * tail edge when the reference ends its alternative: expanding it pushes
 * no continuation, so a cycle of tail edges only revisits a stack the
 * matcher has already expanded in that step (X* with a nullable X makes
 * one) and it skips it. A cycle through any other edge grows the stack
 * without end: that is the left recursion refused. Found with Tarjan's
 * strongly connected components: a non-tail edge inside one component. */
typedef struct scc {
    const sd_grammar *g;
    const bool *nullable;
    int32_t *index, *low, *comp, *stack;
    bool *on_stack;
    int32_t next_index, n_stack, n_comp;
    bool too_deep; /* a chain of START_DEPTH references: refused, not followed */
} scc;

static void scc_visit(scc *t, int32_t r, int depth) {
    t->index[r] = t->low[r] = t->next_index++;
    t->stack[t->n_stack++] = r;
    t->on_stack[r] = true;
    const sd_grammar *g = t->g;
    for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
        for (const g_elem *e = g->elems + g->rules[r].alts[a]; e->type == G_REF; e++) {
            int32_t v = e->arg;
            if (t->index[v] < 0) {
                if (depth >= START_DEPTH) {
                    t->too_deep = true;
                    return;
                }
                scc_visit(t, v, depth + 1);
                if (t->low[v] < t->low[r]) t->low[r] = t->low[v];
            } else if (t->on_stack[v] && t->index[v] < t->low[r]) {
                t->low[r] = t->index[v];
            }
            if (!t->nullable[v]) break;
        }
    }
    if (t->low[r] == t->index[r]) {
        int32_t v;
        do {
            v = t->stack[--t->n_stack];
            t->on_stack[v] = false;
            t->comp[v] = t->n_comp;
        } while (v != r);
        t->n_comp++;
    }
}

/* The rule holding a non-tail "starts with" edge inside a cycle, or -1;
 * -2 when the references nest deeper than START_DEPTH. */
static int32_t left_recursive_rule(const sd_grammar *g, const bool *nullable, int32_t *buf) {
    int32_t n = g->n_rules;
    scc t = {.g = g,
             .nullable = nullable,
             .index = buf,
             .low = buf + n,
             .comp = buf + 2 * n,
             .stack = buf + 3 * n,
             .on_stack = (bool *)(buf + 4 * n)};
    for (int32_t r = 0; r < n; r++) t.index[r] = -1;
    for (int32_t r = 0; r < n; r++)
        if (t.index[r] < 0 && !t.too_deep) scc_visit(&t, r, 0);
    if (t.too_deep) return -2;
    for (int32_t r = 0; r < n; r++)
        for (int32_t a = 0; a < g->rules[r].n_alts; a++)
            for (const g_elem *e = g->elems + g->rules[r].alts[a]; e->type == G_REF; e++) {
                bool tail = e[1].type == G_END;
                if (!tail && t.comp[e->arg] == t.comp[r]) return r;
                if (!nullable[e->arg]) break;
            }
    return -1;
}

static bool check_grammar(parser *ps) {
    sd_grammar *g = ps->g;
    for (int32_t r = 0; r < g->n_rules; r++)
        if (!g->rules[r].n_alts) return fail(ps, SD_ERR_FORMAT, "rule '%s' is used but not defined", g->rules[r].name);
    g->root = rule_find(g, "root", 4);
    if (g->root < 0) return fail(ps, SD_ERR_FORMAT, "the grammar has no 'root' rule");
    bool *nullable = calloc((size_t)g->n_rules, 1);
    int32_t *buf = malloc((size_t)g->n_rules * (4 * sizeof(int32_t) + sizeof(bool)) + sizeof(int32_t));
    bool ok = nullable && buf;
    if (!ok) fail(ps, SD_ERR_NOMEM, "out of memory");
    if (ok) {
        if (!find_nullable(g, nullable))
            return fail(ps, SD_ERR_RANGE, "the grammar's empty rules nest too deeply to analyse"), free(nullable),
                   free(buf), false;
        memset(buf, 0, (size_t)g->n_rules * (4 * sizeof(int32_t) + sizeof(bool)));
        int32_t c = left_recursive_rule(g, nullable, buf);
        if (c == -2) ok = fail(ps, SD_ERR_RANGE, "rules nest deeper than %d references at their starts", START_DEPTH);
        if (c >= 0) ok = fail(ps, SD_ERR_UNSUPPORTED, "rule '%s' is left recursive", g->rules[c].name);
    }
    free(nullable);
    free(buf);
    return ok;
}

sd_status sd_grammar_parse_gbnf(const char *text, size_t len, const sd_constrain_limits *lim, sd_grammar **out,
                                char *err, size_t err_cap) {
    if (err_cap) err[0] = '\0';
    *out = NULL;
    sd_grammar *g = calloc(1, sizeof *g);
    if (!g) return SD_ERR_NOMEM;
    g->limits = lim ? *lim : sd_constrain_default_limits();
    parser ps = {.g = g, .p = text, .end = text + len, .err = err, .err_cap = err_cap};
    if (len > g->limits.max_text)
        fail(&ps, SD_ERR_RANGE, "the grammar is %zu bytes, at most %zu", len, g->limits.max_text);
    for (skip_space(&ps); !ps.failed && ps.p < ps.end; skip_space(&ps)) {
        size_t n = name_len(ps.p, ps.end);
        if (!n || !at_rule_start(&ps)) {
            fail(&ps, SD_ERR_FORMAT, "a rule 'name ::= ...' expected at byte %zu", (size_t)(ps.p - text));
            break;
        }
        int32_t r = rule_get(&ps, ps.p, n);
        if (r < 0) break;
        if (g->rules[r].defined) {
            fail(&ps, SD_ERR_FORMAT, "rule '%s' is defined twice", g->rules[r].name);
            break;
        }
        g->rules[r].defined = true;
        ps.p += n; /* at_rule_start saw the "::=" after blanks */
        while (*ps.p == ' ' || *ps.p == '\t') ps.p++;
        ps.p += 3;
        parse_alternates(&ps, r);
        if (!ps.failed && ps.p < ps.end && *ps.p == ')') fail(&ps, SD_ERR_FORMAT, "a ')' without its '('");
    }
    if (!ps.failed) check_grammar(&ps);
    if (ps.failed) {
        sd_grammar_free(&g);
        return ps.status;
    }
    *out = g;
    return SD_OK;
}

void sd_grammar_free(sd_grammar **pg) {
    if (!pg || !*pg) return;
    sd_grammar *g = *pg;
    for (int32_t r = 0; r < g->n_rules; r++) {
        free(g->rules[r].name);
        free(g->rules[r].alts);
    }
    free(g->rules);
    free(g->name_tab);
    free(g->elems);
    free(g->ranges);
    free(g->classes);
    free(g);
    *pg = NULL;
}

sd_constrain_limits sd_constrain_default_limits(void) {
    return (sd_constrain_limits){.max_text = 1u << 20,
                                 .max_rules = 100000,
                                 .max_elems = 1000000,
                                 .max_repeat = 1000,
                                 .max_depth = 64,
                                 .max_enum = 4096,
                                 .max_stacks = 2048,
                                 .max_expansions = 100000};
}

sd_status sd_grammar_from_gbnf(const char *text, size_t len, const sd_constrain_limits *lim, sd_grammar **out,
                               char *err, size_t err_cap) {
    return sd_grammar_parse_gbnf(text, len, lim, out, err, err_cap);
}
