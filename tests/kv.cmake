specd_unit_test(test_kv test_kv.c)
# The prefix cache (engine/kv_prefix.c): bookkeeping, warm equals cold on a
# small random model (f32 and f16 KV, forced hash collisions), and a
# randomized run with shared prefixes, rollbacks, cancellations, eviction.
specd_unit_test(test_kv_prefix test_kv_prefix.c)
# The window group (engine/kv_window.c, engine/model_window.c): sliding-window
# layers free the blocks that left the window; logits bit-equal to the
# unbounded cache's on random Gemma 3 and Mistral models, decoding,
# speculative rollbacks across the window's edge, chunked prompts; bounded
# window blocks.
specd_unit_test(test_kv_window test_kv_window.c)
target_compile_definitions(test_kv_window PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_kv_window specd-mkmodel)
# The side rows beside the KV (engine/kv_side.c): write, adopt, partial
# copy, eviction and block reuse, bounds.
specd_unit_test(test_kv_side test_kv_side.c)
# The prefix cache on a window-group cache (engine/kv_window.c's twins):
# a content oracle through random sharing, rollbacks and eviction, and warm
# equals cold on random Gemma 3 and Mistral models.
specd_unit_test(test_kv_window_prefix test_kv_window_prefix.c)
target_compile_definitions(test_kv_window_prefix PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_kv_window_prefix specd-mkmodel)
