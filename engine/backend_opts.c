/* backend_opts.c — the backend switches from a command line (specd/backend_opts.h). */
#include <stdio.h>
#include <string.h>

#include "specd/backend_opts.h"
#include "specd/cli.h"

static bool parse_bool(const char *name, const char *arg, const char *prog, bool *out) {
    int v = 0;
    if (!arg || !sd_cli_parse_int(arg, 0, 1, &v)) {
        fprintf(stderr, "%s: --%s must be 0 or 1, got '%s'\n", prog, name, arg ? arg : "");
        return false;
    }
    *out = v == 1;
    return true;
}

bool sd_backend_opts_parse(sd_backend_opts *o, const char *name, const char *arg, const char *prog) {
    if (!o || !name) return false;
    if (strcmp(name, "cpu-weights") == 0) {
        static const char *const names[] = {"stored", "f32", "copy"};
        static const sd_cpu_weights values[] = {SD_CPU_WEIGHTS_STORED, SD_CPU_WEIGHTS_F32, SD_CPU_WEIGHTS_COPY};
        for (size_t i = 0; arg && i < sizeof names / sizeof names[0]; i++)
            if (strcmp(arg, names[i]) == 0) {
                o->cpu_weights = values[i];
                return true;
            }
        fprintf(stderr, "%s: --cpu-weights must be stored, f32 or copy, got '%s'\n", prog, arg ? arg : "");
        return false;
    }
    if (strcmp(name, "cpu-qpath") == 0) {
        static const char *const paths[] = {"c", "avx2", "avx512-vnni", "avx512-amx"};
        for (size_t i = 0; arg && i < sizeof paths / sizeof paths[0]; i++)
            if (strcmp(arg, paths[i]) == 0) {
                o->cpu_qpath = paths[i];
                return true;
            }
        fprintf(stderr, "%s: --cpu-qpath must be c, avx2, avx512-vnni or avx512-amx, got '%s'\n", prog, arg ? arg : "");
        return false;
    }
    if (strcmp(name, "host-verify") == 0) {
        o->host_verify = true;
        return true;
    }
    if (strcmp(name, "cuda-graphs") == 0) return parse_bool(name, arg, prog, &o->cuda_graphs);
    if (strcmp(name, "cuda-mma") == 0) return parse_bool(name, arg, prog, &o->cuda_mma);
    if (strcmp(name, "cuda-fuse") == 0) return parse_bool(name, arg, prog, &o->cuda_fuse);
    if (strcmp(name, "cuda-pdl") == 0) return parse_bool(name, arg, prog, &o->cuda_pdl);
    if (strcmp(name, "cuda-pdl-prefetch") == 0) {
        if (arg && sd_cli_parse_i32(arg, 0, 64, &o->cuda_pdl_prefetch)) return true;
        fprintf(stderr, "%s: --cuda-pdl-prefetch must be an integer in [0, 64], got '%s'\n", prog, arg ? arg : "");
        return false;
    }
    fprintf(stderr, "%s: --%s is not a backend switch\n", prog, name);
    return false;
}

/* Appends " " (unless first) and s to buf[len], cut to fit. */
static void append(char *buf, size_t len, const char *s) {
    size_t n = strlen(buf);
    if (n > 0 && n + 1 < len) buf[n++] = ' ', buf[n] = '\0';
    size_t m = strlen(s);
    if (n + m + 1 > len) m = len - n - 1;
    memcpy(buf + n, s, m);
    buf[n + m] = '\0';
}

void sd_backend_opts_describe(const sd_backend_opts *o, char *buf, size_t len) {
    if (!buf || len == 0) return;
    buf[0] = '\0';
    if (!o) return;
    const sd_backend_opts d = sd_backend_default_opts();
    char one[64];
    if (o->cpu_weights != d.cpu_weights)
        append(buf, len, o->cpu_weights == SD_CPU_WEIGHTS_F32 ? "--cpu-weights f32" : "--cpu-weights copy");
    if (o->cpu_qpath) {
        snprintf(one, sizeof one, "--cpu-qpath %.20s", o->cpu_qpath);
        append(buf, len, one);
    }
    if (o->host_verify) append(buf, len, "--host-verify");
    if (o->cuda_graphs != d.cuda_graphs) append(buf, len, o->cuda_graphs ? "--cuda-graphs 1" : "--cuda-graphs 0");
    if (o->cuda_mma != d.cuda_mma) append(buf, len, o->cuda_mma ? "--cuda-mma 1" : "--cuda-mma 0");
    if (o->cuda_fuse != d.cuda_fuse) append(buf, len, o->cuda_fuse ? "--cuda-fuse 1" : "--cuda-fuse 0");
    if (o->cuda_pdl != d.cuda_pdl) append(buf, len, o->cuda_pdl ? "--cuda-pdl 1" : "--cuda-pdl 0");
    if (o->cuda_pdl_prefetch != d.cuda_pdl_prefetch) {
        snprintf(one, sizeof one, "--cuda-pdl-prefetch %d", (int)o->cuda_pdl_prefetch);
        append(buf, len, one);
    }
}
