/* eagle_probe — runs an EAGLE-3 head (engine/spec/eagle_head.c) on given
 * features for tests/ref/test_eagle_head.py.
 *
 *   eagle_probe TARGET HEAD_DIR IN.safetensors OUT.safetensors N_CHAIN [q8_0|stored]
 *
 * IN holds tokens I32 [n] (the token each head row reads) and aux F32
 * [n][3 Ht] (the target features of those rows). The probe loads the head
 * for TARGET (a GGUF or HF directory; its embedding serves a head without
 * one), fuses aux, runs the n rows in one forward (logits of every row),
 * then N_CHAIN chain steps, each reading the argmax draft of the previous
 * row (mapped to its target id) and that row's pre-norm output. OUT gets
 * fused [n][H], logits [n + N_CHAIN][Vd], hidden [n + N_CHAIN][H] and
 * chain I32 [N_CHAIN] (the target ids fed). The last argument is the head's
 * sd_eagle_params.weights (default: the library's, Q8_0). A refused head
 * exits 3 with the loader's log line on stderr. */
#include "specd/eagle.h"
#include "specd/safetensors.h"
#include "specd/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const sd_safetensors_tensor *need(const sd_safetensors *st, const char *name, sd_safetensors_dtype dt) {
    const sd_safetensors_tensor *t = sd_safetensors_find(st, name);
    if (!t || t->dtype != dt) fprintf(stderr, "eagle_probe: input lacks %s of the right type\n", name);
    return t && t->dtype == dt ? t : NULL;
}

static int run(sd_eagle_head *h, const sd_safetensors *in, const char *out_path, int n_chain) {
    const sd_safetensors_tensor *tt = need(in, "tokens", SD_SAFETENSORS_I32), *ta = need(in, "aux", SD_SAFETENSORS_F32);
    if (!tt || !ta) return 1;
    const int32_t n = (int32_t)tt->n_elems, H = sd_eagle_head_hidden(h), Vd = sd_eagle_head_draft_vocab(h);
    const int32_t rows = n + n_chain;
    int32_t *tokens = malloc((size_t)n * sizeof *tokens), *chain = calloc((size_t)n_chain + 1, sizeof *chain);
    float *aux = malloc((size_t)ta->n_bytes), *fused = malloc((size_t)n * (size_t)H * sizeof(float));
    float *logits = malloc((size_t)rows * (size_t)Vd * sizeof(float));
    float *hidden = malloc((size_t)rows * (size_t)H * sizeof(float));
    bool *want = malloc((size_t)n * sizeof *want);
    int rc = 1;
    if (!tokens || !chain || !aux || !fused || !logits || !hidden || !want) goto done;
    memcpy(tokens, tt->data, (size_t)n * sizeof *tokens);
    memcpy(aux, ta->data, (size_t)ta->n_bytes);
    for (int32_t i = 0; i < n; i++) want[i] = true;
    if (sd_eagle_head_fuse(h, aux, n, fused) != SD_OK ||
        sd_eagle_head_forward(h, 0, 0, n, tokens, fused, want, logits, hidden) != SD_OK)
        goto done;
    for (int32_t c = 0; c < n_chain; c++) {
        const float *last = logits + (size_t)(n + c - 1) * (size_t)Vd;
        int32_t best = 0;
        for (int32_t i = 1; i < Vd; i++)
            if (last[i] > last[best]) best = i;
        chain[c] = sd_eagle_head_target_id(h, best);
        if (sd_eagle_head_forward(h, 0, n + c, 1, &chain[c], hidden + (size_t)(n + c - 1) * (size_t)H, NULL,
                                  logits + (size_t)(n + c) * (size_t)Vd, hidden + (size_t)(n + c) * (size_t)H) != SD_OK)
            goto done;
    }
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    const uint64_t sf[2] = {(uint64_t)n, (uint64_t)H}, sl[2] = {(uint64_t)rows, (uint64_t)Vd},
                   sh[2] = {(uint64_t)rows, (uint64_t)H}, sc[1] = {(uint64_t)n_chain};
    bool ok =
        w && sd_safetensors_writer_add_tensor(w, "fused", SD_SAFETENSORS_F32, 2, sf, fused) == SD_OK &&
        sd_safetensors_writer_add_tensor(w, "logits", SD_SAFETENSORS_F32, 2, sl, logits) == SD_OK &&
        sd_safetensors_writer_add_tensor(w, "hidden", SD_SAFETENSORS_F32, 2, sh, hidden) == SD_OK &&
        (n_chain == 0 || sd_safetensors_writer_add_tensor(w, "chain", SD_SAFETENSORS_I32, 1, sc, chain) == SD_OK) &&
        sd_safetensors_writer_write(w, out_path) == SD_OK;
    sd_safetensors_writer_free(&w);
    rc = ok ? 0 : 1;
done:
    free(tokens);
    free(chain);
    free(aux);
    free(fused);
    free(logits);
    free(hidden);
    free(want);
    return rc;
}

int main(int argc, char **argv) {
    sd_eagle_params p = sd_eagle_default_params();
    if ((argc != 6 && argc != 7) || (argc == 7 && !sd_eagle_weights_parse(argv[6], &p.weights))) {
        fprintf(stderr, "usage: eagle_probe TARGET HEAD_DIR IN.safetensors OUT.safetensors N_CHAIN [q8_0|stored]\n");
        return 2;
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "eagle_probe");
    sd_weights *w = NULL;
    sd_model *m = NULL;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    if (sd_weights_open(argv[1], &w) != SD_OK || sd_model_load_weights(w, &mp, &m) != SD_OK) {
        fprintf(stderr, "eagle_probe: cannot load the target %s\n", argv[1]);
        sd_weights_close(&w);
        return 1;
    }
    sd_weights_close(&w);
    sd_eagle_target t = sd_eagle_target_of(m);
    p.max_ctx = 512;
    p.n_threads = 2;
    sd_eagle_head *h = NULL;
    sd_status s = sd_eagle_head_load(argv[2], &t, &p, &h);
    if (s != SD_OK) {
        fprintf(stderr, "eagle_probe: refused: %s\n", sd_status_str(s));
        sd_model_free(&m);
        return 3;
    }
    int32_t ids[SD_EAGLE_N_AUX];
    sd_eagle_head_layers(h, ids);
    printf("layers %d %d %d\n", (int)ids[0], (int)ids[1], (int)ids[2]);
    sd_safetensors *in = NULL;
    char err[256];
    int rc = 1;
    if (sd_safetensors_open(argv[3], &in, err, sizeof err) == SD_OK)
        rc = run(h, in, argv[4], atoi(argv[5]));
    else
        fprintf(stderr, "eagle_probe: %s: %s\n", argv[3], err);
    sd_safetensors_close(&in);
    sd_eagle_head_free(&h);
    sd_model_free(&m);
    return rc;
}
