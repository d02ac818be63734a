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
 * models use, and a hand-written formatter is easy to check exactly. */
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
