specd_unit_test(test_kv test_kv.c)
