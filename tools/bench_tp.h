/* bench_tp.h — the `tp` mode of specd-bench (bench_tp.c). */
#ifndef SPECD_BENCH_TP_H
#define SPECD_BENCH_TP_H

/* Runs `specd-bench tp ...` (argv[1] == "tp"); returns the exit code. */
int bench_tp_main(int argc, char **argv);

#endif
