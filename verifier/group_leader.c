/* group_leader.c — the leader of a tensor-parallel verifier group: checks
 * joins, sets up the collectives, runs the group thread (heartbeats, rank
 * liveness) and fans each forward's plan out to the ranks. See group.c. */
#include "group_impl.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static void eventfd_signal(int fd) {
    uint64_t one = 1;
    if (write(fd, &one, sizeof one) != sizeof one) SD_ERROR("group: cannot signal an eventfd: %s", strerror(errno));
}

/* Sends bytes as one message, after the routing id when ident != NULL. */
static sd_status send_bytes(void *sock, const uint8_t *ident, size_t ident_len, const void *data, size_t len) {
    if (ident && zmq_send(sock, ident, ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return SD_ERR_NET;
    if (zmq_send(sock, data, len, ident ? ZMQ_DONTWAIT : 0) < 0) return SD_ERR_NET;
    return SD_OK;
}

/* ------------------------------------------------------------ leader */

typedef struct rank_peer {
    bool joined, ready;
    uint8_t ident[SD_MAX_IDENTITY_BYTES];
    size_t ident_len;
    double last_recv; /* sd_now() of its last message */
    int32_t pid;
    bool same_host; /* its pid means something here (host and pid namespace equal) */
} rank_peer;

struct sd_group {
    sd_group_params p;
    void *zctx;
    void *router; /* the ranks' link: the caller's thread during start, then the group thread's */
    sd_zap *zap;  /* the ZAP handler of the ranks' link (CurveZMQ only) */
    sd_zap_domain zap_domain;
    void *plan_in;  /* inproc PAIR: the group thread reads plans here */
    void *plan_out; /* inproc PAIR: the forward's thread writes plans here */
    sd_coll *coll;
    rank_peer *peers; /* [size]; [0] unused */
    pthread_t thread;
    bool thread_started;
    int quit_fd; /* eventfd: sd_group_close ends the group thread */
    int down_fd; /* eventfd: readable once down */
    atomic_bool down;
    pthread_mutex_t mu; /* guards reason */
    char reason[SD_GROUP_REASON_MAX];
    uint64_t steps; /* plans sent (the forward's thread) */
    uint8_t *pack;  /* the forward's thread's packing buffer */
    size_t cap_pack;
    char host[64];
    uint64_t pid_ns;
    double last_beat;
};

sd_coll *sd_group_coll(const sd_group *g) { return g ? g->coll : NULL; }
int sd_group_down_fd(const sd_group *g) { return g ? g->down_fd : -1; }

const char *sd_group_down_reason(const sd_group *g) {
    if (!g || !atomic_load(&g->down)) return "";
    return g->reason; /* written once, before down was set */
}

void sd_group_fail(sd_group *g, const char *reason) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    bool first = !atomic_load(&g->down);
    if (first) {
        snprintf(g->reason, sizeof g->reason, "%s", reason ? reason : "failed");
        atomic_store(&g->down, true);
    }
    pthread_mutex_unlock(&g->mu);
    if (!first) return;
    SD_ERROR("group: down: %s", g->reason);
    if (g->coll) sd_coll_abort(g->coll); /* a forward waiting in a collective returns now */
    eventfd_signal(g->down_fd);
}

static int32_t rank_of(const sd_group *g, const uint8_t *ident, size_t len) {
    for (int32_t r = 1; r < g->p.size; r++)
        if (g->peers[r].joined && g->peers[r].ident_len == len && memcmp(g->peers[r].ident, ident, len) == 0) return r;
    return -1;
}

static void leader_send(sd_group *g, int32_t r, const Specd__LeaderToRank *env) {
    const rank_peer *pr = &g->peers[r];
    if (sd_net_send(g->router, pr->ident, pr->ident_len, &env->base) != SD_OK)
        SD_DEBUG("group: could not send to rank %d", (int)r);
}

static void send_error_to(sd_group *g, const uint8_t *ident, size_t len, Specd__Code code, const char *msg) {
    Specd__Error e;
    sd_net_error_init(&e, code, 0, 0, msg);
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_ERROR;
    env.error = &e;
    (void)sd_net_send(g->router, ident, len, &env.base);
}

static void heartbeat_ranks(sd_group *g) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    for (int32_t r = 1; r < g->p.size; r++)
        if (g->peers[r].joined) leader_send(g, r, &env);
    g->last_beat = sd_now();
}

