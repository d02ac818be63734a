/* test_model.c — unit tests of the Llama model and its forward pass
 * (engine/model.c, engine/cpu/).
 *
 * Small random Llama models are written with the GGUF writer inside the test
 * (several shapes: GQA groups of 1/2/4/8, head_dim 16/32, odd n_ff and
 * vocabulary sizes), then checked for:
 *   - batch invariance, bit for bit: a sequence's logits are identical alone,
 *     beside 1-3 interleaved sequences, chunked 1+1+..., 3+5 or all at once,
 *     with 1 or 2 threads and different KV block sizes;
 *   - agreement with a naive double-precision forward written here (sanity
 *     of the numbers, incl. linear and llama3 rope scaling and GQA);
 *   - KV rollback: truncate + re-append equals a fresh computation;
 *   - self-draft (n_layers_used = L) equals a model that only has L layers;
 *   - bad batches and OUT_OF_BLOCKS are refused and leave the cache unchanged;
 *   - config validation (architecture, shapes, head counts, vocab fallback). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/gguf.h"
#include "specd/model.h"

/* ------------------------------------------------------------ model maker */

typedef struct spec {
    int embd, heads, kv_heads, layers, ff, vocab;
    int write_layers; /* layers actually written (0 = layers) */
    bool untied;      /* write output.weight */
    const char *arch; /* NULL = "llama" */
    int rope_scaling; /* 0 none, 1 linear, 2 llama3 */
    float rope_factor;
    int vocab_source;          /* 0 llama.vocab_size, 1 tokenizer tokens, 2 token_embd only */
    const char *bad_tensor;    /* write this tensor with a wrong shape */
    const char *skip_tensor;   /* leave this tensor out */
    sd_dtype matrix_type;      /* type of 2-D weights (F32 default) */
    const char *poison_tensor; /* write poison_value into this tensor at element poison_at */
    float poison_value;
    uint64_t poison_at;
} spec;

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Deterministic uniform floats in [-1, 1) from a per-tensor seed. */
static float next_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static void add_tensor(sd_gguf_writer *w, const spec *sp, const char *name, uint64_t ne0, uint64_t ne1, float center,
                       float amp) {
    bool bad = sp->bad_tensor && strcmp(sp->bad_tensor, name) == 0;
    if (sp->skip_tensor && strcmp(sp->skip_tensor, name) == 0) return;
    uint64_t ne[2] = {ne0 + (bad ? 8 : 0), ne1};
    uint32_t n_dims = ne1 ? 2 : 1;
    uint64_t n = ne[0] * (ne1 ? ne1 : 1);
    float *data = malloc(n * sizeof(float));
    assert_non_null(data);
    uint64_t st = fnv(name);
    for (uint64_t i = 0; i < n; i++) data[i] = center + amp * next_uniform(&st);
    if (sp->poison_tensor && strcmp(sp->poison_tensor, name) == 0) data[sp->poison_at % n] = sp->poison_value;
    sd_dtype type = n_dims == 2 ? sp->matrix_type : SD_DTYPE_F32;
    if (type != SD_DTYPE_F32) {
        void *q = malloc(n * sizeof(float));
        assert_non_null(q);
        assert_int_equal(sd_quantize(type, data, n, q), SD_OK);
        assert_int_equal(sd_gguf_writer_add_tensor(w, name, type, n_dims, ne, q), SD_OK);
        free(q);
    } else {
        assert_int_equal(sd_gguf_writer_add_tensor(w, name, type, n_dims, ne, data), SD_OK);
    }
    free(data);
}

/* Writes the model described by sp to a temp file and opens it. */
static sd_gguf *make_gguf(const spec *sp) {
    int hd = sp->embd / sp->heads;
    int layers = sp->write_layers ? sp->write_layers : sp->layers;
    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(sd_gguf_writer_set_str(w, "general.architecture", sp->arch ? sp->arch : "llama"), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.context_length", 256), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)sp->embd), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)layers), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)sp->ff), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)sp->heads), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)sp->kv_heads), SD_OK);
    assert_int_equal(sd_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd), SD_OK);
    assert_int_equal(sd_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), SD_OK);
    assert_int_equal(sd_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f), SD_OK);
    if (sp->rope_scaling) {
        assert_int_equal(
            sd_gguf_writer_set_str(w, "llama.rope.scaling.type", sp->rope_scaling == 1 ? "linear" : "llama3"), SD_OK);
        assert_int_equal(sd_gguf_writer_set_f32(w, "llama.rope.scaling.factor", sp->rope_factor), SD_OK);
        if (sp->rope_scaling == 2) {
            assert_int_equal(sd_gguf_writer_set_f32(w, "llama.rope.scaling.low_freq_factor", 1.0f), SD_OK);
            assert_int_equal(sd_gguf_writer_set_f32(w, "llama.rope.scaling.high_freq_factor", 4.0f), SD_OK);
            assert_int_equal(sd_gguf_writer_set_u32(w, "llama.rope.scaling.original_context_length", 64), SD_OK);
        }
    }
    if (sp->vocab_source == 0) {
        assert_int_equal(sd_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)sp->vocab), SD_OK);
    } else if (sp->vocab_source == 1) {
        char **toks = calloc((size_t)sp->vocab, sizeof *toks);
        assert_non_null(toks);
        for (int i = 0; i < sp->vocab; i++) {
            toks[i] = malloc(16);
            snprintf(toks[i], 16, "t%d", i);
        }
        assert_int_equal(
            sd_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)sp->vocab),
            SD_OK);
        for (int i = 0; i < sp->vocab; i++) free(toks[i]);
        free(toks);
    }
    uint64_t E = (uint64_t)sp->embd, V = (uint64_t)sp->vocab, F = (uint64_t)sp->ff;
    uint64_t KD = (uint64_t)(sp->kv_heads * hd);
    add_tensor(w, sp, "token_embd.weight", E, V, 0.0f, 1.0f);
    add_tensor(w, sp, "output_norm.weight", E, 0, 1.0f, 0.2f);
    if (sp->untied) add_tensor(w, sp, "output.weight", E, V, 0.0f, 1.0f / sqrtf((float)E));
    char name[64];
    for (int l = 0; l < layers; l++) {
#define T(suffix, ne0, ne1, c, a)                               \
    snprintf(name, sizeof name, "blk.%d." suffix ".weight", l); \
    add_tensor(w, sp, name, ne0, ne1, c, a);
        float se = 1.0f / sqrtf((float)E), sf = 1.0f / sqrtf((float)F);
        T("attn_norm", E, 0, 1.0f, 0.2f)
        T("attn_q", E, E, 0.0f, 2.0f * se)
        T("attn_k", E, KD, 0.0f, 2.0f * se)
        T("attn_v", E, KD, 0.0f, se)
        T("attn_output", E, E, 0.0f, se)
        T("ffn_norm", E, 0, 1.0f, 0.2f)
        T("ffn_gate", E, F, 0.0f, 2.0f * se)
        T("ffn_up", E, F, 0.0f, se)
        T("ffn_down", F, E, 0.0f, sf)
#undef T
    }
    char path[] = "/tmp/specd_test_model_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(sd_gguf_writer_write(w, path), SD_OK);
    sd_gguf_writer_free(&w);
    sd_gguf *g = NULL;
    char err[256];
    sd_status s = sd_gguf_open(path, &g, err, sizeof err);
    unlink(path);
    if (s != SD_OK) fail_msg("gguf open: %s", err);
    return g;
}

