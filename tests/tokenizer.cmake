# Tokenizer: unit tests (small in-test vocabularies, plus the demo model when
# present) and the Hugging Face oracle comparison driven through tok_cli.
specd_unit_test(test_tokenizer ${CMAKE_CURRENT_SOURCE_DIR}/test_tokenizer.c)
target_include_directories(test_tokenizer PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)

add_executable(tok_cli ${CMAKE_CURRENT_SOURCE_DIR}/tok_cli.c)
target_link_libraries(tok_cli PRIVATE specd_engine)
target_compile_definitions(tok_cli PRIVATE _GNU_SOURCE)

specd_py_test(test_tokenizer_hf ref/test_tokenizer_hf.py LABELS "oracle;model")
