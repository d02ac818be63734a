# Speculative verification (engine/spec.c) and drafters (engine/drafter*.c).
specd_unit_test(test_spec test_spec.c spec_stats.c)
specd_unit_test(test_spec_exact test_spec_exact.c spec_stats.c)
specd_unit_test(test_spec_drafter test_spec_drafter.c)
target_compile_definitions(test_spec_drafter PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_drafter specd-mkmodel)
