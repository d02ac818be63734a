# specd-coll-test: nccl-tests-shaped collective benchmark (shm ranks forked;
# NCCL ranks one thread per GPU when the engine compiles engine/cuda/coll_nccl.c).
specd_tool(specd-coll-test ${CMAKE_CURRENT_SOURCE_DIR}/specd-coll-test.c)
get_target_property(SPECD_COLL_TOOL_ENGINE_SOURCES specd_engine SOURCES)
list(FILTER SPECD_COLL_TOOL_ENGINE_SOURCES INCLUDE REGEX "coll_nccl\\.c$")
if(SPECD_COLL_TOOL_ENGINE_SOURCES)
  find_package(CUDAToolkit REQUIRED)
  target_compile_definitions(specd-coll-test PRIVATE SPECD_HAVE_CUDA)
  target_link_libraries(specd-coll-test PRIVATE CUDA::cudart)
endif()
