"""Per-request view of the drafter choice: where it gains or loses against
the fixed drafter kinds, by prompt and by kind of prompt.

`specd-bench serve --modes A,B` gives the choice against one fixed kind as
the median of per-round ratios; it cannot say which requests the few
percent come from. This sends each prompt of a file once per mode, one
request at a time, the modes rotated per prompt (A B C, then C B A, ...) so
that drift hits them alike, and prints one JSON line per request with its
Finished.stats (steps, drafts, accepted, total and first-token times, the
kind it ended on, its kind switches) and the CPU time that processes other
than the service's ("specd-*") and this one used meanwhile, in cores.

Modes: choice (the coordinator picks), ngram / model (pinned), target
(no speculation), and old: the choice on a second service (--addr2: an
older build with the same flags), so old and new choice run interleaved.

    bench/choice_probe.py run --addr tcp://127.0.0.1:7700 [--addr2 ...] \
        --prompts bench/prompts/mixed.txt --modes choice,old,ngram,model --rounds 2 > probe.jsonl
    bench/choice_probe.py report probe.jsonl [more.jsonl ...]

The report gives per mode and prompt kind (even lines of mixed.txt:
summaries, odd: chat) the tokens/s over the requests and, for the choice
against each other mode, the ratio of total times for the same tokens and
the geometric mean of the per-request ratios with a 95% interval."""
import argparse
import collections
import glob
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))

MODES = {"choice": (0, 0), "old": (0, 0), "ngram": (0, 2), "model": (0, 1), "target": (-1, 0)}


def other_busy():
    """(all CPU busy jiffies, those of the service's and python processes)."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    total = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    ours = 0
    for p in glob.glob("/proc/[0-9]*/stat"):
        try:
            t = open(p).read()
        except OSError:
            continue
        name = t[t.index("(") + 1:t.rindex(")")]
        if name.startswith("specd-") or name.startswith("python"):
            rest = t[t.rindex(")") + 2:].split()
            ours += int(rest[11]) + int(rest[12])
    return total, ours


def run(a):
    import zmq
    import harness as H

    class Ctx:
        zctx = zmq.Context()

    prompts = [l.rstrip("\n").replace("\\n", "\n") for l in open(a.prompts) if l.strip()]
    modes = a.modes.split(",")
    for m in modes:
        if m not in MODES or (m == "old" and not a.addr2):
            sys.exit("choice_probe: unknown mode %r (or old without --addr2)" % m)
    ctx = Ctx()
    c = H.Client(ctx, a.addr, key=None)
    c2 = H.Client(ctx, a.addr2, key=None) if a.addr2 else None
    hz = os.sysconf("SC_CLK_TCK")

    def one(mode, i):
        max_k, kind = MODES[mode]
        job = dict(prompt=prompts[i], chat=True, max_tokens=a.n, max_k=max_k)
        if kind:
            job["drafter_kind"] = kind
        b0, t0 = other_busy(), time.monotonic()
        r = (c2 if mode == "old" else c).run([job], timeout=600)[0]
        wall = time.monotonic() - t0
        b1 = other_busy()
        st = r["finished"]["stats"] if r["finished"] else {}
        other = ((b1[0] - b0[0]) - (b1[1] - b0[1])) / hz / wall
        return dict(mode=mode, prompt=i, n=len(r["ids"]), wall=wall, other=round(other, 2), rid=r["request_id"],
                    err=r["error"], **st)

    for w in range(a.warmup):
        for m in modes:
            one(m, w % len(prompts))
    seq = 0
    for _ in range(a.rounds):
        for i in range(len(prompts)):
            order = modes if seq % 2 == 0 else modes[::-1]
            seq += 1
            for m in order:
                print(json.dumps(one(m, i)), flush=True)


def geo(v):
    logs = [math.log(x) for x in v]
    mu = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in logs) / (len(logs) - 1)) if len(logs) > 1 else 0.0
    half = 1.96 * sd / math.sqrt(len(logs))
    return math.exp(mu), math.exp(mu - half), math.exp(mu + half)


def report(a):
    rows = [json.loads(l) for f in a.files for l in open(f) if l.strip()]
    modes = []
    for r in rows:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["mode"], r["prompt"] % 2)].append(r)
    print("| mode | prompts | tokens/s | steps / request | tokens / step | kind switches | kind at the end |")
    print("|---|---|---:|---:|---:|---:|---|")
    for m in modes:
        for k, name in ((0, "summaries"), (1, "chat")):
            rs = by[(m, k)]
            n = sum(r["n"] for r in rs)
            t = sum(r["total_ms"] for r in rs)
            steps = sum(r.get("target_steps", 0) for r in rs)
            sw = sum(r.get("drafter_switches", 0) for r in rs)
            kinds = "".join({1: "m", 2: "n"}.get(r.get("drafter_kind", 0), "-") for r in rs)
            print("| %s | %s | %.1f | %.1f | %.2f | %d | %s |" % (m, name, n / t * 1e3, steps / len(rs),
                                                                   n / max(steps, 1), sw, kinds))
    idx = collections.defaultdict(dict)
    seen = collections.Counter()
    for r in rows:
        key = (r["prompt"], seen[(r["mode"], r["prompt"])])
        seen[(r["mode"], r["prompt"])] += 1
        idx[key][r["mode"]] = r
    print()
    print("| choice / | prompts | time ratio, same tokens | geometric mean of per-request ratios [95% CI] | requests |")
    print("|---|---|---:|---|---:|")
    for other in modes:
        if other == "choice":
            continue
        for k, name in ((0, "summaries"), (1, "chat"), (None, "all")):
            pairs = [d for (p, _), d in idx.items() if "choice" in d and other in d and (k is None or p % 2 == k)]
            if not pairs:
                continue
            v = [d[other]["total_ms"] / d["choice"]["total_ms"] * d["choice"]["n"] / d[other]["n"] for d in pairs]
            tc = sum(d["choice"]["total_ms"] / d["choice"]["n"] for d in pairs)
            to = sum(d[other]["total_ms"] / d[other]["n"] for d in pairs)
            g, lo, hi = geo(v)
            print("| %s | %s | %.3f | %.3f [%.3f, %.3f] | %d |" % (other, name, to / tc, g, lo, hi, len(v)))
    oth = sorted(r["other"] for r in rows)
    # the median only: a process first seen inside a short window counts all its CPU time there
    print("\nother CPU during the requests, cores: median %.2f" % oth[len(oth) // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--addr", required=True)
    r.add_argument("--addr2", default=None)
    r.add_argument("--prompts", default="bench/prompts/mixed.txt")
    r.add_argument("--modes", default="choice,ngram,model")
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("-n", type=int, default=64)
    r.add_argument("--warmup", type=int, default=1)
    p = sub.add_parser("report")
    p.add_argument("files", nargs="+")
    a = ap.parse_args()
    run(a) if a.cmd == "run" else report(a)


if __name__ == "__main__":
    main()
