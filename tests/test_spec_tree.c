/* test_spec_tree.c — token trees verified in one forward (engine/model_tree.c,
 * the CPU backend's attention_tree) on a random model (specd-mkmodel),
 * against chains run by sd_model_forward:
 *   - every node's logits equal, bit for bit, those of its root-to-node path
 *     run as a chain after the same context (f32 and f16 caches; the tree
 *     crosses a block boundary);
 *   - after sd_model_tree_keep of a path the cache's K/V rows equal the
 *     chain's, and the next forward's logits equal the chain's;
 *   - a control: the same nodes run as one flat chain (no tree mask) give
 *     other logits for a node whose parent is not the node before it, so the
 *     comparison above sees a wrong mask;
 *   - malformed trees and kept paths are refused, and so are layers beyond
 *     Llama's (a qwen2 model). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "specd/gguf.h"
#include "specd/kv.h"
#include "specd/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { LAYERS = 3, VOCAB = 300, CTX = 21, NODES = 12, BLOCK = 16 };

static struct {
    char dir[64];
    char path[96], qwen[96];
    bool ok, qwen_ok;
} env;

static int setup(void **state) {
    (void)state;
    strcpy(env.dir, "/tmp/specd_tree_XXXXXX");
    if (!mkdtemp(env.dir)) return -1;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers %d --dim 128 --ff 256 --heads 2 --kv-heads 1 --vocab %d --seed 11 >/dev/null 2>&1",
             SPECD_MKMODEL, env.path, LAYERS, VOCAB);
    env.ok = system(cmd) == 0;
    snprintf(env.qwen, sizeof env.qwen, "%s/q.gguf", env.dir);
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --arch qwen2 --layers 2 --dim 64 --ff 128 --heads 4 --kv-heads 2 --vocab %d --seed 3 "
             ">/dev/null 2>&1",
             SPECD_MKMODEL, env.qwen, VOCAB);
    env.qwen_ok = system(cmd) == 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(env.path);
    unlink(env.qwen);
    rmdir(env.dir);
    return 0;
}

static sd_model *load_file(const char *path, sd_dtype kv_type) {
    sd_gguf *g = NULL;
    char err[128];
    assert_int_equal(sd_gguf_open(path, &g, err, sizeof err), SD_OK);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    mp.kv_type = kv_type;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_gguf_close(&g);
    return m;
}

static sd_model *load(sd_dtype kv_type) { return load_file(env.path, kv_type); }

static const int32_t ctx[CTX] = {5, 17, 99, 3, 250, 42, 7, 8, 9, 120, 121, 33, 34, 35, 200, 201, 2, 4, 6, 88, 77};
/* the tree: roots 0 and 1 (continuing the context), depth up to 5 */
static const int32_t tokens[NODES] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
static const int32_t parent[NODES] = {-1, -1, 0, 0, 1, 2, 2, 5, 3, 7, 8, 9};

static sd_kv *prefill(sd_model *m) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 8, BLOCK, &kv), SD_OK);
    int32_t pos[CTX], seq[CTX] = {0};
    for (int32_t i = 0; i < CTX; i++) pos[i] = i;
    sd_batch b = {CTX, ctx, pos, seq, NULL};
    assert_int_equal(sd_model_forward(m, kv, &b, NULL), SD_OK);
    return kv;
}

/* The path root .. node (node indices), returns its length. */
static int32_t path_of(int32_t node, int32_t *path) {
    int32_t n = 0, tmp[NODES];
    for (int32_t v = node; v >= 0; v = parent[v]) tmp[n++] = v;
    for (int32_t i = 0; i < n; i++) path[i] = tmp[n - 1 - i];
    return n;
}

/* Runs the path's tokens as a chain after the context: logits of every row
 * into out[n][VOCAB]; returns the cache (caller frees). */
static sd_kv *chain(sd_model *m, const int32_t *path, int32_t n, float *out) {
    sd_kv *kv = prefill(m);
    int32_t toks[NODES], pos[NODES], seq[NODES] = {0};
    for (int32_t i = 0; i < n; i++) {
        toks[i] = tokens[path[i]];
        pos[i] = CTX + i;
    }
    bool want[NODES];
    for (int32_t i = 0; i < n; i++) want[i] = true;
    sd_batch b = {n, toks, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    return kv;
}

static void check_tree_logits(sd_dtype kv_type) {
    if (!env.ok) skip();
    sd_model *m = load(kv_type);
    sd_kv *kv = prefill(m);
    static float tree[NODES * VOCAB], ch[NODES * VOCAB];
    sd_tree_batch t = {.seq = 0, .n_nodes = NODES, .tokens = tokens, .parent = parent, .logits = NULL};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, tree), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, 0), CTX + NODES);
    for (int32_t i = 0; i < NODES; i++) {
        int32_t path[NODES], n = path_of(i, path);
        sd_kv *ckv = chain(m, path, n, ch);
        assert_memory_equal(tree + (size_t)i * VOCAB, ch + (size_t)(n - 1) * VOCAB, VOCAB * sizeof(float));
        sd_kv_free(&ckv);
    }
    sd_kv_free(&kv);
    sd_model_free(&m);
}

static void test_tree_logits_f32(void **state) {
    (void)state;
    check_tree_logits(SD_DTYPE_F32);
}

static void test_tree_logits_f16(void **state) {
    (void)state;
    check_tree_logits(SD_DTYPE_F16);
}

/* Keeping the path to node 11 (nodes 0, 2, 5, 7, 9, 11: copied down) leaves
 * the chain's cache, and the next token's logits are the chain's. */
