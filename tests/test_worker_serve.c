/* test_worker_serve.c — the verifier's and the drafter's request handling
 * (verifier/verify_serve.c, drafter/draft_serve.c), called directly without
 * sockets, on small random models written by specd-mkmodel at test start
 * (skipped when it cannot run).
 *
 * Verifier: a batch of three sequences (greedy, T=0.8, T=1 with top-p 0.9)
 * stepped through keep_len/append/drafts commits, step for step, what
 * sd_spec_decoder commits for each sequence alone with an identical drafter;
 * CACHE_MISS for a short cache and an unknown id (and the same token after
 * the prefix is resent); KV_FULL when slots or blocks run out, without
 * taking a slot; Release returns the blocks (stats); prefill_only chunks
 * give the same next token as a whole-prompt step, and with prompt_logprobs
 * the whole prompt's log-softmax at every position; a warm-up before serving
 * runs the sizes it says and leaves nothing behind.
 * Drafter: a batch with keep_len truncation proposes exactly what
 * sd_drafter_propose gives on the same context (tokens and q); CACHE_MISS;
 * Release; the n-gram drafter's one-hot q; a warm-up leaves the proposals
 * unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "draft_serve.h"
#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/sample.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"
#include "verify_serve.h"

#define VOCAB   300
#define MAX_CTX 256
#define N_SEQS  3
#define K       4

static struct {
    char dir[64], target[128], draft[128];
    bool ok;
    sd_model *target_model;
    uint64_t hash;
    int32_t n_vocab;
} env;

static int setup_models(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-worker-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.target, sizeof env.target, "%s/target.gguf", env.dir);
    snprintf(env.draft, sizeof env.draft, "%s/draft.gguf", env.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers 2 --vocab %d --ctx %d --seed 31 >/dev/null 2>&1 && "
             "'%s' -o '%s' --layers 2 --vocab %d --ctx %d --seed 31 --dtype q4_0 >/dev/null 2>&1",
             SPECD_MKMODEL, env.target, VOCAB, MAX_CTX, SPECD_MKMODEL, env.draft, VOCAB, MAX_CTX);
    env.ok = system(cmd) == 0;
    if (!env.ok) return 0;
    sd_gguf *g = NULL;
    char err[128];
    if (sd_gguf_open(env.target, &g, err, sizeof err) != SD_OK) return -1;
    sd_tok *tok = NULL;
    if (sd_tok_from_gguf(g, &tok) != SD_OK) return -1;
    env.hash = sd_tok_vocab_hash(tok);
    env.n_vocab = sd_tok_n_vocab(tok);
    sd_tok_free(&tok);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    sd_status st = sd_model_load(g, &mp, &env.target_model);
    sd_gguf_close(&g);
    return st == SD_OK ? 0 : -1;
}

static int teardown_models(void **state) {
    (void)state;
    sd_model_free(&env.target_model);
    unlink(env.target);
    unlink(env.draft);
    rmdir(env.dir);
    return 0;
}

#define SKIP_WITHOUT_MODELS()                                                   \
    do {                                                                        \
        if (!env.ok) {                                                          \
            fprintf(stderr, "skipped: specd-mkmodel could not write models\n"); \
            skip();                                                             \
        }                                                                       \
    } while (0)

static sd_drafter *open_draft(int32_t max_seqs) {
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = max_seqs;
    dp.max_ctx = MAX_CTX;
    dp.n_threads = 1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_model_open(env.draft, env.hash, env.n_vocab, &dp, &d), SD_OK);
    return d;
}

static sd_verifier *new_verifier_cache(int32_t max_seqs, int32_t kv_blocks, int32_t prefix_cache_pct) {
    sd_verifier_params vp = sd_verifier_default_params();
    vp.max_seqs = max_seqs;
    vp.kv_blocks = kv_blocks;
    vp.max_batch = 8;
    vp.max_k = 8;
    vp.prefix_cache_pct = prefix_cache_pct;
    sd_verifier *v = NULL;
    assert_int_equal(sd_verifier_create(env.target_model, &vp, &v), SD_OK);
    return v;
}

static sd_verifier *new_verifier(int32_t max_seqs, int32_t kv_blocks) {
    sd_verifier_params vp = sd_verifier_default_params();
    vp.max_seqs = max_seqs;
    vp.kv_blocks = kv_blocks;
    vp.max_batch = 8;
    vp.max_k = 8;
    sd_verifier *v = NULL;
    assert_int_equal(sd_verifier_create(env.target_model, &vp, &v), SD_OK);
    return v;
}

static void make_prompt(int32_t *p, int32_t n, uint32_t seed) {
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (int32_t)((seed >> 16) % VOCAB);
    }
}

/* A VerifySeq over caller-owned arrays. */
typedef struct vseq {
    Specd__VerifySeq seq;
    Specd__Sampling sampling;
    Specd__SparseDist dists[K];
    Specd__SparseDist *dist_ptrs[K];
    int32_t draft[K];
} vseq;

static void vseq_init(vseq *s, uint64_t id, uint32_t keep_len, int32_t *append, size_t n_append,
                      const sd_sampling *smp) {
    specd__verify_seq__init(&s->seq);
    specd__sampling__init(&s->sampling);
    sd_net_sampling_to_pb(smp, &s->sampling);
    s->seq.request_id = id;
    s->seq.keep_len = keep_len;
    s->seq.append = append;
    s->seq.n_append = n_append;
    s->seq.sampling = &s->sampling;
}

static void vseq_drafts(vseq *s, const int32_t *tokens, const sd_spec_q *q, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        s->draft[i] = tokens[i];
        specd__sparse_dist__init(&s->dists[i]);
        s->dists[i].n_ids = s->dists[i].n_probs = (size_t)q[i].n;
        s->dists[i].ids = (int32_t *)q[i].ids;
        s->dists[i].probs = (float *)q[i].probs;
        s->dist_ptrs[i] = &s->dists[i];
    }
    s->seq.draft = s->draft;
    s->seq.n_draft = (size_t)n;
    s->seq.q = s->dist_ptrs;
    s->seq.n_q = (size_t)n;
}

