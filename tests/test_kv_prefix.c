/* test_kv_prefix.c — the KV cache's prefix cache (engine/kv_prefix.c).
 *
 * Bookkeeping: adoption of a committed chain, a prompt ending exactly at a
 * block boundary, truncation into a shared block stopping at its start,
 * eviction (idle blocks count as free; the bound holds), the forced hash
 * collision (different prompts, every hash equal: nothing wrong adopted).
 * On a small random model (CPU, f32 and f16 KV): warm equals cold bit for
 * bit, with and without forced collisions; and a randomized run of many
 * sequences sharing prefixes and diverging at random points (at and inside
 * block boundaries), with speculative rollbacks that cross into shared
 * blocks, cancellations while blocks are shared and a pool small enough to
 * evict: every computed row's logits equal the sequence's cold run, and
 * sd_kv_check (no block freed while referenced) holds after every step. */
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

enum { BS = 4 };

static sd_kv *make_kv(int32_t n_blocks, int32_t max_seqs, int32_t max_idle, bool collide) {
    sd_kv_params p = sd_kv_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.block_size = BS;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    p.prefix_hash_collide = collide;
    sd_kv *kv = NULL;
    assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    assert_int_equal(sd_kv_prefix_enable(kv, max_idle), SD_OK);
    return kv;
}

/* grow seq to n tokens and commit them */
static void fill(sd_kv *kv, int32_t seq, const int32_t *tok, int32_t n) {
    assert_int_equal(sd_kv_grow(kv, seq, n), SD_OK);
    assert_int_equal(sd_kv_prefix_commit(kv, seq, tok, n), SD_OK);
    assert_int_equal(sd_kv_check(kv), SD_OK);
}

static void test_adopt_and_boundary(void **state) {
    (void)state;
    sd_kv *kv = make_kv(16, 3, 16, false);
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, got = -1;
    fill(kv, 0, a, 10); /* blocks 0, 1 full and cached; block 2 partial */
    sd_kv_prefix_stats st;
    sd_kv_prefix_stats_get(kv, &st);
    assert_int_equal(st.blocks_cached, 2);
    /* a prompt of exactly 2 blocks: both adopted (the caller keeps the last
     * token out when it needs its logits: then 1 block) */
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, a, 8, &got), SD_OK);
    assert_int_equal(got, 8);
    assert_int_equal(sd_kv_seq_len(kv, 1), 8);
    assert_int_equal(sd_kv_prefix_adopt(kv, 2, a, 7, &got), SD_OK);
    assert_int_equal(got, 4);
    int32_t n0, n1;
    const int32_t *t0 = sd_kv_block_table(kv, 0, &n0), *t1 = sd_kv_block_table(kv, 1, &n1);
    assert_int_equal(t0[0], t1[0]);
    assert_int_equal(t0[1], t1[1]);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    /* a different second block: only the first adopted */
    sd_kv_release(kv, 2);
    int32_t b[8] = {1, 2, 3, 4, 5, 6, 7, 9};
    assert_int_equal(sd_kv_prefix_adopt(kv, 2, b, 8, &got), SD_OK);
    assert_int_equal(got, 4);
    /* truncating into a shared block stops at its start */
    assert_int_equal(sd_kv_truncate(kv, 1, 6), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, 1), 4);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_prefix_stats_get(kv, &st);
    assert_int_equal(st.hit_tokens, 8 + 4 + 4);
    assert_int_equal(st.query_tokens, 8 + 7 + 8);
    sd_kv_free(&kv);
}

static void test_eviction(void **state) {
    (void)state;
    sd_kv *kv = make_kv(8, 2, 6, false);
    int32_t a[32];
    for (int i = 0; i < 32; i++) a[i] = 100 + i;
    fill(kv, 0, a, 24); /* 6 blocks, all cached */
    sd_kv_release(kv, 0);
    assert_int_equal(sd_kv_n_free_blocks(kv), 8);
    sd_kv_prefix_stats st;
    sd_kv_prefix_stats_get(kv, &st);
    assert_int_equal(st.blocks_idle, 6);
    /* a cold request of the whole pool: never refused because of the cache */
    assert_int_equal(sd_kv_grow(kv, 1, 32), SD_OK);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_prefix_stats_get(kv, &st);
    assert_int_equal(st.blocks_cached, 0);
    assert_int_equal(st.blocks_evicted, 6);
    sd_kv_release(kv, 1);
    /* the bound: at most 2 idle blocks, the tail evicted first */
    assert_int_equal(sd_kv_prefix_enable(kv, 2), SD_OK);
    fill(kv, 0, a, 16);
    sd_kv_release(kv, 0);
    sd_kv_prefix_stats_get(kv, &st);
    assert_int_equal(st.blocks_idle, 2);
    int32_t got = -1;
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, a, 16, &got), SD_OK);
    assert_int_equal(got, 8); /* the chain's head survived */
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_free(&kv);
}

