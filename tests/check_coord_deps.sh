#!/usr/bin/env bash
# check_coord_deps.sh COORDINATOR — specd-coordinator runs no forward pass
# and links no model code and no CUDA (docs/DESIGN.md; issue 36): its
# in-process n-gram drafter comes from specd_ngram, not the engine.
#   1. it needs no CUDA, cuBLAS or NCCL shared library;
#   2. it holds no symbol of the forward pass, the KV cache, the backends,
#      the collectives, verification or model drafters;
#   3. it does hold the n-gram drafter and the scheduler (so the check looks
#      at the right binary).
# --self-test shows on made-up symbol lists that the check can fail.
set -euo pipefail
# sd_model_config_*: the model's config reader, in specd_formats (engine/formats)
allowed_syms='^sd_model_config_'
bad_syms='^sd_(model|kv|backend|cpu|cuda|coll|nccl|threadpool|spec_verify|spec_scratch|spec_draft|sample|drafter_model|drafter_self|attention|matmul|rope|rmsnorm|swiglu)_'
check_syms() { # name, symbol list on stdin
  local syms bad n
  syms=$(cat)
  bad=$(echo "$syms" | grep -E "$bad_syms" | grep -vE "$allowed_syms" || true)
  if [ -n "$bad" ]; then
    echo "FAIL: $1 holds model, forward-pass or CUDA symbols:"
    echo "$bad" | head -20
    return 1
  fi
  n=$(echo "$syms" | grep -cE '^sd_(drafter_ngram_create|sched_pump)$' || true)
  if [ "$n" -lt 2 ]; then
    echo "FAIL: $1 lacks sd_drafter_ngram_create or sd_sched_pump: not the coordinator"
    return 1
  fi
  return 0
}
if [ "${1:-}" = "--self-test" ]; then
  if ! printf 'sd_drafter_ngram_create\nsd_sched_pump\nsd_net_now_us\n' | check_syms good > /dev/null; then
    echo "FAIL: a clean symbol list was refused"; exit 1
  fi
  if printf 'sd_drafter_ngram_create\nsd_sched_pump\nsd_model_forward\n' | check_syms bad > /dev/null; then
    echo "FAIL: sd_model_forward was not found"; exit 1
  fi
  if printf 'sd_drafter_ngram_create\nsd_sched_pump\nsd_cuda_backend_create\n' | check_syms bad > /dev/null; then
    echo "FAIL: a CUDA symbol was not found"; exit 1
  fi
  echo "ok: the check finds model and CUDA symbols"
  exit 0
fi
bin=$1
fail=0
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
bad=$(echo "$needed" | grep -E 'cudart|cublas|nccl|cuda' || true)
if [ -n "$bad" ]; then
  echo "FAIL: $(basename "$bin") needs CUDA libraries: $bad"
  fail=1
fi
nm "$bin" | awk '$2 ~ /^[TtDdBbRr]$/ {print $3}' | check_syms "$(basename "$bin")" || fail=1
[ $fail -eq 0 ] && echo "ok: $(basename "$bin") links no model, forward pass or CUDA (needs: $(echo "$needed" | tr '\n' ' '))"
exit $fail
