/* specd-mkmodel — write a small random model as GGUF, for tests.
 *
 * The model has llama.cpp's tensor names and <arch>.* metadata (--arch
 * llama, qwen2, qwen3, gemma3, phi3, or mistral: llama with a sliding
 * window), so anything that loads SmolLM2 (or llama.cpp) loads it; --shape
 * NAME takes a real model's shape (qwen2.5-0.5b, qwen3-0.6b, gemma3-270m,
 * gemma3-1b, mistral-7b, phi3-mini, phi3-mini-128k). Phi-3 stores Q, K, V as one attn_qkv
 * matrix and gate, up as one ffn_up of 2 x ff rows, each part drawn as
 * llama's; --longrope ORIG gives it Phi-3 128k's LongRoPE over an original
 * context of ORIG (mkmodel_rope.c). What an architecture adds is drawn like the rest: Qwen2's
 * Q/K/V biases N(0, 0.1^2), the q/k and post norms like the other norms. Weights come from a seeded PRNG (splitmix64,
 * one independent stream per tensor, Box-Muller normals) scaled so that a
 * forward pass is well-conditioned: matrices have std 1/sqrt(fan_in), the
 * embedding 1/sqrt(dim) (small, so a tied LM head does not simply echo the
 * input token), the untied LM head 2/sqrt(dim) (logits with std ~2: peaked
 * but not degenerate), norm weights 1 + N(0, 0.1^2).
 *
 * The tokenizer is copied from another GGUF (--tokenizer-from, every
 * tokenizer.* key) or synthesized: byte-level BPE with three control tokens,
 * the 256 GPT-2 byte symbols, then merges built level by level — " "+letter
 * and letter pairs (letters in English frequency order), then each token of
 * the previous level extended by one letter — so every merge joins two
 * tokens that already exist.
 *
 * --format hf writes the same model (same seed, same numbers) as a Hugging
 * Face checkpoint directory instead (mkmodel_hf.c): the GGUF is built as
 * always, then rewritten with HF names and values, config.json
 * and tokenizer.json, optionally sharded (--shards). --convert turns an
 * existing GGUF into such a directory. */
#include "mkmodel_hf.h"
#include "specd/cli.h"
#include "specd/gguf.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_VOCAB 262144

typedef struct mk_params {
    const char *out;
    const char *arch; /* GGUF general.architecture: llama, qwen2, qwen3, gemma3, phi3 */
    bool mistral;     /* --arch mistral: llama with a sliding window on every layer */
    uint32_t head_dim, window; /* 0: dim / heads; 0: no sliding window */
    uint32_t dim, layers, heads, kv_heads, ff, vocab, ctx;
    uint32_t longrope;  /* --longrope ORIG: phi3 LongRoPE fitted to ORIG tokens (0: none) */
    uint32_t pad_vocab; /* --pad-vocab: the synthetic vocabulary padded with unused [PADn] tokens to this size */
    float rope_base;
    sd_dtype dtype, norm_dtype;
    bool tied;
    uint64_t seed;
    const char *tokenizer_from;
    const char *requant_from;
    bool dtype_set;
    bool hf;             /* --format hf: OUT is a checkpoint directory */
    uint32_t shards;     /* --shards (hf only) */
    const char *convert; /* --convert FROM.gguf (hf only) */
} mk_params;

static void usage(FILE *f) {
    fprintf(f, "usage: specd-mkmodel -o OUT.gguf [--arch llama|qwen2|qwen3|gemma3|phi3|mistral] [--shape NAME]\n"
               "                     [--head-dim N] [--window N] [--longrope ORIG_CTX]\n"
               "                     [--dim 64] [--layers 2] [--heads 4] [--kv-heads 2] [--ff 128]\n"
               "                     [--vocab 512 | --tokenizer-from MODEL.gguf] [--ctx 2048] [--rope-base 10000]\n"
               "                     [--dtype f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k] [--norm-dtype f32] "
               "[--tied] "
               "[--seed S]\n"
               "                     [--format gguf|hf] [--shards N] [--pad-vocab N]\n"
               "       specd-mkmodel -o OUT.gguf --requant FROM.gguf --dtype q4_0|q8_0|...\n"
               "       specd-mkmodel -o OUTDIR --format hf --convert FROM.gguf [--dtype f32|f16|bf16] [--shards N]\n"
               "Writes a random Llama model (llama.cpp tensor names and metadata) for tests, or (--requant) FROM's\n"
               "model, tokenizer and metadata with every 2-D weight re-quantized to --dtype (a realistic draft\n"
               "model: same vocabulary, different numerics).\n"
               "--format hf writes the same model as a Hugging Face checkpoint directory OUT (config.json of the\n"
               "family's class: LlamaForCausalLM, MistralForCausalLM, Qwen2/Qwen3/Gemma3/Phi3ForCausalLM;\n"
               "model.safetensors or N shards with model.safetensors.index.json, tokenizer.json): the engine\n"
               "reads identical numbers from both. --convert does that for an existing GGUF (quantized weights\n"
               "are stored dequantized, as f32 unless --dtype says f16 or bf16).\n");
}

