/* test_kv_window_prefix.c — the prefix cache on a cache with a window group
 * (engine/kv_prefix.c, engine/kv_window.c: a cached block's window twin).
 *
 * Bookkeeping with a content oracle (no model): every row a sequence writes
 * holds a hash of its token prefix, in a windowed and a global layer; a
 * randomized run of sequences sharing prefixes (adopting, partial copies on
 * and off), appending, rolling back within the slack, deeper and into the
 * adopted blocks, cancelled while shared, in a window pool small enough
 * that twins are evicted all along: after every call sd_kv_check holds
 * (every window block's reference count equals its holders, no twin held
 * without its main block, no held block free or idle), every row a
 * sequence can still read holds its own prefix's hash (a block freed or
 * rewritten while referenced would show another), and each slot's window
 * blocks stay under the bound; adoption happens, and twins are evicted.
 * A chain end adopted with only its window held; twins evicted oldest
 * first and the exact adoptable prefix after it. Where the pool has room,
 * the same adoptions as a cache without a window group. A prompt grown in
 * chunks before its commit keeps its unregistered entries only up to its
 * share of the pool (the other slots grow to theirs).
 *
 * On random Gemma 3 and Mistral models (window 12, blocks of 4, as
 * test_kv_window): a cold sequence committed and released, then warm
 * sequences adopt prefixes of it (at block boundaries and inside a block,
 * the window reaching back into the shared blocks) and every logit equals
 * the whole-context cache's bit for bit; speculative steps and a drafter's
 * rollback after the adopted point, a rollback past it (into the shared
 * blocks: the slot stops at a block start or empties, and recomputing is
 * exact); then another sequence long enough to evict the twins: a chain is
 * adopted only as far as its window is kept, and warm still equals cold. */
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

#define WINDOW 12
#define BS     4

/* ---- bookkeeping with a content oracle ---- */

enum { SEQS = 4, SLACK = 6, MAXLEN = 160, WBLOCKS = 30, NBLOCKS = 120 };

static uint32_t rng_state = 12345;
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 8) % n;
}

/* The value of a row: a hash of the token prefix up to it (24 bits: exact in a float). */
static float row_value(const int32_t *tok, int32_t pos) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i <= pos; i++) h = (h ^ (uint32_t)tok[i]) * 16777619u;
    return (float)(h & 0xFFFFFF);
}

static sd_kv *make_kv_sized(bool partial, int32_t window, int32_t window_blocks) {
    static const bool windowed[2] = {true, false};
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = 2;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.block_size = BS;
    p.n_blocks = NBLOCKS;
    p.max_seqs = SEQS;
    p.window = window;
    p.windowed = window ? windowed : NULL;
    p.window_slack = SLACK;
    p.window_blocks = window_blocks;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    assert_int_equal(sd_kv_prefix_enable(kv, NBLOCKS / 2), SD_OK);
    assert_true(sd_kv_prefix_enabled(kv));
    assert_int_equal(sd_kv_prefix_set_partial_copy(kv, partial), SD_OK);
    return kv;
}

static sd_kv *make_kv(bool partial) { return make_kv_sized(partial, WINDOW, WBLOCKS); }

static void write_rows(sd_kv *kv, int32_t seq, const int32_t *tok, int32_t from, int32_t to) {
    for (int32_t p = from; p < to; p++)
        for (int32_t l = 0; l < 2; l++) {
            float v = row_value(tok, p), *k = sd_kv_k(kv, l, seq, p), *vv = sd_kv_v(kv, l, seq, p);
            assert_non_null(k);
            assert_non_null(vv);
            k[0] = k[1] = vv[0] = vv[1] = v;
        }
}

/* Every row seq can read holds its prefix's value: all of the global
 * layer's, and the windowed layer's from the next token's window on. */
