/* test_unpack.c — the unpack memory budget (net/unpack.c) and the fitted
 * socket caps.
 *
 * Hostile messages are built by hand from wire bytes (a tag and a zero
 * length repeated millions of times: each is an empty sub-message or an
 * empty string that protobuf-c would allocate); legitimate messages are the
 * densest the services send (an n-gram drafter's one-entry sparse q's) and
 * the largest (full SD_MAX_TOP_N q's), packed with the generated code. ASan
 * checks that a refused unpack frees what it had built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "specd/net.h"

/* Writes a varint; returns the bytes written. */
static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[n++] = v ? (b | 0x80) : b;
    } while (v);
    return n;
}

/* An envelope whose field env_tag holds a message whose field inner_tag is
 * repeated n times with zero length: [env_tag: LEN [inner_tag: LEN 0] x n].
 * Caller frees. */
static uint8_t *empty_repeats(uint32_t env_tag, uint32_t inner_tag, size_t n, size_t *len) {
    size_t body = 2 * n;
    uint8_t *buf = malloc(body + 16);
    assert_non_null(buf);
    size_t o = put_varint(buf, (uint64_t)env_tag << 3 | 2);
    o += put_varint(buf + o, body);
    for (size_t i = 0; i < n; i++) {
        buf[o++] = (uint8_t)(inner_tag << 3 | 2);
        buf[o++] = 0;
    }
    *len = o;
    return buf;
}

static void expect_over_budget_client(const uint8_t *buf, size_t len) {
    Specd__Code code = SPECD__CODE__CODE_OK;
    char err[256];
    Specd__ClientToCoordinator *env = sd_net_decode_client(buf, len, NULL, &code, err, sizeof err);
    assert_null(env);
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    assert_non_null(strstr(err, "budget"));
}

/* 4 MiB of empty stop strings in a Submit (2 wire bytes each): refused. */
static void test_client_empty_strings_refused(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = empty_repeats(2 /* submit */, 8 /* stop */, (4u << 20) / 2 - 8, &len);
    expect_over_budget_client(buf, len);
    free(buf);
    /* 60,000 of them (under the field cap): the budget refuses, an unbounded one unpacks */
    buf = empty_repeats(2, 8, 60000, &len);
    bool over = false;
    ProtobufCMessage *m =
        sd_net_unpack(&specd__client_to_coordinator__descriptor, buf, len, sd_net_unpack_budget(len), &over, NULL);
    assert_null(m);
    assert_true(over);
    m = sd_net_unpack(&specd__client_to_coordinator__descriptor, buf, len, SIZE_MAX, &over, NULL);
    assert_non_null(m);
    assert_false(over);
    protobuf_c_message_free_unpacked(m, NULL);
    free(buf);
}

/* Entries of 9 bytes cost protobuf-c under 16x their size, so the budget
 * alone would let a 4.5 MiB message take ~70 MiB; past 65,536 fields the
 * walk refuses it, even with an unbounded budget. */
static uint8_t *nine_byte_results(size_t n, size_t *len) {
    const uint8_t entry[] = {0x12, 0x07, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}; /* results { request_id } */
    uint8_t *buf = malloc(16 + n * sizeof entry);
    assert_non_null(buf);
    size_t o = 0;
    buf[o++] = 0x22; /* WorkerToCoordinator.draft */
    o += put_varint(buf + o, n * sizeof entry);
    for (size_t i = 0; i < n; i++, o += sizeof entry) memcpy(buf + o, entry, sizeof entry);
    *len = o;
    return buf;
}