static const Specd__VerifyResult *run_verify(sd_verifier *v, vseq *seqs, size_t n, bool prefill_only,
                                             Specd__VerifyResponse *resp) {
    Specd__VerifySeq *ptrs[8];
    for (size_t i = 0; i < n; i++) ptrs[i] = &seqs[i].seq;
    Specd__VerifyRequest req = SPECD__VERIFY_REQUEST__INIT;
    req.step_id = 77;
    req.seqs = ptrs;
    req.n_seqs = n;
    req.prefill_only = prefill_only;
    static sd_net_verify_step step;
    sd_net_verify_step_of(&req, &step);
    assert_int_equal(sd_verifier_handle(v, &step, resp), SD_OK);
    assert_int_equal(resp->step_id, 77);
    assert_int_equal(resp->n_results, n);
    return resp->results[0];
}

static sd_sampling sampling_of(int i) {
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    if (i == 0) s.temperature = 0.0f;
    if (i == 1) {
        s.temperature = 0.8f;
        s.seed = 5;
    }
    if (i == 2) {
        s.temperature = 1.0f;
        s.top_p = 0.9f;
        s.seed = 7;
    }
    return s;
}

/* The batch over keep_len/append/drafts commits what sd_spec_decoder commits alone. */
static void test_verify_batch_matches_spec_decode(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    enum { STEPS = 8, PROMPT = 12 };
    int32_t prompt[N_SEQS][PROMPT];
    int32_t ref[N_SEQS][STEPS][K + 1], ref_n[N_SEQS][STEPS];
    int64_t total_accepted = 0;
    for (int i = 0; i < N_SEQS; i++) {
        make_prompt(prompt[i], PROMPT, 100u + (uint32_t)i);
        sd_drafter *d = open_draft(1);
        sd_spec_decoder *dec = NULL;
        assert_int_equal(sd_spec_decoder_create(env.target_model, d, MAX_CTX, &dec), SD_OK);
        int32_t ctx[MAX_CTX];
        memcpy(ctx, prompt[i], sizeof prompt[i]);
        int32_t n_ctx = PROMPT;
        sd_sampling s = sampling_of(i);
        for (int step = 0; step < STEPS; step++) {
            int32_t n_acc = 0;
            assert_int_equal(sd_spec_decoder_step(dec, ctx, n_ctx, K, &s, ref[i][step], &ref_n[i][step], NULL, &n_acc),
                             SD_OK);
            total_accepted += n_acc;
            memcpy(ctx + n_ctx, ref[i][step], (size_t)ref_n[i][step] * sizeof *ctx);
            n_ctx += ref_n[i][step];
        }
        sd_spec_decoder_free(&dec);
        sd_drafter_free(&d);
    }
    assert_true(total_accepted > 0); /* the Q4 draft agrees sometimes: accepted drafts are exercised */

    sd_verifier *v = new_verifier(8, 64);
    sd_drafter *d = open_draft(N_SEQS);
    int32_t committed[N_SEQS][MAX_CTX], n_committed[N_SEQS];
    uint32_t cached[N_SEQS] = {0};
    for (int i = 0; i < N_SEQS; i++) {
        memcpy(committed[i], prompt[i], sizeof prompt[i]);
        n_committed[i] = PROMPT;
    }
    for (int step = 0; step < STEPS; step++) {
        vseq seqs[N_SEQS];
        for (int i = 0; i < N_SEQS; i++) {
            sd_sampling s = sampling_of(i);
            vseq_init(&seqs[i], 1000u + (uint64_t)i, cached[i], committed[i] + cached[i],
                      (size_t)(n_committed[i] - (int32_t)cached[i]), &s);
            int32_t tokens[K];
            sd_spec_q q[K];
            int32_t nd = 0;
            assert_int_equal(sd_drafter_propose(d, i, committed[i], n_committed[i], K, &s, tokens, q, &nd), SD_OK);
            vseq_drafts(&seqs[i], tokens, q, nd);
        }
        Specd__VerifyResponse resp;
        run_verify(v, seqs, N_SEQS, false, &resp);
        for (int i = 0; i < N_SEQS; i++) {
            const Specd__VerifyResult *r = resp.results[i];
            assert_int_equal(r->request_id, 1000u + (uint64_t)i);
            assert_int_equal(r->code, SPECD__CODE__CODE_OK);
            assert_int_equal((int)r->n_commit, ref_n[i][step]);
            assert_int_equal((int)r->n_accepted, ref_n[i][step] - 1);
            assert_memory_equal(r->commit, ref[i][step], r->n_commit * sizeof(int32_t));
            memcpy(committed[i] + n_committed[i], r->commit, r->n_commit * sizeof(int32_t));
            n_committed[i] += (int32_t)r->n_commit;
            assert_int_equal((int)r->cached_len, n_committed[i] - 1);
            cached[i] = r->cached_len;
        }
    }
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_verifier_stats(v, &st);
    assert_int_equal(st.n_sequences, N_SEQS);
    assert_int_equal(st.steps, STEPS);
    sd_drafter_free(&d);
    sd_verifier_free(&v);
}

/* One sequence's result of a penalized step with 3 alternatives per token:
 * the reference's next tokens, one logprob each, alternatives in order,
 * under greedy led by the token itself; appended to committed. */
static void check_penalized_step(const Specd__VerifyResult *r, bool greedy, const int32_t *ref, int32_t ref_n,
                                 int32_t *committed, int32_t *n_committed, uint32_t *cached) {
    enum { TOP = 3 };
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_true(*n_committed + (int32_t)r->n_commit <= ref_n);
    assert_memory_equal(r->commit, ref + *n_committed, r->n_commit * sizeof(int32_t));
    assert_int_equal(r->n_logprobs, r->n_commit);
    assert_int_equal(r->n_top_ids, r->n_commit * TOP);
    assert_int_equal(r->n_top_logprobs, r->n_commit * TOP);
    for (size_t t = 0; t < r->n_commit; t++) {
        assert_true(r->logprobs[t] <= 0.0f);
        assert_true(r->top_logprobs[t * TOP] >= r->top_logprobs[t * TOP + 1]);
        if (greedy) {
            assert_int_equal(r->top_ids[t * TOP], r->commit[t]);
            assert_true(r->top_logprobs[t * TOP] == r->logprobs[t]);
        }
    }
    memcpy(committed + *n_committed, r->commit, r->n_commit * sizeof(int32_t));
    *n_committed += (int32_t)r->n_commit;
    *cached = r->cached_len;
}

/* Penalties and logprobs through the verifier: with prompt_len set, every
 * step commits what sd_spec_decoder commits alone with the same penalties
 * (greedy and seeded), also after the verifier lost a sequence (Release,
 * CACHE_MISS, the whole prefix resent: the token history is rebuilt); the
 * penalties change the output (a control); each commit token comes with
 * its logprob and 3 alternatives, under greedy the first of them. */
