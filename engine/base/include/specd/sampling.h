/* sampling.h — the sampling parameters of a request, their one default and
 * their one validator (the contract every process applies). */
#ifndef SPECD_SAMPLING_H
#define SPECD_SAMPLING_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_sampling {
    float temperature; /* 0 = greedy (argmax); otherwise > 0 */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* in (0, 1]; 1 = off */
    float min_p;       /* in [0, 1); 0 = off */
    uint64_t seed;
} sd_sampling;

/* temperature 1, top_k 0, top_p 1, min_p 0, seed 0. */
sd_sampling sd_sampling_default(void);
/* SD_ERR_INVALID_ARG (with a log line naming the field) when out of range. */
sd_status sd_sampling_validate(const sd_sampling *s);

#ifdef __cplusplus
}
#endif
#endif
