# Collectives (engine/coll.c, coll_shm.c, cuda/coll_nccl.c): forked shm rank
# groups, and one-rank NCCL collectives (skipped without a GPU or CUDA).
specd_unit_test(test_coll test_coll.c)
specd_unit_test(test_coll_nccl test_coll_nccl.c)
# The NCCL test runs its GPU path only when the engine really compiles
# engine/cuda/coll_nccl.c (a CUDA build); otherwise it checks the
# SD_ERR_UNSUPPORTED fallbacks and skips.
get_target_property(SPECD_COLL_ENGINE_SOURCES specd_model SOURCES)
list(FILTER SPECD_COLL_ENGINE_SOURCES INCLUDE REGEX "coll_nccl\\.c$")
if(SPECD_COLL_ENGINE_SOURCES)
  find_package(CUDAToolkit REQUIRED)
  target_compile_definitions(test_coll_nccl PRIVATE SPECD_HAVE_CUDA)
  target_link_libraries(test_coll_nccl PRIVATE CUDA::cudart)
endif()
# The harness itself, shm ranks, correctness checked (exit 1 on any wrong element).
foreach(op all_reduce broadcast gather barrier)
  add_test(NAME coll_harness_${op} COMMAND specd-coll-test --backend shm -n 3 -b 4 -e 64K -f 16 --op ${op} --iters 5 --warmup 1)
  set_tests_properties(coll_harness_${op} PROPERTIES LABELS "unit" TIMEOUT 120)
endforeach()
# NCCL ranks, one per visible GPU (exit 77 = skipped without CUDA or a GPU).
add_test(NAME coll_harness_nccl COMMAND specd-coll-test --backend nccl -n 8 -b 4 -e 1M -f 16 --op all_reduce --iters 5 --warmup 1)
set_tests_properties(coll_harness_nccl PROPERTIES LABELS "unit" TIMEOUT 120 SKIP_RETURN_CODE 77)
