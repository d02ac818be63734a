/* curve.c — CurveZMQ key files, allow-lists and the bind rule (curve.h).
 *
 * Key files are read whole (bounded by SD_CURVE_MAX_FILE) and checked
 * before any socket sees them: length, Z85 alphabet (zmq_z85_decode), and
 * for a secret key the file mode, the way ssh treats a private key: a
 * secret others can read is no secret, and starting anyway would hide
 * that. An allow-list is kept sorted as bytes so a lookup is a binary
 * search; duplicates are harmless. */
#include "specd/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool sd_curve_key_parse(const char *text, size_t len, char out[SD_CURVE_Z85_LEN + 1], char *err, size_t err_len) {
    size_t n = len;
    while (n > 0 && is_space(text[n - 1])) n--;
    if (n != SD_CURVE_Z85_LEN) {
        snprintf(err, err_len, "a key is %d Z85 characters, found %zu", SD_CURVE_Z85_LEN, n);
        return false;
    }
    char z85[SD_CURVE_Z85_LEN + 1];
    memcpy(z85, text, SD_CURVE_Z85_LEN);
    z85[SD_CURVE_Z85_LEN] = '\0';
    uint8_t bytes[SD_CURVE_KEY_BYTES];
    /* zmq_z85_decode accepts any byte and maps unknown ones to garbage:
     * check the alphabet by a round trip */
    char back[SD_CURVE_Z85_LEN + 1];
    if (!zmq_z85_decode(bytes, z85) || !zmq_z85_encode(back, bytes, sizeof bytes) || strcmp(back, z85) != 0) {
        snprintf(err, err_len, "the key is not Z85 text");
        return false;
    }
    memcpy(out, z85, sizeof z85);
    return true;
}

/* Reads a whole small file into a NUL-terminated buffer (caller frees). */
static sd_status read_small(const char *path, bool secret, char **out, size_t *len) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        SD_ERROR("%s: %s", path, strerror(errno));
        return SD_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        SD_ERROR("%s: not a regular file", path);
        close(fd);
        return SD_ERR_IO;
    }
    if (secret && (sb.st_mode & 077) != 0) {
        SD_ERROR("%s: a secret key file must not be readable or writable by group or others (mode %03o; chmod 600 "
                 "it)",
                 path, (unsigned)(sb.st_mode & 0777));
        close(fd);
        return SD_ERR_INVALID_ARG;
    }
    if (sb.st_size > SD_CURVE_MAX_FILE) {
        SD_ERROR("%s: %lld bytes, more than the %d a key or allow-list file may have", path, (long long)sb.st_size,
                 SD_CURVE_MAX_FILE);
        close(fd);
        return SD_ERR_FORMAT;
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    if (!buf) {
        close(fd);
        return SD_ERR_NOMEM;
    }
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != (size_t)sb.st_size) {
        SD_ERROR("%s: short read (%zu of %lld bytes)", path, got, (long long)sb.st_size);
        free(buf);
        return SD_ERR_IO;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return SD_OK;
}

sd_status sd_curve_key_read(const char *path, bool secret, char out[SD_CURVE_Z85_LEN + 1]) {
    if (!path || !out) return SD_ERR_INVALID_ARG;
    char *text = NULL;
    size_t len = 0;
    SD_TRY(read_small(path, secret, &text, &len));
    char err[128];
    bool ok = sd_curve_key_parse(text, len, out, err, sizeof err);
    if (secret) memset(text, 0, len);
    free(text);
    if (!ok) {
        SD_ERROR("%s: %s", path, err);
        return SD_ERR_FORMAT;
    }
    return SD_OK;
}

