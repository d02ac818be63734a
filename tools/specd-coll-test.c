/* specd-coll-test — a collective benchmark in the shape of nccl-tests.
 *
 *   specd-coll-test --backend shm|nccl -n RANKS -b MINBYTES -e MAXBYTES
 *                   -f FACTOR --op all_reduce|broadcast|gather|barrier
 *                   [--iters N] [--warmup N] [--check 0|1] [--timeout-ms MS]
 *
 * For each size from -b to -e (times -f each step) every rank runs the
 * collective --warmup times, then --iters times timed; the row reports the
 * slowest rank's mean time, the algorithm bandwidth (size / time) and the
 * bus bandwidth as nccl-tests defines it (all-reduce algbw * 2(n-1)/n,
 * gather algbw * (n-1)/n, broadcast algbw), then one checked run with
 * rank-dependent data against an exact expected result: #wrong counts the
 * elements that differ bit for bit, over all ranks (all-reduce expects the
 * rank-order sum). Sizes follow nccl-tests: for gather SIZE is the root's
 * whole receive buffer, each rank sends SIZE / n.
 *
 * shm forks the ranks itself (one process each, one segment named after this
 * process). nccl runs one rank per visible GPU as threads of this process
 * (-n caps it); it prints a message and does nothing in a build without CUDA
 * or on a machine without a GPU. Exit status 0 when every check passed, 1 when
 * any element was wrong or a call failed, 2 on bad usage, 77 when skipped (no
 * CUDA build or no GPU; CTest's skip code). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "specd/coll.h"
#include "specd/cli.h"

#ifdef SPECD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define EXIT_SKIPPED 77

enum op { OP_ALL_REDUCE, OP_BROADCAST, OP_GATHER, OP_BARRIER };

typedef struct options {
    const char *backend;
    int32_t n_ranks;
    size_t min_bytes, max_bytes;
    double factor;
    enum op op;
    int iters, warmup, check, timeout_ms;
} options;

/* How a rank's buffers are reached: host memory for shm, device for nccl. */
typedef struct mem_ops {
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    int (*upload)(void *dst, const void *src, size_t bytes);
    int (*download)(void *dst, const void *src, size_t bytes);
} mem_ops;

static void *host_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void host_release(void *p) { free(p); }
static int host_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}
static const mem_ops host_mem = {host_alloc, host_release, host_copy, host_copy};

static const char *op_name(enum op op) {
    static const char *names[] = {"all_reduce", "broadcast", "gather", "barrier"};
    return names[op];
}

/* Rank-dependent data whose sums depend on the order of the ranks. */
static float value(int32_t rank, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ldexpf((float)(h & 0xffffff) / 16777216.0f - 0.5f, (int)((h >> 24) % 21u) - 10);
}

typedef struct sizes {
    size_t bytes; /* as reported */
    size_t count; /* floats per rank buffer (all-reduce/broadcast) or sent per rank (gather) */
} sizes;

static sizes size_for(const options *o, size_t bytes, int32_t n) {
    sizes s = {bytes, bytes / sizeof(float)};
    if (o->op == OP_GATHER) s.count = bytes / sizeof(float) / (size_t)n;
    if (o->op == OP_BARRIER) s.count = 0;
    s.bytes = o->op == OP_GATHER ? s.count * sizeof(float) * (size_t)n : s.count * sizeof(float);
    return s;
}

static sd_status run_once(const options *o, sd_coll *c, float *buf, float *recv, size_t count) {
    switch (o->op) {
    case OP_ALL_REDUCE: return sd_coll_all_reduce_sum(c, buf, count);
    case OP_BROADCAST: return sd_coll_broadcast(c, buf, count * sizeof(float), 0);
    case OP_GATHER: return sd_coll_gather(c, buf, count, recv, 0);
    case OP_BARRIER: return sd_coll_barrier(c);
    }
    return SD_ERR_INVALID_ARG;
}

