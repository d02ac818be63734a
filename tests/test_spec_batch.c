/* test_spec_batch.c — the batched speculative step (spec_batch.h) on small
 * random models written by specd-mkmodel at test start.
 *
 * "Seeded sampling gives the same output alone and batched": six sequences,
 * each with its own prompt, seed, sampling (greedy, T = 1, T = 0.7 with
 * top-p 0.9) and K (0..8), are generated alone (sd_spec_decoder: drafts
 * through sd_drafter_propose, one sequence per target forward) and then all
 * together by a coordinator-like loop over sd_draft_batch and
 * sd_spec_verify_batch: sequences arrive at different steps, sit in
 * scattered KV slots, finish at different steps, and the loop resends only
 * what each cache lacks (keep_len + append). The tokens must be identical,
 * for the n-gram drafter, a separate draft model (the target quantized to
 * Q4_0) and the self-draft (a view of the target's first layer). Greedy
 * sequences must also equal a plain one-token-per-forward loop.
 *
 * sd_draft_batch must give the same tokens and q as sd_drafter_propose on
 * each sequence alone. Per-sequence errors (cache miss, bad slot, duplicate
 * slot, bad id, K over the limit, missing q, no KV room) are answered per
 * sequence while the valid sequence of the same batch gets exactly its
 * stand-alone result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/drafter.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/spec_batch.h"
#include "specd/spec_decode.h"

#define VOCAB     300
#define MAX_CTX   96
#define N_SEQS    6
#define N_NEW     14
#define MAX_SLOTS 8

static struct {
    char dir[64], target[128], draft_q4[128];
    bool ok;
    sd_model *target_model;
} env;

static int setup_models(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-batch-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.target, sizeof env.target, "%s/target.gguf", env.dir);
    snprintf(env.draft_q4, sizeof env.draft_q4, "%s/draft_q4.gguf", env.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers 3 --vocab %d --seed 31 >/dev/null 2>&1 && "
             "'%s' -o '%s' --layers 3 --vocab %d --seed 31 --dtype q4_0 >/dev/null 2>&1",
             SPECD_MKMODEL, env.target, VOCAB, SPECD_MKMODEL, env.draft_q4, VOCAB);
    env.ok = system(cmd) == 0;
    if (!env.ok) return 0;
    sd_gguf *g = NULL;
    char err[128];
    if (sd_gguf_open(env.target, &g, err, sizeof err) != SD_OK) return -1;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_status st = sd_model_load(g, &mp, &env.target_model);
    sd_gguf_close(&g);
    return st == SD_OK ? 0 : -1;
}

static int teardown_models(void **state) {
    (void)state;
    sd_model_free(&env.target_model);
    unlink(env.target);
    unlink(env.draft_q4);
    rmdir(env.dir);
    return 0;
}

static void skip_without_models(void) {
    if (!env.ok) {
        print_message("specd-mkmodel could not write the test models: skipped\n");
        skip();
    }
}

typedef enum { DRAFT_NGRAM, DRAFT_MODEL, DRAFT_SELF } draft_kind;

static sd_drafter *make_drafter(draft_kind kind, int32_t max_seqs) {
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = max_seqs;
    dp.max_ctx = MAX_CTX;
    dp.n_threads = 1;
    dp.top_n = 8;
    sd_drafter *d = NULL;
    if (kind == DRAFT_NGRAM) {
        dp.ngram_min = 1;
        assert_int_equal(sd_drafter_ngram_create(&dp, &d), SD_OK);
    } else if (kind == DRAFT_SELF) {
        assert_int_equal(sd_drafter_self_view(env.target_model, 1, &dp, &d), SD_OK);
    } else {
        sd_gguf *g = NULL;
        char err[128];
        assert_int_equal(sd_gguf_open(env.target, &g, err, sizeof err), SD_OK);
        sd_tok *tok = NULL;
        assert_int_equal(sd_tok_from_gguf(g, &tok), SD_OK);
        assert_int_equal(sd_drafter_model_open(env.draft_q4, sd_tok_vocab_hash(tok), sd_tok_n_vocab(tok), &dp, &d),
                         SD_OK);
        sd_tok_free(&tok);
        sd_gguf_close(&g);
    }
    return d;
}

typedef struct seq_spec {
    int32_t prompt[24], n_prompt;
    int32_t k;
    sd_sampling s;
    int32_t arrive; /* step of the batched loop at which it joins */
    int32_t slot;
} seq_spec;

