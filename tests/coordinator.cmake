# Coordinator (coordinator/*.c): scheduling logic with fake workers, and the
# loop over real sockets with fake DEALER peers.
if(TARGET specd_coord)
  specd_unit_test(test_coordinator test_coordinator.c)
  target_link_libraries(test_coordinator PRIVATE specd_coord)
  target_compile_definitions(test_coordinator PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
  add_dependencies(test_coordinator specd-mkmodel)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_coordinator_net.c)
    specd_unit_test(test_coordinator_net test_coordinator_net.c)
    target_link_libraries(test_coordinator_net PRIVATE specd_coord Threads::Threads)
    target_compile_definitions(test_coordinator_net PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
    add_dependencies(test_coordinator_net specd-mkmodel)
  endif()
endif()
