/* tp_wire.c — see tp_wire.h. */
#include "tp_wire.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(plan_wire *pw, size_t n) {
    if (n <= pw->cap) return true;
    int32_t *b = realloc(pw->buf, n * sizeof *b);
    if (!b) return false;
    pw->buf = b, pw->cap = n;
    return true;
}

static size_t words(const int32_t hdr[4]) {
    return 3 * (size_t)hdr[0] + (size_t)hdr[1] * (hdr[3] ? 2 : 1) + (size_t)hdr[2];
}

sd_status tp_wire_send(void *user, const sd_model_plan *p) {
    plan_wire *pw = user;
    const bool win = p->bt_win && !pw->drop_window;
    int32_t hdr[4] = {p->n_tokens, p->n_bt, p->n_wanted, win};
    if (!reserve(pw, words(hdr))) return SD_ERR_NOMEM;
    int32_t *q = pw->buf;
    memcpy(q, p->tokens, (size_t)p->n_tokens * 4), q += p->n_tokens;
    memcpy(q, p->pos, (size_t)p->n_tokens * 4), q += p->n_tokens;
    memcpy(q, p->bt_off, (size_t)p->n_tokens * 4), q += p->n_tokens;
    memcpy(q, p->bt, (size_t)p->n_bt * 4), q += p->n_bt;
    if (p->n_wanted) memcpy(q, p->wanted, (size_t)p->n_wanted * 4), q += p->n_wanted;
    if (win) memcpy(q, p->bt_win, (size_t)p->n_bt * 4);
    SD_TRY(sd_coll_broadcast(pw->coll, hdr, sizeof hdr, 0));
    return sd_coll_broadcast(pw->coll, pw->buf, words(hdr) * sizeof(int32_t), 0);
}

sd_status tp_wire_end(sd_coll *coll) {
    int32_t hdr[4] = {0, 0, 0, 0};
    return sd_coll_broadcast(coll, hdr, sizeof hdr, 0);
}

int tp_wire_recv(plan_wire *pw, sd_model_plan *p) {
    int32_t hdr[4];
    if (sd_coll_broadcast(pw->coll, hdr, sizeof hdr, 0) != SD_OK) return -1;
    if (hdr[0] == 0) return 0;
    if (hdr[0] < 0 || hdr[1] < 1 || hdr[2] < 0 || hdr[2] > hdr[0] || hdr[0] > (1 << 20) || hdr[1] > (1 << 24))
        return -1;
    if (!reserve(pw, words(hdr)) || sd_coll_broadcast(pw->coll, pw->buf, words(hdr) * sizeof(int32_t), 0) != SD_OK)
        return -1;
    int32_t *q = pw->buf;
    *p = (sd_model_plan){.n_tokens = hdr[0], .n_bt = hdr[1], .n_wanted = hdr[2]};
    p->tokens = q, q += hdr[0];
    p->pos = q, q += hdr[0];
    p->bt_off = q, q += hdr[0];
    p->bt = q, q += hdr[1];
    p->wanted = q, q += hdr[2];
    p->bt_win = hdr[3] ? q : NULL;
    return 1;
}