static void test_forced_collision_bookkeeping(void **state) {
    (void)state;
    sd_kv *kv = make_kv(16, 3, 16, true);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 4, 5, 6, 7, 0}, c[8] = {5, 6, 7, 8, 1, 2, 3, 4};
    fill(kv, 0, a, 8);
    int32_t got = -1;
    assert_int_equal(sd_kv_prefix_adopt(kv, 1, b, 8, &got), SD_OK);
    assert_int_equal(got, 4);
    /* c's second block has a's first block's tokens, under another parent */
    assert_int_equal(sd_kv_prefix_adopt(kv, 2, c, 8, &got), SD_OK);
    assert_int_equal(got, 0);
    assert_int_equal(sd_kv_check(kv), SD_OK);
    sd_kv_free(&kv);
}

/* ------------------------------------------------------- a small model */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

enum { V = 48, E = 32, H = 4, KVH = 2, FF = 64, LAYERS = 2 };

static void add_tensor(sd_gguf_writer *w, const char *name, uint64_t ne0, uint64_t ne1, float center, float amp,
                       uint64_t seed) {
    uint64_t ne[2] = {ne0, ne1}, n = ne0 * (ne1 ? ne1 : 1);
    float *data = malloc(n * sizeof *data);
    assert_non_null(data);
    for (uint64_t i = 0; i < n; i++) data[i] = center + amp * ((float)(rng_next(&seed) >> 40) / 16777216.0f - 0.5f);
    assert_int_equal(sd_gguf_writer_add_tensor(w, name, SD_DTYPE_F32, ne1 ? 2 : 1, ne, data), SD_OK);
    free(data);
}

static sd_gguf *make_model_file(void) {
    sd_gguf_writer *w = sd_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(sd_gguf_writer_set_str(w, "general.architecture", "llama"), SD_OK);
    const struct {
        const char *key;
        uint32_t v;
    } u[] = {{"llama.context_length", 256},          {"llama.embedding_length", E},
             {"llama.block_count", LAYERS},          {"llama.feed_forward_length", FF},
             {"llama.attention.head_count", H},      {"llama.vocab_size", V},
             {"llama.attention.head_count_kv", KVH}, {"llama.rope.dimension_count", E / H}};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
        assert_int_equal(sd_gguf_writer_set_u32(w, u[i].key, u[i].v), SD_OK);
    assert_int_equal(sd_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), SD_OK);
    assert_int_equal(sd_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f), SD_OK);
    uint64_t seed = 0x5EEDull;
    add_tensor(w, "token_embd.weight", E, V, 0.0f, 2.0f, seed++);
    add_tensor(w, "output_norm.weight", E, 0, 1.0f, 0.4f, seed++);
    const uint64_t KD = KVH * (E / H);
    char name[64];
    for (int l = 0; l < LAYERS; l++) {
        const struct {
            const char *suffix;
            uint64_t ne0, ne1;
            float c, a;
        } t[] = {{"attn_norm", E, 0, 1.0f, 0.4f}, {"attn_q", E, E, 0.0f, 0.7f},       {"attn_k", E, KD, 0.0f, 0.7f},
                 {"attn_v", E, KD, 0.0f, 0.35f},  {"attn_output", E, E, 0.0f, 0.35f}, {"ffn_norm", E, 0, 1.0f, 0.4f},
                 {"ffn_gate", E, FF, 0.0f, 0.7f}, {"ffn_up", E, FF, 0.0f, 0.35f},     {"ffn_down", FF, E, 0.0f, 0.25f}};
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[i].suffix);
            add_tensor(w, name, t[i].ne0, t[i].ne1, t[i].c, t[i].a, seed++);
        }
    }
    char path[] = "/tmp/specd_test_kv_prefix_XXXXXX";
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

typedef struct fixture {
    sd_gguf *g;
    sd_model *m;
} fixture;

