"""Drafters under the request's constraint (issue 35): the coordinator
sends a constrained sequence's constraint with every DraftSeq, and a
drafter with the tokenizer drafts the tokens it forces first (q one-hot)
and masks the rest (drafter/draft_constrain.c).

On SmolLM2 (chat prompts), one coordinator (K fixed at 4) and verifier, and
two rounds of drafters, each an n-gram and a 1-layer self-draft drafter
(requests pinned to each kind):
  - round 1 with --unconstrained (drafts ignore the constraint: the state
    before this change), round 2 following it;
  - greedy requests under two JSON Schemas and a regex and one seeded
    request, per drafter kind: in both rounds exactly specd-generate's
    tokens under the same constraint;
  - with the constraint, each drafter kind has more drafts accepted and
    no more target steps than without (the figures are logged);
  - a coordinator with --local-ngram: the same tokens, and more drafts
    accepted than the unconstrained n-gram drafter's.
"""
import json
import os
import subprocess

import harness as H

KIND = {"json_schema": 2, "regex": 3}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                         "country": {"enum": ["France", "Spain", "Italy"]},
                                         "capital": {"type": "boolean"}},
        "required": ["city", "country", "capital"], "additionalProperties": False}
REGEX = "[0-9]{1,3}( apples| pears)"
DRAFTERS = (("ngram", 2), ("layers", 3))  # start_drafter kind, DrafterKind


def reference(h, model, prompt, n, flag, value, temp=0.0, seed=0):
    argv = [h.bin("generate"), "-m", model, "-p", prompt, "-n", str(n), "--json", "-t", "1", "--chat", flag, value]
    if temp:
        argv += ["--temp", str(temp), "--seed", str(seed)]
    r = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate %s failed (%d): %s" % (flag, r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout)


def drafters_alive(c):
    st = c.stats(timeout=1.0) or {}
    return sum(1 for w in st.get("workers", []) if w.get("alive") and w.get("role") == 2)


def round_of(h, c, cases, refs, n, extra, what):
    """Runs every case with each drafter kind; returns {kind: (drafted, accepted, steps)}."""
    drafters = [h.start_drafter(kind, extra=list(extra)) for kind, _ in DRAFTERS]
    H.wait_until(lambda: drafters_alive(c) == len(DRAFTERS), 180 if H.sanitized() else 60,
                 "both drafters to register", interval=0.2)
    figures = {}
    for kind, dk in DRAFTERS:
        jobs = [dict(prompt=p, chat=True, max_tokens=n, drafter_kind=dk, sampling=smp,
                     constraint={"kind": KIND[k], "text": t}) for p, k, t, _, _, smp in cases]
        res = c.run(jobs, timeout=900)
        H.expect_equal_ids(res, refs, "%s, %s drafter" % (what, kind))
        st = [r["finished"]["stats"] for r in res]
        figures[kind] = tuple(sum(s.get(f, 0) for s in st) for f in ("drafted", "accepted", "target_steps"))
        H.log("%s, %s drafter: drafted %d, accepted %d, target steps %d" % ((what, kind) + figures[kind]))
    for d in drafters:
        h.stop(d)
    H.wait_until(lambda: drafters_alive(c) == 0, 60, "the drafters to leave", interval=0.2)
    return figures


def run(h):
    model = h.smollm()
    n = 48
    person = os.path.join(h.tmp, "person.json")
    city = os.path.join(h.tmp, "city.json")
    for path, schema in ((person, PERSON), (city, CITY)):
        with open(path, "w") as f:
            json.dump(schema, f)
    greedy, seeded = {"temperature": 0.0}, {"temperature": 0.8, "seed": 11}
    cases = [  # (prompt, kind, text, specd-generate flag, value, sampling)
        ("Give me a person as JSON.", "json_schema", json.dumps(PERSON), "--json-schema", person, greedy),
        ("Describe Paris as JSON.", "json_schema", json.dumps(CITY), "--json-schema", city, greedy),
        ("How many fruits are in the basket?", "regex", REGEX, "--regex", REGEX, greedy),
        ("Describe Rome as JSON.", "json_schema", json.dumps(CITY), "--json-schema", city, seeded),
    ]
    refs = [reference(h, model, p, n, flag, val, smp.get("temperature", 0.0), smp.get("seed", 0))
            for p, _, _, flag, val, smp in cases]
    H.log("computed %d references" % len(refs))
    h.start_service(model, drafter=None, coord_extra=H.FIXED_K)
    c = h.client()
    before = round_of(h, c, cases, refs, n, ["--unconstrained"], "drafts without the constraint")
    after = round_of(h, c, cases, refs, n, [], "drafts under the constraint")
    for kind, _ in DRAFTERS:
        (d0, a0, s0), (d1, a1, s1) = before[kind], after[kind]
        H.log("%s drafter: accepted %d of %d drafted (%d target steps) -> %d of %d (%d target steps)"
              % (kind, a0, d0, s0, a1, d1, s1))
        H.check(a1 > a0, "%s drafter: %d drafts accepted under the constraint, %d without" % (kind, a1, a0))
        H.check(s1 <= s0, "%s drafter: %d target steps under the constraint, %d without" % (kind, s1, s0))
    c.close()
    # the in-coordinator n-gram drafter follows the constraint too (the coordinator's tokenizer)
    h.kill_all()
    h.start_service(model, drafter=None, coord_extra=list(H.FIXED_K) + ["--local-ngram"])
    c = h.client()
    jobs = [dict(prompt=p, chat=True, max_tokens=n, drafter_kind=2, sampling=smp,
                 constraint={"kind": KIND[k], "text": t}) for p, k, t, _, _, smp in cases]
    res = c.run(jobs, timeout=900)
    H.expect_equal_ids(res, refs, "the in-coordinator n-gram drafter")
    st = [r["finished"]["stats"] for r in res]
    d, a, s = (sum(x.get(f, 0) for x in st) for f in ("drafted", "accepted", "target_steps"))
    H.log("in-coordinator n-gram drafter under the constraint: drafted %d, accepted %d, target steps %d" % (d, a, s))
    H.check(a > before["ngram"][1], "the in-coordinator n-gram drafter: %d accepted, the unconstrained n-gram "
            "drafter %d" % (a, before["ngram"][1]))
    c.close()


if __name__ == "__main__":
    H.main(run)