static void make_seqs(seq_spec *ss) {
    const int32_t ks[N_SEQS] = {4, 1, 8, 0, 3, 6};
    for (int32_t i = 0; i < N_SEQS; i++) {
        seq_spec *q = &ss[i];
        q->n_prompt = 5 + (i * 7) % 13;
        for (int32_t j = 0; j < q->n_prompt; j++) q->prompt[j] = (int32_t)((i * 97 + j * 31 + (j % 4) * 11) % VOCAB);
        if (q->n_prompt >= 8) memcpy(q->prompt + q->n_prompt - 4, q->prompt + 1, 4 * sizeof(int32_t));
        q->k = ks[i];
        q->s = sd_sampling_default();
        q->s.temperature = 1.0f; /* sampled (the default is greedy) */
        q->s.seed = 1000 + (uint64_t)i * 17;
        if (i % 3 == 0) q->s.temperature = 0.0f;
        if (i % 3 == 2) {
            q->s.temperature = 0.7f;
            q->s.top_p = 0.9f;
        }
        q->arrive = (i * 2) % 5;
        q->slot = (i * 5 + 2) % MAX_SLOTS;
    }
}

/* Plain decoding, one forward per token. */
static void plain_generate(const seq_spec *q, int32_t *out) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.target_model, 1, MAX_CTX / 16 + 2, 16, &kv), SD_OK);
    float logits[VOCAB];
    int32_t pos[MAX_CTX], seq[MAX_CTX] = {0};
    bool want[MAX_CTX] = {false};
    for (int32_t i = 0; i < q->n_prompt; i++) pos[i] = i;
    want[q->n_prompt - 1] = true;
    sd_batch b = {q->n_prompt, q->prompt, pos, seq, want};
    assert_int_equal(sd_model_forward(env.target_model, kv, &b, logits), SD_OK);
    for (int32_t i = 0; i < N_NEW; i++) {
        int32_t p = q->n_prompt + i;
        assert_int_equal(sd_sample_token(logits, VOCAB, &q->s, (uint64_t)p, &out[i]), SD_OK);
        if (i + 1 == N_NEW) break;
        bool one = true;
        sd_batch step = {1, &out[i], &p, seq, &one};
        assert_int_equal(sd_model_forward(env.target_model, kv, &step, logits), SD_OK);
    }
    sd_kv_free(&kv);
}

/* One sequence alone through sd_spec_decoder (its own drafter, slot 0). */
static void alone_generate(draft_kind kind, const seq_spec *q, int32_t *out) {
    sd_drafter *d = make_drafter(kind, 1);
    sd_spec_decoder *dec = NULL;
    assert_int_equal(sd_spec_decoder_create(env.target_model, d, MAX_CTX, &dec), SD_OK);
    int32_t ctx[MAX_CTX + SD_MAX_K + 1];
    memcpy(ctx, q->prompt, (size_t)q->n_prompt * sizeof *ctx);
    int32_t n = q->n_prompt;
    while (n < q->n_prompt + N_NEW) {
        int32_t step[SD_MAX_K + 1], n_step;
        assert_int_equal(sd_spec_decoder_step(dec, ctx, n, q->k, &q->s, step, &n_step, NULL, NULL), SD_OK);
        memcpy(ctx + n, step, (size_t)n_step * sizeof *step);
        n += n_step;
    }
    memcpy(out, ctx + q->n_prompt, N_NEW * sizeof *out);
    sd_spec_decoder_free(&dec);
    sd_drafter_free(&d);
}

/* Coordinator-side state of one sequence in the batched loop. */
typedef struct seq_run {
    int32_t ctx[MAX_CTX + SD_MAX_K + 1], n;
    int32_t target_len;  /* tokens the verifier's cache holds (its last cache_len) */
    int32_t drafter_len; /* tokens the drafter is known to hold */
    bool active, done;
} seq_run;

