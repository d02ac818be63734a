/* fuzz_coord.c — libFuzzer target for the coordinator's logic among hostile peers.
 *
 * The input is a program. Each op is one byte saying what happens next,
 * followed by the bytes that op reads: a client submits (ids or text,
 * sampling, stop strings, K), cancels or asks for stats; a worker says Hello
 * (right or wrong model, version, sizes, step costs), answers its latest
 * draft or verify request faithfully or with one thing bent (step id, count,
 * order, accepted drafts, committed tokens, cached_len, code), sends a
 * heartbeat, or sends raw bytes; time passes and the ticks run; a worker
 * becomes unreachable. The coordinator runs in-process through its
 * sd_coord_io callbacks, as in tests/test_coordinator.c. After the program,
 * faithful workers serve (registering afresh where none is left) until
 * every request has ended.
 *
 * Checked as the messages leave: every submit is answered once (Accepted,
 * or an Error carrying its tag); a request's tokens are in the vocabulary,
 * arrive before its end, count up by what each chunk carries and never pass
 * max_tokens; a request ends once (Finished, or an Error naming it). Checked
 * at the end: every accepted request ended and no chunk is left pending,
 * whatever the peers did before; every worker still registered was sent a
 * Release for each request id it was given since its Welcome (a worker
 * whose link dropped has reset its caches); freeing the state frees
 * everything (ASan's leak check). A violation prints what and aborts.
 *
 * The target model (metadata and tokenizer only) is a small random GGUF
 * made once per process with specd-mkmodel. Linked with replay.c it is a
 * plain program that runs each file named on its command line (the CTest
 * replay of fuzz/corpus/coord, built by every compiler). */
#include "coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB           300
#define CTX             64
#define N_FIXED_WORKERS 4  /* idents the program's ops use */
#define N_WORKER_IDENTS 16 /* + fresh ones the faithful phase registers */
#define N_CLIENTS       3
#define MAX_TRACKED     512
#define MAX_SEQS        SD_MAX_BATCH
#define HEAL_ROUNDS     6000
#define HEAL_STEP_US    20000u
#define HEAL_IDLE_US    10000000u

static char g_model[256];
static char g_dir[64];

/* ---------------------------------------------------------------- input */

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint8_t rd(reader *r) { return r->at < r->n ? r->p[r->at++] : 0; }
static uint32_t rd16(reader *r) { return (uint32_t)rd(r) | (uint32_t)rd(r) << 8; }

/* ---------------------------------------------------------------- harness */

typedef struct last_request {
    uint8_t *bytes; /* packed CoordinatorToWorker (draft or verify), or NULL */
    size_t len;
} last_request;

typedef struct tracked {
    uint64_t id;
    int client;
    int32_t max_tokens; /* 0: unknown (a raw submit) */
    uint32_t generated;
    bool ended;
} tracked;

typedef struct submitted {
    uint64_t tag;
    int client;
    int32_t max_tokens;
    int answers;
} submitted;

/* Request ids a worker was sent since its Welcome and not released: what
 * it may still cache. */
typedef struct held_ids {
    uint64_t id[MAX_TRACKED];
    int n;
} held_ids;

typedef struct fz {
    sd_coord c;
    bool c_ok;
    uint64_t now;
    char worker_ident[N_WORKER_IDENTS][8];
    last_request last[N_WORKER_IDENTS];
    held_ids holds[N_WORKER_IDENTS];
    bool gone[N_WORKER_IDENTS];
    int n_fresh;
    tracked req[MAX_TRACKED];
    int n_req;
    submitted sub[MAX_TRACKED];
    int n_sub;
    uint64_t next_tag;
    uint32_t honest_round;
} fz;

static fz *g_fz; /* the clock and the callbacks' user */

static const char *const CLIENT_IDENT[N_CLIENTS] = {"c0", "c1", "c2"};

#define VIOLATION(...)                               \
    do {                                             \
        fprintf(stderr, "fuzz_coord: " __VA_ARGS__); \
        fputc('\n', stderr);                         \
        abort();                                     \
    } while (0)

static int worker_index(const fz *f, const uint8_t *ident, size_t len) {
    for (int i = 0; i < N_WORKER_IDENTS; i++)
        if (strlen(f->worker_ident[i]) == len && memcmp(f->worker_ident[i], ident, len) == 0) return i;
    return -1;
}

static int client_index(const uint8_t *ident, size_t len) {
    for (int i = 0; i < N_CLIENTS; i++)
        if (strlen(CLIENT_IDENT[i]) == len && memcmp(CLIENT_IDENT[i], ident, len) == 0) return i;
    return -1;
}

