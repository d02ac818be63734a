/* chat_template.c — chat templates read from the model, recognised by
 * family, reproduced byte for byte (see specd/chat.h).
 *
 * Recognition looks for each family's distinctive expressions in the
 * template text (the ones the published templates of SmolLM2, Llama 3,
 * Llama 2, Mistral/Mixtral, Gemma and Phi-3 use; fixtures and a jinja2
 * oracle in tests/data/chat_templates/ and tests/ref/test_chat_templates.py).
 * Exactly one family must match, and none of the features specd does not
 * reproduce may appear; anything else is refused rather than guessed, since
 * a wrong format degrades a model's answers silently. A general Jinja
 * interpreter was rejected: a large attack surface for the few shapes in
 * use, and an exact hand-written formatter per family is easy to check.
 *
 * The formatters follow their template's control flow statement by
 * statement (alternation checks, where the system prompt goes, trim/strip,
 * BOS/EOS), so edge cases such as an empty system prompt come out as Jinja
 * renders them. */
#include "specd/chat.h"

#include "chat_impl.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_TEMPLATE_FILE_BYTES (16u << 20) /* tokenizer_config.json, chat_template.jinja */
#define MAX_DEFAULT_SYSTEM      4096u       /* a ChatML default system prompt */

enum {
    VARIANT_EOS_SPACE = 1,       /* Mistral v0.1: eos_token + ' ' after an answer */
    VARIANT_SYSTEM_NONEMPTY = 2, /* Phi-3.5: a system turn only when its content is not empty */
    VARIANT_ALWAYS_OPEN = 4,     /* Llama 3 (Mllama conversion): assistant header whatever add_generation_prompt */
    VARIANT_SYSTEM_PREFIX = 8,   /* Gemma 3: a system message's content + "\n\n" opens the first turn */
    VARIANT_ROLES_ONLY = 16,     /* Qwen2.5 ChatML: system/user/assistant turns, or Qwen's tools (chat_tools.c) */
    VARIANT_LLAMA31 = 32,        /* Llama 3.1: a dated system turn, tools (chat_tools.c) */
    VARIANT_DATE_TODAY = 64,     /* Llama 3.2: that date is today's (strftime_now("%d %b %Y"), local time) */
    VARIANT_MISTRAL3 = 128,      /* Mistral v3 (7B-Instruct-v0.3): system in the last turn, tools (chat_mistral.c) */
    VARIANT_TEKKEN = 256,        /* with MISTRAL3: Mistral-Nemo's form of it (no spaces after the tags) */
};

struct sd_chat_template {
    sd_chat_family family;
    unsigned variant;
    char *default_system; /* ChatML: inserted when the first turn is not a system one */
    char *bos, *eos;      /* what the template writes for bos_token/eos_token */
    bool drop_leading_bos;
};

static const struct {
    sd_chat_family family;
    const char *name;
} FAMILY_NAMES[] = {
    {SD_CHAT_FAMILY_CHATML, "chatml"},   {SD_CHAT_FAMILY_LLAMA3, "llama3"}, {SD_CHAT_FAMILY_LLAMA2, "llama2"},
    {SD_CHAT_FAMILY_MISTRAL, "mistral"}, {SD_CHAT_FAMILY_GEMMA, "gemma"},   {SD_CHAT_FAMILY_PHI3, "phi3"},
};
#define N_FAMILIES (sizeof FAMILY_NAMES / sizeof FAMILY_NAMES[0])

const char *sd_chat_template_names(void) {
    return "chatml, qwen2.5, llama3, llama3.1, llama3.2, llama2, mistral, mistral-v3, mistral-nemo, gemma, gemma3, "
           "phi3";
}

/* ---- formatting ---- */

typedef struct fmt {
    const sd_chat_template *t;
    strbuf out;
    char *err;
    size_t err_cap;
} fmt;

static sd_status refuse(fmt *f, const char *format, ...) __attribute__((format(printf, 2, 3)));
static sd_status refuse(fmt *f, const char *format, ...) {
    if (f->err_cap) {
        va_list ap;
        va_start(ap, format);
        vsnprintf(f->err, f->err_cap, format, ap);
        va_end(ap);
    }
    return SD_ERR_INVALID_ARG;
}

