/* test_coll_nccl.c — the NCCL collectives (engine/cuda/coll_nccl.c) as a
 * one-rank group on GPU 0.
 *
 * In a build without CUDA it checks that the NCCL entry points refuse with
 * SD_ERR_UNSUPPORTED and exits 77 (skipped) saying so; with CUDA but no GPU
 * it exits 77 too. On a GPU: unique id, join, all-reduce (identity for one
 * rank, checked bit for bit after a device round trip, including a size that
 * is not a multiple of anything), broadcast, gather into device memory,
 * barrier, the stream handle, collectives enqueued on a caller's stream
 * (sd_coll_use_stream) and waited for with sd_coll_wait, and abort: the call
 * after sd_coll_abort fails with SD_ERR_ABORTED. Plain main (not cmocka) so the skip is one exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specd/coll.h"

#ifdef SPECD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "test_coll_nccl: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

#ifndef SPECD_HAVE_CUDA
int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_OFF, "test_coll_nccl");
    unsigned char id[256];
    size_t len = 99;
    sd_coll *c = (sd_coll *)id;
    sd_coll_params p = sd_coll_default_params();
    CHECK(sd_coll_nccl_unique_id(id, sizeof id, &len) == SD_ERR_UNSUPPORTED);
    CHECK(len == 0);
    CHECK(sd_coll_nccl_open(id, sizeof id, 0, &p, &c) == SD_ERR_UNSUPPORTED);
    CHECK(c == NULL);
    printf("test_coll_nccl: skipped: built without CUDA (the NCCL entry points refuse with SD_ERR_UNSUPPORTED)\n");
    return 77;
}
#else
static int run(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_coll_nccl: skipped: no usable CUDA GPU\n");
        return 77;
    }
    unsigned char id[256];
    size_t len = 0;
    CHECK(sd_coll_nccl_unique_id(id, 8, &len) == SD_ERR_INVALID_ARG); /* too small */
    CHECK(sd_coll_nccl_unique_id(id, sizeof id, &len) == SD_OK);
    CHECK(len > 0 && len <= sizeof id);
    sd_coll_params p = sd_coll_default_params();
    p.timeout_ms = 20000;
    sd_coll *c = NULL;
    CHECK(sd_coll_nccl_open(id, len, 0, &p, &c) == SD_OK);
    CHECK(c != NULL);
    CHECK(strcmp(sd_coll_kind(c), "nccl") == 0);
    CHECK(sd_coll_stream(c) != NULL);
    CHECK(sd_coll_size(c) == 1 && sd_coll_rank(c) == 0);

    const size_t n = 1001;
    float *host = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    CHECK(host && back);
    for (size_t i = 0; i < n; i++) host[i] = (float)i * 0.37f - 11.0f;
    float *dev = NULL, *gathered = NULL;
    CHECK(cudaMalloc((void **)&dev, n * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc((void **)&gathered, n * sizeof(float)) == cudaSuccess);
    CHECK(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);

    CHECK(sd_coll_all_reduce_sum(c, dev, n) == SD_OK);
    CHECK(cudaMemcpy(back, dev, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, n * sizeof(float)) == 0);

    CHECK(sd_coll_broadcast(c, dev, 13, 0) == SD_OK);
    CHECK(sd_coll_broadcast(c, dev, 13, 1) == SD_ERR_INVALID_ARG);
    CHECK(sd_coll_gather(c, dev, n, gathered, 0) == SD_OK);
    CHECK(cudaMemcpy(back, gathered, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, n * sizeof(float)) == 0);
    CHECK(sd_coll_barrier(c) == SD_OK);
    CHECK(sd_coll_all_reduce_sum(c, dev, 0) == SD_OK);

    /* on a caller's stream: calls only enqueue, ordered after the copy that
     * fills the buffer; sd_coll_wait is the bounded wait */
    cudaStream_t mine;
    CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(sd_coll_use_stream(c, mine) == SD_OK);
    CHECK(sd_coll_stream(c) == (void *)mine);
    for (size_t i = 0; i < n; i++) host[i] = (float)i * -0.61f + 5.0f;
    CHECK(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, mine) == cudaSuccess);
    CHECK(sd_coll_all_reduce_sum(c, dev, n) == SD_OK);
    CHECK(sd_coll_gather(c, dev, n, gathered, 0) == SD_OK);
    CHECK(sd_coll_wait(c) == SD_OK);
    CHECK(cudaStreamQuery(mine) == cudaSuccess); /* the wait covered the whole stream */
    CHECK(cudaMemcpy(back, gathered, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, n * sizeof(float)) == 0);
    CHECK(sd_coll_use_stream(c, NULL) == SD_OK); /* back to the group's own stream, synchronous */
    CHECK(sd_coll_stream(c) != (void *)mine);
    CHECK(sd_coll_all_reduce_sum(c, dev, n) == SD_OK);
    CHECK(sd_coll_wait(c) == SD_OK);
    CHECK(cudaStreamDestroy(mine) == cudaSuccess);

    sd_coll_abort(c);
    CHECK(sd_coll_all_reduce_sum(c, dev, n) == SD_ERR_ABORTED);
    CHECK(sd_coll_barrier(c) == SD_ERR_ABORTED);
    sd_coll_close(&c);
    CHECK(c == NULL);
    cudaFree(dev);
    cudaFree(gathered);
    free(host);
    free(back);
    printf("test_coll_nccl: one-rank NCCL collectives passed\n");
    return 0;
}

int main(void) {
    sd_log_set(NULL, NULL, SD_LOG_WARN, "test_coll_nccl");
    return run();
}
#endif