static sd_model *load(const sd_gguf *g, int n_threads, int n_layers_used) {
    sd_model_params p = sd_model_default_params();
    p.n_threads = n_threads;
    p.n_layers_used = n_layers_used;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &p, &m), SD_OK);
    assert_non_null(m);
    return m;
}

static sd_kv *make_kv(const sd_model *m, int max_seqs, int n_blocks, int block_size) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, max_seqs, n_blocks, block_size, &kv), SD_OK);
    return kv;
}

static int token_of(int seq, int i, int vocab) {
    return (int)((unsigned)(seq * 7919 + i * 104729 + 13) % (unsigned)vocab);
}

/* ---------------------------------------------------- batch runner helpers */

/* Runs a batch built from parallel arrays; every row's logits wanted. */
static sd_status run(sd_model *m, sd_kv *kv, int n, const int32_t *tok, const int32_t *pos, const int32_t *seq,
                     float *out) {
    bool want[256];
    assert_true(n <= 256);
    for (int i = 0; i < n; i++) want[i] = true;
    sd_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    return sd_model_forward(m, kv, &b, out);
}

/* Logits [len][V] of seq_id's tokens 0..len-1 computed alone, all at once. */
static float *alone(sd_model *m, int seq_id, int len) {
    int V = sd_model_config_of(m)->n_vocab;
    sd_kv *kv = make_kv(m, 1, 64, 16);
    int32_t tok[64], pos[64], seq[64];
    for (int i = 0; i < len; i++) {
        tok[i] = token_of(seq_id, i, V);
        pos[i] = i;
        seq[i] = 0;
    }
    float *out = malloc((size_t)len * (size_t)V * sizeof(float));
    assert_int_equal(run(m, kv, len, tok, pos, seq, out), SD_OK);
    sd_kv_free(&kv);
    return out;
}

/* Runs seq ids ids[0..n_seqs) (lengths lens) in slots 0..n_seqs-1, chunk by
 * chunk: each call takes up to chunk[c] tokens from every sequence,
 * interleaving them round-robin. Collects each sequence's logits. */
static void composed(sd_model *m, int n_seqs, const int *ids, const int *lens, const int *chunks, int n_chunks,
                     int block_size, float **outs) {
    int V = sd_model_config_of(m)->n_vocab;
    sd_kv *kv = make_kv(m, n_seqs + 1, 64, block_size);
    int done[4] = {0};
    float *buf = malloc((size_t)256 * (size_t)V * sizeof(float));
    int row_seq[256], row_pos[256];
    for (int c = 0; c < n_chunks; c++) {
        int32_t tok[256], pos[256], seq[256];
        int n = 0, take[4];
        for (int s = 0; s < n_seqs; s++) {
            take[s] = lens[s] - done[s] < chunks[c] ? lens[s] - done[s] : chunks[c];
        }
        for (int k = 0; k < chunks[c]; k++)
            for (int s = 0; s < n_seqs; s++)
                if (k < take[s]) {
                    int p = done[s] + k;
                    tok[n] = token_of(ids[s], p, V);
                    pos[n] = p;
                    seq[n] = s + 1; /* slot 0 left unused on purpose */
                    row_seq[n] = s;
                    row_pos[n] = p;
                    n++;
                }
        if (n == 0) continue;
        assert_int_equal(run(m, kv, n, tok, pos, seq, buf), SD_OK);
        for (int r = 0; r < n; r++)
            memcpy(outs[row_seq[r]] + (size_t)row_pos[r] * (size_t)V, buf + (size_t)r * (size_t)V,
                   (size_t)V * sizeof(float));
        for (int s = 0; s < n_seqs; s++) done[s] += take[s];
    }
    for (int s = 0; s < n_seqs; s++) assert_int_equal(done[s], lens[s]);
    free(buf);
    sd_kv_free(&kv);
}

static void assert_bits_equal(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, n * sizeof(float)) == 0) return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fail_msg("%s: first difference at %zu: %.9g vs %.9g", what, i, (double)a[i], (double)b[i]);
        }
}

/* ------------------------------------------------- naive reference forward */

/* Double-precision Llama forward of one sequence, contiguous KV, written
 * independently of engine/ (weights read through sd_dequantize). */
typedef struct ref_model {
    int E, H, KV, D, F, V, L;
    double eps, base;
    int scaling;
    double factor;
    float *embd, *onorm, *out;
    float *w[64][9];
} ref_model;

static float *deq(const sd_gguf *g, const char *name) {
    const sd_gguf_tensor *t = sd_gguf_find_tensor(g, name);
    assert_non_null(t);
    float *f = malloc(t->n_elems * sizeof(float));
    assert_int_equal(sd_dequantize(t->type, t->data, t->n_elems, f), SD_OK);
    return f;
}

static void ref_load(ref_model *r, const sd_gguf *g, const spec *sp) {
    r->E = sp->embd;
    r->H = sp->heads;
    r->KV = sp->kv_heads;
    r->D = sp->embd / sp->heads;
    r->F = sp->ff;
    r->V = sp->vocab;
    r->L = sp->layers;
    r->eps = 1e-5;
    r->base = 10000.0;
    r->scaling = sp->rope_scaling;
    r->factor = sp->rope_factor;
    r->embd = deq(g, "token_embd.weight");
    r->onorm = deq(g, "output_norm.weight");
    r->out = sp->untied ? deq(g, "output.weight") : r->embd;
    static const char *const names[9] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                                         "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    char name[64];
    for (int l = 0; l < r->L; l++)
        for (int k = 0; k < 9; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[k]);
            r->w[l][k] = deq(g, name);
        }
}

static void ref_free(ref_model *r) {
    if (r->out != r->embd) free(r->out);
    free(r->embd);
    free(r->onorm);
    for (int l = 0; l < r->L; l++)
        for (int k = 0; k < 9; k++) free(r->w[l][k]);
}

static void ref_norm(const double *x, const float *w, int n, double eps, double *o) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) o[i] = x[i] * sc * w[i];
}

static void ref_mv(const float *w, int n_in, int n_out, const double *x, double *y) {
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++) s += (double)w[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static double ref_freq(const ref_model *r, int i) {
    double f = pow(r->base, -2.0 * i / r->D);
    if (r->scaling == 1) return f / r->factor;
    if (r->scaling == 2) { /* Llama 3.1 rule, orig ctx 64, low 1, high 4 */
        double wl = 2 * M_PI / f, lo = 64.0 / 1.0, hi = 64.0 / 4.0;
        if (wl < hi) return f;
        if (wl > lo) return f / r->factor;
        double sm = (64.0 / wl - 1.0) / (4.0 - 1.0);
        return (1 - sm) * f / r->factor + sm * f;
    }
    return f;
}

static void ref_rope(const ref_model *r, double *v, int n_heads, int p) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < r->D / 2; i++) {
            double th = p * ref_freq(r, i), c = cos(th), s = sin(th);
            double *x = v + h * r->D + 2 * i, x0 = x[0], x1 = x[1];
            x[0] = x0 * c - x1 * s;
            x[1] = x0 * s + x1 * c;
        }
}

