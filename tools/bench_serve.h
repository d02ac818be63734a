/* bench_serve.h — `specd-bench serve` (bench_serve.c). */
#ifndef SPECD_BENCH_SERVE_H
#define SPECD_BENCH_SERVE_H
/* Runs the serve benchmark with argv[1] == "serve"; returns the exit status. */
int bench_serve_main(int argc, char **argv);
#endif
