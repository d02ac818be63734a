/* backend_opts.h — the backend switches (sd_backend_opts, model.h) on a
 * command line: one option table and one parser for every program that
 * loads a model (specd-verifier, specd-drafter, specd-generate, specd-bench).
 *
 * The switches exist to compare paths and to test them; the defaults are
 * what a run wants. They used to be environment variables read deep in the
 * backends; now a program reads them from its command line and passes them
 * down in sd_model_params.backend (or sd_drafter_params.backend), so library
 * code reads no environment and a process's behaviour is on its command
 * line. Usage in a getopt_long loop:
 *
 *     static const struct option longs[] = {..., SD_BACKEND_LONG_OPTIONS, {0, 0, 0, 0}};
 *     int li = 0;
 *     while ((c = getopt_long(argc, argv, "...", longs, &li)) != -1) switch (c) {
 *         case SD_BACKEND_OPTION: ok = sd_backend_opts_parse(&o.backend, longs[li].name, optarg, "prog"); break;
 *         ...
 *     }
 */
#ifndef SPECD_BACKEND_OPTS_H
#define SPECD_BACKEND_OPTS_H

#include <getopt.h>

#include "specd/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* getopt_long's value for every backend switch (the name tells them apart). */
#define SD_BACKEND_OPTION 0x5d0

/* clang-format off */
#define SD_BACKEND_LONG_OPTIONS                                   \
    {"cpu-weights", required_argument, 0, SD_BACKEND_OPTION},     \
    {"cpu-qpath", required_argument, 0, SD_BACKEND_OPTION},       \
    {"host-verify", no_argument, 0, SD_BACKEND_OPTION},           \
    {"cuda-graphs", required_argument, 0, SD_BACKEND_OPTION},     \
    {"cuda-mma", required_argument, 0, SD_BACKEND_OPTION},        \
    {"cuda-fuse", required_argument, 0, SD_BACKEND_OPTION},       \
    {"cuda-pdl", required_argument, 0, SD_BACKEND_OPTION},        \
    {"cuda-pdl-prefetch", required_argument, 0, SD_BACKEND_OPTION}
/* clang-format on */

/* Help lines for the switches, in the house's usage layout. */
#define SD_BACKEND_OPTIONS_USAGE                                                                         \
    "Backend switches (for comparing and testing paths; the defaults are what a run wants):\n"           \
    "      --cpu-weights W     stored (default: matrices as the file stores them, mapped), f32 (every\n" \
    "                          matrix read as f32) or copy (as stored, copied rather than mapped)\n"     \
    "      --cpu-qpath P       CPU kernels for stored matrices: c, avx2, avx512-vnni or avx512-amx\n"    \
    "                          (default: the fastest this CPU has)\n"                                    \
    "      --host-verify       verify drafts on the host even on a GPU\n"                                \
    "      --cuda-graphs 0|1   record and replay CUDA graphs (default 1)\n"                              \
    "      --cuda-mma 0|1      the tensor-core streaming matmul (default 1; 0: CUDA cores)\n"            \
    "      --cuda-fuse 0|1     fused launches (default 1; 0: op by op)\n"                                \
    "      --cuda-pdl 0|1      programmatic dependent launch, compute capability 9.0+ (default 0)\n"     \
    "      --cuda-pdl-prefetch N  weight chunks per warp the matmul prefetches under PDL (0..64, default 4)\n"

/* Sets the switch called name (an entry of SD_BACKEND_LONG_OPTIONS) from
 * arg (NULL for --host-verify). A bad value: false, with a line on stderr
 * that starts with prog and names the option. */
bool sd_backend_opts_parse(sd_backend_opts *o, const char *name, const char *arg, const char *prog);

/* The switches that differ from the defaults as command-line text
 * ("--cuda-graphs 0 --cpu-weights f32"; "" when none), into buf[len]; for
 * benchmark reports. */
void sd_backend_opts_describe(const sd_backend_opts *o, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
