/* constrain.h — structured output: grammars, regular expressions and JSON
 * Schema compiled to one byte-level matcher, and per-step token masks.
 *
 * Every input compiles to a grammar in GBNF (llama.cpp's form: rules
 * `name ::= alternatives`, "strings", [classes], [^negated], `.`, groups,
 * `* + ? {m} {m,} {m,n}`, `#` comments; the start rule is `root`). A
 * regular expression is translated to GBNF, and so is a JSON Schema (the
 * subset of sd_grammar_from_json_schema). The matcher runs the grammar as a
 * pushdown automaton over the output's bytes (a set of stacks, no
 * backtracking), so no input can make it backtrack exponentially; limits
 * on the text, the rules, the repetition counts, the stacks and their depth
 * refuse an adversarial input at compile time or cut a parse at run time.
 *
 * A constraint (sd_constraint) follows one sequence: it holds the matcher's
 * state after each committed or drafted token (for rollback) and gives the
 * mask of the tokens allowed next, computed by walking a byte trie of the
 * vocabulary with the matcher (a dead prefix prunes its whole subtree) and
 * cached per state (hash of the state, compared in full on a hit).
 * End-of-generation tokens are allowed exactly when the grammar accepts;
 * control tokens never. Grammars are immutable and thread-safe;
 * vocabularies too; a constraint is one sequence's, not thread-safe. */
#ifndef SPECD_CONSTRAIN_H
#define SPECD_CONSTRAIN_H

#include "specd/common.h"
#include "specd/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_grammar sd_grammar;

/* Bounds that make a hostile input a refusal instead of a hang. */
typedef struct sd_constrain_limits {
    size_t max_text;        /* bytes of grammar / regex / schema text (default 1 MiB) */
    int32_t max_rules;      /* rules after rewriting (default 100000) */
    int32_t max_elems;      /* elements after rewriting (default 1000000) */
    int32_t max_repeat;     /* the largest m or n of {m,n} (default 1000) */
    int32_t max_depth;      /* nesting of groups / schemas; depth of a matcher stack (default 64 / x4) */
    int32_t max_enum;       /* entries of a JSON Schema enum (default 4096) */
    int32_t max_stacks;     /* live parses in a matcher state (default 2048) */
    int32_t max_expansions; /* rule expansions in one matcher step (default 100000) */
} sd_constrain_limits;

sd_constrain_limits sd_constrain_default_limits(void);

/* Compilers. Each writes a message naming the offending construct, keyword
 * or limit to err (err_cap bytes, always NUL-terminated) and returns
 * SD_ERR_FORMAT (malformed), SD_ERR_UNSUPPORTED (valid but not handled:
 * the keyword is named) or SD_ERR_RANGE (a limit). lim may be NULL
 * (defaults). Caller frees *out with sd_grammar_free. */
sd_status sd_grammar_from_gbnf(const char *text, size_t len, const sd_constrain_limits *lim, sd_grammar **out,
                               char *err, size_t err_cap);
/* A regular expression the whole output must match (Python's
 * re.fullmatch): | ( ) (?: ) * + ? {m,n} (lazy forms too) [ ] [^ ] . and
 * escapes \d \w \s \D \W \S (ASCII classes, as in ECMA-262) \n \t \xHH
 * \uHHHH; ^ and $ only at the ends. Back-references, look-around and
 * \b are refused. '.' matches any character but '\n'. */
sd_status sd_grammar_from_regex(const char *re, size_t len, const sd_constrain_limits *lim, sd_grammar **out, char *err,
                                size_t err_cap);
/* A JSON Schema (text) the output must be an instance of: type (object,
 * array, string, number, integer, boolean, null, or a list of them),
 * properties (in order; required ones always, others optional),
 * required, additionalProperties (false, true or a schema; extra keys are
 * generated only when it is given as true or a schema), items, minItems,
 * maxItems, enum, const, string pattern / minLength / maxLength, anyOf,
 * oneOf (alternatives: overlapping oneOf branches are the schema's
 * problem), $ref to "#", "#/$defs/x" or "#/definitions/x" (recursion
 * allowed). Annotations (title, description, $schema, $id, $comment,
 * default, examples) are ignored; any other keyword is refused, named.
 * Whitespace between tokens is bounded (at most one newline and 20
 * spaces or tabs), so a model cannot loop on it. */
sd_status sd_grammar_from_json_schema(const char *schema, size_t len, const sd_constrain_limits *lim, sd_grammar **out,
                                      char *err, size_t err_cap);
