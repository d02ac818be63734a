/* threadpool.h — a persistent pool of worker threads for the CPU backend.
 *
 * sd_threadpool_run(fn, arg, n_chunks) calls fn(arg, chunk, ith) exactly once
 * for every chunk in [0, n_chunks), spread over the pool's threads (the
 * caller is ith 0, workers 1..n-1), and returns when every chunk is done.
 * Chunks are claimed dynamically, so a worker that the OS has descheduled
 * (the machine is shared) delays nothing: the others take its chunks.
 * Threads are created once; between runs workers spin briefly (a forward pass
 * issues hundreds of runs back to back) and then sleep on a condition
 * variable, so an idle pool costs no CPU. Rejected: creating threads per call
 * (tens of µs per op), static ith/nth splits (one slow thread stalls the op),
 * OpenMP (hidden global state, no control over spinning). */
#ifndef SPECD_CPU_THREADPOOL_H
#define SPECD_CPU_THREADPOOL_H

#include "specd/common.h"

typedef struct sd_threadpool sd_threadpool;

/* Work on one chunk; ith in [0, n_threads) names the calling thread (for
 * per-thread scratch). */
typedef void (*sd_threadpool_fn)(void *arg, int64_t chunk, int32_t ith);

/* Most chunks one run may have. */
#define SD_THREADPOOL_MAX_CHUNKS ((int64_t)1 << 20)

/* Starts n_threads-1 workers (n_threads >= 1; the caller is the n-th).
 * Caller frees with sd_threadpool_free. */
sd_status sd_threadpool_create(int32_t n_threads, sd_threadpool **out);
/* Stops and joins the workers, frees *tp, sets *tp = NULL. NULL-safe. */
void sd_threadpool_free(sd_threadpool **tp);
/* Number of threads, the caller included. */
int32_t sd_threadpool_size(const sd_threadpool *tp);
/* Runs fn on every chunk (0 < n_chunks <= SD_THREADPOOL_MAX_CHUNKS) and
 * waits for all. Not reentrant: one caller at a time. */
void sd_threadpool_run(sd_threadpool *tp, sd_threadpool_fn fn, void *arg, int64_t n_chunks);

#endif
