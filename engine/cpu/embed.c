/* embed.c — embedding lookup (also used to gather rows of any [n][dim] buffer).
 * A plain row copy: memory-bound and tiny next to the matmuls, so it runs on
 * the calling thread. */
#include <string.h>

#include "cpu/cpu_impl.h"

sd_status sd_cpu_embed(sd_backend *be, const float *table, int32_t dim, const int32_t *ids, int32_t n_tokens,
                       float *out) {
    (void)be;
    for (int32_t t = 0; t < n_tokens; t++)
        memcpy(out + (size_t)t * (size_t)dim, table + (size_t)ids[t] * (size_t)dim, (size_t)dim * sizeof(float));
    return SD_OK;
}
