/* test_spec_drafter.c — unit tests of the drafters (engine/drafter*.c).
 *
 * n-gram drafter: longest match first, majority then most recent
 * occurrence, a match running into its own draft, ngram_min respected,
 * one-hot q, no match; the draft length cut by confidence, the
 * per-sequence calibration (greedy only), the cache shared across
 * sequences (greedy only).
 * Model drafters on small random models written by specd-mkmodel (path
 * compiled in as SPECD_MKMODEL; the test skips when it cannot run it):
 *   - a draft model with another vocabulary is refused (UNSUPPORTED);
 *   - greedy drafts equal the draft model's own greedy continuation;
 *   - the automatic rollback: after proposing on one context, proposing on
 *     a diverging context gives exactly what a fresh drafter gives (the
 *     forward pass is batch/chunk invariant, so bit-equal logits);
 *   - sampled drafts: q sums to 1, holds the drafted token, has <= top_n
 *     entries, and the draw is a pure function of (seed, position);
 *   - the self-draft over L layers drafts like a model loaded with
 *     n_layers_used = L;
 *   - paired with a target padded to other rows (sd_drafter_pair_vocab):
 *     the cut to the target's ids, no drafts past the draft's own rows. */
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
#include "specd/tokenizer.h"

/* ---- n-gram ---- */

/* The lookup alone: no draft cut short by its confidence, no shared cache. */
static sd_drafter *ngram(int32_t nmin, int32_t nmax) {
    sd_drafter_params p = sd_drafter_default_params();
    p.ngram_min = nmin;
    p.ngram_max = nmax;
    p.ngram_min_p = 1e-6f;
    p.ngram_cache_entries = -1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_OK);
    assert_int_equal(sd_drafter_kind_of(d), SD_DRAFTER_NGRAM);
    return d;
}

static int32_t propose_at(sd_drafter *d, int32_t slot, const int32_t *ctx, int32_t n, int32_t k, float temperature,
                          int32_t *tokens, sd_spec_q *q) {
    sd_sampling s = sd_sampling_default();
    s.temperature = temperature;
    int32_t n_drafted = -1;
    assert_int_equal(sd_drafter_propose(d, slot, ctx, n, k, &s, tokens, q, &n_drafted), SD_OK);
    return n_drafted;
}

static int32_t propose(sd_drafter *d, const int32_t *ctx, int32_t n, int32_t k, int32_t *tokens, sd_spec_q *q) {
    return propose_at(d, 0, ctx, n, k, 1.0f, tokens, q);
}

static void test_ngram_basic(void **state) {
    (void)state;
    sd_drafter *d = ngram(1, 3);
    int32_t tokens[8];
    sd_spec_q q[8];
    const int32_t ctx[] = {1, 2, 3, 4, 9, 1, 2, 3};
    assert_int_equal(propose(d, ctx, 8, 3, tokens, q), 3);
    assert_int_equal(tokens[0], 4);
    assert_int_equal(tokens[1], 9);
    assert_int_equal(tokens[2], 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(q[i].n, 1);
        assert_int_equal(q[i].ids[0], tokens[i]);
        assert_true(q[i].probs[0] == 1.0f);
    }
    /* Past the end of the context the match runs into the draft itself:
     * 4 9 1 2 3, then 4 9 1 again (a periodic text). */
    assert_int_equal(propose(d, ctx, 8, 8, tokens, q), 8);
    assert_int_equal(tokens[4], 3);
    assert_int_equal(tokens[5], 4);
    assert_int_equal(tokens[7], 1);
    sd_drafter_free(&d);
    assert_null(d);
}

