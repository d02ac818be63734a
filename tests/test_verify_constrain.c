/* test_verify_constrain.c — the verifier under a constraint (VerifySeq.
 * constraint, verifier/verify_constrain.c), on a small random model
 * (specd-mkmodel): steps driven by hand through sd_verifier_handle, with
 * one-hot drafts that are sometimes the constrained plain output and
 * sometimes random tokens (mostly outside the language), commit exactly
 * the tokens of constrained plain decoding, greedy and seeded; a slot
 * released mid-way (the coordinator resends the whole prefix) replays the
 * constraint over the generated tokens and goes on the same; a generated
 * token the constraint does not allow is BAD_REQUEST; a verifier without
 * a tokenizer refuses constrained sequences; the grammar is compiled once
 * for all the steps (cache hits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specd/constrain.h"
#include "specd/gguf.h"
#include "specd/sample.h"
#include "verify_constrain.h"
#include "verify_serve.h"

#define VOCAB    600
#define N_NEW    40
#define N_PROMPT 8
#define MAX_CTX  256

static const char *const RE = "(ab|cd)+ [a-z]{2,8}\\.";

static struct {
    char dir[64], path[128];
    bool ok;
    sd_model *model;
    sd_tok *tok;
    sd_cvocab *vocab;
    sd_grammar *gr;
} env;

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-vcon-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 2 --vocab %d --seed 35 >/dev/null 2>&1", SPECD_MKMODEL, env.path,
             VOCAB);
    env.ok = system(cmd) == 0;
    if (!env.ok) return 0;
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(env.path, &g, err, sizeof err) != SD_OK) return -1;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    sd_status st = sd_model_load(g, &mp, &env.model);
    if (st == SD_OK) st = sd_tok_from_gguf(g, &env.tok);
    if (st == SD_OK) st = sd_cvocab_create(env.tok, &env.vocab);
    if (st == SD_OK) st = sd_grammar_from_regex(RE, strlen(RE), NULL, &env.gr, err, sizeof err);
    sd_gguf_close(&g);
    return st == SD_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    sd_grammar_free(&env.gr);
    sd_cvocab_free(&env.vocab);
    sd_tok_free(&env.tok);
    sd_model_free(&env.model);
    unlink(env.path);
    rmdir(env.dir);
    return 0;
}

/* Constrained plain decoding after prompt: the reference. Returns the count. */
static int32_t plain(const int32_t *prompt, const sd_sampling *s, int32_t *out) {
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(env.gr, env.vocab, &c), SD_OK);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(env.model, 1, MAX_CTX / 16 + 2, 16, &kv), SD_OK);
    static float logits[VOCAB];
    int32_t pos[MAX_CTX], seq[MAX_CTX] = {0};
    bool want[MAX_CTX] = {false};
    for (int32_t i = 0; i < N_PROMPT; i++) pos[i] = i;
    want[N_PROMPT - 1] = true;
    sd_batch b = {N_PROMPT, prompt, pos, seq, want};
    assert_int_equal(sd_model_forward(env.model, kv, &b, logits), SD_OK);
    int32_t n = 0;
    while (n < N_NEW) {
        int32_t p = N_PROMPT + n;
        assert_int_equal(sd_constraint_apply(c, logits, VOCAB), SD_OK);
        assert_int_equal(sd_sample_token(logits, VOCAB, s, (uint64_t)p, &out[n]), SD_OK);
        assert_int_equal(sd_constraint_advance(c, out[n]), SD_OK);
        if (sd_tok_is_eog(env.tok, out[n++])) break;
        bool one = true;
        sd_batch step = {1, &out[n - 1], &p, seq, &one};
        assert_int_equal(sd_model_forward(env.model, kv, &step, logits), SD_OK);
    }
    sd_kv_free(&kv);
    sd_constraint_free(&c);
    return n;
}

static sd_verifier *make_verifier(const sd_tok *tok) {
    sd_verifier_params p = sd_verifier_default_params();
    p.max_seqs = 4;
    p.kv_blocks = 64;
    p.max_ctx = MAX_CTX;
    p.tok = tok;
    sd_verifier *v = NULL;
    assert_int_equal(sd_verifier_create(env.model, &p, &v), SD_OK);
    return v;
}

/* One verify step of request 1: tokens[keep..n) appended, drafts[k] with
 * one-hot q. The result (borrowed from v). */
