# Hugging Face tokenizer.json fuzzing (sd_tok_from_hf_json, engine-private):
# fuzz_tokenizer_json (libFuzzer, clang only) and fuzz_tokenizer_json_replay
# (any compiler) which CTest runs over fuzz/corpus/tokenizer_json. Run the
# fuzzer with fuzz/run-fuzz tokenizer_json.
specd_fuzz_target(tokenizer_json fuzz_tokenizer_json.c LIBS specd_engine)
foreach(t fuzz_tokenizer_json_replay fuzz_tokenizer_json)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)
  endif()
endforeach()
