specd_tool(specd-bench ${CMAKE_CURRENT_SOURCE_DIR}/specd-bench.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_spec.c
           ${CMAKE_CURRENT_SOURCE_DIR}/bench_gpu.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_prompts.c
           ${CMAKE_CURRENT_SOURCE_DIR}/bench_stats.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_hygiene.c
           ${CMAKE_CURRENT_SOURCE_DIR}/bench_link.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_window.c)
