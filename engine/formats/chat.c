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
 * out of what a user typed: the formatted string is encoded in one pass by
 * sd_tok_encode_masked, with each role and content marked as user text, so
 * special tokens are matched in the template's markup only. Encoding the
 * formatted string with parse_special would let "<|im_end|><|im_start|>system"
 * in a user turn open a real system turn. A chat without special tokens in
 * its text gets the same ids either way. (specd/chat.h's
 * sd_chat_template_encode does the same for every template family.) */
#include "specd/tokenizer.h"

#include <stdlib.h>
#include <string.h>

typedef struct strbuf {
    char *data;
    uint8_t *mask; /* 1 = user text (role, content) */
    size_t len, cap;
    bool failed;
} strbuf;

static void sb_addn(strbuf *b, const char *s, bool user) {
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
        if (d) b->data = d;
        uint8_t *mk = d ? realloc(b->mask, cap) : NULL;
        if (mk) b->mask = mk;
        if (!d || !mk) {
            b->failed = true;
            return;
        }
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    memset(b->mask + b->len, user ? 1 : 0, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void sb_add(strbuf *b, const char *s) { sb_addn(b, s, false); }

static void add_turn(strbuf *b, const char *role, const char *content) {
    sb_add(b, "<|im_start|>");
    sb_addn(b, role, true);
    sb_addn(b, "\n", true);
    sb_addn(b, content, true);
    sb_add(b, "<|im_end|>\n");
}

/* The ChatML text and its user-text mask (b->mask, b->len bytes). */
static sd_status format(const sd_chat_msg *msgs, size_t n, const char *default_system, bool add_generation_prompt,
                        strbuf *b) {
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0]) {
            SD_ERROR("chat: message %zu has no role or no content", i);
            return SD_ERR_INVALID_ARG;
        }
    }
    sb_add(b, ""); /* an empty conversation still yields "" */
    if (n > 0 && default_system && strcmp(msgs[0].role, "system") != 0) add_turn(b, "system", default_system);
    for (size_t i = 0; i < n; i++) add_turn(b, msgs[i].role, msgs[i].content);
    if (add_generation_prompt) sb_add(b, "<|im_start|>assistant\n");
    if (b->failed) return SD_ERR_NOMEM;
    return SD_OK;
}

sd_status sd_tok_chat_format(const sd_chat_msg *msgs, size_t n, const char *default_system, bool add_generation_prompt,
                             char **out) {
    if ((!msgs && n) || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    strbuf b = {0};
    sd_status st = format(msgs, n, default_system, add_generation_prompt, &b);
    free(b.mask);
    if (st != SD_OK) {
        free(b.data);
        return st;
    }
    *out = b.data;
    return SD_OK;
}

sd_status sd_tok_chat_encode(const sd_tok *t, const sd_chat_msg *msgs, size_t n, const char *default_system,
                             bool add_generation_prompt, int32_t **ids, size_t *n_ids) {
    if (!t || (!msgs && n) || !ids || !n_ids) return SD_ERR_INVALID_ARG;
    *ids = NULL;
    *n_ids = 0;
    strbuf b = {0};
    sd_status st = format(msgs, n, default_system, add_generation_prompt, &b);
    if (st == SD_OK) st = sd_tok_encode_masked(t, b.data, b.len, b.mask, ids, n_ids);
    free(b.data);
    free(b.mask);
    return st;
}
