/* liveness.c — a drafter's draft-step timeout from its own measured step
 * times, and back-off instead of death for a drafter that is slow but
 * alive (sd_step_times in coord.h).
 *
 * Why. A draft step used to time out after a fixed --draft-timeout-ms
 * (2 s), and a timeout killed the drafter: a slow self-draft on one thread
 * was declared dead 7 times in 35 s (it re-registers after missing our
 * heartbeats, is given the same work, times out again) and drafted
 * nothing. Its heartbeats, sent from its I/O thread, show it alive; only
 * its steps are slow. So liveness stays the heartbeat's business, and a
 * step that overruns its timeout only costs that step:
 *   - the timeout is max(floor, SD_STEP_TIMEOUT_MULT x p99 x (depth + 1)),
 *     with p99 the 99th percentile of its last SD_STEP_TIMES_N successful
 *     steps, each divided by its depth + 1 (a draft step of depth k runs k
 *     sequential forwards after feeding what was appended), the floor
 *     --draft-timeout-ms;
 *   - a step that overruns is dropped (its sequences verify with K = 0),
 *     the drafter is backed off: no drafts for 2^misses x
 *     SD_STEP_BACKOFF_BASE_US (capped), which gives its sequences K = 0 and
 *     lets it finish the late step, and the next timeout is doubled per
 *     miss; the late reply, when it comes, is measured like any other, so
 *     the timeout catches up with what the drafter really takes;
 *   - a step answered in time clears the misses.
 * A drafter that stops heartbeating is still dead after the liveness
 * period (workers.c). Rejected: a K cap per slow drafter (the K policy
 * already prices draft time from the measured round trip; what it lacked
 * was surviving the first slow steps long enough to measure them). */
#include "coord.h"

#include <stdlib.h>
#include <string.h>

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void update_p99(sd_step_times *t) {
    uint32_t sorted[SD_STEP_TIMES_N];
    memcpy(sorted, t->unit_us, sizeof(uint32_t) * (size_t)t->n);
    qsort(sorted, (size_t)t->n, sizeof *sorted, cmp_u32);
    int32_t at = (t->n * 99 + 99) / 100 - 1; /* nearest rank */
    t->p99_unit_us = sorted[at < 0 ? 0 : at];
}

void sd_step_times_add(sd_step_times *t, uint64_t step_us, int32_t depth) {
    uint64_t unit = step_us / (uint64_t)(depth > 0 ? depth + 1 : 1);
    t->unit_us[t->next] = unit > UINT32_MAX ? UINT32_MAX : (uint32_t)unit;
    t->next = (t->next + 1) % SD_STEP_TIMES_N;
    if (t->n < SD_STEP_TIMES_N) t->n++;
    update_p99(t);
}

uint64_t sd_step_times_timeout_us(const sd_step_times *t, uint64_t floor_us, int32_t depth) {
    uint64_t measured = (uint64_t)t->p99_unit_us * (uint64_t)SD_STEP_TIMEOUT_MULT * (uint64_t)(depth + 1);
    uint64_t timeout = measured > floor_us ? measured : floor_us;
    for (int32_t i = 0; i < t->misses && timeout < SD_STEP_TIMEOUT_MAX_US; i++) timeout *= 2;
    return timeout < SD_STEP_TIMEOUT_MAX_US ? timeout : SD_STEP_TIMEOUT_MAX_US;
}

void sd_step_times_missed(sd_step_times *t, uint64_t now_us, uint64_t step_id, uint64_t sent_us, int32_t depth) {
    if (t->misses < 16) t->misses++;
    uint64_t backoff = SD_STEP_BACKOFF_BASE_US;
    for (int32_t i = 1; i < t->misses && backoff < SD_STEP_BACKOFF_MAX_US; i++) backoff *= 2;
    t->backoff_until_us = now_us + (backoff < SD_STEP_BACKOFF_MAX_US ? backoff : SD_STEP_BACKOFF_MAX_US);
    t->late_step_id = step_id;
    t->late_sent_us = sent_us;
    t->late_depth = depth;
}

bool sd_step_times_late_reply(sd_step_times *t, uint64_t step_id, uint64_t now_us) {
    if (t->late_step_id == 0 || step_id != t->late_step_id) return false;
    sd_step_times_add(t, now_us - t->late_sent_us, t->late_depth);
    t->late_step_id = 0;
    return true;
}

bool sd_step_times_backed_off(const sd_step_times *t, uint64_t now_us) { return now_us < t->backoff_until_us; }
