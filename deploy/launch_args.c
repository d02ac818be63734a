/* launch_args.c — specd-launch's command line: the option table, one
 * function per group of options, the rules between flags and --help.
 * Split from specd-launch.c, which keeps the processes and their
 * supervision; the launcher reads only the launch_opts filled here. */
#include "launch_args.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/cli.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: specd-launch --target TARGET.gguf (--draft DRAFT.gguf | --ngram | --draft-layers L)... | --no-draft\n"
        "                    [options]\n"
        "\n"
        "Starts specd-coordinator, specd-verifier, specd-drafter and specd-gateway on this machine, waits until\n"
        "they have registered, prints \"ready ADDR\" (ADDR: where clients connect) and \"http URL\" (the\n"
        "gateway's OpenAI-compatible API) on stdout and supervises them until SIGINT/SIGTERM, then stops them\n"
        "all (SIGTERM, a bounded wait, SIGKILL) and exits 0.\n"
        "\n"
        "  --target FILE          target model (GGUF) for the coordinator and the verifier (required)\n"
        "  --draft FILE           drafter: a separate draft model with the target's vocabulary\n"
        "  --ngram                drafter: n-gram prompt lookup (no model), in its own process\n"
        "  --local-ngram          drafter: n-gram prompt lookup inside the coordinator (no process, no draft\n"
        "                         round trip; the fastest lookup decoding)\n"
        "  --draft-layers L       drafter: the target's first L layers (self-draft)\n"
        "  --eagle DIR            drafter: an EAGLE-3 head (Hugging Face directory, e.g. tools/train-eagle's)\n"
        "                         in each verifier (a TP group's leader), drafting after every verify step\n"
        "                         (no round trip)\n"
        "  --eagle-drafter DIR    drafter: an EAGLE-3 head in its own process (specd-drafter --eagle DIR),\n"
        "                         fed the verifier's features of the committed positions through the\n"
        "                         coordinator (3 x the target's hidden size f32 a position)\n"
        "  --eagle-weights W      the heads' matrices, in the verifiers and drafter processes alike: q8_0\n"
        "                         (quantized at load, the default) or stored\n"
        "                         The drafter flags but --eagle may be repeated and mixed: each starts one drafter,\n"
        "                         all active at once (at most %d); each is restarted when it dies.\n"
        "  --drafters LIST        drafters as a list: ngram, model:FILE, layers:L, eagle:DIR, comma-separated\n"
        "                         (e.g. ngram,model:q4.gguf), added to the flags above\n"
        "  --no-draft             no drafter: target-only decoding\n"
        "  --tp N                 verifier ranks per group: a tensor-parallel group (default 1); restarted as\n"
        "                         a whole when any rank dies\n"
        "  --groups G             verifier groups (data-parallel replicas, default 1, at most %d; G x N <= %d):\n"
        "                         group g (1..G) runs with --group-id g; the coordinator places each request\n"
        "                         on one group by measured load\n"
        "  --group-addr ADDR      the first group's own socket, bound by its rank 0 (default\n"
        "                         tcp://127.0.0.1:7702); group g uses the port + g - 1\n"
        "  --verifier-device D    cpu (default), cuda (rank r of group g on cuda:(g-1)*N+r) or cuda:B (the\n"
        "                         same from cuda:B)\n"
        "  --client-addr ADDR     coordinator's client socket (default: ipc:// in a private directory, below)\n"
        "  --worker-addr ADDR     coordinator's worker socket (default: the same)\n"
        "  --threads-verifier N   verifier threads (default: its own default)\n"
        "  --threads-drafter N    drafter threads (default: its own default)\n"
        "  --bin-dir DIR          where the binaries are (default: the build tree next to specd-launch, then PATH)\n"
        "  --ready-timeout S      give up when not ready after S seconds (default 120)\n"
        "  --stop-timeout S       SIGTERM -> SIGKILL grace per stage (default 30; the gateway, then the\n"
        "                         coordinator, drain what is in flight for up to 20 s, then the workers stop)\n"
        "  --restart on|off       restart a coordinator/drafter/verifier that dies (default on)\n"
        "  --http ADDR:PORT       where specd-gateway serves the OpenAI-compatible HTTP API\n"
        "                         (default 127.0.0.1:8000)\n"
        "  --no-gateway           do not start specd-gateway\n"
        "  Without keys and without addresses the links are ipc:// sockets in $XDG_RUNTIME_DIR (else\n"
        "  /tmp)/specd-UID/launch-PID, mode 0700: no other user can reach them; specd-client and\n"
        "  specd-gateway of the same user find the service there without --coordinator.\n"
        "  --insecure             the TCP loopback defaults instead (tcp://127.0.0.1:7700, 7701, 7702), which\n"
        "                         every local user can reach\n"
        "  --curve DIR            CurveZMQ on every link: key pairs for each process (kept when already\n"
        "                         in DIR, else generated; DIR is created 0700), allow-lists, and a client\n"
        "                         key: specd-client --curve-secret DIR/client.key --curve-server\n"
        "                         DIR/coordinator.pub\n"
        "  --coordinator-arg ARG  extra argument for specd-coordinator (repeatable)\n"
        "  --verifier-arg ARG     extra argument for specd-verifier (repeatable)\n"
        "  --drafter-arg ARG      extra argument for specd-drafter (repeatable)\n"
        "  --gateway-arg ARG      extra argument for specd-gateway (repeatable; e.g. --api-key=KEY); an --http\n"
        "                         address off the loopback needs --api-key=KEY ($SPECD_API_KEY) or --insecure\n"
        "  -v, --verbose          DEBUG logs here and in every child\n"
        "  -h, --help             this help\n"
        "\n"
        "Exit status: 0 after a clean stop; 1 when the service could not start or the coordinator died\n"
        "with --restart off; 2 on a usage error.\n",
        MAX_DRAFTERS, MAX_GROUPS, MAX_TP);
}

