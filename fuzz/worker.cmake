# Worker request-handling fuzzing (a hostile coordinator against the
# verifier's and the drafter's handlers): fuzz_worker (libFuzzer, clang only)
# and fuzz_worker_replay (any compiler) which CTest runs over
# fuzz/corpus/worker. Both make their model with specd-mkmodel. Run the
# fuzzer with fuzz/run-fuzz worker.
specd_fuzz_target(worker fuzz_worker.c MKMODEL LIBS specd_verifier_core specd_drafter_core specd_net)
