# `specd-bench tp` (tools/bench_tp.c) runs a real verifier group: it links the
# group's control plane (verifier/group.c).
if(TARGET specd_verifier_core AND TARGET specd-bench)
  target_sources(specd-bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/bench_tp.c)
  target_include_directories(specd-bench PRIVATE ${CMAKE_SOURCE_DIR}/verifier)
  target_link_libraries(specd-bench PRIVATE specd_verifier_core specd_net)
  target_compile_definitions(specd-bench PRIVATE SPECD_BENCH_TP=1)
endif()
