"""The EAGLE head's drafts under the request's constraint (issue 35): the
head masks its draft vocabulary (in target ids, through d2t) at every
drafted position, after the forced drafts, in the single process
(specd-generate --eagle) and in the verifier (--eagle).

On the tiny random target (vocabulary 512) under the regex [a-z]{20,40}, a
random head whose 4-token draft vocabulary is two letter-only tokens (the
most frequent of the constrained references) and two tokens the regex
never allows (the most frequent other tokens of unconstrained output), so
an unmasked head drafts refused tokens:
  - specd-generate --eagle under the regex, greedy and seeded: exactly
    plain constrained decoding's tokens (specd-generate --regex), drafts
    accepted, and no chain the head drafted (its DEBUG lines) holds a
    refused token;
  - through the service (the head in the verifier, K fixed at 4): the same
    tokens, drafts accepted, and no refused token in any chain the
    verifier's head drafted.
And under a regex with forced words (RE_FORCED: " and ", " or "), greedy
and seeded, both placements give plain constrained decoding's tokens, and
both propose forced drafts (q = 1; specd-generate's forced_drafted, the
verifier's DEBUG lines), the head drafting on after them.
The drafted / accepted figures are logged."""
import json
import os
import re
import subprocess
import sys

import harness as H

RE = "[a-z]{20,40}"
RE_FORCED = "[a-z]{6,10} and [a-z]{6,10} or [a-z]{6,10}"
N = 48


def generate(h, target, prompt, extra=(), temp=0.0, seed=0):
    argv = [h.bin("generate"), "-m", target, "-p", prompt, "-n", str(N), "--json", "-t", "1"] + h.engine_args
    argv += list(extra)
    if temp:
        argv += ["--temp", str(temp), "--seed", str(seed)]
    r = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate %s failed (%d): %s" % (" ".join(extra), r.returncode,
                                                                       r.stderr[-2000:]))
    return json.loads(r.stdout.decode("utf-8", "surrogateescape")), r.stderr.decode("utf-8", "replace")


def chains_of(lines):
    """The chains drafter_eagle.c logs at DEBUG (the head's drafts, as proposed)."""
    return [[int(x) for x in ln.split(" drafted")[1].split()] for ln in lines
            if "eagle: slot" in ln and " context " in ln and " drafted" in ln]


