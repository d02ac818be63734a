/* slots.c — per-slot constraints synced to a slot's history, and forced
 * drafts (constrain_slots.h).
 *
 * A slot keeps the grammar (pinned in the shared cache), its sd_constraint
 * and the generated tokens the constraint advanced over. A sync compares
 * those with the slot's history, rolls back to the common prefix and
 * advances over the rest; a different grammar or prompt length starts the
 * slot afresh (a new request in the slot). */
#include "specd/constrain_slots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct con_slot {
    const sd_grammar *g;
    sd_constraint *con;
    int32_t prompt_len;
    int32_t *ids; /* [cap_ids] the generated tokens con advanced over: n_ids of them */
    int32_t n_ids, cap_ids;
} con_slot;

struct sd_con_slots {
    sd_cvocab *vocab;
    sd_grammar_cache *cache;
    con_slot *slots;
    int32_t max_seqs;
};

sd_status sd_con_slots_create(const sd_tok *tok, int32_t max_seqs, sd_con_slots **out) {
    if (!tok || !out || max_seqs < 1) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_con_slots *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->max_seqs = max_seqs;
    c->slots = calloc((size_t)max_seqs, sizeof *c->slots);
    sd_status st = c->slots ? SD_OK : SD_ERR_NOMEM;
    if (st == SD_OK) st = sd_cvocab_create(tok, &c->vocab);
    if (st == SD_OK) st = sd_grammar_cache_create(SD_CON_SLOTS_CACHE_GRAMMARS, NULL, &c->cache);
    if (st != SD_OK) {
        sd_con_slots_free(&c);
        return st;
    }
    *out = c;
    return SD_OK;
}

void sd_con_slots_release(sd_con_slots *c, int32_t slot) {
    if (!c || slot < 0 || slot >= c->max_seqs) return;
    con_slot *s = &c->slots[slot];
    sd_constraint_free(&s->con);
    sd_grammar_cache_put(c->cache, s->g);
    s->g = NULL;
    s->n_ids = 0;
}

void sd_con_slots_free(sd_con_slots **pc) {
    if (!pc || !*pc) return;
    sd_con_slots *c = *pc;
    for (int32_t i = 0; c->slots && i < c->max_seqs; i++) {
        sd_con_slots_release(c, i);
        free(c->slots[i].ids);
    }
    free(c->slots);
    sd_grammar_cache_free(&c->cache);
    sd_cvocab_free(&c->vocab);
    free(c);
    *pc = NULL;
}

/* Points slot s at the grammar of (kind, text) (a fresh state when it or
 * the prompt changed). */
static sd_status bind_grammar(sd_con_slots *c, con_slot *s, sd_constraint_kind kind, const char *text,
                              int32_t prompt_len, char *err, size_t err_cap) {
    const sd_grammar *g = NULL;
    SD_TRY(sd_grammar_cache_get(c->cache, kind, text, strlen(text), &g, err, err_cap));
    if (g == s->g && s->con && s->prompt_len == prompt_len) {
        sd_grammar_cache_put(c->cache, g); /* the slot holds its pin already */
        return SD_OK;
    }
    sd_constraint_free(&s->con);
    sd_grammar_cache_put(c->cache, s->g);
    s->g = g;
    s->n_ids = 0;
    s->prompt_len = prompt_len;
    return sd_constraint_create(g, c->vocab, &s->con);
}

static sd_status reserve_ids(con_slot *s, int32_t n) {
    if (n <= s->cap_ids) return SD_OK;
    int32_t cap = s->cap_ids ? s->cap_ids : 256;
    while (cap < n) cap *= 2;
    int32_t *ids = realloc(s->ids, (size_t)cap * sizeof *ids);
    if (!ids) return SD_ERR_NOMEM;
    s->ids = ids;
    s->cap_ids = cap;
    return SD_OK;
}

