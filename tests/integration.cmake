# Integration tests: the real processes on loopback (tests/integration/,
# harness.py). Labels: integration; model when they need SmolLM2; slow when
# they take more than a minute under ASan (SmolLM2 with 8 requests x 32 tokens: ~140 s;
# the default run uses 3 x 16, the slow one 64 x 48). The greedy tests fix K at 4 so the
# drafts are verified, except it_greedy_smollm_ngram_64, which runs the adaptive policy.
set(_it integration/)
specd_py_test(it_greedy_tiny_model ${_it}test_greedy.py ARGS --model tiny --drafter model --n 64 LABELS integration)
specd_py_test(it_greedy_tiny_self ${_it}test_greedy.py ARGS --model tiny --drafter layers --n 64 LABELS integration)
specd_py_test(it_greedy_tiny_ngram ${_it}test_greedy.py ARGS --model tiny --drafter ngram --n 64 LABELS integration)
specd_py_test(it_greedy_tiny_local_ngram ${_it}test_greedy.py ARGS --model tiny --drafter local-ngram --n 64
              LABELS integration)
specd_py_test(it_greedy_smollm_local_ngram ${_it}test_greedy.py ARGS --model smollm --drafter local-ngram --n 3
              --tokens 16 LABELS integration model)
# the verifier's own EAGLE-3 head (--eagle; a random head from tests/ref/eagle_ref.py) drafts: no drafter process
specd_py_test(it_greedy_tiny_eagle ${_it}test_greedy.py ARGS --model tiny --drafter eagle --n 16 LABELS integration)
# the same head in its own process (specd-drafter --eagle), fed the verifier's features through the coordinator
specd_py_test(it_greedy_tiny_eagle_drafter ${_it}test_greedy.py ARGS --model tiny --drafter eagle-drafter --n 16
              LABELS integration)
# each architecture beyond Llama through the service, drafted by a random draft model of its own family and by
# the n-gram drafter
foreach(_arch qwen2 qwen3 gemma3 mistral phi3-longrope)
  foreach(_drafter model ngram)
    specd_py_test(it_greedy_arch_${_arch}_${_drafter} ${_it}test_greedy.py ARGS --model tiny --arch ${_arch}
                  --drafter ${_drafter} --n 8 --tokens 16 LABELS integration)
    set_tests_properties(it_greedy_arch_${_arch}_${_drafter} PROPERTIES RESOURCE_LOCK specd_integration)
  endforeach()
endforeach()
specd_py_test(it_greedy_tiny_hf ${_it}test_greedy.py ARGS --model tiny --drafter layers --n 8 --hf LABELS integration)
specd_py_test(it_greedy_tiny_warmup ${_it}test_greedy.py ARGS --model tiny --drafter model --n 16 --warmup 40
              LABELS integration)
specd_py_test(it_greedy_smollm_ngram ${_it}test_greedy.py ARGS --model smollm --drafter ngram --n 3 --tokens 16
              LABELS integration model)
specd_py_test(it_greedy_gemma_ngram ${_it}test_greedy.py ARGS --model gemma --drafter ngram --n 3 --tokens 16
              LABELS integration model)
specd_py_test(it_greedy_smollm_self ${_it}test_greedy.py ARGS --model smollm --drafter layers --n 3 --tokens 16
              LABELS integration model)
specd_py_test(it_greedy_smollm_ngram_64 ${_it}test_greedy.py ARGS --model smollm --drafter ngram --n 64 --tokens 48
              --adaptive LABELS integration model slow)
specd_py_test(it_greedy_smollm_self_64 ${_it}test_greedy.py ARGS --model smollm --drafter layers --n 64 --tokens 48
              LABELS integration model slow)