static tracked *find_tracked(fz *f, uint64_t id) {
    for (int i = 0; i < f->n_req; i++)
        if (f->req[i].id == id) return &f->req[i];
    return NULL;
}

static bool to_worker(void *user, const uint8_t *ident, size_t len, const Specd__CoordinatorToWorker *env) {
    fz *f = user;
    int w = worker_index(f, ident, len);
    if (w < 0) VIOLATION("a message to worker ident '%.*s' that never spoke", (int)len, (const char *)ident);
    held_ids *h = &f->holds[w];
    if (f->gone[w]) { /* disconnected: a worker that reconnects has reset its caches */
        h->n = 0;
        return false;
    }
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME: /* a registration starts from empty caches */ h->n = 0; break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT:
    case SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY: {
        size_t n =
            env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT ? env->draft->n_seqs : env->verify->n_seqs;
        for (size_t i = 0; i < n; i++) {
            uint64_t id = env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT ? env->draft->seqs[i]->request_id
                                                                                     : env->verify->seqs[i]->request_id;
            bool known = false;
            for (int j = 0; j < h->n && !known; j++) known = h->id[j] == id;
            if (!known && h->n < MAX_TRACKED) h->id[h->n++] = id;
        }
        break;
    }
    case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE:
        for (size_t i = 0; i < env->release->n_request_ids; i++)
            for (int j = 0; j < h->n; j++)
                if (h->id[j] == env->release->request_ids[i]) h->id[j--] = h->id[--h->n];
        break;
    default: break;
    }
    if (env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT ||
        env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY) {
        last_request *l = &f->last[w];
        free(l->bytes);
        l->len = protobuf_c_message_get_packed_size(&env->base);
        l->bytes = malloc(l->len ? l->len : 1);
        if (!l->bytes) abort();
        protobuf_c_message_pack(&env->base, l->bytes);
    }
    return true;
}

static void on_chunk(fz *f, const Specd__TokenChunk *ch) {
    tracked *t = find_tracked(f, ch->request_id);
    if (!t) VIOLATION("tokens for request %llu, never accepted", (unsigned long long)ch->request_id);
    if (t->ended) VIOLATION("tokens for request %llu after its end", (unsigned long long)t->id);
    for (size_t i = 0; i < ch->n_tokens; i++)
        if (ch->tokens[i] < 0 || ch->tokens[i] >= VOCAB)
            VIOLATION("request %llu: token %d outside the vocabulary", (unsigned long long)t->id, ch->tokens[i]);
    if (ch->n_generated != t->generated + ch->n_tokens)
        VIOLATION("request %llu: n_generated %u after %u, with %zu tokens in the chunk", (unsigned long long)t->id,
                  ch->n_generated, t->generated, ch->n_tokens);
    t->generated = ch->n_generated;
    if (t->max_tokens > 0 && t->generated > (uint32_t)t->max_tokens)
        VIOLATION("request %llu: %u tokens generated, max_tokens %d", (unsigned long long)t->id, t->generated,
                  t->max_tokens);
}