static fixture load(sd_dtype kv_type) {
    fixture f = {make_model_file(), NULL};
    sd_model_params p = sd_model_default_params();
    p.n_threads = 1;
    p.kv_type = kv_type;
    assert_int_equal(sd_model_load(f.g, &p, &f.m), SD_OK);
    return f;
}

static void unload(fixture *f) {
    sd_model_free(&f->m);
    sd_gguf_close(&f->g);
}

/* Appends tok[from .. to) of seq to kv in one forward; logits of every row
 * into out[(from..to) * V]. */
static sd_status extend(sd_model *m, sd_kv *kv, int32_t seq, const int32_t *tok, int32_t from, int32_t to, float *out) {
    int32_t n = to - from, pos[256], sq[256];
    bool want[256];
    assert_true(n > 0 && n <= 256);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = from + i;
        sq[i] = seq;
        want[i] = true;
    }
    sd_batch b = {.n_tokens = n, .tokens = tok + from, .pos = pos, .seq = sq, .logits = want};
    return sd_model_forward(m, kv, &b, out + (size_t)from * V);
}

/* Cold logits of tok[0 .. n) on a fresh cache: [n][V], caller frees. */
static float *cold(sd_model *m, const int32_t *tok, int32_t n) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 64, BS, &kv), SD_OK);
    float *out = malloc((size_t)n * V * sizeof *out);
    assert_non_null(out);
    assert_int_equal(extend(m, kv, 0, tok, 0, n, out), SD_OK);
    sd_kv_free(&kv);
    return out;
}

static void warm_equals_cold(sd_dtype type, bool collide, bool partial) {
    fixture f = load(type);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(f.m, 2, 32, BS, &kv), SD_OK);
    if (collide) {
        /* a second cache, made like sd_model_kv_create's but colliding */
        sd_kv_params p = *sd_kv_params_of(kv);
        p.prefix_hash_collide = true;
        sd_kv_free(&kv);
        assert_int_equal(sd_kv_create(&p, &kv), SD_OK);
    }
    assert_int_equal(sd_kv_prefix_enable(kv, 32), SD_OK);
    assert_int_equal(sd_kv_prefix_set_partial_copy(kv, partial), SD_OK);
    /* a shares 13 tokens with b (3 whole blocks and one inside the 4th);
     * c has b's second block under another first block (collides, must miss) */
    int32_t a[24], b[22], c[22];
    for (int i = 0; i < 24; i++) a[i] = (7 * i + 3) % V;
    for (int i = 0; i < 22; i++) b[i] = i < 13 ? a[i] : (5 * i + 1) % V;
    for (int i = 0; i < 22; i++) c[i] = i < 4 ? (a[i] + 1) % V : b[i];
    float *la = malloc(24 * V * sizeof *la), *lb = malloc(22 * V * sizeof *lb);
    assert_non_null(la);
    assert_non_null(lb);
    assert_int_equal(extend(f.m, kv, 0, a, 0, 24, la), SD_OK);
    assert_int_equal(sd_kv_prefix_commit(kv, 0, a, 24), SD_OK);
    sd_kv_release(kv, 0);
    const int32_t *prompts[2] = {b, c};
    for (int k = 0; k < 2; k++) {
        int32_t got = -1;
        assert_int_equal(sd_kv_prefix_adopt(kv, 1, prompts[k], 21, &got), SD_OK);
        assert_int_equal(extend(f.m, kv, 1, prompts[k], got, 22, lb), SD_OK);
        float *ref = cold(f.m, prompts[k], 22);
        assert_memory_equal(lb + (size_t)got * V, ref + (size_t)got * V, (size_t)(22 - got) * V * sizeof *ref);
        free(ref);
        assert_int_equal(got, k == 0 ? (partial ? 13 : 12) : 0);
        assert_int_equal(sd_kv_prefix_commit(kv, 1, prompts[k], 22), SD_OK);
        assert_int_equal(sd_kv_check(kv), SD_OK);
        sd_kv_release(kv, 1);
    }
    free(la);
    free(lb);
    sd_kv_free(&kv);
    unload(&f);
}

static void test_warm_equals_cold_f32(void **state) {
    (void)state;
    warm_equals_cold(SD_DTYPE_F32, false, false);
    warm_equals_cold(SD_DTYPE_F32, false, true);
}

static void test_warm_equals_cold_f16(void **state) {
    (void)state;
    warm_equals_cold(SD_DTYPE_F16, false, false);
    warm_equals_cold(SD_DTYPE_F16, false, true);
}

