/* worker.c — the register / serve / heartbeat / reconnect loop shared by
 * specd-drafter and specd-verifier (see worker.h).
 *
 * One thread owns the socket: one zmq_poll over the DEALER, the compute
 * thread's completion eventfd and the stop fd. Steps run on a second
 * thread (one at a time; the rest queue in arrival order, Release
 * included, so state is never touched by two threads at once), because a
 * worker that stops heartbeating while it computes a long step looks dead
 * to the coordinator, which then drops it and its work, forever, if every
 * step is that long. The rejected alternative, a heartbeat from inside the
 * handler, would need every engine call to yield. The poll timeout
 * is the time left until the next heartbeat is due, so an idle worker wakes
 * once per interval to heartbeat and check the coordinator's liveness. A
 * busy worker heartbeats once per interval too (between requests), rather
 * than only when it sent nothing else: the heartbeat carries the KV stats,
 * and the coordinator's view of blocks in use (ServiceStats.workers) would
 * otherwise freeze while the worker is busiest. It costs one small message
 * per interval. Liveness is judged only
 * after the socket has been drained, so a long handler call (whose
 * heartbeats from the coordinator queued up meanwhile) never counts as
 * silence. Reconnecting closes and reopens the DEALER (a fresh routing id:
 * the coordinator sees a new peer, as the ZeroMQ guide's Paranoid Pirate
 * workers do) rather than relying on libzmq's own reconnect, which would
 * keep the old identity and a queue of stale replies. */
#include "specd/worker.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

sd_worker_params sd_worker_default_params(void) {
    sd_worker_params p;
    memset(&p, 0, sizeof p);
    p.group_size = 1;
    p.heartbeat_interval_ms = SD_HEARTBEAT_INTERVAL_MS;
    p.liveness = SD_HEARTBEAT_LIVENESS;
    p.stop_fd = -1;
    p.fail_fd = -1;
    snprintf(p.model.architecture, sizeof p.model.architecture, "llama");
    return p;
}

sd_status sd_worker_signal_fd(int *fd) {
    if (!fd) return SD_ERR_INVALID_ARG;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) {
        SD_ERROR("worker: cannot block SIGINT/SIGTERM");
        return SD_ERR_INTERNAL;
    }
    *fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (*fd < 0) {
        SD_ERROR("worker: signalfd: %s", strerror(errno));
        return SD_ERR_INTERNAL;
    }
    return SD_OK;
}

/* Requests and releases that may wait behind the running step. */
#define WORKER_QUEUE 64
/* The pause before reconnecting to a peer that is not a coordinator (our
 * own Hello echoed, or a bad first message): short, but no busy loop. */
#define SD_WORKER_RECONNECT_PAUSE_MS 50

/* The loop's state across reconnects. */
typedef struct worker_loop {
    const sd_worker_params *p;
    sd_net_limits limits; /* p->limits, n_vocab the target's once a Welcome says it */
    void *zctx;
    void *sock;
    void *monitor;          /* the socket's handshakes */
    int handshake_failures; /* in a row, without detail */
    bool registered;
    int refusals; /* CODE_REFUSED answers to Hello so far */
    uint64_t worker_id;
    int interval_ms; /* heartbeat interval (the Welcome may change it) */
    int liveness;
    double last_beat; /* sd_now() of the last heartbeat sent (or of the Hello) */
    double last_recv; /* sd_now() of the last message received (or connect) */
    char name[128];
    /* The compute thread: runs p->handle while this thread keeps the socket. */
    pthread_t compute;
    bool compute_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool job_ready, quit;                   /* under mu */
    sd_net_worker_msg *job;                 /* under mu while job_ready */
    sd_status job_status;                   /* under mu, written by the compute thread */
    Specd__WorkerToCoordinator job_reply;   /* under mu, written by the compute thread */
    int done_fd;                            /* eventfd: the compute thread finished a job */
    bool busy;                              /* a job is out (this thread's view) */
    sd_net_worker_msg *current;             /* the job out, freed when it completes */
    sd_net_worker_msg *queue[WORKER_QUEUE]; /* requests and releases waiting for the job */
    int q_head, q_len;
    Specd__WorkerStats stats; /* snapshot taken while no job is out */
    uint8_t *hello;           /* the Hello last sent, packed: an echo of it is a self-connect */
    size_t hello_len;
} worker_loop;

