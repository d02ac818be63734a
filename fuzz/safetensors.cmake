# safetensors header fuzzing: fuzz_safetensors (libFuzzer, clang only) and
# fuzz_safetensors_replay (any compiler) which CTest runs over
# fuzz/corpus/safetensors. Run the fuzzer with fuzz/run-fuzz safetensors.
specd_fuzz_target(safetensors fuzz_safetensors.c LIBS specd_engine)