static void on_client_msg(void *user, const uint8_t *ident, size_t len, const Specd__CoordinatorToClient *env) {
    fz *f = user;
    int cl = client_index(ident, len);
    if (cl < 0) VIOLATION("a message to client ident '%.*s' that never spoke", (int)len, (const char *)ident);
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED: {
        const Specd__Accepted *a = env->accepted;
        if (find_tracked(f, a->request_id)) VIOLATION("request id %llu given twice", (unsigned long long)a->request_id);
        int32_t max_tokens = 0;
        for (int i = 0; i < f->n_sub; i++) {
            submitted *s = &f->sub[i];
            if (s->tag != a->client_tag || s->client != cl) continue;
            if (++s->answers > 1) VIOLATION("submit tag %llu answered twice", (unsigned long long)s->tag);
            max_tokens = s->max_tokens;
        }
        if (f->n_req == MAX_TRACKED) abort(); /* the program cannot submit that many */
        f->req[f->n_req++] = (tracked){.id = a->request_id, .client = cl, .max_tokens = max_tokens};
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS: on_chunk(f, env->tokens); break;
    case SPECD__COORDINATOR_TO_CLIENT__BODY_FINISHED: {
        tracked *t = find_tracked(f, env->finished->request_id);
        if (!t) VIOLATION("Finished for request %llu, never accepted", (unsigned long long)env->finished->request_id);
        if (t->ended) VIOLATION("request %llu ended twice", (unsigned long long)t->id);
        if (t->client != cl) VIOLATION("request %llu's end went to another client", (unsigned long long)t->id);
        const Specd__RequestStats *st = env->finished->stats;
        if (st && st->generated_tokens != t->generated)
            VIOLATION("request %llu: Finished counts %u tokens, %u were streamed", (unsigned long long)t->id,
                      st->generated_tokens, t->generated);
        t->ended = true;
        break;
    }
    case SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR: {
        const Specd__Error *e = env->error;
        if (e->code == SPECD__CODE__CODE_OK || e->code == SPECD__CODE__CODE_UNSPECIFIED)
            VIOLATION("an Error with code %d", (int)e->code);
        if (!e->message || !e->message[0]) VIOLATION("an Error without a message");
        if (e->request_id != 0) {
            /* Ends the request when it is this client's and running (what
             * libspecd-client does); otherwise it can only answer a Cancel. */
            tracked *t = find_tracked(f, e->request_id);
            if (t && !t->ended && t->client == cl)
                t->ended = true;
            else if (e->code != SPECD__CODE__CODE_UNKNOWN_REQUEST)
                VIOLATION("an Error %s for request %llu, not a running request of that client (%s)",
                          sd_net_code_name(e->code), (unsigned long long)e->request_id, e->message);
        } else if (e->request_id == 0 && e->client_tag != 0) {
            for (int i = 0; i < f->n_sub; i++) {
                submitted *s = &f->sub[i];
                if (s->tag == e->client_tag && s->client == cl && ++s->answers > 1)
                    VIOLATION("submit tag %llu answered twice", (unsigned long long)s->tag);
            }
        }
        break;
    }
    default: break;
    }
}

/* The coordinator hands over packed replies (outbox.c): checked as decoded. */
static sd_coord_sent to_client(void *user, const uint8_t *ident, size_t len, const uint8_t *body, size_t body_len) {
    Specd__CoordinatorToClient *env = specd__coordinator_to_client__unpack(NULL, body_len, body);
    if (!env) VIOLATION("a reply to a client that does not unpack (%zu bytes)", body_len);
    on_client_msg(user, ident, len, env);
    specd__coordinator_to_client__free_unpacked(env, NULL);
    return SD_COORD_SENT;
}

static uint64_t fz_clock(void) { return g_fz->now; }

/* ---------------------------------------------------------------- feeding */

static void feed_worker(fz *f, int w, const Specd__WorkerToCoordinator *e) {
    size_t n = specd__worker_to_coordinator__get_packed_size(e);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) abort();
    specd__worker_to_coordinator__pack(e, b);
    sd_workers_on_message(&f->c, (const uint8_t *)f->worker_ident[w], strlen(f->worker_ident[w]), b, n, f->now);
    free(b);
}

static void feed_client(fz *f, int cl, const Specd__ClientToCoordinator *e) {
    size_t n = specd__client_to_coordinator__get_packed_size(e);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) abort();
    specd__client_to_coordinator__pack(e, b);
    sd_clients_on_message(&f->c, (const uint8_t *)CLIENT_IDENT[cl], strlen(CLIENT_IDENT[cl]), b, n, f->now);
    free(b);
}

static void hello(fz *f, int w, bool verifier, reader *r) {
    uint8_t flags = r ? rd(r) : 0; /* 0: a faithful Hello */
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = (flags & 1) ? "gpt2" : "llama";
    id.vocab_size = (flags & 2) ? VOCAB + 1u : (uint32_t)f->c.n_vocab;
    id.vocab_hash = (flags & 4) ? f->c.vocab_hash ^ 1u : f->c.vocab_hash;
    id.context_length = (flags & 8) && r ? rd16(r) : CTX;
    id.name = "fuzz.gguf";
    Specd__StepCost costs[8], *pcosts[8];
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = (flags & 16) ? SD_PROTOCOL_VERSION + 1 : SD_PROTOCOL_VERSION;
    h.role = verifier ? SPECD__ROLE__ROLE_VERIFIER : SPECD__ROLE__ROLE_DRAFTER;
    h.group_size = 1;
    h.model = (flags & 32) ? NULL : &id;
    h.name = f->worker_ident[w];
    h.max_batch = 16;
    h.max_k = 8;
    h.drafter_kind = verifier ? SPECD__DRAFTER_KIND__DRAFTER_KIND_UNSPECIFIED : SPECD__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    if ((flags & 64) && r) {
        h.group_size = 1u + rd(r) % 4u;
        h.rank = rd(r) % 4u;
        h.max_batch = rd(r) % 20u;
        h.max_k = rd(r) % 12u;
        h.drafter_kind = rd(r) % 4u;
    }
    if ((flags & 128) && r) {
        size_t n = rd(r) % 9u;
        for (size_t i = 0; i < n; i++) {
            specd__step_cost__init(&costs[i]);
            costs[i].tokens = rd16(r);
            costs[i].forward_us = rd16(r) * 16u;
            pcosts[i] = &costs[i];
        }
        h.step_costs = pcosts;
        h.n_step_costs = n;
    }
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    e.hello = &h;
    feed_worker(f, w, &e);
}

