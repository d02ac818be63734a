/* test_eagle.c — the target's feature capture (engine/model_capture.c) on a
 * random 4-layer model (specd-mkmodel):
 *   - logits are bit-identical with the capture on and off;
 *   - the rows of layer j equal the last layer's rows of a view of the
 *     first j + 1 layers (the same computation);
 *   - bad capture requests are refused and leave the forward as it was;
 * and EAGLE-3 heads that do not fit (written here in the published layout,
 * one defect each) are refused, each with its own status and log line.
 * The head itself is checked against a numpy reference in
 * tests/ref/test_eagle_head.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "specd/constrain.h"
#include "specd/constrain_slots.h"
#include "specd/drafter.h"
#include "specd/eagle.h"
#include "specd/gguf.h"
#include "specd/model.h"
#include "specd/safetensors.h"
#include "specd/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { LAYERS = 4, VOCAB = 300, DIM = 64, N = 7 };

static struct {
    char dir[64];
    char path[96];
    bool ok;
} env;

static int setup(void **state) {
    (void)state;
    strcpy(env.dir, "/tmp/specd_eagle_XXXXXX");
    if (!mkdtemp(env.dir)) return -1;
    snprintf(env.path, sizeof env.path, "%s/m.gguf", env.dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "'%s' -o '%s' --layers %d --dim %d --ff 128 --heads 4 --kv-heads 2 --vocab %d --seed 9 >/dev/null 2>&1",
             SPECD_MKMODEL, env.path, LAYERS, DIM, VOCAB);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(env.path);
    rmdir(env.dir);
    return 0;
}

static sd_model *load(int32_t n_layers_used) {
    sd_gguf *g = NULL;
    char err[128];
    assert_int_equal(sd_gguf_open(env.path, &g, err, sizeof err), SD_OK);
    sd_model_params mp = sd_model_default_params();
    mp.n_threads = 2;
    mp.n_layers_used = n_layers_used;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load(g, &mp, &m), SD_OK);
    sd_gguf_close(&g);
    return m;
}

/* One sequence of N tokens, logits of every row into out[N][VOCAB]. */
static void run(sd_model *m, float *out) {
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 4, 16, &kv), SD_OK);
    const int32_t tokens[N] = {5, 17, 99, 3, 250, 42, 7};
    int32_t pos[N], seq[N] = {0};
    bool want[N];
    for (int32_t i = 0; i < N; i++) {
        pos[i] = i;
        want[i] = true;
    }
    sd_batch b = {N, tokens, pos, seq, want};
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    sd_kv_free(&kv);
}

static void test_capture(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(0);
    static float plain[N * VOCAB], captured[N * VOCAB];
    run(m, plain);
    int32_t n_rows = -1;
    assert_null(sd_model_capture_aux(m, &n_rows));
    assert_int_equal(n_rows, 0);
    const int32_t bad[2] = {0, LAYERS};
    assert_int_equal(sd_model_capture_set(m, 2, bad, false), SD_ERR_RANGE);
    assert_int_equal(sd_model_capture_set(m, SD_MODEL_CAPTURE_MAX + 1, bad, false), SD_ERR_RANGE);
    const int32_t ids[3] = {1, 0, LAYERS - 1};
    assert_int_equal(sd_model_capture_set(m, 3, ids, true), SD_OK);
    run(m, captured);
    assert_memory_equal(plain, captured, sizeof plain);
    const float *aux = sd_model_capture_aux(m, &n_rows);
    assert_non_null(aux);
    assert_int_equal(n_rows, N);
    const float *fin = sd_model_capture_final(m, &n_rows);
    assert_non_null(fin);
    /* layer j's rows = the last rows of a view of j + 1 layers */
    for (int32_t slot = 0; slot < 3; slot++) {
        sd_model *v = NULL;
        assert_int_equal(sd_model_view_layers(m, ids[slot] + 1, &v), SD_OK);
        const int32_t last = ids[slot];
        assert_int_equal(sd_model_capture_set(v, 1, &last, false), SD_OK);
        run(v, captured);
        int32_t nv = 0;
        const float *va = sd_model_capture_aux(v, &nv);
        assert_int_equal(nv, N);
        for (int32_t t = 0; t < N; t++)
            assert_memory_equal(va + (size_t)t * DIM, aux + ((size_t)t * 3 + (size_t)slot) * DIM, DIM * sizeof(float));
        sd_model_free(&v);
    }
    for (int32_t i = 0; i < N * DIM; i++) assert_true(isfinite(fin[i])); /* its values: test_eagle_head.py */
    assert_int_equal(sd_model_capture_set(m, 0, NULL, false), SD_OK);
    assert_null(sd_model_capture_aux(m, &n_rows));
    run(m, captured);
    assert_memory_equal(plain, captured, sizeof plain);
    sd_model_free(&m);
}

