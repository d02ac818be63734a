/* coll_shm.c — collectives between CPU ranks (separate processes on one
 * host) over one POSIX shared-memory segment.
 *
 * Segment layout (every rank maps all of it):
 *   header   magic, geometry, creator pid, state, aborted flag, sleepers
 *   ctl[r]   one 128-byte line per rank: its arrival epoch, its join flag, its
 *            pid and the (op, bytes, root) it announced for the current round
 *   data     slots[2][size][chunk]: two sets of per-rank slots, chunk =
 *            max_bytes rounded down to 64 bytes
 *
 * Synchronisation is a generation-counted barrier without a shared counter:
 * rank r "arrives" at epoch e by storing e into its own ctl[r].arrive and
 * waits until every ctl[j].arrive has reached e. Missing ranks are therefore
 * known by name when a wait times out. Waits spin briefly, then yield, then
 * sleep on a futex of the awaited rank's word (shared, not private: the word
 * lives in a MAP_SHARED segment); an arriving rank wakes sleepers only when
 * the header's sleeper count says there are any, so the fast path has no
 * system call. Every wait is bounded by timeout_ms and checks both the local
 * abort flag (sd_coll_abort) and the segment's aborted flag, which a rank
 * sets when it aborts or times out so that the others fail fast. A wait that
 * has gone to sleep also checks every 2 ms whether the awaited rank's process
 * still exists, so a killed rank fails the group in milliseconds rather than
 * after timeout_ms (only between ranks in the same pid namespace: a pid from
 * another container means nothing here).
 *
 * One "round" moves at most one chunk per rank and uses slot set
 * (round & 1). Double buffering is what lets a round get away with a single
 * barrier: a rank may write set s again only in round k+2, after the barrier
 * of round k+1, which every rank reaches only after it finished reading round
 * k. The op metadata is double-buffered the same way and compared after each
 * round's barrier, so ranks calling different collectives (or sizes) get
 * SD_ERR_INVALID_ARG instead of garbage.
 *
 * All-reduce sums in rank order, ((s0 + s1) + s2) + ..., element by element,
 * so every rank computes bit-identical results (the build uses
 * -ffp-contract=off). Small chunks: every rank reduces the whole chunk from
 * all slots into its own buffer (one barrier). Large chunks: rank r reduces
 * its 1/size share into slot[0] of the set, a second barrier, then every rank
 * copies the result (reduce-scatter + all-gather, same sums).
 *
 * Lifetime: rank 0 removes any segment left under the name (a crashed group),
 * creates a fresh one and marks it open; the others attach with a bounded
 * wait and set their join flag. Once every rank has joined, rank 0 marks the
 * group running and unlinks the name right away: the memory lives on until
 * the last rank unmaps it (the last close frees it), and a group that later
 * crashes leaves nothing in /dev/shm. A joiner that attached to a stale
 * segment notices because its name was unlinked (st_nlink == 0) or its
 * creator is dead (same pid namespace), and retries.
 *
 * Rejected: a central arrival counter (contended, and a timeout cannot say who
 * is missing); process-shared pthread barriers (no timeout, no abort, and a
 * dead member wedges them); sockets (a copy and a syscall per hop). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "coll_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

#define SHM_MAGIC   0x5350454443534d31ull /* "SPEDCSM1" */
#define SHM_VERSION 1u
#define CTL_LINE    128 /* two cache lines: no false sharing with the adjacent-line prefetcher */
#define SPIN_NS \
    2000ll                           /* busy-wait (pause) this long: a running peer arrives in ~1 us; longer
                                          * spins cost 3-5x when ranks outnumber cores (measured) */
#define YIELD_NS         500000ll    /* then sched_yield this long: lets a peer sharing this core run */
#define SLEEP_SLICE_NS   2000000ll   /* a futex sleep never exceeds 2 ms: abort and deadline stay prompt */
#define DIRECT_MAX_BYTES (64u << 10) /* up to this per round every rank reduces everything itself */
#define JOIN_POLL_NS     1000000ll

