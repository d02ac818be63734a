"""specd-launch --groups G --tp N with several drafters (--ngram plus
--draft-layers 1): the launcher starts G verifier groups (ids 1..G) and
every drafter, prints ready once all have registered, restarts a drafter
that is SIGKILLed (the coordinator then counts it again), and greedy
requests give what specd-generate gives alone, before and after. A clean
SIGTERM stops everything with exit 0.

  test_launch_groups.py [--groups 2] [--tp 1] [--n 12] [--tokens 24]"""
import argparse
import os
import signal

import harness as H
from harness import children, cmdline


def alive(h, role):
    return [w for w in h.workers(timeout=5) if w.get("alive") and w.get("role") == role]


def run(h, args):
    target, _ = h.tiny_models(seed=51)
    prompts = H.random_prompts(args.n, seed=52)
    refs = [h.reference(target, p, args.tokens, ignore_eos=True) for p in prompts]
    cport, wport, gport = H.free_port(), H.free_port(), H.free_port()
    h.client_addr = "tcp://127.0.0.1:%d" % cport
    launch = h.start("launch", [h.bin("launch"), "--target", target, "--groups", str(args.groups),
                                "--tp", str(args.tp), "--ngram", "--draft-layers", "1",
                                "--client-addr", h.client_addr, "--worker-addr", "tcp://127.0.0.1:%d" % wport,
                                "--group-addr", "tcp://127.0.0.1:%d" % gport, "--threads-verifier", "1",
                                "--threads-drafter", "1", "--ready-timeout", "300", "--no-gateway"])
    H.wait_until(lambda: ("ready %s" % h.client_addr) in launch.log_tail(400) or not launch.alive(), 300,
                 "specd-launch to print ready")
    H.check(launch.alive(), "specd-launch exited (%s) before ready" % launch.popen.returncode)
    groups = alive(h, H.pb.ROLE_VERIFIER)
    H.check(sorted(w.get("group_id", 0) for w in groups) == list(range(1, args.groups + 1)),
            "verifier groups %s, expected ids 1..%d" % ([w.get("group_id") for w in groups], args.groups))
    H.check(len(alive(h, H.pb.ROLE_DRAFTER)) == 2, "expected 2 drafters registered")
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=args.tokens, ignore_eos=True) for p in prompts]
    H.expect_equal_ids(c.run(jobs, timeout=600), refs, "greedy requests under specd-launch --groups")

    drafters = [k for k in children(launch.pid) if cmdline(k)[:1] and cmdline(k)[0].endswith(b"specd-drafter")]
    H.check(len(drafters) == 2, "the launcher runs %d drafters, expected 2" % len(drafters))
    os.kill(drafters[0], signal.SIGKILL)
    H.wait_until(lambda: "restarting it" in launch.log_tail(400), 60, "the launcher to restart the drafter")
    H.wait_until(lambda: len([k for k in children(launch.pid) if cmdline(k)[:1] and
                              cmdline(k)[0].endswith(b"specd-drafter")]) == 2 and
                 len(alive(h, H.pb.ROLE_DRAFTER)) == 2, 120, "the restarted drafter to register")
    H.expect_equal_ids(c.run(jobs, timeout=600), refs, "greedy requests after a drafter restart")
    st = c.stats(timeout=10)
    for w in st.get("workers", []):
        if w.get("alive") and w.get("role") == H.pb.ROLE_VERIFIER:
            H.check(w.get("served_requests", 0) > 0, "group %s served no request" % w.get("group_id"))
    rc = h.stop(launch, signal.SIGTERM, timeout=60)
    H.check(rc == 0, "specd-launch exited %s on SIGTERM, expected 0" % rc)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=24)
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