static void check_rows(sd_kv *kv, int32_t seq, const int32_t *tok) {
    int32_t len = sd_kv_seq_len(kv, seq);
    for (int32_t p = 0; p < len; p++) {
        float want = row_value(tok, p);
        const float *g = sd_kv_k(kv, 1, seq, p);
        if (g[0] != want || g[1] != want) fail_msg("slot %d: global row %d was overwritten", (int)seq, (int)p);
        if (p < len - WINDOW + 1) continue;
        const float *w = sd_kv_k(kv, 0, seq, p), *wv = sd_kv_v(kv, 0, seq, p);
        if (!w || w[0] != want || wv[1] != want)
            fail_msg("slot %d: window row %d lost or overwritten", (int)seq, (int)p);
    }
}

static void run_oracle(bool partial, int32_t *adopted_total, int32_t *evicted_seen) {
    sd_kv *kv = make_kv(partial);
    static int32_t tok[SEQS][MAXLEN + 8];
    const int32_t bound = (WINDOW + SLACK + BS - 1 + 6 + BS - 1) / BS + 1;
    static const int32_t prefixes[3][3] = {{1, 2, 3}, {1, 2, 4}, {7, 7, 7}};
    for (int32_t step = 0; step < 4000; step++) {
        int32_t s = (int32_t)rnd(SEQS), len = sd_kv_seq_len(kv, s), op = (int32_t)rnd(10);
        if (len == 0) { /* a new prompt: a shared prefix, a random tail */
            const int32_t *pre = prefixes[rnd(3)];
            int32_t n = 20 + (int32_t)rnd(60), split = (int32_t)rnd((uint32_t)n);
            for (int32_t i = 0; i < n; i++) tok[s][i] = i < split ? pre[i % 3] + (i / 3) % 5 : 100 + (int32_t)rnd(50);
            int32_t got = 0;
            assert_int_equal(sd_kv_prefix_adopt(kv, s, tok[s], n - 1, &got), SD_OK);
            *adopted_total += got;
            assert_int_equal(sd_kv_seq_len(kv, s), got);
            check_rows(kv, s, tok[s]);
            if (sd_kv_grow(kv, s, n) != SD_OK) {
                sd_kv_release(kv, s);
                continue;
            }
            write_rows(kv, s, tok[s], got, n);
            assert_int_equal(sd_kv_prefix_commit(kv, s, tok[s], n), SD_OK);
        } else if (op < 6 && len + 6 < MAXLEN) { /* a speculative step, rolled back within the slack */
            int32_t add = 1 + (int32_t)rnd(6), keep = len + 1 + (int32_t)rnd((uint32_t)add);
            for (int32_t i = len; i < len + add; i++) tok[s][i] = 100 + (int32_t)rnd(50);
            if (sd_kv_grow(kv, s, len + add) != SD_OK) {
                sd_kv_release(kv, s);
                continue;
            }
            write_rows(kv, s, tok[s], len, len + add);
            assert_int_equal(sd_kv_truncate(kv, s, keep > len + add ? len + add : keep), SD_OK);
            assert_int_equal(sd_kv_prefix_commit(kv, s, tok[s], sd_kv_seq_len(kv, s)), SD_OK);
        } else if (op < 8) { /* a rollback of any depth: into shared blocks too */
            assert_int_equal(sd_kv_truncate(kv, s, (int32_t)rnd((uint32_t)len + 1)), SD_OK);
        } else {
            sd_kv_release(kv, s);
        }
        assert_int_equal(sd_kv_check(kv), SD_OK);
        for (int32_t q = 0; q < SEQS; q++) {
            check_rows(kv, q, tok[q]);
            assert_true(sd_kv_window_held(kv, q) <= bound + (80 + BS - 1) / BS);
        }
        assert_true(sd_kv_window_idle(kv) <= WBLOCKS);
    }
    sd_kv_prefix_stats st;
    sd_kv_prefix_stats_get(kv, &st);
    *evicted_seen = (int32_t)st.twins_evicted;
    for (int32_t q = 0; q < SEQS; q++) sd_kv_release(kv, q);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    assert_int_equal(sd_kv_prefix_enable(kv, 0), SD_OK); /* off: every twin goes back to the free stack */
    assert_int_equal(sd_kv_window_idle(kv), 0);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_free(&kv);
}

