"""Across hosts: coordinator, verifier, drafter and the test's client each
run in their own network namespace, joined by veth pairs to a bridge in a
fifth (hub) namespace, with 1 ms of netem delay on every process's link;
addresses are in a private subnet (10.213.77.0/24) that exists only inside
those namespaces. Every link is keyed with CurveZMQ (a coordinator binds
beyond loopback only with keys). 16 concurrent greedy requests must give
specd-generate's tokens. Needs root, `ip netns` and `tc`; skipped with a message otherwise.
If the kernel lacks sch_netem the test still runs across namespaces and
says that the delay is missing. Namespaces are always deleted, also the
ones a killed earlier run left behind."""
import ctypes
import os
import shutil
import subprocess

import harness as H

N, TOKENS = 16, 24
SUBNET = "10.213.77"
CLONE_NEWNET = 0x40000000


def sh(*argv, check=True):
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise H.TestFailure("%s failed: %s" % (" ".join(argv), r.stderr.strip()))
    return r


def remove_stale():
    for line in sh("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("sdit") and "-" in name:
            pid = name[4:].split("-")[0]
            if pid.isdigit() and not os.path.exists("/proc/%s" % pid):
                sh("ip", "netns", "del", name, check=False)


def run(h):
    if os.geteuid() != 0:
        H.skip("needs root for network namespaces (run the suite as root to include it)")
    if not shutil.which("ip") or not shutil.which("tc"):
        H.skip("needs the ip and tc tools (iproute2)")
    remove_stale()
    probe = "sdit%d-probe" % os.getpid()
    if sh("ip", "netns", "add", probe, check=False).returncode != 0:
        H.skip("cannot create network namespaces here (ip netns add failed)")
    sh("ip", "netns", "del", probe)

    target, _ = h.tiny_models(seed=23)
    prompts = H.random_prompts(N, seed=61)
    refs = [h.reference(target, p, TOKENS, ignore_eos=True) for p in prompts]

    tag = "sdit%d" % os.getpid()
    hub = tag + "-hub"
    roles = {"coordinator": 1, "verifier": 2, "drafter": 3, "client": 4}
    ns = {r: "%s-%s" % (tag, r[:5]) for r in roles}
    for name in [hub] + list(ns.values()):
        sh("ip", "netns", "add", name)
        h.cleanups.append(lambda n=name: sh("ip", "netns", "del", n, check=False))
        sh("ip", "-n", name, "link", "set", "lo", "up")
    sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", hub, "link", "set", "br0", "up")
    delay = True
    for role, i in roles.items():
        a, b = "v%d" % i, "h%d" % i
        sh("ip", "-n", ns[role], "link", "add", a, "type", "veth", "peer", "name", b, "netns", hub)
        sh("ip", "-n", hub, "link", "set", b, "master", "br0")
        sh("ip", "-n", hub, "link", "set", b, "up")
        sh("ip", "-n", ns[role], "addr", "add", "%s.%d/24" % (SUBNET, i), "dev", a)
        sh("ip", "-n", ns[role], "link", "set", a, "up")
        if delay and sh("ip", "netns", "exec", ns[role], "tc", "qdisc", "add", "dev", a, "root", "netem",
                        "delay", "1ms", check=False).returncode != 0:
            delay = False
    if not delay:
        H.log("NOTE: this kernel has no netem qdisc (sch_netem): the namespaces are joined without the 1 ms delay")
    else:
        H.log("1 ms netem delay on every link")

    # beyond loopback nothing binds without keys (or --insecure): key every link
    h.enable_curve()
    caddr = "%s.%d" % (SUBNET, roles["coordinator"])
    h.start_coordinator(target, H.FIXED_K, netns=ns["coordinator"], client_host=caddr, worker_host=caddr)
    h.start_verifier(netns=ns["verifier"])
    h.start_drafter("layers", netns=ns["drafter"])

    # The test's own client joins the client namespace: setns on this thread,
    # then a fresh ZeroMQ context whose I/O thread is born in it.
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/var/run/netns/%s" % ns["client"], os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise H.TestFailure("setns into %s failed: errno %d" % (ns["client"], ctypes.get_errno()))
    os.close(fd)
    h.zctx.destroy(linger=0)
    h.zctx = H.zmq.Context()
    h.wait_registered()
    res = h.client().run([dict(prompt=p, max_tokens=TOKENS, ignore_eos=True) for p in prompts], timeout=600)
    H.expect_equal_ids(res, refs, "%d greedy requests across network namespaces" % N)
    H.log("equal across namespaces%s" % (" with 1 ms delay per link" if delay else ""))


if __name__ == "__main__":
    H.main(run)
