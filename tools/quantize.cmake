specd_tool(specd-quantize ${CMAKE_CURRENT_SOURCE_DIR}/specd-quantize.c)
