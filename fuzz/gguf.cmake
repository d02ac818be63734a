# GGUF reader fuzzing: fuzz_gguf (libFuzzer, clang only) and fuzz_gguf_replay
# (any compiler) which CTest runs over fuzz/corpus/gguf. Run the fuzzer with
# fuzz/run-fuzz gguf.
specd_fuzz_target(gguf fuzz_gguf.c LIBS specd_engine)
