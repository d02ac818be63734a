/* socket.c — ZeroMQ sockets and envelopes on the wire.
 *
 * Every specd socket is made here so that none escapes the safety settings:
 * a maximum message size (libzmq drops the connection of a peer that sends
 * more, before anything is allocated for it), a finite linger (a process
 * that exits never hangs on unsent messages), ROUTER_MANDATORY on ROUTER
 * sockets (a reply to a vanished peer is an error we log, not a silent
 * drop) and optional CurveZMQ (a server socket always names its ZAP domain,
 * a client socket always brings its own key pair: see curve.h).
 *
 * A message is the routing id (ROUTER only) and exactly one body frame.
 * Receiving keeps the body frame's zmq_msg_t (behind an opaque pointer in
 * sd_net_msg) and points body into it: no copy, so a message at the cap
 * costs its size once, not twice. Sending packs straight into the
 * zmq_msg_t's own buffer.
 *
 * ROUTER sends use ZMQ_DONTWAIT: with ROUTER_MANDATORY a full peer queue
 * would otherwise block the whole coordinator on one slow client; instead
 * the send fails with EAGAIN and the caller decides. Other sockets send
 * blocking: their high-water mark is the back-pressure. */
#include "specd/net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

sd_net_socket_params sd_net_socket_default_params(void) {
    sd_net_socket_params p;
    memset(&p, 0, sizeof p);
    p.linger_ms = SD_NET_LINGER_MS;
    return p;
}

static sd_status set_int(void *sock, int opt, int value, const char *name) {
    if (zmq_setsockopt(sock, opt, &value, sizeof value) != 0) {
        SD_ERROR("zmq_setsockopt(%s=%d): %s", name, value, zmq_strerror(zmq_errno()));
        return SD_ERR_NET;
    }
    return SD_OK;
}

/* Sets a CurveZMQ key given as Z85 text (40 characters). */
static sd_status set_curve_key(void *sock, int opt, const char *z85, const char *name) {
    if (strlen(z85) != 40) {
        SD_ERROR("%s: a CurveZMQ key is 40 Z85 characters, got %zu", name, strlen(z85));
        return SD_ERR_INVALID_ARG;
    }
    if (zmq_setsockopt(sock, opt, z85, 41) != 0) {
        SD_ERROR("zmq_setsockopt(%s): %s", name, zmq_strerror(zmq_errno()));
        return SD_ERR_INVALID_ARG;
    }
    return SD_OK;
}

