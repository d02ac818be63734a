specd_unit_test(test_sample test_sample.c)
