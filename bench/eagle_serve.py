#!/usr/bin/env python3
"""eagle_serve.py — an EAGLE-3 head through the service at 8 and 32 concurrent
requests, against plain decoding of the same target (issue 32: "never below
0.95x plain at 8 and 32 concurrent requests").

    .venv/bin/python bench/eagle_serve.py --model MODEL --head DIR [--bin build] [--conc 8,32]
        [--tokens 64] [--rounds 3] [--warmup 1] [--placements verifier,drafter]
        [--threads-verifier 2] [--threads-drafter 1] [--prompts bench/prompts/chat.txt]
        [--max-other-load 0.25] [--prefix-cache 0] [--k K] [-o OUT.md]

Starts every service at once under specd-launch (no gateway; each on its own
private ipc:// sockets; an idle one waits on its sockets): plain
(--no-draft), the head in the verifier (--eagle DIR) and the head in its own
drafter process (--eagle-drafter DIR), the same target file and verifier
threads. Then, per placement, `specd-bench serve --versus` measures the
placement's service against the plain one: at each concurrency, --warmup
unmeasured pairs, then --rounds pairs of rounds of that many concurrent
requests (chat prompts, greedy, -n --tokens each, EOS ignored), the two
services alternating ABBA and sending the same prompts within a pair. The
tokens/s of a round is its completion tokens over its wall time (the
aggregate throughput); the ratio is the median of the per-pair ratios, with
their geometric mean and 95% interval. The coordinator's K policy is the
service's default (adaptive K, which should back a head that does not pay
off to K = 0), unless --k fixes K (adaptive off). specd-bench's hygiene
leaves out pairs during which processes other than specd-* used more than
--max-other-load cores.

The verifiers' prefix cache is off by default (--prefix-cache 0): specd-bench
sends the same prompts to both services of a pair and cycles its prompt
list, and a cache turns those repeats into hits for plain decoding and for
the head in the verifier, but not for the head in a drafter process (a
sequence whose features go to a drafter computes every row of its prompt:
an adopted block's rows were never computed, so there are no features to
send; verifier/verify_feat.c). --prefix-cache 50 (the service's default)
measures that too.

Prints specd-bench's tables and a summary: per concurrency and placement,
both services' tokens/s, the ratio, tokens per target step, rows verified per
token (1 + K per step: how much was drafted), acceptance, whether the
issue's 0.95x holds, and the CPU time the two services' processes took
over the concurrency's rounds (both generate the same tokens: the same
prompts, -n, EOS ignored), eagle over plain: what the head costs in work,
which a loaded machine's wall time hides. Absolute tokens/s on a shared machine are noise; the
ratios within a pair are what this measures."""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import cpu_name, launch, stop  # noqa: E402

TARGET_RATIO = 0.95
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root):
    """CPU seconds (user + system) of process root and its live descendants
    (the service's coordinator, verifier and drafter), from /proc."""
    kids, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        kids.setdefault(int(fields[1]), []).append(int(d))
        cpu[int(d)] = int(fields[11]) + int(fields[12])
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0)
        todo += kids.get(p, [])
    return total / TICK


ROW = re.compile(r"^\| (\d+) \| ([^|]+?) \| ([\d.]+) \| ([\d.]+)-([\d.]+) \| ([^|]*?) \| ([^|]*?) \| ([^|]*?) \| "
                 r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\d+)% \| (\d+)% \| ([\d.]+) / ([\d.]+) \| (.*?) \|")


