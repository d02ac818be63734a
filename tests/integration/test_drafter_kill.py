"""Drafter killed with SIGKILL mid-generation: every request completes with
the undisturbed greedy output (the coordinator goes on with target-only
steps); a drafter started again registers and speculation resumes (requests
submitted after it registered report accepted > 0). Tiny random models,
self-draft drafter (the target's first layer: high acceptance).
--eagle: the drafter is a random EAGLE-3 head in its own process
(specd-drafter --eagle, test_greedy.eagle_head), fed the verifier's features
through the coordinator: the restarted head lacks the features of the
requests in flight (they go on undrafted, output unchanged) and drafts for
new ones."""
import argparse
import signal

import harness as H

N, TOKENS = 8, 160


def run(h, eagle):
    target, _ = h.tiny_models(seed=5)
    prompts = H.random_prompts(N, seed=21)
    refs = [h.reference(target, p, TOKENS, ignore_eos=True) for p in prompts]
    kind, head = "layers", None
    if eagle:
        from test_greedy import eagle_head
        kind, head = "eagle", eagle_head(h, refs)
    _, _, drafter = h.start_service(target, drafter=kind, draft=head, coord_extra=H.FIXED_K)
    c = h.client()
    killed = {}

    def on_event(m, results):
        # Kill once every request has streamed something (all are mid-generation).
        if not killed and all(r["ids"] for r in results.values()):
            killed["at"] = sum(len(r["ids"]) for r in results.values())
            h.stop(drafter, signal.SIGKILL)
            H.log("drafter SIGKILLed after %d tokens streamed" % killed["at"])

    jobs = [dict(prompt=p, max_tokens=TOKENS, ignore_eos=True) for p in prompts]
    res = c.run(jobs, timeout=120, on_event=on_event)
    H.check(killed, "the requests finished before the drafter could be killed")
    H.check(killed["at"] < N * TOKENS, "drafter killed only after every token was streamed")
    H.expect_equal_ids(res, refs, "requests whose drafter was SIGKILLed")
    # Restart: it registers, and new requests are speculated again.
    h.start_drafter(kind, draft=head)
    h.wait_registered(verifier=True, drafter=True)
    res2 = c.run(jobs, timeout=120)
    H.expect_equal_ids(res2, refs, "requests after the drafter restarted")
    acc = sum(r["finished"]["stats"].get("accepted", 0) for r in res2)
    H.check(acc > 0, "speculation did not resume after the drafter restarted (accepted = 0)")
    H.log("after restart: accepted %d draft tokens" % acc)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--eagle", action="store_true", help="the drafter is an EAGLE-3 head (specd-drafter --eagle)")
    a = ap.parse_args()
    H.main(lambda h: run(h, a.eagle))