static void test_ngram_longest_then_most_recent(void **state) {
    (void)state;
    sd_drafter *d = ngram(1, 3);
    int32_t tokens[4];
    sd_spec_q q[4];
    /* [1 2 3] matches at 0 (followed by 7); [2 3] alone matches later at 5 (followed by 8). */
    const int32_t longest[] = {1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3};
    assert_int_equal(propose(d, longest, 11, 1, tokens, q), 1);
    assert_int_equal(tokens[0], 7);
    /* [5 6] occurs at 0 (then 7) and at 3 (then 8), no majority: the most recent wins. */
    const int32_t recent[] = {5, 6, 7, 5, 6, 8, 5, 6};
    assert_int_equal(propose(d, recent, 8, 3, tokens, q), 3);
    assert_int_equal(tokens[0], 8);
    assert_int_equal(tokens[1], 5);
    assert_int_equal(tokens[2], 6);
    /* Nothing repeats: no draft. */
    const int32_t fresh[] = {1, 2, 3, 4, 5};
    assert_int_equal(propose(d, fresh, 5, 4, tokens, q), 0);
    sd_drafter_free(&d);
    /* ngram_min 2: a lone repeated token is not enough. */
    d = ngram(2, 3);
    const int32_t unigram[] = {4, 1, 2, 3, 4};
    assert_int_equal(propose(d, unigram, 5, 2, tokens, q), 0);
    sd_drafter_free(&d);
    d = ngram(1, 3);
    assert_int_equal(propose(d, unigram, 5, 2, tokens, q), 2);
    assert_int_equal(tokens[0], 1);
    sd_drafter_free(&d);
}

/* Among the longest matches a continuation most of them agree on wins;
 * without a majority the most recent one does. */
static void test_ngram_vote(void **state) {
    (void)state;
    sd_drafter *d = ngram(1, 4);
    int32_t tokens[4];
    sd_spec_q q[4];
    /* "1" is followed by 2, 2 and (most recently) 3. */
    const int32_t majority[] = {1, 2, 1, 2, 1, 3, 1};
    assert_int_equal(propose(d, majority, 7, 1, tokens, q), 1);
    assert_int_equal(tokens[0], 2);
    const int32_t split[] = {1, 2, 1, 3, 1};
    assert_int_equal(propose(d, split, 5, 1, tokens, q), 1);
    assert_int_equal(tokens[0], 3);
    sd_drafter_free(&d);
}

/* Default confidence cut: a one-token match is worth three tokens (0.40 *
 * 0.57 * 0.67 >= 0.15, times 0.75 is not); a higher ngram_min_p drafts
 * nothing on it. */
static void test_ngram_draft_length(void **state) {
    (void)state;
    sd_drafter_params p = sd_drafter_default_params();
    p.ngram_cache_entries = -1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_OK);
    int32_t tokens[8];
    sd_spec_q q[8];
    const int32_t ctx[] = {5, 6, 7, 8, 9, 10, 11, 5};
    assert_int_equal(propose(d, ctx, 8, 8, tokens, q), 3);
    assert_int_equal(tokens[0], 6);
    assert_int_equal(tokens[2], 8);
    sd_drafter_free(&d);
    p.ngram_min_p = 0.5f;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_OK);
    assert_int_equal(propose(d, ctx, 8, 8, tokens, q), 0);
    sd_drafter_free(&d);
    p.ngram_min_p = 1.5f;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_ERR_INVALID_ARG);
}

/* A greedy sequence whose drafts keep being rejected stops drafting on
 * such matches (calibration); a sampled one drafts from the prior alone. */
static void test_ngram_calibration(void **state) {
    (void)state;
    sd_drafter_params p = sd_drafter_default_params();
    p.ngram_cache_entries = -1;
    p.max_seqs = 2;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_OK);
    int32_t tokens[8];
    sd_spec_q q[8];
    /* 5 is followed by a new token every time: each draft after "5" is rejected. */
    int32_t ctx[64] = {5, 6};
    int32_t n = 2, first = -1, last = -1;
    for (int32_t round = 0; round < 8; round++) {
        ctx[n++] = 5;
        int32_t nd = propose_at(d, 0, ctx, n, 4, 0.0f, tokens, q);
        if (round == 0) first = nd;
        last = nd;
        ctx[n++] = 20 + round; /* what the target committed instead */
        ctx[n++] = 40 + round;
    }
    assert_true(first >= 1);
    assert_int_equal(last, 0);
    /* The same context sampled: the prior alone, so it still drafts. */
    assert_true(propose_at(d, 1, ctx, n - 2, 4, 1.0f, tokens, q) >= 1);
    /* Released, the slot forgets what it learnt. */
    sd_drafter_release(d, 0);
    assert_true(propose_at(d, 0, ctx, n - 2, 4, 0.0f, tokens, q) >= 1);
    sd_drafter_free(&d);
}

