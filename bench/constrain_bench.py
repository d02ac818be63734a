#!/usr/bin/env python3
"""Structured-output benchmark: tokens/s of JSON-schema generation with
specd-generate, and the mask cost per step.

For each schema (objects with fixed keys and enums: what forced drafts are
for) and prompt, greedy, it runs
  - unconstrained plain decoding (the same prompt, no schema),
  - constrained plain decoding,
  - constrained, forced drafts alone (--forced-draft),
  - constrained, forced drafts + the n-gram drafter (--ngram),
  - constrained, the n-gram drafter without forced drafts (--ngram --no-forced),
checks that every constrained mode gives the same tokens, and prints decode
tok/s, tokens per target step and the mask cost (p50 / p99 / max us, cache
hits) of each. With --reps R the modes run in R interleaved rounds, the
order reversed every other round (short runs swing with order and warm-up),
and each mode's ratio to constrained plain is the median of its rounds'
ratios. Usage:

    bench/constrain_bench.py BUILD_DIR MODEL [-n TOKENS] [--reps R]
    bench/constrain_bench.py BUILD_DIR MODEL --mask [--steps N]

--mask measures the mask cost alone (tests/constrain_cli mask-bench: a
random path through each schema's language, each state's mask timed when
computed and from the cache, and an EAGLE head's mask per drafted position:
sd_constraint_apply_ids on a cached mask, whole vocabulary and 8192 draft
ids) on MODEL's vocabulary and on a random
qwen2-shape model of 151,936 entries (Qwen2 / Qwen2.5's vocabulary size)
written by specd-mkmodel: a byte-level BPE tokenizer of that size, its
merges synthetic (the trie's size is a real Qwen's, its strings are not).

Use a Release build on a quiet machine: the figures are wall-clock.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
        "role": {"enum": ["engineer", "doctor", "teacher", "artist"]}, "active": {"type": "boolean"}},
        "required": ["name", "age", "role", "active"], "additionalProperties": False},
    "city": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20},
        "continent": {"enum": ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]},
        "capital": {"type": "boolean"}, "population_millions": {"type": "number"}},
        "required": ["city", "country", "continent", "capital", "population_millions"],
        "additionalProperties": False},
    "items": {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
                                         "qty": {"type": "integer"},
                                         "unit": {"enum": ["kg", "piece", "litre"]}},
        "required": ["sku", "qty", "unit"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False},
}
PROMPTS = {"person": "Describe a fictional person as JSON.\n",
           "city": "Give facts about Paris as JSON.\n",
           "items": "A shopping order as JSON.\n"}


def run(gen, model, prompt, n, extra):
    argv = [gen, "-m", model, "-p", prompt, "-n", str(n), "--json"] + extra
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit("specd-generate %s failed: %s" % (" ".join(extra), out.stderr[-600:]))
    return json.loads(out.stdout)


QWEN_VOCAB = 151936


def mask_costs(build, model, steps, tmp):
    """The --mask table: per schema and vocabulary, compile, trie, computed and cached mask costs."""
    qwen = os.path.join(tmp, "qwen2-151936.gguf")
    mk = [os.path.join(build, "tools", "specd-mkmodel"), "-o", qwen, "--arch", "qwen2", "--vocab", str(QWEN_VOCAB),
          "--dim", "64", "--layers", "1", "--heads", "4", "--kv-heads", "2", "--ff", "128", "--seed", "35"]
    if subprocess.run(mk, capture_output=True).returncode != 0:
        sys.exit("specd-mkmodel failed: %s" % " ".join(mk))
    cli = os.path.join(build, "tests", "constrain_cli")
    print("| schema | vocabulary | compile us | vocabulary trie us | masks computed | computed p50 / p99 / max us | "
          "cached p50 / p99 us | EAGLE head's mask per drafted position, whole vocabulary / 8192 draft ids, "
          "p50 / p99 us |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, schema in SCHEMAS.items():
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(schema, f)
        for label, m in ((os.path.basename(model), model), ("random qwen2", qwen)):
            out = subprocess.run([cli, "mask-bench", path, m, str(steps)], capture_output=True, text=True,
                                 timeout=1800)
            if out.returncode != 0:
                sys.exit("constrain_cli mask-bench %s %s failed: %s" % (name, m, out.stderr[-600:]))
            r = json.loads(out.stdout)
            print("| %s | %s (%d) | %.0f | %.0f | %d of %d | %.1f / %.0f / %.0f | %.2f / %.2f | %.1f / %.1f, "
                  "%.1f / %.1f |" % (
                      name, label, r["n_vocab"], r["compile_us"], r["vocab_trie_us"], r["computed"], r["steps"],
                      r["computed_p50_us"], r["computed_p99_us"], r["computed_max_us"], r["cached_p50_us"],
                      r["cached_p99_us"], r["head_mask_full_p50_us"], r["head_mask_full_p99_us"],
                      r["head_mask_8192_p50_us"], r["head_mask_8192_p99_us"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--mask", action="store_true", help="the mask cost alone, on MODEL's and a 151,936-entry vocabulary")
    ap.add_argument("--steps", type=int, default=300, help="--mask: steps of the random path")
    a = ap.parse_args()
    if a.mask:
        with tempfile.TemporaryDirectory() as tmp:
            mask_costs(a.build, a.model, a.steps, tmp)
        return
    gen = os.path.join(a.build, "tools", "specd-generate")
    modes = [("unconstrained", None), ("constrained plain", []), ("forced drafts", ["--forced-draft", "-k", "8"]),
             ("forced + n-gram", ["--ngram", "-k", "8"]), ("n-gram, no forced", ["--ngram", "--no-forced", "-k", "8"])]
    with tempfile.TemporaryDirectory() as tmp:
        print("| schema | mode | decode tok/s (median) | x constrained plain (median of rounds) | tokens/step | "
              "forced drafts | mask p50 us | mask p99 us | mask max us | cache hits | mask mean; all masks / decode time |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, schema in SCHEMAS.items():
            path = os.path.join(tmp, name + ".json")
            with open(path, "w") as f:
                json.dump(schema, f)
            ref_ids = None
            rates = {mode: [] for mode, _ in modes}
            lasts = {}
            for rep in range(a.reps):  # interleaved, the order reversed every other round
                for mode, extra in (modes if rep % 2 == 0 else modes[::-1]):
                    args = [] if extra is None else ["--json-schema", path] + extra
                    lasts[mode] = run(gen, a.model, PROMPTS[name], a.n, args)
                    rates[mode].append(lasts[mode]["timings"]["decode_tok_s"])
            plain = rates["constrained plain"]
            for mode, extra in modes:
                last = lasts[mode]
                if extra is not None:
                    if ref_ids is None:
                        ref_ids = last["ids"]
                    elif last["ids"] != ref_ids:
                        sys.exit("%s / %s: tokens differ from constrained plain decoding" % (name, mode))
                sp = last.get("spec", {})
                c = last.get("constraint", {})
                # each round's ratio to that round's constrained plain run, then the median
                ratio = statistics.median(r / p for r, p in zip(rates[mode], plain) if p > 0)
                # the masks' time over the decode time (one mask a verified row; the first
                # token's, after the prompt, is counted too: a slight overstatement)
                share = ("%.1f us, %.2f%%" % (c["mask_mean_us"], c["mask_mean_us"] * c["masks"] /
                                             (last["timings"]["decode_ms"] * 1e3) * 100)
                         if c and last["timings"]["decode_ms"] > 0 else "-")
                print("| %s | %s | %.1f | %.3fx | %s | %s | %s | %s | %s | %s | %s |" % (
                    name, mode, statistics.median(rates[mode]), ratio,
                    "%.2f" % sp["tokens_per_step"] if sp else "1",
                    c.get("forced_drafted", "-") if sp else "-",
                    "%.1f" % c["mask_p50_us"] if c else "-", "%.1f" % c["mask_p99_us"] if c else "-",
                    "%.0f" % c["mask_max_us"] if c else "-",
                    "%d/%d" % (c["mask_cache_hits"], c["masks"]) if c else "-", share))
            print("|  | output | %s |  |  |  |  |  |  |  |  |" % json.dumps(lasts["constrained plain"]["text"])[:120])


if __name__ == "__main__":
    main()