enum { STATE_INIT = 0, STATE_OPEN = 1, STATE_RUNNING = 2 };
enum { OP_BARRIER = 1, OP_ALL_REDUCE, OP_BROADCAST, OP_GATHER };

typedef struct shm_header {
    uint64_t magic;
    uint32_t version;
    int32_t size;
    uint64_t chunk;     /* bytes per slot */
    uint64_t max_bytes; /* as every rank passed it */
    uint64_t total;     /* segment bytes */
    int32_t creator_pid;
    uint64_t pid_ns; /* inode of the creator's /proc/self/ns/pid (0: unknown) */
    _Atomic uint32_t state;
    _Atomic uint32_t aborted;  /* 0, or 1 + the rank that aborted or timed out */
    _Atomic uint32_t sleepers; /* ranks inside a futex wait */
} shm_header;

typedef struct shm_meta {
    uint32_t op;
    int32_t root;
    uint64_t bytes; /* the call's total payload, not the round's */
} shm_meta;

typedef struct shm_ctl {
    _Atomic uint32_t arrive; /* last epoch this rank arrived at */
    _Atomic uint32_t joined;
    shm_meta meta[2]; /* per slot set, written before arriving */
    int32_t pid;      /* the rank's process, written before joining */
    char pad[CTL_LINE - 8 - 2 * sizeof(shm_meta) - sizeof(int32_t)];
} shm_ctl;

_Static_assert(sizeof(shm_ctl) == CTL_LINE, "ctl line size");
_Static_assert(sizeof(shm_header) <= CTL_LINE, "header fits one line");

typedef struct shm_coll {
    sd_coll base;
    char name[64]; /* "/" + the caller's name */
    int fd;
    unsigned char *map; /* the whole segment */
    size_t map_bytes;
    shm_header *hdr;
    shm_ctl *ctl;        /* [size] */
    unsigned char *data; /* slots[2][size][chunk] */
    size_t chunk;
    uint32_t epoch;   /* this rank's last barrier epoch */
    uint32_t round;   /* rounds done: the slot set is round & 1 */
    bool same_pid_ns; /* every rank's pid is meaningful here: liveness checks allowed */
} shm_coll;

static const sd_coll_ops shm_ops;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Identifies this process's pid namespace; pids are only compared (kill(pid, 0))
 * between ranks that share it, so ranks in other containers are never
 * declared dead by mistake. */
static uint64_t pid_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static bool process_gone(bool same_ns, int32_t pid) {
    return same_ns && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ll), (long)(ns % 1000000000ll)};
    nanosleep(&ts, NULL);
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ll), (long)(ns % 1000000000ll)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Epochs wrap; "reached" is a signed distance so the wrap is harmless. */
static bool reached(uint32_t value, uint32_t epoch) { return (int32_t)(value - epoch) >= 0; }

static unsigned char *slot(shm_coll *s, uint32_t set, int32_t rank) {
    return s->data + ((size_t)set * (size_t)s->base.params.size + (size_t)rank) * s->chunk;
}

static size_t segment_bytes(int32_t size, size_t chunk, size_t *data_off) {
    size_t off = (CTL_LINE + (size_t)size * CTL_LINE + 4095) & ~(size_t)4095;
    *data_off = off;
    return off + 2 * (size_t)size * chunk;
}

/* Marks the whole group failed so every rank's waits return promptly. */
static void raise_group_abort(shm_coll *s) {
    uint32_t expected = 0;
    atomic_compare_exchange_strong(&s->hdr->aborted, &expected, (uint32_t)s->base.params.rank + 1u);
    for (int32_t j = 0; j < s->base.params.size; j++) futex_wake_all(&s->ctl[j].arrive);
}