static void worker_heartbeat(fz *f, int w) {
    Specd__WorkerStats st = SPECD__WORKER_STATS__INIT;
    st.kv_blocks_total = 64;
    st.kv_blocks_free = 32;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.stats = &st;
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT;
    e.heartbeat = &hb;
    feed_worker(f, w, &e);
}

static void client_heartbeat(fz *f, int cl) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_HEARTBEAT;
    e.heartbeat = &hb;
    feed_client(f, cl, &e);
}

/* How an answer is bent (the op's second byte, modulo). */
enum bend {
    BEND_NONE = 0,
    BEND_STEP_ID,
    BEND_DROP_RESULT,
    BEND_SWAP_RESULTS,
    BEND_TOO_MANY_ACCEPTED,
    BEND_BAD_COMMIT,
    BEND_CACHED_LEN,
    BEND_CODE,
    BEND_COMMIT_COUNT,
    BEND_N
};

/* Answers worker w's latest verify request; r == NULL: faithfully, from the
 * harness's own choices. */
static void answer_verify(fz *f, int w, const Specd__VerifyRequest *q, reader *r) {
    enum bend bend = r ? (enum bend)(rd(r) % BEND_N) : BEND_NONE;
    size_t n = q->n_seqs > MAX_SEQS ? MAX_SEQS : q->n_seqs;
    static Specd__VerifyResult res[MAX_SEQS];
    static Specd__VerifyResult *pres[MAX_SEQS];
    static int32_t commit[MAX_SEQS][SD_MAX_K + 2];
    for (size_t i = 0; i < n; i++) {
        const Specd__VerifySeq *s = q->seqs[i];
        specd__verify_result__init(&res[i]);
        res[i].request_id = s->request_id;
        res[i].code = SPECD__CODE__CODE_OK;
        uint32_t end = s->keep_len + (uint32_t)s->n_append;
        if (q->prefill_only) {
            res[i].cached_len = end;
        } else {
            uint32_t acc = r ? (uint32_t)(rd(r) % (s->n_draft + 1)) : (uint32_t)(s->n_draft > 0);
            for (uint32_t j = 0; j < acc; j++) commit[i][j] = s->draft[j];
            f->honest_round++;
            commit[i][acc] = r ? (int32_t)(rd16(r) % VOCAB) : (int32_t)(f->honest_round * 7u + 11u) % VOCAB;
            res[i].n_accepted = acc;
            res[i].commit = commit[i];
            res[i].n_commit = acc + 1;
            res[i].cached_len = end + acc;
        }
        pres[i] = &res[i];
    }
    Specd__VerifyResponse vr = SPECD__VERIFY_RESPONSE__INIT;
    vr.step_id = q->step_id;
    vr.results = pres;
    vr.n_results = n;
    vr.forward_us = r ? 1u + rd16(r) * 4u : 2000u + 300u * (uint32_t)n;
    size_t at = n ? (r ? rd(r) : 0) % n : 0;
    switch (bend) {
    case BEND_NONE: break;
    case BEND_STEP_ID: vr.step_id += 1u + rd(r) % 3u; break;
    case BEND_DROP_RESULT:
        if (n) vr.n_results = n - 1;
        break;
    case BEND_SWAP_RESULTS:
        if (n > 1) {
            Specd__VerifyResult *t = pres[0];
            pres[0] = pres[n - 1];
            pres[n - 1] = t;
        }
        break;
    case BEND_TOO_MANY_ACCEPTED:
        if (n && res[at].n_commit > 0 && res[at].n_commit <= SD_MAX_K) {
            res[at].n_accepted++;
            res[at].commit[res[at].n_commit++] = 1;
            res[at].cached_len++;
        }
        break;
    case BEND_BAD_COMMIT:
        if (n && res[at].n_commit > 0) res[at].commit[rd(r) % res[at].n_commit] = (int32_t)rd16(r) - 128;
        break;
    case BEND_CACHED_LEN:
        if (n) res[at].cached_len += (rd(r) & 1) ? 1u : UINT32_MAX;
        break;
    case BEND_CODE:
        if (n) res[at].code = (Specd__Code)(rd(r) % 15u);
        break;
    case BEND_COMMIT_COUNT:
        if (n) res[at].n_commit = res[at].n_commit ? res[at].n_commit - 1 : 0;
        break;
    case BEND_N: break;
    }
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    e.verify = &vr;
    feed_worker(f, w, &e);
}