static void test_tree_keep(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(SD_DTYPE_F32);
    sd_kv *kv = prefill(m);
    static float tree[NODES * VOCAB], ch[NODES * VOCAB], a[VOCAB], b[VOCAB];
    sd_tree_batch t = {.seq = 0, .n_nodes = NODES, .tokens = tokens, .parent = parent, .logits = NULL};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, tree), SD_OK);
    int32_t path[NODES], n = path_of(11, path);
    assert_int_equal(n, 6);
    assert_int_equal(sd_model_tree_keep(m, kv, 0, CTX, n, path), SD_OK);
    assert_int_equal(sd_kv_seq_len(kv, 0), CTX + n);
    sd_kv *ckv = chain(m, path, n, ch);
    const sd_kv_params *kp = sd_kv_params_of(kv);
    const size_t row = (size_t)kp->n_kv_heads * (size_t)kp->head_dim * sizeof(float);
    for (int32_t l = 0; l < LAYERS; l++)
        for (int32_t p = 0; p < CTX + n; p++) {
            assert_memory_equal(sd_kv_k(kv, l, 0, p), sd_kv_k(ckv, l, 0, p), row);
            assert_memory_equal(sd_kv_v(kv, l, 0, p), sd_kv_v(ckv, l, 0, p), row);
        }
    const int32_t next = 123, pos = CTX + n, seq = 0;
    const bool want = true;
    sd_batch nb = {1, &next, &pos, &seq, &want};
    assert_int_equal(sd_model_forward(m, kv, &nb, a), SD_OK);
    assert_int_equal(sd_model_forward(m, ckv, &nb, b), SD_OK);
    assert_memory_equal(a, b, sizeof a);
    sd_kv_free(&ckv);
    sd_kv_free(&kv);
    sd_model_free(&m);
}

/* Without the mask (the nodes as one chain) node 4, whose parent is root 1
 * and not node 3, gets other logits than its path: the test above would see
 * a mask that lets a node attend to its siblings. */
static void test_tree_control(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(SD_DTYPE_F32);
    static float flat[NODES * VOCAB], ch[NODES * VOCAB];
    sd_kv *kv = prefill(m);
    int32_t pos[NODES], seq[NODES] = {0};
    bool want[NODES];
    for (int32_t i = 0; i < NODES; i++) {
        pos[i] = CTX + i;
        want[i] = true;
    }
    sd_batch b = {NODES, tokens, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, flat), SD_OK);
    int32_t path[NODES], n = path_of(4, path);
    sd_kv *ckv = chain(m, path, n, ch);
    assert_memory_not_equal(flat + 4 * VOCAB, ch + (size_t)(n - 1) * VOCAB, VOCAB * sizeof(float));
    sd_kv_free(&ckv);
    sd_kv_free(&kv);
    sd_model_free(&m);
}

static void test_tree_refusals(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(SD_DTYPE_F32);
    sd_kv *kv = prefill(m);
    static float out[NODES * VOCAB];
    const int32_t bad_parent[3] = {-1, 1, 0}; /* node 1 its own parent */
    sd_tree_batch t = {.seq = 0, .n_nodes = 3, .tokens = tokens, .parent = bad_parent};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, out), SD_ERR_INVALID_ARG);
    const int32_t bad_token[2] = {1, VOCAB};
    t = (sd_tree_batch){.seq = 0, .n_nodes = 2, .tokens = bad_token, .parent = parent};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, out), SD_ERR_RANGE);
    t = (sd_tree_batch){.seq = 1, .n_nodes = 2, .tokens = tokens, .parent = parent};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, out), SD_ERR_RANGE);
    assert_int_equal(sd_kv_seq_len(kv, 0), CTX); /* refused: nothing grown */
    t = (sd_tree_batch){.seq = 0, .n_nodes = NODES, .tokens = tokens, .parent = parent};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, out), SD_OK);
    const int32_t not_increasing[2] = {3, 2}, below[2] = {0, 0}, past[1] = {NODES};
    assert_int_equal(sd_model_tree_keep(m, kv, 0, CTX, 2, not_increasing), SD_ERR_RANGE);
    assert_int_equal(sd_model_tree_keep(m, kv, 0, CTX, 2, below), SD_ERR_RANGE);
    assert_int_equal(sd_model_tree_keep(m, kv, 0, CTX, 1, past), SD_ERR_RANGE);
    assert_int_equal(sd_kv_seq_len(kv, 0), CTX + NODES);
    sd_kv_free(&kv);
    sd_model_free(&m);
}

/* Layers beyond Llama's (qwen2's biases and NeoX RoPE run in model_arch.c)
 * are refused by name, the cache untouched. */
static void test_tree_refuses_arch(void **state) {
    (void)state;
    if (!env.qwen_ok) skip();
    sd_model *m = load_file(env.qwen, SD_DTYPE_F32);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 4, BLOCK, &kv), SD_OK);
    static float out[NODES * VOCAB];
    sd_tree_batch t = {.seq = 0, .n_nodes = NODES, .tokens = tokens, .parent = parent};
    assert_int_equal(sd_model_forward_tree(m, kv, &t, out), SD_ERR_UNSUPPORTED);
    assert_int_equal(sd_kv_seq_len(kv, 0), 0);
    sd_kv_free(&kv);
    sd_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_logits_f32), cmocka_unit_test(test_tree_logits_f16),
        cmocka_unit_test(test_tree_keep),       cmocka_unit_test(test_tree_control),
        cmocka_unit_test(test_tree_refusals),   cmocka_unit_test(test_tree_refuses_arch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
