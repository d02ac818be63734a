/* sampling.c — the Sampling message's one rule: converted into the
 * engine's sd_sampling and checked once, where a message enters a process
 * (the decoders in validate.c hand the result back with the step or the
 * submit that carried it: sd_net_submit, sd_net_draft_step,
 * sd_net_verify_step), and converted back when a process sends one. The
 * check itself is the engine's sd_sampling_check, the same function
 * specd-generate and the tests reach through the engine's public entry
 * points; nothing behind a decoder converts or checks a Sampling again.
 * The wire's one quirk: proto3's unset top_p (0) means "off" (1). */
#include "validate_impl.h"

#include <stdio.h>

/* The conversion alone (no check): sd_net_sampling_from_pb and the
 * sd_net_*_step_of of a process's own request. */
static sd_sampling sampling_of(const Specd__Sampling *msg) {
    sd_sampling s = sd_sampling_default(); /* no sampling message: greedy */
    if (msg) {
        s.temperature = msg->temperature;
        s.top_k = msg->top_k > (uint32_t)INT32_MAX ? INT32_MAX : (int32_t)msg->top_k;
        s.top_p = msg->top_p == 0.0f ? 1.0f : msg->top_p; /* proto3's unset 0 is "off" */
        s.min_p = msg->min_p;
        s.seed = msg->seed;
        s.presence_penalty = msg->presence_penalty;
        s.frequency_penalty = msg->frequency_penalty;
        s.rule = (int32_t)msg->rule; /* sd_sampling_check refuses values past the known rules */
    }
    return s;
}

bool sd_net_sampling_from_pb(const Specd__Sampling *msg, sd_sampling *out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (msg && msg->top_k > (uint32_t)INT32_MAX) {
        if (err && err_len) snprintf(err, err_len, "top_k: %u over the limit of %d", msg->top_k, INT32_MAX);
        return false;
    }
    sd_sampling s = sampling_of(msg);
    if (sd_sampling_check(&s, err, err_len) != SD_OK) return false;
    *out = s;
    return true;
}

void sd_net_sampling_to_pb(const sd_sampling *s, Specd__Sampling *msg) {
    msg->temperature = s->temperature;
    msg->top_k = s->top_k > 0 ? (uint32_t)s->top_k : 0;
    msg->top_p = s->top_p >= 1.0f ? 0.0f : s->top_p;
    msg->min_p = s->min_p;
    msg->seed = s->seed;
    msg->presence_penalty = s->presence_penalty;
    msg->frequency_penalty = s->frequency_penalty;
    msg->rule = (Specd__VerifyRule)s->rule;
}

bool sd_nv_check_sampling(vctx *v, const char *path, const Specd__Sampling *s, sd_sampling *out) {
    char why[160];
    if (!sd_net_sampling_from_pb(s, out, why, sizeof why))
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.%s", path, why);
    return true;
}

void sd_net_draft_step_of(const Specd__DraftRequest *req, sd_net_draft_step *out) {
    out->req = req;
    for (size_t i = 0; i < req->n_seqs && i < SD_MAX_BATCH; i++)
        out->sampling[i] = sampling_of(req->seqs[i]->sampling);
}

void sd_net_verify_step_of(const Specd__VerifyRequest *req, sd_net_verify_step *out) {
    out->req = req;
    for (size_t i = 0; i < req->n_seqs && i < SD_MAX_BATCH; i++)
        out->sampling[i] = sampling_of(req->seqs[i]->sampling);
}
