/* coll_nccl.c — collectives on GPU buffers through NCCL (coll.h).
 *
 * One communicator per rank, created from the unique id the leader made
 * (sd_coll_nccl_unique_id) and handed to the ranks out of band; the id is a
 * secret of the group and is never logged. Every collective is enqueued on
 * the group's own non-blocking CUDA stream and then waited for with a bound:
 * the wait polls cudaStreamQuery and ncclCommGetAsyncError against the
 * group's deadline and the abort flag, and on a timeout, an asynchronous
 * NCCL error or sd_coll_abort it calls ncclCommAbort, which is what unblocks
 * the peers' kernels and makes the group unusable (coll.c then refuses
 * further calls). The communicator is created non-blocking (ncclConfig_t
 * blocking = 0, NCCL >= 2.14), so neither initialisation nor enqueueing can
 * hang a rank whose peer died: ncclInProgress is polled the same way.
 *
 * sd_coll_abort only raises the flag (coll.c) from any thread; the thread
 * inside a collective sees it within one poll (a few microseconds) and aborts
 * the communicator itself, because ncclCommAbort racing an enqueue on the
 * same communicator from another thread is not something NCCL promises to
 * survive. A group with no call in flight is aborted at close.
 *
 * gather uses grouped point-to-point (the root posts one ncclRecv per peer
 * into recv + r*n, peers one ncclSend); barrier is a one-float all-reduce on
 * a scratch buffer.
 *
 * Two modes. On the group's own stream (after open) calls are synchronous to
 * the host: they return once the stream is done, which the bounded wait
 * needs. After sd_coll_use_stream(stream) -- the model does it with its
 * compute stream, so a rank has one stream and NCCL runs on it -- calls
 * return once enqueued, ordered after the ops before them with no host
 * synchronisation, and sd_coll_wait (the model calls it before it reads the
 * logits or ends a forward) is the bounded wait: the same poll over
 * cudaStreamQuery, the async error, the abort flag and the deadline, now
 * covering the compute enqueued with the collectives. A peer that dies
 * mid-forward is therefore noticed at that wait, the forward's end, instead
 * of at the collective itself.
 *
 * Rejected: blocking communicators (a dead peer hangs ncclCommInitRank and
 * collectives with no way to time out); cudaStreamSynchronize (unbounded). */
#include "coll_impl.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#define POLL_SPIN_NS  200000ll /* poll flat out this long, then sleep between polls */
#define POLL_SLEEP_NS 20000l

typedef struct nccl_coll {
    sd_coll base;
    int32_t device;
    ncclComm_t comm;
    cudaStream_t own_stream; /* the group's; destroyed at close */
    cudaStream_t stream;     /* where calls are enqueued: own_stream or a caller's */
    bool deferred;           /* on a caller's stream: calls return once enqueued */
    float *scratch;          /* one float on the device, for barrier */
    bool comm_aborted;       /* ncclCommAbort already called */
} nccl_coll;

static const sd_coll_ops nccl_ops;

#define CUDA_TRY(call)                                                                \
    do {                                                                              \
        cudaError_t cuda_e_ = (call);                                                 \
        if (cuda_e_ != cudaSuccess) {                                                 \
            SD_ERROR("coll nccl: %s failed: %s", #call, cudaGetErrorString(cuda_e_)); \
            return SD_ERR_CUDA;                                                       \
        }                                                                             \
    } while (0)

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void pause_poll(int64_t waited_ns) {
    if (waited_ns < POLL_SPIN_NS) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, POLL_SLEEP_NS};
    nanosleep(&ts, NULL);
}

static void abort_comm(nccl_coll *g) {
    if (g->comm && !g->comm_aborted) {
        ncclCommAbort(g->comm);
        g->comm_aborted = true;
    }
}

/* The tail of every bounded poll: SD_ERR_ABORTED when the group was
 * aborted, SD_ERR_TIMEOUT past the deadline (the communicator aborted and
 * the reason logged in both cases); else SD_OK after the pause before the
 * next poll (t0: when the wait began). */
static sd_status give_up_or_pause(nccl_coll *g, int64_t t0, int64_t deadline, const char *what) {
    if (sd_coll_aborted(&g->base)) {
        SD_ERROR("coll nccl rank %d: %s aborted", g->base.params.rank, what);
        abort_comm(g);
        return SD_ERR_ABORTED;
    }
    int64_t t = now_ns();
    if (t >= deadline) {
        SD_ERROR("coll nccl rank %d: %s timed out after %d ms (a peer rank did not arrive); aborting the "
                 "communicator",
                 g->base.params.rank, what, g->base.params.timeout_ms);
        abort_comm(g);
        return SD_ERR_TIMEOUT;
    }
    pause_poll(t - t0);
    return SD_OK;
}

/* Polls until the communicator has no operation in progress (after a
 * non-blocking init, enqueue or finalize): SD_OK, or the failure after
 * aborting the communicator. */
