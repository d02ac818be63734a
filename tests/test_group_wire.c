/* test_group_wire.c — the verifier group's link as net/validate.c decodes
 * it (sd_net_decode_rank, sd_net_decode_leader): well-formed GroupJoin,
 * GroupSetup, GroupPlan and GroupStop pass; each malformed one is refused
 * with its own message (plan arrays of different lengths, a token outside
 * the vocabulary, no rows, a window table whose length is not bt's; a
 * setup with both or neither of shm_name and nccl_id, a '/' in the name, a
 * zero heartbeat, a window pool larger than the main one; a join claiming rank 0 or a
 * rank past the group, an unknown LM head mode, no model); bytes of another
 * envelope are not taken for a group message. What a rank checks against
 * its own pool (block ids, positions) is test_tp's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "specd/net.h"

static uint8_t *pack_leader(const Specd__LeaderToRank *env, size_t *len) {
    *len = specd__leader_to_rank__get_packed_size(env);
    uint8_t *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    specd__leader_to_rank__pack(env, b);
    return b;
}

static uint8_t *pack_rank(const Specd__RankToLeader *env, size_t *len) {
    *len = specd__rank_to_leader__get_packed_size(env);
    uint8_t *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    specd__rank_to_leader__pack(env, b);
    return b;
}

/* Decodes env as LeaderToRank with a vocabulary of 100: NULL expect_err
 * means it must pass, else the error must contain it. */
static void expect_leader(const Specd__LeaderToRank *env, const char *expect_err) {
    size_t len;
    uint8_t *b = pack_leader(env, &len);
    sd_net_limits lim = {100, 0, 0, 0, 0};
    Specd__Code code;
    char err[256];
    Specd__LeaderToRank *d = sd_net_decode_leader(b, len, &lim, &code, err, sizeof err);
    free(b);
    if (!expect_err) {
        if (!d) fail_msg("refused a good message: %s", err);
        specd__leader_to_rank__free_unpacked(d, NULL);
        return;
    }
    if (d) fail_msg("took a bad message (expected '%s')", expect_err);
    if (!strstr(err, expect_err)) fail_msg("error '%s' does not say '%s'", err, expect_err);
    assert_int_not_equal(code, SPECD__CODE__CODE_OK);
}

static void expect_rank(const Specd__RankToLeader *env, const char *expect_err) {
    size_t len;
    uint8_t *b = pack_rank(env, &len);
    Specd__Code code;
    char err[256];
    Specd__RankToLeader *d = sd_net_decode_rank(b, len, &code, err, sizeof err);
    free(b);
    if (!expect_err) {
        if (!d) fail_msg("refused a good message: %s", err);
        specd__rank_to_leader__free_unpacked(d, NULL);
        return;
    }
    if (d) fail_msg("took a bad message (expected '%s')", expect_err);
    if (!strstr(err, expect_err)) fail_msg("error '%s' does not say '%s'", err, expect_err);
}

static void test_plan(void **state) {
    (void)state;
    int32_t tokens[3] = {1, 2, 3}, pos[3] = {0, 1, 2}, off[3] = {0, 0, 0}, bt[1] = {5}, wanted[1] = {2};
    Specd__GroupPlan p = SPECD__GROUP_PLAN__INIT;
    p.step = 1;
    p.n_tokens = p.n_pos = p.n_bt_off = 3;
    p.tokens = tokens, p.pos = pos, p.bt_off = off;
    p.n_bt = 1, p.bt = bt;
    p.n_wanted = 1, p.wanted = wanted;
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_PLAN;
    env.plan = &p;
    expect_leader(&env, NULL);
    p.n_pos = 2;
    expect_leader(&env, "3 tokens but 2 positions");
    p.n_pos = 3;
    tokens[1] = 100;
    expect_leader(&env, "plan.tokens[1]: token id 100 out of range [0, 100)");
    tokens[1] = 2;
    p.n_bt = 0;
    expect_leader(&env, "plan.bt: 0 entries");
    p.n_bt = 1;
    p.n_tokens = p.n_pos = p.n_bt_off = 0;
    expect_leader(&env, "plan.tokens: 0 rows");
    p.n_tokens = p.n_pos = p.n_bt_off = 1;
    p.n_wanted = 1;
    expect_leader(&env, NULL);
    int32_t two[2] = {0, 0};
    p.n_wanted = 2, p.wanted = two;
    expect_leader(&env, "plan.wanted: 2 rows of 1");
    p.n_wanted = 1;
    int32_t win[2] = {-1, 3}; /* the window table: as many entries as bt, or none */
    p.n_bt_win = 1, p.bt_win = win;
    expect_leader(&env, NULL);
    p.n_bt_win = 2;
    expect_leader(&env, "plan.bt_win: 2 entries, bt has 1");
}

