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
        .default_k = 4,
        .max_k = 8,
        .adaptive_k = true,
        .prefill_chunk = 512,
        .draft_timeout_ms = 2000,
        .verify_timeout_ms = 30000,
        .drain_timeout_ms = 20000,
        .heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS,
        .heartbeat_liveness = SD_HEARTBEAT_LIVENESS,
        .local_ngram_cache = 65536,
        .verify_rule = SD_RULE_COUPLED,
    };
}

sd_status sd_coord_state_init(sd_coord *c, const sd_coord_params *p, const sd_coord_io *io) {
    memset(c, 0, sizeof *c);
    c->p = *p;
    c->io = *io;
    c->clock_us = sd_coord_now_us;
    sd_cost_init(&c->cost);
    c->alpha_prior = 0.6;
    c->drafting_pays = true;
    /* Request ids never repeat across restarts (wall-clock seconds << 20:
     * a million requests a second before the next start could collide, and
     * below 2^53, so JSON keeps them exact): a client resubmitting after a
     * coordinator restart keeps its first id for the user, and must not see
     * it handed to another of its requests. */
    c->next_request_id = (uint64_t)time(NULL) << 20;
    if (p->max_queue < 0 || p->max_active < 1 || p->default_k < 0 || p->max_k < 0 || p->max_k > SD_MAX_K ||
        p->prefill_chunk < 1 || p->max_tokens_default < 1 || p->heartbeat_interval_ms < 1 ||
        p->heartbeat_liveness < 1) {
        SD_ERROR("coordinator parameters out of range (max_active >= 1, 0 <= max_k <= %d, prefill_chunk >= 1...)",
                 SD_MAX_K);
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
    if (st == SD_OK) st = sd_chat_template_from_model(w, p->model_path, c->tok, p->chat_template, &c->chat);
    sd_weights_close(&w);
    if (st != SD_OK) {
        SD_ERROR("%s: cannot read the target's tokenizer/config/chat template: %s", p->model_path, sd_status_str(st));
        sd_coord_state_free(c);
        return st;
    }
    memcpy(c->arch, cfg.arch, sizeof c->arch);
    c->n_vocab = sd_tok_n_vocab(c->tok);
    c->n_ctx = cfg.n_ctx_train;
    c->vocab_hash = sd_tok_vocab_hash(c->tok);
    c->lim =
        (sd_net_limits){.n_vocab = c->n_vocab, .max_context = c->n_ctx, .max_batch = SD_MAX_BATCH, .max_k = SD_MAX_K};
    SD_INFO("target %s: %s, %d tokens (vocab hash 0x%016llx), context %d, chat template %s%s", p->model_path, c->arch,
            c->n_vocab, (unsigned long long)c->vocab_hash, c->n_ctx, sd_chat_template_name(c->chat),
            sd_chat_template_default_system(c->chat) ? " with a default system prompt" : "");
    return SD_OK;
}

void sd_coord_state_free(sd_coord *c) {
    for (int32_t i = 0; i < c->n_clients; i++) sd_outbox_client_forget(c, &c->clients[i]);
    for (int32_t i = 0; i < c->n_chunks; i++) {
        free(c->chunks[i].text);
        free(c->chunks[i].logprobs);
    }
    free(c->chunks);
    c->chunks = NULL;
    c->n_chunks = c->cap_chunks = 0;
    for (int32_t i = 0; i < c->n_sessions; i++) sd_session_free(&c->sessions[i]);
    sd_choice_free(c);
    sd_route_free(&c->route);
    free(c->sessions);
    c->sessions = NULL;
    c->n_sessions = 0;
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        free(c->workers[i].step_rids);
        free(c->workers[i].step_k);
        free(c->workers[i].step_end);
        free(c->workers[i].step_lp);
        c->workers[i].step_lp = NULL;
        c->workers[i].step_rids = NULL;
        c->workers[i].step_k = c->workers[i].step_end = NULL;
    }
    sd_tok_free(&c->tok);
    sd_chat_template_free(&c->chat);
}
