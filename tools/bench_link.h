/* bench_link.h — `specd-bench link` (bench_link.c). */
#ifndef SPECD_BENCH_LINK_H
#define SPECD_BENCH_LINK_H
/* Runs the link benchmark with argv[1] == "link"; returns the exit status. */
int bench_link_main(int argc, char **argv);
#endif
