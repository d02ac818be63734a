/* test_cuda_ops.c — every CUDA op (engine/cuda/) against its CPU twin
 * (engine/cpu/) on random inputs of several shapes.
 *
 * Each case fills inputs from a seeded generator (never zeros), runs the op
 * on both backends, and compares element by element with
 * |gpu - cpu| <= atol + rtol * scale, printing the first mismatches. Outputs
 * on the GPU are poisoned (NaN bytes) before each run so an element the
 * kernel forgot to write fails. Matmul weights are rounded to BF16 on the
 * host first, so both backends multiply the very same numbers and the
 * comparison measures only summation order; its tolerance scales with
 * sum_i |w_i x_i|. The streaming matmul is also checked for batch
 * invariance (a token's row is bit-identical computed alone or with 15
 * others), on the tensor cores (the default for n_in % 32 == 0) and again
 * on the CUDA cores (--cuda-mma 0); matmuls and attention run once more
 * with programmatic launches (--cuda-pdl 1). attention/kv_write run
 * ragged batches over shuffled block tables, block sizes 1, 3 and 16, contexts that span several of the
 * kernel's chunks, positions at block edges, head_dim above 128 and GQA
 * groups of 1 to 4. Finally the ops are run with their host arrays
 * announced (host_arrays), as the model does.
 *
 * Without a CUDA build or a usable GPU it prints why and exits 77
 * (skipped). Plain main so that the skip is one exit code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"

static int failures __attribute__((unused)); /* unused when built without CUDA (the test only skips) */

#define CHECK(cond)                                                                                 \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "test_cuda_ops: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                             \
            return;                                                                                 \
        }                                                                                           \
    } while (0)

#ifndef SPECD_HAVE_CUDA
int main(void) {
    printf("test_cuda_ops: skipped: this build has no CUDA backend (nvcc was not found)\n");
    return 77;
}
#else

static sd_backend_handle cpu, gpu;

/* ---- inputs ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* uniform in [-amp, amp) */
static float rng_float(float amp) { return (float)((double)(rng_next() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * amp; }
static int32_t rng_int(int32_t n) { return (int32_t)(rng_next() % (uint64_t)n); }

static float *rand_floats(size_t n, float amp) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = rng_float(amp);
    return p;
}

/* Rounds to the nearest BF16 (ties to even), kept as f32. */
static float to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- device helpers ---- */

static float *dev_upload(const float *host, size_t n) {
    float *d = gpu.ops->buf_alloc(gpu.ctx, (n ? n : 1) * sizeof(float));
    if (d && n) gpu.ops->buf_upload(gpu.ctx, d, host, n * sizeof(float));
    return d;
}

/* A device buffer of n floats filled with NaN bytes (unwritten = failure). */
static float *dev_poisoned(size_t n) {
    float *nan_host = malloc((n ? n : 1) * sizeof(float));
    memset(nan_host, 0xff, (n ? n : 1) * sizeof(float));
    float *d = dev_upload(nan_host, n);
    free(nan_host);
    return d;
}

static float *dev_download(const float *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (gpu.ops->buf_download(gpu.ctx, h, d, n * sizeof(float)) != SD_OK) {
        fprintf(stderr, "test_cuda_ops: download failed\n");
        failures++;
        memset(h, 0xff, (n ? n : 1) * sizeof(float));
    }
    return h;
}

/* Compares got with want: |d| <= atol + rtol * scale[i] (scale NULL: |want|).
 * Prints the first mismatches and the largest error relative to the bound. */
static bool compare(const char *what, const float *got, const float *want, const double *scale, size_t n, double atol,
                    double rtol) {
    size_t bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double s = scale ? scale[i] : fabs((double)want[i]);
        double bound = atol + rtol * s, d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= bound)) {
            if (bad < 5)
                fprintf(stderr, "  %s: [%zu] gpu %.9g cpu %.9g |d| %.3g > %.3g\n", what, i, (double)got[i],
                        (double)want[i], d, bound);
            bad++;
        } else if (bound > 0 && d / bound > worst) {
            worst = d / bound;
        }
    }
    if (bad) {
        fprintf(stderr, "test_cuda_ops: %s: %zu of %zu elements out of tolerance\n", what, bad, n);
        failures++;
        return false;
    }
    printf("  %-44s ok (%zu elements, worst %.2f of the bound)\n", what, n, worst);
    return true;
}