static void test_verify_penalties_logprobs(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    enum { STEPS = 8, PROMPT = 12, TOP = 3 };
    int32_t prompt[N_SEQS][PROMPT];
    int32_t ref[N_SEQS][MAX_CTX], ref_n[N_SEQS] = {0};
    bool penalties_matter = false;
    for (int i = 0; i < N_SEQS; i++) {
        make_prompt(prompt[i], PROMPT, 200u + (uint32_t)i);
        for (int pass = 0; pass < 2; pass++) {
            sd_drafter *d = open_draft(1);
            sd_spec_decoder *dec = NULL;
            assert_int_equal(sd_spec_decoder_create(env.target_model, d, MAX_CTX, &dec), SD_OK);
            sd_spec_decoder_set_prompt_len(dec, PROMPT);
            int32_t ctx[MAX_CTX];
            memcpy(ctx, prompt[i], sizeof prompt[i]);
            int32_t n_ctx = PROMPT;
            sd_sampling s = sampling_of(i);
            if (pass == 0) s.presence_penalty = 0.7f, s.frequency_penalty = 0.9f;
            for (int step = 0; step < STEPS; step++) {
                int32_t out[K + 1], n_out = 0;
                assert_int_equal(sd_spec_decoder_step(dec, ctx, n_ctx, K, &s, out, &n_out, NULL, NULL), SD_OK);
                memcpy(ctx + n_ctx, out, (size_t)n_out * sizeof *ctx);
                n_ctx += n_out;
            }
            if (pass == 0) {
                ref_n[i] = n_ctx;
                memcpy(ref[i], ctx, (size_t)n_ctx * sizeof *ctx);
            } else {
                int32_t n = n_ctx < ref_n[i] ? n_ctx : ref_n[i];
                penalties_matter |= memcmp(ctx, ref[i], (size_t)n * sizeof *ctx) != 0;
            }
            sd_spec_decoder_free(&dec);
            sd_drafter_free(&d);
        }
    }
    assert_true(penalties_matter);

    sd_verifier *v = new_verifier(8, 64);
    sd_drafter *d = open_draft(N_SEQS);
    int32_t committed[N_SEQS][MAX_CTX], n_committed[N_SEQS];
    uint32_t cached[N_SEQS] = {0};
    for (int i = 0; i < N_SEQS; i++) {
        memcpy(committed[i], prompt[i], sizeof prompt[i]);
        n_committed[i] = PROMPT;
    }
    for (int step = 0; step < STEPS; step++) {
        if (step == 4) {
            /* the verifier loses sequence 0: a miss, then the whole prefix */
            uint64_t id = 2000;
            sd_verifier_release(v, &id, 1);
        }
        vseq seqs[N_SEQS];
        for (int i = 0; i < N_SEQS; i++) {
            sd_sampling s = sampling_of(i);
            s.presence_penalty = 0.7f;
            s.frequency_penalty = 0.9f;
            vseq_init(&seqs[i], 2000u + (uint64_t)i, cached[i], committed[i] + cached[i],
                      (size_t)(n_committed[i] - (int32_t)cached[i]), &s);
            seqs[i].seq.prompt_len = PROMPT;
            seqs[i].seq.logprobs = true;
            seqs[i].seq.top_logprobs = TOP;
            int32_t tokens[K];
            sd_spec_q q[K];
            int32_t nd = 0;
            assert_int_equal(sd_drafter_propose(d, i, committed[i], n_committed[i], K, &s, tokens, q, &nd), SD_OK);
            vseq_drafts(&seqs[i], tokens, q, nd);
        }
        Specd__VerifyResponse resp;
        run_verify(v, seqs, N_SEQS, false, &resp);
        for (int i = 0; i < N_SEQS; i++) {
            if (step == 4 && i == 0) {
                assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_CACHE_MISS);
                continue;
            }
            check_penalized_step(resp.results[i], i == 0, ref[i], ref_n[i], committed[i], &n_committed[i], &cached[i]);
        }
        if (step == 4) {
            seqs[0].seq.keep_len = 0;
            seqs[0].seq.append = committed[0];
            seqs[0].seq.n_append = (size_t)n_committed[0];
            run_verify(v, seqs, 1, false, &resp);
            check_penalized_step(resp.results[0], true, ref[0], ref_n[0], committed[0], &n_committed[0], &cached[0]);
        }
    }
    sd_drafter_free(&d);
    sd_verifier_free(&v);
}

/* keep_len beyond the cache and unknown ids: CACHE_MISS; resending the prefix gives the same token. */
static void test_verify_cache_miss(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_verifier *v = new_verifier(4, 32);
    int32_t prompt[10];
    make_prompt(prompt, 10, 9);
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    vseq s[2];
    vseq_init(&s[0], 1, 0, prompt, 10, &greedy);
    Specd__VerifyResponse resp;
    const Specd__VerifyResult *r = run_verify(v, s, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->cached_len, 10);
    int32_t first = r->commit[0];

    /* The cache holds 10: keep_len 12 misses, and so does an unknown id with keep_len 3. */
    vseq_init(&s[0], 1, 12, &first, 1, &greedy);
    vseq_init(&s[1], 2, 3, prompt, 1, &greedy);
    run_verify(v, s, 2, false, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_CACHE_MISS);
    assert_int_equal(resp.results[0]->cached_len, 0);
    assert_int_equal(resp.results[0]->n_commit, 0);
    assert_int_equal(resp.results[1]->code, SPECD__CODE__CODE_CACHE_MISS);
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_verifier_stats(v, &st);
    assert_int_equal(st.n_sequences, 0); /* a miss frees the slot, an unknown id takes none */
    assert_int_equal(st.kv_blocks_free, 32);

    /* The coordinator resends the whole prefix: the same greedy token. */
    vseq_init(&s[0], 1, 0, prompt, 10, &greedy);
    r = run_verify(v, s, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->commit[0], first);
    /* Truncation: keep 6 of the 10 and append the rest again, the same token once more. */
    vseq_init(&s[0], 1, 6, prompt + 6, 4, &greedy);
    r = run_verify(v, s, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->commit[0], first);
    assert_int_equal(r->cached_len, 10);
    sd_verifier_free(&v);
}

