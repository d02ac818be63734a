/* bench_gpu.h — `specd-bench gpu` (bench_gpu.c): decode against the device's
 * bandwidth floor, k-token call cost and batch throughput on a CUDA GPU. */
#ifndef SPECD_BENCH_GPU_H
#define SPECD_BENCH_GPU_H

/* argv[1] is "gpu"; returns the process exit code (77: no usable GPU). */
int bench_gpu_main(int argc, char **argv);

#endif
