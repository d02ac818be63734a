/* openai.c — the OpenAI wire format: request JSON in, response JSON out.
 *
 * Parsing is strict about what it honours and lenient about the rest, as
 * OpenAI is: unknown fields are ignored, a known field of the wrong type or
 * out of range is a 400 naming the field (`param`). Fields whose meaning
 * specd cannot honour yet (logit_bias and the other output-changing
 * fields in refuse_unhonoured) are refused with a 400 when set to
 * anything but their neutral value, rather than silently ignored: a client
 * asking for them would otherwise get a wrong answer.
 *
 * Penalties go to the coordinator in the sampling parameters and are
 * applied to the target's logits on the verifier. Logprobs are the
 * target's, computed on the verifier from its logits after the penalties
 * and before temperature / top-k / top-p / min-p (what vLLM returns by
 * default); each token comes with its bytes from the coordinator's
 * tokenizer. Chat takes `logprobs: true` and `top_logprobs` (0..20) and
 * answers in `choices[].logprobs.content[]`; completions take `logprobs: N`
 * (0..20 alternatives) and answer in the legacy shape (tokens,
 * token_logprobs, top_logprobs as dicts, text_offset in bytes). With echo
 * those start with the prompt's tokens (the target's prefill logprobs; the
 * first null), and max_tokens 0 asks for the prompt alone ("score this
 * text"); a prompt of ids is echoed as the coordinator detokenizes it.
 *
 * Chat: the whole conversation (system/developer, user, assistant turns
 * with their tool_calls, tool turns) and the tools (tools.c) go to the
 * coordinator as SubmitRequest.messages and .tools, and the coordinator
 * formats it with the model's chat template (specd/chat.h), exactly as
 * `specd-generate --chat --message ...` does. Formatting here was rejected:
 * the gateway holds no model. Roles are checked here (an unknown one is a
 * 400 naming it), the order of turns by the template (a refusal comes back
 * as a 400 with the template's reason).
 *
 * Responses are built with cJSON in OpenAI's shapes (chat.completion,
 * chat.completion.chunk, text_completion). */
#include "gateway_impl.h"
#include "specd/cli.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS_LIMIT (1u << 20) /* max_tokens above this is a typo, not a request */
#define MAX_PROMPT_IDS   (1u << 20)
#define MAX_TOP_K        (1 << 20)

bool gw_fail(gw_error *err, int http_status, const char *type, const char *code, const char *param, const char *fmt,
             ...) {
    err->http_status = http_status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(err, param, ...) gw_fail((err), 400, "invalid_request_error", NULL, (param), __VA_ARGS__)
#define UNSUPPORTED(err, param, ...) \
    gw_fail((err), 400, "invalid_request_error", "unsupported_parameter", (param), __VA_ARGS__)

char *gw_error_json(const gw_error *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param[0])
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

bool gw_utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned min;
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, min = 0x10000;
        else
            return false;
        if (len - i <= n) return false;
        unsigned cp = c & (0x3F >> n);
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n + 1;
    }
    return true;
}

bool gw_key_equal(const char *presented, const char *key) {
    size_t kl = strlen(key), pl = strlen(presented);
    unsigned char diff = (unsigned char)(kl != pl);
    /* Walk the configured key; read the presented one cyclically so the
     * loop never depends on where they differ or on the presented length. */
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)(key[i] ^ (pl ? presented[i % pl] : 0));
    return diff == 0;
}

uint64_t gw_choice_seed(uint64_t seed, unsigned i) {
    if (i == 0) return seed;
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void gw_gen_clear(gw_gen *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_prompts; i++) {
        free(g->prompts[i].text);
        free(g->prompts[i].ids);
        for (size_t k = 0; k < g->prompts[i].n_turns; k++) {
            free((char *)g->prompts[i].turns[k].content);
            free((char *)g->prompts[i].turns[k].tool_calls);
            free((char *)g->prompts[i].turns[k].tool_call_id);
        }
        free(g->prompts[i].turns);
    }
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->constraint_text);
    free(g->tools_json);
    gw_tools_free(&g->tools);
    memset(g, 0, sizeof *g);
}

