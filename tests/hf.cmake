# Hugging Face checkpoints: the safetensors reader/writer (engine/safetensors*.c,
# every header rule with its own corrupt file) and the checkpoint-directory
# weights source (engine/weights_hf.c, engine/tokenizer_hf.c) against the same
# random model written as GGUF by specd-mkmodel (bit-identical logits).
specd_unit_test(test_safetensors test_safetensors.c)
specd_unit_test(test_weights_hf test_weights_hf.c)
target_include_directories(test_weights_hf PRIVATE ${CMAKE_SOURCE_DIR}/engine)
target_compile_definitions(test_weights_hf PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_weights_hf specd-mkmodel)
