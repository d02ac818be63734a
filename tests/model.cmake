# Llama model and forward pass (engine/model.c, engine/cpu/): batch invariance,
# KV rollback, self-draft, refusals, config validation on small random models.
specd_unit_test(test_model test_model.c)
# Matrices used in place from the file mapping: bit-equal to copies, pages
# shared between two processes (the demo model; skipped without it).
specd_unit_test(test_model_map test_model_map.c)
set_tests_properties(test_model_map PROPERTIES LABELS "unit;model")
# The architectures beyond Llama (engine/model_arch.c) on random models from
# specd-mkmodel: batch invariance, rollback across the sliding window,
# greedy speculative == plain, refusals that name what is missing.
specd_unit_test(test_model_arch test_model_arch.c)
target_compile_definitions(test_model_arch PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_model_arch specd-mkmodel)
