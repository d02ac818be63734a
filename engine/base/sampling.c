/* sampling.c — the sampling parameters' one default and one validator.
 *
 * Every edge where sampling parameters enter a process (net/'s decoders, the
 * engine's public entry points) checks them here, once, so one
 * request is judged by one rule set wherever it enters. Pure arithmetic:
 * net/ and client/ link it without any model code. */
#include "specd/sampling.h"

#include <math.h>
#include <stdio.h>

sd_sampling sd_sampling_default(void) {
    sd_sampling s = {.temperature = 0.0f,
                     .top_k = 0,
                     .top_p = 1.0f,
                     .min_p = 0.0f,
                     .seed = 0,
                     .presence_penalty = 0.0f,
                     .frequency_penalty = 0.0f,
                     .rule = SD_RULE_DEFAULT};
    return s;
}

#define FAIL(...)                                                \
    do {                                                         \
        if (err && err_len) snprintf(err, err_len, __VA_ARGS__); \
        return SD_ERR_INVALID_ARG;                               \
    } while (0)

sd_status sd_sampling_check(const sd_sampling *s, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!s) FAIL("sampling: parameters are missing");
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature))
        FAIL("temperature: %g, must be finite and >= 0", (double)s->temperature);
    if (s->temperature > SD_SAMPLING_MAX_TEMPERATURE)
        FAIL("temperature: %g over the limit of %g", (double)s->temperature, (double)SD_SAMPLING_MAX_TEMPERATURE);
    if (s->top_k < 0) FAIL("top_k: %d, must be >= 0 (0 = off)", (int)s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f)) FAIL("top_p: %g outside (0, 1] (1 = off)", (double)s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p < 1.0f)) FAIL("min_p: %g outside [0, 1) (0 = off)", (double)s->min_p);
    if (!(fabsf(s->presence_penalty) <= SD_SAMPLING_MAX_PENALTY))
        FAIL("presence_penalty: %g outside [%g, %g]", (double)s->presence_penalty, -(double)SD_SAMPLING_MAX_PENALTY,
             (double)SD_SAMPLING_MAX_PENALTY);
    if (!(fabsf(s->frequency_penalty) <= SD_SAMPLING_MAX_PENALTY))
        FAIL("frequency_penalty: %g outside [%g, %g]", (double)s->frequency_penalty, -(double)SD_SAMPLING_MAX_PENALTY,
             (double)SD_SAMPLING_MAX_PENALTY);
    if (s->rule < SD_RULE_DEFAULT || s->rule > SD_RULE_REJECTION)
        FAIL("rule: %d is not a verification rule (0 default, 1 coupled, 2 rejection)", (int)s->rule);
    return SD_OK;
}
#undef FAIL

sd_status sd_sampling_validate(const sd_sampling *s) {
    char err[128];
    sd_status st = sd_sampling_check(s, err, sizeof err);
    if (st != SD_OK) SD_ERROR("sampling: %s", err);
    return st;
}
