/* constrain_impl.h — the compiled grammar and the matcher's state, shared
 * by the files of engine/constrain/ (not a public header).
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an
 * alternative is a run of elements in one flat array, ended by G_END. An
 * element is a character class (code point ranges) or a reference to a
 * rule. Repetition, groups and multi-character strings are rewritten into
 * extra rules by the parser, so the matcher sees only these three kinds.
 *
 * The matcher's state is the set of its pushdown stacks (the parses still
 * alive), each a list of element indices, the top last: the element to
 * match next. A stack's top is always a class (references are expanded
 * when a stack is made); an empty stack means the input so far is a whole
 * sentence. Stacks are kept sorted and unique, so equal states have equal
 * encodings: that encoding is what the mask cache hashes and compares. */
#ifndef SPECD_CONSTRAIN_IMPL_H
#define SPECD_CONSTRAIN_IMPL_H

#include "specd/constrain.h"

#include <stddef.h>
#include <stdint.h>

enum { G_END = 0, G_CLASS = 1, G_REF = 2 };

typedef struct g_elem {
    uint8_t type;
    int32_t arg; /* G_CLASS: class index; G_REF: rule index */
} g_elem;

typedef struct g_range {
    uint32_t lo, hi; /* inclusive code points */
} g_range;

typedef struct g_class {
    int32_t first, n; /* ranges[first .. first + n), sorted, disjoint */
} g_class;

typedef struct g_rule {
    char *name;
    int32_t *alts; /* element index of each alternative's first element */
    int32_t n_alts, cap_alts;
    bool defined;
} g_rule;

struct sd_grammar {
    g_elem *elems;
    int32_t n_elems, cap_elems;
    g_range *ranges;
    int32_t n_ranges, cap_ranges;
    g_class *classes;
    int32_t n_classes, cap_classes;
    g_rule *rules;
    int32_t n_rules, cap_rules;
    int32_t *name_tab; /* [name_cap] rule indices by name hash, -1 empty (gbnf.c) */
    uint32_t name_cap;
    int32_t root;
    sd_constrain_limits limits;
};

/* The grammar parser's entry (gbnf.c): text in GBNF, root rule "root". On
 * failure writes a message naming the problem to err. */
sd_status sd_grammar_parse_gbnf(const char *text, size_t len, const sd_constrain_limits *lim, sd_grammar **out,
                                char *err, size_t err_cap);

/* A matcher state (gmatch.c). data holds n_stacks stacks, each as its
 * length followed by its element indices (bottom first). utf8_need > 0
 * while a multi-byte character is half read: utf8_cp holds its bits so far. */
typedef struct g_state {
    int32_t *data;
    size_t len, cap;
    int32_t n_stacks;
    uint32_t utf8_cp;
    uint8_t utf8_need, utf8_len;
} g_state;

void g_state_init(g_state *s);
void g_state_free(g_state *s);
sd_status g_state_copy(g_state *dst, const g_state *src);
bool g_state_equal(const g_state *a, const g_state *b);
uint64_t g_state_hash(const g_state *s);

/* Reusable buffers of a matcher step (one per thread of matching). */
typedef struct g_scratch {
    int32_t *work, *done; /* stacks as [len, elems...] */
    size_t n_work, cap_work, n_done, cap_done;
    size_t *offs; /* offsets of the finished stacks in done */
    size_t n_offs, cap_offs;
    /* the stacks expanded in this step (a cycle through tail references
     * comes back to one: it is skipped); slots hold (generation, offset) */
    int32_t *seen;
    size_t n_seen, cap_seen;
    uint32_t *seen_tab; /* [2 * SEEN_SLOTS] */
    uint32_t gen, n_tab;
} g_scratch;
void g_scratch_free(g_scratch *sc);

/* The start state of g: the root's alternatives, expanded. */
sd_status g_state_start(const sd_grammar *g, g_state *out, g_scratch *sc);
/* out = the state after byte b from in (in untouched). Returns false when
 * no parse survives (or a limit of g was hit), leaving out unspecified. */
bool g_state_advance(const sd_grammar *g, const g_state *in, uint8_t b, g_state *out, g_scratch *sc);
/* True when the input so far is a whole sentence. */
bool g_state_accepting(const g_state *s);

/* Appends text to a growing malloc'd buffer (schema.c, regex.c). */
typedef struct g_buf {
    char *p;
    size_t len, cap;
    bool oom;
} g_buf;
void g_buf_add(g_buf *b, const char *s, size_t n);
void g_buf_puts(g_buf *b, const char *s);
void g_buf_printf(g_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A code point as a GBNF escape inside a string or class ("\x41", "\u00e9"). */
void g_buf_escape_cp(g_buf *b, uint32_t cp);

/* The regex translator (regex.c): appends GBNF for re to b as new rules
 * named prefix-N, and writes the name of its top rule. json_string: the
 * language is intersected with JSON string characters that need no escape
 * (no '"', '\\' or control characters), for a schema's "pattern". */
sd_status g_regex_to_gbnf(const char *re, size_t len, const char *prefix, bool json_string,
                          const sd_constrain_limits *lim, g_buf *b, char *top, size_t top_cap, char *err,
                          size_t err_cap);

#endif