/* ---- field readers: absent and null mean "default" ---- */

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

static bool get_number(const cJSON *root, const char *name, double lo, double hi, bool lo_open, double *out,
                       bool *given, gw_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (given) *given = false;
    if (!present(v)) return true;
    if (!cJSON_IsNumber(v)) return BAD(err, name, "'%s' must be a number", name);
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return BAD(err, name, "'%s' must be a number in %s%g, %g], got %g", name, lo_open ? "(" : "[", lo, hi, d);
    *out = d;
    if (given) *given = true;
    return true;
}

static bool get_int(const cJSON *root, const char *name, double lo, double hi, double *out, bool *given,
                    gw_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (given) *given = false;
    if (!present(v)) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return BAD(err, name, "'%s' must be an integer", name);
    double d = v->valuedouble;
    if (d < lo || d > hi) return BAD(err, name, "'%s' must be an integer in [%.0f, %.0f], got %.0f", name, lo, hi, d);
    *out = d;
    if (given) *given = true;
    return true;
}

static bool get_bool(const cJSON *root, const char *name, bool *out, gw_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!present(v)) return true;
    if (!cJSON_IsBool(v)) return BAD(err, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return true;
}

/* A string value (cJSON hands it over NUL-terminated). */
static bool string_ok(const cJSON *v) { return cJSON_IsString(v) && v->valuestring; }

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static bool nomem(gw_error *err) { return gw_fail(err, 500, "server_error", NULL, NULL, "out of memory"); }

/* Chat: logprobs (a boolean) and top_logprobs (0..20, only with logprobs
 * true). Completions: logprobs = the number of alternatives (0..20; OpenAI
 * caps it at 5); with echo the prompt's tokens come first. */
static bool parse_logprobs(const cJSON *root, gw_gen *g, gw_error *err) {
    double d;
    bool given;
    if (g->endpoint == GW_EP_CHAT) {
        if (!get_bool(root, "logprobs", &g->logprobs, err)) return false;
        if (!get_int(root, "top_logprobs", 0, SD_MAX_TOP_LOGPROBS, &d, &given, err)) return false;
        if (given && !g->logprobs) return BAD(err, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        g->top_logprobs = given ? (uint32_t)d : 0;
        return true;
    }
    if (!get_int(root, "logprobs", 0, SD_MAX_TOP_LOGPROBS, &d, &given, err)) return false;
    g->logprobs = given;
    g->top_logprobs = given ? (uint32_t)d : 0;
    return true;
}

/* Fields that change the output and that specd does not honour yet: each
 * is a 400 naming it unless it holds its neutral value, never silently
 * dropped (a client asking for JSON must not get free text).
 * response_format, llama.cpp's grammar / json_schema and vLLM's guided_*
 * are honoured (response_format.c, guided.c). */
static bool neutral_field(const char *name, const cJSON *v) {
    if (!strcmp(name, "function_call")) return string_ok(v) && !strcmp(v->valuestring, "none");
    if (!strcmp(name, "functions")) return cJSON_IsArray(v) && !v->child;
    if (!strcmp(name, "best_of")) return cJSON_IsNumber(v) && v->valuedouble == 1;
    if (!strcmp(name, "suffix")) return string_ok(v) && !v->valuestring[0];
    if (!strcmp(name, "modalities"))
        return cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && string_ok(v->child) &&
               !strcmp(v->child->valuestring, "text");
    return false; /* the rest have no neutral value */
}

static bool refuse_unhonoured(const cJSON *root, gw_error *err) {
    static const char *const fields[] = {
        "functions",   "function_call", "best_of",       "suffix",      "modalities",    "audio",
        "web_search_options", "reasoning_effort",
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, fields[i]);
        if (present(v) && !neutral_field(fields[i], v))
            return UNSUPPORTED(err, fields[i], "'%s' is not supported by specd yet (it would change the output)",
                               fields[i]);
    }
    return true;
}