/* No slot or no blocks: KV_FULL per sequence; Release returns the blocks. */
static void test_verify_kv_full_and_release(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_verifier *v = new_verifier(3, 4); /* 4 blocks of 16 tokens */
    int32_t a[20], b[20], c[5];
    make_prompt(a, 20, 1);
    make_prompt(b, 20, 2);
    make_prompt(c, 5, 3);
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    vseq s[4];
    vseq_init(&s[0], 11, 0, a, 20, &greedy);
    vseq_init(&s[1], 12, 0, b, 20, &greedy);
    vseq_init(&s[2], 13, 0, c, 5, &greedy);
    Specd__VerifyResponse resp;
    run_verify(v, s, 3, false, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[1]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[2]->code, SPECD__CODE__CODE_KV_FULL); /* 2 + 2 blocks taken */
    assert_int_equal(resp.results[2]->cached_len, 0);
    int32_t c_token_expected = -1;
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_verifier_stats(v, &st);
    assert_int_equal(st.kv_blocks_total, 4);
    assert_int_equal(st.kv_blocks_free, 0);
    assert_int_equal(st.n_sequences, 2);

    /* Slots: a verifier with one slot refuses a second id. */
    sd_verifier *v1 = new_verifier(1, 16);
    vseq_init(&s[0], 21, 0, c, 5, &greedy);
    vseq_init(&s[1], 22, 0, c, 5, &greedy);
    run_verify(v1, s, 2, false, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    c_token_expected = resp.results[0]->commit[0];
    assert_int_equal(resp.results[1]->code, SPECD__CODE__CODE_KV_FULL);
    sd_verifier_free(&v1);

    /* Release a: its two blocks come back and c fits. */
    uint64_t ids[2] = {11, 999};
    sd_verifier_release(v, ids, 2);
    sd_verifier_stats(v, &st);
    assert_int_equal(st.kv_blocks_free, 2);
    assert_int_equal(st.n_sequences, 1);
    vseq_init(&s[0], 13, 0, c, 5, &greedy);
    const Specd__VerifyResult *r = run_verify(v, s, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->commit[0], c_token_expected);
    sd_verifier_reset(v);
    sd_verifier_stats(v, &st);
    assert_int_equal(st.kv_blocks_free, 4);
    assert_int_equal(st.n_sequences, 0);
    sd_verifier_free(&v);
}

/* Warm-up: the sizes it runs, nothing left behind (slots, blocks, step
 * count, and the same commits as a verifier that never warmed up), an early
 * stop where the pool or the slots end, and a refusal once serving. */
static void test_verify_warmup(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_verifier *warm = new_verifier(4, 64), *cold = new_verifier(4, 64);
    sd_warmup_report rep;
    /* max_k 8: 9 tokens a sequence, so 32 tokens are 4 sequences */
    assert_int_equal(sd_verifier_warmup(warm, SD_WARMUP_FULL, 40, &rep), SD_OK);
    assert_int_equal(rep.n_sizes, 18); /* 1..16, 24, 32 */
    assert_int_equal(rep.n_steps, 16 * 3 + 2 * 2);
    assert_int_equal(rep.max_tokens, 32);
    assert_true(rep.first_max_at >= 1 && rep.first_max_at <= SD_WARMUP_EXACT_TOKENS);
    for (int32_t i = 0; i < rep.n_sizes; i++) {
        assert_int_equal(rep.tokens[i], i < 16 ? i + 1 : 24 + 8 * (i - 16));
        assert_true(rep.steady_s[i] > 0);
    }
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_verifier_stats(warm, &st);
    assert_int_equal(st.kv_blocks_free, 64);
    assert_int_equal(st.n_sequences, 0);
    assert_int_equal(st.steps, 0);

    int32_t a[12], b[7], da[K], db[K];
    make_prompt(a, 12, 41);
    make_prompt(b, 7, 42);
    make_prompt(da, K, 43);
    make_prompt(db, K, 44);
    static const float one = 1.0f;
    sd_spec_q qa[K], qb[K];
    for (int32_t i = 0; i < K; i++) qa[i] = (sd_spec_q){1, &da[i], &one}, qb[i] = (sd_spec_q){1, &db[i], &one};
    const sd_sampling greedy = sampling_of(0), sampled = sampling_of(2);
    int32_t commits[2][2][K + 1], n_commit[2][2];
    for (int w = 0; w < 2; w++) {
        vseq s[2];
        vseq_init(&s[0], 51, 0, a, 12, &greedy);
        vseq_drafts(&s[0], da, qa, K);
        vseq_init(&s[1], 52, 0, b, 7, &sampled);
        vseq_drafts(&s[1], db, qb, K);
        Specd__VerifyResponse resp;
        run_verify(w ? warm : cold, s, 2, false, &resp);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(resp.results[i]->code, SPECD__CODE__CODE_OK);
            n_commit[w][i] = (int32_t)resp.results[i]->n_commit;
            memcpy(commits[w][i], resp.results[i]->commit, resp.results[i]->n_commit * sizeof(int32_t));
        }
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(n_commit[0][i], n_commit[1][i]);
        assert_memory_equal(commits[0][i], commits[1][i], (size_t)n_commit[0][i] * sizeof(int32_t));
    }
    /* serving now: a second warm-up is refused */
    assert_int_equal(sd_verifier_warmup(warm, SD_WARMUP_FULL, 8, NULL), SD_ERR_INVALID_ARG);
    sd_verifier_free(&warm);
    sd_verifier_free(&cold);

    /* 2 blocks of 16 tokens hold two sequences: 16 tokens fit, 24 do not */
    sd_verifier *small = new_verifier(4, 2);
    assert_int_equal(sd_verifier_warmup(small, SD_WARMUP_FULL, 128, &rep), SD_OK);
    assert_int_equal(rep.max_tokens, 16);
    assert_int_equal(rep.n_sizes, 16);
    sd_verifier_stats(small, &st);
    assert_int_equal(st.kv_blocks_free, 2);
    sd_verifier_free(&small);
    /* two slots: the same stop */
    sd_verifier *few = new_verifier(2, 64);
    assert_int_equal(sd_verifier_warmup(few, SD_WARMUP_FULL, 128, &rep), SD_OK);
    assert_int_equal(rep.max_tokens, 16);
    sd_verifier_free(&few);
    /* the times only: two steps of 1, 2, 4, .. tokens */
    sd_verifier *times = new_verifier(4, 64);
    assert_int_equal(sd_verifier_warmup(times, SD_WARMUP_TIMES, 40, &rep), SD_OK);
    assert_int_equal(rep.n_sizes, 6); /* 1, 2, 4, 8, 16, 32 */
    assert_int_equal(rep.n_steps, 12);
    for (int32_t i = 0; i < rep.n_sizes; i++) assert_int_equal(rep.tokens[i], 1 << i);
    sd_verifier_stats(times, &st);
    assert_int_equal(st.kv_blocks_free, 64);
    sd_verifier_free(&times);
    /* 0 runs nothing */
    sd_verifier *none = new_verifier(2, 64);
    assert_int_equal(sd_verifier_warmup(none, SD_WARMUP_FULL, 0, &rep), SD_OK);
    assert_int_equal(rep.n_steps, 0);
    sd_verifier_free(&none);
}

