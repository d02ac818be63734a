# specd-gateway: the OpenAI-compatible HTTP API against a live service
# (tests/integration/test_gateway_*.py; labels integration, model where they
# need SmolLM2). They share the integration tests' resource lock.
set(_it integration/)
specd_py_test(it_gateway_openai ${_it}test_gateway_openai.py LABELS integration model)
set_tests_properties(it_gateway_openai PROPERTIES RESOURCE_LOCK specd_integration)
specd_py_test(it_gateway_logprobs ${_it}test_gateway_logprobs.py LABELS integration model)
set_tests_properties(it_gateway_logprobs PROPERTIES RESOURCE_LOCK specd_integration)
specd_py_test(it_gateway_http ${_it}test_gateway_http.py LABELS integration)
set_tests_properties(it_gateway_http PROPERTIES RESOURCE_LOCK specd_integration)
specd_py_test(it_gateway_load ${_it}test_gateway_load.py LABELS integration model)
set_tests_properties(it_gateway_load PROPERTIES RESOURCE_LOCK specd_integration)
specd_unit_test(test_gateway_parse test_gateway_parse.c)
target_link_libraries(test_gateway_parse PRIVATE specd_gateway_openai)
# specd-bench http (tools/bench_http.c, built where libcurl is) against a live gateway.
if(TARGET specd-bench AND CURL_FOUND)
  specd_py_test(it_bench_http ${_it}test_bench_http.py LABELS integration)
  set_tests_properties(it_bench_http PROPERTIES RESOURCE_LOCK specd_integration)
endif()
