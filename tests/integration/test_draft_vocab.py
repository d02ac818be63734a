"""test_draft_vocab — the draft vocabulary cut (--draft-vocab N) on the
command line.

specd-generate with a draft model cut to 100 of its 512 ids, cut at the
vocabulary's size, uncut (0) and by default, and with the self-draft cut to
100: greedy output equal to plain decoding token for token, and a seeded
sampled run equal to seeded plain decoding (the target's draw decides every
token, spec.h). Refused with exit status 2 and a line naming the flag:
--draft-vocab -1, 513 (above the vocabulary) and a non-number in
specd-generate, the flag without a model drafter (--ngram) in both tools,
and 513 in specd-drafter, which must exit before it registers anywhere.

Tiny random models (vocabulary 512); no service.

Run: ctest --test-dir build -R it_draft_vocab --output-on-failure
"""
import json
import subprocess

import harness as H

PROMPT = "the cut draft proposes only the frequent ids"


def generate(h, target, *args):
    argv = [h.bin("generate"), "-m", target, "-p", PROMPT, "-n", "40", "-t", "1", "--json", "--ignore-eos"]
    return subprocess.run(argv + list(args), capture_output=True, timeout=600)


def ids_of(r, what):
    H.check(r.returncode == 0, "%s: exit %d: %s" % (what, r.returncode, r.stderr[-500:]))
    return json.loads(r.stdout)["ids"]


def check_exact(h, target, draft):
    for sampling in ([], ["--temp", "0.9", "--seed", "7"]):
        plain = ids_of(generate(h, target, *sampling), "plain")
        runs = [("draft model, cut 100", ["--draft", draft, "--draft-vocab", "100"]),
                ("draft model, cut 512", ["--draft", draft, "--draft-vocab", "512"]),
                ("draft model, uncut", ["--draft", draft, "--draft-vocab", "0"]),
                ("draft model, default cut", ["--draft", draft]),
                ("self-draft, cut 100", ["--draft-layers", "1", "--draft-vocab", "100"])]
        for what, args in runs:
            r = generate(h, target, *(args + sampling))
            got = ids_of(r, what)
            H.check(got == plain, "%s%s: %s differs from plain decoding %s"
                    % (what, " (sampled)" if sampling else "", got, plain))
            H.check(json.loads(r.stdout)["spec"]["drafted"] > 0, "%s drafted nothing" % what)
    H.log("greedy and seeded output with the draft vocabulary cut equal plain decoding")


def refused(r, what):
    H.check(r.returncode == 2 and b"draft-vocab" in r.stderr,
            "%s: exit %d, %r (want 2 and a line naming --draft-vocab)" % (what, r.returncode, r.stderr[-300:]))


def check_refused(h, target, draft):
    for value in ("-1", "513", "many"):
        refused(generate(h, target, "--draft", draft, "--draft-vocab", value), "specd-generate --draft-vocab " + value)
    refused(generate(h, target, "--ngram", "--draft-vocab", "100"), "specd-generate --ngram --draft-vocab")
    drafter = [h.bin("drafter"), "--coordinator", "tcp://127.0.0.1:9", "-t", "1"]
    refused(subprocess.run(drafter + ["--model", draft, "--draft-vocab", "513"], capture_output=True, timeout=60),
            "specd-drafter --draft-vocab 513")
    refused(subprocess.run(drafter + ["--ngram", "--model", target, "--draft-vocab", "100"], capture_output=True,
                           timeout=60), "specd-drafter --ngram --draft-vocab")
    H.log("bad --draft-vocab values refused by specd-generate and specd-drafter")


def run(h):
    target, draft = h.tiny_models(seed=23)
    check_exact(h, target, draft)
    check_refused(h, target, draft)


if __name__ == "__main__":
    H.main(run)