static bool is_role(const sd_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

/* bos_token, except the first one when the tokenizer adds BOS itself. */
static void add_bos(fmt *f) {
    if (f->out.len == 0 && f->t->drop_leading_bos) return;
    sd_sb_add(&f->out, f->t->bos);
}

/* Llama 2, Mistral, Gemma: (role == 'user') != (index % 2 == 0) raises. */
static sd_status check_alternation(fmt *f, const sd_chat_msg *m, size_t index, size_t msg_index) {
    if (is_role(m, "user") != (index % 2 == 0))
        return refuse(
            f,
            "messages[%zu]: the model's chat template (%s) needs turns that alternate user/assistant/user/..., "
            "got '%s'",
            msg_index, sd_chat_template_name(f->t), m->role);
    return SD_OK;
}

/* ChatML, as sd_tok_chat_format (chat.c) writes it byte for byte (tests
 * compare the two), with the content marked. */
static void chatml_turn(fmt *f, const char *role, const char *content) {
    sd_sb_add(&f->out, "<|im_start|>");
    sd_sb_add(&f->out, role);
    sd_sb_add(&f->out, "\n");
    sd_sb_content(&f->out, content, strlen(content));
    sd_sb_add(&f->out, "<|im_end|>\n");
}

static sd_status format_chatml(fmt *f, const sd_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n && (f->t->variant & VARIANT_ROLES_ONLY); i++)
        if (!is_role(&m[i], "system") && !is_role(&m[i], "user") && !is_role(&m[i], "assistant"))
            return refuse(f, "messages[%zu]: role '%s' is not one the model's chat template (chatml) formats as a turn",
                          i, m[i].role);
    if (f->t->default_system && !is_role(&m[0], "system")) chatml_turn(f, "system", f->t->default_system);
    for (size_t i = 0; i < n; i++) chatml_turn(f, m[i].role, m[i].content);
    if (gen) sd_sb_add(&f->out, "<|im_start|>assistant\n");
    return SD_OK;
}

static sd_status format_llama3(fmt *f, const sd_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0) add_bos(f);
        sd_sb_add(&f->out, "<|start_header_id|>");
        sd_sb_add(&f->out, m[i].role);
        sd_sb_add(&f->out, "<|end_header_id|>\n\n");
        sd_sb_content_stripped(&f->out, m[i].content, strlen(m[i].content));
        sd_sb_add(&f->out, "<|eot_id|>");
    }
    if (gen || (f->t->variant & VARIANT_ALWAYS_OPEN))
        sd_sb_add(&f->out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return SD_OK;
}

/* Llama 2: a leading system message is folded into the first turn inside
 * <<SYS>>; every user turn opens with BOS; content is strip()ped. */
static sd_status format_llama2(fmt *f, const sd_chat_msg *m, size_t n) {
    size_t start = 0;
    const char *system = NULL;
    if (is_role(&m[0], "system")) {
        system = m[0].content;
        start = 1;
    }
    strbuf content = {0}; /* all of it goes out as content: <<SYS>> is plain text, no special token */
    sd_status st = SD_OK;
    for (size_t i = start; i < n && st == SD_OK; i++) {
        size_t index = i - start;
        if ((st = check_alternation(f, &m[i], index, i)) != SD_OK) break;
        content.len = 0;
        if (index == 0 && system) {
            sd_sb_add(&content, "<<SYS>>\n");
            sd_sb_add(&content, system);
            sd_sb_add(&content, "\n<</SYS>>\n\n");
        }
        sd_sb_add(&content, m[i].content);
        if (content.failed) break;
        if (is_role(&m[i], "user")) {
            add_bos(f);
            sd_sb_add(&f->out, "[INST] ");
            sd_sb_content_stripped(&f->out, content.data, content.len);
            sd_sb_add(&f->out, " [/INST]");
        } else if (is_role(&m[i], "assistant")) {
            sd_sb_add(&f->out, " ");
            sd_sb_content_stripped(&f->out, content.data, content.len);
            sd_sb_add(&f->out, " ");
            sd_sb_add(&f->out, f->t->eos);
        } /* a later system turn in an assistant slot: the template writes nothing */
    }
    if (content.failed) f->out.failed = true;
    free(content.data);
    return st;
}

static sd_status format_mistral(fmt *f, const sd_chat_msg *m, size_t n) {
    add_bos(f);
    for (size_t i = 0; i < n; i++) {
        sd_status st = check_alternation(f, &m[i], i, i);
        if (st != SD_OK) return st;
        if (is_role(&m[i], "user")) {
            sd_sb_add(&f->out, "[INST] ");
            sd_sb_content(&f->out, m[i].content, strlen(m[i].content));
            sd_sb_add(&f->out, " [/INST]");
        } else if (is_role(&m[i], "assistant")) {
            sd_sb_content(&f->out, m[i].content, strlen(m[i].content));
            sd_sb_add(&f->out, f->t->eos);
            if (f->t->variant & VARIANT_EOS_SPACE) sd_sb_add(&f->out, " ");
        } else {
            return refuse(
                f, "messages[%zu]: the model's chat template (mistral) supports user and assistant roles only", i);
        }
    }
    return SD_OK;
}

