/* sampling.h — the sampling parameters of a request: one struct, one default
 * (greedy), one validator with one rule set, and the one limit on the draft
 * length. The client, net, the coordinator, the verifier, the drafter and
 * specd-generate all apply these, so a request is judged the same wherever it
 * enters. (On the wire, proto3 sends 0 for an unset top_p; net maps that to
 * 1 = off before validating: a property of the encoding, not a second rule.) */
#ifndef SPECD_SAMPLING_H
#define SPECD_SAMPLING_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest draft length (draft tokens verified per sequence per step),
 * for every process and the wire. */
#define SD_MAX_K                    32
/* The largest temperature accepted (beyond it the distribution is uniform to
 * float precision; the bound keeps 1/T finite and meaningful). */
#define SD_SAMPLING_MAX_TEMPERATURE 1000.0f

typedef struct sd_sampling {
    float temperature; /* 0 = greedy (argmax); otherwise in (0, SD_SAMPLING_MAX_TEMPERATURE] */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* in (0, 1]; 1 = off */
    float min_p;       /* in [0, 1); 0 = off */
    uint64_t seed;
} sd_sampling;

/* Greedy: temperature 0, top_k 0, top_p 1, min_p 0, seed 0. */
sd_sampling sd_sampling_default(void);

/* True when s picks the argmax (temperature 0); the filters then do not
 * matter. */
static inline bool sd_sampling_is_greedy(const sd_sampling *s) { return s->temperature == 0.0f; }

/* The one rule set: SD_OK, or SD_ERR_INVALID_ARG with a sentence naming the
 * field and its range written to err (when err_len > 0). Logs nothing. */
sd_status sd_sampling_check(const sd_sampling *s, char *err, size_t err_len);

/* sd_sampling_check, with the sentence logged as an error. */
sd_status sd_sampling_validate(const sd_sampling *s);

#ifdef __cplusplus
}
#endif
#endif
