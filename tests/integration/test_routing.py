"""Several verifier groups and several drafters serving one coordinator.

Two verifier groups, one of TP 1 (--group-id 1) and one of TP 2
(--group-id 2, two ranks), and three drafters (n-gram and two model
drafters) on tiny random models. N concurrent greedy requests must give
exactly what specd-generate gives each alone; per ServiceStats both groups
and every drafter served requests. With --fault, one process is hit once
every request has a few tokens, and every request must still finish with
its undisturbed output:

  leader-kill  SIGKILL the TP 2 group's leader    rank-kill    SIGKILL its rank 1
  leader-stop  SIGSTOP the TP 2 group's leader    rank-stop    SIGSTOP its rank 1
  tp1-kill     SIGKILL the TP 1 group             drafter-kill SIGKILL a model drafter
  drafter-stop SIGSTOP a model drafter
  drain        SIGTERM the TP 1 group, then the n-gram drafter: each exits 0
               once its running step is answered; nothing is lost

Seeded sampled requests (target-only, max_k -1: their draws then do not
depend on which drafter served them) are run alone before and must give
the same tokens across the failover, the rule test_seeded.py applies to
one group. Nothing is restarted here (no launcher): the survivors carry
the load.

  test_routing.py [--n 64] [--tokens 24] [--fault NAME]"""
import argparse
import os
import signal

import harness as H


def start_group_tp2(h, target, gid):
    gaddr = "tcp://127.0.0.1:%d" % H.free_port()
    common = ["--tp", "2", "--group", gaddr, "--group-id", str(gid), "--threads", "1"]
    leader = h.start_verifier(extra=common + ["--rank", "0", "--name", "g%d-leader" % gid])
    rank = h.start_verifier(extra=common + ["--rank", "1", "--name", "g%d-rank1" % gid])
    return leader, rank


def check_refusals(h, target):
    """A second leader of a live group is refused by the coordinator; a rank
    started for another group is refused by the leader. Both exit non-zero
    and say why."""
    dup = h.start_verifier(extra=["--group-id", "1", "--threads", "1", "--name", "dup-of-g1"])
    H.wait_until(lambda: not dup.alive(), 120, "the duplicate leader of group 1 to exit")
    H.check(dup.popen.returncode == 3, "a second leader of group 1 exited %s, expected 3 (refused)"
            % dup.popen.returncode)
    H.check("group 1 already has a live leader" in dup.log_tail(50),
            "the duplicate leader's log does not say why:\n" + dup.log_tail(20))
    gaddr = "tcp://127.0.0.1:%d" % H.free_port()
    common = ["--tp", "2", "--group", gaddr, "--threads", "1", "--join-timeout", "60"]
    lead = h.start_verifier(extra=common + ["--rank", "0", "--group-id", "5", "--name", "g5-leader"])
    stray = h.start_verifier(extra=common + ["--rank", "1", "--group-id", "6", "--name", "g6-rank1"])
    H.wait_until(lambda: not stray.alive(), 120, "the rank of another group to be refused")
    H.check(stray.popen.returncode != 0, "a rank of group 6 joining group 5 exited 0")
    H.check("belongs to group 6, this leader leads group 5" in stray.log_tail(50) + lead.log_tail(50),
            "neither log says why the stray rank was refused")
    h.stop(lead, signal.SIGKILL)
    H.log("refusals: duplicate group leader and a rank of another group, both refused with the reason")


def alive_workers(h):
    return [w for w in h.workers() if w.get("alive")]


