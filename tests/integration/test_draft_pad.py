"""test_draft_pad — a drafter and a target whose vocabularies differ only by
padding pair; a different vocabulary is refused.

Tiny random models, all with specd-mkmodel's synthetic tokenizer of 500
tokens: the target padded with unused [PADn] tokens to 640 embedding rows
(as llama.cpp's converter pads Qwen2.5-72B's 152,064 rows), drafts padded
to 576 (fewer rows than the target) and to 768 (more: it drafts among the
target's 640 ids only), and one with 520 real tokens (a different
tokenizer). specd-generate --draft with each padded draft gives plain
decoding's tokens, greedy and seeded, and drafts; the 520-token draft is
refused, the message naming both sizes. No service.

Run: ctest --test-dir build -R it_draft_pad --output-on-failure
"""
import json
import os
import subprocess

import harness as H

PROMPT = "the padded draft proposes what the target would"


def mk(h, path, seed, vocab, pad, dim="32", layers="1"):
    argv = [h.bin("mkmodel"), "-o", path, "--dim", dim, "--layers", layers, "--heads", "2", "--kv-heads", "1",
            "--ff", "64", "--vocab", str(vocab), "--seed", str(seed)]
    if pad:
        argv += ["--pad-vocab", str(pad)]
    subprocess.run(argv, check=True, capture_output=True)
    return path


def generate(h, target, *args):
    argv = [h.bin("generate"), "-m", target, "-p", PROMPT, "-n", "32", "-t", "1", "--json", "--ignore-eos"]
    return subprocess.run(argv + list(args), capture_output=True, timeout=600)


def ids_of(r, what):
    H.check(r.returncode == 0, "%s: exit %d: %s" % (what, r.returncode, r.stderr[-500:]))
    return json.loads(r.stdout)["ids"]


def run(h):
    target = mk(h, os.path.join(h.tmp, "target.gguf"), 41, 500, 640, dim="64", layers="2")
    fewer = mk(h, os.path.join(h.tmp, "pad576.gguf"), 42, 500, 576)
    more = mk(h, os.path.join(h.tmp, "pad768.gguf"), 43, 500, 768)
    other = mk(h, os.path.join(h.tmp, "other.gguf"), 44, 520, 0)
    for sampling in ([], ["--temp", "0.9", "--seed", "5"]):
        plain = ids_of(generate(h, target, *sampling), "plain")
        for what, draft in (("draft padded to 576 rows", fewer), ("draft padded to 768 rows", more)):
            r = generate(h, target, "--draft", draft, *sampling)
            got = ids_of(r, what)
            H.check(got == plain, "%s%s: %s differs from plain decoding %s"
                    % (what, " (sampled)" if sampling else "", got, plain))
            H.check(json.loads(r.stdout)["spec"]["drafted"] > 0, "%s drafted nothing" % what)
            H.check(all(t < 640 for t in got), "%s: an id past the target's 640 rows: %s" % (what, got))
    H.log("drafts padded to 576 and 768 rows pair with a target padded to 640: output equals plain decoding")
    r = generate(h, target, "--draft", other)
    err = r.stderr.decode(errors="replace")
    H.check(r.returncode != 0 and "differs from the target's" in err and "(520 tokens" in err and "(640 tokens" in err,
            "a draft with another tokenizer: exit %d, %r (want a refusal naming both sizes)"
            % (r.returncode, err[-400:]))
    H.log("a draft with another tokenizer (520 real tokens) is refused, both sizes named")


if __name__ == "__main__":
    H.main(run)
