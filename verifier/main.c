/* specd-verifier — one rank of the verifier group. Rank 0 (the leader, the
 * only one with --tp 1) loads the target model and answers the
 * coordinator's VerifyRequest batches (verify_serve.c) through the shared
 * worker loop (specd/worker.h: Hello/Welcome, heartbeats with KV stats,
 * reconnect with a cleared cache when the coordinator goes silent).
 *
 * With --tp N every rank loads only its shard (engine/model.c) and the
 * group forms over its own socket (--group ADDR; group.c): the leader binds
 * it, registers with the coordinator only once ranks 1..N-1 have joined and
 * set up the collectives, and sends every forward's plan to them; ranks run
 * the plans until the group ends. A group that loses a rank is not
 * repaired: the leader tells the coordinator it is unavailable and exits 4,
 * and so do the ranks, for the launcher to restart the whole group.
 *
 * Exit status: 0 on SIGINT/SIGTERM (or a clean stop of the group), 1 on an
 * internal error, 2 for bad flags or a model that cannot be loaded (a TP
 * size that does not divide the heads included), 3 when the coordinator
 * refuses the registration (its model, role or key) or the leader refuses a
 * rank (its shard or key), 4 when the group
 * went down. */
#include "group.h"
#include "specd/cli.h"
#include "specd/eagle.h"
#include "verify_serve.h"

#include "specd/weights.h"
#include "specd/model.h"
#include "specd/backend_opts.h"
#include "specd/net.h"
#include "specd/worker.h"
#include "specd/worker_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

typedef struct verifier_opts {
    sd_worker_opts w; /* --coordinator, keys, --name, the serving limits, -v (specd/worker_opts.h) */
    const char *model_path;
    int32_t device; /* -1 CPU, N cuda:N */
    sd_dtype kv_type;
    int32_t block_size, tp, rank;
    int32_t group_id;      /* --group-id N, 0 = not named */
    const char *group;     /* --group ADDR */
    const char *rank_keys; /* key file */
    bool insecure;
    int32_t lm_head; /* sd_tp_lm_head */
    int32_t coll_timeout_ms, group_heartbeat_ms, join_timeout_s;
    bool kv_prefault;               /* --kv-prefault */
    const char *eagle;              /* --eagle DIR: an EAGLE-3 head drafting in this process */
    sd_eagle_weights eagle_weights; /* --eagle-weights q8_0|stored */
    sd_backend_opts backend;        /* --cpu-weights, --cuda-graphs, ... (specd/backend_opts.h) */
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
            "      --kv-type T         KV cache values: f32 (default) or f16 (half the memory; CPU)\n"
            "      --max-seqs N        sequences cached at once (default 64)\n"
            "      --kv-blocks N       KV blocks (default: max-seqs x context/4 tokens, capped by memory)\n"
            "      --block-size N      tokens per KV block (default 16)\n"
            "      --prefix-cache PCT  share of the KV pool that cached prompt blocks no request holds may\n"
            "                          keep (default 50; 0: no prefix cache); evicted first when a request\n"
            "                          needs blocks\n"
            "      --kv-prefault       touch the whole KV pool at start-up, so that no request pays for its\n"
            "                          memory's first use (a page fault every 4 KiB; slow in a VM): the pool\n"
            "                          is resident from the start (default: touched as blocks are first used)\n"
            "      --max-batch N       sequences per verify batch (default 64, at most %d)\n"
            "      --max-k N           draft tokens per sequence (default 16, at most %d)\n"
            "      --eagle DIR         an EAGLE-3 draft head (Hugging Face directory: published or speculators\n"
            "                          layout) that drafts in this process after each verify step, from the\n"
            "                          target's hidden states: the coordinator uses it as a drafter of kind\n"
            "                          eagle for this group's requests (no drafter round trip). With the\n"
            "                          prefix cache, cached blocks keep their rows' features for the head.\n"
            "                          With --tp N it goes to the leader (rank 0) alone, which holds the\n"
            "                          whole residual stream after each layer's all-reduce\n"
            "      --eagle-weights W   the head's matrices: q8_0 (quantized at load, the default) or stored\n"
            "      --tp N              tensor-parallel group size (default 1); it must divide the attention\n"
            "                          heads and the MLP width, and divide or be a multiple of the KV heads\n"
            "      --rank N            rank in the group (default 0: the leader, which talks to the coordinator)\n"
            "      --group ADDR        the group's own socket (required with --tp > 1): the leader binds it,\n"
            "                          ranks 1..N-1 connect to it (e.g. tcp://127.0.0.1:7702)\n"
            "      --group-id N        the verifier group's id (1..65535), unique among the groups of one\n"
            "                          coordinator; every rank gets the leader's (a rank started for another\n"
            "                          group is refused); default: the coordinator numbers the group\n"
            "      --lm-head MODE      split (default: each rank holds vocab/N rows, the leader gathers the\n"
            "                          logits) or leader (the whole head on the leader); the same on every rank\n"
            "      --coll-timeout-ms N bound on every collective wait (default 10000)\n"
            "      --group-heartbeat-ms N  group heartbeat interval; a rank or leader silent for 10 of them\n"
            "                          is dead or hung (default %d)\n"
            "      --join-timeout S    how long the group waits for its ranks to join (default 600)\n"
            "      --warmup N          before registering, run verification steps of up to N tokens: each size\n"
            "                          up to %d three times (a GPU verifier records them as CUDA graphs), then\n"
            "                          24, 32, 48, .. twice, so the first requests do not pay for first\n"
            "                          sightings; their times seed the coordinator's cost model (default on a\n"
            "                          GPU: the largest step, max-batch x (max-draft + 1); on the CPU two timed\n"
            "                          steps of 1, 2, 4, 8 and 16 tokens, the faster kept, for the cost model\n"
            "                          only; 0: none)\n"
            "      --curve-secret FILE this process's CurveZMQ secret key (specd-keygen; mode 0600); the\n"
            "                          leader's public key must be on the coordinator's --worker-keys list,\n"
            "                          a rank's on the leader's --rank-keys list\n"
            "      --curve-server FILE the public key of the server this process connects to: the\n"
            "                          coordinator's (the leader) or the leader's (ranks 1..N-1)\n"
            "      --rank-keys FILE    leader with --tp > 1 and keys: allow-list of the ranks' public keys\n"
            "      --insecure          leader: allow a non-loopback --group, or GPU ranks (the NCCL id), without\n"
            "                          keys (trusted networks only)\n"
            "      --name NAME         name in the coordinator's logs (default host:pid)\n"
            "  -v, --verbose           log at DEBUG level\n"
            "  -h, --help              this help\n"
            "\n" SD_BACKEND_OPTIONS_USAGE,
            SD_MAX_BATCH, SD_MAX_K, SD_GROUP_HEARTBEAT_MS, SD_WARMUP_EXACT_TOKENS);
}

