/* test_coll.c — the shared-memory collectives (engine/coll_shm.c) with real
 * rank processes: each test forks 1..4 ranks that join one group by name.
 *
 * Checked: all-reduce gives every rank exactly the rank-order sum
 * ((v0 + v1) + v2) + ... computed locally, bit for bit, for sizes 0, 1, odd,
 * chunked over max_bytes, and large enough for the reduce-scatter path (the
 * data spans 2^40 of magnitude so any other order changes the bits);
 * broadcast from every root; gather to every root; a barrier really orders a
 * shared counter; ranks calling different collectives are refused; a rank
 * that never arrives gives SD_ERR_TIMEOUT within the bound and fails the
 * others fast; a rank that exits is noticed in well under the bound; sd_coll_abort from another thread ends a wait promptly and
 * later calls; a segment left by a killed group (or junk under the name) is
 * replaced; no /dev/shm entry survives a group. Ranks report through their
 * exit status (cmocka asserts cannot cross fork); the parent waits with a
 * bound and kills stragglers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "specd/coll.h"

#define GROUP_WAIT_S 60.0

static int name_counter;

static void make_name(char *out, size_t cap) { snprintf(out, cap, "specd-test-%d-%d", (int)getpid(), ++name_counter); }

static bool shm_exists(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    return access(path, F_OK) == 0;
}

/* Rank-dependent values spanning 2^-20..2^20 so summation order matters. */
static float value(int32_t rank, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    float mant = (float)(h & 0xffffff) / 16777216.0f - 0.5f;
    int exp = (int)((h >> 24) % 41u) - 20;
    return ldexpf(mant, exp);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef int (*rank_fn)(sd_coll *c, int32_t rank, void *arg);

typedef struct group_spec {
    const char *name;
    sd_coll_params params; /* rank is filled per child */
    rank_fn fn;
    void *arg;
    int skip_open_rank; /* a rank that never joins (-1: none) */
    int rank0_delay_ms; /* rank 0 starts late (joiners reach a stale segment first) */
} group_spec;

static int child_main(const group_spec *g, int32_t rank) {
    if (rank == 0 && g->rank0_delay_ms > 0) usleep((useconds_t)g->rank0_delay_ms * 1000u);
    sd_coll_params p = g->params;
    p.rank = rank;
    sd_coll *c = NULL;
    sd_status st = sd_coll_shm_open(g->name, &p, &c);
    if (st != SD_OK) {
        fprintf(stderr, "rank %d: open failed: %s\n", rank, sd_status_str(st));
        return 10;
    }
    int rc = g->fn ? g->fn(c, rank, g->arg) : 0;
    sd_coll_close(&c);
    if (c != NULL) return 11;
    return rc;
}

/* Forks the ranks, waits (bounded) and returns how many exited non-zero. */
static int run_group(const group_spec *g) {
    pid_t pids[8];
    int32_t n = g->params.size;
    for (int32_t r = 0; r < n; r++) {
        pids[r] = -1;
        if (r == g->skip_open_rank) continue;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) exit(child_main(g, r)); /* exit, not _exit: LeakSanitizer checks the rank */
        pids[r] = pid;
    }
    /* reap every rank as soon as it exits (an unreaped zombie still "exists"
     * for the peers' liveness checks) */
    int failed = 0, running = 0;
    for (int32_t r = 0; r < n; r++) running += pids[r] > 0;
    double t0 = now_s();
    while (running > 0) {
        bool late = now_s() - t0 > GROUP_WAIT_S;
        for (int32_t r = 0; r < n; r++) {
            if (pids[r] <= 0) continue;
            int status = 0;
            if (late) {
                fprintf(stderr, "rank %d hung: killing it\n", r);
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status, 0);
            } else if (waitpid(pids[r], &status, WNOHANG) != pids[r]) {
                continue;
            }
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "rank %d of %d failed (status 0x%x, exit %d)\n", r, n, status,
                        WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                failed++;
            }
            pids[r] = -1;
            running--;
        }
        usleep(1000);
    }
    return failed;
}

static group_spec make_group(const char *name, int32_t size, size_t max_bytes, rank_fn fn, void *arg) {
    group_spec g;
    memset(&g, 0, sizeof g);
    g.name = name;
    g.params = sd_coll_default_params();
    g.params.size = size;
    g.params.max_bytes = max_bytes;
    g.params.timeout_ms = 20000;
    g.fn = fn;
    g.arg = arg;
    g.skip_open_rank = -1;
    return g;
}