/* A step that sleeps 30 ms the first time it sees a size and 2 ms after. */
static int32_t slow_first_seen[64];
static sd_status slow_first_step(void *user, int32_t n_tokens, const sd_sampling *sampling, const int32_t *toks,
                                 bool *fits) {
    (void)user, (void)sampling, (void)toks;
    *fits = true;
    const int32_t i = n_tokens < 64 ? n_tokens : 63;
    usleep(slow_first_seen[i]++ ? 2000 : 30000);
    return SD_OK;
}

/* SD_WARMUP_TIMES reports the faster of each size's two steps, not a
 * first sighting's (the verifier's very first step ran 1.3x its warm time
 * and seeded the coordinator's cost model with it). */
static void test_warmup_times_keeps_faster(void **state) {
    (void)state;
    memset(slow_first_seen, 0, sizeof slow_first_seen);
    sd_warmup_report rep;
    assert_int_equal(sd_warmup_run("test", SD_WARMUP_TIMES, 8, 100, slow_first_step, NULL, &rep), SD_OK);
    assert_int_equal(rep.n_sizes, 4); /* 1, 2, 4, 8 */
    assert_int_equal(rep.n_steps, 8);
    for (int32_t i = 0; i < rep.n_sizes; i++) {
        assert_int_equal(slow_first_seen[rep.tokens[i]], 2);
        assert_true(rep.steady_s[i] >= 0.0019);
        assert_true(rep.steady_s[i] < 0.020);
    }
}