/* ---- PRNG ---- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]. */
static double uniform01(uint64_t *state) { return ((double)(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53; }

static float normal(uint64_t *state) {
    double u1 = uniform01(state), u2 = uniform01(state);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- arguments ---- */

static bool parse_u32(const char *s, const char *flag, uint32_t lo, uint32_t hi, uint32_t *out) {
    long v;
    if (sd_cli_parse_long(s, lo, hi, &v)) {
        *out = (uint32_t)v;
        return true;
    }
    fprintf(stderr, "specd-mkmodel: %s must be an integer in %u..%u (got '%s')\n", flag, lo, hi, s);
    return false;
}

static bool parse_dtype(const char *s, sd_dtype *out) {
    static const struct {
        const char *name;
        sd_dtype t;
    } names[] = {{"f32", SD_DTYPE_F32},   {"f16", SD_DTYPE_F16},   {"bf16", SD_DTYPE_BF16}, {"q8_0", SD_DTYPE_Q8_0},
                 {"q4_0", SD_DTYPE_Q4_0}, {"q4_1", SD_DTYPE_Q4_1}, {"q5_0", SD_DTYPE_Q5_0}, {"q5_1", SD_DTYPE_Q5_1},
                 {"q4_k", SD_DTYPE_Q4_K}, {"q5_k", SD_DTYPE_Q5_K}, {"q6_k", SD_DTYPE_Q6_K}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].t;
            return true;
        }
    fprintf(stderr, "specd-mkmodel: unknown dtype '%s' (f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k)\n", s);
    return false;
}

/* The long options' codes past the short ones. */
enum {
    O_DIM = 256,
    O_LAYERS,
    O_HEADS,
    O_KV,
    O_FF,
    O_VOCAB,
    O_TOKFROM,
    O_CTX,
    O_ROPE,
    O_DTYPE,
    O_NDTYPE,
    O_TIED,
    O_SEED,
    O_REQUANT,
    O_FORMAT,
    O_SHARDS,
    O_CONVERT,
    O_ARCH,
    O_SHAPE,
    O_HEAD_DIM,
    O_WINDOW,
    O_PAD_VOCAB,
    O_LONGROPE
};
static const struct option mk_longs[] = {{"dim", required_argument, 0, O_DIM},
                                         {"layers", required_argument, 0, O_LAYERS},
                                         {"heads", required_argument, 0, O_HEADS},
                                         {"kv-heads", required_argument, 0, O_KV},
                                         {"ff", required_argument, 0, O_FF},
                                         {"vocab", required_argument, 0, O_VOCAB},
                                         {"tokenizer-from", required_argument, 0, O_TOKFROM},
                                         {"ctx", required_argument, 0, O_CTX},
                                         {"rope-base", required_argument, 0, O_ROPE},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"norm-dtype", required_argument, 0, O_NDTYPE},
                                         {"tied", no_argument, 0, O_TIED},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"requant", required_argument, 0, O_REQUANT},
                                         {"format", required_argument, 0, O_FORMAT},
                                         {"shards", required_argument, 0, O_SHARDS},
                                         {"convert", required_argument, 0, O_CONVERT},
                                         {"arch", required_argument, 0, O_ARCH},
                                         {"shape", required_argument, 0, O_SHAPE},
                                         {"head-dim", required_argument, 0, O_HEAD_DIM},
                                         {"window", required_argument, 0, O_WINDOW},
                                         {"pad-vocab", required_argument, 0, O_PAD_VOCAB},
                                         {"longrope", required_argument, 0, O_LONGROPE},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};

/* --arch: the GGUF architecture (mistral is llama with a window, 4096
 * unless --window says otherwise; gemma3 always has one, 512 by default). */
static bool set_arch(const char *name, mk_params *p) {
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};
    p->mistral = strcmp(name, "mistral") == 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(name, archs[i]) == 0 || (p->mistral && i == 0)) {
            p->arch = archs[i];
            if (p->mistral && !p->window) p->window = 4096;
            if (i == 3 && !p->window) p->window = 512;
            return true;
        }
    fprintf(stderr, "specd-mkmodel: unknown --arch '%s' (llama, qwen2, qwen3, gemma3, phi3, mistral)\n", name);
    return false;
}