/* Fields both endpoints share. */
static bool parse_common(const cJSON *root, gw_gen *g, gw_error *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (present(model) && !cJSON_IsString(model)) return BAD(err, "model", "'model' must be a string");

    double d;
    bool given;
    /* max_completion_tokens is the newer name; either works. */
    const char *mt_name = present(cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens"))
                              ? "max_completion_tokens"
                              : "max_tokens";
    /* 0 only for a completion with echo ("score this text"): checked once echo is read */
    if (!get_int(root, mt_name, 0, MAX_TOKENS_LIMIT, &d, &given, err)) return false;
    if (given && d == 0) g->prompt_only = true;
    if (given) g->max_tokens = (uint32_t)d;

    g->sampling = sd_sampling_default(); /* specd's default is greedy; OpenAI's is temperature 1, top_p 1 */
    g->sampling.temperature = 1.0f;
    if (!get_number(root, "temperature", 0, 2, false, &d, &given, err)) return false;
    if (given) g->sampling.temperature = (float)d;
    if (!get_number(root, "top_p", 0, 1, true, &d, &given, err)) return false;
    if (given) g->sampling.top_p = (float)d;
    if (!get_int(root, "top_k", -1, MAX_TOP_K, &d, &given, err)) return false;
    if (given) g->sampling.top_k = d < 0 ? 0 : (int32_t)d; /* -1: off, as in vLLM */
    if (!get_number(root, "min_p", 0, 1, false, &d, &given, err)) return false;
    if (given && d >= 1) return BAD(err, "min_p", "'min_p' must be a number in [0, 1), got %g", d);
    if (given) g->sampling.min_p = (float)d;
    /* Bounds exactly representable as doubles: -2^63 and the largest double below 2^64. */
    if (!get_int(root, "seed", -0x1p63, 0x1.fffffffffffffp63, &d, &g->seeded, err)) return false;
    if (g->seeded) g->sampling.seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    /* specd's extension: the verification rule ("coupled" or "rejection"; absent: the service's) */
    const cJSON *vr = cJSON_GetObjectItemCaseSensitive(root, "verify_rule");
    if (present(vr) && !(cJSON_IsString(vr) && sd_cli_parse_verify_rule(vr->valuestring, &g->sampling.rule)))
        return BAD(err, "verify_rule", "'verify_rule' must be \"coupled\" or \"rejection\"");

    if (!get_int(root, "n", 1, GW_MAX_CHOICES, &d, &given, err)) return false;
    g->n = given ? (unsigned)d : 1;

    if (!get_bool(root, "stream", &g->stream, err)) return false;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (present(so)) {
        if (!cJSON_IsObject(so)) return BAD(err, "stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &g->include_usage, err)) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            return false;
        }
    }
    if (!get_bool(root, "ignore_eos", &g->ignore_eos, err)) return false;

    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (present(stop)) {
        const cJSON *one = cJSON_IsString(stop) ? stop : NULL;
        if (!one && !cJSON_IsArray(stop)) return BAD(err, "stop", "'stop' must be a string or a list of strings");
        size_t n = one ? 1 : (size_t)cJSON_GetArraySize(stop);
        if (n > SD_MAX_STOP_STRINGS)
            return BAD(err, "stop", "'stop' holds %zu strings, at most %d", n, SD_MAX_STOP_STRINGS);
        for (size_t i = 0; i < n; i++) {
            const cJSON *s = one ? one : cJSON_GetArrayItem(stop, (int)i);
            if (!string_ok(s)) return BAD(err, "stop", "'stop' must be a string or a list of strings");
            size_t len = strlen(s->valuestring);
            if (len == 0 || len > SD_MAX_STOP_BYTES)
                return BAD(err, "stop", "each stop string must be 1 to %d bytes long, got %zu", SD_MAX_STOP_BYTES, len);
            if (!(g->stop[g->n_stop++] = dup_str(s->valuestring))) return nomem(err);
        }
    }

    if (!get_number(root, "presence_penalty", -SD_SAMPLING_MAX_PENALTY, SD_SAMPLING_MAX_PENALTY, false, &d, &given,
                    err))
        return false;
    if (given) g->sampling.presence_penalty = (float)d;
    if (!get_number(root, "frequency_penalty", -SD_SAMPLING_MAX_PENALTY, SD_SAMPLING_MAX_PENALTY, false, &d, &given,
                    err))
        return false;
    if (given) g->sampling.frequency_penalty = (float)d;
    if (!parse_logprobs(root, g, err)) return false;
    /* Known, but not honoured yet: refuse anything but the neutral value. */
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (present(lb) && !(cJSON_IsObject(lb) && !lb->child))
        return UNSUPPORTED(err, "logit_bias", "'logit_bias' is not supported by specd yet");
    return gw_parse_constraint(root, g, err) && refuse_unhonoured(root, err);
}

/* The text of a message's content: a string, or a list of {"type":"text"}
 * parts (concatenated). Borrowed from the JSON tree, or *owned set. */
static bool content_text(const cJSON *content, const char *param, char **owned, const char **text, gw_error *err) {
    *owned = NULL;
    if (string_ok(content)) {
        *text = content->valuestring;
        return true;
    }
    if (!cJSON_IsArray(content)) return BAD(err, param, "'%s' must be a string or a list of text parts", param);
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !string_ok(type))
            return BAD(err, param, "'%s' parts must be objects with a 'type'", param);
        if (strcmp(type->valuestring, "text") != 0)
            return UNSUPPORTED(err, param, "'%s': content parts of type '%s' are not supported (text only)", param,
                               type->valuestring);
        if (!string_ok(t)) return BAD(err, param, "'%s': a text part needs a 'text' string", param);
        total += strlen(t->valuestring);
    }
    char *buf = malloc(total + 1);
    if (!buf) return nomem(err);
    size_t off = 0;
    cJSON_ArrayForEach(part, content) {
        const char *s = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(s);
        memcpy(buf + off, s, l);
        off += l;
    }
    buf[off] = '\0';
    *owned = buf;
    *text = buf;
    return true;
}