/* logits [len][V] (float) of tokens of seq_id 0..len-1 */
static float *ref_forward(const ref_model *r, int seq_id, int len) {
    int E = r->E, D = r->D, KD = r->KV * D, F = r->F;
    double *x = calloc((size_t)len * E, sizeof(double));
    double *xn = calloc(E, sizeof(double)), *q = calloc(E, sizeof(double)), *att = calloc(E, sizeof(double));
    double *g = calloc(F, sizeof(double)), *u = calloc(F, sizeof(double)), *tmp = calloc(E, sizeof(double));
    double *K = calloc((size_t)len * KD, sizeof(double)), *Vc = calloc((size_t)len * KD, sizeof(double));
    double *sc = calloc(len, sizeof(double)), *lg = calloc(r->V, sizeof(double));
    float *out = malloc((size_t)len * r->V * sizeof(float));
    for (int t = 0; t < len; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = r->embd[(size_t)token_of(seq_id, t, r->V) * E + i];
    for (int l = 0; l < r->L; l++) {
        float *const *w = r->w[l];
        for (int t = 0; t < len; t++) { /* K, V of every token first */
            ref_norm(x + (size_t)t * E, w[0], E, r->eps, xn);
            ref_mv(w[2], E, KD, xn, K + (size_t)t * KD);
            ref_mv(w[3], E, KD, xn, Vc + (size_t)t * KD);
            ref_rope(r, K + (size_t)t * KD, r->KV, t);
        }
        for (int t = 0; t < len; t++) {
            double *xt = x + (size_t)t * E;
            ref_norm(xt, w[0], E, r->eps, xn);
            ref_mv(w[1], E, E, xn, q);
            ref_rope(r, q, r->H, t);
            for (int h = 0; h < r->H; h++) {
                int kh = h / (r->H / r->KV);
                double mx = -1e300, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double s = 0;
                    for (int d = 0; d < D; d++) s += q[h * D + d] * K[(size_t)p * KD + kh * D + d];
                    sc[p] = s / sqrt((double)D);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = 0; p <= t; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int p = 0; p <= t; p++) o += sc[p] * Vc[(size_t)p * KD + kh * D + d];
                    att[h * D + d] = o / sum;
                }
            }
            ref_mv(w[4], E, E, att, tmp);
            for (int i = 0; i < E; i++) xt[i] += tmp[i];
            ref_norm(xt, w[5], E, r->eps, xn);
            ref_mv(w[6], E, F, xn, g);
            ref_mv(w[7], E, F, xn, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            ref_mv(w[8], F, E, g, tmp);
            for (int i = 0; i < E; i++) xt[i] += tmp[i];
        }
    }
    for (int t = 0; t < len; t++) {
        ref_norm(x + (size_t)t * E, r->onorm, E, r->eps, xn);
        ref_mv(r->out, E, r->V, xn, lg);
        for (int v = 0; v < r->V; v++) out[(size_t)t * r->V + v] = (float)lg[v];
    }
    free(x), free(xn), free(q), free(att), free(g), free(u), free(tmp), free(K), free(Vc), free(sc), free(lg);
    return out;
}

/* ------------------------------------------------------------------ tests */

static int n_error_lines;
static char first_error[512]; /* the first error line since the last reset */
static void count_sink(sd_log_level level, const char *line, void *user) {
    (void)user;
    if (level == SD_LOG_ERROR && !first_error[0]) snprintf(first_error, sizeof first_error, "%s", line);
    if (level == SD_LOG_ERROR) n_error_lines++;
    if (getenv("TEST_MODEL_VERBOSE")) fprintf(stderr, "%s\n", line);
}

static int setup(void **state) {
    (void)state;
    n_error_lines = 0;
    sd_log_set(count_sink, NULL, SD_LOG_WARN, "test_model");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    sd_log_set(NULL, NULL, SD_LOG_INFO, "test_model");
    return 0;
}

static const spec shapes[] = {
    /* embd heads kv layers ff vocab */
    {.embd = 64, .heads = 4, .kv_heads = 1, .layers = 2, .ff = 96, .vocab = 97},
    {.embd = 128, .heads = 4, .kv_heads = 2, .layers = 3, .ff = 200, .vocab = 301, .untied = true},
    {.embd = 128, .heads = 8, .kv_heads = 4, .layers = 2, .ff = 96, .vocab = 256},
    {.embd = 64, .heads = 2, .kv_heads = 2, .layers = 2, .ff = 136, .vocab = 130, .untied = true},
    {.embd = 128,
     .heads = 8,
     .kv_heads = 1,
     .layers = 2,
     .ff = 256,
     .vocab = 200,
     .rope_scaling = 2,
     .rope_factor = 8.0f},
};

/* (1) batch invariance across compositions and thread counts, bit-exact,
 * plus (sanity) closeness to the double-precision reference. */