def head_for(h, target, refs_con, refs_free):
    """Two letter-only tokens the constrained output uses most, two tokens the
    regex refuses that free output uses most; their ids, and the refused ones."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ref"))
    try:
        import gguf
        import numpy as np
        from eagle_ref import write_head
    except ImportError as e:
        H.skip("python packages for the head writer missing (%s); run scripts/setup" % e)
    f = gguf.GGUFReader(target).fields["tokenizer.ggml.tokens"]
    toks = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
    letters = [bool(re.fullmatch("[a-z]+", t)) for t in toks]

    def top(refs, want_letters):
        counts = np.bincount([t for r in refs for t in r["ids"]], minlength=len(toks))
        order = np.argsort(-counts, kind="stable")
        return [int(i) for i in order if counts[i] > 0 and letters[i] == want_letters][:2]
    allowed, refused = top(refs_con, True), top(refs_free, False)
    H.check(len(allowed) == 2 and len(refused) == 2, "no head vocabulary: %s %s" % (allowed, refused))
    hot = np.array(sorted(allowed + refused))

    def to_hot(t):
        t["d2t"] = (hot - np.arange(4)).astype(np.int64)
        t["t2d"] = np.isin(np.arange(len(toks)), hot)
    path = os.path.join(h.tmp, "eagle-head")
    write_head(path, hidden=64, vocab=len(toks), draft_vocab=4, seed=3, tensors_edit=to_hot)
    H.log("head drafts among %s: %s allowed, %s refused by %s" % (hot.tolist(), allowed, refused, RE))
    return path, set(refused)


def check_chains(chains, refused, what):
    bad = [c for c in chains if refused & set(c)]
    H.check(chains, "%s: the head drafted no chain" % what)
    H.check(not bad, "%s: %d of %d chains hold a token the constraint refuses, e.g. %s"
            % (what, len(bad), len(chains), bad[0] if bad else []))


def run(h):
    target, _ = h.tiny_models()
    prompts = H.random_prompts(4, seed=35)
    modes = [(0.0, 0), (0.8, 11)]  # greedy, seeded
    refs = {(p, m): generate(h, target, p, ["--regex", RE], *m)[0] for p in prompts for m in modes}
    refs_forced = {(p, m): generate(h, target, p, ["--regex", RE_FORCED], *m)[0] for p in prompts[:2] for m in modes}
    free = [generate(h, target, p)[0] for p in prompts]
    head, refused = head_for(h, target, list(refs.values()), free)

    # the single process: specd-generate --eagle under the regex
    drafted = accepted = 0
    chains = []
    for (p, m), ref in refs.items():
        out, err = generate(h, target, p, ["--regex", RE, "--eagle", head, "-k", "4", "-v"], *m)
        H.check(out["ids"] == ref["ids"], "specd-generate --eagle under %s (temperature %g): %s, plain %s"
                % (RE, m[0], out["ids"], ref["ids"]))
        drafted += out["spec"]["drafted"]
        accepted += out["spec"]["accepted"]
        chains += chains_of(err.splitlines())
    H.log("single process: %d requests = plain constrained decoding; drafted %d, accepted %d, %d chains"
          % (len(refs), drafted, accepted, len(chains)))
    H.check(accepted > 0, "specd-generate --eagle: no draft accepted under the constraint")
    check_chains(chains, refused, "specd-generate --eagle")
    forced = 0
    for (p, m), ref in refs_forced.items():
        out, _ = generate(h, target, p, ["--regex", RE_FORCED, "--eagle", head, "-k", "4"], *m)
        H.check(out["ids"] == ref["ids"], "specd-generate --eagle under %s (temperature %g): %s, plain %s"
                % (RE_FORCED, m[0], out["ids"], ref["ids"]))
        forced += out["constraint"]["forced_drafted"]
    H.check(forced > 0, "specd-generate --eagle under %s: no forced draft" % RE_FORCED)
    H.log("single process under %s: %d requests = plain, %d forced drafts" % (RE_FORCED, len(refs_forced), forced))

    # the service: the head in the verifier
    _, ver, _ = h.start_service(target, drafter=None, coord_extra=H.FIXED_K, verifier_extra=("--eagle", head, "-v"))
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=N, sampling=dict(temperature=m[0], seed=m[1]),
                 constraint={"kind": 3, "text": RE}) for p, m in refs]
    res = c.run(jobs, timeout=600)
    H.expect_equal_ids(res, list(refs.values()), "%d constrained requests drafted by the verifier's head" % len(jobs))
    st = [r["finished"]["stats"] for r in res]
    drafted, accepted = (sum(s.get(f, 0) for s in st) for f in ("drafted", "accepted"))
    with open(ver.logpath, errors="replace") as f:
        chains = chains_of(f.readlines())
    H.log("service: drafted %d, accepted %d, %d chains" % (drafted, accepted, len(chains)))
    H.check(accepted > 0, "the verifier's head: no draft accepted under the constraint")
    check_chains(chains, refused, "the verifier's head")
    with open(ver.logpath, errors="replace") as f:
        f.seek(0, 2)
        start = f.tell()
    jobs = [dict(prompt=p, max_tokens=N, sampling=dict(temperature=m[0], seed=m[1]),
                 constraint={"kind": 3, "text": RE_FORCED}) for p, m in refs_forced]
    res = c.run(jobs, timeout=600)
    H.expect_equal_ids(res, list(refs_forced.values()), "%d requests under %s drafted by the verifier's head"
                       % (len(jobs), RE_FORCED))
    st = [r["finished"]["stats"] for r in res]
    with open(ver.logpath, errors="replace") as f:
        f.seek(start)
        forced = sum(int(ln.split(": ")[-1].split()[0]) for ln in f if " forced drafts" in ln)
    H.log("service under %s: drafted %d, accepted %d, %d forced drafts" % ((RE_FORCED,) + tuple(
        sum(s.get(f, 0) for s in st) for f in ("drafted", "accepted")) + (forced,)))
    H.check(forced > 0, "the verifier's head proposed no forced draft under %s" % RE_FORCED)
    c.close()


if __name__ == "__main__":
    H.main(run)