/* ---- EAGLE heads written here: a valid tiny one, then one defect each ---- */

enum { HD = 4, HKV = 2, HFF = 32, HVD = 16 };

typedef struct head_spec {
    int32_t hidden, target_hidden, vocab, draft_vocab;
    const char *arch;
    const char *layer_ids; /* JSON array text, or NULL */
    const char *drop;      /* a tensor left out */
    const char *misshape;  /* a tensor written with one row too few */
    int64_t d2t0;          /* d2t[0] */
} head_spec;

static head_spec good_head(void) {
    return (head_spec){DIM, DIM, VOCAB, HVD, "LlamaForCausalLMEagle3", "[0, 1, 3]", NULL, NULL, 0};
}

static void add(sd_safetensors_writer *w, const head_spec *h, const char *name, uint64_t rows, uint64_t cols) {
    if (h->drop && strcmp(name, h->drop) == 0) return;
    if (h->misshape && strcmp(name, h->misshape) == 0) rows--;
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = (float)((i * 7919) % 13) * 0.01f - 0.06f;
    const uint64_t shape[2] = {rows, cols};
    assert_int_equal(sd_safetensors_writer_add_tensor(w, name, SD_SAFETENSORS_F32, cols ? 2 : 1, shape, v), SD_OK);
    free(v);
}

/* Writes h into dir (config.json + model.safetensors). */
static void write_head(const char *dir, const head_spec *h) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, "
            "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"num_hidden_layers\": 1, "
            "\"rms_norm_eps\": 1e-5, \"vocab_size\": %d, \"draft_vocab_size\": %d, \"target_hidden_size\": %d",
            h->arch, (int)h->hidden, HFF, HD, HKV, (int)h->vocab, (int)h->draft_vocab, (int)h->target_hidden);
    if (h->layer_ids) fprintf(f, ", \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": %s}", h->layer_ids);
    fprintf(f, "}\n");
    fclose(f);
    sd_safetensors_writer *w = sd_safetensors_writer_new();
    assert_non_null(w);
    const uint64_t H = (uint64_t)h->hidden, hd = H / HD;
    add(w, h, "fc.weight", H, 3 * (uint64_t)h->target_hidden);
    add(w, h, "midlayer.hidden_norm.weight", H, 0);
    add(w, h, "midlayer.input_layernorm.weight", H, 0);
    add(w, h, "midlayer.post_attention_layernorm.weight", H, 0);
    add(w, h, "midlayer.self_attn.q_proj.weight", HD * hd, 2 * H);
    add(w, h, "midlayer.self_attn.k_proj.weight", HKV * hd, 2 * H);
    add(w, h, "midlayer.self_attn.v_proj.weight", HKV * hd, 2 * H);
    add(w, h, "midlayer.self_attn.o_proj.weight", H, HD * hd);
    add(w, h, "midlayer.mlp.gate_proj.weight", HFF, H);
    add(w, h, "midlayer.mlp.up_proj.weight", HFF, H);
    add(w, h, "midlayer.mlp.down_proj.weight", H, HFF);
    add(w, h, "norm.weight", H, 0);
    add(w, h, "lm_head.weight", (uint64_t)h->draft_vocab, H);
    int64_t d2t[64] = {0};
    for (int32_t i = 0; i < h->draft_vocab && i < 64; i++) d2t[i] = 3 * i; /* draft id i -> target id 4i */
    d2t[0] = h->d2t0;
    const uint64_t dshape[1] = {(uint64_t)h->draft_vocab};
    assert_int_equal(sd_safetensors_writer_add_tensor(w, "d2t", SD_SAFETENSORS_I64, 1, dshape, d2t), SD_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(sd_safetensors_writer_write(w, path), SD_OK);
    sd_safetensors_writer_free(&w);
}

