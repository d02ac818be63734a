"""A rank of a tensor-parallel verifier group killed (SIGKILL) or hung
(SIGSTOP) mid-generation, under specd-launch --tp N: the group is declared
down within a bounded time, the launcher stops what is left of it (nothing
orphaned, the stopped process included) and starts all N ranks again, the
coordinator keeps every request's committed tokens, and every request
finishes with exactly the tokens specd-generate gives it alone.

  test_tp_kill.py [--tp 2] [--rank 1] [--n 6] [--tokens 128]

Tiny random models (4 heads, 2 KV heads), self-draft drafter. The bound
checked on detection is the group's liveness (10 x 200 ms) plus slack for a
loaded 2-core machine under ASan: the SIGKILLed rank is seen at once (the
launcher reaps it; the leader checks its pid every 200 ms), the SIGSTOPped
one once it has missed its heartbeats."""
import argparse
import os
import signal
import threading
import time

import harness as H
from harness import children, cmdline, running

DETECT_BOUND_S = 10.0


def ranks_of(launcher_pid):
    """{rank: pid} of the launcher's verifier children that are alive."""
    out = {}
    for k in children(launcher_pid):
        argv = cmdline(k)
        if not argv or not argv[0].endswith(b"specd-verifier") or not running(k):
            continue
        r = argv.index(b"--rank") if b"--rank" in argv else -1
        out[int(argv[r + 1]) if r >= 0 else 0] = k
    return out


def run(h, args):
    target, _ = h.tiny_models(seed=41)
    prompts = H.random_prompts(args.n, seed=43)
    refs = [h.reference(target, p, args.tokens, ignore_eos=True) for p in prompts]
    cport, wport, gport = H.free_port(), H.free_port(), H.free_port()
    h.client_addr = "tcp://127.0.0.1:%d" % cport
    launch = h.start("launch", [h.bin("launch"), "--target", target, "--draft-layers", "1", "--tp", str(args.tp),
                                "--client-addr", h.client_addr, "--worker-addr", "tcp://127.0.0.1:%d" % wport,
                                "--group-addr", "tcp://127.0.0.1:%d" % gport, "--threads-verifier", "1",
                                "--threads-drafter", "1", "--ready-timeout", "300", "--no-gateway"])
    H.wait_until(lambda: ("ready %s" % h.client_addr) in launch.log_tail(400) or not launch.alive(), 300,
                 "specd-launch to print ready")
    H.check(launch.alive(), "specd-launch exited (%s) before ready" % launch.popen.returncode)
    every_pid = set(children(launch.pid))
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=args.tokens, ignore_eos=True) for p in prompts]

    for sig in (signal.SIGKILL, signal.SIGSTOP):
        name = signal.Signals(sig).name
        old = H.wait_until(lambda: (lambda r: r if len(r) == args.tp else None)(ranks_of(launch.pid)), 120,
                           "all %d ranks running" % args.tp)
        every_pid |= set(old.values())
        state = {}
        done = threading.Event()

        def watch():
            # Times the group's fall and return while the client keeps reading.
            try:
                t_kill = state["t_kill"]
                H.wait_until(lambda: all(not running(p) for p in old.values()), 60,
                             "every rank of the old group to be gone")
                state["gone_s"] = time.monotonic() - t_kill
                new = H.wait_until(lambda: (lambda r: r if len(r) == args.tp and not set(r.values()) & set(old.values())
                                            else None)(ranks_of(launch.pid)), 120, "a new group")
                every_pid.update(new.values())
                state["new"] = new
            except Exception as e:  # reported below
                state["error"] = e
            done.set()

        def on_event(m, results):
            if "t_kill" not in state and all(len(r["ids"]) >= 4 for r in results.values()):
                os.kill(old[args.rank], sig)
                state["t_kill"] = time.monotonic()
                H.log("%s sent to rank %d (pid %d) mid-generation" % (name, args.rank, old[args.rank]))
                state["thread"] = threading.Thread(target=watch)
                state["thread"].start()

        res = c.run(jobs, timeout=600, on_event=on_event)
        H.check("t_kill" in state, "the requests finished before rank %d could be signalled" % args.rank)
        state["thread"].join(200)
        H.check("error" not in state, "%s: %s" % (name, state.get("error")))
        H.expect_equal_ids(res, refs, "after %s of rank %d and a group restart" % (name, args.rank))
        # When did the group notice? The leader's (or, for a death, the
        # launcher's) log line, timed by the old group being gone.
        log = launch.log_tail(2000)
        H.check("verifier group is down" in log, "the launcher did not report the group down")
        if sig == signal.SIGSTOP:
            H.check("silent for" in log, "the leader did not report the stopped rank silent")
        H.check(state["gone_s"] <= DETECT_BOUND_S + 3.0,
                "%s: the old group took %.1f s to go (bound %.0f s + 3 s grace)" % (name, state["gone_s"],
                                                                                      DETECT_BOUND_S))
        H.log("%s: old group gone %.2f s after the signal; new group %s; all %d requests equal"
              % (name, state["gone_s"], state["new"], len(res)))

    # Nothing left behind: a clean stop takes every process we saw with it.
    rc = h.stop(launch, signal.SIGTERM, timeout=60)
    H.check(rc == 0, "specd-launch exited %s on SIGTERM, expected 0" % rc)
    H.wait_until(lambda: all(not running(p) for p in every_pid), 15, "every process of the service to be gone")
    H.log("no process left of %d started" % len(every_pid))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
