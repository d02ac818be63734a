# specd-bench: its forward mode runs end to end on a tiny random model and
# prints a complete table (the committed bench/results/ come from this mode).
specd_py_test(bench_forward_smoke ref/test_bench_forward.py LABELS unit)
# Benchmark hygiene: the foreign CPU share around a repetition sees a spinning child and drops the repetition.
specd_unit_test(test_bench_hygiene test_bench_hygiene.c ${CMAKE_SOURCE_DIR}/tools/bench_hygiene.c)
target_include_directories(test_bench_hygiene PRIVATE ${CMAKE_SOURCE_DIR}/tools)
# The one prompt-file reader of specd-bench, specd-generate --prompt-file and the greedy tests.
specd_unit_test(test_bench_prompts test_bench_prompts.c ${CMAKE_SOURCE_DIR}/tools/bench_prompts.c)
target_include_directories(test_bench_prompts PRIVATE ${CMAKE_SOURCE_DIR}/tools)
# specd-bench http's reader of the gateway's forwarding histogram: series by
# label, scrape differences, interpolated quantiles, malformed input refused.
specd_unit_test(test_bench_prom test_bench_prom.c ${CMAKE_SOURCE_DIR}/tools/bench_prom.c)
target_include_directories(test_bench_prom PRIVATE ${CMAKE_SOURCE_DIR}/tools)
target_link_libraries(test_bench_prom PRIVATE m)