/* ---- ops ---- */

static void test_embed(void) {
    const int32_t dims[] = {1, 3, 64, 576, 1027};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int32_t dim = dims[di], vocab = 97, n = 33;
        float *table = rand_floats((size_t)vocab * dim, 1.0f);
        int32_t ids[33];
        for (int32_t t = 0; t < n; t++) ids[t] = t == 0 ? 0 : t == 1 ? vocab - 1 : rng_int(vocab);
        float *want = malloc((size_t)n * dim * sizeof(float));
        cpu.ops->embed(cpu.ctx, table, dim, ids, n, want);
        float *d_table = dev_upload(table, (size_t)vocab * dim), *d_out = dev_poisoned((size_t)n * dim);
        CHECK(gpu.ops->embed(gpu.ctx, d_table, dim, ids, n, d_out) == SD_OK);
        float *got = dev_download(d_out, (size_t)n * dim);
        char what[64];
        snprintf(what, sizeof what, "embed dim %d", (int)dim);
        compare(what, got, want, NULL, (size_t)n * dim, 0.0, 0.0);
        gpu.ops->buf_free(gpu.ctx, d_table);
        gpu.ops->buf_free(gpu.ctx, d_out);
        free(table), free(want), free(got);
    }
}

static void test_rmsnorm(void) {
    const int32_t dims[] = {1, 5, 64, 576, 4096, 5001};
    const int32_t toks[] = {1, 3, 17};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
            int32_t dim = dims[di], n = toks[ti];
            size_t total = (size_t)n * dim;
            float *x = rand_floats(total, 3.0f), *w = rand_floats((size_t)dim, 1.5f);
            float *want = malloc(total * sizeof(float));
            cpu.ops->rmsnorm(cpu.ctx, x, w, n, dim, 1e-5f, want);
            float *dx = dev_upload(x, total), *dw = dev_upload(w, (size_t)dim), *dout = dev_poisoned(total);
            CHECK(gpu.ops->rmsnorm(gpu.ctx, dx, dw, n, dim, 1e-5f, dout) == SD_OK);
            float *got = dev_download(dout, total);
            char what[64];
            snprintf(what, sizeof what, "rmsnorm dim %d x %d tokens", (int)dim, (int)n);
            compare(what, got, want, NULL, total, 1e-6, 2e-6);
            /* in place, as the model calls it on the LM-head rows */
            CHECK(gpu.ops->rmsnorm(gpu.ctx, dx, dw, n, dim, 1e-5f, dx) == SD_OK);
            float *got2 = dev_download(dx, total);
            snprintf(what, sizeof what, "rmsnorm in place dim %d x %d", (int)dim, (int)n);
            compare(what, got2, got, NULL, total, 0.0, 0.0);
            gpu.ops->buf_free(gpu.ctx, dx), gpu.ops->buf_free(gpu.ctx, dw), gpu.ops->buf_free(gpu.ctx, dout);
            free(x), free(w), free(want), free(got), free(got2);
        }
}

static void test_rope(void) {
    const int32_t heads[] = {1, 9, 32};
    const int32_t dims[] = {2, 16, 64, 128};
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            int32_t H = heads[hi], D = dims[di], n = 13;
            size_t total = (size_t)n * H * D;
            float *x = rand_floats(total, 2.0f), *inv = malloc((size_t)(D / 2) * sizeof(float));
            for (int32_t i = 0; i < D / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / D);
            int32_t pos[13];
            for (int32_t t = 0; t < n; t++) pos[t] = t < 3 ? t : rng_int(131072);
            float *dx = dev_upload(x, total), *dinv = dev_upload(inv, (size_t)(D / 2));
            cpu.ops->rope(cpu.ctx, x, n, H, D, pos, inv);
            CHECK(gpu.ops->rope(gpu.ctx, dx, n, H, D, pos, dinv) == SD_OK);
            float *got = dev_download(dx, total);
            char what[64];
            snprintf(what, sizeof what, "rope %d heads x head_dim %d", (int)H, (int)D);
            compare(what, got, x, NULL, total, 1e-6, 1e-6);
            free(got);
            cpu.ops->rope_neox(cpu.ctx, x, n, H, D, pos, inv); /* on the rotated rows: both sides alike */
            CHECK(gpu.ops->rope_neox(gpu.ctx, dx, n, H, D, pos, dinv) == SD_OK);
            got = dev_download(dx, total);
            snprintf(what, sizeof what, "rope_neox %d heads x head_dim %d", (int)H, (int)D);
            compare(what, got, x, NULL, total, 1e-6, 1e-6);
            gpu.ops->buf_free(gpu.ctx, dx), gpu.ops->buf_free(gpu.ctx, dinv);
            free(x), free(inv), free(got);
        }
}