static sd_status format_gemma(fmt *f, const sd_chat_msg *m, size_t n, bool gen) {
    add_bos(f);
    size_t first = 0; /* Gemma 3: messages[0] as a system prefix, the turns after it */
    if (n > 0 && is_role(&m[0], "system")) {
        if (!(f->t->variant & VARIANT_SYSTEM_PREFIX))
            return refuse(f, "messages[0]: the model's chat template (gemma) has no system role (put the instructions "
                             "in the first user message)");
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        sd_status st = check_alternation(f, &m[i], i - first, i);
        if (st != SD_OK) return st;
        sd_sb_add(&f->out, "<start_of_turn>");
        sd_sb_add(&f->out, is_role(&m[i], "assistant") ? "model" : m[i].role);
        sd_sb_add(&f->out, "\n");
        if (first && i == first) { /* not trimmed, as the template adds it */
            sd_sb_content(&f->out, m[0].content, strlen(m[0].content));
            sd_sb_add(&f->out, "\n\n");
        }
        sd_sb_content_stripped(&f->out, m[i].content, strlen(m[i].content));
        sd_sb_add(&f->out, "<end_of_turn>\n");
    }
    if (gen) sd_sb_add(&f->out, "<start_of_turn>model\n");
    return SD_OK;
}

static sd_status format_phi3(fmt *f, const sd_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system") && ((f->t->variant & VARIANT_SYSTEM_NONEMPTY) == 0 || m[i].content[0])) {
            sd_sb_add(&f->out, "<|system|>\n");
        } else if (is_role(&m[i], "user")) {
            sd_sb_add(&f->out, "<|user|>\n");
        } else if (is_role(&m[i], "assistant")) {
            sd_sb_add(&f->out, "<|assistant|>\n");
        } else {
            continue;
        }
        sd_sb_content(&f->out, m[i].content, strlen(m[i].content));
        sd_sb_add(&f->out, "<|end|>\n");
    }
    sd_sb_add(&f->out, gen ? "<|assistant|>\n" : f->t->eos);
    return SD_OK;
}

static sd_status format_family(fmt *f, const sd_chat_msg *msgs, size_t n, bool gen) {
    switch (f->t->family) {
    case SD_CHAT_FAMILY_CHATML: return format_chatml(f, msgs, n, gen);
    case SD_CHAT_FAMILY_LLAMA3: return format_llama3(f, msgs, n, gen);
    case SD_CHAT_FAMILY_LLAMA2: return format_llama2(f, msgs, n);
    case SD_CHAT_FAMILY_MISTRAL: return format_mistral(f, msgs, n);
    case SD_CHAT_FAMILY_GEMMA: return format_gemma(f, msgs, n, gen);
    case SD_CHAT_FAMILY_PHI3: return format_phi3(f, msgs, n, gen);
    case SD_CHAT_FAMILY_UNSPECIFIED: break;
    }
    return SD_ERR_INTERNAL;
}

/* Llama 3.1, Qwen 2.5 and Mistral v3 render tools as their templates do;
 * the other families get them as Hermes text turns (chat_tools.c). */
static sd_status format_with_tools(fmt *f, const sd_chat_msg *msgs, size_t n, const sd_chat_tools *tt, bool gen) {
    const char *bos = f->t->drop_leading_bos ? NULL : f->t->bos;
    if (f->t->family == SD_CHAT_FAMILY_LLAMA3 && (f->t->variant & VARIANT_LLAMA31)) {
        char date[32] = "26 Jul 2024";
        time_t now = time(NULL);
        struct tm tm;
        if ((f->t->variant & VARIANT_DATE_TODAY) && localtime_r(&now, &tm))
            strftime(date, sizeof date, "%d %b %Y", &tm);
        return sd_chat_format_llama31(&f->out, bos, date, msgs, n, tt, gen, f->err, f->err_cap);
    }
    if (f->t->family == SD_CHAT_FAMILY_MISTRAL && (f->t->variant & VARIANT_MISTRAL3))
        return sd_chat_format_mistral3(&f->out, bos, f->t->eos, (f->t->variant & VARIANT_TEKKEN) != 0, msgs, n, tt,
                                       f->err, f->err_cap);
    if (f->t->family == SD_CHAT_FAMILY_CHATML && (f->t->variant & VARIANT_ROLES_ONLY) && sd_chat_has_tools(msgs, n, tt))
        return sd_chat_format_qwen25(&f->out, f->t->default_system, msgs, n, tt, gen, f->err, f->err_cap);
    if (!sd_chat_has_tools(msgs, n, tt)) return format_family(f, msgs, n, gen);
    sd_chat_msg *m2 = NULL;
    char **owned = NULL;
    size_t n2 = 0;
    sd_status st = sd_chat_hermes(msgs, n, tt, &m2, &n2, &owned, f->err, f->err_cap);
    if (st != SD_OK) return st;
    st = format_family(f, m2, n2, gen);
    sd_chat_hermes_free(&m2, &owned, n2);
    return st;
}

/* Formats as sd_chat_template_format_tools; *mask (when mask != NULL) is
 * malloc'd, one byte per byte of *out (1 = user content). */