static void test_oracle(void **state) {
    (void)state;
    for (int partial = 0; partial < 2; partial++) {
        int32_t adopted = 0, evicted = 0;
        run_oracle(partial, &adopted, &evicted);
        printf("partial copy %s: %d tokens adopted, %d twins evicted\n", partial ? "on" : "off", (int)adopted,
               (int)evicted);
        assert_true(adopted > 1000);
        assert_true(evicted > 0); /* more chains cached than the pool keeps twins of */
    }
}

/* A chain's end keeps its window: a sequence grown to 100 tokens, committed
 * and released; another adopts all of it and holds only its window's
 * blocks; the twins of blocks nobody holds are idle, evicted by a grow that
 * needs the pool, and a chain whose window was evicted is adopted only
 * where its window is whole. */
static void test_adopt_end(void **state) {
    (void)state;
    sd_kv *kv = make_kv(false);
    static int32_t a[120], b[120];
    for (int32_t i = 0; i < 120; i++) a[i] = i % 50, b[i] = 60 + i % 40;
    for (int32_t n = 1; n <= 100; n++) {
        assert_int_equal(sd_kv_grow(kv, 0, n), SD_OK);
        write_rows(kv, 0, a, n - 1, n);
        assert_int_equal(sd_kv_prefix_commit(kv, 0, a, n), SD_OK);
    }
    sd_kv_release(kv, 0);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    assert_int_equal(sd_kv_window_idle(kv), 100 / BS); /* every block's twin, kept while the pool has room */
    int32_t got = 0;
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, a, 101, &got), SD_OK);
    assert_int_equal(got, 100);
    assert_int_equal(sd_kv_window_held(kv, 1), 100 / BS - (100 - WINDOW + 1) / BS); /* the window only */
    check_rows(kv, 1, a);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_release(kv, 1);
    /* another sequence takes the pool: the oldest twins (the chain's head) go first */
    for (int32_t n = 1; n <= 40; n++) {
        assert_int_equal(sd_kv_grow(kv, 2, n), SD_OK);
        write_rows(kv, 2, b, n - 1, n);
    }
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_prefix_stats st;
    sd_kv_prefix_stats_get(kv, &st);
    const int32_t e = (int32_t)st.twins_evicted;
    assert_true(e > 0);
    assert_int_equal(sd_kv_window_idle(kv), 100 / BS - e);
    /* the oldest twins went: the chain's first e blocks' (dropped first as
     * the window slid). A prefix of k blocks is adopted up to the longest n
     * whose next token's window starts at or after block e. */
    for (int32_t k = 1; k <= 100 / BS; k++) {
        int32_t want = 0;
        for (int32_t n = 1; n <= k; n++) {
            int32_t first = n * BS - WINDOW + 1;
            if ((first > 0 ? first / BS : 0) >= e) want = n * BS;
        }
        assert_int_equal(sd_kv_prefix_adopt(kv, 3, a, k * BS + 1, &got), SD_OK);
        if (got != want) fail_msg("a %d-block prefix: %d adopted, %d expected", (int)k, (int)got, (int)want);
        check_rows(kv, 3, a);
        sd_kv_release(kv, 3);
        assert_int_equal(sd_kv_check(kv), SD_OK);
    }
    /* a grow that needs every block the pool has left evicts the rest (none held) */
    assert_int_equal(sd_kv_truncate(kv, 2, 0), SD_OK);
    assert_int_equal(sd_kv_grow(kv, 2, WBLOCKS * BS), SD_OK);
    assert_int_equal(sd_kv_window_idle(kv), 0);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, a, 101, &got), SD_OK);
    assert_int_equal(got, 0);
    sd_kv_free(&kv);
}

/* Where the window pool has room, a window-group cache adopts exactly what
 * a cache without one does: requests one after another (two at a time),
 * each a shared opening cut at and off block boundaries or a conversation
 * grown turn by turn, prefilled in one call or token by token, decoded in
 * speculative steps rolled back within the slack, committed, released. */
