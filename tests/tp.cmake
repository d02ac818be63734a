# Tensor parallelism (engine/model.c shards; verifier/group.c is covered by
# tests/integration/test_tp.py): forked rank groups over shared-memory
# collectives against TP = 1 on random models; SmolLM2-135M at TP = 3
# (label model); the NCCL path with one rank on a GPU (skipped without one).
specd_unit_test(test_tp test_tp.c tp_wire.c)
target_compile_definitions(test_tp PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_tp specd-mkmodel)
add_test(NAME test_tp_smollm COMMAND test_tp smollm)
set_tests_properties(test_tp_smollm PROPERTIES LABELS "model" SKIP_RETURN_CODE 77 TIMEOUT 900)
add_test(NAME test_tp_cuda COMMAND test_tp cuda)
set_tests_properties(test_tp_cuda PROPERTIES LABELS "unit" SKIP_RETURN_CODE 77 TIMEOUT 300)
# The group's link as net/validate.c decodes it.
specd_unit_test(test_group_wire test_group_wire.c)
target_link_libraries(test_group_wire PRIVATE specd_net)
# The sliding window's KV group in TP groups: TP 2 / 4 against TP 1 and
# against whole-context caches, through drafts and rollbacks past the window.
specd_unit_test(test_tp_window test_tp_window.c tp_wire.c)
target_compile_definitions(test_tp_window PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_tp_window specd-mkmodel)
# The feature capture (an EAGLE-3 head's input) on a TP group's leader:
# TP 2 and 4 against TP 1 within 1e-5 of each row's max |value|, a shifted
# control that must fail that bound, and batch invariance under TP 2.
specd_unit_test(test_tp_capture test_tp_capture.c tp_wire.c)
target_compile_definitions(test_tp_capture PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_tp_capture specd-mkmodel)
