# Tensor-parallel verifier groups through the whole service (tests/integration/
# test_tp.py, test_tp_kill.py): greedy output equal to TP = 1 at TP 2 and 4
# (tiny random models; a Gemma 3 whose window group runs on every rank) and TP 3 (SmolLM2-135M, label model, matrices read as
# f32: see below); a rank SIGKILLed
# or SIGSTOPped mid-generation under specd-launch --tp N. Same lock as the
# other integration tests: they start many processes each.
set(_it integration/)
specd_py_test(it_tp2_tiny ${_it}test_tp.py ARGS --tp 2 --model tiny --drafter layers LABELS integration)
specd_py_test(it_tp4_tiny_leader_head ${_it}test_tp.py ARGS --tp 4 --model tiny --lm-head leader --drafter model
              LABELS integration)
specd_py_test(it_tp3_smollm ${_it}test_tp.py ARGS --tp 3 --model smollm --drafter ngram --n 3 --tokens 16
              --cpu-weights f32 LABELS integration model)
specd_py_test(it_tp3_smollm_16 ${_it}test_tp.py ARGS --tp 3 --model smollm --drafter layers --n 16 --tokens 48
              --cpu-weights f32 LABELS integration model slow)
specd_py_test(it_tp2_tiny_curve ${_it}test_tp.py ARGS --tp 2 --model tiny --drafter layers --n 4 --curve
              LABELS integration)
specd_py_test(it_tp2_gemma_window ${_it}test_tp.py ARGS --tp 2 --model gemma --drafter ngram --n 4 --tokens 40
              LABELS integration)
# EAGLE-3 heads with a TP 2 group: in the leader (--eagle, reading the hidden
# states it captures after each all-reduce) and in a drafter process fed the
# group's features; greedy = TP 1 plain greedy, and a lone request drafts
# specd-generate --eagle's (TP 1) chains
specd_py_test(it_tp2_tiny_eagle ${_it}test_tp.py ARGS --tp 2 --model tiny --drafter eagle --n 6 --tokens 24
              LABELS integration)
specd_py_test(it_tp2_tiny_eagle_drafter ${_it}test_tp.py ARGS --tp 2 --model tiny --drafter eagle-drafter --n 6
              --tokens 24 LABELS integration)
# ... and SmolLM2-135M at TP 3 (f32 matrices, as it_tp3_smollm) with a random head borrowing its embedding
specd_py_test(it_tp3_smollm_eagle ${_it}test_tp.py ARGS --tp 3 --model smollm --drafter eagle --n 3 --tokens 16
              --cpu-weights f32 LABELS integration model slow)
specd_py_test(it_tp_kill ${_it}test_tp_kill.py ARGS --tp 2 --rank 1 LABELS integration)
specd_py_test(it_tp_kill_tp4_rank3 ${_it}test_tp_kill.py ARGS --tp 4 --rank 3 LABELS integration slow)
set_tests_properties(it_tp2_tiny it_tp2_tiny_curve it_tp2_tiny_eagle it_tp2_tiny_eagle_drafter it_tp2_gemma_window
                     it_tp4_tiny_leader_head it_tp3_smollm it_tp3_smollm_16 it_tp3_smollm_eagle it_tp_kill
                     it_tp_kill_tp4_rank3 PROPERTIES RESOURCE_LOCK specd_integration)
# SmolLM2 is Q4_1: with its matrices as stored, activations are rounded to 8
# bits and a TP group's differently ordered sums can round one the other way,
# so its text may part from TP = 1 (engine/model_load.c). These tests check
# that TP equals TP = 1 exactly, so every process reads the matrices as f32
# (--cpu-weights f32, passed to each: the tests above).
specd_py_test(it_tp_kill_leader ${_it}test_tp_kill.py ARGS --tp 2 --rank 0 LABELS integration slow)
set_tests_properties(it_tp_kill_leader PROPERTIES RESOURCE_LOCK specd_integration)
