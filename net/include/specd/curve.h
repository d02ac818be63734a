/* curve.h — CurveZMQ keys, allow-lists, the ZAP handler and the bind rule.
 *
 * Every specd link can run CurveZMQ: the binding side (coordinator, verifier
 * leader) holds a server key pair and runs a ZAP handler (ZMQ RFC 27) that
 * admits a peer only when its public key is on the allow-list of the
 * socket's ZAP domain; the connecting side holds its own key pair and the
 * server's public key. Keys live in files written by specd-keygen:
 *
 *   NAME.key  the secret key, 40 Z85 characters and a newline, mode 0600
 *   NAME.pub  the public key, 40 Z85 characters and a newline
 *
 * An allow-list file holds one public key per line (40 Z85 characters),
 * optionally followed by `role=ROLE` (the only role this key may take:
 * "verifier" or "drafter" on the coordinator's worker list) and a label;
 * blank lines and lines starting with '#' are ignored. The ZAP handler
 * hands the role to the socket as the peer's User-Id, and the coordinator
 * refuses a Hello for another role. A key file that is missing, unreadable,
 * malformed or (for a secret key) readable by group or others is a
 * start-up error: nothing here ever falls back to plaintext.
 *
 * Without keys a process may bind to loopback only (sd_curve_bind_check);
 * --insecure lifts that for a trusted network. */
#ifndef SPECD_CURVE_H
#define SPECD_CURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_CURVE_Z85_LEN   40   /* a key as Z85 text */
#define SD_CURVE_KEY_BYTES 32   /* a key as bytes */
#define SD_CURVE_MAX_ALLOW 4096 /* keys on one allow-list */
#define SD_CURVE_MAX_FILE  (1 << 20)

/* ZAP domains (ZMQ_ZAP_DOMAIN) of the three binding sockets: the handler
 * looks up the allow-list by domain, so a key allowed on one socket is
 * refused on the others. */
#define SD_ZAP_DOMAIN_CLIENT "specd-client" /* coordinator: clients and gateways */
#define SD_ZAP_DOMAIN_WORKER "specd-worker" /* coordinator: drafters and verifier leaders */
#define SD_ZAP_DOMAIN_GROUP  "specd-group"  /* verifier leader: ranks 1..N-1 */

/* A process's CurveZMQ identity. on = false: plaintext (no key given). */
typedef struct sd_curve_id {
    bool on;
    char secret[SD_CURVE_Z85_LEN + 1]; /* own secret key (Z85) */
    char public_key[SD_CURVE_Z85_LEN + 1];
    char server[SD_CURVE_Z85_LEN + 1]; /* the server's public key; "" where not needed */
} sd_curve_id;

#define SD_CURVE_ROLE_MAX 16 /* role=ROLE: 1..15 lower-case letters */

/* One allowed key and the role it is restricted to ("" = any). */
typedef struct sd_curve_entry {
    uint8_t key[SD_CURVE_KEY_BYTES];
    char role[SD_CURVE_ROLE_MAX];
} sd_curve_entry;

/* A set of public keys, sorted by key. Caller frees with sd_curve_allow_free. */
typedef struct sd_curve_allow {
    sd_curve_entry *entries;
    size_t n;
} sd_curve_allow;

/* Parses key text (40 Z85 characters, then only whitespace) into out
 * (Z85, NUL-terminated). false + err naming the problem otherwise. */
bool sd_curve_key_parse(const char *text, size_t len, char out[SD_CURVE_Z85_LEN + 1], char *err, size_t err_len);

/* Reads a key file into out. secret: the file must be a regular file
 * without any group or other permission bits (0600 or stricter).
 * SD_ERR_IO (missing, unreadable), SD_ERR_FORMAT (bad length or text),
 * SD_ERR_INVALID_ARG (bad mode); the error names the file. */
sd_status sd_curve_key_read(const char *path, bool secret, char out[SD_CURVE_Z85_LEN + 1]);

/* Loads a process's identity: the secret key file (its public key is
 * derived) and, when server_file is not NULL, the server's public key.
 * Both NULL: *out is plaintext (on = false). server_file without
 * secret_file is an error (a client must be known by its key). */
sd_status sd_curve_id_load(const char *secret_file, const char *server_file, sd_curve_id *out);

/* Parses allow-list text; out is overwritten (free it with
 * sd_curve_allow_free, also after an error). false + err ("line 3: ...")
 * on a bad line or role, a key listed twice, or more than
 * SD_CURVE_MAX_ALLOW keys. */
bool sd_curve_allow_parse(const char *text, size_t len, sd_curve_allow *out, char *err, size_t err_len);

/* Reads and parses an allow-list file (errors name the file and line). */
sd_status sd_curve_allow_read(const char *path, sd_curve_allow *out);

/* The entry of key (32 bytes), borrowed from a; NULL when it is not listed. */
const sd_curve_entry *sd_curve_allow_find(const sd_curve_allow *a, const uint8_t *key);
/* true when key (32 bytes) is on the list. */
bool sd_curve_allow_has(const sd_curve_allow *a, const uint8_t *key);

void sd_curve_allow_free(sd_curve_allow *a);

/* Writes a fresh key pair as dir/name.key (0600, created exclusively) and
 * dir/name.pub; returns the public key in pub when not NULL. */
sd_status sd_curve_keygen(const char *dir, const char *name, char pub[SD_CURVE_Z85_LEN + 1]);

/* true when a ZeroMQ endpoint only reaches this host: ipc://, inproc://,
 * tcp:// on 127.0.0.0/8, [::1] or localhost. */
bool sd_curve_addr_is_local(const char *addr);

/* The bind rule: binding addr without keys is allowed only on a local
 * address, or with insecure. SD_ERR_INVALID_ARG with a line saying what to
 * do otherwise; what names the flag ("--client-addr"). */
sd_status sd_curve_bind_check(const char *addr, bool keyed, bool insecure, const char *what);

/* ---- ZAP handler ---- */

/* A ZAP domain and its allow-list (borrowed). */
typedef struct sd_zap_domain {
    const char *name;
    const sd_curve_allow *allow;
} sd_zap_domain;

/* The handler's decision for one request: true = admit, with the key's
 * entry (its role) in *who when who is not NULL. A request is admitted only
 * with mechanism CURVE, a known domain and a key on that domain's list; why
 * says what was refused otherwise. Pure: tests call it. */
bool sd_zap_decide(const sd_zap_domain *domains, size_t n_domains, const char *domain, const char *mechanism,
                   const uint8_t *key, size_t key_len, const sd_curve_entry **who, char *why, size_t why_len);

typedef struct sd_zap sd_zap;

/* Binds inproc://zeromq.zap.01 in zctx and starts the handler thread; the
 * domains (and their lists) are borrowed until sd_zap_stop. Start it before
 * any CURVE socket of zctx binds. Every refusal is logged with the peer's
 * address and key. Caller stops it with sd_zap_stop before zmq_ctx_term. */
sd_status sd_zap_start(void *zctx, const sd_zap_domain *domains, size_t n_domains, sd_zap **out);

/* Stops the thread and closes its socket. NULL-safe; sets *z = NULL. */
void sd_zap_stop(sd_zap **z);

#ifdef __cplusplus
}
#endif
#endif