static void test_elementwise(void) {
    const size_t sizes[] = {1, 7, 4096, 1000003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float *a = rand_floats(n, 8.0f), *b = rand_floats(n, 2.0f), *want = malloc(n * sizeof(float));
        float *da = dev_upload(a, n), *db = dev_upload(b, n), *dout = dev_poisoned(n);
        char what[64];
        cpu.ops->swiglu(cpu.ctx, a, b, n, want);
        CHECK(gpu.ops->swiglu(gpu.ctx, da, db, n, dout) == SD_OK);
        float *got = dev_download(dout, n);
        snprintf(what, sizeof what, "swiglu n %zu", n);
        compare(what, got, want, NULL, n, 1e-7, 4e-7);
        free(got);
        cpu.ops->add(cpu.ctx, a, b, n, want);
        CHECK(gpu.ops->add(gpu.ctx, da, db, n, da) == SD_OK); /* aliasing out = a */
        got = dev_download(da, n);
        snprintf(what, sizeof what, "add (in place) n %zu", n);
        compare(what, got, want, NULL, n, 0.0, 0.0);
        free(got);
        cpu.ops->geglu(cpu.ctx, a, b, n, want);
        gpu.ops->buf_upload(gpu.ctx, da, a, n * sizeof(float));
        CHECK(gpu.ops->geglu(gpu.ctx, da, db, n, dout) == SD_OK);
        got = dev_download(dout, n);
        snprintf(what, sizeof what, "geglu n %zu", n);
        compare(what, got, want, NULL, n, 1e-7, 4e-7);
        free(got);
        cpu.ops->scale(cpu.ctx, a, n, 25.298221f, want);
        CHECK(gpu.ops->scale(gpu.ctx, da, n, 25.298221f, dout) == SD_OK);
        got = dev_download(dout, n);
        snprintf(what, sizeof what, "scale n %zu", n);
        compare(what, got, want, NULL, n, 0.0, 0.0);
        if (n % 7 == 0 || n == 4096) { /* add_rows: rows of 7 (or 64) plus a bias */
            int32_t dim = n % 7 == 0 ? 7 : 64, rows = (int32_t)(n / (size_t)dim);
            float *db2 = dev_upload(b, (size_t)dim);
            free(got);
            cpu.ops->add_rows(cpu.ctx, a, b, rows, dim, want);
            CHECK(gpu.ops->add_rows(gpu.ctx, da, db2, rows, dim, dout) == SD_OK);
            got = dev_download(dout, n);
            snprintf(what, sizeof what, "add_rows %d x %d", (int)rows, (int)dim);
            compare(what, got, want, NULL, n, 0.0, 0.0);
            gpu.ops->buf_free(gpu.ctx, db2);
        }
        gpu.ops->buf_free(gpu.ctx, da), gpu.ops->buf_free(gpu.ctx, db), gpu.ops->buf_free(gpu.ctx, dout);
        free(a), free(b), free(want), free(got);
    }
}