/* The long options' codes past the short ones, in two groups. */
enum {
    /* which workers run and where: apply_worker_option */
    OPT_DRAFT = 256,
    OPT_NGRAM,
    OPT_DRAFT_LAYERS,
    OPT_DRAFTERS,
    OPT_NO_DRAFT,
    OPT_LOCAL_NGRAM,
    OPT_EAGLE,
    OPT_EAGLE_DRAFTER,
    OPT_EAGLE_WEIGHTS,
    OPT_GROUPS,
    OPT_TP,
    OPT_VERIFIER_DEVICE,
    OPT_THREADS_V,
    OPT_THREADS_D,
    /* the service around them: apply_service_option */
    OPT_TARGET,
    OPT_CLIENT_ADDR,
    OPT_WORKER_ADDR,
    OPT_GROUP_ADDR,
    OPT_HTTP,
    OPT_NO_GATEWAY,
    OPT_CURVE,
    OPT_INSECURE,
    OPT_BIN_DIR,
    OPT_READY_TIMEOUT,
    OPT_STOP_TIMEOUT,
    OPT_RESTART,
    OPT_COORD_ARG,
    OPT_VERIFIER_ARG,
    OPT_DRAFTER_ARG,
    OPT_GATEWAY_ARG
};

/* Adds one drafter; false (with a message) when there are too many. */
static bool add_drafter(launch_opts *o, drafter_kind kind, const char *model, int layers) {
    if (o->n_drafters >= MAX_DRAFTERS) {
        fprintf(stderr, "specd-launch: at most %d drafters\n", MAX_DRAFTERS);
        return false;
    }
    o->drafters[o->n_drafters++] = (drafter_spec){kind, model, layers};
    return true;
}

/* --drafters LIST: comma-separated ngram, model:FILE, layers:L, eagle:DIR. The list
 * is kept in place (argv), cut at the commas. */
static bool parse_drafters(launch_opts *o, char *list) {
    for (char *item = strtok(list, ","); item; item = strtok(NULL, ",")) {
        int layers = 0;
        bool ok;
        if (!strcmp(item, "ngram"))
            ok = add_drafter(o, DRAFT_NGRAM, NULL, 0);
        else if (!strncmp(item, "model:", 6) && item[6])
            ok = add_drafter(o, DRAFT_MODEL, item + 6, 0);
        else if (!strncmp(item, "layers:", 7) && sd_cli_parse_int(item + 7, 1, 4096, &layers))
            ok = add_drafter(o, DRAFT_LAYERS, NULL, layers);
        else if (!strncmp(item, "eagle:", 6) && item[6])
            ok = add_drafter(o, DRAFT_EAGLE, item + 6, 0);
        else {
            fprintf(stderr, "specd-launch: --drafters: '%s' is not ngram, model:FILE, layers:L or eagle:DIR\n", item);
            return false;
        }
        if (!ok) return false;
    }
    return true;
}