/* Any JSON value ({"type": "json_object"} asks for an object: object_only). */
sd_status sd_grammar_json_any(bool object_only, sd_grammar **out);
/* The GBNF text a JSON Schema compiles to (for --print-grammar and tests);
 * *gbnf is malloc'd, caller frees. */
sd_status sd_json_schema_to_gbnf(const char *schema, size_t len, const sd_constrain_limits *lim, char **gbnf, char *err,
                                 size_t err_cap);
void sd_grammar_free(sd_grammar **g);

/* True when bytes[len] is a whole sentence of g (tests, oracles). */
bool sd_grammar_match(const sd_grammar *g, const char *bytes, size_t len);

/* A vocabulary's byte trie, built once per tokenizer (t borrowed for the
 * call). Caller frees with sd_cvocab_free. */
typedef struct sd_cvocab sd_cvocab;
sd_status sd_cvocab_create(const sd_tok *t, sd_cvocab **out);
void sd_cvocab_free(sd_cvocab **v);
int32_t sd_cvocab_n_vocab(const sd_cvocab *v);

/* One sequence under a grammar. g and v are borrowed and must outlive it.
 * Caller frees with sd_constraint_free. */
typedef struct sd_constraint sd_constraint;
sd_status sd_constraint_create(const sd_grammar *g, const sd_cvocab *v, sd_constraint **out);
void sd_constraint_free(sd_constraint **c);

/* The allowed tokens next: a bitmask of n_vocab bits (bit i of word i/32),
 * borrowed, valid until the next call on c. */
sd_status sd_constraint_mask(sd_constraint *c, const uint32_t **bits);
/* Sets logits[i] = -INFINITY for every token the mask forbids. */
sd_status sd_constraint_apply(sd_constraint *c, float *logits, int32_t n_vocab);
/* The same over a reduced vocabulary (an EAGLE head's draft ids): logits[i]
 * scores target token ids[i] (ids NULL: token i), set to -INFINITY when
 * the mask forbids it or it is outside the vocabulary; *any says whether
 * some logit is left above -INFINITY. One pass over n, no pass over the
 * whole vocabulary beyond the (cached) mask. */
sd_status sd_constraint_apply_ids(sd_constraint *c, float *logits, int32_t n, const int32_t *ids, bool *any);
/* True when token is allowed next (computed without the mask). */
bool sd_constraint_allows(sd_constraint *c, int32_t token);
/* Advances past token (allowed next, or SD_ERR_INVALID_ARG and no change).
 * An end-of-generation token ends the sequence: nothing is allowed after. */
sd_status sd_constraint_advance(sd_constraint *c, int32_t token);
/* Tokens advanced so far; rollback to n (<= that) forgets the rest. */
int32_t sd_constraint_len(const sd_constraint *c);
/* Those tokens, sd_constraint_len of them (borrowed, valid until the next
 * advance). */
const int32_t *sd_constraint_tokens(const sd_constraint *c);
sd_status sd_constraint_rollback(sd_constraint *c, int32_t n);
/* The only token allowed next, or -1 when zero or several are. */
int32_t sd_constraint_forced(sd_constraint *c);
/* The bytes every continuation starts with: while the output does not
 * accept and exactly one byte can come next, that byte (at most cap);
 * returns their count. What a forced-token drafter encodes and proposes. */
size_t sd_constraint_forced_bytes(sd_constraint *c, char *buf, size_t cap);
/* The bytes that can come next (bit b of set[b / 32]): none once ended. */
void sd_constraint_next_bytes(sd_constraint *c, uint32_t set[8]);
/* True after an end-of-generation token: nothing is allowed any more. */
bool sd_constraint_ended(const sd_constraint *c);
/* True when the output so far is a whole sentence (EOS would be allowed). */
bool sd_constraint_accepting(const sd_constraint *c);

/* Mask statistics of c's life: masks served, cache hits, and the
 * microseconds each served mask took (the last SD_CONSTRAINT_MAX_TIMES). */
#define SD_CONSTRAINT_MAX_TIMES 65536
typedef struct sd_constraint_stats {
    int64_t masks, hits;
    int32_t n_times;
    float *mask_us; /* [n_times], borrowed */
} sd_constraint_stats;
sd_constraint_stats sd_constraint_get_stats(const sd_constraint *c);

#ifdef __cplusplus
}
#endif
#endif
