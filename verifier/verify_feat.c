/* verify_feat.c — the target's features for an EAGLE-3 head drafting in
 * its own process (specd-drafter --eagle; verify_feat.h).
 *
 * The coordinator names, in each VerifyRequest, the target layers its head
 * drafters read (VerifyRequest.feature_layers, from their Hello), and marks
 * the sequences drafted by one (VerifySeq.want_features). The target then
 * captures those layers on every forward of the step (sd_model_capture_set;
 * the capture stays set while steps keep asking, and is cleared at the
 * first step that does not), and the rows of each such sequence that became
 * committed positions (a prefill chunk's rows, a verify step's appended rows
 * and accepted drafts: never rejected drafts, nor the token the step
 * sampled, which the target has not run) go back in its VerifyResult as
 * they were captured: f32, layer after layer per row
 * (VerifyResult.features, positions feature_pos0 .. cached_len - 1).
 *
 * Why the raw layers and not the fused feature (the head's fc applied):
 * the verifier then needs nothing of the head (no head file, no fc matmul
 * on the target's hardware), any head for these layers can be swapped in
 * at the drafter, and fc runs where the head runs. It costs 3x the bytes of
 * the fused feature (3 x n_embd floats a position against the head's
 * hidden size): 6,912 bytes a committed position for SmolLM2-135M, 48 KiB
 * for an 8B Llama. Why f32: the head then reads exactly the bits it reads
 * in the verifier or single-process (its drafts are those drafts, which
 * the integration test checks chain by chain); a 16-bit encoding would
 * halve the bytes at the price of drafts that differ from the other
 * placements' (never the output: verification is exact whatever the
 * drafts).
 *
 * A sequence that wants features computes every row of its append: the
 * prefix cache's adoption is skipped for it (verify_serve.c), since an
 * adopted row is never computed and so has no features to send (the
 * drafter would lack those positions and draft nothing for the request).
 * Its blocks still enter the prefix cache for other sequences.
 *
 * A TP group's leader captures them as a lone verifier does: after each
 * layer's all-reduce its residual stream holds every row whole (see
 * verify_head.c), equal to TP 1's within the all-reduce's rounding.
 *
 * Refused (no features, logged once): layers the target does not have, a
 * verifier whose own head (--eagle) captures other layers, a step whose
 * features would pass SD_MAX_STEP_FEATURES floats (the sequences past it
 * get none). The coordinator's head drafter then lacks those positions and
 * drafts nothing for the sequence: the output never depends on it. */
#include "verify_feat.h"

#include <stdlib.h>
#include <string.h>

struct sd_vfeat {
    sd_model *target;
    int32_t max_batch, n_embd;
    int32_t head_ids[SD_MODEL_CAPTURE_MAX]; /* the own head's layers (it owns the capture) */
    int32_t n_head;
    int32_t ids[SD_MODEL_CAPTURE_MAX]; /* the capture this module set (n_ids 0: none) */
    int32_t n_ids;
    int32_t warned[SD_MODEL_CAPTURE_MAX]; /* the last refused layer set, said once */
    int32_t n_warned;
    bool on;            /* this step captures the requested layers */
    int32_t width;      /* floats a row this step */
    float *arena;       /* SD_MAX_STEP_FEATURES floats (allocated at the first use; pages touched as used) */
    size_t step_floats; /* of the arena, this step's results' features */
    uint64_t rows_sent, bytes_sent;
};

sd_status sd_vfeat_create(sd_model *target, int32_t max_batch, const int32_t *head_ids, int32_t n_head,
                          sd_vfeat **out) {
    if (!target || !out || max_batch <= 0 || n_head < 0 || n_head > SD_MODEL_CAPTURE_MAX || (n_head > 0 && !head_ids))
        return SD_ERR_INVALID_ARG;
    sd_vfeat *f = calloc(1, sizeof *f);
    if (!f) return SD_ERR_NOMEM;
    f->target = target;
    f->max_batch = max_batch;
    f->n_embd = sd_model_config_of(target)->n_embd;
    if (n_head > 0) memcpy(f->head_ids, head_ids, (size_t)n_head * sizeof *head_ids);
    f->n_head = n_head;
    *out = f;
    return SD_OK;
}

void sd_vfeat_free(sd_vfeat **fp) {
    if (!fp || !*fp) return;
    sd_vfeat *f = *fp;
    if (f->rows_sent > 0)
        SD_INFO("verifier: sent the features of %llu committed positions to head drafters: %llu bytes, %.0f a position",
                (unsigned long long)f->rows_sent, (unsigned long long)f->bytes_sent,
                (double)f->bytes_sent / (double)f->rows_sent);
    if (f->n_ids > 0) sd_model_capture_set(f->target, 0, NULL, false);
    free(f->arena);
    free(f);
    *fp = NULL;
}

static bool same_ids(const int32_t *a, int32_t na, const uint32_t *b, size_t nb) {
    if ((size_t)na != nb) return false;
    for (int32_t j = 0; j < na; j++)
        if ((uint32_t)a[j] != b[j]) return false;
    return true;
}

