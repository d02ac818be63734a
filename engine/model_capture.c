/* model_capture.c — the opt-in feature capture of the forward pass
 * (sd_model_capture_set, model.h): what an EAGLE-3 draft head reads, and
 * what `specd-generate --dump-features` writes for training one.
 *
 * The forward (model_forward.c) calls sd_model_capture_layer after every
 * layer only when a capture is set; that call copies the whole batch's
 * residual stream x [n][E] after the captured layers into the host buffer
 * aux [n][n_layers][E] (each row's layers side by side, in the order set,
 * which is the [3H] concatenation the head's fc takes), and after the last
 * layer computes the final norm of each row on the host into final [n][E]
 * (the LM head's input; the backend's own norm runs only on the rows whose
 * logits are wanted). On a host-memory backend x is read in place; a device
 * backend downloads it once per captured layer. A capture never changes
 * what the forward computes: it only reads x between layers.
 *
 * In a TP group (model_forward.c) every layer ends with the all-reduce of
 * its row-parallel partial sums added into x, on every rank: the leader's
 * x after a layer is the whole residual stream, and this capture reads it
 * as at TP 1. Its values differ from TP 1's only by the all-reduce's
 * summation order (tests/test_tp_capture.c: within 1e-5 of each row's
 * max); a rank > 0 runs the leader's plans with no capture set. On a GPU
 * group whose collectives run on the compute stream the download first
 * waits for them, bounded (sd_coll_wait), as the forward does before it
 * reads logits. */
#include "model_impl.h"
#include "specd/coll.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void capture_buffers_free(model_capture *c) {
    free(c->aux);
    free(c->final_x);
    free(c->download);
    c->aux = c->final_x = c->download = NULL;
    c->cap_rows = 0;
    c->n_rows = 0;
}

void sd_model_capture_free(sd_model *m) {
    if (!m || !m->capture) return;
    capture_buffers_free(m->capture);
    free(m->capture->norm_w);
    free(m->capture);
    m->capture = NULL;
}

sd_status sd_model_capture_set(sd_model *m, int32_t n_layers, const int32_t *layer_ids, bool final) {
    if (!m) return SD_ERR_INVALID_ARG;
    if (n_layers == 0) {
        sd_model_capture_free(m);
        return SD_OK;
    }
    if (n_layers < 0 || n_layers > SD_MODEL_CAPTURE_MAX || !layer_ids) {
        SD_ERROR("model: a capture of %d layers (1..%d)", (int)n_layers, SD_MODEL_CAPTURE_MAX);
        return SD_ERR_RANGE;
    }
    for (int32_t i = 0; i < n_layers; i++)
        if (layer_ids[i] < 0 || layer_ids[i] >= m->n_layers_used) {
            SD_ERROR("model: capture of layer %d, the model runs layers 0..%d", (int)layer_ids[i],
                     (int)m->n_layers_used - 1);
            return SD_ERR_RANGE;
        }
    sd_model_capture_free(m);
    model_capture *c = calloc(1, sizeof *c);
    if (!c) return SD_ERR_NOMEM;
    c->n_layers = n_layers;
    memcpy(c->layer_ids, layer_ids, (size_t)n_layers * sizeof *layer_ids);
    c->final = final;
    if (final) {
        const size_t bytes = (size_t)m->cfg.n_embd * sizeof(float);
        c->norm_w = malloc(bytes);
        if (!c->norm_w || m->be.ops->buf_download(m->be.ctx, c->norm_w, m->output_norm, bytes) != SD_OK) {
            free(c->norm_w);
            free(c);
            return SD_ERR_NOMEM;
        }
    }
    m->capture = c;
    return SD_OK;
}

static sd_status capture_reserve(sd_model *m, int32_t n) {
    model_capture *c = m->capture;
    if (n <= c->cap_rows) return SD_OK;
    capture_buffers_free(c);
    const size_t E = (size_t)m->cfg.n_embd, rows = (size_t)n;
    c->aux = malloc(rows * (size_t)c->n_layers * E * sizeof(float));
    c->final_x = c->final ? malloc(rows * E * sizeof(float)) : NULL;
    c->download = m->be.ops->host_memory ? NULL : malloc(rows * E * sizeof(float));
    if (!c->aux || (c->final && !c->final_x) || (!m->be.ops->host_memory && !c->download)) {
        capture_buffers_free(c);
        SD_ERROR("model: cannot allocate the feature capture for %d rows", (int)n);
        return SD_ERR_NOMEM;
    }
    c->cap_rows = n;
    return SD_OK;
}

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], in double like the reference. */
static void host_rmsnorm(const float *x, const float *w, int32_t E, float eps, float *out) {
    double ss = 0;
    for (int32_t i = 0; i < E; i++) ss += (double)x[i] * (double)x[i];
    const float r = (float)(1.0 / sqrt(ss / (double)E + (double)eps));
    for (int32_t i = 0; i < E; i++) out[i] = x[i] * r * w[i];
}

