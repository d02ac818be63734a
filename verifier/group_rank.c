/* group_rank.c — a rank of a tensor-parallel verifier group (rank >= 1):
 * joins the leader, opens the collectives and its KV pool from the leader's
 * setup, then runs the leader's plans on its shard until the group ends.
 * One thread keeps the socket (heartbeats both ways, the leader's liveness);
 * a compute thread runs the plans, so a long forward never looks like a
 * hang. See group.c for the whole protocol. */
#include "group_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

typedef struct rank_state {
    const sd_group_params *p;
    sd_model *m;
    sd_kv *kv;
    void *to_compute;  /* PAIR, the socket thread's end: plans in (pointers), NULL = quit */
    void *from_socket; /* PAIR, the compute thread's end; it answers each plan with its status */
} rank_state;

/* The compute thread: runs plans in order. A plan arrives as a pointer to
 * its decoded envelope, which this thread then owns and frees. */
static void *rank_compute(void *arg) {
    rank_state *rs = arg;
    for (;;) {
        Specd__LeaderToRank *env = NULL;
        int n = zmq_recv(rs->from_socket, &env, sizeof env, 0);
        if (n < 0 && zmq_errno() == EINTR) continue;
        if (n != (int)sizeof env || !env) break;
        const Specd__GroupPlan *gp = env->plan;
        sd_model_plan plan = {
            .n_tokens = (int32_t)gp->n_tokens,
            .tokens = gp->tokens,
            .pos = gp->pos,
            .bt_off = gp->bt_off,
            .n_bt = (int32_t)gp->n_bt,
            .bt = gp->bt,
            .n_wanted = (int32_t)gp->n_wanted,
            .wanted = gp->wanted,
            .bt_win = gp->n_bt_win > 0 ? gp->bt_win : NULL, /* as many as bt (net/validate.c) */
        };
        int32_t st = (int32_t)sd_model_forward_plan(rs->m, rs->kv, &plan);
        if (st != SD_OK) SD_ERROR("group: plan %llu failed: %s", (unsigned long long)gp->step, sd_status_str(st));
        specd__leader_to_rank__free_unpacked(env, NULL);
        zmq_send(rs->from_socket, &st, sizeof st, 0);
    }
    return NULL;
}

static void rank_send(void *sock, Specd__RankToLeader *env) {
    if (sd_net_send(sock, NULL, 0, &env->base) != SD_OK) SD_DEBUG("group: could not send to the leader");
}

static void rank_heartbeat(void *sock) {
    Specd__Heartbeat hb = SPECD__HEARTBEAT__INIT;
    hb.sent_us = sd_net_now_us();
    Specd__RankToLeader env = SPECD__RANK_TO_LEADER__INIT;
    env.body_case = SPECD__RANK_TO_LEADER__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    rank_send(sock, &env);
}

static void rank_error(void *sock, Specd__Code code, const char *msg) {
    Specd__Error e;
    sd_net_error_init(&e, code, 0, 0, msg);
    Specd__RankToLeader env = SPECD__RANK_TO_LEADER__INIT;
    env.body_case = SPECD__RANK_TO_LEADER__BODY_ERROR;
    env.error = &e;
    rank_send(sock, &env);
}

/* The leader's setup: collectives, KV pool, then Ready. */
static sd_status rank_setup(const sd_group_params *p, sd_model *m, const Specd__GroupSetup *su, sd_coll **coll,
                            sd_kv **kv) {
    sd_coll_params cp = sd_coll_default_params();
    cp.rank = p->rank;
    cp.size = p->size;
    cp.timeout_ms = (int32_t)su->coll_timeout_ms;
    cp.max_bytes = (size_t)su->coll_max_bytes;
    bool nccl = su->nccl_id.len > 0;
    if (nccl != (p->device >= 0)) {
        SD_ERROR("group: the leader set up %s collectives for a rank on %s", nccl ? "NCCL" : "shared-memory",
                 p->device >= 0 ? "a GPU" : "the CPU");
        return SD_ERR_INVALID_ARG;
    }
    sd_status st = nccl ? sd_coll_nccl_open(su->nccl_id.data, su->nccl_id.len, p->device, &cp, coll)
                        : sd_coll_shm_open(su->shm_name, &cp, coll);
    if (st != SD_OK) return st;
    st = sd_model_set_coll(m, *coll);
    if (st == SD_OK)
        st =
            sd_model_kv_create_rank(m, (int32_t)su->kv_blocks, (int32_t)su->block_size, (int32_t)su->window_blocks, kv);
    if (st != SD_OK) {
        sd_model_set_coll(m, NULL);
        sd_coll_abort(*coll);
        sd_coll_close(coll);
    }
    return st;
}

