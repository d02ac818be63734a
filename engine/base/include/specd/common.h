/* common.h — status codes and logging shared by every specd module.
 *
 * Functions that can fail return an sd_status (SD_OK is 0); the detail of a
 * failure goes to the log, never to stdout. Logging goes through a callback
 * that the process installs (each process prefixes lines with its role and
 * rank); the level is checked before anything is formatted. There is one
 * process-wide logger because a library-wide log sink is what every caller
 * wants and the alternative (a context on every call) buys nothing here; it is
 * set once at start-up, before any thread starts. */
#ifndef SPECD_COMMON_H
#define SPECD_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sd_status {
    SD_OK = 0,
    SD_ERR_INVALID_ARG,   /* a caller passed a value outside the contract */
    SD_ERR_IO,            /* open/read/mmap failed */
    SD_ERR_FORMAT,        /* a file or message is malformed or truncated */
    SD_ERR_UNSUPPORTED,   /* well-formed but not something we handle */
    SD_ERR_NOMEM,         /* allocation failed */
    SD_ERR_OUT_OF_BLOCKS, /* the KV cache has no free block left */
    SD_ERR_RANGE,         /* an index or length is out of range */
    SD_ERR_NOT_FOUND,     /* a named item (tensor, key) does not exist */
    SD_ERR_INTERNAL,      /* a broken invariant: a bug */
    SD_ERR_CUDA,          /* a CUDA/cuBLAS/NCCL call failed */
    SD_ERR_NET,           /* a ZeroMQ call failed */
    SD_ERR_TIMEOUT,       /* a bounded wait ran out (a peer rank is dead or hung) */
    SD_ERR_ABORTED,       /* the operation was aborted (a collective torn down) */
    SD_STATUS_COUNT
} sd_status;

/* Returns a static, human-readable name for s ("out of KV blocks"). */
const char *sd_status_str(sd_status s);

typedef enum sd_log_level { SD_LOG_DEBUG = 0, SD_LOG_INFO, SD_LOG_WARN, SD_LOG_ERROR, SD_LOG_OFF } sd_log_level;

/* A log sink: receives one finished line (no trailing newline). */
typedef void (*sd_log_fn)(sd_log_level level, const char *line, void *user);

/* Installs the process's log sink and minimum level. Not thread-safe: call
 * once before starting threads. fn == NULL restores the default sink, which
 * writes "HH:MM:SS.mmm LEVEL prefix: message" to stderr. prefix (copied) is
 * the role/rank tag, e.g. "verifier[2]"; NULL keeps the current one. */
void sd_log_set(sd_log_fn fn, void *user, sd_log_level min_level, const char *prefix);

/* True when a message at level would be emitted (check before formatting). */
bool sd_log_enabled(sd_log_level level);

/* Formats and emits one line, tagged with file:line for WARN and ERROR. */
void sd_log_write(sd_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define SD_LOG(level, ...)                                                                 \
    do {                                                                                   \
        if (sd_log_enabled(level)) sd_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define SD_DEBUG(...) SD_LOG(SD_LOG_DEBUG, __VA_ARGS__)
#define SD_INFO(...)  SD_LOG(SD_LOG_INFO, __VA_ARGS__)
#define SD_WARN(...)  SD_LOG(SD_LOG_WARN, __VA_ARGS__)
#define SD_ERROR(...) SD_LOG(SD_LOG_ERROR, __VA_ARGS__)

/* Evaluates expr (an sd_status); on failure returns it from the caller. */
#define SD_TRY(expr)                              \
    do {                                          \
        sd_status sd_try_s_ = (expr);             \
        if (sd_try_s_ != SD_OK) return sd_try_s_; \
    } while (0)

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool sd_mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool sd_add_ok(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

/* Monotonic clock in seconds (for timings in tools and stats). */
double sd_now(void);

/* The Euclidean norm of n floats, summed in double in order (a debug log's
 * fingerprint of features: the same bits give the same figure). */
double sd_l2_norm(const float *x, size_t n);

/* Length of the longest valid UTF-8 prefix of s[0..len): len when all of it
 * is valid, else the offset of the first byte that is not (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF, no truncated
 * sequence at the end). */
size_t sd_utf8_valid_len(const void *s, size_t len);

/* s[0..len) as a JSON string literal, quotes included, that is valid JSON
 * whatever the bytes: each ill-formed UTF-8 sequence becomes U+FFFD (one
 * per maximal subpart, as Python's decoder with errors="replace" does),
 * control characters and NUL are escaped (\u0000: nothing is cut), '"' and
 * '\\' too. For model text, which byte-level tokens can leave invalid.
 * Malloc'd and NUL-terminated (caller frees); NULL when out of memory. Add it
 * to a cJSON tree with cJSON_AddRawToObject. */
char *sd_json_quote(const void *s, size_t len);
/* True when JSON text json[0..len) holds a NUL byte or a \u0000 escape.
 * cJSON decodes \u0000 into a NUL inside its C string, so a prompt would be
 * cut there; callers refuse such input instead. */
bool sd_json_has_nul(const char *json, size_t len);

#ifdef __cplusplus
}
#endif
#endif
