/* test_cuda_model.c — the model on the GPU (engine/cuda/) against the CPU.
 *
 * Random models (specd-mkmodel with BF16 weights, so both backends hold the
 * very same numbers and only arithmetic order and the softmax differ):
 *   - logits of a ragged multi-sequence batch (the streaming matmul path)
 *     within 1e-4 x max|logit| of the CPU;
 *   - a 40-token prefill (the cuBLAS path, activations rounded to BF16)
 *     and decode steps after it within 2e-2 x max|logit|;
 *   - batch invariance on the GPU: a sequence's logits are bit-identical
 *     alone and in the ragged batch;
 *   - recorded forwards (CUDA graphs) replay bit-identically to op-by-op
 *     runs (a second model with --cuda-graphs 0), and so do a third
 *     model's with programmatic launches (--cuda-pdl 1: the kernels of
 *     a forward overlap their neighbours' launch and tail, which must not
 *     change a bit);
 *   - KV rollback: truncate + re-append gives the fresh computation's
 *     logits bit for bit;
 *   - greedy speculative decoding on the GPU (n-gram and self-draft, K 1, 4
 *     and 8) gives plain greedy GPU output token for token;
 *   - a KV cache larger than the card is refused with SD_ERR_NOMEM;
 *   - Phi-3 LongRoPE (phi3 model C): with its long factors (the default
 *     context) and its short ones (max_ctx 256), 15 tokens' logits within
 *     1e-4 x max|logit| of the CPU loaded alike, and the two sets' GPU
 *     logits apart (the chosen table and the attention factor reach the GPU).
 * SmolLM2-135M-Instruct (when the demo model is available; the CPU side with
 * its matrices read as f32): prompt logits within BF16 tolerance, and greedy outputs over 20 committed prompts x 32
 * tokens compared with the CPU's: the divergence rate is printed, and the
 * first token must agree on at least 90% of the prompts.
 *
 * Exits 77 (skipped, saying why) without a CUDA build or a usable GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

#include "greedy_util.h"

static int failures __attribute__((unused)); /* unused when built without CUDA (the test only skips) */

#define FAIL(...)                                               \
    do {                                                        \
        fprintf(stderr, "test_cuda_model: FAIL: " __VA_ARGS__); \
        fprintf(stderr, "\n");                                  \
        failures++;                                             \
    } while (0)

#ifndef SPECD_HAVE_CUDA
int main(void) {
    printf("test_cuda_model: skipped: this build has no CUDA backend (nvcc was not found)\n");
    return 77;
}
#else

#define MAX_CTX 512

/* Loads path on device with the backend switches *opts (NULL: the defaults). */
static sd_model *load_with(const char *path, int32_t device, int32_t n_layers_used, const sd_backend_opts *opts) {
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK) {
        FAIL("cannot open %s: %s", path, err);
        return NULL;
    }
    sd_model_params mp = sd_model_default_params();
    mp.device = device;
    mp.n_threads = 0;
    mp.n_layers_used = n_layers_used;
    if (opts) mp.backend = *opts;
    sd_model *m = NULL;
    if (sd_model_load(g, &mp, &m) != SD_OK) FAIL("cannot load %s on device %d", path, (int)device);
    sd_gguf_close(&g);
    return m;
}

static sd_model *load(const char *path, int32_t device, int32_t n_layers_used) {
    return load_with(path, device, n_layers_used, NULL);
}

/* max |a - b| / max |b| */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e; /* NaN sticks */
        if (fabs((double)b[i]) > mx) mx = fabs((double)b[i]);
    }
    return mx > 0 ? d / mx : d;
}

/* Runs tokens of several sequences (seq[], continuing each from its cached
 * length) with every row's logits wanted. */
static sd_status run(sd_model *m, sd_kv *kv, int32_t n, const int32_t *tokens, const int32_t *seq, float *out) {
    int32_t pos[256];
    bool want[256];
    int32_t next[8] = {0};
    for (int32_t s = 0; s < 8 && s < sd_kv_params_of(kv)->max_seqs; s++) next[s] = sd_kv_seq_len(kv, s);
    for (int32_t t = 0; t < n; t++) {
        pos[t] = next[seq[t]]++;
        want[t] = true;
    }
    sd_batch b = {n, tokens, pos, seq, want};
    return sd_model_forward(m, kv, &b, out);
}

