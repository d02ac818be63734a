/* threadpool.h — a persistent pool of worker threads for the CPU backend.
 *
 * sd_threadpool_run(fn, arg) calls fn(arg, ith, nth) once on each of the nth
 * threads (the caller is thread 0) and returns when all have finished. Work is
 * split statically by the op itself (ith/nth), so no queue is needed. Threads
 * are created once; between runs workers spin briefly (a forward pass issues
 * hundreds of runs back to back) and then sleep on a condition variable, so an
 * idle pool costs no CPU. Rejected: creating threads per call (tens of µs per
 * op) and OpenMP (hidden global state, no control over spinning). */
#ifndef SPECD_CPU_THREADPOOL_H
#define SPECD_CPU_THREADPOOL_H

#include "specd/common.h"

typedef struct sd_threadpool sd_threadpool;

/* The work of one thread: ith in [0, nth). */
typedef void (*sd_threadpool_fn)(void *arg, int32_t ith, int32_t nth);

/* Starts n_threads-1 workers (n_threads >= 1; the caller is the n-th).
 * Caller frees with sd_threadpool_free. */
sd_status sd_threadpool_create(int32_t n_threads, sd_threadpool **out);
/* Stops and joins the workers, frees *tp, sets *tp = NULL. NULL-safe. */
void sd_threadpool_free(sd_threadpool **tp);
/* Number of threads, the caller included. */
int32_t sd_threadpool_size(const sd_threadpool *tp);
/* Runs fn on every thread and waits for all. Not reentrant: one caller. */
void sd_threadpool_run(sd_threadpool *tp, sd_threadpool_fn fn, void *arg);

#endif