/* --verifier-device cpu, cuda or cuda:B: *device_base -1, 0 or B. */
static bool parse_verifier_device(const char *arg, int *device_base) {
    if (!strcmp(arg, "cpu")) {
        *device_base = -1;
    } else if (!strcmp(arg, "cuda")) {
        *device_base = 0;
    } else if (strncmp(arg, "cuda:", 5) || !sd_cli_parse_int(arg + 5, 0, 1023, device_base)) {
        fprintf(stderr, "specd-launch: --verifier-device takes cpu, cuda or cuda:N, got '%s'\n", arg);
        return false;
    }
    return true;
}

/* --coordinator-arg, --verifier-arg, --drafter-arg, --gateway-arg: one more
 * argument passed through to that process. */
static bool add_extra_arg(launch_opts *o, int opt, const char *arg) {
    int r = opt == OPT_COORD_ARG      ? CHILD_COORDINATOR
            : opt == OPT_VERIFIER_ARG ? CHILD_VERIFIER
            : opt == OPT_DRAFTER_ARG  ? CHILD_DRAFTER
                                      : CHILD_GATEWAY;
    if (o->n_extra[r] >= MAX_EXTRA_ARGS) {
        fprintf(stderr, "specd-launch: at most %d extra arguments per process\n", MAX_EXTRA_ARGS);
        return false;
    }
    o->extra[r][o->n_extra[r]++] = arg;
    return true;
}

/* The options that say which workers run and where: drafters, verifier
 * groups and devices, threads. false (said) on a bad value. */
static bool apply_worker_option(launch_opts *o, int opt, char *arg) {
    int layers = 0;
    switch (opt) {
    case OPT_DRAFT: return add_drafter(o, DRAFT_MODEL, arg, 0);
    case OPT_NGRAM: return add_drafter(o, DRAFT_NGRAM, NULL, 0);
    case OPT_DRAFT_LAYERS:
        if (!sd_cli_parse_int(arg, 1, 4096, &layers)) {
            fprintf(stderr, "specd-launch: --draft-layers must be an integer in [1, 4096], got '%s'\n", arg);
            return false;
        }
        return add_drafter(o, DRAFT_LAYERS, NULL, layers);
    case OPT_DRAFTERS: return parse_drafters(o, arg);
    case OPT_NO_DRAFT: o->no_draft = true; return true;
    case OPT_LOCAL_NGRAM: o->local_ngram = true; return true;
    case OPT_EAGLE: o->eagle = arg; return true;
    case OPT_EAGLE_DRAFTER: return add_drafter(o, DRAFT_EAGLE, arg, 0);
    case OPT_EAGLE_WEIGHTS:
        if (strcmp(arg, "q8_0") != 0 && strcmp(arg, "stored") != 0) {
            fprintf(stderr, "specd-launch: --eagle-weights must be q8_0 or stored, got '%s'\n", arg);
            return false;
        }
        o->eagle_weights = arg;
        return true;
    case OPT_GROUPS:
        if (!sd_cli_parse_int(arg, 1, MAX_GROUPS, &o->groups)) {
            fprintf(stderr, "specd-launch: --groups must be an integer in [1, %d], got '%s'\n", MAX_GROUPS, arg);
            return false;
        }
        return true;
    case OPT_TP:
        if (!sd_cli_parse_int(arg, 1, MAX_TP, &o->tp)) {
            fprintf(stderr, "specd-launch: --tp must be an integer in [1, %d], got '%s'\n", MAX_TP, arg);
            return false;
        }
        return true;
    case OPT_VERIFIER_DEVICE: return parse_verifier_device(arg, &o->device_base);
    case OPT_THREADS_V:
    case OPT_THREADS_D:
        if (!sd_cli_parse_int(arg, 1, 1024, opt == OPT_THREADS_V ? &o->threads_verifier : &o->threads_drafter)) {
            fprintf(stderr, "specd-launch: --threads-* must be an integer in [1, 1024], got '%s'\n", arg);
            return false;
        }
        return true;
    }
    return false;
}

