# CPU attention (engine/cpu/attention.c): the AVX2 path against the C twin bit
# for bit, a token alone vs in a run vs beside other sequences, 1 and 2
# threads, f32 and f16 caches, and both against attention in double.
specd_unit_test(test_attention test_attention.c)
target_include_directories(test_attention PRIVATE ${CMAKE_SOURCE_DIR}/engine)
# GeGLU / SwiGLU (engine/cpu/swiglu.c): GeGLU against double, an element alone
# vs in a long call at every lane, 1 vs 2 threads.
specd_unit_test(test_glu test_glu.c)
target_include_directories(test_glu PRIVATE ${CMAKE_SOURCE_DIR}/engine)
