"""TCP self-connect (issue 37): why the ports are chosen outside the
kernel's ephemeral range, and what a peer does that hears itself.

1. Reproduced: a plain loopback connect loop to a free port P inside
   ip_local_port_range ends up connected to itself (the kernel gave the
   connection P as its source port: simultaneous open), and while it holds
   P nothing can bind P - a coordinator meant for P could never start.
2. The same loop, as many tries again, against a port from the harness's
   free_port() (outside the range, where no connection takes its source
   port) never self-connects, and a coordinator then binds that port and
   serves: a start cannot be blocked this way. The launcher's default
   ports (7700-7702, 8000) are outside the default range too.
3. A peer that hears its own Hello (what a self-connected DEALER hears)
   drops the connection at once: specd-client against an echoing socket
   reconnects with a new routing id instead of holding the connection."""
import errno
import os
import socket
import subprocess
import time

import harness as H

try:
    import zmq
except ImportError:
    zmq = None


def connect_loop(port, tries):
    """Connects to 127.0.0.1:port up to `tries` times; the socket connected
    to itself when one is (else None), and the tries made."""
    for i in range(tries):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as e:
            s.close()
            if e.errno in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ETIMEDOUT):
                continue
            raise
        if s.getsockname()[1] == port:
            return s, i + 1
        s.close()  # someone else listens there: not ours to judge
        return None, i + 1
    return None, tries


def ephemeral_free_port(lo, hi):
    """A free even port inside the range (the kernel prefers even source
    ports for connect)."""
    import random
    rng = random.Random()
    for _ in range(1000):
        p = rng.randrange(lo + (lo & 1), hi, 2)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    H.skip("no free port in the ephemeral range")


def run(h):
    lo, hi = H.ephemeral_range()
    tries = 4 * (hi - lo + 1)
    # 1. the hazard, reproduced
    p = ephemeral_free_port(lo, hi)
    t0 = time.monotonic()
    s, n = connect_loop(p, tries)
    if s is None:
        H.log("no self-connect to port %d in %d tries (%.1f s): this kernel did not reproduce it"
              % (p, n, time.monotonic() - t0))
        need = None
    else:
        need = n
        H.log("self-connect reproduced: port %d (ephemeral range %d-%d) connected to itself after %d tries"
              % (p, lo, hi, n))
        with socket.socket() as l:
            try:
                l.bind(("127.0.0.1", p))
                held = False
            except OSError:
                held = True
        H.check(held, "port %d could be bound while a self-connected socket held it" % p)
        H.log("while it holds port %d nothing can bind it (the coordinator's start would fail)" % p)
        s.close()
    # 2. the harness's ports cannot be held that way
    q = H.free_port()
    H.check(not lo <= q <= hi, "free_port() gave %d, inside the ephemeral range %d-%d" % (q, lo, hi))
    for default in (7700, 7701, 7702, 8000):
        H.check(not lo <= default <= hi, "default port %d is inside the ephemeral range %d-%d" % (default, lo, hi))
    budget = max(2 * (need or 0), hi - lo + 1)
    s, n = connect_loop(q, budget)
    H.check(s is None, "port %d (outside the range) self-connected after %d tries" % (q, n))
    H.log("port %d, outside the range: no self-connect in %d tries" % (q, n))
    target, _ = h.tiny_models(seed=5)
    coord = h.start("coordinator", [h.bin("coordinator"), "--model", target, "--client-addr",
                                    "tcp://127.0.0.1:%d" % q, "--worker-addr", "tcp://127.0.0.1:%d" % H.free_port()])
    c = h.client("tcp://127.0.0.1:%d" % q)
    c.send({"stats": {"include_workers": False}})
    m = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (m and "stats" in m):
        m = c.recv(1)
    H.check(m and "stats" in m, "the coordinator did not serve on port %d" % q)
    H.check(coord.alive(), "the coordinator exited")
    c.close()
    H.log("the coordinator bound port %d and answered after the connect loop" % q)
    # 3. hearing its own Hello: the client drops the connection
    echo = h.zctx.socket(zmq.ROUTER)
    echo.setsockopt(zmq.LINGER, 0)
    r = H.free_port()
    echo.bind("tcp://127.0.0.1:%d" % r)
    cli = h.start("client", [h.bin("client"), "--coordinator", "tcp://127.0.0.1:%d" % r, "-p", "hello", "-n", "2",
                             "--timeout", "5"])
    idents = set()
    deadline = time.monotonic() + 30
    while len(idents) < 3 and time.monotonic() < deadline:
        if echo.poll(500):
            ident, body = echo.recv_multipart()[:2]
            idents.add(ident)
            echo.send_multipart([ident, body])  # what a self-connected socket hears: its own bytes
    # and it still gives up by its deadline (--timeout 5): an echo cannot hold it
    while cli.alive() and time.monotonic() < deadline + 30:
        if echo.poll(200):
            ident, body = echo.recv_multipart()[:2]
            echo.send_multipart([ident, body])
    H.check(not cli.alive(), "specd-client against an echo did not give up within its --timeout")
    H.check(cli.popen.returncode == 1, "specd-client against an echo exited %s" % cli.popen.returncode)
    echo.close(0)
    H.check(len(idents) >= 3, "specd-client kept its connection after hearing its own Hello (%d routing ids)"
            % len(idents))
    log = open(cli.logpath, errors="replace").read()
    H.check("own Hello" in log, "specd-client did not say why it dropped the connection:\n%s" % log[-800:])
    H.log("specd-client heard its own Hello and reconnected at once (%d connections)" % len(idents))


if __name__ == "__main__":
    H.main(run)
