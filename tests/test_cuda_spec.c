/* test_cuda_spec.c — speculative verification on the GPU (engine/cuda/spec.cu)
 * against the CPU implementation (sd_sample_probs + sd_spec_verify /
 * sd_spec_verify_greedy) on the same logits, drafts, q and random keys: the
 * same decisions, sequence by sequence.
 *
 * Each round uploads random logits rows (some -inf, vocabularies of 7, 1000
 * and 49152 entries) and verifies a batch of sequences with mixed sampling
 * (greedy; T = 1; T = 0.7 with top-p 0.9; top-k 5; min-p 0.05; all filters
 * at once) and mixed proposals: a drafter's sparse top-N q of a perturbed
 * distribution with the draft drawn from it, one-hot n-gram q, q equal to
 * the target's own processed distribution (acceptance ~1), q that puts the
 * draft where p has no mass, and q without the drafted token. The GPU's
 * status, n_accepted, tokens and info flags must equal the CPU's (the
 * coupled rule, spec.h) for every sequence; rows with NaN logits must be
 * refused by both. The run prints how often each path (bonus, a rejected
 * draft) was taken, so a path that was never exercised shows.
 *
 * Exits 77 (skipped, saying why) without a CUDA build or a usable GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "specd/sample.h"
#include "specd/spec.h"

#ifndef SPECD_HAVE_CUDA
int main(void) {
    printf("test_cuda_spec: skipped: this build has no CUDA backend (nvcc was not found)\n");
    return 77;
}
#else

#define MAX_SEQS 8
#define MAX_KK   8
#define TOP_N    16

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; }
static int32_t rng_int(int32_t n) { return (int32_t)(rng_next() % (uint64_t)n); }

typedef enum { Q_DRAFTER, Q_ONEHOT, Q_SELF, Q_DISJOINT, Q_MISSING, Q_KINDS } q_kind;
static const char *q_names[Q_KINDS] = {"drafter top-N", "one-hot", "q = p", "disjoint", "q(y) = 0"};

typedef struct seq_case {
    sd_sampling s;
    int32_t k;
    q_kind kind;
    int32_t draft[MAX_KK];
    int32_t q_ids[MAX_KK][TOP_N];
    float q_probs[MAX_KK][TOP_N];
    sd_spec_q q[MAX_KK];
} seq_case;

static sd_sampling sampling_for(int which) {
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    s.seed = rng_next();
    switch (which % 6) {
    case 0: s.temperature = 0.0f; break;
    case 1: break;
    case 2: s.temperature = 0.7f, s.top_p = 0.9f; break;
    case 3: s.top_k = 5; break;
    case 4: s.min_p = 0.05f; break;
    default: s.temperature = 1.3f, s.top_k = 50, s.top_p = 0.8f, s.min_p = 0.02f; break;
    }
    return s;
}

/* Builds draft i's q and draft token from the target's processed row p. */
static void make_proposal(seq_case *c, int32_t i, const float *logits_row, const float *p, int32_t V, float *tmp,
                          float *tmp2) {
    int32_t n = 0;
    switch (c->kind) {
    case Q_DRAFTER: {
        for (int32_t v = 0; v < V; v++) tmp[v] = logits_row[v] + (float)(rng_unit() * 2.0 - 1.0);
        sd_sampling ds = c->s;
        if (ds.temperature == 0.0f) ds.temperature = 1.0f;
        sd_sample_probs(tmp, V, &ds, tmp2);
        sd_spec_sparsify(tmp2, V, TOP_N, c->q_ids[i], c->q_probs[i], &n);
        break;
    }
    case Q_SELF: sd_spec_sparsify(p, V, TOP_N < V ? TOP_N : V, c->q_ids[i], c->q_probs[i], &n); break;
    case Q_ONEHOT:
    case Q_MISSING:
        c->q_ids[i][0] = rng_int(V);
        c->q_probs[i][0] = 1.0f;
        n = 1;
        break;
    case Q_DISJOINT: { /* mass where p has none, when there is such a token */
        int32_t zero = -1;
        for (int32_t t = 0; t < 64 && zero < 0; t++) {
            int32_t v = rng_int(V);
            if (p[v] == 0.0f) zero = v;
        }
        c->q_ids[i][0] = zero >= 0 ? zero : rng_int(V);
        c->q_probs[i][0] = 1.0f;
        n = 1;
        break;
    }
    default: break;
    }
    c->q[i].n = n;
    c->q[i].ids = c->q_ids[i];
    c->q[i].probs = c->q_probs[i];
    sd_spec_q qq = c->q[i];
    c->draft[i] = sd_spec_q_sample(&qq, rng_unit());
    if (c->kind == Q_MISSING) c->draft[i] = (c->q_ids[i][0] + 1) % V; /* drafted outside its own q */
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_cuda_spec");
    sd_backend_handle gpu;
    if (sd_cuda_backend_create(0, &gpu) != SD_OK) {
        printf("test_cuda_spec: skipped: no usable CUDA GPU (cuda:0 could not be opened)\n");
        return 77;
    }
    const int32_t vocabs[] = {7, 1000, 49152};
    long mismatches = 0, checked = 0, bonus = 0, residual = 0, refused = 0;
    long by_kind[Q_KINDS] = {0};
    int rounds = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int32_t V = vocabs[vi];
        const int n_rounds = V > 10000 ? 25 : 120;
        const size_t max_rows = (size_t)MAX_SEQS * (MAX_KK + 1);
        float *logits = malloc(max_rows * (size_t)V * sizeof(float));
        float *p = malloc((size_t)(MAX_KK + 1) * (size_t)V * sizeof(float));
        float *tmp = malloc((size_t)V * sizeof(float)), *tmp2 = malloc((size_t)V * sizeof(float));
        float *d_logits = gpu.ops->buf_alloc(gpu.ctx, max_rows * (size_t)V * sizeof(float));
        seq_case *cases = calloc(MAX_SEQS, sizeof *cases);
        sd_spec_rows rows[MAX_SEQS];
        for (int round = 0; round < n_rounds; round++, rounds++) {
            int32_t n_seqs = 1 + rng_int(MAX_SEQS), row = 0;
            bool nan_seq[MAX_SEQS] = {false};
            for (size_t i = 0; i < (size_t)n_seqs * (MAX_KK + 1) * (size_t)V; i++) {
                double z = rng_unit();
                logits[i] = z < 0.02 ? -INFINITY : (float)((rng_unit() * 2.0 - 1.0) * (round % 3 == 0 ? 12.0 : 3.0));
            }
            int32_t expect_tokens[MAX_SEQS][MAX_KK + 1], expect_na[MAX_SEQS];
            sd_status expect_st[MAX_SEQS];
            sd_spec_info expect_info[MAX_SEQS];
            for (int32_t si = 0; si < n_seqs; si++) {
                seq_case *c = &cases[si];
                c->s = sampling_for(rng_int(6));
                c->k = (int32_t[]){0, 1, 4, 8}[rng_int(4)];
                c->kind = (q_kind)rng_int(Q_KINDS);
                if (c->s.temperature == 0.0f && (c->kind == Q_MISSING || c->kind == Q_DISJOINT)) c->kind = Q_DRAFTER;
                float *rows_logits = logits + (size_t)row * (size_t)V;
                if (si == 3 && round % 7 == 0) { /* a NaN: refused by both */
                    rows_logits[rng_int(V)] = NAN;
                    nan_seq[si] = true;
                }
                /* the CPU reference */
                sd_status st = SD_OK;
                for (int32_t r = 0; r <= c->k && st == SD_OK; r++) {
                    const float *lr = rows_logits + (size_t)r * (size_t)V;
                    if (c->s.temperature == 0.0f) {
                        const int32_t best = sd_argmax(lr, V);
                        for (int32_t v = 0; v < V; v++) p[(size_t)r * V + v] = v == best ? 1.0f : 0.0f;
                    } else {
                        st = sd_sample_probs(lr, V, &c->s, p + (size_t)r * V);
                    }
                }
                for (int32_t r = 0; r < c->k; r++) {
                    if (st != SD_OK) { /* still give it a well-formed proposal */
                        c->q_ids[r][0] = 0, c->q_probs[r][0] = 1.0f, c->draft[r] = 0;
                        c->q[r] = (sd_spec_q){1, c->q_ids[r], c->q_probs[r]};
                        continue;
                    }
                    if (c->s.temperature == 0.0f) {
                        const float *lr = rows_logits + (size_t)r * (size_t)V;
                        c->draft[r] = rng_unit() < 0.7 ? sd_argmax(lr, V) : rng_int(V);
                        c->q_ids[r][0] = c->draft[r], c->q_probs[r][0] = 1.0f;
                        c->q[r] = (sd_spec_q){1, c->q_ids[r], c->q_probs[r]};
                    } else {
                        make_proposal(c, r, rows_logits + (size_t)r * V, p + (size_t)r * V, V, tmp, tmp2);
                    }
                }
                uint64_t pos0 = rng_next() % 100000;
                memset(&expect_info[si], 0, sizeof expect_info[si]);
                expect_na[si] = 0;
                if (st == SD_OK && c->s.temperature == 0.0f) {
                    int32_t am[MAX_KK + 1];
                    for (int32_t r = 0; r <= c->k; r++) am[r] = sd_argmax(rows_logits + (size_t)r * V, V);
                    st = sd_spec_verify_greedy(am, c->draft, c->k, expect_tokens[si], &expect_na[si]);
                } else if (st == SD_OK) {
                    st = sd_spec_verify(p, V, c->draft, c->q, c->k, c->s.seed, pos0, expect_tokens[si], &expect_na[si],
                                        &expect_info[si]);
                }
                expect_st[si] = st;
                rows[si] = (sd_spec_rows){
                    .row0 = row, .k = c->k, .draft = c->draft, .q = c->q, .sampling = &c->s, .pos0 = pos0};
                row += c->k + 1;
            }
            if (gpu.ops->buf_upload(gpu.ctx, d_logits, logits, (size_t)row * (size_t)V * sizeof(float)) != SD_OK ||
                gpu.ops->spec_verify(gpu.ctx, d_logits, V, n_seqs, rows) != SD_OK) {
                fprintf(stderr, "test_cuda_spec: FAIL: the GPU verification call failed (V %d, round %d)\n", (int)V,
                        round);
                return 1;
            }
            for (int32_t si = 0; si < n_seqs; si++) {
                const seq_case *c = &cases[si];
                const sd_spec_rows *g = &rows[si];
                checked++;
                by_kind[c->kind]++;
                bool same = (g->status == SD_OK) == (expect_st[si] == SD_OK);
                if (same && expect_st[si] == SD_OK) {
                    same = g->n_accepted == expect_na[si] &&
                           memcmp(g->tokens, expect_tokens[si], sizeof(int32_t) * (size_t)(expect_na[si] + 1)) == 0 &&
                           g->info.bonus == expect_info[si].bonus;
                    bonus += expect_info[si].bonus;
                    residual += c->s.temperature != 0.0f && !expect_info[si].bonus;
                } else if (same) {
                    refused++;
                }
                if (nan_seq[si] && c->s.temperature != 0.0f && g->status == SD_OK) same = false;
                if (!same) {
                    if (mismatches < 10)
                        fprintf(stderr,
                                "  mismatch: V %d round %d seq %d (T %.2f top-k %d top-p %.2f min-p %.2f, k %d, %s): "
                                "cpu %s n_acc %d tok %d | gpu %s n_acc %d tok %d\n",
                                (int)V, round, (int)si, (double)c->s.temperature, (int)c->s.top_k, (double)c->s.top_p,
                                (double)c->s.min_p, (int)c->k, q_names[c->kind], sd_status_str(expect_st[si]),
                                (int)expect_na[si], (int)expect_tokens[si][expect_na[si]], sd_status_str(g->status),
                                (int)g->n_accepted, (int)g->tokens[g->n_accepted]);
                    mismatches++;
                }
            }
        }
        gpu.ops->buf_free(gpu.ctx, d_logits);
        free(logits), free(p), free(tmp), free(tmp2), free(cases);
    }
    gpu.ops->destroy(&gpu.ctx);
    printf("test_cuda_spec: %ld sequences in %d batches: %ld bonus, %ld ended at a rejected draft, %ld refused by "
           "both\n",
           checked, rounds, bonus, residual, refused);
    printf("test_cuda_spec: proposals:");
    for (int k = 0; k < Q_KINDS; k++) printf(" %s %ld%s", q_names[k], by_kind[k], k + 1 < Q_KINDS ? "," : "\n");
    if (mismatches) {
        fprintf(stderr, "test_cuda_spec: FAIL: %ld of %ld sequences decided differently on the GPU\n", mismatches,
                checked);
        return 1;
    }
    if (!bonus || !residual || !refused) {
        fprintf(stderr, "test_cuda_spec: FAIL: a path was never exercised (bonus %ld rejected %ld refused %ld)\n",
                bonus, residual, refused);
        return 1;
    }
    printf("test_cuda_spec: every decision equals the CPU's\n");
    return 0;
}
#endif
