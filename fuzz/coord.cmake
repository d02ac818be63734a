# Coordinator protocol fuzzing (hostile workers and clients, then faithful
# workers until every request has ended): fuzz_coord (libFuzzer, clang only)
# and fuzz_coord_replay (any compiler) which CTest runs over fuzz/corpus/coord.
# Both make their target model with specd-mkmodel. Run the fuzzer with
# fuzz/run-fuzz coord.
specd_fuzz_target(coord fuzz_coord.c MKMODEL LIBS specd_coord)