static sd_status format_conversation(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                     const sd_chat_tools *tt, bool add_generation_prompt, char **out, uint8_t **mask,
                                     char *err, size_t err_cap) {
    if (!t || !out || (!msgs && n) || (!err && err_cap)) return SD_ERR_INVALID_ARG;
    *out = NULL;
    if (mask) *mask = NULL;
    fmt f = {t, {0}, err, err_cap};
    f.out.track = mask != NULL;
    if (err_cap) err[0] = '\0';
    if (n == 0) return refuse(&f, "messages: the conversation is empty");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) return refuse(&f, "messages[%zu]: no role or no content", i);
        if (!is_role(&msgs[i], "system") && !is_role(&msgs[i], "user") && !is_role(&msgs[i], "assistant") &&
            !(tt && is_role(&msgs[i], "tool")))
            return refuse(&f, "messages[%zu].role: '%.32s' (system, user, assistant%s)", i, msgs[i].role,
                          tt ? " or tool" : "");
        if (tt && tt->tool_calls && tt->tool_calls[i] && !is_role(&msgs[i], "assistant"))
            return refuse(&f, "messages[%zu]: tool calls in a '%.32s' turn (assistant only)", i, msgs[i].role);
    }
    sd_status st = format_with_tools(&f, msgs, n, tt, add_generation_prompt);
    sd_sb_add(&f.out, ""); /* a conversation the template renders as nothing still yields "" */
    if (st == SD_OK && f.out.failed) {
        refuse(&f, "out of memory formatting the conversation");
        st = SD_ERR_NOMEM;
    }
    if (st != SD_OK) {
        free(f.out.data);
        free(f.out.mask);
        return st;
    }
    *out = f.out.data;
    if (mask) *mask = f.out.mask;
    return SD_OK;
}

sd_status sd_chat_template_format(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                  bool add_generation_prompt, char **out, char *err, size_t err_cap) {
    return format_conversation(t, msgs, n, NULL, add_generation_prompt, out, NULL, err, err_cap);
}

sd_status sd_chat_template_format_masked(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                         bool add_generation_prompt, char **out, uint8_t **content, char *err,
                                         size_t err_cap) {
    if (!content) return SD_ERR_INVALID_ARG;
    return format_conversation(t, msgs, n, NULL, add_generation_prompt, out, content, err, err_cap);
}

sd_status sd_chat_template_format_tools(const sd_chat_template *t, const sd_chat_msg *msgs, size_t n,
                                        const sd_chat_tools *tt, bool add_generation_prompt, char **out,
                                        uint8_t **content, char *err, size_t err_cap) {
    return format_conversation(t, msgs, n, tt, add_generation_prompt, out, content, err, err_cap);
}

sd_status sd_chat_template_encode(const sd_chat_template *t, const sd_tok *tok, const sd_chat_msg *msgs, size_t n,
                                  bool add_generation_prompt, int32_t **ids, size_t *n_ids, char **text, char *err,
                                  size_t err_cap) {
    return sd_chat_template_encode_tools(t, tok, msgs, n, NULL, add_generation_prompt, ids, n_ids, text, err, err_cap);
}

sd_status sd_chat_template_encode_tools(const sd_chat_template *t, const sd_tok *tok, const sd_chat_msg *msgs, size_t n,
                                        const sd_chat_tools *tt, bool add_generation_prompt, int32_t **ids,
                                        size_t *n_ids, char **text, char *err, size_t err_cap) {
    if (!tok || !ids || !n_ids) return SD_ERR_INVALID_ARG;
    *ids = NULL;
    *n_ids = 0;
    if (text) *text = NULL;
    char *out = NULL;
    uint8_t *content = NULL;
    sd_status st = format_conversation(t, msgs, n, tt, add_generation_prompt, &out, &content, err, err_cap);
    if (st != SD_OK) return st;
    size_t len = strlen(out);
    /* an empty rendering tracked no bytes: nothing to mask */
    st = sd_tok_encode_masked(tok, out, len, len ? content : NULL, ids, n_ids);
    free(content);
    if (st == SD_OK && text)
        *text = out;
    else
        free(out);
    return st;
}

/* ---- recognition ---- */

static bool has(const char *text, size_t len, const char *needle) {
    return memmem(text, len, needle, strlen(needle)) != NULL;
}

static bool has_all(const char *text, size_t len, const char *const *needles) {
    for (; *needles; needles++)
        if (!has(text, len, *needles)) return false;
    return true;
}

/* Features of templates specd does not reproduce: such a template is
 * refused even when its family's markers are there. */
static const char *const UNSUPPORTED[] = {"tools",        "tool_call",         "enable_thinking", "<think>",
                                          "strftime_now", "Cutting Knowledge", "date_string",     NULL};

/* Qwen2.5: ChatML with a default system prompt and a tools branch that is
 * taken when tools are passed (sd_chat_format_qwen25 renders it). */
