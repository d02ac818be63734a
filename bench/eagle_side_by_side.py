#!/usr/bin/env python3
"""eagle_side_by_side.py — specd's EAGLE-3 head beside llama.cpp's best
speculation on the same target file, one process each, interleaved (issue
32: "measure, in the same run, llama.cpp's best speculation on the same
target file: its draft-model speculation with a Q4 draft, and its lookup").

    .venv/bin/python bench/eagle_side_by_side.py --head DIR --draft Q4.gguf TARGET.gguf [TARGET.gguf ...]
        [--prompts bench/prompts/chat.txt] [--max-prompts 4] [--tokens 96] [--threads 2]
        [--eagle-k 0] [--llama-draft-max 3] [--lookup-max 4] [--rounds 1]
        [--cpus 0-1] [--max-other-load 0.25] [--specd-generate build/tools/specd-generate]
        [--llama-tools DIR] [-o OUT.md]

Per target file, for every prompt (chat-wrapped by the model's own template,
greedy, at most --tokens new tokens, ending at the model's end of
generation), in one run and in turn:
  - specd plain: specd-generate --chat;
  - specd eagle: specd-generate --chat --eagle DIR, adaptive K up to 4 (or,
    with --eagle-k K > 0, K fixed). The head is used as it is on every target
    file: a head trained on one quantization of a model reads the same layers
    of another (the same hidden states up to the quantization's rounding);
  - llama.cpp plain: llama-lookup --spec-draft-n-max 0 (its lookup loop
    drafting nothing: one target token a step);
  - llama.cpp draft model: llama-speculative-simple --spec-type draft-simple -md DRAFT
    --spec-draft-n-max --llama-draft-max (default 3, its own default; the
    draft on the same threads, -td);
  - llama.cpp lookup: llama-lookup --spec-draft-n-max --lookup-max (n-grams
    of the context, its prompt lookup decoding).
The order of the methods is reversed every other prompt (ABBA); --rounds N
runs the prompt list N times over. Each figure is the program's own decode
rate: tokens after the prompt over the time of the steps that made them
(specd-generate's --json decode_tok_s; llama.cpp's "decoded N tokens in S
seconds"), prefill left out, so the ratios are what speculation does to
decoding. Acceptance and tokens per target step come from each program's
counts. llama.cpp's programs are those `scripts/setup --llama-tools` builds
from the llama.cpp that llama-cpp-python vendors (same flags as its wheel).

All programs run with --threads threads on the same CPUs (--cpus, default
the first --threads this process may use; no thread pinned to a core).
Hygiene (bench_common.Hyg): prompts during whose runs processes other than
the one measured used more than --max-other-load cores are left out of the
medians (all kept, and said, when none is clean). Ratios are medians of the
per-prompt ratios against the same target's specd plain, each pair run
back to back within the same minute."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import Hyg, cpu_name, pin  # noqa: E402

METHODS = ["specd plain", "specd eagle", "llama.cpp plain", "llama.cpp draft", "llama.cpp lookup"]


def find_llama_tool(name, tools_dir):
    """tools_dir/NAME, else the newest $SPECD_CACHE/llama-tools/HASH/bin/NAME."""
    if tools_dir:
        p = os.path.join(tools_dir, name)
        return p if os.access(p, os.X_OK) else None
    root = os.path.join(os.environ.get("SPECD_CACHE", os.path.expanduser("~/.cache/specd")), "llama-tools")
    found = [os.path.join(root, h, "bin", name) for h in (os.listdir(root) if os.path.isdir(root) else [])]
    found = [p for p in found if os.access(p, os.X_OK)]
    return max(found, key=os.path.getmtime) if found else None


def chat_template(model):
    """The GGUF's tokenizer.chat_template as a jinja2 template."""
    import gguf
    import jinja2
    r = gguf.GGUFReader(model)
    f = r.fields.get("tokenizer.chat_template")
    if f is None:
        sys.exit("eagle_side_by_side: %s has no tokenizer.chat_template" % model)
    text = bytes(f.parts[f.data[0]]).decode()
    env = jinja2.Environment(loader=jinja2.BaseLoader(), keep_trailing_newline=True)
    return env.from_string(text)


