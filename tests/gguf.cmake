# GGUF reader/writer and dequantization (engine/gguf.c, gguf_write.c, quant.c).
# gguf_dump: lists a GGUF file or dumps one tensor as f32 (used by test_dequant.py).
add_executable(gguf_dump ${CMAKE_CURRENT_SOURCE_DIR}/gguf_dump.c)
target_link_libraries(gguf_dump PRIVATE specd_engine)

specd_unit_test(test_gguf ${CMAKE_CURRENT_SOURCE_DIR}/test_gguf.c)
add_test(NAME test_gguf_model COMMAND test_gguf --model)
set_tests_properties(test_gguf_model PROPERTIES LABELS "unit;model" SKIP_RETURN_CODE 77 TIMEOUT 300)
specd_unit_test(test_gguf_corrupt ${CMAKE_CURRENT_SOURCE_DIR}/test_gguf_corrupt.c)
# sd_dequantize and the reader's listings against the gguf Python package.
specd_py_test(test_dequant ref/test_dequant.py LABELS "oracle;model")