static sd_status wait_comm_ready(nccl_coll *g, int64_t deadline, const char *what) {
    int64_t t0 = now_ns();
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(g->comm, &state);
        if (r != ncclSuccess) state = r;
        if (state == ncclSuccess) return SD_OK;
        if (state != ncclInProgress) {
            SD_ERROR("coll nccl rank %d: %s failed: %s (%s)", g->base.params.rank, what, ncclGetErrorString(state),
                     ncclGetLastError(g->comm));
            abort_comm(g);
            return SD_ERR_CUDA;
        }
        sd_status st = give_up_or_pause(g, t0, deadline, what);
        if (st != SD_OK) return st;
    }
}

/* Waits (bounded) until g->stream holds nothing unfinished. */
static sd_status drain(nccl_coll *g, int64_t t0, int64_t deadline, const char *what) {
    for (;;) {
        cudaError_t q = cudaStreamQuery(g->stream);
        if (q == cudaSuccess) return SD_OK;
        if (q != cudaErrorNotReady) {
            SD_ERROR("coll nccl rank %d: %s: stream failed: %s", g->base.params.rank, what, cudaGetErrorString(q));
            abort_comm(g);
            return SD_ERR_CUDA;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(g->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            SD_ERROR("coll nccl rank %d: %s failed asynchronously: %s (%s)", g->base.params.rank, what,
                     ncclGetErrorString(async), ncclGetLastError(g->comm));
            abort_comm(g);
            return SD_ERR_CUDA;
        }
        sd_status st = give_up_or_pause(g, t0, deadline, what);
        if (st != SD_OK) return st;
    }
}

/* Checks an enqueue's result (ncclInProgress is polled to completion), then,
 * unless calls are deferred to a caller's stream, waits (bounded) for the
 * stream to drain. */
static sd_status finish(nccl_coll *g, ncclResult_t enqueued, const char *what) {
    int64_t t0 = now_ns();
    int64_t deadline = t0 + (int64_t)g->base.params.timeout_ms * 1000000ll;
    if (enqueued != ncclSuccess && enqueued != ncclInProgress) {
        SD_ERROR("coll nccl rank %d: %s failed: %s (%s)", g->base.params.rank, what, ncclGetErrorString(enqueued),
                 ncclGetLastError(g->comm));
        abort_comm(g);
        return enqueued == ncclInvalidArgument || enqueued == ncclInvalidUsage ? SD_ERR_INVALID_ARG : SD_ERR_CUDA;
    }
    if (enqueued == ncclInProgress) SD_TRY(wait_comm_ready(g, deadline, what));
    return g->deferred ? SD_OK : drain(g, t0, deadline, what);
}

static sd_status nccl_wait(sd_coll *base) {
    nccl_coll *g = (nccl_coll *)base;
    if (!g->deferred) return SD_OK;
    CUDA_TRY(cudaSetDevice(g->device));
    int64_t t0 = now_ns();
    return drain(g, t0, t0 + (int64_t)g->base.params.timeout_ms * 1000000ll, "wait");
}

/* Nothing to drain: on the group's own stream every call returned drained,
 * and a caller's stream was waited for (sd_coll_wait) by its owner, who may
 * since have destroyed it (a group outliving the model it served). */
static sd_status nccl_use_stream(sd_coll *base, void *stream) {
    nccl_coll *g = (nccl_coll *)base;
    g->stream = stream ? (cudaStream_t)stream : g->own_stream;
    g->deferred = stream != NULL;
    return SD_OK;
}

static sd_status nccl_all_reduce(sd_coll *base, float *buf, size_t n) {
    nccl_coll *g = (nccl_coll *)base;
    if (n == 0) return SD_OK;
    CUDA_TRY(cudaSetDevice(g->device));
    return finish(g, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, g->comm, g->stream), "all_reduce");
}

static sd_status nccl_broadcast(sd_coll *base, void *buf, size_t bytes, int32_t root) {
    nccl_coll *g = (nccl_coll *)base;
    if (bytes == 0) return SD_OK;
    CUDA_TRY(cudaSetDevice(g->device));
    return finish(g, ncclBroadcast(buf, buf, bytes, ncclUint8, root, g->comm, g->stream), "broadcast");
}

static sd_status nccl_gather(sd_coll *base, const float *send, size_t n, float *recv, int32_t root) {
    nccl_coll *g = (nccl_coll *)base;
    int32_t me = base->params.rank, size = base->params.size;
    if (n == 0) return SD_OK;
    CUDA_TRY(cudaSetDevice(g->device));
    if (me == root)
        CUDA_TRY(cudaMemcpyAsync(recv + (size_t)me * n, send, n * sizeof(float), cudaMemcpyDeviceToDevice, g->stream));
    if (size == 1) return finish(g, ncclSuccess, "gather");
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) {
        if (me == root) {
            for (int32_t j = 0; j < size && (r == ncclSuccess || r == ncclInProgress); j++)
                if (j != me) r = ncclRecv(recv + (size_t)j * n, n, ncclFloat32, j, g->comm, g->stream);
        } else {
            r = ncclSend(send, n, ncclFloat32, root, g->comm, g->stream);
        }
        ncclResult_t end = ncclGroupEnd();
        if (r == ncclSuccess || r == ncclInProgress) r = end;
    }
    return finish(g, r, "gather");
}