static const Specd__VerifyResult *step(sd_verifier *v, const int32_t *tokens, int32_t keep, int32_t n,
                                       const int32_t *draft, int32_t k, const sd_sampling *s, bool constrained) {
    static uint64_t step_id;
    Specd__Sampling smp = SPECD__SAMPLING__INIT;
    sd_net_sampling_to_pb(s, &smp);
    Specd__Constraint con = SPECD__CONSTRAINT__INIT;
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX;
    con.text = (char *)RE;
    Specd__SparseDist q[SD_MAX_K], *pq[SD_MAX_K];
    float one = 1.0f;
    for (int32_t i = 0; i < k; i++) {
        specd__sparse_dist__init(&q[i]);
        q[i].n_ids = q[i].n_probs = 1;
        q[i].ids = (int32_t *)&draft[i];
        q[i].probs = &one;
        pq[i] = &q[i];
    }
    Specd__VerifySeq vs = SPECD__VERIFY_SEQ__INIT, *pvs = &vs;
    vs.request_id = 1;
    vs.keep_len = (uint32_t)keep;
    vs.n_append = (size_t)(n - keep);
    vs.append = (int32_t *)tokens + keep;
    vs.n_draft = vs.n_q = (size_t)k;
    vs.draft = (int32_t *)draft;
    vs.q = pq;
    vs.sampling = &smp;
    vs.prompt_len = N_PROMPT;
    if (constrained) vs.constraint = &con;
    Specd__VerifyRequest req = SPECD__VERIFY_REQUEST__INIT;
    req.step_id = ++step_id;
    req.n_seqs = 1;
    req.seqs = &pvs;
    static Specd__VerifyResponse resp;
    static sd_net_verify_step step;
    sd_net_verify_step_of(&req, &step);
    assert_int_equal(sd_verifier_handle(v, &step, &resp), SD_OK);
    assert_int_equal(resp.n_results, 1);
    return resp.results[0];
}

/* The service's loop for one sequence; drafts alternate between the
 * reference's next tokens and random ones; the slot is released once
 * (resent whole). Returns the tokens generated. */
static int32_t serve(sd_verifier *v, const int32_t *prompt, const int32_t *ref, int32_t n_ref, const sd_sampling *s,
                     int32_t *out) {
    int32_t tokens[MAX_CTX];
    memcpy(tokens, prompt, N_PROMPT * sizeof *tokens);
    int32_t n = N_PROMPT, keep = 0, steps = 0;
    uint64_t rng = 99;
    bool released = false;
    while (n - N_PROMPT < N_NEW && !(n > N_PROMPT && sd_tok_is_eog(env.tok, tokens[n - 1]))) {
        int32_t draft[4], k = 0, gen = n - N_PROMPT;
        for (; k < 3 && gen + k < n_ref && gen + k + 1 < N_NEW; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            draft[k] = steps % 3 == 1 ? (int32_t)((rng >> 33) % VOCAB) : ref[gen + k];
        }
        if (steps % 3 == 2) k = 0; /* a plain step */
        const Specd__VerifyResult *r = step(v, tokens, keep, n, draft, k, s, true);
        assert_int_equal(r->code, SPECD__CODE__CODE_OK);
        /* as the coordinator: nothing after an end-of-generation token (the
         * verifier samples one more after a drafted one, unmasked: unused) */
        for (size_t i = 0; i < r->n_commit && n - N_PROMPT < N_NEW; i++) {
            tokens[n++] = r->commit[i];
            if (sd_tok_is_eog(env.tok, r->commit[i])) break;
        }
        keep = (int32_t)r->cached_len;
        steps++;
        if (!released && n - N_PROMPT >= N_NEW / 3) { /* the coordinator lost track: resend everything */
            uint64_t id = 1;
            sd_verifier_release(v, &id, 1);
            keep = 0;
            released = true;
        }
    }
    memcpy(out, tokens + N_PROMPT, (size_t)(n - N_PROMPT) * sizeof *out);
    return n - N_PROMPT;
}

