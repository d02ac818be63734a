/* cli.c — command-line numbers (cli.h): one parser for every program, so a
 * flag is read the same way by the coordinator, the workers, the launcher
 * and the tools. */
#include "specd/cli.h"

#include "specd/sampling.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool sd_cli_parse_long(const char *s, long lo, long hi, long *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool sd_cli_parse_int(const char *s, int lo, int hi, int *out) {
    long v;
    if (!sd_cli_parse_long(s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

bool sd_cli_parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    long v;
    if (!sd_cli_parse_long(s, lo, hi, &v)) return false;
    *out = (int32_t)v;
    return true;
}

bool sd_cli_parse_double(const char *s, double lo, double hi, double *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

bool sd_cli_parse_float(const char *s, float *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

bool sd_cli_parse_verify_rule(const char *s, int32_t *out) {
    if (!s) return false;
    if (!strcmp(s, "coupled"))
        *out = SD_RULE_COUPLED;
    else if (!strcmp(s, "rejection"))
        *out = SD_RULE_REJECTION;
    else
        return false;
    return true;
}
