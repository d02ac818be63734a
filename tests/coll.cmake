# Collectives (engine/coll.c, coll_shm.c, cuda/coll_nccl.c): forked shm rank
# groups, and one-rank NCCL collectives (skipped without a GPU or CUDA).
specd_unit_test(test_coll test_coll.c)
specd_unit_test(test_coll_nccl test_coll_nccl.c)
if(SPECD_HAVE_CUDA)
  find_package(CUDAToolkit)
  if(CUDAToolkit_FOUND)
    target_compile_definitions(test_coll_nccl PRIVATE SPECD_HAVE_CUDA)
    target_link_libraries(test_coll_nccl PRIVATE CUDA::cudart)
  endif()
endif()