/* Phi-3 LongRoPE: each factor set (max_ctx 0: long; 256: short) on both backends. */
static void longrope_checks(const char *path) {
    enum { N = 15 };
    int32_t tokens[N], seq[N] = {0};
    for (int32_t t = 0; t < N; t++) tokens[t] = (t * 53 + 7) % 300;
    static float out[2][2][N * 320]; /* [set][cpu, gpu] */
    for (int set = 0; set < 2; set++)
        for (int dev = 0; dev < 2; dev++) {
            sd_gguf *g = NULL;
            char err[256];
            sd_model_params mp = sd_model_default_params();
            mp.device = dev ? 0 : -1;
            mp.max_ctx = set ? 256 : 0;
            sd_model *m = NULL;
            sd_kv *kv = NULL;
            if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK || sd_model_load(g, &mp, &m) != SD_OK ||
                sd_model_kv_create(m, 1, 4, 16, &kv) != SD_OK || run(m, kv, N, tokens, seq, out[set][dev]) != SD_OK)
                FAIL("LongRoPE model: load or forward failed (set %d, device %d)", set, dev);
            sd_kv_free(&kv);
            sd_model_free(&m);
            sd_gguf_close(&g);
        }
    for (int set = 0; set < 2; set++) {
        double e = rel_err(out[set][1], out[set][0], (size_t)N * 320);
        printf("  LongRoPE %s factors: GPU vs CPU max err %.2e x max|logit|\n", set ? "short" : "long", e);
        if (!(e <= 1e-4)) FAIL("LongRoPE %s factors: GPU differs from the CPU (%.3g)", set ? "short" : "long", e);
    }
    if (!(rel_err(out[0][1], out[1][1], (size_t)N * 320) > 1e-3)) FAIL("LongRoPE: the factor set does not reach the GPU");
}