static void test_field_count_cap(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = nine_byte_results(30000, &len); /* 60,000 fields */
    bool over = true;
    ProtobufCMessage *m = sd_net_unpack(&specd__worker_to_coordinator__descriptor, buf, len, SIZE_MAX, &over, NULL);
    assert_non_null(m);
    protobuf_c_message_free_unpacked(m, NULL);
    free(buf);
    buf = nine_byte_results(524288, &len);
    assert_null(sd_net_unpack(&specd__worker_to_coordinator__descriptor, buf, len, SIZE_MAX, &over, NULL));
    assert_true(over);
    Specd__Code code;
    char err[256];
    assert_null(sd_net_decode_worker(buf, len, NULL, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    assert_non_null(strstr(err, "budget"));
    free(buf);
}

/* 64 MiB of empty DraftResult sub-messages in a DraftResponse: refused. */
static void test_worker_empty_submessages_refused(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = empty_repeats(4 /* draft */, 2 /* results */, (64u << 20) / 2 - 8, &len);
    Specd__Code code = SPECD__CODE__CODE_OK;
    char err[256];
    Specd__WorkerToCoordinator *env = sd_net_decode_worker(buf, len, NULL, &code, err, sizeof err);
    assert_null(env);
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    assert_non_null(strstr(err, "budget"));
    free(buf);
}

/* A DraftResponse of n_results results of k tokens, each q with top_n
 * entries; packed into a malloc'd buffer (caller frees). */
static uint8_t *pack_draft_response(size_t n_results, size_t k, size_t top_n, size_t *len) {
    Specd__DraftResult *res = calloc(n_results, sizeof *res);
    Specd__DraftResult **pres = calloc(n_results, sizeof *pres);
    int32_t *tokens = calloc(k, sizeof *tokens);
    Specd__SparseDist *q = calloc(k, sizeof *q);
    Specd__SparseDist **pq = calloc(k, sizeof *pq);
    int32_t *ids = calloc(top_n, sizeof *ids);
    float *probs = calloc(top_n, sizeof *probs);
    assert_true(res && pres && tokens && q && pq && ids && probs);
    for (size_t j = 0; j < top_n; j++) {
        ids[j] = (int32_t)(j * 37 % 49152);
        probs[j] = 1.0f / (float)top_n;
    }
    for (size_t t = 0; t < k; t++) {
        tokens[t] = ids[0];
        specd__sparse_dist__init(&q[t]);
        q[t].n_ids = top_n;
        q[t].ids = ids;
        q[t].n_probs = top_n;
        q[t].probs = probs;
        pq[t] = &q[t];
    }
    for (size_t i = 0; i < n_results; i++) {
        specd__draft_result__init(&res[i]);
        res[i].request_id = i + 1;
        res[i].code = SPECD__CODE__CODE_OK;
        res[i].n_tokens = k;
        res[i].tokens = tokens;
        res[i].n_q = k;
        res[i].q = pq;
        res[i].cached_len = 100;
        pres[i] = &res[i];
    }
    Specd__DraftResponse dr = SPECD__DRAFT_RESPONSE__INIT;
    dr.step_id = 7;
    dr.n_results = n_results;
    dr.results = pres;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_DRAFT;
    env.draft = &dr;
    *len = protobuf_c_message_get_packed_size(&env.base);
    uint8_t *buf = malloc(*len);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(&env.base, buf), *len);
    free(res);
    free(pres);
    free(tokens);
    free(q);
    free(pq);
    free(ids);
    free(probs);
    return buf;
}

/* The smallest budget that unpacks buf (bisection), to report the ratio. */
static size_t min_budget(const uint8_t *buf, size_t len) {
    size_t lo = 0, hi = SIZE_MAX / 4;
    while (lo + 1 < hi) {
        size_t mid = lo + (hi - lo) / 2;
        ProtobufCMessage *m = sd_net_unpack(&specd__worker_to_coordinator__descriptor, buf, len, mid, NULL, NULL);
        if (m) {
            protobuf_c_message_free_unpacked(m, NULL);
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return hi;
}

static void expect_decodes(size_t n_results, size_t k, size_t top_n) {
    size_t len;
    uint8_t *buf = pack_draft_response(n_results, k, top_n, &len);
    sd_net_limits lim = {.n_vocab = 49152, .max_context = 8192, .max_batch = SD_MAX_BATCH, .max_k = SD_MAX_K};
    Specd__Code code;
    char err[256];
    Specd__WorkerToCoordinator *env = sd_net_decode_worker(buf, len, &lim, &code, err, sizeof err);
    if (!env) fail_msg("%zu x %zu x %zu: %s", n_results, k, top_n, err);
    assert_int_equal(env->draft->n_results, n_results);
    specd__worker_to_coordinator__free_unpacked(env, NULL);
    size_t need = min_budget(buf, len);
    print_message("DraftResponse %zu x %zu x top-%zu: %zu wire bytes need %zu bytes (%.1fx), budget %zu\n", n_results,
                  k, top_n, len, need, (double)need / (double)len, sd_net_unpack_budget(len));
    assert_true(need <= sd_net_unpack_budget(len));
    /* One byte less than needed fails cleanly (and leaks nothing: ASan). */
    bool over = false;
    assert_null(sd_net_unpack(&specd__worker_to_coordinator__descriptor, buf, len, need - 1, &over, NULL));
    assert_true(over);
    free(buf);
}

/* The densest legitimate worker messages fit their budget. */
static void test_legitimate_within_budget(void **state) {
    (void)state;
    expect_decodes(1, 1, 1);
    expect_decodes(SD_MAX_BATCH, SD_MAX_K, 1); /* n-gram drafter: one-entry q's */
    expect_decodes(64, 8, 64);
    expect_decodes(64, 8, SD_MAX_TOP_N);
}

/* A VerifyResponse of n_results results of n_commit tokens each with
 * logprobs (all 0: proto3 leaves each out, the cheapest wire) and top
 * alternatives per token; bad picks one defect. Caller frees. */
enum lp_defect { LP_OK, LP_COUNT, LP_UNEVEN, LP_TOO_MANY, LP_POSITIVE, LP_VOCAB };

static uint8_t *pack_verify_logprobs(size_t n_results, size_t n_commit, size_t top, enum lp_defect bad, size_t *len) {
    Specd__VerifyResult *res = calloc(n_results, sizeof *res);
    Specd__VerifyResult **pres = calloc(n_results, sizeof *pres);
    int32_t *commit = calloc(n_commit, sizeof *commit);
    float *lps = calloc(n_commit, sizeof *lps);
    size_t n_top = n_commit * top + (bad == LP_UNEVEN);
    int32_t *top_ids = calloc(n_top + 1, sizeof *top_ids);
    float *top_lps = calloc(n_top + 1, sizeof *top_lps);
    assert_true(res && pres && commit && lps && top_ids && top_lps);
    if (bad == LP_POSITIVE) lps[0] = 0.5f;
    if (bad == LP_VOCAB) top_ids[0] = 49152;
    for (size_t i = 0; i < n_results; i++) {
        specd__verify_result__init(&res[i]);
        res[i].request_id = i + 1;
        res[i].code = SPECD__CODE__CODE_OK;
        res[i].n_accepted = (uint32_t)n_commit - 1;
        res[i].n_commit = n_commit;
        res[i].commit = commit;
        res[i].n_logprobs = n_commit - (bad == LP_COUNT);
        res[i].logprobs = lps;
        res[i].n_top_ids = res[i].n_top_logprobs = n_top;
        res[i].top_ids = top_ids;
        res[i].top_logprobs = top_lps;
        pres[i] = &res[i];
    }
    Specd__VerifyResponse vr = SPECD__VERIFY_RESPONSE__INIT;
    vr.n_results = n_results;
    vr.results = pres;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_VERIFY;
    env.verify = &vr;
    *len = protobuf_c_message_get_packed_size(&env.base);
    uint8_t *buf = malloc(*len);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(&env.base, buf), *len);
    free(res);
    free(pres);
    free(commit);
    free(lps);
    free(top_ids);
    free(top_lps);
    return buf;
}

/* A TokenChunk of n tokens with a TokenLogprob each, top alternatives with
 * their bytes; bad picks one defect. Caller frees. */
enum chunk_defect { CH_OK, CH_COUNT, CH_TOO_MANY, CH_BYTES_COUNT, CH_LONG_TOKEN };

static uint8_t *pack_chunk_logprobs(size_t n, size_t top, enum chunk_defect bad, size_t *len) {
    static char long_token[SD_MAX_TOKEN_BYTES + 1];
    memset(long_token, 'x', sizeof long_token);
    Specd__TokenLogprob *lp = calloc(n, sizeof *lp);
    Specd__TokenLogprob **plp = calloc(n, sizeof *plp);
    int32_t *tokens = calloc(n, sizeof *tokens);
    int32_t ids[SD_MAX_TOP_LOGPROBS + 1] = {0};
    float vals[SD_MAX_TOP_LOGPROBS + 1] = {0};
    ProtobufCBinaryData bytes[SD_MAX_TOP_LOGPROBS + 1];
    for (size_t j = 0; j <= SD_MAX_TOP_LOGPROBS; j++) bytes[j] = (ProtobufCBinaryData){2, (uint8_t *)"ab"};
    assert_true(lp && plp && tokens);
    for (size_t i = 0; i < n; i++) {
        specd__token_logprob__init(&lp[i]);
        lp[i].logprob = -1.0f;
        lp[i].token = (ProtobufCBinaryData){bad == CH_LONG_TOKEN ? sizeof long_token : 2,
                                            bad == CH_LONG_TOKEN ? (uint8_t *)long_token : (uint8_t *)"ab"};
        lp[i].n_top_ids = lp[i].n_top_logprobs = top;
        lp[i].n_top_tokens = top - (bad == CH_BYTES_COUNT);
        lp[i].top_ids = ids;
        lp[i].top_logprobs = vals;
        lp[i].top_tokens = bytes;
        plp[i] = &lp[i];
    }
    Specd__TokenChunk ch = SPECD__TOKEN_CHUNK__INIT;
    ch.request_id = 5;
    ch.n_tokens = n;
    ch.tokens = tokens;
    ch.n_logprobs = n - (bad == CH_COUNT);
    ch.logprobs = plp;
    Specd__CoordinatorToClient env = SPECD__COORDINATOR_TO_CLIENT__INIT;
    env.body_case = SPECD__COORDINATOR_TO_CLIENT__BODY_TOKENS;
    env.tokens = &ch;
    *len = protobuf_c_message_get_packed_size(&env.base);
    uint8_t *buf = malloc(*len);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(&env.base, buf), *len);
    free(lp);
    free(plp);
    free(tokens);
    return buf;
}

/* Logprobs on the worker and client links: the largest legitimate ones fit
 * their budget; a count that does not match its tokens, more than
 * SD_MAX_TOP_LOGPROBS alternatives, a positive log-probability, an id out
 * of the vocabulary, missing bytes or an over-long token are refused with a
 * reason. */
static void test_logprob_bounds(void **state) {
    (void)state;
    sd_net_limits lim = {.n_vocab = 49152, .max_context = 8192, .max_batch = SD_MAX_BATCH, .max_k = SD_MAX_K};
    Specd__Code code;
    char err[256];
    static const size_t tops[] = {0, SD_MAX_TOP_LOGPROBS};
    for (size_t t = 0; t < 2; t++) {
        size_t len;
        uint8_t *buf = pack_verify_logprobs(SD_MAX_BATCH, SD_MAX_K + 1, tops[t], LP_OK, &len);
        Specd__WorkerToCoordinator *env = sd_net_decode_worker(buf, len, &lim, &code, err, sizeof err);
        if (!env) fail_msg("verify logprobs, top %zu: %s", tops[t], err);
        assert_int_equal(env->verify->results[0]->n_top_ids, (SD_MAX_K + 1) * tops[t]);
        specd__worker_to_coordinator__free_unpacked(env, NULL);
        size_t need = min_budget(buf, len);
        print_message("VerifyResponse %d x %d tokens x top-%zu: %zu wire bytes need %zu (budget %zu)\n", SD_MAX_BATCH,
                      SD_MAX_K + 1, tops[t], len, need, sd_net_unpack_budget(len));
        assert_true(need <= sd_net_unpack_budget(len));
        free(buf);
    }
    static const struct {
        enum lp_defect bad;
        size_t top;
        const char *word;
    } vbad[] = {{LP_COUNT, 2, "logprobs"},
                {LP_UNEVEN, 2, "alternatives"},
                {LP_TOO_MANY, SD_MAX_TOP_LOGPROBS + 1, "alternatives"},
                {LP_POSITIVE, 2, "log-probability"},
                {LP_VOCAB, 2, "top_ids"}};
    for (size_t i = 0; i < sizeof vbad / sizeof vbad[0]; i++) {
        size_t len;
        uint8_t *buf = pack_verify_logprobs(2, 3, vbad[i].top, vbad[i].bad, &len);
        assert_null(sd_net_decode_worker(buf, len, &lim, &code, err, sizeof err));
        assert_int_equal(code, SPECD__CODE__CODE_BAD_REQUEST);
        if (!strstr(err, vbad[i].word)) fail_msg("defect %d: '%s' lacks '%s'", (int)vbad[i].bad, err, vbad[i].word);
        free(buf);
    }
    size_t len;
    uint8_t *buf = pack_chunk_logprobs(SD_MAX_K + 1, SD_MAX_TOP_LOGPROBS, CH_OK, &len);
    Specd__CoordinatorToClient *cenv = sd_net_decode_to_client(buf, len, &code, err, sizeof err);
    if (!cenv) fail_msg("chunk logprobs: %s", err);
    assert_int_equal(cenv->tokens->n_logprobs, SD_MAX_K + 1);
    specd__coordinator_to_client__free_unpacked(cenv, NULL);
    free(buf);
    static const struct {
        enum chunk_defect bad;
        size_t top;
        Specd__Code code;
    } cbad[] = {{CH_COUNT, 2, SPECD__CODE__CODE_BAD_REQUEST},
                {CH_TOO_MANY, SD_MAX_TOP_LOGPROBS + 1, SPECD__CODE__CODE_BAD_REQUEST},
                {CH_BYTES_COUNT, 2, SPECD__CODE__CODE_BAD_REQUEST},
                {CH_LONG_TOKEN, 2, SPECD__CODE__CODE_TOO_LARGE}};
    for (size_t i = 0; i < sizeof cbad / sizeof cbad[0]; i++) {
        buf = pack_chunk_logprobs(3, cbad[i].top, cbad[i].bad, &len);
        assert_null(sd_net_decode_to_client(buf, len, &code, err, sizeof err));
        assert_int_equal(code, cbad[i].code);
        assert_non_null(strstr(err, "tokens.logprobs"));
        free(buf);
    }
}

/* Truncated bytes are MALFORMED without the budget word. */
static void test_truncated_not_budget(void **state) {
    (void)state;
    uint8_t bad[] = {0x22, 0x10, 0x12};
    Specd__Code code;
    char err[256];
    assert_null(sd_net_decode_worker(bad, sizeof bad, NULL, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_MALFORMED);
    assert_null(strstr(err, "budget"));
    bool over = true;
    assert_null(sd_net_unpack(&specd__worker_to_coordinator__descriptor, bad, sizeof bad, SIZE_MAX, &over, NULL));
    assert_false(over);
}

/* The fitted caps hold the largest legitimate message and no more than the link's ceiling. */
static void test_caps(void **state) {
    (void)state;
    int64_t cap = sd_net_worker_reply_cap(64, 8);
    size_t len;
    uint8_t *buf = pack_draft_response(64, 8, SD_MAX_TOP_N, &len);
    print_message("worker reply cap for 64 x 8: %lld bytes; the largest reply packs to %zu\n", (long long)cap, len);
    assert_true((int64_t)len <= cap);
    assert_true(cap < SD_MAX_WORKER_MSG_BYTES);
    free(buf);
    assert_int_equal(sd_net_worker_reply_cap(1, 0), SD_MIN_MSG_CAP_BYTES);
    assert_int_equal(sd_net_worker_reply_cap(SD_MAX_BATCH, SD_MAX_K), SD_MAX_WORKER_MSG_BYTES);
    int64_t ccap = sd_net_client_msg_cap(8192);
    assert_true(ccap > 2 * SD_MAX_PROMPT_BYTES && ccap <= SD_MAX_CLIENT_MSG_BYTES);
    assert_int_equal(sd_net_client_msg_cap(1 << 30), SD_MAX_CLIENT_MSG_BYTES);
    assert_true(sd_net_unpack_budget(SIZE_MAX) == SIZE_MAX);
    /* a worker's cap holds a verify batch of full contexts (prefixes resent after CACHE_MISS) */
    sd_net_limits lim = {.n_vocab = 49152, .max_context = 2048, .max_batch = 64, .max_k = 16};
    int64_t wcap = sd_net_worker_request_cap(&lim);
    Specd__VerifySeq *seqs = calloc(64, sizeof *seqs);
    Specd__VerifySeq **pseqs = calloc(64, sizeof *pseqs);
    int32_t *append = calloc(2048, sizeof *append);
    assert_true(seqs && pseqs && append);
    for (int i = 0; i < 2048; i++) append[i] = 49151 - i;
    for (int i = 0; i < 64; i++) {
        specd__verify_seq__init(&seqs[i]);
        seqs[i].request_id = (uint64_t)i + 1;
        seqs[i].n_append = 2048;
        seqs[i].append = append;
        pseqs[i] = &seqs[i];
    }
    Specd__VerifyRequest vr = SPECD__VERIFY_REQUEST__INIT;
    vr.n_seqs = 64;
    vr.seqs = pseqs;
    Specd__CoordinatorToWorker env = SPECD__COORDINATOR_TO_WORKER__INIT;
    env.body_case = SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY;
    env.verify = &vr;
    size_t vlen = protobuf_c_message_get_packed_size(&env.base);
    print_message("worker request cap for 64 x 2048: %lld bytes; 64 full prefixes pack to %zu\n", (long long)wcap,
                  vlen);
    assert_true((int64_t)vlen <= wcap && wcap < SD_MAX_WORKER_MSG_BYTES);
    free(seqs);
    free(pseqs);
    free(append);
    assert_int_equal(sd_net_worker_request_cap(NULL), SD_MAX_WORKER_MSG_BYTES);
}

/* A NUL byte in any text field is refused, not cut (protobuf-c drops the length). */
static void test_nul_in_text(void **state) {
    (void)state;
    /* ClientToCoordinator{submit{prompt: "ab\0cd"}} */
    const uint8_t prompt[] = {0x12, 0x07, 0x12, 0x05, 'a', 'b', 0, 'c', 'd'};
    assert_string_equal(sd_net_nul_field(&specd__client_to_coordinator__descriptor, prompt, sizeof prompt), "prompt");
    Specd__Code code;
    char err[256];
    assert_null(sd_net_decode_client(prompt, sizeof prompt, NULL, &code, err, sizeof err));
    assert_int_equal(code, SPECD__CODE__CODE_BAD_REQUEST);
    assert_non_null(strstr(err, "NUL"));
    /* submit{prompt: "ok", stop: ["x\0"]} */
    const uint8_t stop[] = {0x12, 0x08, 0x12, 0x02, 'o', 'k', 0x42, 0x02, 'x', 0};
    assert_string_equal(sd_net_nul_field(&specd__client_to_coordinator__descriptor, stop, sizeof stop), "stop");
    /* bytes fields may hold NULs; clean text passes; garbage ends the walk quietly */
    const uint8_t clean[] = {0x12, 0x04, 0x12, 0x02, 'o', 'k'};
    assert_null(sd_net_nul_field(&specd__client_to_coordinator__descriptor, clean, sizeof clean));
    Specd__ClientToCoordinator *env = sd_net_decode_client(clean, sizeof clean, NULL, &code, err, sizeof err);
    assert_non_null(env);
    assert_string_equal(env->submit->prompt, "ok");
    specd__client_to_coordinator__free_unpacked(env, NULL);
    const uint8_t garbage[] = {0x12, 0x7f, 0x12};
    assert_null(sd_net_nul_field(&specd__client_to_coordinator__descriptor, garbage, sizeof garbage));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_empty_strings_refused),
        cmocka_unit_test(test_worker_empty_submessages_refused),
        cmocka_unit_test(test_field_count_cap),
        cmocka_unit_test(test_legitimate_within_budget),
        cmocka_unit_test(test_truncated_not_budget),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_nul_in_text),
        cmocka_unit_test(test_logprob_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
