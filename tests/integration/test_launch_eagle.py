"""specd-launch --eagle DIR, and specd-client --wait-ready started beside a
default launch.

1. `specd-client --wait-ready 120` is started first, with no --coordinator,
   then the launcher (default links: ipc:// in a private directory, whose
   address it records only once the service is ready). The client must find
   that record and return 0 soon after "ready", not wait on its fallback
   address to the deadline (README's first commands start them so).
2. The launcher gives a TP 2 group's leader the head (--eagle with --tp 2;
   a rank > 0 given --eagle would refuse to start, exit 2, so the launch
   becoming ready shows the launcher passes it to rank 0 alone): the
   coordinator lists a drafter of kind eagle (the head's relay) beside the
   verifier, the launcher counted it before printing ready, and a request is
   served with drafts verified (the leader's capture fed the head); its
   prompt is longer than a drafting step, so the head's first draft catches
   up on it, which the coordinator prices apart (stats: catchup_row_us).
3. --eagle given to a rank > 0 of a group (specd-verifier --rank 1) is
   refused at once (exit 2), naming the reason.
4. --eagle-drafter DIR places the head in its own drafter process
   (specd-drafter --eagle DIR --model TARGET), beside a TP 2 group: the
   coordinator lists a live drafter of kind eagle that is not a verifier's
   relay, and a request at K 4 is served with drafts verified (the group's
   leader sent features to the drafter, which drafts nothing without them).

Tiny random target, a random EAGLE-3 head of its shape
(tests/ref/eagle_ref.write_head)."""
import json
import os
import subprocess
import sys
import time

import harness as H


def head(h):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ref"))
    try:
        from eagle_ref import write_head
    except ImportError as e:
        H.skip("python packages for the head writer missing (%s); run scripts/setup" % e)
    path = os.path.join(h.tmp, "eagle-head")
    write_head(path, hidden=64, vocab=512, draft_vocab=16, seed=5)
    return path


