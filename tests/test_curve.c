/* test_curve.c — unit tests of net/curve.c and net/zap.c: key files (bad
 * length, bad text, bad mode, missing), identities, allow-list parsing, the
 * ZAP handler's decisions, the loopback/--insecure bind rule, specd-keygen's
 * files, and a real CURVE pair behind the ZAP handler (an allowed key gets
 * through; an unknown key, or a key allowed on another domain, is refused and
 * the client's monitor says so at once). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "specd/curve.h"
#include "specd/net.h"

static char g_dir[256];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static void write_text(const char *name, const char *text, mode_t mode) {
    char p[512];
    path_of(p, sizeof p, name);
    unlink(p);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(p, mode), 0);
}

static void test_key_parse(void **state) {
    (void)state;
    char pub[41], sec[41], out[41], err[128], text[64];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    snprintf(text, sizeof text, "%s\n", pub);
    assert_true(sd_curve_key_parse(text, strlen(text), out, err, sizeof err));
    assert_string_equal(out, pub);
    assert_false(sd_curve_key_parse(pub, 39, out, err, sizeof err)); /* short */
    assert_non_null(strstr(err, "40 Z85 characters, found 39"));
    snprintf(text, sizeof text, "%sA", pub); /* long */
    assert_false(sd_curve_key_parse(text, strlen(text), out, err, sizeof err));
    memcpy(text, pub, 41);
    text[5] = '"'; /* not in the Z85 alphabet */
    assert_false(sd_curve_key_parse(text, 40, out, err, sizeof err));
    assert_non_null(strstr(err, "not Z85"));
    assert_false(sd_curve_key_parse("", 0, out, err, sizeof err));
}

static void test_key_files(void **state) {
    (void)state;
    char pub[41], sec[41], out[41], p[512], line[64];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    snprintf(line, sizeof line, "%s\n", sec);
    write_text("ok.key", line, 0600);
    path_of(p, sizeof p, "ok.key");
    assert_int_equal(sd_curve_key_read(p, true, out), SD_OK);
    assert_string_equal(out, sec);
    write_text("open.key", line, 0644); /* readable by others: refused */
    path_of(p, sizeof p, "open.key");
    assert_int_equal(sd_curve_key_read(p, true, out), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_curve_key_read(p, false, out), SD_OK); /* a public key may be world-readable */
    write_text("group.key", line, 0640);
    path_of(p, sizeof p, "group.key");
    assert_int_equal(sd_curve_key_read(p, true, out), SD_ERR_INVALID_ARG);
    write_text("short.key", "abc\n", 0600);
    path_of(p, sizeof p, "short.key");
    assert_int_equal(sd_curve_key_read(p, true, out), SD_ERR_FORMAT);
    path_of(p, sizeof p, "missing.key");
    assert_int_equal(sd_curve_key_read(p, true, out), SD_ERR_IO);
    assert_int_equal(sd_curve_key_read(g_dir, false, out), SD_ERR_IO); /* a directory */
}

static void test_identity(void **state) {
    (void)state;
    char pub[41], sec[41], spub[41], ssec[41], line[64], kp[512], sp[512];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    snprintf(line, sizeof line, "%s\n", sec);
    write_text("me.key", line, 0600);
    snprintf(line, sizeof line, "%s\n", spub);
    write_text("server.pub", line, 0644);
    path_of(kp, sizeof kp, "me.key");
    path_of(sp, sizeof sp, "server.pub");
    sd_curve_id id;
    assert_int_equal(sd_curve_id_load(NULL, NULL, &id), SD_OK);
    assert_false(id.on);
    assert_int_equal(sd_curve_id_load(kp, sp, &id), SD_OK);
    assert_true(id.on);
    assert_string_equal(id.public_key, pub); /* derived from the secret */
    assert_string_equal(id.server, spub);
    assert_int_equal(sd_curve_id_load(NULL, sp, &id), SD_ERR_INVALID_ARG); /* known only by a key */
    assert_false(id.on);
    char missing[512];
    path_of(missing, sizeof missing, "nope.key");
    assert_int_equal(sd_curve_id_load(missing, sp, &id), SD_ERR_IO); /* never plaintext instead */
    assert_false(id.on);
}

