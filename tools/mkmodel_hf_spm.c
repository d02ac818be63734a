/* mkmodel_hf_spm.c — the merge list of a SentencePiece vocabulary, for the
 * tokenizer.json that specd-mkmodel writes beside a Gemma / Mistral / Phi-3 /
 * Llama 2 checkpoint (GGUF tokenizer.ggml.model "llama").
 *
 * A GGUF keeps SentencePiece pieces with scores; a Hugging Face
 * tokenizer.json keeps a BPE model with byte_fallback and a merge list.
 * transformers' converter (SentencePieceExtractor) derives the merges as
 * every split of a piece into two pieces that are both in the vocabulary,
 * at a character boundary, ordered by the piece's score (highest first),
 * then by the piece's id, then by the two halves' ids. That is done here the
 * same way, so the file reads back (tokenizer_hf.c) to the same encodings as
 * the GGUF's scores give. Pieces are found through an open-addressing hash
 * of their bytes (Gemma 3: 262,144 pieces; each split is one probe). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mkmodel_hf.h"

typedef struct spm_merge {
    float score;                /* the merged piece's */
    int32_t piece, left, right; /* ids (the first id of each text) */
} spm_merge;

typedef struct piece_map {
    const sd_gguf_str *text; /* [n] borrowed from the GGUF */
    int32_t *slot;           /* [cap]: id or -1 */
    size_t cap;
} piece_map;

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
    return h;
}

/* The first id whose text is p[0..n), or -1. */
static int32_t map_find(const piece_map *m, const char *p, size_t n) {
    for (size_t i = hash_bytes(p, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (m->text[id].len == n && memcmp(m->text[id].ptr, p, n) == 0) return id;
    }
}

static sd_status map_build(piece_map *m, const sd_gguf_str *text, uint64_t n) {
    m->text = text;
    m->cap = 16;
    while (m->cap < 2 * n) m->cap <<= 1;
    m->slot = malloc(m->cap * sizeof *m->slot);
    if (!m->slot) return SD_ERR_NOMEM;
    for (size_t i = 0; i < m->cap; i++) m->slot[i] = -1;
    for (uint64_t id = 0; id < n; id++) {
        size_t i = hash_bytes(text[id].ptr, (size_t)text[id].len) & (m->cap - 1);
        for (;; i = (i + 1) & (m->cap - 1)) {
            int32_t o = m->slot[i];
            if (o < 0) {
                m->slot[i] = (int32_t)id;
                break;
            }
            if (text[o].len == text[id].len && memcmp(text[o].ptr, text[id].ptr, (size_t)text[id].len) == 0)
                break; /* a duplicate text: the first id stands for it */
        }
    }
    return SD_OK;
}

static int cmp_merge(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->piece != b->piece) return a->piece < b->piece ? -1 : 1;
    if (a->left != b->left) return a->left < b->left ? -1 : 1;
    return a->right < b->right ? -1 : a->right > b->right;
}

/* Every valid split of each distinct piece, appended to *out (grown). */
static sd_status collect(const piece_map *m, const uint8_t *scores, uint64_t n, spm_merge **out, size_t *n_out) {
    size_t cap = 0;
    for (uint64_t id = 0; id < n; id++) {
        const char *p = m->text[id].ptr;
        size_t len = (size_t)m->text[id].len;
        if (map_find(m, p, len) != (int32_t)id) continue; /* a later duplicate */
        for (size_t k = 1; k < len; k++) {
            if (((uint8_t)p[k] & 0xC0) == 0x80) continue; /* inside a UTF-8 character */
            int32_t l = map_find(m, p, k), r = l >= 0 ? map_find(m, p + k, len - k) : -1;
            if (r < 0) continue;
            if (*n_out == cap) {
                cap = cap ? 2 * cap : 4096;
                spm_merge *g = realloc(*out, cap * sizeof *g);
                if (!g) return SD_ERR_NOMEM;
                *out = g;
            }
            float score; /* the GGUF array need not be aligned */
            memcpy(&score, scores + 4 * id, sizeof score);
            (*out)[(*n_out)++] = (spm_merge){score, (int32_t)id, l, r};
        }
    }
    return SD_OK;
}

sd_status mk_spm_merges(const sd_gguf *g, uint64_t n_tokens, cJSON *merges) {
    sd_gguf_type et;
    uint64_t n_scores = 0;
    const void *data = NULL;
    if (sd_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n_scores) != SD_OK || et != SD_GGUF_TYPE_FLOAT32 ||
        n_scores != n_tokens || sd_gguf_get_arr_data(g, "tokenizer.ggml.scores", &data, &n_scores) != SD_OK) {
        fprintf(stderr, "specd-mkmodel: a SentencePiece vocabulary needs tokenizer.ggml.scores (f32, one a token)\n");
        return SD_ERR_FORMAT;
    }
    sd_gguf_str *text = malloc((size_t)(n_tokens ? n_tokens : 1) * sizeof *text);
    if (!text) return SD_ERR_NOMEM;
    sd_status s = SD_OK;
    for (uint64_t i = 0; s == SD_OK && i < n_tokens; i++)
        s = sd_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &text[i]);
    piece_map m = {0};
    spm_merge *list = NULL;
    size_t n = 0;
    if (s == SD_OK) s = map_build(&m, text, n_tokens);
    if (s == SD_OK) s = collect(&m, data, n_tokens, &list, &n);
    if (s == SD_OK) qsort(list, n, sizeof *list, cmp_merge);
    for (size_t i = 0; s == SD_OK && i < n; i++) {
        cJSON *pair = cJSON_CreateArray();
        const sd_gguf_str *l = &text[list[i].left], *r = &text[list[i].right];
        char *ls = strndup(l->ptr, (size_t)l->len), *rs = strndup(r->ptr, (size_t)r->len);
        if (!pair || !ls || !rs) s = SD_ERR_NOMEM;
        if (s == SD_OK) {
            cJSON_AddItemToArray(pair, cJSON_CreateString(ls));
            cJSON_AddItemToArray(pair, cJSON_CreateString(rs));
            cJSON_AddItemToArray(merges, pair);
        } else {
            cJSON_Delete(pair);
        }
        free(ls);
        free(rs);
    }
    free(list);
    free(m.slot);
    free(text);
    return s;
}