static bool parse_int(const char *flag, const char *s, int32_t lo, int32_t hi, int32_t *out) {
    return sd_worker_opts_int("specd-verifier", flag, s, lo, hi, out);
}

/* The long options' codes past the short ones. */
enum {
    O_BLOCK = 256,
    O_TP,
    O_RANK,
    O_DEVICE,
    O_GROUP,
    O_GROUP_ID,
    O_LM_HEAD,
    O_COLL_TIMEOUT,
    O_GROUP_HB,
    O_JOIN_TIMEOUT,
    O_EAGLE,
    O_EAGLE_WEIGHTS,
    O_KV_TYPE,
    O_RANK_KEYS,
    O_INSECURE,
    O_KV_PREFAULT
};
static const struct option verifier_longs[] = {
    {"model", required_argument, 0, 'm'},
    {"rank-keys", required_argument, 0, O_RANK_KEYS},
    {"insecure", no_argument, 0, O_INSECURE},
    {"block-size", required_argument, 0, O_BLOCK},
    {"tp", required_argument, 0, O_TP},
    {"rank", required_argument, 0, O_RANK},
    {"device", required_argument, 0, O_DEVICE},
    {"kv-type", required_argument, 0, O_KV_TYPE},
    {"group", required_argument, 0, O_GROUP},
    {"group-id", required_argument, 0, O_GROUP_ID},
    {"lm-head", required_argument, 0, O_LM_HEAD},
    {"coll-timeout-ms", required_argument, 0, O_COLL_TIMEOUT},
    {"group-heartbeat-ms", required_argument, 0, O_GROUP_HB},
    {"join-timeout", required_argument, 0, O_JOIN_TIMEOUT},
    {"eagle", required_argument, 0, O_EAGLE},
    {"eagle-weights", required_argument, 0, O_EAGLE_WEIGHTS},
    {"kv-prefault", no_argument, 0, O_KV_PREFAULT},
    {"help", no_argument, 0, 'h'},
    SD_WORKER_LONG_OPTIONS,
    SD_BACKEND_LONG_OPTIONS,
    {0, 0, 0, 0},
};

