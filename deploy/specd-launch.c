/* specd-launch — the single-node launcher: starts specd-coordinator, the
 * verifier group(s) (--groups G of --tp N ranks each) and the drafter(s)
 * (every --draft/--ngram/--draft-layers given, or --drafters) as child
 * processes, waits until they have all registered with the coordinator,
 * prints "ready ADDR" and then supervises them until SIGINT/SIGTERM. Each
 * group goes down and restarts on its own; the others keep serving. The
 * command line (options, defaults, rules, --help) is launch_args.c's.
 *
 * Why this shape:
 * - Every child runs in its own process group, so a Ctrl-C on the terminal
 *   reaches only the launcher, which then stops the children in a known
 *   order (the gateway, the coordinator, then the workers: SIGTERM, a
 *   bounded wait, then SIGKILL). Each child also sets PR_SET_PDEATHSIG, so none is
 *   orphaned when the launcher itself is killed with SIGKILL.
 * - Signals (SIGINT, SIGTERM, SIGHUP, SIGCHLD) are blocked and read from a
 *   signalfd that sits in the same zmq_poll set as the readiness socket: one
 *   loop, no async-signal-safety puzzles, no fixed sleeps.
 * - SIGINT/SIGTERM drain the service: the gateway first, then the
 *   coordinator (each refuses new work and finishes what is in flight,
 *   bounded), then the workers (stop_all).
 * - Readiness is asked of the coordinator itself (a StatsQuery over the
 *   client link, answered with ServiceStats listing the registered
 *   workers), not guessed from log lines: "ready" means a client can submit
 *   now and the request will be served (and speculated when a drafter was
 *   asked for).
 * - A drafter or verifier that dies unexpectedly is reported (which one,
 *   exit status or signal) and restarted with exponential back-off
 *   (--restart on, the default); the coordinator re-registers it and the
 *   requests carry on (see DESIGN.md, "Failure semantics"). A tensor-
 *   parallel verifier group (--tp N > 1) is one unit: when any rank exits
 *   (killed, or exit 4 because its group went down), the others are
 *   stopped (SIGTERM and SIGCONT, so a stopped rank hears it; SIGKILL after
 *   GROUP_STOP_GRACE_MS) and all N are started again together, because the
 *   survivors' KV pools no longer match a fresh rank's. A coordinator
 *   that dies is restarted the same way, on the same ports: the workers
 *   notice its silence and register with the new one (net/worker.c), and
 *   every client of libspecd-client resubmits its requests in flight as
 *   continuations, so nothing is lost (DESIGN.md, "Failure semantics").
 *   With --restart off a dead coordinator stops the service (exit 1), for
 *   the supervisor above (systemd, Slurm) to decide. A child that, on its
 *   first start, exits at once with status
 *   2 (usage), 3 (registration refused, e.g. vocabulary mismatch) or 127
 *   (cannot exec) is a configuration error that a restart cannot fix:
 *   everything is stopped and the launcher exits 1. (A restarted verifier
 *   refused because the coordinator has not yet noticed its predecessor's
 *   death is retried with back-off instead.)
 * Rejected: a shell script (no PDEATHSIG, racy readiness); stopping the
 * service when the coordinator dies (it did before clients could resubmit:
 * about 3,100 generated tokens were lost per kill in a 32-request run). */
#include "launch_args.h"
#include "launch_keys.h"
#include "specd/common.h"
#include "specd/cli.h"
#include "specd/net.h"
#include "launch_local.h"
#include "launch_ready.h"
#include "launch_child.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_CHILDREN           (MAX_TP + MAX_DRAFTERS + 2)
#define RESTART_BACKOFF_MIN_MS 500
#define RESTART_BACKOFF_MAX_MS 10000
#define RESTART_STABLE_MS      30000 /* a child that ran this long gets its back-off reset */
/* Every request waits on the coordinator: its back-off stays short and is
 * reset sooner (a coordinator that dies at start is a configuration error,
 * caught on the first start). Measured: with the workers' 30 s / 10 s, the
 * time from a kill to the first token grew from 2.1 s to 10.6 s over seven
 * kills 10 s apart. */
