/* test_coordinator.c — the coordinator's logic without sockets.
 *
 * A small random model (specd-mkmodel, synthetic byte-level BPE) gives the
 * tokenizer and identity. Messages go into the coordinator as packed bytes
 * through the same entry points the event loop uses (sd_workers_on_message,
 * sd_clients_on_message, the ticks) and come out through a capturing
 * sd_coord_io, so registration, scheduling decisions, commits, failure
 * recovery and cancellation are checked message by message with fake
 * worker results and a fake clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "coord.h"
#include "specd/gguf.h"

#define VOCAB  300
#define CTX    256
#define MAXMSG 256

static struct {
    char dir[64], target[128], other[128];
    bool ok;
} env;

/* ---------------------------------------------------------------- capture */

typedef struct captured {
    bool to_worker;
    uint8_t ident[SD_MAX_IDENTITY_BYTES];
    size_t ident_len;
    uint8_t *bytes;
    size_t len;
    bool taken;
} captured;

typedef struct harness {
    const char *peer_role; /* the role the feeding worker's key is bound to (ZAP User-Id); NULL = any */
    sd_coord c;
    captured msgs[MAXMSG];
    int n, next;
    uint64_t now;
    /* forward_us of verify replies: fwd_fixed_us + fwd_token_us * tokens
     * (appended + drafts) when fwd_token_us is set, else 1000 */
    uint32_t fwd_fixed_us, fwd_token_us;
    uint32_t fwd_step_from, fwd_step_us; /* + fwd_step_us when a step has fwd_step_from tokens or more */
    uint32_t draft_us;                   /* draft_us of draft replies (100 when 0) */
    uint32_t draft_catchup_us, draft_catchup_rows; /* their catchup_us / catchup_rows */
    Specd__StepCost **hello_costs;       /* step_costs a verifier's Hello carries */
    size_t n_hello_costs;
    uint32_t hello_group_id; /* Hello.group_id a verifier sends (0: let the coordinator number it) */
    Specd__DrafterKind kind; /* a drafter's Hello.drafter_kind (NGRAM when 0) */
    bool verifier_head;      /* a verifier's Hello announces an EAGLE head (head_relay.c) */
    /* a head drafter's Hello.feature_layers / feature_width (none when 0) */
    uint32_t *feat_layers;
    size_t n_feat_layers;
    uint32_t feat_width;
    /* cannot_pay_request only: the clock runs, each reply's forward_us or
     * draft_us after the last, plus model_extra_us on the model drafter's
     * draft replies (what a step costs beyond the workers' own times) */
    bool clock_runs;
    uint32_t model_extra_us;
    uint32_t model_draft_us; /* cannot_pay_request: the model's draft step of 3 (3000 when 0) */
    bool text_unrepeated;    /* cannot_pay_request: each step's last token is new (no shadow n-gram hits) */
} harness;

static void cap(harness *h, bool w, const uint8_t *ident, size_t ident_len, const ProtobufCMessage *m) {
    assert_true(h->n < MAXMSG);
    captured *c = &h->msgs[h->n++];
    c->to_worker = w;
    memcpy(c->ident, ident, ident_len);
    c->ident_len = ident_len;
    c->len = protobuf_c_message_get_packed_size(m);
    c->bytes = malloc(c->len + 1);
    protobuf_c_message_pack(m, c->bytes);
}
static bool cap_worker(void *u, const uint8_t *id, size_t n, const Specd__CoordinatorToWorker *e) {
    cap(u, true, id, n, &e->base);
    return true;
}
static sd_coord_sent cap_client(void *u, const uint8_t *id, size_t n, const uint8_t *body, size_t len) {
    harness *h = u;
    assert_true(h->n < MAXMSG);
    captured *c = &h->msgs[h->n++];
    c->to_worker = false;
    memcpy(c->ident, id, n);
    c->ident_len = n;
    c->len = len;
    c->bytes = malloc(len + 1);
    memcpy(c->bytes, body, len);
    return SD_COORD_SENT;
}
static uint64_t fake_clock(void) { return 1; }

static harness *harness_new(sd_coord_params *pp) {
    harness *h = calloc(1, sizeof *h);
    sd_coord_params p = pp ? *pp : sd_coord_default_params();
    p.model_path = env.target;
    sd_coord_io io = {.user = h, .to_worker = cap_worker, .to_client = cap_client};
    assert_int_equal(sd_coord_state_init(&h->c, &p, &io), SD_OK);
    h->c.clock_us = fake_clock;
    h->now = 1000000;
    return h;
}

/* A harness whose coordinator drafts a fixed K (adaptive K off). */
static harness *harness_fixed_k(int32_t k) {
    sd_coord_params p = sd_coord_default_params();
    p.adaptive_k = false;
    p.default_k = k;
    return harness_new(&p);
}

static void harness_free(harness *h) {
    for (int i = 0; i < h->n; i++) free(h->msgs[i].bytes);
    sd_coord_state_free(&h->c);
    free(h);
}

/* Next captured message to ident (skipping heartbeats), or NULL. */
static captured *next_to(harness *h, const char *ident) {
    for (int i = h->next; i < h->n; i++) {
        captured *c = &h->msgs[i];
        if (c->taken) continue;
        if (c->ident_len != strlen(ident) || memcmp(c->ident, ident, c->ident_len) != 0) continue;
        if (c->to_worker) {
            Specd__CoordinatorToWorker *e = specd__coordinator_to_worker__unpack(NULL, c->len, c->bytes);
            bool hb = e && e->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT;
            specd__coordinator_to_worker__free_unpacked(e, NULL);
            if (hb) {
                c->taken = true;
                continue;
            }
        } else {
            Specd__CoordinatorToClient *e = specd__coordinator_to_client__unpack(NULL, c->len, c->bytes);
            bool hb = e && e->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_HEARTBEAT;
            specd__coordinator_to_client__free_unpacked(e, NULL);
            if (hb) {
                c->taken = true;
                continue;
            }
        }
        c->taken = true;
        return c;
    }
    return NULL;
}

static Specd__CoordinatorToWorker *pop_worker(harness *h, const char *ident) {
    captured *c = next_to(h, ident);
    if (!c) return NULL;
    return specd__coordinator_to_worker__unpack(NULL, c->len, c->bytes);
}
static Specd__CoordinatorToClient *pop_client(harness *h, const char *ident) {
    captured *c = next_to(h, ident);
    if (!c) return NULL;
    return specd__coordinator_to_client__unpack(NULL, c->len, c->bytes);
}
/* Skips everything captured so far. */
static void drain(harness *h) { h->next = h->n; }

/* ---------------------------------------------------------------- feeding */

static void feed_worker(harness *h, const char *ident, Specd__WorkerToCoordinator *e) {
    size_t n = specd__worker_to_coordinator__get_packed_size(e);
    uint8_t *b = malloc(n + 1);
    specd__worker_to_coordinator__pack(e, b);
    sd_workers_on_message_as(&h->c, (const uint8_t *)ident, strlen(ident), h->peer_role, b, n, h->now);
    free(b);
}
static void feed_client(harness *h, const char *ident, Specd__ClientToCoordinator *e) {
    size_t n = specd__client_to_coordinator__get_packed_size(e);
    uint8_t *b = malloc(n + 1);
    specd__client_to_coordinator__pack(e, b);
    sd_clients_on_message(&h->c, (const uint8_t *)ident, strlen(ident), b, n, h->now);
    free(b);
}

static void hello(harness *h, const char *ident, Specd__Role role, uint64_t hash, uint32_t vocab) {
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = "llama";
    id.vocab_size = vocab;
    id.vocab_hash = hash;
    id.context_length = CTX;
    id.name = "test.gguf";
    Specd__Hello he = SPECD__HELLO__INIT;
    he.protocol_version = SD_PROTOCOL_VERSION;
    he.role = role;
    he.group_size = 1;
    he.model = &id;
    he.name = (char *)ident;
    he.max_batch = 64;
    he.max_k = 8;
    he.drafter_kind =
        role == SPECD__ROLE__ROLE_DRAFTER ? (h->kind ? h->kind : SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM) : 0;
    if (role == SPECD__ROLE__ROLE_DRAFTER && h->feat_width)
        he.feature_layers = h->feat_layers, he.n_feature_layers = h->n_feat_layers, he.feature_width = h->feat_width;
    if (role == SPECD__ROLE__ROLE_VERIFIER) he.group_id = h->hello_group_id;
    if (role == SPECD__ROLE__ROLE_VERIFIER && h->verifier_head) he.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    if (role == SPECD__ROLE__ROLE_VERIFIER) he.step_costs = h->hello_costs, he.n_step_costs = h->n_hello_costs;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    e.hello = &he;
    feed_worker(h, ident, &e);
}

static void register_ok(harness *h, const char *ident, Specd__Role role) {
    hello(h, ident, role, h->c.vocab_hash, (uint32_t)h->c.n_vocab);
    Specd__CoordinatorToWorker *w = pop_worker(h, ident);
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
}

static void submit(harness *h, const char *client, const int32_t *ids, size_t n, uint32_t max_tokens,
                   const char *stop) {
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.client_tag = 77;
    s.prompt_ids = (int32_t *)ids;
    s.n_prompt_ids = n;
    s.max_tokens = max_tokens;
    char *stops[1] = {(char *)stop};
    if (stop) {
        s.stop = stops;
        s.n_stop = 1;
    }
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    feed_client(h, client, &e);
}

static uint64_t expect_accepted(harness *h, const char *client) {
    Specd__CoordinatorToClient *m = pop_client(h, client);
    assert_non_null(m);
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED);
    uint64_t id = m->accepted->request_id;
    assert_int_equal(m->accepted->client_tag, 77);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    return id;
}

/* Answers a verify step with one result per sequence (same order). */
typedef struct vres {
    Specd__Code code;
    uint32_t n_accepted;
    int32_t commit[16];
    size_t n_commit;
    uint32_t cached_len;
    /* VerifyResult.logprobs / top_ids / top_logprobs (borrowed) */
    const float *lps;
    size_t n_lps;
    const int32_t *top_ids;
    const float *top_lps;
    size_t n_top;
    /* a verifier head's drafts for the next step (VerifyResult.next_draft,
     * each proposed with probability 1), its time for them */
    int32_t next_draft[8];
    size_t n_next;
    uint32_t next_us;
} vres;

/* Sends a verify response answering req with the given per-sequence results. */
static void reply_verify(harness *h, const char *ident, const Specd__VerifyRequest *req, const vres *r) {
    Specd__VerifyResult res[16], *pres[16];
    Specd__SparseDist q[16][8], *pq[16][8];
    float q_prob = 1.0f;
    for (size_t i = 0; i < req->n_seqs; i++) {
        specd__verify_result__init(&res[i]);
        for (size_t j = 0; j < r[i].n_next; j++) {
            specd__sparse_dist__init(&q[i][j]);
            q[i][j].ids = (int32_t *)&r[i].next_draft[j];
            q[i][j].probs = &q_prob;
            q[i][j].n_ids = q[i][j].n_probs = 1;
            pq[i][j] = &q[i][j];
        }
        res[i].next_draft = (int32_t *)r[i].next_draft;
        res[i].n_next_draft = res[i].n_next_q = r[i].n_next;
        res[i].next_q = pq[i];
        res[i].next_us = r[i].next_us;
        res[i].request_id = req->seqs[i]->request_id;
        res[i].code = r[i].code ? r[i].code : SPECD__CODE__CODE_OK;
        res[i].n_accepted = r[i].n_accepted;
        res[i].commit = (int32_t *)r[i].commit;
        res[i].n_commit = r[i].n_commit;
        res[i].cached_len = r[i].cached_len;
        res[i].logprobs = (float *)r[i].lps;
        res[i].n_logprobs = r[i].n_lps;
        res[i].top_ids = (int32_t *)r[i].top_ids;
        res[i].top_logprobs = (float *)r[i].top_lps;
        res[i].n_top_ids = res[i].n_top_logprobs = r[i].n_top;
        pres[i] = &res[i];
    }
    Specd__VerifyResponse vr = SPECD__VERIFY_RESPONSE__INIT;
    vr.step_id = req->step_id;
    vr.results = pres;
    vr.n_results = req->n_seqs;
    vr.forward_us = 1000;
    if (h->fwd_token_us) {
        size_t tokens = 0;
        for (size_t i = 0; i < req->n_seqs; i++) tokens += req->seqs[i]->n_append + req->seqs[i]->n_draft;
        vr.forward_us = h->fwd_fixed_us + h->fwd_token_us * (uint32_t)tokens;
        if (h->fwd_step_from && tokens >= h->fwd_step_from) vr.forward_us += h->fwd_step_us;
    }
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    e.verify = &vr;
    feed_worker(h, ident, &e);
}

static Specd__CoordinatorToWorker *expect_verify(harness *h, const char *ident) {
    Specd__CoordinatorToWorker *w = pop_worker(h, ident);
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
    return w;
}

/* A heartbeat; prefix_query: the prompt tokens its prefix cache looked up
 * (0: a verifier without one). */
static void heartbeat_prefix(harness *h, const char *ident, uint64_t prefix_query) {
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    st.kv_blocks_total = 100;
    st.kv_blocks_free = 90;
    st.prefix_query_tokens = prefix_query;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.stats = &st;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT;
    e.heartbeat = &hb;
    feed_worker(h, ident, &e);
}

static void heartbeat(harness *h, const char *ident) { heartbeat_prefix(h, ident, 0); }

/* ---------------------------------------------------------------- setup */

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-coord-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.target, sizeof env.target, "%s/target.gguf", env.dir);
    snprintf(env.other, sizeof env.other, "%s/other.gguf", env.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab %d --ctx %d --seed 3 >/dev/null 2>&1",
             SPECD_MKMODEL, env.target, VOCAB, CTX);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", env.dir);
    if (system(cmd) != 0) return -1;
    return 0;
}

#define NEED_MODEL()         \
    do {                     \
        if (!env.ok) skip(); \
    } while (0)

/* Single-character token ids of the test tokenizer. */
static int32_t tok1(const sd_tok *t, const char *ch) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sd_tok_encode(t, ch, strlen(ch), false, &ids, &n), SD_OK);
    assert_int_equal(n, 1);
    int32_t id = ids[0];
    free(ids);
    return id;
}

/* ---------------------------------------------------------------- session */

static void test_stop_string_across_tokens(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    const sd_tok *t = h->c.tok;
    int32_t a = tok1(t, "a"), x = tok1(t, "x"), y = tok1(t, "y"), z = tok1(t, "z"), b = tok1(t, "b");
    int32_t prompt[1] = {a};
    const char *stop[1] = {"xyz"};
    sd_session *s = sd_session_new(t, 1, prompt, 1, 100, CTX, stop, 1);
    assert_non_null(s);
    sd_commit_out o;
    /* "a x" then "y": the x and y are held back (they may start "xyz"). */
    int32_t step1[2] = {a, x};
    assert_int_equal(sd_session_commit(s, t, step1, 2, &o), SD_OK);
    assert_false(o.finished);
    assert_int_equal(o.n_taken, 2);
    assert_int_equal(o.text_len, 1);
    assert_memory_equal(o.text, "a", 1);
    free(o.text);
    int32_t step2[1] = {y};
    assert_int_equal(sd_session_commit(s, t, step2, 1, &o), SD_OK);
    assert_int_equal(o.text_len, 0);
    free(o.text);
    /* "z b": the stop completes; b in the same step is discarded. */
    int32_t step3[2] = {z, b};
    assert_int_equal(sd_session_commit(s, t, step3, 2, &o), SD_OK);
    assert_true(o.finished);
    assert_int_equal(o.reason, SPECD__STOP_REASON__STOP_REASON_STOP_STRING);
    assert_int_equal(o.n_taken, 1);
    assert_int_equal(o.text_len, 0);
    assert_int_equal(s->n_tokens, 5); /* a + a x y z */
    free(o.text);
    free(o.tail);
    sd_session_free(&s);

    /* A held prefix that does not complete is released: "x" "a" -> "xa". */
    s = sd_session_new(t, 2, prompt, 1, 100, CTX, stop, 1);
    int32_t step4[1] = {x};
    assert_int_equal(sd_session_commit(s, t, step4, 1, &o), SD_OK);
    assert_int_equal(o.text_len, 0);
    free(o.text);
    int32_t step5[1] = {a};
    assert_int_equal(sd_session_commit(s, t, step5, 1, &o), SD_OK);
    assert_int_equal(o.text_len, 2);
    assert_memory_equal(o.text, "xa", 2);
    free(o.text);
    /* Held text at a length stop goes into the tail: max 4 tokens. */
    s->max_tokens = 4;
    int32_t step6[2] = {b, x};
    assert_int_equal(sd_session_commit(s, t, step6, 2, &o), SD_OK);
    assert_true(o.finished);
    assert_int_equal(o.reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    assert_int_equal(o.text_len, 1);
    assert_memory_equal(o.text, "b", 1);
    assert_int_equal(o.tail_len, 1);
    assert_memory_equal(o.tail, "x", 1);
    free(o.text);
    free(o.tail);
    sd_session_free(&s);
    harness_free(h);
}

static void test_stop_string_inside_one_token_and_eos(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    const sd_tok *t = h->c.tok;
    int32_t a = tok1(t, "a"), b = tok1(t, "b");
    int32_t eos = sd_tok_eos(t);
    assert_true(eos >= 0);
    const char *stop[2] = {"zzz", "ab"};
    int32_t prompt[1] = {a};
    sd_session *s = sd_session_new(t, 1, prompt, 1, 100, CTX, stop, 2);
    sd_commit_out o;
    int32_t step[4] = {b, a, b, a};
    assert_int_equal(sd_session_commit(s, t, step, 4, &o), SD_OK);
    assert_true(o.finished);
    assert_int_equal(o.reason, SPECD__STOP_REASON__STOP_REASON_STOP_STRING);
    assert_int_equal(o.n_taken, 3);
    assert_int_equal(o.text_len, 1);
    assert_memory_equal(o.text, "b", 1);
    free(o.text);
    free(o.tail);
    sd_session_free(&s);

    s = sd_session_new(t, 2, prompt, 1, 100, CTX, NULL, 0);
    int32_t step2[3] = {b, eos, a};
    assert_int_equal(sd_session_commit(s, t, step2, 3, &o), SD_OK);
    assert_true(o.finished);
    assert_int_equal(o.reason, SPECD__STOP_REASON__STOP_REASON_EOS);
    assert_int_equal(o.n_taken, 2);
    free(o.text);
    free(o.tail);
    sd_session_free(&s);

    s = sd_session_new(t, 3, prompt, 1, 100, 3, NULL, 0);
    s->ignore_eos = true;
    assert_int_equal(sd_session_commit(s, t, step2, 3, &o), SD_OK);
    assert_true(o.finished);
    assert_int_equal(o.reason, SPECD__STOP_REASON__STOP_REASON_CONTEXT);
    assert_int_equal(o.n_taken, 2);
    free(o.text);
    free(o.tail);
    sd_session_free(&s);
    harness_free(h);
}

/* ---------------------------------------------------------------- adaptive K */

static void test_adaptive_k(void **state) {
    (void)state;
    sd_cost_model c;
    sd_cost_init(&c);
    c.verify_fixed_us = 20000;
    c.verify_token_us = 500;
    c.draft_token_us = 50;
    int32_t k_hi = sd_adapt_choose_k(0.9, &c, 1, 8);
    int32_t k_lo = sd_adapt_choose_k(0.05, &c, 1, 8);
    assert_int_equal(k_hi, 8);
    assert_true(k_lo < k_hi);
    /* as the batch grows the shared fixed cost shrinks: K shrinks */
    int32_t k1 = sd_adapt_choose_k(0.6, &c, 1, 8);
    int32_t k64 = sd_adapt_choose_k(0.6, &c, 64, 8);
    assert_true(k64 < k1);
    /* monotone in alpha */
    int32_t prev = 0;
    for (double a = 0.0; a <= 1.0; a += 0.1) {
        int32_t k = sd_adapt_choose_k(a, &c, 16, 8);
        assert_true(k >= prev);
        prev = k;
    }
    /* bounded by the cap, and 0 with no cap */
    assert_true(sd_adapt_choose_k(0.99, &c, 1, 3) <= 3);
    assert_int_equal(sd_adapt_choose_k(0.99, &c, 1, 0), 0);
    /* the EMA moves toward observed acceptance */
    sd_adapt ad = {.alpha = 0.5};
    for (int i = 0; i < 20; i++) sd_adapt_observe(&ad, 4, 0);
    assert_true(ad.alpha < 0.05);
    for (int i = 0; i < 20; i++) sd_adapt_observe(&ad, 4, 4);
    assert_true(ad.alpha > 0.8);
    /* the fit recovers fixed and per-token costs */
    sd_cost_init(&c);
    for (int i = 0; i < 200; i++) {
        int32_t n = 1 + (i * 7) % 60;
        sd_cost_observe_verify(&c, n, (uint32_t)(3000 + 200 * n));
    }
    assert_true(c.verify_fixed_us > 2500 && c.verify_fixed_us < 3500);
    assert_true(c.verify_token_us > 180 && c.verify_token_us < 220);
}

/* A batch-bound verifier, with the costs measured on the 2-core CPU of
 * bench/results/serve-cpu.md (a verify step ~38 ms + ~3.5 ms per token): at
 * 64 sequences an extra verified token costs nearly a whole K = 0 step of
 * its sequence, so K stays 0 unless the drafter is nearly always right;
 * alone, the fixed cost dominates and K > 0 even at low acceptance. */
static void test_adaptive_k_batch_bound(void **state) {
    (void)state;
    sd_cost_model c;
    sd_cost_init(&c);
    c.verify_fixed_us = 38000;
    c.verify_token_us = 3500;
    c.draft_token_us = 5; /* n-gram */
    assert_int_equal(sd_adapt_choose_k(0.2, &c, 64, 8), 0);
    assert_int_equal(sd_adapt_choose_k(0.6, &c, 64, 8), 0);
    assert_int_equal(sd_adapt_choose_k(0.8, &c, 64, 8), 0);
    assert_true(sd_adapt_choose_k(0.97, &c, 64, 8) >= 1);
    /* break-even at 64 is ~0.86 (K = 1: 1 + a tokens for 1.86x the cost):
     * just above it the predicted gain (< 2%) is inside the margin, and a
     * sequence that only looks a little better than break-even stays at 0 */
    assert_int_equal(sd_adapt_choose_k(0.87, &c, 64, 8), 0);
    assert_int_equal(sd_adapt_choose_k(0.88, &c, 64, 8), 0);
    assert_true(sd_adapt_choose_k(0.92, &c, 64, 8) >= 1);
    assert_true(sd_adapt_choose_k(0.6, &c, 1, 8) >= 2);
    assert_true(sd_adapt_choose_k(0.2, &c, 1, 8) >= 1);
    /* shadow drafts: every step when drafting is nearly free, rarer when a
     * model drafter's token costs a good part of a sequence's verify share */
    assert_int_equal(sd_adapt_shadow_interval(&c, 64), 1);
    c.draft_token_us = 2000;
    int32_t every = sd_adapt_shadow_interval(&c, 64);
    assert_true(every >= 10 && every <= 256);
    assert_true(sd_adapt_shadow_interval(&c, 1) < every);
    /* a shadow step of the 64 is priced at its round trip plus the
     * drafter's time: 3.2 ms + 64 x 5 us against 0.25% of a 262 ms verify
     * step, one every 6 steps */
    c.draft_token_us = 5;
    sd_cost_observe_draft_step(&c, 3200);
    assert_int_equal(sd_adapt_shadow_interval(&c, 64), 6);
    c.draft_step_us = 0;
    /* a shadow observation is a 0/1 sample of the acceptance rate */
    sd_adapt ad = {.alpha = 0.6};
    for (int i = 0; i < 20; i++) sd_adapt_observe_shadow(&ad, false);
    assert_true(ad.alpha < 0.05);
    for (int i = 0; i < 30; i++) sd_adapt_observe_shadow(&ad, true);
    assert_true(ad.alpha > 0.95);
    /* a service steadily at 64 sequences gives the fit no spread in step
     * sizes: the split between fixed and per-token cost it had is kept and
     * rescaled (the machine got 1.5x slower), not replaced by an even split
     * that would make K = 1 look worth it at acceptance 0.6 */
    c.draft_token_us = 5;
    for (int i = 0; i < 100; i++) sd_cost_observe_verify(&c, 64, (uint32_t)(1.5 * (38000 + 3500 * 64)));
    assert_true(c.verify_fixed_us > 50000 && c.verify_fixed_us < 64000);
    assert_true(c.verify_token_us > 4800 && c.verify_token_us < 5800);
    assert_int_equal(sd_adapt_choose_k(0.6, &c, 64, 8), 0);
    /* a sampled request's K follows its own acceptance only, probing K = 1
     * after 8 steps at 0 */
    sd_adapt sa = {.alpha = 0.6};
    assert_true(sd_adapt_sampled_k(&sa, 8) >= 1);
    sa.alpha = 0.05;
    assert_int_equal(sd_adapt_sampled_k(&sa, 8), 0);
    sa.steps_at_zero = 8;
    assert_int_equal(sd_adapt_sampled_k(&sa, 8), 1);
    assert_int_equal(sd_adapt_sampled_k(&sa, 0), 0);
}

/* ---------------------------------------------------------------- registration */

static void test_registration(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    hello(h, "bad", SPECD__ROLE__ROLE_DRAFTER, h->c.vocab_hash ^ 1, (uint32_t)h->c.n_vocab);
    Specd__CoordinatorToWorker *w = pop_worker(h, "bad");
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_ERROR);
    assert_int_equal(w->error->code, SPECD__CODE__CODE_VOCAB_MISMATCH);
    /* the refused peer is told so, and nothing of the target's identity */
    char leak[40];
    snprintf(leak, sizeof leak, "%016llx", (unsigned long long)h->c.vocab_hash);
    assert_null(strstr(w->error->message, leak));
    snprintf(leak, sizeof leak, "%d", (int)h->c.n_vocab);
    assert_null(strstr(w->error->message, leak));
    assert_non_null(strstr(w->error->message, "refused"));
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    /* a key bound to the drafter role cannot register a verifier */
    h->peer_role = "drafter";
    hello(h, "d-as-v", SPECD__ROLE__ROLE_VERIFIER, h->c.vocab_hash, (uint32_t)h->c.n_vocab);
    w = pop_worker(h, "d-as-v");
    assert_non_null(w);
    assert_int_equal(w->error->code, SPECD__CODE__CODE_REFUSED);
    assert_non_null(strstr(w->error->message, "may not register as a verifier"));
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_VERIFIER), 0);
    h->peer_role = "verifier"; /* its own role: fine */
    /* verifier groups: a named group once; unnamed ones are numbered */
    h->hello_group_id = 7;
    register_ok(h, "v1", SPECD__ROLE__ROLE_VERIFIER);
    hello(h, "v1b", SPECD__ROLE__ROLE_VERIFIER, h->c.vocab_hash, (uint32_t)h->c.n_vocab);
    w = pop_worker(h, "v1b");
    assert_int_equal(w->error->code, SPECD__CODE__CODE_REFUSED);
    assert_non_null(strstr(w->error->message, "group 7 already has a live leader"));
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    h->hello_group_id = 0;
    register_ok(h, "v2", SPECD__ROLE__ROLE_VERIFIER);
    /* a drafter naming a group is a malformed Hello */
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = "llama";
    id.vocab_size = (uint32_t)h->c.n_vocab;
    id.vocab_hash = h->c.vocab_hash;
    Specd__Hello he = SPECD__HELLO__INIT;
    he.protocol_version = SD_PROTOCOL_VERSION;
    he.role = SPECD__ROLE__ROLE_DRAFTER;
    he.group_size = 1;
    he.model = &id;
    he.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    he.group_id = 3;
    Specd__WorkerToCoordinator he_env = SPECD__WORKER_TO_COORDINATOR__INIT;
    he_env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    he_env.hello = &he;
    feed_worker(h, "d-bad", &he_env);
    w = pop_worker(h, "d-bad");
    assert_int_equal(w->error->code, SPECD__CODE__CODE_BAD_REQUEST);
    assert_non_null(strstr(w->error->message, "group_id"));
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    uint32_t ids[2] = {0, 0};
    for (int32_t i = 0, n = 0; i < SD_COORD_MAX_WORKERS; i++)
        if (sd_coord_is_group(&h->c.workers[i])) ids[n++] = h->c.workers[i].group_id;
    assert_true((ids[0] == 7 && ids[1] == 1) || (ids[0] == 1 && ids[1] == 7));
    /* a request from nobody registered is dropped, the service carries on */
    Specd__VerifyResponse vr = SPECD__VERIFY_RESPONSE__INIT;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    e.verify = &vr;
    feed_worker(h, "stranger", &e);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_VERIFIER), 2); /* a second group is welcome */
    harness_free(h);
}

