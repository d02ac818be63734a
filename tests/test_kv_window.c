/* test_kv_window.c — the KV cache's window group (engine/kv_window.c,
 * engine/model_window.c): blocks that left the sliding window are freed.
 *
 * Bookkeeping (no model): a sequence grown one token at a time to many
 * windows holds at most ceil((window + slack + bs - 1 + 1) / bs) + 1 window
 * blocks, every invariant holds after each call (sd_kv_check), a rollback
 * within the slack keeps its length, a deeper one empties the slot, a grow
 * that the window pool cannot supply fails leaving the cache as it was.
 *
 * The model oracle, on random Gemma 3 (5 windowed layers of 6, a global
 * one) and Mistral (every layer windowed) models written by specd-mkmodel,
 * a window of 12 positions and blocks of 4, sequences of 300 tokens (25
 * windows) — every logit compared bit for bit with the unbounded cache
 * (a cache made without a window group, whose windowed layers keep every
 * position and mask them):
 *   - decoding token by token beside a second sequence (so the main block
 *     ids outrun the window pools'), the window blocks held stay within the bound
 *     while the main blocks grow with the sequence, and the window cache's
 *     pools are smaller;
 *   - speculative steps: each appends the next token and 3 wrong drafts and
 *     rolls the drafts back, across the window's edge all along;
 *   - a drafter's rollback: a token at a time for 20 more, then back 20
 *     (within the slack) and on with the right tokens;
 *   - a rollback deeper than the slack empties the slot, and recomputing
 *     gives the same logits;
 *   - a 300-token prompt in one call (longer than a chunk: run in chunks);
 *   - the prefix cache on such a cache: the committed end is adopted, and
 *     warm equals cold;
 *   - greedy speculative decoding after a 400-token prompt (verified in one
 *     step: more blocks than the window pools hold) equals plain greedy on
 *     a whole-context cache, with the n-gram drafter and a random draft. */
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
#include "specd/kv.h"
#include "specd/model.h"
#include "specd/drafter.h"
#include "specd/spec_decode.h"
#include "specd/tokenizer.h"

#define VOCAB  300
#define LEN    300
#define WINDOW 12
#define BS     4
#define SLACK  32 /* sd_kv_default_params' window_slack: SD_MAX_K */
#define BLOCKS (4 * LEN / BS + 4)

/* ---- bookkeeping ---- */

static sd_kv *make_kv(int32_t window, int32_t window_blocks, int32_t slack) {
    static const bool windowed[3] = {true, false, true};
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = 3;
    p.n_kv_heads = 1;
    p.head_dim = 4;
    p.block_size = BS;
    p.n_blocks = 200;
    p.max_seqs = 2;
    p.window = window;
    p.windowed = windowed;
    p.window_slack = slack;
    p.window_blocks = window_blocks;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    return kv;
}

static void test_bookkeeping(void **state) {
    (void)state;
    const int32_t slack = 6, bound = (WINDOW + slack + BS - 1 + 1 + BS - 1) / BS + 1;
    sd_kv *kv = make_kv(WINDOW, 20, slack);
    assert_int_equal(sd_kv_window(kv), WINDOW);
    assert_true(sd_kv_layer_windowed(kv, 0));
    assert_false(sd_kv_layer_windowed(kv, 1));
    for (int32_t len = 1; len <= 500; len++) {
        assert_int_equal(sd_kv_grow(kv, 0, len), SD_OK);
        assert_int_equal(sd_kv_check(kv), SD_OK);
        assert_true(sd_kv_window_held(kv, 0) <= bound);
        /* the window of the next token is there, in every windowed layer */
        for (int32_t p = len > WINDOW ? len - WINDOW : 0; p < len; p++) assert_non_null(sd_kv_k(kv, 0, 0, p));
        if (len % 50 == 0) { /* a rollback within the slack keeps its length */
            assert_int_equal(sd_kv_truncate(kv, 0, len - slack), SD_OK);
            assert_int_equal(sd_kv_seq_len(kv, 0), len - slack);
            assert_int_equal(sd_kv_grow(kv, 0, len), SD_OK);
        }
    }
    assert_null(sd_kv_k(kv, 0, 0, 0));     /* left the window */
    assert_non_null(sd_kv_k(kv, 1, 0, 0)); /* a global layer keeps it */
    /* the other slot can take what the first one does not hold */
    int32_t free_w = 20 - sd_kv_window_held(kv, 0);
    assert_int_equal(sd_kv_grow(kv, 1, free_w * BS + 1), SD_ERR_OUT_OF_BLOCKS);
    assert_int_equal(sd_kv_seq_len(kv, 1), 0);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 1, free_w * BS), SD_OK);
    sd_kv_release(kv, 1);
    /* deeper than the slack below the last grow: the slot empties */
    assert_int_equal(sd_kv_truncate(kv, 0, 500 - slack - WINDOW), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, 0), 0);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    assert_int_equal(sd_kv_window_held(kv, 0), 0);
    /* a cache whose layers are none windowed has no window group */
    sd_kv_free(&kv);
    kv = make_kv(0, 0, slack);
    assert_int_equal(sd_kv_window(kv), 0);
    assert_null(sd_kv_window_table(kv, 0, NULL));
    sd_kv_free(&kv);
}

