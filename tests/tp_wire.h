/* tp_wire.h — a TP leader's plans to its forked ranks over the group's own
 * collectives, for test_tp and test_tp_window (the verifier's group sends
 * them over ZeroMQ instead: verifier/group_leader.c). A header broadcast,
 * {n_tokens, n_bt, n_wanted, has_win}, then the arrays; a header with
 * n_tokens 0 ends the ranks' loop. */
#ifndef SPECD_TESTS_TP_WIRE_H
#define SPECD_TESTS_TP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "specd/coll.h"
#include "specd/model.h"

typedef struct plan_wire {
    sd_coll *coll; /* borrowed */
    int32_t *buf;  /* owned: free it when done */
    size_t cap;
    bool drop_window; /* sends no window table (to see a rank refuse the plan) */
} plan_wire;

/* The leader's plan sink (an sd_model_plan_fn; user is a plan_wire). */
sd_status tp_wire_send(void *user, const sd_model_plan *p);

/* The leader's end of the loop. */
sd_status tp_wire_end(sd_coll *coll);

/* A rank: the next plan into *p, its arrays in pw->buf (valid until the
 * next call). 1: a plan, 0: the end, -1: a collective failed. */
int tp_wire_recv(plan_wire *pw, sd_model_plan *p);

#endif
