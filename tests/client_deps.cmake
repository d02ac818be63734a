# libspecd-client links no model code (issue 19): a probe program built from
# the whole client, net, base and protocol archives (it fails to link if any
# of their objects refers to the engine above base), then its dependencies
# and symbols checked by tests/check_client_deps.sh.
add_library(client_link_probe_obj OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/client_link_probe.c)
target_link_libraries(client_link_probe_obj PRIVATE specd_client) # include paths only: objects do not link
add_executable(client_link_probe $<TARGET_OBJECTS:client_link_probe_obj>)
add_dependencies(client_link_probe specd_client specd_net specd_base specd_proto)
target_link_libraries(client_link_probe PRIVATE
  -Wl,--whole-archive $<TARGET_FILE:specd_client> $<TARGET_FILE:specd_net> $<TARGET_FILE:specd_base>
  $<TARGET_FILE:specd_proto> -Wl,--no-whole-archive PkgConfig::ZMQ PkgConfig::PROTOBUFC Threads::Threads m)
add_test(NAME client_links_no_model_code
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_client_deps.sh $<TARGET_FILE:client_link_probe>
                 $<TARGET_FILE:specd-client>)
set_tests_properties(client_links_no_model_code PROPERTIES LABELS "unit" TIMEOUT 60)
