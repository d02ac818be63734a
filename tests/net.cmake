specd_unit_test(test_net test_net.c)
target_link_libraries(test_net PRIVATE specd_net)
specd_unit_test(test_slots test_slots.c)
target_link_libraries(test_slots PRIVATE specd_net)