/* The system prompt its template writes when messages[0] is not a system one. */
static const char QWEN_DEFAULT_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char *const QWEN[] = {"<|im_start|>",          "<|im_end|>",
                                   "message.role",          "message.content",
                                   "<|im_start|>assistant", "(message.role == \"system\" and not loop.first)",
                                   "{%- if tools %}",       NULL};
/* Llama 3.1 / 3.2 (the LLAMA3 markers match them too): Meta's template
 * with tools, dated "26 Jul 2024" when no date_string is passed (specd
 * passes none); 3.2's dates it today with strftime_now (LLAMA32_DATE). */
static const char *const LLAMA31[] = {
    "Cutting Knowledge Date: December 2023",       "tools_in_user_message",
    "{%- set date_string = \"26 Jul 2024\" %}",    "This model only supports single tool-calls at once!",
    "<|start_header_id|>ipython<|end_header_id|>", NULL};
/* Mistral v3 (Mistral-7B-Instruct-v0.3, Mistral-Large-Instruct-2407):
 * [INST] with no space before [/INST], tools, calls and results. */
static const char *const MISTRAL3[] = {
    "{{- bos_token }}",
    "(message == user_messages[-1])",
    "{{- \"[AVAILABLE_TOOLS] [\" }}",
    "{%- for key, val in tool.items() if key != \"return\" %}",
    "{{- '\"' + key + '\": \"' + val + '\"' }}",
    "{{- \"[TOOL_CALLS] [\" }}",
    "{%- set out = tool_call.function|tojson %}",
    "{{- ', \"id\": \"' + tool_call.id + '\"}' }}",
    "{{- \"]\" + eos_token }}",
    "{{- \" \" + message[\"content\"]|trim + eos_token}}",
    "{{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}",
    "{{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}",
    "{%- if loop.last and system_message is defined %}",
    "{{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}",
    "{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}",
    NULL};
/* Mistral-Nemo-Instruct-2407: the v3 template without the spaces. */
static const char *const MISTRAL_TEKKEN[] = {
    "{{- bos_token }}",
    "(message == user_messages[-1])",
    "{{- \"[AVAILABLE_TOOLS][\" }}",
    "{{- \"[TOOL_CALLS][\" }}",
    "{%- set out = tool_call.function|tojson %}",
    "{{- message[\"content\"] + eos_token}}",
    "{{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}",
    "{{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}",
    "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
    NULL};
static const char LLAMA32_DATE[] = "{%- set date_string = strftime_now(\"%d %b %Y\") %}";
static const char *const CHATML[] = {"<|im_start|>",          "<|im_end|>", "message['role']", "message['content']",
                                     "<|im_start|>assistant", NULL};
static const char *const LLAMA3[] = {"<|start_header_id|>",
                                     "message['role']",
                                     "<|end_header_id|>",
                                     "message['content'] | trim",
                                     "<|eot_id|>",
                                     "bos_token",
                                     NULL};
static const char *const LLAMA2[] = {"<<SYS>>",   "<</SYS>>", "bos_token + '[INST] '", "content.strip()", "' [/INST]'",
                                     "eos_token", NULL};
static const char *const MISTRAL[] = {"{{ bos_token }}", "'[INST] ' + message['content'] + ' [/INST]'",
                                      "Only user and assistant roles are supported", "eos_token", NULL};
static const char *const GEMMA[] = {"{{ bos_token }}",
                                    "<start_of_turn>",
                                    "<end_of_turn>",
                                    "'model'",
                                    "message['content'] | trim",
                                    "System role not supported",
                                    NULL};
/* Gemma 3: the system message becomes a prefix of the first turn. */
static const char *const GEMMA3[] = {"{{ bos_token }}",
                                     "<start_of_turn>",
                                     "<end_of_turn>",
                                     "set role = \"model\"",
                                     "message['content'] | trim",
                                     "set first_user_prefix = messages[0]['content'] + '\n\n'",
                                     "(first_user_prefix if loop.first else \"\")",
                                     NULL};
static const char *const PHI3[] = {"'<|system|>", "'<|user|>", "'<|assistant|>", "<|end|>", "{{ eos_token }}", NULL};

/* ChatML's default system prompt: the text of the '<|im_start|>system\n...'
 * literal the template writes when messages[0] is not a system one. */