static char last_error[512];

static void keep_error(sd_log_level level, const char *line, void *user) {
    (void)user;
    if (level >= SD_LOG_ERROR) snprintf(last_error, sizeof last_error, "%s", line);
}

static sd_status load_head(const head_spec *h, const sd_model *m) {
    char dir[96];
    snprintf(dir, sizeof dir, "%s/head", env.dir);
    mkdir(dir, 0755);
    write_head(dir, h);
    sd_eagle_target t = sd_eagle_target_of(m);
    sd_eagle_params p = sd_eagle_default_params();
    p.max_ctx = 32;
    p.n_threads = 1;
    sd_eagle_head *head = NULL;
    last_error[0] = '\0';
    sd_log_set(keep_error, NULL, SD_LOG_ERROR, NULL);
    sd_status s = sd_eagle_head_load(dir, &t, &p, &head);
    sd_log_set(NULL, NULL, SD_LOG_WARN, NULL);
    if (s == SD_OK) {
        int32_t ids[3];
        sd_eagle_head_layers(head, ids);
        assert_int_equal(ids[2], 3);
        assert_int_equal(sd_eagle_head_target_id(head, 2), 8);
    }
    sd_eagle_head_free(&head);
    assert_null(head);
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    return s;
}

/* The head's tree rows (sd_eagle_head_forward_tree): slot 0 runs rows
 * (a, b, c, d) as a chain; slot 1 runs (a, b), then tree rows c (depth 0),
 * its sibling z, and d under c, stored at 2, 3, 4. Row c's and row d's
 * logits and outputs equal the chain's rows 2 and 3 bit for bit; d read
 * through its sibling z instead (a wrong path) gives other logits, and a
 * path outside the rows is refused. */
static void test_eagle_tree_rows(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(0);
    char dir[96];
    snprintf(dir, sizeof dir, "%s/tree_head", env.dir);
    mkdir(dir, 0755);
    const head_spec hs = good_head();
    write_head(dir, &hs);
    sd_eagle_target t = sd_eagle_target_of(m);
    sd_eagle_params p = sd_eagle_default_params();
    p.max_seqs = 2;
    p.max_ctx = 16;
    p.n_threads = 1;
    sd_eagle_head *h = NULL;
    assert_int_equal(sd_eagle_head_load(dir, &t, &p, &h), SD_OK);
    enum { R = 4 };
    static float g[R * DIM], chain[R * HVD], chain_hid[R * DIM], tree[3 * HVD], tree_hid[3 * DIM], two[2 * HVD];
    for (int32_t i = 0; i < R * DIM; i++) g[i] = (float)((i * 31) % 17) * 0.05f - 0.4f;
    const int32_t toks[R] = {5, 17, 99, 3};
    const bool all[R] = {true, true, true, true};
    assert_int_equal(sd_eagle_head_forward(h, 0, 0, R, toks, g, all, chain, chain_hid), SD_OK);
    assert_int_equal(sd_eagle_head_forward(h, 1, 0, 2, toks, g, NULL, two, NULL), SD_OK);
    const int32_t ttoks[3] = {99, 250, 3}, pos[3] = {2, 2, 3}, off[3] = {0, 1, 2}, path[4] = {2, 3, 2, 4};
    float tg[3 * DIM];
    memcpy(tg, g + 2 * DIM, DIM * sizeof(float));
    memcpy(tg + DIM, g + 2 * DIM, DIM * sizeof(float));
    memcpy(tg + 2 * DIM, g + 3 * DIM, DIM * sizeof(float));
    sd_eagle_tree_rows tr = {.pos = pos, .base = 2, .path_off = off, .path = path};
    assert_int_equal(sd_eagle_head_forward_tree(h, 1, 2, 3, ttoks, tg, &tr, all, tree, tree_hid), SD_OK);
    assert_memory_equal(tree, chain + 2 * HVD, HVD * sizeof(float));
    assert_memory_equal(tree + 2 * HVD, chain + 3 * HVD, HVD * sizeof(float));
    assert_memory_equal(tree_hid, chain_hid + 2 * DIM, DIM * sizeof(float));
    assert_memory_equal(tree_hid + 2 * DIM, chain_hid + 3 * DIM, DIM * sizeof(float));
    /* the control: d's path through its sibling z */
    const int32_t wrong[4] = {2, 3, 3, 4};
    tr.path = wrong;
    assert_int_equal(sd_eagle_head_truncate(h, 1, 2), SD_OK);
    assert_int_equal(sd_eagle_head_forward_tree(h, 1, 2, 3, ttoks, tg, &tr, all, tree, NULL), SD_OK);
    assert_memory_not_equal(tree + 2 * HVD, chain + 3 * HVD, HVD * sizeof(float));
    /* a row reading a row after itself, or below base */
    const int32_t ahead[4] = {3, 3, 2, 4}, below[4] = {2, 3, 1, 4};
    assert_int_equal(sd_eagle_head_truncate(h, 1, 2), SD_OK);
    tr.path = ahead;
    assert_int_equal(sd_eagle_head_forward_tree(h, 1, 2, 3, ttoks, tg, &tr, all, tree, NULL), SD_ERR_INVALID_ARG);
    tr.path = below;
    assert_int_equal(sd_eagle_head_forward_tree(h, 1, 2, 3, ttoks, tg, &tr, all, tree, NULL), SD_ERR_INVALID_ARG);
    sd_eagle_head_free(&h);
    char f[160];
    snprintf(f, sizeof f, "%s/config.json", dir);
    unlink(f);
    snprintf(f, sizeof f, "%s/model.safetensors", dir);
    unlink(f);
    rmdir(dir);
    sd_model_free(&m);
}