static void random_model_checks(const char *path, const char *name) {
    printf("%s:\n", name);
    sd_model *cpu = load(path, -1, 0), *gpu = load(path, 0, 0);
    if (!cpu || !gpu) goto out;
    const int32_t V = sd_model_config_of(cpu)->n_vocab;
    float *want = malloc((size_t)64 * V * sizeof(float)), *got = malloc((size_t)64 * V * sizeof(float));
    float *alone = malloc((size_t)64 * V * sizeof(float));
    sd_kv *kc = NULL, *kg = NULL;

    /* 1. ragged batch: 3 sequences, 4 + 6 + 5 tokens, interleaved */
    int32_t tokens[15], seq[15];
    for (int32_t t = 0; t < 15; t++) {
        tokens[t] = (t * 37 + 11) % V;
        seq[t] = t < 12 ? t % 3 : (t == 12 ? 1 : 2);
    }
    if (sd_model_kv_create(cpu, 4, 64, 16, &kc) != SD_OK || sd_model_kv_create(gpu, 4, 64, 16, &kg) != SD_OK) {
        FAIL("%s: kv create", name);
        goto out_kv;
    }
    if (run(cpu, kc, 15, tokens, seq, want) != SD_OK || run(gpu, kg, 15, tokens, seq, got) != SD_OK) {
        FAIL("%s: ragged forward", name);
        goto out_kv;
    }
    double e = rel_err(got, want, (size_t)15 * V);
    printf("  ragged batch (15 tokens, 3 sequences): max |gpu - cpu| = %.2e x max|logit|\n", e);
    if (!(e <= 1e-4)) FAIL("%s: ragged batch error %.3g > 1e-4", name, e);

    /* 2. batch invariance on the GPU: sequence 1 (5 tokens) alone, in two chunks */
    {
        sd_kv *k1 = NULL;
        int32_t s1[15] = {0}, t1[15];
        int32_t k = 0;
        for (int32_t t = 0; t < 15; t++)
            if (seq[t] == 1) t1[k++] = tokens[t];
        if (k != 5) FAIL("%s: the ragged batch has %d tokens of sequence 1, expected 5", name, (int)k);
        if (sd_model_kv_create(gpu, 1, 8, 16, &k1) != SD_OK || run(gpu, k1, 2, t1, s1, alone) != SD_OK ||
            run(gpu, k1, k - 2, t1 + 2, s1, alone + (size_t)2 * V) != SD_OK) {
            FAIL("%s: alone forward", name);
        } else {
            int32_t r = 0;
            for (int32_t t = 0; t < 15; t++) {
                if (seq[t] != 1) continue;
                if (memcmp(got + (size_t)t * V, alone + (size_t)r * V, (size_t)V * sizeof(float)) != 0)
                    FAIL("%s: sequence 1 token %d differs alone and batched on the GPU", name, (int)r);
                r++;
            }
            printf("  batch invariance on the GPU (alone in 2+3 chunks vs batched): %s\n",
                   failures ? "see failures" : "bit-identical");
        }
        sd_kv_free(&k1);
    }

    /* 3. prefill of 40 tokens on a fresh sequence (cuBLAS), then 5 decode steps */
    {
        int32_t pt[40], ps[40];
        for (int32_t i = 0; i < 40; i++) pt[i] = (i * 53 + 7) % V, ps[i] = 3;
        if (run(cpu, kc, 40, pt, ps, want) != SD_OK || run(gpu, kg, 40, pt, ps, got) != SD_OK) {
            FAIL("%s: prefill", name);
        } else {
            e = rel_err(got, want, (size_t)40 * V);
            printf("  40-token prefill (cuBLAS, BF16 activations): %.2e x max|logit|\n", e);
            if (!(e <= 2e-2)) FAIL("%s: prefill error %.3g > 2e-2", name, e);
        }
        double worst = 0;
        for (int32_t step = 0; step < 5; step++) {
            int32_t tk = (step * 101 + 3) % V, s3 = 3;
            if (run(cpu, kc, 1, &tk, &s3, want) != SD_OK || run(gpu, kg, 1, &tk, &s3, got) != SD_OK) {
                FAIL("%s: decode after prefill", name);
                break;
            }
            e = rel_err(got, want, (size_t)V);
            if (e > worst) worst = e;
        }
        printf("  decode after it: %.2e x max|logit|\n", worst);
        if (!(worst <= 2e-2)) FAIL("%s: decode-after-prefill error %.3g > 2e-2", name, worst);
    }

    /* 4. KV rollback on the GPU: 6 tokens, truncate to 3, 3 others; vs fresh */
    {
        sd_kv *ka = NULL, *kb = NULL;
        int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 9, 8, 7}, s0[6] = {0};
        if (sd_model_kv_create(gpu, 1, 8, 4, &ka) != SD_OK || sd_model_kv_create(gpu, 1, 8, 4, &kb) != SD_OK ||
            run(gpu, ka, 6, a, s0, got) != SD_OK || sd_kv_truncate(ka, 0, 3) != SD_OK ||
            run(gpu, ka, 3, b + 3, s0, got) != SD_OK || run(gpu, kb, 6, b, s0, want) != SD_OK) {
            FAIL("%s: rollback forwards", name);
        } else if (memcmp(got, want + (size_t)3 * V, (size_t)3 * V * sizeof(float)) != 0) {
            FAIL("%s: truncate + re-append differs from a fresh computation on the GPU", name);
        } else {
            printf("  KV rollback on the GPU: bit-identical to a fresh computation\n");
        }
        sd_kv_free(&ka);
        sd_kv_free(&kb);
    }

    /* 5. recorded forwards: decode 12 steps at 1 token and 6 at 3 tokens with
     * graphs (recorded the 2nd time a shape comes, replayed after) vs a
     * model that runs op by op */
    {
        sd_backend_opts no_graphs = sd_backend_default_opts(), with_pdl = sd_backend_default_opts();
        no_graphs.cuda_graphs = false;
        with_pdl.cuda_pdl = true;
        sd_model *eager = load_with(path, 0, 0, &no_graphs);
        sd_model *pdl = load_with(path, 0, 0, &with_pdl);
        sd_kv *ka = NULL, *kb = NULL, *kp = NULL;
        bool ok = eager && pdl && sd_model_kv_create(gpu, 1, 16, 16, &ka) == SD_OK &&
                  sd_model_kv_create(eager, 1, 16, 16, &kb) == SD_OK &&
                  sd_model_kv_create(pdl, 1, 16, 16, &kp) == SD_OK;
        int32_t s0[3] = {0, 0, 0};
        for (int32_t step = 0; ok && step < 18; step++) {
            int32_t n = step < 12 ? 1 : 3, tk[3] = {(step * 7 + 1) % V, (step * 5 + 2) % V, (step * 3 + 4) % V};
            if (run(gpu, ka, n, tk, s0, got) != SD_OK || run(eager, kb, n, tk, s0, want) != SD_OK ||
                run(pdl, kp, n, tk, s0, alone) != SD_OK) {
                FAIL("%s: graph forwards", name);
                ok = false;
            } else if (memcmp(got, want, (size_t)n * V * sizeof(float)) != 0) {
                FAIL("%s: step %d (%d tokens) differs replayed and op by op", name, (int)step, (int)n);
                ok = false;
            } else if (memcmp(alone, want, (size_t)n * V * sizeof(float)) != 0) {
                FAIL("%s: step %d (%d tokens) differs with programmatic launches", name, (int)step, (int)n);
                ok = false;
            }
        }
        /* 20-token chunks (the cuBLAS path, which is never recorded): the
         * second sighting tries to record, drops it and runs op by op */
        for (int32_t chunk = 0; ok && chunk < 3; chunk++) {
            int32_t tk[20], sq[20] = {0};
            for (int32_t i = 0; i < 20; i++) tk[i] = (chunk * 31 + i * 11 + 5) % V;
            if (run(gpu, ka, 20, tk, sq, got) != SD_OK || run(eager, kb, 20, tk, sq, want) != SD_OK) {
                FAIL("%s: 20-token chunk %d with graphs on", name, (int)chunk);
                ok = false;
            } else if (memcmp(got, want, (size_t)20 * V * sizeof(float)) != 0) {
                FAIL("%s: 20-token chunk %d differs with graphs on and off", name, (int)chunk);
                ok = false;
            }
        }
        if (ok)
            printf("  recorded forwards (CUDA graphs): 18 steps replayed, and 3 unrecordable 20-token chunks, "
                   "bit-identical to op-by-op runs; the 18 steps with programmatic launches too\n");
        sd_kv_free(&ka);
        sd_kv_free(&kb);
        sd_kv_free(&kp);
        sd_model_free(&eager);
        sd_model_free(&pdl);
    }

    /* 6. a KV cache far larger than the card: a clear refusal */
    {
        sd_kv *huge = NULL;
        sd_status st = sd_model_kv_create(gpu, 1, 1 << 30, 16, &huge);
        if (st != SD_ERR_NOMEM) FAIL("%s: an impossible KV cache gave %s, not SD_ERR_NOMEM", name, sd_status_str(st));
        sd_kv_free(&huge);
    }

