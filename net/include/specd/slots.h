/* slots.h — the request-id -> slot map of a worker (drafter or verifier)
 * and the protocol's admission rules for one sequence of a step.
 *
 * A worker holds each request it serves in one slot (a KV-cache sequence,
 * a drafter's context). The coordinator says how much it believes the
 * worker holds (keep_len); the worker answers CACHE_MISS when it holds less,
 * or nothing for that request, and KV_FULL when no slot is free or the
 * sequence does not fit. Both worker processes apply these rules through
 * sd_slots_admit, so they cannot drift apart. The map is a flat array
 * searched linearly: max_seqs is tens to hundreds, far below a step's cost.
 * Not thread-safe: a worker's compute thread owns it. */
#ifndef SPECD_SLOTS_H
#define SPECD_SLOTS_H

#include "specd/common.h"
#include "specd.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called for a slot that is freed or handed to a new request, so the worker
 * drops what it held there (sd_kv_release, sd_drafter_release). */
typedef void (*sd_slot_release_fn)(void *user, int32_t slot);
/* Tokens the worker holds in a used slot. */
typedef int32_t (*sd_slot_held_fn)(void *user, int32_t slot);

typedef struct sd_slots {
    int32_t n;            /* slots */
    bool *used;           /* [n] */
    uint64_t *request_id; /* [n] */
    sd_slot_release_fn release;
    sd_slot_held_fn held;
    void *user;
} sd_slots;

/* An empty map of n slots; SD_ERR_NOMEM or SD_ERR_INVALID_ARG. Free with
 * sd_slots_free. */
sd_status sd_slots_init(sd_slots *m, int32_t n, sd_slot_release_fn release, sd_slot_held_fn held, void *user);
void sd_slots_free(sd_slots *m);

/* The slot of request id, or -1. */
int32_t sd_slots_find(const sd_slots *m, uint64_t id);
/* Frees slot (releasing what it held). */
void sd_slots_release(sd_slots *m, int32_t slot);
/* Slots in use. */
int32_t sd_slots_used(const sd_slots *m);
/* Frees the slots of request_ids[n] that are held (a Release); ids not
 * held are ignored. */
void sd_slots_release_ids(sd_slots *m, const uint64_t *request_ids, size_t n);
/* Frees every slot in use (a new coordinator: nothing held is wanted). */
void sd_slots_reset(sd_slots *m);

/* Admits one sequence of a step: request id, believed held length keep_len,
 * and whether its whole length fits a slot (the caller's limit). Returns
 * CODE_OK with *slot set (*taken: a fresh slot for a new request, already
 * released), CODE_CACHE_MISS when the worker holds nothing for a continued
 * request or less than keep_len (that slot is freed), or CODE_KV_FULL when
 * it does not fit (its slot, if any, is freed) or no slot is free. */
Specd__Code sd_slots_admit(sd_slots *m, uint64_t id, int32_t keep_len, bool fits, int32_t *slot, bool *taken);

#ifdef __cplusplus
}
#endif
#endif