/* The wire role of an OpenAI role ("developer" is a system turn); NULL for
 * roles specd has no turn for. */
static const char *chat_role(const char *r) {
    if (!strcmp(r, "system") || !strcmp(r, "developer")) return "system";
    if (!strcmp(r, "user")) return "user";
    if (!strcmp(r, "assistant")) return "assistant";
    if (!strcmp(r, "tool")) return "tool"; /* a tool's answer (the chat template renders it) */
    return NULL;
}

static bool parse_messages(const cJSON *root, gw_gen *g, gw_error *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!present(msgs)) return BAD(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD(err, "messages", "'messages' must be a list of messages");
    int n = cJSON_GetArraySize(msgs);
    if (n <= 0) return BAD(err, "messages", "'messages' must not be empty");
    if (n > SD_MAX_CHAT_MESSAGES)
        return BAD(err, "messages", "'messages' holds %d messages, at most %d", n, SD_MAX_CHAT_MESSAGES);
    gw_prompt *p = &g->prompts[0];
    g->n_prompts = 1;
    char param[64];
    /* Roles first: an unknown one, or a turn kind not supported yet, is
     * named before any complaint about a message's content. */
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!string_ok(role)) continue; /* reported below */
        const char *r = role->valuestring;
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!strcmp(r, "function"))
            return UNSUPPORTED(err, param, "'%s': 'function' turns are not supported (use 'tool')", param);
        if (!chat_role(r))
            return BAD(err, param, "'%s': unknown role '%s' (system, developer, user, assistant, tool)", param, r);
    }
    if (!(p->turns = calloc((size_t)n, sizeof *p->turns))) return nomem(err);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return BAD(err, param, "'%s' must be an object", param);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!string_ok(role)) return BAD(err, param, "'%s' must be a string", param);
        snprintf(param, sizeof param, "messages[%d].content", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        char *owned = NULL;
        const char *text = "";
        bool tool_role = !strcmp(role->valuestring, "tool");
        bool calls = present(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
        if (!(calls && !present(content)) && !content_text(content, param, &owned, &text, err)) return false;
        char *copy = owned ? owned : dup_str(text), *calls_json = NULL;
        if (!copy) return nomem(err);
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        if (calls && (tool_role || strcmp(role->valuestring, "assistant") != 0)) {
            free(copy);
            return BAD(err, param, "'%s': only an assistant's message has tool calls", param);
        }
        char *call_id = NULL; /* a tool turn's tool_call_id (Mistral's template writes it) */
        if ((calls && !gw_tool_turn(m, &calls_json, param, err)) ||
            (tool_role && !gw_tool_result_id(m, i, &call_id, err))) {
            free(copy);
            free(calls_json);
            return false;
        }
        p->turns[p->n_turns++] = (sd_client_chat_msg){chat_role(role->valuestring), copy, calls_json, call_id};
        total += strlen(copy) + (calls_json ? strlen(calls_json) : 0) + (call_id ? strlen(call_id) : 0);
        if (total > SD_MAX_PROMPT_BYTES)
            return BAD(err, "messages", "'messages' holds more than %d bytes of content", SD_MAX_PROMPT_BYTES);
    }
    const char *last = p->turns[p->n_turns - 1].role;
    if (strcmp(last, "user") != 0 && strcmp(last, "tool") != 0)
        return BAD(err, "messages",
                   "'messages' must end with a user or tool message (the answer is the assistant's next turn), not %s",
                   last);
    return true;
}

