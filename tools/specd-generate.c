/* specd-generate — single-process generation, the baseline every other mode
 * of specd is compared against.
 *
 * Loads a model (a GGUF file or a Hugging Face checkpoint directory),
 * tokenizes the prompt (optionally as a conversation in the model's chat
 * template, specd/chat.h), prefills it in one forward call and then decodes
 * one token per call, streaming text as whole UTF-8 characters. --json replaces the stream with
 * one JSON object at the end (ids, text, timings), which is what the tests and
 * benchmarks read. Sampling uses the counter-based generator keyed by (seed,
 * position), so a seeded run is reproducible anywhere.
 *
 * With --draft, --ngram or --draft-layers it decodes speculatively through
 * sd_spec_decoder (spec_decode.h): each step drafts K tokens, verifies them
 * in one target pass and commits the accepted ones plus one; the output has
 * exactly plain decoding's distribution (token for token at temperature 0).
 * The report gives drafted, accepted, the acceptance rate, tokens per target
 * step and the i.i.d. expectation (1-a^(K+1))/(1-a) beside it. */
#include "specd/common.h"
#include "specd/chat.h"
#include "specd/cli.h"
#include "specd/drafter.h"
#include "specd/eagle.h"
#include "specd/spec_decode.h"
#include "specd/weights.h"
#include "specd/model.h"
#include "specd/backend_opts.h"
#include "specd/sample.h"
#include "specd/tokenizer.h"

#include "gen_features.h"
#include "gen_constrain.h"
#include "gen_result.h"
#include "gen_spec.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TURNS 256 /* --message turns */

