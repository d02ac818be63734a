# Tokenizer: unit tests (small in-test vocabularies, plus the demo model when
# present) and the Hugging Face oracle comparison driven through tok_cli.
specd_unit_test(test_tokenizer ${CMAKE_CURRENT_SOURCE_DIR}/test_tokenizer.c)
target_include_directories(test_tokenizer PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)

add_executable(tok_cli ${CMAKE_CURRENT_SOURCE_DIR}/tok_cli.c)
target_link_libraries(tok_cli PRIVATE specd_engine)
target_include_directories(tok_cli PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)
target_compile_definitions(tok_cli PRIVATE _GNU_SOURCE)

specd_py_test(test_tokenizer_hf ref/test_tokenizer_hf.py LABELS "oracle;model")

# Chat templates: specd's formatter (driven through chat_cli) against jinja2
# rendering the real templates in tests/data/chat_templates/, and the
# template read from a GGUF / Hugging Face directory by specd-generate.
add_executable(chat_cli ${CMAKE_CURRENT_SOURCE_DIR}/chat_cli.c)
target_link_libraries(chat_cli PRIVATE specd_engine)
target_compile_definitions(chat_cli PRIVATE _GNU_SOURCE)
specd_py_test(test_chat_templates ref/test_chat_templates.py LABELS "oracle;unit")
specd_py_test(test_chat_template_model ref/test_chat_template_model.py LABELS "oracle;unit")
# Tools, tool calls and tool turns against jinja2 running Llama 3.1's template.
specd_py_test(test_chat_tools ref/test_chat_tools.py LABELS "oracle;unit")

# SentencePiece-style tokenizer on small in-test vocabularies.
specd_unit_test(test_tokenizer_spm ${CMAKE_CURRENT_SOURCE_DIR}/test_tokenizer_spm.c)
target_include_directories(test_tokenizer_spm PRIVATE ${CMAKE_SOURCE_DIR}/engine/formats)
# The real Gemma 3 270M vocabulary (tools/fetch-model gemma3, fetched by
# scripts/setup) against Hugging Face tokenizers, and in the slow tier
# against llama.cpp (llama-cpp-python, scripts/setup --llama).
specd_py_test(test_tokenizer_spm_hf ref/test_tokenizer_spm.py LABELS "oracle;model")
specd_py_test(test_tokenizer_spm_llama ref/test_tokenizer_spm.py ARGS --llama LABELS "oracle;model;slow")
