#!/usr/bin/env bash
# check_function_size.sh [ROOT] — no product function is over 120 lines
# (CONTRIBUTING.md; issue 36): a function that long holds more than one job;
# give each its own function, named by what it does. Counts the functions of
# *.c *.h *.cu *.cuh under engine/ net/ coordinator/ drafter/ verifier/
# client/ gateway/ deploy/ tools/ (not tests/ or fuzz/), from the first line
# of the definition to its closing brace, as Universal Ctags finds them
# (`scripts/setup` installs it). Fails, listing the functions and their
# lengths; --self-test shows it can fail.
set -euo pipefail
max=120
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
ctags=ctags-universal # Debian's name; "ctags" is an alternative that may point elsewhere
command -v "$ctags" >/dev/null 2>&1 || ctags=ctags
if ! "$ctags" --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "FAIL: Universal Ctags is needed (apt-get install universal-ctags; scripts/setup installs it)"
  exit 1
fi
if [ "$root" = "--self-test" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/net" "$tmp/tests" "$tmp/engine/cuda"
  body() { # NAME LINES: a C function of LINES lines in all
    printf 'int %s(int x) {\n' "$1"
    for ((i = 0; i < $2 - 3; i++)); do printf '    x += %d;\n' "$i"; done
    printf '    return x;\n}\n\n'
  }
  body long_test 200 > "$tmp/tests/long_test.c"
  body ok_fn 120 > "$tmp/net/ok.c"
  if ! "$0" "$tmp" > /dev/null; then echo "FAIL: tests/ or a 120-line function was counted"; exit 1; fi
  body long_fn 121 >> "$tmp/net/ok.c"
  if "$0" "$tmp" > /dev/null; then echo "FAIL: a 121-line net/ok.c:long_fn was not found"; exit 1; fi
  body ok_fn 120 > "$tmp/net/ok.c"
  { printf '__global__ void '; body long_kernel 130; } > "$tmp/engine/cuda/k.cu"
  if "$0" "$tmp" > /dev/null; then echo "FAIL: a 130-line CUDA kernel was not found"; exit 1; fi
  echo "ok: the check finds a C function and a CUDA kernel over $max lines and leaves tests/ alone"
  exit 0
fi
cd "$root"
mapfile -d '' files < <(find engine net coordinator drafter verifier client gateway deploy tools \
                          \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -type f -print0 2>/dev/null)
[ ${#files[@]} -gt 0 ] || { echo "ok: no product source files"; exit 0; }
# .cu/.cuh read as C++ (kernels are functions to ctags); "end:" is the line of the closing brace
report=$("$ctags" --languages=C,C++ --langmap=C++:+.cu.cuh --kinds-C=f --kinds-C++=f --fields=+ne -f - "${files[@]}" |
  awk -F'\t' -v max=$max '{
    line = ""; end = ""
    for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) line = substr($i, 6); if ($i ~ /^end:/) end = substr($i, 5) }
    if (line != "" && end != "" && end - line + 1 > max) printf "FAIL: %s:%s %s has %d lines (at most %d: one job a function)\n", $2, line, $1, end - line + 1, max
    n++
  } END { printf "%d\n", n > "/dev/stderr" }' 2>"${TMPDIR:-/tmp}/check_function_size.$$")
n=$(cat "${TMPDIR:-/tmp}/check_function_size.$$"); rm -f "${TMPDIR:-/tmp}/check_function_size.$$"
if [ -n "$report" ]; then echo "$report"; exit 1; fi
echo "ok: $n product functions in ${#files[@]} files, none over $max lines"
