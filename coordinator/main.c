/* main.c — specd-coordinator: flags, signals, and the loop.
 *
 * Holes in the shared brief, and the answers chosen here:
 * - A prompt's first draft ("warm" draft sent with the verifier's prefill)
 *   cannot be verified: the verifier commits the first token at the same
 *   time. Its drafts are dropped; it only fills the drafter's cache.
 * - A client Hello is answered with a Heartbeat (there is no Welcome on the
 *   client link); a client needs no Hello to submit.
 * - Responses and heartbeats from an unregistered worker (e.g. one declared
 *   dead after a timeout) are logged and dropped, not answered with an
 *   Error: they are not requests, and the worker re-registers by itself once
 *   it misses our heartbeats.
 * - Cancel answers Finished with reason CANCELLED (and its held text tail).
 * - KV_FULL from the verifier: the sequence is refilled on a later step;
 *   when it is the only active sequence it fails with CODE_KV_FULL instead
 *   of retrying forever.
 * - The EOS token is committed and listed in TokenChunk.tokens but adds no
 *   text, as in specd-generate. */
#include "coord.h"
#include "specd/cli.h"
#include "specd/curve.h"

#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_stop; /* set by the signal handler only (a lock-free atomic: async-signal-safe) */

static void on_signal(int sig) {
    (void)sig;
    atomic_fetch_add(&g_stop, 1); /* 1: drain, 2: stop now */
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-coordinator --model TARGET [options]\n"
            "Schedules speculative decoding over drafters and a verifier (ZeroMQ).\n"
            "  --model PATH              target GGUF file or Hugging Face directory: tokenizer and identity\n"
            "                            (no weights loaded)\n"
            "  --client-addr ADDR        client ROUTER bind address (tcp://127.0.0.1:7700)\n"
            "  --worker-addr ADDR        worker ROUTER bind address (tcp://127.0.0.1:7701)\n"
            "  --max-queue N             waiting requests before OVERLOADED (256)\n"
            "  --max-active N            sequences in the verifier at once (64)\n"
            "  --max-tokens-default N    max_tokens when a request gives 0 (256)\n"
            "  --default-k K             draft length with --adaptive-k off (4)\n"
            "  --max-k K                 largest draft length (8, at most %d)\n"
            "  --adaptive-k on|off       adapt K per sequence to its acceptance and the batch (on)\n"
            "  --prefill-chunk N         prompt tokens per verify step (and drafter warm-ups per draft step),\n"
            "                            all sequences together (512):\n"
            "                            longer prompts are prefilled in chunks, new prompts wait for a\n"
            "                            later step when the budget is spent; running sequences always go\n"
            "                            (smaller: shorter stalls for them when prompts arrive, later first\n"
            "                            tokens for the new ones)\n"
            "  --draft-timeout-ms MS     floor of a draft step's timeout (2000; else 4x the drafter's p99 per\n"
            "                            depth; a step over it is dropped and the drafter backed off, K = 0)\n"
            "  --verify-timeout-ms MS    a verify step unanswered this long kills the verifier (30000; a\n"
            "                            longer step gets 8x the slowest recent time per token)\n"
            "  --curve-secret FILE       CurveZMQ: the coordinator's secret key (specd-keygen; mode 0600),\n"
            "                            for both sockets; needs --client-keys and --worker-keys\n"
            "  --client-keys FILE        allow-list of client public keys (one per line): clients, gateways\n"
            "  --worker-keys FILE        allow-list of worker public keys: drafters, verifier leaders\n"
            "                            (a client key can never register a worker)\n"
            "  --insecure                allow a non-loopback bind without keys (trusted networks only)\n"
            "  --local-ngram             run an n-gram (prompt lookup) drafter inside the coordinator: no\n"
            "                            drafter process and no draft round trip (other drafters may still\n"
            "                            register beside it)\n"
            "  --verify-rule R           how sampled drafts are verified when a request names no rule:\n"
            "                            coupled (default: seeded output = plain decoding's, whatever was\n"
            "                            drafted) or rejection (accept min(1, p/q), replace from\n"
            "                            norm(max(0, p - q)): the most drafts accepted, output depends on them)\n"
            "  --ngram-cache N           its n-grams of earlier outputs kept for all requests (65536; 0: none,\n"
            "                            e.g. for benchmarks that repeat their prompts)\n"
            "  --stats-names             list workers' names (host:pid) in every client's stats query; off:\n"
            "                            names are left empty (only an operator should see them)\n"
            "  --chat-template NAME      chat format when the model's template is not recognised (or to\n"
            "                            override it): %s\n"
            "  --drain-timeout-ms MS     on SIGINT/SIGTERM: refuse new submits (OVERLOADED, retry), let the\n"
            "                            running ones finish for up to MS (20000; 0: stop at once), then exit;\n"
            "                            a second signal stops at once\n"
            "  -v, --verbose             debug logs\n"
            "  -h, --help                this text\n"
            "Exit status: 0 when stopped by SIGINT/SIGTERM; 2 on a usage error (a bad flag or value, the\n"
            "CurveZMQ flags not all three, a bind off the loopback without keys or --insecure); 1 when it\n"
            "cannot start (model, keys, sockets) or run.\n",
            SD_MAX_K, sd_chat_template_names());
}

