"""Shared pieces of the Python side-by-side benchmarks (bench/*.py).

- Hyg: the CPU time other processes used around one measured run, in cores
  (/proc/stat busy time minus this process's own and its reaped children's),
  the same measure specd-bench takes (tools/bench_hygiene.c).
- launch / stop: a `specd-launch` service (no gateway) started in its own
  session, its "ready ADDR" line awaited; stopped as a process group.
- pin: keeps this process, the peer library it runs in-process, and every
  child it starts to one CPU set, so specd and its peer are placed the same
  way (neither pins a thread to a single core).
"""
import os
import signal
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def busy_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


def own_ticks():
    with open("/proc/self/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return sum(int(x) for x in fields[11:15])  # utime stime cutime cstime


class Hyg:
    """with Hyg() as h: ... then h.other is the other processes' share, in cores."""

    def __enter__(self):
        self.t0, self.b0, self.o0 = time.monotonic(), busy_ticks(), own_ticks()
        return self

    def __exit__(self, *exc):
        wall = time.monotonic() - self.t0
        other = (busy_ticks() - self.b0) - (own_ticks() - self.o0)
        self.other = max(0.0, other / TICK / wall) if wall > 0 else -1.0


def parse_cpus(text):
    """A Linux CPU list ("0-1", "0,2,4-5") as a set; ValueError otherwise."""
    cpus = set()
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r}")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(a, b + 1))
    return cpus


def pin(cpus_arg, threads):
    """Takes the CPU set cpus_arg (default: the first `threads` CPUs this
    process may use); returns it as text."""
    allowed = sorted(os.sched_getaffinity(0))
    cpus = parse_cpus(cpus_arg) if cpus_arg else set(allowed[:threads])
    os.sched_setaffinity(0, cpus)
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def launch(bindir, model, extra, logpath):
    """Starts BINDIR/deploy/specd-launch on MODEL with EXTRA flags (stderr to
    LOGPATH); returns (process, coordinator address) once it prints ready."""
    log = open(logpath, "w")
    cmd = [os.path.join(bindir, "deploy", "specd-launch"), "--target", model, "--no-gateway",
           "--ready-timeout", "300"] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    t0 = time.monotonic()
    while True:
        line = p.stdout.readline()
        if line.startswith("ready "):
            return p, line.split()[1]
        if not line or time.monotonic() - t0 > 300:
            stop(p)
            sys.exit("specd-launch %s did not get ready; see %s" % (" ".join(extra), logpath))


def stop(p):
    """SIGTERM to the service's process group; SIGKILL after 120 s."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