out_kv:
    sd_kv_free(&kc);
    sd_kv_free(&kg);
    free(want), free(got), free(alone);
out:
    sd_model_free(&cpu);
    sd_model_free(&gpu);
}

/* Greedy speculative output on the GPU equals plain greedy GPU output. */
static void spec_equality(const char *path) {
    sd_model *gpu = load(path, 0, 0);
    if (!gpu) return;
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = MAX_CTX;
    dp.ngram_min = 1;
    sd_drafter *ngram = NULL, *self = NULL;
    if (sd_drafter_ngram_create(&dp, &ngram) != SD_OK || sd_drafter_self_view(gpu, 1, &dp, &self) != SD_OK) {
        FAIL("cannot create drafters on the GPU model");
    } else {
        const int32_t V = sd_model_config_of(gpu)->n_vocab;
        int32_t prompt[24], plain[40], spec[40];
        for (int32_t i = 0; i < 24; i++) prompt[i] = (i % 6) * 13 % V; /* repetitive: n-gram drafts hit */
        if (greedy_plain(gpu, prompt, 24, 40, MAX_CTX, plain) != 0) FAIL("plain greedy on the GPU");
        const int32_t ks[3] = {1, 4, 8};
        sd_drafter *ds[2] = {ngram, self};
        const char *names[2] = {"n-gram", "self-draft (1 layer)"};
        for (int di = 0; di < 2; di++)
            for (int ki = 0; ki < 3; ki++) {
                if (greedy_spec(gpu, ds[di], ks[ki], prompt, 24, 40, MAX_CTX, spec, NULL, NULL) != 0) {
                    FAIL("speculative decoding on the GPU (%s, K %d)", names[di], (int)ks[ki]);
                    continue;
                }
                if (memcmp(spec, plain, sizeof plain) != 0)
                    FAIL("greedy speculative output (%s, K %d) differs from plain greedy on the GPU", names[di],
                         (int)ks[ki]);
            }
        printf("  greedy speculative == plain greedy on the GPU (n-gram and self-draft, K 1/4/8, 40 tokens)%s\n",
               failures ? ": see failures" : "");
    }
    sd_drafter_free(&ngram);
    sd_drafter_free(&self);
    sd_model_free(&gpu);
}

