#!/usr/bin/env python3
"""Side by side: specd's n-gram drafter and llama.cpp's prompt lookup decoding.

Usage: lookup_side_by_side.py MODEL.gguf PROMPTS.txt... [--tokens 48] [--threads 2]
                              [--cpus 0-1] [--max-other-load 0.25] [--specd-generate PATH]

For every prompt (one a line, "\\n" for a newline, chat-wrapped by each
program's own chat template), interleaved in one run, greedy, the same
thread count:
  - llama.cpp plain, through llama-cpp-python;
  - llama.cpp with prompt lookup decoding (llama-cpp-python's
    LlamaPromptLookupDecoding: n-grams up to 2, drafts of up to
    num_pred_tokens = 4, the issue's "draft up to 4");
  - specd-generate plain and with --ngram --adaptive-k (K <= 4), from its
    --json timings (decode tokens over the time of the steps that made them).
llama-cpp-python reports no acceptance: the lookup object is wrapped to count
its calls (one per target step) and the tokens it proposed, so acceptance is
(generated - steps) / proposed and tokens per step generated / steps (each
step commits its accepted drafts and one more token). llama.cpp's figure is
end-to-end (its prefill included, which the lookup does not change); specd's
is its decode figure: compare each program's ratio to its own plain run.

Both programs run on the same CPUs (--cpus, default the first --threads
online CPUs of this process's affinity): this process takes that affinity
before llama.cpp starts its threads in it, and specd-generate inherits it.
Neither pins a thread to a single core (specd's pool does not; llama.cpp's
default does not either), so both are placed the same way; the table
header names the set.

Hygiene: around every run the CPU time of other processes is sampled
(/proc/stat busy minus this process and its children, i.e. specd-generate
once reaped), and prompts on which any run saw more than --max-other-load
cores are left out of the medians; the table gives the shares.

Prints a markdown table. Needs llama-cpp-python (pip) and a Release build
of specd."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import Hyg, pin  # noqa: E402


def read_prompts(path):
    with open(path) as f:
        return [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpus", default="", help="CPU list both programs run on (default: the first --threads)")
    ap.add_argument("--max-other-load", type=float, default=0.25)
    ap.add_argument("--specd-generate", default="build/tools/specd-generate")
    a = ap.parse_args()
    cpus = pin(a.cpus, a.threads)
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class Counting(LlamaPromptLookupDecoding):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.calls = 0
            self.proposed = 0

        def __call__(self, input_ids, *args, **kwargs):
            out = super().__call__(input_ids, *args, **kwargs)
            self.calls += 1
            self.proposed += len(out)
            return out

    lookup = Counting(max_ngram_size=2, num_pred_tokens=4)
    plain_llm = Llama(model_path=a.model, n_threads=a.threads, n_ctx=2048, verbose=False)
    spec_llm = Llama(model_path=a.model, n_threads=a.threads, n_ctx=2048, verbose=False, draft_model=lookup)

    def llama_run(llm, text):
        llm.reset()
        t0 = time.monotonic()
        r = llm.create_chat_completion(messages=[{"role": "user", "content": text}], max_tokens=a.tokens,
                                       temperature=0.0, top_k=1)
        dt = time.monotonic() - t0
        return r["usage"]["completion_tokens"], dt

    def specd_run(text, spec):
        cmd = [a.specd_generate, "-m", a.model, "-p", text, "--chat", "-n", str(a.tokens), "-t", str(a.threads),
               "--json", "--temp", "0"]
        if spec:
            cmd += ["--ngram", "--adaptive-k", "-k", "4"]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        j = json.loads(r.stdout)
        return j["timings"], j.get("spec", {})

    rows = {m: {"tps": [], "other": [], "acc_num": 0, "acc_den": 0, "tok": 0, "steps": 0}
            for m in ("llama.cpp plain", "llama.cpp lookup", "specd plain", "specd ngram adaptive")}
    keep = []
    for path in a.prompts:
        for text in read_prompts(path):
            ok = True
            for m in rows:
                with Hyg() as h:
                    if m.startswith("llama.cpp"):
                        llm = spec_llm if m.endswith("lookup") else plain_llm
                        c0, p0 = lookup.calls, lookup.proposed
                        n, dt = llama_run(llm, text)
                        tps = n / dt if dt > 0 else 0.0
                        if m.endswith("lookup"):
                            steps, prop = lookup.calls - c0, lookup.proposed - p0
                            rows[m]["acc_num"] += max(0, n - steps)
                            rows[m]["acc_den"] += prop
                            rows[m]["tok"] += n
                            rows[m]["steps"] += steps
                    else:
                        t, sp = specd_run(text, m.endswith("adaptive"))
                        tps = t["decode_tok_s"]
                        if sp:
                            rows[m]["acc_num"] += sp["accepted"]
                            rows[m]["acc_den"] += sp["drafted"]
                            rows[m]["tok"] += sp["accepted"] + sp["target_steps"]
                            rows[m]["steps"] += sp["target_steps"]
                rows[m]["tps"].append(tps)
                rows[m]["other"].append(h.other)
                ok = ok and 0 <= h.other <= a.max_other_load
            keep.append(ok)
            print(f"{path}: prompt {len(keep)} done", file=sys.stderr)
    idx = [i for i, k in enumerate(keep) if k] or list(range(len(keep)))
    print(f"Both programs on CPUs {cpus} (process affinity, {a.threads} threads each, no thread pinned to one core).\n")
    print(f"{len(idx)} of {len(keep)} prompts kept (other processes at most {a.max_other_load} cores during every "
          f"run){'' if any(keep) else ': NONE was, all kept, unreliable'}.\n")
    print("| method | tokens/s (median) | vs own plain | acceptance | tokens / target step | "
          "other CPU, cores: median / max |")
    print("| --- | --- | --- | --- | --- | --- |")
    med = {m: statistics.median([rows[m]["tps"][i] for i in idx]) for m in rows}
    for m, r in rows.items():
        base = med["llama.cpp plain"] if m.startswith("llama.cpp") else med["specd plain"]
        acc = f"{r['acc_num'] / r['acc_den']:.3f}" if r["acc_den"] else "—"
        tps_step = f"{r['tok'] / r['steps']:.2f}" if r["steps"] else "1.00"
        print(f"| {m} | {med[m]:.2f} | {med[m] / base:.2f}x | {acc} | {tps_step} | "
              f"{statistics.median(r['other']):.2f} / {max(r['other']):.2f} |")


if __name__ == "__main__":
    main()