static void test_batch_invariance(void **state) {
    (void)state;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const spec *sp = &shapes[si];
        sd_gguf *g = make_gguf(sp);
        sd_model *m1 = load(g, 1, 0), *m2 = load(g, 2, 0);
        const int V = sp->vocab, LEN = 8;
        const int ids[4] = {0, 1, 2, 3}, lens[4] = {LEN, 5, 11, 3};
        float *ref[4];
        for (int s = 0; s < 4; s++) ref[s] = alone(m1, ids[s], lens[s]);

        /* sanity: the engine agrees with an independent double forward */
        ref_model rm;
        memset(&rm, 0, sizeof rm);
        ref_load(&rm, g, sp);
        float *exact = ref_forward(&rm, ids[2], lens[2]);
        double max_err = 0, max_mag = 0;
        for (size_t i = 0; i < (size_t)lens[2] * (size_t)V; i++) {
            double d = fabs((double)exact[i] - (double)ref[2][i]);
            if (d > max_err) max_err = d;
            if (fabs((double)exact[i]) > max_mag) max_mag = fabs((double)exact[i]);
        }
        if (!(max_err <= 2e-4 * (1.0 + max_mag)))
            fail_msg("shape %zu: engine differs from reference by %g (logit scale %g)", si, max_err, max_mag);
        assert_true(max_mag > 0.1); /* the logits are not trivially zero */
        free(exact);
        ref_free(&rm);

        struct {
            int n_seqs;
            int chunks[12];
            int n_chunks;
            int block_size;
        } const comps[] = {
            {1, {1, 1, 1, 1, 1, 1, 1, 1}, 8, 16}, /* one token at a time */
            {1, {3, 5}, 2, 4},                    /* 3 + 5, small blocks */
            {1, {8}, 1, 3},                       /* all at once, odd block size */
            {2, {2, 6}, 2, 16},                   /* beside one other sequence */
            {3, {1, 4, 3, 3}, 4, 5},              /* beside two */
            {4, {8, 8}, 2, 16},                   /* beside three, ragged lengths */
            {4, {1, 1, 2, 1, 3, 1, 1, 1, 1}, 9, 2},
        };
        for (size_t ci = 0; ci < sizeof comps / sizeof comps[0]; ci++) {
            for (int th = 0; th < 2; th++) {
                sd_model *m = th ? m2 : m1;
                float *outs[4];
                for (int s = 0; s < 4; s++) outs[s] = calloc((size_t)lens[s] * (size_t)V, sizeof(float));
                composed(m, comps[ci].n_seqs, ids, lens, comps[ci].chunks, comps[ci].n_chunks, comps[ci].block_size,
                         outs);
                char what[96];
                for (int s = 0; s < comps[ci].n_seqs; s++) {
                    snprintf(what, sizeof what, "shape %zu composition %zu threads %d seq %d", si, ci, th + 1, s);
                    assert_bits_equal(ref[s], outs[s], (size_t)lens[s] * (size_t)V, what);
                }
                for (int s = 0; s < 4; s++) free(outs[s]);
            }
        }
        /* the 2-thread model alone, all at once */
        float *r2 = alone(m2, ids[0], LEN);
        assert_bits_equal(ref[0], r2, (size_t)LEN * (size_t)V, "2 threads alone");
        free(r2);
        for (int s = 0; s < 4; s++) free(ref[s]);
        sd_model_free(&m1);
        sd_model_free(&m2);
        assert_null(m1);
        sd_gguf_close(&g);
    }
}

/* The cut LM head (sd_model_forward_head): seq 0's len rows with logits of
 * the first n_head ids only, token by token then all at once, equal the
 * first n_head logits of ref (the full head's rows) bit for bit. */
static void check_head_cut(sd_model *m, const float *ref, int len, int n_head, const char *what) {
    const int V = sd_model_config_of(m)->n_vocab;
    int32_t tok[64], pos[64], seq[64] = {0};
    bool want[64];
    for (int i = 0; i < len; i++) {
        tok[i] = token_of(0, i, V);
        pos[i] = i;
        want[i] = true;
    }
    float *got = malloc((size_t)len * (size_t)n_head * sizeof(float));
    assert_non_null(got);
    for (int whole = 0; whole < 2; whole++) {
        sd_kv *kv = make_kv(m, 1, 16, 16);
        for (int i = 0; i < len; i += whole ? len : 1) {
            int n = whole ? len : 1;
            sd_batch b = {.n_tokens = n, .tokens = tok + i, .pos = pos + i, .seq = seq, .logits = want};
            assert_int_equal(sd_model_forward_head(m, kv, &b, n_head, got + (size_t)i * (size_t)n_head), SD_OK);
        }
        char row_what[128];
        for (int i = 0; i < len; i++) {
            snprintf(row_what, sizeof row_what, "%s: head of %d, row %d (%s)", what, n_head, i,
                     whole ? "one batch" : "token by token");
            assert_bits_equal(ref + (size_t)i * (size_t)V, got + (size_t)i * (size_t)n_head, (size_t)n_head, row_what);
        }
        sd_kv_free(&kv);
    }
    free(got);
}

/* Matrices kept as stored (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; the CPU computes on
 * the blocks, integer formats on 8-bit activations): a sequence's logits are
 * bit-identical alone, token by token, chunked, beside other sequences, with
 * 1 and 2 threads; KV rollback re-appends to the same bits; and the logits
 * stay near the double forward on the dequantized weights (F16 / BF16 as for
 * f32; the integer formats within 3% of the logit scale: 8-bit activation
 * rounding through 2 layers). Tied and untied heads. */
static void test_stored_formats(void **state) {
    (void)state;
    const sd_dtype types[] = {SD_DTYPE_F16,  SD_DTYPE_BF16, SD_DTYPE_Q8_0, SD_DTYPE_Q4_0, SD_DTYPE_Q4_1,
                              SD_DTYPE_Q5_0, SD_DTYPE_Q5_1, SD_DTYPE_Q4_K, SD_DTYPE_Q5_K, SD_DTYPE_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const bool k = sd_dtype_is_k(types[ti]); /* rows of whole 256-element super-blocks */
        spec sp = {.embd = k ? 256 : 128,
                   .heads = 4,
                   .kv_heads = 2,
                   .layers = 2,
                   .ff = k ? 512 : 96,
                   .vocab = 203,
                   .untied = ti % 2 == 1};
        sp.matrix_type = types[ti];
        sd_gguf *g = make_gguf(&sp);
        sd_model *m1 = load(g, 1, 0), *m2 = load(g, 2, 0);
        const int V = sp.vocab;
        const int ids[3] = {0, 1, 2}, lens[3] = {8, 5, 11};
        float *ref[3];
        for (int s = 0; s < 3; s++) ref[s] = alone(m1, ids[s], lens[s]);
        ref_model rm;
        memset(&rm, 0, sizeof rm);
        ref_load(&rm, g, &sp);
        float *exact = ref_forward(&rm, ids[2], lens[2]);
        double max_err = 0, max_mag = 0;
        for (size_t i = 0; i < (size_t)lens[2] * (size_t)V; i++) {
            max_err = fmax(max_err, fabs((double)exact[i] - (double)ref[2][i]));
            max_mag = fmax(max_mag, fabs((double)exact[i]));
        }
        double tol =
            types[ti] == SD_DTYPE_F16 || types[ti] == SD_DTYPE_BF16 ? 2e-4 * (1.0 + max_mag) : 3e-2 * (1.0 + max_mag);
        if (!(max_err <= tol))
            fail_msg("%s: engine differs from the dequantized reference by %g (logit scale %g)",
                     sd_dtype_name(types[ti]), max_err, max_mag);
        assert_true(max_mag > 0.1);
        free(exact);
        ref_free(&rm);
        struct {
            int n_seqs;
            int chunks[12];
            int n_chunks;
            int block_size;
        } const comps[] = {
            {1, {1, 1, 1, 1, 1, 1, 1, 1}, 8, 16},
            {1, {3, 5}, 2, 4},
            {3, {1, 4, 3, 3}, 4, 5},
            {3, {8, 8}, 2, 16},
        };
        for (size_t ci = 0; ci < sizeof comps / sizeof comps[0]; ci++)
            for (int th = 0; th < 2; th++) {
                float *outs[3];
                for (int s = 0; s < 3; s++) outs[s] = calloc((size_t)lens[s] * (size_t)V, sizeof(float));
                composed(th ? m2 : m1, comps[ci].n_seqs, ids, lens, comps[ci].chunks, comps[ci].n_chunks,
                         comps[ci].block_size, outs);
                char what[96];
                for (int s = 0; s < comps[ci].n_seqs; s++) {
                    snprintf(what, sizeof what, "%s composition %zu threads %d seq %d", sd_dtype_name(types[ti]), ci,
                             th + 1, s);
                    assert_bits_equal(ref[s], outs[s], (size_t)lens[s] * (size_t)V, what);
                }
                for (int s = 0; s < 3; s++) free(outs[s]);
            }
        /* a cut head gives the full head's first rows, at sizes on and off the tiles' widths */
        const int heads[] = {1, 3, 64, 101, V};
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
            check_head_cut(hi % 2 ? m1 : m2, ref[0], lens[0], heads[hi], sd_dtype_name(types[ti]));
        /* KV rollback: 5 tokens + 3 others, truncate to 5, re-append the first 3 */
        int32_t tok[8], alt[8], pos[8], seq[8] = {0};
        for (int i = 0; i < 8; i++) {
            tok[i] = token_of(0, i, V);
            alt[i] = i < 5 ? tok[i] : token_of(7, i, V);
            pos[i] = i;
        }
        float *got = malloc(8 * (size_t)V * sizeof(float));
        assert_non_null(got);
        sd_kv *kv = make_kv(m2, 1, 8, 4);
        assert_int_equal(run(m2, kv, 5, tok, pos, seq, got), SD_OK);
        assert_int_equal(run(m2, kv, 3, alt + 5, pos + 5, seq, got + 5 * (size_t)V), SD_OK);
        assert_int_equal(sd_kv_truncate(kv, 0, 5), SD_OK);
        assert_int_equal(run(m2, kv, 3, tok + 5, pos + 5, seq, got + 5 * (size_t)V), SD_OK);
        assert_bits_equal(ref[0], got, 8 * (size_t)V, "stored formats: rollback + re-append");
        free(got);
        sd_kv_free(&kv);
        for (int s = 0; s < 3; s++) free(ref[s]);
        sd_model_free(&m1);
        sd_model_free(&m2);
        sd_gguf_close(&g);
    }
}

