/* fuzz_tokenizer.c — libFuzzer target for the byte-level BPE tokenizer and
 * the streaming decoder, which see client text (prompts, stop strings) and
 * every committed token.
 *
 * The first input byte picks what the rest is: text, or token ids (two
 * bytes each, some out of range), or a chat user turn. Checked:
 *   - encoding any bytes succeeds with and without special-token parsing,
 *     every id is in the vocabulary, and decoding gives the bytes back
 *     exactly (byte-level BPE is lossless, invalid UTF-8 included) when the
 *     vocabulary has a symbol for each byte of the text (g_has_sym);
 *   - streaming those ids out one at a time (sd_tok_stream_push, then
 *     flush) gives valid UTF-8 only, and the text itself when the text was
 *     valid UTF-8 of such bytes;
 *   - streaming arbitrary ids: an unknown id is SD_ERR_RANGE and changes
 *     nothing, the output stays valid UTF-8;
 *   - a chat turn around any text formats and encodes.
 * A violation prints what and aborts; ASan/UBSan catch the rest.
 *
 * The tokenizer is the synthetic one specd-mkmodel writes (3 control
 * tokens, the 256 byte symbols, merges; 512 tokens), made once per
 * process, or the one of the GGUF named by SPECD_FUZZ_TOKENIZER (the demo
 * model, say). Linked with replay.c it is a plain program that runs each
 * file named on its command line (the CTest replay of
 * fuzz/corpus/tokenizer, built by every compiler). */
#include "specd/gguf.h"
#include "specd/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STREAM_CAP 256 /* sd_tok_stream_push's documented sufficient capacity */

static sd_tok *g_tok;
/* Bytes the vocabulary has a symbol token for. Real vocabularies lack some
 * (SmolLM2: 0x04 and bytes UTF-8 never uses); those encode as the unknown
 * token, as Hugging Face's BPE does, so only text made of the others comes
 * back exactly. */
static bool g_has_sym[256];
static char g_dir[64], g_path[128];

#define VIOLATION(...)                                   \
    do {                                                 \
        fprintf(stderr, "fuzz_tokenizer: " __VA_ARGS__); \
        fputc('\n', stderr);                             \
        abort();                                         \
    } while (0)

static bool utf8_valid(const char *s, size_t n) { return sd_utf8_valid_len(s, n) == n; }

/* Streams ids through a fresh decoder; returns the output (malloc'd). */
static char *stream_out(const int32_t *ids, size_t n, size_t *out_len, bool expect_all_known) {
    sd_tok_stream *st = sd_tok_stream_new(g_tok);
    if (!st) abort();
    size_t cap = 64 + n * STREAM_CAP, len = 0;
    char *out = malloc(cap);
    if (!out) abort();
    for (size_t i = 0; i < n; i++) {
        size_t got = 0;
        sd_status s = sd_tok_stream_push(st, ids[i], out + len, STREAM_CAP, &got);
        bool known = ids[i] >= 0 && ids[i] < sd_tok_n_vocab(g_tok);
        if (known && s != SD_OK) VIOLATION("stream push of id %d: %s", ids[i], sd_status_str(s));
        if (!known && s != SD_ERR_RANGE) VIOLATION("stream push of unknown id %d: %s", ids[i], sd_status_str(s));
        if (!known && got != 0) VIOLATION("unknown id %d wrote %zu bytes", ids[i], got);
        if (expect_all_known && !known) VIOLATION("encode gave id %d", ids[i]);
        if (got > STREAM_CAP) VIOLATION("push wrote %zu bytes into %d", got, STREAM_CAP);
        len += got;
    }
    size_t got = 0;
    if (sd_tok_stream_flush(st, out + len, STREAM_CAP, &got) != SD_OK) VIOLATION("flush failed");
    len += got;
    sd_tok_stream_free(&st);
    if (!utf8_valid(out, len)) VIOLATION("the stream gave invalid UTF-8 (%zu bytes)", len);
    *out_len = len;
    return out;
}

