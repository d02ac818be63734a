/* specd-verifier — the verifier leader: loads the target model and answers
 * the coordinator's VerifyRequest batches (verify_serve.c) through the shared
 * worker loop (specd/worker.h: Hello/Welcome, heartbeats with KV stats,
 * reconnect with a cleared cache when the coordinator goes silent).
 *
 * Tensor parallelism comes in its own issue: --tp > 1 is refused here, but
 * the Hello already carries rank and group size. Exit status: 0 on
 * SIGINT/SIGTERM, 2 for bad flags or a model that cannot be loaded, 3 when
 * the coordinator refuses the registration. */
#include "verify_serve.h"

#include "specd/weights.h"
#include "specd/model.h"
#include "specd/net.h"
#include "specd/worker.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

typedef struct verifier_opts {
    const char *model_path;
    const char *coordinator;
    const char *name;
    int32_t n_threads;
    int32_t device; /* -1 CPU, N cuda:N */
    int32_t max_seqs, kv_blocks, block_size, max_batch, max_draft, tp, rank;
    bool verbose;
} verifier_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-verifier --model TARGET [options]\n"
            "\n"
            "Loads the target model and serves the coordinator's verify batches.\n"
            "\n"
            "  -m, --model PATH        target model: GGUF file or Hugging Face checkpoint directory (required)\n"
            "      --coordinator ADDR  coordinator worker address (default tcp://127.0.0.1:7701)\n"
            "  -t, --threads N         worker threads (default: all cores)\n"
            "      --device D          cpu (default), cuda or cuda:N: where the target runs\n"
            "      --max-seqs N        sequences cached at once (default 64)\n"
            "      --kv-blocks N       KV blocks (default: max-seqs x context/4 tokens, capped by memory)\n"
            "      --block-size N      tokens per KV block (default 16)\n"
            "      --max-batch N       sequences per verify batch (default 64, at most %d)\n"
            "      --max-draft N       draft tokens per sequence (default 16, at most %d)\n"
            "      --tp N              tensor-parallel group size (only 1 is supported yet)\n"
            "      --rank N            rank in the group (default 0)\n"
            "      --name NAME         name in the coordinator's logs (default host:pid)\n"
            "  -v, --verbose           log at DEBUG level\n"
            "  -h, --help              this help\n",
            SD_MAX_BATCH, SD_MAX_DRAFT);
}

static bool parse_int(const char *flag, const char *s, int32_t lo, int32_t hi, int32_t *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!s[0] || *end || v < lo || v > hi) {
        fprintf(stderr, "specd-verifier: %s must be an integer in [%d, %d], got '%s'\n", flag, (int)lo, (int)hi, s);
        return false;
    }
    *out = (int32_t)v;
    return true;
}

/* 0 = run, 1 = --help printed, 2 = bad flags. */
static int parse_args(int argc, char **argv, verifier_opts *o) {
    enum { O_COORD = 256, O_MAX_SEQS, O_KV_BLOCKS, O_BLOCK, O_MAX_BATCH, O_MAX_DRAFT, O_TP, O_RANK, O_NAME, O_DEVICE };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},      {"coordinator", required_argument, 0, O_COORD},
        {"threads", required_argument, 0, 't'},    {"max-seqs", required_argument, 0, O_MAX_SEQS},
        {"kv-blocks", required_argument, 0, O_KV_BLOCKS}, {"block-size", required_argument, 0, O_BLOCK},
        {"max-batch", required_argument, 0, O_MAX_BATCH}, {"max-draft", required_argument, 0, O_MAX_DRAFT},
        {"tp", required_argument, 0, O_TP},        {"rank", required_argument, 0, O_RANK},
        {"name", required_argument, 0, O_NAME},    {"verbose", no_argument, 0, 'v'},
        {"device", required_argument, 0, O_DEVICE},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "m:t:vh", longs, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case O_COORD: o->coordinator = optarg; break;
        case 't': ok = parse_int("--threads", optarg, 0, 1024, &o->n_threads); break;
        case O_MAX_SEQS: ok = parse_int("--max-seqs", optarg, 1, 65536, &o->max_seqs); break;
        case O_KV_BLOCKS: ok = parse_int("--kv-blocks", optarg, 1, 1 << 28, &o->kv_blocks); break;
        case O_BLOCK: ok = parse_int("--block-size", optarg, 1, 4096, &o->block_size); break;
        case O_MAX_BATCH: ok = parse_int("--max-batch", optarg, 1, SD_MAX_BATCH, &o->max_batch); break;
        case O_MAX_DRAFT: ok = parse_int("--max-draft", optarg, 0, SD_MAX_DRAFT, &o->max_draft); break;
        case O_TP: ok = parse_int("--tp", optarg, 1, 1024, &o->tp); break;
        case O_RANK: ok = parse_int("--rank", optarg, 0, 1023, &o->rank); break;
        case O_NAME: o->name = optarg; break;
        case O_DEVICE:
            ok = sd_device_parse(optarg, &o->device) == SD_OK;
            if (!ok) fprintf(stderr, "specd-verifier: --device must be cpu, cuda or cuda:N, got '%s'\n", optarg);
            break;
        case 'v': o->verbose = true; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (!ok) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "specd-verifier: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o->model_path) {
        fprintf(stderr, "specd-verifier: --model TARGET is required (see --help)\n");
        return 2;
    }
    if (o->tp != 1 || o->rank != 0) {
        fprintf(stderr, "specd-verifier: --tp %d / --rank %d: tensor parallelism is not yet supported (only --tp 1 "
                "--rank 0)\n", (int)o->tp, (int)o->rank);
        return 2;
    }
    return 0;
}