static void stop_ranks(sd_group *g, const char *reason, bool clean) {
    Specd__GroupStop st = SPECD__GROUP_STOP__INIT;
    st.reason = (char *)reason;
    st.clean = clean;
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_STOP;
    env.stop = &st;
    for (int32_t r = 1; r < g->p.size; r++)
        if (g->peers[r].joined) leader_send(g, r, &env);
}

/* The liveness of every joined rank: silence (dead or hung) or, on this
 * host, a process that is gone. Returns false (with why) for the first dead
 * one. */
static bool ranks_alive(sd_group *g, char *why, size_t n) {
    double now = sd_now(), dead_after = g->p.heartbeat_interval_ms * (double)g->p.liveness / 1e3;
    for (int32_t r = 1; r < g->p.size; r++) {
        rank_peer *pr = &g->peers[r];
        if (!pr->joined) continue;
        if (pr->same_host && sd_group_pid_gone(pr->pid)) {
            snprintf(why, n, "rank %d (pid %d) exited", (int)r, (int)pr->pid);
            return false;
        }
        if (now - pr->last_recv > dead_after) {
            snprintf(why, n, "rank %d (pid %d) silent for %.1f s (liveness %.1f s): dead or hung", (int)r, (int)pr->pid,
                     now - pr->last_recv, dead_after);
            return false;
        }
    }
    return true;
}

/* A join: checked against the leader; SD_OK (joined, or a duplicate
 * refused), or SD_ERR_INVALID_ARG when the group cannot be built as
 * configured (the rank was told why). */
static sd_status on_join(sd_group *g, const sd_net_msg *m, const Specd__GroupJoin *j) {
    char msg[768];
    const sd_model_identity *me = &g->p.model;
    const Specd__ModelIdentity *id = j->model;
    msg[0] = 0;
    if (j->protocol_version != SD_PROTOCOL_VERSION)
        snprintf(msg, sizeof msg, "rank %u speaks protocol %u, the leader %u", j->rank, j->protocol_version,
                 SD_PROTOCOL_VERSION);
    else if (j->group_id != g->p.group_id)
        snprintf(msg, sizeof msg, "rank %u belongs to group %u, this leader leads group %u", j->rank, j->group_id,
                 g->p.group_id);
    else if ((int32_t)j->group_size != g->p.size)
        snprintf(msg, sizeof msg, "rank %u was started for a group of %u ranks, the leader for %d", j->rank,
                 j->group_size, (int)g->p.size);
    else if (strcmp(id->architecture, me->architecture) || id->vocab_size != me->vocab_size ||
             id->vocab_hash != me->vocab_hash || id->context_length != me->context_length ||
             id->n_layers != me->n_layers)
        snprintf(msg, sizeof msg,
                 "rank %u serves model '%s' (%s, %u layers, vocab %u hash 0x%016llx, context %u), the leader '%s' "
                 "(%s, %u layers, vocab %u hash 0x%016llx, context %u)",
                 j->rank, id->name, id->architecture, id->n_layers, id->vocab_size, (unsigned long long)id->vocab_hash,
                 id->context_length, me->name, me->architecture, me->n_layers, me->vocab_size,
                 (unsigned long long)me->vocab_hash, me->context_length);
    else if ((int32_t)j->lm_head != g->p.lm_head)
        snprintf(msg, sizeof msg, "rank %u computes the LM head %s, the leader %s", j->rank,
                 j->lm_head ? "whole on the leader" : "split by vocabulary",
                 g->p.lm_head ? "whole on the leader" : "split by vocabulary");
    else if (j->cuda != (g->p.device >= 0))
        snprintf(msg, sizeof msg, "rank %u runs on %s, the leader on %s: a group is all CPU or all GPU", j->rank,
                 j->cuda ? "a GPU" : "the CPU", g->p.device >= 0 ? "a GPU" : "the CPU");
    else if (g->p.device < 0 && strcmp(j->host, g->host) != 0)
        snprintf(msg, sizeof msg,
                 "rank %u runs on host '%s', the leader on '%s': CPU ranks share memory, so a CPU group lives on one "
                 "host (GPU ranks with NCCL can span hosts)",
                 j->rank, j->host, g->host);
    if (msg[0]) {
        SD_ERROR("group: refused a join: %s", msg);
        send_error_to(g, m->identity, m->identity_len, SPECD__CODE__CODE_REFUSED, msg);
        return SD_ERR_INVALID_ARG;
    }
    rank_peer *pr = &g->peers[j->rank];
    if (pr->joined) {
        snprintf(msg, sizeof msg, "rank %u has already joined (pid %d); a second one is refused", j->rank,
                 (int)pr->pid);
        SD_WARN("group: %s", msg);
        send_error_to(g, m->identity, m->identity_len, SPECD__CODE__CODE_REFUSED, msg);
        return SD_OK;
    }
    pr->joined = true;
    memcpy(pr->ident, m->identity, m->identity_len);
    pr->ident_len = m->identity_len;
    pr->last_recv = sd_now();
    pr->pid = (int32_t)j->pid;
    pr->same_host = strcmp(j->host, g->host) == 0 && j->pid_ns != 0 && j->pid_ns == g->pid_ns;
    SD_INFO("group: rank %u joined (pid %u on %s, %.1f MB of weights)", j->rank, j->pid, j->host,
            (double)j->weight_bytes / 1e6);
    return SD_OK;
}

