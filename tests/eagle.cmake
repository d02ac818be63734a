# EAGLE-3 draft heads (engine/spec/eagle*.c, drafter_eagle.c) and the target's
# feature capture (engine/model_capture.c): tests/eagle_probe runs a head on
# given features; the oracle compares it with a numpy reference of random
# heads in the published and speculators layouts, checks each refusal's own
# error, greedy --eagle = plain greedy at K 1..8, and the --dump-features file.
add_executable(eagle_probe ${CMAKE_CURRENT_SOURCE_DIR}/eagle_probe.c)
target_link_libraries(eagle_probe PRIVATE specd_engine)
specd_py_test(eagle_oracle ref/test_eagle_head.py LABELS oracle)
specd_unit_test(test_eagle test_eagle.c)
target_compile_definitions(test_eagle PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_eagle specd-mkmodel)
# The C head against the training tool's own JAX forward (tools/eagle/head.py, branch train): skipped (77)
# where tools/eagle or jax is missing.
specd_py_test(eagle_cross ref/test_eagle_cross.py LABELS oracle)
# Token trees drafted by a head (specd-generate --eagle --tree-topk): greedy,
# seeded and penalized output = plain at several tree shapes with a random
# head; with the demo model's trained head (skipped with a message when
# absent) greedy = plain and drafts are accepted; refusals.
specd_py_test(eagle_tree_oracle ref/test_eagle_tree.py LABELS oracle)