static sd_status loop_send(worker_loop *w, const Specd__WorkerToCoordinator *env) {
    sd_status st = sd_net_send(w->sock, NULL, 0, &env->base);
    return st;
}

static void send_error(worker_loop *w, Specd__Code code, uint64_t request_id, const char *message) {
    Specd__Error e = SPECD__ERROR__INIT;
    sd_net_error_init(&e, code, request_id, 0, message);
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_ERROR;
    env.error = &e;
    if (loop_send(w, &env) != SD_OK) SD_WARN("worker: could not send an Error (%s)", sd_net_code_name(code));
}

static sd_status send_hello(worker_loop *w) {
    const sd_worker_params *p = w->p;
    Specd__ModelIdentity id = SPECD__MODEL_IDENTITY__INIT;
    id.architecture = (char *)p->model.architecture;
    id.vocab_size = p->model.vocab_size;
    id.vocab_hash = p->model.vocab_hash;
    id.context_length = p->model.context_length;
    id.name = (char *)p->model.name;
    id.n_layers = p->model.n_layers;
    Specd__WorkerStats stats = w->stats;
    Specd__Hello h = SPECD__HELLO__INIT;
    h.protocol_version = SD_PROTOCOL_VERSION;
    h.role = p->role;
    h.rank = p->rank;
    h.group_size = p->group_size;
    h.group_id = p->rank == 0 ? p->group_id : 0;
    h.model = &id;
    h.name = w->name;
    h.drafter_kind = p->drafter_kind;
    h.max_batch = (uint32_t)p->limits.max_batch;
    h.max_k = (uint32_t)p->limits.max_k;
    h.stats = &stats;
    h.n_feature_layers = p->n_feature_layers;
    h.feature_layers = (uint32_t *)p->feature_layers;
    h.feature_width = p->n_feature_layers > 0 ? (uint32_t)p->limits.feature_width : 0;
    Specd__StepCost costs[SD_MAX_STEP_COSTS];
    Specd__StepCost *cost_ptrs[SD_MAX_STEP_COSTS];
    const size_t n_costs = p->n_step_costs < SD_MAX_STEP_COSTS ? p->n_step_costs : SD_MAX_STEP_COSTS;
    for (size_t i = 0; i < n_costs; i++) {
        specd__step_cost__init(&costs[i]);
        costs[i].tokens = p->step_costs[i].tokens;
        costs[i].forward_us = p->step_costs[i].forward_us;
        cost_ptrs[i] = &costs[i];
    }
    h.step_costs = cost_ptrs;
    h.n_step_costs = n_costs;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HELLO;
    env.hello = &h;
    free(w->hello); /* kept to recognise our own Hello coming back (drain) */
    w->hello_len = protobuf_c_message_get_packed_size(&env.base);
    w->hello = malloc(w->hello_len ? w->hello_len : 1);
    if (w->hello) protobuf_c_message_pack(&env.base, w->hello);
    else w->hello_len = 0;
    return loop_send(w, &env);
}

/* Refreshes the stats snapshot; only while no job is out (the callbacks are not thread-safe). */
static void refresh_stats(worker_loop *w) {
    if (w->busy) return;
    specd__worker_stats__init(&w->stats);
    w->p->stats(w->p->user, &w->stats);
}

static void send_heartbeat(worker_loop *w) {
    refresh_stats(w);
    Specd__WorkerStats stats = w->stats;
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    hb.stats = &stats;
    Specd__WorkerToCoordinator env = SPECD__WORKER_TO_COORDINATOR__INIT;
    env.body_case = SPECD__WORKER_TO_COORDINATOR__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    w->last_beat = sd_now();
    if (loop_send(w, &env) != SD_OK) SD_WARN("worker: could not send a heartbeat");
}

/* The monitor's news; true when the coordinator refused this worker's key
 * (or handshakes failed SD_NET_HANDSHAKE_TRIES times in a row): a wrong key
 * never becomes right by retrying, so the loop leaves, loudly. */