static void test_matmul(void) {
    const struct {
        int32_t n_in, n_out;
    } shapes[] = {
        {1, 1},      {7, 3},      {64, 64},     {576, 576},  {576, 1536},
        {1536, 576}, {1000, 777}, {4096, 1024}, {8192, 256}, {2048, 49},
    };
    const int32_t toks[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 40};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int32_t n_in = shapes[si].n_in, n_out = shapes[si].n_out, max_t = 40;
        size_t nw = (size_t)n_in * n_out;
        float *w = rand_floats(nw, 0.5f);
        for (size_t i = 0; i < nw; i++) w[i] = to_bf16(w[i]);
        float *x = rand_floats((size_t)max_t * n_in, 1.0f);
        void *dw = NULL;
        CHECK(gpu.ops->weight_upload(gpu.ctx, w, n_out, n_in, &dw) == SD_OK);
        float *dx = dev_upload(x, (size_t)max_t * n_in);
        float *alone = NULL; /* rows computed one token at a time (batch invariance) */
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
            int32_t nt = toks[ti];
            size_t ny = (size_t)nt * n_out;
            float *want = malloc(ny * sizeof(float));
            double *scale = malloc(ny * sizeof(double));
            cpu.ops->matmul(cpu.ctx, w, n_in, n_out, x, nt, want);
            for (int32_t t = 0; t < nt; t++)
                for (int32_t o = 0; o < n_out; o++) {
                    double s = 0;
                    for (int32_t i = 0; i < n_in; i++)
                        s += fabs((double)w[(size_t)o * n_in + i] * (double)x[(size_t)t * n_in + i]);
                    scale[(size_t)t * n_out + o] = s;
                }
            float *dy = dev_poisoned(ny);
            CHECK(gpu.ops->matmul(gpu.ctx, dw, n_in, n_out, dx, nt, dy) == SD_OK);
            float *got = dev_download(dy, ny);
            char what[80];
            bool streamed = nt <= 16;
            snprintf(what, sizeof what, "matmul %dx%d, %d tokens (%s)", (int)n_out, (int)n_in, (int)nt,
                     streamed ? "streaming" : "cuBLAS, x in BF16");
            /* f32 accumulation in another order: ~1e-6 of sum|w x|; cuBLAS
             * also rounds x to BF16: 2^-8 of it */
            compare(what, got, want, scale, ny, 1e-6, streamed ? 1e-5 : 8e-3);
            if (nt == 1) {
                alone = got;
                got = NULL;
            } else if (streamed && alone) {
                /* token 0's row must not depend on the other tokens */
                if (memcmp(got, alone, (size_t)n_out * sizeof(float)) != 0) {
                    fprintf(stderr, "test_cuda_ops: matmul %dx%d: token 0 differs alone and with %d tokens\n",
                            (int)n_out, (int)n_in, (int)nt);
                    failures++;
                }
            }
            gpu.ops->buf_free(gpu.ctx, dy);
            free(want), free(scale), free(got);
        }
        gpu.ops->weight_free(gpu.ctx, dw);
        gpu.ops->buf_free(gpu.ctx, dx);
        free(w), free(x), free(alone);
    }
}

/* matmul_fused against the CPU running the same job op by op (swiglu, then
 * each matrix, then the residual add): groups of 1-3 matrices, the SwiGLU
 * input, accumulation into y; shapes on the tensor-core path and off it (n_in
 * not a multiple of 32), token counts on the streaming path and on cuBLAS.
 * A token's rows must not depend on the other tokens of the call. */
