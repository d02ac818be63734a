/* constrain_cache.h — a constraint as a service request names it (a kind
 * and a text), compiled by the right compiler, and a bounded cache of
 * compiled grammars keyed by that pair: the verifier sees a constrained
 * sequence's constraint with every step and compiles it once.
 *
 * The kinds have the values of the protocol's ConstraintKind
 * (proto/specd.proto), so a decoded message's kind converts by a cast. */
#ifndef SPECD_CONSTRAIN_CACHE_H
#define SPECD_CONSTRAIN_CACHE_H

#include "specd/constrain.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sd_constraint_kind {
    SD_CONSTRAINT_NONE = 0,
    SD_CONSTRAINT_JSON_OBJECT = 1, /* any JSON object (OpenAI's json_object); no text */
    SD_CONSTRAINT_JSON_SCHEMA = 2, /* sd_grammar_from_json_schema */
    SD_CONSTRAINT_REGEX = 3,       /* sd_grammar_from_regex */
    SD_CONSTRAINT_GRAMMAR = 4,     /* sd_grammar_from_gbnf */
} sd_constraint_kind;

/* "none", "json_object", "json_schema", "regex", "grammar"; "?" otherwise
 * (static string). */
const char *sd_constraint_kind_name(sd_constraint_kind kind);

/* Compiles text[len] as kind says (SD_CONSTRAINT_NONE: SD_ERR_INVALID_ARG).
 * Errors and err as the compilers' (constrain.h). Caller frees *out with
 * sd_grammar_free. Thread-safe. */
sd_status sd_grammar_compile(sd_constraint_kind kind, const char *text, size_t len, const sd_constrain_limits *lim,
                             sd_grammar **out, char *err, size_t err_cap);

/* Compiled grammars by (kind, text). A grammar handed out is pinned until
 * it is put back; when the cache holds `capacity` grammars, a new one
 * evicts the least recently used unpinned one (pinned ones may take it
 * past capacity: at most one per live user). Not thread-safe. */
typedef struct sd_grammar_cache sd_grammar_cache;

/* lim may be NULL (defaults; copied). Caller frees with
 * sd_grammar_cache_free, after every grammar was put back. */
sd_status sd_grammar_cache_create(int32_t capacity, const sd_constrain_limits *lim, sd_grammar_cache **out);
void sd_grammar_cache_free(sd_grammar_cache **c);

/* The grammar of (kind, text[len]), compiled on a miss; pinned: borrowed
 * until sd_grammar_cache_put. A failed compile is not cached (err says why). */
sd_status sd_grammar_cache_get(sd_grammar_cache *c, sd_constraint_kind kind, const char *text, size_t len,
                               const sd_grammar **out, char *err, size_t err_cap);
/* Unpins a grammar sd_grammar_cache_get handed out (NULL: nothing). */
void sd_grammar_cache_put(sd_grammar_cache *c, const sd_grammar *g);

typedef struct sd_grammar_cache_stats {
    int64_t hits, misses;
    int32_t entries, pinned;
} sd_grammar_cache_stats;
sd_grammar_cache_stats sd_grammar_cache_get_stats(const sd_grammar_cache *c);

#ifdef __cplusplus
}
#endif
#endif