/* One checked run: returns the number of wrong elements on this rank. */
static long check_once(const options *o, sd_coll *c, const mem_ops *mem, float *buf, float *recv, size_t count,
                       sd_status *st) {
    int32_t rank = sd_coll_rank(c), n = sd_coll_size(c);
    size_t out_n = o->op == OP_GATHER ? count * (size_t)n : count;
    float *host = malloc((out_n + 1) * sizeof(float));
    float *want = malloc((out_n + 1) * sizeof(float));
    long wrong = 0;
    for (size_t i = 0; i < count; i++) host[i] = value(rank, i);
    if (o->op == OP_BROADCAST && rank != 0)
        for (size_t i = 0; i < count; i++) host[i] = -1.0f;
    mem->upload(buf, host, count * sizeof(float));
    *st = run_once(o, c, buf, recv, count);
    if (*st == SD_OK && o->op != OP_BARRIER && !(o->op == OP_GATHER && rank != 0)) {
        for (size_t i = 0; i < out_n; i++) {
            if (o->op == OP_ALL_REDUCE) {
                float acc = value(0, i);
                for (int32_t r = 1; r < n; r++) acc += value(r, i);
                want[i] = acc;
            } else if (o->op == OP_BROADCAST) {
                want[i] = value(0, i);
            } else {
                want[i] = value((int32_t)(i / count), i % count);
            }
        }
        mem->download(host, o->op == OP_GATHER ? recv : buf, out_n * sizeof(float));
        for (size_t i = 0; i < out_n; i++) wrong += memcmp(&host[i], &want[i], sizeof(float)) != 0;
    }
    free(host);
    free(want);
    return wrong;
}

/* Rank 0 collects one number per rank (through the group itself). */
static sd_status gather_stat(sd_coll *c, const mem_ops *mem, float mine, float *all) {
    int32_t n = sd_coll_size(c);
    float *send = mem->alloc(sizeof(float)), *recv = mem->alloc((size_t)n * sizeof(float));
    mem->upload(send, &mine, sizeof(float));
    sd_status st = sd_coll_gather(c, send, 1, recv, 0);
    if (st == SD_OK && sd_coll_rank(c) == 0) mem->download(all, recv, (size_t)n * sizeof(float));
    mem->release(send);
    mem->release(recv);
    return st;
}

/* The benchmark loop of one rank; rank 0 prints. Returns 0 when all good. */
static int rank_main(const options *o, sd_coll *c, const mem_ops *mem) {
    int32_t rank = sd_coll_rank(c), n = sd_coll_size(c);
    if (rank == 0) {
        printf("# specd-coll-test: backend %s, %d ranks, op %s, iters %d, warmup %d, check %d\n", sd_coll_kind(c), n,
               op_name(o->op), o->iters, o->warmup, o->check);
        printf("#%11s %12s %10s %10s %10s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
               "#wrong");
    }
    int bad = 0;
    float *stats = malloc((size_t)n * sizeof(float));
    size_t last = (size_t)-1;
    for (size_t bytes = o->min_bytes;;) {
        sizes sz = size_for(o, bytes, n);
        if (sz.bytes != last || o->op == OP_BARRIER) {
            last = sz.bytes;
            size_t out_n = o->op == OP_GATHER ? sz.count * (size_t)n : sz.count;
            float *buf = mem->alloc(sz.count * sizeof(float) + 64);
            float *recv = o->op == OP_GATHER ? mem->alloc(out_n * sizeof(float) + 64) : NULL;
            sd_status st = SD_OK;
            for (int i = 0; i < o->warmup && st == SD_OK; i++) st = run_once(o, c, buf, recv, sz.count);
            if (st == SD_OK) st = sd_coll_barrier(c);
            double t0 = sd_now();
            for (int i = 0; i < o->iters && st == SD_OK; i++) st = run_once(o, c, buf, recv, sz.count);
            double us = (sd_now() - t0) * 1e6 / o->iters;
            long wrong = 0;
            if (st == SD_OK && o->check) wrong = check_once(o, c, mem, buf, recv, sz.count, &st);
            mem->release(buf);
            mem->release(recv);
            if (st != SD_OK) {
                fprintf(stderr, "specd-coll-test: rank %d: %s of %zu bytes failed: %s\n", rank, op_name(o->op),
                        sz.bytes, sd_status_str(st));
                bad = 1;
                break;
            }
            if (gather_stat(c, mem, (float)us, stats) != SD_OK) {
                bad = 1;
                break;
            }
            double slowest = 0;
            if (rank == 0)
                for (int32_t r = 0; r < n; r++) slowest = stats[r] > slowest ? stats[r] : slowest;
            if (gather_stat(c, mem, (float)wrong, stats) != SD_OK) {
                bad = 1;
                break;
            }
            if (rank == 0) {
                long all_wrong = 0;
                for (int32_t r = 0; r < n; r++) all_wrong += (long)stats[r];
                double algbw = slowest > 0 ? (double)sz.bytes / (slowest * 1e-6) / 1e9 : 0;
                double busbw = algbw;
                if (o->op == OP_ALL_REDUCE) busbw = algbw * 2.0 * (n - 1) / n;
                if (o->op == OP_GATHER) busbw = algbw * (double)(n - 1) / n;
                if (o->op == OP_BARRIER) algbw = busbw = 0;
                char wrong_txt[24] = "N/A";
                if (o->check) snprintf(wrong_txt, sizeof wrong_txt, "%ld", all_wrong);
                printf("%12zu %12zu %10.2f %10.3f %10.3f %8s\n", sz.bytes,
                       o->op == OP_GATHER ? sz.count * (size_t)n : sz.count, slowest, algbw, busbw, wrong_txt);
                if (o->check && all_wrong) bad = 1;
                fflush(stdout);
            }
        }
        if (o->op == OP_BARRIER || bytes >= o->max_bytes) break;
        size_t next = (size_t)((double)bytes * o->factor);
        bytes = next > bytes ? next : bytes + 1;
        if (bytes > o->max_bytes) bytes = o->max_bytes;
    }
    free(stats);
    return bad;
}