/* One rank's run: what the three phases share. */
typedef struct rank_run {
    const sd_group_params *p;
    sd_model *m;
    sd_net_limits lim;
    void *sock;    /* DEALER to the leader */
    void *monitor; /* its handshakes, until the group forms */
    int handshake_failures;
    char host[64];
    int interval_ms, liveness;
    double last_recv, last_beat;
    sd_group_exit *why;
} rank_run;

/* Sends GroupJoin: who this rank is and what it holds. */
static void rank_join(rank_run *r) {
    const sd_group_params *p = r->p;
    Specd__ModelIdentity id;
    sd_group_identity_init(&id, &p->model);
    Specd__GroupJoin j = SPECD__GROUP_JOIN__INIT;
    j.protocol_version = SD_PROTOCOL_VERSION;
    j.rank = (uint32_t)p->rank;
    j.group_size = (uint32_t)p->size;
    j.group_id = p->group_id;
    j.model = &id;
    j.lm_head = (uint32_t)p->lm_head;
    j.cuda = p->device >= 0;
    j.host = r->host;
    j.pid_ns = sd_group_pid_ns();
    j.pid = (uint32_t)getpid();
    j.weight_bytes = p->weight_bytes;
    Specd__RankToLeader jenv = SPECD__RANK_TO_LEADER__INIT;
    jenv.body_case = SPECD__RANK_TO_LEADER__BODY_JOIN;
    jenv.join = &j;
    rank_send(r->sock, &jenv);
    SD_INFO("group: rank %d of %d: joining the leader at %s", (int)p->rank, (int)p->size, p->addr);
}

/* Reads one message from the leader before the setup. Returns the setup
 * (caller frees) when it came; sets *st to SD_ERR_ABORTED when the leader
 * refused or stopped the group (said in *r->why). */
static Specd__LeaderToRank *before_setup(rank_run *r, sd_status *st, bool *got) {
    *got = false;
    sd_net_msg msg;
    memset(&msg, 0, sizeof msg);
    errno = 0;
    if (sd_net_recv(r->sock, false, true, &msg) != SD_OK) {
        sd_net_msg_clear(&msg);
        return NULL;
    }
    *got = true;
    Specd__Code code;
    char err[256];
    Specd__LeaderToRank *env = sd_net_decode_leader(msg.body, msg.body_len, &r->lim, &code, err, sizeof err);
    sd_net_msg_clear(&msg);
    if (!env) {
        SD_WARN("group: bad message from the leader (%s): %s", sd_net_code_name(code), err);
        return NULL;
    }
    r->last_recv = sd_now();
    switch (env->body_case) {
    case SPECD__LEADER_TO_RANK__BODY_SETUP: return env;
    case SPECD__LEADER_TO_RANK__BODY_HEARTBEAT: break;
    case SPECD__LEADER_TO_RANK__BODY_ERROR:
        SD_ERROR("group: the leader refused rank %d: %s", (int)r->p->rank, env->error->message);
        *r->why = SD_GROUP_REFUSED;
        *st = SD_ERR_ABORTED;
        break;
    case SPECD__LEADER_TO_RANK__BODY_STOP:
        SD_WARN("group: the leader stopped the group before it formed: %s", env->stop->reason);
        *r->why = env->stop->clean ? SD_GROUP_STOPPED : SD_GROUP_DOWN;
        *st = SD_ERR_ABORTED;
        break;
    default: SD_WARN("group: leader message %d before the setup, ignored", (int)env->body_case); break;
    }
    specd__leader_to_rank__free_unpacked(env, NULL);
    return NULL;
}

/* Phase 1: waits for GroupSetup, heartbeating (the leader may wait for
 * slower ranks). Returns it (caller frees), or NULL with *st set:
 * SD_ERR_ABORTED when refused / stopped / down (said in *r->why). */
