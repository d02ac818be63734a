/* specd-drafter — a drafter process: proposes draft tokens for the
 * coordinator's DraftRequest batches (draft_serve.c) through the shared
 * worker loop (specd/worker.h).
 *
 * Three kinds, one flag each (a model is a GGUF file or a Hugging Face
 * checkpoint directory):
 *   --model DRAFT.gguf               a small model with the target's vocabulary
 *   --ngram (--model|--vocab-from TARGET.gguf)  prompt lookup; the target file
 *                                    is read for its metadata only (the
 *                                    vocabulary identity it registers with)
 *   --draft-layers L --model TARGET.gguf        the target's first L layers
 *   --eagle DIR --model TARGET.gguf  an EAGLE-3 head (published or
 *                                    speculators layout) fed the verifier's
 *                                    features of the committed positions
 *                                    through the coordinator (draft_head.c);
 *                                    the target file gives its embedding and
 *                                    shape (only its first layer is loaded)
 * The coordinator compares the registered vocabulary with the target's and
 * refuses another tokenizer (exit status 3); a draft whose embedding is
 * padded to other rows registers, and the Welcome's target size reaches the
 * draft server (on_welcome: sd_draft_server_pair_vocab). Slots hold up to --max-ctx tokens
 * (default: the model's context; for model drafters also capped so the KV
 * of --max-seqs slots stays within --kv-blocks or a quarter of the memory
 * available; the pools are touched only as far as they are used). A
 * sequence longer than its slot gets a per-sequence KV_FULL.
 * Exit status: 0 on SIGINT/SIGTERM, 2 for bad flags or files, 3 refused. */
#include "draft_serve.h"
#include "draft_head.h"
#include "specd/cli.h"

#include "specd/drafter.h"
#include "specd/eagle.h"
#include "specd/weights.h"
#include "specd/model.h"
#include "specd/backend_opts.h"
#include "specd/net.h"
#include "specd/curve.h"
#include "specd/worker.h"
#include "specd/worker_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

