/* client_opts.h — the options every program that connects to the
 * coordinator's client socket shares (specd-client, specd-gateway,
 * specd-bench serve), in one table and one parser: where the coordinator is
 * (--coordinator ADDR) and CurveZMQ's key files (--curve-secret FILE,
 * --curve-server FILE), and the one way the loaded keys go into
 * sd_client_params. Each main keeps its own usage text (the help is part of
 * the interface), its default address, and its exit codes; what the
 * environment says ($SPECD_CURVE_SECRET, $SPECD_CURVE_SERVER) is read by the
 * main and handed in, since library code reads no environment. The worker
 * processes' counterpart is net/'s worker_opts.h. */
#ifndef SPECD_CLIENT_OPTS_H
#define SPECD_CLIENT_OPTS_H

#include <getopt.h>

#include "specd/client.h"
#include "specd/curve.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_client_link_opts {
    const char *coordinator;  /* --coordinator ADDR (the main's default until given) */
    const char *curve_secret; /* --curve-secret FILE: this program's secret key */
    const char *curve_server; /* --curve-server FILE: the coordinator's public key */
} sd_client_link_opts;

/* getopt_long's values of the shared long options. */
enum {
    SD_CLIENT_OPT_COORDINATOR = 0x5c0,
    SD_CLIENT_OPT_CURVE_SECRET,
    SD_CLIENT_OPT_CURVE_SERVER,
};

/* clang-format off */
#define SD_CLIENT_LINK_LONG_OPTIONS                                         \
    {"coordinator", required_argument, 0, SD_CLIENT_OPT_COORDINATOR},       \
    {"curve-secret", required_argument, 0, SD_CLIENT_OPT_CURVE_SECRET},     \
    {"curve-server", required_argument, 0, SD_CLIENT_OPT_CURVE_SERVER}
/* clang-format on */

/* Applies getopt_long's result c with its argument arg (borrowed) to *o;
 * false when c is not one of the shared options. */
bool sd_client_link_opts_apply(sd_client_link_opts *o, int c, const char *arg);

/* Key files not given take the defaults the main hands in (what its
 * environment says; NULL: none). false, with "prog: --curve-secret and
 * --curve-server go together" on stderr, when one is set without the
 * other. Not thread-safe (writes stderr). */
bool sd_client_link_opts_keys(sd_client_link_opts *o, const char *prog, const char *secret_default,
                              const char *server_default);

/* Points p's CurveZMQ fields at curve's keys (sd_curve_id_load); nothing
 * when curve->on is false (plaintext). curve is borrowed: it must outlive
 * every use of p. */
void sd_client_params_set_curve(sd_client_params *p, const sd_curve_id *curve);

#ifdef __cplusplus
}
#endif
#endif
