"""A local launch admits no other user (issue 37).

specd-launch without keys, addresses or --insecure puts its links in
ipc:// sockets under $XDG_RUNTIME_DIR/specd-UID/launch-PID (mode 0700), and
records the client address there: specd-client of the same user finds the
service without --coordinator. A second user, created for the test
(useradd; skipped without root or useradd), is refused by the kernel: its
rogue drafter never registers and its rogue client's request fails. With
--insecure (TCP on the loopback, today's behaviour) the same rogue client
is served, which shows the check can fail. Tiny random target, no drafter."""
import json
import os
import shutil
import subprocess
import time

import harness as H


def as_user(user, argv):
    return ["runuser", "-u", user, "--"] + argv


def launch(h, target, base, extra=()):
    p = h.start("launch", [h.bin("launch"), "--target", target, "--no-draft", "--no-gateway"] + list(extra),
                env={"XDG_RUNTIME_DIR": base})
    H.wait_until(lambda: "ready " in p.log_tail(200) or not p.alive(), 120, "specd-launch to print ready")
    H.check(p.alive(), "specd-launch exited %s" % p.popen.returncode)
    line = next(l for l in p.log_tail(200).splitlines() if l.startswith("ready "))
    return p, line.split()[1]


def workers(h, addr):
    r = subprocess.run([h.bin("client"), "--coordinator", addr, "--stats", "--json"], capture_output=True, timeout=60)
    H.check(r.returncode == 0, "stats: %s" % r.stderr[-300:])
    return json.loads(r.stdout).get("workers", [])


def run(h):
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        H.skip("needs root with useradd and runuser to make a second user")
    user = "specdt%d" % (os.getpid() % 100000)
    r = subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", user], capture_output=True, timeout=60)
    if r.returncode != 0:
        H.skip("useradd failed: %s" % r.stderr.decode(errors="replace")[-200:])
    h.cleanups.append(lambda: subprocess.run(["userdel", user], capture_output=True, timeout=60))
    os.chmod(h.tmp, 0o755)  # the other user may walk to the runtime base, not into the private directory
    base = os.path.join(h.tmp, "run")
    os.makedirs(base, mode=0o755)
    os.chmod(base, 0o755)
    target, _ = h.tiny_models(seed=31)
    for f in os.listdir(h.tmp):
        if f.endswith(".gguf"):
            os.chmod(os.path.join(h.tmp, f), 0o644)

    lp, addr = launch(h, target, base)
    H.check(addr.startswith("ipc://"), "a default launch serves on %s, not ipc://" % addr)
    d = os.path.dirname(addr[len("ipc://"):])
    H.check(os.stat(d).st_mode & 0o777 == 0o700, "%s has mode %o" % (d, os.stat(d).st_mode & 0o777))
    # the same user, no --coordinator: found
    r = subprocess.run([h.bin("client"), "-p", "hello", "-n", "3", "--json"], capture_output=True, timeout=120,
                       env=dict(os.environ, XDG_RUNTIME_DIR=base))
    H.check(r.returncode == 0 and len(json.loads(r.stdout).get("ids", [])) == 3,
            "the launching user's specd-client without --coordinator: %s" % r.stderr[-300:])
    n0 = len(workers(h, addr))
    # the other user: a rogue drafter and a rogue client
    worker_addr = addr[:-len("client")] + "worker"
    H.check(os.path.exists(worker_addr[len("ipc://"):]), "no worker socket at %s" % worker_addr)
    rogue = h.start("rogue-drafter", as_user(user, [h.bin("drafter"), "--ngram", "--model", target,
                                                    "--coordinator", worker_addr]))
    r = subprocess.run(as_user(user, [h.bin("client"), "--coordinator", addr, "-p", "steal", "-n", "2",
                                      "--timeout", "3"]), capture_output=True, timeout=120)
    H.check(r.returncode != 0, "another user's specd-client was served on a default launch")
    time.sleep(3)
    H.check(len(workers(h, addr)) == n0, "another user's drafter registered: %s" % workers(h, addr))
    h.stop(rogue)
    H.log("default launch on %s: the same user is served without --coordinator; user %s's client fails and its "
          "drafter never registers" % (addr, user))
    h.stop(lp, timeout=60)
    # --insecure: today's TCP loopback, which the other user reaches
    cport = H.free_port()
    lp, addr = launch(h, target, base, ["--insecure", "--client-addr", "tcp://127.0.0.1:%d" % cport,
                                        "--worker-addr", "tcp://127.0.0.1:%d" % H.free_port(),
                                        "--group-addr", "tcp://127.0.0.1:%d" % H.free_port()])
    r = subprocess.run(as_user(user, [h.bin("client"), "--coordinator", addr, "-p", "steal", "-n", "2",
                                      "--timeout", "30"]), capture_output=True, timeout=120)
    H.check(r.returncode == 0, "with --insecure the other user's client was not served (the test proves "
            "nothing): %s" % r.stderr[-300:])
    H.log("--insecure (TCP on the loopback): the other user's client is served, as before")


if __name__ == "__main__":
    H.main(run)