static sd_status chatml_default_system(const char *text, size_t len, bool qwen, char **out) {
    *out = NULL;
    if (!has(text, len, "messages[0]['role'] != 'system'") &&
        !(qwen && has(text, len, "messages[0]['role'] == 'system'")))
        return SD_OK;
    static const char open[] = "'<|im_start|>system";
    const char *end = text + len;
    /* The first system literal that is plain text up to <|im_end|> (Qwen's
     * template has two others first: the tools header and messages[0]). */
    for (const char *p = memmem(text, len, open, strlen(open)); p;
         p = memmem(p, (size_t)(end - p), open, strlen(open))) {
        p += strlen(open);
        if (p < end && *p == '\n')
            p++;
        else if (end - p >= 2 && p[0] == '\\' && p[1] == 'n')
            p += 2;
        else
            continue;
        const char *q = memmem(p, (size_t)(end - p), "<|im_end|>", 10);
        if (!q || (size_t)(q - p) > MAX_DEFAULT_SYSTEM) continue;
        bool plain = true; /* a plain literal: no quotes, escapes or expressions */
        for (const char *c = p; c < q && plain; c++)
            plain = !(*c == '\'' || *c == '"' || *c == '\\' || *c == '{' || *c == '}' || *c == '\0');
        if (!plain) continue;
        *out = strndup(p, (size_t)(q - p));
        return *out ? SD_OK : SD_ERR_NOMEM;
    }
    return SD_ERR_UNSUPPORTED;
}

static sd_status new_template(sd_chat_family family, sd_chat_template **out) {
    sd_chat_template *t = calloc(1, sizeof *t);
    if (!t) return SD_ERR_NOMEM;
    t->family = family;
    t->bos = strdup("");
    t->eos = strdup("");
    if (!t->bos || !t->eos) {
        sd_chat_template_free(&t);
        return SD_ERR_NOMEM;
    }
    *out = t;
    return SD_OK;
}

static sd_status unrecognised(const char *why) {
    SD_ERROR("chat template: %s; specd formats ChatML, Llama 3, Llama 2, Mistral, Gemma and Phi-3 templates: name the "
             "model's format with --chat-template NAME (%s)",
             why, sd_chat_template_names());
    return SD_ERR_UNSUPPORTED;
}