/* An f16 KV cache (--kv-type f16): a sequence's logits are bit-identical
 * alone, token by token, chunked and beside other sequences, with 1 and 2
 * threads, and after a KV rollback; they stay within 1% of the logit scale
 * of the f32 cache's (each K/V value rounded once to 11 significant bits);
 * and they differ from them somewhere (the cache really is f16). */
static void test_kv_f16(void **state) {
    (void)state;
    spec sp = {.embd = 128, .heads = 4, .kv_heads = 2, .layers = 2, .ff = 96, .vocab = 203};
    sp.matrix_type = SD_DTYPE_Q8_0;
    sd_gguf *g = make_gguf(&sp);
    sd_model_params p = sd_model_default_params();
    sd_model *m32 = NULL, *m1 = NULL, *m2 = NULL;
    p.n_threads = 1;
    assert_int_equal(sd_model_load(g, &p, &m32), SD_OK);
    p.kv_type = SD_DTYPE_F16;
    assert_int_equal(sd_model_load(g, &p, &m1), SD_OK);
    p.n_threads = 2;
    assert_int_equal(sd_model_load(g, &p, &m2), SD_OK);
    const int V = sp.vocab;
    const int ids[3] = {0, 1, 2}, lens[3] = {8, 5, 11};
    float *ref[3];
    for (int s = 0; s < 3; s++) ref[s] = alone(m1, ids[s], lens[s]);
    float *f32 = alone(m32, ids[2], lens[2]);
    double max_err = 0, max_mag = 0;
    for (size_t i = 0; i < (size_t)lens[2] * (size_t)V; i++) {
        max_err = fmax(max_err, fabs((double)f32[i] - (double)ref[2][i]));
        max_mag = fmax(max_mag, fabs((double)f32[i]));
    }
    print_message("f16 KV vs f32 KV: max |diff| %g, logit scale %g\n", max_err, max_mag);
    assert_true(max_err > 0);
    assert_true(max_err <= 1e-2 * max_mag);
    free(f32);
    const int chunks[2][4] = {{1, 4, 3, 3}, {8, 8}};
    const int n_chunks[2] = {4, 2};
    for (int ci = 0; ci < 2; ci++)
        for (int th = 0; th < 2; th++) {
            float *outs[3];
            for (int s = 0; s < 3; s++) outs[s] = calloc((size_t)lens[s] * (size_t)V, sizeof(float));
            composed(th ? m2 : m1, 3, ids, lens, chunks[ci], n_chunks[ci], 4, outs);
            for (int s = 0; s < 3; s++) {
                char what[64];
                snprintf(what, sizeof what, "f16 KV composition %d threads %d seq %d", ci, th + 1, s);
                assert_bits_equal(ref[s], outs[s], (size_t)lens[s] * (size_t)V, what);
                free(outs[s]);
            }
        }
    int32_t tok[8], alt[8], pos[8], seq[8] = {0};
    for (int i = 0; i < 8; i++) {
        tok[i] = token_of(0, i, V);
        alt[i] = i < 5 ? tok[i] : token_of(7, i, V);
        pos[i] = i;
    }
    float *got = malloc(8 * (size_t)V * sizeof(float));
    assert_non_null(got);
    sd_kv *kv = make_kv(m2, 1, 8, 4);
    assert_int_equal(run(m2, kv, 5, tok, pos, seq, got), SD_OK);
    assert_int_equal(run(m2, kv, 3, alt + 5, pos + 5, seq, got + 5 * (size_t)V), SD_OK);
    assert_int_equal(sd_kv_truncate(kv, 0, 5), SD_OK);
    assert_int_equal(run(m2, kv, 3, tok + 5, pos + 5, seq, got + 5 * (size_t)V), SD_OK);
    assert_bits_equal(ref[0], got, 8 * (size_t)V, "f16 KV: rollback + re-append");
    free(got);
    sd_kv_free(&kv);
    for (int s = 0; s < 3; s++) free(ref[s]);
    sd_model_free(&m32);
    sd_model_free(&m1);
    sd_model_free(&m2);
    sd_gguf_close(&g);
}

/* Logits are wanted only for some rows: the rows come back in batch order
 * and equal the full computation's rows. */
static void test_wanted_rows(void **state) {
    (void)state;
    const spec *sp = &shapes[1];
    sd_gguf *g = make_gguf(sp);
    sd_model *m = load(g, 2, 0);
    int V = sp->vocab;
    float *ref = alone(m, 0, 6);
    sd_kv *kv = make_kv(m, 1, 8, 16);
    int32_t tok[6], pos[6], seq[6] = {0};
    bool want[6] = {false, true, false, false, true, true};
    for (int i = 0; i < 6; i++) {
        tok[i] = token_of(0, i, V);
        pos[i] = i;
    }
    float *out = malloc(3 * (size_t)V * sizeof(float));
    sd_batch b = {.n_tokens = 6, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    assert_bits_equal(ref + 1 * (size_t)V, out, (size_t)V, "row 1");
    assert_bits_equal(ref + 4 * (size_t)V, out + (size_t)V, (size_t)V, "row 4");
    assert_bits_equal(ref + 5 * (size_t)V, out + 2 * (size_t)V, (size_t)V, "row 5");
    /* no logits at all: out may be NULL */
    int32_t t6 = token_of(0, 6, V), p6 = 6;
    sd_batch b2 = {.n_tokens = 1, .tokens = &t6, .pos = &p6, .seq = seq, .logits = NULL};
    assert_int_equal(sd_model_forward(m, kv, &b2, NULL), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, 0), 7);
    free(out);
    free(ref);
    sd_kv_free(&kv);
    sd_model_free(&m);
    sd_gguf_close(&g);
}

