/* client_opts.c — the client link's shared options (client_opts.h): one
 * table, one parser, one message for a key file given alone. */
#include "specd/client_opts.h"

#include <stdio.h>

bool sd_client_link_opts_apply(sd_client_link_opts *o, int c, const char *arg) {
    switch (c) {
    case SD_CLIENT_OPT_COORDINATOR: o->coordinator = arg; return true;
    case SD_CLIENT_OPT_CURVE_SECRET: o->curve_secret = arg; return true;
    case SD_CLIENT_OPT_CURVE_SERVER: o->curve_server = arg; return true;
    default: return false;
    }
}

bool sd_client_link_opts_keys(sd_client_link_opts *o, const char *prog, const char *secret_default,
                              const char *server_default) {
    if (!o->curve_secret) o->curve_secret = secret_default;
    if (!o->curve_server) o->curve_server = server_default;
    if (!o->curve_secret != !o->curve_server) {
        fprintf(stderr, "%s: --curve-secret and --curve-server go together\n", prog);
        return false;
    }
    return true;
}

void sd_client_params_set_curve(sd_client_params *p, const sd_curve_id *curve) {
    if (!curve->on) return;
    p->curve_server_public = curve->server;
    p->curve_public = curve->public_key;
    p->curve_secret = curve->secret;
}