/* Applies one option (name: its long name, arg: its value, NULL for a
 * flag): false, said on stderr, for a bad value or an unknown option. */
static bool apply_option(int c, const char *name, const char *arg, verifier_opts *o) {
    sd_worker_opt_result shared = sd_worker_opts_apply(&o->w, c, arg, "specd-verifier");
    if (shared != SD_WORKER_OPT_OTHER) return shared == SD_WORKER_OPT_TAKEN;
    bool ok = true;
    switch (c) {
    case SD_BACKEND_OPTION: ok = sd_backend_opts_parse(&o->backend, name, arg, "specd-verifier"); break;
    case 'm': o->model_path = arg; break;
    case O_BLOCK: ok = parse_int("--block-size", arg, 1, 4096, &o->block_size); break;
    case O_TP: ok = parse_int("--tp", arg, 1, SD_MAX_GROUP_SIZE, &o->tp); break;
    case O_RANK: ok = parse_int("--rank", arg, 0, SD_MAX_GROUP_SIZE - 1, &o->rank); break;
    case O_GROUP: o->group = arg; break;
    case O_GROUP_ID: ok = parse_int("--group-id", arg, 1, SD_MAX_GROUP_ID, &o->group_id); break;
    case O_LM_HEAD:
        ok = !strcmp(arg, "split") || !strcmp(arg, "leader");
        if (!ok) fprintf(stderr, "specd-verifier: --lm-head must be split or leader, got '%s'\n", arg);
        o->lm_head = !strcmp(arg, "leader") ? SD_TP_LM_HEAD_LEADER : SD_TP_LM_HEAD_SPLIT;
        break;
    case O_COLL_TIMEOUT: ok = parse_int("--coll-timeout-ms", arg, 1, 3600000, &o->coll_timeout_ms); break;
    case O_GROUP_HB: ok = parse_int("--group-heartbeat-ms", arg, 1, 60000, &o->group_heartbeat_ms); break;
    case O_JOIN_TIMEOUT: ok = parse_int("--join-timeout", arg, 1, 86400, &o->join_timeout_s); break;
    case O_EAGLE: o->eagle = arg; break;
    case O_EAGLE_WEIGHTS:
        ok = sd_eagle_weights_parse(arg, &o->eagle_weights);
        if (!ok) fprintf(stderr, "specd-verifier: --eagle-weights must be q8_0 or stored, got '%s'\n", arg);
        break;
    case O_KV_PREFAULT: o->kv_prefault = true; break;
    case O_RANK_KEYS: o->rank_keys = arg; break;
    case O_INSECURE: o->insecure = true; break;
    case O_DEVICE:
        ok = sd_device_parse(arg, &o->device) == SD_OK;
        if (!ok) fprintf(stderr, "specd-verifier: --device must be cpu, cuda or cuda:N, got '%s'\n", arg);
        break;
    case O_KV_TYPE:
        ok = sd_kv_type_parse(arg, &o->kv_type);
        if (!ok) fprintf(stderr, "specd-verifier: --kv-type must be f32 or f16, got '%s'\n", arg);
        break;
    default: usage(stderr); return false;
    }
    return ok;
}

