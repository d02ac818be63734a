# Worker processes: verifier/drafter request handling (no sockets) and the
# shared worker loop (net/worker.c) against a fake coordinator.
specd_unit_test(test_worker_serve test_worker_serve.c)
# A draft server whose drafter is an EAGLE head (params.head_seq): its path per sequence, with a fake head
specd_unit_test(test_draft_serve_head test_draft_serve_head.c)
target_link_libraries(test_draft_serve_head PRIVATE specd_drafter_core specd_net)
target_link_libraries(test_worker_serve PRIVATE specd_verifier_core specd_drafter_core specd_net)
target_compile_definitions(test_worker_serve PRIVATE SPECD_MKMODEL="$<TARGET_FILE:specd-mkmodel>")
add_dependencies(test_worker_serve specd-mkmodel)
specd_unit_test(test_worker_loop test_worker_loop.c)
target_link_libraries(test_worker_loop PRIVATE specd_net Threads::Threads)