/* A drafter whose tokenizer hashes like the target's registers whatever
 * its embedding rows, and its Welcome says the target's; a verifier must
 * match row for row; another tokenizer is refused whatever its size. */
static void test_registration_padded_vocab(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    const uint32_t rows = (uint32_t)h->c.n_vocab;
    const uint32_t sizes[2] = {rows + 64, rows - 8};
    const char *names[2] = {"d-wide", "d-narrow"};
    for (int i = 0; i < 2; i++) {
        hello(h, names[i], SPECD__ROLE__ROLE_DRAFTER, h->c.vocab_hash, sizes[i]);
        Specd__CoordinatorToWorker *w = pop_worker(h, names[i]);
        assert_non_null(w);
        assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME);
        assert_int_equal(w->welcome->vocab_size, rows);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_DRAFTER), 2);
    /* equal rows: the Welcome says nothing of the size (a worker built before the field still reads it) */
    hello(h, "d-same", SPECD__ROLE__ROLE_DRAFTER, h->c.vocab_hash, rows);
    Specd__CoordinatorToWorker *same = pop_worker(h, "d-same");
    assert_non_null(same);
    assert_int_equal(same->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME);
    assert_int_equal(same->welcome->vocab_size, 0);
    specd__coordinator_to_worker__free_unpacked(same, NULL);
    hello(h, "v-padded", SPECD__ROLE__ROLE_VERIFIER, h->c.vocab_hash, rows + 64);
    Specd__CoordinatorToWorker *w = pop_worker(h, "v-padded");
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_ERROR);
    assert_int_equal(w->error->code, SPECD__CODE__CODE_VOCAB_MISMATCH);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    hello(h, "d-other", SPECD__ROLE__ROLE_DRAFTER, h->c.vocab_hash ^ 1, rows + 64);
    w = pop_worker(h, "d-other");
    assert_non_null(w);
    assert_int_equal(w->error->code, SPECD__CODE__CODE_VOCAB_MISMATCH);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_DRAFTER), 3);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_VERIFIER), 0);
    harness_free(h);
}

/* ---------------------------------------------------------------- scheduling */

static void test_plain_steps_commit_and_cache_miss(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[3] = {5, 6, 7};
    submit(h, "c", prompt, 3, 3, NULL);
    uint64_t rid = expect_accepted(h, "c");
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    Specd__VerifyRequest *vq = w->verify;
    assert_int_equal(vq->n_seqs, 1);
    assert_int_equal(vq->seqs[0]->request_id, rid);
    assert_int_equal(vq->seqs[0]->keep_len, 0);
    assert_int_equal(vq->seqs[0]->n_append, 3);
    assert_int_equal(vq->seqs[0]->n_draft, 0);
    vres r = {.n_commit = 1, .commit = {9}, .cached_len = 3};
    reply_verify(h, "v", vq, &r);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    assert_int_equal(m->tokens->n_tokens, 1);
    assert_int_equal(m->tokens->tokens[0], 9);
    assert_int_equal(m->tokens->n_generated, 1);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    /* next step appends just the last committed token */
    w = expect_verify(h, "v");
    assert_int_equal(w->verify->seqs[0]->keep_len, 3);
    assert_int_equal(w->verify->seqs[0]->n_append, 1);
    assert_int_equal(w->verify->seqs[0]->append[0], 9);
    /* CACHE_MISS: the whole prefix is resent with keep_len 0 */
    vres miss = {.code = SPECD__CODE__CODE_CACHE_MISS};
    reply_verify(h, "v", w->verify, &miss);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    assert_int_equal(w->verify->seqs[0]->n_append, 4);
    int32_t want[4] = {5, 6, 7, 9};
    assert_memory_equal(w->verify->seqs[0]->append, want, sizeof want);
    /* a result that commits two tokens with no drafts is refused (step failed) */
    vres bad = {.n_commit = 2, .commit = {10, 11}, .cached_len = 4};
    reply_verify(h, "v", w->verify, &bad);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = pop_worker(h, "v");
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_ERROR);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    assert_int_equal(w->verify->seqs[0]->n_append, 4);
    vres ok = {.n_commit = 1, .commit = {10}, .cached_len = 4};
    reply_verify(h, "v", w->verify, &ok);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    vres last = {.n_commit = 1, .commit = {11}, .cached_len = 5};
    reply_verify(h, "v", w->verify, &last);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    /* max_tokens 3 reached: chunk, Finished(LENGTH), Release */
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    assert_int_equal(m->finished->reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    assert_int_equal(m->finished->stats->generated_tokens, 3);
    assert_int_equal(m->finished->stats->target_steps, 3);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    w = pop_worker(h, "v");
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE);
    assert_int_equal(w->release->request_ids[0], rid);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    assert_int_equal(h->c.n_sessions, 0);
    assert_int_equal(h->c.committed_tokens, 3);
    harness_free(h);
}

/* Penalties and logprobs: the verify step carries the penalties, the prompt
 * length and the logprobs asked for; a result without the logprobs asked
 * for (or with other alternatives) fails the step, which is resent; the
 * logprobs that come back reach the client in the TokenChunk with each
 * token's bytes from the tokenizer. */
static void test_logprobs_and_penalties(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[3] = {5, 6, 7};
    Specd__Sampling smp = SPECD__SAMPLING__INIT;
    smp.presence_penalty = 0.5f;
    smp.frequency_penalty = -1.0f;
    Specd__SubmitRequest sub = SPECD__SUBMIT_REQUEST__INIT;
    sub.client_tag = 77;
    sub.prompt_ids = prompt;
    sub.n_prompt_ids = 3;
    sub.max_tokens = 2;
    sub.sampling = &smp;
    sub.logprobs = true;
    sub.top_logprobs = 2;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &sub;
    feed_client(h, "c", &e);
    expect_accepted(h, "c");
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    const Specd__VerifySeq *vs = w->verify->seqs[0];
    assert_true(vs->logprobs);
    assert_int_equal(vs->top_logprobs, 2);
    assert_int_equal(vs->prompt_len, 3);
    assert_true(vs->sampling->presence_penalty == 0.5f && vs->sampling->frequency_penalty == -1.0f);
    /* no logprobs, then the wrong number of alternatives: the step fails */
    vres none = {.n_commit = 1, .commit = {9}, .cached_len = 3};
    reply_verify(h, "v", w->verify, &none);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v"); /* the step failed: resent whole */
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    const float lp[1] = {-0.25f}, top3[3] = {-0.25f, -1.5f, -2.0f};
    const int32_t ids3[3] = {9, 4, 3};
    vres three = {.n_commit = 1,
                  .commit = {9},
                  .cached_len = 3,
                  .lps = lp,
                  .n_lps = 1,
                  .top_ids = ids3,
                  .top_lps = top3,
                  .n_top = 3};
    reply_verify(h, "v", w->verify, &three);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v"); /* the step failed: resent whole */
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    vres ok = {.n_commit = 1,
               .commit = {9},
               .cached_len = 3,
               .lps = lp,
               .n_lps = 1,
               .top_ids = ids3,
               .top_lps = top3,
               .n_top = 2};
    reply_verify(h, "v", w->verify, &ok);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    assert_int_equal(m->tokens->n_logprobs, 1);
    const Specd__TokenLogprob *tl = m->tokens->logprobs[0];
    assert_true(tl->logprob == -0.25f);
    assert_int_equal(tl->n_top_ids, 2);
    assert_int_equal(tl->top_ids[1], 4);
    assert_true(tl->top_logprobs[1] == -1.5f);
    size_t len = 0;
    const char *piece = sd_tok_piece(h->c.tok, 9, &len);
    assert_int_equal(tl->token.len, len);
    assert_memory_equal(tl->token.data, piece, len);
    assert_int_equal(tl->n_top_tokens, 2);
    piece = sd_tok_piece(h->c.tok, 4, &len);
    assert_int_equal(tl->top_tokens[1].len, len);
    assert_memory_equal(tl->top_tokens[1].data, piece, len);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    harness_free(h);
}

/* Submits prompt[n] with prompt logprobs (top 2 alternatives), echo, and
 * max_tokens (0: prompt_only). */
static void submit_echo(harness *h, const int32_t *prompt, size_t n, uint32_t max_tokens, bool prompt_lp) {
    Specd__SubmitRequest sub = SPECD__SUBMIT_REQUEST__INIT;
    sub.client_tag = 77;
    sub.prompt_ids = (int32_t *)prompt;
    sub.n_prompt_ids = n;
    sub.max_tokens = max_tokens;
    sub.prompt_only = max_tokens == 0;
    sub.prompt_logprobs = prompt_lp;
    sub.top_logprobs = prompt_lp ? 2 : 0;
    sub.echo = true;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &sub;
    feed_client(h, "c", &e);
}

/* Expects a prefill chunk [keep, keep + n) of prompt, with prompt logprobs
 * (and prompt_next) or without; answers it: with lp, entry j's logprob is
 * -(keep + j + 1) / 1000 and its alternatives ids 1, 2. */
static void prefill_chunk(harness *h, const int32_t *prompt, uint32_t keep, size_t n, bool lp, Specd__Code code) {
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    const Specd__VerifySeq *vs = w->verify->seqs[0];
    assert_true(w->verify->prefill_only);
    assert_int_equal(vs->keep_len, keep);
    assert_int_equal(vs->n_append, n);
    assert_memory_equal(vs->append, prompt + keep, n * sizeof *prompt);
    assert_int_equal(vs->prompt_logprobs, lp);
    assert_false(vs->logprobs); /* the generated tokens' were not asked for */
    if (lp) {
        assert_int_equal(vs->prompt_next, prompt[keep + n]);
        assert_int_equal(vs->top_logprobs, 2);
    }
    float lps[SD_MAX_PROMPT_LP_ROWS], tops[2 * SD_MAX_PROMPT_LP_ROWS];
    int32_t ids[2 * SD_MAX_PROMPT_LP_ROWS];
    for (size_t j = 0; lp && j < n; j++) {
        lps[j] = -(float)(keep + j + 1) / 1000.0f;
        ids[2 * j] = 1, ids[2 * j + 1] = 2;
        tops[2 * j] = -0.1f, tops[2 * j + 1] = -0.2f;
    }
    vres r = {.code = code, .cached_len = code ? 0 : keep + (uint32_t)n};
    if (lp && !code) r.lps = lps, r.n_lps = n, r.top_ids = ids, r.top_lps = tops, r.n_top = 2 * n;
    reply_verify(h, "v", w->verify, &r);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
}

/* Expects PromptLogprobs for prompt tokens [from, from + n) as
 * prefill_chunk answered them (position 0: NaN, no alternatives). */
static void expect_prompt_lps(harness *h, const int32_t *prompt, uint32_t from, size_t n) {
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_non_null(m);
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_PROMPT_LOGPROBS);
    const Specd__PromptLogprobs *p = m->prompt_logprobs;
    assert_int_equal(p->from, from);
    assert_int_equal(p->n_tokens, n);
    assert_int_equal(p->n_logprobs, n);
    for (size_t j = 0; j < n; j++) {
        const Specd__TokenLogprob *t = p->logprobs[j];
        assert_int_equal(p->tokens[j], prompt[from + j]);
        size_t len = 0;
        const char *piece = sd_tok_piece(h->c.tok, prompt[from + j], &len);
        assert_int_equal(t->token.len, len);
        assert_memory_equal(t->token.data, piece, len);
        if (from + j == 0) {
            assert_true(isnan(t->logprob));
            assert_int_equal(t->n_top_ids, 0);
        } else {
            assert_true(t->logprob == -(float)(from + j) / 1000.0f);
            assert_int_equal(t->n_top_ids, 2);
            assert_int_equal(t->top_ids[1], 2);
            assert_int_equal(t->n_top_tokens, 2);
        }
    }
    specd__coordinator_to_client__free_unpacked(m, NULL);
}

/* Echo with prompt logprobs: Accepted carries the ids' text, position 0's
 * entry follows at once, every prompt token but the last goes through
 * prefill chunks of at most SD_MAX_PROMPT_LP_ROWS that start where the
 * logprobs are owed (prompt_next the token after), each answer becomes one
 * PromptLogprobs; a wrong count fails the step; a CACHE_MISS refill stops
 * where they are owed and scores nothing twice; then a normal step without
 * them. prompt_only ends with LENGTH once scored, or at once without them. */
