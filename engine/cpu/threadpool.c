/* threadpool.c — persistent workers claiming chunks from one atomic word.
 *
 * A run is published as one 64-bit word: generation (24 bits) | n_chunks (20)
 * | next chunk (20). Threads claim a chunk with a compare-and-swap that only
 * succeeds while the generation is the current one, so a worker waking late
 * can never take a chunk of a run that has finished (and fn/arg, which stay
 * valid until every chunk of their run is done, are only read after a
 * successful claim). The caller claims chunks too, then waits for the count
 * of finished chunks, never for the workers themselves.
 *
 * Sleeping: a worker increments n_sleeping before re-checking the word under
 * the mutex and the caller publishes the word before reading n_sleeping (both
 * seq_cst), so at least one sees the other and no wake-up is lost. */
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

/* Spin iterations before sleeping (tens of µs of pause instructions). */
enum { SPIN_ITERS = 2000 };

#define IDX_BITS  20
#define IDX_MASK  ((UINT64_C(1) << IDX_BITS) - 1)
#define GEN_SHIFT (2 * IDX_BITS)

static inline uint64_t word_gen(uint64_t w) { return w >> GEN_SHIFT; }
static inline uint64_t word_n(uint64_t w) { return (w >> IDX_BITS) & IDX_MASK; }
static inline uint64_t word_idx(uint64_t w) { return w & IDX_MASK; }

typedef struct worker {
    sd_threadpool *tp;
    int32_t ith;
    pthread_t thread;
} worker;

struct sd_threadpool {
    int32_t n_threads;
    worker *workers; /* [n_threads - 1] */
    int32_t n_started;
    uint64_t generation; /* caller-side copy of the current generation */

    sd_threadpool_fn fn;
    void *arg;
    _Atomic uint64_t work; /* gen | n_chunks | next */
    atomic_llong n_done;   /* chunks finished in the current run */
    atomic_int n_sleeping;
    atomic_bool caller_sleeping;
    atomic_bool stop;

    pthread_mutex_t mutex;
    pthread_cond_t work_cond;
    pthread_cond_t done_cond;
};

/* Claims and runs chunks of generation gen until none is left. */
static void drain(sd_threadpool *tp, uint64_t gen, int32_t ith) {
    uint64_t w = atomic_load(&tp->work);
    for (;;) {
        if (word_gen(w) != gen || word_idx(w) >= word_n(w)) return;
        if (!atomic_compare_exchange_weak(&tp->work, &w, w + 1)) continue;
        int64_t n = (int64_t)word_n(w);
        tp->fn(tp->arg, (int64_t)word_idx(w), ith);
        if (atomic_fetch_add(&tp->n_done, 1) + 1 == n && ith != 0 && atomic_load(&tp->caller_sleeping)) {
            pthread_mutex_lock(&tp->mutex);
            pthread_cond_signal(&tp->done_cond);
            pthread_mutex_unlock(&tp->mutex);
        }
        w = atomic_load(&tp->work);
    }
}

static void *worker_main(void *p) {
    worker *self = p;
    sd_threadpool *tp = self->tp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = word_gen(atomic_load(&tp->work));
        for (int i = 0; gen == seen && i < SPIN_ITERS && !atomic_load(&tp->stop); i++) {
            CPU_RELAX();
            gen = word_gen(atomic_load(&tp->work));
        }
        if (gen == seen && !atomic_load(&tp->stop)) {
            pthread_mutex_lock(&tp->mutex);
            atomic_fetch_add(&tp->n_sleeping, 1);
            while ((gen = word_gen(atomic_load(&tp->work))) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->work_cond, &tp->mutex);
            atomic_fetch_sub(&tp->n_sleeping, 1);
            pthread_mutex_unlock(&tp->mutex);
        }
        if (atomic_load(&tp->stop)) break;
        seen = gen;
        drain(tp, gen, self->ith);
    }
    return NULL;
}

sd_status sd_threadpool_create(int32_t n_threads, sd_threadpool **out) {
    if (!out || n_threads < 1) return SD_ERR_INVALID_ARG;
    *out = NULL;
    sd_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return SD_ERR_NOMEM;
    tp->n_threads = n_threads;
    atomic_init(&tp->work, 0);
    atomic_init(&tp->n_done, 0);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->caller_sleeping, false);
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

void sd_threadpool_run(sd_threadpool *tp, sd_threadpool_fn fn, void *arg, int64_t n_chunks) {
    if (n_chunks <= 0) return;
    if (tp->n_threads == 1 || n_chunks == 1 || n_chunks > SD_THREADPOOL_MAX_CHUNKS - 1) {
        for (int64_t c = 0; c < n_chunks; c++) fn(arg, c, 0);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->n_done, 0);
    tp->generation = (tp->generation + 1) & ((UINT64_C(1) << (64 - GEN_SHIFT)) - 1);
    if (tp->generation == 0) tp->generation = 1; /* 0 is what idle workers have seen */
    uint64_t gen = tp->generation;
    atomic_store(&tp->work, (gen << GEN_SHIFT) | ((uint64_t)n_chunks << IDX_BITS)); /* publishes fn/arg */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mutex);
        pthread_cond_broadcast(&tp->work_cond);
        pthread_mutex_unlock(&tp->mutex);
    }
    drain(tp, gen, 0);
    for (int i = 0; i < SPIN_ITERS && atomic_load(&tp->n_done) < n_chunks; i++) CPU_RELAX();
    if (atomic_load(&tp->n_done) < n_chunks) {
        pthread_mutex_lock(&tp->mutex);
        atomic_store(&tp->caller_sleeping, true);
        while (atomic_load(&tp->n_done) < n_chunks) pthread_cond_wait(&tp->done_cond, &tp->mutex);
        atomic_store(&tp->caller_sleeping, false);
        pthread_mutex_unlock(&tp->mutex);
    }
}
