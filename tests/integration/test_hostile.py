"""Hostile peers against a CurveZMQ service: every attempt is refused while
the real service keeps serving its allowed clients, with greedy output equal
to specd-generate's.

  test_hostile.py [--n 8] [--tokens 16]

The service (coordinator, verifier, model drafter on the tiny random models)
runs with keys from specd-keygen: clients.allow holds the client key,
workers.allow the verifier's and the drafter's. The attacks, each checked
to be refused:
  - a rogue verifier and a rogue drafter saying Hello on the worker socket
    with no key (plaintext), with a key on no list, and with the client key
    (a client key can never register a worker); the coordinator logs the
    refused key, and the Hello never reaches it (no Welcome, no Error);
  - a plaintext client and a client with an unknown key submitting on the
    client socket, and a worker key used on the client socket;
  - specd-client with an unknown key and without keys: it exits at once
    with the handshake error (it used to hang in sd_client_close);
  - a real specd-drafter process with an unknown key: exits 3, saying the
    coordinator refused it;
  - a valid worker key replaying a verifier Hello for the live group (its
    group id) while the real verifier lives: refused (CODE_REFUSED), the
    live verifier stays registered (a key holder may add a group of its own:
    that is what a worker key allows); a replayed drafter Hello joins the
    drafters at most until it goes silent (dropped then), and its drafts can
    never change greedy output;
  - a valid worker key with the wrong vocabulary: refused, and the refusal
    names neither the target's vocabulary size nor its hash;
  - the drafter's key (bound to role=drafter in workers.allow) asking to
    register as the verifier: refused for its role.
Then the allowed client's requests must equal specd-generate's output, and
the service must list exactly the real verifier and drafter. Before the
service starts, the start-up rules: a missing or world-readable secret key,
a key without the allow-lists, and a non-loopback bind without keys stop
the coordinator; --insecure allows the bind.
"""
import argparse
import re
import subprocess
import time

import harness as H
import pbwire as pb

zmq = H.zmq

MODEL_IDENTITY = {"architecture": (1, "string"), "vocab_size": (2, "uint32"), "vocab_hash": (3, "fixed64"),
                  "context_length": (4, "uint32"), "name": (5, "string"), "n_layers": (6, "uint32")}
WORKER_HELLO = {"protocol_version": (1, "uint32"), "role": (2, "enum"), "rank": (3, "uint32"),
                "group_size": (4, "uint32"), "model": (5, ("msg", MODEL_IDENTITY)), "name": (6, "string"),
                "drafter_kind": (7, "enum"), "max_batch": (8, "uint32"), "max_k": (9, "uint32"),
                "group_id": (12, "uint32")}
WORKER_TO_COORD = {"hello": (1, ("msg", WORKER_HELLO))}
WELCOME = {"protocol_version": (1, "uint32"), "worker_id": (2, "uint64")}
COORD_TO_WORKER = {"welcome": (1, ("msg", WELCOME)), "error": (2, ("msg", pb.ERROR)),
                   "heartbeat": (3, ("msg", pb.HEARTBEAT))}
DRAFTER_KIND_NGRAM = 2
REFUSED_S = 1.5  # how long a refused peer waits for an answer that must not come


def target_identity(coord):
    """(vocab size, vocab hash) from the coordinator's start-up line."""
    with open(coord.logpath, errors="replace") as f:
        for line in f:
            m = re.search(r"(\d+) tokens \(vocab hash 0x([0-9a-f]+)\)", line)
            if m:
                return int(m.group(1)), int(m.group(2), 16)
    raise H.TestFailure("the coordinator did not log the target's identity")


def peer(h, addr, key, server_key=None):
    """A DEALER to addr holding key (a name in h.keys, None for plaintext);
    sends time out instead of blocking on a refused connection."""
    s = h.zctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 500)
    if key is not None:
        s.curve_secretkey = h.keys[key]["secret"]
        s.curve_publickey = h.keys[key]["public"]
        s.curve_serverkey = server_key or h.keys["coordinator"]["public"]
    s.connect(addr)
    return s