sd_status sd_con_slots_sync(sd_con_slots *c, int32_t slot, sd_constraint_kind kind, const char *text,
                            const int32_t *hist, int32_t prompt_len, int32_t n_ctx, sd_constraint **out, char *err,
                            size_t err_cap) {
    *out = NULL;
    if (err_cap) err[0] = '\0';
    if (kind == SD_CONSTRAINT_NONE) {
        sd_con_slots_release(c, slot);
        return SD_OK;
    }
    if (!c || slot < 0 || slot >= c->max_seqs || prompt_len < 0 || n_ctx < prompt_len || (n_ctx > 0 && !hist))
        return SD_ERR_INVALID_ARG;
    con_slot *s = &c->slots[slot];
    SD_TRY(bind_grammar(c, s, kind, text ? text : "", prompt_len, err, err_cap));
    const int32_t *gen = hist + prompt_len;
    int32_t n_gen = n_ctx - prompt_len, keep = 0;
    while (keep < s->n_ids && keep < n_gen && s->ids[keep] == gen[keep]) keep++;
    SD_TRY(sd_constraint_rollback(s->con, keep));
    s->n_ids = keep;
    SD_TRY(reserve_ids(s, n_gen));
    for (int32_t i = keep; i < n_gen; i++) {
        if (sd_constraint_advance(s->con, gen[i]) != SD_OK) {
            snprintf(err, err_cap, "generated token %d (position %d) is not allowed by the %s constraint", (int)gen[i],
                     (int)(prompt_len + i), sd_constraint_kind_name(kind));
            return SD_ERR_INVALID_ARG;
        }
        s->ids[s->n_ids++] = gen[i];
    }
    *out = s->con;
    return SD_OK;
}

sd_grammar_cache_stats sd_con_slots_cache_stats(const sd_con_slots *c) {
    sd_grammar_cache_stats st = {0};
    return c ? sd_grammar_cache_get_stats(c->cache) : st;
}

/* ---- forced drafts ----
 *
 * Forced bytes alone stop at every optional-whitespace choice of JSON (after
 * `{`, `,`, `:`) and come out in the encoder's tokens, which the model often
 * does not use. So a forced draft is built from the output itself where it
 * can: at each position the token the model wrote at the earlier position
 * whose preceding bytes match the current ones longest (ties: the latest),
 * if the constraint allows it. A guess is made where bytes are forced (it
 * must then agree with them: the constraint checks) and where the choice is
 * only optional whitespace before one possible byte; elsewhere (a string's
 * inside, a number, an enum's branches) nothing is guessed. Forced bytes are
 * drafted in the encoder's tokens (all but the last) where no earlier token
 * fits or the encoder's first token is longer. Every draft is verified: a
 * wrong guess costs its row, never the output. */

#define GUESS_HIST  1024 /* earlier tokens a guess looks back over */
#define GUESS_CTX   32   /* bytes of context compared */
#define GUESS_TRIES 8    /* candidates tried (the constraint refusing the best) */

typedef struct guess_ctx {
    char *bytes; /* the output's bytes from token lo on, then the drafts' */
    size_t len, cap;
    size_t *start; /* [n - lo] where token lo + i starts in bytes */
    int32_t *depth; /* [n - lo] the bracket depth where token lo + i starts */
    int32_t *score;
    const int32_t *toks; /* the constraint's tokens, n of them (refetched: an advance may move them) */
    int32_t lo, n;
    int32_t at_depth; /* the bracket depth at the bytes' end: `{` `[` less `}` `]` outside strings, from token lo */
    bool in_str, esc; /* the bytes end inside a JSON string; after its backslash */
} guess_ctx;

/* Follows the bracket depth over bytes appended (JSON's strings skipped). */
static void depth_scan(guess_ctx *g, const char *p, size_t l) {
    for (size_t i = 0; i < l; i++) {
        char ch = p[i];
        if (g->in_str) {
            if (g->esc)
                g->esc = false;
            else if (ch == '\\')
                g->esc = true;
            else if (ch == '"')
                g->in_str = false;
        } else if (ch == '"') {
            g->in_str = true;
        } else if (ch == '{' || ch == '[') {
            g->at_depth++;
        } else if (ch == '}' || ch == ']') {
            g->at_depth--;
        }
    }
}

static bool bytes_add(guess_ctx *g, const sd_tok *tok, int32_t id) {
    size_t l = 0;
    const char *p = sd_tok_piece(tok, id, &l);
    depth_scan(g, p, l);
    if (g->len + l > g->cap) {
        size_t nc = (g->cap ? g->cap : 256) * 2;
        while (nc < g->len + l) nc *= 2;
        char *q = realloc(g->bytes, nc);
        if (!q) return false;
        g->bytes = q;
        g->cap = nc;
    }
    if (l) memcpy(g->bytes + g->len, p, l);
    g->len += l;
    return true;
}

static bool guess_init(guess_ctx *g, const sd_constraint *c, const sd_tok *tok) {
    memset(g, 0, sizeof *g);
    g->n = sd_constraint_len(c);
    g->lo = g->n > GUESS_HIST ? g->n - GUESS_HIST : 0;
    g->toks = sd_constraint_tokens(c);
    size_t m = (size_t)(g->n - g->lo) + 1;
    g->start = malloc(m * sizeof *g->start);
    g->score = malloc(m * sizeof *g->score);
    g->depth = malloc(m * sizeof *g->depth);
    if (!g->start || !g->score || !g->depth) return false;
    for (int32_t i = g->lo; i < g->n; i++) {
        g->start[i - g->lo] = g->len;
        g->depth[i - g->lo] = g->at_depth;
        if (!bytes_add(g, tok, g->toks[i])) return false;
    }
    g->start[g->n - g->lo] = g->len; /* where the drafts start */
    return true;
}

