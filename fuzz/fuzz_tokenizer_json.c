/* fuzz_tokenizer_json.c — libFuzzer target for the Hugging Face
 * tokenizer.json reader (sd_tok_from_hf_json), which reads a file from any
 * checkpoint directory given to -m.
 *
 * The first input byte picks the special-token ids and the vocabulary size
 * the config would add (sd_tok_hf_ids: none, small, or large ids, padding
 * or not); the rest is the JSON. Checked: a refusal is SD_ERR_FORMAT or
 * SD_ERR_UNSUPPORTED and returns no tokenizer; an accepted file gives a
 * tokenizer of at least one token whose every piece can be looked up (up to
 * a cap), whose BOS/EOS are in range or -1, and which encodes a text (with
 * special tokens) into ids in range that decode. ASan/UBSan catch the rest.
 * Linked with replay.c it is a plain program that runs each file named on
 * its command line (the CTest replay of fuzz/corpus/tokenizer_json). */
#include "specd/tokenizer.h"
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PIECE_WALK 4096

#define VIOLATION(...)                                        \
    do {                                                      \
        fprintf(stderr, "fuzz_tokenizer_json: " __VA_ARGS__); \
        fputc('\n', stderr);                                  \
        abort();                                              \
    } while (0)

static sd_tok_hf_ids ids_for(uint8_t b) {
    sd_tok_hf_ids ids = sd_tok_hf_ids_default();
    switch (b % 4) {
    case 0: break;
    case 1: /* what a config.json may give */ ids.bos = 1, ids.eos = 2, ids.pad = 0, ids.add_bos = 1; break;
    case 2: /* ids past the vocabulary, and padding up to a size */
        ids.bos = 100000, ids.eos = -7, ids.eot = 5, ids.n_vocab = 1000;
        break;
    case 3: /* texts from tokenizer_config.json */
        ids.bos_text = "<|im_start|>", ids.eos_text = "<|im_end|>", ids.pad_text = "nope", ids.add_bos = 0;
        ids.n_vocab = (int32_t)(b >> 2) * 4;
        break;
    }
    return ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool quiet;
    if (!quiet) {
        sd_log_set(NULL, NULL, SD_LOG_OFF, NULL);
        quiet = true;
    }
    if (size == 0) return 0;
    sd_tok_hf_ids ids = ids_for(data[0]);
    char *json = malloc(size > 1 ? size - 1 : 1); /* exact size (no NUL), so ASan sees over-reads */
    if (!json) abort();
    memcpy(json, data + 1, size - 1);
    sd_tok *tok = NULL;
    sd_status st = sd_tok_from_hf_json(json, size - 1, &ids, &tok);
    if (st != SD_OK) {
        if (tok) VIOLATION("a refusal (%s) returned a tokenizer", sd_status_str(st));
        if (st != SD_ERR_FORMAT && st != SD_ERR_UNSUPPORTED && st != SD_ERR_NOMEM)
            VIOLATION("refused with %s", sd_status_str(st));
        free(json);
        return 0;
    }
    int32_t n = sd_tok_n_vocab(tok);
    if (n < 1) VIOLATION("a tokenizer of %d tokens", n);
    if (sd_tok_bos(tok) < -1 || sd_tok_bos(tok) >= n || sd_tok_eos(tok) < -1 || sd_tok_eos(tok) >= n)
        VIOLATION("BOS %d / EOS %d outside [0, %d)", sd_tok_bos(tok), sd_tok_eos(tok), n);
    for (int32_t i = 0; i < n && i < MAX_PIECE_WALK; i++) {
        size_t len = 0;
        if (!sd_tok_piece(tok, i, &len)) VIOLATION("no piece for id %d of %d", i, n);
    }
    static const char text[] = "Hello <|im_start|>user 12345 caf\xc3\xa9\n\t \xff";
    int32_t *out = NULL;
    size_t n_out = 0;
    if (sd_tok_encode(tok, text, sizeof text - 1, true, &out, &n_out) != SD_OK) VIOLATION("encode failed");
    for (size_t i = 0; i < n_out; i++)
        if (out[i] < 0 || out[i] >= n) VIOLATION("encode gave id %d of %d", out[i], n);
    char *back = NULL;
    size_t back_len = 0;
    if (sd_tok_decode(tok, out, n_out, &back, &back_len) != SD_OK) VIOLATION("decode failed");
    free(back);
    free(out);
    (void)sd_tok_vocab_hash(tok);
    sd_tok_free(&tok);
    free(json);
    return 0;
}
