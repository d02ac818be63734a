/* test_draft_constrain.c — the draft server under a constraint
 * (DraftSeq.constraint, drafter/draft_constrain.c), on a small random model
 * (specd-mkmodel), driven by hand through sd_draft_server_handle:
 *   - a self-draft drafter's proposal starts with the tokens the
 *     constraint forces (the forced bytes' encoding but its last token, q
 *     one-hot), continues masked (every draft allowed in turn, every q entry
 *     allowed where it was drawn), and runs to k; the same server without a
 *     tokenizer proposes tokens the constraint refuses (what masking fixes);
 *   - after drafts were rejected (keep_len back, other generated tokens),
 *     the slot's constraint follows the new history: drafts allowed again;
 *   - the n-gram drafter, which finds nothing in a random context, still
 *     proposes the forced tokens;
 *   - a sequence without a constraint is drafted as before. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "draft_serve.h"
#include "specd/constrain.h"
#include "specd/drafter.h"
#include "specd/gguf.h"

#define VOCAB    600
#define N_PROMPT 8
#define MAX_CTX  256
#define K        8

static const char *const FORCED = "hello world, ";
static const char *const RE = "hello world, (ab|cd)+ [a-z]{2,8}\\.";

static struct {
    char dir[64], path[128];
    bool ok;
    sd_tok *tok;
    sd_cvocab *vocab;
    sd_grammar *gr;
} env;

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-dcon-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 2 --vocab %d --seed 36 >/dev/null 2>&1", SPECD_MKMODEL, env.path,
             VOCAB);
    env.ok = system(cmd) == 0;
    if (!env.ok) return 0;
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(env.path, &g, err, sizeof err) != SD_OK) return -1;
    sd_status st = sd_tok_from_gguf(g, &env.tok);
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
    unlink(env.path);
    rmdir(env.dir);
    return 0;
}

#define SKIP_WITHOUT_MODEL()                                                                                           \
    do {                                                                                                               \
        if (!env.ok) skip();                                                                                           \
    } while (0)

static sd_draft_server *make_server(sd_drafter *d, bool with_tok, int32_t top_n) {
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = 4;
    sp.max_ctx = MAX_CTX;
    sp.max_batch = 4;
    sp.max_k = K;
    sp.n_vocab = VOCAB;
    sp.top_n = top_n;
    sp.tok = with_tok ? env.tok : NULL;
    sd_draft_server *s = NULL;
    assert_int_equal(sd_draft_server_create(d, &sp, &s), SD_OK);
    return s;
}

static sd_drafter *self_draft(void) {
    sd_drafter_params p = sd_drafter_default_params();
    p.max_seqs = 4;
    p.max_ctx = MAX_CTX;
    p.n_threads = 2;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_self_open(env.path, 1, &p, &d), SD_OK);
    return d;
}

/* One sequence (request 1) of a draft step: ctx[keep..n) appended, prompt
 * N_PROMPT, greedy; constrained by RE or not. The result, borrowed. */
static const Specd__DraftResult *draft(sd_draft_server *s, const int32_t *ctx, int32_t keep, int32_t n,
                                       bool constrained) {
    static Specd__DraftResponse resp;
    sd_sampling greedy = sd_sampling_default();
    greedy.temperature = 0.0f;
    Specd__Sampling smp = SPECD__SAMPLING__INIT;
    sd_net_sampling_to_pb(&greedy, &smp);
    Specd__Constraint con = SPECD__CONSTRAINT__INIT;
    con.kind = SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX;
    con.text = (char *)RE;
    Specd__DraftSeq ds = SPECD__DRAFT_SEQ__INIT, *pds = &ds;
    ds.request_id = 1;
    ds.keep_len = (uint32_t)keep;
    ds.append = (int32_t *)ctx + keep;
    ds.n_append = (size_t)(n - keep);
    ds.k = K;
    ds.sampling = &smp;
    if (constrained) {
        ds.constraint = &con;
        ds.prompt_len = N_PROMPT;
    }
    Specd__DraftRequest req = SPECD__DRAFT_REQUEST__INIT;
    req.step_id = 1;
    req.seqs = &pds;
    req.n_seqs = 1;
    static sd_net_draft_step step;
    sd_net_draft_step_of(&req, &step);
    assert_int_equal(sd_draft_server_handle(s, &step, &resp), SD_OK);
    assert_int_equal(resp.n_results, 1);
    assert_int_equal(resp.results[0]->code, SPECD__CODE__CODE_OK);
    assert_int_equal(resp.results[0]->cached_len, (uint32_t)n);
    return resp.results[0];
}

/* A constraint advanced over ctx[N_PROMPT..n). */
static sd_constraint *at(const int32_t *ctx, int32_t n) {
    sd_constraint *c = NULL;
    assert_int_equal(sd_constraint_create(env.gr, env.vocab, &c), SD_OK);
    for (int32_t i = N_PROMPT; i < n; i++) assert_int_equal(sd_constraint_advance(c, ctx[i]), SD_OK);
    return c;
}

/* How many of r's drafts the constraint after ctx[..n) allows in turn;
 * with check_q, every entry of each allowed draft's q is allowed there. */
