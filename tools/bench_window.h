/* bench_window.h — `specd-bench window` (bench_window.c). */
#ifndef SPECD_BENCH_WINDOW_H
#define SPECD_BENCH_WINDOW_H
/* Runs the sliding-window benchmark with argv[1] == "window"; returns the exit status. */
int bench_window_main(int argc, char **argv);
#endif