static bool parse_ids(const cJSON *arr, const char *param, gw_prompt *p, gw_error *err) {
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n == 0) return BAD(err, param, "'%s' must not be empty", param);
    if (n > MAX_PROMPT_IDS) return BAD(err, param, "'%s' holds %zu tokens, at most %u", param, n, MAX_PROMPT_IDS);
    p->ids = malloc(n * sizeof *p->ids);
    if (!p->ids) return nomem(err);
    p->n_ids = n;
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble > 2147483647.0)
            return BAD(err, param, "'%s' must hold token ids (integers >= 0)", param);
        p->ids[i++] = (int32_t)v->valuedouble;
    }
    return true;
}

static bool parse_prompt(const cJSON *root, gw_gen *g, gw_error *err) {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!present(pr)) return BAD(err, "prompt", "'prompt' is required");
    if (string_ok(pr)) {
        if (!pr->valuestring[0]) return BAD(err, "prompt", "'prompt' must not be empty");
        g->n_prompts = 1;
        return (g->prompts[0].text = dup_str(pr->valuestring)) ? true : nomem(err);
    }
    if (!cJSON_IsArray(pr) || !pr->child)
        return BAD(err, "prompt", "'prompt' must be a string, a list of token ids, or a list of either");
    if (cJSON_IsNumber(pr->child)) {
        g->n_prompts = 1;
        return parse_ids(pr, "prompt", &g->prompts[0], err);
    }
    /* A batch: a list of strings or of token-id lists. */
    size_t n = (size_t)cJSON_GetArraySize(pr);
    if (n > GW_MAX_CHOICES) return BAD(err, "prompt", "%zu prompts in one request, at most %d", n, GW_MAX_CHOICES);
    const cJSON *v;
    cJSON_ArrayForEach(v, pr) {
        gw_prompt *p = &g->prompts[g->n_prompts++];
        char param[32];
        snprintf(param, sizeof param, "prompt[%zu]", g->n_prompts - 1);
        if (string_ok(v)) {
            if (!v->valuestring[0]) return BAD(err, param, "'%s' must not be empty", param);
            if (!(p->text = dup_str(v->valuestring))) return nomem(err);
        } else if (cJSON_IsArray(v)) {
            if (!parse_ids(v, param, p, err)) return false;
        } else {
            return BAD(err, param, "'%s' must be a string or a list of token ids", param);
        }
    }
    return true;
}

