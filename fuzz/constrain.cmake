# The constraint compilers (GBNF, regex, JSON Schema) and the matcher on
# hostile text: fuzz_constrain (libFuzzer, clang only) and
# fuzz_constrain_replay, which CTest runs over fuzz/corpus/constrain.
specd_fuzz_target(constrain fuzz_constrain.c LIBS specd_constrain)
