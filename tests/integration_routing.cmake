# Routing (test_routing.py, test_launch_groups.py): two verifier groups (TP 1
# and TP 2) and three drafters (n-gram, two model drafters) serving 64
# concurrent greedy requests exactly as specd-generate; faults mid-run
# (SIGKILL/SIGSTOP of a group leader, a rank, a drafter; SIGTERM drain of a
# group and a drafter) lose nothing and change no token; specd-launch
# --groups 2 with two drafters restarting the one that dies. 5-12 s each in
# a Release build on the loaded 2-core machine; the SIGSTOP variants (which
# wait out the coordinator's liveness) and the TP 1 kill go to the slow run
# only to keep the default run short.
set(_it integration/)
specd_py_test(it_routing ${_it}test_routing.py ARGS --n 64 --tokens 24 LABELS integration)
specd_py_test(it_routing_leader_kill ${_it}test_routing.py ARGS --fault leader-kill LABELS integration)
specd_py_test(it_routing_rank_kill ${_it}test_routing.py ARGS --fault rank-kill LABELS integration)
specd_py_test(it_routing_drafter_kill ${_it}test_routing.py ARGS --fault drafter-kill LABELS integration)
specd_py_test(it_routing_drain ${_it}test_routing.py ARGS --fault drain LABELS integration)
specd_py_test(it_routing_leader_stop ${_it}test_routing.py ARGS --fault leader-stop LABELS integration slow)
specd_py_test(it_routing_rank_stop ${_it}test_routing.py ARGS --fault rank-stop LABELS integration slow)
specd_py_test(it_routing_drafter_stop ${_it}test_routing.py ARGS --fault drafter-stop LABELS integration slow)
specd_py_test(it_routing_tp1_kill ${_it}test_routing.py ARGS --fault tp1-kill LABELS integration slow)
specd_py_test(it_launch_groups ${_it}test_launch_groups.py ARGS --groups 2 --tp 1 LABELS integration)
set_tests_properties(it_routing it_routing_leader_kill it_routing_rank_kill it_routing_drafter_kill it_routing_drain
                     it_routing_leader_stop it_routing_rank_stop it_routing_drafter_stop it_routing_tp1_kill
                     it_launch_groups PROPERTIES RESOURCE_LOCK specd_integration)