/* --shape: a real model's hyper-parameters (random weights). */
static bool set_shape(const char *name, mk_params *p, bool *vocab_set) {
    static const struct {
        const char *name, *arch;
        uint32_t dim, layers, heads, kv, head_dim, ff, vocab, window;
        float rope;
        bool tied;
        uint32_t ctx, longrope; /* 0: the defaults */
    } shapes[] = {
        {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 0, 1e6f, true, 0, 0},
        {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 0, 1e6f, true, 0, 0},
        {"gemma3-270m", "gemma3", 640, 18, 4, 1, 256, 2048, 262144, 512, 1e6f, true, 0, 0},
        {"gemma3-1b", "gemma3", 1152, 26, 4, 1, 256, 6912, 262144, 512, 1e6f, true, 0, 0},
        {"mistral-7b", "mistral", 4096, 32, 32, 8, 128, 14336, 32000, 4096, 1e4f, false, 0, 0},
        {"phi3-mini", "phi3", 3072, 32, 32, 32, 96, 8192, 32064, 0, 1e4f, false, 0, 0},
        {"phi3-mini-128k", "phi3", 3072, 32, 32, 32, 96, 8192, 32064, 0, 1e4f, false, 131072, 4096},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (strcmp(name, shapes[i].name) != 0) continue;
        p->window = shapes[i].window;
        set_arch(shapes[i].arch, p);
        p->dim = shapes[i].dim, p->layers = shapes[i].layers, p->heads = shapes[i].heads;
        p->kv_heads = shapes[i].kv, p->head_dim = shapes[i].head_dim, p->ff = shapes[i].ff;
        p->vocab = shapes[i].vocab, p->rope_base = shapes[i].rope, p->tied = shapes[i].tied;
        if (shapes[i].ctx) p->ctx = shapes[i].ctx, p->longrope = shapes[i].longrope;
        *vocab_set = true;
        return true;
    }
    fprintf(stderr, "specd-mkmodel: unknown --shape '%s' (qwen2.5-0.5b, qwen3-0.6b, gemma3-270m, gemma3-1b, "
                    "mistral-7b, phi3-mini, phi3-mini-128k)\n", name);
    return false;
}

/* Applies one option (arg: its value); *vocab_set notes --vocab. False,
 * said on stderr, for a bad value or an unknown option. */
static bool apply_option(int c, const char *arg, mk_params *p, bool *vocab_set) {
    bool ok = true;
    switch (c) {
    case 'o': p->out = arg; break;
    case O_DIM: ok = parse_u32(arg, "--dim", 1, 65536, &p->dim); break;
    case O_LAYERS: ok = parse_u32(arg, "--layers", 1, 1024, &p->layers); break;
    case O_HEADS: ok = parse_u32(arg, "--heads", 1, 1024, &p->heads); break;
    case O_KV: ok = parse_u32(arg, "--kv-heads", 1, 1024, &p->kv_heads); break;
    case O_FF: ok = parse_u32(arg, "--ff", 1, 1 << 20, &p->ff); break;
    case O_VOCAB:
        ok = parse_u32(arg, "--vocab", 0, UINT32_MAX, &p->vocab);
        if (ok && (p->vocab < 259 || p->vocab > MAX_VOCAB)) {
            fprintf(stderr, "specd-mkmodel: --vocab must be in 259..%d (3 control tokens + 256 bytes)\n", MAX_VOCAB);
            ok = false;
        }
        *vocab_set = true;
        break;
    case O_TOKFROM: p->tokenizer_from = arg; break;
    case O_PAD_VOCAB: ok = parse_u32(arg, "--pad-vocab", 259, MAX_VOCAB, &p->pad_vocab); break;
    case O_CTX: ok = parse_u32(arg, "--ctx", 1, 1u << 24, &p->ctx); break;
    case O_ROPE: {
        char *end;
        p->rope_base = strtof(arg, &end);
        ok = *end == '\0' && end != arg && p->rope_base > 0.0f && isfinite(p->rope_base);
        if (!ok) fprintf(stderr, "specd-mkmodel: --rope-base must be a positive number (got '%s')\n", arg);
        break;
    }
    case O_DTYPE:
        ok = parse_dtype(arg, &p->dtype);
        p->dtype_set = true;
        break;
    case O_REQUANT: p->requant_from = arg; break;
    case O_NDTYPE: ok = parse_dtype(arg, &p->norm_dtype); break;
    case O_FORMAT:
        ok = strcmp(arg, "gguf") == 0 || strcmp(arg, "hf") == 0;
        p->hf = strcmp(arg, "hf") == 0;
        if (!ok) fprintf(stderr, "specd-mkmodel: --format is gguf or hf (got '%s')\n", arg);
        break;
    case O_SHARDS: ok = parse_u32(arg, "--shards", 1, 99999, &p->shards); break;
    case O_CONVERT: p->convert = arg; break;
    case O_ARCH: ok = set_arch(arg, p); break;
    case O_SHAPE: ok = set_shape(arg, p, vocab_set); break;
    case O_HEAD_DIM: ok = parse_u32(arg, "--head-dim", 2, 1024, &p->head_dim); break;
    case O_WINDOW: ok = parse_u32(arg, "--window", 1, 1u << 24, &p->window); break;
    case O_LONGROPE: ok = parse_u32(arg, "--longrope", 2, 1u << 24, &p->longrope); break;
    case O_TIED: p->tied = true; break;
    case O_SEED: {
        char *end;
        errno = 0;
        p->seed = strtoull(arg, &end, 0);
        ok = !errno && *end == '\0' && end != arg;
        if (!ok) fprintf(stderr, "specd-mkmodel: bad --seed '%s'\n", arg);
        break;
    }
    default: usage(stderr); return false;
    }
    return ok;
}

