/* tokenizer.h — byte-level BPE (GPT-2 style) and SentencePiece-style BPE
 * (Llama 2, Mistral, Gemma, Phi-3) from GGUF metadata or tokenizer.json.
 *
 * Encoding: user-defined tokens are matched first, control tokens too when
 * allowed; for byte-level BPE the rest is split by the pre-tokenizer regex
 * chosen from tokenizer.ggml.pre (PCRE2, Unicode classes), each piece is
 * mapped to byte-level symbols and merged by BPE rank; for SentencePiece
 * spaces become "▁", characters merge by piece score (or merge rank) and
 * characters outside the vocabulary fall back to <0xNN> byte tokens.
 * Decoding maps tokens back to raw bytes; the incremental decoder
 * holds back the bytes of an unfinished UTF-8 character so a stream never
 * emits half a character. A tokenizer is immutable after creation and its
 * functions are thread-safe. */
#ifndef SPECD_TOKENIZER_H
#define SPECD_TOKENIZER_H

#include "specd/common.h"
#include "specd/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_tok sd_tok;

/* Builds a tokenizer from g's tokenizer.ggml.* metadata: model "gpt2"
 * (pre-tokenizers "smollm", "llama-bpe"/"llama3", "qwen2", "gpt2" and
 * "default" at least) or "llama" (SentencePiece with scores; add_bos and
 * add_space_prefix default to true as in llama.cpp). The tokenizer copies what it needs: g may be closed afterwards.
 * Caller frees *out with sd_tok_free. */
sd_status sd_tok_from_gguf(const sd_gguf *g, sd_tok **out);
void sd_tok_free(sd_tok **t);

int32_t sd_tok_n_vocab(const sd_tok *t);
int32_t sd_tok_bos(const sd_tok *t);  /* -1 when the model has none */
int32_t sd_tok_eos(const sd_tok *t);  /* -1 when the model has none */
bool sd_tok_add_bos(const sd_tok *t); /* tokenizer.ggml.add_bos_token */
bool sd_tok_add_eos(const sd_tok *t); /* tokenizer.ggml.add_eos_token */
bool sd_tok_is_spm(const sd_tok *t);  /* SentencePiece-style ("llama") rather than byte-level BPE */
/* True for tokens that end generation (EOS, <|im_end|>, <|eot_id|>...). */
bool sd_tok_is_eog(const sd_tok *t, int32_t id);
/* True for tokens that stand for text (normal, byte and user-defined
 * tokens); false for control, unused and unknown tokens and ids out of
 * range. A constraint on the output's bytes allows only these (and the
 * end-of-generation tokens once it accepts). */
bool sd_tok_is_text(const sd_tok *t, int32_t id);
/* Id of the token whose text is exactly text, or -1. */
int32_t sd_tok_find(const sd_tok *t, const char *text);
/* 64-bit FNV-1a hash over every token's text and type, in id order, up to
 * sd_tok_n_core: two models can share a KV/draft only when their hashes
 * match. Trailing unused tokens (padding to the embedding size: Qwen2.5's
 * 0.5B and 72B differ only there) are left out, so such a pair matches. */
uint64_t sd_tok_vocab_hash(const sd_tok *t);
/* Ids below this are the tokenizer's own; [n_core, n_vocab) are unused
 * padding tokens (none: n_core == n_vocab). */
int32_t sd_tok_n_core(const sd_tok *t);
/* Bytes the tokenizer's tables hold (arenas, hash tables, ranks; not the
 * compiled regexes): what a vocabulary costs in memory. */
size_t sd_tok_memory_bytes(const sd_tok *t);

/* Encodes len bytes of text. User-defined tokens (Gemma's "\n\n", "<tool>")
 * are always matched as single tokens, as Hugging Face and llama.cpp match
 * them. parse_special: also match control tokens like <|im_start|> (off:
 * they are encoded as plain text; always off for text a user supplied, see
 * sd_tok_encode_masked). Does not add BOS or EOS; SentencePiece puts its
 * space prefix before every fragment between special tokens. On success *ids is a malloc'd
 * array (caller frees with free()) of *n_ids tokens. Invalid UTF-8 is encoded
 * byte-wise, as the byte-level model allows. */