typedef struct drafter_opts {
    sd_worker_opts w; /* --coordinator, keys, --name, the serving limits, -v (specd/worker_opts.h) */
    const char *model_path;
    const char *vocab_from;
    const char *eagle;              /* --eagle DIR: an EAGLE-3 head */
    sd_eagle_weights eagle_weights; /* --eagle-weights q8_0|stored */
    bool ngram;
    bool unconstrained; /* --unconstrained: drafts ignore requests' constraints (the verifier still masks) */
    int32_t ngram_min, ngram_max;
    int32_t ngram_cache; /* entries of the n-gram cache shared across requests; 0 = none */
    int32_t draft_layers;
    int32_t draft_vocab; /* --draft-vocab (sd_drafter_params.draft_vocab); -1 = not given */
    int32_t top_n, max_ctx, index;
    int32_t device;          /* model drafters: -1 CPU, N cuda:N */
    sd_backend_opts backend; /* model drafters: --cpu-weights, --cuda-graphs, ... (specd/backend_opts.h) */
} drafter_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-drafter --coordinator ADDR (--model DRAFT | --ngram --model TARGET |\n"
            "                     --draft-layers L --model TARGET | --eagle DIR --model TARGET) [options]\n"
            "\n"
            "Proposes draft tokens for the coordinator's speculative decoding.\n"
            "\n"
            "      --coordinator ADDR  coordinator worker address (default tcp://127.0.0.1:7701)\n"
            "      --curve-secret FILE this drafter's CurveZMQ secret key (specd-keygen; mode 0600); its\n"
            "                          public key must be on the coordinator's --worker-keys list\n"
            "      --curve-server FILE the coordinator's public key (required with --curve-secret)\n"
            "  -m, --model PATH        draft model (GGUF file or Hugging Face checkpoint directory);\n"
            "                          with --ngram or --draft-layers: the target model\n"
            "      --ngram             n-gram (prompt lookup) drafter: no weights are loaded\n"
            "      --vocab-from PATH   with --ngram: the target whose vocabulary to register with\n"
            "      --ngram-min N       smallest n-gram that may match (default 1)\n"
            "      --ngram-max N       longest match measured, in tokens (default 16)\n"
            "      --ngram-cache N     n-grams of earlier outputs kept for all requests (default 65536;\n"
            "                          0: none, e.g. for benchmarks that repeat their prompts)\n"
            "      --draft-layers L    self-draft: the target's first L layers\n"
            "      --eagle DIR         an EAGLE-3 draft head (Hugging Face directory) for the target --model:\n"
            "                          the verifier sends it the target's features of the committed\n"
            "                          positions through the coordinator (3 x the hidden size f32 a position)\n"
            "      --eagle-weights W   the head's matrices: q8_0 (quantized at load, the default) or stored\n"
            "      --draft-vocab N     model drafters: draft among token ids < N only, computing only\n"
            "                          those rows of the LM head (exact at any N, at most the\n"
            "                          vocabulary's size; 0 = the whole vocabulary, the default;\n"
            "                          32768 measured best with SmolLM2's 49,152 ids)\n"
            "      --prefix-cache PCT  model drafters: share of the KV pool that cached prompt blocks no\n"
            "                          request holds may keep (default 50; 0: no prefix cache)\n"
            "  -t, --threads N         worker threads (default: all cores)\n"
            "      --device D          cpu (default), cuda or cuda:N: where a draft model runs\n"
            "      --max-seqs N        sequences held at once (default 64)\n"
            "      --kv-blocks N       model drafters: KV blocks of 16 tokens for all slots\n"
            "                          (default: max-seqs x context, capped at a quarter of memory)\n"
            "      --max-ctx N         tokens per sequence (default: see above)\n"
            "      --top-n N           entries kept of each proposal distribution (default %d)\n"
            "      --max-k N           tokens proposed per sequence (default 16, at most %d)\n"
            "      --max-batch N       sequences per draft batch (default 64, at most %d)\n"
            "      --unconstrained     draft without the requests' constraints (no forced drafts, no\n"
            "                          masking; the verifier still masks): to measure what they buy\n"
            "      --index N           drafter number in the logs (default 0)\n"
            "      --name NAME         name in the coordinator's logs (default host:pid)\n"
            "      --warmup N          before registering, run draft batches whose catch-up forwards reach N\n"
            "                          tokens (each size up to %d, then 24, 32, 48, ..), so a GPU drafter has\n"
            "                          its forwards recorded and its kernels loaded before the first request\n"
            "                          (default: max-batch x (max-draft + 1) for a model drafter on a GPU,\n"
            "                          else 0)\n"
            "  -v, --verbose           log at DEBUG level\n"
            "  -h, --help              this help\n"
            "\n" SD_BACKEND_OPTIONS_USAGE,
            SD_SPEC_DEFAULT_TOP_N, SD_MAX_K, SD_MAX_BATCH, SD_WARMUP_EXACT_TOKENS);
}

static bool parse_int(const char *flag, const char *s, int32_t lo, int32_t hi, int32_t *out) {
    return sd_worker_opts_int("specd-drafter", flag, s, lo, hi, out);
}