/* The rules between flags: 0, or 2 with the reason on stderr. */
static int check_opts(const verifier_opts *o) {
    if (!o->model_path) {
        fprintf(stderr, "specd-verifier: --model TARGET is required (see --help)\n");
        return 2;
    }
    if (o->rank >= o->tp) {
        fprintf(stderr, "specd-verifier: --rank %d must be below --tp %d\n", (int)o->rank, (int)o->tp);
        return 2;
    }
    if (!o->w.curve_secret != !o->w.curve_server) {
        fprintf(stderr, "specd-verifier: --curve-secret and --curve-server go together (see --help)\n");
        return 2;
    }
    if (o->rank_keys && (o->rank != 0 || o->tp < 2 || !o->w.curve_secret)) {
        fprintf(stderr, "specd-verifier: --rank-keys is for the leader of a --tp group with --curve-secret\n");
        return 2;
    }
    if (o->w.curve_secret && o->tp > 1 && o->rank == 0 && !o->rank_keys) {
        fprintf(stderr, "specd-verifier: a keyed leader of a --tp group needs --rank-keys (the ranks' keys)\n");
        return 2;
    }
    if (o->eagle && o->rank > 0) {
        fprintf(stderr,
                "specd-verifier: --eagle goes to the group's leader (--rank 0) only: it captures the whole "
                "hidden states and drafts; rank %d holds no head\n",
                (int)o->rank);
        return 2;
    }
    if (o->tp > 1 && !o->group) {
        fprintf(stderr, "specd-verifier: --tp %d needs --group ADDR (the group's own socket; see --help)\n",
                (int)o->tp);
        return 2;
    }
    return 0;
}

/* 0 = run, 1 = --help printed, 2 = bad flags. */
static int parse_args(int argc, char **argv, verifier_opts *o) {
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "m:t:vh", verifier_longs, &li)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (!apply_option(c, verifier_longs[li].name, optarg, o)) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "specd-verifier: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return check_opts(o);
}

/* Worker-loop callbacks over the verifier; the response lives here until the next request. */
typedef struct verifier_ctx {
    sd_verifier *v;
    sd_group *group; /* NULL without TP */
    Specd__VerifyResponse resp;
} verifier_ctx;

static sd_status on_request(void *user, const sd_net_worker_msg *req, Specd__WorkerToCoordinator *reply) {
    verifier_ctx *ctx = user;
    sd_status st = sd_verifier_handle(ctx->v, &req->verify, &ctx->resp);
    if (st != SD_OK && ctx->group) {
        /* the ranks ran (part of) this forward: the group is out of step */
        char why[160];
        snprintf(why, sizeof why, "a forward failed on the leader (%s)", sd_status_str(st));
        sd_group_fail(ctx->group, why);
    }
    SD_TRY(st);
    reply->body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    reply->verify = &ctx->resp;
    return SD_OK;
}
static void on_release(void *user, const uint64_t *ids, size_t n) {
    sd_verifier_release(((verifier_ctx *)user)->v, ids, n);
}
static void on_reset(void *user) { sd_verifier_reset(((verifier_ctx *)user)->v); }
static void on_stats(void *user, Specd__WorkerStats *st) { sd_verifier_stats(((verifier_ctx *)user)->v, st); }
static const char *on_fail_reason(void *user) {
    verifier_ctx *ctx = user;
    static const char none[] = "";
    return ctx->group ? sd_group_down_reason(ctx->group) : none;
}

/* Group parameters shared by the leader and the ranks. */
static sd_group_params group_params(const verifier_opts *o, const sd_model_identity *id, const sd_model *m, int stop_fd,
                                    const sd_curve_id *curve, const sd_curve_allow *rank_keys) {
    sd_group_params gp = sd_group_default_params();
    sd_model_shard sh;
    sd_model_shard_of(m, &sh);
    gp.addr = o->group;
    gp.rank = o->rank;
    gp.size = o->tp;
    gp.group_id = (uint32_t)o->group_id;
    gp.device = o->device;
    gp.model = *id;
    gp.lm_head = (int32_t)sh.lm_head;
    gp.weight_bytes = sd_model_resident_bytes(m);
    if (o->group_heartbeat_ms > 0) gp.heartbeat_interval_ms = o->group_heartbeat_ms;
    if (o->coll_timeout_ms > 0) gp.coll_timeout_ms = o->coll_timeout_ms;
    if (o->join_timeout_s > 0) gp.join_timeout_ms = o->join_timeout_s * 1000;
    gp.stop_fd = stop_fd;
    gp.insecure = o->insecure;
    gp.curve = curve;
    gp.rank_keys = rank_keys;
    return gp;
}

