specd_tool(specd-generate ${CMAKE_CURRENT_SOURCE_DIR}/specd-generate.c ${CMAKE_CURRENT_SOURCE_DIR}/gen_spec.c
           ${CMAKE_CURRENT_SOURCE_DIR}/gen_features.c ${CMAKE_CURRENT_SOURCE_DIR}/gen_json.c
           ${CMAKE_CURRENT_SOURCE_DIR}/bench_prompts.c
           ${CMAKE_CURRENT_SOURCE_DIR}/gen_constrain.c)