specd_py_test(it_seeded ${_it}test_seeded.py LABELS integration)
# the rejection rule through the service: chi-square against target-only sampling, the per-request rule
specd_py_test(it_reject ${_it}test_reject.py LABELS integration)
specd_py_test(it_prefix_cache ${_it}test_prefix_cache.py LABELS integration)
# ... with an EAGLE-3 head in the verifier: adopted blocks bring their rows' features (the same chains drafted)
specd_py_test(it_prefix_cache_eagle ${_it}test_prefix_cache.py ARGS --drafter eagle LABELS integration)
# ... on a TP 2 group (CPU ranks: the leader's block ids, adopted ones included)
specd_py_test(it_prefix_cache_tp2 ${_it}test_prefix_cache.py ARGS --tp 2 LABELS integration)
# the EAGLE head in a TP 2 group's leader with and without the prefix cache: the same chains, counts and outputs
specd_py_test(it_prefix_cache_tp2_eagle ${_it}test_prefix_cache.py ARGS --tp 2 --drafter eagle LABELS integration)
# ... on sliding-window models (Gemma 3, window 12): cached blocks keep their window blocks
specd_py_test(it_prefix_cache_window ${_it}test_prefix_cache.py ARGS --window LABELS integration)
# ... and on a TP 2 group of them (the leader's window block ids, adopted twins included)
specd_py_test(it_prefix_cache_window_tp2 ${_it}test_prefix_cache.py ARGS --window --tp 2 LABELS integration)
specd_py_test(it_drafter_kill ${_it}test_drafter_kill.py LABELS integration)
specd_py_test(it_drafter_kill_eagle ${_it}test_drafter_kill.py ARGS --eagle LABELS integration)
specd_py_test(it_verifier_restart ${_it}test_verifier_restart.py LABELS integration)
specd_py_test(it_cancel ${_it}test_cancel.py LABELS integration)
specd_py_test(it_bad_input ${_it}test_bad_input.py LABELS integration)
specd_py_test(it_overload ${_it}test_overload.py LABELS integration)
# Floods: 10,000 submits from one client, then from 16 at once; each answered exactly once (issue 37)
specd_py_test(it_flood ${_it}test_flood.py LABELS integration)
# The gateway's exposure rule (exit 2 off the loopback without a key), HTTPS, usage exit codes
specd_py_test(it_gateway_bind ${_it}test_gateway_bind.py LABELS integration)
# A TCP self-connect: reproduced on an ephemeral port; the tests' ports cannot have it; a peer that
# hears its own Hello drops the connection
specd_py_test(it_self_connect ${_it}test_self_connect.py LABELS integration)
# SIGTERM drains the gateway and the coordinator: streams in flight finish, new work gets 503 / OVERLOADED
specd_py_test(it_drain ${_it}test_drain.py LABELS integration)
# The gateway SIGKILLed under specd-launch: restarted, the openai client's retries get the undisturbed answers
specd_py_test(it_gateway_failover ${_it}test_gateway_failover.py LABELS integration)
# A default launch (ipc:// in a 0700 directory) refuses another user's worker and client (needs root: useradd)
specd_py_test(it_local_user ${_it}test_local_user.py LABELS integration)
specd_py_test(it_netns ${_it}test_netns.py LABELS integration)
specd_py_test(it_launch ${_it}test_launch.py LABELS integration)
# specd-launch --eagle DIR (the head in the verifier, its relay counted before ready); --wait-ready beside a default launch
specd_py_test(it_launch_eagle ${_it}test_launch_eagle.py LABELS integration)
specd_py_test(it_client_cli ${_it}test_client_cli.py LABELS integration)
specd_py_test(it_bounds ${_it}test_bounds.py LABELS integration)
specd_py_test(it_holes ${_it}test_holes.py LABELS integration)
# The draft vocabulary cut on the command line: exact output, bad values refused (no service)
specd_py_test(it_draft_vocab ${_it}test_draft_vocab.py LABELS integration)
# A draft whose vocabulary differs from the target's only by padding pairs (exact output); another is refused
specd_py_test(it_draft_pad ${_it}test_draft_pad.py LABELS integration)
# ... and through the service: padded drafts register and serve exactly; another tokenizer is refused at Hello
specd_py_test(it_draft_pad_service ${_it}test_draft_pad_service.py LABELS integration)
# CurveZMQ: hostile peers against a keyed service (rogue workers and clients, replayed Hellos)
specd_py_test(it_hostile ${_it}test_hostile.py LABELS integration)
specd_py_test(it_launch_curve ${_it}test_launch.py ARGS --curve LABELS integration)
# The integration tests start several processes each: never two at once.
set_tests_properties(it_greedy_tiny_model it_greedy_tiny_self it_greedy_tiny_ngram it_greedy_tiny_hf it_greedy_tiny_eagle
                     it_greedy_tiny_eagle_drafter
                     it_greedy_tiny_local_ngram it_greedy_smollm_local_ngram
                     it_greedy_tiny_warmup it_greedy_smollm_ngram it_greedy_gemma_ngram
                     it_greedy_smollm_self it_greedy_smollm_ngram_64 it_greedy_smollm_self_64 it_seeded
                     it_drafter_kill it_drafter_kill_eagle it_verifier_restart it_cancel it_bad_input it_overload it_netns it_launch
                     it_client_cli it_hostile it_launch_curve it_flood it_gateway_bind it_self_connect it_drain
                     it_gateway_failover it_local_user it_launch_eagle it_draft_pad_service it_prefix_cache_tp2 it_prefix_cache_tp2_eagle
                     it_prefix_cache_window it_prefix_cache_window_tp2
                     PROPERTIES RESOURCE_LOCK specd_integration)
# Failover through specd-launch and specd-client --jobs (libspecd-client):
# a role killed or stopped mid-generation with 32 requests in flight; greedy
# jobs equal specd-generate, seeded jobs the undisturbed run (and seeded
# specd-generate at TP = 1). it_failover_rank runs a TP = 2 group.
foreach(_role coordinator drafter verifier rank)
  specd_py_test(it_failover_${_role} ${_it}test_failover.py ARGS --role ${_role} LABELS integration)
  set_tests_properties(it_failover_${_role} PROPERTIES RESOURCE_LOCK specd_integration)
endforeach()
specd_py_test(it_failover_coordinator_stop ${_it}test_failover.py ARGS --role coordinator --signal stop
              LABELS integration)
set_tests_properties(it_failover_coordinator_stop PROPERTIES RESOURCE_LOCK specd_integration)
specd_py_test(it_failover_gateway ${_it}test_failover.py ARGS --role coordinator --gateway LABELS integration)
set_tests_properties(it_failover_gateway PROPERTIES RESOURCE_LOCK specd_integration)
# Chaos soak: SPECD_CHAOS_MINUTES (default 10) of 64 streaming requests under
# specd-launch --tp 2 while a random role is killed or stopped every 2-5 s.
specd_py_test(it_chaos ${_it}test_chaos.py LABELS integration slow)
set_tests_properties(it_chaos PROPERTIES RESOURCE_LOCK specd_integration TIMEOUT 3600)
# The same with specd-gateway in the loop: 16 more requests through HTTP (openai client), the gateway killed too
specd_py_test(it_chaos_gateway ${_it}test_chaos.py ARGS --gateway LABELS integration slow)
set_tests_properties(it_chaos_gateway PROPERTIES RESOURCE_LOCK specd_integration TIMEOUT 3600)
# Per-request drafter choice on SmolLM2 (F16 target, n-gram in the coordinator and the Q4_1 file as a
# draft model): ~15 s in Release.
specd_py_test(it_choice_smollm ${_it}test_choice.py LABELS integration model)
set_tests_properties(it_choice_smollm PROPERTIES RESOURCE_LOCK specd_integration)