/* prefill_only chunks append without sampling; the next step equals a whole-prompt step. */
static void test_verify_prefill_only(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_verifier *v = new_verifier(4, 32);
    int32_t prompt[40];
    make_prompt(prompt, 40, 44);
    sd_sampling s = sd_sampling_default();
    s.temperature = 0.9f;
    s.seed = 3;
    vseq q[2];
    Specd__VerifyResponse resp;
    vseq_init(&q[0], 5, 0, prompt, 40, &s);
    const Specd__VerifyResult *r = run_verify(v, q, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    int32_t whole = r->commit[0];

    vseq_init(&q[0], 6, 0, prompt, 16, &s);
    vseq_init(&q[1], 7, 0, prompt, 20, &s);
    run_verify(v, q, 2, true, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[0]->n_commit, 0);
    assert_int_equal(resp.results[0]->cached_len, 16);
    assert_int_equal(resp.results[1]->cached_len, 20);
    vseq_init(&q[0], 6, 16, prompt + 16, 16, &s);
    run_verify(v, q, 1, true, &resp);
    assert_int_equal(resp.results[0]->cached_len, 32);
    vseq_init(&q[0], 6, 32, prompt + 32, 8, &s);
    vseq_init(&q[1], 7, 20, prompt + 20, 20, &s);
    run_verify(v, q, 2, false, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[0]->commit[0], whole);
    assert_int_equal(resp.results[1]->commit[0], whole);
    assert_int_equal(resp.results[0]->cached_len, 40);
    sd_verifier_free(&v);
}

/* The prefix cache: a prompt sharing 33 tokens with an earlier, released
 * one adopts its first two blocks (of 16) in a prefill chunk, then the
 * 33rd token's row copied from the earlier prompt's third block in a
 * normal step with drafts; the same prompt again adopts in a normal step;
 * every answer (commits, acceptance, cached_len) equals a verifier without
 * the cache: sampled without drafts, greedy with drafts. */
static void test_verify_prefix_cache(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_verifier *v[2] = {new_verifier_cache(4, 32, 50), new_verifier_cache(4, 32, 0)};
    int32_t a[50], b[48];
    make_prompt(a, 50, 91);
    memcpy(b, a, 33 * sizeof *b);
    make_prompt(b + 33, 15, 92);
    sd_sampling sampled = sd_sampling_default(), greedy = sd_sampling_default();
    sampled.temperature = 0.9f;
    sampled.seed = 3;
    int32_t drafts[4] = {b[44], b[45], b[46], b[47]};
    sd_spec_q q[4] = {{0, NULL, NULL}};
    vseq s;
    Specd__VerifyResponse resp;
    uint32_t answers[2][6];
    for (int w = 0; w < 2; w++) {
        vseq_init(&s, 1, 0, a, 50, &sampled); /* a, then released: its 3 full blocks stay cached */
        assert_int_equal(run_verify(v[w], &s, 1, false, &resp)->code, SPECD__CODE__CODE_OK);
        uint64_t id = 1;
        sd_verifier_release(v[w], &id, 1);
        vseq_init(&s, 2, 0, b, 32, &sampled); /* b: a prefill chunk of two whole cached blocks */
        const Specd__VerifyResult *r = run_verify(v[w], &s, 1, true, &resp);
        assert_int_equal(r->code, SPECD__CODE__CODE_OK);
        assert_int_equal(r->cached_len, 32);
        vseq_init(&s, 2, 32, b + 32, 12, &greedy); /* then a step with drafts */
        vseq_drafts(&s, drafts, q, 4);
        r = run_verify(v[w], &s, 1, false, &resp);
        assert_int_equal(r->code, SPECD__CODE__CODE_OK);
        answers[w][0] = r->commit[0];
        answers[w][1] = r->n_accepted;
        answers[w][2] = r->cached_len;
        vseq_init(&s, 3, 0, b, 40, &sampled); /* b again, new id, one normal step */
        r = run_verify(v[w], &s, 1, false, &resp);
        assert_int_equal(r->code, SPECD__CODE__CODE_OK);
        answers[w][3] = r->commit[0];
        answers[w][4] = r->cached_len;
        Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
        sd_verifier_stats(v[w], &st);
        answers[w][5] = (uint32_t)st.prefix_hit_tokens;
    }
    assert_memory_equal(answers[0], answers[1], 5 * sizeof answers[0][0]);
    /* b's chunk: a's 2 blocks; its step: 1 row of a's third; b again: 2 blocks at least */
    assert_true(answers[0][5] >= 32 + 1 + 32);
    assert_int_equal(answers[1][5], 0);
    sd_verifier_free(&v[0]);
    sd_verifier_free(&v[1]);
}

/* Prompt logprobs (echo): prefill chunks with prompt_logprobs score every
 * appended token's successor (the last against prompt_next) exactly as the
 * log-softmax of the target's logits over the whole prompt in one forward
 * (a separate cache) does, next to a plain prefill sequence in the same
 * step; the cache they leave gives the whole-prompt step's next token; a
 * normal step or a chunk over SD_MAX_PROMPT_LP_ROWS asking for them is
 * refused. */
static void test_verify_prompt_logprobs(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    enum { N = 40, SPLIT = 16, TOP = 3 };
    int32_t prompt[N];
    make_prompt(prompt, N, 91);
    /* reference: one forward over the whole prompt, logits at every row */
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.target_model, 1, 8, 16, &kv), SD_OK);
    int32_t pos[N], seq[N];
    bool wanted[N];
    for (int32_t j = 0; j < N; j++) pos[j] = j, seq[j] = 0, wanted[j] = true;
    float *logits = malloc((size_t)N * (size_t)env.n_vocab * sizeof *logits);
    assert_non_null(logits);
    sd_batch b = {N, prompt, pos, seq, wanted};
    assert_int_equal(sd_model_forward(env.target_model, kv, &b, logits), SD_OK);
    sd_kv_free(&kv);
    sd_token_logprob ref[N];
    for (int32_t j = 0; j + 1 < N; j++)
        assert_int_equal(
            sd_sample_logprobs(logits + (size_t)j * (size_t)env.n_vocab, env.n_vocab, prompt[j + 1], TOP, &ref[j]),
            SD_OK);
    free(logits);

    sd_verifier *v = new_verifier(4, 32);
    sd_sampling s = sd_sampling_default();
    vseq q[2];
    Specd__VerifyResponse resp;
    vseq_init(&q[0], 5, 0, prompt, N, &s);
    const Specd__VerifyResult *r = run_verify(v, q, 1, false, &resp);
    int32_t whole = r->commit[0];

    /* chunk 1 [0, 16) with prompt logprobs, beside a plain prefill */
    vseq_init(&q[0], 8, 0, prompt, SPLIT, &s);
    q[0].seq.prompt_logprobs = true, q[0].seq.prompt_next = prompt[SPLIT], q[0].seq.top_logprobs = TOP;
    vseq_init(&q[1], 9, 0, prompt, 20, &s);
    run_verify(v, q, 2, true, &resp);
    const Specd__VerifyResult *r0 = resp.results[0], *r1 = resp.results[1];
    assert_int_equal(r0->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r0->n_commit, 0);
    assert_int_equal(r0->cached_len, SPLIT);
    assert_int_equal(r1->cached_len, 20);
    assert_int_equal(r1->n_logprobs, 0);
    int32_t checked = 0;
    for (int chunk = 0; chunk < 2; chunk++) {
        int32_t from = chunk ? SPLIT : 0, n = chunk ? N - 1 - SPLIT : SPLIT;
        if (chunk) {
            vseq_init(&q[0], 8, SPLIT, prompt + SPLIT, (size_t)n, &s);
            q[0].seq.prompt_logprobs = true, q[0].seq.prompt_next = prompt[N - 1], q[0].seq.top_logprobs = TOP;
            run_verify(v, q, 1, true, &resp);
            r0 = resp.results[0];
            assert_int_equal(r0->code, SPECD__CODE__CODE_OK);
            assert_int_equal(r0->cached_len, N - 1);
        }
        assert_int_equal(r0->n_logprobs, n);
        assert_int_equal(r0->n_top_ids, (size_t)n * TOP);
        assert_int_equal(r0->n_top_logprobs, (size_t)n * TOP);
        for (int32_t j = 0; j < n; j++, checked++) {
            const sd_token_logprob *e = &ref[from + j];
            if (fabsf(r0->logprobs[j] - e->logprob) > 1e-5f)
                fail_msg("position %d: logprob %.7f, the whole prompt's %.7f", (int)(from + j + 1),
                         (double)r0->logprobs[j], (double)e->logprob);
            for (int t = 0; t < TOP; t++) {
                assert_int_equal(r0->top_ids[j * TOP + t], e->top_ids[t]);
                assert_true(fabsf(r0->top_logprobs[j * TOP + t] - e->top_logprobs[t]) <= 1e-5f);
            }
        }
    }
    assert_int_equal(checked, N - 1);
    /* the last prompt token in a normal step: the whole prompt's next token */
    vseq_init(&q[0], 8, N - 1, prompt + N - 1, 1, &s);
    r = run_verify(v, q, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->commit[0], whole);
    assert_int_equal(r->n_logprobs, 0);

    /* refused: in a normal step, and over SD_MAX_PROMPT_LP_ROWS tokens */
    vseq_init(&q[0], 10, 0, prompt, 4, &s);
    q[0].seq.prompt_logprobs = true, q[0].seq.prompt_next = prompt[4];
    r = run_verify(v, q, 1, false, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_BAD_REQUEST);
    int32_t longer[SD_MAX_PROMPT_LP_ROWS + 1];
    make_prompt(longer, SD_MAX_PROMPT_LP_ROWS + 1, 5);
    vseq_init(&q[0], 11, 0, longer, SD_MAX_PROMPT_LP_ROWS + 1, &s);
    q[0].seq.prompt_logprobs = true, q[0].seq.prompt_next = prompt[0];
    r = run_verify(v, q, 1, true, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_BAD_REQUEST);
    vseq_init(&q[0], 11, 0, longer, SD_MAX_PROMPT_LP_ROWS, &s);
    q[0].seq.prompt_logprobs = true, q[0].seq.prompt_next = longer[SD_MAX_PROMPT_LP_ROWS];
    r = run_verify(v, q, 1, true, &resp);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->n_logprobs, SD_MAX_PROMPT_LP_ROWS);
    sd_verifier_free(&v);
}

/* ---- drafter ---- */

typedef struct dseq {
    Specd__DraftSeq seq;
    Specd__Sampling sampling;
} dseq;

