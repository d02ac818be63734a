# Decoder fuzzing at hostile sizes (the unpack budget, NULs in text): every
# link's decoder on raw bytes, with a mutator that repeats fields inside the
# envelope's body: fuzz_decode (libFuzzer, clang only) and fuzz_decode_replay
# (any compiler) which CTest runs over fuzz/corpus/decode. Run the fuzzer
# with fuzz/run-fuzz decode (-max_len 8 MiB).
specd_fuzz_target(decode fuzz_decode.c LIBS specd_net)