static Specd__LeaderToRank *wait_setup(rank_run *r, sd_status *st) {
    const sd_group_params *p = r->p;
    double deadline = sd_now() + p->join_timeout_ms / 1e3;
    bool heard = false;
    Specd__LeaderToRank *setup = NULL;
    r->last_recv = 0;
    r->last_beat = sd_now();
    *st = SD_OK;
    while (!setup && *st == SD_OK) {
        zmq_pollitem_t items[3] = {
            {r->sock, 0, ZMQ_POLLIN, 0}, {r->monitor, 0, ZMQ_POLLIN, 0}, {NULL, p->stop_fd, ZMQ_POLLIN, 0}};
        int n_items = r->monitor ? 2 : 1;
        if (p->stop_fd >= 0) {
            if (!r->monitor) items[1] = items[2];
            n_items++;
        }
        int rc = zmq_poll(items, n_items, r->interval_ms);
        if (rc < 0 && zmq_errno() != EINTR) {
            *st = SD_ERR_NET;
            break;
        }
        char refused[256];
        sd_net_handshake hs = r->monitor && (items[1].revents & ZMQ_POLLIN)
                                  ? sd_net_monitor_read(r->monitor, refused, sizeof refused)
                                  : SD_NET_HANDSHAKE_NONE;
        if (hs == SD_NET_HANDSHAKE_OK) r->handshake_failures = 0;
        if (hs == SD_NET_HANDSHAKE_REFUSED ||
            (hs == SD_NET_HANDSHAKE_FAILED && ++r->handshake_failures >= SD_NET_HANDSHAKE_TRIES)) {
            SD_ERROR("group: the leader refused this rank: %s", refused);
            *r->why = SD_GROUP_REFUSED;
            *st = SD_ERR_ABORTED;
            break;
        }
        if (!r->monitor) items[2] = items[1];
        if (p->stop_fd >= 0 && sd_group_readable(p->stop_fd, items[2].revents)) {
            *r->why = SD_GROUP_STOPPED;
            *st = SD_ERR_ABORTED;
            break;
        }
        bool got = rc > 0 && (items[0].revents & ZMQ_POLLIN);
        while (got && !setup && *st == SD_OK) {
            setup = before_setup(r, st, &got);
            heard |= got;
        }
        double now = sd_now();
        if (now - r->last_beat >= r->interval_ms / 1e3) {
            rank_heartbeat(r->sock);
            r->last_beat = now;
        }
        if (!setup && *st == SD_OK && !heard && now > deadline) {
            SD_ERROR("group: no answer from the leader at %s within %d s", p->addr, p->join_timeout_ms / 1000);
            *st = SD_ERR_TIMEOUT;
        } else if (!setup && *st == SD_OK && heard && now - r->last_recv > r->interval_ms * (double)r->liveness / 1e3) {
            SD_ERROR("group: the leader went silent for %.1f s before the group formed", now - r->last_recv);
            *st = SD_ERR_ABORTED;
        }
    }
    return setup;
}

/* The leader's process, watched while serving when it runs on this host. */
typedef struct leader_watch {
    bool here;
    int32_t pid;
} leader_watch;

/* Phase 2: collectives and KV pool from the setup (which it frees, wiping
 * the NCCL id), then Ready. */
static sd_status apply_setup(rank_run *r, Specd__LeaderToRank *setup, sd_coll **coll, sd_kv **kv, leader_watch *lw) {
    const sd_group_params *p = r->p;
    const Specd__GroupSetup *su = setup->setup;
    r->interval_ms = (int)su->heartbeat_interval_ms;
    r->liveness = (int)su->heartbeat_liveness;
    lw->here = strcmp(su->host, r->host) == 0 && su->pid_ns != 0 && su->pid_ns == sd_group_pid_ns();
    lw->pid = (int32_t)su->pid;
    sd_status st = rank_setup(p, r->m, su, coll, kv);
    if (st == SD_OK)
        SD_INFO("group: rank %d set up: %s collectives, KV pool of %u blocks x %u tokens (%u window blocks)",
                (int)p->rank, sd_coll_kind(*coll), su->kv_blocks, su->block_size, su->window_blocks);
    /* the NCCL id is a secret of the group: wipe the decoded copy */
    if (su->nccl_id.data) memset(su->nccl_id.data, 0, su->nccl_id.len);
    specd__leader_to_rank__free_unpacked(setup, NULL);
    if (st != SD_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "rank %d could not set up its collectives or KV pool: %s", (int)p->rank,
                 sd_status_str(st));
        rank_error(r->sock, SPECD__CODE__CODE_INTERNAL, msg);
        return st;
    }
    Specd__GroupReady ready = SPECD__GROUP_READY__INIT;
    ready.rank = (uint32_t)p->rank;
    Specd__RankToLeader renv = SPECD__RANK_TO_LEADER__INIT;
    renv.body_case = SPECD__RANK_TO_LEADER__BODY_READY;
    renv.ready = &ready;
    rank_send(r->sock, &renv);
    return SD_OK;
}

