# Forward-pass oracle: specd_logits dumps the engine's logits, the numpy
# reference (tests/ref/llama_ref.py) recomputes them. Built only once the
# engine has a forward pass (engine/model_forward.c), so the tree builds before it lands.
if(EXISTS ${CMAKE_SOURCE_DIR}/engine/model_forward.c)
  add_executable(specd_logits ${CMAKE_CURRENT_SOURCE_DIR}/specd_logits.c)
  target_link_libraries(specd_logits PRIVATE specd_engine PkgConfig::CJSON)
  target_compile_definitions(specd_logits PRIVATE _GNU_SOURCE)
  specd_py_test(forward_oracle_random ref/test_forward_oracle.py ARGS --random LABELS oracle)
  specd_py_test(forward_oracle_smollm2 ref/test_forward_oracle.py ARGS --smollm2 LABELS "oracle;model")
endif()