#define COORD_BACKOFF_MAX_MS   2000
#define COORD_STABLE_MS        3000
#define EARLY_EXIT_MS          3000 /* exits this soon after start with 2/3/127 are fatal */
#define STATS_POLL_MS          200  /* readiness query period */
#define GROUP_STOP_GRACE_MS    3000 /* a group's surviving ranks get this long to stop before SIGKILL */

typedef launch_child child;

typedef struct launcher {
    launch_opts o;
    launch_keys keys;   /* with --curve */
    launch_local local; /* without keys, addresses or --insecure: ipc:// in a private directory */
    child kids[MAX_CHILDREN];
    int n_kids;
    int sfd; /* signalfd: SIGINT, SIGTERM, SIGHUP, SIGCHLD */
    char worker_connect[256];
    char client_connect[256];
    bool stopping;
    int exit_code;
    /* a verifier group (--tp > 1) goes down and restarts as a whole */
    struct group_state {
        bool down;            /* a rank exited: the others are being stopped */
        bool killed;          /* SIGKILL sent to the stragglers */
        double kill_at_ms;    /* SIGKILL the ranks still running after this */
        double restart_at_ms; /* start all ranks again (once none runs) */
        double started_ms;
        int backoff_ms, restarts;
        char addr[256]; /* its own socket (--tp > 1) */
    } groups[MAX_GROUPS];
} launcher;

double launch_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double now_ms(void) { return launch_now_ms(); }

/* A wildcard bind address (tcp, host "*" or "0.0.0.0") -> the loopback
 * address of the same port, which a local peer can connect to. Other
 * addresses are unchanged. */
static void connect_addr_of(const char *bind, char *out, size_t n) {
    const char *hosts[] = {"tcp://*:", "tcp://0.0.0.0:"};
    for (size_t i = 0; i < 2; i++) {
        size_t l = strlen(hosts[i]);
        if (!strncmp(bind, hosts[i], l)) {
            snprintf(out, n, "tcp://127.0.0.1:%s", bind + l);
            return;
        }
    }
    snprintf(out, n, "%s", bind);
}

/* ---- process control ---- */

static sd_status spawn(launcher *L, child *c) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        SD_ERROR("cannot fork %s: %s", c->name, strerror(errno));
        return SD_ERR_IO;
    }
    if (pid == 0) {
        /* The child: its own process group (terminal signals reach only the
         * launcher), a death signal if the launcher goes away, default
         * signal mask, then exec. Only async-signal-safe calls here. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127); /* the launcher died before prctl */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(c->path, c->argv);
        static const char msg[] = "specd-launch: exec failed\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    c->pid = pid;
    c->started_ms = now_ms();
    if (sd_log_enabled(SD_LOG_INFO)) {
        char line[2048];
        size_t off = 0;
        for (int i = 0; c->argv[i] && off < sizeof line; i++)
            off += (size_t)snprintf(line + off, sizeof line - off, "%s%s", i ? " " : "", c->argv[i]);
        SD_INFO("started %s (pid %d): %s", c->name, (int)pid, line);
    }
    return SD_OK;
}

static void describe_status(int status, char *buf, size_t n) {
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, n, "changed state 0x%x", status);
}

/* Sends sig to a child and SIGCONT after it, so that a stopped (hung)
 * child acts on it too. */
static void signal_child(const child *c, int sig) {
    if (!c->pid) return;
    kill(c->pid, sig);
    if (sig != SIGKILL) kill(c->pid, SIGCONT);
}

/* Rank c of the verifier group exited: the group is down. Stops the other
 * ranks and schedules a restart of all of them (restart_due). */
static void group_down(launcher *L, const child *c, const char *why) {
    double t = now_ms();
    struct group_state *g = &L->groups[c->group];
    if (g->down) {
        SD_INFO("%s %s (its group is going down)", c->name, why);
        return;
    }
    if (t - g->started_ms >= RESTART_STABLE_MS) g->backoff_ms = RESTART_BACKOFF_MIN_MS;
    g->down = true;
    g->killed = false;
    g->kill_at_ms = t + GROUP_STOP_GRACE_MS;
    g->restart_at_ms = t + g->backoff_ms;
    int others = 0;
    for (int i = 0; i < L->n_kids; i++)
        if (L->kids[i].role == CHILD_VERIFIER && L->kids[i].group == c->group && L->kids[i].pid) {
            signal_child(&L->kids[i], SIGTERM);
            others++;
        }
    SD_WARN("%s %s unexpectedly: the verifier group is down (group %d); stopping its %d other rank(s) and restarting "
            "all %d "
            "in %d ms",
            c->name, why, c->group + 1, others, L->o.tp, g->backoff_ms);
    g->backoff_ms = g->backoff_ms * 2 > RESTART_BACKOFF_MAX_MS ? RESTART_BACKOFF_MAX_MS : g->backoff_ms * 2;
}