static void test_eagle_refusals(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(0);
    head_spec h = good_head();
    assert_int_equal(load_head(&h, m), SD_OK);
    const struct {
        head_spec h;
        sd_status want;
        const char *words;
    } bad[] = {
        {{DIM, 32, VOCAB, HVD, "LlamaForCausalLMEagle3", NULL, NULL, NULL, 0}, SD_ERR_UNSUPPORTED, "size 32"},
        {{DIM, DIM, VOCAB, HVD, "LlamaForCausalLMEagle3", "[0, 1, 4]", NULL, NULL, 0}, SD_ERR_RANGE, "layer id 4"},
        {{DIM, DIM, VOCAB - 1, HVD, "LlamaForCausalLMEagle3", NULL, NULL, NULL, 0}, SD_ERR_UNSUPPORTED, "299 ids"},
        {{DIM, DIM, VOCAB, HVD, "LlamaForCausalLMEagle3", NULL, NULL, NULL, VOCAB}, SD_ERR_RANGE, "d2t maps"},
        {{DIM, DIM, VOCAB, HVD, "LlamaForCausalLMEagle3", NULL, "norm.weight", NULL, 0},
         SD_ERR_FORMAT,
         "lacks the tensor norm.weight"},
        {{DIM, DIM, VOCAB, HVD, "LlamaForCausalLMEagle3", NULL, NULL, "midlayer.mlp.up_proj.weight", 0},
         SD_ERR_FORMAT,
         "up_proj.weight has shape"},
        {{DIM, DIM, VOCAB, HVD, "LlamaForCausalLM", NULL, NULL, NULL, 0}, SD_ERR_FORMAT, "neither"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sd_status s = load_head(&bad[i].h, m);
        if (s != bad[i].want || !strstr(last_error, bad[i].words))
            fail_msg("bad head %zu: %s, log \"%s\" (want %s, \"%s\")", i, sd_status_str(s), last_error,
                     sd_status_str(bad[i].want), bad[i].words);
    }
    sd_model_free(&m);
}

static void test_eagle_missing_dir(void **state) {
    (void)state;
    if (!env.ok) skip();
    sd_model *m = load(0);
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = 64;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_eagle_open("/nonexistent/specd-head", m, &dp, &d), SD_ERR_IO);
    assert_null(d);
    int32_t ids[3];
    sd_eagle_default_layers(30, ids);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 14);
    assert_int_equal(ids[2], 26);
    sd_model_free(&m);
}