/* ---- shm: one forked process per rank ---- */

static int run_shm(const options *o) {
    char name[64];
    snprintf(name, sizeof name, "specd-coll-test-%d", (int)getpid());
    sd_coll_params p = sd_coll_default_params();
    p.size = o->n_ranks;
    p.timeout_ms = o->timeout_ms;
    size_t slot = o->max_bytes + 64;
    p.max_bytes = slot < ((size_t)64 << 20) ? slot : ((size_t)64 << 20);
    pid_t pids[256];
    fflush(NULL);
    for (int32_t r = 0; r < o->n_ranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "specd-coll-test: fork: %s\n", strerror(errno));
            for (int32_t k = 0; k < r; k++) kill(pids[k], SIGKILL);
            return 1;
        }
        if (pid == 0) {
            char tag[32];
            snprintf(tag, sizeof tag, "coll-test[%d]", r);
            sd_log_set(NULL, NULL, SD_LOG_WARN, tag);
            p.rank = r;
            sd_coll *c = NULL;
            sd_status st = sd_coll_shm_open(name, &p, &c);
            if (st != SD_OK) _exit(1);
            int rc = rank_main(o, c, &host_mem);
            sd_coll_close(&c);
            fflush(stdout);
            _exit(rc);
        }
        pids[r] = pid;
    }
    int bad = 0;
    for (int32_t r = 0; r < o->n_ranks; r++) {
        int status = 0;
        while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad = 1;
    }
    return bad;
}

/* ---- nccl: one thread per GPU ---- */

#ifdef SPECD_HAVE_CUDA
static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
    cudaMemset(p, 0, bytes ? bytes : 1);
    return p;
}
static void dev_release(void *p) {
    if (p) cudaFree(p);
}
static int dev_upload(void *dst, const void *src, size_t bytes) {
    return bytes && cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess;
}
static int dev_download(void *dst, const void *src, size_t bytes) {
    return bytes && cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess;
}
static const mem_ops dev_mem = {dev_alloc, dev_release, dev_upload, dev_download};

typedef struct nccl_rank {
    const options *o;
    unsigned char id[512];
    size_t id_len;
    int32_t rank, size;
    int rc;
} nccl_rank;

static void *nccl_rank_main(void *arg) {
    nccl_rank *r = arg;
    sd_coll_params p = sd_coll_default_params();
    p.rank = r->rank;
    p.size = r->size;
    p.timeout_ms = r->o->timeout_ms;
    sd_coll *c = NULL;
    r->rc = 1;
    if (cudaSetDevice(r->rank) != cudaSuccess) return NULL;
    if (sd_coll_nccl_open(r->id, r->id_len, r->rank, &p, &c) != SD_OK) return NULL;
    r->rc = rank_main(r->o, c, &dev_mem);
    sd_coll_close(&c);
    return NULL;
}

