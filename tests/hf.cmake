# Hugging Face checkpoints: the safetensors reader/writer (engine/safetensors*.c,
# every header rule with its own corrupt file) and the checkpoint-directory
# weights source (engine/weights_hf.c, engine/tokenizer_hf.c) against the same
# random model written as GGUF by specd-mkmodel (bit-identical logits).
specd_unit_test(test_safetensors test_safetensors.c)
specd_unit_test(test_weights_hf test_weights_hf.c)
target_include_directories(test_weights_hf PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)
target_compile_definitions(test_weights_hf PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_weights_hf specd-mkmodel)
# Oracles (.venv): the engine's logits from an HF directory against a numpy
# forward pass with Hugging Face's own rotate-half RoPE reading the files
# through the `safetensors` package; tokenizer.json through HF `tokenizers`;
# st_check's verdicts against the reference reader's on crafted files.
add_executable(st_check ${CMAKE_CURRENT_SOURCE_DIR}/st_check.c)
target_link_libraries(st_check PRIVATE specd_engine)
specd_py_test(hf_oracle ref/test_hf_oracle.py ARGS --random LABELS oracle)
specd_py_test(hf_oracle_smollm2 ref/test_hf_oracle.py ARGS --smollm2 LABELS "oracle;model")
# The demo model converted to an f32 checkpoint: bit-identical logits and vocabulary hash.
add_test(NAME test_weights_hf_model COMMAND test_weights_hf --model)
set_tests_properties(test_weights_hf_model PROPERTIES LABELS "unit;model" SKIP_RETURN_CODE 77 TIMEOUT 600)
# The architectures beyond Llama as HF checkpoints (Qwen2, Qwen3, Gemma 3,
# Phi-3, Mistral) against the same random model as GGUF: equal configs,
# bit-identical tensors and logits, equal tokenization; refusals that name
# the missing tensor or the unsupported class / key.
specd_unit_test(test_weights_hf_arch test_weights_hf_arch.c)
target_include_directories(test_weights_hf_arch PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)
target_compile_definitions(test_weights_hf_arch PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_weights_hf_arch specd-mkmodel)
# The same checkpoints read by the reference packages (`safetensors`, `gguf`):
# each GGUF tensor equals its HF tensor after llama.cpp's converter transforms.
specd_py_test(hf_arch_tensors ref/test_hf_arch_tensors.py LABELS oracle)
# specd-mkmodel's SentencePiece tokenizer.json (Gemma 3's real 262k vocabulary,
# tools/fetch-model gemma3): the converter's merge list, HF `tokenizers` on the
# written file = specd on the GGUF, specd on the directory = specd on the GGUF.
specd_py_test(hf_spm_writer ref/test_hf_spm_writer.py LABELS "oracle;model")
# The real shapes (Qwen2.5-0.5B, Qwen3-0.6B, Gemma-3-270M; bf16) both ways: bit-identical logits.
add_test(NAME test_weights_hf_shapes COMMAND test_weights_hf_arch --shapes)
set_tests_properties(test_weights_hf_shapes PROPERTIES LABELS "unit;slow" TIMEOUT 1800)
