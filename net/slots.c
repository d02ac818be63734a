/* slots.c — a worker's request-id -> slot map and the admission rules of
 * the worker protocol (slots.h). */
#include "specd/slots.h"

#include <stdlib.h>

sd_status sd_slots_init(sd_slots *m, int32_t n, sd_slot_release_fn release, sd_slot_held_fn held, void *user) {
    if (!m || n <= 0 || !release || !held) return SD_ERR_INVALID_ARG;
    *m = (sd_slots){.n = n, .release = release, .held = held, .user = user};
    m->used = calloc((size_t)n, sizeof *m->used);
    m->request_id = calloc((size_t)n, sizeof *m->request_id);
    if (!m->used || !m->request_id) {
        sd_slots_free(m);
        return SD_ERR_NOMEM;
    }
    return SD_OK;
}

void sd_slots_free(sd_slots *m) {
    if (!m) return;
    free(m->used);
    free(m->request_id);
    m->used = NULL;
    m->request_id = NULL;
    m->n = 0;
}

int32_t sd_slots_find(const sd_slots *m, uint64_t id) {
    for (int32_t i = 0; i < m->n; i++)
        if (m->used[i] && m->request_id[i] == id) return i;
    return -1;
}

static int32_t take(sd_slots *m, uint64_t id) {
    for (int32_t i = 0; i < m->n; i++) {
        if (!m->used[i]) {
            m->used[i] = true;
            m->request_id[i] = id;
            m->release(m->user, i);
            return i;
        }
    }
    return -1;
}

void sd_slots_release(sd_slots *m, int32_t slot) {
    if (slot < 0 || slot >= m->n) return;
    m->release(m->user, slot);
    m->used[slot] = false;
    m->request_id[slot] = 0;
}

void sd_slots_release_ids(sd_slots *m, const uint64_t *request_ids, size_t n) {
    if (!m || !request_ids) return;
    for (size_t i = 0; i < n; i++) sd_slots_release(m, sd_slots_find(m, request_ids[i]));
}

void sd_slots_reset(sd_slots *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n; i++)
        if (m->used[i]) sd_slots_release(m, i);
}

int32_t sd_slots_used(const sd_slots *m) {
    int32_t n = 0;
    for (int32_t i = 0; i < m->n; i++) n += m->used[i];
    return n;
}

Specd__Code sd_slots_admit(sd_slots *m, uint64_t id, int32_t keep_len, bool fits, int32_t *slot, bool *taken) {
    *taken = false;
    *slot = sd_slots_find(m, id);
    if (*slot < 0 && keep_len > 0) return SPECD__CODE__CODE_CACHE_MISS;
    if (*slot >= 0) {
        int32_t held = m->held(m->user, *slot);
        if (held < keep_len) {
            SD_DEBUG("slots: request %llu holds %d tokens, keep_len %d: cache miss", (unsigned long long)id, (int)held,
                     (int)keep_len);
            sd_slots_release(m, *slot);
            *slot = -1;
            return SPECD__CODE__CODE_CACHE_MISS;
        }
    }
    if (!fits) {
        if (*slot >= 0) sd_slots_release(m, *slot);
        *slot = -1;
        return SPECD__CODE__CODE_KV_FULL;
    }
    if (*slot < 0) {
        *slot = take(m, id);
        if (*slot < 0) return SPECD__CODE__CODE_KV_FULL;
        *taken = true;
    }
    return SPECD__CODE__CODE_OK;
}