static int run_nccl(const options *o) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("specd-coll-test: skipped: --backend nccl needs a CUDA GPU and none is visible\n");
        return EXIT_SKIPPED;
    }
    int32_t n = o->n_ranks > 0 && o->n_ranks < n_dev ? o->n_ranks : n_dev;
    nccl_rank *ranks = calloc((size_t)n, sizeof *ranks);
    pthread_t *threads = calloc((size_t)n, sizeof *threads);
    size_t id_len = 0;
    if (!ranks || !threads || sd_coll_nccl_unique_id(ranks[0].id, sizeof ranks[0].id, &id_len) != SD_OK) {
        free(ranks);
        free(threads);
        return 1;
    }
    for (int32_t r = 0; r < n; r++) {
        ranks[r].o = o;
        memcpy(ranks[r].id, ranks[0].id, id_len);
        ranks[r].id_len = id_len;
        ranks[r].rank = r;
        ranks[r].size = n;
        pthread_create(&threads[r], NULL, nccl_rank_main, &ranks[r]);
    }
    int bad = 0;
    for (int32_t r = 0; r < n; r++) {
        pthread_join(threads[r], NULL);
        bad |= ranks[r].rc;
    }
    free(ranks);
    free(threads);
    return bad;
}
#else
static int run_nccl(const options *o) {
    (void)o;
    printf("specd-coll-test: skipped: --backend nccl needs a CUDA build (this one has none)\n");
    return EXIT_SKIPPED;
}
#endif

/* ---- command line ---- */

static int usage(void) {
    fprintf(stderr, "usage: specd-coll-test --backend shm|nccl -n RANKS -b MINBYTES -e MAXBYTES -f FACTOR\n"
                    "                       --op all_reduce|broadcast|gather|barrier [--iters N] [--warmup N]\n"
                    "                       [--check 0|1] [--timeout-ms MS]\n"
                    "  sizes accept K/M/G suffixes (powers of 1024)\n");
    return 2;
}

static bool parse_size(const char *s, size_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return false;
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024ull, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024ull * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024ull * 1024 * 1024, end++;
    if (*end) return false;
    *out = (size_t)(v * mul);
    return true;
}

int main(int argc, char **argv) {
    options o = {"shm", 2, 8, 8 << 20, 2.0, OP_ALL_REDUCE, 100, 10, 1, 10000};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int n = 0;
        if (!v) return usage();
        if (!strcmp(a, "--backend"))
            o.backend = v;
        else if (!strcmp(a, "-n")) {
            if (!sd_cli_parse_int(v, 1, 256, &n)) return usage();
            o.n_ranks = n;
        } else if (!strcmp(a, "-b")) {
            if (!parse_size(v, &o.min_bytes)) return usage();
        } else if (!strcmp(a, "-e")) {
            if (!parse_size(v, &o.max_bytes)) return usage();
        } else if (!strcmp(a, "-f")) {
            o.factor = atof(v);
            if (!(o.factor > 1.0)) return usage();
        } else if (!strcmp(a, "--op")) {
            if (!strcmp(v, "all_reduce"))
                o.op = OP_ALL_REDUCE;
            else if (!strcmp(v, "broadcast"))
                o.op = OP_BROADCAST;
            else if (!strcmp(v, "gather"))
                o.op = OP_GATHER;
            else if (!strcmp(v, "barrier"))
                o.op = OP_BARRIER;
            else
                return usage();
        } else if (!strcmp(a, "--iters")) {
            if (!sd_cli_parse_int(v, 1, 100000000, &o.iters)) return usage();
        } else if (!strcmp(a, "--warmup")) {
            if (!sd_cli_parse_int(v, 0, 100000000, &o.warmup)) return usage();
        } else if (!strcmp(a, "--check")) {
            if (!sd_cli_parse_int(v, 0, 1, &o.check)) return usage();
        } else if (!strcmp(a, "--timeout-ms")) {
            if (!sd_cli_parse_int(v, 1, 3600000, &o.timeout_ms)) return usage();
        } else
            return usage();
        i++;
    }
    if (o.min_bytes > o.max_bytes) return usage();
    if (!strcmp(o.backend, "shm")) return run_shm(&o);
    if (!strcmp(o.backend, "nccl")) return run_nccl(&o);
    return usage();
}