/* The rules of the output's format: 0, or -1 with the reason on stderr. */
static int check_format(const mk_params *p) {
    if (!p->out) {
        fprintf(stderr, "specd-mkmodel: -o OUT.gguf is required\n");
        usage(stderr);
        return -1;
    }
    if ((p->shards > 1 || p->convert) && !p->hf) {
        fprintf(stderr, "specd-mkmodel: --shards and --convert need --format hf\n");
        return -1;
    }
    if (p->hf && p->requant_from) {
        fprintf(stderr, "specd-mkmodel: --requant writes GGUF only\n");
        return -1;
    }
    if (p->hf && ((p->dtype != SD_DTYPE_F32 && p->dtype != SD_DTYPE_F16 && p->dtype != SD_DTYPE_BF16) ||
                  (p->norm_dtype != SD_DTYPE_F32 && p->norm_dtype != SD_DTYPE_F16 && p->norm_dtype != SD_DTYPE_BF16))) {
        fprintf(stderr, "specd-mkmodel: --format hf stores f32, f16 or bf16 only\n");
        return -1;
    }
    return 0;
}

/* The rules for a model written here (not --convert): its source flags and
 * its shape. 0, or -1 with the reason on stderr. */
static int check_shape(const mk_params *p, bool vocab_set) {
    if (p->requant_from && (vocab_set || p->tokenizer_from || !p->dtype_set)) {
        fprintf(stderr, "specd-mkmodel: --requant takes --dtype and excludes --vocab/--tokenizer-from\n");
        return -1;
    }
    if (vocab_set && p->tokenizer_from) {
        fprintf(stderr, "specd-mkmodel: --vocab and --tokenizer-from exclude each other\n");
        return -1;
    }
    if (!p->head_dim && p->dim % p->heads != 0) {
        fprintf(stderr, "specd-mkmodel: --dim %u is not a multiple of --heads %u (or give --head-dim)\n", p->dim,
                p->heads);
        return -1;
    }
    if (p->kv_heads > p->heads || p->heads % p->kv_heads != 0) {
        fprintf(stderr, "specd-mkmodel: --heads %u is not a multiple of --kv-heads %u\n", p->heads, p->kv_heads);
        return -1;
    }
    uint32_t hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    if (hd % 2 != 0) {
        fprintf(stderr, "specd-mkmodel: head dimension %u must be even (RoPE rotates pairs)\n", hd);
        return -1;
    }
    if (p->longrope && (strcmp(p->arch, "phi3") != 0 || hd > 1024)) {
        fprintf(stderr, "specd-mkmodel: --longrope is for --arch phi3 (LongRoPE: Phi-3's 128k models)\n");
        return -1;
    }
    if (p->window && strcmp(p->arch, "gemma3") != 0 && !p->mistral) {
        fprintf(stderr, "specd-mkmodel: --window is for --arch gemma3 or mistral\n");
        return -1;
    }
    size_t be;
    sd_dtype_block(p->dtype, &be, NULL);
    if (p->dim % be != 0 || p->ff % be != 0) {
        fprintf(stderr, "specd-mkmodel: --dtype %s needs --dim and --ff to be multiples of %zu\n",
                sd_dtype_name(p->dtype), be);
        return -1;
    }
    sd_dtype_block(p->norm_dtype, &be, NULL);
    if (p->dim % be != 0) {
        fprintf(stderr, "specd-mkmodel: --norm-dtype %s needs --dim to be a multiple of %zu\n",
                sd_dtype_name(p->norm_dtype), be);
        return -1;
    }
    return 0;
}

/* Returns 0 to go on, 1 for --help, -1 on a bad argument. */
static int parse_args(int argc, char **argv, mk_params *p) {
    *p = (mk_params){.arch = "llama",
                     .dim = 64,
                     .layers = 2,
                     .heads = 4,
                     .kv_heads = 2,
                     .ff = 128,
                     .vocab = 512,
                     .ctx = 2048,
                     .rope_base = 10000.0f,
                     .dtype = SD_DTYPE_F32,
                     .norm_dtype = SD_DTYPE_F32,
                     .seed = 1};
    bool vocab_set = false;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", mk_longs, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (!apply_option(c, optarg, p, &vocab_set)) return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "specd-mkmodel: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (check_format(p)) return -1;
    if (p->convert) return 0; /* the model's shape comes from FROM */
    return check_shape(p, vocab_set);
}

/* ---- tokenizer ---- */

