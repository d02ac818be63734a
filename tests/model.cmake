# Llama model and forward pass (engine/model.c, engine/cpu/): batch invariance,
# KV rollback, self-draft, refusals, config validation on small random models.
specd_unit_test(test_model test_model.c)
