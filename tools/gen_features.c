/* gen_features.c — specd-generate --dump-features (gen_features.h): plain
 * decoding with the target's feature capture on (model.h), one safetensors
 * file per sequence for tools/train-eagle. The decode loop is the plain
 * one of specd-generate (prefill, then one token per forward, sampled with
 * the counter-based generator at its position); the capture only copies
 * rows out, so the tokens are the ones plain decoding makes. */
#include "gen_features.h"

#include "bench_prompts.h"

#include "specd/eagle.h"
#include "specd/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What a dump runs: the caller's parameters and what main derives. */
typedef struct dump_job {
    const sd_gen_dump_params *p;
    const char *const *prompts; /* [n_prompts] */
    size_t n_prompts;
    int32_t n_layers; /* capture ids */
    int32_t layer_ids[SD_MODEL_CAPTURE_MAX];
    const char *model_name;
} dump_job;

/* A sequence's rows as they come out of the forwards. */
typedef struct dump_seq {
    int32_t *tokens;  /* [cap] */
    float *aux;       /* [cap][n_layers * E] */
    float *final;     /* [cap][E] */
    int32_t n, cap;   /* rows with features; tokens may run one ahead */
    int32_t n_prompt; /* the prompt's tokens, the first ones */
} dump_seq;

static void dump_seq_free(dump_seq *s) {
    free(s->tokens);
    free(s->aux);
    free(s->final);
    memset(s, 0, sizeof *s);
}

/* Appends the last forward's n_rows captured rows. */
static sd_status take_rows(dump_seq *s, const sd_model *m, int32_t width, int32_t E) {
    int32_t n_aux = 0, n_final = 0;
    const float *aux = sd_model_capture_aux(m, &n_aux);
    const float *fin = sd_model_capture_final(m, &n_final);
    if (!aux || !fin || n_aux != n_final || s->n + n_aux > s->cap) return SD_ERR_INTERNAL;
    memcpy(s->aux + (size_t)s->n * (size_t)width, aux, (size_t)n_aux * (size_t)width * sizeof(float));
    memcpy(s->final + (size_t)s->n * (size_t)E, fin, (size_t)n_aux * (size_t)E * sizeof(float));
    s->n += n_aux;
    return SD_OK;
}

