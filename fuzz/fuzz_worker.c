/* fuzz_worker.c — libFuzzer target for the workers' request handling under a
 * hostile coordinator: the verifier (sd_verifier_handle) and the drafter
 * (sd_draft_server_handle, over an n-gram or a model drafter).
 *
 * The input's first byte picks the drafter; the rest is a program. Each op
 * builds a VerifyRequest or a DraftRequest from the bytes (request ids from
 * a small set so that sequences meet again, any keep_len, appended tokens,
 * drafts with one-hot or two-point q, greedy or sampled, prefill-only), or
 * releases ids, or resets. A request goes the way the worker loop takes it:
 * packed, decoded and validated by sd_net_read_to_worker against the
 * worker's limits (refused ones stop there), then handled. Small pools
 * (4 sequence slots, 8 KV blocks of 16 tokens) bring KV_FULL into play.
 *
 * Checked on every answer: the handler succeeds; the answer packs into a
 * WorkerToCoordinator that the coordinator's decoder accepts; one result per
 * sequence, in order; an OK verify result commits its accepted drafts plus
 * one token, holds keep_len + |append| + accepted (prefill: commits nothing
 * and holds keep_len + |append|), and at temperature 0 or with a one-hot q
 * the first rejected draft is not the token committed in its place; an OK
 * draft result holds keep_len + |append| and proposes at most k tokens;
 * CACHE_MISS exactly where the harness's own record of what each id holds
 * says the worker cannot have keep_len tokens; a replay (replay_op) of
 * tokens greedy steps committed accepts them all and commits the same next
 * token (the CPU target is deterministic and batch-invariant). Checked at
 * the end: after releasing every id, no sequence is cached and every KV
 * block is free.
 * A violation prints what and aborts; ASan/UBSan catch the rest.
 *
 * The models (a 2-layer target; the model drafter is its first layer, a
 * view) are made once per process with specd-mkmodel. Linked with replay.c
 * it is a plain program that runs each file named on its command line (the
 * CTest replay of fuzz/corpus/worker, built by every compiler). */
#include "draft_serve.h"
#include "specd/drafter.h"
#include "specd/gguf.h"
#include "verify_serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB      300
#define CTX        64
#define N_IDS      6 /* request ids 1..N_IDS */
#define MAX_SEQS   4 /* slots of both workers */
#define KV_BLOCKS  8
#define BLOCK      16
#define MAX_BATCH  4
#define MAX_K      4
#define MAX_APPEND 12

static char g_dir[64], g_path[128];
static sd_model *g_target;

/* SPECD_FUZZ_VERBOSE: 1 prints what each input exercised, 2 every verify
 * result and the engine's log. */
static int g_verbose;

/* What one input exercised (SPECD_FUZZ_VERBOSE=1 prints it). */
static struct { int refused, verify_steps, draft_steps, ok, miss, kv_full, other, accepted, replays; } g_count;

#define VIOLATION(...)                                \
    do {                                              \
        fprintf(stderr, "fuzz_worker: " __VA_ARGS__); \
        fputc('\n', stderr);                          \
        abort();                                      \
    } while (0)

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint8_t rd(reader *r) { return r->at < r->n ? r->p[r->at++] : 0; }

/* What the harness knows a worker holds for an id. */
enum { HELD_NONE = -1, HELD_UNSURE = -2 };

#define HIST (CTX + MAX_K + 2)

typedef struct worker_state {
    int32_t held[N_IDS + 1];
    /* The verifier's sequences as far as known (hlen[id] >= 0; -1 unknown):
     * the cached tokens, then after a normal step the last committed token
     * (not cached yet). det[id][j]: hist[id][j] was committed by a greedy
     * step, so it is the target's argmax after hist[id][:j] — what
     * replay_op re-verifies. */
    int32_t hist[N_IDS + 1][HIST];
    bool det[N_IDS + 1][HIST];
    int32_t hlen[N_IDS + 1];
} worker_state;

