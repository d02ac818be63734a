# The multi-node deploy files (deploy/systemd, deploy/slurm, deploy/k8s,
# deploy/Containerfile) checked against the built binaries: systemd-analyze
# verify, bash -n + shellcheck, the Kubernetes schemas, the Containerfile
# against the tree (tests/check_deploy.sh). Label deploy (and unit, so the
# default run has it); skips (77) only when a tool scripts/setup installs is missing.
add_test(NAME deploy_files
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_deploy.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR} ${SPECD_PYTHON})
set_tests_properties(deploy_files PROPERTIES LABELS "deploy;unit" SKIP_RETURN_CODE 77 TIMEOUT 120)