def say_hello(h, key, role, identity, wait_s=REFUSED_S, group_id=0):
    """A Hello on the worker socket; returns the decoded answer or None.
    group_id: the verifier group it claims to lead (0: none named)."""
    n_vocab, vhash = identity
    hello = {"protocol_version": 1, "role": role, "rank": 0, "group_size": 1, "name": "rogue",
             "model": {"architecture": "llama", "vocab_size": n_vocab, "vocab_hash": vhash, "context_length": 2048,
                       "name": "rogue.gguf", "n_layers": 1}}
    if role == pb.ROLE_DRAFTER:
        hello["drafter_kind"] = DRAFTER_KIND_NGRAM
    if group_id:
        hello["group_id"] = group_id
    s = peer(h, h.worker_addr, key)
    try:
        try:
            s.send(pb.encode(WORKER_TO_COORD, {"hello": hello}))
        except zmq.Again:
            return None  # never connected: refused at the handshake
        if s.poll(int(wait_s * 1000)):
            return pb.decode(COORD_TO_WORKER, s.recv())
        return None
    finally:
        s.close(0)


def submit_as(h, key, addr=None):
    """A Submit on the client socket; returns the decoded answer or None."""
    s = peer(h, addr or h.client_addr, key)
    try:
        try:
            s.send(pb.encode(pb.CLIENT_TO_COORD, {"submit": {"client_tag": 1, "prompt": "the cat", "max_tokens": 4,
                                                             "ignore_eos": True}}))
        except zmq.Again:
            return None
        if s.poll(int(REFUSED_S * 1000)):
            return pb.decode(pb.COORD_TO_CLIENT, s.recv())
        return None
    finally:
        s.close(0)


def zap_refusals(coord):
    with open(coord.logpath, errors="replace") as f:
        return [l for l in f if "zap: refused" in l]


def expect_refused_key(coord, key_z85, domain, what):
    k = key_z85.decode()
    H.wait_until(lambda: any(k in l and domain in l for l in zap_refusals(coord)), 10,
                 "the coordinator to log the refusal of %s (key %s on %s)" % (what, k, domain))


def start_up_rules(h, target):
    """Fail closed at start-up: a missing or world-readable key file, keys
    without allow-lists, and a bind beyond loopback without keys are
    refused; --insecure allows the bind."""
    import os
    import shutil
    k = h.keys
    lists = ["--client-keys", os.path.join(h.key_dir, "clients.allow"),
             "--worker-keys", os.path.join(h.key_dir, "workers.allow")]
    open_key = os.path.join(h.tmp, "open.key")
    shutil.copy(k["coordinator"]["key"], open_key)
    os.chmod(open_key, 0o644)
    port = lambda: "tcp://127.0.0.1:%d" % H.free_port()
    cases = [
        (["--curve-secret", os.path.join(h.tmp, "missing.key")] + lists, "missing.key"),
        (["--curve-secret", open_key] + lists, "chmod 600"),
        (["--curve-secret", k["coordinator"]["key"]], "needs all three"),
        (["--client-addr", "tcp://0.0.0.0:%d" % H.free_port()], "without CurveZMQ keys is refused"),
    ]
    for extra, want in cases:
        argv = [h.bin("coordinator"), "--model", target, "--client-addr", port(), "--worker-addr", port()] + extra
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        H.check(r.returncode != 0 and want in r.stderr, "coordinator %s: exit %d, expected a refusal with %r:\n%s"
                % (" ".join(extra), r.returncode, want, r.stderr[-800:]))
        H.log("start-up refused: %s" % next(l for l in r.stderr.splitlines() if want in l).split(": ", 1)[-1])
    # a drafter whose key file is missing stops before it loads anything
    r = subprocess.run([h.bin("drafter"), "--ngram", "--model", target, "--coordinator", port(),
                        "--curve-secret", os.path.join(h.tmp, "missing.key"), "--curve-server",
                        k["coordinator"]["pub"]], capture_output=True, text=True, timeout=60)
    H.check(r.returncode == 2 and "missing.key" in r.stderr, "a drafter without its key file: exit %d: %s"
            % (r.returncode, r.stderr[-500:]))
    # --insecure: the same wildcard bind is allowed (the coordinator starts, then stops on SIGTERM)
    p = h.start("insecure-coordinator", [h.bin("coordinator"), "--model", target, "--client-addr",
                                         "tcp://0.0.0.0:%d" % H.free_port(), "--worker-addr", port(), "--insecure"])
    H.wait_until(lambda: "clients on" in p.log_tail(20) or not p.alive(), 60, "the --insecure coordinator to bind")
    H.check(p.alive(), "the --insecure coordinator exited %s" % p.popen.returncode)
    H.check(h.stop(p) == 0, "the --insecure coordinator did not stop cleanly")
    h.procs.remove(p)


