# End-to-end golden check of specd-generate on the demo model.
specd_py_test(golden_france ref/test_golden.py LABELS "oracle;model")