static void test_matmul_fused(void) {
    const struct {
        int32_t n_mats, n_in, n_out[3];
        bool glu, acc;
    } cases[] = {
        {3, 576, {576, 192, 192}, false, false},     /* SmolLM2 Q/K/V */
        {3, 4096, {4096, 1024, 1024}, false, false}, /* 8B Q/K/V */
        {2, 576, {1536, 1536, 0}, false, false},     /* gate/up */
        {1, 4096, {1000, 0, 0}, false, true},        /* o projection into the residual */
        {1, 1536, {576, 0, 0}, true, true},          /* down: SwiGLU input, residual */
        {1, 1536, {576, 0, 0}, true, false},         /* down in a group: SwiGLU, no add */
        {2, 1000, {77, 333, 0}, false, false},       /* off the tensor cores */
        {1, 1000, {250, 0, 0}, true, true},          /* off the tensor cores, both fusions */
    };
    const int32_t toks[] = {1, 3, 8, 9, 16, 20};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t n_in = cases[ci].n_in, M = cases[ci].n_mats, max_t = 20;
        const bool glu = cases[ci].glu, acc = cases[ci].acc;
        float *w[3] = {NULL, NULL, NULL}, *alone[3] = {NULL, NULL, NULL};
        void *dw[3] = {NULL, NULL, NULL};
        for (int32_t m = 0; m < M; m++) {
            size_t nw = (size_t)n_in * (size_t)cases[ci].n_out[m];
            w[m] = rand_floats(nw, 0.5f);
            for (size_t i = 0; i < nw; i++) w[m][i] = to_bf16(w[m][i]);
            CHECK(gpu.ops->weight_upload(gpu.ctx, w[m], cases[ci].n_out[m], n_in, &dw[m]) == SD_OK);
        }
        const size_t nx = (size_t)max_t * (size_t)n_in;
        float *x = rand_floats(nx, 2.0f), *up = rand_floats(nx, 1.0f), *xin = malloc(nx * sizeof(float));
        if (glu)
            cpu.ops->swiglu(cpu.ctx, x, up, nx, xin);
        else
            memcpy(xin, x, nx * sizeof(float));
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
            const int32_t nt = toks[ti];
            /* x is overwritten by a SwiGLU run op by op: a fresh copy per call */
            float *dx = dev_upload(x, nx), *dup = dev_upload(up, nx);
            float *dy[3] = {NULL, NULL, NULL}, *y0[3] = {NULL, NULL, NULL};
            sd_matmul_job job = {
                .n_mats = M, .n_in = n_in, .n_tokens = nt, .x = dx, .up = glu ? dup : NULL, .accumulate = acc};
            for (int32_t m = 0; m < M; m++) {
                size_t ny = (size_t)nt * (size_t)cases[ci].n_out[m];
                y0[m] = rand_floats(ny, 3.0f);
                dy[m] = acc ? dev_upload(y0[m], ny) : dev_poisoned(ny);
                job.w[m] = dw[m];
                job.n_out[m] = cases[ci].n_out[m];
                job.y[m] = dy[m];
            }
            CHECK(gpu.ops->matmul_fused(gpu.ctx, &job) == SD_OK);
            for (int32_t m = 0; m < M; m++) {
                const int32_t n_out = cases[ci].n_out[m];
                const size_t ny = (size_t)nt * (size_t)n_out;
                float *want = malloc(ny * sizeof(float));
                double *scale = malloc(ny * sizeof(double));
                cpu.ops->matmul(cpu.ctx, w[m], n_in, n_out, xin, nt, want);
                for (int32_t t = 0; t < nt; t++)
                    for (int32_t o = 0; o < n_out; o++) {
                        double s = 0;
                        for (int32_t i = 0; i < n_in; i++)
                            s += fabs((double)w[m][(size_t)o * n_in + i] * (double)xin[(size_t)t * n_in + i]);
                        size_t k = (size_t)t * n_out + o;
                        if (acc) {
                            s += fabs((double)y0[m][k]);
                            want[k] += y0[m][k];
                        }
                        scale[k] = s;
                    }
                float *got = dev_download(dy[m], ny);
                char what[96];
                const bool streamed = nt <= 16;
                snprintf(what, sizeof what, "fused %d/%d: %dx%d%s%s, %d tokens%s", (int)m + 1, (int)M, (int)n_out,
                         (int)n_in, glu ? " swiglu" : "", acc ? " +=" : "", (int)nt, streamed ? "" : " (cuBLAS)");
                /* the SwiGLU's expf may differ by an ulp between the CPU and the GPU */
                compare(what, got, want, scale, ny, 1e-6, streamed ? 2e-5 : 8e-3);
                if (acc) /* y0 differs per call: compare the products, not the sums */
                    for (size_t k = 0; k < ny; k++) got[k] -= y0[m][k];
                if (nt == 1) {
                    alone[m] = got;
                    got = NULL;
                } else if (streamed && alone[m] && memcmp(got, alone[m], (size_t)n_out * sizeof(float)) != 0 && !acc) {
                    fprintf(stderr, "test_cuda_ops: %s: token 0 differs alone and with %d tokens\n", what, (int)nt);
                    failures++;
                }
                free(want), free(scale), free(got), free(y0[m]);
                gpu.ops->buf_free(gpu.ctx, dy[m]);
            }
            gpu.ops->buf_free(gpu.ctx, dx), gpu.ops->buf_free(gpu.ctx, dup);
        }
        for (int32_t m = 0; m < M; m++) {
            gpu.ops->weight_free(gpu.ctx, dw[m]);
            free(w[m]), free(alone[m]);
        }
        free(x), free(up), free(xin);
    }
}