/* 0 = run, 1 = --help printed, 2 = bad flags. */
static int parse_args(int argc, char **argv, drafter_opts *o) {
    enum {
        O_NGRAM = 256,
        O_VOCAB,
        O_NMIN,
        O_NMAX,
        O_NCACHE,
        O_LAYERS,
        O_DVOCAB,
        O_CTX,
        O_TOPN,
        O_INDEX,
        O_DEVICE,
        O_UNCON,
        O_EAGLE,
        O_EAGLE_WEIGHTS,
    };
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},
        {"ngram", no_argument, 0, O_NGRAM},
        {"vocab-from", required_argument, 0, O_VOCAB},
        {"ngram-min", required_argument, 0, O_NMIN},
        {"ngram-max", required_argument, 0, O_NMAX},
        {"ngram-cache", required_argument, 0, O_NCACHE},
        {"draft-layers", required_argument, 0, O_LAYERS},
        {"draft-vocab", required_argument, 0, O_DVOCAB},
        {"max-ctx", required_argument, 0, O_CTX},
        {"top-n", required_argument, 0, O_TOPN},
        {"index", required_argument, 0, O_INDEX},
        {"device", required_argument, 0, O_DEVICE},
        {"unconstrained", no_argument, 0, O_UNCON},
        {"eagle", required_argument, 0, O_EAGLE},
        {"eagle-weights", required_argument, 0, O_EAGLE_WEIGHTS},
        {"help", no_argument, 0, 'h'},
        SD_WORKER_LONG_OPTIONS,
        SD_BACKEND_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "m:t:vh", longs, &li)) != -1) {
        bool ok = true;
        sd_worker_opt_result shared = sd_worker_opts_apply(&o->w, c, optarg, "specd-drafter");
        if (shared == SD_WORKER_OPT_BAD) return 2;
        if (shared == SD_WORKER_OPT_TAKEN) continue;
        switch (c) {
        case SD_BACKEND_OPTION: ok = sd_backend_opts_parse(&o->backend, longs[li].name, optarg, "specd-drafter"); break;
        case 'm': o->model_path = optarg; break;
        case O_NGRAM: o->ngram = true; break;
        case O_VOCAB: o->vocab_from = optarg; break;
        case O_UNCON: o->unconstrained = true; break;
        case O_EAGLE: o->eagle = optarg; break;
        case O_EAGLE_WEIGHTS:
            ok = sd_eagle_weights_parse(optarg, &o->eagle_weights);
            if (!ok) fprintf(stderr, "specd-drafter: --eagle-weights must be q8_0 or stored, got '%s'\n", optarg);
            break;
        case O_NMIN: ok = parse_int("--ngram-min", optarg, 1, 64, &o->ngram_min); break;
        case O_NMAX: ok = parse_int("--ngram-max", optarg, 1, 64, &o->ngram_max); break;
        case O_NCACHE: ok = parse_int("--ngram-cache", optarg, 0, 1 << 24, &o->ngram_cache); break;
        case O_LAYERS: ok = parse_int("--draft-layers", optarg, 1, 4096, &o->draft_layers); break;
        case O_DVOCAB: ok = parse_int("--draft-vocab", optarg, 0, 1 << 24, &o->draft_vocab); break;
        case O_CTX: ok = parse_int("--max-ctx", optarg, 1, 1 << 24, &o->max_ctx); break;
        case O_TOPN: ok = parse_int("--top-n", optarg, 1, SD_MAX_TOP_N, &o->top_n); break;
        case O_INDEX: ok = parse_int("--index", optarg, 0, 1 << 20, &o->index); break;
        case O_DEVICE:
            ok = sd_device_parse(optarg, &o->device) == SD_OK;
            if (!ok) fprintf(stderr, "specd-drafter: --device must be cpu, cuda or cuda:N, got '%s'\n", optarg);
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (!ok) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "specd-drafter: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if ((o->ngram ? 1 : 0) + (o->draft_layers > 0 ? 1 : 0) + (o->eagle ? 1 : 0) > 1) {
        fprintf(stderr, "specd-drafter: choose one of --ngram, --draft-layers and --eagle\n");
        return 2;
    }
    if (o->eagle && o->draft_vocab >= 0) {
        fprintf(stderr,
                "specd-drafter: --draft-vocab goes with a model drafter; a head has its own draft vocabulary\n");
        return 2;
    }
    if (o->ngram && o->draft_vocab >= 0) {
        fprintf(stderr, "specd-drafter: --draft-vocab goes with a model drafter (--model DRAFT or --draft-layers)\n");
        return 2;
    }
    if (o->ngram && !o->model_path && !o->vocab_from) {
        fprintf(stderr, "specd-drafter: --ngram needs the target's vocabulary: --model or --vocab-from TARGET\n");
        return 2;
    }
    if (!o->ngram && !o->model_path) {
        fprintf(stderr, "specd-drafter: --model PATH is required (see --help)\n");
        return 2;
    }
    if (o->vocab_from && !o->ngram) {
        fprintf(stderr, "specd-drafter: --vocab-from goes with --ngram\n");
        return 2;
    }
    if (o->ngram_max < o->ngram_min) {
        fprintf(stderr, "specd-drafter: --ngram-max %d is below --ngram-min %d\n", (int)o->ngram_max,
                (int)o->ngram_min);
        return 2;
    }
    return 0;
}