static bool handshake_refused(worker_loop *w) {
    char why[256];
    sd_net_handshake h = sd_net_monitor_read(w->monitor, why, sizeof why);
    if (h == SD_NET_HANDSHAKE_OK) w->handshake_failures = 0;
    if (h == SD_NET_HANDSHAKE_REFUSED ||
        (h == SD_NET_HANDSHAKE_FAILED && ++w->handshake_failures >= SD_NET_HANDSHAKE_TRIES)) {
        SD_ERROR("worker: the coordinator refused this worker: %s", why);
        return true;
    }
    if (h == SD_NET_HANDSHAKE_FAILED) SD_WARN("worker: %s; retrying", why);
    return false;
}

static void close_socket(worker_loop *w) {
    sd_net_monitor_close(w->sock, &w->monitor);
    sd_net_close(&w->sock);
}

static sd_status connect_and_hello(worker_loop *w) {
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_DEALER;
    sp.max_msg_bytes = sd_net_worker_request_cap(&w->p->limits); /* what our limits let a request hold */
    const sd_curve_id *id = w->p->curve;
    if (id && id->on) {
        sp.curve_server_public = id->server;
        sp.curve_public = id->public_key;
        sp.curve_secret = id->secret;
    }
    sp.monitor = &w->monitor; /* always: a plaintext worker of a CURVE coordinator learns it at once too */
    SD_TRY(sd_net_socket_open(w->zctx, &sp, NULL, w->p->coordinator, &w->sock));
    w->registered = false;
    w->last_recv = sd_now();
    w->last_beat = w->last_recv;
    SD_INFO("worker: connecting to %s, sending Hello", w->p->coordinator);
    sd_status st = send_hello(w);
    if (st != SD_OK) close_socket(w);
    return st;
}

/* What one received message asks the loop to do next. NEXT_RECONNECT: the
 * peer is not a coordinator (see drain). */
typedef enum { NEXT_CONTINUE, NEXT_REFUSED, NEXT_RECONNECT } loop_next;

static void *compute_main(void *arg) {
    worker_loop *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job_ready && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) break;
        const sd_net_worker_msg *msg = w->job;
        pthread_mutex_unlock(&w->mu);
        Specd__WorkerToCoordinator reply = SPECD__WORKER_TO_COORDINATOR__INIT;
        sd_status st = w->p->handle(w->p->user, msg, &reply);
        pthread_mutex_lock(&w->mu);
        w->job_status = st;
        w->job_reply = reply;
        w->job_ready = false;
        uint64_t one = 1;
        if (write(w->done_fd, &one, sizeof one) != sizeof one) SD_ERROR("worker: cannot signal a finished step");
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static uint64_t step_of(const Specd__CoordinatorToWorker *env) {
    return env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT ? env->draft->step_id : env->verify->step_id;
}

/* Hands msg (owned from now on) to the compute thread. */
static void start_job(worker_loop *w, sd_net_worker_msg *msg) {
    refresh_stats(w); /* the last snapshot before the state changes under the job */
    pthread_mutex_lock(&w->mu);
    w->job = msg;
    w->job_ready = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    w->busy = true;
    w->current = msg;
}

/* Collects the finished job: sends its reply when send_reply, frees it. Blocks until it is done. */
static void finish_job(worker_loop *w, bool send_reply) {
    if (!w->busy) return;
    uint64_t n = 0;
    struct pollfd pfd = {w->done_fd, POLLIN, 0};
    while (read(w->done_fd, &n, sizeof n) != sizeof n) {
        if (errno != EAGAIN && errno != EINTR) break;
        poll(&pfd, 1, 1000);
    }
    pthread_mutex_lock(&w->mu);
    sd_status st = w->job_status;
    Specd__WorkerToCoordinator reply = w->job_reply;
    pthread_mutex_unlock(&w->mu);
    uint64_t step = step_of(w->current->env);
    if (send_reply && st != SD_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "worker: step %llu failed: %s", (unsigned long long)step, sd_status_str(st));
        SD_ERROR("%s", msg);
        send_error(w, SPECD__CODE__CODE_INTERNAL, 0, msg);
    } else if (send_reply && loop_send(w, &reply) != SD_OK) {
        SD_WARN("worker: could not send the reply of step %llu", (unsigned long long)step);
    }
    sd_net_worker_msg_free(&w->current);
    w->busy = false;
    refresh_stats(w);
}