static void check_text(const char *text, size_t n, bool parse_special) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    sd_status s = sd_tok_encode(g_tok, text, n, parse_special, &ids, &n_ids);
    if (s != SD_OK) VIOLATION("encode of %zu bytes (special %d): %s", n, parse_special, sd_status_str(s));
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= sd_tok_n_vocab(g_tok)) VIOLATION("encode gave id %d", ids[i]);
    bool exact = true;
    for (size_t i = 0; i < n; i++) exact = exact && g_has_sym[(unsigned char)text[i]];
    char *back = NULL;
    size_t back_len = 0;
    if (sd_tok_decode(g_tok, ids, n_ids, &back, &back_len) != SD_OK) VIOLATION("decode failed");
    if (exact && (back_len != n || memcmp(back, text, n) != 0))
        VIOLATION("decode(encode(%zu bytes)) gave %zu bytes that differ (special %d)", n, back_len, parse_special);
    if (back[back_len] != '\0') VIOLATION("decode's text is not NUL-terminated");
    free(back);
    size_t out_len = 0;
    char *out = stream_out(ids, n_ids, &out_len, true);
    if (exact && utf8_valid(text, n) && (out_len != n || memcmp(out, text, n) != 0))
        VIOLATION("streaming valid UTF-8 of %zu bytes gave %zu bytes that differ", n, out_len);
    free(out);
    free(ids);
}

static void check_ids(const uint8_t *data, size_t size) {
    size_t n = size / 2;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) abort();
    int32_t span = sd_tok_n_vocab(g_tok) + 8;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)((data[2 * i] | data[2 * i + 1] << 8) % span) - 4;
    size_t out_len = 0;
    free(stream_out(ids, n, &out_len, false));
    free(ids);
}

static void check_chat(const char *text) {
    sd_chat_msg m[2] = {{"system", "You are terse."}, {"user", text}};
    char *chat = NULL;
    if (sd_tok_chat_format(m, 2, NULL, true, &chat) != SD_OK) VIOLATION("chat format failed");
    check_text(chat, strlen(chat), true);
    free(chat);
}

static void remove_model(void) {
    sd_tok_free(&g_tok);
    if (g_path[0]) unlink(g_path);
    if (g_dir[0]) rmdir(g_dir);
}

static bool setup(void) {
    atexit(remove_model);
    const char *path = getenv("SPECD_FUZZ_TOKENIZER");
    if (!path || !path[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/specd-fuzz-tok-XXXXXX");
        if (!mkdtemp(g_dir)) return false;
        snprintf(g_path, sizeof g_path, "%s/tok.gguf", g_dir);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab 512 --ctx 64 >/dev/null 2>&1",
                 SPECD_MKMODEL, g_path);
        if (system(cmd) != 0) return false;
        path = g_path;
    }
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        return false;
    }
    sd_status s = sd_tok_from_gguf(g, &g_tok);
    sd_gguf_close(&g);
    if (s != SD_OK) return false;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        if (sd_tok_encode(g_tok, &c, 1, false, &ids, &n) != SD_OK) return false;
        const char *piece = n == 1 ? sd_tok_piece(g_tok, ids[0], &len) : NULL;
        g_has_sym[b] = piece && len == 1 && piece[0] == c;
        free(ids);
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
        ready = setup() ? 1 : -1;
        if (ready < 0) fprintf(stderr, "fuzz_tokenizer: no tokenizer (specd-mkmodel %s)\n", SPECD_MKMODEL);
    }
    if (ready < 0) abort();
    if (size == 0) return 0;
    uint8_t mode = data[0] % 4;
    data++;
    size--;
    char *text = malloc(size + 1); /* exact size + NUL, so ASan sees over-reads */
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    switch (mode) {
    case 0: check_text(text, size, false); break;
    case 1: check_text(text, size, true); break;
    case 2: check_ids(data, size); break;
    case 3:
        /* a NUL ends the C string the chat formatter takes */
        check_chat(text);
        break;
    }
    (void)sd_tok_find(g_tok, text);
    free(text);
    return 0;
}