static void answer_draft(fz *f, int w, const Specd__DraftRequest *q, reader *r) {
    enum bend bend = r ? (enum bend)(rd(r) % BEND_N) : BEND_NONE;
    size_t n = q->n_seqs > MAX_SEQS ? MAX_SEQS : q->n_seqs;
    static Specd__DraftResult res[MAX_SEQS];
    static Specd__DraftResult *pres[MAX_SEQS];
    static int32_t toks[MAX_SEQS][SD_MAX_K + 1];
    static Specd__SparseDist dist[MAX_SEQS][SD_MAX_K + 1];
    static Specd__SparseDist *pdist[MAX_SEQS][SD_MAX_K + 1];
    static int32_t dist_ids[MAX_SEQS][SD_MAX_K + 1][2];
    static float dist_p[MAX_SEQS][SD_MAX_K + 1][2];
    for (size_t i = 0; i < n; i++) {
        const Specd__DraftSeq *s = q->seqs[i];
        specd__draft_result__init(&res[i]);
        res[i].request_id = s->request_id;
        res[i].code = SPECD__CODE__CODE_OK;
        res[i].cached_len = s->keep_len + (uint32_t)s->n_append;
        uint32_t k = s->k > SD_MAX_K ? SD_MAX_K : s->k;
        uint32_t m = r ? rd(r) % (k + 1) : (k < 2 ? k : 2);
        for (uint32_t j = 0; j < m; j++) {
            toks[i][j] = r ? (int32_t)(rd16(r) % VOCAB) : 5;
            specd__sparse_dist__init(&dist[i][j]);
            bool two = r && (rd(r) & 1);
            dist_ids[i][j][0] = toks[i][j];
            dist_ids[i][j][1] = (toks[i][j] + 1) % VOCAB;
            dist_p[i][j][0] = two ? 0.75f : 1.0f;
            dist_p[i][j][1] = 0.25f;
            dist[i][j].ids = dist_ids[i][j];
            dist[i][j].probs = dist_p[i][j];
            dist[i][j].n_ids = dist[i][j].n_probs = two ? 2 : 1;
            pdist[i][j] = &dist[i][j];
        }
        res[i].tokens = toks[i];
        res[i].n_tokens = m;
        res[i].q = pdist[i];
        res[i].n_q = m;
        pres[i] = &res[i];
    }
    Specd__DraftResponse dr = SPECD__DRAFT_RESPONSE__INIT;
    dr.step_id = q->step_id;
    dr.results = pres;
    dr.n_results = n;
    dr.draft_us = r ? rd16(r) : 200u;
    size_t at = n ? (r ? rd(r) : 0) % n : 0;
    switch (bend) {
    case BEND_STEP_ID: dr.step_id += 1u + rd(r) % 3u; break;
    case BEND_DROP_RESULT:
        if (n) dr.n_results = n - 1;
        break;
    case BEND_SWAP_RESULTS:
        if (n > 1) {
            Specd__DraftResult *t = pres[0];
            pres[0] = pres[n - 1];
            pres[n - 1] = t;
        }
        break;
    case BEND_TOO_MANY_ACCEPTED: /* more tokens than k */
        if (n && res[at].n_tokens < SD_MAX_K) {
            uint32_t j = (uint32_t)res[at].n_tokens;
            toks[at][j] = 3;
            dist_ids[at][j][0] = 3;
            dist_p[at][j][0] = 1.0f;
            specd__sparse_dist__init(&dist[at][j]);
            dist[at][j].ids = dist_ids[at][j];
            dist[at][j].probs = dist_p[at][j];
            dist[at][j].n_ids = dist[at][j].n_probs = 1;
            pdist[at][j] = &dist[at][j];
            res[at].n_tokens = res[at].n_q = j + 1;
        }
        break;
    case BEND_BAD_COMMIT: /* a token outside the vocabulary */
        if (n && res[at].n_tokens > 0) res[at].tokens[0] = VOCAB + (int32_t)rd(r);
        break;
    case BEND_CACHED_LEN:
        if (n) res[at].cached_len += (rd(r) & 1) ? 1u : UINT32_MAX;
        break;
    case BEND_CODE:
        if (n) res[at].code = (Specd__Code)(rd(r) % 15u);
        break;
    case BEND_COMMIT_COUNT: /* q shorter than the tokens */
        if (n && res[at].n_q > 0) res[at].n_q--;
        break;
    default: break;
    }
    Specd__WorkerToCoordinator e = SPECD__WORKER_TO_COORDINATOR__INIT;
    e.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
    e.draft = &dr;
    feed_worker(f, w, &e);
}

