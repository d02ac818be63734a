/* bench_spec.h — the `spec` mode of specd-bench (bench_spec.c). */
#ifndef SPECD_BENCH_SPEC_H
#define SPECD_BENCH_SPEC_H

/* Runs `specd-bench spec ...` (argv[1] == "spec"); returns the exit code. */
int bench_spec_main(int argc, char **argv);

#endif