/* ---- drafts under a constraint (drafter_eagle.c, issue 35) ---- */

typedef struct con_counts {
    int32_t drafted, refused, forced_tail, tail_drafted;
} con_counts;

/* Proposes k drafts on ctx[n] under con (NULL: unmasked) and counts them
 * into *c: drafted, and refused (a draft, or a q entry of positive mass,
 * that the constraint does not allow after the drafts before it). */
static void propose_counted(sd_drafter *d, sd_constraint *con, sd_constraint *check, const int32_t *ctx, int32_t n,
                            const sd_sampling *s, con_counts *c) {
    int32_t tokens[SD_MAX_K], nd = 0;
    sd_spec_q q[SD_MAX_K];
    sd_drafter_set_constraint(d, con);
    int32_t before = con ? sd_constraint_len(con) : 0;
    assert_int_equal(sd_drafter_propose(d, 0, ctx, n, 6, s, tokens, q, &nd), SD_OK);
    sd_drafter_set_constraint(d, NULL);
    if (con) assert_int_equal(sd_constraint_len(con), before); /* left where it was */
    int32_t base = sd_constraint_len(check), i = 0;
    for (; i < nd && !sd_constraint_ended(check); i++) {
        bool bad = false;
        for (int32_t j = 0; j < q[i].n; j++)
            bad = bad || (q[i].probs[j] > 0 && !sd_constraint_allows(check, q[i].ids[j]));
        if (bad || sd_constraint_advance(check, tokens[i]) != SD_OK) {
            c->refused++;
            break;
        }
    }
    c->drafted += nd;
    assert_int_equal(sd_constraint_rollback(check, base), SD_OK);
}

/* Feeds the features of the last forward's rows (positions pos0..) to d. */
static void feed(sd_model *m, sd_drafter *d, const int32_t *tokens, int32_t pos0, int32_t n) {
    int32_t rows = 0;
    const float *aux = sd_model_capture_aux(m, &rows);
    assert_non_null(aux);
    assert_int_equal(rows, n);
    assert_int_equal(sd_drafter_eagle_features(d, 0, pos0, n, tokens + pos0, aux), SD_OK);
}

/* The head in dir over m (contexts up to 128, one thread), m capturing
 * the layers it reads. */
static sd_drafter *open_capturing(sd_model *m, const char *dir) {
    sd_drafter_params dp = sd_drafter_default_params();
    dp.max_ctx = 128;
    dp.n_threads = 1;
    sd_drafter *d = NULL;
    assert_int_equal(sd_drafter_eagle_open(dir, m, &dp, &d), SD_OK);
    int32_t ids[3];
    assert_int_equal(sd_drafter_eagle_layers(d, ids), 3);
    assert_int_equal(sd_model_capture_set(m, 3, ids, false), SD_OK);
    return d;
}

/* ---- what a propose charges to its drafts (drafter_eagle.c) ---- */

/* The head rows past 1 + k of a propose (a context it fell behind on) are
 * counted apart, as catch-up: none when the context grew by at most 1 + k
 * since the last propose, some after a prompt and after steps it did not
 * draft for; taking the count zeroes it. */