/* Start-up phases on the caller's thread: receives and answers until
 * `done` says every rank is there, with heartbeats both ways. Joins are
 * taken in phase 0 only. */
typedef enum { PHASE_JOIN, PHASE_READY } start_phase;

static bool phase_done(const sd_group *g, start_phase ph) {
    for (int32_t r = 1; r < g->p.size; r++)
        if (!(ph == PHASE_JOIN ? g->peers[r].joined : g->peers[r].ready)) return false;
    return true;
}

/* One message from the group socket: 0 when drained; 1 with *m filled (the
 * caller clears it), *env the decoded message or NULL after a warning for a
 * bad one, *rank the sender's rank (-1: not a member yet). A message from a
 * member refreshes its liveness. */
static int recv_rank(sd_group *g, sd_net_msg *m, Specd__RankToLeader **env, int32_t *rank) {
    for (;;) {
        memset(m, 0, sizeof *m);
        errno = 0;
        sd_status st = sd_net_recv(g->router, true, true, m);
        if (st == SD_OK) break;
        sd_net_msg_clear(m);
        if (st == SD_ERR_NET && errno == EAGAIN) return 0;
    }
    Specd__Code code;
    char err[256];
    *rank = rank_of(g, m->identity, m->identity_len);
    *env = sd_net_decode_rank(m->body, m->body_len, &code, err, sizeof err);
    if (!*env) {
        SD_WARN("group: bad message from rank %d (%s): %s", (int)*rank, sd_net_code_name(code), err);
        return 1;
    }
    if (*rank > 0) g->peers[*rank].last_recv = sd_now();
    return 1;
}

