# Structured output (engine/constrain/): the GBNF parser and matcher, regex
# and JSON Schema translation, refusals of hostile inputs, and token masks
# against brute force on the demo model's vocabulary (skipped without it).
specd_unit_test(test_constrain ${CMAKE_CURRENT_SOURCE_DIR}/test_constrain.c)
set_tests_properties(test_constrain PROPERTIES LABELS "unit;oracle")

# The oracles: regex matching against Python's re.fullmatch on random
# patterns and strings; a schema corpus compiled and its generated outputs
# validated with the jsonschema package; GBNF grammars, their matcher and
# their generated outputs against the same grammars in Lark
# (tests/ref/test_constrain_*.py).
add_executable(constrain_cli ${CMAKE_CURRENT_SOURCE_DIR}/constrain_cli.c)
target_link_libraries(constrain_cli PRIVATE specd_constrain)
target_compile_definitions(constrain_cli PRIVATE _GNU_SOURCE)
specd_py_test(test_constrain_regex ref/test_constrain_regex.py LABELS "oracle;model")
specd_py_test(test_constrain_grammar ref/test_constrain_grammar.py LABELS "oracle;model")
specd_py_test(test_constrain_schema ref/test_constrain_schema.py LABELS "oracle;model")
add_test(NAME test_constrain_schema_full COMMAND ${SPECD_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_constrain_schema.py --full)
set_tests_properties(test_constrain_schema_full PROPERTIES LABELS "slow;oracle;model" SKIP_RETURN_CODE 77 TIMEOUT 7200
                     ENVIRONMENT "SPECD_BUILD_DIR=${CMAKE_BINARY_DIR};SPECD_SOURCE_DIR=${CMAKE_SOURCE_DIR}")

# Speculative decoding under a constraint equals constrained plain decoding
# (n-gram, masked self-draft, forced drafts alone; greedy and seeded) on a
# small random model: no demo model needed.
specd_unit_test(test_constrain_spec test_constrain_spec.c)
target_compile_definitions(test_constrain_spec PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_constrain_spec specd-mkmodel)

# Structured output through the service (SubmitRequest.constraint masked by
# the verifier): greedy and seeded output under schemas, a regex, json_object
# and a grammar equal specd-generate's; bad constraints refused; specd-client's
# --json-schema / --regex.
specd_py_test(it_constrain_service integration/test_constrain_service.py LABELS integration model)
set_tests_properties(it_constrain_service PROPERTIES RESOURCE_LOCK specd_integration)

# The verifier under a constraint, driven by hand (drafts in and out of the
# language, a slot released mid-way): constrained plain decoding's tokens.
specd_unit_test(test_verify_constrain test_verify_constrain.c)
target_link_libraries(test_verify_constrain PRIVATE specd_verifier_core specd_net)
target_compile_definitions(test_verify_constrain PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_verify_constrain specd-mkmodel)

# The draft server under a constraint (DraftSeq.constraint): forced drafts
# first, a self-draft masked at every step, the slot's constraint following
# rejections; without a tokenizer the drafts leave the language.
specd_unit_test(test_draft_constrain test_draft_constrain.c)
target_link_libraries(test_draft_constrain PRIVATE specd_drafter_core specd_engine specd_net)
target_compile_definitions(test_draft_constrain PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_draft_constrain specd-mkmodel)

# Drafters under the request's constraint through the service: n-gram and
# self-draft drafters with and without --unconstrained give specd-generate's
# tokens, and more drafts are accepted under the constraint.
specd_py_test(it_constrain_drafts integration/test_constrain_drafts.py LABELS integration model)
set_tests_properties(it_constrain_drafts PROPERTIES RESOURCE_LOCK specd_integration)

# The EAGLE head under the request's constraint: specd-generate --eagle and
# the verifier's head give plain constrained decoding's tokens, greedy and
# seeded, and no chain either head drafts holds a token the constraint
# refuses (a random head whose draft vocabulary holds refused tokens).
specd_py_test(it_constrain_eagle integration/test_constrain_eagle.py LABELS integration)
set_tests_properties(it_constrain_eagle PROPERTIES RESOURCE_LOCK specd_integration)
