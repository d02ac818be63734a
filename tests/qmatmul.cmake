# Stored-weight matmul kernels (engine/cpu/qmatmul.c): every SIMD path against
# the C twin bit for bit, batch invariance, bounds against exact products.
specd_unit_test(test_qmatmul test_qmatmul.c)
target_include_directories(test_qmatmul PRIVATE ${CMAKE_SOURCE_DIR}/engine)
