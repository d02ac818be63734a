/* bench_http.h — `specd-bench http` (bench_http.c). */
#ifndef SPECD_BENCH_HTTP_H
#define SPECD_BENCH_HTTP_H
/* Runs the HTTP gateway benchmark with argv[1] == "http"; returns the exit status. */
int bench_http_main(int argc, char **argv);
#endif