/* Answers worker w's latest request (if any, once). */
static bool answer(fz *f, int w, reader *r) {
    last_request *l = &f->last[w];
    if (!l->bytes) return false;
    Specd__CoordinatorToWorker *m = specd__coordinator_to_worker__unpack(NULL, l->len, l->bytes);
    free(l->bytes);
    l->bytes = NULL;
    if (!m) abort(); /* we packed it */
    if (m->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY)
        answer_verify(f, w, m->verify, r);
    else if (m->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT)
        answer_draft(f, w, m->draft, r);
    specd__coordinator_to_worker__free_unpacked(m, NULL);
    return true;
}

static void submit(fz *f, reader *r) {
    int cl = rd(r) % N_CLIENTS;
    uint8_t flags = rd(r);
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.client_tag = ++f->next_tag;
    int32_t ids[CTX + 8];
    char text[48];
    if (flags & 1) {
        size_t n = rd(r) % (sizeof text - 1);
        for (size_t i = 0; i < n; i++) text[i] = (char)(rd(r) | 1); /* no NUL inside */
        text[n] = '\0';
        s.prompt = text;
        s.chat = (flags & 2) != 0;
    } else {
        size_t n = rd(r) % (CTX + 4);
        for (size_t i = 0; i < n; i++) ids[i] = (flags & 2) ? (int32_t)rd16(r) - 64 : (int32_t)(rd(r) % VOCAB);
        s.prompt_ids = ids;
        s.n_prompt_ids = n;
    }
    s.max_tokens = rd(r) % 20u;
    if (flags & 4) s.max_tokens = rd(r);
    Specd__Sampling samp = SPECD__SAMPLING__INIT;
    if (flags & 8) {
        samp.temperature = (float)(rd(r) % 20) / 10.0f;
        samp.top_k = rd(r) % 50u;
        samp.top_p = (float)(rd(r) % 11) / 10.0f;
        samp.seed = rd(r);
        s.sampling = &samp;
    }
    char stop_text[2][4];
    char *stops[2];
    if (flags & 16) {
        size_t ns = 1 + rd(r) % 2u;
        for (size_t i = 0; i < ns; i++) {
            for (int j = 0; j < 3; j++) stop_text[i][j] = (char)('a' + rd(r) % 4);
            stop_text[i][1 + rd(r) % 2] = '\0';
            stop_text[i][3] = '\0';
            stops[i] = stop_text[i];
        }
        s.stop = stops;
        s.n_stop = ns;
    }
    s.ignore_eos = (flags & 32) != 0;
    if (flags & 64) s.max_k = (int32_t)(rd(r) % 12) - 2;
    int32_t max_tokens = s.max_tokens ? (int32_t)s.max_tokens : f->c.p.max_tokens_default;
    f->sub[f->n_sub++] = (submitted){.tag = s.client_tag, .client = cl, .max_tokens = max_tokens};
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    feed_client(f, cl, &e);
    if (f->sub[f->n_sub - 1].answers != 1)
        VIOLATION("submit tag %llu not answered at once", (unsigned long long)s.client_tag);
}

static void cancel(fz *f, reader *r) {
    int cl = rd(r) % N_CLIENTS;
    uint8_t b = rd(r);
    Specd__Cancel can = SPECD__CANCEL__INIT;
    can.request_id = f->n_req && b < 200 ? f->req[b % f->n_req].id : b;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_CANCEL;
    e.cancel = &can;
    feed_client(f, cl, &e);
}

static void stats(fz *f, reader *r) {
    int cl = rd(r) % N_CLIENTS;
    Specd__StatsQuery q = SPECD__STATS_QUERY__INIT;
    q.include_workers = rd(r) & 1;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_STATS;
    e.stats = &q;
    feed_client(f, cl, &e);
}

