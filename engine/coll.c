/* coll.c — the collectives' shared front: default parameters, argument checks
 * and dispatch to the implementation's table (coll_impl.h).
 *
 * Checks live here once so the shm and NCCL implementations cannot disagree on
 * what a valid call is. A group whose call failed (timeout, abort, a peer's
 * error) is never reused: every later call returns SD_ERR_ABORTED without
 * touching the implementation, so no rank can wait on a half-torn group.
 *
 * In a build without CUDA the NCCL entry points live here and return
 * SD_ERR_UNSUPPORTED with a log line; with CUDA (SPECD_HAVE_CUDA, or
 * SPECD_HAVE_NCCL where only the NCCL file is compiled in),
 * engine/cuda/coll_nccl.c defines them. */
#include "coll_impl.h"

#include <string.h>

sd_coll_params sd_coll_default_params(void) {
    sd_coll_params p;
    memset(&p, 0, sizeof p);
    p.rank = 0;
    p.size = 1;
    p.timeout_ms = 10000;
    p.max_bytes = (size_t)64 << 20;
    return p;
}

sd_status sd_coll_check_params(const sd_coll_params *p) {
    if (!p) {
        SD_ERROR("coll: params is NULL");
        return SD_ERR_INVALID_ARG;
    }
    if (p->size < 1 || p->size > 1024) {
        SD_ERROR("coll: group size %d outside [1, 1024]", p->size);
        return SD_ERR_INVALID_ARG;
    }
    if (p->rank < 0 || p->rank >= p->size) {
        SD_ERROR("coll: rank %d outside [0, %d)", p->rank, p->size);
        return SD_ERR_INVALID_ARG;
    }
    if (p->timeout_ms <= 0) {
        SD_ERROR("coll: timeout_ms %d must be positive", p->timeout_ms);
        return SD_ERR_INVALID_ARG;
    }
    if (p->max_bytes < 64 || p->max_bytes > ((size_t)1 << 34)) {
        SD_ERROR("coll: max_bytes %zu outside [64, 16 GiB]", p->max_bytes);
        return SD_ERR_INVALID_ARG;
    }
    return SD_OK;
}

void sd_coll_init_base(sd_coll *c, const sd_coll_ops *ops, const sd_coll_params *p) {
    c->ops = ops;
    c->params = *p;
    atomic_init(&c->aborted, false);
    atomic_init(&c->failed, SD_OK);
}

static sd_status check_usable(sd_coll *c, const char *what);
static sd_status note_result(sd_coll *c, sd_status s);

void *sd_coll_stream(const sd_coll *c) {
    if (!c || !c->ops->stream) return NULL;
    return c->ops->stream(c);
}

sd_status sd_coll_use_stream(sd_coll *c, void *stream) {
    if (!c) return SD_ERR_INVALID_ARG;
    if (!c->ops->use_stream) {
        SD_ERROR("coll %s: collectives cannot be enqueued on a caller's stream", c->ops->kind);
        return SD_ERR_UNSUPPORTED;
    }
    SD_TRY(check_usable(c, "use_stream"));
    return note_result(c, c->ops->use_stream(c, stream));
}

sd_status sd_coll_wait(sd_coll *c) {
    if (!c) return SD_ERR_INVALID_ARG;
    if (!c->ops->wait) return SD_OK;
    SD_TRY(check_usable(c, "wait"));
    return note_result(c, c->ops->wait(c));
}

void sd_coll_close(sd_coll **c) {
    if (!c || !*c) return;
    (*c)->ops->destroy(*c);
    *c = NULL;
}

void sd_coll_abort(sd_coll *c) {
    if (!c) return;
    atomic_store(&c->aborted, true);
    if (c->ops->abort) c->ops->abort(c);
}

int32_t sd_coll_rank(const sd_coll *c) { return c ? c->params.rank : -1; }
int32_t sd_coll_size(const sd_coll *c) { return c ? c->params.size : 0; }
const char *sd_coll_kind(const sd_coll *c) { return c ? c->ops->kind : "none"; }