static void batched_generate(draft_kind kind, const seq_spec *ss, int32_t out[N_SEQS][N_NEW], int64_t *accepted) {
    sd_drafter *d = make_drafter(kind, MAX_SLOTS);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.target_model, MAX_SLOTS, MAX_SLOTS * (MAX_CTX / 16 + 2), 16, &kv), SD_OK);
    sd_spec_scratch *scratch = NULL;
    assert_int_equal(sd_spec_scratch_create(&scratch), SD_OK);
    seq_run *runs = calloc(N_SEQS, sizeof *runs);
    assert_non_null(runs);
    *accepted = 0;
    int32_t n_done = 0;
    for (int32_t step = 0; n_done < N_SEQS; step++) {
        assert_true(step < 200);
        sd_draft_seq dseq[N_SEQS];
        sd_draft_result *dres = calloc(N_SEQS, sizeof *dres);
        sd_verify_seq vseq[N_SEQS];
        sd_verify_result *vres = calloc(N_SEQS, sizeof *vres);
        assert_non_null(dres);
        assert_non_null(vres);
        int32_t idx[N_SEQS], m = 0;
        /* Later arrivals first, so batch order differs from sequence order. */
        for (int32_t i = N_SEQS - 1; i >= 0; i--) {
            seq_run *r = &runs[i];
            if (!r->active && !r->done && ss[i].arrive <= step) {
                memcpy(r->ctx, ss[i].prompt, (size_t)ss[i].n_prompt * sizeof(int32_t));
                r->n = ss[i].n_prompt;
                r->active = true;
            }
            if (!r->active) continue;
            int32_t k = ss[i].k; /* as alone: the sequence may overshoot N_NEW, only the first N_NEW count */
            dseq[m] = (sd_draft_seq){
                ss[i].slot, r->drafter_len, r->n - r->drafter_len, r->ctx + r->drafter_len, k, ss[i].s, NULL};
            idx[m++] = i;
        }
        assert_int_equal(sd_draft_batch(d, m, dseq, dres), SD_OK);
        for (int32_t j = 0; j < m; j++) {
            int32_t i = idx[j];
            seq_run *r = &runs[i];
            assert_int_equal(dres[j].outcome, SD_SEQ_OK);
            vseq[j] = (sd_verify_seq){.slot = ss[i].slot,
                                      .keep_len = r->target_len,
                                      .n_append = r->n - r->target_len,
                                      .append = r->ctx + r->target_len,
                                      .k = dres[j].n_drafted,
                                      .draft = dres[j].tokens,
                                      .q = dres[j].q,
                                      .sampling = ss[i].s};
        }
        assert_int_equal(sd_spec_verify_batch(env.target_model, kv, m, vseq, vres, scratch), SD_OK);
        for (int32_t j = 0; j < m; j++) {
            int32_t i = idx[j];
            seq_run *r = &runs[i];
            assert_int_equal(vres[j].outcome, SD_SEQ_OK);
            assert_int_equal(vres[j].n_ctx, r->n);
            assert_int_equal(vres[j].n_tokens, vres[j].n_accepted + 1);
            *accepted += vres[j].n_accepted;
            /* What the drafter holds that is still committed: the n-gram drafter
             * keeps the context only; a model drafter also fed its drafts but
             * the last. */
            int32_t nd = dres[j].n_drafted, acc = vres[j].n_accepted;
            int32_t fed = kind == DRAFT_NGRAM ? 0 : (acc < nd - 1 ? acc : (nd > 0 ? nd - 1 : 0));
            r->drafter_len = r->n + fed;
            r->target_len = vres[j].cache_len;
            memcpy(r->ctx + r->n, vres[j].tokens, (size_t)vres[j].n_tokens * sizeof(int32_t));
            r->n += vres[j].n_tokens;
            if (r->n >= ss[i].n_prompt + N_NEW) {
                memcpy(out[i], r->ctx + ss[i].n_prompt, N_NEW * sizeof(int32_t));
                r->active = false;
                r->done = true;
                n_done++;
                sd_drafter_release(d, ss[i].slot);
                sd_kv_release(kv, ss[i].slot);
            }
        }
        free(dres);
        free(vres);
    }
    free(runs);
    sd_spec_scratch_free(&scratch);
    sd_kv_free(&kv);
    sd_drafter_free(&d);
}

static void check_alone_equals_batched(draft_kind kind) {
    skip_without_models();
    seq_spec ss[N_SEQS];
    make_seqs(ss);
    int32_t batched[N_SEQS][N_NEW];
    int64_t accepted = 0;
    batched_generate(kind, ss, batched, &accepted);
    print_message("accepted drafts in the batched run: %lld\n", (long long)accepted);
    if (kind != DRAFT_NGRAM) assert_true(accepted > 0);
    for (int32_t i = 0; i < N_SEQS; i++) {
        int32_t alone[N_NEW];
        alone_generate(kind, &ss[i], alone);
        assert_memory_equal(alone, batched[i], sizeof alone);
        if (ss[i].s.temperature == 0.0f) {
            int32_t plain[N_NEW];
            plain_generate(&ss[i], plain);
            assert_memory_equal(plain, batched[i], sizeof plain);
        }
    }
}

static void test_alone_equals_batched_ngram(void **state) {
    (void)state;
    check_alone_equals_batched(DRAFT_NGRAM);
}

static void test_alone_equals_batched_model(void **state) {
    (void)state;
    check_alone_equals_batched(DRAFT_MODEL);
}

