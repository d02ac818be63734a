/* test_outbox.c — no reply to a client is dropped (coordinator/outbox.c).
 *
 * The coordinator's state runs without sockets; its to_client callback is a
 * fake queue that takes a set number of messages and then answers FULL, as
 * libzmq does at a client's high-water mark. Checked: a reply that meets a
 * full queue waits in the client's backlog, and every later one behind it
 * (order kept); while a backlog waits, the client's new submits are refused
 * OVERLOADED (and that refusal waits in line too); sd_outbox_flush delivers
 * the backlog in order as room appears; a backlog over its bound drops the
 * client (its replies discarded, its requests cancelled at the next tick)
 * and memory returns; a gone client's backlog is discarded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "coord.h"

#define MAXMSG 4096

static struct {
    char dir[64], target[128];
    bool ok;
} env;

typedef struct fake {
    sd_coord c;
    int room;  /* messages the queue still takes; < 0: unlimited */
    bool gone; /* the client disconnected */
    Specd__CoordinatorToClient *got[MAXMSG];
    int n_got;
} fake;

static sd_coord_sent to_client(void *user, const uint8_t *ident, size_t ident_len, const uint8_t *body, size_t len) {
    fake *f = user;
    (void)ident, (void)ident_len;
    if (f->gone) return SD_COORD_GONE;
    if (f->room == 0) return SD_COORD_FULL;
    if (f->room > 0) f->room--;
    assert_true(f->n_got < MAXMSG);
    f->got[f->n_got] = specd__coordinator_to_client__unpack(NULL, len, body);
    assert_non_null(f->got[f->n_got]);
    f->n_got++;
    return SD_COORD_SENT;
}

static bool to_worker(void *user, const uint8_t *ident, size_t ident_len, const Specd__CoordinatorToWorker *msg) {
    (void)user, (void)ident, (void)ident_len, (void)msg;
    return true;
}

static fake *fake_new(void) {
    fake *f = calloc(1, sizeof *f);
    sd_coord_params p = sd_coord_default_params();
    p.model_path = env.target;
    p.max_queue = 100000;
    sd_coord_io io = {.user = f, .to_worker = to_worker, .to_client = to_client};
    assert_int_equal(sd_coord_state_init(&f->c, &p, &io), SD_OK);
    f->room = -1;
    return f;
}

static void fake_free(fake *f) {
    for (int i = 0; i < f->n_got; i++) specd__coordinator_to_client__free_unpacked(f->got[i], NULL);
    sd_coord_state_free(&f->c);
    free(f);
}

static void submit(fake *f, const char *ident, uint64_t tag, uint64_t now) {
    Specd__SubmitRequest s = SPECD__SUBMIT_REQUEST__INIT;
    s.client_tag = tag;
    s.prompt = (char *)"ab";
    s.max_tokens = 2;
    Specd__ClientToCoordinator e = SPECD__CLIENT_TO_COORDINATOR__INIT;
    e.body_case = SPECD__CLIENT_TO_COORDINATOR__BODY_SUBMIT;
    e.submit = &s;
    size_t len = protobuf_c_message_get_packed_size(&e.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&e.base, buf);
    sd_clients_on_message(&f->c, (const uint8_t *)ident, strlen(ident), buf, len, now);
    free(buf);
}

