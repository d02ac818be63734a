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
# 64 concurrent streams under specd-launch (K fixed): greedy text and usage
# equal specd-generate's, the speculation metrics consistent (6 tokens at
# K = 2: ~10 s in a Release build, ~70 s under ASan at load 6 on the 2-core
# machine, lighter than it_greedy_smollm_self_64); with the drafter
# SIGKILLed mid-run, nothing lost and /metrics shows the killed drafter
# down and its replacement up (slow: 12 tokens at K = 4, ~20 s Release,
# ~4 min under ASan at load 7).
specd_py_test(it_gateway_streams ${_it}test_gateway_streams.py ARGS --tokens 6 --k 2 --prompts 4
              LABELS integration model)
specd_py_test(it_gateway_streams_drafter_kill ${_it}test_gateway_streams.py ARGS --kill-drafter --tokens 12
              LABELS integration model slow)
set_tests_properties(it_gateway_streams it_gateway_streams_drafter_kill PROPERTIES RESOURCE_LOCK specd_integration)
specd_unit_test(test_gateway_parse test_gateway_parse.c)
target_link_libraries(test_gateway_parse PRIVATE specd_gateway_openai)
# /metrics text from a made-up coordinator snapshot (gateway/metrics.c, compiled in).
# The forwarding histogram is read back with specd-bench's reader (tools/bench_prom.c).
specd_unit_test(test_gateway_metrics test_gateway_metrics.c ${CMAKE_SOURCE_DIR}/gateway/metrics.c
                ${CMAKE_SOURCE_DIR}/tools/bench_prom.c)
target_include_directories(test_gateway_metrics PRIVATE ${CMAKE_SOURCE_DIR}/tools)
target_link_libraries(test_gateway_metrics PRIVATE specd_gateway_openai m)
# specd-bench http (tools/bench_http.c, built where libcurl is) against a live gateway.
if(TARGET specd-bench AND CURL_FOUND)
  specd_py_test(it_bench_http ${_it}test_bench_http.py LABELS integration)
  set_tests_properties(it_bench_http PROPERTIES RESOURCE_LOCK specd_integration)
endif()
# echo for completions: prompt logprobs (prefill) and prompts of ids
specd_py_test(it_gateway_echo ${_it}test_gateway_echo.py LABELS integration model)
set_tests_properties(it_gateway_echo PROPERTIES RESOURCE_LOCK specd_integration)
# Structured output (response_format json_schema / json_object, the grammar
# extension) through the openai client: specd-generate's text, valid JSON,
# unsupported schema keywords a 400 naming them.
specd_py_test(it_gateway_structured ${_it}test_gateway_structured.py LABELS integration model)
set_tests_properties(it_gateway_structured PROPERTIES RESOURCE_LOCK specd_integration)

# vLLM's guided_json / guided_regex / guided_grammar / guided_choice through
# the openai client's extra_body: specd-generate's text; conflicts a 400.
specd_py_test(it_gateway_guided ${_it}test_gateway_guided.py LABELS integration model)
set_tests_properties(it_gateway_guided PROPERTIES RESOURCE_LOCK specd_integration)
# Tool calls in each family's syntax (Hermes, Llama 3.1, Mistral) parsed from
# an answer and streamed as deltas fed in pieces (gateway/tool_formats.c,
# gateway/tool_stream.c).
specd_unit_test(test_gateway_tools test_gateway_tools.c)
target_link_libraries(test_gateway_tools PRIVATE specd_gateway_openai)
# tool_choice "auto" streamed: content until a call marker, then the calls'
# arguments in fragments that reassemble into the unstreamed call (openai client).
specd_py_test(it_gateway_tools ${_it}test_gateway_tools.py LABELS integration model)
set_tests_properties(it_gateway_tools PROPERTIES RESOURCE_LOCK specd_integration)
# Tools rendered by Llama 3.1's template on the coordinator (--chat-template
# llama3.1 on SmolLM2): a tool round trip answers as the jinja2 rendering of
# the real template does, greedily; a forced call parses.
specd_py_test(it_gateway_tools_llama ${_it}test_gateway_tools_llama.py LABELS integration model)
set_tests_properties(it_gateway_tools_llama PROPERTIES RESOURCE_LOCK specd_integration)
# Tools rendered by Mistral's v3 template (--chat-template mistral-v3 on
# SmolLM2): a forced call's id is 9 letters and digits; the call and its
# tool answer (tool_call_id) come back and answer as the jinja2 rendering of
# the real template does, greedily; a tool turn without its id is a 400.
specd_py_test(it_gateway_tools_mistral ${_it}test_gateway_tools_mistral.py LABELS integration model)
set_tests_properties(it_gateway_tools_mistral PROPERTIES RESOURCE_LOCK specd_integration)
# The same under Mistral-Nemo's template (--chat-template mistral-nemo: the
# v3 form without the spaces after the tags).
specd_py_test(it_gateway_tools_mistral_nemo ${_it}test_gateway_tools_mistral_nemo.py LABELS integration model)
set_tests_properties(it_gateway_tools_mistral_nemo PROPERTIES RESOURCE_LOCK specd_integration)
# Tools rendered by Qwen 2.5's template (--chat-template qwen2.5 on SmolLM2):
# forced, auto and parallel calls (Qwen's <tool_call> blocks) parse into
# tool_calls, streamed alike; the calls and two tool answers (<tool_response>
# in one user turn) answer as the jinja2 rendering of the real template does.
specd_py_test(it_gateway_tools_qwen ${_it}test_gateway_tools_qwen.py LABELS integration model)
set_tests_properties(it_gateway_tools_qwen PROPERTIES RESOURCE_LOCK specd_integration)
