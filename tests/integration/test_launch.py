"""specd-launch: starts coordinator, verifier and drafter, prints "ready
ADDR" once they registered (and "http URL" once specd-gateway listens),
serves a request through that address and one through the gateway's HTTP
API, restarts
a drafter killed with SIGKILL (a new drafter pid registers), stops
everything on SIGTERM with exit 0 (no child left), and when the launcher
itself is SIGKILLed its children die too (PR_SET_PDEATHSIG). Tiny random
models, self-draft.

  test_launch.py [--curve]

--curve: specd-launch --curve DIR: every link keyed; the test's client uses
DIR/client.key, a client without keys is refused, the key files are
mode 0600, and a second launch reuses the keys already in DIR."""
import argparse
import json
import os
import signal
import time
import urllib.request

import harness as H
from harness import children, running


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def gone(pids):
    return not any(running(p) for p in pids)


def start_launcher(h, target, curve=False):
    cport, wport, hport = H.free_port(), H.free_port(), H.free_port()
    h.client_addr = "tcp://127.0.0.1:%d" % cport
    h.http_url = "http://127.0.0.1:%d" % hport
    keys = ["--curve", os.path.join(h.tmp, "keys")] if curve else []
    p = h.start("launch", [h.bin("launch"), "--target", target, "--draft-layers", "1",
                           "--client-addr", h.client_addr, "--worker-addr", "tcp://127.0.0.1:%d" % wport,
                           "--http", "127.0.0.1:%d" % hport, "--ready-timeout", "300"] + keys)
    H.wait_until(lambda: ("http %s" % h.http_url) in p.log_tail(200) or not p.alive(),
                 300, "specd-launch to print ready and the gateway's URL")
    H.check(p.alive(), "specd-launch exited (%s) before ready" % p.popen.returncode)
    H.check(("ready %s" % h.client_addr) in p.log_tail(200), "specd-launch did not print ready")
    # the verifier (on the CPU) warms up and registers before the drafter starts
    log = p.log_tail(400)
    reg, drafter = log.find("verifier group 1 (leader"), log.find("started drafter (pid")
    H.check(0 <= reg < drafter, "the drafter started before the verifier registered (%d, %d)" % (reg, drafter))
    kids = {comm(k): k for k in children(p.pid)}
    H.check({"specd-coordinat", "specd-verifier", "specd-drafter", "specd-gateway"} <= set(kids),
            "launcher children are %s" % kids)
    return p, kids


def check_keys(h):
    """--curve: the launcher's keys serve the client; no key is refused."""
    d = os.path.join(h.tmp, "keys")
    h.load_keys(d)
    for n in ("coordinator", "verifier", "rank", "drafter", "gateway", "client", "launch"):
        H.check(n in h.keys, "specd-launch --curve wrote no %s key pair" % n)
        mode = os.stat(h.keys[n]["key"]).st_mode & 0o777
        H.check(mode == 0o600, "%s.key has mode %o, expected 600" % (n, mode))
    plain = h.zctx.socket(H.zmq.DEALER)
    plain.setsockopt(H.zmq.LINGER, 0)
    plain.setsockopt(H.zmq.SNDTIMEO, 500)
    plain.connect(h.client_addr)
    try:
        plain.send(b"\x22\x02\x08\x01")  # a StatsQuery
        H.check(not plain.poll(1500), "a client without keys was answered by a --curve service")
    except H.zmq.Again:
        pass
    plain.close(0)
    H.log("--curve: keys 0600, a plaintext client refused")


def run(h, curve=False):
    target, _ = h.tiny_models(seed=29)
    ref = h.reference(target, "launch me", 16, ignore_eos=True)
    p, kids = start_launcher(h, target, curve)
    first_keys = None
    if curve:
        check_keys(h)
        first_keys = {n: k["public"] for n, k in h.keys.items()}
    r = h.client().run([dict(prompt="launch me", max_tokens=16, ignore_eos=True)], timeout=120)[0]
    H.check(r["ids"] == ref["ids"], "through the launcher: %s vs %s" % (r["ids"], ref["ids"]))
    body = json.dumps({"prompt": "launch me", "max_tokens": 16, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(h.http_url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = json.loads(resp.read())
    # Token counts only: a random model's text holds NUL bytes, which
    # specd-generate's JSON cuts (test_gateway compares text on SmolLM2).
    H.check(out["usage"]["completion_tokens"] == 16 and out["choices"][0]["finish_reason"] == "length",
            "through the gateway: %s" % out)

    os.kill(kids["specd-drafter"], signal.SIGKILL)
    new = H.wait_until(lambda: next((k for k in children(p.pid) if comm(k) == "specd-drafter"
                                     and k != kids["specd-drafter"]), None), 60, "a restarted drafter")
    H.log("drafter %d killed, restarted as %d" % (kids["specd-drafter"], new))
    h.wait_registered()
    H.check("drafter" in p.log_tail(200) and "restart" in p.log_tail(200),
            "the launcher did not report the drafter's death and restart")

    all_kids = children(p.pid)
    t0 = time.monotonic()
    rc = h.stop(p, signal.SIGTERM, timeout=60)
    H.check(rc == 0, "specd-launch exited %s on SIGTERM, expected 0" % rc)
    H.wait_until(lambda: gone(all_kids), 10, "the children to be gone after the launcher stopped")
    H.log("clean stop in %.2f s" % (time.monotonic() - t0))

    # SIGKILL the launcher: PR_SET_PDEATHSIG takes the children down.
    p, kids = start_launcher(h, target, curve)
    if curve:
        H.check({n: k["public"] for n, k in h.load_keys(os.path.join(h.tmp, "keys")).items()} == first_keys,
                "a second specd-launch --curve on the same directory changed the keys")
    os.kill(p.pid, signal.SIGKILL)
    H.wait_until(lambda: gone(kids.values()), 30, "the children to die with the SIGKILLed launcher")
    H.log("children died with the launcher")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--curve", action="store_true")
    a = ap.parse_args()
    H.main(lambda h: run(h, a.curve))