/* UTF-8 of the GPT-2 byte-level symbol for byte b: printable bytes stand for
 * themselves, the others map to U+0100 + n in byte order. Returns the length. */
static int byte_symbol(int b, char out[4]) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    out[2] = 0;
    return 2;
}

typedef struct str_list {
    char **items;
    size_t n, cap;
} str_list;

static bool list_push(str_list *l, char *s) { /* takes s */
    if (!s) return false;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        char **p = realloc(l->items, cap * sizeof *p);
        if (!p) {
            free(s);
            return false;
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = s;
    return true;
}

static void list_free(str_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    *l = (str_list){0};
}

static char *concat(const char *a, const char *sep, const char *b) {
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s", a, sep, b);
    return s;
}

/* Adds token a+b and its merge "a b". */
static bool add_merge(str_list *tokens, str_list *merges, const char *a, const char *b) {
    return list_push(tokens, concat(a, "", b)) && list_push(merges, concat(a, " ", b));
}

/* vocab tokens, then unused "[PADn]" ones up to pad (llama.cpp's converter
 * pads Qwen's tokenizer to the embedding's rows so). */
static sd_status write_synthetic_tokenizer(sd_gguf_writer *w, uint32_t vocab, uint32_t pad) {
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
    const size_t n_letters = sizeof letters - 1;
    str_list tokens = {0}, merges = {0};
    sd_status s = SD_ERR_NOMEM;
    const uint32_t n_text = vocab;
    vocab = pad > vocab ? pad : vocab;
    int32_t *types = malloc(vocab * sizeof *types);
    bool ok = types != NULL;
    const char *control[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; ok && i < 3; i++) ok = list_push(&tokens, strdup(control[i]));
    for (int b = 0; ok && b < 256; b++) {
        char sym[4];
        byte_symbol(b, sym);
        ok = list_push(&tokens, strdup(sym));
    }
    char space[4], letter[26][2];
    byte_symbol(' ', space);
    for (size_t i = 0; i < n_letters; i++) letter[i][0] = letters[i], letter[i][1] = 0;
    /* Level 1: " x" and "xy"; level k+1: every level-k token extended by a letter. */
    size_t level_begin = tokens.n;
    for (size_t i = 0; ok && i < n_letters && tokens.n < n_text; i++) ok = add_merge(&tokens, &merges, space, letter[i]);
    for (size_t i = 0; ok && i < n_letters && tokens.n < n_text; i++)
        for (size_t j = 0; ok && j < n_letters && tokens.n < n_text; j++)
            ok = add_merge(&tokens, &merges, letter[i], letter[j]);
    while (ok && tokens.n < n_text) {
        size_t level_end = tokens.n;
        for (size_t t = level_begin; ok && t < level_end && tokens.n < n_text; t++)
            for (size_t j = 0; ok && j < n_letters && tokens.n < n_text; j++)
                ok = add_merge(&tokens, &merges, tokens.items[t], letter[j]);
        level_begin = level_end;
    }
    char padname[32];
    while (ok && tokens.n < vocab) {
        snprintf(padname, sizeof padname, "[PAD%zu]", tokens.n);
        ok = list_push(&tokens, strdup(padname));
    }
    if (ok) {
        for (uint32_t i = 0; i < vocab; i++) types[i] = i < 3 ? 3 : i < n_text ? 1 : 5; /* control, normal, unused */
        sd_status st = SD_OK;
        if (st == SD_OK) st = sd_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
        if (st == SD_OK) st = sd_gguf_writer_set_str(w, "tokenizer.ggml.pre", "smollm");
        if (st == SD_OK)
            st = sd_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens.items, tokens.n);
        if (st == SD_OK) st = sd_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", SD_GGUF_TYPE_INT32, types, vocab);
        if (st == SD_OK)
            st = sd_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges.items, merges.n);
        if (st == SD_OK) st = sd_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        if (st == SD_OK) st = sd_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
        if (st == SD_OK) st = sd_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        if (st == SD_OK) st = sd_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 2);
        if (st == SD_OK) st = sd_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
        if (st == SD_OK) st = sd_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
        s = st;
    }
    free(types);
    list_free(&tokens);
    list_free(&merges);
    return s;
}

/* ---- weights ---- */

/* Adds a tensor of shape ne (n_dims dims) drawn as mean + std * N(0, 1) from
 * the stream for tensor number index, stored as dtype. */
static sd_status add_random(sd_gguf_writer *w, const mk_params *p, uint32_t index, const char *name, sd_dtype dtype,
                            uint32_t n_dims, const uint64_t *ne, float mean, float std) {
    size_t n = 1, be, bb;
    for (uint32_t d = 0; d < n_dims; d++) n *= (size_t)ne[d];
    sd_dtype_block(dtype, &be, &bb);
    float *vals = malloc(n * sizeof *vals);
    void *enc = malloc(n / be * bb);
    sd_status s = SD_ERR_NOMEM;
    if (vals && enc) {
        uint64_t state = p->seed ^ (0x632be59bd9b4e019ull * (index + 1));
        for (size_t i = 0; i < n; i++) vals[i] = mean + std * normal(&state);
        s = sd_quantize(dtype, vals, n, enc);
        if (s == SD_OK) s = sd_gguf_writer_add_tensor(w, name, dtype, n_dims, ne, enc);
    }
    if (s != SD_OK) fprintf(stderr, "specd-mkmodel: cannot make tensor %s: %s\n", name, sd_status_str(s));
    free(vals);
    free(enc);
    return s;
}