/* Seeded sampled speculative decoding: verification on the GPU (p never
 * leaves the device) and on the host (logits downloaded, sd_spec_verify)
 * commit the same tokens. */
static void spec_sampled_device_vs_host(const char *path) {
    sd_backend_opts host = sd_backend_default_opts();
    host.host_verify = true;
    sd_model *host_v = load_with(path, 0, 0, &host);
    sd_model *dev_v = load(path, 0, 0);
    if (!host_v || !dev_v) goto out;
    if (!sd_model_verifies_on_device(dev_v) || sd_model_verifies_on_device(host_v)) {
        FAIL("--host-verify (sd_backend_opts.host_verify) did not select the verification path");
        goto out;
    }
    const int32_t V = sd_model_config_of(dev_v)->n_vocab;
    int32_t prompt[24];
    for (int32_t i = 0; i < 24; i++) prompt[i] = (i % 5) * 17 % V;
    const sd_sampling cfgs[3] = {
        {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 7},
        {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 11},
        {.temperature = 1.2f, .top_k = 40, .top_p = 0.95f, .min_p = 0.02f, .seed = 13},
    };
    int same = 0;
    for (int ci = 0; ci < 3; ci++) {
        int32_t outs[2][40];
        for (int which = 0; which < 2; which++) {
            sd_model *m = which ? dev_v : host_v;
            sd_drafter_params dp = sd_drafter_default_params();
            dp.max_ctx = MAX_CTX;
            sd_drafter *d = NULL;
            sd_spec_decoder *dec = NULL;
            if (sd_drafter_self_view(m, 1, &dp, &d) != SD_OK || sd_spec_decoder_create(m, d, MAX_CTX, &dec) != SD_OK) {
                FAIL("decoder on the GPU");
                sd_drafter_free(&d);
                goto out;
            }
            int32_t ctx[MAX_CTX];
            memcpy(ctx, prompt, sizeof prompt);
            int32_t n = 24;
            while (n < 64) {
                int32_t step[SD_MAX_K + 1], n_step, nd, na;
                if (sd_spec_decoder_step(dec, ctx, n, 4, &cfgs[ci], step, &n_step, &nd, &na) != SD_OK) {
                    FAIL("sampled speculative step on the GPU");
                    break;
                }
                memcpy(ctx + n, step, sizeof(int32_t) * (size_t)n_step);
                n += n_step;
            }
            memcpy(outs[which], ctx + 24, sizeof outs[which]);
            sd_spec_decoder_free(&dec);
            sd_drafter_free(&d);
        }
        if (memcmp(outs[0], outs[1], sizeof outs[0]) != 0)
            FAIL("seeded sampling (config %d): device and host verification commit different tokens", ci);
        else
            same++;
    }
    printf("  seeded sampled speculation (self-draft, K 4, 3 sampling configs): device == host verification on %d "
           "of 3\n",
           same);
out:
    sd_model_free(&host_v);
    sd_model_free(&dev_v);
}

/* ---- the demo model ---- */