static void run_ok(int32_t size, size_t max_bytes, rank_fn fn, void *arg) {
    char name[64];
    make_name(name, sizeof name);
    group_spec g = make_group(name, size, max_bytes, fn, arg);
    assert_int_equal(run_group(&g), 0);
    assert_false(shm_exists(name));
}

/* ---- all-reduce ---- */

static const size_t reduce_sizes[] = {0, 1, 7, 255, 256, 257, 576, 1001};

static int check_all_reduce(sd_coll *c, int32_t rank, size_t n) {
    int32_t size = sd_coll_size(c);
    float *buf = malloc((n + 1) * sizeof(float));
    float *want = malloc((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        buf[i] = value(rank, i);
        float acc = value(0, i);
        for (int32_t r = 1; r < size; r++) acc += value(r, i);
        want[i] = acc;
    }
    sd_status st = sd_coll_all_reduce_sum(c, buf, n);
    int rc = 0;
    if (st != SD_OK) {
        fprintf(stderr, "rank %d: all_reduce(%zu) failed: %s\n", rank, n, sd_status_str(st));
        rc = 20;
    } else if (n && memcmp(buf, want, n * sizeof(float)) != 0) {
        for (size_t i = 0; i < n; i++)
            if (memcmp(&buf[i], &want[i], sizeof(float)) != 0) {
                fprintf(stderr, "rank %d: all_reduce(%zu)[%zu] = %.9g, rank-order sum %.9g\n", rank, n, i,
                        (double)buf[i], (double)want[i]);
                break;
            }
        rc = 21;
    }
    if (rc == 0 && n) {
        /* and explicitly: rank 0 sees every rank's result, bit for bit */
        float *all = rank == 0 ? malloc((size_t)size * n * sizeof(float)) : NULL;
        st = sd_coll_gather(c, buf, n, all, 0);
        if (st != SD_OK) rc = 22;
        for (int32_t r = 1; all && rc == 0 && r < size; r++)
            if (memcmp(all + (size_t)r * n, buf, n * sizeof(float)) != 0) {
                fprintf(stderr, "all_reduce(%zu): rank %d's result differs from rank 0's\n", n, r);
                rc = 23;
            }
        free(all);
    }
    free(buf);
    free(want);
    return rc;
}

static int rank_all_reduce_sizes(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    for (size_t k = 0; k < sizeof reduce_sizes / sizeof reduce_sizes[0]; k++) {
        int rc = check_all_reduce(c, rank, reduce_sizes[k]);
        if (rc) return rc;
    }
    return 0;
}

static int rank_all_reduce_large(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    /* 40001 floats = 160 KB in one round: the reduce-scatter path; twice to
     * use both slot sets */
    for (int k = 0; k < 3; k++) {
        int rc = check_all_reduce(c, rank, 40001);
        if (rc) return rc;
    }
    return 0;
}

/* The test's sums must depend on the order, or it could not catch a
 * reordered reduction. */
static void test_value_order_matters(void **state) {
    (void)state;
    int differs = 0;
    for (size_t i = 0; i < 1000; i++) {
        float fwd = ((value(0, i) + value(1, i)) + value(2, i)) + value(3, i);
        float rev = ((value(3, i) + value(2, i)) + value(1, i)) + value(0, i);
        differs += memcmp(&fwd, &rev, sizeof fwd) != 0;
    }
    assert_true(differs > 100);
}

static void test_all_reduce(void **state) {
    (void)state;
    for (int32_t size = 1; size <= 4; size++) run_ok(size, 1024, rank_all_reduce_sizes, NULL); /* 256-float chunks */
    for (int32_t size = 2; size <= 4; size++) run_ok(size, (size_t)1 << 20, rank_all_reduce_large, NULL);
    run_ok(3, 64 * 3, rank_all_reduce_large, NULL); /* many tiny chunks */
    run_ok(2, 1000, rank_all_reduce_sizes, NULL);   /* max_bytes not a multiple of 64 */
}

/* ---- broadcast ---- */

static int rank_broadcast(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    static const size_t sizes[] = {0, 1, 13, 1024, 3001};
    for (int32_t root = 0; root < sd_coll_size(c); root++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t bytes = sizes[k];
            unsigned char *buf = malloc(bytes + 1);
            for (size_t i = 0; i < bytes; i++) buf[i] = (unsigned char)(rank == root ? (i * 31 + (size_t)root) : 0xEE);
            sd_status st = sd_coll_broadcast(c, buf, bytes, root);
            int bad = st != SD_OK;
            for (size_t i = 0; i < bytes && !bad; i++) bad = buf[i] != (unsigned char)(i * 31 + (size_t)root);
            free(buf);
            if (bad) {
                fprintf(stderr, "rank %d: broadcast(%zu bytes, root %d) wrong (%s)\n", rank, bytes, root,
                        sd_status_str(st));
                return 30;
            }
        }
    }
    return 0;
}