static void raw(fz *f, reader *r) {
    uint8_t who = rd(r);
    size_t n = rd(r);
    if (n > r->n - r->at) n = r->n - r->at;
    uint8_t *b = malloc(n ? n : 1); /* exact size, so ASan sees over-reads */
    if (!b) abort();
    memcpy(b, r->p + r->at, n);
    r->at += n;
    if (who & 1) {
        int w = (who >> 1) % N_FIXED_WORKERS;
        sd_workers_on_message(&f->c, (const uint8_t *)f->worker_ident[w], strlen(f->worker_ident[w]), b, n, f->now);
    } else {
        int cl = (who >> 1) % N_CLIENTS;
        sd_clients_on_message(&f->c, (const uint8_t *)CLIENT_IDENT[cl], strlen(CLIENT_IDENT[cl]), b, n, f->now);
    }
    free(b);
}

/* Time passes: heartbeats from the clients (they are not what is tested
 * here), then the coordinator's ticks. */
static void pass_time(fz *f, uint64_t us) {
    f->now += us;
    for (int cl = 0; cl < N_CLIENTS; cl++) client_heartbeat(f, cl);
    sd_workers_tick(&f->c, f->now);
    sd_clients_tick(&f->c, f->now);
}

/* ---------------------------------------------------------------- the end */

static bool all_done(const fz *f) {
    for (int i = 0; i < f->n_req; i++)
        if (!f->req[i].ended) return false;
    return true;
}

static bool worker_alive(const fz *f, int w) {
    for (int i = 0; i < SD_COORD_MAX_WORKERS; i++) {
        const sd_coord_worker *x = &f->c.workers[i];
        if (x->used && x->alive && x->ident_len == strlen(f->worker_ident[w]) &&
            memcmp(x->ident, f->worker_ident[w], x->ident_len) == 0)
            return true;
    }
    return false;
}

/* Faithful workers from here on, until every request has ended. A step
 * the program answered wrongly (or not at all) is never answered again, as
 * with a real worker that believes it answered: only the coordinator's step
 * timeout recovers it, and a hostile Hello's step costs can make that
 * timeout long. So when nothing is left to answer, time jumps ahead by
 * HEAL_IDLE_US, the workers heartbeating at the new time. */
static void heal(fz *f) {
    memset(f->gone, 0, sizeof f->gone);
    for (int round = 0; round < HEAL_ROUNDS && !all_done(f); round++) {
        if (sd_place_count(&f->c, SPECD__ROLE__ROLE_VERIFIER) == 0 && f->n_fresh < N_WORKER_IDENTS - N_FIXED_WORKERS) {
            int w = N_FIXED_WORKERS + f->n_fresh++;
            hello(f, w, true, NULL);
            if (sd_place_count(&f->c, SPECD__ROLE__ROLE_DRAFTER) == 0 && f->n_fresh < N_WORKER_IDENTS - N_FIXED_WORKERS)
                hello(f, N_FIXED_WORKERS + f->n_fresh++, false, NULL);
        }
        bool answered = false;
        for (int w = 0; w < N_WORKER_IDENTS; w++) answered |= answer(f, w, NULL);
        f->now += answered ? HEAL_STEP_US : HEAL_IDLE_US;
        for (int w = 0; w < N_WORKER_IDENTS; w++)
            if (worker_alive(f, w)) worker_heartbeat(f, w);
        pass_time(f, 0);
    }
    if (!all_done(f)) {
        for (int i = 0; i < f->n_req; i++)
            if (!f->req[i].ended)
                fprintf(stderr, "fuzz_coord: request %llu never ended (%u tokens)\n", (unsigned long long)f->req[i].id,
                        f->req[i].generated);
        VIOLATION("requests lost: %d active, %d queued, %d verifier groups, %d drafters", f->c.n_active, f->c.n_queued,
                  sd_place_count(&f->c, SPECD__ROLE__ROLE_VERIFIER), sd_place_count(&f->c, SPECD__ROLE__ROLE_DRAFTER));
    }
    for (int i = 0; i < f->n_sub; i++)
        if (f->sub[i].answers != 1)
            VIOLATION("submit tag %llu answered %d times", (unsigned long long)f->sub[i].tag, f->sub[i].answers);
    if (f->c.n_chunks != 0) VIOLATION("%d token chunks never streamed", f->c.n_chunks);
    /* Every request has ended: a worker still registered must have been
     * told to free each sequence it was sent. */
    for (int w = 0; w < N_WORKER_IDENTS; w++)
        if (worker_alive(f, w) && f->holds[w].n > 0)
            VIOLATION("worker %s was never sent a Release for request %llu (%d left)", f->worker_ident[w],
                      (unsigned long long)f->holds[w].id[0], f->holds[w].n);
}

/* SPECD_FUZZ_VERBOSE: 1 a line per input, to see what a corpus exercises;
 * 2 also the coordinator's log and every op. */