/* (2) KV rollback: run 5 tokens + 3 "draft" tokens, truncate to 5, append 3
 * different tokens: equal to a fresh run of those 8 tokens. */
static void test_kv_rollback(void **state) {
    (void)state;
    const spec *sp = &shapes[2];
    sd_gguf *g = make_gguf(sp);
    sd_model *m = load(g, 2, 0);
    int V = sp->vocab;
    int32_t tok[8], alt[8], pos[8], seq[8] = {0};
    for (int i = 0; i < 8; i++) {
        tok[i] = token_of(5, i, V);
        alt[i] = i < 5 ? tok[i] : token_of(6, i, V);
        pos[i] = i;
    }
    float *fresh = malloc(8 * (size_t)V * sizeof(float)), *got = malloc(8 * (size_t)V * sizeof(float));
    sd_kv *kv0 = make_kv(m, 1, 8, 4);
    assert_int_equal(run(m, kv0, 8, alt, pos, seq, fresh), SD_OK);
    sd_kv_free(&kv0);

    sd_kv *kv = make_kv(m, 1, 8, 4);
    assert_int_equal(run(m, kv, 5, tok, pos, seq, got), SD_OK);
    assert_int_equal(run(m, kv, 3, tok + 5, pos + 5, seq, got + 5 * (size_t)V), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, 0), 8);
    assert_int_equal(sd_kv_truncate(kv, 0, 5), SD_OK);
    assert_int_equal(run(m, kv, 3, alt + 5, pos + 5, seq, got + 5 * (size_t)V), SD_OK);
    assert_bits_equal(fresh, got, 8 * (size_t)V, "rollback + re-append");
    /* roll back further, across a block boundary, and redo one token at a time */
    assert_int_equal(sd_kv_truncate(kv, 0, 2), SD_OK);
    for (int i = 2; i < 8; i++)
        assert_int_equal(run(m, kv, 1, alt + i, pos + i, seq, got + (size_t)i * (size_t)V), SD_OK);
    assert_bits_equal(fresh, got, 8 * (size_t)V, "rollback to 2 + one at a time");
    free(fresh);
    free(got);
    sd_kv_free(&kv);
    sd_model_free(&m);
    sd_gguf_close(&g);
}

/* (3) self-draft: the first L layers of a deep model equal a model that has
 * only those L layers (same tensors), and differ from the full model. */
static void test_self_draft(void **state) {
    (void)state;
    spec sp = shapes[1]; /* 3 layers */
    sd_gguf *g = make_gguf(&sp);
    spec sp1 = sp;
    sp1.write_layers = 1;
    sd_gguf *g1 = make_gguf(&sp1);
    sd_model *draft = load(g, 2, 1), *full = load(g, 2, 0), *small = load(g1, 1, 0);
    assert_int_equal(sd_model_config_of(draft)->n_layers, 3);
    sd_kv *kv = make_kv(draft, 1, 8, 16);
    assert_int_equal(sd_kv_params_of(kv)->n_layers, 1);
    sd_kv_free(&kv);
    float *a = alone(draft, 3, 6), *b = alone(small, 3, 6), *c = alone(full, 3, 6);
    size_t n = 6 * (size_t)sp.vocab;
    assert_bits_equal(a, b, n, "self-draft vs 1-layer model");
    assert_true(memcmp(a, c, n * sizeof(float)) != 0);
    for (size_t i = 0; i < n; i++) assert_true(isfinite(a[i]));
    free(a), free(b), free(c);
    /* n_layers_used beyond block_count is refused */
    sd_model_params p = sd_model_default_params();
    p.n_layers_used = 4;
    sd_model *bad = NULL;
    assert_int_equal(sd_model_load(g, &p, &bad), SD_ERR_INVALID_ARG);
    assert_null(bad);
    sd_model_free(&draft), sd_model_free(&full), sd_model_free(&small);
    sd_gguf_close(&g);
    sd_gguf_close(&g1);
}

/* Checks that the cache still continues exactly as if nothing had happened:
 * seq 0 holds tokens 0..3 of id 9; the next token's logits must match. */
static void assert_cache_intact(sd_model *m, sd_kv *kv, const float *ref4, int32_t free_before) {
    int V = sd_model_config_of(m)->n_vocab;
    assert_int_equal(sd_kv_seq_len(kv, 0), 4);
    assert_int_equal(sd_kv_seq_len(kv, 1), 0);
    assert_int_equal(sd_kv_n_free_blocks(kv), free_before);
    int32_t t = token_of(9, 4, V), p = 4, s = 0;
    float *out = malloc((size_t)V * sizeof(float));
    assert_int_equal(run(m, kv, 1, &t, &p, &s, out), SD_OK);
    assert_bits_equal(ref4, out, (size_t)V, "continuation after refusal");
    free(out);
    assert_int_equal(sd_kv_truncate(kv, 0, 4), SD_OK);
}