static void test_alone_equals_batched_self(void **state) {
    (void)state;
    check_alone_equals_batched(DRAFT_SELF);
}

/* sd_draft_batch on several sequences == sd_drafter_propose on each alone. */
static void test_draft_batch_equals_propose(void **state) {
    (void)state;
    skip_without_models();
    seq_spec ss[N_SEQS];
    make_seqs(ss);
    for (int kind = DRAFT_NGRAM; kind <= DRAFT_SELF; kind++) {
        sd_drafter *batch = make_drafter((draft_kind)kind, MAX_SLOTS);
        sd_draft_seq dseq[N_SEQS];
        sd_draft_result *dres = calloc(N_SEQS, sizeof *dres);
        assert_non_null(dres);
        for (int32_t i = 0; i < N_SEQS; i++) {
            ss[i].s.temperature = ss[i].s.temperature == 0.0f ? 0.0f : 1.0f;
            dseq[i] = (sd_draft_seq){ss[i].slot, 0, ss[i].n_prompt, ss[i].prompt, ss[i].k + 1, ss[i].s, NULL};
        }
        assert_int_equal(sd_draft_batch(batch, N_SEQS, dseq, dres), SD_OK);
        for (int32_t i = 0; i < N_SEQS; i++) {
            sd_drafter *alone = make_drafter((draft_kind)kind, 1);
            int32_t tokens[SD_MAX_K], nd = 0;
            sd_spec_q q[SD_MAX_K];
            assert_int_equal(
                sd_drafter_propose(alone, 0, ss[i].prompt, ss[i].n_prompt, ss[i].k + 1, &ss[i].s, tokens, q, &nd),
                SD_OK);
            assert_int_equal(dres[i].outcome, SD_SEQ_OK);
            assert_int_equal(dres[i].n_drafted, nd);
            if (kind != DRAFT_NGRAM) assert_int_equal(nd, ss[i].k + 1);
            assert_memory_equal(tokens, dres[i].tokens, (size_t)nd * sizeof *tokens);
            for (int32_t j = 0; j < nd; j++) {
                assert_int_equal(q[j].n, dres[i].q[j].n);
                assert_memory_equal(q[j].ids, dres[i].q[j].ids, (size_t)q[j].n * sizeof(int32_t));
                assert_memory_equal(q[j].probs, dres[i].q[j].probs, (size_t)q[j].n * sizeof(float));
            }
            sd_drafter_free(&alone);
        }
        /* A slot the drafter never saw misses its cache; a repeated slot is invalid. */
        sd_draft_seq bad[3] = {
            {7, 5, 1, ss[0].prompt, 2, ss[0].s, NULL},
            {6, 0, 3, ss[0].prompt, 2, ss[0].s, NULL},
            {6, 0, 3, ss[0].prompt, 2, ss[0].s, NULL},
        };
        bad[0].slot = 7;
        sd_drafter_release(batch, 7);
        assert_int_equal(sd_draft_batch(batch, 3, bad, dres), SD_OK);
        assert_int_equal(dres[0].outcome, SD_SEQ_CACHE_MISS);
        assert_int_equal(dres[1].outcome, SD_SEQ_OK);
        assert_int_equal(dres[2].outcome, SD_SEQ_INVALID);
        free(dres);
        sd_drafter_free(&batch);
    }
}

/* Runs one sequence alone in a fresh cache: prompt + draft (greedy). */
static void verify_alone(const sd_verify_seq *v, sd_verify_result *r) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.target_model, MAX_SLOTS, 16, 16, &kv), SD_OK);
    sd_spec_scratch *scratch = NULL;
    assert_int_equal(sd_spec_scratch_create(&scratch), SD_OK);
    assert_int_equal(sd_spec_verify_batch(env.target_model, kv, 1, v, r, scratch), SD_OK);
    sd_spec_scratch_free(&scratch);
    sd_kv_free(&kv);
}