static void test_prompt_logprobs(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    enum { N = 150 };
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = 3 + (i * 7) % 250;
    submit_echo(h, prompt, N, 1, true);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED);
    char *text = NULL;
    size_t text_len = 0;
    assert_int_equal(sd_tok_decode(h->c.tok, prompt, N, &text, &text_len), SD_OK);
    assert_int_equal(m->accepted->prompt_text.len, text_len);
    assert_memory_equal(m->accepted->prompt_text.data, text, text_len);
    free(text);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    expect_prompt_lps(h, prompt, 0, 1);

    /* a reply without the logprobs asked for fails the step: sent again */
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    assert_true(w->verify->seqs[0]->prompt_logprobs);
    vres none = {.cached_len = 64};
    reply_verify(h, "v", w->verify, &none);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    prefill_chunk(h, prompt, 0, 64, true, 0);
    expect_prompt_lps(h, prompt, 1, 64);
    /* the next chunk's cache is lost: the refill stops where logprobs are owed */
    prefill_chunk(h, prompt, 64, 64, true, SPECD__CODE__CODE_CACHE_MISS);
    prefill_chunk(h, prompt, 0, 64, false, 0);
    prefill_chunk(h, prompt, 64, 64, true, 0);
    expect_prompt_lps(h, prompt, 65, 64);
    prefill_chunk(h, prompt, 128, 21, true, 0);
    expect_prompt_lps(h, prompt, 129, 21);
    /* scored: the last prompt token in a normal step, no prompt logprobs */
    w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only);
    assert_int_equal(w->verify->seqs[0]->keep_len, N - 1);
    assert_int_equal(w->verify->seqs[0]->n_append, 1);
    assert_false(w->verify->seqs[0]->prompt_logprobs);
    vres one = {.n_commit = 1, .commit = {9}, .cached_len = N};
    reply_verify(h, "v", w->verify, &one);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    drain(h);

    /* prompt_only: scored, then LENGTH with nothing generated */
    submit_echo(h, prompt, 3, 0, true);
    (void)expect_accepted(h, "c");
    expect_prompt_lps(h, prompt, 0, 1);
    prefill_chunk(h, prompt, 0, 2, true, 0);
    expect_prompt_lps(h, prompt, 1, 2);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    assert_int_equal(m->finished->reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    assert_int_equal(m->finished->stats->generated_tokens, 0);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    /* prompt_only without prompt logprobs (echo of ids): Accepted, Finished, no step */
    submit_echo(h, prompt, 5, 0, false);
    (void)expect_accepted(h, "c");
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    assert_int_equal(m->finished->reason, SPECD__STOP_REASON__STOP_REASON_LENGTH);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    Specd__CoordinatorToWorker *rel = pop_worker(h, "v");
    assert_true(!rel || rel->body_case != SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
    specd__coordinator_to_worker__free_unpacked(rel, NULL);
    harness_free(h);
}

/* A verifier's per-request code other than OK / CACHE_MISS / KV_FULL ends the
 * request with an Error naming it: BAD_REQUEST and TOO_LARGE pass through,
 * any other (UNKNOWN_REQUEST here, which would tell the client its own
 * running request does not exist) becomes INTERNAL. */
static void test_verifier_result_codes(void **state) {
    (void)state;
    NEED_MODEL();
    const struct {
        Specd__Code answered, client_sees;
    } cases[] = {
        {SPECD__CODE__CODE_BAD_REQUEST, SPECD__CODE__CODE_BAD_REQUEST},
        {SPECD__CODE__CODE_TOO_LARGE, SPECD__CODE__CODE_TOO_LARGE},
        {SPECD__CODE__CODE_UNKNOWN_REQUEST, SPECD__CODE__CODE_INTERNAL},
        {SPECD__CODE__CODE_CANCELLED, SPECD__CODE__CODE_INTERNAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        harness *h = harness_new(NULL);
        register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
        int32_t prompt[3] = {5, 6, 7};
        submit(h, "c", prompt, 3, 3, NULL);
        uint64_t rid = expect_accepted(h, "c");
        Specd__CoordinatorToWorker *w = expect_verify(h, "v");
        vres r = {.code = cases[i].answered};
        reply_verify(h, "v", w->verify, &r);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
        Specd__CoordinatorToClient *m = pop_client(h, "c");
        assert_non_null(m);
        assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
        assert_int_equal(m->error->code, cases[i].client_sees);
        assert_int_equal(m->error->request_id, rid);
        assert_non_null(strstr(m->error->message, sd_net_code_name(cases[i].answered)));
        specd__coordinator_to_client__free_unpacked(m, NULL);
        assert_int_equal(h->c.n_active, 0);
        harness_free(h);
    }
}

static void reply_draft(harness *h, const char *ident, const Specd__DraftRequest *req, const int32_t *toks,
                        size_t n_tok) {
    Specd__DraftResult res[8], *pres[8];
    Specd__SparseDist q[8], *pq[8];
    float one = 1.0f;
    for (size_t j = 0; j < n_tok; j++) {
        specd__sparse_dist__init(&q[j]);
        q[j].ids = (int32_t *)&toks[j];
        q[j].n_ids = 1;
        q[j].probs = &one;
        q[j].n_probs = 1;
        pq[j] = &q[j];
    }
    for (size_t i = 0; i < req->n_seqs; i++) {
        specd__draft_result__init(&res[i]);
        res[i].request_id = req->seqs[i]->request_id;
        res[i].code = SPECD__CODE__CODE_OK;
        size_t k = n_tok < req->seqs[i]->k ? n_tok : req->seqs[i]->k;
        res[i].tokens = (int32_t *)toks;
        res[i].n_tokens = k;
        res[i].q = pq;
        res[i].n_q = k;
        res[i].cached_len = req->seqs[i]->keep_len + (uint32_t)req->seqs[i]->n_append;
        pres[i] = &res[i];
    }
    Specd__DraftResponse dr = SPECD__DRAFT_RESPONSE__INIT;
    dr.step_id = req->step_id;
    dr.results = pres;
    dr.n_results = req->n_seqs;
    dr.draft_us = h->draft_us ? h->draft_us : 100;
    dr.catchup_us = h->draft_catchup_us;
    dr.catchup_rows = h->draft_catchup_rows;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
    e.draft = &dr;
    feed_worker(h, ident, &e);
}

static Specd__CoordinatorToWorker *expect_draft(harness *h, const char *ident) {
    Specd__CoordinatorToWorker *w = pop_worker(h, ident);
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT);
    return w;
}

static void test_speculative_steps_and_drafter_death(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_fixed_k(3);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8};
    submit(h, "c", prompt, 4, 50, NULL);
    uint64_t rid = expect_accepted(h, "c");
    /* prefill on both at once */
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    Specd__CoordinatorToWorker *dw = expect_draft(h, "d");
    assert_int_equal(vw->verify->seqs[0]->n_append, 4);
    assert_int_equal(dw->draft->seqs[0]->keep_len, 0);
    assert_int_equal(dw->draft->seqs[0]->n_append, 4);
    assert_int_equal(dw->draft->seqs[0]->k, 3);
    vres r0 = {.n_commit = 1, .commit = {20}, .cached_len = 4};
    reply_verify(h, "v", vw->verify, &r0);
    int32_t stale[3] = {1, 2, 3};
    reply_draft(h, "d", dw->draft, stale, 3);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    /* the warm drafts are stale: a fresh draft continues from [20] */
    dw = expect_draft(h, "d");
    assert_int_equal(dw->draft->seqs[0]->keep_len, 4);
    assert_int_equal(dw->draft->seqs[0]->n_append, 1);
    assert_int_equal(dw->draft->seqs[0]->append[0], 20);
    int32_t drafts[3] = {21, 22, 23};
    reply_draft(h, "d", dw->draft, drafts, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vw = expect_verify(h, "v");
    Specd__VerifySeq *vs = vw->verify->seqs[0];
    assert_int_equal(vs->keep_len, 4);
    assert_int_equal(vs->n_append, 1);
    assert_int_equal(vs->append[0], 20);
    assert_int_equal(vs->n_draft, 3);
    assert_memory_equal(vs->draft, drafts, sizeof drafts);
    assert_int_equal(vs->n_q, 3);
    /* accepted drafts that differ from what was sent fail the step */
    vres liar = {.n_accepted = 2, .n_commit = 3, .commit = {21, 99, 5}, .cached_len = 7};
    reply_verify(h, "v", vw->verify, &liar);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    vw = expect_verify(h, "v");
    vs = vw->verify->seqs[0];
    assert_int_equal(vs->keep_len, 0); /* belief reset: full prefix + same drafts */
    assert_int_equal(vs->n_append, 5);
    assert_int_equal(vs->n_draft, 3);
    vres r1 = {.n_accepted = 2, .n_commit = 3, .commit = {21, 22, 30}, .cached_len = 7};
    reply_verify(h, "v", vw->verify, &r1);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    m = (specd__coordinator_to_client__free_unpacked(m, NULL), pop_client(h, "c"));
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    assert_int_equal(m->tokens->n_tokens, 3);
    assert_int_equal(m->tokens->n_generated, 4);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    sd_session *s = sd_sched_find(&h->c, rid);
    assert_int_equal(s->accepted, 2);
    assert_int_equal(s->drafted, 3);
    /* next draft is in flight; the drafter goes silent and dies */
    dw = expect_draft(h, "d");
    assert_int_equal(dw->draft->seqs[0]->keep_len, 5);
    assert_int_equal(dw->draft->seqs[0]->n_append, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    uint64_t dead = (uint64_t)h->c.p.heartbeat_interval_ms * 1000u * (uint64_t)(h->c.p.heartbeat_liveness + 1);
    h->now += dead / 2;
    heartbeat(h, "v");
    h->now += dead / 2 + 1000;
    heartbeat(h, "v");
    sd_workers_tick(&h->c, h->now);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_DRAFTER), 0);
    /* K = 0 steps continue on the verifier */
    vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_draft, 0);
    assert_int_equal(vw->verify->seqs[0]->keep_len, 7);
    vres r2 = {.n_commit = 1, .commit = {31}, .cached_len = 8};
    reply_verify(h, "v", vw->verify, &r2);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_draft, 0);
    /* a new drafter registers: beliefs 0, the whole prefix goes to it */
    register_ok(h, "d2", SPECD__ROLE__ROLE_DRAFTER);
    vres r3 = {.n_commit = 1, .commit = {32}, .cached_len = 9};
    reply_verify(h, "v", vw->verify, &r3);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    dw = expect_draft(h, "d2");
    assert_int_equal(dw->draft->seqs[0]->keep_len, 0);
    assert_int_equal(dw->draft->seqs[0]->n_append, 10);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    /* cancel: Finished(CANCELLED), Release to both holders */
    drain(h);
    Specd__Cancel cc = SPECD__CANCEL__INIT;
    cc.request_id = rid;
    Specd__ClientToCoordinator ce = SPECD__CLIENT_TO_COORDINATOR__INIT;
    ce.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL;
    ce.cancel = &cc;
    feed_client(h, "c", &ce);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    assert_int_equal(m->finished->reason, SPECD__STOP_REASON__STOP_REASON_CANCELLED);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    int rel = 0;
    for (int i = h->next; i < h->n; i++) {
        if (!h->msgs[i].to_worker) continue;
        Specd__CoordinatorToWorker *e = specd__coordinator_to_worker__unpack(NULL, h->msgs[i].len, h->msgs[i].bytes);
        if (e->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE && e->release->request_ids[0] == rid) rel++;
        specd__coordinator_to_worker__free_unpacked(e, NULL);
    }
    assert_int_equal(rel, 2);
    /* unknown request on cancel */
    feed_client(h, "c", &ce);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
    assert_int_equal(m->error->code, SPECD__CODE__CODE_UNKNOWN_REQUEST);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    harness_free(h);
}

/* ServiceStats as a client gets it (through the client's own decoder,
 * which checks the per-position arrays); caller frees. */
static Specd__CoordinatorToClient *query_stats(harness *h) {
    Specd__StatsQuery q = SPECD__STATS_QUERY__INIT;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_STATS;
    e.stats = &q;
    feed_client(h, "stats", &e);
    captured *c = next_to(h, "stats");
    assert_non_null(c);
    Specd__Code code;
    char err[256];
    Specd__CoordinatorToClient *m = sd_net_decode_to_client(c->bytes, c->len, &code, err, sizeof err);
    assert_non_null(m);
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_STATS);
    return m;
}

/* The speculative-decoding counters of ServiceStats: per sequence verify
 * step (k = 0 steps too), draft tokens and acceptance per draft position,
 * from the results the verifier gave; a bent result is not counted. */
static void test_spec_counters_per_position(void **state) {
    (void)state;
    NEED_MODEL();
    sd_coord_params p = sd_coord_default_params();
    p.adaptive_k = false;
    p.default_k = 3;
    p.max_k = 5;
    harness *h = harness_new(&p);
    Specd__CoordinatorToClient *m = query_stats(h);
    assert_int_equal(m->stats->seq_verify_steps, 0);
    assert_int_equal(m->stats->n_draft_tokens_per_pos, 5); /* max_k entries from the start */
    assert_int_equal(m->stats->n_accepted_tokens_per_pos, 5);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8};
    submit(h, "c", prompt, 4, 50, NULL);
    expect_accepted(h, "c");
    /* step 1: the prompt and no drafts (K = 0), one token committed */
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v"), *dw = expect_draft(h, "d");
    vres r0 = {.n_commit = 1, .commit = {20}, .cached_len = 4};
    reply_verify(h, "v", vw->verify, &r0);
    int32_t stale[3] = {1, 2, 3};
    reply_draft(h, "d", dw->draft, stale, 3);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    /* step 2: three drafts, the first two accepted */
    dw = expect_draft(h, "d");
    int32_t drafts[3] = {21, 22, 23};
    reply_draft(h, "d", dw->draft, drafts, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_draft, 3);
    /* a result that claims an accepted draft that was not sent fails the
     * step and counts nothing; the step is sent again */
    vres liar = {.n_accepted = 2, .n_commit = 3, .commit = {21, 99, 5}, .cached_len = 7};
    reply_verify(h, "v", vw->verify, &liar);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    vw = expect_verify(h, "v");
    vres r1 = {.n_accepted = 2, .n_commit = 3, .commit = {21, 22, 30}, .cached_len = 7};
    reply_verify(h, "v", vw->verify, &r1);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    /* step 3: three drafts, none accepted */
    dw = expect_draft(h, "d");
    int32_t drafts2[3] = {40, 41, 42};
    reply_draft(h, "d", dw->draft, drafts2, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vw = expect_verify(h, "v");
    Specd__VerifySeq *vs = vw->verify->seqs[0];
    assert_int_equal(vs->n_draft, 3);
    vres r2 = {.n_accepted = 0, .n_commit = 1, .commit = {50}, .cached_len = vs->keep_len + (uint32_t)vs->n_append};
    reply_verify(h, "v", vw->verify, &r2);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);

    m = query_stats(h);
    const Specd__ServiceStats *st = m->stats;
    assert_int_equal(st->seq_verify_steps, 3);
    assert_int_equal(st->drafts, 2);
    assert_int_equal(st->draft_tokens, 6);
    assert_int_equal(st->accepted_tokens, 2);
    assert_int_equal(st->committed_tokens, 5); /* goodput 5 / 3 */
    assert_int_equal(st->verify_batches, 4);   /* the failed step was sent too */
    assert_int_equal(st->n_draft_tokens_per_pos, 5);
    const uint64_t want_d[5] = {2, 2, 2, 0, 0}, want_a[5] = {1, 1, 0, 0, 0};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(st->draft_tokens_per_pos[i], want_d[i]);
        assert_int_equal(st->accepted_tokens_per_pos[i], want_a[i]);
    }
    specd__coordinator_to_client__free_unpacked(m, NULL);
    harness_free(h);

    /* the counting itself: positions past max_k widen the report, and
     * arguments out of range are not counted */
    sd_spec_counts t = {0};
    sd_spec_counts_add(&t, 0, 0);
    sd_spec_counts_add(&t, SD_MAX_K, SD_MAX_K);
    sd_spec_counts_add(&t, 2, 3);
    sd_spec_counts_add(&t, SD_MAX_K + 1, 0);
    sd_spec_counts_add(&t, -1, 0);
    assert_int_equal(t.seq_steps, 2);
    assert_int_equal(t.drafts, 1);
    assert_int_equal(t.accepted_per_pos[SD_MAX_K - 1], 1);
    assert_int_equal(sd_spec_counts_positions(&t, 4), SD_MAX_K);
    sd_spec_counts u = {0};
    sd_spec_counts_add(&u, 6, 1);
    assert_int_equal(sd_spec_counts_positions(&u, 4), 6);
    assert_int_equal(sd_spec_counts_positions(&u, 8), 8);
}

/* K = 0 costs the verifier nothing: a sequence whose acceptance does not
 * pay for drafts at this cost is verified with no drafts, step after step
 * (no K = 1 probes in the verify batch), while the drafter proposes one
 * token for the position being verified (a shadow draft). Shadows that
 * match the committed tokens raise the acceptance estimate until K > 0 pays;
 * a rejected real draft brings K back to 0. Steps that refill a prefix stay
 * out of the cost fit. */
static void test_k0_steps_shadow_draft(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL); /* adaptive K */
    /* what one of 64 sequences sees of a 38 ms + 3.5 ms/token verify step */
    h->c.cost.verify_fixed_us = 600;
    h->c.cost.verify_token_us = 3500;
    h->c.cost.draft_token_us = 5;
    h->c.cost.n_draft_obs = 1; /* as measured: not the prior */
    h->fwd_fixed_us = 600;
    h->fwd_token_us = 3500;
    h->draft_us = 5; /* an n-gram drafter: shadow drafts every step */
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8};
    submit(h, "c", prompt, 4, 60, NULL);
    uint64_t rid = expect_accepted(h, "c");
    sd_session *s = sd_sched_find(&h->c, rid);
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_append, 4);
    assert_int_equal(vw->verify->seqs[0]->n_draft, 0);
    assert_null(pop_worker(h, "d")); /* K = 0: no warm-up draft */
    vres r = {.n_commit = 1, .commit = {30}, .cached_len = 4};
    reply_verify(h, "v", vw->verify, &r);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    assert_true(h->c.cost.verify_fit.w == 0.0); /* the refill step is not a verify-cost sample */
    int32_t len = 5, shadows = 0;
    for (;;) {
        vw = pop_worker(h, "v");
        if (!vw) break; /* not verified at once: it is being drafted for real */
        assert_int_equal(vw->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
        assert_int_equal(vw->verify->seqs[0]->n_draft, 0);
        assert_int_equal(vw->verify->seqs[0]->n_append, 1);
        Specd__CoordinatorToWorker *dw = expect_draft(h, "d");
        assert_int_equal(dw->draft->seqs[0]->k, 1);
        assert_int_equal(dw->draft->seqs[0]->keep_len + dw->draft->seqs[0]->n_append, len);
        int32_t next = 31 + shadows;
        reply_draft(h, "d", dw->draft, &next, 1); /* the shadow comes back first... */
        specd__coordinator_to_worker__free_unpacked(dw, NULL);
        vres step = {.n_commit = 1, .commit = {next}, .cached_len = (uint32_t)len};
        reply_verify(h, "v", vw->verify, &step); /* ...and matches the committed token */
        specd__coordinator_to_worker__free_unpacked(vw, NULL);
        if (shadows == 0) assert_true(h->c.cost.verify_fit.w > 0.0);
        len++;
        shadows++;
        assert_true(shadows < 20);
    }
    /* from alpha 0.6, K = 1 breaks even at ~0.86 (seven matching shadows)
     * and gains the 2% margin past ~0.89: nine */
    print_message("K > 0 after %d matching shadow drafts (alpha %.3f)\n", shadows, s->adapt.alpha);
    assert_int_equal(shadows, 9);
    assert_int_equal(s->drafted, 0); /* shadows are not drafts */
    Specd__CoordinatorToWorker *dw = expect_draft(h, "d");
    assert_true(dw->draft->seqs[0]->k >= 1);
    int32_t guess[8] = {90, 91, 92, 93, 94, 95, 96, 97};
    reply_draft(h, "d", dw->draft, guess, dw->draft->seqs[0]->k);
    size_t k = dw->draft->seqs[0]->k;
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_draft, k);
    /* the drafts are all rejected: back to K = 0 and shadows */
    vres rej = {.n_accepted = 0, .n_commit = 1, .commit = {50}, .cached_len = (uint32_t)len};
    reply_verify(h, "v", vw->verify, &rej);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    assert_int_equal(s->drafted, k);
    vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_draft, 0);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    dw = expect_draft(h, "d");
    assert_int_equal(dw->draft->seqs[0]->k, 1);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    /* the service learned from it: the next greedy request starts from the
     * service's estimate, not from 0.6 */
    assert_true(h->c.alpha_prior > 0.6);
    submit(h, "c2", prompt, 4, 10, NULL);
    uint64_t rid2 = expect_accepted(h, "c2");
    assert_true(sd_sched_find(&h->c, rid2)->adapt.alpha == h->c.alpha_prior);
    harness_free(h);
}

/* A verifier "v" and a drafter "d" registered, and three greedy requests
 * of the same 4-token prompt (60 tokens each) accepted. */
static void start_three(harness *h) {
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8};
    for (int i = 0; i < 3; i++) {
        submit(h, "c", prompt, 4, 60, NULL);
        expect_accepted(h, "c");
    }
}

/* Answers req with one committed token, `token`, for each sequence (every
 * draft rejected, nothing drafted for the next step). */
static void reply_verify_one_each(harness *h, const char *ident, const Specd__VerifyRequest *req, int32_t token) {
    vres r[16];
    assert_true(req->n_seqs <= 16);
    for (size_t i = 0; i < req->n_seqs; i++) {
        const Specd__VerifySeq *q = req->seqs[i];
        r[i] = (vres){.n_commit = 1, .commit = {token}, .cached_len = q->keep_len + (uint32_t)q->n_append};
    }
    reply_verify(h, ident, req, r);
}

/* Shadow drafts cost the verifier's machine more than the drafter's own
 * time (messages, both processes waking up): when a shadow is due only every
 * few steps, every sequence due is shadowed at the same verify steps, and
 * the steps in between send the drafter nothing. */
