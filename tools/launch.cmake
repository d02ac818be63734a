# specd-launch lives in deploy/ (with its README); it needs the net library's
# code, so it is built once net/ has sources.
get_target_property(_specd_net_type specd_net TYPE)
if(_specd_net_type STREQUAL "INTERFACE_LIBRARY")
  message(STATUS "specd: net/ has no sources yet; specd-launch is not built")
else()
  add_subdirectory(${CMAKE_SOURCE_DIR}/deploy ${CMAKE_BINARY_DIR}/deploy)
endif()

# `specd-bench serve` (tools/bench_serve.c) talks to the running service
# through libspecd-client.
if(TARGET specd_client AND TARGET specd-bench)
  target_sources(specd-bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/bench_serve.c)
  target_link_libraries(specd-bench PRIVATE specd_client)
  target_compile_definitions(specd-bench PRIVATE SPECD_BENCH_SERVE=1)
endif()

# `specd-bench http` (tools/bench_http.c) drives the gateway over HTTP with
# libcurl beside the same load through libspecd-client.
pkg_check_modules(CURL IMPORTED_TARGET libcurl)
if(TARGET specd_client AND TARGET specd-bench AND CURL_FOUND)
  target_sources(specd-bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/bench_http.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_prom.c)
  target_link_libraries(specd-bench PRIVATE PkgConfig::CURL PkgConfig::CJSON)
  target_compile_definitions(specd-bench PRIVATE SPECD_BENCH_HTTP=1)
elseif(TARGET specd-bench)
  message(STATUS "specd: libcurl not found (libcurl4-openssl-dev); specd-bench has no http mode")
endif()