static void forget_all(worker_state *ws) {
    for (int i = 0; i <= N_IDS; i++) {
        ws->held[i] = HELD_NONE;
        ws->hlen[i] = 0;
    }
}

/* A replayed sequence's expected verdict (replay_op). */
typedef struct replay_want {
    uint32_t k;   /* drafts sent, all the target's own greedy tokens: all accepted */
    int32_t next; /* the token greedy decoding committed after them, or -1 when not known */
} replay_want;

/* Whether a worker holding h tokens (or none, or unknown) must answer
 * CACHE_MISS for keep_len k. */
static bool must_miss(int32_t h, uint32_t k) {
    if (h == HELD_UNSURE) return false;
    if (h == HELD_NONE) return k > 0;
    return (int64_t)k > h;
}

/* The cache protocol's CACHE_MISS, on both workers: exactly where the
 * record (held, before the batch) says the worker cannot have keep_len. */
static void check_miss(const char *what, uint64_t id, uint32_t keep_len, int32_t held, bool miss, Specd__Code code) {
    if (miss && code != SPECD__CODE__CODE_CACHE_MISS)
        VIOLATION("%s of request %llu: keep_len %u over what it holds (%d), answered %s", what, (unsigned long long)id,
                  keep_len, held, sd_net_code_name(code));
    if (code == SPECD__CODE__CODE_CACHE_MISS && held != HELD_UNSURE && !miss)
        VIOLATION("%s of request %llu: CACHE_MISS at keep_len %u, holding %d", what, (unsigned long long)id, keep_len,
                  held);
}

/* ---------------------------------------------------------------- requests */

/* One sequence's arrays, owned by the op that builds it. */
typedef struct seq_buf {
    int32_t append[MAX_APPEND + 2];
    int32_t draft[MAX_K + 2];
    Specd__SparseDist dist[MAX_K + 2];
    Specd__SparseDist *pdist[MAX_K + 2];
    int32_t dist_ids[MAX_K + 2][2];
    float dist_p[MAX_K + 2][2];
    Specd__Sampling sampling;
    bool one_hot;
} seq_buf;

static int32_t token(reader *r, bool wild) {
    uint8_t b = rd(r);
    if (wild && b >= 250) return VOCAB + b - 252; /* 298..301: the decoder's edge */
    return (int32_t)((b * 7u + rd(r)) % VOCAB);
}

/* The sequence's sampling: NULL (greedy) unless flags say sampled. */
static Specd__Sampling *fill_sampling(reader *r, seq_buf *b, uint8_t flags) {
    specd__sampling__init(&b->sampling);
    if (!(flags & 8)) return NULL;
    b->sampling.temperature = 0.25f + (float)(rd(r) % 8) / 4.0f;
    b->sampling.top_k = rd(r) % 40u;
    b->sampling.top_p = (float)(rd(r) % 11) / 10.0f;
    b->sampling.min_p = (float)(rd(r) % 4) / 10.0f;
    b->sampling.seed = rd(r);
    return &b->sampling;
}

/* The drafts of one sequence, with one-hot or two-point q (flags & 16). */
static size_t fill_drafts(reader *r, seq_buf *b, uint8_t flags, bool wild) {
    size_t nd = rd(r) % (MAX_K + 2);
    b->one_hot = !(flags & 16);
    for (size_t j = 0; j < nd; j++) {
        b->draft[j] = token(r, wild);
        specd__sparse_dist__init(&b->dist[j]);
        b->dist_ids[j][0] = b->draft[j];
        b->dist_ids[j][1] = (b->draft[j] + 1 + rd(r) % 7) % VOCAB;
        b->dist_p[j][0] = b->one_hot ? 1.0f : 0.5f + (float)(rd(r) % 5) / 10.0f;
        b->dist_p[j][1] = 1.0f - b->dist_p[j][0];
        b->dist[j].ids = b->dist_ids[j];
        b->dist[j].probs = b->dist_p[j];
        b->dist[j].n_ids = b->dist[j].n_probs = b->one_hot ? 1 : 2;
        b->pdist[j] = &b->dist[j];
    }
    return nd;
}

