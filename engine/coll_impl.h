/* coll_impl.h — the table a collectives implementation fills in (coll.h).
 *
 * sd_coll is this common head plus the implementation's own state: each
 * implementation embeds `sd_coll base` as its first member and allocates the
 * whole. coll.c checks the arguments every implementation shares (ranges,
 * overflow, root), refuses calls on an aborted or failed group, and records
 * the first failure; an implementation only moves bytes and waits (bounded,
 * polling sd_coll_aborted). */
#ifndef SPECD_COLL_IMPL_H
#define SPECD_COLL_IMPL_H

#include <stdatomic.h>

#include "specd/coll.h"

typedef struct sd_coll_ops {
    const char *kind; /* "shm", "nccl" */
    /* Leaves the group and frees c (the implementation's whole allocation). */
    void (*destroy)(sd_coll *c);
    /* Wakes waiters after coll.c set c->aborted; called from any thread. */
    void (*abort)(sd_coll *c);
    void *(*stream)(const sd_coll *c);
    /* Optional (NULL: SD_ERR_UNSUPPORTED / nothing to wait for). */
    sd_status (*use_stream)(sd_coll *c, void *stream);
    sd_status (*wait)(sd_coll *c);
    /* Arguments already checked; n > 0 / bytes > 0 not guaranteed. */
    sd_status (*all_reduce_sum)(sd_coll *c, float *buf, size_t n);
    sd_status (*broadcast)(sd_coll *c, void *buf, size_t bytes, int32_t root);
    sd_status (*gather)(sd_coll *c, const float *send, size_t n, float *recv, int32_t root);
    sd_status (*barrier)(sd_coll *c);
} sd_coll_ops;

struct sd_coll {
    const sd_coll_ops *ops;
    sd_coll_params params;
    atomic_bool aborted; /* set by sd_coll_abort (any thread) */
    atomic_int failed;   /* sd_status of the first failed call; SD_OK while healthy */
};

/* Fills the common head (after the implementation zeroed its allocation). */
void sd_coll_init_base(sd_coll *c, const sd_coll_ops *ops, const sd_coll_params *p);

/* True once sd_coll_abort was called on c (cheap: one relaxed load). */
static inline bool sd_coll_aborted(const sd_coll *c) {
    return atomic_load_explicit(&((sd_coll *)c)->aborted, memory_order_relaxed);
}

/* Checks the parameters every implementation shares; logs what is wrong. */
sd_status sd_coll_check_params(const sd_coll_params *p);

#endif
