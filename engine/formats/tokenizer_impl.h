/* tokenizer_impl.h — the tokenizer's internal constructor.
 *
 * sd_tok_from_gguf only gathers the tokenizer.ggml.* arrays out of a GGUF
 * into an sd_tok_spec (views, nothing copied) and calls sd_tok_build, which
 * validates everything and builds the immutable tables. Keeping the two apart
 * lets tests build small vocabularies directly from C literals and lets the
 * tokenizer.json loader (tokenizer_hf.c) reuse the same constructor. */
#ifndef SPECD_TOKENIZER_IMPL_H
#define SPECD_TOKENIZER_IMPL_H

#include "specd/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A byte string view (not NUL-terminated). */
typedef struct sd_tok_text {
    const char *ptr;
    size_t len;
} sd_tok_text;

/* GGUF token types (tokenizer.ggml.token_type values). */
enum {
    SD_TOK_TYPE_UNDEFINED = 0,
    SD_TOK_TYPE_NORMAL = 1,
    SD_TOK_TYPE_UNKNOWN = 2,
    SD_TOK_TYPE_CONTROL = 3,
    SD_TOK_TYPE_USER_DEFINED = 4,
    SD_TOK_TYPE_UNUSED = 5,
    SD_TOK_TYPE_BYTE = 6,
};

/* SentencePiece: where a "▁" is put before a fragment of text (the text
 * between special tokens). */
typedef enum sd_tok_space_prefix {
    SD_TOK_SPACE_PREFIX_NONE = 0,
    SD_TOK_SPACE_PREFIX_ALWAYS = 1, /* every fragment (llama.cpp's add_space_prefix; HF Prepend normalizer) */
    /* HF Metaspace pre-tokenizer: never before a fragment that starts with
     * a space already; "first": only a fragment at the start of the text. */
    SD_TOK_SPACE_PREFIX_FIRST = 2,
    SD_TOK_SPACE_PREFIX_META_ALWAYS = 3,
} sd_tok_space_prefix;

/* Everything sd_tok_build needs; all views are borrowed for the call only. */
typedef struct sd_tok_spec {
    sd_tok_text model; /* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE) */
    sd_tok_text pre;   /* tokenizer.ggml.pre: regex set name; empty = "default" (gpt2 only) */
    size_t n_tokens;
    const sd_tok_text *tokens; /* [n_tokens] token texts (byte-level, or SPM pieces with "▁") */
    const int32_t *types;      /* [n_tokens] token types, or NULL (all normal) */
    const float *scores;       /* llama: [n_tokens] merge scores, higher first; NULL: merges rank instead */
    size_t n_merges;
    const sd_tok_text *merges;       /* [n_merges] "left right", rank = index (gpt2; llama without scores) */
    const uint32_t *merge_left_len;  /* [n_merges] bytes of each merge's left part (the space after it
                                        separates), or NULL: the first space after the first byte */
    int64_t bos, eos, unk, pad, eot; /* token ids, -1 when absent */
    bool add_bos, add_eos;
    sd_tok_space_prefix space_prefix; /* llama only */
    const uint8_t *rstrip;            /* [n_tokens] nonzero: a special token that swallows the whitespace
                                         after it (HF added-token rstrip; Phi-3), or NULL: none */
} sd_tok_spec;

/* Returns a spec with no vocabulary, every id -1, model "gpt2", pre "default". */
sd_tok_spec sd_tok_spec_default(void);

/* Validates spec and builds a tokenizer (caller frees with sd_tok_free).
 * SD_ERR_UNSUPPORTED for an unknown model or pre-tokenizer, SD_ERR_FORMAT for
 * inconsistent data (the first bad item is logged). */
sd_status sd_tok_build(const sd_tok_spec *spec, sd_tok **out);

/* Pre-tokenizer set i (0, 1, ... until false): its name, its regexes
 * (applied in order, matches isolated) and whether whole pieces found in the
 * vocabulary skip BPE. For loaders that recognise a pre-tokenizer by its
 * regexes (tokenizer.json). Borrowed static data. */
bool sd_tok_pre_def_at(size_t i, const char **name, const char *const **regexes, int *n_regexes, bool *ignore_merges);

/* Special tokens and flags that a Hugging Face checkpoint keeps outside
 * tokenizer.json: texts from tokenizer_config.json win (as in llama.cpp's
 * converter), ids from config.json are the fallback. */
typedef struct sd_tok_hf_ids {
    const char *bos_text, *eos_text, *pad_text; /* NULL when absent or not in the vocabulary */
    int64_t bos, eos, eot, pad;                 /* ids; -1 when absent */
    int add_bos;                                /* 1 / 0, or -1: from the post-processor */
    int32_t n_vocab;                            /* config vocab_size: pad the vocabulary to it (0: don't) */
} sd_tok_hf_ids;

/* Every id -1, every text NULL, add_bos -1, n_vocab 0. */
sd_tok_hf_ids sd_tok_hf_ids_default(void);

/* Builds a tokenizer from the len bytes of a tokenizer.json (byte-level BPE:
 * model BPE without byte fallback, no normalizer, a ByteLevel pre-tokenizer
 * alone or after Digits / Split steps that match one of the known sets).
 * ids may be NULL. Ids not in the file (up to ids->n_vocab) become unused
 * "[PAD<id>]" tokens, as llama.cpp's converter does. Caller frees *out with
 * sd_tok_free. SD_ERR_UNSUPPORTED for another kind of tokenizer,
 * SD_ERR_FORMAT for a malformed file (the reason is logged). */
sd_status sd_tok_from_hf_json(const char *json, size_t len, const sd_tok_hf_ids *ids, sd_tok **out);

#ifdef __cplusplus
}
#endif
#endif