static size_t fill_append(reader *r, seq_buf *b, bool wild) {
    size_t n = rd(r) % (MAX_APPEND + 1);
    for (size_t j = 0; j < n; j++) b->append[j] = token(r, wild);
    return n;
}

/* Packs env, decodes it as the worker loop does; NULL when refused. */
static sd_net_worker_msg *through_decoder(const Specd__CoordinatorToWorker *env, const sd_net_limits *lim) {
    size_t n = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *bytes = malloc(n ? n : 1);
    if (!bytes) abort();
    protobuf_c_message_pack(&env->base, bytes);
    Specd__Code code;
    char err[256];
    sd_net_worker_msg *out = sd_net_read_to_worker(bytes, n, lim, &code, err, sizeof err);
    free(bytes);
    if (!out && (!err[0] || code == SPECD__CODE__CODE_OK)) VIOLATION("a refusal without a reason or a code");
    return out;
}

/* The answer as the coordinator receives it: packed and decoded. */
static void check_answer_decodes(const Specd__WorkerToCoordinator *env, const sd_net_limits *lim) {
    size_t n = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *bytes = malloc(n ? n : 1);
    if (!bytes) abort();
    protobuf_c_message_pack(&env->base, bytes);
    Specd__Code code;
    char err[256];
    Specd__WorkerToCoordinator *back = sd_net_decode_worker(bytes, n, lim, &code, err, sizeof err);
    free(bytes);
    if (!back) VIOLATION("the coordinator refuses the worker's answer: %s", err);
    specd__worker_to_coordinator__free_unpacked(back, NULL);
}

static void count_code(Specd__Code c) {
    if (c == SPECD__CODE__CODE_OK)
        g_count.ok++;
    else if (c == SPECD__CODE__CODE_CACHE_MISS)
        g_count.miss++;
    else if (c == SPECD__CODE__CODE_KV_FULL)
        g_count.kv_full++;
    else
        g_count.other++;
}

static void run_verify(sd_verifier *v, worker_state *ws, const Specd__VerifyRequest *vq, const replay_want *want);

static void verify_op(sd_verifier *v, worker_state *ws, reader *r) {
    uint8_t flags = rd(r);
    bool wild = (flags & 64) != 0;
    size_t n = 1 + rd(r) % (MAX_BATCH + 1); /* one over max_batch: refused */
    static seq_buf bufs[MAX_BATCH + 1];
    Specd__VerifySeq seqs[MAX_BATCH + 1], *pseqs[MAX_BATCH + 1];
    for (size_t i = 0; i < n; i++) {
        specd__verify_seq__init(&seqs[i]);
        seqs[i].request_id = 1 + rd(r) % N_IDS;
        seqs[i].keep_len = rd(r) % (CTX + 6);
        seqs[i].append = bufs[i].append;
        seqs[i].n_append = fill_append(r, &bufs[i], wild);
        seqs[i].sampling = fill_sampling(r, &bufs[i], flags);
        if (!(flags & 1) || (flags & 128)) { /* drafts in a prefill chunk: refused */
            seqs[i].draft = bufs[i].draft;
            seqs[i].n_draft = fill_drafts(r, &bufs[i], flags, wild);
            seqs[i].q = bufs[i].pdist;
            seqs[i].n_q = seqs[i].n_draft;
        }
        pseqs[i] = &seqs[i];
    }
    Specd__VerifyRequest vq = SPECD__VERIFY_REQUEST__INIT;
    vq.step_id = rd(r);
    vq.seqs = pseqs;
    vq.n_seqs = n;
    vq.prefill_only = (flags & 1) != 0;
    run_verify(v, ws, &vq, NULL);
}

/* Sends vq the way the worker loop takes it and checks the answer; want,
 * when given, is what its first sequence must get. */