static sd_status aborted_status(shm_coll *s, const char *what) {
    uint32_t by = atomic_load(&s->hdr->aborted);
    if (sd_coll_aborted(&s->base))
        SD_ERROR("coll shm '%s' rank %d: %s aborted", s->name + 1, s->base.params.rank, what);
    else
        SD_ERROR("coll shm '%s' rank %d: %s failed: the group was aborted by rank %u", s->name + 1, s->base.params.rank,
                 what, by - 1);
    return SD_ERR_ABORTED;
}

static bool is_aborted(shm_coll *s) {
    return sd_coll_aborted(&s->base) || atomic_load_explicit(&s->hdr->aborted, memory_order_relaxed) != 0;
}

static sd_status timeout_status(shm_coll *s, const char *what) {
    char missing[256];
    size_t len = 0;
    int n_missing = 0;
    missing[0] = '\0';
    for (int32_t j = 0; j < s->base.params.size; j++) {
        if (reached(atomic_load(&s->ctl[j].arrive), s->epoch)) continue;
        n_missing++;
        if (len + 16 < sizeof missing)
            len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", j);
    }
    SD_ERROR("coll shm '%s' rank %d: %s timed out after %d ms waiting for %d rank(s): %s", s->name + 1,
             s->base.params.rank, what, s->base.params.timeout_ms, n_missing, missing);
    raise_group_abort(s);
    return SD_ERR_TIMEOUT;
}

/* Arrives at the next epoch and waits (bounded) until every rank has. */
static sd_status barrier_wait(shm_coll *s, const char *what) {
    if (is_aborted(s)) return aborted_status(s, what); /* peers may all have arrived already */
    uint32_t e = ++s->epoch;
    int32_t me = s->base.params.rank;
    atomic_store(&s->ctl[me].arrive, e); /* seq_cst: pairs with the sleepers check below */
    if (atomic_load(&s->hdr->sleepers) != 0) futex_wake_all(&s->ctl[me].arrive);
    int64_t start = 0, deadline = 0;
    for (int32_t j = 0; j < s->base.params.size; j++) {
        if (j == me) continue;
        uint32_t polls = 0;
        while (!reached(atomic_load_explicit(&s->ctl[j].arrive, memory_order_acquire), e)) {
            if (is_aborted(s)) return aborted_status(s, what);
            if ((++polls & 63u) != 0) { /* the clock is read every 64 polls */
                cpu_relax();
                continue;
            }
            int64_t t = now_ns();
            if (start == 0) {
                start = t;
                deadline = t + (int64_t)s->base.params.timeout_ms * 1000000ll;
            }
            if (t - start < SPIN_NS) continue;
            if (t >= deadline) return timeout_status(s, what);
            if (t - start < YIELD_NS) {
                sched_yield();
                continue;
            }
            int32_t peer_pid = s->ctl[j].pid;
            if (process_gone(s->same_pid_ns, peer_pid)) {
                SD_ERROR("coll shm '%s' rank %d: %s failed: rank %d (pid %d) has exited", s->name + 1, me, what, j,
                         (int)peer_pid);
                raise_group_abort(s);
                return SD_ERR_TIMEOUT;
            }
            int64_t slice = deadline - t < SLEEP_SLICE_NS ? deadline - t : SLEEP_SLICE_NS;
            atomic_fetch_add(&s->hdr->sleepers, 1);
            uint32_t v = atomic_load(&s->ctl[j].arrive);
            if (!reached(v, e) && !is_aborted(s)) futex_wait(&s->ctl[j].arrive, v, slice);
            atomic_fetch_sub(&s->hdr->sleepers, 1);
        }
    }
    return SD_OK;
}

/* The deadline starts at the first clock read, a few hundred nanoseconds into
 * the wait: the bound is timeout_ms from entering the wait, give or take. */

/* Begins a round: announces (op, bytes, root) in this round's set. */
static uint32_t round_begin(shm_coll *s, uint32_t op, uint64_t bytes, int32_t root) {
    uint32_t set = s->round & 1u;
    shm_meta *m = &s->ctl[s->base.params.rank].meta[set];
    m->op = op;
    m->bytes = bytes;
    m->root = root;
    return set;
}