/* Ranks 1..N-1: join the group and run the leader's plans until it ends. */
static int run_rank(const verifier_opts *o, const sd_model_identity *id, sd_model *model, int stop_fd,
                    const sd_curve_id *curve) {
    void *zctx = zmq_ctx_new();
    if (!zctx) return 1;
    sd_group_params gp = group_params(o, id, model, stop_fd, curve, NULL);
    sd_group_exit why = SD_GROUP_DOWN;
    sd_status st = sd_group_rank_run(zctx, &gp, model, &why);
    zmq_ctx_term(zctx);
    if (st != SD_OK) {
        SD_ERROR("rank %d could not serve the group: %s", (int)o->rank, sd_status_str(st));
        return 1;
    }
    SD_INFO("stopped (%s)", why == SD_GROUP_STOPPED ? "clean" : why == SD_GROUP_REFUSED ? "refused" : "group down");
    return (int)why;
}

/* Opens the model and loads this rank's part of it: *model, or an error
 * (logged). */
static sd_status load_model(const verifier_opts *o, sd_model **model) {
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(o->model_path, &w);
    if (st != SD_OK) {
        SD_ERROR("cannot open %s: %s", o->model_path, sd_status_str(st));
        return st;
    }
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = o->w.n_threads;
    mp.device = o->device;
    mp.backend = o->backend;
    mp.kv_type = o->kv_type;
    mp.tp_rank = o->rank;
    mp.tp_size = o->tp;
    mp.tp_lm_head = (sd_tp_lm_head)o->lm_head;
    if (o->tp > 1)
        SD_INFO("loading shard %d of %d of %s on %s", (int)o->rank, (int)o->tp, o->model_path,
                o->device < 0 ? "the CPU" : "a CUDA GPU");
    else
        SD_INFO("loading %s on %s", o->model_path, o->device < 0 ? "the CPU" : "a CUDA GPU");
    st = sd_model_load_weights(w, &mp, model);
    sd_weights_close(&w); /* the shard is copied out: the mapping goes */
    return st;
}

/* The leader's verifier over model, its parameters in *vp (logged); *tok
 * the tokenizer it borrows (NULL without one), freed by the caller after
 * the verifier. */
static sd_status create_verifier(const verifier_opts *o, sd_model *model, const sd_model_identity *id,
                                 sd_verifier_params *vp, sd_verifier **v, sd_tok **tok_out) {
    *vp = sd_verifier_default_params();
    vp->max_seqs = o->w.max_seqs;
    vp->block_size = o->block_size;
    vp->max_batch = o->w.max_batch;
    vp->max_k = o->w.max_k;
    vp->prefix_cache_pct = o->w.prefix_cache;
    vp->eagle_dir = o->eagle;
    vp->eagle_weights = (int32_t)o->eagle_weights;
    vp->kv_prefault = o->kv_prefault;
    vp->kv_blocks = o->w.kv_blocks > 0
                        ? o->w.kv_blocks
                        : sd_verifier_default_kv_blocks(sd_model_config_of(model), o->w.max_seqs, o->block_size, 0);
    /* the tokenizer's byte strings, for structured output: without them
     * the verifier serves every request but constrained ones */
    sd_weights *w = NULL;
    sd_tok *tok = NULL;
    if (sd_weights_open(o->model_path, &w) != SD_OK || sd_weights_tokenizer(w, &tok) != SD_OK)
        SD_WARN("no tokenizer in %s: constrained requests will be refused", o->model_path);
    sd_weights_close(&w);
    vp->tok = tok;
    sd_status st = sd_verifier_create(model, vp, v);
    vp->tok = NULL;
    *tok_out = tok; /* the verifier borrows it until it is freed */
    if (st == SD_OK)
        SD_INFO("model %s: %u layers, vocab %u, context %u; KV %d blocks of %d tokens, %d slots", id->name,
                id->n_layers, id->vocab_size, id->context_length, (int)vp->kv_blocks, (int)vp->block_size,
                (int)vp->max_seqs);
    return st;
}

/* --tp > 1: forms the group (the coordinator sees the leader only once
 * every rank is there) and wires the model's collectives and plans to it
 * and its failure to the worker loop. On failure *exit_code is set. */
