#!/usr/bin/env bash
# check_deploy.sh — the multi-node deploy files (deploy/systemd, deploy/slurm,
# deploy/k8s, deploy/Containerfile) checked statically against the built
# binaries. Registered in CTest by tests/deploy.cmake (label deploy):
#   check_deploy.sh SOURCE_DIR BUILD_DIR PYTHON
#   1. systemd-analyze verify on each unit, from a temporary copy whose
#      ExecStart points at the built binaries (verify wants them to exist);
#      any message about a unit is a failure (unknown keys only warn)
#   2. bash -n and shellcheck on the Slurm script and the container entrypoint
#   3. kubernetes-validate --strict (the Kubernetes schemas, bundled: offline)
#   4. tests/check_deploy.py: options against each binary's --help,
#      cross-references of the manifests, the Containerfile against the tree
# Exit 0 all good, 1 a check failed, 77 (CTest: skipped) when every check that
# could run passed but a tool is missing (scripts/setup installs them all:
# systemd and shellcheck from Debian, kubernetes-validate into .venv).
set -uo pipefail
src=${1:?usage: check_deploy.sh SOURCE_DIR BUILD_DIR PYTHON}
build=${2:?usage: check_deploy.sh SOURCE_DIR BUILD_DIR PYTHON}
python=${3:?usage: check_deploy.sh SOURCE_DIR BUILD_DIR PYTHON}
failed=0
missing=()
fail() { echo "FAIL: $*"; failed=1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- 1. systemd units ----
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$tmp/bin" "$tmp/units"
  for b in coordinator/specd-coordinator verifier/specd-verifier drafter/specd-drafter \
           gateway/specd-gateway client/specd-client deploy/specd-launch; do
    [ -x "$build/$b" ] || { fail "$build/$b is not built"; continue; }
    ln -s "$(cd "$build" && pwd)/$b" "$tmp/bin/"
  done
  for u in "$src"/deploy/systemd/*.service; do
    sed "s#/opt/specd/bin/#$tmp/bin/#g" "$u" > "$tmp/units/$(basename "$u")"
  done
  for u in "$tmp"/units/*.service; do
    name=$(basename "$u")
    out=$(systemd-analyze verify --man=no --recursive-errors=no "$u" 2>&1)
    rc=$?
    # messages about other units (the host's own) are not ours
    ours=$(printf '%s\n' "$out" | grep -F -e "$name" -e "${name%@.service}@" -e "$tmp" || true)
    if [ $rc -ne 0 ] || [ -n "$ours" ]; then
      fail "systemd-analyze verify deploy/systemd/$name (exit $rc):"
      printf '%s\n' "$out" | sed 's/^/    /'
    else
      echo "ok: systemd-analyze verify deploy/systemd/$name"
    fi
  done
else
  missing+=("systemd-analyze (Debian package systemd)")
fi

# ---- 2. shell scripts ----
for s in deploy/slurm/specd.sbatch deploy/container/specd-entrypoint; do
  if bash -n "$src/$s"; then echo "ok: bash -n $s"; else fail "bash -n $s"; fi
  if command -v shellcheck >/dev/null; then
    if (cd "$src" && shellcheck -x "$s"); then echo "ok: shellcheck $s"; else fail "shellcheck $s"; fi
  fi
done
command -v shellcheck >/dev/null || missing+=("shellcheck (Debian package shellcheck)")

# ---- 3. Kubernetes schemas ----
kv=$(dirname "$python")/kubernetes-validate
if [ -x "$kv" ]; then
  if out=$("$kv" --strict --quiet "$src"/deploy/k8s/*.yaml 2>&1); then
    echo "ok: kubernetes-validate --strict deploy/k8s/*.yaml"
    [ -z "$out" ] || printf '%s\n' "$out" | sed 's/^/    /'
  else
    fail "kubernetes-validate --strict deploy/k8s/*.yaml:"
    printf '%s\n' "$out" | sed 's/^/    /'
  fi
else
  missing+=("kubernetes-validate (tests/ref/requirements.txt, in .venv)")
fi

# ---- 4. consistency ----
if "$python" -c "import yaml" 2>/dev/null; then
  "$python" "$src/tests/check_deploy.py" "$src" "$build" || failed=1
else
  missing+=("PyYAML in $python (comes with kubernetes-validate)")
fi

if [ $failed -ne 0 ]; then
  echo "check_deploy: FAILED"
  exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "check_deploy: skipped, missing: ${missing[*]} (scripts/setup installs them)"
  exit 77
fi
echo "check_deploy: all checks passed"