static const char *op_name(uint32_t op) {
    switch (op) {
    case OP_BARRIER: return "barrier";
    case OP_ALL_REDUCE: return "all_reduce";
    case OP_BROADCAST: return "broadcast";
    case OP_GATHER: return "gather";
    default: return "?";
    }
}

/* After the round's barrier: every rank must have announced the same call. */
static sd_status round_check(shm_coll *s, uint32_t set) {
    const shm_meta *mine = &s->ctl[s->base.params.rank].meta[set];
    for (int32_t j = 0; j < s->base.params.size; j++) {
        const shm_meta *m = &s->ctl[j].meta[set];
        if (m->op != mine->op || m->bytes != mine->bytes || m->root != mine->root) {
            SD_ERROR("coll shm '%s' rank %d: ranks disagree: this rank called %s(%llu bytes, root %d), rank %d "
                     "called %s(%llu bytes, root %d)",
                     s->name + 1, s->base.params.rank, op_name(mine->op), (unsigned long long)mine->bytes, mine->root,
                     j, op_name(m->op), (unsigned long long)m->bytes, m->root);
            raise_group_abort(s);
            return SD_ERR_INVALID_ARG;
        }
    }
    return SD_OK;
}

static void round_end(shm_coll *s) { s->round++; }

/* dst[i] = ((src[0][i] + src[1][i]) + src[2][i]) + ... over every rank. */
static void reduce_rank_order(shm_coll *s, uint32_t set, size_t off, size_t n, float *restrict dst) {
    int32_t size = s->base.params.size;
    const float *restrict a = (const float *)slot(s, set, 0) + off;
    if (size == 1) {
        memcpy(dst, a, n * sizeof(float));
        return;
    }
    const float *restrict b = (const float *)slot(s, set, 1) + off;
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
    for (int32_t j = 2; j < size; j++) {
        const float *restrict c = (const float *)slot(s, set, j) + off;
        for (size_t i = 0; i < n; i++) dst[i] += c[i];
    }
}

static sd_status shm_all_reduce(sd_coll *base, float *buf, size_t n) {
    shm_coll *s = (shm_coll *)base;
    int32_t size = base->params.size, me = base->params.rank;
    size_t per_round = s->chunk / sizeof(float);
    size_t done = 0;
    do {
        size_t m = n - done < per_round ? n - done : per_round;
        uint32_t set = round_begin(s, OP_ALL_REDUCE, (uint64_t)n * sizeof(float), -1);
        memcpy(slot(s, set, me), buf + done, m * sizeof(float));
        SD_TRY(barrier_wait(s, "all_reduce"));
        SD_TRY(round_check(s, set));
        if (m * sizeof(float) <= DIRECT_MAX_BYTES || size == 1) {
            reduce_rank_order(s, set, 0, m, buf + done);
        } else {
            /* reduce-scatter into slot 0 (shares of 16 floats), then all copy */
            size_t share = ((m + (size_t)size - 1) / (size_t)size + 15) & ~(size_t)15;
            size_t lo = share * (size_t)me < m ? share * (size_t)me : m;
            size_t hi = lo + share < m ? lo + share : m;
            float *result = (float *)slot(s, set, 0);
            if (hi > lo) {
                float tmp[1024];
                /* slot 0 is both an input and the output: reduce through a
                 * small stack buffer so the rank-order sum reads s0 intact */
                for (size_t at = lo; at < hi; at += 1024) {
                    size_t k = hi - at < 1024 ? hi - at : 1024;
                    reduce_rank_order(s, set, at, k, tmp);
                    memcpy(result + at, tmp, k * sizeof(float));
                }
            }
            SD_TRY(barrier_wait(s, "all_reduce"));
            memcpy(buf + done, result, m * sizeof(float));
        }
        round_end(s);
        done += m;
    } while (done < n);
    return SD_OK;
}