typedef struct gen_opts {
    const char *model_path;
    const char *prompt;
    const char *system;
    int32_t n_predict;
    int32_t n_threads;
    int32_t device; /* -1 CPU, N cuda:N (target and draft model) */
    sd_dtype kv_type;
    int32_t max_ctx; /* --max-ctx N: tokens the sequence may reach (0: the model's context; LongRoPE's factors) */
    sd_sampling sampling;
    bool chat, special;           /* special: a plain prompt's special-token text is read as control tokens */
    const char *chat_template;    /* --chat-template NAME, or NULL: the model's */
    sd_chat_msg turns[MAX_TURNS]; /* --message ROLE:TEXT, in order */
    size_t n_turns;
    bool json;
    bool verbose;
    bool ignore_eos;
    /* speculative decoding: at most one of draft_path / ngram / draft_layers */
    const char *draft_path;
    bool ngram;
    int32_t draft_layers;
    int32_t draft_vocab; /* --draft-vocab N: a model drafter's vocabulary cut (-1 = not given) */
    int32_t k;
    bool adaptive_k;
    int32_t tree_topk, tree_nodes; /* --tree-topk K (0: chains), --tree-nodes N */
    bool logprobs;                    /* --logprobs N: each token's logprob and top N (plain decoding) */
    int32_t top_logprobs;             /* N */
    const char *eagle_dir, *dump_dir; /* --eagle DIR (an EAGLE-3 head drafts), --dump-features DIR (gen_features.h) */
    const char *prompt_file, *eagle_layers; /* --prompt-file F, --eagle-layers a,b,c (with --dump-features) */
    sd_eagle_weights eagle_weights;         /* --eagle-weights q8_0|stored */
    sd_backend_opts backend;          /* --cpu-weights, --cuda-graphs, ... (specd/backend_opts.h) */
    /* structured output: at most one of the four */
    const char *json_schema, *regex, *grammar; /* --json-schema FILE, --regex RE, --grammar FILE */
    bool response_json;                        /* --response-json: any JSON object */
    bool forced_draft;                         /* --forced-draft: speculative, forced tokens as the only drafts */
    bool no_forced;                            /* --no-forced: no forced drafts (for comparison) */
} gen_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: specd-generate -m MODEL [-p PROMPT] [options]\n"
            "\n"
            "Generates text from a prompt with a Llama-architecture model on the CPU or a GPU.\n"
            "Without -p the prompt is read from standard input.\n"
            "\n"
            "  -m, --model PATH     GGUF file or Hugging Face checkpoint directory (required)\n"
            "  -p, --prompt TEXT    prompt text\n"
            "  -n, --n-predict N    maximum new tokens (default 128)\n"
            "      --temp T         temperature; 0 = greedy (default 0)\n"
            "      --top-k K        keep the K most likely tokens (0 = off, default)\n"
            "      --top-p P        nucleus sampling mass in (0, 1] (default 1)\n"
            "      --min-p P        drop tokens below P x the top probability (default 0)\n"
            "      --seed S         random seed for sampling (default 0)\n"
            "      --verify-rule R  how sampled drafts are verified: coupled (default: seeded output = plain\n"
            "                       decoding's) or rejection (accept min(1, p/q), residual max(0, p - q))\n"
            "      --presence-penalty P   subtract P from the logit of every token generated so far, in\n"
            "                       [-2, 2] (default 0)\n"
            "      --frequency-penalty F  subtract F x (times generated so far) from a token's logit, in\n"
            "                       [-2, 2] (default 0)\n"
            "      --logprobs N     with --json: each generated token's log-probability and the N (0..%d) most\n"
            "                       likely tokens at its position (log-softmax after the penalties, before\n"
            "                       temperature and the filters; plain decoding only)\n"
            "      --chat           format the prompt as a user turn with the model's chat template\n"
            "      --special        read special-token text in a plain prompt as control tokens (not with --chat)\n"
            "      --system TEXT    system prompt with --chat (default: the model's)\n"
            "      --message ROLE:TEXT  a turn of the conversation before the prompt (ROLE system, user or\n"
            "                       assistant; repeat in order; implies --chat; -p may then be left out)\n"
            "      --chat-template NAME  chat format when the model's template is not recognised (or to\n"
            "                       override it): %s\n"
            "  -t, --threads N      worker threads (default: all cores)\n"
            "      --device D       cpu (default), cuda or cuda:N: where the target and a draft model run\n"
            "      --kv-type T      the target's KV cache: f32 (default) or f16 (half the memory; CPU)\n"
            "      --max-ctx N      tokens the sequence may reach (default: the model's context length); picks\n"
            "                       a LongRoPE model's factors (long above its original context, else short)\n"
            "      --ignore-eos     keep generating past end-of-generation tokens\n"
            "      --draft PATH     speculative decoding with a draft model (same vocabulary)\n"
            "      --ngram          speculative decoding with the n-gram (prompt lookup) drafter\n"
            "      --draft-layers L speculative decoding with the target's first L layers (self-draft)\n"
            "      --eagle DIR      speculative decoding with an EAGLE-3 head (a Hugging Face directory)\n"
            "      --eagle-weights W  the head's matrices: q8_0 (quantized at load, the default) or stored\n"
            "      --dump-features DIR  plain decoding writing tokens + hidden states to DIR/NNNNNN.safetensors\n"
            "      --eagle-layers a,b,c  layers dumped (default EAGLE-3's: outputs of 1, L/2-1, L-4)\n"
            "      --prompt-file F  with --dump-features: one prompt a line (\\n a newline, # lines skipped)\n"
            "      --draft-vocab N  with --draft or --draft-layers: draft among token ids < N only, computing\n"
            "                       only those rows of the draft's LM head (exact at any N, at most the\n"
            "                       vocabulary's size; 0 = the whole vocabulary, the default; 32768\n"
            "                       measured best with SmolLM2's 49,152 ids, whose order follows frequency)\n"
            "  -k K                 draft tokens per step (default 4, at most %d)\n"
            "      --tree-topk T    with --eagle: draft a token tree per step, T children per node and T\n"
            "                       nodes expanded per depth, depth K (0 = chains, the default; at most %d)\n"
            "      --tree-nodes N   with --tree-topk: the N most probable nodes are verified (default 16, <= %d)\n"
            "      --adaptive-k     choose K per step (0..K) from the acceptance and measured costs; at K = 0\n"
            "                       it shadow-drafts now and then to notice when drafting pays again\n"
            "      --json-schema FILE  constrain the output to an instance of the JSON Schema in FILE\n"
            "      --regex RE       constrain the output to match the regular expression RE whole\n"
            "      --grammar FILE   constrain the output to the GBNF grammar in FILE (start rule: root)\n"
            "      --response-json  constrain the output to a JSON object (OpenAI's json_object)\n"
            "      --forced-draft   under a constraint: speculative, drafting only the tokens it forces\n"
            "      --no-forced      under a constraint with a drafter: no forced drafts\n"
            "      --json           print one JSON object at the end instead of streaming\n"
            "  -v, --verbose        log at DEBUG level\n"
            "  -h, --help           this help\n"
            "\n" SD_BACKEND_OPTIONS_USAGE,
            SD_MAX_TOP_LOGPROBS, sd_chat_template_names(), SD_MAX_K, SD_TREE_MAX_TOPK, SD_TREE_MAX_NODES);
}

/* --message ROLE:TEXT appended to o->turns (TEXT borrowed from argv). */
static bool parse_turn(char *arg, gen_opts *o) {
    char *colon = strchr(arg, ':');
    if (!colon || o->n_turns >= MAX_TURNS) return false;
    size_t n = (size_t)(colon - arg);
    static const char *const roles[] = {"system", "user", "assistant"};
    for (size_t i = 0; i < 3; i++) {
        if (strlen(roles[i]) == n && strncmp(arg, roles[i], n) == 0) {
            o->turns[o->n_turns++] = (sd_chat_msg){roles[i], colon + 1};
            return true;
        }
    }
    return false;
}

