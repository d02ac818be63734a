#!/usr/bin/env python3
"""A quantized copy of the target as its draft model, in one process:
specd-generate plain against specd-generate --draft, interleaved.

Usage: draft_side_by_side.py TARGET.gguf DRAFT.gguf PROMPTS.txt... [--tokens 96] [--threads 2]
                             [--max-prompts 4] [--k 4] [--cpus 0-1] [--max-other-load 0.25]
                             [--specd-generate PATH] [--draft-vocab N,N,...] [--old-generate PATH]
                             [--no-adaptive] [--old-specd-generate PATH] [--rounds 1]

For every prompt (one a line, chat-wrapped by the model's template, greedy,
requests end at the model's end of generation), in one run and in turn:
plain decoding of TARGET, speculative decoding with DRAFT at K fixed (--k),
and with adaptive K (up to 2 --k; left out with --no-adaptive); with
--draft-vocab, K fixed again at each draft vocabulary cut listed (0 = the
whole vocabulary); with --old-generate, K fixed with that other build (its
defaults); with --old-specd-generate, adaptive K by that (older) build.
The order of the runs is reversed every other prompt (ABBA); --rounds N
runs the prompt list N times over. Each row's tokens/s is specd-generate's
decode rate (tokens after the first over the time of the steps that made
them, prefill left out), so the ratio is what speculation does to decoding;
acceptance and tokens per target step come from its --json. Medians per
prompt file over the prompts whose runs all saw other processes use at most
--max-other-load cores (Hyg); the ratio is the median of the per-prompt
ratios (each pair ran back to back).

Prints a markdown table; the CPU is named in its header."""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import Hyg, cpu_name, pin  # noqa: E402


def run(gen, target, prompt, tokens, threads, extra):
    """One specd-generate run; its decode rate, speculation figures and the other processes' CPU."""
    argv = [gen, "-m", target, "--chat", "-p", prompt, "-n", str(tokens), "-t", str(threads), "--json"] + extra
    with Hyg() as h:
        r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    if r.returncode != 0:
        sys.exit("specd-generate failed (%d): %s" % (r.returncode, r.stderr[-500:]))
    d = json.loads(r.stdout)
    sp = d.get("spec", {})
    return {"tps": d["timings"]["decode_tok_s"], "acc": sp.get("acceptance_rate", 0.0),
            "tps_step": sp.get("tokens_per_step", 1.0), "k": sp.get("mean_k", 0.0), "other": h.other,
            "gen": d["timings"]["generated_tokens"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-prompts", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--cpus")
    ap.add_argument("--max-other-load", type=float, default=0.25)
    ap.add_argument("--specd-generate", default=os.path.join(os.path.dirname(__file__), "..", "build", "tools",
                                                             "specd-generate"))
    ap.add_argument("--draft-vocab", help="comma-separated draft vocabulary cuts, each a K fixed row")
    ap.add_argument("--old-generate", help="another specd-generate build, run at K fixed beside the others")
    ap.add_argument("--old-specd-generate", help="an older build's specd-generate: its adaptive K as one more row")
    ap.add_argument("--no-adaptive", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="run the prompt list this many times over")
    a = ap.parse_args()
    cpus = pin(a.cpus, a.threads)
    gen = a.specd_generate
    draft = ["--draft", a.draft, "-k", str(a.k)]
    adaptive = ["--draft", a.draft, "-k", str(2 * a.k), "--adaptive-k"]
    methods = [("plain", gen, []), ("draft K=%d" % a.k, gen, draft)]
    if a.old_generate:
        methods.append(("draft K=%d, old build" % a.k, a.old_generate, draft))
    for n in (a.draft_vocab.split(",") if a.draft_vocab else []):
        methods.append(("draft K=%d, vocab %s" % (a.k, n), gen, draft + ["--draft-vocab", n]))
    if not a.no_adaptive:
        methods.append(("draft K adaptive (<= %d)" % (2 * a.k), gen, adaptive))
    if a.old_specd_generate:
        methods.append(("draft K adaptive (<= %d), old build" % (2 * a.k), a.old_specd_generate, adaptive))
    print("CPU: %s; CPUs %s (process affinity, no thread pinned); target %s, draft %s; greedy, at most %d tokens "
          "ending at EOS, %d threads\n" % (cpu_name(), cpus, os.path.basename(a.target), os.path.basename(a.draft),
                                           a.tokens, a.threads))
    print("| prompts | method | decode tokens/s (median) | vs plain (median of per-prompt ratios) | acceptance | "
          "tokens / target step | mean K | other CPU, cores: median / max | prompts left out |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in a.prompts:
        with open(path) as f:
            prompts = [l.rstrip("\n").replace("\\n", "\n") for l in f if l.strip()][:a.max_prompts] * a.rounds
        rows = {m: [] for m, _, _ in methods}
        for pi, p in enumerate(prompts):
            for m, g, extra in (methods if pi % 2 == 0 else methods[::-1]):
                rows[m].append(run(g, a.target, p, a.tokens, a.threads, extra))
            print("  %s: %s" % (os.path.basename(path), " | ".join("%s %.1f" % (m, rows[m][-1]["tps"])
                                                                 for m, _, _ in methods)), file=sys.stderr)
        n = len(prompts)
        clean = [i for i in range(n) if all(rows[m][i]["other"] <= a.max_other_load for m, _, _ in methods)]
        keep = clean or list(range(n))
        others = [r["other"] for m, _, _ in methods for r in rows[m]]
        for m, _, _ in methods:
            rs = [rows[m][i] for i in keep]
            ratio = statistics.median(rows[m][i]["tps"] / rows["plain"][i]["tps"] for i in keep)
            print("| %s | %s | %.1f | %.2fx | %.3f | %.2f | %.2f | %.2f / %.2f | %d of %d%s |"
                  % (os.path.basename(path), m, statistics.median(r["tps"] for r in rs), ratio,
                     statistics.median(r["acc"] for r in rs), statistics.median(r["tps_step"] for r in rs),
                     statistics.median(r["k"] for r in rs), statistics.median(others), max(others), n - len(keep),
                     n, "" if clean else " (none clean: all kept)"))


if __name__ == "__main__":
    main()