static void test_allow_parse(void **state) {
    (void)state;
    char a[41], b[41], sec[41], text[512], err[160];
    assert_int_equal(zmq_curve_keypair(a, sec), 0);
    assert_int_equal(zmq_curve_keypair(b, sec), 0);
    snprintf(text, sizeof text, "# clients\n\n  %s gateway\n%s\t client two\n\n", a, b);
    sd_curve_allow l;
    assert_true(sd_curve_allow_parse(text, strlen(text), &l, err, sizeof err));
    assert_int_equal(l.n, 2);
    uint8_t ka[32], kb[32], kc[32];
    zmq_z85_decode(ka, a);
    zmq_z85_decode(kb, b);
    memset(kc, 7, sizeof kc);
    assert_true(sd_curve_allow_has(&l, ka));
    assert_true(sd_curve_allow_has(&l, kb));
    assert_false(sd_curve_allow_has(&l, kc));
    sd_curve_allow_free(&l);
    assert_null(l.entries);
    /* roles: role=ROLE after the key, before any label */
    snprintf(text, sizeof text, "%s role=verifier the leader\n%s drafter-label\n", a, b);
    assert_true(sd_curve_allow_parse(text, strlen(text), &l, err, sizeof err));
    const sd_curve_entry *ea = sd_curve_allow_find(&l, ka), *eb = sd_curve_allow_find(&l, kb);
    assert_non_null(ea);
    assert_non_null(eb);
    assert_string_equal(ea->role, "verifier");
    assert_string_equal(eb->role, ""); /* a label is not a role: any */
    sd_curve_allow_free(&l);
    snprintf(text, sizeof text, "%s role=Verifier\n", a); /* lower-case letters only */
    assert_false(sd_curve_allow_parse(text, strlen(text), &l, err, sizeof err));
    assert_non_null(strstr(err, "role=ROLE"));
    sd_curve_allow_free(&l);
    snprintf(text, sizeof text, "%s role=\n", a);
    assert_false(sd_curve_allow_parse(text, strlen(text), &l, err, sizeof err));
    sd_curve_allow_free(&l);
    snprintf(text, sizeof text, "%s role=drafter\n%s role=verifier\n", a, a); /* one key, one line */
    assert_false(sd_curve_allow_parse(text, strlen(text), &l, err, sizeof err));
    assert_non_null(strstr(err, "listed twice"));
    sd_curve_allow_free(&l);
    /* '#' (Z85 digit 84) cannot lead a key: a group's first digit is at most 82 ('%'), 82 * 85^4 < 2^32 */
    char hz[41];
    memset(hz, '0', 40);
    hz[0] = '#';
    hz[40] = '\0';
    uint8_t hk[32];
    assert_null(zmq_z85_decode(hk, hz));
    /* a bad line names its number */
    snprintf(text, sizeof text, "%s\nnot-a-key\n", a);
    assert_false(sd_curve_allow_parse(text, strlen(text), &l, err, sizeof err));
    assert_non_null(strstr(err, "line 2"));
    sd_curve_allow_free(&l);
    /* an empty list parses (and refuses everyone) */
    assert_true(sd_curve_allow_parse("# nobody\n", 9, &l, err, sizeof err));
    assert_int_equal(l.n, 0);
    assert_false(sd_curve_allow_has(&l, ka));
    sd_curve_allow_free(&l);
    /* too many keys */
    size_t cap = (size_t)(SD_CURVE_MAX_ALLOW + 1) * 41 + 1, off = 0;
    char *big = malloc(cap);
    assert_non_null(big);
    for (int i = 0; i <= SD_CURVE_MAX_ALLOW; i++) off += (size_t)snprintf(big + off, cap - off, "%s\n", a);
    assert_false(sd_curve_allow_parse(big, off, &l, err, sizeof err));
    assert_non_null(strstr(err, "more than"));
    sd_curve_allow_free(&l);
    free(big);
    /* from a file */
    snprintf(text, sizeof text, "%s\n", a);
    write_text("list.allow", text, 0644);
    char p[512];
    path_of(p, sizeof p, "list.allow");
    assert_int_equal(sd_curve_allow_read(p, &l), SD_OK);
    assert_int_equal(l.n, 1);
    sd_curve_allow_free(&l);
    path_of(p, sizeof p, "missing.allow");
    assert_int_equal(sd_curve_allow_read(p, &l), SD_ERR_IO);
}