def run(h):
    target, _ = h.tiny_models(seed=41)
    hd = head(h)
    base = os.path.join(h.tmp, "run")
    os.makedirs(base, mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=base)

    r = subprocess.run([h.bin("verifier"), "--model", target, "--eagle", hd, "--tp", "2", "--rank", "1",
                        "--group", "tcp://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    H.check(r.returncode == 2 and "--eagle goes to the group's leader" in r.stderr,
            "--eagle on rank 1: exit %d, %s" % (r.returncode, r.stderr))

    t0 = time.monotonic()
    waiter = subprocess.Popen([h.bin("client"), "--wait-ready", "120"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    h.cleanups.append(lambda: waiter.kill())
    time.sleep(0.5)  # the client looks before the launcher has recorded anything
    lp = h.start("launch", [h.bin("launch"), "--target", target, "--eagle", hd, "--tp", "2", "--no-gateway",
                            "--ready-timeout", "120", "--coordinator-arg", "--adaptive-k", "--coordinator-arg", "off",
                            "--coordinator-arg", "--default-k", "--coordinator-arg", "4"],
                 env={"XDG_RUNTIME_DIR": base})
    H.wait_until(lambda: "ready " in lp.log_tail(200) or not lp.alive(), 150, "specd-launch to print ready")
    H.check(lp.alive(), "specd-launch exited %s before ready" % lp.popen.returncode)
    t_ready = time.monotonic() - t0
    try:
        _, err = waiter.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        H.check(False, "specd-client --wait-ready still waiting 30 s after the launcher was ready (%.1f s)" % t_ready)
    H.check(waiter.returncode == 0, "specd-client --wait-ready: exit %d, %s" % (waiter.returncode, err))
    H.log("--wait-ready started before the launcher returned %.1f s after start (ready after %.1f s)"
          % (time.monotonic() - t0, t_ready))

    addr = next(l for l in lp.log_tail(200).splitlines() if l.startswith("ready ")).split()[1]
    r = subprocess.run([h.bin("client"), "--coordinator", addr, "--stats", "--json"], capture_output=True,
                       text=True, timeout=60)
    H.check(r.returncode == 0, "stats: %s" % r.stderr[-300:])
    ws = json.loads(r.stdout).get("workers", [])
    kinds = [(w["role"], w.get("drafter_kind"), w["alive"]) for w in ws]
    H.check(any(w["role"] == "drafter" and w.get("drafter_kind") == "eagle" and w["alive"] for w in ws),
            "no live drafter of kind eagle: %s" % kinds)
    prompt = " ".join(["hello world"] * 20)  # longer than a drafting step: the head's first draft catches up
    r = subprocess.run([h.bin("client"), "--coordinator", addr, "-p", prompt, "-n", "12", "--ignore-eos", "--json"],
                       capture_output=True, text=True, timeout=120)
    H.check(r.returncode == 0, "request: %s" % r.stderr[-300:])
    out = json.loads(r.stdout)
    H.check(len(out.get("ids", [])) == 12 and out["stats"]["drafted"] > 0,
            "--eagle --tp 2: %d tokens, %d drafted" % (len(out.get("ids", [])), out["stats"]["drafted"]))
    # the head's catch-up over the prompt was reported apart and priced (VerifyResult.next_catchup_us / _rows)
    r = subprocess.run([h.bin("client"), "--coordinator", addr, "--stats", "--json"], capture_output=True,
                       text=True, timeout=60)
    H.check(r.returncode == 0, "stats: %s" % r.stderr[-300:])
    st = json.loads(r.stdout)
    H.check(st.get("catchup_row_us", 0) > 0, "no catch-up priced after a %d-word prompt: %s"
            % (len(prompt.split()), {k: st.get(k) for k in ("draft_token_us", "catchup_row_us")}))
    H.log("specd-launch --eagle --tp 2: workers %s; 12 tokens, %d drafted; draft token %.0f us, catch-up %.0f us a row"
          % (kinds, out["stats"]["drafted"], st["draft_token_us"], st["catchup_row_us"]))
    h.stop(lp, timeout=60)

    lp = h.start("launch", [h.bin("launch"), "--target", target, "--eagle-drafter", hd, "--tp", "2", "--no-gateway",
                            "--ready-timeout", "120", "--coordinator-arg", "--adaptive-k", "--coordinator-arg", "off",
                            "--coordinator-arg", "--default-k", "--coordinator-arg", "4"],
                 env={"XDG_RUNTIME_DIR": base})
    H.wait_until(lambda: "ready " in lp.log_tail(200) or not lp.alive(), 150, "specd-launch --eagle-drafter ready")
    H.check(lp.alive(), "specd-launch --eagle-drafter exited %s before ready" % lp.popen.returncode)
    addr = next(l for l in lp.log_tail(200).splitlines() if l.startswith("ready ")).split()[1]
    r = subprocess.run([h.bin("client"), "--coordinator", addr, "--stats", "--json"], capture_output=True,
                       text=True, timeout=60)
    H.check(r.returncode == 0, "stats: %s" % r.stderr[-300:])
    ws = json.loads(r.stdout).get("workers", [])
    heads = [w for w in ws if w["role"] == "drafter" and w.get("drafter_kind") == "eagle" and w["alive"]]
    H.check(len(heads) == 1 and not heads[0].get("name", "").startswith("head of"),
            "--eagle-drafter: expected one live drafter process of kind eagle, workers %s"
            % [(w["role"], w.get("drafter_kind"), w.get("name")) for w in ws])
    r = subprocess.run([h.bin("client"), "--coordinator", addr, "-p", "hello there", "-n", "24", "--ignore-eos",
                        "--json"], capture_output=True, text=True, timeout=120)
    H.check(r.returncode == 0, "request: %s" % r.stderr[-300:])
    out = json.loads(r.stdout)
    H.check(len(out.get("ids", [])) == 24 and out["stats"]["drafted"] > 0,
            "--eagle-drafter: %d tokens, %d drafted" % (len(out.get("ids", [])), out["stats"]["drafted"]))
    H.log("specd-launch --eagle-drafter --tp 2: head drafter %s; 24 tokens, %d drafted"
          % (heads[0].get("name"), out["stats"]["drafted"]))
    h.stop(lp, timeout=60)


if __name__ == "__main__":
    H.main(run)