/* The 1-D tensors an architecture adds to layer l, drawn after the layer's
 * others (so a llama model's numbers do not move). */
static sd_status write_arch_tensors(sd_gguf_writer *w, const mk_params *p, uint32_t l, uint32_t *index) {
    const uint64_t hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    const uint64_t q_dim = p->heads * hd, kv_dim = p->kv_heads * hd, dim = p->dim;
    const bool qwen2 = strcmp(p->arch, "qwen2") == 0, gemma = strcmp(p->arch, "gemma3") == 0;
    const bool qk_norm = gemma || strcmp(p->arch, "qwen3") == 0;
    const struct {
        bool on;
        const char *suffix;
        uint64_t n;
        float mean, std;
    } extra[] = {
        {qwen2, "attn_q.bias", q_dim, 0.0f, 0.1f},
        {qwen2, "attn_k.bias", kv_dim, 0.0f, 0.1f},
        {qwen2, "attn_v.bias", kv_dim, 0.0f, 0.1f},
        {qk_norm, "attn_q_norm.weight", hd, 1.0f, 0.1f},
        {qk_norm, "attn_k_norm.weight", hd, 1.0f, 0.1f},
        {gemma, "post_attention_norm.weight", dim, 1.0f, 0.1f},
        {gemma, "post_ffw_norm.weight", dim, 1.0f, 0.1f},
    };
    char name[96];
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        if (!extra[i].on) continue;
        snprintf(name, sizeof name, "blk.%u.%s", l, extra[i].suffix);
        SD_TRY(add_random(w, p, (*index)++, name, SD_DTYPE_F32, 1, (uint64_t[]){extra[i].n}, extra[i].mean,
                          extra[i].std));
    }
    return SD_OK;
}

static sd_status write_weights(sd_gguf_writer *w, const mk_params *p) {
    const uint64_t hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    const uint64_t dim = p->dim, q_dim = p->heads * hd, kv_dim = p->kv_heads * hd;
    const uint64_t ff = p->ff, vocab = p->vocab;
    const float inv_sqrt_dim = 1.0f / sqrtf((float)dim);
    const bool phi3 = strcmp(p->arch, "phi3") == 0; /* fused attn_qkv and gate/up (ffn_up of 2 x ff rows) */
    uint32_t index = 0;
    SD_TRY(add_random(w, p, index++, "token_embd.weight", p->dtype, 2, (uint64_t[]){dim, vocab}, 0.0f, inv_sqrt_dim));
    SD_TRY(add_random(w, p, index++, "output_norm.weight", p->norm_dtype, 1, (uint64_t[]){dim}, 1.0f, 0.1f));
    if (!p->tied)
        SD_TRY(add_random(w, p, index++, "output.weight", p->dtype, 2, (uint64_t[]){dim, vocab}, 0.0f,
                          2.0f * inv_sqrt_dim));
    for (uint32_t l = 0; l < p->layers; l++) {
        char name[96];
#define BLK(suffix) (snprintf(name, sizeof name, "blk.%u." suffix, l), name)
        SD_TRY(add_random(w, p, index++, BLK("attn_norm.weight"), p->norm_dtype, 1, (uint64_t[]){dim}, 1.0f, 0.1f));
        if (phi3) {
            SD_TRY(add_random(w, p, index++, BLK("attn_qkv.weight"), p->dtype, 2,
                              (uint64_t[]){dim, q_dim + 2 * kv_dim}, 0.0f, inv_sqrt_dim));
        } else {
            SD_TRY(add_random(w, p, index++, BLK("attn_q.weight"), p->dtype, 2, (uint64_t[]){dim, q_dim}, 0.0f,
                              inv_sqrt_dim));
            SD_TRY(add_random(w, p, index++, BLK("attn_k.weight"), p->dtype, 2, (uint64_t[]){dim, kv_dim}, 0.0f,
                              inv_sqrt_dim));
            SD_TRY(add_random(w, p, index++, BLK("attn_v.weight"), p->dtype, 2, (uint64_t[]){dim, kv_dim}, 0.0f,
                              inv_sqrt_dim));
        }
        SD_TRY(add_random(w, p, index++, BLK("attn_output.weight"), p->dtype, 2, (uint64_t[]){q_dim, dim}, 0.0f,
                          1.0f / sqrtf((float)q_dim)));
        SD_TRY(add_random(w, p, index++, BLK("ffn_norm.weight"), p->norm_dtype, 1, (uint64_t[]){dim}, 1.0f, 0.1f));
        if (!phi3)
            SD_TRY(add_random(w, p, index++, BLK("ffn_gate.weight"), p->dtype, 2, (uint64_t[]){dim, ff}, 0.0f,
                              inv_sqrt_dim));
        SD_TRY(add_random(w, p, index++, BLK("ffn_up.weight"), p->dtype, 2, (uint64_t[]){dim, phi3 ? 2 * ff : ff},
                          0.0f, inv_sqrt_dim));
        SD_TRY(add_random(w, p, index++, BLK("ffn_down.weight"), p->dtype, 2, (uint64_t[]){ff, dim}, 0.0f,
                          1.0f / sqrtf((float)ff)));
#undef BLK
    }
    for (uint32_t l = 0; l < p->layers; l++) SD_TRY(write_arch_tensors(w, p, l, &index));
    if (p->longrope) SD_TRY(mk_write_longrope(w, p->arch, (uint32_t)hd, p->ctx, p->longrope, p->seed));
    return SD_OK;
}

