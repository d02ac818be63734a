/* specd-gateway — OpenAI-compatible HTTP API (and Prometheus /metrics) in
 * front of a specd coordinator.
 *
 * One process: libmicrohttpd's threads on the HTTP side, one
 * libspecd-client connection (its own I/O thread) on the coordinator side,
 * and the janitor thread that collects finished request records. HTTP
 * parsing never runs in the coordinator, and several gateways may front
 * one coordinator.
 *
 * Signals are waited for with sigwait on the main thread (blocked in every
 * other thread, which inherit the mask). Stop order: a drain first (new
 * requests 503, those in flight finish, bounded: drain()), then HTTP (every
 * connection thread ends; their streams cancel what is unfinished), then
 * the janitor, then the client connection. */
#include "gateway_impl.h"
#include "specd/client_opts.h"
#include "specd/curve.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-gateway [options]\n"
            "\n"
            "OpenAI-compatible HTTP API for a specd coordinator: POST /v1/chat/completions, POST /v1/completions\n"
            "(streaming with server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
            "\n"
            "  --listen ADDR:PORT      where to serve HTTP (default %s; [IPv6]:PORT works too)\n"
            "  --coordinator ADDR      the coordinator's client socket (default: the one this user's specd-launch\n"
            "                          recorded in $XDG_RUNTIME_DIR or /tmp/specd-UID/current, else %s)\n"
            "  --curve-secret FILE     CurveZMQ: the gateway's secret key (specd-keygen; mode 0600; default\n"
            "                          $SPECD_CURVE_SECRET); its public key must be on the coordinator's\n"
            "                          --client-keys list\n"
            "  --curve-server FILE     the coordinator's public key (default $SPECD_CURVE_SERVER)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' on /v1/* (default: $SPECD_API_KEY;\n"
            "                          /health and /metrics need it only from off the loopback)\n"
            "  --insecure              allow a --listen address off the loopback without an API key (anyone who\n"
            "                          can reach it can use the service); refused without it\n"
            "  --tls-cert FILE         serve HTTPS with this certificate (PEM; with --tls-key)\n"
            "  --tls-key FILE          the certificate's private key (PEM)\n"
            "  --model-name NAME       the model id /v1/models lists and responses carry (default %s)\n"
            "  --max-body BYTES        largest request body (default %u; 413 above)\n"
            "  --max-connections N     open HTTP connections (default %d)\n"
            "  --max-inflight N        coordinator requests in flight from this gateway (default %d; 429 above)\n"
            "  --timeout S             close HTTP connections idle for S seconds (default %d)\n"
            "  --drain-timeout S       on SIGINT/SIGTERM: new requests get 503 (Retry-After) while those in\n"
            "                          flight finish, for up to S seconds (default 20; a second signal: at once)\n"
            "  -v, --verbose           DEBUG logs\n"
            "  -h, --help              this help\n"
            "\n"
            "Prints \"listening http://ADDR:PORT\" (https:// with TLS) on stdout once it serves. Drains, then stops\n"
            "on SIGINT/SIGTERM (exit 0). Exit status 2: bad arguments, a --listen address off the loopback without\n"
            "an API key or --insecure, or unreadable TLS files; 1: it could not start.\n",
            GW_DEFAULT_LISTEN, SD_CLIENT_DEFAULT_ADDR, GW_DEFAULT_MODEL_NAME, GW_DEFAULT_MAX_BODY,
            GW_DEFAULT_MAX_CONNECTIONS, GW_DEFAULT_MAX_INFLIGHT, GW_DEFAULT_TIMEOUT_S);
}

static bool parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

enum {
    OPT_LISTEN = 256,
    OPT_KEY,
    OPT_MODEL,
    OPT_BODY,
    OPT_CONNS,
    OPT_INFLIGHT,
    OPT_TIMEOUT,
    OPT_INSECURE,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_DRAIN
};

bool gw_listen_is_loopback(const char *listen) {
    if (strncmp(listen, "[::1]:", 6) == 0) return true;
    if (strncmp(listen, "127.", 4) != 0) return false;
    /* 127.a.b.c:PORT, numeric (parse_listen refuses anything else later) */
    for (const char *p = listen + 4; *p && *p != ':'; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '.')) return false;
    return true;
}