static void test_broadcast(void **state) {
    (void)state;
    for (int32_t size = 1; size <= 4; size++) run_ok(size, 1024, rank_broadcast, NULL);
}

/* ---- gather ---- */

static int rank_gather(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    static const size_t sizes[] = {0, 1, 5, 300};
    int32_t size = sd_coll_size(c);
    for (int32_t root = 0; root < size; root++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            float *send = malloc((n + 1) * sizeof(float));
            float *recv = rank == root ? malloc(((size_t)size * n + 1) * sizeof(float)) : NULL;
            for (size_t i = 0; i < n; i++) send[i] = value(rank, i + (size_t)root);
            if (recv)
                for (size_t i = 0; i < (size_t)size * n; i++) recv[i] = -1.0f;
            sd_status st = sd_coll_gather(c, send, n, recv, root);
            int bad = st != SD_OK;
            if (recv)
                for (int32_t r = 0; r < size && !bad; r++)
                    for (size_t i = 0; i < n && !bad; i++) bad = recv[(size_t)r * n + i] != value(r, i + (size_t)root);
            free(send);
            free(recv);
            if (bad) {
                fprintf(stderr, "rank %d: gather(%zu, root %d) wrong (%s)\n", rank, n, root, sd_status_str(st));
                return 40;
            }
        }
    }
    return 0;
}

static void test_gather(void **state) {
    (void)state;
    for (int32_t size = 1; size <= 4; size++) run_ok(size, 512, rank_gather, NULL);
}

/* ---- barrier ---- */

static int rank_barrier(sd_coll *c, int32_t rank, void *arg) {
    _Atomic int *counter = arg;
    int32_t size = sd_coll_size(c);
    for (int it = 0; it < 200; it++) {
        if (rank == it % size) usleep(200); /* a late rank each time */
        atomic_fetch_add(counter, 1);
        if (sd_coll_barrier(c) != SD_OK) return 50;
        int seen = atomic_load(counter);
        if (seen < size * (it + 1)) {
            fprintf(stderr, "rank %d: passed barrier %d with the counter at %d < %d\n", rank, it, seen,
                    size * (it + 1));
            return 51;
        }
        if (sd_coll_barrier(c) != SD_OK) return 52; /* nobody increments before everyone checked */
    }
    return 0;
}

static void test_barrier(void **state) {
    (void)state;
    for (int32_t size = 1; size <= 4; size++) {
        _Atomic int *counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(counter != MAP_FAILED);
        atomic_init(counter, 0);
        run_ok(size, 1024, rank_barrier, (void *)counter);
        assert_int_equal(atomic_load(counter), size * 200);
        munmap((void *)counter, 4096);
    }
}

/* ---- mismatched calls ---- */

static int rank_mismatch(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    float buf[8] = {0};
    sd_status st = sd_coll_all_reduce_sum(c, buf, rank == 0 ? 4 : 5);
    if (st == SD_OK) return 60;
    /* the group is failed now: later calls are refused */
    if (sd_coll_barrier(c) != SD_ERR_ABORTED) return 61;
    return 0;
}

static void test_mismatch(void **state) {
    (void)state;
    run_ok(2, 1024, rank_mismatch, NULL);
}

/* ---- timeouts ---- */

