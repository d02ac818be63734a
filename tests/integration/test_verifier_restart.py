"""Verifier restarted (1) between requests and (2) mid-generation: the
coordinator's cache beliefs no longer hold, the new verifier answers
CACHE_MISS or registers afresh, the coordinator resends whole prefixes and
every output still equals specd-generate's. Tiny random models, self-draft
drafter."""
import signal

import harness as H

N, TOKENS = 6, 96


def run(h):
    target, _ = h.tiny_models(seed=9)
    prompts = H.random_prompts(N, seed=31)
    refs = [h.reference(target, p, TOKENS, ignore_eos=True) for p in prompts]
    _, verifier, _ = h.start_service(target, drafter="layers")
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=TOKENS, ignore_eos=True) for p in prompts]
    H.expect_equal_ids(c.run(jobs, timeout=600), refs, "before the restart")

    # (1) between requests: clean stop, new verifier, same prompts again.
    H.check(h.stop(verifier) == 0, "verifier did not exit 0 on SIGTERM")
    verifier = h.start_verifier()
    h.wait_registered()
    H.expect_equal_ids(c.run(jobs, timeout=600), refs, "after a verifier restart between requests")

    # (2) mid-generation: SIGKILL once every request streamed, start another at once.
    state = {}

    def on_event(m, results):
        if not state and all(r["ids"] for r in results.values()):
            state["killed"] = True
            h.stop(verifier, signal.SIGKILL)
            state["new"] = h.start_verifier()
            H.log("verifier SIGKILLed mid-generation and restarted")

    res = c.run(jobs, timeout=600, on_event=on_event)
    H.check(state, "the requests finished before the verifier could be killed")
    H.expect_equal_ids(res, refs, "after a verifier SIGKILL + restart mid-generation")


if __name__ == "__main__":
    H.main(run)
