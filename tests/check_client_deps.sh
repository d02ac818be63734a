#!/usr/bin/env bash
# check_client_deps.sh PROBE CLI — libspecd-client links no model code and no
# CUDA library (issue 19). PROBE is tests/client_link_probe.c built from the
# whole client, net, base and protocol archives; CLI is specd-client.
#   1. neither program needs a CUDA, NCCL or PCRE2 shared library (the probe
#      not cJSON either: only the CLI reads JSON job files);
#   2. the probe holds no engine symbol above base (model, weights,
#      tokenizer, GGUF, safetensors, KV cache, backends, collectives,
#      speculative decoding, drafters).
set -euo pipefail
probe=$1 cli=$2
fail=0
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
for bin in "$probe" "$cli"; do
  bad=$(needed "$bin" | grep -E 'cudart|cublas|nccl|cuda|pcre2' || true)
  if [ -n "$bad" ]; then
    echo "FAIL: $(basename "$bin") needs model-side libraries: $bad"
    fail=1
  fi
done
if needed "$probe" | grep -q cjson; then
  echo "FAIL: the client library needs cJSON"
  fail=1
fi
syms=$(nm "$probe" | awk '{print $NF}' |
       grep -E '^sd_(model|weights|tok|gguf|st|safetensors|kv|backend|cpu|cuda|coll|spec|draft|drafter|sample|argmax|philox|rng|chat)_' || true)
if [ -n "$syms" ]; then
  echo "FAIL: the client holds engine symbols:"
  echo "$syms" | head -20
  fail=1
fi
n=$(nm "$probe" | grep -c ' T sd_client_' || true)
if [ "$n" -lt 5 ]; then
  echo "FAIL: the probe holds $n sd_client_ functions: it was not built from the whole library"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok: libspecd-client links base, net and the protocol only ($n client functions; needs: $(needed "$probe" | tr '\n' ' '))"
exit $fail