/* The cache shared across sequences: what one greedy request's output did
 * after an n-gram is drafted for another whose own context has no match;
 * sampled requests and a drafter without the cache draft nothing there. */
static void test_ngram_shared_cache(void **state) {
    (void)state;
    sd_drafter_params p = sd_drafter_default_params();
    p.max_seqs = 2;
    for (int with_cache = 0; with_cache < 2; with_cache++) {
        p.ngram_cache_entries = with_cache ? 1024 : -1;
        sd_drafter *d = NULL;
        assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_OK);
        int32_t tokens[8];
        sd_spec_q q[8];
        /* slot 0: a prompt, then an output saying 30 31 32 33 three times */
        int32_t a[32] = {1, 2, 3};
        int32_t n = 3;
        propose_at(d, 0, a, n, 4, 0.0f, tokens, q);
        for (int rep = 0; rep < 3; rep++)
            for (int32_t t = 30; t < 34; t++) {
                a[n++] = t;
                propose_at(d, 0, a, n, 4, 0.0f, tokens, q);
            }
        /* slot 1: another prompt ending in 30 */
        const int32_t b[] = {7, 8, 9, 30};
        int32_t nd = propose_at(d, 1, b, 4, 4, 0.0f, tokens, q);
        if (with_cache) {
            assert_true(nd >= 2);
            assert_int_equal(tokens[0], 31);
            assert_int_equal(tokens[1], 32);
            assert_int_equal(q[0].n, 1);
            assert_int_equal(q[0].ids[0], 31);
        } else {
            assert_int_equal(nd, 0);
        }
        assert_int_equal(propose_at(d, 1, b, 4, 4, 1.0f, tokens, q), 0);
        sd_drafter_free(&d);
    }
}

static void test_ngram_bad_args(void **state) {
    (void)state;
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_spec_drafter");
    sd_drafter *d = ngram(1, 2);
    const int32_t ctx[] = {1, 1};
    int32_t tokens[4], n;
    sd_spec_q q[4];
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.0f; /* sampled (the default is greedy) */
    assert_int_equal(sd_drafter_propose(d, 1, ctx, 2, 2, &s, tokens, q, &n), SD_ERR_RANGE);
    assert_int_equal(sd_drafter_propose(d, 0, ctx, 0, 2, &s, tokens, q, &n), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_drafter_propose(d, 0, ctx, 2, SD_MAX_K + 1, &s, tokens, q, &n), SD_ERR_INVALID_ARG);
    s.top_p = 0;
    assert_int_equal(sd_drafter_propose(d, 0, ctx, 2, 2, &s, tokens, q, &n), SD_ERR_INVALID_ARG);
    sd_drafter_free(&d);
    sd_drafter_params p = sd_drafter_default_params();
    p.ngram_min = 3;
    p.ngram_max = 2;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_ERR_INVALID_ARG);
    assert_null(d);
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_spec_drafter");
}

/* ---- model drafters ---- */

typedef struct model_files {
    char dir[64];
    char target[128], draft[128], other_vocab[128];
    bool ok;
} model_files;
static model_files files;

static int make_models(void **state) {
    (void)state;
    snprintf(files.dir, sizeof files.dir, "/tmp/specd-drafter-XXXXXX");
    if (!mkdtemp(files.dir)) return 0;
    snprintf(files.target, sizeof files.target, "%s/target.gguf", files.dir);
    snprintf(files.draft, sizeof files.draft, "%s/draft.gguf", files.dir);
    snprintf(files.other_vocab, sizeof files.other_vocab, "%s/other.gguf", files.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers 3 --vocab 300 --seed 1 >/dev/null 2>&1 && "
             "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab 300 --seed 2 >/dev/null 2>&1 && "
             "'%s' -o '%s' --layers 1 --vocab 320 --seed 3 >/dev/null 2>&1",
             SPECD_MKMODEL, files.target, SPECD_MKMODEL, files.draft, SPECD_MKMODEL, files.other_vocab);
    files.ok = system(cmd) == 0;
    return 0;
}

static int remove_models(void **state) {
    (void)state;
    unlink(files.target);
    unlink(files.draft);
    unlink(files.other_vocab);
    rmdir(files.dir);
    return 0;
}

static void need_models(void) {
    if (!files.ok) skip();
}