/* The tag a reply answers (Accepted or Error), 0 for others. */
static uint64_t tag_of(const Specd__CoordinatorToClient *m) {
    if (m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED) return m->accepted->client_tag;
    if (m->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR) return m->error->client_tag;
    return 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(env.dir, sizeof env.dir, "/tmp/specd-outbox-XXXXXX");
    if (!mkdtemp(env.dir)) return 0;
    snprintf(env.target, sizeof env.target, "%s/target.gguf", env.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 1 --dim 32 --ff 64 --vocab 300 --ctx 256 --seed 3 >/dev/null 2>&1",
             SPECD_MKMODEL, env.target);
    env.ok = system(cmd) == 0;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", env.dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A full queue keeps every reply, in order; the backlog refuses new work. */
static void test_backlog_keeps_order_and_refuses(void **state) {
    (void)state;
    if (!env.ok) skip();
    fake *f = fake_new();
    f->room = 3;
    for (uint64_t t = 1; t <= 50; t++) submit(f, "c", t, 1000000 + t);
    assert_int_equal(f->n_got, 3);
    sd_coord_client *cl = sd_coord_client_find(&f->c, (const uint8_t *)"c", 1, false);
    assert_non_null(cl);
    assert_int_equal(cl->backlog_n, 47);
    assert_int_equal(f->c.n_backlogged, 1);
    f->room = -1;
    sd_outbox_flush(&f->c, 2000000);
    assert_int_equal(cl->backlog_n, 0);
    assert_int_equal(f->c.n_backlogged, 0);
    assert_int_equal(f->c.backlog_bytes, 0);
    /* one answer per submit, in submit order; the backlogged ones refused */
    assert_int_equal(f->n_got, 50);
    int accepted = 0, refused = 0;
    for (int i = 0; i < 50; i++) {
        assert_int_equal(tag_of(f->got[i]), (uint64_t)i + 1);
        if (f->got[i]->body_case == SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED) {
            accepted++;
        } else {
            assert_int_equal(f->got[i]->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ERROR);
            assert_int_equal(f->got[i]->error->code, SPECD__CODE__CODE_OVERLOADED);
            if (i >= 4) assert_non_null(strstr(f->got[i]->error->message, "backed up"));
            refused++;
        }
    }
    assert_true(accepted >= 3 && accepted <= 4); /* the ones before the queue filled (and the one that filled it) */
    assert_int_equal(accepted + refused, 50);
    /* with the backlog gone, new work is taken again */
    submit(f, "c", 51, 3000000);
    assert_int_equal(f->n_got, 51);
    assert_int_equal(f->got[50]->body_case, SPECD__COORDINATOR_TO_CLIENT__BODY_ACCEPTED);
    fake_free(f);
}

/* Over the bound: the client does not read; everything for it goes, its
 * requests are cancelled at the next tick, nothing leaks. */
static void test_backlog_bound_drops_unreading_client(void **state) {
    (void)state;
    if (!env.ok) skip();
    fake *f = fake_new();
    submit(f, "c", 1, 1000000); /* accepted: a request to cancel later */
    assert_int_equal(f->n_got, 1);
    assert_int_equal(f->c.n_active + f->c.n_queued, 1);
    f->room = 0;
    sd_coord_client *cl = sd_coord_client_find(&f->c, (const uint8_t *)"c", 1, false);
    size_t sent = 0;
    uint64_t t = 2;
    while (!cl->unreading && sent < 2u * SD_COORD_BACKLOG_BYTES) {
        submit(f, "c", t, 1000000 + t);
        t++;
        sent += 64;
    }
    assert_true(cl->unreading);
    assert_int_equal(cl->backlog_n, 0);
    assert_int_equal(f->c.backlog_bytes, 0);
    assert_int_equal(f->c.n_backlogged, 0);
    sd_clients_tick(&f->c, 1000000 + t);
    assert_null(sd_coord_client_find(&f->c, (const uint8_t *)"c", 1, false));
    assert_int_equal(f->c.n_active + f->c.n_queued, 0); /* its request cancelled */
    fake_free(f);
}

/* A backlog that does not move for SD_COORD_BACKLOG_STALL_US: dropped;
 * a client gone (disconnected): its backlog discarded. */
static void test_backlog_stall_and_gone(void **state) {
    (void)state;
    if (!env.ok) skip();
    fake *f = fake_new();
    f->room = 0;
    submit(f, "c", 1, 1000000);
    submit(f, "d", 1, 1000000);
    assert_int_equal(f->c.n_backlogged, 2);
    /* d keeps talking but never reads; c is gone */
    f->gone = true;
    sd_outbox_flush(&f->c, 1000100);
    f->gone = false;
    assert_int_equal(f->c.n_backlogged, 0); /* gone: discarded; d's answer "gone" too in this fake */
    submit(f, "d", 2, 1000200);
    assert_int_equal(f->c.n_backlogged, 1);
    sd_clients_tick(&f->c, 1000300);
    assert_non_null(sd_coord_client_find(&f->c, (const uint8_t *)"d", 1, false));
    for (uint64_t t = 1; t < 40; t++) submit(f, "d", 2 + t, 1000300 + t * 1000000); /* it talks: not silent */
    sd_clients_tick(&f->c, 1000300 + SD_COORD_BACKLOG_STALL_US + 1000);
    assert_null(sd_coord_client_find(&f->c, (const uint8_t *)"d", 1, false));
    assert_int_equal(f->c.n_backlogged, 0);
    assert_int_equal(f->c.backlog_bytes, 0);
    fake_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backlog_keeps_order_and_refuses),
        cmocka_unit_test(test_backlog_bound_drops_unreading_client),
        cmocka_unit_test(test_backlog_stall_and_gone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