static sd_status wait_phase(sd_group *g, start_phase ph) {
    double deadline = sd_now() + g->p.join_timeout_ms / 1e3;
    double dead_after = g->p.heartbeat_interval_ms * (double)g->p.liveness / 1e3;
    /* opening the collectives (NCCL's init) and the pool is not heartbeated:
     * while ranks do that, only a process that is gone counts */
    if (ph == PHASE_READY && dead_after < g->p.coll_timeout_ms / 1e3) dead_after = g->p.coll_timeout_ms / 1e3;
    while (!phase_done(g, ph)) {
        zmq_pollitem_t items[2] = {{g->router, 0, ZMQ_POLLIN, 0}, {NULL, g->p.stop_fd, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, g->p.stop_fd >= 0 ? 2 : 1, g->p.heartbeat_interval_ms);
        if (rc < 0 && zmq_errno() != EINTR) {
            SD_ERROR("group: zmq_poll: %s", zmq_strerror(zmq_errno()));
            return SD_ERR_NET;
        }
        if (g->p.stop_fd >= 0 && sd_group_readable(g->p.stop_fd, items[1].revents)) {
            SD_INFO("group: stop requested while the group was forming");
            return SD_ERR_ABORTED;
        }
        while (rc > 0 && (items[0].revents & ZMQ_POLLIN)) {
            sd_net_msg m;
            Specd__RankToLeader *env;
            int32_t r;
            if (recv_rank(g, &m, &env, &r) == 0) break;
            if (!env) {
                sd_net_msg_clear(&m);
                continue;
            }
            sd_status fatal = SD_OK;
            switch (env->body_case) {
            case SPECD__RANK_TO_LEADER__BODY_JOIN:
                if (ph == PHASE_JOIN && r < 0) {
                    fatal = on_join(g, &m, env->join);
                } else {
                    send_error_to(g, m.identity, m.identity_len, SPECD__CODE__CODE_REFUSED,
                                  "the group is already set up: joins are closed");
                    if (r > 0) {
                        SD_ERROR("group: rank %d joined again while the group was being set up", (int)r);
                        fatal = SD_ERR_ABORTED;
                    }
                }
                break;
            case SPECD__RANK_TO_LEADER__BODY_READY:
                if (r > 0 && ph == PHASE_READY) {
                    g->peers[r].ready = true;
                    SD_DEBUG("group: rank %d ready", (int)r);
                }
                break;
            case SPECD__RANK_TO_LEADER__BODY_HEARTBEAT: break;
            case SPECD__RANK_TO_LEADER__BODY_ERROR:
                SD_ERROR("group: rank %d cannot join: %s: %s", (int)r, sd_net_code_name(env->error->code),
                         env->error->message);
                if (r > 0) fatal = SD_ERR_ABORTED;
                break;
            default: SD_WARN("group: rank message %d ignored while forming", (int)env->body_case); break;
            }
            specd__rank_to_leader__free_unpacked(env, NULL);
            sd_net_msg_clear(&m);
            if (fatal != SD_OK) return fatal;
        }
        double now = sd_now();
        if (now - g->last_beat >= g->p.heartbeat_interval_ms / 1e3) heartbeat_ranks(g);
        /* a rank that died before the group formed makes room for its
         * replacement while joins are open, and fails the set-up after */
        for (int32_t r = 1; r < g->p.size; r++) {
            rank_peer *pr = &g->peers[r];
            if (!pr->joined) continue;
            bool gone = (pr->same_host && sd_group_pid_gone(pr->pid)) || now - pr->last_recv > dead_after;
            if (!gone) continue;
            if (ph != PHASE_JOIN) {
                SD_ERROR("group: rank %d (pid %d) died or went silent during set-up", (int)r, (int)pr->pid);
                return SD_ERR_ABORTED;
            }
            SD_WARN("group: rank %d (pid %d) died or went silent before the group formed; waiting for another", (int)r,
                    (int)pr->pid);
            memset(pr, 0, sizeof *pr);
        }
        if (now > deadline) {
            char missing[256] = "";
            size_t len = 0;
            for (int32_t r = 1; r < g->p.size && len < sizeof missing; r++)
                if (!(ph == PHASE_JOIN ? g->peers[r].joined : g->peers[r].ready))
                    len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", (int)r);
            SD_ERROR("group: rank(s)%s did not %s within %d s (at %s)", missing,
                     ph == PHASE_JOIN ? "join" : "get ready", g->p.join_timeout_ms / 1000, g->p.addr);
            return SD_ERR_TIMEOUT;
        }
    }
    return SD_OK;
}

/* The group thread: forwards plans, heartbeats, watches the ranks. */
static void *group_main(void *arg) {
    sd_group *g = arg;
    bool stop_sent = false;
    char why[SD_GROUP_REASON_MAX];
    for (int32_t r = 1; r < g->p.size; r++) g->peers[r].last_recv = sd_now();
    for (;;) {
        double until = g->p.heartbeat_interval_ms / 1e3 - (sd_now() - g->last_beat);
        long timeout_ms = until > 0 ? (long)(until * 1e3) + 1 : 0;
        zmq_pollitem_t items[4] = {
            {g->router, 0, ZMQ_POLLIN, 0},
            {g->plan_in, 0, ZMQ_POLLIN, 0},
            {NULL, g->quit_fd, ZMQ_POLLIN, 0},
            {NULL, g->down_fd, ZMQ_POLLIN, 0},
        };
        int rc = zmq_poll(items, stop_sent ? 3 : 4, timeout_ms);
        if (rc < 0 && zmq_errno() != EINTR) {
            SD_ERROR("group: zmq_poll: %s", zmq_strerror(zmq_errno()));
            sd_group_fail(g, "the group thread's poll failed");
            break;
        }
        if (rc > 0 && sd_group_readable(g->quit_fd, items[2].revents)) break;
        bool down = atomic_load(&g->down);
        if (down && !stop_sent) {
            stop_ranks(g, g->reason, false);
            stop_sent = true;
        }
        /* plans from the forward: to every rank (dropped once down) */
        while (rc > 0 && (items[1].revents & ZMQ_POLLIN)) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, g->plan_in, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            for (int32_t r = 1; r < g->p.size && !down; r++) {
                const rank_peer *pr = &g->peers[r];
                if (send_bytes(g->router, pr->ident, pr->ident_len, zmq_msg_data(&msg), zmq_msg_size(&msg)) != SD_OK) {
                    snprintf(why, sizeof why, "the plan could not be sent to rank %d (%s)", (int)r,
                             zmq_strerror(zmq_errno()));
                    sd_group_fail(g, why);
                    down = true;
                }
            }
            zmq_msg_close(&msg);
        }
        /* the ranks */
        while (rc > 0 && (items[0].revents & ZMQ_POLLIN)) {
            sd_net_msg m;
            Specd__RankToLeader *env;
            int32_t r;
            if (recv_rank(g, &m, &env, &r) == 0) break;
            if (env) {
                switch (env->body_case) {
                case SPECD__RANK_TO_LEADER__BODY_HEARTBEAT:
                case SPECD__RANK_TO_LEADER__BODY_READY: break;
                case SPECD__RANK_TO_LEADER__BODY_ERROR:
                    snprintf(why, sizeof why, "rank %d failed: %s", (int)r, env->error->message);
                    if (r > 0) sd_group_fail(g, why);
                    break;
                case SPECD__RANK_TO_LEADER__BODY_JOIN:
                    send_error_to(g, m.identity, m.identity_len, SPECD__CODE__CODE_REFUSED,
                                  "the group is running: joins are closed (it is restarted as a whole)");
                    if (env->join->rank < (uint32_t)g->p.size && g->peers[env->join->rank].joined) {
                        snprintf(why, sizeof why, "rank %u joined again (pid %u): it restarted, its KV pool is empty",
                                 env->join->rank, env->join->pid);
                        sd_group_fail(g, why);
                    }
                    break;
                default: SD_WARN("group: rank message %d ignored", (int)env->body_case); break;
                }
                specd__rank_to_leader__free_unpacked(env, NULL);
            }
            sd_net_msg_clear(&m);
        }
        if (sd_now() - g->last_beat >= g->p.heartbeat_interval_ms / 1e3) {
            if (!atomic_load(&g->down)) {
                heartbeat_ranks(g);
                if (!ranks_alive(g, why, sizeof why)) sd_group_fail(g, why);
            } else {
                g->last_beat = sd_now();
            }
        }
    }
    if (!atomic_load(&g->down)) stop_ranks(g, "the leader stops", true);
    return NULL;
}

