/* threadpool.c — persistent workers: spin on a generation counter, then sleep.
 *
 * A run publishes (fn, arg), bumps `generation` and wakes sleepers; workers
 * that see the new generation call fn and decrement `pending`; the caller
 * does its own share and then waits for pending == 0. Sleepers are counted so
 * a run only takes the mutex when someone actually sleeps: the worker
 * increments `n_sleeping` before re-checking the generation and the caller
 * bumps the generation before reading `n_sleeping` (both seq_cst), so at least
 * one of them sees the other and no wake-up is lost. */
#include "cpu/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin iterations before sleeping (~50-100 µs of pause instructions). */
enum { SPIN_ITERS = 4000 };

typedef struct worker {
    sd_threadpool *tp;
    int32_t ith;
    pthread_t thread;
} worker;

struct sd_threadpool {
    int32_t n_threads;
    worker *workers; /* [n_threads - 1] */
    int32_t n_started;

    sd_threadpool_fn fn;
    void *arg;
    atomic_uint generation;
    atomic_int pending;
    atomic_int n_sleeping;
    atomic_bool stop;

    pthread_mutex_t mutex;
    pthread_cond_t work_cond;
    pthread_cond_t done_cond;
};

static void *worker_main(void *p) {
    worker *self = p;
    sd_threadpool *tp = self->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned gen = atomic_load(&tp->generation);
        for (int i = 0; gen == seen && i < SPIN_ITERS && !atomic_load(&tp->stop); i++) {
            CPU_RELAX();
            gen = atomic_load(&tp->generation);
        }
        if (gen == seen && !atomic_load(&tp->stop)) {
            pthread_mutex_lock(&tp->mutex);
            atomic_fetch_add(&tp->n_sleeping, 1);
            while ((gen = atomic_load(&tp->generation)) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->work_cond, &tp->mutex);
            atomic_fetch_sub(&tp->n_sleeping, 1);
            pthread_mutex_unlock(&tp->mutex);
        }
        if (atomic_load(&tp->stop)) break;
        seen = gen;
        tp->fn(tp->arg, self->ith, tp->n_threads);
        if (atomic_fetch_sub(&tp->pending, 1) == 1) {
            pthread_mutex_lock(&tp->mutex);
            pthread_cond_signal(&tp->done_cond);
            pthread_mutex_unlock(&tp->mutex);
        }
    }
    return NULL;
}

sd_status sd_threadpool_create(int32_t n_threads, sd_threadpool **out) {
    if (!out || n_threads < 1) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return SD_ERR_NOMEM;
    tp->n_threads = n_threads;
    atomic_init(&tp->generation, 0);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->stop, false);
    pthread_mutex_init(&tp->mutex, NULL);
    pthread_cond_init(&tp->work_cond, NULL);
    pthread_cond_init(&tp->done_cond, NULL);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            sd_threadpool_free(&tp);
            return SD_ERR_NOMEM;
        }
        for (int32_t i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            if (pthread_create(&tp->workers[i].thread, NULL, worker_main, &tp->workers[i]) != 0) {
                SD_ERROR("threadpool: pthread_create failed for worker %d", (int)i + 1);
                sd_threadpool_free(&tp);
                return SD_ERR_NOMEM;
            }
            tp->n_started++;
        }
    }
    *out = tp;
    return SD_OK;
}

void sd_threadpool_free(sd_threadpool **ptp) {
    if (!ptp || !*ptp) return;
    sd_threadpool *tp = *ptp;
    pthread_mutex_lock(&tp->mutex);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->work_cond);
    pthread_mutex_unlock(&tp->mutex);
    for (int32_t i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i].thread, NULL);
    pthread_cond_destroy(&tp->done_cond);
    pthread_cond_destroy(&tp->work_cond);
    pthread_mutex_destroy(&tp->mutex);
    free(tp->workers);
    free(tp);
    *ptp = NULL;
}

int32_t sd_threadpool_size(const sd_threadpool *tp) { return tp->n_threads; }

void sd_threadpool_run(sd_threadpool *tp, sd_threadpool_fn fn, void *arg) {
    if (tp->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->pending, tp->n_threads - 1);
    atomic_fetch_add(&tp->generation, 1); /* publishes fn/arg (seq_cst) */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mutex);
        pthread_cond_broadcast(&tp->work_cond);
        pthread_mutex_unlock(&tp->mutex);
    }
    fn(arg, 0, tp->n_threads);
    for (int i = 0; i < SPIN_ITERS && atomic_load(&tp->pending) > 0; i++) CPU_RELAX();
    if (atomic_load(&tp->pending) > 0) {
        pthread_mutex_lock(&tp->mutex);
        while (atomic_load(&tp->pending) > 0) pthread_cond_wait(&tp->done_cond, &tp->mutex);
        pthread_mutex_unlock(&tp->mutex);
    }
}