static sd_status apply_curve(void *sock, const sd_net_socket_params *p) {
    bool server = p->curve_server_secret != NULL;
    bool client = p->curve_server_public != NULL;
    if (!server && !client) {
        if (p->curve_public || p->curve_secret) {
            SD_ERROR("curve_public/curve_secret given without curve_server_public");
            return SD_ERR_INVALID_ARG;
        }
        return SD_OK;
    }
    if (server && client) {
        SD_ERROR("a socket is either a CurveZMQ server (curve_server_secret) or a client (curve_server_public)");
        return SD_ERR_INVALID_ARG;
    }
    if (!zmq_has("curve")) {
        SD_ERROR("CurveZMQ keys given but this libzmq was built without CURVE support");
        return SD_ERR_UNSUPPORTED;
    }
    if (server) {
        /* the ZAP handler (zap.c) picks the allow-list by this domain */
        if (!p->zap_domain) {
            SD_ERROR("a CurveZMQ server socket needs a ZAP domain (its allow-list)");
            return SD_ERR_INVALID_ARG;
        }
        if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, p->zap_domain, strlen(p->zap_domain)) != 0) {
            SD_ERROR("zmq_setsockopt(ZMQ_ZAP_DOMAIN=%s): %s", p->zap_domain, zmq_strerror(zmq_errno()));
            return SD_ERR_NET;
        }
        SD_TRY(set_int(sock, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER"));
        return set_curve_key(sock, ZMQ_CURVE_SECRETKEY, p->curve_server_secret, "curve_server_secret");
    }
    SD_TRY(set_curve_key(sock, ZMQ_CURVE_SERVERKEY, p->curve_server_public, "curve_server_public"));
    if ((p->curve_public == NULL) != (p->curve_secret == NULL)) {
        SD_ERROR("curve_public and curve_secret go together");
        return SD_ERR_INVALID_ARG;
    }
    if (!p->curve_public) {
        /* an ephemeral pair would be refused by every allow-list: fail now */
        SD_ERROR("curve_server_public needs this side's own key pair (curve_public, curve_secret)");
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(set_curve_key(sock, ZMQ_CURVE_PUBLICKEY, p->curve_public, "curve_public"));
    return set_curve_key(sock, ZMQ_CURVE_SECRETKEY, p->curve_secret, "curve_secret");
}

static sd_status configure(void *sock, const sd_net_socket_params *p) {
    int64_t maxmsg = p->max_msg_bytes;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) != 0) {
        SD_ERROR("zmq_setsockopt(ZMQ_MAXMSGSIZE=%lld): %s", (long long)maxmsg, zmq_strerror(zmq_errno()));
        return SD_ERR_NET;
    }
    SD_TRY(set_int(sock, ZMQ_LINGER, p->linger_ms, "ZMQ_LINGER"));
    if (p->sndhwm > 0) SD_TRY(set_int(sock, ZMQ_SNDHWM, p->sndhwm, "ZMQ_SNDHWM"));
    if (p->rcvhwm > 0) SD_TRY(set_int(sock, ZMQ_RCVHWM, p->rcvhwm, "ZMQ_RCVHWM"));
    if (p->type == ZMQ_ROUTER) SD_TRY(set_int(sock, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY"));
    if (p->identity) {
        size_t n = strlen(p->identity);
        if (n == 0 || n > SD_MAX_IDENTITY_BYTES || p->identity[0] == '\0') {
            SD_ERROR("identity: length %zu outside [1, %d]", n, SD_MAX_IDENTITY_BYTES);
            return SD_ERR_INVALID_ARG;
        }
        if (zmq_setsockopt(sock, ZMQ_ROUTING_ID, p->identity, n) != 0) {
            SD_ERROR("zmq_setsockopt(ZMQ_ROUTING_ID=%s): %s", p->identity, zmq_strerror(zmq_errno()));
            return SD_ERR_NET;
        }
    }
    return apply_curve(sock, p);
}

sd_status sd_net_socket_open(void *zctx, const sd_net_socket_params *p, const char *bind_addr, const char *connect_addr,
                             void **out) {
    if (!out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    if (!zctx || !p || p->max_msg_bytes <= 0 || (!bind_addr == !connect_addr)) {
        SD_ERROR("sd_net_socket_open: need a context, max_msg_bytes > 0 and exactly one of bind/connect address");
        return SD_ERR_INVALID_ARG;
    }
    void *sock = zmq_socket(zctx, p->type);
    if (!sock) {
        SD_ERROR("zmq_socket(type %d): %s", p->type, zmq_strerror(zmq_errno()));
        return SD_ERR_NET;
    }
    sd_status st = configure(sock, p);
    if (st == SD_OK && p->monitor) st = sd_net_monitor_open(zctx, sock, p->monitor);
    if (st == SD_OK) {
        int rc = bind_addr ? zmq_bind(sock, bind_addr) : zmq_connect(sock, connect_addr);
        if (rc != 0) {
            SD_ERROR("%s %s: %s", bind_addr ? "bind" : "connect", bind_addr ? bind_addr : connect_addr,
                     zmq_strerror(zmq_errno()));
            st = SD_ERR_NET;
        }
    }
    if (st != SD_OK) {
        if (p->monitor) sd_net_monitor_close(sock, p->monitor);
        int zero = 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(sock);
        return st;
    }
    *out = sock;
    return SD_OK;
}

void sd_net_close(void **sock) {
    if (!sock || !*sock) return;
    zmq_close(*sock);
    *sock = NULL;
}

/* ---- handshake monitor ---- */

#define HANDSHAKE_EVENTS                                                                                          \
    (ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

sd_status sd_net_monitor_open(void *zctx, void *sock, void **mon) {
    if (!zctx || !sock || !mon) return SD_ERR_INVALID_ARG;
    *mon = NULL;
    char addr[64];
    snprintf(addr, sizeof addr, "inproc://specd-monitor-%p", sock);
    if (zmq_socket_monitor(sock, addr, HANDSHAKE_EVENTS) != 0) {
        SD_ERROR("zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
        return SD_ERR_NET;
    }
    void *m = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    if (!m || zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero) != 0 || zmq_connect(m, addr) != 0) {
        SD_ERROR("monitor %s: %s", addr, zmq_strerror(zmq_errno()));
        if (m) zmq_close(m);
        zmq_socket_monitor(sock, NULL, 0);
        return SD_ERR_NET;
    }
    *mon = m;
    return SD_OK;
}

/* One event: [6 bytes: uint16 event, uint32 value][endpoint]. */
static sd_net_handshake classify(uint16_t event, uint32_t value, const char *endpoint, char *why, size_t why_len) {
    const char *kind;
    sd_net_handshake h;
    switch (event) {
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: return SD_NET_HANDSHAKE_OK;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        kind = "the server refused this key";
        h = SD_NET_HANDSHAKE_REFUSED;
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        kind = "security handshake failed (the server speaks another mechanism: CurveZMQ on one side only?)";
        h = SD_NET_HANDSHAKE_REFUSED;
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        kind = "security handshake failed (a wrong server public key?)";
        h = SD_NET_HANDSHAKE_FAILED;
        break;
    default: return SD_NET_HANDSHAKE_NONE;
    }
    /* value: the ZAP status code (AUTH), a ZMQ_PROTOCOL_ERROR_* code, or an errno */
    snprintf(why, why_len, "connection to %s: %s (code %u)", endpoint[0] ? endpoint : "the server", kind,
             (unsigned)value);
    return h;
}

sd_net_handshake sd_net_monitor_read(void *mon, char *why, size_t why_len) {
    sd_net_handshake last = SD_NET_HANDSHAKE_NONE;
    for (;;) {
        zmq_msg_t ev, ep;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return last;
        }
        zmq_msg_init(&ep);
        bool have_ep = zmq_msg_more(&ev) && zmq_msg_recv(&ep, mon, 0) >= 0;
        if (zmq_msg_size(&ev) >= 6) {
            uint16_t event;
            uint32_t value;
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
            char endpoint[128] = "";
            if (have_ep) {
                size_t n = zmq_msg_size(&ep) < sizeof endpoint - 1 ? zmq_msg_size(&ep) : sizeof endpoint - 1;
                memcpy(endpoint, zmq_msg_data(&ep), n);
                endpoint[n] = '\0';
            }
            sd_net_handshake h = classify(event, value, endpoint, why, why_len);
            if (h != SD_NET_HANDSHAKE_NONE) last = h;
        }
        zmq_msg_close(&ep);
        zmq_msg_close(&ev);
    }
}

void sd_net_monitor_close(void *sock, void **mon) {
    if (!mon || !*mon) return;
    if (sock) zmq_socket_monitor(sock, NULL, 0);
    zmq_close(*mon);
    *mon = NULL;
}

/* ---- receive ---- */

static bool more_frames(void *sock) {
    int more = 0;
    size_t len = sizeof more;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more;
}

/* Consumes the rest of a multipart message; returns how many frames it ate. */
static int drain(void *sock) {
    int n = 0;
    while (more_frames(sock)) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            zmq_msg_close(&f);
            break;
        }
        zmq_msg_close(&f);
        n++;
    }
    return n;
}

