/* chat_impl.h — internals shared by the chat-template formatter's files
 * (chat_template.c: families and recognition; chat_buf.c: the output
 * buffer; chat_tools.c, chat_mistral.c: tools, tool calls and tool turns;
 * chat_json.c: JSON as the templates write it). */
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

/* chat_json.c: json.dumps(json.loads(text), ensure_ascii=False,
 * indent=indent or None) as transformers' tojson filter writes it (keys in
 * their order; Python's number and string forms), appended to b as
 * content. False for text that is not one JSON value (or nests deeper than
 * 64, or holds a lone surrogate or a number Python would print as
 * Infinity). */
bool sd_chat_pyjson(strbuf *b, const char *text, size_t len, int indent);
/* s (n bytes of UTF-8) as json.dumps(s, ensure_ascii=False) writes it
 * (sd_json_quote), appended to b as content. */
void sd_chat_pystr(strbuf *b, const char *s, size_t n);
/* The JSON string text[0, len) decoded, appended to b as content (what a
 * template's '"' + s + '"' writes); false when it is not one string. */
bool sd_chat_json_string(strbuf *b, const char *text, size_t len);
/* Walks the JSON list (object) text[0, len): *at is 0 before the first
 * call; each call gives the next element's (member's) value span
 * [*vf, *vt) and, for an object, its key decoded into key (reset first).
 * 1: an entry; 0: the end (nothing but whitespace after); -1: malformed. */
int sd_chat_json_item(const char *text, size_t len, size_t *at, size_t *vf, size_t *vt);
int sd_chat_json_member(const char *text, size_t len, size_t *at, strbuf *key, size_t *vf, size_t *vt);
/* The value span of member key of the JSON object text[0, len) (the last
 * one when repeated, as Python's dict keeps it); false when it has none or
 * the text is not an object. */
bool sd_chat_json_find(const char *text, size_t len, const char *key, size_t *vf, size_t *vt);

/* Whether the conversation uses tools (tools given, a tool turn, or an
 * assistant turn with tool calls). tt may be NULL. */
bool sd_chat_has_tools(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt);

/* Llama 3.1's template (tools_in_user_message, no builtin tools; 3.2's is
 * the same but for the date), statement by statement, into out; bos: what
 * it writes for bos_token (NULL: left to the tokenizer); date: "Today
 * Date" ("26 Jul 2024" for 3.1). tt may be NULL. */
sd_status sd_chat_format_llama31(strbuf *out, const char *bos, const char *date, const sd_chat_msg *m, size_t n,
                                 const sd_chat_tools *tt, bool gen, char *err, size_t err_cap);

/* Qwen 2.5's template (ChatML, its '# Tools' system text, <tool_call>
 * blocks, consecutive tool turns in one user turn of <tool_response>s),
 * statement by statement; default_system: the template's own system
 * prompt. tt may be NULL. */
sd_status sd_chat_format_qwen25(strbuf *out, const char *default_system, const sd_chat_msg *m, size_t n,
                                const sd_chat_tools *tt, bool gen, char *err, size_t err_cap);

/* chat_mistral.c: Mistral's v3 template (Mistral-7B-Instruct-v0.3,
 * Mistral-Large-2407: [AVAILABLE_TOOLS] before the last user message,
 * [TOOL_CALLS] with 9-character ids, [TOOL_RESULTS] with the call's id, the
 * system prompt in the last user turn when it is the last message),
 * statement by statement; bos NULL: left to the tokenizer. tt may be NULL.
 * tekken: Mistral-Nemo-Instruct-2407's form of the same template (no space
 * after [INST], [AVAILABLE_TOOLS], [TOOL_CALLS] and [TOOL_RESULTS]; an
 * answer's content as it is, with no space before it). */
sd_status sd_chat_format_mistral3(strbuf *out, const char *bos, const char *eos, bool tekken, const sd_chat_msg *m,
                                  size_t n, const sd_chat_tools *tt, char *err, size_t err_cap);

/* For families without tools in their template: the conversation with the
 * tools written as Hermes text (Qwen 2.5's form with compact JSON: the <tools> signatures appended
 * to the system turn, or a system turn of their own first; an assistant's
 * calls as <tool_call> blocks after its content; a tool turn as a user turn
 * of <tool_response>). *out (n_out messages) and *owned (the texts) are
 * malloc'd: free both with sd_chat_hermes_free. */
sd_status sd_chat_hermes(const sd_chat_msg *m, size_t n, const sd_chat_tools *tt, sd_chat_msg **out, size_t *n_out,
                         char ***owned, char *err, size_t err_cap);
void sd_chat_hermes_free(sd_chat_msg **out, char ***owned, size_t n_out);

#endif
