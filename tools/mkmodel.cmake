specd_tool(specd-mkmodel ${CMAKE_CURRENT_SOURCE_DIR}/specd-mkmodel.c ${CMAKE_CURRENT_SOURCE_DIR}/mkmodel_hf.c
           ${CMAKE_CURRENT_SOURCE_DIR}/mkmodel_hf_spm.c ${CMAKE_CURRENT_SOURCE_DIR}/mkmodel_rope.c)
target_include_directories(specd-mkmodel PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)