/* Tokens per slot for a model drafter: the context, capped by --kv-blocks or a quarter of memory. */
static int32_t model_slot_ctx(const drafter_opts *o, const sd_model_identity *id, const char *path) {
    int32_t ctx = o->max_ctx > 0 ? o->max_ctx : (int32_t)id->context_length;
    int64_t blocks = o->w.kv_blocks;
    if (blocks <= 0) {
        sd_weights *w = NULL;
        sd_model_config cfg;
        if (sd_weights_open(path, &w) != SD_OK) return ctx;
        bool have = sd_weights_config(w, &cfg) == SD_OK;
        sd_weights_close(&w);
        if (!have) return ctx;
        int32_t layers = o->draft_layers > 0 ? o->draft_layers : cfg.n_layers;
        int64_t block_bytes = (int64_t)layers * 2 * 16 * cfg.n_kv_heads * cfg.head_dim * 4;
        int64_t want = ((int64_t)id->context_length / 16 + 1) * o->w.max_seqs;
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        int64_t cap = pages > 0 && page > 0 ? (int64_t)pages * page / 4 / block_bytes : want;
        blocks = want < cap ? want : cap;
        if (o->max_ctx <= 0 && blocks / o->w.max_seqs * 16 < ctx) ctx = (int32_t)((blocks / o->w.max_seqs - 1) * 16);
        return ctx > 16 ? ctx : 16;
    }
    int64_t per_seq = (blocks / o->w.max_seqs - 1) * 16;
    if (per_seq < ctx) ctx = (int32_t)per_seq;
    return ctx > 16 ? ctx : 16;
}

typedef struct drafter_ctx {
    sd_draft_server *server;
    Specd__DraftResponse resp;
} drafter_ctx;

static sd_status on_request(void *user, const sd_net_worker_msg *req, Specd__WorkerToCoordinator *reply) {
    drafter_ctx *ctx = user;
    SD_TRY(sd_draft_server_handle(ctx->server, &req->draft, &ctx->resp));
    reply->body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
    reply->draft = &ctx->resp;
    return SD_OK;
}
static void on_release(void *user, const uint64_t *ids, size_t n) {
    sd_draft_server_release(((drafter_ctx *)user)->server, ids, n);
}
static void on_reset(void *user) { sd_draft_server_reset(((drafter_ctx *)user)->server); }
static void on_stats(void *user, Specd__WorkerStats *st) { sd_draft_server_stats(((drafter_ctx *)user)->server, st); }
static void on_welcome(void *user, int32_t target_n_vocab) {
    sd_draft_server_pair_vocab(((drafter_ctx *)user)->server, target_n_vocab);
}

/* --eagle: the target (its first layer: the head borrows its embedding and
 * reads its shape) into *target and the head over it; the layers it reads
 * and their width go to the Hello (wp, layers[SD_MAX_FEATURE_LAYERS]). */
