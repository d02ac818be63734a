/* bench_link.c — `specd-bench link`: what CurveZMQ costs one message on a
 * specd link, plaintext and CURVE side by side.
 *
 * Two DEALER -> ROUTER pairs over loopback TCP in one process, made with
 * sd_net_socket_open like every specd socket: one plaintext, one CURVE
 * (server key, a ZAP handler with an allow-list, client key pairs), each
 * ROUTER echoed by a thread of its own. For each message size the two
 * pairs run blocks of round trips in ABBA order, so a busy neighbour hits
 * both alike; each block gives microseconds per round trip; the table has
 * the medians over the blocks kept by the hygiene check (bench_hygiene.h)
 * and the median per-block difference, i.e. what CURVE adds to two messages
 * (one each way). `specd-bench serve --versus` measures the same thing
 * through the whole service, where it drowns in the step times. */
#include "bench_link.h"
#include "bench_hygiene.h"
#include "bench_stats.h"

#include "specd/curve.h"
#include "specd/net.h"

#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define MAX_BLOCKS 200

typedef struct link_pair {
    void *router, *dealer;
    pthread_t echo;
    bool started; /* the echo thread runs */
} link_pair;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Echoes [identity, body] until a zero-length body arrives. */
static void *echo_main(void *arg) {
    void *router = arg;
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, router, 0) < 0 || zmq_msg_recv(&body, router, 0) < 0) {
            zmq_msg_close(&id);
            zmq_msg_close(&body);
            return NULL;
        }
        bool stop = zmq_msg_size(&body) == 0;
        zmq_msg_send(&id, router, ZMQ_SNDMORE);
        zmq_msg_send(&body, router, 0);
        if (stop) return NULL;
    }
}

static bool pair_open(void *zctx, link_pair *lp, const sd_curve_id *server, const sd_curve_id *client) {
    sd_net_socket_params rp = sd_net_socket_default_params();
    rp.type = ZMQ_ROUTER;
    rp.max_msg_bytes = SD_MAX_WORKER_MSG_BYTES;
    if (server) rp.curve_server_secret = server->secret, rp.zap_domain = SD_ZAP_DOMAIN_WORKER;
    if (sd_net_socket_open(zctx, &rp, "tcp://127.0.0.1:*", NULL, &lp->router) != SD_OK) return false;
    char endpoint[256];
    size_t n = sizeof endpoint;
    zmq_getsockopt(lp->router, ZMQ_LAST_ENDPOINT, endpoint, &n);
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = SD_MAX_WORKER_MSG_BYTES;
    if (client)
        dp.curve_server_public = server->public_key, dp.curve_public = client->public_key,
        dp.curve_secret = client->secret;
    if (sd_net_socket_open(zctx, &dp, NULL, endpoint, &lp->dealer) != SD_OK) return false;
    lp->started = pthread_create(&lp->echo, NULL, echo_main, lp->router) == 0;
    return lp->started;
}

static void pair_close(link_pair *lp) {
    zmq_send(lp->dealer, "", 0, 0); /* ends the echo thread */
    char b[1];
    zmq_recv(lp->dealer, b, sizeof b, 0);
    pthread_join(lp->echo, NULL);
    sd_net_close(&lp->dealer);
    sd_net_close(&lp->router);
}

/* trips round trips of size bytes; microseconds per round trip. */
static double block(link_pair *lp, const uint8_t *msg, uint8_t *back, size_t size, int trips) {
    double t0 = now_s();
    for (int i = 0; i < trips; i++) {
        if (zmq_send(lp->dealer, msg, size, 0) < 0 || zmq_recv(lp->dealer, back, size, 0) < 0) return -1;
    }
    return (now_s() - t0) * 1e6 / trips;
}

static void usage(FILE *f) {
    fprintf(f, "usage: specd-bench link [--sizes 256,4096,65536] [--blocks N] [--trips N] [--max-other-load C]\n"
               "Round trips over loopback TCP, plaintext and CurveZMQ (ZAP allow-list) side by side in ABBA\n"
               "blocks: microseconds per round trip (medians over clean blocks) and what CURVE adds.\n"
               "  --sizes LIST        message sizes in bytes (default 256,4096,65536)\n"
               "  --blocks N          blocks per link and size (default 30)\n"
               "  --trips N           round trips per block (default 500)\n"
               "  --max-other-load C  leave out pairs of blocks during which other processes used more than\n"
               "                      C cores (default 0.25)\n");
}

/* A key pair in memory (no files: the benchmark owns both ends). */
static void make_id(sd_curve_id *id) {
    memset(id, 0, sizeof *id);
    zmq_curve_keypair(id->public_key, id->secret);
    id->on = true;
}