static void test_same_as_global(void **state) {
    (void)state;
    for (int partial = 0; partial < 2; partial++) {
        sd_kv *kv[2] = {make_kv_sized(partial, WINDOW, NBLOCKS), make_kv_sized(partial, 0, 0)};
        static int32_t tok[MAXLEN + 8];
        int32_t total = 0;
        rng_state = 777u + (uint32_t)partial;
        for (int32_t r = 0; r < 200; r++) {
            int32_t n = 10 + (int32_t)rnd(60), s = r % 2, gen = 1 + (int32_t)rnd(30);
            for (int32_t i = 0; i < n; i++) /* an opening of 40, then a turn of 12 per r / 3 */
                tok[i] = i < 40 ? i % 7 : i < 40 + 12 * (r / 3 % 3) ? 50 + (i - 40) % 11 : 200 + (int32_t)rnd(9);
            uint32_t saved = rng_state;
            int32_t got[2];
            for (int c = 0; c < 2; c++) {
                rng_state = saved;
                int32_t len;
                assert_int_equal(sd_kv_prefix_adopt(kv[c], s, tok, n - 1, &got[c]), SD_OK);
                if (rnd(2)) { /* a prefill in one call */
                    assert_int_equal(sd_kv_grow(kv[c], s, n), SD_OK);
                } else {
                    for (len = got[c]; len < n; len++) assert_int_equal(sd_kv_grow(kv[c], s, len + 1), SD_OK);
                }
                assert_int_equal(sd_kv_prefix_commit(kv[c], s, tok, n), SD_OK);
                for (len = n; len < n + gen; len++) { /* steps of 4, 3 rolled back */
                    tok[len] = 300 + (int32_t)rnd(5);
                    assert_int_equal(sd_kv_grow(kv[c], s, len + 4), SD_OK);
                    assert_int_equal(sd_kv_truncate(kv[c], s, len + 1), SD_OK);
                    assert_int_equal(sd_kv_prefix_commit(kv[c], s, tok, len + 1), SD_OK);
                }
                assert_int_equal(sd_kv_check(kv[c]), SD_OK);
                sd_kv_release(kv[c], (s + 1) % 2); /* the one before it ends */
            }
            if (got[0] != got[1])
                fail_msg("request %d: %d tokens adopted with the window group, %d without", (int)r, (int)got[0],
                         (int)got[1]);
            total += got[0];
        }
        printf("partial copy %s: %d tokens adopted with and without the window group\n", partial ? "on" : "off",
               (int)total);
        assert_true(total > 200 * 20);
        sd_kv_free(&kv[0]);
        sd_kv_free(&kv[1]);
    }
}

/* A prompt prefilled in chunks before its commit keeps its unregistered
 * window entries only up to its share of the pool (48 / SEQS blocks): every
 * other slot can still grow to its share, and the commit makes the kept
 * entries twins. */
static void test_deferred_share(void **state) {
    (void)state;
    sd_kv *kv = make_kv_sized(false, WINDOW, 48);
    static int32_t a[120];
    const int32_t share = 48 / SEQS;
    for (int32_t i = 0; i < 120; i++) a[i] = 3 + i % 13;
    for (int32_t n = 8; n <= 80; n += 8) {
        assert_int_equal(sd_kv_grow(kv, 0, n), SD_OK);
        write_rows(kv, 0, a, n - 8, n);
        assert_true(sd_kv_window_held(kv, 0) <= share);
        assert_int_equal(sd_kv_check(kv), SD_OK);
    }
    assert_true(sd_kv_window_held(kv, 0) > (WINDOW + SLACK + BS - 1) / BS + 2); /* more than without the cache */
    for (int32_t s = 1; s < SEQS; s++) assert_int_equal(sd_kv_grow(kv, s, share * BS), SD_OK);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    for (int32_t s = 1; s < SEQS; s++) sd_kv_release(kv, s);
    assert_int_equal(sd_kv_prefix_commit(kv, 0, a, 80), SD_OK);
    int32_t held = sd_kv_window_held(kv, 0);
    sd_kv_release(kv, 0);
    assert_int_equal(sd_kv_window_idle(kv), held); /* each kept entry became its block's twin */
    int32_t got = 0;
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, a, 80, &got), SD_OK);
    assert_int_equal(got, 80);
    check_rows(kv, 1, a);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_free(&kv);
}

/* ---- random models: warm equals cold ---- */

