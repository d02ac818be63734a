/* chat_impl.h — internals shared by the chat-template formatter's files
 * (chat_template.c: families and recognition; chat_buf.c: the output
 * buffer; chat_tools.c: tools, tool calls and tool turns). */
#ifndef SPECD_CHAT_IMPL_H
#define SPECD_CHAT_IMPL_H

#include "specd/chat.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The formatted text and, when mask is tracked, one byte per text byte: 1
 * where the byte is user content (a message's content, the system prompt),
 * 0 in the template's markup. sd_tok_encode_masked matches special tokens in
 * the markup only, so special-token text a user typed stays text. */
typedef struct strbuf {
    char *data;
    uint8_t *mask; /* NULL unless tracking */
    size_t len, cap;
    bool track, content, failed;
} strbuf;

void sd_sb_addn(strbuf *b, const char *s, size_t n);
void sd_sb_add(strbuf *b, const char *s);
/* Appends user content (marked in the mask). */
void sd_sb_content(strbuf *b, const char *s, size_t n);
/* Appends user content s (n bytes) with leading and trailing whitespace
 * (Python's str.strip(), Jinja's trim) removed. */
void sd_sb_content_stripped(strbuf *b, const char *s, size_t n);

/* chat_tools.c: json.dumps(json.loads(text), ensure_ascii=False,
 * indent=indent or None) as transformers' tojson filter writes it (keys in
 * their order; Python's number and string forms), appended to b as
 * content. False for text that is not one JSON value (or nests deeper than
 * 64, or holds a lone surrogate or a number Python would print as
 * Infinity). */
bool sd_chat_pyjson(strbuf *b, const char *text, size_t len, int indent);

/* Whether the conversation uses tools (tools given, a tool turn, or an
 * assistant turn with tool calls). tt may be NULL. */
bool sd_chat_has_tools(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt);

/* Llama 3.1's template (tools_in_user_message, no builtin tools; 3.2's is
 * the same but for the date), statement by statement, into out; bos: what
 * it writes for bos_token (NULL: left to the tokenizer); date: "Today
 * Date" ("26 Jul 2024" for 3.1). tt may be NULL. */
sd_status sd_chat_format_llama31(strbuf *out, const char *bos, const char *date, const sd_chat_msg *m, size_t n,
                                 const sd_chat_tools *tt, bool gen, char *err, size_t err_cap);

/* For families without tools in their template: the conversation with the
 * tools written as Hermes / Qwen 2.5 text (the <tools> signatures appended
 * to the system turn, or a system turn of their own first; an assistant's
 * calls as <tool_call> blocks after its content; a tool turn as a user turn
 * of <tool_response>). *out (n_out messages) and *owned (the texts) are
 * malloc'd: free both with sd_chat_hermes_free. */
sd_status sd_chat_hermes(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt, sd_chat_msg **out, size_t *n_out,
                         char ***owned, char *err, size_t err_cap);
void sd_chat_hermes_free(sd_chat_msg **out, char ***owned, size_t n_out);

#endif