/* Runs what waits in the queue until a job is out or the queue is empty. */
static void run_queue(worker_loop *w) {
    while (!w->busy && w->q_len > 0) {
        sd_net_worker_msg *msg = w->queue[w->q_head];
        w->q_head = (w->q_head + 1) % WORKER_QUEUE;
        w->q_len--;
        if (msg->env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE) {
            w->p->release(w->p->user, msg->env->release->request_ids, msg->env->release->n_request_ids);
            sd_net_worker_msg_free(&msg);
        } else {
            start_job(w, msg);
        }
    }
}

static void clear_queue(worker_loop *w) {
    while (w->q_len > 0) {
        sd_net_worker_msg_free(&w->queue[w->q_head]);
        w->q_head = (w->q_head + 1) % WORKER_QUEUE;
        w->q_len--;
    }
}

/* Queues msg behind the running job (or runs it now); true when msg was taken. */
static bool enqueue(worker_loop *w, sd_net_worker_msg *msg) {
    if (w->q_len == WORKER_QUEUE) {
        send_error(w, SPECD__CODE__CODE_OVERLOADED, 0, "worker queue full: 64 requests wait behind the running step");
        return false;
    }
    w->queue[(w->q_head + w->q_len) % WORKER_QUEUE] = msg;
    w->q_len++;
    run_queue(w);
    return true;
}

/* A draft or verify request: true when msg was taken (queued or running). */
static bool serve_request(worker_loop *w, sd_net_worker_msg *msg) {
    const sd_worker_params *p = w->p;
    const Specd__CoordinatorToWorker *env = msg->env;
    bool is_draft = env->body_case == SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT;
    Specd__Role wanted = is_draft ? SPECD__ROLE__ROLE_DRAFTER : SPECD__ROLE__ROLE_VERIFIER;
    if (!w->registered) {
        send_error(w, SPECD__CODE__CODE_PROTOCOL, 0, "request before Welcome: this worker is not registered yet");
        return false;
    }
    if (p->role != wanted) {
        char why[160];
        snprintf(why, sizeof why, "%s request (step %llu) sent to a %s", is_draft ? "draft" : "verify",
                 (unsigned long long)step_of(env), p->role == SPECD__ROLE__ROLE_DRAFTER ? "drafter" : "verifier");
        send_error(w, SPECD__CODE__CODE_PROTOCOL, 0, why);
        return false;
    }
    return enqueue(w, msg);
}

