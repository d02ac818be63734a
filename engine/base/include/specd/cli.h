/* cli.h — command-line numbers, parsed one way in every program: the whole
 * string must be the number (no trailing text, no empty string, no overflow)
 * and inside [lo, hi]. The callers print their own message naming the flag. */
#ifndef SPECD_CLI_H
#define SPECD_CLI_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A decimal integer in [lo, hi] into *out; false (and *out untouched) otherwise. */
bool sd_cli_parse_long(const char *s, long lo, long hi, long *out);
bool sd_cli_parse_int(const char *s, int lo, int hi, int *out);
bool sd_cli_parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out);
/* A decimal or hexadecimal floating-point number in [lo, hi] (NaN never is). */
bool sd_cli_parse_double(const char *s, double lo, double hi, double *out);
/* Any float strtof reads whole (range checks are the caller's: sampling
 * parameters go to sd_sampling_check). */
bool sd_cli_parse_float(const char *s, float *out);
/* A verification rule's name, "coupled" or "rejection", into *out as
 * sd_verify_rule (specd/sampling.h): --verify-rule in specd-coordinator and
 * specd-generate. False (and *out untouched) for any other string. */
bool sd_cli_parse_verify_rule(const char *s, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