static void test_verifier_constrained_equals_plain(void **state) {
    (void)state;
    if (!env.ok) skip();
    int32_t prompt[N_PROMPT];
    for (int32_t i = 0; i < N_PROMPT; i++) prompt[i] = 3 + (i * 37) % (VOCAB - 3);
    sd_sampling greedy = sd_sampling_default(), seeded = sd_sampling_default();
    seeded.temperature = 0.9f;
    seeded.seed = 35;
    const sd_sampling *modes[2] = {&greedy, &seeded};
    sd_verifier *v = make_verifier(env.tok);
    for (int m = 0; m < 2; m++) {
        int32_t ref[N_NEW], got[N_NEW];
        int32_t n_ref = plain(prompt, modes[m], ref);
        int32_t n = serve(v, prompt, ref, n_ref, modes[m], got);
        assert_int_equal(n, n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *got);
        uint64_t id = 1;
        sd_verifier_release(v, &id, 1);
    }
    sd_verifier_free(&v);
}

/* A generated token outside the language, and a verifier without a
 * tokenizer: BAD_REQUEST for that sequence. */
static void test_verifier_constraint_refusals(void **state) {
    (void)state;
    if (!env.ok) skip();
    int32_t tokens[N_PROMPT + 2];
    for (int32_t i = 0; i < N_PROMPT; i++) tokens[i] = 3 + (i * 37) % (VOCAB - 3);
    /* a token whose bytes cannot start a sentence of RE (not 'a' or 'c') */
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(env.gr, env.vocab, &c), SD_OK);
    int32_t bad = -1;
    for (int32_t t = 0; t < VOCAB && bad < 0; t++)
        if (!sd_constraint_allows(c, t) && !sd_tok_is_eog(env.tok, t)) bad = t;
    sd_constraint_free(&c);
    assert_true(bad >= 0);
    tokens[N_PROMPT] = bad;
    sd_sampling greedy = sd_sampling_default();
    sd_verifier *v = make_verifier(env.tok);
    const Specd__VerifyResult *r = step(v, tokens, 0, N_PROMPT + 1, NULL, 0, &greedy, true);
    assert_int_equal(r->code, SPECD__CODE__CODE_BAD_REQUEST);
    /* the same prefix without it is served; the grammar is compiled once */
    r = step(v, tokens, 0, N_PROMPT, NULL, 0, &greedy, true);
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    sd_verifier_free(&v);
    v = make_verifier(NULL);
    r = step(v, tokens, 0, N_PROMPT, NULL, 0, &greedy, true);
    assert_int_equal(r->code, SPECD__CODE__CODE_BAD_REQUEST);
    r = step(v, tokens, 0, N_PROMPT, NULL, 0, &greedy, false); /* unconstrained: served */
    assert_int_equal(r->code, SPECD__CODE__CODE_OK);
    sd_verifier_free(&v);
}

/* sd_vcon_sync directly: one compile for many steps, rollback to the
 * common prefix, replay, refusal. */
static void test_vcon_sync(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_vcon *vc = NULL;
    assert_int_equal(sd_vcon_create(env.tok, 2, &vc), SD_OK);
    Specd__Constraint con = SPECD__CONSTRAINT__INIT;
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX;
    con.text = (char *)RE;
    int32_t prompt[N_PROMPT] = {0}, ref[N_NEW], hist[N_PROMPT + N_NEW];
    for (int32_t i = 0; i < N_PROMPT; i++) prompt[i] = 3 + (i * 37) % (VOCAB - 3);
    sd_sampling greedy = sd_sampling_default();
    int32_t n_ref = plain(prompt, &greedy, ref);
    assert_true(n_ref > 4);
    memcpy(hist, prompt, sizeof prompt);
    memcpy(hist + N_PROMPT, ref, (size_t)n_ref * sizeof *ref);
    char err[256];
    sd_constraint *c = NULL;
    for (int32_t n = 0; n < n_ref; n++) { /* one token a step */
        assert_int_equal(sd_vcon_sync(vc, 0, &con, hist, N_PROMPT, N_PROMPT + n, &c, err, sizeof err), SD_OK);
        assert_int_equal(sd_constraint_len(c), n);
        assert_true(sd_constraint_allows(c, ref[n]));
    }
    /* back to 2 tokens (rejected drafts, a resend): rolled back */
    assert_int_equal(sd_vcon_sync(vc, 0, &con, hist, N_PROMPT, N_PROMPT + 2, &c, err, sizeof err), SD_OK);
    assert_int_equal(sd_constraint_len(c), 2);
    /* the other slot, same text: the cached grammar */
    assert_int_equal(sd_vcon_sync(vc, 1, &con, hist, N_PROMPT, N_PROMPT + 3, &c, err, sizeof err), SD_OK);
    sd_grammar_cache_stats st = sd_vcon_cache_stats(vc);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.pinned, 1);
    /* a changed token in the history: replayed from there, and refused when outside the language */
    int32_t saved = hist[N_PROMPT + 1];
    hist[N_PROMPT + 1] = prompt[0];
    sd_status s = sd_vcon_sync(vc, 0, &con, hist, N_PROMPT, N_PROMPT + 3, &c, err, sizeof err);
    if (s != SD_OK) assert_non_null(strstr(err, "not allowed"));
    hist[N_PROMPT + 1] = saved;
    assert_int_equal(sd_vcon_sync(vc, 0, &con, hist, N_PROMPT, N_PROMPT + 3, &c, err, sizeof err), SD_OK);
    assert_int_equal(sd_constraint_len(c), 3);
    /* no constraint: the slot's state goes */
    assert_int_equal(sd_vcon_sync(vc, 0, NULL, hist, N_PROMPT, N_PROMPT + 3, &c, err, sizeof err), SD_OK);
    assert_null(c);
    sd_vcon_release(vc, 1);
    assert_int_equal(sd_vcon_cache_stats(vc).pinned, 0);
    sd_vcon_free(&vc);
}