static void test_setup(void **state) {
    (void)state;
    uint8_t id[128] = {1, 2, 3};
    Specd__GroupSetup s = SPECD__GROUP_SETUP__INIT;
    s.shm_name = "specd-tp-1-abcd";
    s.coll_timeout_ms = 10000;
    s.coll_max_bytes = 1 << 20;
    s.kv_blocks = 64;
    s.block_size = 16;
    s.heartbeat_interval_ms = 200;
    s.heartbeat_liveness = 10;
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_SETUP;
    env.setup = &s;
    expect_leader(&env, NULL);
    s.nccl_id.data = id, s.nccl_id.len = sizeof id;
    expect_leader(&env, "exactly one of shm_name and nccl_id");
    s.shm_name = "";
    expect_leader(&env, NULL); /* NCCL */
    s.nccl_id.len = 0;
    expect_leader(&env, "exactly one of shm_name and nccl_id");
    s.shm_name = "a/b";
    expect_leader(&env, "no '/'");
    s.shm_name = "ok";
    s.heartbeat_interval_ms = 0;
    expect_leader(&env, "heartbeat interval 0 ms");
    s.heartbeat_interval_ms = 200;
    s.block_size = 0;
    expect_leader(&env, "block_size 0");
    s.block_size = 16;
    s.coll_timeout_ms = 0;
    expect_leader(&env, "coll_timeout_ms: 0");
    s.coll_timeout_ms = 1;
    s.window_blocks = 64;
    expect_leader(&env, NULL);
    s.window_blocks = 65;
    expect_leader(&env, "setup.window_blocks: 65 over kv_blocks 64");
    s.window_blocks = 0;
    Specd__GroupStop st = SPECD__GROUP_STOP__INIT;
    st.reason = "a rank died";
    env.body_case = SPECD__LEADER_TO_RANK__BODY_STOP;
    env.stop = &st;
    expect_leader(&env, NULL);
}

static void test_join(void **state) {
    (void)state;
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = "llama";
    id.vocab_size = 100;
    id.name = "m.gguf";
    Specd__GroupJoin j = SPECD__GROUP_JOIN__INIT;
    j.protocol_version = SD_PROTOCOL_VERSION;
    j.rank = 1;
    j.group_size = 2;
    j.model = &id;
    j.host = "vm";
    Specd__RankToLeader env = SPECD__RANK_TO_LEADER__INIT;
    env.body_case = SPECD__RANK_TO_LEADER__BODY_JOIN;
    env.join = &j;
    expect_rank(&env, NULL);
    j.rank = 0;
    expect_rank(&env, "join.rank: 0 outside [1, 2)");
    j.rank = 2;
    expect_rank(&env, "join.rank: 2 outside [1, 2)");
    j.rank = 1;
    j.group_size = 1;
    expect_rank(&env, "join.group_size: 1");
    j.group_size = 2;
    j.lm_head = 2;
    expect_rank(&env, "join.lm_head: 2");
    j.lm_head = 0;
    j.model = NULL;
    expect_rank(&env, "join.model: missing");
    /* bytes of a Hello are not a group message */
    Specd__Hello h = SPECD__HELLO__INIT;
    h.name = "x";
    Specd__WorkerToCoordinator w = SPECD__WORKER_TO_COORDINATOR__INIT;
    w.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    w.hello = &h;
    size_t len = specd__worker_to_coordinator__get_packed_size(&w);
    uint8_t *b = malloc(len);
    specd__worker_to_coordinator__pack(&w, b);
    Specd__Code code;
    char err[256];
    Specd__RankToLeader *d = sd_net_decode_rank(b, len, &code, err, sizeof err);
    free(b);
    if (d) specd__rank_to_leader__free_unpacked(d, NULL);
    assert_null(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_setup),
        cmocka_unit_test(test_join),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