static sd_status nccl_barrier(sd_coll *base) {
    nccl_coll *g = (nccl_coll *)base;
    CUDA_TRY(cudaSetDevice(g->device));
    return finish(g, ncclAllReduce(g->scratch, g->scratch, 1, ncclFloat32, ncclSum, g->comm, g->stream), "barrier");
}

static void *nccl_stream(const sd_coll *base) { return (void *)((const nccl_coll *)base)->stream; }

static void nccl_destroy(sd_coll *base) {
    nccl_coll *g = (nccl_coll *)base;
    cudaSetDevice(g->device);
    if (g->comm) {
        bool healthy = !g->comm_aborted && !sd_coll_aborted(base) && atomic_load(&base->failed) == SD_OK;
        if (healthy) {
            /* flush and leave cleanly, bounded; abort if a peer never does */
            int64_t deadline = now_ns() + (int64_t)base->params.timeout_ms * 1000000ll;
            ncclResult_t r = ncclCommFinalize(g->comm);
            if ((r != ncclSuccess && r != ncclInProgress) || wait_comm_ready(g, deadline, "close") != SD_OK)
                healthy = false;
        }
        if (healthy)
            ncclCommDestroy(g->comm);
        else
            abort_comm(g);
    }
    if (g->scratch) cudaFree(g->scratch);
    if (g->own_stream) cudaStreamDestroy(g->own_stream);
    free(g);
}

sd_status sd_coll_nccl_unique_id(void *id, size_t cap, size_t *len) {
    if (!id || !len) return SD_ERR_INVALID_ARG;
    *len = 0;
    if (cap < sizeof(ncclUniqueId)) {
        SD_ERROR("coll nccl: unique id buffer of %zu bytes, needs %zu", cap, sizeof(ncclUniqueId));
        return SD_ERR_INVALID_ARG;
    }
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        SD_ERROR("coll nccl: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
        return SD_ERR_CUDA;
    }
    memcpy(id, &uid, sizeof uid);
    *len = sizeof uid;
    return SD_OK;
}

sd_status sd_coll_nccl_open(const void *id, size_t len, int32_t device, const sd_coll_params *p, sd_coll **out) {
    if (!out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    SD_TRY(sd_coll_check_params(p));
    if (!id || len != sizeof(ncclUniqueId)) {
        SD_ERROR("coll nccl: the unique id must be %zu bytes, got %zu", sizeof(ncclUniqueId), len);
        return SD_ERR_INVALID_ARG;
    }
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev < 1) {
        SD_ERROR("coll nccl: no usable CUDA device (%s)", ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
        return SD_ERR_CUDA;
    }
    if (device < 0 || device >= n_dev) {
        SD_ERROR("coll nccl: device %d outside [0, %d)", device, n_dev);
        return SD_ERR_INVALID_ARG;
    }
    nccl_coll *g = calloc(1, sizeof *g);
    if (!g) return SD_ERR_NOMEM;
    sd_coll_init_base(&g->base, &nccl_ops, p);
    g->device = device;
    sd_status st = SD_OK;
    if ((ce = cudaSetDevice(device)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&g->own_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaMalloc((void **)&g->scratch, sizeof(float))) != cudaSuccess ||
        (ce = cudaMemset(g->scratch, 0, sizeof(float))) != cudaSuccess) {
        SD_ERROR("coll nccl rank %d: CUDA setup on device %d failed: %s", p->rank, device, cudaGetErrorString(ce));
        st = SD_ERR_CUDA;
    }
    g->stream = g->own_stream;
    if (st == SD_OK) {
        ncclUniqueId uid;
        memcpy(&uid, id, sizeof uid);
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&g->comm, p->size, uid, p->rank, &cfg);
        memset(&uid, 0, sizeof uid);
        if (r != ncclSuccess && r != ncclInProgress) {
            SD_ERROR("coll nccl rank %d: ncclCommInitRankConfig failed: %s (%s)", p->rank, ncclGetErrorString(r),
                     ncclGetLastError(NULL));
            if (g->comm) abort_comm(g);
            st = SD_ERR_CUDA;
        } else {
            int64_t deadline = now_ns() + (int64_t)p->timeout_ms * 1000000ll;
            st = wait_comm_ready(g, deadline, "join");
        }
    }
    if (st != SD_OK) {
        nccl_destroy(&g->base);
        return st;
    }
    SD_INFO("coll nccl: rank %d of %d joined on device %d", p->rank, p->size, device);
    *out = &g->base;
    return SD_OK;
}

static const sd_coll_ops nccl_ops = {
    .kind = "nccl",
    .destroy = nccl_destroy,
    .abort = NULL, /* the thread in the call aborts the communicator (see top) */
    .stream = nccl_stream,
    .use_stream = nccl_use_stream,
    .wait = nccl_wait,
    .all_reduce_sum = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .gather = nccl_gather,
    .barrier = nccl_barrier,
};