void sd_net_msg_clear(sd_net_msg *m) {
    if (!m) return;
    if (m->frame) {
        zmq_msg_close(m->frame);
        free(m->frame);
        m->frame = NULL;
    } else {
        free(m->body);
    }
    m->body = NULL;
    m->body_len = 0;
    m->identity_len = 0;
}

sd_status sd_net_recv(void *sock, bool router, bool dontwait, sd_net_msg *m) {
    if (!sock || !m) return SD_ERR_INVALID_ARG;
    m->body = NULL;
    m->body_len = 0;
    m->identity_len = 0;
    m->frame = NULL;
    m->user_id[0] = '\0';

    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, sock, dontwait ? ZMQ_DONTWAIT : 0) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&f);
        if (e != EAGAIN && e != EINTR && e != ETERM) SD_ERROR("zmq_msg_recv: %s", zmq_strerror(e));
        errno = e;
        return SD_ERR_NET;
    }
    if (router) {
        /* libzmq limits routing ids to 255 bytes; the bound is checked anyway. */
        size_t n = zmq_msg_size(&f);
        if (n > SD_MAX_IDENTITY_BYTES) n = SD_MAX_IDENTITY_BYTES;
        memcpy(m->identity, zmq_msg_data(&f), n);
        m->identity_len = n;
        if (!more_frames(sock)) {
            zmq_msg_close(&f);
            SD_WARN("message with a routing id and no body frame");
            return SD_ERR_FORMAT;
        }
        zmq_msg_close(&f);
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&f);
            SD_ERROR("zmq_msg_recv (body): %s", zmq_strerror(e));
            errno = e;
            return SD_ERR_NET;
        }
    }
    int extra = drain(sock);
    if (extra > 0) {
        zmq_msg_close(&f);
        SD_WARN("message with %d extra frame(s) after the body: dropped", extra);
        return SD_ERR_FORMAT;
    }
    const char *uid = zmq_msg_gets(&f, "User-Id"); /* NULL without ZAP */
    if (uid) snprintf(m->user_id, sizeof m->user_id, "%s", uid);
    zmq_msg_t *frame = malloc(sizeof *frame);
    if (!frame) {
        zmq_msg_close(&f);
        return SD_ERR_NOMEM;
    }
    zmq_msg_init(frame);
    zmq_msg_move(frame, &f);
    zmq_msg_close(&f);
    m->frame = frame;
    m->body = zmq_msg_data(frame);
    m->body_len = zmq_msg_size(frame);
    return SD_OK;
}

