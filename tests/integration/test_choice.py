"""Per-request drafter choice on the real model: the demo model's F16
conversion as the target, two drafter kinds at once -- the n-gram drafter
inside the coordinator (--local-ngram) and the demo Q4_1 file as a draft
model in its own process -- K fixed at 4, requests of two kinds, one after
the other:

- "repeat this text exactly" prompts, whose answers copy the prompt: n-gram
  lookup drafts them as well as the draft model (every draft accepted) and
  costs nothing, so the choice must end on n-gram for them;
- open chat, where n-gram lookup finds little to copy and the draft model
  (the target's own 4-bit copy) is accepted most of the time: the choice
  must end on the model for them.

Every request's tokens must equal specd-generate's greedy tokens on the F16
target (exact whatever drafts), and each request's final kind is read from
Finished.stats.drafter_kind. Which kind pays is a cost question (draft
tokens against verify rows, both measured by the coordinator while it
runs). With both models on two threads a draft token of the 4-bit copy
costs about 0.6-0.75 of a target step on this CPU, and on chat the model's
4.4 tokens a step then tie with n-gram's 1.1 at no cost: which one the
choice keeps is a coin toss, rightly. So the verifier gets one thread and
the draft model two (they take turns at batch 1): a draft token then costs
about a third of a target step, as a draft model should, and each kind wins
its kind of request by a wide margin (about 1.6x in goodput either way).
Under ASan (CI) only the copy requests' kind is checked: the sanitizer
changes the models' relative costs, and with them which kind pays on chat;
in a release build at least one of the two chat requests must end on the
model (under outside load the second one may rightly not)."""
import os
import subprocess

import harness as H

COPY_TEXT = ("The quick brown fox jumps over the lazy dog near the river bank, while three small birds sing "
             "in the old oak tree and a farmer walks slowly home along the dusty road.")
PROMPTS = [
    ("copy", "Repeat the following text exactly, word for word, and nothing else:\n\n" + COPY_TEXT),
    ("chat", "Can you explain how a rainbow forms?"),
    ("copy", "Copy this sentence exactly as it is written: " + COPY_TEXT),
    ("chat", "Why is exercise good for mental health?"),
]


def run(h):
    demo = h.smollm()
    target = os.path.join(h.tmp, "smol-f16.gguf")
    subprocess.run([h.bin("quantize"), demo, target, "f16"], check=True, capture_output=True, timeout=600)
    tokens = 40
    refs = [h.reference(target, p, tokens, chat=True) for _, p in PROMPTS]
    H.log("computed %d references on the F16 target" % len(refs))
    # the target costs what a target should next to its draft: one thread
    # against the draft model's two (on 2 cores at batch 1 they take turns)
    h.start_service(target, drafter="model", draft=demo, coord_extra=list(H.FIXED_K) + ["--local-ngram"],
                    verifier_extra=["--threads", "1"], drafter_extra=["--threads", "2"])
    c = h.client()
    # one at a time: each request's costs are a batch of one's (with all four
    # at once the kinds' costs depend on how the batches happen to mix)
    res = [c.run([dict(prompt=p, max_tokens=tokens, chat=True)], timeout=900)[0] for _, p in PROMPTS]
    H.expect_equal_ids(res, refs, "requests drafted by the kind chosen for each (n-gram or model)")
    kinds = []
    for (kind, p), r in zip(PROMPTS, res):
        st = r["finished"]["stats"]
        got = st.get("drafter_kind", 0)
        kinds.append(got)
        H.log("%-4s request: drafted by %s, %d switches, %d of %d drafts accepted, %d steps for %d tokens: %r"
              % (kind, {1: "model", 2: "ngram"}.get(got, got), st.get("drafter_switches", 0), st.get("accepted", 0),
                 st.get("drafted", 0), st.get("target_steps", 0), st.get("generated_tokens", 0), p[:40]))
    # Under ASan the two models' relative costs are not what they are in a
    # release build (the sanitizer slows memory-bound code unevenly): one
    # chat request measured the model draft dear enough to end on n-gram,
    # which was the right choice at those costs. Copying wins by far more.
    # In a release build on a loaded machine (other processes on the 2
    # cores inflate the draft model's measured cost), the second chat
    # request was measured unable to pay for a move to the model in about
    # 1 run of 6 and rightly stayed on n-gram: there one chat request of
    # the two on the model is enough, and both copy requests must be on
    # n-gram.
    sanitized = H.sanitized()
    chat_on_model = 0
    for (kind, _), got in zip(PROMPTS, kinds):
        if kind == "copy":
            H.check(got == 2, "a copy request ended drafted by kind %s, not n-gram (kinds by request: %s)"
                    % (got, kinds))
        elif got == 1:
            chat_on_model += 1
    if not sanitized:
        H.check(chat_on_model >= 1, "no chat request ended drafted by the model (kinds by request: %s)" % kinds)
        if chat_on_model < 2:
            H.log("one chat request ended on n-gram (kinds by request: %s): the model was measured too dear to "
                  "pay for its move on it" % kinds)

if __name__ == "__main__":
    H.main(run)