static sd_status open_eagle(const drafter_opts *o, sd_drafter_params *dp, sd_worker_params *wp, uint32_t *layers,
                            sd_model **target, sd_drafter **drafter) {
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(o->model_path, &w);
    if (st != SD_OK) return st;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = o->w.n_threads;
    mp.n_layers_used = 1;
    mp.backend = o->backend;
    SD_INFO("loading the embedding of %s for the EAGLE head in %s", o->model_path, o->eagle);
    st = sd_model_load_weights(w, &mp, target);
    sd_weights_close(&w);
    if (st != SD_OK) return st;
    /* the head keeps features and K/V per slot position: a default context of at most 4096 */
    dp->max_ctx = o->max_ctx > 0                    ? o->max_ctx
                  : wp->model.context_length > 4096 ? 4096
                                                    : (int32_t)wp->model.context_length;
    dp->eagle_weights = (int32_t)o->eagle_weights;
    st = sd_drafter_eagle_open(o->eagle, *target, dp, drafter);
    if (st != SD_OK) return st;
    int32_t ids[SD_MODEL_CAPTURE_MAX];
    int32_t n = sd_drafter_eagle_layers(*drafter, ids);
    for (int32_t j = 0; j < n; j++) layers[j] = (uint32_t)ids[j];
    wp->drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    wp->feature_layers = layers;
    wp->n_feature_layers = (size_t)n;
    wp->limits.feature_width = n * sd_model_config_of(*target)->n_embd;
    SD_INFO("EAGLE head %s reads target layers %d, %d, %d: %d floats a position", o->eagle, (int)ids[0], (int)ids[1],
            (int)ids[2], (int)wp->limits.feature_width);
    return SD_OK;
}

/* The drafter of the kind the flags ask for, its slots' context in
 * dp->max_ctx and its kind in wp (registered with the coordinator): SD_OK
 * or the open's failure. */
static sd_status open_drafter(const drafter_opts *o, sd_drafter_params *dp, sd_worker_params *wp,
                              sd_drafter **drafter) {
    if (o->ngram) {
        dp->max_ctx = o->max_ctx > 0 ? o->max_ctx : (int32_t)wp->model.context_length;
        wp->drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
        wp->model.n_layers = 0;
        dp->top_n = 1;
        return sd_drafter_ngram_create(dp, drafter);
    }
    if (o->draft_layers > 0) {
        dp->max_ctx = model_slot_ctx(o, &wp->model, o->model_path);
        wp->drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_SELF;
        wp->model.n_layers = (uint32_t)o->draft_layers;
        SD_INFO("loading the first %d layers of %s", (int)o->draft_layers, o->model_path);
        return sd_drafter_self_open(o->model_path, o->draft_layers, dp, drafter);
    }
    dp->max_ctx = model_slot_ctx(o, &wp->model, o->model_path);
    wp->drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    SD_INFO("loading %s", o->model_path);
    /* The draft model registers with its own vocabulary; the coordinator compares it with the target's. */
    return sd_drafter_model_open(o->model_path, wp->model.vocab_hash, (int32_t)wp->model.vocab_size, dp, drafter);
}

/* The drafter's parameters from the flags (its backend switches borrowed
 * from o): false, said, for a --draft-vocab beyond the vocabulary or
 * --draft-layers beyond the model's layers. */
static bool drafter_params(const drafter_opts *o, const sd_worker_params *wp, const char *id_path,
                           sd_drafter_params *dp) {
    *dp = sd_drafter_default_params();
    dp->max_seqs = o->w.max_seqs;
    dp->top_n = o->top_n;
    dp->ngram_min = o->ngram_min;
    dp->ngram_max = o->ngram_max;
    dp->ngram_cache_entries = o->ngram_cache > 0 ? o->ngram_cache : -1;
    dp->n_threads = o->w.n_threads;
    dp->device = o->device;
    dp->backend = &o->backend;
    if (o->draft_vocab >= 0) dp->draft_vocab = o->draft_vocab;
    if (o->w.prefix_cache >= 0) dp->prefix_cache_pct = o->w.prefix_cache > 0 ? o->w.prefix_cache : -1;
    if (o->draft_vocab > 0 && (uint32_t)o->draft_vocab > wp->model.vocab_size) {
        SD_ERROR("--draft-vocab %d is more than the %u tokens of the vocabulary of %s", (int)o->draft_vocab,
                 wp->model.vocab_size, id_path);
        return false;
    }
    if (o->draft_layers > 0 && (uint32_t)o->draft_layers > wp->model.n_layers) {
        SD_ERROR("--draft-layers %d is more than the %u layers of %s", (int)o->draft_layers, wp->model.n_layers,
                 o->model_path);
        return false;
    }
    return true;
}

