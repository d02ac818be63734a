# Tokenizer and streaming decoder fuzzing (lossless byte-level round trip,
# valid UTF-8 out of the stream): fuzz_tokenizer (libFuzzer, clang only) and
# fuzz_tokenizer_replay (any compiler) which CTest runs over
# fuzz/corpus/tokenizer. Both make their tokenizer with specd-mkmodel unless
# SPECD_FUZZ_TOKENIZER names a GGUF. Run the fuzzer with fuzz/run-fuzz tokenizer.
specd_fuzz_target(tokenizer fuzz_tokenizer.c MKMODEL LIBS specd_engine)
