/* chat.h — the model's chat template: read from the model file, recognised
 * by family, and reproduced byte for byte.
 *
 * A chat template is Jinja text shipped with the model (GGUF
 * tokenizer.chat_template; tokenizer_config.json's chat_template or
 * chat_template.jinja in a Hugging Face directory). specd does not run
 * Jinja: it recognises the families in use (ChatML, Llama 3, Llama 2,
 * Mistral [INST], Gemma, Phi-3) by markers in the text and formats
 * conversations as those templates do, including their refusals (Gemma has
 * no system role; Llama 2, Mistral and Gemma demand alternating user and
 * assistant turns). Llama 3.1's, Qwen 2.5's and Mistral v3's templates are
 * reproduced with their tools (sd_chat_tools). A template that uses none of these shapes, or one with
 * features specd does not reproduce (other tools, thinking switches, dates),
 * is refused: the user names the family with --chat-template NAME. A model with
 * no template at all is formatted as ChatML (logged). A template is
 * immutable after creation and safe to share between threads. */
#ifndef SPECD_CHAT_H
#define SPECD_CHAT_H

#include "specd/tokenizer.h"
#include "specd/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sd_chat_family {
    SD_CHAT_FAMILY_UNSPECIFIED = 0,
    SD_CHAT_FAMILY_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen, OpenHermes) */
    SD_CHAT_FAMILY_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> (3.1, 3.2: tools, a date) */
    SD_CHAT_FAMILY_LLAMA2,  /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s> */
    SD_CHAT_FAMILY_MISTRAL, /* <s>[INST] ... [/INST]...</s> (no system role) */
    SD_CHAT_FAMILY_GEMMA,   /* <bos><start_of_turn>user\n...<end_of_turn>\n, assistant is "model" */
    SD_CHAT_FAMILY_PHI3,    /* <|user|>\n...<|end|>\n */
} sd_chat_family;

typedef struct sd_chat_template sd_chat_template;

/* Recognises template text (len bytes). SD_ERR_UNSUPPORTED when no family
 * matches (logged, naming --chat-template). Caller frees *out with
 * sd_chat_template_free. The BOS/EOS texts start empty. */
sd_status sd_chat_template_parse(const char *text, size_t len, sd_chat_template **out);

/* The family called name ("chatml", "qwen2.5", "llama3", "llama3.1",
 * "llama3.2", "llama2", "mistral", "mistral-v3", "mistral-nemo", "gemma", "gemma3", "phi3"),
 * with no default system prompt except qwen2.5's (Qwen2.5-Instruct's
 * template: "You are Qwen, ..." and its tools form). SD_ERR_INVALID_ARG
 * (logged, with the list) for another name. Caller frees *out. */
sd_status sd_chat_template_named(const char *name, sd_chat_template **out);

/* The names sd_chat_template_named accepts, for --help: "chatml, llama3, ...". */
const char *sd_chat_template_names(void);

/* The model's template: name when not NULL (the --chat-template override),
 * else the text read from w (GGUF metadata; for a Hugging Face directory,
 * path/tokenizer_config.json or path/chat_template.jinja), else ChatML. The
 * BOS/EOS texts are tok's; when tok adds BOS itself, the BOS the template
 * writes first is left out so it is never doubled. Errors are logged; an
 * unrecognised template names --chat-template. Caller frees *out. */
sd_status sd_chat_template_from_model(const sd_weights *w, const char *path, const sd_tok *tok, const char *name,
                                      sd_chat_template **out);

/* Sets the texts the template writes for bos_token and eos_token (copied;
 * NULL = ""), and whether the leading BOS is left to the tokenizer. */
sd_status sd_chat_template_set_tokens(sd_chat_template *t, const char *bos, const char *eos, bool tokenizer_adds_bos);

sd_chat_family sd_chat_template_family(const sd_chat_template *t);
/* The family's name as sd_chat_template_named takes it (static string). */
const char *sd_chat_template_name(const sd_chat_template *t);
/* The default system prompt the template inserts, or NULL. Borrowed. */
const char *sd_chat_template_default_system(const sd_chat_template *t);