static void test_warm_equals_cold_forced_collision(void **state) {
    (void)state;
    warm_equals_cold(SD_DTYPE_F32, true, false);
    warm_equals_cold(SD_DTYPE_F32, true, true);
}

/* ------------------------------------------------------ the randomized run */

enum { R_SLOTS = 4, R_POOL = 36, R_MAXLEN = 40, R_BASE = 24, R_STEPS = 400 };

typedef struct rseq {
    bool active;
    int32_t n, len; /* target length, tokens computed */
    int32_t tok[R_MAXLEN + 8];
    float *ref; /* [n][V] cold logits */
} rseq;

typedef struct rstate {
    sd_model *m;
    sd_kv *kv;
    uint64_t rng;
    int32_t base[3][R_BASE];
    rseq s[R_SLOTS];
    float *out; /* [R_MAXLEN + 8][V] */
    int n_stopped_early, n_out_of_blocks, n_cancel_shared;
} rstate;

static int32_t rnd(rstate *r, int32_t n) { return (int32_t)(rng_next(&r->rng) % (uint64_t)n); }

static void end_seq(rstate *r, int32_t i) {
    sd_kv_release(r->kv, i);
    free(r->s[i].ref);
    r->s[i].ref = NULL;
    r->s[i].active = false;
}

/* The rows [from, to) of out must equal seq i's cold run. */
static void check_rows(rstate *r, int32_t i, int32_t from, int32_t to) {
    size_t off = (size_t)from * V, n = (size_t)(to - from) * V;
    if (to > from && memcmp(r->out + off, r->s[i].ref + off, n * sizeof(float)) != 0)
        fail_msg("slot %d: logits of rows [%d, %d) differ from the cold run", (int)i, (int)from, (int)to);
}

/* A forward refused for want of blocks must really lack them. */
static bool forward_or_refused(rstate *r, int32_t i, const int32_t *tok, int32_t from, int32_t to) {
    int32_t need = (to + BS - 1) / BS - (from + BS - 1) / BS;
    sd_status st = extend(r->m, r->kv, i, tok, from, to, r->out);
    if (st == SD_ERR_OUT_OF_BLOCKS) {
        assert_true(need > sd_kv_n_free_blocks(r->kv));
        r->n_out_of_blocks++;
        end_seq(r, i);
        return false;
    }
    assert_int_equal(st, SD_OK);
    return true;
}

static void start_seq(rstate *r, int32_t i) {
    rseq *s = &r->s[i];
    s->n = 8 + rnd(r, R_MAXLEN - 8 + 1);
    int32_t diverge = rnd(r, R_BASE + 1), which = rnd(r, 3);
    for (int32_t t = 0; t < s->n; t++) s->tok[t] = t < diverge ? r->base[which][t] : rnd(r, V);
    s->ref = cold(r->m, s->tok, s->n);
    s->active = true;
    int32_t got = 0;
    assert_int_equal(sd_kv_prefix_adopt(r->kv, i, s->tok, s->n - 1, &got), SD_OK);
    assert_true(got <= s->n - 1);
    s->len = got;
}

/* One verify-like step: a accepted tokens and w wrong drafts, rolled back. */
static void spec_step(rstate *r, int32_t i) {
    rseq *s = &r->s[i];
    int32_t a = rnd(r, 4), w = 1 + rnd(r, 3);
    if (s->len + a > s->n) a = s->n - s->len;
    int32_t tmp[R_MAXLEN + 8];
    memcpy(tmp, s->tok, (size_t)(s->len + a) * sizeof *tmp);
    for (int32_t j = 0; j < w; j++) tmp[s->len + a + j] = (s->tok[s->len + a < s->n ? s->len + a : 0] + 1 + j) % V;
    if (!forward_or_refused(r, i, tmp, s->len, s->len + a + w)) return;
    check_rows(r, i, s->len, s->len + a);
    assert_int_equal(sd_kv_truncate(r->kv, i, s->len + a), SD_OK);
    assert_int_equal(sd_kv_seq_len(r->kv, i), s->len + a); /* the drafts sat in private blocks */
    s->len += a;
    assert_int_equal(sd_kv_prefix_commit(r->kv, i, s->tok, s->len), SD_OK);
}

