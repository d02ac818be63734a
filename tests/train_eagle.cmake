# EAGLE-3 head training (tools/train-eagle, JAX): a short run on a tiny random
# target lowers the loss and writes the published layout, whose JAX forward
# equals an independent numpy forward of the checkpoint. Needs specd-mkmodel.
specd_py_test(train_eagle_smoke ref/test_train_eagle.py LABELS "unit;oracle")