/* The serve loop's tallies and its end. */
typedef struct serve_state {
    rank_state rs;
    uint64_t plans, done;
    char reason[SD_GROUP_REASON_MAX];
    bool clean;
} serve_state;

/* Takes the statuses of finished plans; a failed one ends the loop. */
static void take_statuses(rank_run *r, serve_state *s) {
    while (!s->reason[0]) {
        int32_t status;
        if (zmq_recv(s->rs.to_compute, &status, sizeof status, ZMQ_DONTWAIT) != (int)sizeof status) break;
        s->done++;
        if (status != SD_OK) {
            snprintf(s->reason, sizeof s->reason, "rank %d: plan %llu failed here: %s", (int)r->p->rank,
                     (unsigned long long)s->done, sd_status_str((sd_status)status));
            rank_error(r->sock, SPECD__CODE__CODE_INTERNAL, s->reason);
        }
    }
}

/* Reads the leader's messages: plans go to the compute thread; a stop, an
 * error or an unreadable message ends the loop. */
static void take_messages(rank_run *r, serve_state *s) {
    while (!s->reason[0]) {
        sd_net_msg msg;
        memset(&msg, 0, sizeof msg);
        if (sd_net_recv(r->sock, false, true, &msg) != SD_OK) {
            sd_net_msg_clear(&msg);
            break;
        }
        Specd__Code code;
        char err[256];
        Specd__LeaderToRank *env = sd_net_decode_leader(msg.body, msg.body_len, &r->lim, &code, err, sizeof err);
        sd_net_msg_clear(&msg);
        if (!env) {
            /* a plan it cannot read would leave the collectives out of step */
            snprintf(s->reason, sizeof s->reason, "rank %d: unreadable message from the leader (%s): %s",
                     (int)r->p->rank, sd_net_code_name(code), err);
            rank_error(r->sock, code, s->reason);
            break;
        }
        r->last_recv = sd_now();
        switch (env->body_case) {
        case SPECD__LEADER_TO_RANK__BODY_PLAN:
            if (zmq_send(s->rs.to_compute, &env, sizeof env, 0) == (int)sizeof env) {
                env = NULL; /* the compute thread owns it now */
                s->plans++;
            } else {
                snprintf(s->reason, sizeof s->reason, "rank %d: cannot queue a plan", (int)r->p->rank);
            }
            break;
        case SPECD__LEADER_TO_RANK__BODY_HEARTBEAT: break;
        case SPECD__LEADER_TO_RANK__BODY_STOP:
            snprintf(s->reason, sizeof s->reason, "the leader stopped the group: %s", env->stop->reason);
            s->clean = env->stop->clean;
            break;
        case SPECD__LEADER_TO_RANK__BODY_ERROR:
            snprintf(s->reason, sizeof s->reason, "the leader reports %s: %s", sd_net_code_name(env->error->code),
                     env->error->message);
            break;
        default: SD_WARN("group: leader message %d ignored", (int)env->body_case); break;
        }
        if (env) specd__leader_to_rank__free_unpacked(env, NULL);
    }
}

/* Phase 3: this thread keeps the socket (heartbeats, the leader's liveness),
 * the compute thread runs plans, until something ends the group. */
static void serve(rank_run *r, serve_state *s, const leader_watch *lw) {
    const sd_group_params *p = r->p;
    r->last_recv = sd_now();
    r->last_beat = 0;
    for (;;) {
        double until = r->interval_ms / 1e3 - (sd_now() - r->last_beat);
        long timeout_ms = until > 0 ? (long)(until * 1e3) + 1 : 0;
        zmq_pollitem_t items[3] = {
            {r->sock, 0, ZMQ_POLLIN, 0}, {s->rs.to_compute, 0, ZMQ_POLLIN, 0}, {NULL, p->stop_fd, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, p->stop_fd >= 0 ? 3 : 2, timeout_ms);
        if (rc < 0 && zmq_errno() != EINTR) {
            snprintf(s->reason, sizeof s->reason, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            return;
        }
        if (p->stop_fd >= 0 && rc > 0 && sd_group_readable(p->stop_fd, items[2].revents)) {
            snprintf(s->reason, sizeof s->reason, "stop requested");
            s->clean = true;
            return;
        }
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN)) take_statuses(r, s);
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) take_messages(r, s);
        if (s->reason[0]) return;
        double now = sd_now();
        if (now - r->last_beat >= r->interval_ms / 1e3) {
            rank_heartbeat(r->sock);
            r->last_beat = now;
            if (lw->here && sd_group_pid_gone(lw->pid)) {
                snprintf(s->reason, sizeof s->reason, "the leader (pid %d) exited", (int)lw->pid);
                return;
            }
            if (now - r->last_recv > r->interval_ms * (double)r->liveness / 1e3) {
                snprintf(s->reason, sizeof s->reason, "the leader has been silent for %.1f s: dead or hung",
                         now - r->last_recv);
                return;
            }
        }
    }
}