static void test_shadow_drafts_share_a_phase(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    /* 3 sequences at 40 us of drafting each against 0.25% of an 11.1 ms
     * verify step (the round trip is 0 on the harness's clock): one shadow
     * step every 5 verify steps, more as the harness's draft replies (120 us
     * a step whatever its size) raise the cost per token */
    h->c.cost.verify_fixed_us = 600;
    h->c.cost.verify_token_us = 3500;
    h->c.cost.draft_token_us = 40;
    h->c.cost.n_draft_obs = 1; /* as measured: not the prior */
    h->fwd_fixed_us = 600;
    h->fwd_token_us = 3500;
    h->draft_us = 120;      /* per draft step of the 3: 40 us a token */
    h->c.alpha_prior = 0.3; /* K = 0 at this cost (break-even ~0.96) */
    start_three(h);
    int drafts_steady = 0, steady_steps = 0;
    for (int step = 0; step < 30; step++) {
        Specd__CoordinatorToWorker *vw = pop_worker(h, "v");
        assert_non_null(vw);
        assert_int_equal(vw->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
        uint64_t sent = h->c.verify_steps;
        bool steady = vw->verify->n_seqs == 3 && vw->verify->seqs[0]->n_append == 1 &&
                      vw->verify->seqs[1]->n_append == 1 && vw->verify->seqs[2]->n_append == 1;
        for (size_t i = 0; i < vw->verify->n_seqs; i++) assert_int_equal(vw->verify->seqs[i]->n_draft, 0);
        Specd__CoordinatorToWorker *dw;
        while ((dw = pop_worker(h, "d"))) {
            assert_int_equal(dw->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT);
            if (steady && step >= 8) {
                /* a shadow step (once the sequences' first shadows have
                 * brought them into phase): every sequence, at a step of
                 * the phase */
                int32_t every = sd_adapt_shadow_interval(&h->c.cost, 3);
                assert_true(every >= 2);
                assert_int_equal(dw->draft->n_seqs, 3);
                assert_int_equal(sent % (uint64_t)every, 0);
                for (size_t i = 0; i < 3; i++) assert_int_equal(dw->draft->seqs[i]->k, 1);
                drafts_steady++;
            }
            int32_t wrong = 299;
            reply_draft(h, "d", dw->draft, &wrong, 1);
            specd__coordinator_to_worker__free_unpacked(dw, NULL);
        }
        steady_steps += steady && step >= 8;
        reply_verify_one_each(h, "v", vw->verify, 40 + step);
        specd__coordinator_to_worker__free_unpacked(vw, NULL);
    }
    print_message("%d steady steps, %d shadow draft steps\n", steady_steps, drafts_steady);
    assert_int_equal(steady_steps, 22);
    assert_true(drafts_steady >= 2 && drafts_steady <= steady_steps / 2);
    harness_free(h);
}

/* A head drafter's catch-up (DraftResponse.catchup_us / _rows: the
 * features of the positions it skipped at K = 0, fused and run at the next
 * shadow) is priced apart: a row's time into cost.catchup_row_us, and out
 * of the draft token's price. Charged to the shadows' 1-token drafts, it
 * priced a head drafter's token at 2.6 ms against ~0.5. Here each draft
 * step of up to 3 sequences takes 3 ms, 2.4 of it catch-up over 3 rows:
 * 800 us a row, and a draft token (the first observation replaces the
 * prior) at most (3000 - 2400) / 1 = 600 us, where 3000 / 3 = 1 ms would be
 * the least without the catch-up taken off. */
static void test_draft_catchup_priced_apart(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    h->c.cost.verify_fixed_us = 600;
    h->c.cost.verify_token_us = 3500;
    h->fwd_fixed_us = 600;
    h->fwd_token_us = 3500;
    h->draft_us = 3000;
    h->draft_catchup_us = 2400;
    h->draft_catchup_rows = 3;
    h->c.alpha_prior = 0.3;
    start_three(h);
    int replies = 0;
    for (int step = 0; step < 50 && h->c.cost.n_draft_obs == 0; step++) {
        Specd__CoordinatorToWorker *vw = pop_worker(h, "v");
        assert_non_null(vw);
        assert_int_equal(vw->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
        Specd__CoordinatorToWorker *dw;
        while ((dw = pop_worker(h, "d"))) {
            int32_t wrong = 299;
            reply_draft(h, "d", dw->draft, &wrong, 1);
            specd__coordinator_to_worker__free_unpacked(dw, NULL);
            replies++;
        }
        reply_verify_one_each(h, "v", vw->verify, 40 + step);
        specd__coordinator_to_worker__free_unpacked(vw, NULL);
    }
    print_message("%d draft replies: a draft token %.1f us, catch-up %.1f us a row\n", replies,
                  h->c.cost.draft_token_us, h->c.cost.catchup_row_us);
    assert_true(replies >= 1 && h->c.cost.n_draft_obs >= 1);
    assert_true(fabs(h->c.cost.catchup_row_us - 800.0) < 1e-9);
    assert_true(h->c.cost.draft_token_us > 0.0 && h->c.cost.draft_token_us <= 600.0 + 1e-9);
    harness_free(h);
}

/* A verifier's EAGLE head drafts the next step's tokens in each verify step
 * (VerifySeq.next_k), which costs the verifier a head forward a sequence. At
 * K = 0 it drafts only what the next step reads: one token for a sequence
 * whose shadow draft comes while the next step is verified, none for the
 * others; and every shadow its relay answers finds that token. */
static void test_head_drafts_only_when_read(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    sd_head_relays *hr = NULL;
    assert_int_equal(sd_head_relays_new(&h->c, &hr), SD_OK);
    /* as test_shadow_drafts_share_a_phase: a shadow every few steps */
    h->c.cost.verify_fixed_us = 600;
    h->c.cost.verify_token_us = 3500;
    h->c.cost.draft_token_us = 40;
    h->c.cost.n_draft_obs = 1;
    h->fwd_fixed_us = 600;
    h->fwd_token_us = 3500;
    h->c.alpha_prior = 0.3; /* K = 0 at this cost */
    h->verifier_head = true;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    sd_head_relays_pump(hr, h->now); /* the head's relay registers */
    int32_t prompt[4] = {5, 6, 7, 8};
    uint64_t rid[3];
    for (int i = 0; i < 3; i++) {
        submit(h, "c", prompt, 4, 60, NULL);
        rid[i] = expect_accepted(h, "c");
    }
    bool asked[3] = {false, false, false}; /* next_k 1 in the step before */
    int requested = 0, shadows = 0, steady_steps = 0;
    for (int step = 0; step < 30; step++) {
        sd_head_relays_pump(hr, h->now); /* shadow drafts answered */
        Specd__CoordinatorToWorker *vw = pop_worker(h, "v");
        assert_non_null(vw);
        assert_int_equal(vw->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
        const Specd__VerifyRequest *req = vw->verify;
        bool steady = req->n_seqs == 3 && step >= 2;
        vres r[3];
        for (size_t i = 0; i < req->n_seqs; i++) {
            const Specd__VerifySeq *q = req->seqs[i];
            assert_int_equal(q->n_draft, 0);
            int j = 0;
            while (j < 3 && rid[j] != q->request_id) j++;
            assert_true(j < 3);
            sd_session *s = sd_sched_find(&h->c, rid[j]);
            /* a shadow of this step's position: exactly where the step
             * before asked the head for a token, and it found the token */
            bool shadow = s->shadow_base == s->n_tokens;
            if (steady) {
                if (shadow != asked[j])
                    print_message("step %d seq %d: shadow %d asked %d every %d zero %d\n", step, j, shadow, asked[j],
                                  sd_adapt_shadow_interval(&h->c.cost, 3), s->adapt.steps_at_zero);
                assert_int_equal(shadow, asked[j]);
                if (shadow) assert_int_equal(s->shadow_token, 200 + step - 1);
                shadows += shadow;
            }
            assert_true(q->next_k <= 1);
            asked[j] = q->next_k == 1;
            requested += steady && asked[j];
            r[i] = (vres){.n_commit = 1,
                          .commit = {40 + step},
                          .cached_len = q->keep_len + (uint32_t)q->n_append,
                          .next_draft = {200 + step},
                          .n_next = q->next_k,
                          .next_us = 40 * q->next_k};
        }
        steady_steps += steady;
        reply_verify(h, "v", req, r);
        specd__coordinator_to_worker__free_unpacked(vw, NULL);
    }
    int32_t every = sd_adapt_shadow_interval(&h->c.cost, 3);
    print_message("%d steady steps of 3 sequences, every %d: %d head drafts asked, %d shadows\n", steady_steps, every,
                  requested, shadows);
    assert_int_equal(steady_steps, 28);
    assert_true(every >= 2);
    /* shadows still come at their interval (a shadow's own step counts in
     * it, as in one process), and the head drafted nothing else; the last
     * step's asks have no next step */
    assert_true(shadows >= 3 * (steady_steps / every) - 3);
    assert_true(requested <= 3 * (steady_steps / (every - 1) + 1));
    assert_true(requested >= shadows && requested - shadows <= 3);
    sd_head_relays_free(&hr);
    harness_free(h);
}

/* The next verify request leaves before the committed tokens are streamed:
 * packing and sending a chunk per client is not on the verifier's critical
 * path. A request that finishes gets its last chunk before Finished. */
static void test_next_verify_before_streaming(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[4] = {5, 6, 7, 8};
    submit(h, "c", prompt, 4, 2, NULL);
    expect_accepted(h, "c");
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    vres r = {.n_commit = 1, .commit = {30}, .cached_len = 4};
    int mark = h->n;
    reply_verify(h, "v", vw->verify, &r);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    int at_verify = -1, at_chunk = -1;
    for (int i = mark; i < h->n; i++) {
        if (h->msgs[i].to_worker) {
            Specd__CoordinatorToWorker *e =
                specd__coordinator_to_worker__unpack(NULL, h->msgs[i].len, h->msgs[i].bytes);
            if (e->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY && at_verify < 0) at_verify = i;
            specd__coordinator_to_worker__free_unpacked(e, NULL);
        } else {
            Specd__CoordinatorToClient *e =
                specd__coordinator_to_client__unpack(NULL, h->msgs[i].len, h->msgs[i].bytes);
            if (e->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS && at_chunk < 0) {
                at_chunk = i;
                assert_int_equal(e->tokens->n_tokens, 1);
                assert_int_equal(e->tokens->tokens[0], 30);
            }
            specd__coordinator_to_client__free_unpacked(e, NULL);
        }
    }
    assert_true(at_verify >= 0 && at_chunk >= 0);
    assert_true(at_verify < at_chunk);
    /* the last token: chunk, then Finished */
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    vw = expect_verify(h, "v");
    vres r2 = {.n_commit = 1, .commit = {31}, .cached_len = 5};
    reply_verify(h, "v", vw->verify, &r2);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    assert_int_equal(m->tokens->tokens[0], 31);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    harness_free(h);
}

/* A launch-bound verifier (a GPU running a small target: 3 ms a step, 10 us
 * a row) with a 1 ms draft round trip. Four sequences at acceptance 0.25:
 * each alone would draft (one more row is nearly free), but the batch would
 * wait for the round trip every step, 34% longer, for 25% more tokens. The
 * gate keeps the batch at K = 0; at acceptance 0.8 drafting pays and the
 * batch drafts. */
static void gate_case(double alpha, bool expect_drafts) {
    harness *h = harness_new(NULL);
    h->c.cost.verify_fixed_us = 3000;
    h->c.cost.verify_token_us = 10;
    h->c.cost.draft_token_us = 5;
    h->c.cost.n_draft_obs = 1; /* as measured: not the prior */
    h->c.cost.draft_step_us = 1000;
    h->fwd_fixed_us = 3000;
    h->fwd_token_us = 10;
    h->draft_us = 5;
    h->c.alpha_prior = alpha;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8};
    for (int i = 0; i < 4; i++) {
        submit(h, "c", prompt, 4, 60, NULL);
        expect_accepted(h, "c");
    }
    /* answer until every sequence has had its refill step */
    bool drafted = false;
    int refilled = 0;
    for (int step = 0; step < 12; step++) {
        Specd__CoordinatorToWorker *dw;
        while ((dw = pop_worker(h, "d"))) {
            for (size_t i = 0; i < dw->draft->n_seqs; i++)
                if (refilled >= 4 && dw->draft->seqs[i]->k > 1) drafted = true; /* not a 1-token shadow */
            int32_t guess[8] = {299, 299, 299, 299, 299, 299, 299, 299};
            reply_draft(h, "d", dw->draft, guess, 8);
            specd__coordinator_to_worker__free_unpacked(dw, NULL);
        }
        Specd__CoordinatorToWorker *vw = pop_worker(h, "v");
        if (!vw) break;
        vres r[8];
        for (size_t i = 0; i < vw->verify->n_seqs; i++) {
            const Specd__VerifySeq *q = vw->verify->seqs[i];
            if (q->n_append > 1) refilled++;
            if (refilled >= 4 && q->n_draft > 0) drafted = true;
            r[i] = (vres){.n_commit = 1, .commit = {40 + step}, .cached_len = q->keep_len + (uint32_t)q->n_append};
        }
        reply_verify(h, "v", vw->verify, r);
        specd__coordinator_to_worker__free_unpacked(vw, NULL);
    }
    print_message("alpha %.2f: gate %s, drafted %d\n", alpha, h->c.drafting_pays ? "open" : "closed", drafted);
    assert_int_equal(refilled, 4);
    assert_int_equal(drafted, expect_drafts);
    harness_free(h);
}

/* The verify step timeout scales with the step: a slow machine's big
 * refill step is not mistaken for a hung verifier (which, sent the same
 * step again after re-registering, never finished), and a step that timed
 * out gets twice as long next time. */
static void test_verify_timeout_scales(void **state) {
    (void)state;
    sd_cost_model c;
    sd_cost_init(&c);
    assert_int_equal(sd_cost_verify_timeout_us(&c, 3600, 30000000), 30000000); /* nothing measured: the floor */
    sd_cost_observe_rows(&c, 45, 900000);                                      /* 20 ms a token (ASan, 2 cores) */
    assert_int_equal(sd_cost_verify_timeout_us(&c, 10, 30000000), 30000000);
    uint64_t big = sd_cost_verify_timeout_us(&c, 3600, 30000000);
    assert_true(big >= (uint64_t)(8.0 * 20000 * 3600 * 0.99)); /* 8x the expected 72 s */
    /* faster steps let the peak decay, slowly */
    for (int i = 0; i < 10; i++) sd_cost_observe_rows(&c, 64, 64 * 2000);
    assert_true(c.row_us_peak > 0.8 * 20000 && c.row_us_peak < 20000);
    /* a timeout doubles what the next step of that size gets */
    uint64_t t = sd_cost_verify_timeout_us(&c, 5000, 30000000);
    sd_cost_verify_timed_out(&c, 5000, t);
    assert_true(sd_cost_verify_timeout_us(&c, 5000, 30000000) >= 2 * t - 8);
}

static void test_batch_gate_round_trip(void **state) {
    (void)state;
    NEED_MODEL();
    sd_cost_model c;
    sd_cost_init(&c);
    c.verify_fixed_us = 3000;
    c.verify_token_us = 10;
    c.draft_token_us = 5;
    c.draft_step_us = 1000;
    /* one sequence alone would draft at 0.4 ... */
    assert_int_equal(sd_adapt_choose_k(0.4, &c, 64, 8), 1);
    /* ... 64 of them do not pay for the round trip; at 0.8 they do */
    assert_false(sd_adapt_drafting_pays(&c, 64, 64 * 0.4, 64));
    int32_t k8 = sd_adapt_choose_k(0.8, &c, 64, 8);
    assert_true(sd_adapt_drafting_pays(&c, 64, 64 * (sd_adapt_expected_tokens(0.8, k8) - 1.0), 64 * k8));
    /* without a round trip the 0.4 batch pays */
    c.draft_step_us = 0;
    assert_true(sd_adapt_drafting_pays(&c, 64, 64 * 0.4, 64));
    /* a batch-bound CPU at batch 1 (18 ms + 2 ms a row): a 1 ms round trip
     * is small next to the step, acceptance 0.5 with 2 drafts pays */
    c.verify_fixed_us = 18000;
    c.verify_token_us = 2000;
    c.draft_step_us = 1000;
    assert_true(sd_adapt_drafting_pays(&c, 1, sd_adapt_expected_tokens(0.5, 2) - 1.0, 2));
    assert_true(sd_adapt_drafting_pays(&c, 5, 0, 0)); /* nobody drafts */
    assert_true(fabs(sd_adapt_expected_tokens(0.5, 2) - 1.75) < 1e-12);
    /* the scheduler */
    gate_case(0.25, false);
    gate_case(0.8, true);
}

/* The gate prices drafts at each step size's own measured time once both
 * sizes were seen: a verifier whose step costs 1000 us + 10 us a token up
 * to 8 tokens and 300 us more from the 9th (a GPU kernel's 8-token column
 * tile) makes drafting at batch 8 a loss that a line fitted below the step
 * calls a gain; under the step, at batch 4, the same drafts still pay. */
/* A verifier's measured step times seed the cost model at registration:
 * each size is trusted at once, the line fits the sizes up to
 * SD_COST_SIZES, the step timeout follows the slowest per token. */
static void test_cost_seeded_from_hello(void **state) {
    (void)state;
    NEED_MODEL();
    sd_cost_model c;
    sd_cost_init(&c);
    sd_step_cost costs[20];
    size_t n = 0;
    for (uint32_t t = 1; t <= 16; t++) costs[n++] = (sd_step_cost){t, 1000 + 10 * t};
    costs[n++] = (sd_step_cost){24, 1240};
    costs[n++] = (sd_step_cost){128, 2280};
    costs[n++] = (sd_step_cost){1024, 400000}; /* beyond the sizes kept: the timeout only */
    sd_cost_seed(&c, costs, n);
    assert_true(fabs(sd_cost_size_us(&c, 9) - 1090) < 1e-9);
    assert_true(fabs(sd_cost_size_us(&c, 24) - 1240) < 1e-9);
    assert_true(sd_cost_size_us(&c, 17) < 0);
    assert_true(fabs(c.verify_fixed_us - 1000) < 1e-3 && fabs(c.verify_token_us - 10) < 1e-6);
    /* 1024 tokens at ~390 us a token: a 100-token step may take 8x that */
    assert_true(sd_cost_verify_timeout_us(&c, 100, 1000) > 100 * 390 * 7);
    /* an observation afterwards moves the size's EMA as usual */
    sd_cost_observe_verify(&c, 9, 2090);
    assert_true(fabs(sd_cost_size_us(&c, 9) - (0.8 * 1090 + 0.2 * 2090)) < 1e-9);

    /* through registration */
    harness *h = harness_new(NULL);
    Specd__StepCost sc[3] = {SPECD__STEP_COST__INIT, SPECD__STEP_COST__INIT, SPECD__STEP_COST__INIT};
    Specd__StepCost *scp[3] = {&sc[0], &sc[1], &sc[2]};
    for (int i = 0; i < 3; i++) sc[i].tokens = (uint32_t)(4 * i + 1), sc[i].forward_us = 500 + 50 * (4 * i + 1);
    h->hello_costs = scp;
    h->n_hello_costs = 3;
    assert_true(sd_cost_size_us(&h->c.cost, 5) < 0);
    register_ok(h, "v1", SPECD__ROLE__ROLE_VERIFIER);
    assert_true(fabs(sd_cost_size_us(&h->c.cost, 5) - 750) < 1e-9);
    assert_true(fabs(h->c.cost.verify_token_us - 50) < 1e-6 && fabs(h->c.cost.verify_fixed_us - 500) < 1e-3);
    harness_free(h);
}

static void test_batch_gate_step_sizes(void **state) {
    (void)state;
    NEED_MODEL();
    sd_cost_model c;
    sd_cost_init(&c);
    c.draft_step_us = 0;
    for (int rep = 0; rep < 20; rep++)
        for (int32_t n = 1; n <= 12; n++) sd_cost_observe_verify(&c, n, (uint32_t)(1000 + 10 * n + (n >= 9 ? 300 : 0)));
    assert_true(fabs(sd_cost_size_us(&c, 8) - 1080) < 1e-6);
    assert_true(fabs(sd_cost_size_us(&c, 10) - 1400) < 1e-6);
    assert_true(sd_cost_size_us(&c, 13) < 0); /* never seen */
    assert_true(sd_cost_size_us(&c, 0) < 0 && sd_cost_size_us(&c, SD_COST_SIZES + 1) < 0);
    /* 8 sequences, 2 drafts that bring 0.5 tokens: +6% tokens for +30% time */
    assert_false(sd_adapt_drafting_pays(&c, 8, 0.5, 2));
    /* 4 sequences, the same drafts: 6 tokens stay under the step */
    assert_true(sd_adapt_drafting_pays(&c, 4, 0.5, 2));
    /* where the line was fitted on 4 and 8 only (1000 + 10 n), it calls the
     * same drafts a gain until the 10-token step has been seen 3 times */
    sd_cost_model d;
    sd_cost_init(&d);
    d.draft_step_us = 0;
    for (int rep = 0; rep < 20; rep++) sd_cost_observe_verify(&d, 8, 1080);
    for (int rep = 0; rep < 20; rep++) sd_cost_observe_verify(&d, 4, 1040);
    sd_cost_observe_verify(&d, 10, 1400);
    sd_cost_observe_verify(&d, 10, 1400);
    assert_true(sd_cost_size_us(&d, 10) < 0);
    assert_true(sd_adapt_drafting_pays(&d, 8, 0.6, 2)); /* the line, pulled up to ~25 us a token */
    assert_true(sd_adapt_drafting_pays(&d, 8, 1.2, 4));
    sd_cost_observe_verify(&d, 10, 1400);
    assert_false(sd_adapt_drafting_pays(&d, 8, 0.6, 2));
    /* 12 tokens were never seen, but cost at least what 10 did */
    assert_true(sd_cost_size_us(&d, 12) < 0);
    assert_false(sd_adapt_drafting_pays(&d, 8, 1.2, 4));
}

/* Drops what a long simulation has no use for: messages already taken and
 * everything sent to clients (the harness holds MAXMSG). */
static void harness_compact(harness *h) {
    int kept = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->msgs[i].taken || !h->msgs[i].to_worker) {
            free(h->msgs[i].bytes);
            continue;
        }
        h->msgs[kept++] = h->msgs[i];
    }
    memset(&h->msgs[kept], 0, (size_t)(h->n - kept) * sizeof h->msgs[0]); /* cap() does not reset taken */
    h->n = kept;
    h->next = 0;
}

/* Rounds of `batch` greedy requests submitted together, against a drafter
 * whose guess (299) is the target's token with probability 1/right_every at
 * every position, drafted or not (shadows see the same; 0: never). rows[r]
 * and tokens[r]: draft rows verified and tokens committed in round r. */
static void run_batch_rounds(harness *h, int rounds, int batch, uint32_t max_tokens, uint32_t right_every,
                             int32_t *rows, int32_t *tokens) {
    int32_t prompt[4] = {5, 6, 7, 8};
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int r = 0; r < rounds; r++) {
        rows[r] = tokens[r] = 0;
        for (int i = 0; i < batch; i++) {
            submit(h, "c", prompt, 4, max_tokens, NULL);
            expect_accepted(h, "c");
        }
        for (int step = 0; step < 2000; step++) {
            Specd__CoordinatorToWorker *dw;
            while ((dw = pop_worker(h, "d"))) {
                if (dw->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) {
                    int32_t guess[8] = {299, 299, 299, 299, 299, 299, 299, 299};
                    reply_draft(h, "d", dw->draft, guess, 8);
                }
                specd__coordinator_to_worker__free_unpacked(dw, NULL);
            }
            Specd__CoordinatorToWorker *vw = pop_worker(h, "v");
            while (vw && vw->body_case != SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
                specd__coordinator_to_worker__free_unpacked(vw, NULL);
                vw = pop_worker(h, "v");
            }
            if (!vw) break;
            vres res[16];
            assert_true(vw->verify->n_seqs <= 16);
            for (size_t i = 0; i < vw->verify->n_seqs; i++) {
                const Specd__VerifySeq *q = vw->verify->seqs[i];
                uint32_t n_acc = 0;
                int32_t last = 40 + step % 200;
                for (;;) { /* position by position: is the target's token the guess? */
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    bool right = right_every > 0 && (rng >> 33) % right_every == 0;
                    if (right && n_acc < q->n_draft) {
                        n_acc++;
                        continue;
                    }
                    if (right) last = 299; /* the target's own next token is the guess */
                    break;
                }
                res[i] = (vres){.n_accepted = n_acc,
                                .n_commit = n_acc + 1,
                                .cached_len = q->keep_len + (uint32_t)q->n_append + n_acc};
                for (uint32_t j = 0; j < n_acc; j++) res[i].commit[j] = 299;
                res[i].commit[n_acc] = last;
                if (!vw->verify->prefill_only) {
                    rows[r] += (int32_t)q->n_draft;
                    tokens[r] += (int32_t)(n_acc + 1);
                }
            }
            reply_verify(h, "v", vw->verify, res);
            specd__coordinator_to_worker__free_unpacked(vw, NULL);
            harness_compact(h);
        }
        assert_int_equal(h->c.n_sessions, 0); /* the round ran to its end */
        harness_compact(h);
    }
}

/* A verifier and a drafter registered, the verifier launch-bound like a
 * GPU running a small model (1200 us a step + 25 us a token, and step_us
 * more from step_from tokens when set), the drafter 5 us a token. */
static harness *launch_bound_harness(uint32_t step_from, uint32_t step_us) {
    harness *h = harness_new(NULL);
    h->c.cost.verify_fixed_us = 1200;
    h->c.cost.verify_token_us = 25;
    h->c.cost.draft_token_us = 5;
    h->c.cost.n_draft_obs = 1; /* as measured: not the prior */
    h->fwd_fixed_us = 1200;
    h->fwd_token_us = 25;
    h->fwd_step_from = step_from;
    h->fwd_step_us = step_us;
    h->draft_us = 5;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    return h;
}