static void demo_model_checks(const char *path) {
    printf("SmolLM2-135M-Instruct (%s):\n", path);
    sd_gguf *g = NULL;
    sd_tok *tok = NULL;
    char err[256];
    if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK || sd_tok_from_gguf(g, &tok) != SD_OK) {
        FAIL("cannot open the demo model's tokenizer");
        sd_gguf_close(&g);
        return;
    }
    sd_gguf_close(&g);
    /* the CPU side reads the matrices as f32 (--cpu-weights f32), as the
     * GPU does before its BF16 conversion: kept as stored, the CPU would
     * round activations to 8 bits (Q4_1) and differ from the GPU by that,
     * not by the GPU's arithmetic */
    sd_backend_opts f32 = sd_backend_default_opts();
    f32.cpu_weights = SD_CPU_WEIGHTS_F32;
    sd_model *cpu = load_with(path, -1, 0, &f32);
    sd_model *gpu = load(path, 0, 0);
    enum { N_PROMPTS = 20, N_NEW = 32 };
    char *prompts[N_PROMPTS];
    int n_prompts = cpu && gpu ? greedy_read_prompts(SPECD_SOURCE_DIR, prompts, N_PROMPTS) : 0;
    if (cpu && gpu && n_prompts != N_PROMPTS) FAIL("read %d of %d prompts", n_prompts, N_PROMPTS);
    int same_first = 0, same_all = 0, checked = 0;
    double prefix_sum = 0, worst_logit = 0;
    const int32_t V = cpu ? sd_model_config_of(cpu)->n_vocab : 0;
    float *lc = malloc((size_t)(V ? V : 1) * sizeof(float)), *lg = malloc((size_t)(V ? V : 1) * sizeof(float));
    for (int p = 0; p < n_prompts; p++) {
        char *text = NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        sd_chat_msg msg = {"user", prompts[p]};
        if (sd_tok_chat_format(&msg, 1, NULL, true, &text) != SD_OK ||
            sd_tok_encode(tok, text, strlen(text), true, &ids, &n_ids) != SD_OK || n_ids + N_NEW > MAX_CTX) {
            FAIL("cannot encode prompt %d", p);
            free(text), free(ids);
            continue;
        }
        free(text);
        /* the prompt's last logits (a one-chunk prefill: cuBLAS on the GPU) */
        {
            sd_kv *kc = NULL, *kg = NULL;
            int32_t pos[MAX_CTX], seq[MAX_CTX] = {0};
            bool want[MAX_CTX] = {false};
            for (size_t i = 0; i < n_ids; i++) pos[i] = (int32_t)i;
            want[n_ids - 1] = true;
            sd_batch b = {(int32_t)n_ids, ids, pos, seq, want};
            if (sd_model_kv_create(cpu, 1, MAX_CTX / 16 + 2, 16, &kc) == SD_OK &&
                sd_model_kv_create(gpu, 1, MAX_CTX / 16 + 2, 16, &kg) == SD_OK &&
                sd_model_forward(cpu, kc, &b, lc) == SD_OK && sd_model_forward(gpu, kg, &b, lg) == SD_OK) {
                double e = rel_err(lg, lc, (size_t)V);
                if (e > worst_logit) worst_logit = e;
            } else {
                FAIL("prompt %d logits", p);
            }
            sd_kv_free(&kc);
            sd_kv_free(&kg);
        }
        int32_t oc[N_NEW], og[N_NEW];
        if (greedy_plain(cpu, ids, (int32_t)n_ids, N_NEW, MAX_CTX, oc) != 0 ||
            greedy_plain(gpu, ids, (int32_t)n_ids, N_NEW, MAX_CTX, og) != 0) {
            FAIL("greedy decoding of prompt %d", p);
            free(ids);
            continue;
        }
        int prefix = 0;
        while (prefix < N_NEW && oc[prefix] == og[prefix]) prefix++;
        checked++;
        same_first += prefix > 0;
        same_all += prefix == N_NEW;
        prefix_sum += prefix;
        free(ids);
    }
    for (int p = 0; p < n_prompts; p++) free(prompts[p]);
    if (checked) {
        printf("  prompt logits: max |gpu - cpu| = %.2e x max|logit| (worst of %d prompts)\n", worst_logit, checked);
        printf("  greedy %d tokens on %d prompts: %d identical (divergence rate %.0f%%), first token equal on %d, "
               "mean common prefix %.1f tokens\n",
               N_NEW, checked, same_all, 100.0 * (checked - same_all) / checked, same_first, prefix_sum / checked);
        if (same_first * 10 < checked * 9)
            FAIL("first greedy token differs on %d of %d prompts", checked - same_first, checked);
        if (!(worst_logit <= 5e-2)) FAIL("prompt logits differ by %.3g x max|logit| (> 5e-2)", worst_logit);
    }
    free(lc), free(lg);
    sd_tok_free(&tok);
    sd_model_free(&cpu);
    sd_model_free(&gpu);
}