static void test_eagle_catchup_counted(void **state) {
    (void)state;
    if (!env.ok) skip();
    char dir[96];
    snprintf(dir, sizeof dir, "%s/uhead", env.dir);
    mkdir(dir, 0755);
    head_spec h = good_head();
    write_head(dir, &h);
    sd_model *m = load(0);
    sd_drafter *d = open_capturing(m, dir);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 8, 16, &kv), SD_OK);
    int32_t ctx[96], pos[96], seq[96] = {0};
    bool want[96] = {false};
    for (int32_t i = 0; i < 96; i++) ctx[i] = (int32_t)((i * 37 + 11) % VOCAB), pos[i] = i;
    float *logits = malloc(96 * sizeof(float) * VOCAB);
    assert_non_null(logits);
    int64_t rows = -1;
    assert_true(sd_drafter_eagle_take_catchup_s(NULL, &rows) == 0.0);
    assert_int_equal(rows, 0);
    /* the prompt: 40 positions, one draft: 38 of its 39 head rows are catch-up */
    assert_int_equal(sd_model_forward(m, kv, &(sd_batch){40, ctx, pos, seq, want}, logits), SD_OK);
    feed(m, d, ctx, 0, 40);
    sd_sampling greedy = sd_sampling_default();
    int32_t tokens[SD_MAX_K], nd = 0, n = 40;
    sd_spec_q q[SD_MAX_K];
    assert_int_equal(sd_drafter_propose(d, 0, ctx, n + 1, 1, &greedy, tokens, q, &nd), SD_OK);
    assert_int_equal(nd, 1);
    assert_true(sd_drafter_eagle_take_catchup_s(d, &rows) > 0.0);
    assert_int_equal(rows, 38);
    assert_true(sd_drafter_eagle_take_catchup_s(d, &rows) == 0.0);
    assert_int_equal(rows, 0);
    /* drafting steps: the context grows by 1 or 2 (at most 1 + k): nothing */
    for (int32_t grow = 1; grow <= 2; grow++) {
        assert_int_equal(sd_model_forward(m, kv, &(sd_batch){grow, ctx + n, pos + n, seq, want}, logits), SD_OK);
        feed(m, d, ctx, n, grow);
        n += grow;
        assert_int_equal(sd_drafter_propose(d, 0, ctx, n + 1, 1, &greedy, tokens, q, &nd), SD_OK);
        assert_int_equal(nd, 1);
        assert_true(sd_drafter_eagle_take_catchup_s(d, &rows) == 0.0);
        assert_int_equal(rows, 0);
    }
    /* steps at K = 0 (features fed, no propose), then a probe: catch-up */
    for (int32_t i = 0; i < 12; i++, n++) {
        assert_int_equal(sd_model_forward(m, kv, &(sd_batch){1, ctx + n, pos + n, seq, want}, logits), SD_OK);
        feed(m, d, ctx, n, 1);
    }
    assert_int_equal(sd_drafter_propose(d, 0, ctx, n + 1, 1, &greedy, tokens, q, &nd), SD_OK);
    assert_true(sd_drafter_eagle_take_catchup_s(d, &rows) > 0.0);
    assert_int_equal(rows, 10); /* 12 new rows, 2 a step's own */
    free(logits);
    sd_kv_free(&kv);
    sd_drafter_free(&d);
    sd_model_free(&m);
}

/* A random head (draft vocabulary of 64 ids mapped to target ids 4i) drafts
 * at every step of constrained greedy decoding, greedy and seeded, masked
 * and not: masked, no draft and no q entry is ever one the constraint
 * refuses, also after forced drafts the target has not run (fed as chain
 * rows); unmasked, the same head drafts refused tokens (so the check can
 * fail). */
