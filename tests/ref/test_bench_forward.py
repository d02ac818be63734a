#!/usr/bin/env python3
"""Smoke test of `specd-bench forward` (the mode behind bench/results/forward-cpu.md).

Writes a tiny random model with specd-mkmodel, runs the forward benchmark on
it with small sizes (2 repetitions, 8-token prompt, k up to 8, 4 MiB
bandwidth buffers) and checks that the table is complete and sane: every
measure row is present with a positive number, the k-cost table has k = 1..8
in both prefix columns with k = 1 at exactly 1.00, the targets line names
both targets, the hygiene line gives the other processes' CPU share, and
--out writes the same table. Bad arguments must exit 2
with a message. This guards the benchmark tool itself; it says nothing about
speed (the model is tiny and the figures are noise).

Environment: SPECD_BUILD_DIR. Exit 77 when the binaries are missing.
"""
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))

ROWS = [
    "memory read bandwidth",
    "memory copy bandwidth, read + write bytes",
    "memory copy, bytes copied per second",
    "prompt processing, 8 tokens",
    "decode at batch 1",
    "decode weight streaming",
    "decode / copy bandwidth (read + write)",
    "decode / bytes copied per second",
    "decode / read bandwidth",
]


def fail(msg, out=""):
    print(f"FAIL: {msg}")
    if out:
        print(out)
    sys.exit(1)


def main():
    bench = os.path.join(BUILD, "tools", "specd-bench")
    mk = os.path.join(BUILD, "tools", "specd-mkmodel")
    if not (os.path.exists(bench) and os.path.exists(mk)):
        print(f"skip: specd-bench or specd-mkmodel not built in {BUILD}")
        return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        r = subprocess.run([mk, "-o", model, "--dim", "64", "--layers", "2", "--vocab", "300"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode:
            fail("specd-mkmodel failed", r.stderr)
        out_md = os.path.join(tmp, "forward.md")
        cmd = [bench, "forward", "-m", model, "-t", "2", "-r", "2", "--prompt-len", "8", "--max-k", "8",
               "--decode-steps", "4", "--bw-mb", "4", "-o", out_md]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode:
            fail(f"{' '.join(cmd)} exited {r.returncode}", r.stdout + r.stderr)
        table = r.stdout
        for name in ROWS:
            m = re.search(r"^\| " + re.escape(name) + r"[^|]* \| ([0-9.]+)", table, re.M)
            if not m:
                fail(f"row '{name}' missing", table)
            if not float(m.group(1)) > 0:
                fail(f"row '{name}' is not positive", table)
        ks = re.findall(r"^\| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", table, re.M)
        if [int(k[0]) for k in ks] != list(range(1, 9)):
            fail(f"k-cost rows are {[k[0] for k in ks]}, want 1..8", table)
        if ks[0][2] != "1.00" or ks[0][4] != "1.00":
            fail("k = 1 is not 1.00 relative to itself", table)
        if any(float(k[1]) <= 0 or float(k[3]) <= 0 for k in ks):
            fail("a k-cost time is not positive", table)
        if not re.search(r"^Targets: decode >= 60% of copy bandwidth .*(met|MISSED); 8 tokens in one call "
                         r"<= 1\.6x the cost of 1: [0-9.]+x after 8 tokens, (met|MISSED)", table, re.M):
            fail("targets line missing or malformed", table)
        if not re.search(r"^- hygiene: other processes(' CPU use during a repetition, median [0-9.]+, max [0-9.]+ "
                         r"cores; \d of 2 repetitions over 0\.25 of a core left out| used more than 0\.25 of a core "
                         r"during every repetition)", table, re.M):
            fail("hygiene line missing or malformed", table)
        with open(out_md) as f:
            if f.read() != table:
                fail("--out file differs from the table printed on stdout")
        for bad in (["-r", "0"], ["-r", "x"], ["--max-k", "65"], ["--bw-mb", "1"], ["-t", "-1"],
                    ["--max-other-load", "0"]):
            r = subprocess.run([bench, "forward", "-m", model] + bad, capture_output=True, text=True, timeout=60)
            if r.returncode != 2 or "specd-bench:" not in r.stderr:
                fail(f"bad arguments {bad}: exit {r.returncode}, stderr {r.stderr!r}")
        r = subprocess.run([bench, "forward", "-m", os.path.join(tmp, "missing.gguf"), "--bw-mb", "4"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 1 or "cannot open" not in r.stderr:
            fail(f"missing model: exit {r.returncode}, stderr {r.stderr!r}")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
