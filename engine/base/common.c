/* common.c — status strings, the process's log sink, the clock.
 *
 * The sink is a function pointer plus a level and a prefix, set once at
 * start-up (sd_log_set). Formatting happens in a stack buffer so a log line is
 * one write(2) and lines from threads do not interleave mid-line. */
#define _POSIX_C_SOURCE 200809L
#include "specd/common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const status_names[SD_STATUS_COUNT] = {
    [SD_OK] = "ok",
    [SD_ERR_INVALID_ARG] = "invalid argument",
    [SD_ERR_IO] = "i/o error",
    [SD_ERR_FORMAT] = "malformed input",
    [SD_ERR_UNSUPPORTED] = "unsupported",
    [SD_ERR_NOMEM] = "out of memory",
    [SD_ERR_OUT_OF_BLOCKS] = "out of KV blocks",
    [SD_ERR_RANGE] = "out of range",
    [SD_ERR_NOT_FOUND] = "not found",
    [SD_ERR_INTERNAL] = "internal error",
    [SD_ERR_CUDA] = "cuda error",
    [SD_ERR_NET] = "network error",
    [SD_ERR_TIMEOUT] = "timed out",
    [SD_ERR_ABORTED] = "aborted",
};

const char *sd_status_str(sd_status s) {
    if ((unsigned)s >= SD_STATUS_COUNT || !status_names[s]) return "unknown status";
    return status_names[s];
}

static struct {
    sd_log_fn fn;
    void *user;
    sd_log_level min_level;
    char prefix[64];
} logger = {NULL, NULL, SD_LOG_INFO, "specd"};

void sd_log_set(sd_log_fn fn, void *user, sd_log_level min_level, const char *prefix) {
    logger.fn = fn;
    logger.user = user;
    logger.min_level = min_level;
    if (prefix) snprintf(logger.prefix, sizeof logger.prefix, "%s", prefix);
}

bool sd_log_enabled(sd_log_level level) { return level >= logger.min_level && level < SD_LOG_OFF; }

static const char *level_name(sd_log_level l) {
    switch (l) {
    case SD_LOG_DEBUG: return "DEBUG";
    case SD_LOG_INFO: return "INFO";
    case SD_LOG_WARN: return "WARN";
    case SD_LOG_ERROR: return "ERROR";
    default: return "?";
    }
}

void sd_log_write(sd_log_level level, const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (logger.fn) {
        logger.fn(level, msg, logger.user);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char out[1280];
    int n;
    if (level >= SD_LOG_WARN)
        n = snprintf(out, sizeof out, "%02d:%02d:%02d.%03ld %s %s: %s (%s:%d)\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_name(level), logger.prefix, msg, base, line);
    else
        n = snprintf(out, sizeof out, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_name(level), logger.prefix, msg);
    if (n > 0) fwrite(out, 1, (size_t)n < sizeof out ? (size_t)n : sizeof out - 1, stderr);
}

double sd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double sd_l2_norm(const float *x, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    return sqrt(ss);
}

/* The continuation bytes a UTF-8 lead byte b needs (0: b starts no
 * well-formed character), and the range [*lo, *hi] its first continuation
 * byte must be in (the rest: 0x80..0xBF), per Unicode's table of
 * well-formed sequences: no overlongs, surrogates or code points past
 * U+10FFFF. */
static size_t utf8_lead(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 1;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 2;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 3;
    }
    return 0;
}

size_t sd_utf8_valid_len(const void *text, size_t len) {
    const uint8_t *s = text;
    size_t i = 0;
    while (i < len) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        uint8_t lo, hi;
        size_t need = utf8_lead(b, &lo, &hi);
        if (need == 0) return i;
        if (len - i - 1 < need) return i;
        for (size_t k = 1; k <= need; k++) {
            uint8_t c = s[i + k];
            if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
        }
        i += need + 1;
    }
    return len;
}

/* Appends byte ch of valid UTF-8 text to a JSON string body at out + o. */
static size_t json_byte(char *out, size_t o, uint8_t ch) {
    static const char hex[] = "0123456789abcdef";
    if (ch == '"' || ch == '\\') {
        out[o++] = '\\';
        out[o++] = (char)ch;
    } else if (ch && strchr("\b\f\n\r\t", ch)) { /* the short escapes, as JSON encoders write them */
        out[o++] = '\\';
        out[o++] = "btnvfr"[ch - '\b'];
    } else if (ch < 0x20) {
        memcpy(out + o, "\\u00", 4);
        out[o + 4] = hex[ch >> 4];
        out[o + 5] = hex[ch & 15];
        o += 6;
    } else {
        out[o++] = (char)ch;
    }
    return o;
}

/* Bytes of the ill-formed sequence at s (n >= 1 bytes left) that one U+FFFD
 * replaces: the longest prefix of a well-formed character there, or the one
 * byte that cannot start one (Unicode's "maximal subpart", as Python's and
 * browsers' decoders count). */
static size_t maximal_subpart(const uint8_t *s, size_t n) {
    uint8_t lo, hi;
    size_t need = utf8_lead(s[0], &lo, &hi);
    if (need == 0) return 1;
    size_t k = 1;
    while (k <= need && k < n && s[k] >= (k == 1 ? lo : 0x80) && s[k] <= (k == 1 ? hi : 0xBF)) k++;
    return k;
}

char *sd_json_quote(const void *text, size_t len) {
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */
    const uint8_t *s = text;
    if (len > (SIZE_MAX - 3) / 6) return NULL;
    char *out = malloc(6 * len + 3); /* worst case: every byte a \u00XX escape */
    if (!out) return NULL;
    size_t i = 0, o = 0;
    out[o++] = '"';
    while (i < len) {
        size_t valid = sd_utf8_valid_len(s + i, len - i);
        for (size_t k = 0; k < valid; k++) o = json_byte(out, o, s[i++]);
        if (i == len) break;
        memcpy(out + o, replacement, 3);
        o += 3;
        i += maximal_subpart(s + i, len - i);
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}

bool sd_json_has_nul(const char *json, size_t len) {
    if (memchr(json, 0, len)) return true;
    for (size_t i = 0; i + 1 < len; i++) {
        if (json[i] != '\\') continue;
        if (json[i + 1] == 'u' && len - i >= 6 && memcmp(json + i + 2, "0000", 4) == 0) return true;
        i++; /* the escaped character: in JSON "\\u0000" is a backslash and text */
    }
    return false;
}