bool gw_gen_parse(gw_endpoint endpoint, const char *body, size_t len, gw_gen *g, gw_error *err) {
    memset(g, 0, sizeof *g);
    g->endpoint = endpoint;
    if (!gw_utf8_valid(body, len)) return BAD(err, NULL, "the request body is not valid UTF-8");
    if (sd_json_has_nul(body, len))
        return BAD(err, NULL,
                   "the request body holds a NUL character (\\u0000): refused rather than cut the text at it");
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return BAD(err, NULL, "the request body is not valid JSON");
    bool ok;
    if (!cJSON_IsObject(root)) {
        ok = BAD(err, NULL, "the request body must be a JSON object");
    } else {
        ok = parse_common(root, g, err) &&
             (endpoint == GW_EP_CHAT ? parse_messages(root, g, err) : parse_prompt(root, g, err)) &&
             gw_parse_tools(root, g, err);
        if (ok && endpoint == GW_EP_COMPLETIONS) {
            ok = get_bool(root, "echo", &g->echo, err) && get_bool(root, "parse_special", &g->parse_special, err);
            /* max_tokens 0 with echo: the prompt (and its logprobs) only */
            if (ok && g->prompt_only && !g->echo)
                ok = BAD(err,
                         present(cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens"))
                             ? "max_completion_tokens"
                             : "max_tokens",
                         "'max_tokens' 0 generates nothing: it needs 'echo': true (to score the prompt)");
            /* OpenAI's default for completions: 16 tokens. */
            if (ok && g->max_tokens == 0 && !g->prompt_only) g->max_tokens = 16;
        } else if (ok && g->prompt_only) {
            ok = BAD(err,
                     present(cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")) ? "max_completion_tokens"
                                                                                              : "max_tokens",
                     "'max_tokens' must be at least 1");
        }
        if (ok && g->n_prompts * g->n > GW_MAX_CHOICES)
            ok = BAD(err, "n", "%zu prompts x n = %u choices, at most %d", g->n_prompts, g->n, GW_MAX_CHOICES);
    }
    cJSON_Delete(root);
    if (!ok) gw_gen_clear(g);
    return ok;
}

/* ---- responses ---- */

const char *gw_finish_reason(const gw_choice *c) {
    switch (c->stop_reason) {
    case SPECD__STOP_REASON__STOP_REASON_LENGTH:
    case SPECD__STOP_REASON__STOP_REASON_CONTEXT: return "length";
    default: return "stop";
    }
}

void gw_choice_error(const gw_choice *c, gw_error *err) {
    switch (c->code) {
    case SPECD__CODE__CODE_BAD_REQUEST:
    case SPECD__CODE__CODE_MALFORMED:
        /* a constraint the engine refused (the keyword is named) */
        gw_fail(err, 400, "invalid_request_error", NULL, strstr(c->error, "submit.constraint") ? "response_format" : NULL,
                "%s", c->error);
        break;
    case SPECD__CODE__CODE_TOO_LARGE:
        gw_fail(err, 400, "invalid_request_error", "context_length_exceeded", NULL, "%s", c->error);
        break;
    case SPECD__CODE__CODE_OVERLOADED:
    case SPECD__CODE__CODE_KV_FULL:
        gw_fail(err, 429, "rate_limit_error", "overloaded", NULL, "the service is overloaded: %s", c->error);
        break;
    default:
        gw_fail(err, 503, "service_unavailable", NULL, NULL, "generation failed: %s",
                c->error[0] ? c->error : sd_status_str(c->status));
        break;
    }
}

static cJSON *envelope(const gw_job *job, const char *model, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", job->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)job->created);
    cJSON_AddStringToObject(root, "model", model);
    return root;
}

static void add_usage(cJSON *root, const gw_job *job) {
    double prompt = 0, completion = 0;
    for (size_t i = 0; i < job->n_choices; i++) {
        const gw_choice *c = &job->choices[i];
        if (i % job->n == 0) prompt += c->prompt_tokens; /* each prompt once, as OpenAI counts with n > 1 */
        completion += c->n_tokens;
    }
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
}

/* A string value of exactly len bytes, quoted by sd_json_quote: cJSON's
 * strings end at the first NUL byte (generated text may hold U+0000) and
 * cJSON writes invalid UTF-8 as it is (byte-level tokens can produce it),
 * which would make the response invalid JSON. */
static cJSON *add_text(cJSON *obj, const char *name, const char *s, size_t len) {
    char *buf = sd_json_quote(s, len);
    if (!buf) return NULL;
    cJSON *v = cJSON_AddRawToObject(obj, name, buf);
    free(buf);
    return v;
}

/* ---- logprobs ---- */

/* A log-probability as JSON: -inf (a token the target rules out) is
 * OpenAI's -9999. */
static double lp_value(float lp) { return isfinite(lp) ? (double)lp : -9999.0; }

static cJSON *bytes_array(const char *b, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)(unsigned char)b[i]));
    return a;
}