static loop_next dispatch(worker_loop *w, const sd_net_msg *m) {
    const sd_worker_params *p = w->p;
    Specd__Code code = SPECD__CODE__CODE_UNSPECIFIED;
    char err[512] = "";
    sd_net_worker_msg *msg = sd_net_read_to_worker(m->body, m->body_len, &w->limits, &code, err, sizeof err);
    if (!msg && !w->registered) { /* the first thing heard is no coordinator's: see drain */
        SD_WARN("worker: %s answered with a bad message (%s: %s) before any Welcome: not a coordinator, reconnecting",
                p->coordinator, sd_net_code_name(code), err);
        return NEXT_RECONNECT;
    }
    if (!msg) {
        SD_WARN("worker: bad message from the coordinator (%s): %s", sd_net_code_name(code), err);
        send_error(w, code == SPECD__CODE__CODE_UNSPECIFIED ? SPECD__CODE__CODE_MALFORMED : code, 0, err);
        return NEXT_CONTINUE;
    }
    const Specd__CoordinatorToWorker *env = msg->env;
    loop_next next = NEXT_CONTINUE;
    bool taken = false;
    switch (env->body_case) {
    case SPECD__COORDINATOR_TO_WORKER__BODY_WELCOME:
        if (w->registered) {
            SD_DEBUG("worker: a second Welcome, ignored");
            break;
        }
        w->registered = true;
        w->refusals = 0;
        w->worker_id = env->welcome->worker_id;
        if (env->welcome->heartbeat_interval_ms > 0) w->interval_ms = (int)env->welcome->heartbeat_interval_ms;
        if (env->welcome->heartbeat_liveness > 0) w->liveness = (int)env->welcome->heartbeat_liveness;
        if (env->welcome->vocab_size > 0 && (int32_t)env->welcome->vocab_size != w->limits.n_vocab) {
            /* a drafter padded to other rows than the target (same tokenizer): requests hold the target's ids */
            SD_INFO("worker: the target's vocabulary has %u rows, this worker's %d", env->welcome->vocab_size,
                    (int)p->model.vocab_size);
            w->limits.n_vocab = (int32_t)env->welcome->vocab_size;
            if (p->welcome) p->welcome(p->user, (int32_t)env->welcome->vocab_size);
        }
        SD_INFO("worker: registered as worker %llu (heartbeat %d ms, liveness %d)", (unsigned long long)w->worker_id,
                w->interval_ms, w->liveness);
        break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_ERROR: {
        const Specd__Error *e = env->error;
        if (!w->registered && e->code == SPECD__CODE__CODE_REFUSED && w->refusals < SD_WORKER_REFUSED_RETRIES) {
            /* Most likely the peer we replace (a verifier restarted after a
             * clean stop) is not yet known to be dead: say Hello again once
             * the liveness period has passed (the reconnect below). */
            w->refusals++;
            SD_WARN("worker: registration refused (%s); retrying after the liveness period (%d of %d)",
                    e->message ? e->message : "", w->refusals, SD_WORKER_REFUSED_RETRIES);
        } else if (!w->registered) {
            SD_ERROR("worker: the coordinator refused registration: %s: %s", sd_net_code_name(e->code),
                     e->message ? e->message : "");
            if (e->code == SPECD__CODE__CODE_VOCAB_MISMATCH) /* the target's side is in the coordinator's log */
                SD_ERROR("worker: this worker's vocabulary: %u tokens, vocab hash 0x%016llx (model '%s')",
                         p->model.vocab_size, (unsigned long long)p->model.vocab_hash, p->model.name);
            next = NEXT_REFUSED;
        } else {
            SD_WARN("worker: error from the coordinator: %s: %s (request %llu)", sd_net_code_name(e->code),
                    e->message ? e->message : "", (unsigned long long)e->request_id);
        }
        break;
    }
    case SPECD__COORDINATOR_TO_WORKER__BODY_HEARTBEAT: break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_DRAFT:
    case SPECD__COORDINATOR_TO_WORKER__BODY_VERIFY: taken = serve_request(w, msg); break;
    case SPECD__COORDINATOR_TO_WORKER__BODY_RELEASE:
        if (!w->registered) {
            send_error(w, SPECD__CODE__CODE_PROTOCOL, 0, "Release before Welcome: this worker is not registered yet");
            break;
        }
        taken = enqueue(w, msg); /* in order with the requests before it */
        break;
    default:
        SD_WARN("worker: envelope with no body (case %d), ignored", (int)env->body_case);
        send_error(w, SPECD__CODE__CODE_MALFORMED, 0, "envelope has no body");
        break;
    }
    if (!taken) sd_net_worker_msg_free(&msg);
    return next;
}