static void test_zap_decide(void **state) {
    (void)state;
    char cpub[41], wpub[41], sec[41], text[128], err[64], why[160];
    assert_int_equal(zmq_curve_keypair(cpub, sec), 0);
    assert_int_equal(zmq_curve_keypair(wpub, sec), 0);
    sd_curve_allow clients, workers;
    snprintf(text, sizeof text, "%s\n", cpub);
    assert_true(sd_curve_allow_parse(text, strlen(text), &clients, err, sizeof err));
    snprintf(text, sizeof text, "%s role=drafter\n", wpub);
    assert_true(sd_curve_allow_parse(text, strlen(text), &workers, err, sizeof err));
    sd_zap_domain d[2] = {{SD_ZAP_DOMAIN_CLIENT, &clients}, {SD_ZAP_DOMAIN_WORKER, &workers}};
    uint8_t ck[32], wk[32], other[32];
    zmq_z85_decode(ck, cpub);
    zmq_z85_decode(wk, wpub);
    memset(other, 1, sizeof other);
    assert_true(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_CLIENT, "CURVE", ck, 32, NULL, why, sizeof why));
    const sd_curve_entry *who = NULL;
    assert_true(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_WORKER, "CURVE", wk, 32, &who, why, sizeof why));
    assert_non_null(who);
    assert_string_equal(who->role, "drafter"); /* handed to the socket as the User-Id */
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_WORKER, "CURVE", ck, 32, &who, why, sizeof why));
    assert_null(who);
    /* a client key can never register a worker, nor a worker key submit */
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_WORKER, "CURVE", ck, 32, NULL, why, sizeof why));
    assert_non_null(strstr(why, "specd-worker allow-list"));
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_CLIENT, "CURVE", wk, 32, NULL, why, sizeof why));
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_CLIENT, "CURVE", other, 32, NULL, why, sizeof why));
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_GROUP, "CURVE", ck, 32, NULL, why, sizeof why)); /* no such list */
    assert_non_null(strstr(why, "unknown ZAP domain"));
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_CLIENT, "NULL", NULL, 0, NULL, why, sizeof why));
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_CLIENT, "PLAIN", ck, 32, NULL, why, sizeof why));
    assert_false(sd_zap_decide(d, 2, SD_ZAP_DOMAIN_CLIENT, "CURVE", ck, 31, NULL, why, sizeof why));
    assert_false(sd_zap_decide(d, 2, NULL, "CURVE", ck, 32, NULL, why, sizeof why));
    sd_curve_allow_free(&clients);
    sd_curve_allow_free(&workers);
}

static void test_bind_rule(void **state) {
    (void)state;
    assert_true(sd_curve_addr_is_local("tcp://127.0.0.1:7700"));
    assert_true(sd_curve_addr_is_local("tcp://127.1.2.3:1"));
    assert_true(sd_curve_addr_is_local("tcp://[::1]:7700"));
    assert_true(sd_curve_addr_is_local("tcp://localhost:7700"));
    assert_true(sd_curve_addr_is_local("ipc:///tmp/specd.sock"));
    assert_true(sd_curve_addr_is_local("inproc://x"));
    assert_false(sd_curve_addr_is_local("tcp://0.0.0.0:7700"));
    assert_false(sd_curve_addr_is_local("tcp://*:7700"));
    assert_false(sd_curve_addr_is_local("tcp://10.0.0.5:7700"));
    assert_false(sd_curve_addr_is_local("tcp://eth0:7700"));
    assert_false(sd_curve_addr_is_local("tcp://[::]:7700"));
    assert_false(sd_curve_addr_is_local(NULL));
    assert_int_equal(sd_curve_bind_check("tcp://127.0.0.1:7700", false, false, "--client-addr"), SD_OK);
    assert_int_equal(sd_curve_bind_check("tcp://0.0.0.0:7700", false, false, "--client-addr"), SD_ERR_INVALID_ARG);
    assert_int_equal(sd_curve_bind_check("tcp://0.0.0.0:7700", false, true, "--client-addr"), SD_OK); /* --insecure */
    assert_int_equal(sd_curve_bind_check("tcp://0.0.0.0:7700", true, false, "--client-addr"), SD_OK); /* keyed */
}

static void test_keygen(void **state) {
    (void)state;
    char pub[41], p[512], got[41];
    assert_int_equal(sd_curve_keygen(g_dir, "svc", pub), SD_OK);
    path_of(p, sizeof p, "svc.key");
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    sd_curve_id id;
    assert_int_equal(sd_curve_id_load(p, NULL, &id), SD_OK);
    assert_string_equal(id.public_key, pub);
    path_of(p, sizeof p, "svc.pub");
    assert_int_equal(sd_curve_key_read(p, false, got), SD_OK);
    assert_string_equal(got, pub);
    assert_int_equal(sd_curve_keygen(g_dir, "svc", NULL), SD_ERR_IO); /* never overwritten */
}

/* A CURVE ROUTER on domain `domain` behind a ZAP handler admitting `allowed`
 * on the client domain; a DEALER with key (pub, sec), or plaintext when pub
 * is NULL, sends one message.
 * Returns whether it arrived; *hs is what the DEALER's monitor saw. */