/* Returns 0 and fills o, 1 after --help, 2 on a usage error (message printed). */
enum {
    OPT_TEMP = 256,
    OPT_TOPK,
    OPT_TOPP,
    OPT_MINP,
    OPT_SEED,
    OPT_CHAT,
    OPT_SYSTEM,
    OPT_MESSAGE,
    OPT_CHAT_TEMPLATE,
    OPT_JSON,
    OPT_NOEOS,
    OPT_DRAFT,
    OPT_NGRAM,
    OPT_DRAFT_LAYERS,
    OPT_DRAFT_VOCAB,
    OPT_ADAPTIVE,
    OPT_DEVICE,
    OPT_KV_TYPE,
    OPT_PRESENCE,
    OPT_FREQUENCY,
    OPT_LOGPROBS,
    OPT_EAGLE,
    OPT_TREE_TOPK,
    OPT_TREE_NODES,
    OPT_DUMP,
    OPT_PROMPT_FILE,
    OPT_EAGLE_LAYERS,
    OPT_EAGLE_WEIGHTS,
    OPT_SCHEMA,
    OPT_REGEX,
    OPT_GRAMMAR,
    OPT_RESPONSE_JSON,
    OPT_FORCED,
    OPT_NO_FORCED,
    OPT_MAX_CTX,
    OPT_SPECIAL,
    OPT_VERIFY_RULE
};

