# safetensors header fuzzing: fuzz_safetensors (libFuzzer, clang only) and
# fuzz_safetensors_replay (any compiler) which CTest runs over
# fuzz/corpus/safetensors. Run the fuzzer with fuzz/run-fuzz safetensors.
add_executable(fuzz_safetensors_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.c)
target_link_libraries(fuzz_safetensors_replay PRIVATE specd_engine)
target_compile_definitions(fuzz_safetensors_replay PRIVATE SD_FUZZ_REPLAY_MAIN)
file(GLOB SPECD_ST_SEEDS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/safetensors/*)
add_test(NAME fuzz_safetensors_corpus COMMAND fuzz_safetensors_replay ${SPECD_ST_SEEDS})
set_tests_properties(fuzz_safetensors_corpus PROPERTIES LABELS "unit" TIMEOUT 300)

if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_safetensors ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.c)
  target_link_libraries(fuzz_safetensors PRIVATE specd_engine)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
endif()