static void dseq_init(dseq *s, uint64_t id, uint32_t keep_len, int32_t *append, size_t n_append, uint32_t k,
                      const sd_sampling *smp) {
    specd__draft_seq__init(&s->seq);
    specd__sampling__init(&s->sampling);
    sd_net_sampling_to_pb(smp, &s->sampling);
    s->seq.request_id = id;
    s->seq.keep_len = keep_len;
    s->seq.append = append;
    s->seq.n_append = n_append;
    s->seq.k = k;
    s->seq.sampling = &s->sampling;
}

static void run_draft(sd_draft_server *srv, dseq *seqs, size_t n, Specd__DraftResponse *resp) {
    Specd__DraftSeq *ptrs[8];
    for (size_t i = 0; i < n; i++) ptrs[i] = &seqs[i].seq;
    Specd__DraftRequest req = SPECD__DRAFT_REQUEST__INIT;
    req.step_id = 5;
    req.seqs = ptrs;
    req.n_seqs = n;
    static sd_net_draft_step step;
    sd_net_draft_step_of(&req, &step);
    assert_int_equal(sd_draft_server_handle(srv, &step, resp), SD_OK);
    assert_int_equal(resp->n_results, n);
}

static void assert_same_proposal(const Specd__DraftResult *r, sd_drafter *ref, const int32_t *ctx, int32_t n_ctx,
                                 const sd_sampling *s) {
    int32_t tokens[K];
    sd_spec_q q[K];
    int32_t nd = 0;
    assert_int_equal(sd_drafter_propose(ref, 0, ctx, n_ctx, K, s, tokens, q, &nd), SD_OK);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal((int)r->n_tokens, nd);
    assert_int_equal((int)r->n_q, nd);
    assert_memory_equal(r->tokens, tokens, (size_t)nd * sizeof *tokens);
    for (int32_t i = 0; i < nd; i++) {
        assert_int_equal((int)r->q[i]->n_ids, q[i].n);
        assert_memory_equal(r->q[i]->ids, q[i].ids, (size_t)q[i].n * sizeof(int32_t));
        for (int32_t j = 0; j < q[i].n; j++) assert_true(fabsf(r->q[i]->probs[j] - q[i].probs[j]) < 1e-6f);
    }
}

/* A draft server over d: slots of max_ctx tokens, batches of 8, K drafts. */
static sd_draft_server *new_draft_server(sd_drafter *d, int32_t max_seqs, int32_t max_ctx) {
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = max_seqs;
    sp.max_ctx = max_ctx;
    sp.max_batch = 8;
    sp.max_k = K;
    sp.n_vocab = VOCAB;
    sd_draft_server *srv = NULL;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_OK);
    return srv;
}

static void test_draft_batch(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_drafter *d = open_draft(4);
    sd_draft_server *srv = new_draft_server(d, 4, MAX_CTX);
    int32_t a[24], b[30];
    make_prompt(a, 24, 71);
    make_prompt(b, 30, 72);
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    sd_sampling hot = sd_sampling_default();
    hot.temperature = 0.8f;
    hot.seed = 11;
    dseq s[3];
    Specd__DraftResponse resp;
    dseq_init(&s[0], 1, 0, a, 20, K, &greedy);
    dseq_init(&s[1], 2, 0, b, 30, K, &hot);
    run_draft(srv, s, 2, &resp);
    assert_int_equal(resp.results[0]->cached_len, 20);
    assert_int_equal(resp.results[1]->cached_len, 30);
    sd_drafter *ref = open_draft(1);
    assert_same_proposal(resp.results[0], ref, a, 20, &greedy);
    sd_drafter_release(ref, 0);
    assert_same_proposal(resp.results[1], ref, b, 30, &hot);
    sd_drafter_release(ref, 0);

    /* keep_len truncation: a keeps 17 of its 20 and appends a[17..24) (7 tokens); b misses; c unknown misses. */
    dseq_init(&s[0], 1, 17, a + 17, 7, K, &greedy);
    dseq_init(&s[1], 2, 31, b, 1, K, &hot);
    dseq_init(&s[2], 3, 2, a, 1, K, &greedy);
    run_draft(srv, s, 3, &resp);
    assert_int_equal(resp.results[0]->cached_len, 24);
    assert_same_proposal(resp.results[0], ref, a, 24, &greedy);
    assert_int_equal(resp.results[1]->code, SPECD__CODE__CODE_CACHE_MISS);
    assert_int_equal(resp.results[1]->n_tokens, 0);
    assert_int_equal(resp.results[2]->code, SPECD__CODE__CODE_CACHE_MISS);

    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_draft_server_stats(srv, &st);
    assert_int_equal(st.n_sequences, 1);
    uint32_t free_before = st.kv_blocks_free;
    assert_int_equal(st.kv_blocks_total - free_before, 2); /* 24 tokens = 2 blocks of 16 */
    uint64_t id = 1;
    sd_draft_server_release(srv, &id, 1);
    sd_draft_server_stats(srv, &st);
    assert_int_equal(st.n_sequences, 0);
    assert_int_equal(st.kv_blocks_free, st.kv_blocks_total);
    /* After release the id is unknown. */
    dseq_init(&s[0], 1, 24, a, 1, K, &greedy);
    run_draft(srv, s, 1, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_CACHE_MISS);
    sd_drafter_free(&ref);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d);
}

/* Paired with a target padded to 40 more rows (the Welcome's size): a
 * sequence whose context holds an id past the draft's rows gets OK with no
 * drafts, step after step (no CACHE_MISS), while another drafts as usual. */
static void test_draft_server_padded_target(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_drafter *d = open_draft(4), *ref = open_draft(1);
    sd_draft_server *srv = new_draft_server(d, 4, MAX_CTX);
    sd_draft_server_pair_vocab(srv, VOCAB + 40);
    int32_t a[24], b[30];
    make_prompt(a, 24, 81);
    make_prompt(b, 30, 82);
    a[10] = VOCAB + 5; /* the target's padding id */
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    dseq s[2];
    Specd__DraftResponse resp;
    dseq_init(&s[0], 1, 0, a, 20, K, &greedy);
    dseq_init(&s[1], 2, 0, b, 30, K, &greedy);
    run_draft(srv, s, 2, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[0]->n_tokens, 0);
    assert_int_equal(resp.results[0]->cached_len, 20);
    assert_same_proposal(resp.results[1], ref, b, 30, &greedy);
    assert_true(resp.results[1]->n_tokens > 0);
    dseq_init(&s[0], 1, 20, a + 20, 4, K, &greedy);
    run_draft(srv, s, 1, &resp);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[0]->n_tokens, 0);
    assert_int_equal(resp.results[0]->cached_len, 24);
    sd_drafter_free(&ref);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d);
}