static void run_verify(sd_verifier *v, worker_state *ws, const Specd__VerifyRequest *vq, const replay_want *want) {
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY;
    env.verify = (Specd__VerifyRequest *)vq;
    sd_net_limits lim = sd_verifier_limits(v);
    sd_net_worker_msg *in = through_decoder(&env, &lim);
    if (!in) {
        g_count.refused++;
        return;
    }
    g_count.verify_steps++;
    const Specd__VerifyRequest *q = in->verify.req;
    /* What must be a miss is decided on the state before the batch; an id
     * twice in one batch is refused by the decoder. */
    bool miss[MAX_BATCH + 1];
    for (size_t i = 0; i < q->n_seqs; i++) miss[i] = must_miss(ws->held[q->seqs[i]->request_id], q->seqs[i]->keep_len);
    Specd__VerifyResponse resp = SPECD__VERIFY_RESPONSE__INIT;
    sd_status st = sd_verifier_handle(v, &in->verify, &resp);
    if (st != SD_OK) VIOLATION("sd_verifier_handle: %s on a request the decoder accepted", sd_status_str(st));
    if (resp.n_results != q->n_seqs) VIOLATION("%zu results for %zu sequences", resp.n_results, q->n_seqs);
    for (size_t i = 0; i < q->n_seqs; i++) {
        const Specd__VerifySeq *s = q->seqs[i];
        const Specd__VerifyResult *res = resp.results[i];
        int32_t *held = &ws->held[s->request_id];
        count_code(res->code);
        if (res->code == SPECD__CODE__CODE_OK) g_count.accepted += (int)res->n_accepted;
        if (g_verbose >= 2)
            fprintf(stderr,
                    "fuzz_worker: verify%s%s id %llu keep %u +%zu drafts %zu: %s, %u accepted, %zu committed, "
                    "holds %u\n",
                    q->prefill_only ? " (prefill)" : "", want && i == 0 ? " (replay)" : "",
                    (unsigned long long)s->request_id, s->keep_len, s->n_append, s->n_draft,
                    sd_net_code_name(res->code), res->n_accepted, res->n_commit, res->cached_len);
        if (res->request_id != s->request_id)
            VIOLATION("results[%zu] answers request %llu", i, (unsigned long long)res->request_id);
        /* A step of the wrong shape is refused before the cache is looked
         * at (verify_serve.c's corner cases); the decoder lets these by. */
        bool bad = (!q->prefill_only && s->n_append == 0) || (q->prefill_only && s->n_draft > 0) ||
                   (int64_t)s->keep_len + (int64_t)s->n_append + (int64_t)s->n_draft > CTX;
        if (bad != (res->code == SPECD__CODE__CODE_BAD_REQUEST))
            VIOLATION("request %llu: keep_len %u, %zu appended, %zu drafts%s: answered %s",
                      (unsigned long long)s->request_id, s->keep_len, s->n_append, s->n_draft,
                      q->prefill_only ? " (prefill)" : "", sd_net_code_name(res->code));
        if (bad) continue; /* refused before anything was touched */
        check_miss("verify", s->request_id, s->keep_len, *held, miss[i], res->code);
        int32_t *hlen = &ws->hlen[s->request_id];
        if (res->code == SPECD__CODE__CODE_CACHE_MISS || res->code == SPECD__CODE__CODE_KV_FULL) {
            /* a miss frees the slot; KV_FULL keeps at most keep_len and says so */
            if (res->cached_len > s->keep_len)
                VIOLATION("request %llu: %s says it holds %u, over keep_len %u", (unsigned long long)s->request_id,
                          sd_net_code_name(res->code), res->cached_len, s->keep_len);
            *held = (int32_t)res->cached_len;
            if (*hlen >= 0 || res->cached_len == 0) *hlen = (int32_t)res->cached_len;
            continue;
        }
        if (res->code != SPECD__CODE__CODE_OK) {
            *held = HELD_UNSURE;
            *hlen = -1;
            continue;
        }
        if (i == 0 && want) {
            if (res->n_accepted != want->k)
                VIOLATION("request %llu replayed: %u of its %u greedy tokens accepted as drafts (keep_len %u)",
                          (unsigned long long)s->request_id, res->n_accepted, want->k, s->keep_len);
            if (want->next >= 0 && res->n_commit > want->k && res->commit[want->k] != want->next)
                VIOLATION("request %llu replayed: committed %d after its drafts, greedy decoding gave %d",
                          (unsigned long long)s->request_id, res->commit[want->k], want->next);
        }
        /* the sequence now: what was kept, the appended tokens, the commits */
        if (*hlen >= 0 || s->keep_len == 0) {
            int32_t *h = ws->hist[s->request_id];
            bool *det = ws->det[s->request_id];
            bool greedy = !s->sampling || s->sampling->temperature == 0.0f;
            size_t at = s->keep_len;
            for (size_t j = 0; j < s->n_append; j++, at++) h[at] = s->append[j], det[at] = false;
            for (size_t j = 0; j < res->n_commit; j++, at++) h[at] = res->commit[j], det[at] = greedy;
            *hlen = (int32_t)at;
        }
        uint32_t end = s->keep_len + (uint32_t)s->n_append;
        if (q->prefill_only) {
            if (res->n_commit != 0 || res->cached_len != end)
                VIOLATION("prefill of request %llu: %zu committed, holds %u, expected 0 and %u",
                          (unsigned long long)s->request_id, res->n_commit, res->cached_len, end);
        } else {
            uint32_t a = res->n_accepted;
            if (a > s->n_draft || res->n_commit != (size_t)a + 1 || res->cached_len != end + a)
                VIOLATION("request %llu: %u of %zu drafts accepted, %zu committed, holds %u (expected %u)",
                          (unsigned long long)s->request_id, a, s->n_draft, res->n_commit, res->cached_len, end + a);
            for (uint32_t j = 0; j < a; j++)
                if (res->commit[j] != s->draft[j]) VIOLATION("commit[%u] is not the accepted draft", j);
            bool one_hot = s->n_q == s->n_draft && (s->n_q == 0 || s->q[a < s->n_q ? a : 0]->n_ids == 1);
            bool greedy = !s->sampling || s->sampling->temperature == 0.0f;
            if (a < s->n_draft && (greedy || one_hot) && res->commit[a] == s->draft[a])
                VIOLATION("request %llu: draft %u rejected and committed in its place (%d)",
                          (unsigned long long)s->request_id, a, res->commit[a]);
            for (size_t j = 0; j < res->n_commit; j++)
                if (res->commit[j] < 0 || res->commit[j] >= VOCAB) VIOLATION("committed token %d", res->commit[j]);
        }
        *held = (int32_t)res->cached_len;
    }
    Specd__WorkerToCoordinator out = SPECD__WORKER_TO_COORDINATOR__INIT;
    out.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    out.verify = &resp;
    check_answer_decodes(&out, &lim);
    sd_net_worker_msg_free(&in);
}