/* A quoted JSON string of a token's bytes (invalid UTF-8 becomes U+FFFD:
 * sd_json_quote), as a raw cJSON item. */
static cJSON *token_string(const gw_choice *c, const gw_tok_lp *t) {
    char *q = sd_json_quote(c->lp_bytes ? c->lp_bytes + t->off : "", t->len);
    cJSON *v = q ? cJSON_CreateRaw(q) : cJSON_CreateNull();
    free(q);
    return v;
}

/* Chat: {"token", "logprob", "bytes"} and, for a generated token (full),
 * its "top_logprobs". */
static cJSON *chat_lp_entry(const gw_choice *c, const gw_tok_lp *t, const gw_lp *full) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "token", token_string(c, t));
    cJSON_AddNumberToObject(e, "logprob", lp_value(t->logprob));
    cJSON_AddItemToObject(e, "bytes", bytes_array(c->lp_bytes ? c->lp_bytes + t->off : "", t->len));
    if (full) {
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (uint32_t j = 0; j < full->n_top; j++) cJSON_AddItemToArray(top, chat_lp_entry(c, &full->top[j], NULL));
    }
    return e;
}

/* Chat: {"content": [entry per token [from, to)], "refusal": null}. */
static cJSON *chat_logprobs(const gw_choice *c, size_t from, size_t to) {
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    for (size_t i = from; i < to; i++) cJSON_AddItemToArray(content, chat_lp_entry(c, &c->lps[i].token, &c->lps[i]));
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* {token: logprob, ...} over e's alternatives as a raw cJSON item: keys
 * are token bytes, quoted by sd_json_quote (cJSON would write invalid
 * UTF-8 in a key as it is). */
static cJSON *top_dict(const gw_choice *c, const gw_lp *e) {
    size_t cap = 2, len = 0;
    char *quoted[SD_MAX_TOP_LOGPROBS];
    for (uint32_t j = 0; j < e->n_top; j++) {
        quoted[j] = sd_json_quote(c->lp_bytes ? c->lp_bytes + e->top[j].off : "", e->top[j].len);
        cap += (quoted[j] ? strlen(quoted[j]) : 2) + 40; /* "," ":" and a %.17g number */
    }
    char *buf = malloc(cap + 1);
    if (buf) {
        buf[len++] = '{';
        for (uint32_t j = 0; j < e->n_top; j++)
            len += (size_t)snprintf(buf + len, cap + 1 - len, "%s%s:%.17g", j ? "," : "",
                                    quoted[j] ? quoted[j] : "\"\"", lp_value(e->top[j].logprob));
        buf[len++] = '}';
        buf[len] = '\0';
    }
    for (uint32_t j = 0; j < e->n_top; j++) free(quoted[j]);
    cJSON *v = buf ? cJSON_CreateRaw(buf) : cJSON_CreateObject();
    free(buf);
    return v;
}

/* Completions (legacy shape) for tokens [from, to): tokens, token_logprobs,
 * top_logprobs (one {token: logprob} dict per token; tokens with the same
 * text share a key), text_offset (byte offsets: the tokens' bytes one after
 * another). With echo the prompt's tokens come first, the first with a
 * null logprob and null alternatives (OpenAI's and vLLM's shape). */
static cJSON *completion_logprobs(const gw_choice *c, size_t from, size_t to) {
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    size_t offset = 0;
    for (size_t i = 0; i < from; i++) offset += c->lps[i].token.len;
    for (size_t i = from; i < to; i++) {
        const gw_lp *e = &c->lps[i];
        cJSON_AddItemToArray(tokens, token_string(c, &e->token));
        if (isnan(e->token.logprob)) { /* the prompt's first token (echo): nothing precedes it */
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
        } else {
            cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(e->token.logprob)));
            cJSON_AddItemToArray(tops, top_dict(c, e));
        }
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        offset += e->token.len;
    }
    return o;
}

