/* tok_cli.c — drives the tokenizer from the Python oracle test.
 *
 * tok_cli MODEL IN OUT      (MODEL: a GGUF file, a Hugging Face checkpoint directory,
 *                            or a bare tokenizer.json: a path ending in .json)
 * IN holds records  [u8 parse_special][u32 len][len bytes]  (little endian);
 * OUT gets, per record,  [u32 n_ids][n_ids x i32][u32 len][decoded bytes].
 * A length-prefixed binary format was chosen over JSON so that any byte
 * string (NULs, invalid UTF-8) travels unchanged. */
#include "specd/tokenizer.h"
#include "specd/weights.h"
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int read_all(const char *path, unsigned char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return -1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        unsigned char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            buf = NULL;
            continue;
        }
        buf = nb;
    }
    fclose(f);
    *data = buf;
    *len = n;
    return 0;
}

static void put_u32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, f);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf|HF_DIR IN OUT\n", argv[0]);
        return 2;
    }
    sd_tok *t = NULL;
    double t_build = sd_now();
    sd_status st;
    size_t plen = strlen(argv[1]);
    if (plen > 5 && strcmp(argv[1] + plen - 5, ".json") == 0) {
        unsigned char *json = NULL;
        size_t json_len = 0;
        if (read_all(argv[1], &json, &json_len) != 0) {
            fprintf(stderr, "tok_cli: cannot read %s\n", argv[1]);
            return 1;
        }
        st = sd_tok_from_hf_json((const char *)json, json_len, NULL, &t);
        free(json);
    } else {
        sd_weights *w = NULL;
        if (sd_weights_open(argv[1], &w) != SD_OK) {
            fprintf(stderr, "tok_cli: cannot open %s (see the log above)\n", argv[1]);
            return 1;
        }
        st = sd_weights_tokenizer(w, &t);
        sd_weights_close(&w);
    }
    t_build = sd_now() - t_build;
    if (st != SD_OK) {
        fprintf(stderr, "tok_cli: tokenizer: %s\n", sd_status_str(st));
        return 1;
    }
    unsigned char *in = NULL;
    size_t in_len = 0;
    FILE *out = fopen(argv[3], "wb");
    if (read_all(argv[2], &in, &in_len) != 0 || !out) {
        fprintf(stderr, "tok_cli: cannot read %s or write %s\n", argv[2], argv[3]);
        sd_tok_free(&t);
        free(in);
        if (out) fclose(out);
        return 1;
    }
    int rc = 0;
    double t_enc = 0;
    size_t at = 0, n_bytes = 0;
    while (at < in_len && rc == 0) {
        if (in_len - at < 5) {
            rc = 1;
            break;
        }
        bool parse_special = in[at] != 0;
        uint32_t len =
            (uint32_t)in[at + 1] | (uint32_t)in[at + 2] << 8 | (uint32_t)in[at + 3] << 16 | (uint32_t)in[at + 4] << 24;
        at += 5;
        if (in_len - at < len) {
            rc = 1;
            break;
        }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        double t0 = sd_now();
        st = sd_tok_encode(t, (const char *)in + at, len, parse_special, &ids, &n_ids);
        t_enc += sd_now() - t0;
        n_bytes += len;
        at += len;
        char *text = NULL;
        size_t text_len = 0;
        if (st == SD_OK) st = sd_tok_decode(t, ids, n_ids, &text, &text_len);
        if (st != SD_OK) {
            fprintf(stderr, "tok_cli: encode/decode failed: %s\n", sd_status_str(st));
            rc = 1;
        } else {
            put_u32(out, (uint32_t)n_ids);
            fwrite(ids, sizeof *ids, n_ids, out);
            put_u32(out, (uint32_t)text_len);
            fwrite(text, 1, text_len, out);
        }
        free(ids);
        free(text);
    }
    if (at != in_len && rc == 0) rc = 1;
    fprintf(stderr, "tok_cli: %d tokens, built in %.3f s, tables %.1f MiB; encoded %zu bytes in %.3f s\n",
            sd_tok_n_vocab(t), t_build, (double)sd_tok_memory_bytes(t) / (1 << 20), n_bytes, t_enc);
    if (fclose(out) != 0) rc = 1;
    free(in);
    sd_tok_free(&t);
    return rc;
}