static void target_vocab(uint64_t *hash, int32_t *n_vocab) {
    sd_gguf *g = NULL;
    char err[128];
    assert_int_equal(sd_gguf_open(files.target, &g, err, sizeof err), SD_OK);
    sd_tok *t = NULL;
    assert_int_equal(sd_tok_from_gguf(g, &t), SD_OK);
    *hash = sd_tok_vocab_hash(t);
    *n_vocab = sd_tok_n_vocab(t);
    sd_tok_free(&t);
    sd_gguf_close(&g);
}

/* The draft model with a vocabulary cut (0 = the whole vocabulary). */
static sd_drafter *open_draft_cut(int32_t top_n, int32_t draft_vocab) {
    uint64_t hash;
    int32_t n_vocab;
    target_vocab(&hash, &n_vocab);
    sd_drafter_params p = sd_drafter_default_params();
    p.max_ctx = 128;
    p.top_n = top_n;
    p.n_threads = 1;
    p.draft_vocab = draft_vocab;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_model_open(files.draft, hash, n_vocab, &p, &d), SD_OK);
    assert_int_equal(sd_drafter_kind_of(d), SD_DRAFTER_MODEL);
    return d;
}

static sd_drafter *open_draft(int32_t top_n) { return open_draft_cut(top_n, 0); }

/* Plain greedy continuation of ctx by the model in path (n_layers_used L),
 * each token the argmax of the first n_head logits (0 = all). */
static void greedy_continuation_cut(const char *path, int32_t n_layers_used, int32_t n_head, const int32_t *ctx,
                                    int32_t n, int32_t k, int32_t *out) {
    sd_gguf *g = NULL;
    char err[128];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    mp.n_layers_used = n_layers_used;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_gguf_close(&g);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 16, 16, &kv), SD_OK);
    int32_t n_vocab = sd_model_config_of(m)->n_vocab;
    if (n_head == 0) n_head = n_vocab;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int32_t seq[64] = {0}, pos[64];
    bool want[64] = {false};
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    want[n - 1] = true;
    sd_batch b = {n, ctx, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, logits), SD_OK);
    for (int32_t i = 0; i < k; i++) {
        out[i] = sd_argmax(logits, n_head);
        int32_t p = n + i;
        bool one = true;
        sd_batch step = {1, &out[i], &p, seq, &one};
        assert_int_equal(sd_model_forward(m, kv, &step, logits), SD_OK);
    }
    free(logits);
    sd_kv_free(&kv);
    sd_model_free(&m);
}

static void greedy_continuation(const char *path, int32_t n_layers_used, const int32_t *ctx, int32_t n, int32_t k,
                                int32_t *out) {
    greedy_continuation_cut(path, n_layers_used, 0, ctx, n, k, out);
}

static void test_model_vocab_mismatch(void **state) {
    (void)state;
    need_models();
    uint64_t hash;
    int32_t n_vocab;
    target_vocab(&hash, &n_vocab);
    sd_drafter *d = NULL;
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_spec_drafter");
    assert_int_equal(sd_drafter_model_open(files.other_vocab, hash, n_vocab, NULL, &d), SD_ERR_UNSUPPORTED);
    assert_null(d);
    assert_int_equal(sd_drafter_model_open(files.draft, hash ^ 1, n_vocab, NULL, &d), SD_ERR_UNSUPPORTED);
    assert_null(d);
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_spec_drafter");
}