static sd_status shm_broadcast(sd_coll *base, void *buf, size_t bytes, int32_t root) {
    shm_coll *s = (shm_coll *)base;
    int32_t me = base->params.rank;
    unsigned char *p = buf;
    size_t done = 0;
    do {
        size_t m = bytes - done < s->chunk ? bytes - done : s->chunk;
        uint32_t set = round_begin(s, OP_BROADCAST, bytes, root);
        if (me == root && m) memcpy(slot(s, set, root), p + done, m);
        SD_TRY(barrier_wait(s, "broadcast"));
        SD_TRY(round_check(s, set));
        if (me != root && m) memcpy(p + done, slot(s, set, root), m);
        round_end(s);
        done += m;
    } while (done < bytes);
    return SD_OK;
}

static sd_status shm_gather(sd_coll *base, const float *send, size_t n, float *recv, int32_t root) {
    shm_coll *s = (shm_coll *)base;
    int32_t size = base->params.size, me = base->params.rank;
    size_t per_round = s->chunk / sizeof(float);
    size_t done = 0;
    do {
        size_t m = n - done < per_round ? n - done : per_round;
        uint32_t set = round_begin(s, OP_GATHER, (uint64_t)n * sizeof(float), root);
        if (me != root && m) memcpy(slot(s, set, me), send + done, m * sizeof(float));
        SD_TRY(barrier_wait(s, "gather"));
        SD_TRY(round_check(s, set));
        if (me == root && m) {
            for (int32_t j = 0; j < size; j++) {
                const float *src = j == me ? send + done : (const float *)slot(s, set, j);
                memcpy(recv + (size_t)j * n + done, src, m * sizeof(float));
            }
        }
        round_end(s);
        done += m;
    } while (done < n);
    return SD_OK;
}

static sd_status shm_barrier(sd_coll *base) {
    shm_coll *s = (shm_coll *)base;
    uint32_t set = round_begin(s, OP_BARRIER, 0, -1);
    SD_TRY(barrier_wait(s, "barrier"));
    SD_TRY(round_check(s, set));
    round_end(s);
    return SD_OK;
}

static void shm_abort(sd_coll *base) { raise_group_abort((shm_coll *)base); }

static void shm_unmap(shm_coll *s) {
    if (s->map) munmap(s->map, s->map_bytes);
    if (s->fd >= 0) close(s->fd);
    s->map = NULL;
    s->fd = -1;
}

/* Unlinks the name only while it still refers to our segment (a new group
 * may have recreated it after we were unlinked). */
static void unlink_if_ours(shm_coll *s) {
    struct stat mine;
    if (s->fd < 0 || fstat(s->fd, &mine) != 0 || mine.st_nlink == 0) return;
    shm_unlink(s->name);
}

static void shm_destroy(sd_coll *base) {
    shm_coll *s = (shm_coll *)base;
    if (base->params.rank == 0) unlink_if_ours(s); /* a group that never finished joining */
    shm_unmap(s);
    free(s);
}

static sd_status map_segment(shm_coll *s, size_t bytes) {
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED) {
        SD_ERROR("coll shm '%s': mmap of %zu bytes failed: %s", s->name + 1, bytes, strerror(errno));
        return SD_ERR_IO;
    }
    s->map = m;
    s->map_bytes = bytes;
    s->hdr = (shm_header *)s->map;
    s->ctl = (shm_ctl *)(s->map + CTL_LINE);
    size_t data_off;
    segment_bytes(s->base.params.size, s->chunk, &data_off);
    s->data = s->map + data_off;
    return SD_OK;
}

static bool all_joined(shm_coll *s) {
    for (int32_t j = 0; j < s->base.params.size; j++)
        if (!atomic_load(&s->ctl[j].joined)) return false;
    return true;
}