/* Verifies again a stretch that greedy steps committed: keep_len r, the
 * token at r appended, the greedy tokens after it as drafts (one-hot q),
 * beside up to two other sequences. A target that is deterministic and
 * batch-invariant (the CPU backend is, bit for bit) accepts every draft and
 * commits the same token after them, whatever else the cache went through
 * since (truncations, other sequences, freed and reused blocks). */
static void replay_op(sd_verifier *v, worker_state *ws, reader *r) {
    uint64_t id = 1 + rd(r) % N_IDS;
    int32_t hlen = ws->hlen[id];
    const int32_t *h = ws->hist[id];
    const bool *det = ws->det[id];
    if (ws->held[id] == HELD_UNSURE || hlen < 2) return;
    int32_t cand[HIST], n_cand = 0;
    for (int32_t p = 0; p + 1 < hlen; p++)
        if (det[p + 1] && p + 2 <= CTX) cand[n_cand++] = p;
    if (n_cand == 0) return;
    int32_t p = cand[rd(r) % n_cand];
    uint32_t run = 0;
    while (p + 1 + (int32_t)run < hlen && det[p + 1 + run] && run < MAX_K && p + 2 + (int32_t)run <= CTX) run++;
    uint32_t k = 1 + rd(r) % run;
    static seq_buf bufs[3];
    Specd__VerifySeq seqs[3], *pseqs[3];
    specd__verify_seq__init(&seqs[0]);
    seqs[0].request_id = id;
    seqs[0].keep_len = (uint32_t)p;
    bufs[0].append[0] = h[p];
    seqs[0].append = bufs[0].append;
    seqs[0].n_append = 1;
    for (uint32_t j = 0; j < k; j++) {
        bufs[0].draft[j] = h[p + 1 + (int32_t)j];
        specd__sparse_dist__init(&bufs[0].dist[j]);
        bufs[0].dist_ids[j][0] = bufs[0].draft[j];
        bufs[0].dist_p[j][0] = 1.0f;
        bufs[0].dist[j].ids = bufs[0].dist_ids[j];
        bufs[0].dist[j].probs = bufs[0].dist_p[j];
        bufs[0].dist[j].n_ids = bufs[0].dist[j].n_probs = 1;
        bufs[0].pdist[j] = &bufs[0].dist[j];
    }
    seqs[0].draft = bufs[0].draft;
    seqs[0].n_draft = k;
    seqs[0].q = bufs[0].pdist;
    seqs[0].n_q = k;
    pseqs[0] = &seqs[0];
    size_t n = 1, extra = rd(r) % 3;
    for (size_t e = 0; e < extra; e++) { /* neighbours: other ids, any content */
        uint64_t other = 1 + rd(r) % N_IDS;
        bool taken = false;
        for (size_t j = 0; j < n; j++) taken = taken || seqs[j].request_id == other;
        if (taken) continue;
        specd__verify_seq__init(&seqs[n]);
        seqs[n].request_id = other;
        seqs[n].keep_len = ws->held[other] > 0 ? (uint32_t)(rd(r) % (ws->held[other] + 1)) : 0;
        seqs[n].append = bufs[n].append;
        seqs[n].n_append = 1 + rd(r) % MAX_APPEND;
        for (size_t j = 0; j < seqs[n].n_append; j++) bufs[n].append[j] = token(r, false);
        pseqs[n] = &seqs[n];
        n++;
    }
    Specd__VerifyRequest vq = SPECD__VERIFY_REQUEST__INIT;
    vq.step_id = rd(r);
    vq.seqs = pseqs;
    vq.n_seqs = n;
    replay_want want = {.k = k, .next = p + 1 + (int32_t)k < hlen && det[p + 1 + k] ? h[p + 1 + k] : -1};
    g_count.replays++;
    run_verify(v, ws, &vq, &want);
}