/* The rules between flags, usage errors (exit 2) before anything opens. */
static bool usage_rules_ok(const sd_coord_params *p) {
    bool keyed = p->curve_secret_file || p->client_keys_file || p->worker_keys_file;
    if (keyed && !(p->curve_secret_file && p->client_keys_file && p->worker_keys_file)) {
        fprintf(stderr, "specd-coordinator: CurveZMQ needs all three of --curve-secret, --client-keys and "
                        "--worker-keys\n");
        return false;
    }
    return sd_curve_bind_check(p->client_addr, keyed, p->insecure, "--client-addr") == SD_OK &&
           sd_curve_bind_check(p->worker_addr, keyed, p->insecure, "--worker-addr") == SD_OK;
}

enum {
    O_MODEL = 256,
    O_CADDR,
    O_WADDR,
    O_QUEUE,
    O_ACTIVE,
    O_MAXTOK,
    O_KDEF,
    O_KMAX,
    O_ADAPT,
    O_CHUNK,
    O_DTO,
    O_VTO,
    O_CURVE,
    O_STATS_NAMES,
    O_CHAT,
    O_CKEYS,
    O_WKEYS,
    O_INSECURE,
    O_LOCAL_NGRAM,
    O_NGRAM_CACHE,
    O_VERIFY_RULE,
    O_DRAIN
};
static const struct option coord_longs[] = {{"model", required_argument, 0, O_MODEL},
                                            {"client-addr", required_argument, 0, O_CADDR},
                                            {"worker-addr", required_argument, 0, O_WADDR},
                                            {"max-queue", required_argument, 0, O_QUEUE},
                                            {"max-active", required_argument, 0, O_ACTIVE},
                                            {"max-tokens-default", required_argument, 0, O_MAXTOK},
                                            {"default-k", required_argument, 0, O_KDEF},
                                            {"max-k", required_argument, 0, O_KMAX},
                                            {"adaptive-k", required_argument, 0, O_ADAPT},
                                            {"prefill-chunk", required_argument, 0, O_CHUNK},
                                            {"draft-timeout-ms", required_argument, 0, O_DTO},
                                            {"verify-timeout-ms", required_argument, 0, O_VTO},
                                            {"curve-secret", required_argument, 0, O_CURVE},
                                            {"stats-names", no_argument, 0, O_STATS_NAMES},
                                            {"chat-template", required_argument, 0, O_CHAT},
                                            {"client-keys", required_argument, 0, O_CKEYS},
                                            {"worker-keys", required_argument, 0, O_WKEYS},
                                            {"insecure", no_argument, 0, O_INSECURE},
                                            {"local-ngram", no_argument, 0, O_LOCAL_NGRAM},
                                            {"ngram-cache", required_argument, 0, O_NGRAM_CACHE},
                                            {"verify-rule", required_argument, 0, O_VERIFY_RULE},
                                            {"drain-timeout-ms", required_argument, 0, O_DRAIN},
                                            {"verbose", no_argument, 0, 'v'},
                                            {"help", no_argument, 0, 'h'},
                                            {0, 0, 0, 0}};