static uint32_t file_type(sd_dtype t) { /* llama.cpp's general.file_type (LLAMA_FTYPE_*) */
    switch (t) {
    case SD_DTYPE_F32: return 0;
    case SD_DTYPE_F16: return 1;
    case SD_DTYPE_Q4_0: return 2;
    case SD_DTYPE_Q4_1: return 3;
    case SD_DTYPE_Q5_0: return 8;
    case SD_DTYPE_Q5_1: return 9;
    case SD_DTYPE_Q8_0: return 7;
    case SD_DTYPE_BF16: return 32;
    case SD_DTYPE_Q4_K: return 14; /* MOSTLY_Q4_K_S: every matrix Q4_K */
    case SD_DTYPE_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case SD_DTYPE_Q6_K: return 18;
    }
    return 0;
}

static sd_status write_metadata(sd_gguf_writer *w, const mk_params *p) {
    const uint32_t hd = p->head_dim ? p->head_dim : p->dim / p->heads;
    char key[96], name[64];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", p->arch, suffix), key)
    /* not "phi3" in the name: llama.cpp keys Phi-3's special-token rules on
     * general.name and then looks up "</s>", which the synthetic vocabulary lacks */
    const bool phi3 = strcmp(p->arch, "phi3") == 0;
    snprintf(name, sizeof name, "specd-mkmodel random %s", p->mistral ? "mistral" : phi3 ? "fused-qkv" : p->arch);
    SD_TRY(sd_gguf_writer_set_str(w, "general.architecture", p->arch));
    SD_TRY(sd_gguf_writer_set_str(w, "general.name", name));
    SD_TRY(sd_gguf_writer_set_u32(w, "general.file_type", file_type(p->dtype)));
    SD_TRY(sd_gguf_writer_set_u32(w, "general.quantization_version", 2));
    SD_TRY(sd_gguf_writer_set_u32(w, K("context_length"), p->ctx));
    SD_TRY(sd_gguf_writer_set_u32(w, K("embedding_length"), p->dim));
    SD_TRY(sd_gguf_writer_set_u32(w, K("block_count"), p->layers));
    SD_TRY(sd_gguf_writer_set_u32(w, K("feed_forward_length"), p->ff));
    SD_TRY(sd_gguf_writer_set_u32(w, K("attention.head_count"), p->heads));
    SD_TRY(sd_gguf_writer_set_u32(w, K("attention.head_count_kv"), p->kv_heads));
    SD_TRY(sd_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f));
    SD_TRY(sd_gguf_writer_set_f32(w, K("rope.freq_base"), p->rope_base));
    SD_TRY(sd_gguf_writer_set_u32(w, K("rope.dimension_count"), hd));
    if (p->head_dim) {
        SD_TRY(sd_gguf_writer_set_u32(w, K("attention.key_length"), hd));
        SD_TRY(sd_gguf_writer_set_u32(w, K("attention.value_length"), hd));
    }
    if (p->window) SD_TRY(sd_gguf_writer_set_u32(w, K("attention.sliding_window"), p->window));
    SD_TRY(sd_gguf_writer_set_u32(w, K("vocab_size"), p->vocab));
#undef K
    return SD_OK;
}

/* Copies every tokenizer.* key of path into w and sets p->vocab. */
static sd_status copy_tokenizer(sd_gguf_writer *w, mk_params *p) {
    char err[512];
    sd_gguf *src = NULL;
    sd_status s = sd_gguf_open(p->tokenizer_from, &src, err, sizeof err);
    if (s != SD_OK) {
        fprintf(stderr, "specd-mkmodel: %s: %s\n", p->tokenizer_from, err);
        return s;
    }
    sd_gguf_type et;
    uint64_t n = 0;
    s = sd_gguf_get_arr(src, "tokenizer.ggml.tokens", &et, &n);
    if (s != SD_OK || et != SD_GGUF_TYPE_STRING || n == 0 || n > MAX_VOCAB) {
        fprintf(stderr, "specd-mkmodel: %s has no usable tokenizer.ggml.tokens string array\n", p->tokenizer_from);
        s = SD_ERR_FORMAT;
    } else {
        p->vocab = (uint32_t)n;
        s = sd_gguf_writer_copy_kv(w, src, "tokenizer.");
    }
    sd_gguf_close(&src);
    return s;
}