#define VOCAB 300
#define LEN   200

static struct {
    char dir[64], path[2][128];
    bool ok;
} env;

static const char *const arch_args[2] = {
    "--arch gemma3 --layers 7 --dim 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --tied",
    "--arch mistral --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128",
};

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-kvwp-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    env.ok = true;
    for (int i = 0; i < 2 && env.ok; i++) {
        snprintf(env.path[i], sizeof env.path[i], "%s/m%d.gguf", env.dir, i);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "'%s' -o '%s' %s --window %d --vocab %d --seed %d >/dev/null 2>&1", SPECD_MKMODEL,
                 env.path[i], arch_args[i], WINDOW, VOCAB, 61 + i);
        env.ok = system(cmd) == 0;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) unlink(env.path[i]);
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

static void forward(sd_model *m, sd_kv *kv, int32_t seq, const int32_t *tokens, int32_t from, int32_t n, float *out) {
    static int32_t pos[2 * LEN], sq[2 * LEN];
    static bool want[2 * LEN];
    for (int32_t i = 0; i < n; i++) pos[i] = from + i, sq[i] = seq, want[i] = true;
    sd_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq = sq, .logits = want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
}

/* Rows [from, to) of out (row 0 = position from) equal ref's. */
static void same_rows(const float *out, const float *ref, int32_t from, int32_t to, const char *what) {
    for (int32_t p = from; p < to; p++)
        if (memcmp(out + (size_t)(p - from) * VOCAB, ref + (size_t)p * VOCAB, VOCAB * sizeof(float)) != 0)
            fail_msg("%s: logits at position %d differ from the cold run's", what, (int)p);
}

/* seq adopts toks[0 .. n - 1) and computes the rest up to n: warm == cold. */
static int32_t warm(sd_model *m, sd_kv *kv, int32_t seq, const int32_t *toks, int32_t n, const float *ref, float *got,
                    const char *what) {
    int32_t adopted = -1;
    assert_int_equal(sd_kv_prefix_adopt(kv, seq, toks, n - 1, &adopted), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, seq), adopted);
    forward(m, kv, seq, toks + adopted, adopted, n - adopted, got);
    same_rows(got, ref, adopted, n, what);
    assert_int_equal(sd_kv_prefix_commit(kv, seq, toks, n), SD_OK);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    return adopted;
}