/* Says once per layer set why it gets no features. */
static void refuse(sd_vfeat *f, const Specd__VerifyRequest *req, const char *why) {
    if (same_ids(f->warned, f->n_warned, req->feature_layers, req->n_feature_layers)) return;
    f->n_warned = (int32_t)req->n_feature_layers;
    for (int32_t j = 0; j < f->n_warned; j++) f->warned[j] = (int32_t)req->feature_layers[j];
    SD_WARN("verifier: no features for the head drafter (%zu layers from %u): %s; it drafts nothing for those "
            "requests",
            req->n_feature_layers, req->n_feature_layers ? req->feature_layers[0] : 0, why);
}

void sd_vfeat_begin(sd_vfeat *f, const Specd__VerifyRequest *req) {
    if (!f) return;
    f->on = false;
    f->step_floats = 0;
    bool wanted = false;
    for (size_t i = 0; i < req->n_seqs && !wanted; i++) wanted = req->seqs[i]->want_features;
    if (!wanted || req->n_feature_layers == 0) {
        if (f->n_ids > 0 && !wanted) { /* nobody asks any more: stop copying the layers out */
            sd_model_capture_set(f->target, 0, NULL, false);
            f->n_ids = 0;
        }
        return;
    }
    if (req->n_feature_layers > SD_MODEL_CAPTURE_MAX) return refuse(f, req, "too many layers");
    if (f->n_head > 0) {
        if (!same_ids(f->head_ids, f->n_head, req->feature_layers, req->n_feature_layers))
            return refuse(f, req, "this verifier's own head (--eagle) captures other layers");
    } else if (!same_ids(f->ids, f->n_ids, req->feature_layers, req->n_feature_layers)) {
        int32_t ids[SD_MODEL_CAPTURE_MAX];
        for (size_t j = 0; j < req->n_feature_layers; j++)
            ids[j] = req->feature_layers[j] > INT32_MAX ? INT32_MAX : (int32_t)req->feature_layers[j];
        if (sd_model_capture_set(f->target, (int32_t)req->n_feature_layers, ids, false) != SD_OK) {
            f->n_ids = 0;
            return refuse(f, req, "the target has no such layer");
        }
        memcpy(f->ids, ids, req->n_feature_layers * sizeof *ids);
        f->n_ids = (int32_t)req->n_feature_layers;
        SD_INFO("verifier: capturing %d layers (%d..%d) for a head drafter", (int)f->n_ids, (int)ids[0],
                (int)ids[f->n_ids - 1]);
    }
    f->width = (int32_t)req->n_feature_layers * f->n_embd;
    f->on = true;
}

bool sd_vfeat_wanted(const sd_vfeat *f, const Specd__VerifySeq *s) { return f && f->on && s->want_features; }

void sd_vfeat_put(sd_vfeat *f, size_t i, const Specd__VerifySeq *s, int32_t pos0, int32_t n, int32_t row0,
                  Specd__VerifyResult *res) {
    if (!sd_vfeat_wanted(f, s) || n <= 0 || i >= (size_t)f->max_batch) return;
    int32_t n_rows = 0;
    const float *aux = sd_model_capture_aux(f->target, &n_rows);
    const size_t floats = (size_t)n * (size_t)f->width;
    if (!aux || row0 < 0 || pos0 < 0 || (int64_t)row0 + n > n_rows) {
        SD_WARN("verifier: request %llu: no captured rows %d..%d (the forward had %d): no features",
                (unsigned long long)s->request_id, (int)row0, (int)(row0 + n - 1), (int)n_rows);
        return;
    }
    if (floats > (size_t)SD_MAX_STEP_FEATURES - f->step_floats) {
        SD_WARN("verifier: request %llu: its %d rows of features would pass the step's %d floats: none sent",
                (unsigned long long)s->request_id, (int)n, SD_MAX_STEP_FEATURES);
        return;
    }
    if (!f->arena && !(f->arena = malloc((size_t)SD_MAX_STEP_FEATURES * sizeof *f->arena))) {
        SD_ERROR("verifier: out of memory for a step's features (%d floats)", SD_MAX_STEP_FEATURES);
        return;
    }
    float *dst = f->arena + f->step_floats;
    memcpy(dst, aux + (size_t)row0 * (size_t)f->width, floats * sizeof *aux);
    f->step_floats += floats;
    res->feature_pos0 = (uint32_t)pos0;
    res->feature_width = (uint32_t)f->width;
    res->n_features = floats;
    res->features = dst;
    f->rows_sent += (uint64_t)n;
    f->bytes_sent += (uint64_t)floats * sizeof(float);
}

void sd_vfeat_totals(const sd_vfeat *f, uint64_t *rows, uint64_t *bytes) {
    *rows = f ? f->rows_sent : 0;
    *bytes = f ? f->bytes_sent : 0;
}