/* The options of the service around the workers: addresses, binaries,
 * timeouts, restarts, the gateway, keys, extra arguments. false (said)
 * on a bad value. */
static bool apply_service_option(launch_opts *o, int opt, char *arg) {
    switch (opt) {
    case OPT_TARGET: o->target = arg; return true;
    case OPT_CLIENT_ADDR: o->client_addr = arg, o->addrs_given = true; return true;
    case OPT_WORKER_ADDR: o->worker_addr = arg, o->addrs_given = true; return true;
    case OPT_GROUP_ADDR: o->group_addr = arg, o->addrs_given = true; return true;
    case OPT_INSECURE: o->insecure = true; return true;
    case OPT_HTTP: o->http = arg; return true;
    case OPT_NO_GATEWAY: o->no_gateway = true; return true;
    case OPT_CURVE: o->curve_dir = arg; return true;
    case OPT_BIN_DIR: o->bin_dir = arg; return true;
    case OPT_READY_TIMEOUT:
    case OPT_STOP_TIMEOUT:
        if (!sd_cli_parse_int(arg, 1, 86400, opt == OPT_READY_TIMEOUT ? &o->ready_timeout_s : &o->stop_timeout_s)) {
            fprintf(stderr, "specd-launch: timeouts are integers in [1, 86400] seconds, got '%s'\n", arg);
            return false;
        }
        return true;
    case OPT_RESTART:
        if (strcmp(arg, "on") && strcmp(arg, "off")) {
            fprintf(stderr, "specd-launch: --restart takes on or off, got '%s'\n", arg);
            return false;
        }
        o->restart = !strcmp(arg, "on");
        return true;
    case OPT_COORD_ARG:
    case OPT_VERIFIER_ARG:
    case OPT_DRAFTER_ARG:
    case OPT_GATEWAY_ARG: return add_extra_arg(o, opt, arg);
    }
    return false;
}

/* True when ADDR:PORT is on the loopback (127.0.0.0/8 or [::1]). */
static bool http_is_loopback(const char *http) {
    if (strncmp(http, "[::1]:", 6) == 0) return true;
    if (strncmp(http, "127.", 4) != 0) return false;
    for (const char *p = http + 4; *p && *p != ':'; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '.')) return false;
    return true;
}

/* The gateway's rule, said before anything starts: off the loopback it
 * needs an API key (--gateway-arg --api-key=KEY, or $SPECD_API_KEY, which
 * it inherits) or --gateway-arg --insecure. */
static bool gateway_exposure_ok(const launch_opts *o) {
    if (o->no_gateway || http_is_loopback(o->http)) return true;
    const char *env = getenv("SPECD_API_KEY");
    if (env && env[0]) return true;
    for (int i = 0; i < o->n_extra[CHILD_GATEWAY]; i++) {
        const char *a = o->extra[CHILD_GATEWAY][i];
        if (!strcmp(a, "--insecure") || !strcmp(a, "--api-key") || !strncmp(a, "--api-key=", 10)) return true;
    }
    fprintf(stderr,
            "specd-launch: --http %s is off the loopback: give the gateway an API key (--gateway-arg --api-key=KEY "
            "or $SPECD_API_KEY), or --gateway-arg --insecure to serve it open\n",
            o->http);
    return false;
}

/* The rules between flags: 0, or 2 with the reason on stderr. */
static int check_opts(const launch_opts *o) {
    if (!gateway_exposure_ok(o)) return 2;
    if (!o->target || (o->n_drafters == 0 && !o->local_ngram && !o->eagle) == !o->no_draft) {
        fprintf(stderr, "specd-launch: need --target and either drafters (--draft, --ngram, --local-ngram, "
                        "--draft-layers, --eagle, --drafters) or --no-draft (see --help)\n");
        return 2;
    }
    if (o->groups * o->tp > MAX_TP) {
        fprintf(stderr, "specd-launch: --groups %d x --tp %d is %d verifier ranks, more than %d\n", o->groups, o->tp,
                o->groups * o->tp, MAX_TP);
        return 2;
    }
    if (o->tp > 1 && o->device_base >= 0 && !o->curve_dir) {
        fprintf(stderr,
                "specd-launch: GPU ranks (--tp %d) share an NCCL id over the group socket, which travels "
                "only on an encrypted link: give --curve DIR\n",
                o->tp);
        return 2;
    }
    return 0;
}

