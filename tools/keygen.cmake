# specd-keygen: CurveZMQ key pairs for specd's links (net/curve.c); links
# only the net plumbing.
add_executable(specd-keygen ${CMAKE_CURRENT_SOURCE_DIR}/specd-keygen.c)
target_link_libraries(specd-keygen PRIVATE specd_net)
target_compile_definitions(specd-keygen PRIVATE _GNU_SOURCE)