static bool zap_exchange(const char *domain, const char *allowed, const char *pub, const char *sec,
                         sd_net_handshake *hs) {
    char spub[41], ssec[41], text[64], err[64];
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    sd_curve_allow list;
    snprintf(text, sizeof text, "%s\n", allowed);
    assert_true(sd_curve_allow_parse(text, strlen(text), &list, err, sizeof err));
    sd_zap_domain d = {SD_ZAP_DOMAIN_CLIENT, &list};
    void *ctx = zmq_ctx_new(), *router = NULL, *dealer = NULL, *mon = NULL;
    sd_zap *zap = NULL;
    assert_int_equal(sd_zap_start(ctx, &d, 1, &zap), SD_OK);
    sd_net_socket_params rp = sd_net_socket_default_params();
    rp.type = ZMQ_ROUTER;
    rp.max_msg_bytes = 4096;
    rp.curve_server_secret = ssec;
    rp.zap_domain = domain;
    assert_int_equal(sd_net_socket_open(ctx, &rp, "tcp://127.0.0.1:*", NULL, &router), SD_OK);
    char endpoint[256];
    size_t n = sizeof endpoint;
    assert_int_equal(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &n), 0);
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = 4096;
    if (pub) { /* else plaintext: another mechanism than the server's */
        dp.curve_server_public = spub;
        dp.curve_public = pub;
        dp.curve_secret = sec;
    }
    dp.linger_ms = 0;
    dp.monitor = &mon; /* attached before connecting: libzmq never retries a mechanism mismatch */
    assert_int_equal(sd_net_socket_open(ctx, &dp, NULL, endpoint, &dealer), SD_OK);
    int timeout = 200;
    zmq_setsockopt(dealer, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    zmq_send(dealer, "hi", 2, 0);
    zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
    bool got = zmq_poll(&it, 1, 1000) > 0;
    *hs = SD_NET_HANDSHAKE_NONE;
    char why[256];
    /* up to 10 s: under ThreadSanitizer on a loaded machine the refusal took over 1 s to show */
    for (int i = 0; i < 200 && *hs == SD_NET_HANDSHAKE_NONE; i++) {
        zmq_pollitem_t m = {mon, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&m, 1, 50) > 0) *hs = sd_net_monitor_read(mon, why, sizeof why);
    }
    sd_net_monitor_close(dealer, &mon);
    sd_net_close(&dealer);
    sd_net_close(&router);
    sd_zap_stop(&zap);
    zmq_ctx_term(ctx);
    sd_curve_allow_free(&list);
    return got;
}

static void test_zap_handler(void **state) {
    (void)state;
    if (!zmq_has("curve")) {
        print_message("libzmq built without CURVE: skipping\n");
        skip();
    }
    char pub[41], sec[41], opub[41], osec[41];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    assert_int_equal(zmq_curve_keypair(opub, osec), 0);
    sd_net_handshake hs;
    assert_true(zap_exchange(SD_ZAP_DOMAIN_CLIENT, pub, pub, sec, &hs));
    assert_int_equal(hs, SD_NET_HANDSHAKE_OK);
    assert_false(zap_exchange(SD_ZAP_DOMAIN_CLIENT, pub, opub, osec, &hs)); /* unknown key */
    assert_int_equal(hs, SD_NET_HANDSHAKE_REFUSED);
    assert_false(zap_exchange(SD_ZAP_DOMAIN_WORKER, pub, pub, sec, &hs)); /* allowed elsewhere only */
    assert_int_equal(hs, SD_NET_HANDSHAKE_REFUSED);
    /* plaintext against CURVE: one failed handshake, never retried by
     * libzmq, so the monitor must be there before the connection is */
    for (int i = 0; i < 5; i++) {
        assert_false(zap_exchange(SD_ZAP_DOMAIN_CLIENT, pub, NULL, NULL, &hs));
        assert_int_equal(hs, SD_NET_HANDSHAKE_REFUSED);
    }
}

static void test_server_needs_domain(void **state) {
    (void)state;
    char spub[41], ssec[41];
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    void *ctx = zmq_ctx_new(), *s = NULL;
    sd_net_socket_params rp = sd_net_socket_default_params();
    rp.type = ZMQ_ROUTER;
    rp.max_msg_bytes = 100;
    rp.curve_server_secret = ssec; /* no ZAP domain: no allow-list would apply */
    assert_int_equal(sd_net_socket_open(ctx, &rp, "tcp://127.0.0.1:*", NULL, &s), SD_ERR_INVALID_ARG);
    sd_net_socket_params dp = sd_net_socket_default_params();
    dp.type = ZMQ_DEALER;
    dp.max_msg_bytes = 100;
    dp.curve_server_public = spub; /* no own key pair: refused, not an ephemeral one */
    assert_int_equal(sd_net_socket_open(ctx, &dp, NULL, "tcp://127.0.0.1:1", &s), SD_ERR_INVALID_ARG);
    zmq_ctx_term(ctx);
}

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/specd-test-curve-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_curve");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_parse),
        cmocka_unit_test(test_key_files),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_allow_parse),
        cmocka_unit_test(test_zap_decide),
        cmocka_unit_test(test_bind_rule),
        cmocka_unit_test(test_keygen),
        cmocka_unit_test(test_zap_handler),
        cmocka_unit_test(test_server_needs_domain),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