/* Reaps every exited child; decides restart / fatal for unexpected exits. */
static void reap(launcher *L) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return;
        child *c = NULL;
        for (int i = 0; i < L->n_kids; i++)
            if (L->kids[i].pid == pid) c = &L->kids[i];
        if (!c) continue;
        c->pid = 0;
        char why[128];
        describe_status(status, why, sizeof why);
        if (L->stopping) {
            SD_INFO("%s stopped (%s)", c->name, why);
            continue;
        }
        double ran = now_ms() - c->started_ms;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (c->role == CHILD_COORDINATOR && !L->o.restart) {
            SD_ERROR("coordinator %s unexpectedly (--restart off); stopping the service", why);
            L->stopping = true;
            L->exit_code = 1;
            continue;
        }
        /* Only a first start can reveal a configuration error: a restarted
         * verifier may well be refused (status 3) while the coordinator
         * still counts its dead predecessor as alive; back-off fixes that. */
        if (c->restarts == 0 && ran < EARLY_EXIT_MS &&
            (code == 2 || code == 3 || code == 127 || (c->role == CHILD_GATEWAY && code == 1))) {
            SD_ERROR("%s %s %.0f ms after start: a configuration error (usage, refused registration or "
                     "missing binary; see its log above); stopping the service",
                     c->name, why, ran);
            L->stopping = true;
            L->exit_code = 1;
            continue;
        }
        if (!L->o.restart) {
            SD_ERROR("%s %s unexpectedly (--restart off: not restarted; the service carries on without it)", c->name,
                     why);
            continue;
        }
        if (c->role == CHILD_VERIFIER && L->o.tp > 1) {
            group_down(L, c, why);
            continue;
        }
        bool coord = c->role == CHILD_COORDINATOR;
        int max_ms = coord ? COORD_BACKOFF_MAX_MS : RESTART_BACKOFF_MAX_MS;
        if (ran >= (coord ? COORD_STABLE_MS : RESTART_STABLE_MS)) c->backoff_ms = RESTART_BACKOFF_MIN_MS;
        c->restart_at_ms = now_ms() + c->backoff_ms;
        SD_WARN("%s %s unexpectedly; restarting it in %d ms", c->name, why, c->backoff_ms);
        c->backoff_ms = c->backoff_ms * 2 > max_ms ? max_ms : c->backoff_ms * 2;
    }
}

/* A group that went down: SIGKILL the ranks that outlive the grace, and
 * once none runs and the back-off has passed, start all of them again. */
static void group_restart_due(launcher *L, int gi) {
    struct group_state *g = &L->groups[gi];
    if (!g->down) return;
    double t = now_ms();
    bool any = false;
    for (int i = 0; i < L->n_kids; i++) {
        child *c = &L->kids[i];
        if (c->role != CHILD_VERIFIER || c->group != gi || !c->pid) continue;
        any = true;
        if (t >= g->kill_at_ms && !g->killed) {
            SD_WARN("%s (pid %d) did not stop within %d ms of its group going down: SIGKILL", c->name, (int)c->pid,
                    GROUP_STOP_GRACE_MS);
            signal_child(c, SIGKILL);
        }
    }
    if (t >= g->kill_at_ms) g->killed = true;
    if (any || t < g->restart_at_ms) return;
    g->down = false;
    g->restarts++;
    g->started_ms = t;
    for (int i = 0; i < L->n_kids; i++) {
        child *c = &L->kids[i];
        if (c->role != CHILD_VERIFIER || c->group != gi) continue;
        c->restart_at_ms = 0;
        c->restarts++;
        if (spawn(L, c) != SD_OK) SD_ERROR("cannot restart %s", c->name);
    }
    SD_INFO("verifier group %d restarted (%d ranks, restart %d)", gi + 1, L->o.tp, g->restarts);
}

