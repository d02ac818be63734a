# engine/base: the command-line number parser (cli.c); engine/formats: the
# one RoPE scaling reader (model_config.c). The sampling contract
# (sampling.c) is tested in test_sample.c; the client's link closure in
# client_deps.cmake.
specd_unit_test(test_cli ${CMAKE_CURRENT_SOURCE_DIR}/test_cli.c)
specd_unit_test(test_rope_scaling ${CMAKE_CURRENT_SOURCE_DIR}/test_rope_scaling.c)
# engine/base: model text into JSON (sd_json_quote) and NULs in JSON input.
specd_unit_test(test_json_text ${CMAKE_CURRENT_SOURCE_DIR}/test_json_text.c)
