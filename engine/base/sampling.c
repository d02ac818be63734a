/* sampling.c — the sampling parameters' one default and one validator.
 *
 * Every process that takes sampling parameters (client, net, coordinator,
 * verifier, drafter, specd-generate) checks them here, so one request is
 * judged by one rule set wherever it enters. Pure arithmetic: net/ and
 * client/ link it without any model code. */
#include "specd/sampling.h"

#include <math.h>

sd_sampling sd_sampling_default(void) {
    sd_sampling s = { .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0 };
    return s;
}

sd_status sd_sampling_validate(const sd_sampling *s) {
    if (!s) {
        SD_ERROR("sampling: parameters are NULL");
        return SD_ERR_INVALID_ARG;
    }
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature)) {
        SD_ERROR("sampling: temperature must be finite and >= 0, got %g", (double)s->temperature);
        return SD_ERR_INVALID_ARG;
    }
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f)) {
        SD_ERROR("sampling: top_p must be in (0, 1], got %g", (double)s->top_p);
        return SD_ERR_INVALID_ARG;
    }
    if (!(s->min_p >= 0.0f && s->min_p < 1.0f)) {
        SD_ERROR("sampling: min_p must be in [0, 1), got %g", (double)s->min_p);
        return SD_ERR_INVALID_ARG;
    }
    if (s->top_k < 0) {
        SD_ERROR("sampling: top_k must be >= 0, got %d", (int)s->top_k);
        return SD_ERR_INVALID_ARG;
    }
    return SD_OK;
}