def run_specd(a, target, prompt, extra):
    argv = [a.specd_generate, "-m", target, "--chat", "-p", prompt, "-n", str(a.tokens), "-t", str(a.threads),
            "--json"] + extra
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    if r.returncode != 0:
        sys.exit("specd-generate failed (%d): %s" % (r.returncode, r.stderr[-800:]))
    d = json.loads(r.stdout)
    sp = d.get("spec", {})
    gen = d["timings"]["generated_tokens"]
    return {"tps": d["timings"]["decode_tok_s"], "gen": gen, "drafted": sp.get("drafted", 0),
            "accepted": sp.get("accepted", 0), "steps": sp.get("target_steps", gen)}


def run_llama(a, argv):
    """A llama.cpp example's decode rate and counts, from its log."""
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    log = r.stderr + r.stdout
    if r.returncode != 0:
        sys.exit("%s failed (%d): %s" % (os.path.basename(argv[0]), r.returncode, log[-2000:]))
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", log)
    d = re.search(r"n_drafted\s*=\s*(\d+)", log)
    acc = re.search(r"n_accept\s*=\s*(\d+)", log)
    if not (m and d and acc):
        sys.exit("%s printed no statistics: %s" % (os.path.basename(argv[0]), log[-2000:]))
    n, sec, drafted, accepted = int(m.group(1)), float(m.group(2)), int(d.group(1)), int(acc.group(1))
    return {"tps": n / sec if sec > 0 else 0.0, "gen": n, "drafted": drafted, "accepted": accepted,
            "steps": max(1, n - accepted)}


def llama_common(a, target, text):
    return ["-m", target, "-p", text, "-n", str(a.tokens), "-t", str(a.threads), "-tb", str(a.threads), "-c", "2048",
            "--temp", "0", "--top-k", "1", "--seed", "1"]


def run_method(a, m, target, prompt, rendered):
    if m == "specd plain":
        return run_specd(a, target, prompt, [])
    if m == "specd eagle":
        k = ["-k", str(a.eagle_k)] if a.eagle_k > 0 else ["-k", "4", "--adaptive-k"]
        return run_specd(a, target, prompt, ["--eagle", a.head] + k)
    if m == "llama.cpp plain":
        return run_llama(a, [a.lookup_bin] + llama_common(a, target, rendered) + ["--spec-draft-n-max", "0"])
    if m == "llama.cpp lookup":
        return run_llama(a, [a.lookup_bin] + llama_common(a, target, rendered) +
                         ["--spec-draft-n-max", str(a.lookup_max)])
    return run_llama(a, [a.spec_bin] + llama_common(a, target, rendered) +
                     ["--spec-type", "draft-simple", "-md", a.draft, "-td", str(a.threads), "-tbd", str(a.threads),
                      "--spec-draft-n-max",
                      str(a.llama_draft_max)])