/* A drafter's warm-up: the sizes it runs, the same proposals afterwards as
 * a drafter that never warmed up, an early stop where the slots end, and a
 * refusal once serving. */
static void test_draft_warmup(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_drafter *d = open_draft(4), *ref = open_draft(1);
    sd_draft_server *srv = new_draft_server(d, 4, MAX_CTX);
    sd_warmup_report rep;
    assert_int_equal(sd_draft_server_warmup(srv, 40, &rep), SD_OK);
    assert_int_equal(rep.n_sizes, 18); /* 1..16, 24, 32 */
    assert_int_equal(rep.n_steps, 16 * 3 + 2 * 2);
    assert_int_equal(rep.max_tokens, 32);
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    sd_draft_server_stats(srv, &st);
    assert_int_equal(st.n_sequences, 0);
    assert_int_equal(st.steps, 0);
    int32_t a[20];
    make_prompt(a, 20, 81);
    const sd_sampling greedy = sampling_of(0), hot = sampling_of(1);
    dseq s[2];
    dseq_init(&s[0], 1, 0, a, 20, K, &greedy);
    dseq_init(&s[1], 2, 0, a, 13, K, &hot);
    Specd__DraftResponse resp;
    run_draft(srv, s, 2, &resp);
    assert_same_proposal(resp.results[0], ref, a, 20, &greedy);
    sd_drafter_release(ref, 0);
    assert_same_proposal(resp.results[1], ref, a, 13, &hot);
    assert_int_equal(sd_draft_server_warmup(srv, 8, NULL), SD_ERR_INVALID_ARG);
    sd_draft_server_free(&srv);

    /* slots of 8 tokens, two slots: 12 tokens are 6 a slot (+2 drafts), 16 do not fit */
    sd_drafter *d2 = open_draft(2);
    srv = new_draft_server(d2, 2, 8);
    assert_int_equal(sd_draft_server_warmup(srv, 128, &rep), SD_OK);
    assert_int_equal(rep.max_tokens, 12);
    assert_int_equal(sd_draft_server_warmup(srv, 0, &rep), SD_OK);
    assert_int_equal(rep.n_steps, 0);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d2);
    sd_drafter_free(&ref);
    sd_drafter_free(&d);
}

/* A server that would keep fewer q entries than the drafter makes is
 * refused: a drafted token could fall outside the q it sends (found by
 * fuzz_worker with a mismatched harness). The n-gram drafter's q is one-hot,
 * so top_n 1 is enough there. */
static void test_draft_server_keeps_whole_q(void **state) {
    (void)state;
    SKIP_WITHOUT_MODELS();
    sd_drafter *d = open_draft(2); /* top_n SD_SPEC_DEFAULT_TOP_N */
    assert_int_equal(sd_drafter_max_q(d), SD_SPEC_DEFAULT_TOP_N);
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = 2;
    sp.max_ctx = MAX_CTX;
    sp.n_vocab = VOCAB;
    sp.top_n = SD_SPEC_DEFAULT_TOP_N - 1;
    sd_draft_server *srv = NULL;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_ERR_INVALID_ARG);
    assert_null(srv);
    sp.top_n = SD_SPEC_DEFAULT_TOP_N;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_OK);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d);
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = 2;
    assert_int_equal(sd_drafter_ngram_create(&dp, &d), SD_OK);
    assert_int_equal(sd_drafter_max_q(d), 1);
    sp.top_n = 1;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_OK);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d);
}

static void test_draft_ngram(void **state) {
    (void)state;
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = 2;
    dp.max_ctx = 64;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_ngram_create(&dp, &d), SD_OK);
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = 2;
    sp.max_ctx = 64;
    sp.max_batch = 4;
    sp.max_k = 3;
    sp.n_vocab = 50;
    sp.top_n = 1;
    sd_draft_server *srv = NULL;
    assert_int_equal(sd_draft_server_create(d, &sp, &srv), SD_OK);
    int32_t ctx[] = {1, 2, 3, 4, 5, 9, 1, 2};
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    dseq s[3];
    Specd__DraftResponse resp;
    dseq_init(&s[0], 40, 0, ctx, 8, 8, &greedy); /* k 8 is capped at max_k 3 */
    dseq_init(&s[1], 41, 0, ctx, 3, 2, &greedy);
    dseq_init(&s[2], 42, 0, ctx, 3, 2, &greedy); /* no third slot */
    run_draft(srv, s, 3, &resp);
    const Specd__DraftResult *r = resp.results[0];
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[0], 3);
    assert_int_equal(r->tokens[1], 4);
    assert_int_equal(r->tokens[2], 5);
    assert_int_equal(r->q[1]->n_ids, 1);
    assert_int_equal(r->q[1]->ids[0], 4);
    assert_true(r->q[1]->probs[0] == 1.0f);
    assert_int_equal(resp.results[1]->n_tokens, 0); /* 1 2 3: nothing repeats */
    assert_int_equal(resp.results[1]->cached_len, 3);
    assert_int_equal(resp.results[2]->code, SPECD__CODE__CODE_KV_FULL);
    /* Truncate 41 to 2 tokens and append 9 1 2 ... no repeat of "2" before: 1 2 9 1 2 -> after "1 2": 9 1 2. */
    int32_t tail[] = {9, 1, 2};
    dseq_init(&s[0], 41, 2, tail, 3, 3, &greedy);
    run_draft(srv, s, 1, &resp);
    r = resp.results[0];
    assert_int_equal(r->cached_len, 5);
    assert_int_equal(r->n_tokens, 3);
    assert_int_equal(r->tokens[0], 9);
    sd_draft_server_free(&srv);
    sd_drafter_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_batch_matches_spec_decode),
        cmocka_unit_test(test_verify_cache_miss),
        cmocka_unit_test(test_verify_penalties_logprobs),
        cmocka_unit_test(test_verify_kv_full_and_release),
        cmocka_unit_test(test_verify_prefill_only),
        cmocka_unit_test(test_verify_prefix_cache),
        cmocka_unit_test(test_verify_prompt_logprobs),
        cmocka_unit_test(test_verify_warmup),
        cmocka_unit_test(test_warmup_times_keeps_faster),
        cmocka_unit_test(test_draft_server_keeps_whole_q),
        cmocka_unit_test(test_draft_batch),
        cmocka_unit_test(test_draft_server_padded_target),
        cmocka_unit_test(test_draft_warmup),
        cmocka_unit_test(test_draft_ngram),
    };
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