static void leader_free(sd_group *g) {
    if (g->thread_started) {
        eventfd_signal(g->quit_fd);
        pthread_join(g->thread, NULL);
    }
    sd_net_close(&g->plan_out);
    sd_net_close(&g->plan_in);
    sd_net_close(&g->router);
    sd_zap_stop(&g->zap);
    if (g->coll) {
        if (atomic_load(&g->down)) sd_coll_abort(g->coll);
        sd_coll_close(&g->coll);
    }
    if (g->quit_fd >= 0) close(g->quit_fd);
    if (g->down_fd >= 0) close(g->down_fd);
    pthread_mutex_destroy(&g->mu);
    free(g->peers);
    free(g->pack);
    free(g);
}

void sd_group_close(sd_group **pg) {
    if (!pg || !*pg) return;
    leader_free(*pg);
    *pg = NULL;
}

/* The security of the ranks' link: with keys, a ZAP handler admitting the
 * rank keys only; without, a loopback address, and never an NCCL id (a
 * secret of the group: whoever holds it can join the communicator) unless
 * --insecure says the network is trusted. */
static sd_status group_curve(sd_group *g, sd_net_socket_params *sp) {
    const sd_group_params *p = &g->p;
    bool keyed = p->curve && p->curve->on;
    if (!keyed) {
        SD_TRY(sd_curve_bind_check(p->addr, false, p->insecure, "--group"));
        if (p->device >= 0 && !p->insecure) {
            SD_ERROR("group: the NCCL id travels only on an encrypted link: give the group keys (--curve-secret, "
                     "--rank-keys on the leader) or --insecure");
            return SD_ERR_INVALID_ARG;
        }
        return SD_OK;
    }
    if (!p->rank_keys) {
        SD_ERROR("group: CurveZMQ on the group link needs the ranks' allow-list (--rank-keys)");
        return SD_ERR_INVALID_ARG;
    }
    g->zap_domain = (sd_zap_domain){SD_ZAP_DOMAIN_GROUP, p->rank_keys};
    SD_TRY(sd_zap_start(g->zctx, &g->zap_domain, 1, &g->zap));
    sp->curve_server_secret = p->curve->secret;
    sp->zap_domain = SD_ZAP_DOMAIN_GROUP;
    return SD_OK;
}