sd_status sd_chat_template_parse(const char *text, size_t len, sd_chat_template **out) {
    if (!text || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    bool qwen = has_all(text, len, QWEN), llama31 = has_all(text, len, LLAMA31),
         tekken = has_all(text, len, MISTRAL_TEKKEN), mistral3 = tekken || has_all(text, len, MISTRAL3);
    for (const char *const *u = UNSUPPORTED; *u; u++) {
        if ((qwen || llama31 || mistral3) && (strcmp(*u, "tools") == 0 || strcmp(*u, "tool_call") == 0)) continue;
        if (llama31 && (strcmp(*u, "Cutting Knowledge") == 0 || strcmp(*u, "date_string") == 0)) continue;
        if (llama31 && strcmp(*u, "strftime_now") == 0 && has(text, len, LLAMA32_DATE)) continue;
        if (has(text, len, *u)) {
            char why[128];
            snprintf(why, sizeof why, "the model's template uses '%s', which specd does not reproduce", *u);
            return unrecognised(why);
        }
    }
    static const struct {
        sd_chat_family family;
        const char *const *markers;
    } sig[] = {{SD_CHAT_FAMILY_CHATML, CHATML},    {SD_CHAT_FAMILY_LLAMA3, LLAMA3},
               {SD_CHAT_FAMILY_LLAMA2, LLAMA2},    {SD_CHAT_FAMILY_CHATML, QWEN},
               {SD_CHAT_FAMILY_MISTRAL, MISTRAL},  {SD_CHAT_FAMILY_GEMMA, GEMMA},
               {SD_CHAT_FAMILY_GEMMA, GEMMA3},     {SD_CHAT_FAMILY_PHI3, PHI3},
               {SD_CHAT_FAMILY_MISTRAL, MISTRAL3}, {SD_CHAT_FAMILY_MISTRAL, MISTRAL_TEKKEN}};
    sd_chat_family found = SD_CHAT_FAMILY_UNSPECIFIED;
    for (size_t i = 0; i < sizeof sig / sizeof sig[0]; i++) {
        if (!has_all(text, len, sig[i].markers)) continue;
        if (found != SD_CHAT_FAMILY_UNSPECIFIED) return unrecognised("the model's template mixes two families");
        found = sig[i].family;
    }
    if (found == SD_CHAT_FAMILY_UNSPECIFIED) return unrecognised("the model's template is not one specd recognises");
    sd_chat_template *t = NULL;
    sd_status st = new_template(found, &t);
    if (st != SD_OK) return st;
    if (found == SD_CHAT_FAMILY_CHATML) {
        st = chatml_default_system(text, len, qwen, &t->default_system);
        if (qwen) t->variant |= VARIANT_ROLES_ONLY;
        if (st == SD_ERR_UNSUPPORTED)
            st = unrecognised("the ChatML template's default system prompt is not a plain text");
    }
    if (found == SD_CHAT_FAMILY_MISTRAL && has(text, len, "eos_token + ' '")) t->variant |= VARIANT_EOS_SPACE;
    if (found == SD_CHAT_FAMILY_MISTRAL && mistral3) t->variant |= VARIANT_MISTRAL3 | (tekken ? VARIANT_TEKKEN : 0);
    if (found == SD_CHAT_FAMILY_PHI3 && has(text, len, "message['role'] == 'system' and message['content']"))
        t->variant |= VARIANT_SYSTEM_NONEMPTY;
    if (found == SD_CHAT_FAMILY_LLAMA3 && !has(text, len, "add_generation_prompt")) t->variant |= VARIANT_ALWAYS_OPEN;
    if (found == SD_CHAT_FAMILY_LLAMA3 && llama31) t->variant |= VARIANT_LLAMA31;
    if (found == SD_CHAT_FAMILY_LLAMA3 && llama31 && has(text, len, LLAMA32_DATE)) t->variant |= VARIANT_DATE_TODAY;
    if (found == SD_CHAT_FAMILY_GEMMA && has(text, len, "first_user_prefix")) t->variant |= VARIANT_SYSTEM_PREFIX;
    if (st != SD_OK) {
        sd_chat_template_free(&t);
        return st;
    }
    *out = t;
    return SD_OK;
}

sd_status sd_chat_template_named(const char *name, sd_chat_template **out) {
    if (!name || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(name, FAMILY_NAMES[i].name) == 0) return new_template(FAMILY_NAMES[i].family, out);
    if (strcmp(name, "qwen2.5") == 0) { /* Qwen2.5-Instruct's template: its default system prompt, tools */
        SD_TRY(new_template(SD_CHAT_FAMILY_CHATML, out));
        (*out)->variant |= VARIANT_ROLES_ONLY;
        if (!((*out)->default_system = strdup(QWEN_DEFAULT_SYSTEM))) {
            sd_chat_template_free(out);
            return SD_ERR_NOMEM;
        }
        return SD_OK;
    }
    if (strcmp(name, "llama3.1") == 0 || strcmp(name, "llama3.2") == 0) { /* tools, a dated system turn */
        SD_TRY(new_template(SD_CHAT_FAMILY_LLAMA3, out));
        (*out)->variant |= VARIANT_LLAMA31 | (strcmp(name, "llama3.2") == 0 ? VARIANT_DATE_TODAY : 0);
        return SD_OK;
    }
    if (strcmp(name, "mistral-v3") == 0 || strcmp(name, "mistral-nemo") == 0) { /* 7B-v0.3's, Nemo's: tools */
        SD_TRY(new_template(SD_CHAT_FAMILY_MISTRAL, out));
        (*out)->variant |= VARIANT_MISTRAL3 | (strcmp(name, "mistral-nemo") == 0 ? VARIANT_TEKKEN : 0);
        return SD_OK;
    }
    if (strcmp(name, "gemma3") == 0) { /* Gemma 3's template: gemma with a system prefix */
        SD_TRY(new_template(SD_CHAT_FAMILY_GEMMA, out));
        (*out)->variant |= VARIANT_SYSTEM_PREFIX;
        return SD_OK;
    }
    SD_ERROR("chat template '%s': unknown name (%s)", name, sd_chat_template_names());
    return SD_ERR_INVALID_ARG;
}

sd_status sd_chat_template_set_tokens(sd_chat_template *t, const char *bos, const char *eos, bool tokenizer_adds_bos) {
    if (!t) return SD_ERR_INVALID_ARG;
    char *b = strdup(bos ? bos : ""), *e = strdup(eos ? eos : "");
    if (!b || !e) {
        free(b);
        free(e);
        return SD_ERR_NOMEM;
    }
    free(t->bos);
    free(t->eos);
    t->bos = b;
    t->eos = e;
    t->drop_leading_bos = tokenizer_adds_bos;
    return SD_OK;
}

sd_chat_family sd_chat_template_family(const sd_chat_template *t) { return t ? t->family : SD_CHAT_FAMILY_UNSPECIFIED; }

const char *sd_chat_template_name(const sd_chat_template *t) {
    for (size_t i = 0; t && i < N_FAMILIES; i++)
        if (FAMILY_NAMES[i].family == t->family) return FAMILY_NAMES[i].name;
    return "none";
}

const char *sd_chat_template_default_system(const sd_chat_template *t) { return t ? t->default_system : NULL; }

void sd_chat_template_free(sd_chat_template **t) {
    if (!t || !*t) return;
    free((*t)->default_system);
    free((*t)->bos);
    free((*t)->eos);
    free(*t);
    *t = NULL;
}

/* ---- reading the template from the model ---- */

/* Reads dir/name whole (at most MAX_TEMPLATE_FILE_BYTES) into a malloc'd
 * NUL-terminated buffer; SD_ERR_NOT_FOUND when the file does not exist. */
static sd_status read_file(const char *dir, const char *name, char **out, size_t *len) {
    *out = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) return SD_ERR_INVALID_ARG;
    FILE *f = fopen(path, "rb");
    if (!f) return SD_ERR_NOT_FOUND;
    struct stat sb;
    sd_status st = SD_OK;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = SD_ERR_IO;
    } else if ((uint64_t)sb.st_size > MAX_TEMPLATE_FILE_BYTES) {
        SD_ERROR("%s: %lld bytes, more than the %u a chat template file may have", path, (long long)sb.st_size,
                 MAX_TEMPLATE_FILE_BYTES);
        st = SD_ERR_FORMAT;
    } else if (!(*out = malloc((size_t)sb.st_size + 1))) {
        st = SD_ERR_NOMEM;
    } else if (fread(*out, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        st = SD_ERR_IO;
    }
    fclose(f);
    if (st != SD_OK) {
        free(*out);
        *out = NULL;
        return st;
    }
    (*out)[sb.st_size] = '\0';
    *len = (size_t)sb.st_size;
    return SD_OK;
}

