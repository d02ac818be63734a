# Llama model and forward pass (engine/model.c, engine/cpu/): batch invariance,
# KV rollback, self-draft, refusals, config validation on small random models.
specd_unit_test(test_model test_model.c)
# Matrices used in place from the file mapping: bit-equal to copies, pages
# shared between two processes (the demo model; skipped without it).
specd_unit_test(test_model_map test_model_map.c)
set_tests_properties(test_model_map PROPERTIES LABELS "unit;model")