/* The rendezvous of the collectives, sent to every rank, then this end. */
static sd_status setup_collectives(sd_group *g) {
    char shm_name[96] = "";
    uint8_t nccl_id[SD_GROUP_NCCL_ID_MAX];
    size_t id_len = 0;
    uint32_t salt = 0;
    if (getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt) salt = (uint32_t)(sd_now() * 1e6);
    if (g->p.device < 0) {
        snprintf(shm_name, sizeof shm_name, "specd-tp-%d-%08x", (int)getpid(), salt);
    } else {
        SD_TRY(sd_coll_nccl_unique_id(nccl_id, sizeof nccl_id, &id_len));
    }
    Specd__GroupSetup su = SPECD__GROUP_SETUP__INIT;
    su.generation = salt;
    su.shm_name = shm_name;
    su.nccl_id.data = nccl_id;
    su.nccl_id.len = id_len;
    su.coll_timeout_ms = (uint32_t)g->p.coll_timeout_ms;
    su.coll_max_bytes = g->p.coll_max_bytes;
    su.kv_blocks = (uint32_t)g->p.kv_blocks;
    su.block_size = (uint32_t)g->p.block_size;
    su.window_blocks = (uint32_t)g->p.window_blocks;
    su.heartbeat_interval_ms = (uint32_t)g->p.heartbeat_interval_ms;
    su.heartbeat_liveness = (uint32_t)g->p.liveness;
    su.host = g->host;
    su.pid_ns = g->pid_ns;
    su.pid = (uint32_t)getpid();
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_SETUP;
    env.setup = &su;
    for (int32_t r = 1; r < g->p.size; r++) leader_send(g, r, &env);
    sd_coll_params cp = sd_coll_default_params();
    cp.rank = 0;
    cp.size = g->p.size;
    cp.timeout_ms = g->p.coll_timeout_ms;
    cp.max_bytes = g->p.coll_max_bytes;
    sd_status st = g->p.device < 0 ? sd_coll_shm_open(shm_name, &cp, &g->coll)
                                   : sd_coll_nccl_open(nccl_id, id_len, g->p.device, &cp, &g->coll);
    memset(nccl_id, 0, sizeof nccl_id);
    if (st != SD_OK)
        SD_ERROR("group: the leader could not open the %s collectives: %s", g->p.device < 0 ? "shm" : "nccl",
                 sd_status_str(st));
    return st;
}

