# GGUF reader fuzzing: fuzz_gguf (libFuzzer, clang only) and fuzz_gguf_replay
# (any compiler) which CTest runs over fuzz/corpus/gguf.
add_executable(fuzz_gguf_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_gguf.c)
target_link_libraries(fuzz_gguf_replay PRIVATE specd_engine)
target_compile_definitions(fuzz_gguf_replay PRIVATE SD_FUZZ_REPLAY_MAIN)
file(GLOB SPECD_GGUF_SEEDS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/gguf/*)
add_test(NAME fuzz_gguf_corpus COMMAND fuzz_gguf_replay ${SPECD_GGUF_SEEDS})
set_tests_properties(fuzz_gguf_corpus PROPERTIES LABELS "unit" TIMEOUT 300)

if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_gguf ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_gguf.c)
  target_link_libraries(fuzz_gguf PRIVATE specd_engine)
  target_compile_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
endif()