static void test_model_greedy_and_rollback(void **state) {
    (void)state;
    need_models();
    sd_drafter *d = open_draft(8);
    const int32_t ctx[] = {1, 40, 41, 42, 100, 7, 250, 3, 3, 9};
    int32_t tokens[6], expect[6], n_drafted;
    sd_spec_q q[6];
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    assert_int_equal(sd_drafter_propose(d, 0, ctx, 10, 6, &greedy, tokens, q, &n_drafted), SD_OK);
    assert_int_equal(n_drafted, 6);
    greedy_continuation(files.draft, 0, ctx, 10, 6, expect);
    assert_memory_equal(tokens, expect, sizeof expect);
    for (int i = 0; i < 6; i++) assert_int_equal(q[i].n, 1); /* greedy q is one-hot */

    /* Diverge: accept two drafts, then a different token. */
    int32_t ctx2[16];
    memcpy(ctx2, ctx, sizeof ctx);
    ctx2[10] = tokens[0];
    ctx2[11] = tokens[1];
    ctx2[12] = (tokens[2] + 1) % 300;
    int32_t after[5], fresh_tokens[5];
    assert_int_equal(sd_drafter_propose(d, 0, ctx2, 13, 5, &greedy, after, q, &n_drafted), SD_OK);
    assert_int_equal(n_drafted, 5);
    sd_drafter *fresh = open_draft(8);
    assert_int_equal(sd_drafter_propose(fresh, 0, ctx2, 13, 5, &greedy, fresh_tokens, q, &n_drafted), SD_OK);
    assert_memory_equal(after, fresh_tokens, sizeof after);
    greedy_continuation(files.draft, 0, ctx2, 13, 5, expect);
    assert_memory_equal(after, expect, sizeof after);
    /* Explicit rollback and release keep working. */
    assert_int_equal(sd_drafter_rollback(d, 0, 4), SD_OK);
    assert_int_equal(sd_drafter_propose(d, 0, ctx2, 13, 5, &greedy, after, q, &n_drafted), SD_OK);
    assert_memory_equal(after, fresh_tokens, sizeof after);
    sd_drafter_release(d, 0);
    assert_int_equal(sd_drafter_propose(d, 0, ctx2, 13, 5, &greedy, after, q, &n_drafted), SD_OK);
    assert_memory_equal(after, fresh_tokens, sizeof after);
    sd_drafter_free(&fresh);
    sd_drafter_free(&d);
}

static void test_model_sampled_q(void **state) {
    (void)state;
    need_models();
    sd_drafter *d = open_draft(5);
    sd_drafter *d2 = open_draft(5);
    const int32_t ctx[] = {1, 17, 18, 19};
    sd_sampling s = sd_sampling_default();
    s.temperature = 1.5f; /* flat enough that several tokens have mass */
    int distinct_first = 0, seen[300] = {0};
    for (uint64_t seed = 0; seed < 40; seed++) {
        s.seed = seed;
        int32_t tokens[4], tokens2[4], n_drafted, n2;
        sd_spec_q q[4], q2[4];
        assert_int_equal(sd_drafter_propose(d, 0, ctx, 4, 4, &s, tokens, q, &n_drafted), SD_OK);
        assert_int_equal(n_drafted, 4);
        for (int i = 0; i < 4; i++) {
            assert_true(q[i].n >= 1 && q[i].n <= 5);
            double total = 0;
            for (int j = 0; j < q[i].n; j++) total += q[i].probs[j];
            assert_true(total > 0.999999 && total < 1.000001);
            assert_true(sd_spec_q_prob(&q[i], tokens[i]) > 0);
        }
        /* A fresh drafter with the same seed drafts the same tokens. */
        assert_int_equal(sd_drafter_propose(d2, 0, ctx, 4, 4, &s, tokens2, q2, &n2), SD_OK);
        assert_memory_equal(tokens, tokens2, sizeof tokens);
        if (!seen[tokens[0]]++) distinct_first++;
    }
    assert_true(distinct_first >= 2); /* it samples, not argmax */
    sd_drafter_free(&d);
    sd_drafter_free(&d2);
}

/* The vocabulary cut (draft_vocab): greedy drafts are the argmax of the
 * first N logits, sampled drafts and every q entry lie below N, the batched
 * path drafts what the single one does, N >= n_vocab is no cut, and
 * negative values are refused. */
