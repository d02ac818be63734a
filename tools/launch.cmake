# specd-launch lives in deploy/ (with its README); it needs the net library's
# code, so it is built once net/ has sources.
get_target_property(_specd_net_type specd_net TYPE)
if(_specd_net_type STREQUAL "INTERFACE_LIBRARY")
  message(STATUS "specd: net/ has no sources yet; specd-launch is not built")
else()
  add_subdirectory(${CMAKE_SOURCE_DIR}/deploy ${CMAKE_BINARY_DIR}/deploy)
endif()