/* New greedy requests start from the service's acceptance estimate, which
 * must follow what drafts actually achieve. On a launch-bound verifier
 * (1200 us + 25 us a token: drafting nearly free per row, break-even
 * acceptance ~5% at batch 1) a drafter that is never right must stop being
 * asked: the first 10 requests draft (from the 0.6 start), and after 30
 * requests the next 10 verify no drafts at all. (A variant of this harness with a
 * drafter right 1 time in 20 settled at ~5% extra rows, the break-even the
 * cost model sees; feeding the prior raw outcomes instead of each request's
 * smoothed estimate changed nothing there, so it was not done.) */
static void test_prior_follows_outcomes(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = launch_bound_harness(0, 0);
    int32_t rows[40], tokens[40];
    run_batch_rounds(h, 40, 1, 24, 0, rows, tokens);
    int32_t first = 0, last = 0;
    for (int r = 0; r < 10; r++) first += rows[r];
    for (int r = 30; r < 40; r++) last += rows[r];
    print_message("draft rows: first 10 requests %d, last 10 %d (prior %.3f)\n", first, last, h->c.alpha_prior);
    assert_true(first > 0);
    assert_int_equal(last, 0);
    harness_free(h);
}

/* A verifier whose step costs a step more from the 9th token (a GPU
 * kernel's 8-token column tile: 1400 us up to 8 tokens, 300 us more from 9,
 * 25 us a token), 8 requests at a time, a drafter right 1 time in 20: after
 * the first round the batch stops drafting, since +5% tokens never pay for
 * +20% time. (The line-only gate got there too in this harness. On the
 * H100, SmolLM2 and the n-gram drafter on chat prompts kept drafting ~3% rows
 * at 8 concurrent requests with either gate: something this harness lacks,
 * not established what; bench/results/cuda-h100.md.) */
static void test_batch_drafts_stop_at_step_cost(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = launch_bound_harness(9, 300);
    int32_t rows[12], tokens[12];
    run_batch_rounds(h, 12, 8, 48, 20, rows, tokens);
    int32_t later = 0;
    for (int r = 2; r < 12; r++) later += rows[r];
    print_message("draft rows: round 0 %d of %d tokens, rounds 2-11 %d\n", rows[0], tokens[0], later);
    assert_true(rows[0] > 0);
    assert_int_equal(later, 0);
    harness_free(h);
}

/* A sampled request's output depends on its K schedule, so its K must not
 * follow the load: on the same batch-bound verifier that keeps a greedy
 * request at K = 0 (above), a sampled one still drafts from its own
 * acceptance estimate, and gets no shadow drafts. */
static void test_sampled_k_ignores_load(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    h->c.cost.verify_fixed_us = 600;
    h->c.cost.verify_token_us = 3500;
    h->c.cost.draft_token_us = 5;
    h->c.cost.n_draft_obs = 1; /* as measured: not the prior */
    h->c.alpha_prior = 0.05;   /* what greedy requests taught: ignored by a sampled one */
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8};
    Specd__Sampling sm = SPECD__SAMPLING__INIT;
    sm.temperature = 0.8f;
    sm.top_p = 1.0f;
    sm.seed = 3;
    Specd__SubmitRequest sub = SPECD__SUBMIT_REQUEST__INIT;
    sub.client_tag = 77;
    sub.prompt_ids = prompt;
    sub.n_prompt_ids = 4;
    sub.max_tokens = 20;
    sub.sampling = &sm;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &sub;
    feed_client(h, "c", &e);
    uint64_t rid = expect_accepted(h, "c");
    assert_true(sd_sched_find(&h->c, rid)->adapt.alpha == 0.6);
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    Specd__CoordinatorToWorker *dw = expect_draft(h, "d"); /* warm-up: K > 0 */
    assert_true(dw->draft->seqs[0]->k >= 1);
    vres r = {.n_commit = 1, .commit = {30}, .cached_len = 4};
    reply_verify(h, "v", vw->verify, &r);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    assert_null(pop_worker(h, "v")); /* waits for its drafts */
    int32_t guess[8] = {31, 32, 33, 34, 35, 36, 37, 38};
    reply_draft(h, "d", dw->draft, guess, dw->draft->seqs[0]->k); /* stale: the verifier committed */
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    /* A second sampled request arrives while the verifier is busy (the
     * first one's drafts are verified): its warm-up drafts come back before
     * its prefill step can go, and that step still carries none, as it
     * would alone (its draws must not depend on that timing). */
    dw = expect_draft(h, "d");
    reply_draft(h, "d", dw->draft, guess, dw->draft->seqs[0]->k);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vw = expect_verify(h, "v"); /* the first request's drafts, verifier now busy */
    int32_t prompt2[5] = {9, 8, 7, 6, 5};
    sub.prompt_ids = prompt2;
    sub.n_prompt_ids = 5;
    feed_client(h, "c2", &e);
    (void)expect_accepted(h, "c2");
    dw = expect_draft(h, "d"); /* its warm-up */
    assert_int_equal(dw->draft->seqs[0]->n_append, 5);
    reply_draft(h, "d", dw->draft, guess, dw->draft->seqs[0]->k);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vres r2 = {.n_accepted = 0, .n_commit = 1, .commit = {40}, .cached_len = 5};
    reply_verify(h, "v", vw->verify, &r2);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    dw = expect_draft(h, "d"); /* the first request's next drafts (the verifier waits for them) */
    reply_draft(h, "d", dw->draft, guess, dw->draft->seqs[0]->k);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vw = expect_verify(h, "v");
    bool seen = false;
    for (size_t i = 0; i < vw->verify->n_seqs; i++) {
        if (vw->verify->seqs[i]->n_append != 5) continue;
        assert_int_equal(vw->verify->seqs[i]->n_draft, 0);
        seen = true;
    }
    assert_true(seen);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    harness_free(h);
}

/* A clock that moves on every read, for the held-step statistics. */
static uint64_t moving_clock_us;
static uint64_t moving_clock(void) { return moving_clock_us += 10; }

/* Starts request A (its verify answered, its warm-up draft still out) and
 * then submits B (a prompt to refill): B is ready, A waits only for drafts. */
static harness *two_cohorts_setup(double draft_step_us) {
    harness *h = harness_fixed_k(2);
    h->c.clock_us = moving_clock;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t a[4] = {5, 6, 7, 8}, b[3] = {9, 10, 11};
    submit(h, "c", a, 4, 30, NULL);
    (void)expect_accepted(h, "c");
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    Specd__CoordinatorToWorker *dw = expect_draft(h, "d");
    assert_int_equal(dw->draft->seqs[0]->n_append, 4); /* A's warm-up */
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    vres r = {.n_commit = 1, .commit = {20}, .cached_len = 4};
    reply_verify(h, "v", vw->verify, &r);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    h->c.cost.draft_step_us = draft_step_us;
    submit(h, "c2", b, 3, 30, NULL);
    (void)expect_accepted(h, "c2");
    return h;
}

/* A drafter that answers in far less time than a verify step: the free
 * verifier waits for A's drafts and verifies A and B in one batch instead
 * of splitting them into two cohorts that each pay the fixed cost. */
static void test_fast_drafter_one_cohort(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = two_cohorts_setup(0.0);
    assert_null(pop_worker(h, "v")); /* held for A's drafts */
    /* A's warm-up drafts come back stale (the verifier committed meanwhile) */
    Specd__CoordinatorToWorker *dw = pop_worker(h, "d");
    assert_null(dw);
    captured *warm = NULL;
    for (int i = 0; i < h->n; i++) {
        Specd__CoordinatorToWorker *e = specd__coordinator_to_worker__unpack(NULL, h->msgs[i].len, h->msgs[i].bytes);
        if (e && e->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) warm = &h->msgs[i];
        specd__coordinator_to_worker__free_unpacked(e, NULL);
    }
    assert_non_null(warm);
    dw = specd__coordinator_to_worker__unpack(NULL, warm->len, warm->bytes);
    int32_t stale[2] = {1, 2};
    reply_draft(h, "d", dw->draft, stale, 2);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    assert_null(pop_worker(h, "v")); /* still held: A is drafted now */
    dw = expect_draft(h, "d");
    assert_int_equal(dw->draft->n_seqs, 2); /* A from [20], B's warm-up */
    int32_t drafts[2] = {21, 22};
    reply_draft(h, "d", dw->draft, drafts, 2);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->n_seqs, 2);
    assert_int_equal(vw->verify->seqs[0]->n_draft, 2);
    assert_int_equal(vw->verify->seqs[1]->n_append, 3);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    double mean, p99, share, o50, o99;
    sd_sched_draft_wait(&h->c, &mean, &p99, &share);
    sd_sched_overhead(&h->c, &o50, &o99);
    assert_true(share > 0.0 && mean > 0.0);
    assert_true(o50 < mean); /* the wait is not counted as coordinator overhead */
    harness_free(h);
}

/* A drafter slower than the verify step it would hold up: B goes at once
 * and A's drafting overlaps B's verification (two cohorts). */
static void test_slow_drafter_two_cohorts(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = two_cohorts_setup(10e6);
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->n_seqs, 1);
    assert_int_equal(vw->verify->seqs[0]->n_append, 3);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    harness_free(h);
}

/* A drafter later than expected releases the hold within about a verify
 * step (here at the next tick, 100 ms on): B is not kept waiting for it. */
static void test_late_drafter_releases_hold(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = two_cohorts_setup(0.0);
    assert_null(pop_worker(h, "v"));
    sd_sched_pump(&h->c, h->now + 1000);
    assert_null(pop_worker(h, "v")); /* 1 ms late: still worth waiting */
    h->now += 100000;
    sd_sched_pump(&h->c, h->now);
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->n_seqs, 1);
    assert_int_equal(vw->verify->seqs[0]->n_append, 3);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    harness_free(h);
}

static void test_verifier_death_waits_and_resends(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[2] = {5, 6};
    submit(h, "c", prompt, 2, 10, NULL);
    (void)expect_accepted(h, "c");
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    vres r = {.n_commit = 1, .commit = {40}, .cached_len = 2};
    reply_verify(h, "v", w->verify, &r);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    /* the verifier dies with a step in flight */
    h->now += 10u * 1000u * 1000u;
    heartbeat(h, "c-nothing"); /* unregistered: ignored */
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    Specd__ClientToCoordinator ch = SPECD__CLIENT_TO_COORDINATOR__INIT;
    ch.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT;
    ch.heartbeat = &hb;
    feed_client(h, "c", &ch);
    sd_workers_tick(&h->c, h->now);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_VERIFIER), 0);
    assert_int_equal(h->c.n_active, 1);
    drain(h);
    sd_sched_pump(&h->c, h->now);
    assert_null(pop_worker(h, "v"));
    /* a new verifier: full prefix with keep_len 0 */
    register_ok(h, "v2", SPECD__ROLE__ROLE_VERIFIER);
    w = expect_verify(h, "v2");
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    assert_int_equal(w->verify->seqs[0]->n_append, 3);
    assert_int_equal(w->verify->seqs[0]->append[2], 40);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);
}

static void test_chunked_prefill_and_queue(void **state) {
    (void)state;
    NEED_MODEL();
    sd_coord_params p = sd_coord_default_params();
    p.prefill_chunk = 8;
    p.max_active = 1;
    p.max_queue = 1;
    harness *h = harness_new(&p);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 10 + i;
    submit(h, "c", prompt, 20, 5, NULL);
    (void)expect_accepted(h, "c");
    submit(h, "c", prompt, 3, 5, NULL); /* queued (max_active 1) */
    (void)expect_accepted(h, "c");
    submit(h, "c", prompt, 3, 5, NULL); /* queue full */
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
    assert_int_equal(m->error->code, SPECD__CODE__CODE_OVERLOADED);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    assert_true(w->verify->prefill_only);
    assert_int_equal(w->verify->n_seqs, 1);
    assert_int_equal(w->verify->seqs[0]->n_append, 8);
    vres r = {.cached_len = 8};
    reply_verify(h, "v", w->verify, &r);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    assert_true(w->verify->prefill_only);
    assert_int_equal(w->verify->seqs[0]->keep_len, 8);
    assert_int_equal(w->verify->seqs[0]->n_append, 8);
    r.cached_len = 16;
    reply_verify(h, "v", w->verify, &r);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only);
    assert_int_equal(w->verify->seqs[0]->keep_len, 16);
    assert_int_equal(w->verify->seqs[0]->n_append, 4);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);
}

/* A head drafter in its own process reads every committed position's
 * features, and a step carries at most SD_MAX_STEP_FEATURES floats of them
 * (feat_relay.c): with the widest feature a Hello may name (16 positions a
 * step), a 40-token prompt goes to the verifier in prefill chunks of 16
 * rows and then the last 8, each step asking for its features, though the
 * prompt is far below --prefill-chunk. */
static void test_feature_rows_bound_steps(void **state) {
    (void)state;
    NEED_MODEL();
    sd_coord_params p = sd_coord_default_params();
    harness *h = harness_new(&p);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    uint32_t layers[] = {0, 1, 2, 3, 4, 5, 6, 7};
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_EAGLE;
    h->feat_layers = layers, h->n_feat_layers = 8, h->feat_width = SD_MAX_FEATURE_WIDTH;
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    const int32_t rows = SD_MAX_STEP_FEATURES / SD_MAX_FEATURE_WIDTH;
    assert_int_equal(rows, 16);
    assert_true(p.prefill_chunk > 40);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 10 + i;
    submit(h, "c", prompt, 40, 5, NULL);
    (void)expect_accepted(h, "c");
    for (uint32_t cached = 0; cached < 32; cached += 16) {
        Specd__CoordinatorToWorker *w = expect_verify(h, "v");
        assert_true(w->verify->prefill_only);
        assert_int_equal(w->verify->n_seqs, 1);
        assert_int_equal(w->verify->seqs[0]->keep_len, cached);
        assert_int_equal(w->verify->seqs[0]->n_append, rows);
        assert_true(w->verify->seqs[0]->want_features);
        assert_int_equal(w->verify->n_feature_layers, 8);
        vres r = {.cached_len = cached + 16};
        reply_verify(h, "v", w->verify, &r);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only);
    assert_int_equal(w->verify->seqs[0]->keep_len, 32);
    assert_int_equal(w->verify->seqs[0]->n_append, 8);
    assert_true(w->verify->seqs[0]->n_append + w->verify->seqs[0]->n_draft <= (size_t)rows);
    assert_true(w->verify->seqs[0]->want_features);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);
}

/* Answers every sequence of a normal step with one committed token (100 +
 * its position in the step) and the cache the protocol says. */
static void commit_one_each(harness *h, const Specd__VerifyRequest *req) {
    vres r[16] = {0};
    assert_true(req->n_seqs <= 16);
    for (size_t i = 0; i < req->n_seqs; i++) {
        r[i].commit[0] = 100 + (int32_t)i;
        r[i].n_commit = 1;
        r[i].cached_len = req->seqs[i]->keep_len + (uint32_t)req->seqs[i]->n_append;
    }
    reply_verify(h, "v", req, r);
}

/* --prefill-chunk is a budget of prompt tokens per step, all sequences
 * together: a burst of new prompts joins the running sequences a budget's
 * worth at a time (a running sequence always goes), and a prefill-only step
 * carries one prompt's chunk. */
static void test_step_prompt_budget(void **state) {
    (void)state;
    NEED_MODEL();
    sd_coord_params p = sd_coord_default_params();
    p.prefill_chunk = 8;
    harness *h = harness_new(&p);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 10 + i;
    submit(h, "c", prompt, 6, 10, NULL);
    (void)expect_accepted(h, "c");
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only);
    assert_int_equal(w->verify->n_seqs, 1);
    assert_int_equal(w->verify->seqs[0]->n_append, 6);
    /* three 5-token prompts arrive while the first step runs */
    for (int i = 0; i < 3; i++) {
        submit(h, "c", prompt + 1 + i, 5, 10, NULL);
        (void)expect_accepted(h, "c");
    }
    assert_null(pop_worker(h, "v")); /* one step in flight */
    commit_one_each(h, w->verify);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    /* each step: the running sequences (1 token each) and one new prompt
     * (5 of the 8; the next would need 10) */
    for (size_t step = 0; step < 3; step++) {
        w = expect_verify(h, "v");
        assert_false(w->verify->prefill_only);
        assert_int_equal(w->verify->n_seqs, step + 2);
        size_t prompt_tokens = 0;
        for (size_t i = 0; i < w->verify->n_seqs; i++) {
            size_t n = w->verify->seqs[i]->n_append;
            assert_true(n == 1 || n == 5);
            if (n > 1) prompt_tokens += n;
        }
        assert_int_equal(prompt_tokens, 5);
        assert_int_equal(w->verify->seqs[step + 1]->n_append, 5); /* the prompts in arrival order */
        commit_one_each(h, w->verify);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    w = expect_verify(h, "v"); /* all four running */
    assert_int_equal(w->verify->n_seqs, 4);
    for (size_t i = 0; i < 4; i++) assert_int_equal(w->verify->seqs[i]->n_append, 1);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);

    /* two long prompts waiting together: a prefill-only step carries 8
     * tokens in all (it used to carry a chunk of each) */
    h = harness_new(&p);
    submit(h, "c", prompt, 20, 5, NULL);
    (void)expect_accepted(h, "c");
    submit(h, "c", prompt, 20, 5, NULL);
    (void)expect_accepted(h, "c");
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    for (uint32_t chunk = 0; chunk < 2; chunk++) {
        w = expect_verify(h, "v");
        assert_true(w->verify->prefill_only);
        assert_int_equal(w->verify->n_seqs, 1);
        assert_int_equal(w->verify->seqs[0]->keep_len, 8 * chunk);
        assert_int_equal(w->verify->seqs[0]->n_append, 8);
        vres r = {.cached_len = 8 * (chunk + 1)};
        reply_verify(h, "v", w->verify, &r);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    /* the first's last 4 go in a normal step, which takes turns with the
     * second's prefill */
    w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only);
    assert_int_equal(w->verify->n_seqs, 1);
    assert_int_equal(w->verify->seqs[0]->n_append, 4);
    commit_one_each(h, w->verify);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_verify(h, "v");
    assert_true(w->verify->prefill_only);
    assert_int_equal(w->verify->n_seqs, 1);
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    assert_int_equal(w->verify->seqs[0]->n_append, 8);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);
}

/* The drafter's side of the budget: a burst of new prompts warms the
 * drafter up a budget's worth at a time, as it prefills the verifier; the
 * first always goes. */
static void test_draft_prompt_budget(void **state) {
    (void)state;
    NEED_MODEL();
    sd_coord_params p = sd_coord_default_params();
    p.adaptive_k = false;
    p.default_k = 2;
    p.max_k = 2; /* a running sequence appends at most 3 tokens to the drafter */
    p.prefill_chunk = 8;
    harness *h = harness_new(&p);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 10 + i;
    for (int i = 0; i < 3; i++) { /* 5, 5 and 12 tokens, before any worker */
        submit(h, "c", prompt + i, i < 2 ? 5 : 12, 10, NULL);
        (void)expect_accepted(h, "c");
    }
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    Specd__CoordinatorToWorker *w = expect_draft(h, "d");
    assert_int_equal(w->draft->n_seqs, 1); /* 5 of 8; the next 5 would not fit */
    assert_int_equal(w->draft->seqs[0]->n_append, 5);
    int32_t toks[2] = {7, 8};
    reply_draft(h, "d", w->draft, toks, 2);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_draft(h, "d");
    assert_int_equal(w->draft->n_seqs, 1);
    assert_int_equal(w->draft->seqs[0]->n_append, 5);
    reply_draft(h, "d", w->draft, toks, 2);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    w = expect_draft(h, "d"); /* over the budget, but the first of its step */
    assert_int_equal(w->draft->n_seqs, 1);
    assert_int_equal(w->draft->seqs[0]->n_append, 12);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);
}

static void test_bad_submits(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    struct {
        const char *prompt;
        uint32_t max_tokens;
        float temp;
        Specd__Code code;
        const char *field;
    } cases[] = {
        {"", 0, 0, SPECD__CODE__CODE_BAD_REQUEST, "prompt"},
        {"hi", CTX + 1, 0, SPECD__CODE__CODE_BAD_REQUEST, "max_tokens"},
        {"hi", 0, -1.0f, SPECD__CODE__CODE_BAD_REQUEST, "temperature"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Specd__Sampling sm = SPECD__SAMPLING__INIT;
        sm.temperature = cases[i].temp;
        Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
        s.prompt = (char *)cases[i].prompt;
        s.max_tokens = cases[i].max_tokens;
        s.sampling = &sm;
        s.client_tag = 5;
        Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
        e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
        e.submit = &s;
        feed_client(h, "c", &e);
        Specd__CoordinatorToClient *m = pop_client(h, "c");
        assert_non_null(m);
        assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
        print_message("submit case %zu: %s: %s\n", i, sd_net_code_name(m->error->code), m->error->message);
        assert_true(m->error->code == cases[i].code || m->error->code == SPECD__CODE__CODE_TOO_LARGE);
        assert_non_null(strstr(m->error->message, cases[i].field));
        specd__coordinator_to_client__free_unpacked(m, NULL);
    }
    /* a long text prompt: over the context */
    char *big = malloc(4000);
    memset(big, 'a', 3999);
    big[3999] = 0;
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.prompt = big;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    feed_client(h, "c", &e);
    free(big);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->error->code, SPECD__CODE__CODE_TOO_LARGE);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    /* garbage bytes */
    uint8_t junk[5] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    sd_clients_on_message(&h->c, (const uint8_t *)"c", 1, junk, sizeof junk, h->now);
    m = pop_client(h, "c");
    assert_int_equal(m->error->code, SPECD__CODE__CODE_MALFORMED);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    assert_int_equal(h->c.n_sessions, 0);
    harness_free(h);
}

/* A resubmission after a coordinator restart (SubmitRequest.continuation):
 * the tokens already generated follow the prompt in the first step, count
 * in n_generated and max_tokens, are not streamed again, and a stop string
 * that began before the seam (held back then) still ends the request with
 * none of it emitted. A continuation that already ends the request is
 * refused. */