/* Worker-loop callbacks over the verifier; the response lives here until the next request. */
typedef struct verifier_ctx {
    sd_verifier *v;
    Specd__VerifyResponse resp;
} verifier_ctx;

static sd_status on_request(void *user, const Specd__CoordinatorToWorker *req, Specd__WorkerToCoordinator *reply) {
    verifier_ctx *ctx = user;
    SD_TRY(sd_verifier_handle(ctx->v, req->verify, &ctx->resp));
    reply->body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    reply->verify = &ctx->resp;
    return SD_OK;
}
static void on_release(void *user, const uint64_t *ids, size_t n) { sd_verifier_release(((verifier_ctx *)user)->v, ids, n); }
static void on_reset(void *user) { sd_verifier_reset(((verifier_ctx *)user)->v); }
static void on_stats(void *user, Specd__WorkerStats *st) { sd_verifier_stats(((verifier_ctx *)user)->v, st); }

int main(int argc, char **argv) {
    verifier_opts o = {
        .coordinator = "tcp://127.0.0.1:7701", .max_seqs = 64, .block_size = 16, .max_batch = 64,
        .max_draft = 16, .tp = 1, .rank = 0, .device = -1,
    };
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    sd_net_log_init("verifier", o.rank, o.verbose);
    int stop_fd = -1;
    if (sd_worker_signal_fd(&stop_fd) != SD_OK) return 1;

    sd_worker_params wp = sd_worker_default_params();
    if (sd_worker_identity_from_model(o.model_path, &wp.model) != SD_OK) {
        close(stop_fd);
        return 2;
    }
    sd_weights *w = NULL;
    sd_model *model = NULL;
    sd_verifier *v = NULL;
    void *zctx = NULL;
    sd_status st = sd_weights_open(o.model_path, &w);
    if (st == SD_OK) {
        sd_model_params mp = sd_model_default_params();
        mp.n_threads = o.n_threads;
        mp.device = o.device;
        SD_INFO("loading %s on %s", o.model_path, o.device < 0 ? "the CPU" : "a CUDA GPU");
        st = sd_model_load_weights(w, &mp, &model);
        sd_weights_close(&w);
    } else {
        SD_ERROR("cannot open %s: %s", o.model_path, sd_status_str(st));
    }
    if (st == SD_OK) {
        sd_verifier_params vp = sd_verifier_default_params();
        vp.max_seqs = o.max_seqs;
        vp.block_size = o.block_size;
        vp.max_batch = o.max_batch;
        vp.max_draft = o.max_draft;
        vp.kv_blocks = o.kv_blocks > 0 ? o.kv_blocks
                                       : sd_verifier_default_kv_blocks(sd_model_config_of(model), o.max_seqs,
                                                                       o.block_size, 0);
        st = sd_verifier_create(model, &vp, &v);
        if (st == SD_OK)
            SD_INFO("model %s: %u layers, vocab %u, context %u; KV %d blocks of %d tokens, %d slots",
                    wp.model.name, wp.model.n_layers, wp.model.vocab_size, wp.model.context_length, (int)vp.kv_blocks,
                    (int)vp.block_size, (int)vp.max_seqs);
    }
    if (st != SD_OK) {
        SD_ERROR("cannot start the verifier: %s", sd_status_str(st));
        sd_model_free(&model);
        close(stop_fd);
        return 2;
    }

    zctx = zmq_ctx_new();
    wp.coordinator = o.coordinator;
    wp.role = SPECD__ROLE__ROLE_VERIFIER;
    wp.rank = (uint32_t)o.rank;
    wp.group_size = (uint32_t)o.tp;
    wp.name = o.name;
    wp.limits = sd_verifier_limits(v);
    wp.stop_fd = stop_fd;
    wp.handle = on_request;
    wp.release = on_release;
    wp.reset = on_reset;
    wp.stats = on_stats;
    verifier_ctx ctx = {.v = v};
    wp.user = &ctx;
    sd_worker_exit why = SD_WORKER_STOPPED;
    st = zctx ? sd_worker_run(zctx, &wp, &why) : SD_ERR_NET;

    if (zctx) zmq_ctx_term(zctx);
    sd_verifier_free(&v);
    sd_model_free(&model);
    close(stop_fd);
    if (st != SD_OK) return 1;
    if (why == SD_WORKER_REFUSED) return 3;
    SD_INFO("stopped");
    return 0;
}