def table(a, target, rows, keep, n):
    idx = keep or list(range(n))
    med = {m: statistics.median(rows[m][i]["tps"] for i in idx) for m in METHODS}
    out = []
    for m in METHODS:
        rs = [rows[m][i] for i in idx]
        ratio = statistics.median(rows[m][i]["tps"] / rows["specd plain"][i]["tps"] for i in idx)
        own = "llama.cpp plain" if m.startswith("llama") else "specd plain"
        own_ratio = statistics.median(rows[m][i]["tps"] / rows[own][i]["tps"] for i in idx)
        drafted = sum(r["drafted"] for r in rs)
        acc = "%.3f" % (sum(r["accepted"] for r in rs) / drafted) if drafted else "—"
        tps_step = sum(r["gen"] for r in rs) / max(1, sum(r["steps"] for r in rs))
        others = [r["other"] for r in rows[m]]
        out.append("| %s | %s | %.1f | %.2fx | %.2fx | %s | %.2f | %.2f / %.2f | %d of %d%s |" % (
            os.path.basename(target), m, med[m], ratio, own_ratio, acc, tps_step, statistics.median(others),
            max(others), n - len(idx), n, "" if keep else " (none clean: all kept)"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="target GGUF files (e.g. the F16 and Q8_0 of one model)")
    ap.add_argument("--head", required=True, help="EAGLE-3 head directory (tools/train-eagle's)")
    ap.add_argument("--draft", required=True, help="llama.cpp's draft model (a Q4 file of the same model)")
    ap.add_argument("--prompts", default=os.path.join(HERE, "prompts", "chat.txt"))
    ap.add_argument("--max-prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eagle-k", type=int, default=0, help="specd's K with the head (0: adaptive, up to 4)")
    ap.add_argument("--llama-draft-max", type=int, default=3, help="llama-speculative-simple's --spec-draft-n-max")
    ap.add_argument("--lookup-max", type=int, default=4, help="llama-lookup's --spec-draft-n-max")
    ap.add_argument("--rounds", type=int, default=1, help="run the prompt list this many times over")
    ap.add_argument("--cpus", help="CPU list every program runs on (default: the first --threads)")
    ap.add_argument("--max-other-load", type=float, default=0.25)
    ap.add_argument("--specd-generate", default=os.path.join(ROOT, "build", "tools", "specd-generate"))
    ap.add_argument("--llama-tools", help="directory of llama-lookup and llama-speculative-simple "
                                          "(default: scripts/setup --llama-tools's)")
    ap.add_argument("-o", "--out", help="also write the table (markdown) to this file")
    a = ap.parse_args()
    for path in a.targets + [a.draft, a.prompts, os.path.join(a.head, "config.json")]:
        if not os.path.exists(path):
            sys.exit("eagle_side_by_side: %s does not exist" % path)
    if not os.access(a.specd_generate, os.X_OK):
        sys.exit("eagle_side_by_side: no %s (build it first)" % a.specd_generate)
    a.lookup_bin = find_llama_tool("llama-lookup", a.llama_tools)
    a.spec_bin = find_llama_tool("llama-speculative-simple", a.llama_tools)
    if not a.lookup_bin or not a.spec_bin:
        sys.exit("eagle_side_by_side: llama-lookup and llama-speculative-simple not found: run scripts/setup "
                 "--llama-tools, or give --llama-tools DIR")
    cpus = pin(a.cpus, a.threads)
    with open(a.prompts) as f:
        prompts = [l.rstrip("\n").replace("\\n", "\n") for l in f if l.strip()][:a.max_prompts] * a.rounds
    load0 = os.getloadavg()
    templates = {t: chat_template(t) for t in a.targets}
    rows = {t: {m: [] for m in METHODS} for t in a.targets}
    for pi, p in enumerate(prompts):
        for t in a.targets:
            rendered = templates[t].render(messages=[{"role": "user", "content": p}], add_generation_prompt=True)
            for m in (METHODS if pi % 2 == 0 else METHODS[::-1]):
                with Hyg() as h:
                    r = run_method(a, m, t, p, rendered)
                r["other"] = h.other
                rows[t][m].append(r)
            print("  prompt %d %s: %s" % (pi + 1, os.path.basename(t), " | ".join(
                "%s %.1f" % (m, rows[t][m][-1]["tps"]) for m in METHODS)), file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    lines = ["CPU: %s; CPUs %s (process affinity, %d threads each, no thread pinned); head %s (%s); llama.cpp "
             "draft %s (--spec-draft-n-max %d), lookup --spec-draft-n-max %d; %d prompts of %s x %d round(s), "
             "greedy, at most %d tokens ending at EOS; load average %.2f at the start, %.2f at the end" % (
                 cpu_name(), cpus, a.threads, a.head,
                 "K %d" % a.eagle_k if a.eagle_k else "adaptive K <= 4", os.path.basename(a.draft),
                 a.llama_draft_max, a.lookup_max, len(prompts) // a.rounds, os.path.basename(a.prompts), a.rounds,
                 a.tokens, load0[0], load1[0]), "",
             "| target | method | decode tok/s (median) | vs specd plain | vs own plain | acceptance | tokens / "
             "target step | other CPU, cores: median / max | prompts left out |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in a.targets:
        n = len(prompts)
        keep = [i for i in range(n) if all(rows[t][m][i]["other"] <= a.max_other_load for m in METHODS)]
        lines += table(a, t, rows[t], keep, n)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
