# specd-coll-test: nccl-tests-shaped collective benchmark (shm ranks forked;
# NCCL ranks one thread per GPU in a CUDA build).
specd_tool(specd-coll-test ${CMAKE_CURRENT_SOURCE_DIR}/specd-coll-test.c)
if(SPECD_HAVE_CUDA)
  find_package(CUDAToolkit)
  if(CUDAToolkit_FOUND)
    target_compile_definitions(specd-coll-test PRIVATE SPECD_HAVE_CUDA)
    target_link_libraries(specd-coll-test PRIVATE CUDA::cudart)
  endif()
endif()
