# specd-bench: its forward mode runs end to end on a tiny random model and
# prints a complete table (the committed bench/results/ come from this mode).
specd_py_test(bench_forward_smoke ref/test_bench_forward.py LABELS unit)
