/* zap.c — the ZAP handler (ZMQ RFC 27) of a binding process (curve.h).
 *
 * libzmq asks the handler bound at inproc://zeromq.zap.01 in the socket's
 * context about every CURVE handshake on a server socket: request frames
 * [version "1.0", request id, domain, address, routing id, mechanism,
 * credentials...], answered with [version, request id, status code, status
 * text, user id, metadata]. The handler is a REP socket on a thread of its
 * own so that a slow event loop never stalls handshakes and a handshake
 * never waits on the event loop. The decision is a pure function
 * (sd_zap_decide) so every branch has a unit test without sockets.
 *
 * Fail closed: a request the handler cannot parse is answered 500, which
 * libzmq treats as a refusal; a domain without a list refuses everyone;
 * only CURVE is admitted (a NULL or PLAIN socket never asks unless it has a
 * domain set, and then it is refused). */
#include "specd/curve.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define ZAP_ENDPOINT   "inproc://zeromq.zap.01"
#define ZAP_MAX_FRAMES 8
#define ZAP_POLL_MS    100

struct sd_zap {
    void *sock;
    pthread_t thread;
    atomic_bool stop;
    const sd_zap_domain *domains;
    size_t n_domains;
};

bool sd_zap_decide(const sd_zap_domain *domains, size_t n_domains, const char *domain, const char *mechanism,
                   const uint8_t *key, size_t key_len, const sd_curve_entry **who, char *why, size_t why_len) {
    if (who) *who = NULL;
    if (!mechanism || strcmp(mechanism, "CURVE") != 0) {
        snprintf(why, why_len, "mechanism %s: only CURVE is admitted", mechanism ? mechanism : "(none)");
        return false;
    }
    const sd_zap_domain *d = NULL;
    for (size_t i = 0; domain && i < n_domains; i++)
        if (domains[i].name && strcmp(domains[i].name, domain) == 0) d = &domains[i];
    if (!d) {
        snprintf(why, why_len, "unknown ZAP domain '%s'", domain ? domain : "");
        return false;
    }
    if (!key || key_len != SD_CURVE_KEY_BYTES) {
        snprintf(why, why_len, "a CURVE credential is %d bytes, got %zu", SD_CURVE_KEY_BYTES, key_len);
        return false;
    }
    const sd_curve_entry *e = sd_curve_allow_find(d->allow, key);
    if (!e) {
        snprintf(why, why_len, "key not on the %s allow-list", d->name);
        return false;
    }
    if (who) *who = e;
    snprintf(why, why_len, "OK");
    return true;
}

/* Copies frame f (at most cap - 1 bytes) as a NUL-terminated string. */
static void frame_str(zmq_msg_t *f, char *out, size_t cap) {
    size_t n = zmq_msg_size(f);
    if (n > cap - 1) n = cap - 1;
    memcpy(out, zmq_msg_data(f), n);
    out[n] = '\0';
}

static void send_str(void *sock, const char *s, size_t len, bool more) {
    zmq_send(sock, s, len, more ? ZMQ_SNDMORE : 0);
}

/* Receives one request (all its frames) and answers it. */
static void serve_one(sd_zap *z) {
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->sock, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < ZAP_MAX_FRAMES)
            f[n++] = m;
        else
            zmq_msg_close(&m);
    }
    char version[8] = "", domain[256] = "", address[128] = "", mechanism[32] = "", why[160];
    const char *code = "500";
    const sd_curve_entry *who = NULL;
    if (n >= 6) {
        frame_str(&f[0], version, sizeof version);
        frame_str(&f[2], domain, sizeof domain);
        frame_str(&f[3], address, sizeof address);
        frame_str(&f[5], mechanism, sizeof mechanism);
    }
    if (n < 6 || strcmp(version, "1.0") != 0) {
        snprintf(why, sizeof why, "malformed ZAP request (%d frames)", n);
        SD_ERROR("zap: %s", why);
    } else {
        const uint8_t *key = n > 6 ? zmq_msg_data(&f[6]) : NULL;
        size_t key_len = n > 6 ? zmq_msg_size(&f[6]) : 0;
        bool ok = sd_zap_decide(z->domains, z->n_domains, domain, mechanism, key, key_len, &who, why, sizeof why);
        code = ok ? "200" : "400";
        char z85[SD_CURVE_Z85_LEN + 1] = "(none)";
        if (key && key_len == SD_CURVE_KEY_BYTES) zmq_z85_encode(z85, key, key_len);
        if (ok)
            SD_DEBUG("zap: admitted %s on %s (key %s)", address, domain, z85);
        else
            SD_WARN("zap: refused %s on %s: %s (key %s)", address, domain, why, z85);
    }
    /* the reply echoes the request id; without one there is nothing to answer */
    send_str(z->sock, "1.0", 3, true);
    if (n >= 2)
        zmq_send(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        send_str(z->sock, "", 0, true);
    send_str(z->sock, code, 3, true);
    send_str(z->sock, why, strlen(why), true);
    /* the user id is the role the key is restricted to ("" = any): the
     * socket's messages carry it as "User-Id" (sd_net_msg.user_id) */
    const char *uid = code[0] == '2' && who ? who->role : "";
    send_str(z->sock, uid, strlen(uid), true);
    send_str(z->sock, "", 0, false);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg) {
    sd_zap *z = arg;
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t it = {z->sock, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&it, 1, ZAP_POLL_MS);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            if (zmq_errno() != ETERM) SD_ERROR("zap: zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (it.revents & ZMQ_POLLIN) serve_one(z);
    }
    return NULL;
}

sd_status sd_zap_start(void *zctx, const sd_zap_domain *domains, size_t n_domains, sd_zap **out) {
    if (!zctx || !out || (n_domains && !domains)) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_zap *z = calloc(1, sizeof *z);
    if (!z) return SD_ERR_NOMEM;
    z->domains = domains;
    z->n_domains = n_domains;
    atomic_init(&z->stop, false);
    z->sock = zmq_socket(zctx, ZMQ_REP);
    int linger = 0;
    if (!z->sock || zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(z->sock, ZAP_ENDPOINT) != 0) {
        SD_ERROR("zap: cannot bind %s: %s", ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
        if (z->sock) zmq_close(z->sock);
        free(z);
        return SD_ERR_NET;
    }
    if (pthread_create(&z->thread, NULL, zap_main, z) != 0) {
        SD_ERROR("zap: cannot start the handler thread");
        zmq_close(z->sock);
        free(z);
        return SD_ERR_INTERNAL;
    }
    *out = z;
    return SD_OK;
}

void sd_zap_stop(sd_zap **zp) {
    if (!zp || !*zp) return;
    sd_zap *z = *zp;
    atomic_store(&z->stop, true);
    pthread_join(z->thread, NULL);
    zmq_close(z->sock);
    free(z);
    *zp = NULL;
}