static int verbosity(void) {
    static int v = -1;
    if (v < 0) v = getenv("SPECD_FUZZ_VERBOSE") ? atoi(getenv("SPECD_FUZZ_VERBOSE")) : 0;
    return v;
}

static void summary(const fz *f, size_t ops_bytes) {
    if (verbosity() < 1) return;
    uint64_t tokens = 0;
    for (int i = 0; i < f->n_req; i++) tokens += f->req[i].generated;
    fprintf(stderr,
            "fuzz_coord: %zu bytes: %d submits, %d accepted, %llu tokens streamed, %llu finished, "
            "%d fresh workers\n",
            ops_bytes, f->n_sub, f->n_req, (unsigned long long)tokens, (unsigned long long)f->c.finished_requests,
            f->n_fresh);
}

/* ---------------------------------------------------------------- setup */

static void remove_model(void) {
    if (!g_model[0]) return;
    unlink(g_model);
    rmdir(g_dir);
}

static bool make_model(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/specd-fuzz-coord-XXXXXX");
    if (!mkdtemp(g_dir)) return false;
    snprintf(g_model, sizeof g_model, "%s/target.gguf", g_dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab %d --ctx %d --seed 3 >/dev/null 2>&1",
             SPECD_MKMODEL, g_model, VOCAB, CTX);
    atexit(remove_model);
    return system(cmd) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready; /* 0 not tried, 1 ok, -1 failed */
    if (!ready) {
        sd_log_set(NULL, NULL, verbosity() >= 2 ? SD_LOG_DEBUG : SD_LOG_OFF, NULL);
        ready = make_model() ? 1 : -1;
        if (ready < 0) fprintf(stderr, "fuzz_coord: specd-mkmodel failed (%s)\n", SPECD_MKMODEL);
    }
    if (ready < 0) abort();
    fz *f = calloc(1, sizeof *f);
    if (!f) abort();
    g_fz = f;
    for (int w = 0; w < N_WORKER_IDENTS; w++)
        snprintf(f->worker_ident[w], sizeof f->worker_ident[w], w < 2 ? "v%d" : w < 4 ? "d%d" : "h%d", w);
    sd_coord_params p = sd_coord_default_params();
    p.model_path = g_model;
    p.max_queue = 4;
    p.max_active = 3;
    p.max_tokens_default = 12;
    p.prefill_chunk = 8;
    p.draft_timeout_ms = 200;
    p.verify_timeout_ms = 1000;
    p.heartbeat_interval_ms = 100;
    p.heartbeat_liveness = 3;
    sd_coord_io io = {.user = f, .to_worker = to_worker, .to_client = to_client};
    if (sd_coord_state_init(&f->c, &p, &io) != SD_OK) abort();
    f->c.clock_us = fz_clock;
    f->now = 1000000;
    if (f->c.n_vocab != VOCAB) abort();

    reader r = {data, size, 0};
    while (r.at < r.n && f->n_sub < MAX_TRACKED / 2) {
        uint8_t op = rd(&r);
        if (verbosity() >= 2)
            fprintf(stderr, "fuzz_coord: op %d at byte %zu, t %llu ms\n", op % 12, r.at - 1,
                    (unsigned long long)(f->now / 1000u));
        switch (op % 12) {
        case 0: submit(f, &r); break;
        case 1: cancel(f, &r); break;
        case 2: stats(f, &r); break;
        case 3: {
            uint8_t b = rd(&r);
            hello(f, b % N_FIXED_WORKERS, (b & 4) == 0, &r);
            break;
        }
        case 4:
        case 5: /* answers are the common case */ answer(f, rd(&r) % N_FIXED_WORKERS, &r); break;
        case 6: answer(f, rd(&r) % N_FIXED_WORKERS, NULL); break;
        case 7: worker_heartbeat(f, rd(&r) % N_FIXED_WORKERS); break;
        case 8: raw(f, &r); break;
        case 9: pass_time(f, (uint64_t)rd(&r) * 5000u); break;
        case 10: {
            uint8_t b = rd(&r);
            f->gone[b % N_FIXED_WORKERS] = (b & 4) != 0;
            break;
        }
        case 11: /* a faithful pair registers */
            hello(f, 0, true, NULL);
            hello(f, 2, false, NULL);
            break;
        }
    }
    if (verbosity() >= 2) fprintf(stderr, "fuzz_coord: faithful workers from here on\n");
    heal(f);
    summary(f, size);
    for (int w = 0; w < N_WORKER_IDENTS; w++) free(f->last[w].bytes);
    sd_coord_state_free(&f->c);
    g_fz = NULL;
    free(f);
    return 0;
}