static int rank_one_absent(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    if (rank == 1) {
        usleep(2500 * 1000); /* joined, but never calls */
        return 0;
    }
    float buf[4] = {1, 2, 3, 4};
    double t0 = now_s();
    sd_status st = sd_coll_all_reduce_sum(c, buf, 4);
    double dt = now_s() - t0;
    if (st != SD_ERR_TIMEOUT || dt < 0.49 || dt > 1.5) {
        fprintf(stderr, "rank 0: expected a timeout after ~0.5 s, got %s after %.3f s\n", sd_status_str(st), dt);
        return 70;
    }
    if (sd_coll_all_reduce_sum(c, buf, 4) != SD_ERR_ABORTED) return 71;
    return 0;
}

static void test_timeout_in_call(void **state) {
    (void)state;
    char name[64];
    make_name(name, sizeof name);
    group_spec g = make_group(name, 2, 1024, rank_one_absent, NULL);
    g.params.timeout_ms = 500;
    assert_int_equal(run_group(&g), 0);
    assert_false(shm_exists(name));
}

static int rank_dies(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    if (rank == 2) _exit(0); /* joined, then gone without closing (as if killed) */
    float buf[4] = {1, 2, 3, 4};
    double t0 = now_s();
    sd_status st = sd_coll_all_reduce_sum(c, buf, 4); /* timeout 20 s */
    double dt = now_s() - t0;
    if (st != SD_ERR_TIMEOUT && st != SD_ERR_ABORTED) return 72;
    if (dt > 2.0) {
        fprintf(stderr, "rank %d: a dead peer took %.3f s to notice\n", rank, dt);
        return 73;
    }
    return 0;
}

/* A rank that dies is noticed long before the timeout; its group leaves no
 * /dev/shm entry (the name went away once everyone had joined). */
static void test_dead_rank(void **state) {
    (void)state;
    char name[64];
    make_name(name, sizeof name);
    group_spec g = make_group(name, 3, 1024, rank_dies, NULL);
    assert_int_equal(run_group(&g), 0);
    assert_false(shm_exists(name));
}

static void test_timeout_at_join(void **state) {
    (void)state;
    char name[64];
    make_name(name, sizeof name);
    sd_coll_params p = sd_coll_default_params();
    p.size = 3;
    p.max_bytes = 1024;
    p.timeout_ms = 200;
    sd_coll *c = NULL;
    double t0 = now_s();
    assert_int_equal(sd_coll_shm_open(name, &p, &c), SD_ERR_TIMEOUT);
    double dt = now_s() - t0;
    assert_null(c);
    assert_true(dt >= 0.19 && dt < 1.0);
    assert_false(shm_exists(name));
    /* a joiner with no rank 0 times out too */
    p.rank = 2;
    t0 = now_s();
    assert_int_equal(sd_coll_shm_open(name, &p, &c), SD_ERR_TIMEOUT);
    dt = now_s() - t0;
    assert_true(dt >= 0.19 && dt < 1.0);
    assert_false(shm_exists(name));
}

/* ---- abort ---- */

typedef struct abort_arg {
    sd_coll *c;
    int delay_ms;
} abort_arg;

static void *abort_later(void *p) {
    abort_arg *a = p;
    usleep((useconds_t)a->delay_ms * 1000u);
    sd_coll_abort(a->c);
    return NULL;
}

static int rank_abort(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    float buf[4] = {1, 2, 3, 4};
    if (rank == 1) {
        /* arrives late: the group is already aborted by rank 0 */
        usleep(400 * 1000);
        double t0 = now_s();
        sd_status st = sd_coll_all_reduce_sum(c, buf, 4);
        if (st != SD_ERR_ABORTED || now_s() - t0 > 0.5) {
            fprintf(stderr, "rank 1: expected a fast SD_ERR_ABORTED, got %s\n", sd_status_str(st));
            return 80;
        }
        return 0;
    }
    abort_arg a = {c, 100};
    pthread_t th;
    if (pthread_create(&th, NULL, abort_later, &a) != 0) return 81;
    double t0 = now_s();
    sd_status st = sd_coll_all_reduce_sum(c, buf, 4); /* timeout 20 s: only the abort ends it */
    double dt = now_s() - t0;
    pthread_join(th, NULL);
    if (st != SD_ERR_ABORTED || dt > 0.8) {
        fprintf(stderr, "rank 0: expected SD_ERR_ABORTED ~0.1 s in, got %s after %.3f s\n", sd_status_str(st), dt);
        return 82;
    }
    if (sd_coll_barrier(c) != SD_ERR_ABORTED) return 83;
    return 0;
}

