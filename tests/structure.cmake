# The tree's own rules, checked on its sources (issue 36): no library code
# reads the environment (tests/check_no_getenv.sh) and no product source file
# is over 800 lines (tests/check_file_size.sh) and no product function over
# 120 (tests/check_function_size.sh). Each check also runs its
# --self-test, which shows on a made-up tree that it can fail.
add_test(NAME library_reads_no_environment COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_no_getenv.sh ${CMAKE_SOURCE_DIR})
add_test(NAME library_reads_no_environment_self_test COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_no_getenv.sh --self-test)
add_test(NAME product_files_at_most_800_lines COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_file_size.sh ${CMAKE_SOURCE_DIR})
add_test(NAME product_files_at_most_800_lines_self_test
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_file_size.sh --self-test)
add_test(NAME product_functions_at_most_120_lines
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_function_size.sh ${CMAKE_SOURCE_DIR})
add_test(NAME product_functions_at_most_120_lines_self_test
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_function_size.sh --self-test)
set_tests_properties(library_reads_no_environment library_reads_no_environment_self_test
                     product_files_at_most_800_lines product_files_at_most_800_lines_self_test
                     product_functions_at_most_120_lines product_functions_at_most_120_lines_self_test
                     PROPERTIES LABELS "unit" TIMEOUT 60)