def run(h, args):
    target, draft = h.tiny_models(seed=21)
    prompts = H.random_prompts(args.n, seed=22)
    refs = [h.reference(target, p, args.tokens, ignore_eos=True) for p in prompts]
    # fixed K: every drafter drafts throughout (adaptive K would stop
    # drafting from the random draft model, whose drafts are all rejected)
    h.start_coordinator(target, ["--adaptive-k", "off", "--default-k", "3"])
    # On a tiny model a CPU TP 2 group is many times slower than TP 1 (its
    # collectives dominate), so placement by measured cost would give it
    # next to nothing; a batch cap of 8 on the TP 1 group makes its later
    # requests wait several of its steps, and the TP 2 group takes a share.
    g1 = h.start_verifier(extra=["--group-id", "1", "--threads", "1", "--name", "g1", "--max-batch", "8"])
    g2, g2r1 = start_group_tp2(h, target, 2)
    ngram = h.start_drafter("ngram", extra=["--name", "ngram"])
    m1 = h.start_drafter("model", draft=draft, extra=["--name", "model1", "--threads", "1"])
    # the target as its own draft model: drafts that are accepted (the other is random)
    m2 = h.start_drafter("model", draft=target, extra=["--name", "model2", "--threads", "1"])
    timeout = 240 if H.sanitized() else 120

    def registered():
        ws = alive_workers(h)
        return (sum(w.get("role") == H.pb.ROLE_VERIFIER for w in ws) == 2 and
                sum(w.get("role") == H.pb.ROLE_DRAFTER for w in ws) == 3)
    H.wait_until(registered, timeout, "two verifier groups and three drafters to register")
    groups = {w.get("group_id", 0): w for w in alive_workers(h) if w.get("role") == H.pb.ROLE_VERIFIER}
    H.check(sorted(groups) == [1, 2], "group ids %s, expected [1, 2]" % sorted(groups))
    H.check(groups[2].get("group_size") == 2, "group 2 reports TP %s" % groups[2].get("group_size"))

    if not args.fault:
        check_refusals(h, target)
    c = h.client()
    jobs = [dict(prompt=p, max_tokens=args.tokens, ignore_eos=True) for p in prompts]
    seeded = [dict(prompt=p, max_tokens=args.tokens, ignore_eos=True, max_k=-1,
                   sampling=dict(temperature=0.8, top_p=0.95, seed=500 + i))
              for i, p in enumerate(H.random_prompts(4, seed=23))]
    alone = [c.run([j], timeout=300)[0] for j in seeded] if args.fault else []

    victims = {"leader-kill": (g2, signal.SIGKILL), "rank-kill": (g2r1, signal.SIGKILL),
               "leader-stop": (g2, signal.SIGSTOP), "rank-stop": (g2r1, signal.SIGSTOP),
               "tp1-kill": (g1, signal.SIGKILL), "drafter-kill": (m1, signal.SIGKILL),
               "drafter-stop": (m1, signal.SIGSTOP), "drain": (g1, signal.SIGTERM)}
    state = {}

    def on_event(m, results):
        if not args.fault or "hit" in state:
            return
        if all(len(r["ids"]) >= 4 for r in list(results.values())[:args.n]):
            proc, sig = victims[args.fault]
            os.kill(proc.pid, sig)
            state["hit"] = True
            H.log("%s: %s sent to %s (pid %d) mid-generation" % (args.fault, signal.Signals(sig).name, proc.name,
                                                                   proc.pid))
            if args.fault == "drain":
                os.kill(ngram.pid, signal.SIGTERM)
                H.log("drain: SIGTERM sent to the n-gram drafter (pid %d) too" % ngram.pid)

    res = c.run(jobs + seeded if args.fault else jobs, timeout=900, on_event=on_event)
    H.expect_equal_ids(res[:args.n], refs, "greedy requests over two groups and three drafters" +
                       (" across %s" % args.fault if args.fault else ""))
    if args.fault:
        H.check("hit" in state, "the requests finished before the fault could be injected")
        H.expect_equal_ids(res[args.n:], alone, "seeded sampled requests across %s" % args.fault)
    if args.fault == "drain":
        for p in (g1, ngram):
            H.wait_until(lambda: not p.alive(), 60, "%s to exit after SIGTERM" % p.name)
            H.check(p.popen.returncode == 0, "%s exited %s after SIGTERM, expected 0" % (p.name,
                                                                                        p.popen.returncode))
    st = h.client().stats(timeout=10)
    H.check(st is not None, "no ServiceStats")
    for w in st.get("workers", []):
        H.log("%s %s group %s: served %s, drafted %s, accepted %s, committed %s" %
              ("verifier" if w.get("role") == H.pb.ROLE_VERIFIER else "drafter", w.get("name"),
               w.get("group_id", 0), w.get("served_requests", 0), w.get("drafted", 0), w.get("accepted", 0),
               w.get("committed", 0)))
    for w in st.get("workers", []):
        H.check(w.get("served_requests", 0) > 0, "worker %s served no request" % w.get("name"))
        if w.get("role") == H.pb.ROLE_DRAFTER and not args.fault:
            H.check(w.get("drafted", 0) > 0, "drafter %s had no draft verified" % w.get("name"))
    if args.fault in ("leader-stop", "rank-stop", "drafter-stop"):
        os.kill(victims[args.fault][0].pid, signal.SIGCONT)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--fault", default=None)
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