/* --requant: every metadata entry of FROM, its 1-D tensors as they are and
 * its 2-D tensors dequantized and quantized again to p->dtype (rows whose
 * length is not a multiple of the block size are kept as they are). */
static sd_status requant(sd_gguf_writer *w, const mk_params *p) {
    char err[512];
    sd_gguf *src = NULL;
    sd_status s = sd_gguf_open(p->requant_from, &src, err, sizeof err);
    if (s != SD_OK) {
        fprintf(stderr, "specd-mkmodel: %s: %s\n", p->requant_from, err);
        return s;
    }
    s = sd_gguf_writer_copy_kv(w, src, "");
    size_t block_elems, block_bytes;
    sd_dtype_block(p->dtype, &block_elems, &block_bytes);
    for (int64_t i = 0; s == SD_OK && i < sd_gguf_n_tensors(src); i++) {
        const sd_gguf_tensor *t = sd_gguf_tensor_at(src, i);
        if (t->n_dims != 2 || t->ne[0] % block_elems != 0 || t->type == p->dtype) {
            s = sd_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        float *f = malloc(t->n_elems * sizeof *f);
        void *q = malloc(t->n_elems / block_elems * block_bytes);
        s = f && q ? sd_dequantize(t->type, t->data, t->n_elems, f) : SD_ERR_NOMEM;
        if (s == SD_OK) s = sd_quantize(p->dtype, f, t->n_elems, q);
        if (s == SD_OK) s = sd_gguf_writer_add_tensor(w, t->name, p->dtype, t->n_dims, t->ne, q);
        free(f);
        free(q);
    }
    sd_gguf_close(&src);
    return s;
}

/* --format hf: the GGUF goes to a scratch file inside the directory, is
 * rewritten as the checkpoint, and removed. */
static sd_status write_hf(const sd_gguf_writer *w, const mk_params *p) {
    mk_hf_params hp = {.dir = p->out,
                       .n_shards = p->shards ? p->shards : 1,
                       .force_dtype = p->convert && p->dtype_set,
                       .dtype = p->dtype};
    char err[512];
    sd_gguf *g = NULL;
    if (p->convert) {
        sd_status s = sd_gguf_open(p->convert, &g, err, sizeof err);
        if (s != SD_OK) {
            fprintf(stderr, "specd-mkmodel: %s: %s\n", p->convert, err);
            return s;
        }
        s = mk_write_hf(g, &hp); /* any architecture the engine reads (mk_write_hf checks) */
        sd_gguf_close(&g);
        return s;
    }
    if (mkdir(p->out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "specd-mkmodel: cannot create %s: %s\n", p->out, strerror(errno));
        return SD_ERR_IO;
    }
    size_t n = strlen(p->out) + 32;
    char *tmp = malloc(n);
    if (!tmp) return SD_ERR_NOMEM;
    snprintf(tmp, n, "%s/.mkmodel-source.gguf", p->out);
    sd_status s = sd_gguf_writer_write(w, tmp);
    if (s == SD_OK) s = sd_gguf_open(tmp, &g, err, sizeof err);
    if (s == SD_OK) s = mk_write_hf(g, &hp);
    sd_gguf_close(&g);
    unlink(tmp);
    free(tmp);
    return s;
}

int main(int argc, char **argv) {
    mk_params p;
    int rc = parse_args(argc, argv, &p);
    if (rc != 0) return rc > 0 ? 0 : 2;
    sd_gguf_writer *w = sd_gguf_writer_new();
    if (!w) return 1;
    sd_status s = SD_OK;
    if (p.requant_from) {
        s = requant(w, &p);
    } else if (!p.convert) {
        s = p.tokenizer_from ? copy_tokenizer(w, &p) : write_synthetic_tokenizer(w, p.vocab, p.pad_vocab);
        if (p.pad_vocab > p.vocab) p.vocab = p.pad_vocab; /* the embedding's rows */
        if (s == SD_OK) s = write_metadata(w, &p);
        if (s == SD_OK) s = write_weights(w, &p);
    }
    if (s == SD_OK) s = p.hf ? write_hf(w, &p) : sd_gguf_writer_write(w, p.out);
    sd_gguf_writer_free(&w);
    if (s != SD_OK) {
        fprintf(stderr, "specd-mkmodel: failed: %s\n", sd_status_str(s));
        return 1;
    }
    return 0;
}
