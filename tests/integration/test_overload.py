"""A full queue answers OVERLOADED at once. The coordinator runs with
--max-active 1 --max-queue 2: of 12 long requests submitted together at
most 3 are accepted, every other one gets Error OVERLOADED within a couple
of seconds (no waiting for capacity), the accepted ones run to the end, and
once they are done a new request is accepted again. Tiny random models,
target only (no drafter) so nothing else varies."""
import time

import harness as H
import pbwire as pb

N = 12


def run(h):
    target, _ = h.tiny_models(seed=19)
    h.start_service(target, drafter=None, coord_extra=["--max-active", "1", "--max-queue", "2"])
    c = h.client()
    t0 = time.monotonic()
    for p in H.random_prompts(N, seed=51):
        c.submit(prompt=p, max_tokens=200, ignore_eos=True)
    accepted, overloaded, other = set(), {}, []
    finished = set()
    while len(accepted) + len(overloaded) + len(other) < N:
        m = c.recv(20)
        H.check(m is not None, "no reply for %d of %d submits within 20 s"
                % (N - len(accepted) - len(overloaded) - len(other), N))
        if "accepted" in m:
            accepted.add(m["accepted"]["request_id"])
        elif "error" in m:
            e = m["error"]
            if pb.CODE.get(e.get("code")) == "OVERLOADED":
                overloaded[e.get("client_tag")] = time.monotonic() - t0
            else:
                other.append(e)
        elif "finished" in m:
            finished.add(m["finished"]["request_id"])
    H.check(not other, "unexpected errors: %s" % other)
    H.check(len(accepted) <= 3, "%d requests accepted with max-active 1 + max-queue 2" % len(accepted))
    H.check(len(overloaded) >= N - 3, "only %d OVERLOADED answers" % len(overloaded))
    slowest = max(overloaded.values())
    H.check(slowest < 5.0, "an OVERLOADED answer took %.1f s: not at once" % slowest)
    H.log("accepted %d, OVERLOADED %d (slowest answer %.3f s)" % (len(accepted), len(overloaded), slowest))

    def all_done():
        m = c.recv(0.5)
        if m and "finished" in m:
            finished.add(m["finished"]["request_id"])
        H.check(not (m and "error" in m), "accepted request failed: %s" % (m and m.get("error")))
        return accepted <= finished
    H.wait_until(all_done, 300, "the accepted requests to finish", interval=0)
    r = c.run([dict(prompt="room again", max_tokens=5, ignore_eos=True)], timeout=60)[0]
    H.check(not r["error"] and len(r["ids"]) == 5, "no room after the queue drained: %s" % r)


if __name__ == "__main__":
    H.main(run)