/* ---- the model oracle ---- */

static struct {
    char dir[64], path[2][128], draft[2][128];
    bool ok;
} env;

static const char *const arch_args[2] = {
    "--arch gemma3 --layers 7 --dim 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --tied",
    "--arch mistral --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128",
};
static const char *const draft_args[2] = {
    "--arch gemma3 --layers 1 --dim 32 --heads 2 --kv-heads 1 --head-dim 32 --ff 64 --tied",
    "--arch mistral --layers 1 --dim 32 --heads 2 --kv-heads 2 --ff 64",
};

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-kvwin-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    env.ok = true;
    for (int i = 0; i < 2 && env.ok; i++) {
        snprintf(env.path[i], sizeof env.path[i], "%s/m%d.gguf", env.dir, i);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "'%s' -o '%s' %s --window %d --vocab %d --seed %d >/dev/null 2>&1", SPECD_MKMODEL,
                 env.path[i], arch_args[i], WINDOW, VOCAB, 41 + i);
        env.ok = system(cmd) == 0;
        snprintf(env.draft[i], sizeof env.draft[i], "%s/d%d.gguf", env.dir, i);
        snprintf(cmd, sizeof cmd, "'%s' -o '%s' %s --window %d --vocab %d --seed %d >/dev/null 2>&1", SPECD_MKMODEL,
                 env.draft[i], draft_args[i], WINDOW, VOCAB, 51 + i);
        env.ok = env.ok && system(cmd) == 0;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) unlink(env.path[i]), unlink(env.draft[i]);
    rmdir(env.dir);
    return 0;
}

static sd_model *load(const char *path) {
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(path, &g, err, sizeof err) != SD_OK) fail_msg("%s: %s", path, err);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_gguf_close(&g);
    return m;
}

static int32_t tok_of(int32_t i) { return (i * 7919 + 13) % VOCAB; }

/* Logits of tokens[from, from + n) at positions from.. in one call, into out. */
static void forward(sd_model *m, sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t from, int32_t n, float *out) {
    static int32_t pos[2 * LEN], sq[2 * LEN];
    static bool want[2 * LEN];
    for (int32_t i = 0; i < n; i++) pos[i] = from + i, sq[i] = seq, want[i] = true;
    sd_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq = sq, .logits = want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
}

/* Logits row p of the sequence on kv equal ref's, bit for bit. */
static void same_row(const float *got, const float *ref, int32_t p, const char *what) {
    if (memcmp(got, ref + (size_t)p * VOCAB, VOCAB * sizeof(float)) != 0)
        fail_msg("%s: logits at position %d differ from the unbounded cache's", what, p);
}

