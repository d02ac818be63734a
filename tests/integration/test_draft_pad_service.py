"""test_draft_pad_service — a draft padded to other embedding rows than the
target serves through the service; a different tokenizer is refused at
registration.

Tiny random models with specd-mkmodel's synthetic tokenizer of 500 tokens.
The target is padded with unused [PADn] tokens to 640 rows; the drafts are
the same model (same seed and shape: specd-mkmodel gives the shared rows the
same numbers) padded to 576 rows (fewer: a context holding one of the
target's padding ids 576..639 drafts nothing from then on) and to 768 (more:
drafts among the target's 640 ids only), so their drafts are accepted. For
each, specd-drafter --model DRAFT registers (the coordinator logs both
sizes), and greedy requests with K fixed (harness.FIXED_K) equal plain
greedy decoding token for token, with drafts accepted, and seeded sampled
ones (temperature 0.9) equal specd-generate's seeded plain decoding; with 576 rows some
outputs hold a padding id (else the no-draft path went untested); neither
drafter refuses an id nor has a step refused by the coordinator (an id
past the target's rows). A drafter
whose model has another tokenizer (520 real tokens) is refused: it exits
with status 3, the coordinator's log names both sizes, the drafter's its own
(a refused peer is not told the target's identity), and the coordinator
never lists a drafter.

Run: ctest --test-dir build -R it_draft_pad_service --output-on-failure
"""
import os
import re

import harness as H
from test_draft_pad import mk  # the same random models, written one way

N_PROMPTS = 8
REGISTERED = re.compile(r"drafter \S+ \(\w+\) registered as worker")
TOKENS = 32
TEMP, SEED = 0.9, 500


def log_text(p):
    with open(p.logpath, errors="replace") as f:
        return f.read()


def check_refused(h, coord, other):
    """A drafter with another tokenizer: refused, both sizes in the coordinator's log, its own in the drafter's
    (the refused peer is not told the target's identity), never listed."""
    dr = h.start_drafter("model", draft=other)
    H.wait_until(lambda: not dr.alive(), 60, "the drafter with another tokenizer to be refused")
    text = log_text(dr)
    H.check(dr.popen.returncode == 3, "the refused drafter exited with %s, want 3" % dr.popen.returncode)
    H.check("VOCAB_MISMATCH" in text and "vocabulary: 520 tokens" in text and "640" not in text,
            "the refused drafter's log does not name its own size (520) alone: %s" % text[-600:])
    said = [l for l in log_text(coord).splitlines() if "vocabulary mismatch" in l]
    H.check(len(said) == 1 and "has 520 tokens" in said[0] and "the target has 640 tokens" in said[0],
            "the coordinator's refusal does not name both sizes (520 and 640): %s" % said)
    drafters = [w for w in H_workers(h) if w.get("role") == H.pb.ROLE_DRAFTER]
    H.check(not drafters, "the coordinator lists a refused drafter: %s" % drafters)
    H.log("a drafter with another tokenizer is refused, both sizes named, never listed")


def H_workers(h):
    c = h.client()
    try:
        st = c.stats(timeout=10)
    finally:
        c.close()
    H.check(st is not None, "no ServiceStats from the coordinator")
    return st.get("workers", [])


def serve_with(h, coord, draft, rows, prompts, refs, n_registered):
    dr = h.start_drafter("model", draft=draft)
    H.wait_until(lambda: len(REGISTERED.findall(log_text(coord))) >= n_registered or not dr.alive(), 120,
                 "the drafter padded to %d rows to register" % rows)
    H.check(dr.alive(), "the drafter padded to %d rows exited: %s" % (rows, log_text(dr)[-600:]))
    H.check("pads the target's tokenizer to %d rows, the target to 640" % rows in log_text(coord),
            "the coordinator did not log the drafter's %d rows beside the target's 640" % rows)
    c = h.client()
    greedy = [dict(prompt=p, max_tokens=TOKENS, ignore_eos=True) for p in prompts]
    seeded = [dict(g, sampling=dict(temperature=TEMP, seed=SEED + i)) for i, g in enumerate(greedy)]
    res = c.run(greedy + seeded, timeout=600)
    c.close()
    H.expect_equal_ids(res[len(prompts):], refs[len(prompts):], "seeded requests with a draft padded to %d rows"
                       % rows)
    res = res[:len(prompts)]
    H.expect_equal_ids(res, refs, "greedy requests with a draft padded to %d rows" % rows)
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in res)
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in res)
    H.log("draft padded to %d rows: all %d equal; drafted %d, accepted %d" % (rows, len(res), drafted, accepted))
    H.check(accepted > 0, "the draft padded to %d rows: no draft accepted (drafted %d)" % (rows, drafted))
    H.check(dr.alive(), "the drafter padded to %d rows exited while serving" % rows)
    text = log_text(dr)
    H.check("outside [0," not in text, "the drafter padded to %d rows refused an id: %s" % (rows, text[-600:]))
    H.check("error from the coordinator" not in text, "the coordinator refused the drafts of the draft padded "
            "to %d rows (an id past the target's rows?): %s" % (rows, text[-600:]))
    bad = [l for l in log_text(coord).splitlines() if "failed step" in l or "bad message" in l]
    H.check(not bad, "the coordinator refused a drafter's step: %s" % bad[:3])
    h.stop(dr)


def run(h):
    target = mk(h, os.path.join(h.tmp, "target.gguf"), 41, 500, 640, dim="64", layers="2")
    fewer = mk(h, os.path.join(h.tmp, "pad576.gguf"), 41, 500, 576, dim="64", layers="2")
    more = mk(h, os.path.join(h.tmp, "pad768.gguf"), 41, 500, 768, dim="64", layers="2")
    other = mk(h, os.path.join(h.tmp, "other.gguf"), 44, 520, 0, dim="32", layers="1")
    prompts = H.random_prompts(N_PROMPTS, seed=33)
    refs = [h.reference(target, p, TOKENS, ignore_eos=True) for p in prompts]
    refs += [h.reference(target, p, TOKENS, temp=TEMP, seed=SEED + i, ignore_eos=True) for i, p in enumerate(prompts)]
    padded = sum(any(t >= 576 for t in r["ids"]) for r in refs[:len(prompts)])
    H.check(padded > 0, "no reference output holds a padding id >= 576: the no-draft path would go untested")
    H.log("%d of %d greedy reference outputs hold a target padding id (>= 576)" % (padded, len(prompts)))
    coord = h.start_coordinator(target, H.FIXED_K)
    h.start_verifier()
    h.wait_registered(verifier=True, drafter=False)
    check_refused(h, coord, other)
    serve_with(h, coord, fewer, 576, prompts, refs, 1)
    serve_with(h, coord, more, 768, prompts, refs, 2)


if __name__ == "__main__":
    H.main(run)