static sd_status create_segment(shm_coll *s, int64_t deadline) {
    size_t data_off, bytes = segment_bytes(s->base.params.size, s->chunk, &data_off);
    if (shm_unlink(s->name) == 0)
        SD_WARN("coll shm '%s': removed a stale segment left by an earlier group", s->name + 1);
    s->fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (s->fd < 0) {
        SD_ERROR("coll shm '%s': shm_open(create) failed: %s", s->name + 1, strerror(errno));
        return SD_ERR_IO;
    }
    if (ftruncate(s->fd, (off_t)bytes) != 0) {
        SD_ERROR("coll shm '%s': ftruncate(%zu) failed: %s", s->name + 1, bytes, strerror(errno));
        return SD_ERR_IO;
    }
    SD_TRY(map_segment(s, bytes));
    shm_header *h = s->hdr;
    h->version = SHM_VERSION;
    h->size = s->base.params.size;
    h->chunk = s->chunk;
    h->max_bytes = s->base.params.max_bytes;
    h->total = bytes;
    h->creator_pid = (int32_t)getpid();
    h->pid_ns = pid_namespace();
    s->same_pid_ns = h->pid_ns != 0;
    s->ctl[0].pid = (int32_t)getpid();
    atomic_store(&h->aborted, 0);
    atomic_store(&h->sleepers, 0);
    atomic_store(&s->ctl[0].joined, 1);
    atomic_store(&h->state, STATE_OPEN);
    __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE); /* joiners check it last */
    while (!all_joined(s)) {
        if (now_ns() >= deadline) {
            char missing[256];
            size_t len = 0;
            missing[0] = '\0';
            for (int32_t j = 1; j < s->base.params.size; j++)
                if (!atomic_load(&s->ctl[j].joined) && len + 16 < sizeof missing)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", j);
            SD_ERROR("coll shm '%s' rank 0: join timed out after %d ms; ranks that never joined: %s", s->name + 1,
                     s->base.params.timeout_ms, missing);
            atomic_store(&h->aborted, 1);
            return SD_ERR_TIMEOUT;
        }
        sleep_ns(JOIN_POLL_NS / 10);
    }
    atomic_store(&h->state, STATE_RUNNING);
    shm_unlink(s->name); /* every rank has it mapped: the name is no longer needed */
    return SD_OK;
}

/* One attempt to attach to the segment under the name: SD_OK when joined and
 * running, SD_ERR_NOT_FOUND when it should retry (absent, stale, not ready),
 * another error when the group is incompatible. */
static sd_status try_join(shm_coll *s, int64_t deadline) {
    size_t data_off, bytes = segment_bytes(s->base.params.size, s->chunk, &data_off);
    s->fd = shm_open(s->name, O_RDWR, 0600);
    if (s->fd < 0) return SD_ERR_NOT_FOUND;
    struct stat st;
    if (fstat(s->fd, &st) != 0 || (size_t)st.st_size < CTL_LINE) goto retry;
    shm_header hcopy;
    if (pread(s->fd, &hcopy, sizeof hcopy, 0) != (ssize_t)sizeof hcopy || hcopy.magic != SHM_MAGIC) goto retry;
    uint64_t my_ns = pid_namespace();
    bool same_ns = my_ns != 0 && my_ns == hcopy.pid_ns;
    if (hcopy.version != SHM_VERSION || hcopy.size != s->base.params.size ||
        hcopy.max_bytes != s->base.params.max_bytes || hcopy.total != bytes || (size_t)st.st_size != bytes) {
        if (process_gone(same_ns, hcopy.creator_pid)) goto retry; /* a dead group's: rank 0 will replace it */
        SD_ERROR("coll shm '%s' rank %d: the group has size %d, max_bytes %llu; this rank passed size %d, "
                 "max_bytes %zu",
                 s->name + 1, s->base.params.rank, hcopy.size, (unsigned long long)hcopy.max_bytes, s->base.params.size,
                 s->base.params.max_bytes);
        shm_unmap(s);
        return SD_ERR_INVALID_ARG;
    }
    if (process_gone(same_ns, hcopy.creator_pid)) goto retry;
    if (map_segment(s, bytes) != SD_OK) goto retry;
    if (atomic_load(&s->hdr->state) != STATE_OPEN || atomic_load(&s->hdr->aborted)) goto retry;
    s->same_pid_ns = same_ns;
    s->ctl[s->base.params.rank].pid = (int32_t)getpid();
    uint32_t expected = 0;
    if (!atomic_compare_exchange_strong(&s->ctl[s->base.params.rank].joined, &expected, 1)) goto retry;
    /* joined: wait for rank 0 to see everyone; a segment unlinked before it
     * ran, or whose creator died, was stale */
    for (;;) {
        uint32_t state = atomic_load(&s->hdr->state);
        if (state == STATE_RUNNING) return SD_OK;
        if (atomic_load(&s->hdr->aborted)) break;
        if (fstat(s->fd, &st) != 0 || st.st_nlink == 0) {
            if (atomic_load(&s->hdr->state) == STATE_RUNNING) return SD_OK;
            break;
        }
        if (process_gone(same_ns, hcopy.creator_pid)) break;
        if (now_ns() >= deadline) {
            SD_ERROR("coll shm '%s' rank %d: joined, but rank 0 did not start the group within %d ms", s->name + 1,
                     s->base.params.rank, s->base.params.timeout_ms);
            shm_unmap(s);
            return SD_ERR_TIMEOUT;
        }
        sleep_ns(JOIN_POLL_NS / 10);
    }
retry:
    shm_unmap(s);
    return SD_ERR_NOT_FOUND;
}

