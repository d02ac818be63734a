/* tokenizer_core.h — the tokenizer's tables and the pieces its files share.
 *
 * The tokenizer is one immutable struct built by tokenizer.c and read by
 * tokenizer_encode.c (special tokens, pre-tokenizer, byte-level BPE),
 * tokenizer_spm.c (SentencePiece-style BPE) and tokenizer_decode.c. The
 * struct body lives here, not in the public header, so the handle stays
 * opaque to everything outside these files. */
#ifndef SPECD_TOKENIZER_CORE_H
#define SPECD_TOKENIZER_CORE_H

#include "tokenizer_impl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define MAX_PRE_REGEX    2
#define SPECIAL_SCAN_MAX 32 /* a bucket of special tokens up to this size is scanned, not hashed */

/* Log-safe preview of a token text: at most 48 bytes. */
#define PREVIEW(tx) (int)((tx).len > 48 ? 48 : (tx).len), (tx).ptr

typedef struct merge_slot {
    uint64_t key;   /* (left id << 32) | right id */
    int32_t rank;   /* -1: empty slot */
    int32_t result; /* id of the merged token */
} merge_slot;

/* The two ways of splitting text into symbols and merging them. */
typedef enum sd_tok_algo {
    SD_TOK_ALGO_BYTE_BPE = 0, /* GPT-2 byte-level BPE ("gpt2") */
    SD_TOK_ALGO_SPM = 1,      /* SentencePiece-style BPE over characters ("llama") */
} sd_tok_algo;

struct sd_tok {
    sd_tok_algo algo;
    int32_t n_vocab;
    char *text_arena;  /* token texts, back to back */
    size_t *text_off;  /* [n_vocab + 1] */
    char *piece_arena; /* decoded bytes of each token, NUL after each */
    size_t *piece_off; /* [n_vocab + 1]; piece i ends 1 before piece_off[i+1] */
    int32_t *types;    /* [n_vocab] */

    int32_t *tok_slots; /* text -> id, -1 empty; capacity tok_mask + 1 */
    size_t tok_mask;
    merge_slot *merge_slots; /* (left, right) -> rank; NULL for SPM by score */
    size_t merge_mask;

    /* byte-level BPE: each byte's symbol token; SPM: each byte's <0xNN>
     * fallback token. The unknown token where the vocabulary lacks it. */
    int32_t byte_token[256];
    char byte_sym[256][2]; /* UTF-8 of each byte's symbol (U+0021..U+0143: 1 or 2 bytes) */
    uint8_t byte_sym_len[256];

    /* SPM by score (GGUF): merge priority of each token as a dense rank of
     * its score, best (highest score) first; NULL when merges are ranked by
     * a merge list (tokenizer.json) or for byte-level BPE. */
    int32_t *score_rank;
    sd_tok_space_prefix space_prefix; /* SPM: when a "▁" is put before a text fragment */
    /* SPM: byte b followed by "▁" occurs inside some token that merging can
     * produce. Where it does not, no merge crosses the gap before that "▁",
     * so the text is merged word by word (a small heap per word). */
    bool joins_mark[256];

    uint8_t *rstrip;      /* [n_vocab] or NULL: special tokens that swallow the whitespace after them */
    int32_t *special_ids; /* control/user-defined ids, by first byte then longest first */
    size_t n_special;
    size_t special_start[257]; /* bucket of first byte b: [special_start[b], special_start[b+1]) */
    size_t *special_lens;      /* distinct lengths of a big bucket's tokens, longest first */
    size_t lens_start[257];    /* first byte b: [lens_start[b], lens_start[b+1]); empty: scan the bucket */

    pcre2_code *pre_re[MAX_PRE_REGEX];
    int n_pre_re;
    bool ignore_merges; /* whole piece found in the vocabulary wins (Llama 3) */

    int32_t bos, eos, unk, pad;
    bool add_bos, add_eos;
    int32_t eog[8];
    int n_eog;
    uint64_t vocab_hash;
    int32_t n_core; /* ids below it are the tokenizer's; the rest is unused padding */
};

static inline const char *sd_tok_text_of(const sd_tok *t, int32_t id, size_t *len) {
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text_arena + t->text_off[id];
}

/* Id of the token whose text is s[0..len), or -1. O(len). */
int32_t sd_tok_lookup_text(const sd_tok *t, const char *s, size_t len);
/* The merge of (left, right), or NULL. O(1). */
const merge_slot *sd_tok_lookup_merge(const sd_tok *t, int32_t left, int32_t right);
/* Classifies the UTF-8 sequence at s[0..len), len >= 1: returns n > 0 for a
 * complete character of n bytes (*cp set), 0 for a valid but unfinished
 * prefix, and -n for an invalid maximal subpart of n >= 1 bytes. */
int sd_tok_utf8_scan(const unsigned char *s, size_t len, uint32_t *cp);

/* ---- encoding workspace, one per encode call ---- */
typedef struct bpe_sym {
    int32_t id; /* -1: merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank, pos; /* heap order: rank, then leftmost */
    int32_t right_pos;
    int32_t left, right, result; /* byte-level: ids; SPM: byte lengths of the two symbols */
} bpe_cand;

typedef struct enc_ctx {
    const sd_tok *t;
    pcre2_match_data *md[MAX_PRE_REGEX];
    int32_t *ids;
    size_t n_ids, cap_ids;
    bpe_sym *syms;
    size_t cap_syms;
    bpe_cand *heap;
    size_t n_heap, cap_heap;
    char *symtext; /* byte-level text of a piece (ignore_merges lookup); SPM: the escaped fragment */
    size_t cap_symtext;
    int32_t *sym_start; /* SPM: [cap_sym_start] byte offset of each symbol in symtext */
    size_t cap_sym_start;
} enc_ctx;

/* Grows *p (elements of elem bytes, capacity *cap) to hold need elements. */
sd_status sd_tok_grow(void **p, size_t *cap, size_t need, size_t elem);
sd_status sd_tok_push_id(enc_ctx *c, int32_t id);
sd_status sd_tok_heap_push(enc_ctx *c, bpe_cand cand);
bpe_cand sd_tok_heap_pop(enc_ctx *c);

/* SPM: encodes one fragment of raw text (no special tokens in it), putting
 * a "▁" before it when prefix; appends its ids to c. */
sd_status sd_tok_spm_fragment(enc_ctx *c, const char *s, size_t len, bool prefix);
/* SPM: the decoded bytes of token text tx of type `type` into out (room for
 * tx.len bytes); returns their count. */
size_t sd_tok_spm_piece(sd_tok_text tx, int32_t type, char *out);
/* SPM: byte fallback tokens and score ranks, after the texts are built. */
sd_status sd_tok_spm_build(sd_tok *t, const sd_tok_spec *spec);

#endif