sd_status sd_curve_id_load(const char *secret_file, const char *server_file, sd_curve_id *out) {
    if (!out) return SD_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (!secret_file && !server_file) return SD_OK;
    if (!secret_file) {
        SD_ERROR("the server's public key (%s) was given without this process's own secret key (--curve-secret)",
                 server_file);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(sd_curve_key_read(secret_file, true, out->secret));
    if (zmq_curve_public(out->public_key, out->secret) != 0) {
        SD_ERROR("%s: cannot derive the public key: %s", secret_file, zmq_strerror(zmq_errno()));
        memset(out, 0, sizeof *out);
        return SD_ERR_FORMAT;
    }
    if (server_file) {
        sd_status st = sd_curve_key_read(server_file, false, out->server);
        if (st != SD_OK) {
            memset(out, 0, sizeof *out);
            return st;
        }
    }
    out->on = true;
    return SD_OK;
}

/* entries start with their key: one comparison serves sort and search */
static int cmp_key(const void *a, const void *b) { return memcmp(a, b, SD_CURVE_KEY_BYTES); }

/* The optional role=ROLE token after a key: 1..15 lower-case letters. */
static bool parse_role(const char *tok, size_t len, char role[SD_CURVE_ROLE_MAX]) {
    role[0] = '\0';
    if (len < 5 || strncmp(tok, "role=", 5) != 0) return true; /* a label, not a role */
    size_t n = len - 5;
    if (n == 0 || n >= SD_CURVE_ROLE_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (tok[5 + i] < 'a' || tok[5 + i] > 'z') return false;
    memcpy(role, tok + 5, n);
    role[n] = '\0';
    return true;
}

bool sd_curve_allow_parse(const char *text, size_t len, sd_curve_allow *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    size_t cap = 0, line = 0;
    for (size_t i = 0; i < len;) {
        size_t end = i;
        while (end < len && text[end] != '\n') end++;
        line++;
        size_t a = i;
        while (a < end && is_space(text[a])) a++;
        size_t b = a;
        while (b < end && !is_space(text[b])) b++;
        size_t ra = b;
        while (ra < end && is_space(text[ra])) ra++;
        size_t rb = ra;
        while (rb < end && !is_space(text[rb])) rb++;
        i = end + 1;
        if (a == end) continue;
        char z85[SD_CURVE_Z85_LEN + 1], why[96];
        /* '#' is a Z85 digit, though never a key's first (a group's first
         * digit is below 83): a '#' line is a comment unless it is a key */
        bool key = sd_curve_key_parse(text + a, b - a, z85, why, sizeof why);
        if (!key && text[a] == '#') continue;
        if (!key) {
            snprintf(err, err_len, "line %zu: %s", line, why);
            return false;
        }
        if (out->n == SD_CURVE_MAX_ALLOW) {
            snprintf(err, err_len, "line %zu: more than %d keys", line, SD_CURVE_MAX_ALLOW);
            return false;
        }
        char role[SD_CURVE_ROLE_MAX];
        if (!parse_role(text + ra, rb - ra, role)) {
            snprintf(err, err_len, "line %zu: role=ROLE takes 1 to %d lower-case letters", line, SD_CURVE_ROLE_MAX - 1);
            return false;
        }
        if (out->n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            void *k = realloc(out->entries, ncap * sizeof *out->entries);
            if (!k) {
                snprintf(err, err_len, "out of memory");
                return false;
            }
            out->entries = k;
            cap = ncap;
        }
        sd_curve_entry *e = &out->entries[out->n++];
        zmq_z85_decode(e->key, z85);
        memcpy(e->role, role, sizeof role);
    }
    if (out->n > 1) qsort(out->entries, out->n, sizeof *out->entries, cmp_key);
    for (size_t k = 1; k < out->n; k++)
        if (cmp_key(&out->entries[k - 1], &out->entries[k]) == 0) {
            snprintf(err, err_len, "a key is listed twice (one line per key, with its one role)");
            return false;
        }
    return true;
}

sd_status sd_curve_allow_read(const char *path, sd_curve_allow *out) {
    if (!path || !out) return SD_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    SD_TRY(read_small(path, false, &text, &len));
    char err[160];
    bool ok = sd_curve_allow_parse(text, len, out, err, sizeof err);
    free(text);
    if (!ok) {
        SD_ERROR("%s: %s", path, err);
        sd_curve_allow_free(out);
        return SD_ERR_FORMAT;
    }
    if (out->n == 0) SD_WARN("%s: the allow-list is empty: every peer will be refused", path);
    return SD_OK;
}

const sd_curve_entry *sd_curve_allow_find(const sd_curve_allow *a, const uint8_t *key) {
    if (!a || !key || a->n == 0) return NULL;
    return bsearch(key, a->entries, a->n, sizeof *a->entries, cmp_key);
}

bool sd_curve_allow_has(const sd_curve_allow *a, const uint8_t *key) { return sd_curve_allow_find(a, key) != NULL; }

void sd_curve_allow_free(sd_curve_allow *a) {
    if (!a) return;
    free(a->entries);
    a->entries = NULL;
    a->n = 0;
}

static sd_status write_file(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        SD_ERROR("%s: %s", path, strerror(errno));
        return SD_ERR_IO;
    }
    size_t len = strlen(text);
    bool ok = fchmod(fd, mode) == 0 && write(fd, text, len) == (ssize_t)len;
    if (close(fd) != 0) ok = false;
    if (!ok) {
        SD_ERROR("%s: cannot write: %s", path, strerror(errno));
        unlink(path);
        return SD_ERR_IO;
    }
    return SD_OK;
}

sd_status sd_curve_keygen(const char *dir, const char *name, char pub[SD_CURVE_Z85_LEN + 1]) {
    char public_key[SD_CURVE_Z85_LEN + 1], secret[SD_CURVE_Z85_LEN + 1];
    if (zmq_curve_keypair(public_key, secret) != 0) {
        SD_ERROR("zmq_curve_keypair: %s (is libzmq built with CURVE?)", zmq_strerror(zmq_errno()));
        return SD_ERR_UNSUPPORTED;
    }
    char path[4096], line[SD_CURVE_Z85_LEN + 2];
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    snprintf(line, sizeof line, "%s\n", secret);
    sd_status st = write_file(path, line, 0600);
    memset(secret, 0, sizeof secret);
    memset(line, 0, sizeof line);
    if (st != SD_OK) return st;
    snprintf(path, sizeof path, "%s/%s.pub", dir, name);
    snprintf(line, sizeof line, "%s\n", public_key);
    SD_TRY(write_file(path, line, 0644));
    if (pub) memcpy(pub, public_key, sizeof public_key);
    return SD_OK;
}

bool sd_curve_addr_is_local(const char *addr) {
    if (!addr) return false;
    if (!strncmp(addr, "ipc://", 6) || !strncmp(addr, "inproc://", 9)) return true;
    if (strncmp(addr, "tcp://", 6) != 0) return false;
    const char *host = addr + 6;
    if (!strncmp(host, "127.", 4)) return true;
    if (!strncmp(host, "[::1]:", 6) || !strncmp(host, "localhost:", 10)) return true;
    return false;
}

sd_status sd_curve_bind_check(const char *addr, bool keyed, bool insecure, const char *what) {
    if (keyed || insecure || sd_curve_addr_is_local(addr)) return SD_OK;
    SD_ERROR("%s %s: binding beyond loopback without CurveZMQ keys is refused: give the keys (--curve-secret and "
             "the allow-lists; see specd-keygen) or, on a network you trust, --insecure",
             what ? what : "bind", addr ? addr : "(null)");
    return SD_ERR_INVALID_ARG;
}
