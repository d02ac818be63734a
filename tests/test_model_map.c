/* test_model_map.c — matrices used in place from the model file's mapping
 * (engine/model_load.c, sd_weights_map_stored).
 *
 * On the demo model (SmolLM2 Q4_1; skipped without SPECD_MODEL):
 *   - every matrix and the embedding table are used from the mapping, and
 *     the model keeps working after its weights source is closed;
 *   - the logits are bit-identical to those of a model whose matrices were
 *     copied (--cpu-weights copy, SD_CPU_WEIGHTS_COPY), alone and with 2 threads;
 *   - a second process loading the same file shares the pages: in the
 *     child, the file's mapping is mostly Shared_Clean (/proc/self/smaps)
 *     while the parent's model, which touched them, is alive;
 *   - a view (self-draft) borrows the mapping and frees nothing of it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/kv.h"
#include "specd/model.h"
#include "specd/weights.h"

#define N_TOK 6

static const char *model_path(void) {
    const char *p = getenv("SPECD_MODEL");
    return p && access(p, R_OK) == 0 ? p : NULL;
}

static sd_model *load(const char *path, int threads, bool copy) {
    sd_weights *w = NULL;
    assert_int_equal(sd_weights_open(path, &w), SD_OK);
    sd_model_params p = sd_model_default_params();
    p.n_threads = threads;
    if (copy) p.backend.cpu_weights = SD_CPU_WEIGHTS_COPY;
    sd_model *m = NULL;
    assert_int_equal(sd_model_load_weights(w, &p, &m), SD_OK);
    sd_weights_close(&w); /* the mapping must outlive the source */
    return m;
}

/* Logits [N_TOK][V] of a fixed token sequence. */
static float *forward(sd_model *m) {
    int V = sd_model_config_of(m)->n_vocab;
    sd_kv *kv = NULL;
    assert_int_equal(sd_model_kv_create(m, 1, 4, 16, &kv), SD_OK);
    int32_t tok[N_TOK] = {1, 504, 3458, 282, 4649, 314}, pos[N_TOK], seq[N_TOK] = {0};
    bool want[N_TOK];
    for (int i = 0; i < N_TOK; i++) pos[i] = i, want[i] = true;
    sd_batch b = {.n_tokens = N_TOK, .tokens = tok, .pos = pos, .seq = seq, .logits = want};
    float *out = malloc((size_t)N_TOK * (size_t)V * sizeof(float));
    assert_non_null(out);
    assert_int_equal(sd_model_forward(m, kv, &b, out), SD_OK);
    sd_kv_free(&kv);
    return out;
}

static void test_mapped_equals_copied(void **state) {
    (void)state;
    const char *path = model_path();
    if (!path) {
        print_message("SKIP: no demo model (SPECD_MODEL)\n");
        skip();
    }
    sd_model *mapped = load(path, 1, false), *copied = load(path, 1, true), *mapped2 = load(path, 2, false);
    uint64_t wb = sd_model_weight_bytes(mapped);
    print_message("weights %.1f MB, mapped %.1f MB\n", (double)wb / 1e6, (double)sd_model_mapped_bytes(mapped) / 1e6);
    /* every matrix and the embedding table: all but the f32 norm vectors */
    assert_true((double)sd_model_mapped_bytes(mapped) >= 0.99 * (double)wb);
    assert_int_equal(sd_model_mapped_bytes(copied), 0);
    float *a = forward(mapped), *b = forward(copied), *c = forward(mapped2);
    size_t n = (size_t)N_TOK * (size_t)sd_model_config_of(mapped)->n_vocab;
    assert_memory_equal(a, b, n * sizeof(float));
    assert_memory_equal(a, c, n * sizeof(float));
    /* a view (the first layers: self-draft) borrows the mapping */
    sd_model *view = NULL;
    assert_int_equal(sd_model_view_layers(mapped, 4, &view), SD_OK);
    float *v = forward(view);
    sd_model_free(&view);
    free(v);
    float *again = forward(mapped); /* the view freed nothing of the parent's */
    assert_memory_equal(a, again, n * sizeof(float));
    free(a);
    free(b);
    free(c);
    free(again);
    sd_model_free(&mapped);
    sd_model_free(&copied);
    sd_model_free(&mapped2);
}

/* Sums Rss and Shared_Clean (kB) of this process's mappings of path. */
static void file_pages(const char *path, long *rss_kb, long *shared_kb) {
    char real[4096];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path);
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[8192];
    bool in = false;
    *rss_kb = *shared_kb = 0;
    while (f && fgets(line, sizeof line, f)) {
        long v;
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && strchr(line, ' ')) {
            size_t len = strlen(line);
            if (len && line[len - 1] == '\n') line[len - 1] = 0;
            const char *name = strrchr(line, ' ');
            in = name && strcmp(name + 1, real) == 0;
        } else if (in && sscanf(line, "Rss: %ld kB", &v) == 1) {
            *rss_kb += v;
        } else if (in && sscanf(line, "Shared_Clean: %ld kB", &v) == 1) {
            *shared_kb += v;
        }
    }
    if (f) fclose(f);
}

static void test_two_processes_share_pages(void **state) {
    (void)state;
    const char *path = model_path();
    if (!path) {
        print_message("SKIP: no demo model (SPECD_MODEL)\n");
        skip();
    }
    sd_model *m = load(path, 1, false);
    free(forward(m)); /* touches every weight page */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        sd_model *cm = load(path, 1, false);
        free(forward(cm));
        long rss, shared;
        file_pages(path, &rss, &shared);
        double mapped_kb = (double)sd_model_mapped_bytes(cm) / 1024.0;
        fprintf(stderr, "child: file mapping Rss %ld kB, Shared_Clean %ld kB, matrices mapped %.0f kB\n", rss, shared,
                mapped_kb);
        sd_model_free(&cm);
        _exit(rss >= 0.9 * mapped_kb && shared >= 0.9 * mapped_kb ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    sd_model_free(&m);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapped_equals_copied),
        cmocka_unit_test(test_two_processes_share_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