static void test_model_vocab_cut(void **state) {
    (void)state;
    need_models();
    enum { CUT = 150 };
    sd_drafter *d = open_draft_cut(8, CUT);
    const int32_t ctx[] = {1, 240, 241, 242, 100, 7, 250, 3, 3, 9};
    int32_t tokens[6], expect[6], n_drafted;
    sd_spec_q q[6];
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    assert_int_equal(sd_drafter_propose(d, 0, ctx, 10, 6, &greedy, tokens, q, &n_drafted), SD_OK);
    assert_int_equal(n_drafted, 6);
    greedy_continuation_cut(files.draft, 0, CUT, ctx, 10, 6, expect);
    assert_memory_equal(tokens, expect, sizeof expect);
    int32_t full[6];
    greedy_continuation(files.draft, 0, ctx, 10, 6, full);
    bool differs = false; /* the cut is real on this context: the full argmax lies above it somewhere */
    for (int i = 0; i < 6; i++) differs |= full[i] >= CUT;
    assert_true(differs);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(q[i].n, 1);
        assert_true(tokens[i] < CUT);
    }
    /* the batched draft from a fresh drafter */
    sd_drafter *b = open_draft_cut(8, CUT);
    sd_draft_seq seq = {.slot = 0, .keep_len = 0, .n_append = 10, .append = ctx, .k = 6, .sampling = greedy};
    sd_draft_result res;
    assert_int_equal(sd_draft_batch(b, 1, &seq, &res), SD_OK);
    assert_int_equal(res.outcome, SD_SEQ_OK);
    assert_int_equal(res.n_drafted, 6);
    assert_memory_equal(res.tokens, expect, sizeof expect);
    sd_drafter_free(&b);

    sd_sampling s = sd_sampling_default();
    s.temperature = 1.5f;
    int distinct_first = 0, seen[300] = {0};
    for (uint64_t seed = 0; seed < 40; seed++) {
        s.seed = seed;
        assert_int_equal(sd_drafter_propose(d, 0, ctx, 4, 4, &s, tokens, q, &n_drafted), SD_OK);
        assert_int_equal(n_drafted, 4);
        for (int i = 0; i < 4; i++) {
            assert_true(tokens[i] >= 0 && tokens[i] < CUT);
            double total = 0;
            for (int j = 0; j < q[i].n; j++) {
                assert_true(q[i].ids[j] >= 0 && q[i].ids[j] < CUT);
                total += q[i].probs[j];
            }
            assert_true(total > 0.999999 && total < 1.000001);
            assert_true(sd_spec_q_prob(&q[i], tokens[i]) > 0);
        }
        if (!seen[tokens[0]]++) distinct_first++;
    }
    assert_true(distinct_first >= 2);
    sd_drafter_free(&d);

    /* N = n_vocab and above, and the default (0), is the whole vocabulary */
    const int32_t wholes[] = {300, 301, SD_DRAFTER_DEFAULT_VOCAB};
    for (int i = 0; i < 3; i++) {
        sd_drafter *whole = open_draft_cut(8, wholes[i]);
        assert_int_equal(sd_drafter_propose(whole, 0, ctx, 10, 6, &greedy, tokens, q, &n_drafted), SD_OK);
        assert_memory_equal(tokens, full, sizeof full);
        sd_drafter_free(&whole);
    }

    uint64_t hash;
    int32_t n_vocab;
    target_vocab(&hash, &n_vocab);
    sd_drafter_params p = sd_drafter_default_params();
    p.max_ctx = 128;
    p.n_threads = 1;
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_spec_drafter");
    const int32_t bad[] = {-1, -300, INT32_MIN};
    for (int i = 0; i < 3; i++) {
        p.draft_vocab = bad[i];
        sd_drafter *x = NULL;
        assert_int_equal(sd_drafter_model_open(files.draft, hash, n_vocab, &p, &x), SD_ERR_INVALID_ARG);
        assert_null(x);
        assert_int_equal(sd_drafter_self_open(files.target, 1, &p, &x), SD_ERR_INVALID_ARG);
        assert_null(x);
    }
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_spec_drafter");
}

/* sd_drafter_pair_vocab (the service's Welcome): a draft with more rows than
 * the target drafts among the target's ids only (batched, as the vocabulary
 * cut); one with fewer accepts the target's ids and drafts nothing for a
 * sequence holding one past its rows (OK, not INVALID); an id past the
 * target's rows is still INVALID. N-gram drafters: nothing to pair. */
