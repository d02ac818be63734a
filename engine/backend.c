/* backend.c — picks the backend for a device number, and parses device names.
 *
 * The CUDA backend is linked only in builds where nvcc was found
 * (SPECD_HAVE_CUDA); elsewhere asking for a GPU is a clear error, and the
 * CPU path is always there. The switches (sd_backend_opts) come from the
 * caller, never from the environment. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "specd/model.h"

sd_backend_opts sd_backend_default_opts(void) {
    sd_backend_opts o = {.cpu_weights = SD_CPU_WEIGHTS_STORED,
                         .cpu_qpath = NULL,
                         .host_verify = false,
                         .cuda_graphs = true,
                         .cuda_mma = true,
                         .cuda_fuse = true,
                         .cuda_pdl = false,
                         .cuda_pdl_prefetch = 4};
    return o;
}

sd_status sd_backend_create(int32_t device, int32_t n_threads, const sd_backend_opts *opts, sd_backend_handle *out) {
    const sd_backend_opts def = sd_backend_default_opts();
    if (!opts) opts = &def;
    if (device < 0) return sd_cpu_backend_create_opts(n_threads, opts, out);
#ifdef SPECD_HAVE_CUDA
    return sd_cuda_backend_create_opts(device, opts, out);
#else
    SD_ERROR("backend: cuda:%d was asked for, but this build has no CUDA backend (nvcc was not found)", (int)device);
    return SD_ERR_UNSUPPORTED;
#endif
}

sd_status sd_device_parse(const char *name, int32_t *device) {
    if (!name || !device) return SD_ERR_INVALID_ARG;
    if (strcmp(name, "cpu") == 0) {
        *device = -1;
        return SD_OK;
    }
    if (strcmp(name, "cuda") == 0) {
        *device = 0;
        return SD_OK;
    }
    if (strncmp(name, "cuda:", 5) == 0 && name[5] >= '0' && name[5] <= '9') {
        char *end;
        errno = 0;
        long v = strtol(name + 5, &end, 10);
        if (errno == 0 && *end == '\0' && v >= 0 && v < 1024) {
            *device = (int32_t)v;
            return SD_OK;
        }
    }
    SD_ERROR("device '%s' is not cpu, cuda or cuda:N", name);
    return SD_ERR_INVALID_ARG;
}