/* Refuses a call on a group that was aborted or already failed. */
static sd_status check_usable(sd_coll *c, const char *what) {
    if (atomic_load(&c->aborted)) {
        SD_ERROR("coll %s rank %d: %s on an aborted group", c->ops->kind, c->params.rank, what);
        return SD_ERR_ABORTED;
    }
    int failed = atomic_load(&c->failed);
    if (failed != SD_OK) {
        SD_ERROR("coll %s rank %d: %s on a group that already failed (%s); close it and build a new one", c->ops->kind,
                 c->params.rank, what, sd_status_str((sd_status)failed));
        return SD_ERR_ABORTED;
    }
    return SD_OK;
}

/* Records the first failure of the implementation (a timeout, an abort, ranks
 * disagreeing on the call) so the group is not reused; argument errors caught
 * above never reach it and leave the group usable. */
static sd_status note_result(sd_coll *c, sd_status s) {
    if (s != SD_OK) {
        int expected = SD_OK;
        atomic_compare_exchange_strong(&c->failed, &expected, (int)s);
    }
    return s;
}

sd_status sd_coll_all_reduce_sum(sd_coll *c, float *buf, size_t n) {
    if (!c) return SD_ERR_INVALID_ARG;
    size_t bytes;
    if (!sd_mul_ok(n, sizeof(float), &bytes) || (n > 0 && !buf)) {
        SD_ERROR("coll all_reduce: bad buffer (n %zu, buf %p)", n, (void *)buf);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(check_usable(c, "all_reduce"));
    return note_result(c, c->ops->all_reduce_sum(c, buf, n));
}

sd_status sd_coll_broadcast(sd_coll *c, void *buf, size_t bytes, int32_t root) {
    if (!c) return SD_ERR_INVALID_ARG;
    if ((bytes > 0 && !buf) || root < 0 || root >= c->params.size) {
        SD_ERROR("coll broadcast: bad arguments (bytes %zu, buf %p, root %d, size %d)", bytes, buf, root,
                 c->params.size);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(check_usable(c, "broadcast"));
    return note_result(c, c->ops->broadcast(c, buf, bytes, root));
}

sd_status sd_coll_gather(sd_coll *c, const float *send, size_t n, float *recv, int32_t root) {
    if (!c) return SD_ERR_INVALID_ARG;
    size_t total, bytes;
    if (root < 0 || root >= c->params.size || !sd_mul_ok(n, (size_t)c->params.size, &total) ||
        !sd_mul_ok(total, sizeof(float), &bytes) || (n > 0 && !send) || (n > 0 && c->params.rank == root && !recv)) {
        SD_ERROR("coll gather: bad arguments (n %zu, send %p, recv %p, root %d, size %d)", n, (const void *)send,
                 (void *)recv, root, c->params.size);
        return SD_ERR_INVALID_ARG;
    }
    SD_TRY(check_usable(c, "gather"));
    return note_result(c, c->ops->gather(c, send, n, recv, root));
}

sd_status sd_coll_barrier(sd_coll *c) {
    if (!c) return SD_ERR_INVALID_ARG;
    SD_TRY(check_usable(c, "barrier"));
    return note_result(c, c->ops->barrier(c));
}

#if !defined(SPECD_HAVE_CUDA) && !defined(SPECD_HAVE_NCCL)
sd_status sd_coll_nccl_unique_id(void *id, size_t cap, size_t *len) {
    (void)id;
    (void)cap;
    if (len) *len = 0;
    SD_ERROR("coll: NCCL unavailable: this build has no CUDA (configure with SPECD_CUDA=ON on a CUDA machine)");
    return SD_ERR_UNSUPPORTED;
}

sd_status sd_coll_nccl_open(const void *id, size_t len, int32_t device, const sd_coll_params *p, sd_coll **out) {
    (void)id;
    (void)len;
    (void)device;
    (void)p;
    if (out) *out = NULL;
    SD_ERROR("coll: NCCL unavailable: this build has no CUDA (configure with SPECD_CUDA=ON on a CUDA machine)");
    return SD_ERR_UNSUPPORTED;
}
#endif
