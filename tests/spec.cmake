# Speculative verification (engine/spec.c) and drafters (engine/drafter*.c).
specd_unit_test(test_spec test_spec.c spec_stats.c)
specd_unit_test(test_spec_exact test_spec_exact.c spec_stats.c)
# the rejection-sampling rule (engine/spec_reject.c): chi-square against p, and a wrong residual that must fail
specd_unit_test(test_spec_reject test_spec_reject.c spec_stats.c)
specd_unit_test(test_spec_drafter test_spec_drafter.c)
target_compile_definitions(test_spec_drafter PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_drafter specd-mkmodel)
specd_unit_test(test_spec_e2e test_spec_e2e.c spec_stats.c)
target_compile_definitions(test_spec_e2e PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_e2e specd-mkmodel)
add_test(NAME test_spec_e2e_exact COMMAND test_spec_e2e exact)
set_tests_properties(test_spec_e2e_exact PROPERTIES LABELS "slow" SKIP_RETURN_CODE 77 TIMEOUT 1800)
add_test(NAME test_spec_e2e_reject COMMAND test_spec_e2e reject)
set_tests_properties(test_spec_e2e_reject PROPERTIES LABELS "slow" SKIP_RETURN_CODE 77 TIMEOUT 1800)
specd_unit_test(test_model_view test_model_view.c)
target_compile_definitions(test_model_view PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_model_view specd-mkmodel)
specd_unit_test(test_spec_batch test_spec_batch.c)
target_compile_definitions(test_spec_batch PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_batch specd-mkmodel)
# Greedy equality on the demo model: the default run rotates the nine (drafter, K) pairs over 3 prompts x 6
# tokens, rotated: 2 prompts x 4 tokens (sized for ASan on 2 shared cores); the slow one runs every pair on 50 prompts x 32 tokens.
add_executable(test_spec_demo test_spec_demo.c greedy_util.c ${CMAKE_SOURCE_DIR}/tools/bench_prompts.c)
target_include_directories(test_spec_demo PRIVATE ${CMAKE_SOURCE_DIR}/tools)
target_link_libraries(test_spec_demo PRIVATE specd_engine)
target_compile_definitions(test_spec_demo PRIVATE _GNU_SOURCE SPECD_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                           SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_demo specd-mkmodel)
add_test(NAME test_spec_demo COMMAND test_spec_demo 2 4 rotate)
set_tests_properties(test_spec_demo PROPERTIES LABELS "model" SKIP_RETURN_CODE 77 TIMEOUT 600)
add_test(NAME test_spec_demo_full COMMAND test_spec_demo 50 32 full)
set_tests_properties(test_spec_demo_full PROPERTIES LABELS "model;slow" SKIP_RETURN_CODE 77 TIMEOUT 7200)
# The n-gram drafter on the copy-heavy prompt set with the demo model: greedy equality at K 2, 4, 8 and
# acceptance / tokens per step against the previous drafter. The comparison needs all 12 prompts x 64 tokens
# (slow under ASan); the default run checks equality only, on 3 prompts x 12 tokens.
add_executable(test_ngram_copy test_ngram_copy.c greedy_util.c ${CMAKE_SOURCE_DIR}/tools/bench_prompts.c)
target_include_directories(test_ngram_copy PRIVATE ${CMAKE_SOURCE_DIR}/tools)
target_link_libraries(test_ngram_copy PRIVATE specd_engine)
target_compile_definitions(test_ngram_copy PRIVATE _GNU_SOURCE SPECD_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_test(NAME test_ngram_copy COMMAND test_ngram_copy 12 3 equal-only)
set_tests_properties(test_ngram_copy PROPERTIES LABELS "model" SKIP_RETURN_CODE 77 TIMEOUT 900)
add_test(NAME test_ngram_copy_full COMMAND test_ngram_copy 64)
set_tests_properties(test_ngram_copy_full PROPERTIES LABELS "model;slow" SKIP_RETURN_CODE 77 TIMEOUT 3600)
# The draft length policy shared by the coordinator and specd-generate (engine/spec_adapt.c).
specd_unit_test(test_spec_adapt test_spec_adapt.c)
target_compile_definitions(test_spec_adapt PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_adapt specd-mkmodel)
# specd-generate's speculative loop (tools/gen_spec.c): decode figures count the tokens of the steps they time.
specd_unit_test(test_gen_timing test_gen_timing.c ${CMAKE_SOURCE_DIR}/tools/gen_spec.c)
target_include_directories(test_gen_timing PRIVATE ${CMAKE_SOURCE_DIR}/tools)
target_compile_definitions(test_gen_timing PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_gen_timing specd-mkmodel)
# Token trees verified in one forward (engine/model_tree.c, attention_tree):
# each node's logits = its path's as a chain, bit for bit (f32 and f16
# caches), the cache after keeping a path = the chain's, a no-mask control
# that differs, refusals.
specd_unit_test(test_spec_tree test_spec_tree.c)
target_compile_definitions(test_spec_tree PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_spec_tree specd-mkmodel)
set_tests_properties(test_spec_tree PROPERTIES LABELS "unit;model")
