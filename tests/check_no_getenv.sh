#!/usr/bin/env bash
# check_no_getenv.sh [ROOT] — library code reads no environment variables
# (issue 36): a switch that changes what the engine, the network layer, the
# coordinator, a drafter, a verifier or libspecd-client does is a
# command-line option passed down in a params struct, so a process's
# behaviour is on its command line. Greps engine/ net/ coordinator/ drafter/
# verifier/ client/ (*.c *.h *.cu *.cuh) for getenv / secure_getenv /
# environ, leaving out the program entry files (main.c and the specd-*.c
# tools, which may read their own environment).
# Fails, listing the calls, when it finds one; --self-test shows it can fail.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if [ "$root" = "--self-test" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/engine" "$tmp/net" "$tmp/coordinator" "$tmp/drafter" "$tmp/verifier"
  echo 'int main(void) { return getenv("X") != 0; }' > "$tmp/coordinator/main.c"
  if ! "$0" "$tmp" > /dev/null; then echo "FAIL: a main.c was counted as library code"; exit 1; fi
  echo 'const char *f(void) { return getenv("X"); }' > "$tmp/engine/lib.c"
  if "$0" "$tmp" > /dev/null; then echo "FAIL: a getenv in engine/lib.c was not found"; exit 1; fi
  echo "ok: the check finds a library getenv and leaves main.c alone"
  exit 0
fi
hits=$(cd "$root" && grep -rnE '\b(secure_)?getenv[[:space:]]*\(|\benviron\b' \
         --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
         engine net coordinator drafter verifier client 2>/dev/null |
       grep -vE '^[^:]*/main\.c:|^[^:]*/specd-[^/:]*\.c:' || true)
if [ -n "$hits" ]; then
  echo "FAIL: library code reads the environment (make it an option passed in a params struct):"
  echo "$hits"
  exit 1
fi
echo "ok: no getenv in library code (engine, net, coordinator, drafter, verifier, client)"