static void draft_op(sd_draft_server *ds, worker_state *ws, reader *r) {
    uint8_t flags = rd(r);
    bool wild = (flags & 64) != 0;
    size_t n = 1 + rd(r) % (MAX_BATCH + 1);
    static seq_buf bufs[MAX_BATCH + 1];
    Specd__DraftSeq seqs[MAX_BATCH + 1], *pseqs[MAX_BATCH + 1];
    for (size_t i = 0; i < n; i++) {
        specd__draft_seq__init(&seqs[i]);
        seqs[i].request_id = 1 + rd(r) % N_IDS;
        seqs[i].keep_len = rd(r) % (CTX + 6);
        seqs[i].append = bufs[i].append;
        seqs[i].n_append = fill_append(r, &bufs[i], wild);
        seqs[i].k = rd(r) % (MAX_K + 2);
        seqs[i].sampling = fill_sampling(r, &bufs[i], flags);
        seqs[i].top_n = rd(r) % 4u;
        pseqs[i] = &seqs[i];
    }
    Specd__DraftRequest dq = SPECD__DRAFT_REQUEST__INIT;
    dq.step_id = rd(r);
    dq.seqs = pseqs;
    dq.n_seqs = n;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT;
    env.draft = &dq;
    sd_net_limits lim = sd_draft_server_limits(ds);
    sd_net_worker_msg *in = through_decoder(&env, &lim);
    if (!in) {
        g_count.refused++;
        return;
    }
    g_count.draft_steps++;
    const Specd__DraftRequest *q = in->draft.req;
    bool miss[MAX_BATCH + 1];
    for (size_t i = 0; i < q->n_seqs; i++) miss[i] = must_miss(ws->held[q->seqs[i]->request_id], q->seqs[i]->keep_len);
    Specd__DraftResponse resp = SPECD__DRAFT_RESPONSE__INIT;
    sd_status st = sd_draft_server_handle(ds, &in->draft, &resp);
    if (st != SD_OK) VIOLATION("sd_draft_server_handle: %s on a request the decoder accepted", sd_status_str(st));
    if (resp.n_results != q->n_seqs) VIOLATION("%zu results for %zu sequences", resp.n_results, q->n_seqs);
    for (size_t i = 0; i < q->n_seqs; i++) {
        const Specd__DraftSeq *s = q->seqs[i];
        const Specd__DraftResult *res = resp.results[i];
        int32_t *held = &ws->held[s->request_id];
        count_code(res->code);
        if (res->request_id != s->request_id)
            VIOLATION("draft results[%zu] answers request %llu", i, (unsigned long long)res->request_id);
        check_miss("draft", s->request_id, s->keep_len, *held, miss[i], res->code);
        if (res->code == SPECD__CODE__CODE_CACHE_MISS || res->code == SPECD__CODE__CODE_KV_FULL) {
            if (res->cached_len != 0)
                VIOLATION("draft request %llu: %s with cached_len %u (the slot is freed)",
                          (unsigned long long)s->request_id, sd_net_code_name(res->code), res->cached_len);
            *held = HELD_NONE;
            continue;
        }
        if (res->code != SPECD__CODE__CODE_OK) {
            *held = HELD_UNSURE;
            continue;
        }
        uint32_t end = s->keep_len + (uint32_t)s->n_append;
        if (res->cached_len != end || res->n_tokens > s->k || res->n_q != res->n_tokens)
            VIOLATION("draft request %llu: %zu tokens for k %u, %zu q, holds %u (expected %u)",
                      (unsigned long long)s->request_id, res->n_tokens, s->k, res->n_q, res->cached_len, end);
        *held = (int32_t)end;
    }
    Specd__WorkerToCoordinator out = SPECD__WORKER_TO_COORDINATOR__INIT;
    out.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
    out.draft = &resp;
    check_answer_decodes(&out, &lim);
    sd_net_worker_msg_free(&in);
}