/* The EAGLE head's drafts cut where the constraint refuses them
 * (sd_vcon_cut_drafts): after the step's accepted tokens and the sampled
 * one, the drafts the language allows are kept, the first refused one and
 * everything after it dropped; the constraint is left where it was. */
static void test_cut_head_drafts(void **state) {
    (void)state;
    if (!env.ok) skip();
    static const char text[] = "abcdab zz.";
    int32_t *ids = NULL, *bad = NULL;
    size_t n = 0, n_bad = 0;
    assert_int_equal(sd_tok_encode(env.tok, text, strlen(text), false, &ids, &n), SD_OK);
    assert_int_equal(sd_tok_encode(env.tok, "Q", 1, false, &bad, &n_bad), SD_OK);
    assert_true(n >= 4 && n < 32 && n_bad == 1);
    int32_t hist[N_PROMPT + 32] = {0}, drafts[32];
    for (int32_t i = 0; i < N_PROMPT; i++) hist[i] = 5 + i;
    memcpy(hist + N_PROMPT, ids, n * sizeof *ids);
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(env.gr, env.vocab, &c), SD_OK);
    /* no accepted drafts: the sampled token ids[0], drafts ids[1..] then a refused one */
    memcpy(drafts, ids + 1, (n - 1) * sizeof *ids);
    drafts[n - 1] = bad[0];
    assert_int_equal(sd_vcon_cut_drafts(c, hist, N_PROMPT, N_PROMPT, ids[0], drafts, n), n - 1);
    assert_int_equal(sd_constraint_len(c), 0);
    /* two accepted drafts, the sampled ids[2], a refused draft in the middle */
    memcpy(drafts, ids + 3, (n - 3) * sizeof *ids);
    drafts[1] = bad[0];
    assert_int_equal(sd_vcon_cut_drafts(c, hist, N_PROMPT, N_PROMPT + 2, ids[2], drafts, n - 3), 1);
    assert_int_equal(sd_constraint_len(c), 0);
    /* the committed tokens themselves outside the language: nothing kept */
    assert_int_equal(sd_vcon_cut_drafts(c, hist, N_PROMPT, N_PROMPT, bad[0], drafts, 2), 0);
    /* from a constraint already past the first two tokens */
    assert_int_equal(sd_constraint_advance(c, ids[0]), SD_OK);
    assert_int_equal(sd_constraint_advance(c, ids[1]), SD_OK);
    memcpy(drafts, ids + 3, (n - 3) * sizeof *ids);
    assert_int_equal(sd_vcon_cut_drafts(c, hist, N_PROMPT + 2, N_PROMPT + 2, ids[2], drafts, n - 3), n - 3);
    assert_int_equal(sd_constraint_len(c), 2);
    sd_constraint_free(&c);
    free(ids);
    free(bad);
}

int main(void) {
    sd_log_set(NULL, NULL, getenv("SPECD_TEST_LOG") ? SD_LOG_DEBUG : SD_LOG_OFF, "test_verify_constrain");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verifier_constrained_equals_plain),
        cmocka_unit_test(test_verifier_constraint_refusals),
        cmocka_unit_test(test_vcon_sync),
        cmocka_unit_test(test_cut_head_drafts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
