# End-to-end golden check of specd-generate on the demo model.
specd_py_test(golden_france ref/test_golden.py LABELS "oracle;model")
# The demo model rewritten by specd-quantize in every stored format answers.
specd_py_test(golden_formats ref/test_golden_formats.py LABELS "oracle;model")