static void test_eagle_constrained_drafts(void **state) {
    (void)state;
    if (!env.ok) skip();
    char dir[96];
    snprintf(dir, sizeof dir, "%s/chead", env.dir);
    mkdir(dir, 0755);
    head_spec h = good_head();
    h.draft_vocab = 64;
    write_head(dir, &h);
    sd_gguf *g = NULL;
    char err[256];
    assert_int_equal(sd_gguf_open(env.path, &g, err, sizeof err), SD_OK);
    sd_tok *tok = NULL;
    assert_int_equal(sd_tok_from_gguf(g, &tok), SD_OK);
    sd_gguf_close(&g);
    sd_model *m = load(0);
    sd_drafter *d = open_capturing(m, dir);
    const char *re = "(size|name) = [a-z0-9]{1,12}, (size|name) = [0-9a-z]{1,12}\\.";
    sd_grammar *gr = NULL;
    sd_cvocab *cv = NULL;
    sd_constraint *con = NULL, *check = NULL;
    assert_int_equal(sd_grammar_from_regex(re, strlen(re), NULL, &gr, err, sizeof err), SD_OK);
    assert_int_equal(sd_cvocab_create(tok, &cv), SD_OK);
    assert_int_equal(sd_constraint_create(gr, cv, &con), SD_OK);
    assert_int_equal(sd_constraint_create(gr, cv, &check), SD_OK);
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 8, 16, &kv), SD_OK);
    int32_t ctx[128 + SD_MAX_K] = {5, 17, 99, 3, 250, 42}, n = 6, pos[6] = {0, 1, 2, 3, 4, 5}, seq[6] = {0};
    bool want[6] = {false, false, false, false, false, true};
    float logits[VOCAB];
    assert_int_equal(sd_model_forward(m, kv, &(sd_batch){n, ctx, pos, seq, want}, logits), SD_OK);
    feed(m, d, ctx, 0, n);
    sd_sampling greedy = sd_sampling_default(), seeded = sd_sampling_default();
    seeded.temperature = 1.0f;
    seeded.seed = 35;
    con_counts masked = {0}, unmasked = {0};
    for (int32_t step = 0; step < 40 && !sd_constraint_ended(con); step++) {
        for (int mode = 0; mode < 2; mode++) {
            const sd_sampling *s = mode ? &seeded : &greedy;
            propose_counted(d, con, check, ctx, n, s, &masked);
            propose_counted(d, NULL, check, ctx, n, s, &unmasked);
        }
        int32_t forced[4], nf = sd_constraint_forced_tokens(con, tok, 4, forced);
        if (nf > 0) { /* the context ends with forced drafts: the head drafts on after them */
            int32_t base = sd_constraint_len(con);
            for (int32_t i = 0; i < nf; i++) {
                ctx[n + i] = forced[i];
                assert_int_equal(sd_constraint_advance(con, forced[i]), SD_OK);
                assert_int_equal(sd_constraint_advance(check, forced[i]), SD_OK);
            }
            con_counts tail = {0};
            propose_counted(d, con, check, ctx, n + nf, &greedy, &tail);
            masked.refused += tail.refused;
            masked.forced_tail++;
            masked.tail_drafted += tail.drafted;
            assert_int_equal(sd_constraint_rollback(con, base), SD_OK);
            assert_int_equal(sd_constraint_rollback(check, base), SD_OK);
        }
        /* constrained plain greedy: the next token, then its features */
        assert_int_equal(sd_constraint_apply(con, logits, VOCAB), SD_OK);
        int32_t y = 0;
        for (int32_t v = 1; v < VOCAB; v++) y = logits[v] > logits[y] ? v : y;
        assert_int_equal(sd_constraint_advance(con, y), SD_OK);
        assert_int_equal(sd_constraint_advance(check, y), SD_OK);
        ctx[n] = y;
        int32_t p = n++;
        bool one = true;
        assert_int_equal(sd_model_forward(m, kv, &(sd_batch){1, &ctx[p], &p, seq, &one}, logits), SD_OK);
        feed(m, d, ctx, p, 1);
    }
    print_message("masked: %d drafted, %d refused; %d forced tails, %d drafted after them; unmasked: %d drafted, "
                  "%d refused\n",
                  (int)masked.drafted, (int)masked.refused, (int)masked.forced_tail, (int)masked.tail_drafted,
                  (int)unmasked.drafted, (int)unmasked.refused);
    assert_int_equal(masked.refused, 0);
    assert_true(masked.drafted > 0);
    assert_true(masked.forced_tail > 0 && masked.tail_drafted > 0);
    assert_true(unmasked.refused > 0); /* the check can fail */
    sd_kv_free(&kv);
    sd_constraint_free(&check);
    sd_constraint_free(&con);
    sd_cvocab_free(&cv);
    sd_grammar_free(&gr);
    sd_drafter_free(&d);
    sd_model_free(&m);
    sd_tok_free(&tok);
    char path[160];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture),
        cmocka_unit_test(test_eagle_missing_dir),
        cmocka_unit_test(test_eagle_refusals),
        cmocka_unit_test(test_eagle_tree_rows),
        cmocka_unit_test(test_eagle_constrained_drafts),
        cmocka_unit_test(test_eagle_catchup_counted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