static int32_t allowed_prefix(const Specd__DraftResult *r, const int32_t *ctx, int32_t n, bool check_q) {
    sd_constraint *c = at(ctx, n);
    int32_t ok = 0;
    for (; ok < (int32_t)r->n_tokens; ok++) {
        if (check_q)
            for (size_t j = 0; j < r->q[ok]->n_ids; j++) assert_true(sd_constraint_allows(c, r->q[ok]->ids[j]));
        if (sd_constraint_advance(c, r->tokens[ok]) != SD_OK) break;
    }
    sd_constraint_free(&c);
    return ok;
}

/* The expected forced drafts: FORCED encoded, all but its last token. */
static int32_t forced_ids(int32_t *ids) {
    int32_t *enc = NULL;
    size_t n = 0;
    assert_int_equal(sd_tok_encode(env.tok, FORCED, strlen(FORCED), false, &enc, &n), SD_OK);
    assert_true(n >= 2); /* else the test proves nothing about forced drafts */
    int32_t nf = (int32_t)n - 1 < K ? (int32_t)n - 1 : K;
    memcpy(ids, enc, (size_t)nf * sizeof *ids);
    free(enc);
    return nf;
}

static void make_prompt(int32_t *ctx) {
    for (int32_t i = 0; i < N_PROMPT; i++) ctx[i] = 3 + (i * 37) % (VOCAB - 3);
}

static void assert_forced_first(const Specd__DraftResult *r) {
    int32_t want[K];
    int32_t nf = forced_ids(want);
    assert_true((int32_t)r->n_tokens >= nf);
    for (int32_t i = 0; i < nf; i++) {
        assert_int_equal(r->tokens[i], want[i]);
        assert_int_equal((int)r->q[i]->n_ids, 1);
        assert_int_equal(r->q[i]->ids[0], want[i]);
        assert_true(r->q[i]->probs[0] == 1.0f);
    }
}

static void test_self_draft_masked(void **state) {
    (void)state;
    SKIP_WITHOUT_MODEL();
    sd_drafter *d = self_draft();
    sd_draft_server *s = make_server(d, true, SD_SPEC_DEFAULT_TOP_N);
    int32_t ctx[MAX_CTX];
    make_prompt(ctx);
    const Specd__DraftResult *r = draft(s, ctx, 0, N_PROMPT, true);
    assert_forced_first(r);
    assert_int_equal((int)r->n_tokens, K); /* masked, the drafter never runs out of allowed tokens here */
    assert_int_equal(allowed_prefix(r, ctx, N_PROMPT, true), K);
    /* accept 3 drafts, then the target's own (allowed) token: the next
     * step's constraint follows; then a step back (drafts rejected: keep
     * under the last context) with another allowed token */
    int32_t n = N_PROMPT;
    for (int32_t i = 0; i < 3; i++) ctx[n++] = r->tokens[i];
    r = draft(s, ctx, N_PROMPT, n, true);
    assert_int_equal(allowed_prefix(r, ctx, n, true), (int32_t)r->n_tokens);
    assert_true(r->n_tokens > 0);
    for (int32_t i = 0; i < 4; i++) ctx[n++] = r->tokens[i];
    r = draft(s, ctx, n - 4, n, true);
    assert_int_equal(allowed_prefix(r, ctx, n, true), (int32_t)r->n_tokens);
    n -= 5; /* back under the previous step's context: a rejection and a resend */
    r = draft(s, ctx, n - 1, n, true);
    assert_int_equal(allowed_prefix(r, ctx, n, true), (int32_t)r->n_tokens);
    assert_true(r->n_tokens > 0);
    sd_draft_server_free(&s);

    /* without the tokenizer: unconstrained drafts, some refused */
    s = make_server(d, false, SD_SPEC_DEFAULT_TOP_N);
    r = draft(s, ctx, 0, N_PROMPT, true);
    assert_true(allowed_prefix(r, ctx, N_PROMPT, false) < (int32_t)r->n_tokens);
    sd_draft_server_free(&s);
    sd_drafter_free(&d);
}

static void test_ngram_forced(void **state) {
    (void)state;
    SKIP_WITHOUT_MODEL();
    sd_drafter_params p = sd_drafter_default_params();
    p.max_seqs = 4;
    p.max_ctx = MAX_CTX;
    p.top_n = 1;
    p.ngram_cache_entries = -1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_ngram_create(&p, &d), SD_OK);
    sd_draft_server *s = make_server(d, true, 1);
    int32_t ctx[MAX_CTX];
    make_prompt(ctx);
    const Specd__DraftResult *r = draft(s, ctx, 0, N_PROMPT, true);
    assert_forced_first(r);
    assert_int_equal(allowed_prefix(r, ctx, N_PROMPT, true), (int32_t)r->n_tokens);
    /* no constraint: nothing forced, and nothing found in a random context */
    r = draft(s, ctx, 0, N_PROMPT, false);
    assert_int_equal((int)r->n_tokens, 0);
    sd_draft_server_free(&s);
    sd_drafter_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_draft_masked),
        cmocka_unit_test(test_ngram_forced),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
