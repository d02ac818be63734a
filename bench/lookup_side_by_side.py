#!/usr/bin/env python3
"""Side by side: specd's n-gram drafter and llama.cpp's prompt lookup decoding.

Usage: lookup_side_by_side.py MODEL.gguf PROMPTS.txt... [--tokens 48] [--threads 2]
                              [--cpus 0-1] [--max-other-load 0.25] [--specd-generate PATH]
                              [--llama-lookup PATH | --no-llama-lookup] [--no-python-lookup]
                              [--draft-max 4] [--old-specd-generate PATH]

For every prompt (one a line, "\\n" for a newline, chat-wrapped by the model's
own chat template), interleaved in one run, greedy, the same thread count:
  - llama.cpp's own C++ lookup decoding, `llama-lookup` (examples/lookup of
    the llama.cpp that llama-cpp-python vendors, built by
    `scripts/setup --llama-tools`): n-grams of 1..4 tokens from the context,
    drafts of up to --draft-max tokens; and the same program with
    --spec-draft-n-max 0 as its plain decoding (the same loop, no drafts).
    It prints what it drafted and accepted and its decode speed (prefill
    separate), so these rows compare with specd's directly;
  - llama.cpp plain and with llama-cpp-python's LlamaPromptLookupDecoding
    (n-grams up to 2, drafts of up to num_pred_tokens = --draft-max), a
    Python-side loop, unless --no-python-lookup. llama-cpp-python reports no
    acceptance: the lookup object is wrapped to count its calls (one per
    target step) and the tokens it proposed, so acceptance is
    (generated - steps) / proposed; its figure is end-to-end (prefill
    included);
  - specd-generate plain and with --ngram --adaptive-k (K <= --draft-max),
    from its --json timings (decode tokens over the time of the steps that
    made them); with --old-specd-generate also --ngram --adaptive-k by that
    (older) build, old and new in turn ABBA (old first on even prompts).
The chat wrapping is the GGUF's tokenizer.chat_template rendered by jinja2
for llama-lookup (which takes raw text and parses special tokens), the same
template through llama-cpp-python's own renderer, and specd's --chat.

Both programs run on the same CPUs (--cpus, default the first --threads
online CPUs of this process's affinity): this process takes that affinity
before llama.cpp starts its threads in it, and children inherit it. Neither
pins a thread to a single core (specd's pool does not; llama.cpp's default
does not either), so both are placed the same way; the table header names
the set.

Hygiene: around every run the CPU time of other processes is sampled
(/proc/stat busy minus this process and its children, i.e. specd-generate
once reaped), and prompts on which any run saw more than --max-other-load
cores are left out of the medians; the table gives the shares.

Prints a markdown table. Needs a Release build of specd, and llama-lookup or
llama-cpp-python (or both)."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import Hyg, cpu_name, pin  # noqa: E402


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
    ap.add_argument("--llama-lookup", default="", help="llama.cpp's llama-lookup (default: scripts/setup --llama-tools's)")
    ap.add_argument("--no-llama-lookup", action="store_true")
    ap.add_argument("--no-python-lookup", action="store_true", help="leave llama-cpp-python's rows out")
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--old-specd-generate", default="", help="an older build's specd-generate: one more row")
    a = ap.parse_args()
    cpus = pin(a.cpus, a.threads)
    lookup_bin = None if a.no_llama_lookup else (a.llama_lookup or find_llama_lookup())
    if not a.no_llama_lookup and not lookup_bin:
        sys.exit("llama-lookup not found: run scripts/setup --llama-tools, or give --llama-lookup PATH or --no-llama-lookup")
    methods = []
    if lookup_bin:
        template = chat_template(a.model)
        methods += ["llama-lookup plain", f"llama-lookup K<={a.draft_max}"]
    if not a.no_python_lookup:
        methods += ["llama-cpp-python plain", "llama-cpp-python lookup"]
    methods += ["specd plain", "specd ngram adaptive"]
    if a.old_specd_generate:
        methods += ["specd ngram adaptive, old build"]
    if a.no_python_lookup:
        return run(a, cpus, methods, lookup_bin, template if lookup_bin else None, None, None, None)
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

    lookup = Counting(max_ngram_size=2, num_pred_tokens=a.draft_max)
    plain_llm = Llama(model_path=a.model, n_threads=a.threads, n_ctx=2048, verbose=False)
    spec_llm = Llama(model_path=a.model, n_threads=a.threads, n_ctx=2048, verbose=False, draft_model=lookup)
    return run(a, cpus, methods, lookup_bin, template if lookup_bin else None, lookup, plain_llm, spec_llm)


def find_llama_lookup():
    root = os.path.join(os.environ.get("SPECD_CACHE", os.path.expanduser("~/.cache/specd")), "llama-tools")
    if not os.path.isdir(root):
        return None
    for h in sorted(os.listdir(root)):
        p = os.path.join(root, h, "bin", "llama-lookup")
        if os.access(p, os.X_OK):
            return p
    return None


def chat_template(model):
    """The GGUF's tokenizer.chat_template as a jinja2 template."""
    import gguf
    import jinja2
    r = gguf.GGUFReader(model)
    f = r.fields["tokenizer.chat_template"]
    text = bytes(f.parts[f.data[0]]).decode()
    env = jinja2.Environment(loader=jinja2.BaseLoader(), keep_trailing_newline=True)
    return env.from_string(text)