static void test_model_oracle(void **state) {
    (void)state;
    if (!env.ok) skip();
    static int32_t toks[LEN];
    static float ref[LEN * VOCAB], got[LEN * VOCAB];
    for (int32_t i = 0; i < LEN; i++) toks[i] = tok_of(i);
    for (int a = 0; a < 2; a++) {
        sd_model *m = load(env.path[a]);
        const sd_model_config *c = sd_model_config_of(m);
        /* the reference: no window group (every position kept, masked), as many blocks */
        sd_kv_params fp = sd_kv_default_params();
        fp.n_layers = c->n_layers, fp.n_kv_heads = c->n_kv_heads, fp.head_dim = c->head_dim;
        fp.block_size = BS, fp.n_blocks = BLOCKS, fp.max_seqs = 1;
        sd_kv *full = NULL;
        assert_int_equal(sd_kv_create(&fp, &full), SD_OK);
        for (int32_t p = 0; p < LEN; p++) forward(m, full, 0, toks + p, p, 1, ref + (size_t)p * VOCAB);

        sd_kv *kv = NULL;
        assert_int_equal(sd_model_kv_create(m, 2, BLOCKS, BS, &kv), SD_OK);
        assert_int_equal(sd_kv_window(kv), WINDOW);
        assert_true(sd_kv_pool_bytes(kv) < sd_kv_pool_bytes(full));
        printf("%s: KV pools %zu bytes with the window group, %zu without\n", a ? "mistral" : "gemma3",
               sd_kv_pool_bytes(kv), sd_kv_pool_bytes(full));
        const int32_t bound = (WINDOW + SLACK + BS - 1 + 4 + BS - 1) / BS + 1;
        /* another sequence first, so slot 0's main block ids run past the
         * window pools' (a windowed layer read through the main table would
         * leave its pool) */
        forward(m, kv, 1, toks, 0, LEN, got);
        forward(m, kv, 1, toks, LEN, LEN, got);
        /* decode token by token */
        for (int32_t p = 0; p < LEN; p++) {
            forward(m, kv, 0, toks + p, p, 1, got);
            same_row(got, ref, p, "decode");
            assert_true(sd_kv_window_held(kv, 0) <= bound);
        }
        assert_int_equal(sd_kv_check(kv), SD_OK);
        int32_t n_main = 0;
        sd_kv_block_table(kv, 0, &n_main);
        assert_int_equal(n_main, LEN / BS);
        /* speculative steps: the right token and 3 wrong drafts, drafts rolled back */
        sd_kv_release(kv, 0);
        for (int32_t p = 0; p < LEN; p++) {
            int32_t step[4] = {toks[p], (toks[p] + 1) % VOCAB, (toks[p] + 2) % VOCAB, (toks[p] + 3) % VOCAB};
            int32_t n = p + 4 <= LEN ? 4 : 1;
            forward(m, kv, 0, step, p, n, got);
            same_row(got, ref, p, "speculative step");
            assert_int_equal(sd_kv_truncate(kv, 0, p + 1), SD_OK);
            assert_int_equal(sd_kv_seq_len(kv, 0), p + 1);
            assert_true(sd_kv_window_held(kv, 0) <= bound);
        }
        assert_int_equal(sd_kv_check(kv), SD_OK);
        /* a drafter's rollback: 20 wrong tokens one at a time, back 20 */
        sd_kv_release(kv, 0);
        for (int32_t p = 0; p < LEN; p++) {
            forward(m, kv, 0, toks + p, p, 1, got);
            if (p % 60 != 59 || p + 21 > LEN) continue;
            for (int32_t i = 1; i <= 20; i++) {
                int32_t wrong = (toks[p + i] + 5) % VOCAB;
                forward(m, kv, 0, &wrong, p + i, 1, got);
            }
            assert_int_equal(sd_kv_truncate(kv, 0, p + 1), SD_OK);
            assert_int_equal(sd_kv_seq_len(kv, 0), p + 1);
            forward(m, kv, 0, toks + p + 1, p + 1, 1, got);
            same_row(got, ref, p + 1, "drafter rollback");
            assert_int_equal(sd_kv_truncate(kv, 0, p + 1), SD_OK);
        }
        /* deeper than the slack: the slot empties, recomputing is exact */
        assert_int_equal(sd_kv_truncate(kv, 0, LEN - SLACK - WINDOW - 10), SD_OK);
        assert_int_equal(sd_kv_seq_len(kv, 0), 0);
        assert_int_equal(sd_kv_check(kv), SD_OK);
        /* the whole sequence as one prompt (chunked inside) */
        forward(m, kv, 0, toks, 0, LEN, got);
        assert_memory_equal(got, ref, sizeof ref);
        assert_true(sd_kv_window_held(kv, 0) <= bound + 256 / BS);
        /* the prefix cache on it (test_kv_window_prefix has more): the
         * committed sequence's end keeps its window; a prefix whose window
         * left with the one-call prompt's grow is not adopted */
        sd_kv_release(kv, 1);
        assert_int_equal(sd_kv_prefix_enable(kv, 8), SD_OK);
        assert_true(sd_kv_prefix_enabled(kv));
        assert_int_equal(sd_kv_prefix_commit(kv, 0, toks, LEN), SD_OK);
        int32_t adopted = -1;
        assert_int_equal(sd_kv_prefix_adopt(kv, 1, toks, LEN - 1, &adopted), SD_OK);
        assert_int_equal(adopted, (LEN - 1) / BS * BS);
        forward(m, kv, 1, toks + adopted, adopted, LEN - adopted, got);
        assert_memory_equal(got, ref + (size_t)adopted * VOCAB, (size_t)(LEN - adopted) * VOCAB * sizeof(float));
        sd_kv_release(kv, 1);
        assert_int_equal(sd_kv_prefix_adopt(kv, 1, toks, 40, &adopted), SD_OK);
        assert_int_equal(adopted, 0);
        forward(m, kv, 1, toks + adopted, adopted, 40 - adopted, got);
        assert_memory_equal(got, ref + (size_t)adopted * VOCAB, (size_t)(40 - adopted) * VOCAB * sizeof(float));
        assert_int_equal(sd_kv_check(kv), SD_OK);
        sd_kv_free(&kv);
        sd_kv_free(&full);
        sd_model_free(&m);
    }
}