static void restart_due(launcher *L) {
    for (int g = 0; g < L->o.groups; g++) group_restart_due(L, g);
    double t = now_ms();
    for (int i = 0; i < L->n_kids; i++) {
        child *c = &L->kids[i];
        if (c->pid == 0 && c->restart_at_ms > 0 && t >= c->restart_at_ms) {
            c->restart_at_ms = 0;
            c->restarts++;
            if (spawn(L, c) == SD_OK) SD_INFO("%s restarted (restart %d)", c->name, c->restarts);
        }
    }
}

static int n_running(const launcher *L) {
    int n = 0;
    for (int i = 0; i < L->n_kids; i++) n += L->kids[i].pid != 0;
    return n;
}

/* The order of a stop: the gateway drains first (its streams need the
 * rest), then the coordinator (its requests need the workers), then the
 * workers. */
static int stop_stage(child_role r) { return r == CHILD_GATEWAY ? 0 : r == CHILD_COORDINATOR ? 1 : 2; }

static void signal_role(launcher *L, int stage, int sig) {
    for (int i = 0; i < L->n_kids; i++)
        if (L->kids[i].pid && stop_stage(L->kids[i].role) == stage) signal_child(&L->kids[i], sig);
}

/* Waits (reading the signalfd) until no child of the given kind runs or the
 * deadline passes. A second SIGINT/SIGTERM cuts the wait short. */
static void wait_children(launcher *L, int stage, double deadline) {
    for (;;) {
        reap(L);
        bool any = false;
        for (int i = 0; i < L->n_kids; i++) any |= L->kids[i].pid && stop_stage(L->kids[i].role) == stage;
        double left = deadline - now_ms();
        if (!any || left <= 0) return;
        struct pollfd p = {.fd = L->sfd, .events = POLLIN};
        if (poll(&p, 1, (int)(left < 50 ? left + 1 : 50)) > 0) {
            struct signalfd_siginfo si;
            if (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si &&
                (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM)) {
                SD_WARN("second signal: killing the remaining processes now");
                return;
            }
        }
    }
}

/* A drain of the whole service (stop_stage's order: the gateway and the
 * coordinator each finish what is in flight, bounded by their drain
 * timeouts, while the workers still serve); each stage gets SIGTERM and
 * stop_timeout, then SIGKILL. */
static void stop_all(launcher *L) {
    L->stopping = true;
    for (int stage = 0; stage < 3; stage++) {
        signal_role(L, stage, SIGTERM);
        wait_children(L, stage, now_ms() + 1e3 * L->o.stop_timeout_s);
        for (int i = 0; i < L->n_kids; i++) {
            child *c = &L->kids[i];
            if (c->pid && stop_stage(c->role) == stage) {
                SD_WARN("%s (pid %d) did not stop within %d s: SIGKILL", c->name, (int)c->pid, L->o.stop_timeout_s);
                kill(c->pid, SIGKILL);
                int status;
                waitpid(c->pid, &status, 0);
                c->pid = 0;
            }
        }
    }
}

/* Group g's own socket: --group-addr for the first group; the others get
 * the next ports (tcp://host:PORT + g) or, for other transports, the
 * address with "-g" appended. */
static void group_addr_of(const char *base, int g, char *out, size_t n) {
    const char *colon = strrchr(base, ':');
    int port = 0;
    if (g > 0 && !strncmp(base, "tcp://", 6) && colon && sd_cli_parse_int(colon + 1, 1, 65535, &port)) {
        snprintf(out, n, "%.*s:%d", (int)(colon - base), base, port + g);
    } else if (g > 0) {
        snprintf(out, n, "%s-%d", base, g);
    } else {
        snprintf(out, n, "%s", base);
    }
}

/* ---- main loop ---- */

/* The children to run (coordinator, verifier ranks, drafters, gateway):
 * names, binaries and argv. False (logged) when a binary is missing. */
