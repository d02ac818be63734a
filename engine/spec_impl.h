/* spec_impl.h — what engine/spec.c shares with the other verification
 * rule (spec_reject.c); not part of the public API. */
#ifndef SPECD_SPEC_IMPL_H
#define SPECD_SPEC_IMPL_H

#include "specd/common.h"

#include <stdint.h>

/* The sum of a dense processed distribution row (index order) into
 * *total; SD_ERR_INVALID_ARG (logged, naming row i) for a negative or
 * non-finite entry or a row with no positive mass. */
sd_status sd_spec_p_row_total(const float *row, int32_t n_vocab, int32_t i, double *total);

#endif
