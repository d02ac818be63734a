# CUDA backend (engine/cuda/): every op against its CPU twin, the model on the
# GPU against the CPU, GPU speculative verification against the CPU's.
# Each exits 77 (skipped, saying why) without a CUDA build or a usable GPU.
specd_unit_test(test_cuda_ops test_cuda_ops.c)
target_include_directories(test_cuda_ops PRIVATE ${CMAKE_SOURCE_DIR}/engine)
specd_unit_test(test_cuda_model test_cuda_model.c greedy_util.c ${CMAKE_SOURCE_DIR}/tools/bench_prompts.c)
target_include_directories(test_cuda_model PRIVATE ${CMAKE_SOURCE_DIR}/tools)
target_compile_definitions(test_cuda_model PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>"
                                                   SPECD_QUANTIZE="$<TARGET_FILE:specd-quantize>")
add_dependencies(test_cuda_model specd-mkmodel specd-quantize)
specd_unit_test(test_cuda_spec test_cuda_spec.c)
target_include_directories(test_cuda_spec PRIVATE ${CMAKE_SOURCE_DIR}/engine)
