specd_tool(specd-mkmodel ${CMAKE_CURRENT_SOURCE_DIR}/specd-mkmodel.c ${CMAKE_CURRENT_SOURCE_DIR}/mkmodel_hf.c)