sd_status sd_coll_shm_open(const char *name, const sd_coll_params *p, sd_coll **out) {
    if (!out) return SD_ERR_INVALID_ARG;
    *out = NULL;
    SD_TRY(sd_coll_check_params(p));
    size_t name_len = name ? strlen(name) : 0;
    if (name_len == 0 || name_len > 60 || strchr(name, '/')) {
        SD_ERROR("coll shm: group name '%s' must be 1..60 characters without '/'", name ? name : "(null)");
        return SD_ERR_INVALID_ARG;
    }
    shm_coll *s = calloc(1, sizeof *s);
    if (!s) return SD_ERR_NOMEM;
    sd_coll_init_base(&s->base, &shm_ops, p);
    snprintf(s->name, sizeof s->name, "/%s", name);
    s->fd = -1;
    s->chunk = p->max_bytes & ~(size_t)63;
    size_t data_off;
    size_t total = segment_bytes(p->size, s->chunk, &data_off);
    if (total / 2 / (size_t)p->size < s->chunk) { /* overflow */
        free(s);
        return SD_ERR_INVALID_ARG;
    }
    int64_t deadline = now_ns() + (int64_t)p->timeout_ms * 1000000ll;
    sd_status st;
    if (p->rank == 0) {
        st = create_segment(s, deadline);
    } else {
        for (;;) {
            st = try_join(s, deadline);
            if (st != SD_ERR_NOT_FOUND) break;
            if (now_ns() >= deadline) {
                SD_ERROR("coll shm '%s' rank %d: no running group to join within %d ms (is rank 0 up?)", name, p->rank,
                         p->timeout_ms);
                st = SD_ERR_TIMEOUT;
                break;
            }
            sleep_ns(JOIN_POLL_NS);
        }
    }
    if (st != SD_OK) {
        shm_destroy(&s->base);
        return st;
    }
    SD_DEBUG("coll shm '%s': rank %d of %d joined (%zu-byte slots, %zu-byte segment)", name, p->rank, p->size, s->chunk,
             s->map_bytes);
    *out = &s->base;
    return SD_OK;
}

static const sd_coll_ops shm_ops = {
    .kind = "shm",
    .destroy = shm_destroy,
    .abort = shm_abort,
    .stream = NULL,
    .all_reduce_sum = shm_all_reduce,
    .broadcast = shm_broadcast,
    .gather = shm_gather,
    .barrier = shm_barrier,
};