/* The whole of a small PEM file, NUL-terminated (owned), or NULL (said). */
static char *read_pem(const char *path, const char *flag) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "specd-gateway: %s %s: %s\n", flag, path, strerror(errno));
        return NULL;
    }
    enum { MAX_PEM = 1 << 20 };
    char *buf = malloc(MAX_PEM + 1);
    size_t n = buf ? fread(buf, 1, MAX_PEM + 1, f) : 0;
    bool err = ferror(f);
    fclose(f);
    if (!buf || err || n == 0 || n > MAX_PEM) {
        fprintf(stderr, "specd-gateway: %s %s: %s\n", flag, path,
                !buf     ? "out of memory"
                : err    ? "read error"
                : n == 0 ? "empty"
                         : "over 1 MiB");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* The listen rule and the TLS files; -1: go on, else the exit status. */
static int check_listen(gw_server *srv, const char *tls_files[2]) {
    if (!tls_files[0] != !tls_files[1]) {
        fprintf(stderr, "specd-gateway: --tls-cert and --tls-key go together\n");
        return 2;
    }
    if (tls_files[0]) {
        if (!(srv->tls_cert = read_pem(tls_files[0], "--tls-cert"))) return 2;
        if (!(srv->tls_key = read_pem(tls_files[1], "--tls-key"))) return 2;
    }
    if (!gw_listen_is_loopback(srv->listen) && !srv->api_key && !srv->insecure) {
        fprintf(stderr,
                "specd-gateway: refusing to listen on %s, off the loopback, without an API key: anyone who can reach "
                "it could use the service. Give --api-key (or $SPECD_API_KEY; with --tls-cert/--tls-key it is not "
                "sent in the clear), or --insecure to serve it open\n",
                srv->listen);
        return 2;
    }
    return -1;
}

/* -1: go on; otherwise the exit status. */
/* link: the coordinator's address and the key files (client_opts.h). */
static int parse_args(int argc, char **argv, gw_server *srv, bool *verbose, sd_client_link_opts *link) {
    const char *tls_files[2] = {NULL, NULL};
    static const struct option longs[] = {{"listen", required_argument, 0, OPT_LISTEN},
                                          {"api-key", required_argument, 0, OPT_KEY},
                                          {"model-name", required_argument, 0, OPT_MODEL},
                                          {"max-body", required_argument, 0, OPT_BODY},
                                          {"max-connections", required_argument, 0, OPT_CONNS},
                                          {"max-inflight", required_argument, 0, OPT_INFLIGHT},
                                          {"timeout", required_argument, 0, OPT_TIMEOUT},
                                          {"insecure", no_argument, 0, OPT_INSECURE},
                                          {"tls-cert", required_argument, 0, OPT_TLS_CERT},
                                          {"tls-key", required_argument, 0, OPT_TLS_KEY},
                                          {"drain-timeout", required_argument, 0, OPT_DRAIN},
                                          {"verbose", no_argument, 0, 'v'},
                                          {"help", no_argument, 0, 'h'},
                                          SD_CLIENT_LINK_LONG_OPTIONS,
                                          {0, 0, 0, 0}};
    int c;
    unsigned long v;
    while ((c = getopt_long(argc, argv, "vh", longs, NULL)) != -1) {
        switch (c) {
        case OPT_LISTEN:
            if (strlen(optarg) >= sizeof srv->listen) {
                fprintf(stderr, "specd-gateway: --listen address too long\n");
                return 2;
            }
            snprintf(srv->listen, sizeof srv->listen, "%s", optarg);
            break;
        case OPT_KEY: srv->api_key = optarg; break;
        case OPT_INSECURE: srv->insecure = true; break;
        case OPT_TLS_CERT: tls_files[0] = optarg; break;
        case OPT_TLS_KEY: tls_files[1] = optarg; break;
        case OPT_MODEL:
            if (!optarg[0] || strlen(optarg) > 200) {
                fprintf(stderr, "specd-gateway: --model-name must be 1 to 200 characters\n");
                return 2;
            }
            srv->model_name = optarg;
            break;
        case OPT_BODY:
            if (!parse_uint(optarg, 1024, 1ul << 30, &v)) {
                fprintf(stderr, "specd-gateway: --max-body must be in [1024, 2^30], got '%s'\n", optarg);
                return 2;
            }
            srv->max_body = v;
            break;
        case OPT_CONNS:
        case OPT_INFLIGHT:
            if (!parse_uint(optarg, 1, 100000, &v)) {
                fprintf(stderr, "specd-gateway: --max-connections/--max-inflight must be in [1, 100000], got '%s'\n",
                        optarg);
                return 2;
            }
            if (c == OPT_CONNS)
                srv->max_connections = (unsigned)v;
            else
                srv->max_inflight = (unsigned)v;
            break;
        case OPT_DRAIN:
            if (!parse_uint(optarg, 0, 86400, &v)) {
                fprintf(stderr, "specd-gateway: --drain-timeout must be in [0, 86400] seconds, got '%s'\n", optarg);
                return 2;
            }
            srv->drain_timeout_s = (unsigned)v;
            break;
        case OPT_TIMEOUT:
            if (!parse_uint(optarg, 1, 86400, &v)) {
                fprintf(stderr, "specd-gateway: --timeout must be in [1, 86400] seconds, got '%s'\n", optarg);
                return 2;
            }
            srv->timeout_s = (unsigned)v;
            break;
        case 'v': *verbose = true; break;
        case 'h': usage(stdout); return 0;
        default:
            if (sd_client_link_opts_apply(link, c, optarg)) break;
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "specd-gateway: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!srv->api_key) {
        const char *env = getenv("SPECD_API_KEY");
        if (env && env[0]) srv->api_key = env;
    }
    if (srv->api_key && !srv->api_key[0]) srv->api_key = NULL;
    srv->coordinator = link->coordinator;
    if (!sd_client_link_opts_keys(link, "specd-gateway", getenv("SPECD_CURVE_SECRET"), getenv("SPECD_CURVE_SERVER")))
        return 2;
    return check_listen(srv, tls_files);
}

/* The first SIGINT/SIGTERM: new generation requests get 503 with
 * Retry-After (a load balancer or the openai client retries elsewhere, or
 * here once restarted) while those in flight finish, for up to
 * --drain-timeout seconds; a second signal cuts it short. Then the streams
 * still open end (gw_http_stop). */
static void drain(gw_server *srv, const sigset_t *set, int sig) {
    atomic_store(&srv->draining, true);
    SD_INFO("signal %d: draining (%u requests in flight, at most %u s; a second signal stops at once)", sig,
            atomic_load(&srv->inflight), srv->drain_timeout_s);
    struct timespec t0, now, tick = {0, 50 * 1000000L};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (atomic_load(&srv->inflight) == 0) {
            /* the last events of the streams that just ended are still being written */
            struct timespec grace = {0, 200 * 1000000L};
            nanosleep(&grace, NULL);
            SD_INFO("drained in %.1f s: stopping", waited);
            return;
        }
        if (waited >= (double)srv->drain_timeout_s) {
            SD_WARN("drain timed out with %u requests in flight: stopping", atomic_load(&srv->inflight));
            return;
        }
        int s = sigtimedwait(set, NULL, &tick);
        if (s == SIGINT || s == SIGTERM) {
            SD_WARN("second signal: stopping at once");
            return;
        }
    }
}

int main(int argc, char **argv) {
    gw_server *srv = calloc(1, sizeof *srv);
    if (!srv) return 1;
    snprintf(srv->listen, sizeof srv->listen, "%s", GW_DEFAULT_LISTEN);
    static char found[600];
    srv->coordinator =
        sd_client_discover(getenv("XDG_RUNTIME_DIR"), found, sizeof found) ? found : SD_CLIENT_DEFAULT_ADDR;
    srv->model_name = GW_DEFAULT_MODEL_NAME;
    srv->max_body = GW_DEFAULT_MAX_BODY;
    srv->max_connections = GW_DEFAULT_MAX_CONNECTIONS;
    srv->max_inflight = GW_DEFAULT_MAX_INFLIGHT;
    srv->timeout_s = GW_DEFAULT_TIMEOUT_S;
    srv->drain_timeout_s = GW_DEFAULT_DRAIN_S;
    bool verbose = false;
    sd_client_link_opts link = {.coordinator = srv->coordinator};
    int rc = parse_args(argc, argv, srv, &verbose, &link);
    if (rc >= 0) {
        free(srv->tls_cert);
        free(srv->tls_key);
        free(srv);
        return rc;
    }
    sd_net_log_init("gateway", 0, verbose);
    sd_curve_id curve;
    if (sd_curve_id_load(link.curve_secret, link.curve_server, &curve) != SD_OK) {
        free(srv->tls_cert);
        free(srv->tls_key);
        free(srv);
        return 2;
    }

    /* Before any thread: every thread inherits the blocked mask and only
     * the main thread takes these signals (sigwait). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    rc = 1;
    void *http = NULL;
    sd_client_params cp = sd_client_default_params();
    cp.coordinator = srv->coordinator;
    cp.name = "specd-gateway";
    cp.connect_timeout_ms = 5000;
    sd_client_params_set_curve(&cp, &curve);
    if (sd_client_connect(&cp, &srv->client) != SD_OK) {
        SD_ERROR("cannot set up the connection to the coordinator %s", srv->coordinator);
        goto out;
    }
    srv->metrics = gw_metrics_create();
    srv->janitor = gw_janitor_start(srv->client);
    if (!srv->metrics || !srv->janitor) {
        SD_ERROR("out of memory or threads at start-up");
        goto out;
    }
    http = gw_http_start(srv);
    if (!http) goto out;
    const char *scheme = srv->tls_cert ? "https" : "http";
    if (srv->api_key == NULL && !gw_listen_is_loopback(srv->listen))
        SD_WARN("listening on %s without --api-key (--insecure): anyone who can reach it can use the service",
                srv->listen);
    SD_INFO("serving %s on %s://%s for coordinator %s%s", srv->model_name, scheme, srv->listen, srv->coordinator,
            srv->api_key ? " (API key required)" : "");
    printf("listening %s://%s\n", scheme, srv->listen);
    fflush(stdout);

    int sig = 0;
    while (sigwait(&set, &sig) != 0 || sig == SIGHUP) {
    }
    drain(srv, &set, sig);
    rc = 0;
out:
    atomic_store(&srv->stopping, true);
    gw_http_stop(srv, &http);
    gw_janitor_stop(srv->janitor);
    sd_client_close(&srv->client); /* runs the final callbacks of what is still in flight */
    gw_janitor_free(&srv->janitor);
    gw_metrics_destroy(&srv->metrics);
    memset(&curve, 0, sizeof curve);
    if (srv->tls_key) memset(srv->tls_key, 0, strlen(srv->tls_key));
    free(srv->tls_cert);
    free(srv->tls_key);
    free(srv);
    return rc;
}
