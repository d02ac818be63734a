specd_unit_test(test_kv test_kv.c)
# The prefix cache (engine/kv_prefix.c): bookkeeping, warm equals cold on a
# small random model (f32 and f16 KV, forced hash collisions), and a
# randomized run with shared prefixes, rollbacks, cancellations, eviction.
specd_unit_test(test_kv_prefix test_kv_prefix.c)
# The side rows beside the KV (engine/kv_side.c): write, adopt, partial
# copy, eviction and block reuse, bounds.
specd_unit_test(test_kv_side test_kv_side.c)