static void submit_continuation(harness *h, const int32_t *prompt, size_t n, const int32_t *cont, size_t n_cont,
                                uint32_t max_tokens, const char *stop) {
    Specd__SubmitRequest sr = SPECD__SUBMIT_REQUEST__INIT;
    sr.client_tag = 77;
    sr.prompt_ids = (int32_t *)prompt;
    sr.n_prompt_ids = n;
    sr.continuation = (int32_t *)cont;
    sr.n_continuation = n_cont;
    sr.max_tokens = max_tokens;
    char *stops[1] = {(char *)stop};
    sr.stop = stops;
    sr.n_stop = 1;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &sr;
    feed_client(h, "c", &e);
}

static void test_continuation_across_the_seam(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    const sd_tok *t = h->c.tok;
    int32_t a = tok1(t, "a"), x = tok1(t, "x"), y = tok1(t, "y"), z = tok1(t, "z");
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    int32_t prompt[1] = {a}, cont[2] = {a, x}; /* the client got "a"; "x" was held (it may start "xyz") */
    submit_continuation(h, prompt, 1, cont, 2, 10, "xyz");
    (void)expect_accepted(h, "c");
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->keep_len, 0);
    assert_int_equal(vw->verify->seqs[0]->n_append, 3); /* prompt + continuation */
    vres r0 = {.n_commit = 1, .commit = {y}, .cached_len = 3};
    reply_verify(h, "v", vw->verify, &r0);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS);
    assert_int_equal(m->tokens->n_tokens, 1);
    assert_int_equal(m->tokens->tokens[0], y);
    assert_int_equal(m->tokens->n_generated, 3); /* the continuation counts */
    assert_int_equal(m->tokens->text.len, 0);    /* "xy" held */
    specd__coordinator_to_client__free_unpacked(m, NULL);
    vw = expect_verify(h, "v");
    vres r1 = {.n_commit = 1, .commit = {z}, .cached_len = 4};
    reply_verify(h, "v", vw->verify, &r1);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    for (m = pop_client(h, "c"); m && m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS;
         m = pop_client(h, "c")) {
        assert_int_equal(m->tokens->text.len, 0);
        specd__coordinator_to_client__free_unpacked(m, NULL);
    }
    assert_non_null(m);
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED);
    assert_int_equal(m->finished->reason, SPECD__STOP_REASON__STOP_REASON_STOP_STRING);
    assert_int_equal(m->finished->text_tail.len, 0);
    specd__coordinator_to_client__free_unpacked(m, NULL);
    drain(h);
    /* a continuation that already holds the stop string, or max_tokens: refused */
    int32_t done[3] = {x, y, z};
    submit_continuation(h, prompt, 1, done, 3, 10, "xyz");
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
    assert_int_equal(m->error->code, SPECD__CODE__CODE_BAD_REQUEST);
    assert_non_null(strstr(m->error->message, "continuation"));
    specd__coordinator_to_client__free_unpacked(m, NULL);
    submit_continuation(h, prompt, 1, cont, 2, 2, "xyz");
    m = pop_client(h, "c");
    assert_int_equal(m->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
    assert_non_null(strstr(m->error->message, "continuation"));
    specd__coordinator_to_client__free_unpacked(m, NULL);
    harness_free(h);
}

/* ---------------------------------------------------------------- liveness */

/* Moves the fake clock on by us in 250 ms steps, both workers heartbeating
 * (alive, whatever their steps do), the coordinator ticking. */
static void advance_alive(harness *h, uint64_t us) {
    for (uint64_t t = 0; t < us; t += 250000) {
        h->now += us - t < 250000 ? us - t : 250000;
        heartbeat(h, "v");
        heartbeat(h, "d");
        sd_workers_tick(&h->c, h->now);
        for (int i = h->next; i < h->n; i++) { /* our heartbeats to the workers: seen */
            captured *c = &h->msgs[i];
            if (!c->to_worker || c->taken) continue;
            Specd__CoordinatorToWorker *e = specd__coordinator_to_worker__unpack(NULL, c->len, c->bytes);
            c->taken = e && e->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT;
            specd__coordinator_to_worker__free_unpacked(e, NULL);
        }
        harness_compact(h);
    }
}

/* Answers the step waiting for "v", if any (no draft accepted, one token
 * committed); returns 1 when there was one, adding its drafts to *drafts. */
static int serve_verifies(harness *h, int32_t *tok, int *drafts) {
    int n = 0;
    for (Specd__CoordinatorToWorker *w; n == 0 && (w = pop_worker(h, "v"));) {
        if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
            vres r[16];
            memset(r, 0, sizeof r);
            for (size_t i = 0; i < w->verify->n_seqs && i < 16; i++) {
                const Specd__VerifySeq *vs = w->verify->seqs[i];
                r[i].n_commit = 1;
                r[i].commit[0] = 50 + (*tok)++ % 200;
                r[i].cached_len = vs->keep_len + (uint32_t)vs->n_append;
                if (drafts) *drafts += (int)vs->n_draft;
            }
            reply_verify(h, "v", w->verify, r);
            n++;
        }
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    harness_compact(h);
    return n;
}

/* The next draft request to "d", serving the verifier meanwhile. */
static Specd__CoordinatorToWorker *next_draft(harness *h, int32_t *tok) {
    for (int round = 0; round < 20; round++) {
        for (Specd__CoordinatorToWorker *w; (w = pop_worker(h, "d"));) {
            if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) return w;
            specd__coordinator_to_worker__free_unpacked(w, NULL);
        }
        serve_verifies(h, tok, NULL);
    }
    fail_msg("no draft request to the drafter");
    return NULL;
}

/* A slow drafter that heartbeats (issue 17: a one-thread self-draft was
 * declared dead 7 times in 35 s by the fixed 2 s draft timeout): its steps
 * get a timeout from its measured times, a step over that costs the step
 * and backs the drafter off (K = 0 meanwhile), never its registration, and
 * drafts resume after the back-off with a doubled timeout. */
/* The slot of the one live drafter (-1: none). */
static int32_t drafter_slot(const harness *h) {
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++)
        if (sd_coord_is_drafter(&h->c.workers[i])) return i;
    return -1;
}

static void test_slow_drafter_backs_off(void **state) {
    (void)state;
    NEED_MODEL();
    sd_coord_params p = sd_coord_default_params();
    p.adaptive_k = false;
    p.default_k = 3;
    const uint64_t floor_us = (uint64_t)p.draft_timeout_ms * 1000u;
    harness *h = harness_new(&p);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[4] = {5, 6, 7, 8}, toks[3] = {1, 2, 3}, tok = 0;
    submit(h, "c", prompt, 4, 200, NULL);
    (void)expect_accepted(h, "c");
    const int32_t di = drafter_slot(h);
    sd_coord_worker *d = &h->c.workers[di];

    /* 1. a step of depth 3 answered after 1.5 s: 375 ms per depth unit,
     * so its timeout is 4 x 375 ms x 4 = 6 s, over the 2 s floor */
    Specd__CoordinatorToWorker *dw = next_draft(h, &tok);
    advance_alive(h, 1500000);
    serve_verifies(h, &tok, NULL);
    reply_draft(h, "d", dw->draft, toks, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    assert_int_equal(d->times.n, 1);
    assert_int_equal(d->times.p99_unit_us, 375000);
    assert_int_equal(sd_step_times_timeout_us(&d->times, floor_us, 3), 6000000);

    /* 2. a 3 s step, which the fixed 2 s timeout would have killed: in time */
    dw = next_draft(h, &tok);
    advance_alive(h, 3000000);
    assert_true(d->alive && d->busy && !d->backed_off);
    assert_int_equal(drafter_slot(h), di);
    reply_draft(h, "d", dw->draft, toks, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    assert_int_equal(d->times.n, 2);
    assert_int_equal(d->times.misses, 0);

    /* 3. a step over its measured timeout: dropped, the drafter backed off
     * but registered */
    dw = next_draft(h, &tok);
    uint64_t timeout = sd_step_times_timeout_us(&d->times, floor_us, 3);
    assert_true(timeout > floor_us);
    advance_alive(h, timeout + 300000);
    assert_true(d->alive);
    assert_int_equal(drafter_slot(h), di);
    assert_true(d->backed_off && !d->busy);
    assert_int_equal(d->times.misses, 1);
    /* meanwhile K = 0: verify steps carry no drafts, no draft is asked */
    int steps = 0, drafts = 0;
    for (int i = 0; i < 4; i++) steps += serve_verifies(h, &tok, &drafts);
    assert_true(steps >= 3);
    assert_int_equal(drafts, 0);
    for (Specd__CoordinatorToWorker *w; (w = pop_worker(h, "d"));) {
        assert_int_not_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    /* the late reply is measured, not applied */
    reply_draft(h, "d", dw->draft, toks, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    assert_int_equal(d->times.n, 3);
    assert_int_equal(d->times.late_step_id, 0);
    assert_true(d->alive && d->backed_off);

    /* 4. after the back-off drafts resume, with a doubled timeout */
    advance_alive(h, SD_STEP_BACKOFF_BASE_US + 250000);
    assert_false(d->backed_off);
    dw = next_draft(h, &tok);
    assert_true(sd_step_times_timeout_us(&d->times, floor_us, 3) >= 2 * timeout);
    reply_draft(h, "d", dw->draft, toks, 3);
    specd__coordinator_to_worker__free_unpacked(dw, NULL);
    assert_int_equal(d->times.misses, 0); /* answered in time */
    harness_free(h);
}

/* ---------------------------------------------------------------- routing */

/* The worker slot of the worker registered as ident (-1 none alive). */
static int32_t widx(const harness *h, const char *ident) {
    for (int32_t i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *w = &h->c.workers[i];
        if (w->used && w->alive && w->ident_len == strlen(ident) && memcmp(w->ident, ident, w->ident_len) == 0)
            return i;
    }
    return -1;
}

/* Active requests whose group (drafters: false) or drafter (true) is slot wi. */
static int32_t n_on(const harness *h, int32_t wi, bool drafter) {
    int32_t n = 0;
    for (int32_t i = 0; i < h->c.n_sessions; i++) {
        const sd_session *s = h->c.sessions[i];
        if (s->state == SD_SESSION_ACTIVE && (drafter ? s->drafter : s->group) == wi) n++;
    }
    return n;
}

/* Registers a verifier group whose Hello says a step of t tokens takes
 * fixed + per_token * t microseconds (t = 1..16). */
static void register_group(harness *h, const char *ident, uint32_t fixed, uint32_t per_token) {
    Specd__StepCost costs[16], *pcosts[16];
    for (uint32_t t = 1; t <= 16; t++) {
        specd__step_cost__init(&costs[t - 1]);
        costs[t - 1].tokens = t;
        costs[t - 1].forward_us = fixed + per_token * t;
        pcosts[t - 1] = &costs[t - 1];
    }
    h->hello_costs = pcosts;
    h->n_hello_costs = 16;
    register_ok(h, ident, SPECD__ROLE__ROLE_VERIFIER);
    h->hello_costs = NULL;
    h->n_hello_costs = 0;
}

/* Answers the verify step in w with one committed token per sequence. */
static void answer_plain(harness *h, const char *ident, Specd__CoordinatorToWorker *w, int32_t token) {
    vres r[16];
    memset(r, 0, sizeof r);
    for (size_t i = 0; i < w->verify->n_seqs && i < 16; i++) {
        r[i].n_commit = 1;
        r[i].commit[0] = token;
        r[i].cached_len = w->verify->seqs[i]->keep_len + (uint32_t)w->verify->seqs[i]->n_append;
    }
    reply_verify(h, ident, w->verify, r);
}

/* A harness with one verifier ("v", --prefill-chunk 16) whose heartbeat
 * reports prefix_query looked-up tokens (0: no prefix cache), after it
 * served prompt[0..n) for a one-token request, in chunks of 16 and a last
 * normal step: the coordinator then records the full 16-token blocks of
 * what the group prefilled (prefix_route.c). */
static harness *served_prompt(const int32_t *prompt, int32_t n, uint64_t prefix_query) {
    sd_coord_params p = sd_coord_default_params();
    p.prefill_chunk = 16;
    harness *h = harness_new(&p);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    heartbeat_prefix(h, "v", prefix_query);
    submit(h, "c", prompt, (size_t)n, 1, NULL);
    (void)expect_accepted(h, "c");
    for (uint32_t kept = 0; kept + 16 < (uint32_t)n; kept += 16) { /* no record yet: chunks of 16 */
        Specd__CoordinatorToWorker *w = expect_verify(h, "v");
        assert_true(w->verify->prefill_only);
        assert_int_equal(w->verify->seqs[0]->keep_len, kept);
        assert_int_equal(w->verify->seqs[0]->n_append, 16);
        vres r = {.cached_len = kept + 16};
        reply_verify(h, "v", w->verify, &r);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only);
    answer_plain(h, "v", w, 7); /* one token: the request ends */
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    drain(h);
    return h;
}

/* A prompt whose start the group's prefix cache likely holds (the
 * coordinator's record of what it prefilled there) is not cut into
 * prefill-only chunks for that part: the verifier adopts it, so the whole
 * prompt goes in the step that computes the rest. That prompt is charged
 * the whole step budget, so a second new prompt waits for the next step
 * (two computed prompts in one step each wait for both). A group that
 * reports no prefix lookups gets budget-sized chunks as before, and a long
 * hint is trusted at most 4 budgets a step: a wrong one (blocks evicted
 * there) makes one step compute at most 5 budgets of prompt rows. */
static void test_cached_prefix_costs_no_step(void **state) {
    (void)state;
    NEED_MODEL();
    int32_t prompt[160], other[6];
    for (int i = 0; i < 160; i++) prompt[i] = 10 + i;
    for (int i = 0; i < 6; i++) other[i] = 250 + i;
    /* 40 tokens served: 32 recorded; then 40 + 4 and a new 6-token prompt */
    harness *h = served_prompt(prompt, 40, 40);
    submit(h, "c", prompt, 44, 1, NULL);
    (void)expect_accepted(h, "c");
    submit(h, "c", other, 6, 1, NULL);
    (void)expect_accepted(h, "c");
    Specd__CoordinatorToWorker *w = expect_verify(h, "v");
    assert_false(w->verify->prefill_only); /* was: prefill chunks of 16, 16, then 12 */
    assert_int_equal(w->verify->n_seqs, 1);
    assert_int_equal(w->verify->seqs[0]->keep_len, 0);
    assert_int_equal(w->verify->seqs[0]->n_append, 44);
    answer_plain(h, "v", w, 7);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    while ((w = pop_worker(h, "v")) && w->body_case != SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY)
        specd__coordinator_to_worker__free_unpacked(w, NULL); /* the first one's Release */
    assert_non_null(w); /* the other prompt: its own step */
    assert_false(w->verify->prefill_only);
    assert_int_equal(w->verify->n_seqs, 1);
    assert_int_equal(w->verify->seqs[0]->n_append, 6);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);

    /* no prefix lookups reported: the record is not trusted */
    h = served_prompt(prompt, 40, 0);
    submit(h, "c", prompt, 44, 1, NULL);
    (void)expect_accepted(h, "c");
    w = expect_verify(h, "v");
    assert_true(w->verify->prefill_only);
    assert_int_equal(w->verify->seqs[0]->n_append, 16);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);

    /* 120 served: 112 recorded, 64 of them (4 budgets) trusted a step; the
     * 160-token prompt goes as prefill chunks of 16 computed + what is
     * trusted (80, 16 + 32 = 48), then 16 and the last 16 */
    h = served_prompt(prompt, 120, 120);
    submit(h, "c", prompt, 160, 1, NULL);
    (void)expect_accepted(h, "c");
    const uint32_t want[] = {80, 48, 16, 16};
    uint32_t kept = 0;
    for (size_t step = 0; step < 4; step++) {
        w = expect_verify(h, "v");
        assert_int_equal(w->verify->prefill_only, step < 3);
        assert_int_equal(w->verify->seqs[0]->keep_len, kept);
        assert_int_equal(w->verify->seqs[0]->n_append, want[step]);
        assert_true(w->verify->seqs[0]->n_append <= 5 * 16); /* a wrong hint's worst step */
        kept += want[step];
        vres r = {.cached_len = kept};
        if (step < 3) reply_verify(h, "v", w->verify, &r);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    harness_free(h);
}

/* Placement: a request goes to the group where it waits least by that
 * group's measured step cost (the faster group takes more, the slower one
 * some); it stays there while the group lives (affinity: its next steps
 * go to the same group with its cache kept); a group that dies hands its
 * requests to the other, which refills them from their committed tokens. */
static void test_placement_load_affinity_failover(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_group(h, "fast", 1000, 100);
    register_group(h, "slow", 1000, 300);
    int32_t gf = widx(h, "fast"), gs = widx(h, "slow");
    assert_true(gf >= 0 && gs >= 0);
    for (int i = 0; i < 8; i++) {
        int32_t prompt[2] = {5 + i, 6};
        submit(h, "c", prompt, 2, 20, NULL);
        (void)expect_accepted(h, "c");
    }
    int32_t nf = n_on(h, gf, false), ns = n_on(h, gs, false);
    print_message("placed: fast %d, slow %d\n", nf, ns);
    assert_int_equal(nf + ns, 8);
    assert_true(ns >= 1 && nf >= 2 * ns); /* 3x slower per token: a third of the share or less */
    uint64_t on_fast[8];
    int32_t n_fast = 0;
    for (int32_t i = 0; i < h->c.n_sessions; i++)
        if (h->c.sessions[i]->group == gf) on_fast[n_fast++] = h->c.sessions[i]->id;
    /* every step of a request goes to its group, its cache kept there */
    for (int round = 0; round < 3; round++) {
        const char *g[2] = {"fast", "slow"};
        for (int k = 0; k < 2; k++) {
            Specd__CoordinatorToWorker *w = pop_worker(h, g[k]); /* its one step in flight */
            if (w) {
                assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
                for (size_t i = 0; i < w->verify->n_seqs; i++) {
                    bool fast_req = false;
                    for (int32_t j = 0; j < n_fast; j++) fast_req |= on_fast[j] == w->verify->seqs[i]->request_id;
                    assert_int_equal(fast_req, k == 0);
                    if (round > 0 && w->verify->seqs[i]->keep_len > 0)
                        assert_int_equal(w->verify->seqs[i]->n_append, 1);
                }
                answer_plain(h, g[k], w, 40 + round);
                specd__coordinator_to_worker__free_unpacked(w, NULL);
            }
        }
    }
    assert_int_equal(n_on(h, gf, false), nf);
    assert_int_equal(n_on(h, gs, false), ns);
    /* the fast group dies (silent); the slow one lives */
    uint64_t dead = (uint64_t)h->c.p.heartbeat_interval_ms * 1000u * (uint64_t)(h->c.p.heartbeat_liveness + 1);
    h->now += dead / 2;
    heartbeat(h, "slow");
    h->now += dead / 2 + 1000;
    heartbeat(h, "slow");
    sd_workers_tick(&h->c, h->now);
    assert_int_equal(widx(h, "fast"), -1);
    assert_int_equal(n_on(h, gs, false), 8);
    /* the slow group's step in flight comes back; its next step carries
     * all eight, the moved ones refilled from keep_len 0 */
    Specd__CoordinatorToWorker *w = pop_worker(h, "slow");
    if (w && w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
        answer_plain(h, "slow", w, 50);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
        w = pop_worker(h, "slow");
    }
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
    assert_int_equal(w->verify->n_seqs, 8);
    int32_t refilled = 0;
    for (size_t i = 0; i < w->verify->n_seqs; i++) {
        const Specd__VerifySeq *q = w->verify->seqs[i];
        if (q->keep_len == 0) {
            refilled++;
            assert_true(q->n_append >= 4); /* 2 prompt tokens + at least 2 committed on the fast group */
        }
    }
    assert_int_equal(refilled, nf);
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    harness_free(h);
}

/* The group of session id (-1 when none). */
static int32_t group_of_request(const harness *h, uint64_t id) {
    for (int32_t i = 0; i < h->c.n_sessions; i++)
        if (h->c.sessions[i]->id == id) return h->c.sessions[i]->group;
    return -1;
}

/* Placement by cached prefix (prefix_route.c): a request whose prompt
 * extends one a group has prefilled goes to that group although it is the
 * busier one, while that group holds no more than an even share; the next
 * goes to the other group by load (no piling). Before the coordinator saw
 * the prefill, load alone decides. */
static void test_placement_prefix(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_group(h, "a", 1000, 100);
    register_group(h, "b", 1000, 100);
    int32_t ga = widx(h, "a"), gb = widx(h, "b");
    assert_true(ga >= 0 && gb >= 0);
    int32_t prompt[72];
    for (int i = 0; i < 72; i++) prompt[i] = 10 + (i * 7) % 90;
    submit(h, "c", prompt, 64, 20, NULL);
    uint64_t first = expect_accepted(h, "c");
    int32_t g1 = group_of_request(h, first), g2 = g1 == ga ? gb : ga;
    const char *name1 = g1 == ga ? "a" : "b";
    Specd__CoordinatorToWorker *w = pop_worker(h, name1);
    assert_non_null(w);
    assert_int_equal(w->body_case, SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY);
    answer_plain(h, name1, w, 7); /* the 64-token prompt is prefilled on g1 */
    specd__coordinator_to_worker__free_unpacked(w, NULL);
    drain(h); /* its token, its next step */
    prompt[64] = 3;
    submit(h, "c", prompt, 66, 20, NULL);
    uint64_t second = expect_accepted(h, "c");
    assert_int_equal(group_of_request(h, second), g1); /* 2 tokens to compute there, 66 on the other */
    prompt[64] = 4;
    submit(h, "c", prompt, 66, 20, NULL);
    uint64_t third = expect_accepted(h, "c");
    assert_int_equal(group_of_request(h, third), g2); /* g1 holds more than an even share */
    harness_free(h);
}

/* A group that drains (UNAVAILABLE after its last step) hands its
 * requests over at once, without waiting out the liveness period. */
static void test_drained_group_hands_over(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_new(NULL);
    register_ok(h, "g1", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "g2", SPECD__ROLE__ROLE_VERIFIER);
    for (int i = 0; i < 4; i++) {
        int32_t prompt[2] = {5 + i, 6};
        submit(h, "c", prompt, 2, 20, NULL);
        (void)expect_accepted(h, "c");
    }
    int32_t g1 = widx(h, "g1"), g2 = widx(h, "g2");
    assert_int_equal(n_on(h, g1, false), 2); /* equal groups: an even split */
    assert_int_equal(n_on(h, g2, false), 2);
    Specd__Error e = SPECD__ERROR__INIT;
    e.code = SPECD__CODE__CODE_UNAVAILABLE;
    e.message = "g1 is draining (stopped): its requests go to the others";
    Specd__WorkerToCoordinator wenv = SPECD__WORKER_TO_COORDINATOR__INIT;
    wenv.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR;
    wenv.error = &e;
    feed_worker(h, "g1", &wenv);
    assert_int_equal(widx(h, "g1"), -1);
    assert_int_equal(n_on(h, g2, false), 4);
    assert_int_equal(h->c.n_active, 4);
    harness_free(h);
}

/* Drafters: requests are spread over the live drafters; one that
 * registers takes its share of the running requests (Release on the old
 * drafter); one that dies hands its requests to the others, and with none
 * left they run with K = 0. A request pinned to a drafter kind waits for
 * a drafter of that kind (K = 0 meanwhile). */
static void test_drafters_share_failover_pin(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_fixed_k(2);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "d1", SPECD__ROLE__ROLE_DRAFTER);
    for (int i = 0; i < 4; i++) {
        int32_t prompt[3] = {5 + i, 6, 7};
        submit(h, "c", prompt, 3, 30, NULL);
        (void)expect_accepted(h, "c");
    }
    int32_t d1 = widx(h, "d1");
    assert_int_equal(n_on(h, d1, true), 4);
    /* d1 answers its warm-up drafts: the requests are between draft steps */
    Specd__CoordinatorToWorker *w;
    int32_t toks[2] = {9, 9};
    while ((w = pop_worker(h, "d1")) != NULL) {
        if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) reply_draft(h, "d1", w->draft, toks, 2);
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    drain(h);
    register_ok(h, "d2", SPECD__ROLE__ROLE_DRAFTER);
    int32_t d2 = widx(h, "d2");
    int32_t moved = n_on(h, d2, true);
    print_message("d2 took %d of 4\n", moved);
    assert_int_equal(moved + n_on(h, d1, true), 4);
    assert_true(moved >= 1);
    int32_t released = 0;
    while ((w = pop_worker(h, "d1")) != NULL) {
        if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE) released += (int32_t)w->release->n_request_ids;
        specd__coordinator_to_worker__free_unpacked(w, NULL);
    }
    assert_true(released >= 1 && released <= moved);
    /* d1 dies: its requests go to d2 */
    uint64_t dead = (uint64_t)h->c.p.heartbeat_interval_ms * 1000u * (uint64_t)(h->c.p.heartbeat_liveness + 1);
    h->now += dead / 2;
    heartbeat(h, "v");
    heartbeat(h, "d2");
    h->now += dead / 2 + 1000;
    heartbeat(h, "v");
    heartbeat(h, "d2");
    sd_workers_tick(&h->c, h->now);
    assert_int_equal(widx(h, "d1"), -1);
    assert_int_equal(n_on(h, d2, true), 4);
    /* d2 goes too: K = 0 for everyone */
    h->now += dead + 1000;
    heartbeat(h, "v");
    sd_workers_tick(&h->c, h->now);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_DRAFTER), 0);
    for (int32_t i = 0; i < h->c.n_sessions; i++) {
        assert_int_equal(h->c.sessions[i]->drafter, -1);
        assert_int_equal(sd_max_k(&h->c, h->c.sessions[i]), 0);
    }
    /* a request pinned to the model drafter kind: not the n-gram drafter */
    register_ok(h, "dn", SPECD__ROLE__ROLE_DRAFTER);
    Specd__SubmitRequest sr = SPECD__SUBMIT_REQUEST__INIT;
    sr.client_tag = 77;
    int32_t prompt[3] = {11, 12, 13};
    sr.prompt_ids = prompt;
    sr.n_prompt_ids = 3;
    sr.max_tokens = 10;
    sr.drafter_kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    Specd__ClientToCoordinator ce = SPECD__CLIENT_TO_COORDINATOR__INIT;
    ce.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    ce.submit = &sr;
    feed_client(h, "c", &ce);
    uint64_t pinned = expect_accepted(h, "c");
    sd_session *s = sd_sched_find(&h->c, pinned);
    assert_non_null(s);
    assert_int_equal(s->drafter, -1);
    assert_int_equal(n_on(h, widx(h, "dn"), true), 4); /* the others took the n-gram drafter */
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    register_ok(h, "dm", SPECD__ROLE__ROLE_DRAFTER);
    sd_sched_pump(&h->c, h->now);
    assert_int_equal(s->drafter, widx(h, "dm"));
    /* an unknown kind is refused at the door */
    sr.drafter_kind = 9;
    feed_client(h, "c", &ce);
    Specd__CoordinatorToClient *m = pop_client(h, "c");
    while (m && m->body_case != SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR) {
        specd__coordinator_to_client__free_unpacked(m, NULL);
        m = pop_client(h, "c");
    }
    assert_non_null(m);
    assert_non_null(strstr(m->error->message, "drafter_kind"));
    specd__coordinator_to_client__free_unpacked(m, NULL);
    harness_free(h);
}