static void test_warm_equals_cold(void **state) {
    (void)state;
    if (!env.ok) skip();
    static int32_t toks[LEN], other[3 * LEN];
    static float ref[LEN * VOCAB], got[LEN * VOCAB];
    for (int32_t i = 0; i < LEN; i++) toks[i] = tok_of(i);
    for (int32_t i = 0; i < 3 * LEN; i++) other[i] = tok_of(3 * i + 1000);
    for (int a = 0; a < 2; a++) {
        sd_model *m = load(env.path[a]);
        const sd_model_config *c = sd_model_config_of(m);
        sd_kv_params fp = sd_kv_default_params(); /* the reference: no window group */
        fp.n_layers = c->n_layers, fp.n_kv_heads = c->n_kv_heads, fp.head_dim = c->head_dim;
        fp.block_size = BS, fp.n_blocks = LEN / BS + 2, fp.max_seqs = 1;
        sd_kv *full = NULL;
        assert_int_equal(sd_kv_create(&fp, &full), SD_OK);
        for (int32_t p = 0; p < LEN; p++) forward(m, full, 0, toks + p, p, 1, ref + (size_t)p * VOCAB);
        sd_kv_free(&full);

        for (int partial = 0; partial < 2; partial++) {
            sd_kv *kv = NULL;
            assert_int_equal(sd_model_kv_create(m, 2, 4 * LEN / BS, BS, &kv), SD_OK);
            assert_int_equal(sd_kv_window(kv), WINDOW);
            assert_int_equal(sd_kv_prefix_enable(kv, 2 * LEN / BS), SD_OK);
            assert_true(sd_kv_prefix_enabled(kv));
            assert_int_equal(sd_kv_prefix_set_partial_copy(kv, partial), SD_OK);
            /* cold: token by token, committed as a verifier does */
            for (int32_t p = 0; p < LEN; p++) {
                forward(m, kv, 0, toks + p, p, 1, got);
                same_rows(got, ref, p, p + 1, "cold");
                assert_int_equal(sd_kv_prefix_commit(kv, 0, toks, p + 1), SD_OK);
            }
            sd_kv_release(kv, 0);
            /* warm: prefixes ending at and inside blocks, the window reaching into shared blocks */
            static const int32_t ends[] = {LEN, 101, 42, 43, 14, 9};
            for (size_t e = 0; e < sizeof ends / sizeof ends[0]; e++) {
                int32_t n = ends[e], want = (n - 1) / BS * BS + (partial ? (n - 1) % BS : 0);
                int32_t adopted = warm(m, kv, 1, toks, n, ref, got, "warm");
                if (adopted != want)
                    fail_msg("%d-token prompt: %d adopted, %d expected", (int)n, (int)adopted, (int)want);
                assert_true(sd_kv_window_held(kv, 1) <= (WINDOW + BS - 1) / BS + 2);
                sd_kv_release(kv, 1);
            }
            /* speculative steps after the adopted point: 3 wrong drafts rolled back */
            int32_t adopted = warm(m, kv, 1, toks, 81, ref, got, "warm before steps");
            assert_int_equal(adopted, 80);
            for (int32_t p = 81; p < 120; p++) {
                int32_t step[4] = {toks[p], (toks[p] + 1) % VOCAB, (toks[p] + 2) % VOCAB, (toks[p] + 3) % VOCAB};
                forward(m, kv, 1, step, p, 4, got);
                same_rows(got, ref, p, p + 1, "step after adoption");
                assert_int_equal(sd_kv_truncate(kv, 1, p + 1), SD_OK);
                assert_int_equal(sd_kv_prefix_commit(kv, 1, toks, p + 1), SD_OK);
                assert_int_equal(sd_kv_check(kv), SD_OK);
            }
            /* a rollback past the adopted point, into the shared blocks: the
             * slot stops at a block start or empties; recomputing is exact */
            assert_int_equal(sd_kv_prefix_adopt(kv, 0, toks, 150, &adopted), SD_OK);
            assert_true(adopted >= 120 / BS * BS);
            assert_int_equal(sd_kv_truncate(kv, 1, 70), SD_OK);
            int32_t kept = sd_kv_seq_len(kv, 1);
            assert_true(kept <= 70 && kept % BS == 0);
            forward(m, kv, 1, toks + kept, kept, 120 - kept, got);
            same_rows(got, ref, kept, 120, "after a rollback into shared blocks");
            assert_int_equal(sd_kv_check(kv), SD_OK);
            sd_kv_release(kv, 0);
            sd_kv_release(kv, 1);
            /* another sequence long enough to evict twins: adoption only as
             * far as a window is kept, warm still equals cold */
            sd_kv_prefix_stats st0, st1;
            sd_kv_prefix_stats_get(kv, &st0);
            for (int32_t p = 0; p < 3 * LEN; p += 8) {
                forward(m, kv, 0, other + p, p, 8, got);
                assert_int_equal(sd_kv_prefix_commit(kv, 0, other, p + 8), SD_OK);
            }
            sd_kv_release(kv, 0);
            assert_int_equal(sd_kv_check(kv), SD_OK);
            sd_kv_prefix_stats_get(kv, &st1);
            assert_true(st1.twins_evicted > st0.twins_evicted);
            int32_t after = warm(m, kv, 1, toks, LEN, ref, got, "warm after eviction");
            printf("%s, partial copy %s: after eviction a %d-token prompt adopted %d\n", a ? "mistral" : "gemma3",
                   partial ? "on" : "off", LEN, (int)after);
            sd_kv_release(kv, 1);
            assert_int_equal(sd_kv_check(kv), SD_OK);
            sd_kv_free(&kv);
        }
        sd_model_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle),
        cmocka_unit_test(test_adopt_end),
        cmocka_unit_test(test_same_as_global),
        cmocka_unit_test(test_deferred_share),
        cmocka_unit_test_setup_teardown(test_warm_equals_cold, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
