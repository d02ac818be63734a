/* state.c — the coordinator's state: target identity read from GGUF
 * metadata (tokenizer and config only; no weights are loaded), defaults,
 * and teardown. */
#include "coord.h"

#include "specd/gguf.h"
#include "specd/weights.h"
#include "specd/model_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SMOLLM_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

uint64_t sd_coord_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

sd_coord_params sd_coord_default_params(void) {
    return (sd_coord_params){
        .client_addr = "tcp://127.0.0.1:7700",
        .worker_addr = "tcp://127.0.0.1:7701",
        .max_queue = 256,
        .max_active = 64,
        .max_tokens_default = 256,
        .k_default = 4,
        .k_max = 8,
        .adaptive_k = true,
        .prefill_chunk = 512,
        .draft_timeout_ms = 2000,
        .verify_timeout_ms = 30000,
        .heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS,
        .heartbeat_liveness = SD_HEARTBEAT_LIVENESS,
    };
}

/* True when the model's chat template carries SmolLM's default system
 * prompt: tokenizer.chat_template in a GGUF, tokenizer_config.json's
 * "chat_template" in a Hugging Face directory (searched as text: the prompt
 * has no character JSON escapes; the file is read up to 4 MB). */
static bool template_has_smollm_system(const sd_weights *w, const char *path) {
    const sd_gguf *g = sd_weights_gguf(w);
    if (g) {
        sd_gguf_str tmpl;
        return sd_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == SD_OK &&
               memmem(tmpl.ptr, tmpl.len, SMOLLM_SYSTEM, strlen(SMOLLM_SYSTEM)) != NULL;
    }
    char name[4096];
    if ((size_t)snprintf(name, sizeof name, "%s/tokenizer_config.json", path) >= sizeof name) return false;
    FILE *f = fopen(name, "rb");
    if (!f) return false;
    enum { MAX_BYTES = 4 << 20 };
    char *buf = malloc(MAX_BYTES);
    size_t n = buf ? fread(buf, 1, MAX_BYTES, f) : 0;
    fclose(f);
    bool found = buf && memmem(buf, n, SMOLLM_SYSTEM, strlen(SMOLLM_SYSTEM)) != NULL;
    free(buf);
    return found;
}

sd_status sd_coord_state_init(sd_coord *c, const sd_coord_params *p, const sd_coord_io *io) {
    memset(c, 0, sizeof *c);
    c->p = *p;
    c->io = *io;
    c->clock_us = sd_coord_now_us;
    sd_cost_init(&c->cost);
    c->alpha_prior = 0.6;
    c->drafting_pays = true;
    if (p->max_queue < 0 || p->max_active < 1 || p->k_default < 0 || p->k_max < 0 || p->k_max > SD_MAX_DRAFT ||
        p->prefill_chunk < 1 || p->max_tokens_default < 1 || p->heartbeat_interval_ms < 1 ||
        p->heartbeat_liveness < 1) {
        SD_ERROR("coordinator parameters out of range (max_active >= 1, 0 <= k_max <= %d, prefill_chunk >= 1...)",
                 SD_MAX_DRAFT);
        return SD_ERR_INVALID_ARG;
    }
    /* the target as any weights source: a GGUF file or a Hugging Face
     * directory (its tokenizer.json and config.json) */
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(p->model_path, &w);
    if (st != SD_OK) {
        SD_ERROR("%s: cannot open the target (GGUF file or Hugging Face directory): %s", p->model_path,
                 sd_status_str(st));
        return st;
    }
    sd_model_config cfg;
    st = sd_weights_config(w, &cfg);
    if (st == SD_OK) st = sd_weights_tokenizer(w, &c->tok);
    if (st == SD_OK && template_has_smollm_system(w, p->model_path)) c->default_system = SMOLLM_SYSTEM;
    sd_weights_close(&w);
    if (st != SD_OK) {
        SD_ERROR("%s: cannot read the target's tokenizer/config: %s", p->model_path, sd_status_str(st));
        sd_coord_state_free(c);
        return st;
    }
    memcpy(c->arch, cfg.arch, sizeof c->arch);
    c->n_vocab = sd_tok_n_vocab(c->tok);
    c->n_ctx = cfg.n_ctx_train;
    c->vocab_hash = sd_tok_vocab_hash(c->tok);
    c->lim = (sd_net_limits){
        .n_vocab = c->n_vocab, .max_context = c->n_ctx, .max_batch = SD_MAX_BATCH, .max_draft = SD_MAX_DRAFT};
    SD_INFO("target %s: %s, %d tokens (vocab hash 0x%016llx), context %d%s", p->model_path, c->arch, c->n_vocab,
            (unsigned long long)c->vocab_hash, c->n_ctx, c->default_system ? ", ChatML default system prompt" : "");
    return SD_OK;
}

void sd_coord_state_free(sd_coord *c) {
    for (int32_t i = 0; i < c->n_chunks; i++) free(c->chunks[i].text);
    free(c->chunks);
    c->chunks = NULL;
    c->n_chunks = c->cap_chunks = 0;
    for (int32_t i = 0; i < c->n_sessions; i++) sd_session_free(&c->sessions[i]);
    free(c->sessions);
    c->sessions = NULL;
    c->n_sessions = 0;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        free(c->workers[i].step_rids);
        free(c->workers[i].step_k);
        free(c->workers[i].step_end);
        c->workers[i].step_rids = NULL;
        c->workers[i].step_k = c->workers[i].step_end = NULL;
    }
    sd_tok_free(&c->tok);
}