/* The drafter-choice tests' service: K fixed at 3, a verifier "v" with a
 * 5 ms + 1 ms a token step, an n-gram drafter "dn" and a model drafter
 * "dm" (h->kind stays MODEL for drafters registered after). */
static harness *choice_harness(void) {
    harness *h = harness_fixed_k(3);
    h->fwd_fixed_us = 5000;
    h->fwd_token_us = 1000;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "dn", SPECD__ROLE__ROLE_DRAFTER); /* NGRAM */
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    register_ok(h, "dm", SPECD__ROLE__ROLE_DRAFTER);
    return h;
}

/* Drafter choice: two requests, two drafter kinds; the n-gram drafter's
 * drafts are accepted on the first request only ("repeat this text"), the
 * model drafter's on the second only (open chat). After trying both, each
 * request keeps the kind that commits more tokens per step for it, and is
 * drafted by it; a request whose text changes character (the model's
 * drafts stop being accepted on the second) tries the kinds again and
 * moves. */
static void test_drafter_choice_by_goodput(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_fixed_k(3);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "dn", SPECD__ROLE__ROLE_DRAFTER); /* NGRAM */
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    register_ok(h, "dm", SPECD__ROLE__ROLE_DRAFTER);
    int32_t dn = widx(h, "dn"), dm = widx(h, "dm");
    int32_t prompt[3] = {5, 6, 7};
    submit(h, "c", prompt, 3, 250, NULL);
    uint64_t copy = expect_accepted(h, "c");
    submit(h, "c", prompt, 3, 250, NULL);
    uint64_t chat = expect_accepted(h, "c");
    bool chat_changes = false;
    const char *who[3] = {"v", "dn", "dm"};
    int32_t toks[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    Specd__DrafterKind chat_last = 0;
    for (int round = 0; round < 400; round++) {
        if (round == 40) chat_changes = true;
        harness_compact(h);
        bool any = false;
        for (int k = 0; k < 3; k++) {
            Specd__CoordinatorToWorker *w = pop_worker(h, who[k]);
            if (!w) continue;
            any = true;
            if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) {
                reply_draft(h, who[k], w->draft, toks, 8);
            } else if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
                vres r[16];
                memset(r, 0, sizeof r);
                for (size_t i = 0; i < w->verify->n_seqs; i++) {
                    const Specd__VerifySeq *q = w->verify->seqs[i];
                    sd_session *s = sd_sched_find(&h->c, q->request_id);
                    bool by_ngram = s && s->drafter == dn, by_model = s && s->drafter == dm;
                    bool good = q->request_id == copy ? by_ngram : (chat_changes ? by_ngram : by_model);
                    uint32_t acc = good && !w->verify->prefill_only ? (uint32_t)q->n_draft : 0;
                    for (uint32_t j = 0; j < acc; j++) r[i].commit[j] = 9;
                    r[i].n_accepted = acc;
                    /* the chat request's text does not repeat itself (the
                     * shadow n-gram lookup finds nothing to copy in it) */
                    r[i].commit[acc] = q->request_id == chat && !chat_changes ? 20 + (round * 37) % 250 : 10;
                    r[i].n_commit = w->verify->prefill_only ? 0 : acc + 1;
                    r[i].cached_len = q->keep_len + (uint32_t)q->n_append + acc;
                }
                reply_verify(h, "v", w->verify, r);
            }
            specd__coordinator_to_worker__free_unpacked(w, NULL);
        }
        if (!any) break;
        const sd_session *cs = sd_sched_find(&h->c, chat);
        if (cs && cs->kind_chosen) chat_last = cs->want_kind;
        if (round == 39) {
            sd_session *a = sd_sched_find(&h->c, copy), *b = sd_sched_find(&h->c, chat);
            assert_non_null(a);
            assert_non_null(b);
            print_message("copy request: %s, chat request: %s\n",
                          a->want_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM ? "ngram" : "model",
                          b->want_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM ? "ngram" : "model");
            assert_true(a->kind_chosen && b->kind_chosen);
            assert_int_equal(a->want_kind, SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM);
            assert_int_equal(b->want_kind, SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL);
            assert_int_equal(a->drafter, dn);
            assert_int_equal(b->drafter, dm);
            assert_true(sd_choice_goodput(&h->c, a, SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM) >
                        sd_choice_goodput(&h->c, a, SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL));
        }
    }
    assert_int_equal(chat_last, SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM); /* it switched */
    harness_free(h);
}

/* The "chat turn that starts quoting" of the choice, seen by the shadow
 * n-gram lookup: a good draft model drafts the request throughout (all of
 * its drafts are accepted, at 1 ms a draft token), the n-gram drafter is
 * not tried on it while the text is chat (it does not repeat itself), and once
 * the text quotes the prompt the shadow lookup's goodput (all 3 of its
 * proposals taken, at no drafting cost) passes the model's, so the request
 * moves to the n-gram drafter although the model's own acceptance never
 * dropped. The text is the test's "target": each verify step commits the
 * drafts that match it and its next token. */
#define SHADOW_PROMPT 40
#define SHADOW_CHAT   60
static int32_t shadow_truth(const int32_t *prompt, int32_t pos) {
    if (pos < SHADOW_PROMPT) return prompt[pos];
    int32_t g = pos - SHADOW_PROMPT;
    if (g < SHADOW_CHAT) return 20 + (int32_t)((uint32_t)(g + 1) * 2654435761u % 271u); /* no repeats nearby */
    return prompt[(g - SHADOW_CHAT) % SHADOW_PROMPT];                                   /* the quotation */
}

static void test_drafter_choice_shadow_ngram(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_fixed_k(3);
    h->fwd_fixed_us = 5000; /* a verify step: 5 ms + 1 ms a row */
    h->fwd_token_us = 1000;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    register_ok(h, "dm", SPECD__ROLE__ROLE_DRAFTER);
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    register_ok(h, "dn", SPECD__ROLE__ROLE_DRAFTER);
    int32_t prompt[SHADOW_PROMPT];
    for (int32_t i = 0; i < SHADOW_PROMPT; i++) prompt[i] = 20 + (int32_t)((uint32_t)(i + 7) * 40503u % 263u);
    submit(h, "c", prompt, SHADOW_PROMPT, SHADOW_CHAT + 2 * SHADOW_PROMPT, NULL);
    uint64_t rid = expect_accepted(h, "c");
    const char *who[3] = {"v", "dn", "dm"};
    int32_t chose_model_at = -1, moved_at = -1, ngram_drafts_in_chat = 0, ngram_drafts_in_quote = 0;
    double model_tokens_when_moved = 0;
    for (int round = 0; round < 400; round++) {
        harness_compact(h);
        bool any = false;
        for (int k = 0; k < 3; k++) {
            Specd__CoordinatorToWorker *w = pop_worker(h, who[k]);
            if (!w) continue;
            any = true;
            sd_session *s = sd_sched_find(&h->c, rid);
            if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT && s) {
                /* the model drafts the text; the n-gram drafter only a quotation */
                int32_t toks[8];
                for (int32_t j = 0; j < 8; j++) {
                    int32_t t = shadow_truth(prompt, s->n_tokens + j);
                    bool quoting = s->n_tokens + j >= SHADOW_PROMPT + SHADOW_CHAT;
                    toks[j] = k == 2 || quoting ? t : 7;
                }
                if (k == 1 && s->n_tokens < SHADOW_PROMPT + SHADOW_CHAT && w->draft->n_seqs > 0 &&
                    w->draft->seqs[0]->k > 0)
                    ngram_drafts_in_chat++;
                if (k == 1 && s->n_tokens >= SHADOW_PROMPT + SHADOW_CHAT) ngram_drafts_in_quote++;
                h->draft_us = k == 2 ? 3000 : 10; /* per step of 3: 1 ms a model draft token */
                reply_draft(h, who[k], w->draft, toks, 8);
            } else if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
                vres r[16];
                memset(r, 0, sizeof r);
                for (size_t i = 0; i < w->verify->n_seqs; i++) {
                    const Specd__VerifySeq *q = w->verify->seqs[i];
                    sd_session *x = sd_sched_find(&h->c, q->request_id);
                    assert_non_null(x);
                    uint32_t acc = 0;
                    int32_t at = x->n_tokens;
                    while (!w->verify->prefill_only && acc < q->n_draft &&
                           q->draft[acc] == shadow_truth(prompt, at + (int32_t)acc))
                        acc++;
                    for (uint32_t j = 0; j <= acc; j++) r[i].commit[j] = shadow_truth(prompt, at + (int32_t)j);
                    r[i].n_accepted = acc;
                    r[i].n_commit = w->verify->prefill_only ? 0 : acc + 1;
                    r[i].cached_len = q->keep_len + (uint32_t)q->n_append + acc;
                }
                reply_verify(h, "v", w->verify, r);
            }
            specd__coordinator_to_worker__free_unpacked(w, NULL);
        }
        if (!any) break;
        const sd_session *s = sd_sched_find(&h->c, rid);
        if (!s) break;
        if (chose_model_at < 0 && s->kind_chosen && s->want_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL)
            chose_model_at = s->n_tokens;
        if (moved_at < 0 && s->kind_chosen && s->want_kind == SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM) {
            moved_at = s->n_tokens;
            model_tokens_when_moved = s->kinds[SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL].tokens;
        }
    }
    print_message("model chosen at %d tokens, moved to n-gram at %d (quotation from %d), model's tokens a step "
                  "then %.2f, n-gram drafts during the chat %d\n",
                  chose_model_at, moved_at, SHADOW_PROMPT + SHADOW_CHAT, model_tokens_when_moved, ngram_drafts_in_chat);
    assert_true(chose_model_at > 0 && chose_model_at < SHADOW_PROMPT + SHADOW_CHAT);
    /* priced by the shadow: a trial would be 4 steps of n-gram drafts (one
     * may complete it, as a step without drafts shadows nothing) */
    assert_true(ngram_drafts_in_chat < 4);
    assert_true(moved_at >= SHADOW_PROMPT + SHADOW_CHAT && moved_at < SHADOW_PROMPT + SHADOW_CHAT + 48);
    assert_true(model_tokens_when_moved > 3.5); /* not a drop in the model's acceptance */
    assert_true(ngram_drafts_in_quote > 0);     /* and it drafted the quotation */
    harness_free(h);
}

/* A costly kind is not tried where it has not paid: after requests on
 * which the model drafter committed 2 tokens a step (1 of its 3 drafts) at
 * 0.2 ms a draft token while n-gram committed 3 (2 of 3) for nothing, a new
 * request that n-gram serves as well is not moved to the model drafter for
 * a trial (which would cost it the model's prefill of its prefix and its
 * steps), except the one request in 16 of those asked that keeps the
 * model's record current. (The model is cheap enough here that it could
 * pay with every draft accepted: test_drafter_choice_cannot_pay covers a
 * kind that could not.) */
static void test_drafter_choice_skips_unpromising(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = choice_harness();
    int32_t dn = widx(h, "dn"), dm = widx(h, "dm");
    const char *who[3] = {"v", "dn", "dm"};
    int32_t toks[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    int32_t model_trials_late = 0, late_requests = 0, explorers = 0, explorer_trials = 0;
    for (int r = 0; r < 12; r++) {
        int32_t prompt[3] = {5, 6, 7};
        submit(h, "c", prompt, 3, 60, NULL);
        uint64_t rid = expect_accepted(h, "c");
        bool tried_model = false;
        int8_t explore = 0;
        for (int round = 0; round < 200; round++) {
            harness_compact(h);
            bool any = false;
            for (int k = 0; k < 3; k++) {
                Specd__CoordinatorToWorker *w = pop_worker(h, who[k]);
                if (!w) continue;
                any = true;
                if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) {
                    if (k == 2) tried_model = true;
                    h->draft_us = k == 2 ? 600 : 10;
                    reply_draft(h, who[k], w->draft, toks, 8);
                } else if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
                    vres res[16];
                    memset(res, 0, sizeof res);
                    for (size_t i = 0; i < w->verify->n_seqs; i++) {
                        const Specd__VerifySeq *q = w->verify->seqs[i];
                        sd_session *s = sd_sched_find(&h->c, q->request_id);
                        uint32_t acc = 0;
                        if (s && !w->verify->prefill_only && q->n_draft > 0)
                            acc = s->drafter == dn ? (uint32_t)q->n_draft - 1 : s->drafter == dm ? 1u : 0u;
                        for (uint32_t j = 0; j < acc; j++) res[i].commit[j] = 9;
                        res[i].commit[acc] = 10;
                        res[i].n_accepted = acc;
                        res[i].n_commit = w->verify->prefill_only ? 0 : acc + 1;
                        res[i].cached_len = q->keep_len + (uint32_t)q->n_append + acc;
                    }
                    reply_verify(h, "v", w->verify, res);
                }
                specd__coordinator_to_worker__free_unpacked(w, NULL);
            }
            if (!any) break;
            const sd_session *s = sd_sched_find(&h->c, rid);
            if (s && s->explore) explore = s->explore;
        }
        assert_null(sd_sched_find(&h->c, rid)); /* finished */
        if (explore > 0) {
            explorers++;
            explorer_trials += tried_model;
        } else if (r >= 6) {
            late_requests++;
            model_trials_late += tried_model;
        }
    }
    print_message("model kind: goodput %.2f over %u choices, n-gram %.2f; tried on %d of %d later requests, "
                  "%d of %d exploring ones\n",
                  h->c.kind_goodput[SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL],
                  h->c.kind_decisions[SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL],
                  h->c.kind_goodput[SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM], model_trials_late, late_requests,
                  explorer_trials, explorers);
    assert_true(h->c.kind_decisions[SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL] >= 4);
    assert_true(late_requests >= 4);
    assert_int_equal(model_trials_late, 0);
    /* the first request asked explores (one in 16 of those asked, counted
     * by the coordinator, not by request id), and it does try the model */
    assert_int_equal(explorers, 1);
    assert_int_equal(explorer_trials, 1);
    harness_free(h);
}

/* One request of n_prompt tokens through test_drafter_choice_cannot_pay's
 * service: the n-gram drafter's drafts accepted ng_acc of 3 at a step, the
 * model's model_acc; the model drafts at 1 ms a token and takes in a
 * prefix at 0.2 ms a token. Returns whether the model drafted for it; with
 * ngram_record, the request's n-gram record (tokens a step) as last seen
 * goes there; model_steps counts the model's draft steps for it. */
static bool cannot_pay_request(harness *h, int32_t n_prompt, uint32_t max_tokens, uint32_t ng_acc, uint32_t model_acc,
                               double *ngram_record, int32_t *model_steps) {
    int32_t dn = widx(h, "dn"), dm = widx(h, "dm");
    const char *who[3] = {"v", "dn", "dm"};
    int32_t toks[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    int32_t prompt[128];
    for (int32_t i = 0; i < n_prompt && i < 128; i++) prompt[i] = 20 + (i * 37) % 200;
    submit(h, "c", prompt, (size_t)n_prompt, max_tokens, NULL);
    uint64_t rid = expect_accepted(h, "c");
    bool tried_model = false;
    for (int round = 0; round < 400; round++) {
        harness_compact(h);
        bool any = false;
        for (int k = 0; k < 3; k++) {
            Specd__CoordinatorToWorker *w = pop_worker(h, who[k]);
            if (!w) continue;
            any = true;
            if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT) {
                uint32_t appended = w->draft->n_seqs > 0 ? (uint32_t)w->draft->seqs[0]->n_append : 0;
                if (k == 2) tried_model = true;
                if (k == 2 && model_steps) ++*model_steps;
                h->draft_us =
                    k == 2 ? (h->model_draft_us ? h->model_draft_us : 3000) + (appended > 4 ? 200 * appended : 0) : 10;
                if (h->clock_runs) h->now += h->draft_us + (k == 2 ? h->model_extra_us : 0);
                reply_draft(h, who[k], w->draft, toks, 8);
            } else if (w->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
                vres res[16];
                memset(res, 0, sizeof res);
                for (size_t i = 0; i < w->verify->n_seqs; i++) {
                    const Specd__VerifySeq *q = w->verify->seqs[i];
                    sd_session *x = sd_sched_find(&h->c, q->request_id);
                    uint32_t acc = 0;
                    if (x && !w->verify->prefill_only && q->n_draft > 0)
                        acc = x->drafter == dn ? ng_acc : x->drafter == dm ? model_acc : 0u;
                    if (acc > q->n_draft) acc = (uint32_t)q->n_draft;
                    for (uint32_t j = 0; j < acc; j++) res[i].commit[j] = 9;
                    res[i].commit[acc] = 10;
                    if (h->text_unrepeated && x) /* the token after the accepted drafts */
                        res[i].commit[acc] = 20 + (int32_t)((uint32_t)(x->n_tokens + 1) * 2654435761u % 271u);
                    res[i].n_accepted = acc;
                    res[i].n_commit = w->verify->prefill_only ? 0 : acc + 1;
                    res[i].cached_len = q->keep_len + (uint32_t)q->n_append + acc;
                }
                if (h->clock_runs) {
                    uint32_t tokens = 0;
                    for (size_t i = 0; i < w->verify->n_seqs; i++)
                        tokens += (uint32_t)(w->verify->seqs[i]->n_append + w->verify->seqs[i]->n_draft);
                    h->now += h->fwd_fixed_us + h->fwd_token_us * tokens;
                }
                reply_verify(h, "v", w->verify, res);
            }
            specd__coordinator_to_worker__free_unpacked(w, NULL);
        }
        if (!any) break;
        const sd_session *s = sd_sched_find(&h->c, rid);
        if (ngram_record && s && s->kinds[SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM].steps > 0)
            *ngram_record = s->kinds[SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM].tokens;
    }
    assert_null(sd_sched_find(&h->c, rid)); /* finished */
    return tried_model;
}