/* tokenizer_config.json's chat_template: a string, or a list of {name,
 * template} of which "default" is used. *text NULL when there is none. */
static sd_status hf_config_template(const char *json, size_t len, char **text) {
    *text = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        SD_ERROR("tokenizer_config.json: not valid JSON");
        return SD_ERR_FORMAT;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *found = NULL;
    if (cJSON_IsString(ct)) {
        found = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        for (const cJSON *e = ct->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0 && cJSON_IsString(tmpl))
                found = tmpl->valuestring;
        }
    }
    sd_status st = SD_OK;
    if (found && !(*text = strdup(found))) st = SD_ERR_NOMEM;
    cJSON_Delete(root);
    return st;
}

/* The template text of the model, malloc'd in *text (NULL when it has none). */
static sd_status model_template_text(const sd_weights *w, const char *path, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    const sd_gguf *g = sd_weights_gguf(w);
    if (g) {
        sd_gguf_str s;
        if (sd_gguf_get_str(g, "tokenizer.chat_template", &s) != SD_OK) return SD_OK;
        if (!(*text = malloc((size_t)s.len + 1))) return SD_ERR_NOMEM;
        memcpy(*text, s.ptr, (size_t)s.len);
        (*text)[s.len] = '\0';
        *len = (size_t)s.len;
        return SD_OK;
    }
    char *json = NULL;
    size_t json_len = 0;
    sd_status st = read_file(path, "tokenizer_config.json", &json, &json_len);
    if (st == SD_OK) st = hf_config_template(json, json_len, text);
    free(json);
    if (st == SD_ERR_NOT_FOUND) st = SD_OK;
    if (st != SD_OK) return st;
    if (*text) {
        *len = strlen(*text);
        return SD_OK;
    }
    st = read_file(path, "chat_template.jinja", text, len);
    return st == SD_ERR_NOT_FOUND ? SD_OK : st;
}

/* The text of token id (empty when the model has no such token), malloc'd. */
static char *token_text(const sd_tok *tok, int32_t id) {
    size_t n = 0;
    const char *p = id >= 0 ? sd_tok_piece(tok, id, &n) : NULL;
    return p ? strndup(p, n) : strdup("");
}

sd_status sd_chat_template_from_model(const sd_weights *w, const char *path, const sd_tok *tok, const char *name,
                                      sd_chat_template **out) {
    if (!w || !path || !tok || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_chat_template *t = NULL;
    sd_status st;
    if (name) {
        st = sd_chat_template_named(name, &t);
    } else {
        char *text = NULL;
        size_t len = 0;
        st = model_template_text(w, path, &text, &len);
        if (st == SD_OK && text) {
            st = sd_chat_template_parse(text, len, &t);
            if (st == SD_ERR_UNSUPPORTED) SD_ERROR("%s: its chat template is not recognised (see above)", path);
        } else if (st == SD_OK && sd_tok_find(tok, "<start_of_turn>") >= 0 && sd_tok_find(tok, "<end_of_turn>") >= 0) {
            /* Gemma's GGUFs often carry no template; ChatML's markers would be
             * plain text to its tokenizer. */
            SD_WARN("%s: the model has no chat template; its vocabulary has Gemma's turn tokens: chat is formatted "
                    "as Gemma 3's",
                    path);
            st = sd_chat_template_named("gemma3", &t);
        } else if (st == SD_OK) {
            SD_WARN("%s: the model has no chat template; chat is formatted as ChatML", path);
            st = new_template(SD_CHAT_FAMILY_CHATML, &t);
        }
        free(text);
    }
    if (st != SD_OK) return st;
    char *bos = token_text(tok, sd_tok_bos(tok)), *eos = token_text(tok, sd_tok_eos(tok));
    st = bos && eos ? sd_chat_template_set_tokens(t, bos, eos, sd_tok_add_bos(tok) && sd_tok_bos(tok) >= 0)
                    : SD_ERR_NOMEM;
    free(bos);
    free(eos);
    if (st != SD_OK) {
        sd_chat_template_free(&t);
        return st;
    }
    *out = t;
    return SD_OK;
}