static void test_model_pair_vocab(void **state) {
    (void)state;
    need_models();
    enum { TARGET = 150 };
    const int32_t ctx[] = {1, 240, 241, 242, 100, 7, 250, 3, 3, 9};
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    int32_t expect[6];
    greedy_continuation_cut(files.draft, 0, TARGET, ctx, 10, 6, expect);
    sd_drafter *d = open_draft(8);
    int32_t rows = sd_drafter_embed_rows(d);
    assert_true(rows > TARGET);
    assert_int_equal(sd_drafter_pair_vocab(d, TARGET), SD_OK);
    sd_draft_seq seq = {.slot = 0, .keep_len = 0, .n_append = 10, .append = ctx, .k = 6, .sampling = greedy};
    sd_draft_result res;
    assert_int_equal(sd_draft_batch(d, 1, &seq, &res), SD_OK);
    assert_int_equal(res.outcome, SD_SEQ_OK);
    assert_int_equal(res.n_drafted, 6);
    assert_memory_equal(res.tokens, expect, sizeof expect);
    sd_drafter_free(&d);

    d = open_draft(8);
    assert_int_equal(sd_drafter_pair_vocab(d, rows + 40), SD_OK);
    int32_t padded[10];
    memcpy(padded, ctx, sizeof padded);
    padded[5] = rows + 5; /* the target's padding id: this draft cannot embed it */
    sd_draft_seq two[2] = {
        {.slot = 0, .keep_len = 0, .n_append = 10, .append = padded, .k = 4, .sampling = greedy},
        {.slot = 0, .keep_len = 0, .n_append = 10, .append = ctx, .k = 4, .sampling = greedy},
    };
    sd_draft_result r2;
    assert_int_equal(sd_draft_batch(d, 1, &two[0], &r2), SD_OK);
    assert_int_equal(r2.outcome, SD_SEQ_OK);
    assert_int_equal(r2.n_drafted, 0);
    assert_int_equal(sd_draft_batch(d, 1, &two[1], &r2), SD_OK); /* the slot serves a context it embeds */
    assert_int_equal(r2.outcome, SD_SEQ_OK);
    assert_int_equal(r2.n_drafted, 4);
    padded[5] = rows + 40; /* past the target's rows too */
    assert_int_equal(sd_draft_batch(d, 1, &two[0], &r2), SD_OK);
    assert_int_equal(r2.outcome, SD_SEQ_INVALID);
    assert_int_equal(sd_drafter_pair_vocab(d, 0), SD_ERR_INVALID_ARG);
    sd_drafter_free(&d);

    sd_drafter *ng = ngram(1, 3);
    assert_int_equal(sd_drafter_embed_rows(ng), INT32_MAX);
    assert_int_equal(sd_drafter_pair_vocab(ng, TARGET), SD_OK);
    sd_drafter_free(&ng);
}

static void test_self_draft(void **state) {
    (void)state;
    need_models();
    sd_drafter_params p = sd_drafter_default_params();
    p.max_ctx = 64;
    p.n_threads = 1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_self_open(files.target, 1, &p, &d), SD_OK);
    assert_int_equal(sd_drafter_kind_of(d), SD_DRAFTER_SELF);
    const int32_t ctx[] = {1, 50, 60, 70, 80};
    int32_t tokens[4], expect[4], n_drafted;
    sd_spec_q q[4];
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    assert_int_equal(sd_drafter_propose(d, 0, ctx, 5, 4, &greedy, tokens, q, &n_drafted), SD_OK);
    greedy_continuation(files.target, 1, ctx, 5, 4, expect);
    assert_memory_equal(tokens, expect, sizeof expect);
    sd_drafter_free(&d);
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_spec_drafter");
    assert_int_equal(sd_drafter_self_open(files.target, 9, &p, &d), SD_ERR_INVALID_ARG); /* > block_count */
    assert_null(d);
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_spec_drafter");
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_spec_drafter");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_basic),
        cmocka_unit_test(test_ngram_longest_then_most_recent),
        cmocka_unit_test(test_ngram_vote),
        cmocka_unit_test(test_ngram_draft_length),
        cmocka_unit_test(test_ngram_calibration),
        cmocka_unit_test(test_ngram_shared_cache),
        cmocka_unit_test(test_ngram_bad_args),
        cmocka_unit_test(test_model_vocab_mismatch),
        cmocka_unit_test(test_model_greedy_and_rollback),
        cmocka_unit_test(test_model_sampled_q),
        cmocka_unit_test(test_model_vocab_cut),
        cmocka_unit_test(test_model_pair_vocab),
        cmocka_unit_test(test_self_draft),
    };
    return cmocka_run_group_tests_name("spec_drafter", tests, make_models, remove_models);
}