/* choice_harness() where the model drafter (2 ms of drafting a step) has
 * a record from 6 requests on which it commits what n-gram does (2 of 3
 * drafts each, at a cost): from then on it is an unpromising kind for
 * such requests, tried only by the request that samples. */
static harness *unpromising_model_harness(void) {
    harness *h = choice_harness();
    h->model_draft_us = 2000;
    h->text_unrepeated = true;
    for (int r = 0; r < 6; r++) cannot_pay_request(h, 3, 60, 2, 2, NULL, NULL);
    assert_true(h->c.kind_decisions[SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL] >= 4);
    return h;
}

/* A kind that cannot pay on a request is not tried on it, not even by the
 * requests that sample unpromising kinds: on a chat request (n-gram's
 * drafts all rejected) the model drafter (all accepted, 1 ms a draft token
 * against a 6 ms step) is tried and kept, which measures its costs; on
 * requests that n-gram copies (all 3 drafts accepted: 4 tokens a step for
 * nothing) even a model whose every draft were accepted would commit less
 * per unit of time, so none tries it. With n-gram taking 1 of 3 the model
 * could pay per step, but moving a request costs the model's intake of its
 * prefix (0.2 ms a token): on a 100-token prompt that leaves room for 16
 * tokens it costs more than the model could save, and the request stays
 * on n-gram; with room for 140 it is tried. Also: the step of the prompt,
 * which carries no drafts, is not in the first kind's trial record (n-gram
 * committing 4 a step is recorded as 4, not pulled down by that 1), and on
 * a cold service a trial that turns out unable to pay ends as soon as the
 * kind's cost is measured. */
static void test_drafter_choice_cannot_pay(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = choice_harness();
    int32_t dm = widx(h, "dm");
    /* a cold service (the model's cost not measured yet): its first request,
     * a copy, tries the model, and ends the trial once the model's cost
     * is known (its first draft step takes in the prompt, the second is
     * measured), not after 4 steps, and ends on n-gram */
    int32_t model_steps = 0;
    assert_true(cannot_pay_request(h, 3, 60, 3, 3, NULL, &model_steps));
    print_message("cold copy request: %d model draft steps\n", model_steps);
    assert_true(model_steps >= 2 && model_steps <= 3);
    assert_true(cannot_pay_request(h, 3, 60, 0, 3, NULL, NULL)); /* chat: the model is tried (and kept) */
    print_message("model: %.0f us a draft token, %.0f us a prefix token\n", h->c.workers[dm].cost.draft_token_us,
                  h->c.workers[dm].refill_token_us);
    assert_true(h->c.workers[dm].refill_token_us > 100 && h->c.workers[dm].refill_token_us < 300);
    int32_t copy_trials = 0;
    for (int r = 0; r < 10; r++) {
        double rec = 0;
        copy_trials += cannot_pay_request(h, 3, 60, 3, 3, &rec, NULL);
        assert_true(rec > 3.999 && rec < 4.001);
    }
    print_message("copy requests that tried the model: %d of 10 (%u asked whether to explore)\n", copy_trials,
                  h->c.explore_asked);
    assert_int_equal(copy_trials, 0);
    assert_false(cannot_pay_request(h, 100, 16, 1, 3, NULL, NULL)); /* the move costs more than it could save */
    assert_true(cannot_pay_request(h, 100, 140, 1, 3, NULL, NULL)); /* room enough: tried */
    harness_free(h);
}

/* A kind is tried only where its record beats what the request gets by
 * SD_CHOICE_PROMISE (1.3x): the model drafter (2 of its 3 drafts accepted,
 * 2 ms a step of drafting against a 9 ms verify step) is tried and kept on
 * chat requests, where n-gram's drafts are all rejected; on requests where
 * n-gram takes 1 of 3 (2 tokens a step at no drafting cost) the model's
 * record is only about 1.1x theirs, which a trial's move and its steps
 * would not repay, and only the request in 16 that samples unpromising kinds
 * tries it (the old rule, any record above the request's, tried it on
 * every one: this test fails with SD_CHOICE_PROMISE 1.0). */
static void test_drafter_choice_promising_margin(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = choice_harness();
    h->model_draft_us = 2000;
    h->text_unrepeated = true;
    const Specd__DrafterKind model = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    int32_t chat_trials = 0;
    for (int r = 0; r < 5; r++) chat_trials += cannot_pay_request(h, 3, 60, 0, 2, NULL, NULL);
    print_message("chat: the model tried on %d of 5; its record %.2f over %u choices\n", chat_trials,
                  h->c.kind_goodput[model], h->c.kind_decisions[model]);
    assert_int_equal(chat_trials, 5);
    assert_true(h->c.kind_decisions[model] >= 4);
    int32_t trials = 0, explorers = 0;
    for (int r = 0; r < 16; r++) {
        uint32_t asked = h->c.explore_asked;
        double rec = 0;
        bool tried = cannot_pay_request(h, 3, 60, 1, 2, &rec, NULL);
        assert_int_equal(h->c.explore_asked, asked + 1); /* it asked: the model looked unpromising */
        bool explorer = asked % 16 == 0;
        if (!explorer) assert_true(rec > 1.999 && rec < 2.001); /* n-gram's own steps only */
        explorers += explorer;
        assert_true(tried == explorer);
        trials += tried;
    }
    assert_true(cannot_pay_request(h, 3, 60, 0, 2, NULL, NULL)); /* chat again: still tried */
    /* the margin is what kept them: the model's record beats theirs */
    submit(h, "c", (const int32_t[]){5, 6, 7}, 3, 60, NULL);
    sd_session *s = sd_sched_find(&h->c, expect_accepted(h, "c"));
    assert_non_null(s);
    const Specd__DrafterKind ngram = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    s->kinds[ngram].tokens = 2;
    s->kinds[ngram].k = 3;
    s->kinds[ngram].steps = 4;
    double g_ngram = sd_choice_goodput(&h->c, s, ngram);
    print_message("n-gram taking 1 of 3 (%.2f net; the model's record %.2f): the model tried on %d of 16 (%d "
                  "sampling)\n",
                  g_ngram, h->c.kind_goodput[model], trials, explorers);
    assert_true(h->c.kind_goodput[model] > g_ngram && h->c.kind_goodput[model] < 1.3 * g_ngram);
    assert_int_equal(explorers, 1);
    harness_free(h);
}

/* A request that samples an unpromising kind stands for the 16 asked: its
 * decision moves the kind's record by 0.97 (1 - 0.8^16), not the 0.2 of one
 * request. The model drafter is unpromising after requests where it
 * committed 3 tokens a step against n-gram's 3 (no drafting cost); then
 * the text changes (the model now commits 4, n-gram 2): the requests
 * before the sample do not try it, the sample does, and the very next
 * request tries it too (at 0.2 the record would need 4 more samples, 64
 * requests, to pass the 1.3x margin: what happened on the demo model after
 * a spell of outside load had depressed the draft model's record). */
static void test_drafter_choice_sample_weight(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = unpromising_model_harness();
    const Specd__DrafterKind model = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    double before = h->c.kind_goodput[model];
    print_message("the model's record %.2f over %u choices\n", before, h->c.kind_decisions[model]);
    int32_t sampled_at = -1;
    for (int r = 0; r < 20 && sampled_at < 0; r++) {
        uint32_t asked = h->c.explore_asked;
        bool tried = cannot_pay_request(h, 3, 60, 1, 3, NULL, NULL);
        bool sample = h->c.explore_asked > asked && asked % 16 == 0;
        assert_true(tried == sample);
        if (sample) sampled_at = r;
    }
    double after = h->c.kind_goodput[model];
    uint32_t asked = h->c.explore_asked;
    bool next_tried = cannot_pay_request(h, 3, 60, 1, 3, NULL, NULL);
    print_message("sampled at request %d: the record %.2f -> %.2f; the next request tried it: %d (asked %u -> %u)\n",
                  sampled_at, before, after, next_tried, asked, h->c.explore_asked);
    assert_true(sampled_at >= 0);
    assert_true(next_tried);
    assert_int_equal(h->c.explore_asked, asked); /* promising again: not a sample */
    harness_free(h);
}

/* One in 16 of the requests asked samples an unpromising kind, not one in
 * 8: with both models on two threads each sample of the draft model cost
 * its request 8-43% (routing-cpu.md). The model drafter is unpromising
 * (3 tokens a step at 2 ms of drafting against n-gram's 3 for nothing);
 * over the next 32 requests asked exactly 2 try it (4 at one in 8), the
 * 1st and the 17th asked, and each of those moves the model's record
 * nearly all the way (0.97) to what it gave on that request. */
static void test_drafter_choice_sample_rate(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = unpromising_model_harness();
    const Specd__DrafterKind model = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    /* start the count at a sample's turn */
    while (h->c.explore_asked % 16 != 0) {
        uint32_t asked = h->c.explore_asked;
        assert_false(cannot_pay_request(h, 3, 60, 2, 2, NULL, NULL));
        assert_int_equal(h->c.explore_asked, asked + 1);
    }
    int32_t samples = 0, first = -1, second = -1;
    double first_move = 0;
    for (int r = 0; r < 32; r++) {
        uint32_t asked = h->c.explore_asked;
        double before = h->c.kind_goodput[model];
        /* the sample's request: the model commits 2 tokens a step there
         * (below its record of 3, so the record stays unpromising) */
        bool tried = cannot_pay_request(h, 3, 60, 2, 1, NULL, NULL);
        assert_int_equal(h->c.explore_asked, asked + 1); /* every one asked */
        if (!tried) {
            assert_true(h->c.kind_goodput[model] == before); /* no decision on the model */
            continue;
        }
        samples++;
        if (first < 0)
            first = r;
        else
            second = r;
        double after = h->c.kind_goodput[model];
        print_message("sample at %d: the model's record %.3f -> %.3f\n", r, before, after);
        assert_true(after < before);
        if (samples == 1)
            first_move = before - after;
        else /* the same request again: the first went 0.97 of the way, so this
              * one moves 0.97 * 0.03 of that gap (0.83 * 0.17 at 0.83) */
            assert_true(before - after < 0.06 * first_move);
    }
    print_message("%d samples in 32 requests asked (at %d and %d)\n", samples, first, second);
    assert_int_equal(samples, 2);
    assert_int_equal(first, 0);
    assert_int_equal(second, 16);
    harness_free(h);
}

/* A due sample goes to a request whose move is cheap: where the model
 * drafter is unpromising, the request at the sample's turn has a
 * 100-token prompt and room for 24 tokens (the model could pay there, but
 * its intake of the prefix, 0.2 ms a token, is over SD_CHOICE_MOVE_SHARE
 * of the request's remaining time), so it does not sample; the next
 * request, a 3-token prompt, does. With both models on two threads the
 * samples that landed on a summary (a long prefix, a short answer) cost
 * their rounds 0.57-0.68 of fixed n-gram (routing-cpu.md). A service of
 * long prompts still samples: after SD_CHOICE_SAMPLE requests that passed
 * a due sample over, the next one takes it. (Fails on the old rule, which
 * sampled the long request at its turn.) */
static void test_drafter_choice_sample_move(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = unpromising_model_harness();
    while (h->c.explore_asked % 16 != 0) assert_false(cannot_pay_request(h, 3, 60, 2, 2, NULL, NULL));
    /* the sample's turn: a long prompt with a short answer */
    uint32_t asked = h->c.explore_asked;
    assert_false(cannot_pay_request(h, 100, 24, 1, 2, NULL, NULL));
    assert_int_equal(h->c.explore_asked, asked + 1); /* asked (the model is unpromising), put off */
    assert_int_equal(h->c.sample_due, 2);
    assert_false(cannot_pay_request(h, 100, 24, 1, 2, NULL, NULL)); /* again */
    assert_int_equal(h->c.explore_asked, asked + 2);
    assert_true(cannot_pay_request(h, 3, 60, 1, 2, NULL, NULL)); /* a short prompt takes it */
    assert_int_equal(h->c.explore_asked, asked + 3);
    assert_int_equal(h->c.sample_due, 0);
    /* then only long prompts: the next sample falls due at the 16th asked
     * and is taken 16 requests later */
    int32_t samples = 0, at = -1;
    for (int r = 0; r < 40; r++) {
        uint32_t before = h->c.explore_asked;
        bool tried = cannot_pay_request(h, 100, 24, 1, 2, NULL, NULL);
        assert_int_equal(h->c.explore_asked, before + 1);
        if (tried) samples++, at = (int32_t)(before - asked);
    }
    print_message("long prompts only: %d samples in 40 asked, at %d (the sample due at 16)\n", samples, at);
    assert_int_equal(samples, 1);
    assert_int_equal(at, 32);
    harness_free(h);
}

/* A kind's goodput counts what its steps take on the clock beyond the cost
 * models: here each model step takes 30 ms more than its drafter's and the
 * verifier's own times (3 ms of drafting, a 9 ms verify step) say. The
 * first chat request measures that (n-gram's steps take what they say),
 * and with it the model's 3 tokens a step in 42 ms are worth less than
 * n-gram's 1 in 9: later chat requests, which would keep the model on the
 * cost models alone (3 in 12 ms), end on n-gram. */
static void test_drafter_choice_step_overhead(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_fixed_k(3);
    h->fwd_fixed_us = 5000;
    h->fwd_token_us = 1000;
    h->clock_runs = true;
    h->model_extra_us = 30000;
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    register_ok(h, "dn", SPECD__ROLE__ROLE_DRAFTER); /* NGRAM */
    h->kind = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    register_ok(h, "dm", SPECD__ROLE__ROLE_DRAFTER);
    const Specd__DrafterKind model = SPECD__DRAFTER_KIND__DRAFTER_KIND_MODEL,
                             ngram = SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    int32_t model_steps = 0;
    assert_true(cannot_pay_request(h, 3, 60, 0, 2, NULL, &model_steps)); /* tried: nothing measured yet */
    print_message("overhead a step: model %.0f us over %u steps, n-gram %.0f us over %u\n",
                  h->c.kind_overhead_us[model], h->c.kind_overhead_steps[model], h->c.kind_overhead_us[ngram],
                  h->c.kind_overhead_steps[ngram]);
    assert_true(h->c.kind_overhead_steps[model] >= 2 && h->c.kind_overhead_steps[ngram] >= 2);
    /* (the cost models' fitted verify line is not exactly the test's, so
     * about 30 ms, and a little for n-gram) */
    assert_true(h->c.kind_overhead_us[model] > 27000 && h->c.kind_overhead_us[model] < 33000);
    assert_true(h->c.kind_overhead_us[ngram] < 2000);
    /* and its goodput is the wall clock's: a step's modelled time plus the
     * overhead, against the modelled time alone */
    submit(h, "c", (const int32_t[]){5, 6, 7}, 3, 60, NULL);
    sd_session *s = sd_sched_find(&h->c, expect_accepted(h, "c"));
    assert_non_null(s);
    s->kinds[model].tokens = 3;
    s->kinds[model].k = 3;
    s->kinds[model].steps = 4;
    double g = sd_choice_goodput(&h->c, s, model), over = h->c.kind_overhead_us[model];
    h->c.kind_overhead_us[model] = 0;
    double g0 = sd_choice_goodput(&h->c, s, model);
    const sd_cost_model *v = &h->c.workers[widx(h, "v")].cost;
    double modelled = v->verify_fixed_us + 4 * v->verify_token_us + 3 * h->c.workers[widx(h, "dm")].cost.draft_token_us;
    print_message("model goodput at 3 tokens a step: %.3f, %.3f without the overhead (a step %.0f us modelled)\n", g,
                  g0, modelled);
    assert_true(fabs(g / g0 - modelled / (modelled + over)) < 0.01);
    assert_true(g < 0.5 * g0);
    harness_free(h);
}

/* The n-gram drafter inside the coordinator (--local-ngram): it registers
 * as a drafter without a socket, its drafts come back within the same pump
 * (no verify step waits on a process), they continue what the context
 * repeats, and it answers heartbeats, so it stays alive. */
static void test_local_ngram_drafter(void **state) {
    (void)state;
    NEED_MODEL();
    harness *h = harness_fixed_k(4);
    sd_local_drafter *ld = NULL;
    assert_int_equal(sd_local_drafter_new(&h->c, h->now, &ld), SD_OK);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_DRAFTER), 1);
    register_ok(h, "v", SPECD__ROLE__ROLE_VERIFIER);
    const int32_t pat[6] = {5, 6, 7, 8, 9, 10};
    int32_t prompt[14];
    for (int i = 0; i < 14; i++) prompt[i] = pat[i % 6];
    submit(h, "c", prompt, 14, 40, NULL);
    uint64_t rid = expect_accepted(h, "c");
    sd_local_drafter_pump(ld, h->now); /* the prefill's draft step (its drafts are dropped) */
    Specd__CoordinatorToWorker *vw = expect_verify(h, "v");
    assert_int_equal(vw->verify->seqs[0]->n_append, 14);
    vres r0 = {.n_commit = 1, .commit = {7}, .cached_len = 14};
    reply_verify(h, "v", vw->verify, &r0);
    specd__coordinator_to_worker__free_unpacked(vw, NULL);
    int32_t n_ctx = 15; /* committed so far: the prompt and 7 */
    for (int round = 0; round < 2; round++) {
        assert_null(pop_worker(h, "v"));   /* the verify step waits for the drafts ... */
        sd_local_drafter_pump(ld, h->now); /* ... which arrive in this pump */
        vw = expect_verify(h, "v");
        Specd__VerifySeq *vs = vw->verify->seqs[0];
        assert_int_equal(vs->n_draft, 4);
        for (size_t j = 0; j < vs->n_draft; j++) assert_int_equal(vs->draft[j], pat[(n_ctx + (int32_t)j) % 6]);
        assert_int_equal(vs->n_q, 4);
        vres r = {.n_accepted = 4, .n_commit = 5, .cached_len = (uint32_t)(n_ctx + 4)};
        for (int j = 0; j < 5; j++) r.commit[j] = pat[(n_ctx + j) % 6];
        reply_verify(h, "v", vw->verify, &r);
        specd__coordinator_to_worker__free_unpacked(vw, NULL);
        n_ctx += 5;
    }
    sd_session *s = sd_sched_find(&h->c, rid);
    assert_non_null(s);
    assert_int_equal(s->drafted, 8);
    assert_int_equal(s->accepted, 8);
    /* heartbeats answered: alive past the liveness period */
    uint64_t dead = (uint64_t)h->c.p.heartbeat_interval_ms * 1000u * (uint64_t)(h->c.p.heartbeat_liveness + 2);
    for (uint64_t t = 0; t < dead; t += (uint64_t)h->c.p.heartbeat_interval_ms * 500u) {
        h->now += (uint64_t)h->c.p.heartbeat_interval_ms * 500u;
        heartbeat(h, "v");
        sd_workers_tick(&h->c, h->now);
        sd_local_drafter_pump(ld, h->now);
    }
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_DRAFTER), 1);
    assert_int_equal(sd_place_count(&h->c, SPECD__ROLE__ROLE_VERIFIER), 1);
    sd_local_drafter_free(&ld);
    assert_null(ld);
    harness_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_string_across_tokens),
        cmocka_unit_test(test_stop_string_inside_one_token_and_eos),
        cmocka_unit_test(test_adaptive_k),
        cmocka_unit_test(test_adaptive_k_batch_bound),
        cmocka_unit_test(test_registration),
        cmocka_unit_test(test_registration_padded_vocab),
        cmocka_unit_test(test_plain_steps_commit_and_cache_miss),
        cmocka_unit_test(test_verifier_result_codes),
        cmocka_unit_test(test_logprobs_and_penalties),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_speculative_steps_and_drafter_death),
        cmocka_unit_test(test_spec_counters_per_position),
        cmocka_unit_test(test_k0_steps_shadow_draft),
        cmocka_unit_test(test_shadow_drafts_share_a_phase),
        cmocka_unit_test(test_draft_catchup_priced_apart),
        cmocka_unit_test(test_head_drafts_only_when_read),
        cmocka_unit_test(test_next_verify_before_streaming),
        cmocka_unit_test(test_batch_gate_step_sizes),
        cmocka_unit_test(test_cost_seeded_from_hello),
        cmocka_unit_test(test_prior_follows_outcomes),
        cmocka_unit_test(test_batch_drafts_stop_at_step_cost),
        cmocka_unit_test(test_batch_gate_round_trip),
        cmocka_unit_test(test_verify_timeout_scales),
        cmocka_unit_test(test_sampled_k_ignores_load),
        cmocka_unit_test(test_fast_drafter_one_cohort),
        cmocka_unit_test(test_slow_drafter_two_cohorts),
        cmocka_unit_test(test_late_drafter_releases_hold),
        cmocka_unit_test(test_verifier_death_waits_and_resends),
        cmocka_unit_test(test_chunked_prefill_and_queue),
        cmocka_unit_test(test_feature_rows_bound_steps),
        cmocka_unit_test(test_step_prompt_budget),
        cmocka_unit_test(test_cached_prefix_costs_no_step),
        cmocka_unit_test(test_draft_prompt_budget),
        cmocka_unit_test(test_bad_submits),
        cmocka_unit_test(test_slow_drafter_backs_off),
        cmocka_unit_test(test_continuation_across_the_seam),
        cmocka_unit_test(test_placement_load_affinity_failover),
        cmocka_unit_test(test_placement_prefix),
        cmocka_unit_test(test_drained_group_hands_over),
        cmocka_unit_test(test_drafters_share_failover_pin),
        cmocka_unit_test(test_drafter_choice_by_goodput),
        cmocka_unit_test(test_drafter_choice_shadow_ngram),
        cmocka_unit_test(test_drafter_choice_skips_unpromising),
        cmocka_unit_test(test_drafter_choice_cannot_pay),
        cmocka_unit_test(test_drafter_choice_promising_margin),
        cmocka_unit_test(test_drafter_choice_sample_weight),
        cmocka_unit_test(test_drafter_choice_sample_rate),
        cmocka_unit_test(test_drafter_choice_sample_move),
        cmocka_unit_test(test_drafter_choice_step_overhead),
        cmocka_unit_test(test_local_ngram_drafter),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