/* (4) bad batches are refused with a log line and leave the cache unchanged. */
static void test_bad_batches(void **state) {
    (void)state;
    const spec *sp = &shapes[0];
    sd_gguf *g = make_gguf(sp);
    sd_model *m = load(g, 2, 0);
    int V = sp->vocab;
    float *ref = alone(m, 9, 5);
    sd_kv *kv = make_kv(m, 2, 8, 4);
    int32_t tok[5], pos[5], seq[5] = {0};
    for (int i = 0; i < 5; i++) {
        tok[i] = token_of(9, i, V);
        pos[i] = i;
    }
    float *out = malloc(8 * (size_t)V * sizeof(float));
    assert_int_equal(run(m, kv, 4, tok, pos, seq, out), SD_OK);
    int32_t free0 = sd_kv_n_free_blocks(kv);
    const float *ref4 = ref + 4 * (size_t)V;

    struct {
        int32_t tok[3], pos[3], seq[3];
        sd_status want;
    } const cases[] = {
        /* a valid new sequence 1 first, then the bad token */
        {{1, 2, -1}, {0, 1, 4}, {1, 1, 0}, SD_ERR_RANGE},         /* id < 0 */
        {{1, 2, (int32_t)V}, {0, 1, 4}, {1, 1, 0}, SD_ERR_RANGE}, /* id == n_vocab */
        {{1, 2, 3}, {0, 1, 4}, {1, 1, 2}, SD_ERR_RANGE},          /* slot == max_seqs */
        {{1, 2, 3}, {0, 1, 4}, {1, 1, -1}, SD_ERR_RANGE},         /* slot < 0 */
        {{1, 2, 3}, {0, 1, 5}, {1, 1, 0}, SD_ERR_INVALID_ARG},    /* gap: 5 instead of 4 */
        {{1, 2, 3}, {0, 1, 3}, {1, 1, 0}, SD_ERR_INVALID_ARG},    /* rewrites position 3 */
        {{1, 2, 3}, {0, 2, 4}, {1, 1, 0}, SD_ERR_INVALID_ARG},    /* gap inside seq 1 */
        {{1, 2, 3}, {1, 2, 4}, {1, 1, 0}, SD_ERR_INVALID_ARG},    /* seq 1 must start at 0 */
        {{1, 2, 3}, {0, 0, 4}, {1, 1, 0}, SD_ERR_INVALID_ARG},    /* repeated position */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int before = n_error_lines;
        sd_status s = run(m, kv, 3, cases[i].tok, cases[i].pos, cases[i].seq, out);
        if (s != cases[i].want)
            fail_msg("case %zu: got %s, want %s", i, sd_status_str(s), sd_status_str(cases[i].want));
        assert_true(n_error_lines > before);
        assert_cache_intact(m, kv, ref4, free0);
    }
    /* logits wanted but no output buffer */
    int32_t p4 = 4, t4 = tok[4];
    assert_int_equal(run(m, kv, 1, &t4, &p4, seq, NULL), SD_ERR_INVALID_ARG);
    assert_cache_intact(m, kv, ref4, free0);
    /* missing arrays, negative count */
    sd_batch nb = {.n_tokens = 1, .tokens = NULL, .pos = &p4, .seq = seq};
    assert_int_equal(sd_model_forward(m, kv, &nb, out), SD_ERR_INVALID_ARG);
    nb.n_tokens = -1;
    assert_int_equal(sd_model_forward(m, kv, &nb, out), SD_ERR_INVALID_ARG);
    assert_cache_intact(m, kv, ref4, free0);
    /* a cut LM head outside [1, n_vocab] */
    bool one = true;
    sd_batch hb = {.n_tokens = 1, .tokens = &t4, .pos = &p4, .seq = seq, .logits = &one};
    const int32_t bad_heads[] = {0, -1, V + 1};
    for (size_t i = 0; i < sizeof bad_heads / sizeof bad_heads[0]; i++) {
        int before = n_error_lines;
        assert_int_equal(sd_model_forward_head(m, kv, &hb, bad_heads[i], out), SD_ERR_RANGE);
        assert_true(n_error_lines > before);
        assert_cache_intact(m, kv, ref4, free0);
    }
    /* a KV cache shaped for another model */
    sd_kv_params kp = sd_kv_default_params();
    kp.n_layers = 2, kp.n_kv_heads = 2, kp.head_dim = 16, kp.n_blocks = 4, kp.max_seqs = 1;
    sd_kv *other = NULL;
    assert_int_equal(sd_kv_create(&kp, &other), SD_OK);
    int32_t p0 = 0;
    assert_int_equal(run(m, other, 1, tok, &p0, seq, out), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_kv_seq_len(other, 0), 0);
    sd_kv_free(&other);
    free(out);
    free(ref);
    sd_kv_free(&kv);
    sd_model_free(&m);
    sd_gguf_close(&g);
}

/* (5) OUT_OF_BLOCKS: seq 1 grows first (fits), seq 0 then does not fit:
 * both must be back to their old lengths with every block free again. */
static void test_out_of_blocks(void **state) {
    (void)state;
    const spec *sp = &shapes[0];
    sd_gguf *g = make_gguf(sp);
    sd_model *m = load(g, 1, 0);
    int V = sp->vocab;
    float *ref = alone(m, 9, 5);
    sd_kv *kv = make_kv(m, 2, 3, 4); /* 3 blocks of 4 tokens */
    int32_t tok[5], pos[5], seq[5] = {0};
    for (int i = 0; i < 5; i++) {
        tok[i] = token_of(9, i, V);
        pos[i] = i;
    }
    float *out = malloc(8 * (size_t)V * sizeof(float));
    assert_int_equal(run(m, kv, 4, tok, pos, seq, out), SD_OK); /* 1 block */
    int32_t free0 = sd_kv_n_free_blocks(kv);
    assert_int_equal(free0, 2);
    /* seq 1: 4 tokens (1 block, fits); seq 0: 4 more -> positions 4..7 need a
     * second block; then seq 0 to 9 would need a third: 1 + 2 > 2 free */
    int32_t bseq[9] = {1, 1, 1, 1, 0, 0, 0, 0, 0};
    int32_t bpos2[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    int32_t btok2[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    bool want[9] = {0};
    sd_batch b = {.n_tokens = 9, .tokens = btok2, .pos = bpos2, .seq = bseq, .logits = want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_ERR_OUT_OF_BLOCKS);
    assert_cache_intact(m, kv, ref + 4 * (size_t)V, free0);
    /* it fits once it is smaller: seq 1 takes 4 tokens, seq 0 grows to 8 */
    b.n_tokens = 8;
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    assert_int_equal(sd_kv_n_free_blocks(kv), 0);
    free(out);
    free(ref);
    sd_kv_free(&kv);
    sd_model_free(&m);
    sd_gguf_close(&g);
}

/* Quantized weights load (kept as stored) and run; the config reports the file. */
static void test_quantized_and_config(void **state) {
    (void)state;
    spec sp = shapes[1];
    sp.matrix_type = SD_DTYPE_Q8_0;
    sp.ff = 224; /* rows must be whole Q8_0 blocks of 32 */
    sd_gguf *g = make_gguf(&sp);
    sd_model_config c;
    assert_int_equal(sd_model_config_from_gguf(g, &c), SD_OK);
    assert_string_equal(c.arch, "llama");
    assert_int_equal(c.n_vocab, sp.vocab);
    assert_int_equal(c.n_embd, 128);
    assert_int_equal(c.n_layers, 3);
    assert_int_equal(c.n_ff, 224);
    assert_int_equal(c.n_heads, 4);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.n_ctx_train, 256);
    assert_false(c.tied_output);
    assert_true(fabsf(c.rms_eps - 1e-5f) < 1e-9f);
    assert_true(c.rope_base == 10000.0f);
    assert_int_equal(c.rope_scaling_type, 0);
    sd_model *m = load(g, 2, 0);
    float *a = alone(m, 1, 4);
    for (size_t i = 0; i < 4 * (size_t)sp.vocab; i++) assert_true(isfinite(a[i]));
    free(a);
    /* what a step streams: the LM head and the layers' matrices as stored
     * (Q8_0: 34 bytes per 32 parameters), the norms in f32, not the
     * embedding table (one row per token) */
    uint64_t E = 128, V = (uint64_t)sp.vocab, F = 224, KD = 64;
    uint64_t matrix_params = E * V + 3 * (E * E * 2 + 2 * E * KD + 3 * E * F);
    uint64_t norm_params = E + 3 * 2 * E;
    assert_int_equal(sd_model_weight_bytes(m), matrix_params / 32 * 34 + norm_params * 4);
    sd_model_free(&m);
    sd_gguf_close(&g);

    /* rope scaling is read */
    sp = shapes[4];
    g = make_gguf(&sp);
    assert_int_equal(sd_model_config_from_gguf(g, &c), SD_OK);
    assert_int_equal(c.rope_scaling_type, 2);
    assert_true(c.rope_scale_factor == 8.0f);
    assert_int_equal(c.rope_orig_ctx, 64);
    assert_true(c.tied_output);
    sd_gguf_close(&g);
}

/* Linear rope scaling agrees with the reference (positions / factor). */
static void test_linear_rope(void **state) {
    (void)state;
    spec sp = shapes[0];
    sp.rope_scaling = 1;
    sp.rope_factor = 4.0f;
    sd_gguf *g = make_gguf(&sp);
    sd_model *m = load(g, 1, 0);
    float *got = alone(m, 2, 9);
    ref_model rm;
    memset(&rm, 0, sizeof rm);
    ref_load(&rm, g, &sp);
    float *want = ref_forward(&rm, 2, 9);
    rm.scaling = 0; /* and it does differ from unscaled */
    float *unscaled = ref_forward(&rm, 2, 9);
    double err = 0, diff = 0;
    for (size_t i = 0; i < 9 * (size_t)sp.vocab; i++) {
        err = fmax(err, fabs((double)got[i] - want[i]));
        diff = fmax(diff, fabs((double)unscaled[i] - want[i]));
    }
    if (!(err < 1e-3)) fail_msg("linear rope: error %g", err);
    assert_true(diff > 1e-2);
    free(got), free(want), free(unscaled);
    ref_free(&rm);
    sd_model_free(&m);
    sd_gguf_close(&g);
}

static void expect_config_error(const spec *sp, sd_status want) {
    sd_gguf *g = make_gguf(sp);
    sd_model_config c;
    int before = n_error_lines;
    assert_int_equal(sd_model_config_from_gguf(g, &c), want);
    assert_true(n_error_lines > before);
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, NULL, &m), want);
    assert_null(m);
    sd_gguf_close(&g);
}