/* Phase 3 with its compute thread: starts it, serves, and stops it. */
static sd_status serve_with_compute(void *zctx, rank_run *r, sd_coll *coll, sd_kv *kv, const leader_watch *lw) {
    const sd_group_params *p = r->p;
    serve_state s;
    memset(&s, 0, sizeof s);
    s.rs = (rank_state){.p = p, .m = r->m, .kv = kv};
    char inproc[64];
    snprintf(inproc, sizeof inproc, "inproc://specd-rank-%p", (void *)&s.rs);
    sd_net_socket_params pp = sd_net_socket_default_params();
    pp.type = ZMQ_PAIR;
    pp.max_msg_bytes = 64;
    pp.linger_ms = 0;
    sd_status st = sd_net_socket_open(zctx, &pp, inproc, NULL, &s.rs.to_compute);
    if (st == SD_OK) st = sd_net_socket_open(zctx, &pp, NULL, inproc, &s.rs.from_socket);
    pthread_t compute;
    bool started = st == SD_OK && pthread_create(&compute, NULL, rank_compute, &s.rs) == 0;
    if (!started && st == SD_OK) st = SD_ERR_INTERNAL;
    if (started) {
        serve(r, &s, lw);
        if (s.clean)
            SD_INFO("group: rank %d leaves: %s (%llu plans run)", (int)p->rank, s.reason, (unsigned long long)s.done);
        else
            SD_ERROR("group: rank %d leaves, the group is down: %s (%llu of %llu plans run)", (int)p->rank, s.reason,
                     (unsigned long long)s.done, (unsigned long long)s.plans);
        /* a forward waiting in a collective returns now; then the compute
         * thread takes the quit marker (after any plans still queued,
         * which fail at once on the aborted group) */
        sd_coll_abort(coll);
        Specd__LeaderToRank *quit = NULL;
        zmq_send(s.rs.to_compute, &quit, sizeof quit, 0);
        pthread_join(compute, NULL);
    }
    *r->why = s.clean ? SD_GROUP_STOPPED : SD_GROUP_DOWN;
    sd_net_close(&s.rs.from_socket);
    sd_net_close(&s.rs.to_compute);
    return st;
}

sd_status sd_group_rank_run(void *zctx, const sd_group_params *p, sd_model *m, sd_group_exit *why) {
    if (!zctx || !m || !why) return SD_ERR_INVALID_ARG;
    SD_TRY(sd_group_check_params(p, false));
    *why = SD_GROUP_DOWN;
    rank_run r = {.p = p, .m = m, .why = why, .interval_ms = p->heartbeat_interval_ms, .liveness = p->liveness};
    r.lim = (sd_net_limits){sd_model_config_of(m)->n_vocab, 0, 0, 0, 0};
    sd_net_socket_params sp = sd_net_socket_default_params();
    sp.type = ZMQ_DEALER;
    sp.max_msg_bytes = SD_MAX_GROUP_MSG_BYTES;
    if (p->curve && p->curve->on) {
        sp.curve_server_public = p->curve->server;
        sp.curve_public = p->curve->public_key;
        sp.curve_secret = p->curve->secret;
    }
    sp.monitor = &r.monitor; /* always: a plaintext rank of a keyed leader learns it at once too */
    SD_TRY(sd_net_socket_open(zctx, &sp, NULL, p->addr, &r.sock));
    sd_group_host_name(r.host, sizeof r.host);
    rank_join(&r);

    sd_status st;
    Specd__LeaderToRank *setup = wait_setup(&r, &st);
    sd_net_monitor_close(r.sock, &r.monitor); /* the handshake is over */
    if (!setup) {
        sd_net_close(&r.sock);
        return st == SD_ERR_ABORTED ? SD_OK : st; /* refused / stopped / down: said in *why */
    }
    sd_coll *coll = NULL;
    sd_kv *kv = NULL;
    leader_watch lw;
    st = apply_setup(&r, setup, &coll, &kv, &lw);
    if (st == SD_OK) st = serve_with_compute(zctx, &r, coll, kv, &lw);
    sd_model_set_coll(m, NULL);
    sd_kv_free(&kv);
    sd_coll_close(&coll);
    sd_net_close(&r.sock);
    return st;
}