/* ---------------------------------------------------------------- setup */

static void remove_models(void) {
    sd_model_free(&g_target);
    if (g_path[0]) unlink(g_path);
    if (g_dir[0]) rmdir(g_dir);
}

static bool setup(void) {
    atexit(remove_models);
    snprintf(g_dir, sizeof g_dir, "/tmp/specd-fuzz-worker-XXXXXX");
    if (!mkdtemp(g_dir)) return false;
    snprintf(g_path, sizeof g_path, "%s/target.gguf", g_dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 2 --dim 32 --ff 64 --vocab %d --ctx %d --seed 5 >/dev/null 2>&1",
             SPECD_MKMODEL, g_path, VOCAB, CTX);
    if (system(cmd) != 0) return false;
    sd_gguf *g = NULL;
    char err[256];
    if (sd_gguf_open(g_path, &g, err, sizeof err) != SD_OK) return false;
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 1;
    sd_status st = sd_model_load(g, &mp, &g_target);
    sd_gguf_close(&g);
    return st == SD_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        const char *v = getenv("SPECD_FUZZ_VERBOSE");
        g_verbose = v ? atoi(v) : 0;
        sd_log_set(NULL, NULL, g_verbose >= 2 ? SD_LOG_DEBUG : SD_LOG_OFF, NULL);
        ready = setup() ? 1 : -1;
        if (ready < 0) fprintf(stderr, "fuzz_worker: could not make the model (%s)\n", SPECD_MKMODEL);
    }
    if (ready < 0) abort();
    memset(&g_count, 0, sizeof g_count);
    reader r = {data, size, 0};
    bool model_drafter = rd(&r) & 1;

    sd_verifier_params vp = sd_verifier_default_params();
    vp.max_seqs = MAX_SEQS;
    vp.kv_blocks = KV_BLOCKS;
    vp.block_size = BLOCK;
    vp.max_batch = MAX_BATCH;
    vp.max_k = MAX_K;
    sd_verifier *v = NULL;
    if (sd_verifier_create(g_target, &vp, &v) != SD_OK) abort();
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_seqs = MAX_SEQS;
    dp.max_ctx = CTX + MAX_K + 1;
    dp.n_threads = 1;
    dp.top_n = model_drafter ? 4 : 1; /* as specd-drafter: the server keeps what the drafter makes */
    sd_drafter *d = NULL;
    sd_status st = model_drafter ? sd_drafter_self_view(g_target, 1, &dp, &d) : sd_drafter_ngram_create(&dp, &d);
    if (st != SD_OK) abort();
    sd_draft_server_params sp = sd_draft_server_default_params();
    sp.max_seqs = MAX_SEQS;
    sp.max_ctx = CTX;
    sp.max_batch = MAX_BATCH;
    sp.max_k = MAX_K;
    sp.n_vocab = VOCAB;
    sp.top_n = dp.top_n;
    sd_draft_server *ds = NULL;
    if (sd_draft_server_create(d, &sp, &ds) != SD_OK) abort();

    static worker_state vs, dst;
    forget_all(&vs);
    forget_all(&dst);
    while (r.at < r.n) {
        uint8_t op = rd(&r);
        switch (op % 9) {
        case 0:
        case 1:
        case 2: verify_op(v, &vs, &r); break;
        case 3:
        case 4: draft_op(ds, &dst, &r); break;
        case 8: replay_op(v, &vs, &r); break;
        case 5:
        case 6: {
            uint64_t ids[3];
            size_t n = 1 + rd(&r) % 3;
            for (size_t i = 0; i < n; i++) ids[i] = rd(&r) % (N_IDS + 2); /* 0 and N_IDS + 1: never used */
            sd_verifier_release(v, ids, n);
            sd_draft_server_release(ds, ids, n);
            for (size_t i = 0; i < n; i++)
                if (ids[i] >= 1 && ids[i] <= N_IDS) {
                    vs.held[ids[i]] = dst.held[ids[i]] = HELD_NONE;
                    vs.hlen[ids[i]] = 0;
                }
            break;
        }
        case 7:
            sd_verifier_reset(v);
            sd_draft_server_reset(ds);
            forget_all(&vs);
            forget_all(&dst);
            break;
        }
    }
    uint64_t all[N_IDS];
    for (int i = 0; i < N_IDS; i++) all[i] = (uint64_t)i + 1;
    sd_verifier_release(v, all, N_IDS);
    sd_draft_server_release(ds, all, N_IDS);
    Specd__WorkerStats wst = SPECD__WORKER_STATS__INIT;
    sd_verifier_stats(v, &wst);
    if (wst.n_sequences != 0 || wst.kv_blocks_free != wst.kv_blocks_total)
        VIOLATION("verifier after releasing every id: %u sequences, %u of %u KV blocks free", wst.n_sequences,
                  wst.kv_blocks_free, wst.kv_blocks_total);
    specd__worker_stats__init(&wst);
    sd_draft_server_stats(ds, &wst);
    if (wst.n_sequences != 0) VIOLATION("drafter after releasing every id: %u sequences", wst.n_sequences);
    sd_draft_server_free(&ds);
    sd_drafter_free(&d);
    sd_verifier_free(&v);
    if (g_verbose >= 1)
        fprintf(stderr,
                "fuzz_worker: %zu bytes, %s drafter: %d verify and %d draft steps (%d refused by the decoder); "
                "results %d OK (%d drafts accepted), %d CACHE_MISS, %d KV_FULL, %d other; %d replays\n",
                size, model_drafter ? "model" : "n-gram", g_count.verify_steps, g_count.draft_steps, g_count.refused,
                g_count.ok, g_count.accepted, g_count.miss, g_count.kv_full, g_count.other, g_count.replays);
    return 0;
}