sd_status sd_group_leader_start(void *zctx, const sd_group_params *p, sd_group **out) {
    if (!zctx || !out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    SD_TRY(sd_group_check_params(p, true));
    sd_group *g = calloc(1, sizeof *g);
    if (!g) return SD_ERR_NOMEM;
    g->p = *p;
    g->zctx = zctx;
    g->quit_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    g->down_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->down, false);
    g->peers = calloc((size_t)p->size, sizeof *g->peers);
    sd_group_host_name(g->host, sizeof g->host);
    g->pid_ns = sd_group_pid_ns();
    sd_status st = g->quit_fd >= 0 && g->down_fd >= 0 && g->peers ? SD_OK : SD_ERR_NOMEM;
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_ROUTER;
    sp.max_msg_bytes = SD_MIN_MSG_CAP_BYTES; /* ranks send Join, Ready, heartbeats and errors: small */
    if (st == SD_OK) st = group_curve(g, &sp);
    if (st == SD_OK) st = sd_net_socket_open(zctx, &sp, p->addr, NULL, &g->router);
    if (st == SD_OK) {
        SD_INFO("group: leader of %d ranks at %s, waiting for ranks 1..%d to join", (int)p->size, p->addr,
                (int)p->size - 1);
        st = wait_phase(g, PHASE_JOIN);
    }
    if (st == SD_OK) st = setup_collectives(g);
    if (st == SD_OK) st = wait_phase(g, PHASE_READY);
    /* the forward's thread -> the group thread */
    char inproc[64];
    snprintf(inproc, sizeof inproc, "inproc://specd-group-%p", (void *)g);
    sd_net_socket_params pp = sd_net_socket_default_params();
    pp.type = ZMQ_PAIR;
    pp.max_msg_bytes = SD_MAX_GROUP_MSG_BYTES;
    pp.linger_ms = 0;
    if (st == SD_OK) st = sd_net_socket_open(zctx, &pp, inproc, NULL, &g->plan_in);
    if (st == SD_OK) st = sd_net_socket_open(zctx, &pp, NULL, inproc, &g->plan_out);
    if (st == SD_OK) {
        int sndtimeo = p->coll_timeout_ms;
        zmq_setsockopt(g->plan_out, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
        if (pthread_create(&g->thread, NULL, group_main, g) != 0) {
            SD_ERROR("group: cannot start the group thread");
            st = SD_ERR_INTERNAL;
        } else {
            g->thread_started = true;
        }
    }
    if (st != SD_OK) {
        /* tell whoever joined that this group will not be */
        if (g->router) stop_ranks(g, "the leader could not set up the group", false);
        if (g->coll) sd_coll_abort(g->coll);
        leader_free(g);
        return st;
    }
    SD_INFO("group: %d ranks ready, %s collectives", (int)p->size, sd_coll_kind(g->coll));
    *out = g;
    return SD_OK;
}

sd_status sd_group_plan(void *group, const sd_model_plan *plan) {
    sd_group *g = group;
    if (!g || !plan) return SD_ERR_INVALID_ARG;
    if (atomic_load(&g->down)) {
        SD_ERROR("group: down (%s): no forward can run", g->reason);
        return SD_ERR_ABORTED;
    }
    Specd__GroupPlan gp = SPECD__GROUP_PLAN__INIT;
    gp.step = ++g->steps;
    gp.n_tokens = gp.n_pos = gp.n_bt_off = (size_t)plan->n_tokens;
    gp.tokens = (int32_t *)plan->tokens; /* read only: packing never writes them */
    gp.pos = (int32_t *)plan->pos;
    gp.bt_off = (int32_t *)plan->bt_off;
    gp.n_bt = (size_t)plan->n_bt;
    gp.bt = (int32_t *)plan->bt;
    gp.n_wanted = (size_t)plan->n_wanted;
    gp.wanted = (int32_t *)plan->wanted;
    gp.n_bt_win = plan->bt_win ? (size_t)plan->n_bt : 0; /* the window group's tables (model_window.c) */
    gp.bt_win = (int32_t *)plan->bt_win;
    Specd__LeaderToRank env = SPECD__LEADER_TO_RANK__INIT;
    env.body_case = SPECD__LEADER_TO_RANK__BODY_PLAN;
    env.plan = &gp;
    size_t len = specd__leader_to_rank__get_packed_size(&env);
    if (len > SD_MAX_GROUP_MSG_BYTES) {
        SD_ERROR("group: a plan of %d rows packs to %zu bytes, over the link's %d", (int)plan->n_tokens, len,
                 SD_MAX_GROUP_MSG_BYTES);
        return SD_ERR_RANGE;
    }
    if (len > g->cap_pack) {
        uint8_t *b = realloc(g->pack, len);
        if (!b) return SD_ERR_NOMEM;
        g->pack = b;
        g->cap_pack = len;
    }
    specd__leader_to_rank__pack(&env, g->pack);
    if (zmq_send(g->plan_out, g->pack, len, 0) < 0) {
        SD_ERROR("group: cannot hand a plan to the group thread: %s", zmq_strerror(zmq_errno()));
        return SD_ERR_NET;
    }
    return SD_OK;
}
