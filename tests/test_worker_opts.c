/* test_worker_opts.c — the options the worker processes share
 * (net/worker_opts.c): every shared flag goes through one table and one
 * parser, with the same bounds for both roles but --max-k's floor, and
 * anything else is left to the role's own switch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "specd/net.h"
#include "specd/worker_opts.h"

/* getopt_long over argv with the shared table plus one role option
 * ("--role-only"); the role option's count in *role. 0, or 2 on a bad
 * value. */
static int parse(sd_worker_opts *o, int argc, char **argv, int *role) {
    static const struct option longs[] = {
        {"role-only", no_argument, 0, 1000},
        SD_WORKER_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    optind = 0; /* glibc: 0 also resets its scan state */
    opterr = 0;
    int c;
    *role = 0;
    while ((c = getopt_long(argc, argv, SD_WORKER_SHORT_OPTIONS, longs, NULL)) != -1) {
        sd_worker_opt_result r = sd_worker_opts_apply(o, c, optarg, "test");
        if (r == SD_WORKER_OPT_BAD) return 2;
        if (r == SD_WORKER_OPT_OTHER) {
            if (c != 1000) return 2;
            (*role)++;
        }
    }
    return 0;
}

static void test_shared_flags(void **state) {
    (void)state;
    sd_worker_opts o = {.coordinator = "tcp://127.0.0.1:7701", .min_max_k = 1, .warmup = -1};
    char *argv[] = {"w",
                    "--coordinator",
                    "ipc:///tmp/c",
                    "--name",
                    "n1",
                    "--curve-secret",
                    "s.key",
                    "--curve-server",
                    "c.pub",
                    "-t",
                    "3",
                    "--max-seqs",
                    "7",
                    "--kv-blocks",
                    "99",
                    "--prefix-cache",
                    "25",
                    "--max-batch",
                    "5",
                    "--max-k",
                    "4",
                    "--warmup",
                    "12",
                    "-v",
                    "--role-only"};
    int role = 0;
    assert_int_equal(parse(&o, (int)(sizeof argv / sizeof argv[0]), argv, &role), 0);
    assert_int_equal(role, 1);
    assert_string_equal(o.coordinator, "ipc:///tmp/c");
    assert_string_equal(o.name, "n1");
    assert_string_equal(o.curve_secret, "s.key");
    assert_string_equal(o.curve_server, "c.pub");
    assert_int_equal(o.n_threads, 3);
    assert_int_equal(o.max_seqs, 7);
    assert_int_equal(o.kv_blocks, 99);
    assert_int_equal(o.prefix_cache, 25);
    assert_int_equal(o.max_batch, 5);
    assert_int_equal(o.max_k, 4);
    assert_int_equal(o.warmup, 12);
    assert_true(o.verbose);
}

static void test_bounds(void **state) {
    (void)state;
    sd_worker_opts o = {.min_max_k = 1, .max_k = 16};
    /* the drafter's floor is 1, the verifier's 0 */
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_MAX_K, "0", "test"), SD_WORKER_OPT_BAD);
    assert_int_equal(o.max_k, 16);
    o.min_max_k = 0;
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_MAX_K, "0", "test"), SD_WORKER_OPT_TAKEN);
    assert_int_equal(o.max_k, 0);
    char over[16];
    snprintf(over, sizeof over, "%d", SD_MAX_K + 1);
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_MAX_K, over, "test"), SD_WORKER_OPT_BAD);
    snprintf(over, sizeof over, "%d", SD_MAX_BATCH + 1);
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_MAX_BATCH, over, "test"), SD_WORKER_OPT_BAD);
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_PREFIX_CACHE, "101", "test"), SD_WORKER_OPT_BAD);
    assert_int_equal(sd_worker_opts_apply(&o, 't', "12x", "test"), SD_WORKER_OPT_BAD);
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_MAX_SEQS, "0", "test"), SD_WORKER_OPT_BAD);
    assert_int_equal(sd_worker_opts_apply(&o, SD_WORKER_OPT_KV_BLOCKS, "", "test"), SD_WORKER_OPT_BAD);
    /* what is not shared is the role's */
    assert_int_equal(sd_worker_opts_apply(&o, 'm', "model.gguf", "test"), SD_WORKER_OPT_OTHER);
    assert_int_equal(sd_worker_opts_apply(&o, 'h', NULL, "test"), SD_WORKER_OPT_OTHER);
    int32_t v = -1;
    assert_false(sd_worker_opts_int("test", "--x", "7", 0, 6, &v));
    assert_int_equal(v, -1);
    assert_true(sd_worker_opts_int("test", "--x", "6", 0, 6, &v));
    assert_int_equal(v, 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_shared_flags), cmocka_unit_test(test_bounds)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