/* The command line into *p and *verbose: -1 to go on, else the exit status
 * (0 after --help, 2 for a bad option, said on stderr). */
static int parse_args(int argc, char **argv, sd_coord_params *p, bool *verbose) {
    int o;
    while ((o = getopt_long(argc, argv, "vh", coord_longs, NULL)) != -1) {
        bool ok = true;
        const char *name = NULL;
        switch (o) {
        case O_MODEL: p->model_path = optarg; break;
        case O_CADDR: p->client_addr = optarg; break;
        case O_WADDR: p->worker_addr = optarg; break;
        case O_QUEUE:
            name = "max-queue";
            ok = sd_cli_parse_i32(optarg, 0, 1 << 20, &p->max_queue);
            break;
        case O_ACTIVE:
            name = "max-active";
            ok = sd_cli_parse_i32(optarg, 1, 1 << 16, &p->max_active);
            break;
        case O_MAXTOK:
            name = "max-tokens-default";
            ok = sd_cli_parse_i32(optarg, 1, 1 << 24, &p->max_tokens_default);
            break;
        case O_KDEF:
            name = "default-k";
            ok = sd_cli_parse_i32(optarg, 0, SD_MAX_K, &p->default_k);
            break;
        case O_KMAX:
            name = "max-k";
            ok = sd_cli_parse_i32(optarg, 0, SD_MAX_K, &p->max_k);
            break;
        case O_ADAPT:
            name = "adaptive-k";
            ok = strcmp(optarg, "on") == 0 || strcmp(optarg, "off") == 0;
            p->adaptive_k = strcmp(optarg, "on") == 0;
            break;
        case O_CHUNK:
            name = "prefill-chunk";
            ok = sd_cli_parse_i32(optarg, 1, 1 << 20, &p->prefill_chunk);
            break;
        case O_DTO:
            name = "draft-timeout-ms";
            ok = sd_cli_parse_i32(optarg, 1, 1 << 30, &p->draft_timeout_ms);
            break;
        case O_VTO:
            name = "verify-timeout-ms";
            ok = sd_cli_parse_i32(optarg, 1, 1 << 30, &p->verify_timeout_ms);
            break;
        case O_DRAIN:
            name = "drain-timeout-ms";
            ok = sd_cli_parse_i32(optarg, 0, 1 << 30, &p->drain_timeout_ms);
            break;
        case O_CURVE: p->curve_secret_file = optarg; break;
        case O_STATS_NAMES: p->stats_names = true; break;
        case O_CHAT: p->chat_template = optarg; break;
        case O_CKEYS: p->client_keys_file = optarg; break;
        case O_WKEYS: p->worker_keys_file = optarg; break;
        case O_INSECURE: p->insecure = true; break;
        case O_LOCAL_NGRAM: p->local_ngram = true; break;
        case O_VERIFY_RULE:
            name = "verify-rule";
            ok = sd_cli_parse_verify_rule(optarg, &p->verify_rule);
            break;
        case O_NGRAM_CACHE:
            name = "ngram-cache";
            ok = sd_cli_parse_i32(optarg, 0, 1 << 24, &p->local_ngram_cache);
            break;
        case 'v': *verbose = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "specd-coordinator: --%s: bad value '%s'\n", name, optarg);
            return 2;
        }
    }
    if (!p->model_path || optind < argc) {
        usage(stderr);
        return 2;
    }
    return usage_rules_ok(p) ? -1 : 2;
}

int main(int argc, char **argv) {
    sd_coord_params p = sd_coord_default_params();
    bool verbose = false;
    int rc = parse_args(argc, argv, &p, &verbose);
    if (rc >= 0) return rc;
    sd_net_log_init("coordinator", 0, verbose);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sd_coord_server *srv = NULL;
    if (sd_coord_server_new(&p, &srv) != SD_OK) return 1;
    sd_status st = sd_coord_server_run(srv, &g_stop);
    sd_coord_server_free(&srv);
    return st == SD_OK ? 0 : 1;
}
