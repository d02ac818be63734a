# specd-coordinator links no model code and no CUDA (issue 36): its binary's
# shared libraries and symbols checked by tests/check_coord_deps.sh (like the
# client's, client_deps.cmake).
add_test(NAME coordinator_links_no_model_code
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_coord_deps.sh $<TARGET_FILE:specd-coordinator>)
add_test(NAME coordinator_links_no_model_code_self_test COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_coord_deps.sh --self-test)
set_tests_properties(coordinator_links_no_model_code coordinator_links_no_model_code_self_test
                     PROPERTIES LABELS "unit" TIMEOUT 60)
