"""Verifier restarted (1) between requests and (2) mid-generation: the
coordinator's cache beliefs no longer hold, the new verifier answers
CACHE_MISS or registers afresh, the coordinator resends whole prefixes and
every output still equals specd-generate's. Tiny random models, self-draft
drafter."""
import signal
import threading

import harness as H
import pbwire as pb

N, TOKENS = 6, 96


def replace_verifier(h, old, sig):
    """Stops old with sig, waits (bounded) until the coordinator no longer
    counts a live verifier (a second leader is refused while one is alive),
    starts a new one and waits for it to register. Returns the new Proc."""
    rc = h.stop(old, sig)
    H.check(sig != signal.SIGTERM or rc == 0, "the verifier exited %s on SIGTERM, expected 0" % rc)
    c = h.client()
    H.wait_until(lambda: not any(w.get("alive") and w.get("role") == pb.ROLE_VERIFIER
                                 for w in (c.stats(timeout=1.0) or {"workers": [{"alive": 1, "role": 3}]})
                                 .get("workers", [])),
                 30, "the coordinator to declare the old verifier dead")
    c.close()
    new = h.start_verifier()
    h.wait_registered()
    return new


def run(h):
    target, _ = h.tiny_models(seed=9)
    prompts = H.random_prompts(N, seed=31)
    refs = [h.reference(target, p, TOKENS, ignore_eos=True) for p in prompts]
    _, verifier, _ = h.start_service(target, drafter="layers", coord_extra=H.FIXED_K)
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=TOKENS, ignore_eos=True) for p in prompts]
    H.expect_equal_ids(c.run(jobs, timeout=300), refs, "before the restart")

    # (1) between requests: clean stop, new verifier, same prompts again.
    verifier = replace_verifier(h, verifier, signal.SIGTERM)
    H.expect_equal_ids(c.run(jobs, timeout=300), refs, "after a verifier restart between requests")

    # (2) mid-generation: SIGKILL once every request streamed; a helper
    # thread brings up a new verifier while this one keeps the client alive.
    state = {}

    done = threading.Event()

    def restart():
        try:
            state["new"] = replace_verifier(h, verifier, signal.SIGKILL)
            H.log("verifier SIGKILLed mid-generation and replaced")
        except Exception as e:  # reported below
            state["error"] = e
        # PR_SET_PDEATHSIG fires when the *thread* that started a child
        # exits: this one must outlive the new verifier's use.
        done.wait(600)

    def on_event(m, results):
        if not state and all(r["ids"] for r in results.values()):
            state["thread"] = threading.Thread(target=restart)
            state["thread"].start()

    try:
        res = c.run(jobs, timeout=300, on_event=on_event)
        H.check(state, "the requests finished before the verifier could be killed")
        H.check("error" not in state, "replacing the verifier failed: %s" % state.get("error"))
    finally:
        h.cleanups.append(done.set)  # after the processes are killed
    H.expect_equal_ids(res, refs, "after a verifier SIGKILL + restart mid-generation")


if __name__ == "__main__":
    H.main(run)