def parse_rows(text):
    """specd-bench serve's table rows: {(concurrency, label): fields}."""
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        rows[(int(m.group(1)), m.group(2))] = dict(
            tps=float(m.group(3)), lo=float(m.group(4)), hi=float(m.group(5)), ratio=m.group(6).strip(),
            gm_ci=m.group(7).strip(), tok_step=float(m.group(9)), rows_tok=float(m.group(10)),
            acc=int(m.group(13)), other_med=float(m.group(15)), other_max=float(m.group(16)),
            dirty=m.group(17).strip())
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="target GGUF")
    ap.add_argument("--head", required=True, help="EAGLE-3 head directory (tools/train-eagle's)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"), help="build tree (default: build)")
    ap.add_argument("--conc", default="8,32", help="concurrencies (default 8,32)")
    ap.add_argument("--tokens", type=int, default=64, help="completion tokens per request (default 64)")
    ap.add_argument("--rounds", type=int, default=3, help="measured pairs per concurrency (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured pairs first (default 1)")
    ap.add_argument("--placements", default="verifier,drafter",
                    help="which head placements: verifier (--eagle), drafter (--eagle-drafter)")
    ap.add_argument("--threads-verifier", type=int, default=2)
    ap.add_argument("--threads-drafter", type=int, default=1, help="the drafter process's threads (placement drafter)")
    ap.add_argument("--prompts", default=os.path.join(HERE, "prompts", "chat.txt"))
    ap.add_argument("--max-other-load", type=float, default=0.25)
    ap.add_argument("--prefix-cache", type=int, default=0,
                    help="the verifiers' --prefix-cache PCT (default 0: off; the service's default is 50)")
    ap.add_argument("--k", type=int, default=0, help="fix K (adaptive K off) instead of the default policy")
    ap.add_argument("-o", "--out", help="also write the summary (markdown) to this file")
    a = ap.parse_args()
    places = [p for p in a.placements.split(",") if p]
    for p in places:
        if p not in ("verifier", "drafter"):
            sys.exit("eagle_serve: --placements takes verifier and/or drafter, not %r" % p)
    for path in (a.model, os.path.join(a.head, "config.json"), a.prompts):
        if not os.path.exists(path):
            sys.exit("eagle_serve: %s does not exist" % path)
    bench = os.path.join(a.bin, "tools", "specd-bench")
    if not os.access(bench, os.X_OK):
        sys.exit("eagle_serve: no %s (build it first)" % bench)
    policy = []
    if a.k > 0:
        policy = ["--coordinator-arg", "--adaptive-k", "--coordinator-arg", "off",
                  "--coordinator-arg", "--default-k", "--coordinator-arg", str(a.k)]
    tv = ["--threads-verifier", str(a.threads_verifier), "--verifier-arg", "--prefix-cache",
          "--verifier-arg", str(a.prefix_cache)]
    flags = {"plain": ["--no-draft"] + tv,
             "verifier": ["--eagle", a.head] + tv + policy,
             "drafter": ["--eagle-drafter", a.head, "--threads-drafter", str(a.threads_drafter)] + tv + policy}
    concs = [int(c) for c in a.conc.split(",") if c]
    tmp = tempfile.mkdtemp(prefix="eagle-serve-")
    procs, addr = {}, {}
    try:
        for name in ["plain"] + places:
            procs[name], addr[name] = launch(a.bin, a.model, flags[name], os.path.join(tmp, name + ".log"))
        load0 = os.getloadavg()
        results, cpu = {}, {}
        for conc in concs:
            for name in places:
                label = "eagle in %s" % name
                cmd = [bench, "serve", "--coordinator", addr[name], "--versus", addr["plain"], "--labels",
                       label + ",plain", "--conc", str(conc), "-n", str(a.tokens), "--rounds", str(a.rounds),
                       "--warmup", str(a.warmup), "--prompts", a.prompts, "--max-other-load", str(a.max_other_load)]
                print("$ " + " ".join(cmd), flush=True)
                c0 = {n: tree_cpu(procs[n].pid) for n in (name, "plain")}
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
                cpu[(conc, name)] = {n: tree_cpu(procs[n].pid) - c0[n] for n in c0}
                print(r.stdout, flush=True)
                if r.returncode != 0:
                    sys.exit("eagle_serve: specd-bench serve failed (%d): %s" % (r.returncode, r.stderr[-1000:]))
                results[(conc, name)] = (label, parse_rows(r.stdout))
        load1 = os.getloadavg()
    finally:
        for p in procs.values():
            stop(p)
    lines = ["CPU: %s; target %s; head %s; verifier %d thread(s)%s; %s; %d tokens a request, greedy, "
             "chat prompts of %s; prefix cache %s; %d measured pairs (+%d warm-up) per concurrency; load average %.2f at the "
             "start, %.2f at the end" % (
                 cpu_name(), os.path.basename(a.model), a.head, a.threads_verifier,
                 ", drafter %d" % a.threads_drafter if "drafter" in places else "",
                 "K fixed at %d" % a.k if a.k else "adaptive K (the default policy)", a.tokens,
                 os.path.basename(a.prompts), "%d%%" % a.prefix_cache if a.prefix_cache else "off", a.rounds, a.warmup, load0[0], load1[0]), "",
             "| concurrency | placement | eagle tok/s | plain tok/s | eagle / plain: median of pairs | geometric "
             "mean [95% CI] | >= 0.95x | eagle tokens / step | eagle rows / token | acceptance | service CPU "
             "a token, eagle / plain | pairs over the load limit |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for conc in concs:
        for name in places:
            label, rows = results[(conc, name)]
            c = cpu[(conc, name)]
            e, p = rows.get((conc, label)), rows.get((conc, "plain"))
            if not e or not p:
                sys.exit("eagle_serve: no row for concurrency %d in specd-bench's table" % conc)
            ok = e["ratio"] and float(e["ratio"]) >= TARGET_RATIO
            lines.append("| %d | %s | %.1f | %.1f | %s | %s | %s | %.2f | %.2f | %d%% | %.2f (%.1f / %.1f s) | %s |" % (
                conc, name, e["tps"], p["tps"], e["ratio"], e["gm_ci"], "yes" if ok else "**no**", e["tok_step"],
                e["rows_tok"], e["acc"], c[name] / max(1e-9, c["plain"]), c[name], c["plain"], e["dirty"]))
    text = "\n".join(lines) + "\n"
    print(text)
    print("service logs in %s" % tmp)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
