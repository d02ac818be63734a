# engine/base: the command-line number parser (cli.c). The sampling contract
# (sampling.c) is tested in test_sample.c; the client's link closure in
# client_deps.cmake.
specd_unit_test(test_cli ${CMAKE_CURRENT_SOURCE_DIR}/test_cli.c)