/* The model id the gateway reports: the target's name without its folder
 * and .gguf. */
static void set_model_name(launch_opts *o) {
    const char *base = strrchr(o->target, '/');
    base = base && base[1] ? base + 1 : o->target;
    snprintf(o->model_name, sizeof o->model_name, "%s", base);
    size_t ml = strlen(o->model_name);
    while (ml > 1 && o->model_name[ml - 1] == '/') o->model_name[--ml] = '\0';
    if (ml > 5 && !strcmp(o->model_name + ml - 5, ".gguf")) o->model_name[ml - 5] = '\0';
}

static const struct option launch_longs[] = {{"target", required_argument, 0, OPT_TARGET},
                                             {"draft", required_argument, 0, OPT_DRAFT},
                                             {"drafters", required_argument, 0, OPT_DRAFTERS},
                                             {"groups", required_argument, 0, OPT_GROUPS},
                                             {"ngram", no_argument, 0, OPT_NGRAM},
                                             {"draft-layers", required_argument, 0, OPT_DRAFT_LAYERS},
                                             {"no-draft", no_argument, 0, OPT_NO_DRAFT},
                                             {"local-ngram", no_argument, 0, OPT_LOCAL_NGRAM},
                                             {"eagle", required_argument, 0, OPT_EAGLE},
                                             {"eagle-drafter", required_argument, 0, OPT_EAGLE_DRAFTER},
                                             {"eagle-weights", required_argument, 0, OPT_EAGLE_WEIGHTS},
                                             {"tp", required_argument, 0, OPT_TP},
                                             {"client-addr", required_argument, 0, OPT_CLIENT_ADDR},
                                             {"worker-addr", required_argument, 0, OPT_WORKER_ADDR},
                                             {"threads-verifier", required_argument, 0, OPT_THREADS_V},
                                             {"threads-drafter", required_argument, 0, OPT_THREADS_D},
                                             {"bin-dir", required_argument, 0, OPT_BIN_DIR},
                                             {"ready-timeout", required_argument, 0, OPT_READY_TIMEOUT},
                                             {"stop-timeout", required_argument, 0, OPT_STOP_TIMEOUT},
                                             {"restart", required_argument, 0, OPT_RESTART},
                                             {"coordinator-arg", required_argument, 0, OPT_COORD_ARG},
                                             {"verifier-arg", required_argument, 0, OPT_VERIFIER_ARG},
                                             {"drafter-arg", required_argument, 0, OPT_DRAFTER_ARG},
                                             {"group-addr", required_argument, 0, OPT_GROUP_ADDR},
                                             {"verifier-device", required_argument, 0, OPT_VERIFIER_DEVICE},
                                             {"http", required_argument, 0, OPT_HTTP},
                                             {"no-gateway", no_argument, 0, OPT_NO_GATEWAY},
                                             {"gateway-arg", required_argument, 0, OPT_GATEWAY_ARG},
                                             {"curve", required_argument, 0, OPT_CURVE},
                                             {"insecure", no_argument, 0, OPT_INSECURE},
                                             {"verbose", no_argument, 0, 'v'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};

int launch_args_parse(int argc, char **argv, launch_opts *o) {
    *o = (launch_opts){.tp = 1,
                       .groups = 1,
                       .client_addr = "tcp://127.0.0.1:7700",
                       .worker_addr = "tcp://127.0.0.1:7701",
                       .group_addr = "tcp://127.0.0.1:7702",
                       .http = "127.0.0.1:8000",
                       .device_base = -1,
                       .ready_timeout_s = 120,
                       .stop_timeout_s = 30,
                       .restart = true};
    int c;
    while ((c = getopt_long(argc, argv, "vh", launch_longs, NULL)) != -1) {
        if (c == 'v') {
            o->verbose = true;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (c < OPT_DRAFT) { /* '?': getopt said what */
            usage(stderr);
            return 2;
        } else if (!(c < OPT_TARGET ? apply_worker_option(o, c, optarg) : apply_service_option(o, c, optarg))) {
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "specd-launch: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (check_opts(o)) return 2;
    set_model_name(o);
    return -1;
}
