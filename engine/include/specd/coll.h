/* coll.h — collectives for a tensor-parallel group: all-reduce sum,
 * broadcast, gather, barrier.
 *
 * Two implementations behind one handle:
 *   - shm:  CPU ranks as separate processes on one host, over a POSIX
 *           shared-memory segment. Deterministic: the sum is taken in rank
 *           order (((r0 + r1) + r2) + ...), so every rank gets bit-identical
 *           results and a run is reproducible.
 *   - nccl: GPU buffers; the leader creates the unique id and hands its bytes
 *           to the ranks out of band (the group's ZeroMQ socket). The id is a
 *           secret of the group: it is never logged.
 * Buffers are host memory for shm and device memory for nccl.
 *
 * Every call is bounded: a rank that does not arrive within the group's
 * timeout makes the call fail with SD_ERR_TIMEOUT; after sd_coll_abort (from
 * any thread, e.g. the leader's heartbeat watcher) pending and later calls
 * fail with SD_ERR_ABORTED. A failed group is not reused: close it and build
 * a new one. */
#ifndef SPECD_COLL_H
#define SPECD_COLL_H

#include "specd/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_coll sd_coll;

typedef struct sd_coll_params {
    int32_t rank;       /* this rank, in [0, size) */
    int32_t size;       /* ranks in the group, >= 1 */
    int32_t timeout_ms; /* bound on every wait (default 10000) */
    size_t max_bytes;   /* largest single payload (shm segment sizing; default 64 MiB) */
} sd_coll_params;

sd_coll_params sd_coll_default_params(void);

/* Joins the shared-memory group called name (a short identifier without
 * '/', unique per group and generation, e.g. "specd-<pid>-<gen>"). Rank 0
 * creates the segment, the others wait for it (bounded) and attach; every
 * rank must pass the same size and max_bytes. Caller frees with
 * sd_coll_close; the last rank to close removes the segment. */
sd_status sd_coll_shm_open(const char *name, const sd_coll_params *p, sd_coll **out);

/* Rank 0 only: creates a NCCL unique id into id[cap] and sets *len
 * (SD_ERR_UNSUPPORTED in a build without CUDA). */
sd_status sd_coll_nccl_unique_id(void *id, size_t cap, size_t *len);

/* Joins the NCCL group identified by id[len] on CUDA device `device`
 * (SD_ERR_UNSUPPORTED without CUDA, SD_ERR_CUDA when no GPU is usable).
 * Collectives run on the stream sd_coll_stream returns. */
sd_status sd_coll_nccl_open(const void *id, size_t len, int32_t device, const sd_coll_params *p, sd_coll **out);

/* The CUDA stream (cudaStream_t) a NCCL group runs on; NULL for shm. */
void *sd_coll_stream(const sd_coll *c);

/* NCCL: from now on enqueue the group's collectives on `stream` (a
 * cudaStream_t, e.g. the model's compute stream: the one stream of the rank)
 * and return once they are enqueued, ordered after whatever the stream
 * already holds; sd_coll_wait waits for them, bounded. NULL goes back to the
 * group's own stream and calls that return when done. Whoever enqueued on
 * the previous caller's stream must have waited for it (sd_coll_wait): it is
 * not touched again, so it may be gone. The stream must stay valid while the
 * group uses it. shm: SD_ERR_UNSUPPORTED (its calls are synchronous). */
sd_status sd_coll_use_stream(sd_coll *c, void *stream);

/* Waits, bounded by the group's timeout and abortable like a collective,
 * until everything enqueued on the group's stream so far is done, the
 * collectives and whatever else the stream holds; a timeout or a peer's
 * error fails the group as a failed collective does. SD_OK at once where
 * calls are synchronous (shm, or NCCL on its own stream). */
sd_status sd_coll_wait(sd_coll *c);

/* Leaves the group and frees it (aborting NCCL if a call failed); *c = NULL. */
void sd_coll_close(sd_coll **c);

/* Makes every pending and later call on c fail with SD_ERR_ABORTED.
 * Safe from any thread while another thread is inside a collective. */
void sd_coll_abort(sd_coll *c);

int32_t sd_coll_rank(const sd_coll *c);
int32_t sd_coll_size(const sd_coll *c);
const char *sd_coll_kind(const sd_coll *c); /* "shm" or "nccl" */

/* In place: buf[i] = sum over ranks of buf[i], every rank gets the result.
 * buf [n] floats. */
sd_status sd_coll_all_reduce_sum(sd_coll *c, float *buf, size_t n);

/* buf[bytes] of rank root is copied to every rank's buf. */
sd_status sd_coll_broadcast(sd_coll *c, void *buf, size_t bytes, int32_t root);

/* Root receives recv[size][n]: rank r's send[n] at recv + r*n. recv is
 * ignored (may be NULL) on the other ranks. */
sd_status sd_coll_gather(sd_coll *c, const float *send, size_t n, float *recv, int32_t root);

/* Returns once every rank has entered the barrier (NCCL on a caller's
 * stream: once it is enqueued, like every call; sd_coll_wait waits). */
sd_status sd_coll_barrier(sd_coll *c);

#ifdef __cplusplus
}
#endif
#endif