static bool plan_children(launcher *L) {
    const launch_opts *o = &L->o;
    static const struct {
        const char *bin, *dir;
    } bins[CHILD_ROLE_COUNT] = {{"specd-coordinator", "coordinator"},
                                {"specd-verifier", "verifier"},
                                {"specd-drafter", "drafter"},
                                {"specd-gateway", "gateway"}};
    L->n_kids = 0;
    L->kids[L->n_kids++].role = CHILD_COORDINATOR;
    for (int g = 0; g < o->groups; g++) {
        for (int r = 0; r < o->tp; r++) {
            child *c = &L->kids[L->n_kids++];
            c->role = CHILD_VERIFIER;
            c->group = g;
            c->rank = r;
        }
    }
    for (int d = 0; d < o->n_drafters; d++) {
        child *c = &L->kids[L->n_kids++];
        c->role = CHILD_DRAFTER;
        c->drafter = d;
    }
    if (!o->no_gateway) L->kids[L->n_kids++].role = CHILD_GATEWAY;
    for (int g = 0; g < o->groups; g++) group_addr_of(o->group_addr, g, L->groups[g].addr, sizeof L->groups[g].addr);
    for (int i = 0; i < L->n_kids; i++) {
        child *c = &L->kids[i];
        c->backoff_ms = RESTART_BACKOFF_MIN_MS;
        if (c->role == CHILD_VERIFIER && o->groups > 1)
            snprintf(c->name, sizeof c->name, "verifier[%d.%d]", c->group + 1, c->rank);
        else if (c->role == CHILD_VERIFIER)
            snprintf(c->name, sizeof c->name, "verifier[%d]", c->rank);
        else if (c->role == CHILD_DRAFTER && o->n_drafters > 1)
            snprintf(c->name, sizeof c->name, "drafter[%d]", c->drafter);
        else
            snprintf(c->name, sizeof c->name, "%s", bins[c->role].dir);
        if (!launch_find_binary(o, bins[c->role].bin, bins[c->role].dir, c->path, sizeof c->path)) {
            SD_ERROR("cannot find %s (looked in %s, next to specd-launch and on PATH); build it or pass --bin-dir%s",
                     bins[c->role].bin, o->bin_dir ? o->bin_dir : "the build tree",
                     c->role == CHILD_GATEWAY ? " (or --no-gateway)" : "");
            return false;
        }
        const launch_argv_ctx x = {.o = o,
                                   .keys = &L->keys,
                                   .worker_connect = L->worker_connect,
                                   .client_connect = L->client_connect,
                                   .group_addr = L->groups[c->group].addr};
        launch_build_argv(&x, c);
    }
    return true;
}

/* The readiness query's context and socket to the coordinator's client
 * address (with the launcher's keys). False (logged) on failure. */
static bool open_ready_socket(launcher *L, launch_ready *rd) {
    rd->zctx = zmq_ctx_new();
    if (!rd->zctx) {
        SD_ERROR("zmq_ctx_new: %s", zmq_strerror(errno));
        return false;
    }
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_DEALER;
    sp.max_msg_bytes = SD_MAX_CLIENT_MSG_BYTES;
    sp.linger_ms = 0;
    if (L->keys.launch_id.on) {
        sp.curve_server_public = L->keys.launch_id.server;
        sp.curve_public = L->keys.launch_id.public_key;
        sp.curve_secret = L->keys.launch_id.secret;
    }
    if (sd_net_socket_open(rd->zctx, &sp, NULL, L->client_connect, &rd->sock) != SD_OK) {
        zmq_ctx_term(rd->zctx);
        return false;
    }
    return true;
}

/* Before "ready": reads the coordinator's answer (sock_readable), prints
 * "ready" once every group, drafter and the gateway are there, else asks
 * again every STATS_POLL_MS. False when the deadline passed (logged). */
