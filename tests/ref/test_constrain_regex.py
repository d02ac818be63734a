#!/usr/bin/env python3
"""Oracle: specd's regex matcher (engine/constrain/, through
tests/constrain_cli) against Python's re.fullmatch with re.ASCII (\\d \\w \\s
are ASCII classes in specd, as in ECMA-262).

Random patterns over a small alphabet (literals, '.', classes, negated
classes, \\d \\w \\s and their negations, groups, alternation, * + ? {m}
{m,} {m,n} {,n} and lazy forms) are each matched against random strings
and every string of length <= 3 over the alphabet; the two must agree on
every one. Also: hand-written patterns, including ones that make a
backtracking matcher take exponential time, which specd answers in linear
time (a generous wall-clock bound guards against a hang, not a speed test).

Exit 0: all agree; 1: a mismatch (the first ones printed); 77: skipped.
"""
import itertools
import json
import os
import random
import re
import subprocess
import sys
import time

SKIP = 77
SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))
CLI = os.path.join(BUILD, "tests", "constrain_cli")
ALPHABET = ["a", "b", "c", "1", " ", "\n", "é", "_"]


def atom(rng, depth):
    r = rng.random()
    if depth < 3 and r < 0.2:
        return "(" + ("?:" if rng.random() < 0.3 else "") + alt(rng, depth + 1) + ")"
    if r < 0.45:
        return rng.choice(["a", "b", "c", "1", "é", " ", "\\n", "\\.", "_"])
    if r < 0.55:
        return "."
    if r < 0.7:
        return rng.choice(["\\d", "\\w", "\\s", "\\D", "\\W", "\\S"])
    neg = "^" if rng.random() < 0.3 else ""
    items = rng.sample(["a", "b", "c", "0-9", "\\d", "\\s", "é", "_", "a-c"], rng.randint(1, 3))
    return "[" + neg + "".join(items) + "]"


def quant(rng):
    r = rng.random()
    if r < 0.55:
        return ""
    q = rng.choice(["*", "+", "?", "{2}", "{1,}", "{0,2}", "{1,3}", "{,2}"])
    if rng.random() < 0.15:
        q += "?"
    return q


def seq(rng, depth):
    return "".join(atom(rng, depth) + quant(rng) for _ in range(rng.randint(1, 4)))


def alt(rng, depth):
    return "|".join(seq(rng, depth) for _ in range(rng.randint(1, 2 if depth else 3)))


def run_cli(pattern, strings):
    inp = "".join(s.encode("utf-8").hex() + "\n" for s in strings)
    out = subprocess.run([CLI, "regex", pattern], input=inp, capture_output=True, text=True, timeout=120)
    if out.returncode == 3:
        return out.stdout.strip()
    if out.returncode != 0:
        raise RuntimeError("constrain_cli failed on %r: %s" % (pattern, out.stderr[-400:]))
    return [line == "1" for line in out.stdout.split("\n") if line]


def model_outputs():
    """With the demo model: specd-generate --regex outputs (greedy and
    seeded, plain and with the n-gram drafter) fullmatch with re, and the
    speculative ones equal the plain ones."""
    model = os.environ.get("SPECD_MODEL")
    gen = os.path.join(BUILD, "tools", "specd-generate")
    if not model or not os.path.exists(gen):
        print("model part skipped (no SPECD_MODEL or specd-generate)")
        return 0
    cases = [("Today's date is ", "\\d{4}-\\d{2}-\\d{2}"), ("The answer (yes or no): ", "(yes|no)"),
             ("A phone number: ", "\\(\\d{3}\\) \\d{3}-\\d{4}"), ("Name a color: ", "[a-z]{3,10}"),
             ("Three words: ", "[A-Za-z]+( [A-Za-z]+){2}\\.")]
    bad = 0
    for prompt, pat in cases:
        outs = []
        for extra in ([], ["--ngram", "-k", "4"], ["--forced-draft", "-k", "4"], ["--temp", "0.9", "--seed", "7"],
                      ["--temp", "0.9", "--seed", "7", "--ngram"]):
            argv = [gen, "-m", model, "-p", prompt, "-n", "48", "--json", "-t", "1", "--regex", pat] + extra
            out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                print("specd-generate --regex %r %s failed: %s" % (pat, extra, out.stderr[-400:]))
                bad += 1
                continue
            r = json.loads(out.stdout)
            outs.append(r["ids"])
            if r["stop_reason"] == "eos" and not re.fullmatch(pat, r["text"], re.ASCII):
                bad += 1
                print("OUTPUT %r of --regex %r %s does not match" % (r["text"], pat, extra))
            else:
                print("--regex %r %s: %r (%s)" % (pat, extra, r["text"], r["stop_reason"]))
        if len(outs) == 5 and not (outs[0] == outs[1] == outs[2] and outs[3] == outs[4]):
            bad += 1
            print("--regex %r: speculative output differs from plain" % pat)
    return bad


def main():
    if not os.path.exists(CLI):
        print("SKIP: %s not built" % CLI)
        return SKIP
    rng = random.Random(35)
    short = ["".join(t) for n in range(4) for t in itertools.product(ALPHABET[:5], repeat=n)]
    patterns = [alt(rng, 0) for _ in range(250)]
    patterns += ["^(a|ab)(c|bcd)(d*)$", "(a+)+b", "(a|a)*c", "(\\d{1,3}\\.){3}\\d{1,3}", "[^\\n]*", "a{,3}b{2,}",
                 "x*?y+?z??", "\\.\\*\\+", "[\\]a-]+", "a{", "é+[à-ü]"]
    bad = 0
    checked = 0
    for pat in patterns:
        try:
            compiled = re.compile(pat, re.ASCII)
        except re.error:
            continue
        strings = short + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))) for _ in range(60)]
        got = run_cli(pat, strings)
        if isinstance(got, str):
            print("REFUSED %r: %s" % (pat, got))
            bad += 1
            continue
        for s, g in zip(strings, got):
            want = compiled.fullmatch(s) is not None
            checked += 1
            if g != want:
                bad += 1
                if bad <= 10:
                    print("MISMATCH %r on %r: specd %s, re %s" % (pat, s, g, want))
    # exponential for a backtracker, linear here
    t0 = time.time()
    long_a = "a" * 5000 + "!"
    for pat in ["(a+)+b", "(a|a)*b", "(a*)*b", "((a+)+)+b"]:
        got = run_cli(pat, [long_a, "a" * 30 + "b"])
        if got != [False, True]:
            bad += 1
            print("MISMATCH %r on long input: %s" % (pat, got))
    if time.time() - t0 > 60:
        bad += 1
        print("the catastrophic-backtracking patterns took %.1f s" % (time.time() - t0))
    # refused with the construct named
    for pat, needle in [("(a)\\1", "back-reference"), ("(?<=a)b", "look-around"), ("a\\bb", "word boundary"),
                        ("a{1000}{1000}", "nothing to repeat")]:
        got = run_cli(pat, ["a"])
        if not (isinstance(got, str) and needle in got):
            bad += 1
            print("%r: expected a refusal naming %r, got %r" % (pat, needle, got))
    bad += model_outputs()
    print("%d patterns, %d strings checked, %d problems" % (len(patterns), checked, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