/* Every stored format of the demo model on the GPU (dequantized to BF16 at
 * upload) against the CPU reading the same file's values as f32: the
 * demo's Q4_1 file rewritten by specd-quantize. */
static void format_checks(const char *demo) {
    static const char *const types[] = {"f16", "bf16", "q8_0", "q4_0", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k"};
    char dir[64] = "/tmp/specd-cuda-fmt-XXXXXX";
    if (!mkdtemp(dir)) {
        FAIL("mkdtemp for the format files");
        return;
    }
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char out[128], cmd[1024];
        snprintf(out, sizeof out, "%s/smol-%s.gguf", dir, types[i]);
        snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s >/dev/null 2>&1", SPECD_QUANTIZE, demo, out, types[i]);
        if (system(cmd) != 0) {
            FAIL("specd-quantize to %s failed: %s", types[i], cmd);
            continue;
        }
        printf("format %s: ", types[i]);
        demo_model_checks(out);
        unlink(out);
    }
    rmdir(dir);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_cuda_model");
    char dir[64] = "/tmp/specd-cuda-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char a[128], b[128], cmd[1024];
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 512 --dtype bf16 --seed 3 "
             ">/dev/null 2>&1 && '%s' -o '%s' --dim 256 --layers 3 --heads 8 --kv-heads 2 --ff 704 --vocab 1000 "
             "--dtype bf16 --seed 5 >/dev/null 2>&1",
             SPECD_MKMODEL, a, SPECD_MKMODEL, b);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_cuda_model: specd-mkmodel failed: %s\n", cmd);
        return 1;
    }
    /* a GPU at all? (the backend logs why not) */
    {
        sd_gguf *g = NULL;
        char err[256];
        sd_model *probe = NULL;
        sd_model_params mp = sd_model_default_params();
        mp.device = 0;
        sd_status st = sd_gguf_open(a, &g, err, sizeof err);
        if (st == SD_OK) st = sd_model_load(g, &mp, &probe);
        sd_gguf_close(&g);
        sd_model_free(&probe);
        if (st == SD_ERR_CUDA) {
            unlink(a), unlink(b), rmdir(dir);
            printf("test_cuda_model: skipped: no usable CUDA GPU (the model could not be put on cuda:0)\n");
            return 77;
        }
        if (st != SD_OK) {
            fprintf(stderr, "test_cuda_model: loading %s on cuda:0 failed: %s\n", a, sd_status_str(st));
            return 1;
        }
    }
    random_model_checks(a, "random model A (dim 64, 2 layers, 4/2 heads, vocab 512, BF16)");
    random_model_checks(b, "random model B (dim 256, 3 layers, 8/2 heads, ff 704, vocab 1000, BF16)");
    printf("speculative decoding on model B:\n");
    spec_equality(b);
    spec_sampled_device_vs_host(b);
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --arch phi3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 320 --dtype bf16 "
             "--ctx 4096 --longrope 256 --seed 7 >/dev/null 2>&1",
             SPECD_MKMODEL, a);
    printf("phi3 LongRoPE model C (dim 64, 2 layers, context 4096 over an original 256, BF16):\n");
    if (system(cmd) != 0)
        FAIL("specd-mkmodel failed: %s", cmd);
    else
        longrope_checks(a);
    unlink(a), unlink(b), rmdir(dir);
    const char *demo = getenv("SPECD_MODEL");
    if (demo && *demo && access(demo, R_OK) == 0) {
        demo_model_checks(demo);
        format_checks(demo);
    } else {
        printf("SmolLM2 checks skipped: SPECD_MODEL is not set to a readable file\n");
    }
    if (failures) {
        fprintf(stderr, "test_cuda_model: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_cuda_model: GPU model matches the CPU\n");
    return 0;
}
#endif
