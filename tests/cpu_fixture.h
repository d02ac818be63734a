/* cpu_fixture.h — the cmocka fixture of the CPU kernel tests: one CPU
 * backend with one thread and one with two, so every kernel is checked on
 * both and the two compared. Include after cmocka.h and cpu/cpu_impl.h. */
#ifndef SPECD_TESTS_CPU_FIXTURE_H
#define SPECD_TESTS_CPU_FIXTURE_H

#include <stdlib.h>

typedef struct fixture {
    sd_backend_handle be1, be2; /* 1 and 2 threads */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    if (sd_cpu_backend_create(1, &f->be1) != SD_OK || sd_cpu_backend_create(2, &f->be2) != SD_OK) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    f->be1.ops->destroy(&f->be1.ctx);
    f->be2.ops->destroy(&f->be2.ctx);
    free(f);
    return 0;
}

#endif
