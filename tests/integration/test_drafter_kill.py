"""Drafter killed with SIGKILL mid-generation: every request completes with
the undisturbed greedy output (the coordinator goes on with target-only
steps); a drafter started again registers and speculation resumes (requests
submitted after it registered report accepted > 0). Tiny random models,
self-draft drafter (the target's first layer: high acceptance)."""
import signal

import harness as H

N, TOKENS = 8, 160


def run(h):
    target, _ = h.tiny_models(seed=5)
    prompts = H.random_prompts(N, seed=21)
    refs = [h.reference(target, p, TOKENS, ignore_eos=True) for p in prompts]
    _, _, drafter = h.start_service(target, drafter="layers", coord_extra=H.FIXED_K)
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
    h.start_drafter("layers")
    h.wait_registered(verifier=True, drafter=True)
    res2 = c.run(jobs, timeout=120)
    H.expect_equal_ids(res2, refs, "requests after the drafter restarted")
    acc = sum(r["finished"]["stats"].get("accepted", 0) for r in res2)
    H.check(acc > 0, "speculation did not resume after the drafter restarted (accepted = 0)")
    H.log("after restart: accepted %d draft tokens" % acc)


if __name__ == "__main__":
    H.main(run)