static void guess_free(guess_ctx *g) {
    free(g->bytes);
    free(g->start);
    free(g->depth);
    free(g->score);
}

static bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

static int32_t trailing_space(const guess_ctx *g) {
    size_t w = 0;
    while (w < g->len && w < GUESS_CTX && is_space(g->bytes[g->len - 1 - w])) w++;
    return (int32_t)w;
}

/* Context bytes match when equal, or both digits: a number's value does
 * not change how the model goes on after it (`1\n    ` then ` ` earlier,
 * `2\n    ` now). */
static bool ctx_eq(char x, char y) { return x == y || ((unsigned)(x - '0') < 10 && (unsigned)(y - '0') < 10); }

/* True for whitespace that indents a new line: a newline, then a space or
 * a tab. */
static bool indents(const char *p, size_t l) {
    for (size_t i = 0; i + 1 < l; i++)
        if (p[i] == '\n' && (p[i + 1] == ' ' || p[i + 1] == '\t')) return true;
    return false;
}

/* The earlier token whose context matches the current bytes' end longest
 * (ctx_eq; at least min_ctx bytes, min_ctx_space for a token of
 * whitespace only), that starts as the forced bytes do (fb[n_fb]) and that
 * c allows now; its index in g->toks, -1 if none. A token of whitespace
 * that indents a line is taken only from the same bracket depth (the
 * model indents by depth: `\n   ` under `{`, `\n       ` a level deeper),
 * and there with no context needed right after `,` `{` `[` (the first
 * line at a depth after a `},` that the output wrote only after `[`). */
static int32_t guess_token(guess_ctx *g, sd_constraint *c, const sd_tok *tok, int32_t min_ctx, int32_t min_ctx_space,
                           const char *fb, size_t n_fb) {
    const char *b = g->bytes;
    g->toks = sd_constraint_tokens(c); /* an advance since may have moved them */
    char last = g->len ? b[g->len - 1] : 0;
    bool opens = last == ',' || last == '{' || last == '['; /* a new line may start here */
    for (int32_t j = g->lo; j < g->n; j++) {
        size_t at = g->start[j - g->lo], m = 0, l = 0;
        while (m < GUESS_CTX && m < at && ctx_eq(b[at - 1 - m], b[g->len - 1 - m])) m++;
        const char *p = sd_tok_piece(tok, g->toks[j], &l);
        size_t sp = 0;
        while (sp < l && is_space(p[sp])) sp++;
        bool space = l && sp == l, indent = space && indents(p, l);
        bool fits = memcmp(p, fb, l < n_fb ? l : n_fb) == 0 &&
                    (indent ? g->depth[j - g->lo] == g->at_depth && ((int32_t)m >= min_ctx_space || opens)
                            : (int32_t)m >= (space ? min_ctx_space : min_ctx));
        g->score[j - g->lo] = fits ? (int32_t)m : -1;
    }
    for (int tries = 0; tries < GUESS_TRIES; tries++) {
        int32_t best = -1;
        for (int32_t j = g->n - 1; j >= g->lo; j--)
            if (g->score[j - g->lo] >= 0 && (best < 0 || g->score[j - g->lo] > g->score[best - g->lo])) best = j;
        if (best < 0) return -1;
        if (sd_constraint_allows(c, g->toks[best])) return best;
        int32_t refused = g->toks[best]; /* the same token elsewhere is refused too */
        for (int32_t j = g->lo; j < g->n; j++)
            if (g->toks[j] == refused) g->score[j - g->lo] = -1;
    }
    return -1;
}

/* True when what may come next is optional whitespace and at most one
 * other byte (the output not yet whole): a forced run held up by spacing. */
static bool blocked_by_space(sd_constraint *c) {
    if (sd_constraint_accepting(c)) return false;
    uint32_t set[8];
    sd_constraint_next_bytes(c, set);
    bool space = false;
    int other = 0;
    for (int byte = 0; byte < 256; byte++) {
        if (!(set[byte >> 5] >> (byte & 31) & 1u)) continue;
        if (is_space((char)byte))
            space = true;
        else
            other++;
    }
    return space && other <= 1;
}

static size_t piece_len(const sd_tok *tok, int32_t id) {
    size_t l = 0;
    sd_tok_piece(tok, id, &l);
    return l;
}