sd_status sd_model_capture_layer(sd_model *m, int32_t l, int32_t n) {
    model_capture *c = m->capture;
    const bool last = l == m->n_layers_used - 1;
    bool wanted = last && c->final;
    for (int32_t i = 0; i < c->n_layers; i++) wanted = wanted || c->layer_ids[i] == l;
    if (!wanted) return SD_OK;
    SD_TRY(capture_reserve(m, n));
    const size_t E = (size_t)m->cfg.n_embd;
    const float *x = m->act.x; /* [n][E] */
    if (!m->be.ops->host_memory) {
        /* a GPU group's all-reduce may still be on the stream: wait for it
         * with the group's bound (model_forward.c's settle_coll), not in
         * the download, which would block for good on a dead peer */
        if (m->coll_on_stream) SD_TRY(sd_coll_wait(m->coll));
        SD_TRY(m->be.ops->buf_download(m->be.ctx, c->download, m->act.x, (size_t)n * E * sizeof(float)));
        x = c->download;
    }
    for (int32_t slot = 0; slot < c->n_layers; slot++) {
        if (c->layer_ids[slot] != l) continue; /* an id may be listed twice (tiny models' defaults) */
        for (int32_t t = 0; t < n; t++)
            memcpy(c->aux + ((size_t)t * (size_t)c->n_layers + (size_t)slot) * E, x + (size_t)t * E, E * sizeof(float));
    }
    if (last && c->final)
        for (int32_t t = 0; t < n; t++)
            host_rmsnorm(x + (size_t)t * E, c->norm_w, (int32_t)E, m->cfg.rms_eps, c->final_x + (size_t)t * E);
    c->n_rows = n;
    return SD_OK;
}

const float *sd_model_capture_aux(const sd_model *m, int32_t *n_rows) {
    if (n_rows) *n_rows = 0;
    if (!m || !m->capture || !m->capture->aux || m->capture->n_rows == 0) return NULL;
    if (n_rows) *n_rows = m->capture->n_rows;
    return m->capture->aux;
}

const float *sd_model_capture_final(const sd_model *m, int32_t *n_rows) {
    if (n_rows) *n_rows = 0;
    if (!m || !m->capture || !m->capture->final_x || m->capture->n_rows == 0) return NULL;
    if (n_rows) *n_rows = m->capture->n_rows;
    return m->capture->final_x;
}

sd_status sd_model_embed_host(const sd_model *m, const int32_t *ids, int32_t n, float *out) {
    if (!m || (n > 0 && (!ids || !out)) || n < 0) return SD_ERR_INVALID_ARG;
    const size_t E = (size_t)m->cfg.n_embd;
    for (int32_t t = 0; t < n; t++) {
        if (ids[t] < 0 || ids[t] >= m->cfg.n_vocab) {
            SD_ERROR("model: embedding of id %d outside [0, %d)", (int)ids[t], (int)m->cfg.n_vocab);
            return SD_ERR_RANGE;
        }
        float *row = out + (size_t)t * E;
        if (m->tok_embd.type == SD_DTYPE_F32) {
            const float *src = (const float *)m->tok_embd.w + (size_t)ids[t] * E;
            if (m->be.ops->host_memory)
                memcpy(row, src, E * sizeof(float));
            else
                SD_TRY(m->be.ops->buf_download(m->be.ctx, row, src, E * sizeof(float)));
            continue;
        }
        size_t be, bb;
        if (!sd_dtype_block(m->tok_embd.type, &be, &bb)) return SD_ERR_INTERNAL;
        const size_t row_bytes = E / be * bb;
        SD_TRY(sd_dequantize(m->tok_embd.type, (const unsigned char *)m->tok_embd.w + (size_t)ids[t] * row_bytes,
                             (uint64_t)E, row));
    }
    return SD_OK;
}