static bool check_ready(launcher *L, launch_ready *rd, bool sock_readable, double deadline, bool *ready) {
    const launch_opts *o = &L->o;
    if (sock_readable) launch_ready_read(rd);
    /* the coordinator's own drafters count: its n-gram one, a head's relay per group */
    const int drafters = o->n_drafters + (o->local_ngram ? 1 : 0) + (o->eagle ? o->groups : 0);
    if (rd->groups_alive >= o->groups && rd->drafters_alive >= drafters &&
        (o->no_gateway || launch_gateway_listening(o->http))) {
        *ready = true;
        SD_INFO("all processes registered (%d running)", n_running(L));
        if (L->local.on) launch_local_publish(&L->local, L->client_connect);
        printf("ready %s\n", L->client_connect);
        if (!o->no_gateway) printf("http http://%s\n", o->http);
        fflush(stdout);
        sd_net_close(&rd->sock); /* readiness is a start-up question only */
    } else if (now_ms() > deadline) {
        SD_ERROR("not ready after %d s: %d of %d verifier groups and %d of %d drafters registered, gateway "
                 "%s; stopping the service",
                 o->ready_timeout_s, rd->groups_alive, o->groups, rd->drafters_alive, drafters,
                 o->no_gateway                       ? "not asked for"
                 : launch_gateway_listening(o->http) ? "listening"
                                                     : "NOT listening");
        return false;
    } else if (now_ms() - rd->last_query_ms >= STATS_POLL_MS) {
        launch_ready_query(rd);
    }
    return true;
}

/* Starts the coordinator and waits until both its sockets are bound, so
 * that nothing connects to a port nobody has bound yet (with a port in the
 * kernel's ephemeral range, such a connect can become a TCP self-connect
 * that holds the port, and the coordinator could never bind it). Signals
 * and exits are handled meanwhile. False when the service must stop. */
static bool start_coordinator(launcher *L) {
    const launch_opts *o = &L->o;
    const char *addrs[3] = {o->client_addr, o->worker_addr, o->no_gateway ? NULL : o->http};
    for (int i = 0; i < 3; i++) {
        const char *colon = addrs[i] ? strrchr(addrs[i], ':') : NULL;
        if (colon && launch_port_ephemeral(atoi(colon + 1)))
            SD_WARN("%s: the port is in the kernel's ephemeral range (ip_local_port_range): an outgoing "
                    "connection may take it before it is bound; choose one outside it",
                    addrs[i]);
    }
    if (spawn(L, &L->kids[0]) != SD_OK) {
        L->exit_code = 1;
        return false;
    }
    const double deadline = now_ms() + 1e3 * o->ready_timeout_s;
    while (!L->stopping) {
        if (L->kids[0].pid && launch_zmq_bound(o->client_addr) && launch_zmq_bound(o->worker_addr)) return true;
        struct pollfd pfd = {.fd = L->sfd, .events = POLLIN};
        if (poll(&pfd, 1, 20) > 0) {
            struct signalfd_siginfo si;
            if (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si && si.ssi_signo != SIGCHLD) {
                SD_INFO("%s: stopping the service", strsignal((int)si.ssi_signo));
                return false;
            }
        }
        reap(L);
        restart_due(L);
        if (now_ms() > deadline) {
            SD_ERROR("the coordinator did not bind %s and %s within %d s; stopping the service", o->client_addr,
                     o->worker_addr, o->ready_timeout_s);
            L->exit_code = 1;
            return false;
        }
    }
    return false;
}

/* With verifiers on the CPU, the drafter processes start once every group
 * has registered, that is after the verifiers' warm-up: the step times it
 * measures seed the coordinator's cost model (adaptive K, the drafter
 * choice), and a drafter loading and warming up on the same cores made
 * them up to 3x too slow (one launch with an EAGLE-3 drafter seeded 9,704 us
 * + 1,540 us a token, a plain one beside it 3,167 + 2,139). The drafters'
 * own warm-up then runs with the verifiers idle (no request is served before
 * "ready"). It costs the drafters' start-up time once at launch; a verifier
 * on a GPU warms up on the device, and the drafters start with it. True
 * when the drafters were started (or the service is stopping). */
static bool start_drafters_due(launcher *L, const launch_ready *rd) {
    if (rd->groups_alive < L->o.groups) return false;
    SD_INFO("verifier group(s) warmed up and registered; starting the drafter(s)");
    for (int i = 1; i < L->n_kids && !L->stopping; i++)
        if (L->kids[i].role == CHILD_DRAFTER && spawn(L, &L->kids[i]) != SD_OK) L->stopping = true, L->exit_code = 1;
    return true;
}

