# Speculative verification (engine/spec.c) and drafters (engine/drafter*.c).
specd_unit_test(test_spec test_spec.c spec_stats.c)
specd_unit_test(test_spec_exact test_spec_exact.c spec_stats.c)