/* Warms the drafter up before the coordinator knows it (no request waits
 * on it): SD_OK or the failure (said). */
static sd_status warm_up(const drafter_opts *o, sd_draft_server *server) {
    const int32_t n_warm = o->w.warmup >= 0              ? o->w.warmup
                           : !o->ngram && o->device >= 0 ? o->w.max_batch * (o->w.max_k + 1)
                                                         : 0;
    sd_warmup_report wr;
    sd_status st = sd_draft_server_warmup(server, n_warm, &wr);
    if (st != SD_OK) {
        SD_ERROR("the warm-up failed after batches of up to %d tokens (%s): lower --max-batch or --max-k, or "
                 "pass --warmup with a smaller size (0: none)",
                 (int)wr.max_tokens, sd_status_str(st));
        return st;
    }
    if (wr.n_steps > 0)
        SD_INFO("warm-up: %d batch sizes up to %d tokens in %.0f ms", (int)wr.n_sizes, (int)wr.max_tokens,
                wr.seconds * 1e3);
    return SD_OK;
}

/* Registers with the coordinator and serves until stopped: the worker
 * loop's status, *why how it ended. */
static sd_status serve(const drafter_opts *o, sd_worker_params *wp, sd_draft_server *server, int stop_fd,
                       sd_worker_exit *why) {
    void *zctx = zmq_ctx_new();
    drafter_ctx ctx = {.server = server};
    wp->coordinator = o->w.coordinator;
    wp->role = SPECD__ROLE__ROLE_DRAFTER;
    wp->rank = 0;
    wp->group_size = 1;
    wp->name = o->w.name;
    int32_t feature_width = wp->limits.feature_width; /* open_eagle's */
    wp->limits = sd_draft_server_limits(server);
    wp->limits.feature_width = feature_width;
    /* Envelopes are validated against the model's context; a sequence longer
     * than a slot gets a per-sequence KV_FULL instead of failing the batch. */
    if (wp->model.context_length > (uint32_t)wp->limits.max_context)
        wp->limits.max_context = (int32_t)wp->model.context_length;
    wp->stop_fd = stop_fd;
    wp->handle = on_request;
    wp->release = on_release;
    wp->reset = on_reset;
    wp->stats = on_stats;
    wp->welcome = on_welcome;
    wp->user = &ctx;
    *why = SD_WORKER_STOPPED;
    sd_status st = zctx ? sd_worker_run(zctx, wp, why) : SD_ERR_NET;
    if (zctx) zmq_ctx_term(zctx);
    return st;
}

/* The target's tokenizer from the file the drafter registers with, for
 * structured output (draft_constrain.h); NULL (logged) when it has none:
 * constrained requests are then drafted unconstrained. */
static sd_tok *open_tokenizer(const char *path) {
    sd_weights *w = NULL;
    sd_tok *tok = NULL;
    if (sd_weights_open(path, &w) != SD_OK || sd_weights_tokenizer(w, &tok) != SD_OK)
        SD_WARN("no tokenizer in %s: constrained requests are drafted without their constraint", path);
    sd_weights_close(&w);
    return tok;
}