static void test_per_sequence_errors(void **state) {
    (void)state;
    skip_without_models();
    const int32_t prompt[6] = {3, 4, 5, 6, 7, 8}, draft[3] = {9, 10, 11}, bad_ids[2] = {3, VOCAB};
    sd_sampling greedy = sd_sampling_default(), hot = sd_sampling_default();
    hot.temperature = 1.0f;
    sd_verify_seq good = {
        .slot = 1, .keep_len = 0, .n_append = 6, .append = prompt, .k = 3, .draft = draft, .sampling = greedy};
    sd_verify_result want;
    verify_alone(&good, &want);
    assert_int_equal(want.outcome, SD_SEQ_OK);
    assert_int_equal(want.cache_len, 6 + want.n_accepted);

    /* 3 blocks of 4 tokens: the good sequence (9 tokens, 3 blocks) fits, nothing else does. */
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.target_model, MAX_SLOTS, 3, 4, &kv), SD_OK);
    sd_spec_scratch *scratch = NULL;
    assert_int_equal(sd_spec_scratch_create(&scratch), SD_OK);
    sd_verify_seq seqs[9];
    for (int32_t i = 0; i < 9; i++) seqs[i] = good;
    seqs[0].slot = 2;
    seqs[0].keep_len = 4; /* slot 2 holds nothing: cache miss */
    seqs[0].n_append = 2;
    seqs[1].slot = MAX_SLOTS; /* out of range */
    seqs[2] = good;           /* the good one */
    seqs[3].slot = 1;         /* duplicate of the good one's slot */
    seqs[4].slot = 3;
    seqs[4].append = bad_ids; /* id == VOCAB */
    seqs[4].n_append = 2;
    seqs[5].slot = 4;
    seqs[5].k = SD_MAX_K + 1; /* K over the limit */
    seqs[6].slot = 5;
    seqs[6].sampling = hot; /* sampling without q */
    seqs[7].slot = 6;
    seqs[7].n_append = 0; /* nothing to feed */
    seqs[8].slot = 7;
    seqs[8].k = 0; /* valid, but no KV room left after the good one */
    sd_verify_result res[9];
    assert_int_equal(sd_spec_verify_batch(env.target_model, kv, 9, seqs, res, scratch), SD_OK);
    const sd_seq_outcome expect[9] = {SD_SEQ_CACHE_MISS, SD_SEQ_INVALID, SD_SEQ_OK,
                                      SD_SEQ_INVALID,    SD_SEQ_INVALID, SD_SEQ_INVALID,
                                      SD_SEQ_INVALID,    SD_SEQ_INVALID, SD_SEQ_OUT_OF_BLOCKS};
    for (int32_t i = 0; i < 9; i++) {
        if (res[i].outcome != expect[i])
            print_message("sequence %d: outcome %s, expected %s\n", (int)i, sd_seq_outcome_str(res[i].outcome),
                          sd_seq_outcome_str(expect[i]));
        assert_int_equal(res[i].outcome, expect[i]);
        if (i != 2) assert_int_equal(res[i].n_tokens, 0);
    }
    assert_int_equal(res[2].n_accepted, want.n_accepted);
    assert_int_equal(res[2].n_tokens, want.n_tokens);
    assert_memory_equal(res[2].tokens, want.tokens, (size_t)want.n_tokens * sizeof(int32_t));
    assert_int_equal(sd_kv_seq_len(kv, 1), want.cache_len);
    assert_int_equal(sd_kv_seq_len(kv, 7), 0);
    /* Continue the good sequence with keep_len = cache_len: one more greedy token, equal to a fresh run. */
    int32_t ctx[16];
    memcpy(ctx, prompt, sizeof prompt);
    memcpy(ctx + 6, want.tokens, (size_t)want.n_tokens * sizeof(int32_t));
    int32_t n = 6 + want.n_tokens;
    sd_verify_seq next = {.slot = 1,
                          .keep_len = want.cache_len,
                          .n_append = n - want.cache_len,
                          .append = ctx + want.cache_len,
                          .k = 0,
                          .sampling = greedy};
    sd_kv_release(kv, 7);
    assert_int_equal(sd_spec_verify_batch(env.target_model, kv, 1, &next, res, scratch), SD_OK);
    assert_int_equal(res[0].outcome, SD_SEQ_OK);
    sd_verify_seq fresh = {.slot = 0, .keep_len = 0, .n_append = n, .append = ctx, .k = 0, .sampling = greedy};
    verify_alone(&fresh, &want);
    assert_int_equal(res[0].tokens[0], want.tokens[0]);
    /* Whole-call errors. */
    assert_int_equal(sd_spec_verify_batch(NULL, kv, 1, &next, res, scratch), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_spec_verify_batch(env.target_model, kv, 1, NULL, res, scratch), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_spec_verify_batch(env.target_model, kv, 0, NULL, NULL, scratch), SD_OK);
    sd_spec_scratch_free(&scratch);
    sd_kv_free(&kv);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_batch_equals_propose), cmocka_unit_test(test_per_sequence_errors),
        cmocka_unit_test(test_alone_equals_batched_ngram), cmocka_unit_test(test_alone_equals_batched_model),
        cmocka_unit_test(test_alone_equals_batched_self),
    };
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
