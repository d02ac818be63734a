/* group.c — the control plane of a tensor-parallel verifier group
 * (group.h; the messages are the Group* ones of proto/specd.proto).
 *
 * Start-up. The leader binds the group socket (ROUTER); each rank loads its
 * shard, connects (DEALER) and sends GroupJoin. The leader checks every join
 * against itself (protocol, group size, model identity, LM head mode, CPU or
 * GPU, one host for shared memory) and, once every rank has joined, makes
 * the collectives' rendezvous — a fresh shared-memory segment name, or a
 * NCCL unique id (a secret of the group: it travels only in GroupSetup and
 * is never logged) — and sends each rank GroupSetup with it and the KV pool
 * shape. Every rank opens the collectives and its pool and answers
 * GroupReady; the leader opens its own end meanwhile. Only then does
 * specd-verifier register the leader with the coordinator, so the service
 * never sees a half-built group.
 *
 * Running. The model's forward on the leader calls sd_group_plan with each
 * plan (rows, positions, the leader's block tables, wanted rows): it is
 * packed once and handed over an inproc PAIR to the group thread, which
 * owns the ROUTER and forwards the bytes to every rank. Ranks run the plan
 * on their shard (sd_model_forward_plan) and meet the leader in the
 * collectives. Heartbeats go both ways every interval, from threads that
 * never compute (a rank's socket thread, the leader's group thread), so a
 * long forward is never mistaken for a hang; libzmq's own ZMTP heartbeats
 * would be answered by its I/O thread even in a stopped process.
 *
 * Failure. The group goes down when a rank is silent for `liveness`
 * intervals (dead or SIGSTOPped), when a rank's process is gone (checked
 * every interval when it runs on the leader's host: a SIGKILL is seen in one
 * interval rather than the liveness period), when a rank reports an error,
 * when a rank joins again (it restarted, so its pool is empty), or when a
 * forward fails on the leader. Going down aborts the collectives (so a
 * forward blocked in one returns at once), tells every rank (GroupStop), and
 * makes the down fd readable: the worker loop then reports the verifier
 * unavailable to the coordinator, which keeps every request's committed
 * tokens, and the process exits for its supervisor (specd-launch) to restart
 * the whole group. A rank whose leader is silent, gone or says stop aborts
 * its collectives and exits likewise. A group is never repaired in place:
 * the survivors' KV pools would no longer match, and the coordinator
 * already re-prefills every request on a fresh verifier.
 *
 * Rejected: sending plans through the collectives (a broadcast per step) —
 * it needs the group healthy to even tell the ranks to stop, and on NCCL it
 * would mean device copies of host arrays; letting ranks mirror the
 * leader's KV bookkeeping — block tables in the plan make ranks stateless
 * apart from their pools, so they cannot drift.
 *
 * Files: group.c (parameters and what both sides use), group_leader.c (the
 * leader: joins, setup, the group thread, plan fan-out), group_rank.c (a
 * rank: join, setup, the serve loop); group_impl.h between them. */
#include "group_impl.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

sd_group_params sd_group_default_params(void) {
    sd_group_params p;
    memset(&p, 0, sizeof p);
    p.device = -1;
    p.heartbeat_interval_ms = SD_GROUP_HEARTBEAT_MS;
    p.liveness = SD_GROUP_LIVENESS;
    p.join_timeout_ms = 600000;
    p.coll_timeout_ms = 10000;
    p.coll_max_bytes = (size_t)1 << 20;
    p.stop_fd = -1;
    return p;
}

void sd_group_host_name(char *out, size_t n) {
    if (gethostname(out, n - 1) != 0) snprintf(out, n, "localhost");
    out[n - 1] = 0;
}

/* Inode of this process's pid namespace (0 when unknown). */
uint64_t sd_group_pid_ns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* True when process pid (in our pid namespace) no longer runs: gone, or a
 * zombie its parent has not reaped yet. */
bool sd_group_pid_gone(int32_t pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

bool sd_group_readable(int fd, short revents) { return fd >= 0 && (revents & (POLLIN | POLLERR | POLLHUP)); }

void sd_group_identity_init(Specd__ModelIdentity *id, const sd_model_identity *m) {
    specd__model_identity__init(id);
    id->architecture = (char *)m->architecture;
    id->vocab_size = m->vocab_size;
    id->vocab_hash = m->vocab_hash;
    id->context_length = m->context_length;
    id->name = (char *)m->name;
    id->n_layers = m->n_layers;
}

sd_status sd_group_check_params(const sd_group_params *p, bool leader) {
    if (!p || !p->addr || p->size < 2 || p->size > SD_MAX_GROUP_SIZE || p->rank < 0 || p->rank >= p->size ||
        (leader != (p->rank == 0)) || p->heartbeat_interval_ms <= 0 || p->liveness <= 0 || p->join_timeout_ms <= 0 ||
        p->coll_timeout_ms <= 0 || p->coll_max_bytes < 64 ||
        (leader &&
         (p->kv_blocks <= 0 || p->block_size <= 0 || p->window_blocks < 0 || p->window_blocks > p->kv_blocks))) {
        SD_ERROR("group: bad parameters (an address, 2 <= size <= %d, the right rank, positive timings%s)",
                 SD_MAX_GROUP_SIZE, leader ? ", the KV pool shape" : "");
        return SD_ERR_INVALID_ARG;
    }
    return SD_OK;
}