static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                      {"prompt", required_argument, 0, 'p'},
                                      {"n-predict", required_argument, 0, 'n'},
                                      {"threads", required_argument, 0, 't'},
                                      {"temp", required_argument, 0, OPT_TEMP},
                                      {"top-k", required_argument, 0, OPT_TOPK},
                                      {"top-p", required_argument, 0, OPT_TOPP},
                                      {"min-p", required_argument, 0, OPT_MINP},
                                      {"seed", required_argument, 0, OPT_SEED},
                                      {"verify-rule", required_argument, 0, OPT_VERIFY_RULE},
                                      {"chat", no_argument, 0, OPT_CHAT},
                                      {"special", no_argument, 0, OPT_SPECIAL},
                                      {"system", required_argument, 0, OPT_SYSTEM},
                                      {"message", required_argument, 0, OPT_MESSAGE},
                                      {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
                                      {"json", no_argument, 0, OPT_JSON},
                                      {"ignore-eos", no_argument, 0, OPT_NOEOS},
                                      {"draft", required_argument, 0, OPT_DRAFT},
                                      {"ngram", no_argument, 0, OPT_NGRAM},
                                      {"draft-layers", required_argument, 0, OPT_DRAFT_LAYERS},
                                      {"draft-vocab", required_argument, 0, OPT_DRAFT_VOCAB},
                                      {"adaptive-k", no_argument, 0, OPT_ADAPTIVE},
                                      {"device", required_argument, 0, OPT_DEVICE},
                                      {"kv-type", required_argument, 0, OPT_KV_TYPE},
                                      {"presence-penalty", required_argument, 0, OPT_PRESENCE},
                                      {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
                                      {"logprobs", required_argument, 0, OPT_LOGPROBS},
                                      {"eagle", required_argument, 0, OPT_EAGLE},
                                      {"tree-topk", required_argument, 0, OPT_TREE_TOPK},
                                      {"tree-nodes", required_argument, 0, OPT_TREE_NODES},
                                      {"dump-features", required_argument, 0, OPT_DUMP},
                                      {"prompt-file", required_argument, 0, OPT_PROMPT_FILE},
                                      {"eagle-layers", required_argument, 0, OPT_EAGLE_LAYERS},
                                      {"eagle-weights", required_argument, 0, OPT_EAGLE_WEIGHTS},
                                      {"json-schema", required_argument, 0, OPT_SCHEMA},
                                      {"regex", required_argument, 0, OPT_REGEX},
                                      {"grammar", required_argument, 0, OPT_GRAMMAR},
                                      {"response-json", no_argument, 0, OPT_RESPONSE_JSON},
                                      {"forced-draft", no_argument, 0, OPT_FORCED},
                                      {"no-forced", no_argument, 0, OPT_NO_FORCED},
                                      {"max-ctx", required_argument, 0, OPT_MAX_CTX},
                                      {"verbose", no_argument, 0, 'v'},
                                      {"help", no_argument, 0, 'h'},
                                      SD_BACKEND_LONG_OPTIONS,
                                      {0, 0, 0, 0}};

/* Applies option c (with optarg) to o. False on a bad value, with *name the
 * option's name for the message; *unknown when c is no option of ours. */
static bool apply_opt(int c, gen_opts *o, const char **name, bool *unknown) {
    bool ok = true;
    *name = "";
    *unknown = false;
    switch (c) {
    case 'm': o->model_path = optarg; break;
    case 'p': o->prompt = optarg; break;
    case 'n': ok = sd_cli_parse_i32(optarg, 0, 1 << 20, &o->n_predict), *name = "n-predict"; break;
    case 't':
        *name = "threads";
        ok = sd_cli_parse_i32(optarg, 0, 1024, &o->n_threads);
        break;
    case OPT_TEMP:
        *name = "temp";
        ok = sd_cli_parse_float(optarg, &o->sampling.temperature);
        break;
    case OPT_TOPK:
        *name = "top-k";
        ok = sd_cli_parse_i32(optarg, 0, 1 << 30, &o->sampling.top_k);
        break;
    case OPT_TOPP:
        *name = "top-p";
        ok = sd_cli_parse_float(optarg, &o->sampling.top_p);
        break;
    case OPT_MINP:
        *name = "min-p";
        ok = sd_cli_parse_float(optarg, &o->sampling.min_p);
        break;
    case OPT_SEED: {
        *name = "seed";
        char *end;
        errno = 0;
        unsigned long long v = strtoull(optarg, &end, 10);
        ok = !errno && end != optarg && !*end && optarg[0] != '-';
        o->sampling.seed = v;
        break;
    }
    case OPT_VERIFY_RULE:
        *name = "verify-rule (coupled or rejection)";
        ok = sd_cli_parse_verify_rule(optarg, &o->sampling.rule);
        break;
    case OPT_PRESENCE:
        *name = "presence-penalty";
        ok = sd_cli_parse_float(optarg, &o->sampling.presence_penalty);
        break;
    case OPT_FREQUENCY:
        *name = "frequency-penalty";
        ok = sd_cli_parse_float(optarg, &o->sampling.frequency_penalty);
        break;
    case OPT_LOGPROBS:
        *name = "logprobs";
        ok = sd_cli_parse_i32(optarg, 0, SD_MAX_TOP_LOGPROBS, &o->top_logprobs);
        o->logprobs = true;
        break;
    case OPT_CHAT: o->chat = true; break;
    case OPT_SPECIAL: o->special = true; break;
    case OPT_SYSTEM: o->system = optarg; break;
    case OPT_MESSAGE:
        *name = "message";
        ok = parse_turn(optarg, o);
        o->chat = true;
        break;
    case OPT_CHAT_TEMPLATE: o->chat_template = optarg; break;
    case OPT_JSON: o->json = true; break;
    case OPT_NOEOS: o->ignore_eos = true; break;
    case OPT_DRAFT: o->draft_path = optarg; break;
    case OPT_NGRAM: o->ngram = true; break;
    case OPT_EAGLE: o->eagle_dir = optarg; break;
    case OPT_DUMP: o->dump_dir = optarg; break;
    case OPT_PROMPT_FILE: o->prompt_file = optarg; break;
    case OPT_EAGLE_LAYERS: o->eagle_layers = optarg; break;
    case OPT_EAGLE_WEIGHTS:
        *name = "eagle-weights";
        ok = sd_eagle_weights_parse(optarg, &o->eagle_weights);
        break;
    case OPT_DRAFT_LAYERS:
        *name = "draft-layers";
        ok = sd_cli_parse_i32(optarg, 1, 1024, &o->draft_layers);
        break;
    case OPT_DRAFT_VOCAB:
        *name = "draft-vocab";
        ok = sd_cli_parse_i32(optarg, 0, 1 << 24, &o->draft_vocab);
        break;
    case 'k':
        *name = "k";
        ok = sd_cli_parse_i32(optarg, 1, SD_MAX_K, &o->k);
        break;
    case OPT_ADAPTIVE: o->adaptive_k = true; break;
    case OPT_TREE_TOPK:
        *name = "tree-topk";
        ok = sd_cli_parse_i32(optarg, 0, SD_TREE_MAX_TOPK, &o->tree_topk);
        break;
    case OPT_TREE_NODES:
        *name = "tree-nodes";
        ok = sd_cli_parse_i32(optarg, 1, SD_TREE_MAX_NODES, &o->tree_nodes);
        break;
    case OPT_DEVICE:
        *name = "device";
        ok = sd_device_parse(optarg, &o->device) == SD_OK;
        break;
    case OPT_KV_TYPE:
        *name = "kv-type (f32 or f16)";
        ok = sd_kv_type_parse(optarg, &o->kv_type);
        break;
    case OPT_SCHEMA: o->json_schema = optarg; break;
    case OPT_REGEX: o->regex = optarg; break;
    case OPT_GRAMMAR: o->grammar = optarg; break;
    case OPT_RESPONSE_JSON: o->response_json = true; break;
    case OPT_FORCED: o->forced_draft = true; break;
    case OPT_NO_FORCED: o->no_forced = true; break;
    case OPT_MAX_CTX: ok = sd_cli_parse_i32(optarg, 1, SD_MODEL_MAX_CTX, &o->max_ctx), *name = "max-ctx"; break;
    case 'v': o->verbose = true; break;
    default: *unknown = true; break;
    }
    return ok;
}

/* The checks across options, once all are read: 0, or 2 with a message. */
static int check_opts(const gen_opts *o) {
    if ((o->draft_path != NULL) + o->ngram + (o->draft_layers > 0) + (o->eagle_dir != NULL) + (o->dump_dir != NULL) >
            1 ||
        ((o->prompt_file || o->eagle_layers) && !o->dump_dir)) {
        fprintf(stderr, "specd-generate: --draft, --ngram, --draft-layers, --eagle and --dump-features exclude each "
                        "other; --prompt-file and --eagle-layers go with --dump-features\n");
        return 2;
    }
    if (o->draft_vocab >= 0 && !o->draft_path && o->draft_layers <= 0) {
        fprintf(stderr, "specd-generate: --draft-vocab goes with --draft or --draft-layers\n");
        return 2;
    }
    if ((o->logprobs && (o->draft_path || o->ngram || o->draft_layers > 0 || o->eagle_dir || !o->json)) ||
        (o->special && o->chat)) {
        fprintf(stderr, "specd-generate: %s\n",
                o->special && o->chat ? "--special is for a plain prompt (not --chat)"
                                      : "--logprobs is for plain decoding with --json");
        return 2;
    }
    bool constrained = o->json_schema || o->regex || o->grammar || o->response_json;
    const char *bad =
        !constrained && (o->forced_draft || o->no_forced) ? "--forced-draft and --no-forced need a constraint"
        : constrained && (o->ignore_eos || o->adaptive_k) ? "a constraint excludes --ignore-eos and --adaptive-k"
        : o->tree_topk > 0 && (!o->eagle_dir || o->adaptive_k || constrained)
            ? "--tree-topk needs --eagle, and excludes --adaptive-k and constraints"
        : o->forced_draft && (o->draft_path || o->ngram || o->draft_layers > 0)
            ? "--forced-draft excludes the other drafters"
            : NULL;
    if (bad) {
        fprintf(stderr, "specd-generate: %s\n", bad);
        return 2;
    }
    if (!o->model_path) {
        fprintf(stderr, "specd-generate: -m MODEL is required (see --help)\n");
        return 2;
    }
    if (sd_sampling_validate(&o->sampling) != SD_OK) {
        fprintf(stderr, "specd-generate: invalid sampling parameters (see the log line above)\n");
        return 2;
    }
    return 0;
}

static int parse_args(int argc, char **argv, gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->k = 4;
    o->tree_nodes = 16;
    o->device = -1;
    o->draft_vocab = -1;
    o->sampling = sd_sampling_default();
    o->backend = sd_backend_default_opts();
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:t:k:vh", longs, &li)) != -1) {
        const char *name;
        bool unknown;
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (c == SD_BACKEND_OPTION && !sd_backend_opts_parse(&o->backend, longs[li].name, optarg, "specd-generate"))
            return 2;
        if (c == SD_BACKEND_OPTION) continue;
        bool ok = apply_opt(c, o, &name, &unknown);
        if (unknown) {
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "specd-generate: invalid value '%s' for --%s\n", optarg, name);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "specd-generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return check_opts(o);
}


/* Adds BOS to the tokenized prompt in r->prompt_ids when the model wants it and
 * checks that prompt + n_predict fits the model's context. */
static sd_status encode_prompt(const gen_opts *o, const sd_model_config *cfg, const sd_tok *tok, gen_result *r) {
    bool own_bos = o->special && r->n_prompt > 0 && r->prompt_ids[0] == sd_tok_bos(tok); /* --special brought it */
    if (sd_tok_add_bos(tok) && sd_tok_bos(tok) >= 0 && !own_bos) {
        int32_t *with_bos = malloc((r->n_prompt + 1) * sizeof *with_bos);
        if (!with_bos) return SD_ERR_NOMEM;
        with_bos[0] = sd_tok_bos(tok);
        memcpy(with_bos + 1, r->prompt_ids, r->n_prompt * sizeof *with_bos);
        free(r->prompt_ids);
        r->prompt_ids = with_bos;
        r->n_prompt++;
    }
    if (r->n_prompt == 0) {
        SD_ERROR("the prompt is empty after tokenization");
        return SD_ERR_INVALID_ARG;
    }
    int64_t n_ctx = (int64_t)r->n_prompt + o->n_predict;
    int32_t max = o->max_ctx > 0 && o->max_ctx < cfg->n_ctx_train ? o->max_ctx : cfg->n_ctx_train;
    if (n_ctx > max) {
        SD_ERROR("prompt (%zu tokens) + n_predict (%d) exceeds the context length %d (%s)", r->n_prompt, o->n_predict,
                 max, max == cfg->n_ctx_train ? "the model's" : "--max-ctx");
        return SD_ERR_RANGE;
    }
    return SD_OK;
}

/* Prefill + decode loop. Streams text to stdout unless o->json. */
static sd_status generate(const gen_opts *o, sd_model *m, const sd_tok *tok, sd_constraint *con, gen_result *r) {
    const sd_model_config *cfg = sd_model_config_of(m);
    int32_t n_vocab = cfg->n_vocab;
    sd_status st = encode_prompt(o, cfg, tok, r);
    if (st != SD_OK) return st;
    int64_t n_ctx = (int64_t)r->n_prompt + o->n_predict;
    const int32_t block = 16;
    sd_kv *kv = NULL;
    SD_TRY(sd_model_kv_create(m, 1, (int32_t)((n_ctx + block - 1) / block) + 1, block, &kv));

    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int32_t *pos = malloc(r->n_prompt * sizeof *pos);
    int32_t *seq = calloc(r->n_prompt, sizeof *seq);
    bool *want = calloc(r->n_prompt, sizeof *want);
    r->ids = malloc(((size_t)o->n_predict + 1) * sizeof *r->ids);
    sd_tok_stream *stream = sd_tok_stream_new(tok);
    int32_t *counts = calloc((size_t)n_vocab, sizeof *counts); /* sd_sample_penalize's scratch */
    if (o->logprobs) r->logprobs = calloc((size_t)o->n_predict + 1, sizeof *r->logprobs);
    if (!logits || !pos || !seq || !want || !r->ids || !stream || !counts || (o->logprobs && !r->logprobs)) {
        st = SD_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < r->n_prompt; i++) pos[i] = (int32_t)i;
    want[r->n_prompt - 1] = true;

    double t0 = sd_now();
    sd_batch b = {(int32_t)r->n_prompt, r->prompt_ids, pos, seq, want};
    st = sd_model_forward(m, kv, &b, logits);
    if (st != SD_OK) goto done;
    double t1 = sd_now();
    r->prompt_s = t1 - t0;

    r->stop_reason = "length";
    int32_t cur_pos = (int32_t)r->n_prompt;
    for (int32_t i = 0; i < o->n_predict; i++) {
        int32_t next;
        st = sd_sample_penalize(logits, n_vocab, &o->sampling, r->ids, (int32_t)r->n_ids, counts);
        if (st == SD_OK && con) st = sd_constraint_apply(con, logits, n_vocab); /* before the sampler's filters */
        if (st == SD_OK) st = sd_sample_token(logits, n_vocab, &o->sampling, (uint64_t)cur_pos, &next);
        if (st == SD_OK && o->logprobs)
            st = sd_sample_logprobs(logits, n_vocab, next, o->top_logprobs, &r->logprobs[r->n_ids]);
        if (st == SD_OK && con) st = sd_constraint_advance(con, next);
        if (st != SD_OK) goto done;
        r->ids[r->n_ids++] = next;
        if (!o->ignore_eos && sd_tok_is_eog(tok, next)) {
            r->stop_reason = "eos";
            break;
        }
        if (!o->json) {
            char piece[512];
            size_t n;
            if (sd_tok_stream_push(stream, next, piece, sizeof piece, &n) == SD_OK && n) {
                fwrite(piece, 1, n, stdout);
                fflush(stdout);
            }
        }
        if (i + 1 == o->n_predict) break;
        bool one = true;
        sd_batch step = {1, &next, &cur_pos, seq, &one};
        st = sd_model_forward(m, kv, &step, logits);
        if (st != SD_OK) goto done;
        cur_pos++;
    }
    r->decode_s = sd_now() - t1;
    r->decode_tokens = r->n_ids > 1 ? (int64_t)r->n_ids - 1 : 0; /* the first token came from the prefill */
    if (!o->json) {
        char tail[512];
        size_t n;
        if (sd_tok_stream_flush(stream, tail, sizeof tail, &n) == SD_OK && n) fwrite(tail, 1, n, stdout);
        fputc('\n', stdout);
    }
done:
    sd_tok_stream_free(&stream);
    free(counts);
    free(want);
    free(seq);
    free(pos);
    free(logits);
    sd_kv_free(&kv);
    return st;
}

typedef struct spec_stream {
    const gen_opts *o;
    const sd_tok *tok;
    sd_tok_stream *stream;
} spec_stream;

static bool spec_is_end(void *user, int32_t token) {
    const spec_stream *ss = user;
    return !ss->o->ignore_eos && sd_tok_is_eog(ss->tok, token);
}

static void spec_on_token(void *user, int32_t token) {
    spec_stream *ss = user;
    if (ss->o->json || spec_is_end(user, token)) return; /* the stream leaves out the end token */
    char piece[512];
    size_t n;
    if (sd_tok_stream_push(ss->stream, token, piece, sizeof piece, &n) == SD_OK && n) {
        fwrite(piece, 1, n, stdout);
        fflush(stdout);
    }
}

/* Speculative decode loop over decoder dec (tools/gen_spec.c). Streams unless o->json. */
static sd_status generate_spec(const gen_opts *o, sd_model *m, sd_spec_decoder *dec, const sd_tok *tok,
                               const char *text, gen_result *r) {
    SD_TRY(encode_prompt(o, sd_model_config_of(m), tok, r));
    int32_t n_prompt = (int32_t)r->n_prompt;
    int32_t *ctx = malloc(((size_t)n_prompt + (size_t)o->n_predict + SD_MAX_K + 1) * sizeof *ctx);
    r->ids = malloc(((size_t)o->n_predict + SD_MAX_K + 1) * sizeof *r->ids);
    spec_stream ss = {o, tok, sd_tok_stream_new(tok)};
    sd_status st = SD_OK;
    if (!ctx || !r->ids || !ss.stream) {
        st = SD_ERR_NOMEM;
        goto done;
    }
    sd_gen_spec_params gp = {
        .n_predict = o->n_predict,
        .k = o->k,
        .adaptive_k = o->adaptive_k,
        .tree = {.topk = o->tree_topk, .n_nodes = o->tree_nodes},
        .sampling = o->sampling,
        .user = &ss,
        .is_end = spec_is_end,
        .on_token = spec_on_token,
    };
    sd_gen_spec_result gr;
    st = sd_gen_spec_run(dec, r->prompt_ids, n_prompt, &gp, ctx, r->ids, &gr);
    if (st != SD_OK) goto done;
    r->spec = true;
    r->n_ids = (size_t)gr.n_ids;
    r->stop_reason = gr.ended ? "eos" : "length";
    r->prompt_s = gr.prompt_s; /* the first step carries the prefill */
    r->decode_s = gr.decode_s;
    r->decode_tokens = gr.decode_tokens;
    r->spec_stats = *sd_spec_decoder_stats(dec);
    r->mean_k = gr.n_steps ? gr.k_sum / (double)gr.n_steps : 0;
    if (o->adaptive_k) {
        r->adaptive = true;
        r->cost = *sd_spec_decoder_cost(dec);
        r->adapt = *sd_spec_decoder_adapt(dec);
    }
    if (!o->json) {
        char tail[512];
        size_t n;
        if (sd_tok_stream_flush(ss.stream, tail, sizeof tail, &n) == SD_OK && n) fwrite(tail, 1, n, stdout);
        fputc('\n', stdout);
    }
done:
    sd_tok_stream_free(&ss.stream);
    free(ctx);
    return st;
}

/* The conversation of o (--system, --message turns, then -p as the last
 * user turn) in the chat template, malloc'd in *out. */
/* Formats the conversation (--system, --message turns, the prompt) with the
 * model's template and tokenizes it, special tokens matched in the
 * template's markup only. *out gets the text (for --json), r the ids. */
static sd_status encode_chat(const gen_opts *o, const sd_chat_template *chat, const sd_tok *tok, char **out,
                             gen_result *r) {
    sd_chat_msg msgs[MAX_TURNS + 2];
    size_t n = 0;
    if (o->system) msgs[n++] = (sd_chat_msg){"system", o->system};
    for (size_t i = 0; i < o->n_turns; i++) msgs[n++] = o->turns[i];
    if (o->prompt) msgs[n++] = (sd_chat_msg){"user", o->prompt};
    char err[400];
    sd_status st =
        sd_chat_template_encode(chat, tok, msgs, n, true, &r->prompt_ids, &r->n_prompt, out, err, sizeof err);
    if (st == SD_ERR_INVALID_ARG)
        fprintf(stderr, "specd-generate: the %s chat template refuses this conversation: %s\n",
                sd_chat_template_name(chat), err);
    else if (st != SD_OK)
        fprintf(stderr, "specd-generate: chat formatting failed: %s\n", sd_status_str(st));
    return st;
}

/* The model, its tokenizer and (with --chat) its chat template, the weights
 * file closed again (the model holds what it uses: copies, or its own
 * reference to the file mapping). false after saying why on stderr. */
static bool open_model(const gen_opts *o, sd_model **m, sd_tok **tok, sd_chat_template **chat) {
    sd_weights *w = NULL;
    sd_status st = sd_weights_open(o->model_path, &w);
    if (st != SD_OK) {
        fprintf(stderr, "specd-generate: cannot open %s: %s (see the log above)\n", o->model_path, sd_status_str(st));
        return false;
    }
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = o->n_threads;
    mp.device = o->device;
    mp.backend = o->backend;
    mp.kv_type = o->kv_type;
    mp.max_ctx = o->max_ctx;
    bool ok = false;
    if ((st = sd_weights_tokenizer(w, tok)) != SD_OK || (st = sd_model_load_weights(w, &mp, m)) != SD_OK)
        fprintf(stderr, "specd-generate: cannot load %s: %s (see the log above)\n", o->model_path, sd_status_str(st));
    else if (o->chat && (st = sd_chat_template_from_model(w, o->model_path, *tok, o->chat_template, chat)) != SD_OK)
        fprintf(stderr, "specd-generate: %s: no usable chat template: %s (see the log above)\n", o->model_path,
                sd_status_str(st));
    else
        ok = true;
    sd_weights_close(&w);
    return ok;
}

int main(int argc, char **argv) {
    gen_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    sd_log_set(NULL, NULL, o.verbose ? SD_LOG_DEBUG : SD_LOG_WARN, "generate");

    char *stdin_prompt = NULL; /* with no prompt given, the prompt is stdin */
    if (!o.prompt && o.n_turns == 0 && !o.prompt_file && (rc = sd_gen_prompt_stdin(&o.prompt, &stdin_prompt)) != 0)
        return rc;

    sd_model *m = NULL;
    sd_tok *tok = NULL;
    char *chat_text = NULL;
    sd_chat_template *chat = NULL;
    gen_result r = {0};
    sd_drafter *drafter = NULL;
    sd_spec_decoder *dec = NULL;
    gen_constraint gc = {0};
    rc = 1;
    sd_status st = SD_OK;
    if (!open_model(&o, &m, &tok, &chat)) goto out;

    const char *text = o.prompt ? o.prompt : "";
    if (o.dump_dir) { /* gen_features.c */
        sd_gen_dump_params dp = {o.dump_dir,  o.model_path, o.prompt,     o.prompt_file,        o.eagle_layers,
                                 o.n_predict, o.sampling,   o.ignore_eos, o.chat ? chat : NULL, o.system};
        rc = sd_gen_dump_main(&dp, m, tok);
        goto out;
    }
    if (o.chat) {
        if ((st = encode_chat(&o, chat, tok, &chat_text, &r)) != SD_OK) goto out;
        text = chat_text;
    } else if ((st = sd_tok_encode(tok, text, strlen(text), o.special, &r.prompt_ids, &r.n_prompt)) != SD_OK) {
        goto out; /* a plain prompt is text: special-token text in it stays text, unless --special */
    }
    if ((rc = gen_constraint_open(o.json_schema, o.regex, o.grammar, o.response_json, tok, &gc)) != 0) goto out;
    rc = 1;
    if (o.forced_draft) { /* speculative with the forced drafts alone */
        st = sd_spec_decoder_create(m, NULL, sd_model_config_of(m)->n_ctx_train, &dec);
        if (st == SD_OK) st = sd_spec_decoder_set_constraint(dec, gc.c, tok);
        if (st == SD_OK) st = generate_spec(&o, m, dec, tok, text, &r);
        r.forced_drafted = sd_spec_decoder_forced_drafted(dec);
    } else if (o.draft_path || o.ngram || o.draft_layers > 0 || o.eagle_dir) {
        sd_drafter_params dp = sd_drafter_default_params();
        dp.max_ctx = sd_model_config_of(m)->n_ctx_train;
        dp.n_threads = o.n_threads;
        dp.device = o.device;
        dp.backend = &o.backend;
        if (o.draft_vocab > sd_tok_n_vocab(tok)) {
            fprintf(stderr, "specd-generate: --draft-vocab %d is more than the %d tokens of the vocabulary\n",
                    (int)o.draft_vocab, (int)sd_tok_n_vocab(tok));
            rc = 2;
            goto out;
        }
        if (o.draft_vocab >= 0) dp.draft_vocab = o.draft_vocab;
        dp.eagle_weights = (int32_t)o.eagle_weights;
        if (o.ngram)
            st = sd_drafter_ngram_create(&dp, &drafter);
        else if (o.draft_layers > 0)
            st = sd_drafter_self_view(m, o.draft_layers, &dp, &drafter);
        else if (o.eagle_dir)
            st = sd_drafter_eagle_open(o.eagle_dir, m, &dp, &drafter);
        else
            st = sd_drafter_model_open(o.draft_path, sd_tok_vocab_hash(tok), sd_tok_n_vocab(tok), &dp, &drafter);
        if (st == SD_OK) st = sd_spec_decoder_create(m, drafter, sd_model_config_of(m)->n_ctx_train, &dec);
        if (st != SD_OK) {
            fprintf(stderr, "specd-generate: cannot set up the drafter: %s (see the log above)\n", sd_status_str(st));
            goto out;
        }
        if (st == SD_OK && gc.c) st = sd_spec_decoder_set_constraint(dec, gc.c, o.no_forced ? NULL : tok);
        if (st == SD_OK) st = generate_spec(&o, m, dec, tok, text, &r);
        r.forced_drafted = sd_spec_decoder_forced_drafted(dec);
    } else {
        st = generate(&o, m, tok, gc.c, &r);
    }
    gen_constraint_report(gc.c, &r);
    if (st != SD_OK) {
        fprintf(stderr, "specd-generate: generation failed: %s (see the log above)\n", sd_status_str(st));
        goto out;
    }
    rc = o.json ? gen_print_json(o.model_path, tok, text, &r) : 0;
    if (!o.json) {
        double steps = (double)r.decode_tokens;
        fprintf(stderr, "[prompt %zu tokens, %.1f tok/s | generated %zu tokens, %.1f tok/s | stop: %s]\n", r.n_prompt,
                r.prompt_s > 0 ? (double)r.n_prompt / r.prompt_s : 0, r.n_ids, r.decode_s > 0 ? steps / r.decode_s : 0,
                r.stop_reason);
        if (r.spec) {
            double rate, per_step, expected;
            gen_spec_summary(&r, &rate, &per_step, &expected);
            fprintf(stderr,
                    "[%s drafter, K %s%d: drafted %lld, accepted %lld, acceptance %.3f | %.2f tokens per "
                    "target step, expected (1-a^(K+1))/(1-a) = %.2f]\n",
                    drafter ? sd_drafter_name(drafter) : "forced", o.adaptive_k ? "<= " : "", (int)o.k,
                    (long long)r.spec_stats.drafted, (long long)r.spec_stats.accepted, rate, per_step, expected);
        }
    }
out:
    sd_spec_decoder_free(&dec);
    gen_constraint_close(&gc);
    sd_drafter_free(&drafter);
    free(r.prompt_ids);
    free(r.ids);
    free(r.logprobs);
    free(chat_text);
    sd_chat_template_free(&chat);
    free(stdin_prompt);
    sd_model_free(&m);
    sd_tok_free(&tok);
    return rc;
}
