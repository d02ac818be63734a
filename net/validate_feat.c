/* validate_feat.c — a head drafter's features at the edge (validate_impl.h).
 *
 * specd-drafter --eagle runs an EAGLE-3 head away from the target: its
 * Hello names the target layers it reads and the floats per position
 * (feature_width = layers x the target's hidden size), the coordinator asks
 * the verifier to capture those layers (VerifyRequest.feature_layers) for
 * the sequences that want them, and passes the rows each result carries
 * (VerifyResult.features) on to the drafter (DraftSeq.features). Every one
 * of these is bounded here before a process acts on it:
 *   - Hello: 1..SD_MAX_FEATURE_LAYERS layer ids with a width that is a
 *     multiple of their count, at most SD_MAX_FEATURE_WIDTH, only from a
 *     drafter of kind EAGLE; none and 0 otherwise;
 *   - VerifyRequest.feature_layers: at most SD_MAX_FEATURE_LAYERS ids;
 *   - VerifyResult: features only with a width in [1, SD_MAX_FEATURE_WIDTH]
 *     and exactly (cached_len - feature_pos0) rows of it (cached_len within
 *     the context), on an OK result, finite values, and at most
 *     SD_MAX_STEP_FEATURES floats in the whole response (the coordinator
 *     checks feature_pos0 against the keep_len its step sent: rows at most
 *     what the step appended and accepted, coordinator/feat_relay.c);
 *   - DraftSeq: features only to a drafter that announced a width, a whole
 *     number of rows of it, all before the context's last token
 *     (feature_pos0 + rows <= keep_len + |append| - 1), finite, and at most
 *     SD_MAX_STEP_FEATURES floats in the whole request.
 * Finite values: a head fed an infinity or a NaN drafts garbage or NaN
 * probabilities; the scan costs one compare per float, next to the copy the
 * unpack already did. */
#include "validate_impl.h"

#include <math.h>

/* Every value of f[n] finite; else sd_nv_fail naming the first. */
static bool check_finite(vctx *v, const char *path, const float *f, size_t n) {
    for (size_t j = 0; j < n; j++)
        if (!isfinite(f[j]))
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s[%zu]: %g is not a finite feature value", path, j,
                              (double)f[j]);
    return true;
}

/* Adds n floats to *total, refusing a step past SD_MAX_STEP_FEATURES. */
static bool add_total(vctx *v, const char *what, size_t *total, size_t n) {
    if (n > (size_t)SD_MAX_STEP_FEATURES - *total)
        return sd_nv_fail(v, SPECD__CODE__CODE_TOO_LARGE, "%s: %zu feature floats in one step, over the limit of %d",
                          what, *total + n, SD_MAX_STEP_FEATURES);
    *total += n;
    return true;
}

bool sd_nv_check_hello_features(vctx *v, const char *path, const Specd__Hello *h) {
    if (h->n_feature_layers == 0 && h->feature_width == 0) return true;
    if (h->role != SPECD__ROLE__ROLE_DRAFTER || h->drafter_kind != SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "%s.feature_layers: only a drafter of kind DRAFTER_KIND_EAGLE reads the target's features",
                          path);
    if (h->n_feature_layers < 1 || h->n_feature_layers > SD_MAX_FEATURE_LAYERS)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.feature_layers: %zu layers, expected 1..%d", path,
                          h->n_feature_layers, SD_MAX_FEATURE_LAYERS);
    for (size_t j = 0; j < h->n_feature_layers; j++)
        if (h->feature_layers[j] > SD_MAX_FEATURE_LAYER_ID)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "%s.feature_layers[%zu]: %u is not a layer id", path, j,
                              h->feature_layers[j]);
    if (h->feature_width < 1 || h->feature_width > SD_MAX_FEATURE_WIDTH || h->feature_width % h->n_feature_layers != 0)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "%s.feature_width: %u, expected a multiple of the %zu layers in [1, %d]", path,
                          h->feature_width, h->n_feature_layers, SD_MAX_FEATURE_WIDTH);
    return true;
}

bool sd_nv_check_feature_layers(vctx *v, const Specd__VerifyRequest *r) {
    if (r->n_feature_layers > SD_MAX_FEATURE_LAYERS)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.feature_layers: %zu layers over the limit of %d",
                          r->n_feature_layers, SD_MAX_FEATURE_LAYERS);
    for (size_t j = 0; j < r->n_feature_layers; j++)
        if (r->feature_layers[j] > SD_MAX_FEATURE_LAYER_ID)
            return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.feature_layers[%zu]: %u is not a layer id", j,
                              r->feature_layers[j]);
    return true;
}

bool sd_nv_check_result_features(vctx *v, size_t i, const Specd__VerifyResult *d, size_t *total) {
    if (d->n_features == 0) return true;
    if (d->code != SPECD__CODE__CODE_OK)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.results[%zu].features: with code %d", i,
                          (int)d->code);
    if (d->feature_width < 1 || d->feature_width > SD_MAX_FEATURE_WIDTH)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST, "verify.results[%zu].feature_width: %u outside [1, %d]", i,
                          d->feature_width, SD_MAX_FEATURE_WIDTH);
    if (d->feature_pos0 >= d->cached_len)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "verify.results[%zu].feature_pos0: %u, not below cached_len %u", i, d->feature_pos0,
                          d->cached_len);
    /* rows within cached_len, itself within the context (checked by the caller); the coordinator
     * also checks feature_pos0 against the keep_len it sent (rows <= the step's appended + accepted) */
    const uint64_t rows = (uint64_t)d->cached_len - d->feature_pos0;
    if ((uint64_t)d->n_features != rows * d->feature_width)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "verify.results[%zu].features: %zu floats, expected %llu rows x %u = %llu", i, d->n_features,
                          (unsigned long long)rows, d->feature_width, (unsigned long long)(rows * d->feature_width));
    if (!add_total(v, "verify.results", total, d->n_features)) return false;
    return check_finite(v, "verify.results.features", d->features, d->n_features);
}

bool sd_nv_check_draft_features(vctx *v, size_t i, const Specd__DraftSeq *s, size_t *total) {
    if (s->n_features == 0) return true;
    if (v->feature_width <= 0)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "draft.seqs[%zu].features: %zu floats to a drafter that reads no features", i, s->n_features);
    const size_t w = (size_t)v->feature_width;
    if (s->n_features % w != 0)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "draft.seqs[%zu].features: %zu floats, not a whole number of rows of %zu", i, s->n_features,
                          w);
    const uint64_t rows = s->n_features / w, len = (uint64_t)s->keep_len + s->n_append;
    if (len == 0 || (uint64_t)s->feature_pos0 + rows > len - 1)
        return sd_nv_fail(v, SPECD__CODE__CODE_BAD_REQUEST,
                          "draft.seqs[%zu].features: positions %u..%llu, the context of %llu tokens has features of "
                          "positions below %llu only",
                          i, s->feature_pos0, (unsigned long long)(s->feature_pos0 + rows - 1), (unsigned long long)len,
                          (unsigned long long)(len ? len - 1 : 0));
    if (!add_total(v, "draft.seqs", total, s->n_features)) return false;
    return check_finite(v, "draft.seqs.features", s->features, s->n_features);
}