def run(h, args):
    h.enable_curve(extra_names=["rogue"])
    target, draft = h.tiny_models()
    start_up_rules(h, target)
    prompts = H.random_prompts(args.n, seed=11)
    refs = [h.reference(target, p, args.tokens, ignore_eos=True) for p in prompts]
    coord, ver, dr = h.start_service(target, drafter="model", draft=draft, coord_extra=H.FIXED_K)
    identity = target_identity(coord)
    c = h.client()
    before = {(w.get("role"), w.get("name")) for w in c.stats()["workers"] if w.get("alive")}
    H.check(len(before) == 2, "expected the verifier and the drafter registered, got %s" % before)

    # 1. rogue workers: no key, an unknown key, the client key
    for role, rname in ((pb.ROLE_VERIFIER, "verifier"), (pb.ROLE_DRAFTER, "drafter")):
        for key in (None, "rogue", "client"):
            ans = say_hello(h, key, role, identity)
            H.check(ans is None, "a rogue %s with %s got an answer: %s" % (rname, key or "no key", ans))
            if key:
                expect_refused_key(coord, h.keys[key]["public"], "specd-worker", "a rogue %s" % rname)
            H.log("rogue %s with %s: refused" % (rname, key or "no key (plaintext)"))

    # 2. rogue clients: plaintext, an unknown key, a worker key on the client socket
    for key in (None, "rogue", "drafter"):
        ans = submit_as(h, key)
        H.check(ans is None, "a client with %s was answered: %s" % (key or "no key", ans))
        if key:
            expect_refused_key(coord, h.keys[key]["public"], "specd-client", "a client")
        H.log("client with %s: refused" % (key or "no key (plaintext)"))

    # 3. specd-client: refused at once (no hang in close), for a bad key and for none
    for argv, what in ((h.key_args("rogue"), "an unknown key"), ([], "no key")):
        t0 = time.monotonic()
        r = subprocess.run([h.bin("client"), "--coordinator", h.client_addr, "-p", "hi", "-n", "2", "--timeout",
                            "30"] + argv, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        H.check(r.returncode != 0, "specd-client with %s succeeded" % what)
        out = r.stderr + r.stdout
        H.check(took < 10 and ("handshake" in out or "refused" in out),
                "specd-client with %s: exit %d after %.1f s without a handshake error: %s"
                % (what, r.returncode, took, r.stderr[-500:]))
        H.log("specd-client with %s: exit %d after %.2f s" % (what, r.returncode, took))

    # 4. a real drafter process with an unknown key exits 3, saying so
    rogue = h.start_drafter("ngram", key="rogue")
    H.wait_until(lambda: not rogue.alive(), 60, "the rogue drafter to exit")
    H.check(rogue.popen.returncode == 3, "the rogue drafter exited %s, expected 3" % rogue.popen.returncode)
    H.check("refused this worker" in rogue.log_tail(20), "the rogue drafter did not say it was refused")

    # 5. a valid worker key replaying a verifier Hello while the verifier lives:
    # the Hello claims the live group's id (several groups may serve at once,
    # each registering with its own id; a second leader of a live group never)
    gid = next(w.get("group_id") for w in c.stats()["workers"] if w.get("alive") and w.get("role") == pb.ROLE_VERIFIER)
    ans = say_hello(h, "verifier", pb.ROLE_VERIFIER, identity, wait_s=10, group_id=gid)
    H.check(ans is not None and "error" in ans and pb.CODE.get(ans["error"].get("code")) == "REFUSED",
            "a replayed verifier Hello was not refused: %s" % ans)
    H.check(ver.alive(), "the real verifier died")
    H.log("replayed verifier Hello: %s" % ans["error"].get("message"))

    # a drafter's key is bound to its role (role=drafter): never a verifier
    ans = say_hello(h, "drafter", pb.ROLE_VERIFIER, identity, wait_s=10)
    H.check(ans is not None and "error" in ans and "may not register as a verifier" in ans["error"].get("message", ""),
            "a drafter key asking to be the verifier was not refused for its role: %s" % ans)
    H.log("drafter key as a verifier: %s" % ans["error"].get("message"))

    # ... and a drafter Hello: at most a standby, never in place of the live drafter
    ans = say_hello(h, "drafter", pb.ROLE_DRAFTER, identity, wait_s=10)
    H.check(ans is not None and ("welcome" in ans or "error" in ans), "a replayed drafter Hello got %s" % ans)
    with open(coord.logpath, errors="replace") as f:
        standby = [l for l in f if "drafter rogue registered" in l]
    H.check(not standby or "(standby)" in standby[-1], "the replayed drafter Hello displaced the drafter: %s"
            % standby[-1:])
    H.check(dr.alive(), "the real drafter died")
    # the silent replayer is dropped after the liveness period
    H.wait_until(lambda: not any(w.get("name") == "rogue" and w.get("alive") for w in c.stats()["workers"]), 30,
                 "the replayed drafter to be dropped")
    H.log("replayed drafter Hello: %s" % ("standby, then dropped" if "welcome" in ans else ans["error"]))

    # 6. a valid worker key with the wrong vocabulary: refused, told nothing of the target
    ans = say_hello(h, "drafter", pb.ROLE_DRAFTER, (identity[0] + 1, identity[1] ^ 1), wait_s=10)
    H.check(ans is not None and "error" in ans and pb.CODE.get(ans["error"].get("code")) == "VOCAB_MISMATCH",
            "a wrong vocabulary was not refused: %s" % ans)
    msg = ans["error"].get("message", "")
    H.check(str(identity[0]) not in msg and ("%x" % identity[1]) not in msg.lower(),
            "the refusal leaks the target's identity: %r" % msg)
    H.log("wrong vocabulary: %r" % msg)

    # the real service still serves, exactly, with only the real workers
    res = c.run([dict(prompt=p, max_tokens=args.tokens, ignore_eos=True) for p in prompts], timeout=300)
    H.expect_equal_ids(res, refs, "%d greedy requests after the attacks" % args.n)
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in res)
    H.check(drafted > 0, "no request was drafted: the real drafter is not in use")
    after = {(w.get("role"), w.get("name")) for w in c.stats()["workers"] if w.get("alive")}
    H.check(after == before, "registered workers changed: %s -> %s" % (before, after))
    r = subprocess.run([h.bin("client"), "--coordinator", h.client_addr, "-p", prompts[0], "-n", str(args.tokens),
                        "--ignore-eos", "--json"] + h.key_args("client"), capture_output=True, text=True, timeout=120)
    H.check(r.returncode == 0, "specd-client with the client key failed: %s" % r.stderr[-500:])
    H.log("specd-client with the client key: served")
    c.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
