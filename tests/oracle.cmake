# Forward-pass oracle: specd_logits dumps the engine's logits, the numpy
# reference (tests/ref/llama_ref.py) recomputes them. Built only once the
# engine has a forward pass (engine/model_forward.c), so the tree builds before it lands.
if(EXISTS ${CMAKE_SOURCE_DIR}/engine/model_forward.c)
  add_executable(specd_logits ${CMAKE_CURRENT_SOURCE_DIR}/specd_logits.c)
  target_link_libraries(specd_logits PRIVATE specd_engine PkgConfig::CJSON)
  target_compile_definitions(specd_logits PRIVATE _GNU_SOURCE)
  specd_py_test(forward_oracle_random ref/test_forward_oracle.py ARGS --random LABELS oracle)
  specd_py_test(forward_oracle_smollm2 ref/test_forward_oracle.py ARGS --smollm2 LABELS "oracle;model")
  # qwen2, qwen3, gemma3 and mistral random models (biases, q/k norms,
  # post-norms, GeGLU, NeoX RoPE, sliding windows) against the same oracle
  specd_py_test(arch_oracle ref/test_arch_oracle.py LABELS oracle)
  # the real Gemma 3 270M (SPECD_GEMMA_MODEL or tools/fetch-model gemma3;
  # skipped without it) on token ids against the same oracle
  specd_py_test(gemma_oracle ref/test_gemma_oracle.py LABELS "oracle;model;slow")
endif()
# llama.cpp as an independent oracle (llama-cpp-python; scripts/setup --llama
# builds it from source once): tokenization, teacher-forced argmax and logits,
# greedy agreement on the demo model in F16, Q8_0, Q4_0, Q4_1 (and Q4_K_M
# written by llama.cpp's quantizer when specd reads K-quants). Slow tier.
if(EXISTS ${CMAKE_SOURCE_DIR}/engine/model_forward.c)
  specd_py_test(llama_oracle ref/test_llama_oracle.py LABELS "oracle;model;slow")
endif()
# llama.cpp against specd per architecture (llama, qwen2, qwen3, gemma3,
# mistral, phi3) on random models in F16, Q8_0 and llama.cpp's Q4_K_M:
# tokenization, teacher-forced logits and argmax, free-running greedy
# (skipped without llama-cpp-python); the slow one at real models' widths.
# Both are in the slow tier, which is where scripts/test installs
# llama-cpp-python (a build from source the default run has no time for);
# in the default tier the first one would only ever skip there.
if(EXISTS ${CMAKE_SOURCE_DIR}/engine/model_forward.c)
  specd_py_test(arch_llama_oracle ref/test_arch_llama_oracle.py LABELS "oracle;slow")
  specd_py_test(arch_llama_oracle_slow ref/test_arch_llama_oracle.py ARGS --slow LABELS "oracle;slow")
  set_tests_properties(arch_llama_oracle_slow PROPERTIES TIMEOUT 2400)
  # the real Gemma 3 270M (tools/fetch-model gemma3) against llama.cpp over 20 prompts
  specd_py_test(gemma_llama_oracle ref/test_gemma_llama.py LABELS "oracle;model;slow")
  set_tests_properties(gemma_llama_oracle PROPERTIES TIMEOUT 2400)
endif()