/* Receives everything waiting. NEXT_REFUSED when the coordinator refused us. */
static sd_status drain(worker_loop *w, loop_next *next) {
    *next = NEXT_CONTINUE;
    for (;;) {
        sd_net_msg m;
        memset(&m, 0, sizeof m);
        errno = 0;
        sd_status st = sd_net_recv(w->sock, false, true, &m);
        if (st == SD_ERR_NET && errno == EAGAIN) {
            sd_net_msg_clear(&m);
            return SD_OK;
        }
        if (st == SD_ERR_FORMAT) {
            w->last_recv = sd_now();
            send_error(w, SPECD__CODE__CODE_MALFORMED, 0, "message must be exactly one body frame");
            sd_net_msg_clear(&m);
            continue;
        }
        if (st != SD_OK) {
            sd_net_msg_clear(&m);
            return st;
        }
        w->last_recv = sd_now();
        if (!w->registered && w->hello && m.body_len == w->hello_len && memcmp(m.body, w->hello, m.body_len) == 0) {
            /* Our own Hello: a TCP self-connect (the coordinator's port in
             * the kernel's ephemeral range and not bound yet, so the
             * connection's source port became its destination). Holding it
             * would keep the port from the coordinator: drop it at once. */
            SD_WARN("worker: received our own Hello from %s (a TCP self-connect?): reconnecting", w->p->coordinator);
            sd_net_msg_clear(&m);
            *next = NEXT_RECONNECT;
            return SD_OK;
        }
        *next = dispatch(w, &m);
        sd_net_msg_clear(&m);
        if (*next == NEXT_REFUSED || *next == NEXT_RECONNECT) return SD_OK;
    }
}

/* Tells the coordinator this worker cannot serve any more (fail_fd). */
static void report_failed(worker_loop *w) {
    const char *reason = w->p->fail_reason ? w->p->fail_reason(w->p->user) : NULL;
    char msg[512];
    snprintf(msg, sizeof msg, "%s cannot serve any more: %s", w->name, reason ? reason : "failed");
    SD_ERROR("worker: %s; telling the coordinator and leaving", msg);
    send_error(w, SPECD__CODE__CODE_UNAVAILABLE, 0, msg);
}

static bool stop_requested(int fd, short revents) { return fd >= 0 && (revents & (POLLIN | POLLERR | POLLHUP)) != 0; }

/* Starts the compute thread and its completion eventfd. */
static sd_status compute_start(worker_loop *w) {
    w->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->done_fd < 0) {
        SD_ERROR("worker: eventfd: %s", strerror(errno));
        return SD_ERR_INTERNAL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->compute, NULL, compute_main, w) != 0) {
        SD_ERROR("worker: cannot start the compute thread");
        close(w->done_fd);
        return SD_ERR_INTERNAL;
    }
    w->compute_started = true;
    return SD_OK;
}

static void compute_stop(worker_loop *w) {
    if (!w->compute_started) return;
    finish_job(w, false);
    clear_queue(w);
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->compute, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    close(w->done_fd);
    w->compute_started = false;
}

/* stop_fd became readable: finishes the running step and tells the
 * coordinator why this worker goes. */
static void stop_serving(worker_loop *w, sd_worker_exit *why) {
    const sd_worker_params *p = w->p;
    SD_INFO("worker: stop requested%s, closing the connection", w->busy ? " (finishing the running step)" : "");
    finish_job(w, true);
    /* the step may have failed because the worker did (its group lost a
     * rank, the reason it is being stopped): say so, so the coordinator
     * does not wait out the liveness period */
    struct pollfd fp = {p->fail_fd, POLLIN, 0};
    if (p->fail_fd >= 0 && poll(&fp, 1, 0) > 0 && (fp.revents & POLLIN)) {
        report_failed(w);
        *why = SD_WORKER_FAILED;
    } else if (w->registered) {
        /* a drain: the running step is answered; the coordinator hands this
         * worker's requests to the others now rather than after the
         * liveness period */
        char msg[320];
        snprintf(msg, sizeof msg, "%s is draining (stopped): its requests go to the others", w->name);
        send_error(w, SPECD__CODE__CODE_UNAVAILABLE, 0, msg);
    }
}