static int run(launcher *L) {
    const launch_opts *o = &L->o;
    if (!o->curve_dir && !o->insecure && !o->addrs_given) { /* closed to other users (launch_local.c) */
        if (!launch_local_make(getenv("XDG_RUNTIME_DIR"), &L->local)) return 1;
        L->o.client_addr = L->local.client;
        L->o.worker_addr = L->local.worker;
        L->o.group_addr = L->local.group;
        SD_INFO("links: ipc:// in %s (mode 0700: this user only; --insecure for TCP on the loopback)", L->local.dir);
    }
    connect_addr_of(o->worker_addr, L->worker_connect, sizeof L->worker_connect);
    connect_addr_of(o->client_addr, L->client_connect, sizeof L->client_connect);
    if (o->curve_dir) {
        if (launch_keys_make(o->curve_dir, &L->keys) != SD_OK) return 1;
        SD_INFO("CurveZMQ on every link; keys in %s (a client connects with --curve-secret %s --curve-server %s)",
                o->curve_dir, L->keys.secret[LAUNCH_KEY_CLIENT], L->keys.pub[LAUNCH_KEY_COORDINATOR]);
    }
    launch_ready rd = {0};
    if (!plan_children(L)) return 1;

    L->exit_code = 0;
    for (int g = 0; g < o->groups; g++) {
        L->groups[g].backoff_ms = RESTART_BACKOFF_MIN_MS;
        L->groups[g].started_ms = now_ms();
    }
    /* the coordinator first, bound before anything connects to it */
    bool started = start_coordinator(L); /* exit_code says why not: 0 after a signal */
    if (started && !open_ready_socket(L, &rd)) started = false, L->exit_code = 1;
    if (!started) {
        stop_all(L);
        launch_local_remove(&L->local);
        SD_INFO("stopped (exit %d)", L->exit_code);
        return L->exit_code;
    }
    /* CPU verifiers warm up alone (start_drafters_due) */
    bool drafters_held = o->device_base < 0 && o->n_drafters > 0;
    for (int i = 1; i < L->n_kids && !L->stopping; i++)
        if (!(drafters_held && L->kids[i].role == CHILD_DRAFTER) && spawn(L, &L->kids[i]) != SD_OK)
            L->stopping = true, L->exit_code = 1;

    const double ready_deadline = now_ms() + 1e3 * o->ready_timeout_s;
    bool ready = false;
    while (!L->stopping) {
        zmq_pollitem_t items[2] = {{.fd = L->sfd, .events = ZMQ_POLLIN}, {.socket = rd.sock, .events = ZMQ_POLLIN}};
        int n_items = rd.sock ? 2 : 1;
        if (zmq_poll(items, n_items, ready ? 500 : 50) < 0 && errno != EINTR) {
            SD_ERROR("zmq_poll: %s", zmq_strerror(errno));
            L->exit_code = 1;
            break;
        }
        if (items[0].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo si;
            if (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si && si.ssi_signo != SIGCHLD) {
                SD_INFO("%s: stopping the service", strsignal((int)si.ssi_signo));
                break;
            }
        }
        reap(L);
        if (L->stopping) break;
        restart_due(L);
        if (!ready && !check_ready(L, &rd, items[1].revents & ZMQ_POLLIN, ready_deadline, &ready)) {
            L->exit_code = 1;
            break;
        }
        if (drafters_held) drafters_held = !start_drafters_due(L, &rd);
    }
    sd_net_close(&rd.sock);
    zmq_ctx_term(rd.zctx);
    stop_all(L);
    launch_local_remove(&L->local);
    SD_INFO("stopped (exit %d)", L->exit_code);
    return L->exit_code;
}

int main(int argc, char **argv) {
    launcher *L = calloc(1, sizeof *L);
    if (!L) return 1;
    int rc = launch_args_parse(argc, argv, &L->o);
    if (rc >= 0) {
        free(L);
        return rc;
    }
    sd_net_log_init("launch", 0, L->o.verbose);

    /* Signals are read from a signalfd; block them before any thread exists
     * (libzmq's I/O threads inherit the mask). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    L->sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (L->sfd < 0) {
        fprintf(stderr, "specd-launch: signalfd: %s\n", strerror(errno));
        free(L);
        return 1;
    }
    rc = run(L);
    close(L->sfd);
    free(L);
    return rc;
}
