# EAGLE-3 head training (tools/train-eagle, JAX): a short run on a tiny random
# target lowers the loss and writes the published layout, whose JAX forward
# equals an independent numpy forward of the checkpoint. Needs specd-mkmodel.
specd_py_test(train_eagle_smoke ref/test_train_eagle.py LABELS "unit;oracle")
# The full pipeline on the demo model, briefly (specd-generate's answers to 20
# training prompts, 70 steps): the held-out first-step loss must fall to 0.7x.
# Minutes on a quiet 2-core machine (16 under the shared load): slow tier.
specd_py_test(train_eagle_demo ref/test_train_eagle.py ARGS --demo LABELS "oracle;model;slow")
