#!/usr/bin/env python3
"""eagle_wire.py — an EAGLE-3 head through the service in its two service
placements, beside plain decoding: in the verifier (specd-verifier --eagle)
and in its own drafter process fed the verifier's features over the wire
(specd-drafter --eagle), with what the features cost.

    .venv/bin/python bench/eagle_wire.py --model MODEL --head DIR [--bin build] [--n 8] [--tokens 64] [--k 3]
                                         [--threads-verifier 1] [--threads-drafter 1]
                                         [--prompts bench/prompts/chat.txt] [--runs 1]

Each placement runs under specd-launch (no gateway; K fixed at --k for the two
head placements, so both draft the same way whatever adaptive K would
choose for a weak head), the prompts one at a time (batch 1,
chat template, EOS ignored) through specd-client. Per placement: tokens/s
(generated tokens over the requests' wall time), drafted and accepted
tokens, accepted tokens per verify step. For the drafter placement, from the
processes' own logs at shutdown: the features' bytes per committed position
(verifier/verify_feat.c: sent; drafter/draft_head.c: received), the
drafter's time fusing them (the head's fc) per position, and the share of
the drafter's time that is. The placements alternate run by run (--runs R);
a shared machine's figures are noisy: re-measure on a quiet one."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import launch, stop  # noqa: E402


def serve(bindir, addr, prompts, tokens):
    tot = dict(generated=0, drafted=0, accepted=0, steps=0, seconds=0.0)
    for pr in prompts:
        t0 = time.monotonic()
        r = subprocess.run([os.path.join(bindir, "client", "specd-client"), "--coordinator", addr, "-p", pr, "--chat",
                            "-n", str(tokens), "--ignore-eos", "--json"], capture_output=True, text=True, timeout=900)
        tot["seconds"] += time.monotonic() - t0
        if r.returncode != 0:
            sys.exit("specd-client failed: %s" % r.stderr[-500:])
        st = json.loads(r.stdout)["stats"]
        tot["generated"] += st["generated_tokens"]
        tot["drafted"] += st["drafted"]
        tot["accepted"] += st["accepted"]
        tot["steps"] += st["target_steps"]
    return tot


def feature_costs(logpath):
    """The shutdown lines of verify_feat.c and draft_head.c, parsed."""
    text = open(logpath, errors="replace").read()
    out = {}
    m = re.search(r"sent the features of (\d+) committed positions to head drafters: (\d+) bytes", text)
    if m:
        out["sent_positions"], out["sent_bytes"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"head features of (\d+) positions received, (\d+) bytes \(\d+ a position\), (\d+) gaps; fused in "
                  r"([\d.]+) ms \(([\d.]+) us a position\), drafting ([\d.]+) ms", text)
    if m:
        out.update(recv_positions=int(m.group(1)), recv_bytes=int(m.group(2)), gaps=int(m.group(3)),
                   fuse_ms=float(m.group(4)), fuse_us_per_pos=float(m.group(5)), draft_ms=float(m.group(6)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"))
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--threads-verifier", type=int, default=1)
    ap.add_argument("--threads-drafter", type=int, default=1)
    ap.add_argument("--prompts", default=os.path.join(HERE, "prompts", "chat.txt"))
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    prompts = [l.strip() for l in open(a.prompts) if l.strip()][:a.n]
    fixed = ["--coordinator-arg", "--adaptive-k", "--coordinator-arg", "off", "--coordinator-arg", "--default-k",
             "--coordinator-arg", str(a.k)]
    threads = ["--threads-verifier", str(a.threads_verifier), "--threads-drafter", str(a.threads_drafter)]
    placements = [("plain", ["--no-draft"]), ("verifier", ["--eagle", a.head] + fixed),
                  ("drafter", ["--eagle-drafter", a.head] + fixed)]
    tmp = tempfile.mkdtemp(prefix="eagle-wire-")
    rows = {name: [] for name, _ in placements}
    for run in range(a.runs):
        for name, extra in placements:
            logpath = os.path.join(tmp, "%s-%d.log" % (name, run))
            p, addr = launch(a.bin, a.model, extra + threads, logpath)
            try:
                tot = serve(a.bin, addr, prompts, a.tokens)
            finally:
                stop(p)
            tot.update(feature_costs(logpath))
            rows[name].append(tot)
            print("run %d %-8s %6.2f tok/s  drafted %4d accepted %4d  %.2f tokens/step" % (
                run, name, tot["generated"] / tot["seconds"], tot["drafted"], tot["accepted"],
                tot["generated"] / max(1, tot["steps"])), flush=True)
    print("\nbest of %d run(s), %d prompts x %d tokens, K %d, verifier %d thread(s), drafter %d:" % (
        a.runs, len(prompts), a.tokens, a.k, a.threads_verifier, a.threads_drafter))
    plain = max(r["generated"] / r["seconds"] for r in rows["plain"])
    for name, _ in placements:
        best = max(rows[name], key=lambda r: r["generated"] / r["seconds"])
        tps = best["generated"] / best["seconds"]
        line = "%-8s %6.2f tok/s (%.2fx plain)  accepted %d of %d drafted, %.2f tokens per verify step" % (
            name, tps, tps / plain, best["accepted"], best["drafted"], best["generated"] / max(1, best["steps"]))
        print(line)
        if "recv_positions" in best:
            per = best["recv_bytes"] / max(1, best["recv_positions"])
            gen = best["generated"]
            print("         features: %d positions received (%d sent), %.0f bytes a committed position, %.0f bytes "
                  "a generated token (prompts included), %d gaps; fc over them %.1f us a position (%.1f%% of the "
                  "drafter's time)" % (best["recv_positions"], best.get("sent_positions", 0), per,
                                       best["recv_bytes"] / max(1, gen), best["gaps"], best["fuse_us_per_pos"],
                                       100.0 * best["fuse_ms"] / max(1e-9, best["fuse_ms"] + best["draft_ms"])))
    print("logs in %s" % tmp)


if __name__ == "__main__":
    main()