def llama_lookup_run(a, lookup_bin, prompt, draft_max):
    """(decoded tokens, decode seconds, drafted, accepted) from llama-lookup's log."""
    cmd = [lookup_bin, "-m", a.model, "-p", prompt, "-n", str(a.tokens), "-t", str(a.threads), "-tb",
           str(a.threads), "-c", "2048", "--temp", "0", "--top-k", "1", "--spec-draft-n-max", str(draft_max), "--seed", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stderr + r.stdout
    if r.returncode != 0:
        sys.exit(f"llama-lookup failed ({r.returncode}): {log[-2000:]}")
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", log)
    d = re.search(r"n_drafted\s*=\s*(\d+)", log)
    acc = re.search(r"n_accept\s*=\s*(\d+)", log)
    if not (m and d and acc):
        sys.exit(f"llama-lookup printed no statistics: {log[-2000:]}")
    return int(m.group(1)), float(m.group(2)), int(d.group(1)), int(acc.group(1))


def run(a, cpus, methods, lookup_bin, template, lookup, plain_llm, spec_llm):
    def llama_run(llm, text):
        llm.reset()
        t0 = time.monotonic()
        r = llm.create_chat_completion(messages=[{"role": "user", "content": text}], max_tokens=a.tokens,
                                       temperature=0.0, top_k=1)
        dt = time.monotonic() - t0
        return r["usage"]["completion_tokens"], dt

    def specd_run(text, spec, gen):
        cmd = [gen, "-m", a.model, "-p", text, "--chat", "-n", str(a.tokens), "-t", str(a.threads),
               "--json", "--temp", "0"]
        if spec:
            cmd += ["--ngram", "--adaptive-k", "-k", str(a.draft_max)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        j = json.loads(r.stdout)
        return j["timings"], j.get("spec", {})

    rows = {m: {"tps": [], "other": [], "acc_num": 0, "acc_den": 0, "tok": 0, "steps": 0} for m in methods}
    keep = []
    for path in a.prompts:
        for text in read_prompts(path):
            ok = True
            order = list(rows)
            if a.old_specd_generate and len(keep) % 2 == 0:  # ABBA: the old build's adaptive run first
                order[-2], order[-1] = order[-1], order[-2]
            for m in order:
                with Hyg() as h:
                    if m.startswith("llama-lookup"):
                        prompt = template.render(messages=[{"role": "user", "content": text}],
                                                 add_generation_prompt=True)
                        n, dt, drafted, accepted = llama_lookup_run(a, lookup_bin, prompt,
                                                                    0 if m.endswith("plain") else a.draft_max)
                        tps = n / dt if dt > 0 else 0.0
                        if not m.endswith("plain"):
                            rows[m]["acc_num"] += accepted
                            rows[m]["acc_den"] += drafted
                            rows[m]["tok"] += n
                            rows[m]["steps"] += n - accepted  # each step commits its accepted drafts and one more
                    elif m.startswith("llama-cpp-python"):
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
                        old = m.endswith("old build")
                        t, sp = specd_run(text, "adaptive" in m, a.old_specd_generate if old else a.specd_generate)
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
    print(f"CPU: {cpu_name()}. Both programs on CPUs {cpus} (process affinity, {a.threads} threads each, "
          "no thread pinned to one core).\n")
    print(f"{len(idx)} of {len(keep)} prompts kept (other processes at most {a.max_other_load} cores during every "
          f"run){'' if any(keep) else ': NONE was, all kept, unreliable'}.\n")
    print("| method | tokens/s (median) | vs own plain | acceptance | tokens / target step | "
          "other CPU, cores: median / max |")
    print("| --- | --- | --- | --- | --- | --- |")
    med = {m: statistics.median([rows[m]["tps"][i] for i in idx]) for m in rows}
    for m, r in rows.items():
        base = med[m.split(" ")[0] + " plain"]
        acc = f"{r['acc_num'] / r['acc_den']:.3f}" if r["acc_den"] else "—"
        tps_step = f"{r['tok'] / r['steps']:.2f}" if r["steps"] else "1.00"
        print(f"| {m} | {med[m]:.2f} | {med[m] / base:.2f}x | {acc} | {tps_step} | "
              f"{statistics.median(r['other']):.2f} / {max(r['other']):.2f} |")


if __name__ == "__main__":
    main()