char *gw_response_json(const gw_job *job, const char *model) {
    bool chat = job->endpoint == GW_EP_CHAT;
    cJSON *root = envelope(job, model, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (size_t i = 0; i < job->n_choices; i++) {
        const gw_choice *c = &job->choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", (double)c->index);
        const char *text = c->text ? c->text : "", *finish = gw_finish_reason(c);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON *calls = gw_tool_calls(job, i);
            if (calls) { /* the answer is tool calls (tools.c) */
                cJSON_AddNullToObject(msg, "content");
                cJSON_AddItemToObject(msg, "tool_calls", calls);
                finish = "tool_calls";
            } else {
                add_text(msg, "content", text, c->text_len);
            }
        } else {
            add_text(ch, "text", text, c->text_len);
        }
        if (job->logprobs)
            cJSON_AddItemToObject(ch, "logprobs",
                                  chat ? chat_logprobs(c, 0, c->n_lps) : completion_logprobs(c, 0, c->n_lps));
        else
            cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", finish);
        cJSON_AddItemToArray(choices, ch);
    }
    add_usage(root, job);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

char *gw_chunk_json(const gw_job *job, const char *model, size_t ci, bool role, const char *delta, size_t delta_len,
                    size_t lp_from, size_t lp_to, bool finish, bool include_usage) {
    bool chat = job->endpoint == GW_EP_CHAT;
    const gw_choice *c = &job->choices[ci];
    const char *finish_reason = gw_finish_reason(c);
    cJSON *root = envelope(job, model, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", (double)c->index);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) {
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
        } else if (delta) {
            add_text(d, "content", delta, delta_len);
        } else if (finish && job->tools) { /* what tool_stream.c did not stream yet */
            gw_tool_finish_delta(job, ci, d, &finish_reason);
        }
    } else {
        add_text(ch, "text", delta ? delta : "", delta ? delta_len : 0);
    }
    if (lp_to > lp_from && lp_to <= c->n_lps)
        cJSON_AddItemToObject(ch, "logprobs",
                              chat ? chat_logprobs(c, lp_from, lp_to) : completion_logprobs(c, lp_from, lp_to));
    else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish_reason);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    if (include_usage) cJSON_AddNullToObject(root, "usage");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

char *gw_usage_chunk_json(const gw_job *job, const char *model) {
    cJSON *root = envelope(job, model, job->endpoint == GW_EP_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, job);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