static void random_op(rstate *r) {
    int32_t i = rnd(r, R_SLOTS);
    rseq *s = &r->s[i];
    if (!s->active) {
        start_seq(r, i);
        return;
    }
    int32_t op = rnd(r, 10);
    if (s->len == s->n || op == 0) { /* done, or cancelled (maybe mid-prefill, its blocks shared) */
        int32_t nb = 0;
        const int32_t *t = sd_kv_block_table(r->kv, i, &nb);
        for (int32_t j = 0; j < R_SLOTS; j++) {
            int32_t mb = 0;
            const int32_t *u = j != i && r->s[j].active ? sd_kv_block_table(r->kv, j, &mb) : NULL;
            if (nb > 0 && mb > 0 && t[0] == u[0]) r->n_cancel_shared++;
        }
        end_seq(r, i);
    } else if (op <= 4) { /* a prefill chunk */
        int32_t to = s->len + 1 + rnd(r, 8);
        if (to > s->n) to = s->n;
        if (!forward_or_refused(r, i, s->tok, s->len, to)) return;
        check_rows(r, i, s->len, to);
        s->len = to;
        assert_int_equal(sd_kv_prefix_commit(r->kv, i, s->tok, s->len), SD_OK);
    } else if (op <= 8) {
        spec_step(r, i);
    } else { /* a deep rollback, maybe into shared blocks */
        int32_t to = rnd(r, s->len + 1);
        assert_int_equal(sd_kv_truncate(r->kv, i, to), SD_OK);
        int32_t now = sd_kv_seq_len(r->kv, i);
        assert_true(now <= to && now >= to / BS * BS);
        if (now < to) r->n_stopped_early++;
        s->len = now;
    }
}

static void randomized(sd_dtype type, bool partial) {
    fixture f = load(type);
    rstate r = {.m = f.m, .rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)type};
    assert_int_equal(sd_model_kv_create(f.m, R_SLOTS, R_POOL, BS, &r.kv), SD_OK);
    assert_int_equal(sd_kv_prefix_enable(r.kv, R_POOL / 2), SD_OK);
    assert_int_equal(sd_kv_prefix_set_partial_copy(r.kv, partial), SD_OK);
    r.out = malloc((size_t)(R_MAXLEN + 8) * V * sizeof *r.out);
    assert_non_null(r.out);
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < R_BASE; t++) r.base[b][t] = rnd(&r, V);
    for (int step = 0; step < R_STEPS; step++) {
        random_op(&r);
        assert_int_equal(sd_kv_check(r.kv), SD_OK);
    }
    for (int32_t i = 0; i < R_SLOTS; i++)
        if (r.s[i].active) end_seq(&r, i);
    sd_kv_prefix_stats st;
    sd_kv_prefix_stats_get(r.kv, &st);
    print_message("randomized (%s KV, partial blocks %s): %llu of %llu prompt tokens hit, %llu blocks evicted, %d "
                  "rollbacks stopped at a "
                  "shared block, %d cancellations while shared, %d grows refused\n",
                  sd_dtype_name(type), partial ? "copied" : "recomputed", (unsigned long long)st.hit_tokens,
                  (unsigned long long)st.query_tokens, (unsigned long long)st.blocks_evicted, r.n_stopped_early,
                  r.n_cancel_shared, r.n_out_of_blocks);
    /* the run must have exercised what it claims to */
    assert_true(st.hit_tokens > 0);
    assert_true(st.blocks_evicted > 0);
    assert_true(r.n_stopped_early > 0);
    assert_true(r.n_cancel_shared > 0);
    assert_int_equal(sd_kv_check(r.kv), SD_OK);
    free(r.out);
    sd_kv_free(&r.kv);
    unload(&f);
}

static void test_randomized_f32(void **state) {
    (void)state;
    randomized(SD_DTYPE_F32, false);
    randomized(SD_DTYPE_F32, true);
}

static void test_randomized_f16(void **state) {
    (void)state;
    randomized(SD_DTYPE_F16, false);
    randomized(SD_DTYPE_F16, true);
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_ERROR, "test_kv_prefix");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adopt_and_boundary),
        cmocka_unit_test(test_eviction),
        cmocka_unit_test(test_forced_collision_bookkeeping),
        cmocka_unit_test(test_warm_equals_cold_f32),
        cmocka_unit_test(test_warm_equals_cold_f16),
        cmocka_unit_test(test_warm_equals_cold_forced_collision),
        cmocka_unit_test(test_randomized_f32),
        cmocka_unit_test(test_randomized_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