static void test_abort(void **state) {
    (void)state;
    run_ok(2, 1024, rank_abort, NULL);
}

/* ---- stale segments ---- */

static int rank_quick_check(sd_coll *c, int32_t rank, void *arg) {
    (void)arg;
    return check_all_reduce(c, rank, 33);
}

static void test_stale_junk(void **state) {
    (void)state;
    char name[64], path[128];
    make_name(name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a segment, just junk", 24), 24);
    close(fd);
    group_spec g = make_group(name, 2, 1024, rank_quick_check, NULL);
    g.rank0_delay_ms = 200; /* the joiner meets the junk first */
    assert_int_equal(run_group(&g), 0);
    assert_false(shm_exists(name));
}

static void test_stale_killed_group(void **state) {
    (void)state;
    char name[64];
    make_name(name, sizeof name);
    /* a rank 0 killed while its group was forming leaves its segment */
    group_spec dead = make_group(name, 3, 1024, NULL, NULL);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(child_main(&dead, 0));
    for (int i = 0; i < 2000 && !shm_exists(name); i++) usleep(1000);
    usleep(50 * 1000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_true(shm_exists(name));
    /* same name, new group, joiners first: they must not join the dead one */
    group_spec g = make_group(name, 3, 1024, rank_quick_check, NULL);
    g.rank0_delay_ms = 300;
    assert_int_equal(run_group(&g), 0);
    assert_false(shm_exists(name));
}

/* ---- arguments ---- */

static void test_bad_arguments(void **state) {
    (void)state;
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_coll");
    sd_coll *c = NULL;
    sd_coll_params p = sd_coll_default_params();
    assert_int_equal(p.size, 1);
    assert_int_equal(p.timeout_ms, 10000);
    assert_int_equal(sd_coll_shm_open("a/b", &p, &c), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_coll_shm_open("", &p, &c), SD_ERR_INVALID_ARG);
    p.rank = 1;
    assert_int_equal(sd_coll_shm_open("x", &p, &c), SD_ERR_INVALID_ARG);
    p.rank = 0;
    p.timeout_ms = 0;
    assert_int_equal(sd_coll_shm_open("x", &p, &c), SD_ERR_INVALID_ARG);
    p.timeout_ms = 1000;
    p.max_bytes = 8;
    assert_int_equal(sd_coll_shm_open("x", &p, &c), SD_ERR_INVALID_ARG);
    assert_null(c);
    /* a one-rank group: collectives are identities, bad calls are refused */
    char name[64];
    make_name(name, sizeof name);
    p.max_bytes = 1024;
    assert_int_equal(sd_coll_shm_open(name, &p, &c), SD_OK);
    assert_false(shm_exists(name));
    assert_string_equal(sd_coll_kind(c), "shm");
    assert_null(sd_coll_stream(c));
    assert_int_equal(sd_coll_rank(c), 0);
    assert_int_equal(sd_coll_size(c), 1);
    float buf[3] = {1.5f, -2.0f, 3.25f};
    assert_int_equal(sd_coll_all_reduce_sum(c, buf, 3), SD_OK);
    assert_true(buf[0] == 1.5f && buf[1] == -2.0f && buf[2] == 3.25f);
    assert_int_equal(sd_coll_all_reduce_sum(c, NULL, 3), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_coll_broadcast(c, buf, 4, 1), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_coll_gather(c, buf, 3, NULL, 0), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_coll_all_reduce_sum(c, buf, SIZE_MAX), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_coll_barrier(c), SD_OK); /* argument errors do not fail the group */
    /* shm calls are synchronous: no caller's stream, nothing to wait for */
    int dummy_stream;
    assert_int_equal(sd_coll_use_stream(c, &dummy_stream), SD_ERR_UNSUPPORTED);
    assert_int_equal(sd_coll_wait(c), SD_OK);
    assert_int_equal(sd_coll_barrier(c), SD_OK); /* refusing use_stream does not fail the group */
    sd_coll_close(&c);
    assert_null(c);
    sd_coll_close(&c);
    sd_log_set(NULL, NULL, SD_LOG_ERROR, "test_coll");
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_ERROR, "test_coll");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_order_matters),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_timeout_in_call),
        cmocka_unit_test(test_timeout_at_join),
        cmocka_unit_test(test_dead_rank),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_stale_junk),
        cmocka_unit_test(test_stale_killed_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