int bench_link_main(int argc, char **argv) {
    char sizes[128] = "256,4096,65536";
    int blocks = 30, trips = 500;
    sd_hyg_params hyg = sd_hyg_default_params();
    static const struct option longs[] = {
        {"sizes", required_argument, 0, 's'}, {"blocks", required_argument, 0, 'b'},
        {"trips", required_argument, 0, 't'}, {"max-other-load", required_argument, 0, 'X'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    optind = 2;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (ch) {
        case 's': snprintf(sizes, sizeof sizes, "%s", optarg); break;
        case 'b': blocks = atoi(optarg); break;
        case 't': trips = atoi(optarg); break;
        case 'X': hyg.max_other_cores = atof(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (blocks < 2 || blocks > MAX_BLOCKS || trips < 1 || !(hyg.max_other_cores > 0)) {
        fprintf(stderr, "specd-bench link: --blocks in [2, %d], --trips >= 1, --max-other-load > 0\n", MAX_BLOCKS);
        return 2;
    }
    sd_curve_id server, client;
    make_id(&server);
    make_id(&client);
    char text[64], err[64];
    snprintf(text, sizeof text, "%s\n", client.public_key);
    sd_curve_allow allow;
    if (!sd_curve_allow_parse(text, strlen(text), &allow, err, sizeof err)) return 1;
    sd_zap_domain dom = {SD_ZAP_DOMAIN_WORKER, &allow};
    void *zctx = zmq_ctx_new();
    sd_zap *zap = NULL;
    link_pair lp[2] = {{0}}; /* 0: plaintext, 1: CURVE */
    int rc = 1;
    if (sd_zap_start(zctx, &dom, 1, &zap) != SD_OK || !pair_open(zctx, &lp[0], NULL, NULL) ||
        !pair_open(zctx, &lp[1], &server, &client))
        goto done;
    printf("| message bytes | plaintext us / round trip | CurveZMQ us / round trip | CURVE adds, us / round trip "
           "(median of block differences) | CURVE / plaintext | other CPU, cores: median | blocks over the limit |\n"
           "|---|---|---|---|---|---|---|\n");
    for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
        size_t size = (size_t)atol(tok);
        if (size < 1 || size > (16u << 20)) continue;
        uint8_t *msg = malloc(size), *back = malloc(size);
        if (!msg || !back) goto done;
        memset(msg, 0x5a, size);
        block(&lp[0], msg, back, size, trips / 5 + 1); /* warm-up: handshakes, buffers */
        block(&lp[1], msg, back, size, trips / 5 + 1);
        double us[2][MAX_BLOCKS], diff[MAX_BLOCKS], other[MAX_BLOCKS], kept[2][MAX_BLOCKS];
        int n_kept = 0;
        for (int b = 0; b < blocks; b++) {
            sd_hyg_mark h0 = sd_hyg_now(&hyg);
            for (int i = 0; i < 2; i++) {
                int m = (b % 2) ? 1 - i : i; /* ABBA */
                us[m][b] = block(&lp[m], msg, back, size, trips);
            }
            sd_hyg_mark h1 = sd_hyg_now(&hyg);
            other[b] = sd_hyg_other_cores(&h0, &h1);
            if (!sd_hyg_clean(&hyg, other[b])) continue;
            kept[0][n_kept] = us[0][b];
            kept[1][n_kept] = us[1][b];
            diff[n_kept++] = us[1][b] - us[0][b];
        }
        int n_dirty = blocks - n_kept;
        if (n_kept == 0)
            for (int b = 0; b < blocks; b++)
                kept[0][b] = us[0][b], kept[1][b] = us[1][b], diff[b] = us[1][b] - us[0][b], n_kept++;
        double p = sd_bench_median(kept[0], n_kept), c = sd_bench_median(kept[1], n_kept);
        printf("| %zu | %.1f | %.1f | %.1f | %.3f | %.2f | %d of %d%s |\n", size, p, c, sd_bench_median(diff, n_kept),
               p > 0 ? c / p : 0, sd_bench_median(other, blocks), n_dirty, blocks,
               n_dirty == blocks ? ", all kept: unreliable" : "");
        fflush(stdout);
        free(msg);
        free(back);
    }
    rc = 0;
done:
    for (int i = 0; i < 2; i++) {
        if (lp[i].started) pair_close(&lp[i]);
        sd_net_close(&lp[i].dealer);
        sd_net_close(&lp[i].router);
    }
    sd_zap_stop(&zap);
    zmq_ctx_term(zctx);
    sd_curve_allow_free(&allow);
    return rc;
}