static sd_status write_seq(const dump_job *j, const dump_seq *s, int32_t index, int32_t E, int32_t V) {
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    if (!w) return SD_ERR_NOMEM;
    char ids[16 * SD_MODEL_CAPTURE_MAX] = "", num[32], path[4096];
    for (int32_t i = 0; i < j->n_layers; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", (int)j->layer_ids[i]);
    const uint64_t T = (uint64_t)s->n, shape_aux[2] = {T, (uint64_t)j->n_layers * (uint64_t)E},
                   shape_fin[2] = {T, (uint64_t)E};
    sd_status st = sd_safetensors_writer_set_metadata(w, "layer_ids", ids);
    snprintf(num, sizeof num, "%d", (int)E);
    if (st == SD_OK) st = sd_safetensors_writer_set_metadata(w, "hidden_size", num);
    snprintf(num, sizeof num, "%d", (int)V);
    if (st == SD_OK) st = sd_safetensors_writer_set_metadata(w, "vocab_size", num);
    if (st == SD_OK) st = sd_safetensors_writer_set_metadata(w, "model", j->model_name);
    snprintf(num, sizeof num, "%d", (int)s->n_prompt);
    if (st == SD_OK) st = sd_safetensors_writer_set_metadata(w, "n_prompt", num);
    if (st == SD_OK) st = sd_safetensors_writer_add_tensor(w, "tokens", SD_SAFETENSORS_I32, 1, &T, s->tokens);
    if (st == SD_OK) st = sd_safetensors_writer_add_tensor(w, "aux", SD_SAFETENSORS_F32, 2, shape_aux, s->aux);
    if (st == SD_OK) st = sd_safetensors_writer_add_tensor(w, "final", SD_SAFETENSORS_F32, 2, shape_fin, s->final);
    snprintf(path, sizeof path, "%s/%06d.safetensors", j->p->dir, (int)index);
    if (st == SD_OK) st = sd_safetensors_writer_write(w, path);
    if (st != SD_OK) SD_ERROR("dump: cannot write %s: %s", path, sd_status_str(st));
    sd_safetensors_writer_free(&w);
    return st;
}

/* The prompt's ids (chat template or plain text; BOS when the model wants it). */
static sd_status encode(const sd_gen_dump_params *p, const sd_tok *tok, const char *prompt, int32_t **ids, size_t *n) {
    if (p->chat) {
        sd_chat_msg msgs[2];
        size_t nm = 0;
        if (p->system) msgs[nm++] = (sd_chat_msg){"system", p->system};
        msgs[nm++] = (sd_chat_msg){"user", prompt};
        char err[400];
        sd_status st = sd_chat_template_encode(p->chat, tok, msgs, nm, true, ids, n, NULL, err, sizeof err);
        if (st != SD_OK) SD_ERROR("dump: chat formatting failed: %s", err);
        SD_TRY(st);
    } else {
        SD_TRY(sd_tok_encode(tok, prompt, strlen(prompt), false, ids, n));
    }
    if (sd_tok_add_bos(tok) && sd_tok_bos(tok) >= 0 && (*n == 0 || (*ids)[0] != sd_tok_bos(tok))) {
        int32_t *b = malloc((*n + 1) * sizeof *b);
        if (!b) return SD_ERR_NOMEM;
        b[0] = sd_tok_bos(tok);
        if (*n) memcpy(b + 1, *ids, *n * sizeof *b);
        free(*ids);
        *ids = b;
        (*n)++;
    }
    return *n > 0 ? SD_OK : SD_ERR_INVALID_ARG;
}

/* Plain decoding after s->tokens[0..n_prompt), every forward captured. */
static sd_status generate_one(sd_model *m, const sd_tok *tok, const dump_job *j, dump_seq *s, int32_t n_prompt,
                              int32_t *scratch_pos, bool *want, int32_t *seq0, float *logits, int32_t *counts) {
    const sd_gen_dump_params *p = j->p;
    const sd_model_config *c = sd_model_config_of(m);
    const int32_t E = c->n_embd, width = j->n_layers * E;
    const int32_t block = 16;
    sd_kv *kv = NULL;
    SD_TRY(sd_model_kv_create(m, 1, (s->cap + block - 1) / block + 1, block, &kv));
    for (int32_t i = 0; i < n_prompt; i++) {
        scratch_pos[i] = i;
        want[i] = i == n_prompt - 1;
    }
    sd_batch b = {n_prompt, s->tokens, scratch_pos, seq0, want};
    sd_status st = sd_model_forward(m, kv, &b, logits);
    if (st == SD_OK) st = take_rows(s, m, width, E);
    int32_t n_tok = n_prompt;
    for (int32_t i = 0; st == SD_OK && i < p->n_predict && n_tok < s->cap; i++) {
        int32_t next;
        st = sd_sample_penalize(logits, c->n_vocab, &p->sampling, s->tokens + n_prompt, n_tok - n_prompt, counts);
        if (st == SD_OK) st = sd_sample_token(logits, c->n_vocab, &p->sampling, (uint64_t)n_tok, &next);
        if (st != SD_OK) break;
        s->tokens[n_tok] = next;
        int32_t pos = n_tok++;
        bool last = i + 1 == p->n_predict || n_tok == s->cap || (!p->ignore_eos && sd_tok_is_eog(tok, next));
        bool one = !last; /* the last token is fed only for its features */
        sd_batch step = {1, &next, &pos, seq0, &one};
        st = sd_model_forward(m, kv, &step, logits);
        if (st == SD_OK) st = take_rows(s, m, width, E);
        if (last) break;
    }
    sd_kv_free(&kv);
    return st;
}

static sd_status dump_run(sd_model *m, const sd_tok *tok, const dump_job *j, int32_t *n_written) {
    const sd_gen_dump_params *p = j->p;
    const sd_model_config *c = sd_model_config_of(m);
    const int32_t E = c->n_embd;
    *n_written = 0;
    SD_TRY(sd_model_capture_set(m, j->n_layers, j->layer_ids, true));
    float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
    int32_t *counts = calloc((size_t)c->n_vocab, sizeof *counts); /* sd_sample_penalize's scratch */
    sd_status st = logits && counts ? SD_OK : SD_ERR_NOMEM;
    for (size_t i = 0; st == SD_OK && i < j->n_prompts; i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        st = encode(p, tok, j->prompts[i], &ids, &n_ids);
        if (st == SD_OK && (int64_t)n_ids + p->n_predict > c->n_ctx_train) {
            SD_WARN("dump: prompt %zu (%zu tokens) + %d new exceeds the context %d: skipped", i, n_ids,
                    (int)p->n_predict, (int)c->n_ctx_train);
            free(ids);
            continue;
        }
        dump_seq s = {.cap = (int32_t)n_ids + p->n_predict, .n_prompt = (int32_t)n_ids};
        s.tokens = malloc((size_t)s.cap * sizeof *s.tokens);
        s.aux = malloc((size_t)s.cap * (size_t)j->n_layers * (size_t)E * sizeof *s.aux);
        s.final = malloc((size_t)s.cap * (size_t)E * sizeof *s.final);
        int32_t *pos = malloc(n_ids * sizeof *pos), *seq0 = calloc(n_ids, sizeof *seq0);
        bool *want = calloc(n_ids, sizeof *want);
        if (st == SD_OK && (!s.tokens || !s.aux || !s.final || !pos || !seq0 || !want)) st = SD_ERR_NOMEM;
        if (st == SD_OK) {
            memcpy(s.tokens, ids, n_ids * sizeof *ids);
            st = generate_one(m, tok, j, &s, (int32_t)n_ids, pos, want, seq0, logits, counts);
        }
        if (st == SD_OK) st = write_seq(j, &s, *n_written, E, c->n_vocab);
        if (st == SD_OK) {
            fprintf(stderr, "dump: %06d: %zu prompt + %d generated tokens\n", (int)*n_written, n_ids,
                    (int)(s.n - (int32_t)n_ids));
            (*n_written)++;
        }
        dump_seq_free(&s);
        free(ids);
        free(pos);
        free(seq0);
        free(want);
    }
    free(logits);
    free(counts);
    sd_model_capture_set(m, 0, NULL, false);
    return st;
}

int sd_gen_dump_main(const sd_gen_dump_params *p, sd_model *m, const sd_tok *tok) {
    dump_job j = {.p = p};
    const char *slash = strrchr(p->model_path, '/');
    j.model_name = slash ? slash + 1 : p->model_path;
    if (p->layers && !sd_gen_parse_layers(p->layers, j.layer_ids, SD_MODEL_CAPTURE_MAX, &j.n_layers)) {
        fprintf(stderr, "specd-generate: --eagle-layers wants up to %d layer ids, as a,b,c\n", SD_MODEL_CAPTURE_MAX);
        return 2;
    }
    if (!p->layers) {
        sd_eagle_default_layers(sd_model_config_of(m)->n_layers, j.layer_ids);
        j.n_layers = SD_EAGLE_N_AUX;
    }
    if (mkdir(p->dir, 0755) != 0 && errno != EEXIST) { /* the directory, not its parents */
        fprintf(stderr, "specd-generate: cannot create --dump-features directory %s: %s\n", p->dir, strerror(errno));
        return 1;
    }
    char **lines = NULL;
    size_t n_lines = 0;
    const char *one = p->prompt ? p->prompt : "";
    if (p->prompt_file && sd_bench_read_prompt_file(p->prompt_file, &lines, &n_lines) != 0) return 1;
    j.prompts = p->prompt_file ? (const char *const *)lines : &one;
    j.n_prompts = p->prompt_file ? n_lines : 1;
    int32_t n_written = 0;
    sd_status st = dump_run(m, tok, &j, &n_written);
    sd_bench_prompts_free(lines, n_lines);
    if (st != SD_OK)
        fprintf(stderr, "specd-generate: --dump-features failed: %s (see the log above)\n", sd_status_str(st));
    else
        fprintf(stderr, "[dumped %d sequences to %s]\n", (int)n_written, p->dir);
    return st == SD_OK ? 0 : 1;
}

bool sd_gen_parse_layers(const char *s, int32_t *ids, int32_t max, int32_t *n) {
    *n = 0;
    while (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1 << 20 || *n >= max || (*end && *end != ',')) return false;
        ids[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *n > 0;
}

/* All of stdin, malloc'd and NUL-terminated; *n_read the bytes read (more
 * than strlen when the input holds a NUL). NULL when out of memory. */
static char *read_stdin(size_t *n_read) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                return NULL;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    buf[len] = 0;
    *n_read = len;
    return buf;
}

int sd_gen_prompt_stdin(const char **prompt, char **owned) {
    size_t n_read = 0;
    char *text = read_stdin(&n_read);
    if (!text) return 1;
    if (strlen(text) != n_read) {
        fprintf(stderr,
                "specd-generate: the prompt on stdin holds a NUL byte at offset %zu: refused rather "
                "than cut there\n",
                strlen(text));
        free(text);
        return 2;
    }
    *prompt = *owned = text;
    return 0;
}