static sd_status form_group(const verifier_opts *o, void *zctx, sd_model *model, const sd_verifier_params *vp,
                            const sd_curve_id *curve, const sd_curve_allow *rank_keys, sd_worker_params *wp,
                            verifier_ctx *ctx, int *exit_code) {
    sd_group_params gp = group_params(o, &wp->model, model, wp->stop_fd, curve, rank_keys);
    gp.kv_blocks = vp->kv_blocks;
    gp.block_size = vp->block_size;
    gp.window_blocks = sd_model_kv_window_blocks(model, vp->max_seqs, vp->kv_blocks, vp->block_size);
    sd_status st = sd_group_leader_start(zctx, &gp, &ctx->group);
    if (st == SD_OK) st = sd_model_set_coll(model, sd_group_coll(ctx->group));
    if (st == SD_OK) {
        sd_model_set_plan_sink(model, sd_group_plan, ctx->group);
        wp->fail_fd = sd_group_down_fd(ctx->group);
        wp->fail_reason = on_fail_reason;
    } else {
        *exit_code = st == SD_ERR_ABORTED ? 0 : st == SD_ERR_INVALID_ARG ? 3 : 4;
        SD_ERROR("the group could not be formed: %s", sd_status_str(st));
    }
    return st;
}

/* Before the coordinator knows us (no request waits on it): the warm-up
 * steps, their steady times into costs[*n_costs] (sent in every Hello).
 * On failure *exit_code is 1. */
static sd_status warm_up(const verifier_opts *o, sd_verifier *v, sd_step_cost costs[SD_WARMUP_MAX_SIZES],
                         size_t *n_costs, int *exit_code) {
    sd_warmup_report wr;
    memset(&wr, 0, sizeof wr);
    const bool cpu_default = o->w.warmup < 0 && o->device < 0;
    const int32_t n_warm = o->w.warmup >= 0 ? o->w.warmup : cpu_default ? 16 : o->w.max_batch * (o->w.max_k + 1);
    sd_status st = sd_verifier_warmup(v, cpu_default ? SD_WARMUP_TIMES : SD_WARMUP_FULL, n_warm, &wr);
    for (int32_t i = 0; st == SD_OK && i < wr.n_sizes; i++) {
        const double us = wr.steady_s[i] * 1e6;
        costs[(*n_costs)++] = (sd_step_cost){(uint32_t)wr.tokens[i], us < 1.0   ? 1u
                                                                     : us > 4e9 ? 4000000000u
                                                                                : (uint32_t)us};
    }
    if (st == SD_OK && wr.n_steps > 0 && wr.first_max_at > 0)
        SD_INFO("warm-up: %d step sizes up to %d tokens in %.0f ms (slowest first sighting: %.1f ms at %d tokens)",
                (int)wr.n_sizes, (int)wr.max_tokens, wr.seconds * 1e3, wr.first_s_max * 1e3, (int)wr.first_max_at);
    else if (st == SD_OK && wr.n_steps > 0)
        SD_INFO("warm-up: step times of %d sizes up to %d tokens measured in %.0f ms", (int)wr.n_sizes,
                (int)wr.max_tokens, wr.seconds * 1e3);
    if (st != SD_OK) {
        /* a forward that fails here would fail a request later: say so now */
        SD_ERROR("the warm-up failed after steps of up to %d tokens (%s): a step that large cannot run here; "
                 "lower --max-batch or --max-k, or pass --warmup with a smaller size (0: none)",
                 (int)wr.max_tokens, sd_status_str(st));
        *exit_code = 1;
    }
    return st;
}

/* Registers with the coordinator and serves it until stopped: the exit
 * status (0 stopped, 1 error, 3 refused, 4 group down). */
static int serve(const verifier_opts *o, void *zctx, sd_worker_params *wp, sd_verifier *v, verifier_ctx *ctx,
                 const sd_step_cost *costs, size_t n_costs) {
    wp->coordinator = o->w.coordinator;
    wp->role = SPECD__ROLE__ROLE_VERIFIER;
    wp->rank = (uint32_t)o->rank;
    wp->group_size = (uint32_t)o->tp;
    wp->group_id = (uint32_t)o->group_id;
    /* a head drafts here: the coordinator makes it a drafter of kind eagle */
    if (o->eagle) wp->drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    wp->name = o->w.name;
    wp->limits = sd_verifier_limits(v);
    wp->step_costs = costs;
    wp->n_step_costs = n_costs;
    wp->handle = on_request;
    wp->release = on_release;
    wp->reset = on_reset;
    wp->stats = on_stats;
    wp->user = ctx;
    sd_worker_exit why = SD_WORKER_STOPPED;
    sd_status st = sd_worker_run(zctx, wp, &why);
    return st != SD_OK ? 1 : why == SD_WORKER_REFUSED ? 3 : why == SD_WORKER_FAILED ? 4 : 0;
}