/* ---- send ---- */

static void identity_hex(const uint8_t *id, size_t n, char *out, size_t out_len) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 <= out_len; i++) o += (size_t)snprintf(out + o, out_len - o, "%02x", id[i]);
    if (o < out_len) out[o] = '\0';
}

sd_status sd_net_send(void *sock, const uint8_t *identity, size_t identity_len, const ProtobufCMessage *env) {
    if (!sock || !env) return SD_ERR_INVALID_ARG;
    int flags = 0;
    if (identity) {
        flags = ZMQ_DONTWAIT;
        if (zmq_send(sock, identity, identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            char hex[2 * SD_MAX_IDENTITY_BYTES + 1];
            identity_hex(identity, identity_len, hex, sizeof hex);
            if (e == EHOSTUNREACH)
                SD_WARN("send to peer %s: no such peer (gone or never connected)", hex);
            else
                SD_ERROR("send to peer %s: %s", hex, zmq_strerror(e));
            errno = e;
            return SD_ERR_NET;
        }
    }
    size_t len = protobuf_c_message_get_packed_size(env);
    zmq_msg_t body;
    if (zmq_msg_init_size(&body, len) != 0) {
        SD_ERROR("zmq_msg_init_size(%zu): %s", len, zmq_strerror(zmq_errno()));
        return SD_ERR_NOMEM;
    }
    size_t packed = protobuf_c_message_pack(env, zmq_msg_data(&body));
    if (packed != len) {
        zmq_msg_close(&body);
        SD_ERROR("protobuf pack wrote %zu bytes, expected %zu", packed, len);
        return SD_ERR_INTERNAL;
    }
    if (zmq_msg_send(&body, sock, flags) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&body);
        if (e != EINTR && e != ETERM) SD_ERROR("zmq_msg_send (%zu bytes): %s", len, zmq_strerror(e));
        errno = e;
        return SD_ERR_NET;
    }
    return SD_OK;
}

/* ---- small helpers ---- */

void sd_net_error_init(Specd__Error *e, Specd__Code code, uint64_t request_id, uint64_t client_tag,
                       const char *message) {
    specd__error__init(e);
    e->code = code;
    e->request_id = request_id;
    e->client_tag = client_tag;
    /* Borrowed: the message text must outlive e (it is packed, not copied). */
    e->message = (char *)(message ? message : "");
}

const char *sd_net_code_name(Specd__Code code) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&specd__code__descriptor, (int)code);
    if (!v) return "UNKNOWN_CODE";
    return strncmp(v->name, "CODE_", 5) == 0 ? v->name + 5 : v->name;
}

void sd_net_log_init(const char *role, int rank, bool verbose) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s[%d]", role ? role : "specd", rank);
    sd_log_set(NULL, NULL, verbose ? SD_LOG_DEBUG : SD_LOG_INFO, prefix);
}

uint64_t sd_net_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
