# GGUF reader/writer and dequantization (engine/gguf.c, gguf_write.c, quant.c).
add_executable(gguf_dump ${CMAKE_CURRENT_SOURCE_DIR}/gguf_dump.c)
target_link_libraries(gguf_dump PRIVATE specd_engine)