sd_status sd_worker_run(void *zctx, const sd_worker_params *p, sd_worker_exit *why) {
    if (!zctx || !p || !why || !p->coordinator || !p->handle || !p->release || !p->reset || !p->stats ||
        p->heartbeat_interval_ms <= 0 || p->liveness <= 0) {
        SD_ERROR("worker: run needs a context, an address, the four callbacks and positive heartbeat timing");
        return SD_ERR_INVALID_ARG;
    }
    *why = SD_WORKER_STOPPED;
    worker_loop *wp = calloc(1, sizeof *wp);
    if (!wp) return SD_ERR_NOMEM;
    worker_loop *w = wp;
    w->p = p;
    w->limits = p->limits;
    w->zctx = zctx;
    w->interval_ms = p->heartbeat_interval_ms;
    w->liveness = p->liveness;
    if (p->name && p->name[0]) {
        snprintf(w->name, sizeof w->name, "%s", p->name);
    } else {
        char host[64] = "localhost";
        gethostname(host, sizeof host - 1);
        snprintf(w->name, sizeof w->name, "%s:%ld", host, (long)getpid());
    }
    refresh_stats(w);
    sd_status st = compute_start(w);
    if (st == SD_OK) st = connect_and_hello(w);
    while (st == SD_OK) {
        double now = sd_now();
        double until_beat = w->interval_ms / 1e3 - (now - w->last_beat);
        long timeout_ms = until_beat > 0 ? (long)(until_beat * 1e3) + 1 : 0;
        if (!w->registered) timeout_ms = w->interval_ms; /* only the liveness check is due */
        /* the stop and fail fds, when given, follow the socket and the eventfd */
        zmq_pollitem_t items[5] = {
            {w->sock, 0, ZMQ_POLLIN, 0}, {NULL, w->done_fd, ZMQ_POLLIN, 0}, {NULL, -1, ZMQ_POLLIN, 0},
            {NULL, -1, ZMQ_POLLIN, 0},   {NULL, -1, ZMQ_POLLIN, 0},
        };
        int n_items = 2, stop_i = -1, fail_i = -1, mon_i = -1;
        if (p->stop_fd >= 0) items[stop_i = n_items++].fd = p->stop_fd;
        if (p->fail_fd >= 0) items[fail_i = n_items++].fd = p->fail_fd;
        if (w->monitor) items[mon_i = n_items++].socket = w->monitor;
        int rc = zmq_poll(items, n_items, timeout_ms);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            SD_ERROR("worker: zmq_poll: %s", zmq_strerror(zmq_errno()));
            st = SD_ERR_NET;
            break;
        }
        /* before the stop: a worker that failed says so even when it is also
         * being stopped (a launcher tearing its group down) */
        if (fail_i >= 0 && stop_requested(p->fail_fd, items[fail_i].revents)) {
            finish_job(w, false); /* whatever it was doing failed with the group */
            clear_queue(w);
            report_failed(w);
            *why = SD_WORKER_FAILED;
            break;
        }
        if (stop_i >= 0 && stop_requested(p->stop_fd, items[stop_i].revents)) {
            stop_serving(w, why);
            break;
        }
        if (mon_i >= 0 && (items[mon_i].revents & ZMQ_POLLIN) && handshake_refused(w)) {
            finish_job(w, false);
            clear_queue(w);
            *why = SD_WORKER_REFUSED;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            finish_job(w, true);
            run_queue(w);
        }
        if (items[0].revents & ZMQ_POLLIN) {
            loop_next next;
            st = drain(w, &next);
            if (st != SD_OK) break;
            if (next == NEXT_REFUSED) {
                *why = SD_WORKER_REFUSED;
                break;
            }
            if (next == NEXT_RECONNECT) { /* not a coordinator: a new socket, after a pause (no hot loop) */
                finish_job(w, false);
                clear_queue(w);
                close_socket(w);
                usleep(SD_WORKER_RECONNECT_PAUSE_MS * 1000);
                st = connect_and_hello(w);
                continue;
            }
        }
        now = sd_now();
        double dead_after = (double)w->interval_ms * w->liveness / 1e3;
        if (now - w->last_recv > dead_after) {
            if (w->refusals == 0 || w->registered)
                SD_WARN("worker: the coordinator has been silent for %.1f s (%s); clearing caches and reconnecting",
                        now - w->last_recv, w->registered ? "after registration" : "no Welcome");
            finish_job(w, false);
            clear_queue(w);
            p->reset(p->user);
            refresh_stats(w);
            close_socket(w);
            st = connect_and_hello(w);
            continue;
        }
        if (w->registered && now - w->last_beat >= w->interval_ms / 1e3) send_heartbeat(w);
    }
    compute_stop(w);
    close_socket(w);
    free(w->hello);
    free(wp);
    return st;
}