static bool is_letter(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

/* True when id, an encoder token, would be drafted inside a word the model
 * has started splitting its own way (split: the output before this call's
 * drafts ends in a letter, and the drafts have not left that word yet): id
 * starts with a letter, is longer than a byte, and neither the output nor
 * the drafts hold it (g->lo on). SmolLM2 spelled forced keys `c` `ont`
 * `in` `en` `t`, `m` `illi` `on` `s`, `ac` `t` `iv` `e` where the encoder
 * writes `continent`, `millions`, `active`: such a draft is mostly
 * rejected, with every draft after it, so the chain stops after it. */
static bool splits_word(sd_constraint *c, const guess_ctx *g, const sd_tok *tok, int32_t id, bool split) {
    size_t l = 0;
    const char *p = sd_tok_piece(tok, id, &l);
    if (!split || l < 2 || !is_letter(p[0])) return false;
    const int32_t *toks = sd_constraint_tokens(c);
    for (int32_t j = g->lo, n = sd_constraint_len(c); j < n; j++)
        if (toks[j] == id) return false;
    return true;
}

/* Whether the drafts are still inside the word the output ended in: split
 * until a drafted piece holds a byte other than a letter. */
static bool still_split(bool split, const sd_tok *tok, int32_t id) {
    size_t l = 0;
    const char *p = sd_tok_piece(tok, id, &l);
    for (size_t i = 0; split && i < l; i++) split = is_letter(p[i]);
    return split;
}

/* How many of the forced bytes fb[n] the output wrote from earlier token
 * j's start on (the drafts excluded). */
static size_t wrote_before(const guess_ctx *g, int32_t j, const char *fb, size_t n) {
    size_t at = g->start[j - g->lo], end = g->start[g->n - g->lo], m = 0;
    while (m < n && at + m < end && g->bytes[at + m] == fb[m]) m++;
    return m;
}

/* Advances c past id and appends it to the drafts. */
static bool draft_push(sd_constraint *c, guess_ctx *g, const sd_tok *tok, int32_t id, int32_t *ids, int32_t *nf) {
    if (sd_constraint_advance(c, id) != SD_OK) return false;
    ids[(*nf)++] = id;
    return bytes_add(g, tok, id);
}

int32_t sd_constraint_forced_tokens(sd_constraint *c, const sd_tok *tok, int32_t k, int32_t *ids) {
    if (!c || !tok || !ids || k <= 0) return 0;
    int32_t base = sd_constraint_len(c), nf = 0;
    guess_ctx g;
    bool ok = guess_init(&g, c, tok);
    bool split = ok && g.len && is_letter(g.bytes[g.len - 1]); /* the output ends inside a word */
    while (ok && nf < k && !sd_constraint_ended(c)) {
        char bytes[256];
        size_t n = sd_constraint_forced_bytes(c, bytes, sizeof bytes);
        if (!n && !blocked_by_space(c)) break;
        /* at a spacing choice, a byte of context; for more whitespace it
         * must reach past the whitespace before to the byte that makes the
         * structural point (`{`, `,`): "more spaces after spaces" is a guess
         * the model rarely confirms */
        int32_t j = guess_token(&g, c, tok, n ? 0 : 1, n ? 0 : trailing_space(&g) + 1, bytes, n), *enc = NULL,
                before = nf, t = j >= 0 ? g.toks[j] : -1;
        size_t n_enc = 0;
        if (n && sd_tok_encode(tok, bytes, n, false, &enc, &n_enc) != SD_OK) break;
        /* forced bytes: the earlier token unless the encoder's first one
         * covers more of them (a short earlier token, `c` of another key,
         * splits a word the model writes whole) and the output did not go
         * on from that token with those bytes (it wrote them before, split
         * its own way: `s` `ku` where the encoder has `sk` `u`) */
        if (t >= 0 && (n_enc < 2 || piece_len(tok, t) >= piece_len(tok, enc[0]) ||
                       wrote_before(&g, j, bytes, n) >= piece_len(tok, enc[0]))) {
            free(enc);
            ok = draft_push(c, &g, tok, t, ids, &nf);
            split = still_split(split, tok, t);
            continue;
        }
        /* the encoder's tokens, all but the last (it ends where the forced
         * bytes do, and the model usually writes a longer token there) */
        bool stop = false;
        for (size_t i = 0; ok && !stop && nf < k && i + 1 < n_enc; i++) {
            stop = splits_word(c, &g, tok, enc[i], split);
            ok = draft_push(c, &g, tok, enc[i], ids, &nf);
            split = still_split(split, tok, enc[i]);
        }
        free(enc);
        if (nf == before || stop) break;
    }
    guess_free(&g);
    return sd_constraint_rollback(c, base) == SD_OK ? nf : 0;
}
