# Coordinator protocol fuzzing (hostile workers and clients, then faithful
# workers until every request has ended): fuzz_coord (libFuzzer, clang only)
# and fuzz_coord_replay (any compiler) which CTest runs over fuzz/corpus/coord.
# Both make their target model with specd-mkmodel. Run the fuzzer with
# fuzz/run-fuzz coord.
specd_fuzz_target(coord fuzz_coord.c specd_coord)
foreach(t fuzz_coord_replay fuzz_coord)
  if(TARGET ${t})
    target_compile_definitions(${t} PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
    add_dependencies(${t} specd-mkmodel)
  endif()
endforeach()