/* Greedy speculative decoding with a long prompt on window-group caches
 * (the first step verifies the whole prompt: longer than a chunk and than
 * the window pools' share of one slot) equals plain greedy decoding on a
 * whole-context cache, with the n-gram drafter and a 1-layer random draft
 * of the same architecture (whose own cache is windowed and rolls back
 * every rejected draft). */
static void test_spec_long_prompt(void **state) {
    (void)state;
    if (!env.ok) skip();
    enum { N_PROMPT = 400, N_NEW = 40, K = 4, CTX = N_PROMPT + N_NEW + 8 };
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0;
    static int32_t ctx[CTX + SD_MAX_K + 1], plain[N_NEW];
    static float logits[N_PROMPT * VOCAB];
    for (int a = 0; a < 2; a++) {
        sd_model *m = load(env.path[a]);
        const sd_model_config *c = sd_model_config_of(m);
        for (int32_t i = 0; i < N_PROMPT; i++) ctx[i] = tok_of(i % 37 + (i / 111) * 5); /* repeats: n-gram drafts */
        /* plain greedy on a whole-context cache */
        sd_kv_params fp = sd_kv_default_params();
        fp.n_layers = c->n_layers, fp.n_kv_heads = c->n_kv_heads, fp.head_dim = c->head_dim;
        fp.block_size = BS, fp.n_blocks = CTX / BS + 2, fp.max_seqs = 1;
        sd_kv *full = NULL;
        assert_int_equal(sd_kv_create(&fp, &full), SD_OK);
        forward(m, full, 0, ctx, 0, N_PROMPT, logits);
        const float *row = logits + (size_t)(N_PROMPT - 1) * VOCAB;
        for (int32_t t = 0; t < N_NEW; t++) {
            int32_t best = 0;
            for (int32_t v = 1; v < VOCAB; v++) best = row[v] > row[best] ? v : best;
            plain[t] = best;
            forward(m, full, 0, &plain[t], N_PROMPT + t, 1, logits);
            row = logits;
        }
        sd_kv_free(&full);
        sd_gguf *g = NULL;
        char err[256];
        assert_int_equal(sd_gguf_open(env.path[a], &g, err, sizeof err), SD_OK);
        sd_tok *tok = NULL;
        assert_int_equal(sd_tok_from_gguf(g, &tok), SD_OK);
        uint64_t hash = sd_tok_vocab_hash(tok);
        sd_tok_free(&tok);
        sd_gguf_close(&g);
        sd_drafter_params dp = sd_drafter_default_params();
        dp.max_ctx = CTX;
        dp.n_threads = 1;
        sd_drafter *drafters[2] = {NULL, NULL};
        assert_int_equal(sd_drafter_ngram_create(&dp, &drafters[0]), SD_OK);
        assert_int_equal(sd_drafter_model_open(env.draft[a], hash, VOCAB, &dp, &drafters[1]), SD_OK);
        for (int d = 0; d < 2; d++) {
            sd_spec_decoder *dec = NULL;
            assert_int_equal(sd_spec_decoder_create(m, drafters[d], CTX, &dec), SD_OK);
            int32_t n = N_PROMPT;
            while (n < N_PROMPT + N_NEW) {
                int32_t stepv[SD_MAX_K + 1], n_step;
                assert_int_equal(sd_spec_decoder_step(dec, ctx, n, K, &greedy, stepv, &n_step, NULL, NULL), SD_OK);
                memcpy(ctx + n, stepv, (size_t)n_step * sizeof *stepv);
                n += n_step;
            }
            assert_memory_equal(plain, ctx + N_PROMPT, sizeof plain);
            printf("%s: greedy spec == plain after a %d-token prompt, %s drafter: %lld drafted, %lld accepted\n",
                   a ? "mistral" : "gemma3", N_PROMPT, sd_drafter_name(drafters[d]),
                   (long long)sd_spec_decoder_stats(dec)->drafted, (long long)sd_spec_decoder_stats(dec)->accepted);
            sd_spec_decoder_free(&dec);
            sd_drafter_free(&drafters[d]);
        }
        sd_model_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bookkeeping),
        cmocka_unit_test_setup_teardown(test_model_oracle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spec_long_prompt, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