/* A ragged batch over a shuffled paged cache. */
typedef struct kv_case {
    int32_t H, KV, D, bs, n_seqs;
    int32_t ctx[4];   /* tokens already cached per sequence */
    int32_t n_new[4]; /* new tokens per sequence */
} kv_case;

static void run_kv_case(const kv_case *c, bool announce) {
    int32_t row = c->KV * c->D, n = 0, n_blocks = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        n += c->n_new[s];
        n_blocks += (c->ctx[s] + c->n_new[s] + c->bs - 1) / c->bs;
    }
    n_blocks += 3; /* spare blocks nobody uses */
    /* a random permutation of blocks handed out to the sequences in turn */
    int32_t *perm = malloc((size_t)n_blocks * sizeof *perm);
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = rng_int(i + 1), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    int32_t bt[512], seq_bt[4], used = 0;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        seq_bt[s] = used;
        int32_t nb = (c->ctx[s] + c->n_new[s] + c->bs - 1) / c->bs;
        for (int32_t b = 0; b < nb; b++) bt[used + b] = perm[used + b];
        used += nb;
    }
    /* tokens of the sequences interleaved round-robin */
    int32_t pos[64], bt_off[64], next[4] = {0}, t = 0;
    while (t < n)
        for (int32_t s = 0; s < c->n_seqs && t < n; s++)
            if (next[s] < c->n_new[s]) {
                pos[t] = c->ctx[s] + next[s]++;
                bt_off[t] = seq_bt[s];
                t++;
            }
    size_t pool_n = (size_t)n_blocks * c->bs * row;
    float *k_pool = rand_floats(pool_n, 1.0f), *v_pool = rand_floats(pool_n, 1.0f);
    float *k_new = rand_floats((size_t)n * row, 1.0f), *v_new = rand_floats((size_t)n * row, 1.0f);
    float *q = rand_floats((size_t)n * c->H * c->D, 1.0f);
    float *dk = dev_upload(k_pool, pool_n), *dv = dev_upload(v_pool, pool_n);
    float *dkn = dev_upload(k_new, (size_t)n * row), *dvn = dev_upload(v_new, (size_t)n * row);
    float *dq = dev_upload(q, (size_t)n * c->H * c->D), *dout = dev_poisoned((size_t)n * c->H * c->D);
    if (announce) {
        const sd_host_array arrays[] = {{pos, (size_t)n}, {bt, (size_t)used}, {bt_off, (size_t)n}};
        CHECK(gpu.ops->host_arrays(gpu.ctx, arrays, 3) == SD_OK);
    }
    float scale = 1.0f / sqrtf((float)c->D);
    cpu.ops->kv_write(cpu.ctx, k_pool, c->bs, row, k_new, n, pos, bt, bt_off);
    cpu.ops->kv_write(cpu.ctx, v_pool, c->bs, row, v_new, n, pos, bt, bt_off);
    CHECK(gpu.ops->kv_write(gpu.ctx, dk, c->bs, row, dkn, n, pos, bt, bt_off) == SD_OK);
    CHECK(gpu.ops->kv_write(gpu.ctx, dv, c->bs, row, dvn, n, pos, bt, bt_off) == SD_OK);
    float *want = malloc((size_t)n * c->H * c->D * sizeof(float));
    cpu.ops->attention(cpu.ctx, q, k_pool, v_pool, n, c->H, c->KV, c->D, c->bs, pos, bt, bt_off, scale, want);
    CHECK(gpu.ops->attention(gpu.ctx, dq, dk, dv, n, c->H, c->KV, c->D, c->bs, pos, bt, bt_off, scale, dout) == SD_OK);
    float *got_k = dev_download(dk, pool_n), *got = dev_download(dout, (size_t)n * c->H * c->D);
    char what[96];
    snprintf(what, sizeof what, "kv_write H%d/KV%d D%d bs%d%s", (int)c->H, (int)c->KV, (int)c->D, (int)c->bs,
             announce ? " announced" : "");
    compare(what, got_k, k_pool, NULL, pool_n, 0.0, 0.0);
    snprintf(what, sizeof what, "attention H%d/KV%d D%d bs%d ctx<=%d%s", (int)c->H, (int)c->KV, (int)c->D, (int)c->bs,
             (int)(c->ctx[0] + c->n_new[0]), announce ? " announced" : "");
    /* outputs are convex combinations of v in [-1, 1]: absolute tolerance */
    compare(what, got, want, NULL, (size_t)n * c->H * c->D, 2e-6, 2e-5);
    /* the sliding window (a window of 1, of 4, and one wider than any context) */
    const int32_t windows[] = {1, 4, 100000};
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
        cpu.ops->attention_window(cpu.ctx, q, k_pool, v_pool, n, c->H, c->KV, c->D, c->bs, pos, bt, bt_off,
                                  windows[wi], scale, want);
        CHECK(gpu.ops->attention_window(gpu.ctx, dq, dk, dv, n, c->H, c->KV, c->D, c->bs, pos, bt, bt_off, windows[wi],
                                        scale, dout) == SD_OK);
        float *got_w = dev_download(dout, (size_t)n * c->H * c->D);
        snprintf(what, sizeof what, "attention_window %d H%d/KV%d D%d bs%d%s", (int)windows[wi], (int)c->H,
                 (int)c->KV, (int)c->D, (int)c->bs, announce ? " announced" : "");
        compare(what, got_w, want, NULL, (size_t)n * c->H * c->D, 2e-6, 2e-5);
        free(got_w);
    }

    /* rope_kv: rope of q and k, then both cache writes, against the CPU's
     * four ops (the pools as they were after the writes above) */
    float *inv_freq = malloc((size_t)(c->D / 2) * sizeof(float));
    for (int32_t i = 0; i < c->D / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)c->D);
    float *d_freq = dev_upload(inv_freq, (size_t)(c->D / 2));
    float *k2 = rand_floats((size_t)n * row, 1.0f), *v2 = rand_floats((size_t)n * row, 1.0f);
    float *dk2 = dev_upload(k2, (size_t)n * row), *dv2 = dev_upload(v2, (size_t)n * row);
    CHECK(gpu.ops->rope_kv(gpu.ctx, dq, dk2, dv2, n, c->H, c->KV, c->D, pos, d_freq, dk, dv, c->bs, bt, bt_off) ==
          SD_OK);
    cpu.ops->rope(cpu.ctx, q, n, c->H, c->D, pos, inv_freq);
    cpu.ops->rope(cpu.ctx, k2, n, c->KV, c->D, pos, inv_freq);
    cpu.ops->kv_write(cpu.ctx, k_pool, c->bs, row, k2, n, pos, bt, bt_off);
    cpu.ops->kv_write(cpu.ctx, v_pool, c->bs, row, v2, n, pos, bt, bt_off);
    float *got_q = dev_download(dq, (size_t)n * c->H * c->D), *got_k2 = dev_download(dk, pool_n);
    float *got_v2 = dev_download(dv, pool_n);
    snprintf(what, sizeof what, "rope_kv H%d/KV%d D%d bs%d%s: q", (int)c->H, (int)c->KV, (int)c->D, (int)c->bs,
             announce ? " announced" : "");
    compare(what, got_q, q, NULL, (size_t)n * c->H * c->D, 1e-6, 1e-6);
    snprintf(what, sizeof what, "rope_kv H%d/KV%d D%d bs%d%s: k pool", (int)c->H, (int)c->KV, (int)c->D, (int)c->bs,
             announce ? " announced" : "");
    compare(what, got_k2, k_pool, NULL, pool_n, 1e-6, 1e-6);
    snprintf(what, sizeof what, "rope_kv H%d/KV%d D%d bs%d%s: v pool", (int)c->H, (int)c->KV, (int)c->D, (int)c->bs,
             announce ? " announced" : "");
    compare(what, got_v2, v_pool, NULL, pool_n, 0.0, 0.0);
    free(inv_freq), free(k2), free(v2), free(got_q), free(got_k2), free(got_v2);
    gpu.ops->buf_free(gpu.ctx, d_freq), gpu.ops->buf_free(gpu.ctx, dk2), gpu.ops->buf_free(gpu.ctx, dv2);

    float *bufs[] = {dk, dv, dkn, dvn, dq, dout};
    for (size_t i = 0; i < 6; i++) gpu.ops->buf_free(gpu.ctx, bufs[i]);
    free(perm), free(k_pool), free(v_pool), free(k_new), free(v_new), free(q), free(want), free(got_k), free(got);
}

