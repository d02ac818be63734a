/* chat.c — ChatML prompt formatting (sd_tok_chat_format).
 *
 * Reproduces, byte for byte, the Jinja chat template that SmolLM2 ships in
 * tokenizer.chat_template:
 *   {% for message in messages %}
 *     {% if loop.first and messages[0]['role'] != 'system' %}
 *       '<|im_start|>system\n' DEFAULT '<|im_end|>\n'
 *     {% endif %}
 *     '<|im_start|>' role '\n' content '<|im_end|>' '\n'
 *   {% endfor %}
 *   {% if add_generation_prompt %} '<|im_start|>assistant\n' {% endif %}
 * A general Jinja interpreter was rejected: ChatML is what the supported
 * models use, and a hand-written formatter is easy to check exactly.
 *
 * sd_tok_chat_encode tokenizes a chat without ever reading special tokens
 * out of what a user typed: the template's markup alone is encoded with
 * special-token matching, each role and content as plain text. Encoding the
 * formatted string with parse_special would let "<|im_end|><|im_start|>system"
 * in a user turn open a real system turn. The text between two markup tokens
 * is encoded in one piece, as a whole-string encode splits it, so a chat
 * without special tokens in its text gets the same ids either way. */
#include "specd/tokenizer.h"

#include <stdlib.h>
#include <string.h>

typedef struct strbuf {
    char *data;
    size_t len, cap;
    bool failed;
} strbuf;

static void sb_add(strbuf *b, const char *s) {
    if (b->failed) return;
    size_t n = strlen(s), need;
    if (!sd_add_ok(b->len, n + 1, &need)) {
        b->failed = true;
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void add_turn(strbuf *b, const char *role, const char *content) {
    sb_add(b, "<|im_start|>");
    sb_add(b, role);
    sb_add(b, "\n");
    sb_add(b, content);
    sb_add(b, "<|im_end|>\n");
}

sd_status sd_tok_chat_format(const sd_chat_msg *msgs, size_t n, const char *default_system, bool add_generation_prompt,
                             char **out) {
    if ((!msgs && n) || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0]) {
            SD_ERROR("chat: message %zu has no role or no content", i);
            return SD_ERR_INVALID_ARG;
        }
    }
    strbuf b = {NULL, 0, 0, false};
    sb_add(&b, ""); /* an empty conversation still yields "" */
    if (n > 0 && default_system && strcmp(msgs[0].role, "system") != 0) add_turn(&b, "system", default_system);
    for (size_t i = 0; i < n; i++) add_turn(&b, msgs[i].role, msgs[i].content);
    if (add_generation_prompt) sb_add(&b, "<|im_start|>assistant\n");
    if (b.failed) {
        free(b.data);
        return SD_ERR_NOMEM;
    }
    *out = b.data;
    return SD_OK;
}

typedef struct idbuf {
    int32_t *ids;
    size_t n, cap;
    sd_status st;
} idbuf;

/* Appends the encoding of len bytes of text (special tokens matched only when parse_special). */
static void ib_encode(idbuf *b, const sd_tok *t, const char *text, size_t len, bool parse_special) {
    if (b->st != SD_OK || len == 0) return;
    int32_t *ids = NULL;
    size_t n = 0;
    b->st = sd_tok_encode(t, text, len, parse_special, &ids, &n);
    if (b->st != SD_OK) return;
    size_t need;
    if (!sd_add_ok(b->n, n, &need)) b->st = SD_ERR_NOMEM;
    if (b->st == SD_OK && need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        int32_t *d = realloc(b->ids, cap * sizeof *d);
        if (!d)
            b->st = SD_ERR_NOMEM;
        else {
            b->ids = d;
            b->cap = cap;
        }
    }
    if (b->st == SD_OK && n) {
        memcpy(b->ids + b->n, ids, n * sizeof *ids);
        b->n += n;
    }
    free(ids);
}

/* One turn: markup, "role\ncontent" as text, markup, "\n" as text. */
static void ib_turn(idbuf *b, const sd_tok *t, const char *role, const char *content) {
    static const char start[] = "<|im_start|>", end[] = "<|im_end|>";
    size_t rl = strlen(role), cl = strlen(content);
    char *text = malloc(rl + 1 + cl + 1);
    if (!text) {
        if (b->st == SD_OK) b->st = SD_ERR_NOMEM;
        return;
    }
    memcpy(text, role, rl);
    text[rl] = '\n';
    memcpy(text + rl + 1, content, cl);
    ib_encode(b, t, start, sizeof start - 1, true);
    ib_encode(b, t, text, rl + 1 + cl, false);
    ib_encode(b, t, end, sizeof end - 1, true);
    ib_encode(b, t, "\n", 1, false);
    free(text);
}

sd_status sd_tok_chat_encode(const sd_tok *t, const sd_chat_msg *msgs, size_t n, const char *default_system,
                             bool add_generation_prompt, int32_t **ids, size_t *n_ids) {
    if (!t || (!msgs && n) || !ids || !n_ids) return SD_ERR_INVALID_ARG;
    *ids = NULL;
    *n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0]) {
            SD_ERROR("chat: message %zu has no role or no content", i);
            return SD_ERR_INVALID_ARG;
        }
    }
    idbuf b = {NULL, 0, 0, SD_OK};
    if (n > 0 && default_system && strcmp(msgs[0].role, "system") != 0) ib_turn(&b, t, "system", default_system);
    for (size_t i = 0; i < n; i++) ib_turn(&b, t, msgs[i].role, msgs[i].content);
    if (add_generation_prompt) {
        ib_encode(&b, t, "<|im_start|>", 12, true);
        ib_encode(&b, t, "assistant\n", 10, false);
    }
    if (b.st != SD_OK) {
        free(b.ids);
        return b.st;
    }
    *ids = b.ids;
    *n_ids = b.n;
    return SD_OK;
}