/* The leader (rank 0) from its loaded model on: the verifier, the group
 * with --tp > 1, the warm-up, then the coordinator's requests until
 * stopped. Frees model. The exit status. */
static int run_leader(const verifier_opts *o, sd_worker_params *wp, sd_model *model, sd_curve_id *curve,
                      sd_curve_allow *rank_keys) {
    sd_verifier *v = NULL;
    sd_verifier_params vp;
    sd_tok *tok = NULL;
    sd_status st = create_verifier(o, model, &wp->model, &vp, &v, &tok);
    if (st != SD_OK) {
        SD_ERROR("cannot start the verifier: %s", sd_status_str(st));
        sd_tok_free(&tok);
        sd_model_free(&model);
        return 2;
    }
    void *zctx = zmq_ctx_new();
    verifier_ctx ctx = {.v = v};
    int exit_code = 0;
    if (!zctx)
        st = SD_ERR_NET;
    else if (o->tp > 1)
        st = form_group(o, zctx, model, &vp, curve, o->rank_keys ? rank_keys : NULL, wp, &ctx, &exit_code);
    sd_step_cost costs[SD_WARMUP_MAX_SIZES]; /* the warm-up's step times, sent in every Hello */
    size_t n_costs = 0;
    if (st == SD_OK) st = warm_up(o, v, costs, &n_costs, &exit_code);
    if (st == SD_OK)
        exit_code = serve(o, zctx, wp, v, &ctx, costs, n_costs);
    else if (!exit_code)
        exit_code = st == SD_ERR_ABORTED ? 0 : 1;
    sd_model_set_plan_sink(model, NULL, NULL);
    sd_model_set_coll(model, NULL);
    sd_group_close(&ctx.group);
    if (zctx) zmq_ctx_term(zctx);
    sd_verifier_free(&v);
    sd_tok_free(&tok);
    sd_model_free(&model);
    SD_INFO("stopped (exit %d)", exit_code);
    return exit_code;
}

int main(int argc, char **argv) {
    verifier_opts o = {
        .w = {.coordinator = "tcp://127.0.0.1:7701",
              .max_seqs = 64,
              .max_batch = 64,
              .max_k = 16,
              .min_max_k = 0,
              .prefix_cache = 50,
              .warmup = -1},
        .block_size = 16,
        .tp = 1,
        .rank = 0,
        .device = -1,
        .backend = sd_backend_default_opts(),
        .lm_head = SD_TP_LM_HEAD_SPLIT,
    };
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    sd_net_log_init("verifier", o.rank, o.w.verbose);
    int stop_fd = -1;
    if (sd_worker_signal_fd(&stop_fd) != SD_OK) return 1;
    /* keys first: a missing key file is a start-up error, before the model loads */
    sd_curve_id curve;
    sd_curve_allow rank_keys = {0};
    sd_worker_params wp = sd_worker_default_params();
    wp.curve = &curve;
    wp.stop_fd = stop_fd;
    sd_model *model = NULL;
    sd_status st;
    if (sd_curve_id_load(o.w.curve_secret, o.w.curve_server, &curve) != SD_OK ||
        (o.rank_keys && sd_curve_allow_read(o.rank_keys, &rank_keys) != SD_OK) ||
        sd_weights_identity(o.model_path, &wp.model) != SD_OK) {
        rc = 2;
    } else if ((st = load_model(&o, &model)) != SD_OK) {
        SD_ERROR("cannot start the verifier: %s", sd_status_str(st));
        rc = 2;
    } else if (o.rank > 0) {
        rc = run_rank(&o, &wp.model, model, stop_fd, &curve);
        sd_model_free(&model);
    } else {
        rc = run_leader(&o, &wp, model, &curve, &rank_keys);
    }
    sd_curve_allow_free(&rank_keys);
    memset(&curve, 0, sizeof curve);
    close(stop_fd);
    return rc;
}