sd_status sd_tok_encode(const sd_tok *t, const char *text, size_t len, bool parse_special, int32_t **ids,
                        size_t *n_ids);

/* Encodes len bytes of text with special tokens matched only outside user
 * content: no_special (len bytes; NULL = none) is nonzero on each byte a
 * user supplied, and a special-token match may neither start on nor overlap
 * such a byte. The text between special tokens is split as sd_tok_encode
 * splits it, so when the content holds no special-token text the ids equal
 * sd_tok_encode(text, parse_special = true). *ids as sd_tok_encode. */
sd_status sd_tok_encode_masked(const sd_tok *t, const char *text, size_t len, const uint8_t *no_special, int32_t **ids,
                               size_t *n_ids);

/* Raw bytes of token id (byte-level decoding applied, or for SentencePiece
 * "▁" -> " " and <0xNN> -> the byte; control tokens give their text). Borrowed, valid while t lives; *len set. NULL when out of range. */
const char *sd_tok_piece(const sd_tok *t, int32_t id, size_t *len);

/* Decodes n ids into a malloc'd NUL-terminated string (caller frees with
 * free()); *len gets the byte length. Bytes are concatenated as they are. */
sd_status sd_tok_decode(const sd_tok *t, const int32_t *ids, size_t n, char **text, size_t *len);

/* Incremental decoder for streaming: push tokens one at a time, get only
 * complete UTF-8 characters out. */
typedef struct sd_tok_stream sd_tok_stream;
/* Returns a new stream over t (borrowed; must outlive the stream), caller
 * frees with sd_tok_stream_free; NULL on allocation failure. */
sd_tok_stream *sd_tok_stream_new(const sd_tok *t);
void sd_tok_stream_free(sd_tok_stream **s);
/* Feeds id; writes the bytes that are now complete into out (cap bytes)
 * and sets *out_len. Returns SD_ERR_RANGE for an unknown id and
 * SD_ERR_INVALID_ARG when cap is too small (cap >= 256 always suffices). */
sd_status sd_tok_stream_push(sd_tok_stream *s, int32_t id, char *out, size_t cap, size_t *out_len);
/* Emits whatever is held back (an incomplete tail becomes U+FFFD per byte
 * sequence) at the end of a stream. */
sd_status sd_tok_stream_flush(sd_tok_stream *s, char *out, size_t cap, size_t *out_len);

/* One chat message for sd_tok_chat_format. */
typedef struct sd_chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} sd_chat_msg;

/* Formats messages as ChatML (<|im_start|>role\ncontent<|im_end|>\n ...),
 * adding the default system prompt of the model's template when the first
 * message is not a system one and default_system != NULL, and opening the
 * assistant turn when add_generation_prompt. Result is malloc'd (caller frees).
 * The ChatML family of specd/chat.h, which formats with the model's own
 * template: use that for anything a user talks to; this one is for tests and
 * benchmarks that want ChatML whatever the model. */
sd_status sd_tok_chat_format(const sd_chat_msg *msgs, size_t n, const char *default_system, bool add_generation_prompt,
                             char **out);

/* Tokenizes the chat sd_tok_chat_format would format, with the special
 * tokens placed by the template only: the markup is matched as control
 * tokens, every role and content is encoded as plain text (parse_special
 * off), so "<|im_start|>" typed in a message stays text. For messages
 * without special-token text the ids equal encoding the formatted string
 * with parse_special. Does not add BOS. *ids is malloc'd (caller frees). */
sd_status sd_tok_chat_encode(const sd_tok *t, const sd_chat_msg *msgs, size_t n, const char *default_system,
                             bool add_generation_prompt, int32_t **ids, size_t *n_ids);

#ifdef __cplusplus
}
#endif
#endif
