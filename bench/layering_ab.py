#!/usr/bin/env python3
"""The forward A/B of bench/results/layering-ab.md: specd-bench forward of two builds (before and
after the engine layering, each built in its own worktree: /tmp/ab-3293dcc and /tmp/ab-43ab741),
4 rounds alternating which goes first, both pinned to CPUs 0-1, the CPU time other processes used
around every run sampled with bench_common.Hyg (the builds predate specd-bench's own hygiene
columns). Prints markdown rows."""
import os, re, subprocess, sys, statistics
sys.path.insert(0, "/work/main/bench")
from bench_common import Hyg, pin, cpu_name
cpus = pin("0-1", 2)
M = subprocess.run(["/work/main/tools/fetch-model"], capture_output=True, text=True).stdout.strip()
bins = {"before": "/tmp/ab-3293dcc/build/tools/specd-bench", "after": "/tmp/ab-43ab741/build/tools/specd-bench"}
env = dict(os.environ, SPECD_CPU_WEIGHTS="f32")  # both builds predate --cpu-weights f32: they read this
rows = []
for r in range(4):
    order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
    res = {}
    for who in order:
        out = f"/tmp/ab-{who}-{r}.md"
        with Hyg() as h:
            subprocess.run([bins[who], "forward", "-m", M, "-t", "2", "-r", "3", "--prompt-len", "128", "--max-k", "8",
                            "--decode-steps", "32", "--bw-mb", "256", "-o", out], capture_output=True, env=env, check=True)
        t = open(out).read()
        dec = float(re.search(r"decode at batch 1 \| [0-9.]+ ms/token, ([0-9.]+) tok/s", t).group(1))
        pr = float(re.search(r"prompt processing, 128 tokens \| ([0-9.]+) tok/s", t).group(1))
        res[who] = (dec, pr, h.other)
    rows.append(res)
    b, a = res["before"], res["after"]
    print(f"| {r+1} | {'before first' if order[0]=='before' else 'after first'} | {b[0]:.1f} | {a[0]:.1f} | {a[0]/b[0]:.3f} | {b[1]:.0f} | {a[1]:.0f} | {a[1]/b[1]:.3f} | {b[2]:.2f} / {a[2]:.2f} |", flush=True)
dr = statistics.median(x["after"][0] / x["before"][0] for x in rows)
pr = statistics.median(x["after"][1] / x["before"][1] for x in rows)
print(f"| median of ratios | | | | **{dr:.3f}** | | | **{pr:.3f}** | |")
print(f"CPU: {cpu_name()}; CPUs {cpus}")
