/* test_slots.c — a worker's slot map and the protocol's admission rules
 * (net/slots.c), which the drafter and the verifier both apply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "specd/slots.h"

enum { N = 3 };

typedef struct worker {
    int32_t held[N];     /* tokens each slot holds */
    int32_t released[N]; /* release calls per slot */
} worker;

static void release(void *user, int32_t slot) {
    worker *w = user;
    w->held[slot] = 0;
    w->released[slot]++;
}

static int32_t held(void *user, int32_t slot) { return ((worker *)user)->held[slot]; }

static void test_admission(void **state) {
    (void)state;
    worker w;
    memset(&w, 0, sizeof w);
    sd_slots m;
    assert_int_equal(sd_slots_init(&m, N, release, held, &w), SD_OK);
    int32_t slot = -2;
    bool taken = false;

    /* a continued request the worker never saw: cache miss, no slot taken */
    assert_int_equal(sd_slots_admit(&m, 7, 5, true, &slot, &taken), SPECD__CODE__CODE_CACHE_MISS);
    assert_int_equal(sd_slots_used(&m), 0);
    /* a new request takes a fresh (released) slot */
    assert_int_equal(sd_slots_admit(&m, 7, 0, true, &slot, &taken), SPECD__CODE__CODE_OK);
    assert_true(taken);
    assert_int_equal(slot, 0);
    assert_int_equal(w.released[0], 1);
    w.held[0] = 10;
    /* continuing within what it holds: the same slot, not taken again */
    assert_int_equal(sd_slots_admit(&m, 7, 8, true, &slot, &taken), SPECD__CODE__CODE_OK);
    assert_false(taken);
    assert_int_equal(slot, 0);
    assert_int_equal(sd_slots_find(&m, 7), 0);
    /* the coordinator believes more than it holds: cache miss, slot freed */
    assert_int_equal(sd_slots_admit(&m, 7, 11, true, &slot, &taken), SPECD__CODE__CODE_CACHE_MISS);
    assert_int_equal(sd_slots_find(&m, 7), -1);
    assert_int_equal(w.released[0], 2);

    /* does not fit: KV_FULL, and the slot it had is freed */
    assert_int_equal(sd_slots_admit(&m, 8, 0, true, &slot, &taken), SPECD__CODE__CODE_OK);
    w.held[slot] = 4;
    assert_int_equal(sd_slots_admit(&m, 8, 4, false, &slot, &taken), SPECD__CODE__CODE_KV_FULL);
    assert_int_equal(sd_slots_find(&m, 8), -1);

    /* every slot taken: a new request gets KV_FULL and takes none */
    for (uint64_t id = 20; id < 20 + N; id++)
        assert_int_equal(sd_slots_admit(&m, id, 0, true, &slot, &taken), SPECD__CODE__CODE_OK);
    assert_int_equal(sd_slots_used(&m), N);
    assert_int_equal(sd_slots_admit(&m, 99, 0, true, &slot, &taken), SPECD__CODE__CODE_KV_FULL);
    assert_int_equal(sd_slots_find(&m, 99), -1);
    /* releasing one frees it for the next */
    sd_slots_release(&m, sd_slots_find(&m, 21));
    assert_int_equal(sd_slots_admit(&m, 99, 0, true, &slot, &taken), SPECD__CODE__CODE_OK);
    assert_true(taken);
    sd_slots_free(&m);
    assert_int_equal(sd_slots_init(&m, 0, release, held, &w), SD_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_admission)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