int main(int argc, char **argv) {
    drafter_opts o = {
        .w = {.coordinator = "tcp://127.0.0.1:7701",
              .max_seqs = 64,
              .max_k = 16,
              .min_max_k = 1,
              .max_batch = 64,
              .warmup = -1,
              .prefix_cache = -1},
        .ngram_min = 1,
        .ngram_max = 16,
        .ngram_cache = 65536,
        .top_n = SD_SPEC_DEFAULT_TOP_N,
        .device = -1,
        .backend = sd_backend_default_opts(),
        .draft_vocab = -1,
    };
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    sd_net_log_init("drafter", o.index, o.w.verbose);
    int stop_fd = -1;
    if (sd_worker_signal_fd(&stop_fd) != SD_OK) return 1;
    /* keys first: a missing key file is a start-up error, before any model loads */
    sd_curve_id curve;
    if ((o.w.curve_secret && !o.w.curve_server) ||
        sd_curve_id_load(o.w.curve_secret, o.w.curve_server, &curve) != SD_OK) {
        if (o.w.curve_secret && !o.w.curve_server)
            SD_ERROR("--curve-secret needs --curve-server (the coordinator's key)");
        close(stop_fd);
        return 2;
    }
    sd_worker_params wp = sd_worker_default_params();
    wp.curve = &curve;
    const char *id_path = o.ngram && o.vocab_from ? o.vocab_from : o.model_path;
    sd_drafter_params dp;
    if (sd_weights_identity(id_path, &wp.model) != SD_OK || !drafter_params(&o, &wp, id_path, &dp)) {
        close(stop_fd);
        return 2;
    }
    sd_drafter *drafter = NULL;
    sd_draft_server *server = NULL;
    sd_model *target = NULL; /* --eagle */
    uint32_t layers[SD_MAX_FEATURE_LAYERS];
    sd_draft_head head = {0};
    sd_tok *tok = o.unconstrained ? NULL : open_tokenizer(id_path);
    sd_status st = o.eagle ? open_eagle(&o, &dp, &wp, layers, &target, &drafter) : open_drafter(&o, &dp, &wp, &drafter);
    if (st == SD_OK) {
        sd_draft_server_params sp = sd_draft_server_default_params();
        sp.max_seqs = o.w.max_seqs;
        sp.max_ctx = dp.max_ctx;
        sp.max_batch = o.w.max_batch;
        sp.max_k = o.w.max_k;
        sp.n_vocab = (int32_t)wp.model.vocab_size;
        sp.top_n = dp.top_n;
        sp.tok = tok;
        if (o.eagle) {
            head.width = wp.limits.feature_width;
            sp.feature_width = head.width;
            sp.head_seq = sd_draft_head_seq;
            sp.head = &head;
        }
        st = sd_draft_server_create(drafter, &sp, &server);
    }
    if (st != SD_OK) {
        SD_ERROR("cannot start the drafter: %s", sd_status_str(st));
        sd_drafter_free(&drafter);
        sd_model_free(&target);
        sd_tok_free(&tok);
        close(stop_fd);
        return 2;
    }
    SD_INFO("%s drafter for %s (vocab %u): %d slots of %d tokens, top-n %d, max draft %d", sd_drafter_name(drafter),
            wp.model.name, wp.model.vocab_size, (int)o.w.max_seqs, (int)dp.max_ctx, (int)dp.top_n, (int)o.w.max_k);
    sd_worker_exit why = SD_WORKER_STOPPED;
    rc = 1;
    if (o.eagle && o.w.warmup > 0) SD_WARN("--warmup: a head drafter has no warm-up (its first steps pay it)");
    if (o.eagle || warm_up(&o, server) == SD_OK) {
        st = serve(&o, &wp, server, stop_fd, &why);
        rc = st != SD_OK ? 1 : why == SD_WORKER_REFUSED ? 3 : 0;
    }
    memset(&curve, 0, sizeof curve);
    sd_draft_server_free(&server);
    sd_draft_head_log(&head);
    sd_drafter_free(&drafter);
    sd_model_free(&target);
    sd_tok_free(&tok);
    close(stop_fd);
    if (rc == 0) SD_INFO("stopped");
    return rc;
}