/* Formats n >= 1 messages (roles "system", "user", "assistant"; the caller
 * bounds their count and size, e.g. SD_MAX_CHAT_MESSAGES on the wire) as the template does, opening the assistant turn
 * when add_generation_prompt (families without that switch ignore it). On
 * success *out is malloc'd (caller frees with free()). A conversation the
 * template refuses (unknown role, system role where there is none, turns
 * that do not alternate) gives SD_ERR_INVALID_ARG and a readable reason in
 * err (err_cap bytes, may be 0). Thread-safe. */
sd_status sd_chat_template_format(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                  bool add_generation_prompt, char **out, char *err, size_t err_cap);

/* sd_chat_template_format that also marks user text: *content (malloc'd,
 * caller frees; strlen(*out) bytes, NULL when *out is "") holds 1 for each
 * byte of *out that came from a message's content or the system prompt, 0
 * for the template's markup (Llama 2's <<SYS>> lines, plain text, count as
 * content). */
sd_status sd_chat_template_format_masked(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                         bool add_generation_prompt, char **out, uint8_t **content, char *err,
                                         size_t err_cap);

/* Formats the conversation and tokenizes it in one pass with special tokens
 * matched in the template's markup only (sd_tok_encode_masked): a
 * "<|eot_id|>" or "<|im_start|>" typed in a message stays text, so a user
 * cannot open a turn of another role. For messages without special-token
 * text the ids equal sd_tok_encode(formatted, parse_special). Does not add
 * BOS beyond what the template writes. *ids is malloc'd (caller frees);
 * *text (when text != NULL) gets the formatted string (caller frees). Errors
 * as sd_chat_template_format. Thread-safe. */
sd_status sd_chat_template_encode(const sd_chat_template *t, const sd_tok *tok, const sd_chat_msg *msgs, size_t n,
                                  bool add_generation_prompt, int32_t **ids, size_t *n_ids, char **text, char *err,
                                  size_t err_cap);

/* Tools in a conversation (OpenAI's tools, an assistant's tool_calls, tool
 * turns). The templates of Llama 3.1 / 3.2, Qwen 2.5 and Mistral v3
 * (Mistral-7B-Instruct-v0.3) render them exactly as their Jinja does: Llama
 * 3.1 the functions as indented JSON in the first user turn, a call as
 * {"name": ..., "parameters": ...}, a tool's answer in an ipython turn;
 * Qwen 2.5 a '# Tools' system text, <tool_call> blocks, answers as
 * <tool_response> in a user turn; Mistral [AVAILABLE_TOOLS] before the last
 * user turn, [TOOL_CALLS] with each call's 9-character id, [TOOL_RESULTS]
 * with the tool turn's tool_call_id (both required, as its template
 * demands). Every other family gets the Hermes text (Qwen's form, compact
 * JSON). All of it is marked as content. */
typedef struct sd_chat_tools {
    const char *tools; /* a JSON list of tools ({"type": "function", "function": {...}}), or NULL */
    /* NULL, or one entry per message: an assistant's calls as a JSON list
     * of {"name": ..., "arguments": {...}, "id": ...} ("id" optional but
     * for Mistral), or NULL */
    const char *const *tool_calls;
    /* NULL, or one entry per message: a tool turn's tool_call_id, or NULL */
    const char *const *tool_call_ids;
} sd_chat_tools;

/* sd_chat_template_format_masked with tools (tt may be NULL; content may
 * be NULL) and "tool" turns allowed. JSON that does not parse, or a
 * conversation the template refuses (Llama 3.1: two calls in one turn, no
 * user turn to hold the tools; Mistral: an id that is not 9 characters), is
 * SD_ERR_INVALID_ARG with the reason. */
sd_status sd_chat_template_format_tools(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                        const sd_chat_tools *tt, bool add_generation_prompt, char **out,
                                        uint8_t **content, char *err, size_t err_cap);
/* sd_chat_template_encode with tools (tt may be NULL). */
sd_status sd_chat_template_encode_tools(const sd_chat_template *t, const sd_tok *tok, const sd_chat_msg *msgs, size_t n,
                                        const sd_chat_tools *tt, bool add_generation_prompt, int32_t **ids,
                                        size_t *n_ids, char **text, char *err, size_t err_cap);

void sd_chat_template_free(sd_chat_template **t);

#ifdef __cplusplus
}
#endif
#endif