static void test_attention(void) {
    const kv_case cases[] = {
        {1, 1, 16, 1, 1, {0}, {1}},                          /* the very first token */
        {4, 2, 16, 3, 3, {0, 5, 2}, {4, 1, 7}},              /* ragged, block size 3 */
        {9, 3, 64, 16, 2, {15, 16}, {1, 9}},                 /* SmolLM2 heads, block edges */
        {32, 8, 128, 16, 2, {700, 40}, {9, 1}},              /* 8B heads, several chunks, verify 9 */
        {8, 8, 256, 16, 1, {300}, {3}},                      /* head_dim > 128 */
        {6, 2, 48, 16, 4, {1, 255, 256, 257}, {2, 2, 2, 2}}, /* head_dim not dividing the block */
        {2, 1, 6, 3, 2, {5, 300}, {3, 2}},                   /* head_dim 6: the scalar path */
        {4, 2, 64, 16, 2, {0, 100}, {20, 10}},               /* 30 tokens: no position splits */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_kv_case(&cases[i], false);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_kv_case(&cases[i], true);
}

/* Runs tests (NULL-terminated) on a fresh GPU backend made with var=value. */
static void rerun_with(const sd_backend_opts *opts, const char *switch_, const char *what, void (*const *tests)(void)) {
    if (sd_cuda_backend_create_opts(0, opts, &gpu) != SD_OK) {
        fprintf(stderr, "test_cuda_ops: cuda:0 could not be opened again (%s)\n", switch_);
        failures++;
    } else {
        printf("with %s (%s):\n", switch_, what);
        for (int i = 0; tests[i]; i++) tests[i]();
        gpu.ops->destroy(&gpu.ctx);
    }
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_cuda_ops");
    if (sd_cuda_backend_create(0, &gpu) != SD_OK) {
        printf("test_cuda_ops: skipped: no usable CUDA GPU (cuda:0 could not be opened)\n");
        return 77;
    }
    if (sd_cpu_backend_create(2, &cpu) != SD_OK) return 1;
    test_embed();
    test_rmsnorm();
    test_rope();
    test_elementwise();
    test_matmul();
    test_matmul_fused();
    test_attention();
    gpu.ops->destroy(&gpu.ctx);
    /* the same matmuls with the tensor-core kernel off: the CUDA-core
     * streaming kernel then takes every shape */
    static void (*const mm_tests[])(void) = {test_matmul, test_matmul_fused, NULL};
    sd_backend_opts no_mma = sd_backend_default_opts();
    no_mma.cuda_mma = false;
    rerun_with(&no_mma, "--cuda-mma 0", "CUDA cores", mm_tests);
    /* programmatic launches (Hopper and later; elsewhere the backend turns
     * them off): the ops whose kernels follow one another within the op
     * (SwiGLU -> matmul, attention -> its join, matvec -> slice sum) */
    static void (*const pdl_tests[])(void) = {test_matmul, test_matmul_fused, test_attention, NULL};
    sd_backend_opts pdl = sd_backend_default_opts();
    pdl.cuda_pdl = true;
    rerun_with(&pdl, "--cuda-pdl 1", "programmatic launches", pdl_tests);
    cpu.ops->destroy(&cpu.ctx);
    if (failures) {
        fprintf(stderr, "test_cuda_ops: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_cuda_ops: all ops match the CPU\n");
    return 0;
}
#endif
