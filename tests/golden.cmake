# End-to-end golden check of specd-generate on the demo model.
specd_py_test(golden_france ref/test_golden.py LABELS "oracle;model")
# The demo model requantized by specd-quantize to q4_k_m answers sensibly.
specd_py_test(golden_france_q4_k_m ref/test_golden_kquant.py LABELS "oracle;model")