static void test_config_errors(void **state) {
    (void)state;
    spec sp = shapes[0];
    sp.arch = "gpt2";
    expect_config_error(&sp, SD_ERR_UNSUPPORTED);
    sp = shapes[0];
    sp.bad_tensor = "blk.1.ffn_down.weight";
    expect_config_error(&sp, SD_ERR_FORMAT);
    sp = shapes[1];
    sp.bad_tensor = "output.weight";
    expect_config_error(&sp, SD_ERR_FORMAT);
    sp = shapes[0];
    sp.bad_tensor = "blk.0.attn_k.weight";
    expect_config_error(&sp, SD_ERR_FORMAT);
    sp = shapes[0];
    sp.skip_tensor = "blk.1.attn_norm.weight";
    expect_config_error(&sp, SD_ERR_FORMAT);
    sp = shapes[0];
    sp.skip_tensor = "token_embd.weight";
    expect_config_error(&sp, SD_ERR_FORMAT);
    sp = shapes[2];
    sp.kv_heads = 3; /* 8 % 3 != 0 */
    expect_config_error(&sp, SD_ERR_FORMAT);

    /* vocabulary from the tokenizer list, then from token_embd */
    for (int src = 1; src <= 2; src++) {
        sp = shapes[0];
        sp.vocab_source = src;
        sd_gguf *g = make_gguf(&sp);
        sd_model_config c;
        assert_int_equal(sd_model_config_from_gguf(g, &c), SD_OK);
        assert_int_equal(c.n_vocab, sp.vocab);
        sd_gguf_close(&g);
    }
}

/* A NaN or an infinity anywhere in the weights refuses the model at load,
 * with a line naming the tensor (sd_weights_read): found late, it would
 * poison the logits of whatever step first read that row. F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1 (matrices and the embedding table kept as stored) and a
 * norm vector;
 * the config itself is fine. */
static void test_non_finite_weights(void **state) {
    (void)state;
    const struct {
        const char *tensor;
        float value;
        sd_dtype type;
        const char *says; /* in the error line */
    } cases[] = {
        {"blk.1.ffn_down.weight", NAN, SD_DTYPE_F32, "NaN"},
        {"token_embd.weight", INFINITY, SD_DTYPE_F32, "infinity"},
        {"blk.0.attn_q.weight", -INFINITY, SD_DTYPE_F16, "infinity"},
        {"output_norm.weight", NAN, SD_DTYPE_F32, "NaN"},
        /* an infinite value gives its block an infinite scale: the block's
         * values dequantize to infinities and NaNs (0 x inf), found while the
         * stored matrix is scanned row by row */
        {"blk.0.ffn_up.weight", INFINITY, SD_DTYPE_Q8_0, "NaN"},
        {"token_embd.weight", INFINITY, SD_DTYPE_Q4_1, "NaN"},
        {"blk.1.attn_v.weight", NAN, SD_DTYPE_BF16, "NaN"},
        {"blk.0.ffn_gate.weight", -INFINITY, SD_DTYPE_Q4_0, "NaN"},
        {"blk.1.attn_output.weight", NAN, SD_DTYPE_F16, "NaN"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spec sp = shapes[0];
        sp.matrix_type = cases[i].type;
        sp.poison_tensor = cases[i].tensor;
        sp.poison_value = cases[i].value;
        sp.poison_at = 1000003u * (i + 1);
        sd_gguf *g = make_gguf(&sp);
        sd_model_config c;
        assert_int_equal(sd_model_config_from_gguf(g, &c), SD_OK);
        first_error[0] = '\0';
        sd_model *m = NULL;
        assert_int_equal(sd_model_load(g, NULL, &m), SD_ERR_FORMAT);
        assert_null(m);
        if (!strstr(first_error, cases[i].tensor) || !strstr(first_error, cases[i].says))
            fail_msg("case %zu: error line '%s'", i, first_error);
        sd_gguf_close(&g);
    }
}

/* The demo model, when present: loads, and a few greedy steps run. */
static void test_demo_model(void **state) {
    (void)state;
    const char *path = getenv("SPECD_MODEL");
    char buf[1024] = "";
    if (!path) {
        FILE *f = popen(SPECD_SOURCE_DIR "/tools/fetch-model 2>/dev/null", "r");
        if (f) {
            if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
            pclose(f);
        }
        buf[strcspn(buf, "\n")] = 0;
        path = buf;
    }
    if (!path[0] || access(path, R_OK) != 0) {
        skip();
        return;
    }
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    sd_model_config c;
    assert_int_equal(sd_model_config_from_gguf(g, &c), SD_OK);
    assert_int_equal(c.n_embd, 576);
    assert_int_equal(c.n_layers, 30);
    assert_int_equal(c.n_vocab, 49152);
    sd_gguf_close(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batch_invariance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stored_formats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_f16, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wanted_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_rollback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_self_draft, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quantized_and_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_rope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_finite_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_demo_model, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
