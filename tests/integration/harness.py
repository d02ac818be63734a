"""harness — start the real specd processes on loopback for integration tests.

Every process is started with a free port chosen by the kernel, its output
in a log file, PR_SET_PDEATHSIG (so nothing outlives a test killed by CTest's
timeout), and is killed at the end whatever happened; a failing test prints
the tail of every log. Waiting is always a poll with a bound (wait_until),
never a fixed sleep. The client speaks the wire protocol itself (pbwire.py)
so tests can send exactly the bytes they mean, good or bad.

Exit codes follow CTest: 0 pass, 1 fail, 77 skipped (with the reason printed).
"""
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import pbwire as pb

try:
    import zmq
except ImportError:  # pyzmq is in tests/ref/requirements.txt
    zmq = None

SKIP = 77
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
SOURCE = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARIES = {
    "coordinator": "coordinator/specd-coordinator",
    "verifier": "verifier/specd-verifier",
    "drafter": "drafter/specd-drafter",
    "client": "client/specd-client",
    "launch": "deploy/specd-launch",
    "generate": "tools/specd-generate",
    "mkmodel": "tools/specd-mkmodel",
    "gateway": "gateway/specd-gateway",
    "bench": "tools/specd-bench",
    "keygen": "tools/specd-keygen",
    "quantize": "tools/specd-quantize",
}


# Coordinator flags for tests of the speculative path: every step drafts
# (K = 4). Adaptive K rightly chooses K = 0 for drafters that do not pay
# (on the tiny random models a draft round trip costs several verify
# steps), which would leave the drafts, their verification and the
# drafter's caches untested. The adaptive policy has its own unit tests
# (test_coordinator) and benchmark (specd-bench serve).
FIXED_K = ["--adaptive-k", "off", "--default-k", "4"]



# Random target and draft of each architecture beyond Llama (specd-mkmodel
# flags; the shapes of tests/test_model_arch.c's cases).
TINY_ARCHS = {
    "qwen2": ("--arch qwen2 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128 --tied",
              "--arch qwen2 --layers 1 --dim 32 --heads 2 --kv-heads 1 --ff 64 --tied"),
    "qwen3": ("--arch qwen3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 128",
              "--arch qwen3 --layers 1 --dim 32 --heads 2 --kv-heads 2 --head-dim 32 --ff 64"),
    "gemma3": ("--arch gemma3 --layers 7 --dim 64 --heads 2 --kv-heads 1 --head-dim 32 --ff 128 --window 7 --tied",
               "--arch gemma3 --layers 1 --dim 32 --heads 2 --kv-heads 1 --head-dim 32 --ff 64 --window 7 --tied"),
    "mistral": ("--arch mistral --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128 --window 5",
                "--arch mistral --layers 1 --dim 32 --heads 2 --kv-heads 2 --ff 64 --window 5"),
    "phi3-longrope": ("--arch phi3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ff 128 --ctx 4096 --longrope 256",
                      "--arch phi3 --layers 1 --dim 32 --heads 2 --kv-heads 2 --ff 64 --ctx 4096 --longrope 256"),
}

class TestFailure(Exception):
    pass



# ---- processes, read from /proc (the launcher's children and their state) ----

def children(pid):
    """The pids of pid's children (empty once pid is gone)."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def cmdline(pid):
    """pid's argv as bytes (empty once pid is gone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def running(pid):
    """Whether pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


def skip(why):
    print("SKIPPED: " + why, flush=True)
    sys.exit(SKIP)


def log(msg):
    print("[%7.2f] %s" % (time.monotonic() - _T0, msg), flush=True)


_T0 = time.monotonic()
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _child_setup():
    # Runs in the forked child: die with the test, own process group. The
    # death signal follows the *thread* that forked: start processes from
    # threads that live as long as the processes (normally the main one).
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgid(0, 0)


def ephemeral_range():
    """The kernel's range for the local port of an outgoing connection."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_rng_ports = random.Random(os.getpid() ^ int(time.time() * 1000))
_given_ports = set()


def free_port():
    """A free loopback TCP port outside the kernel's ephemeral range. A
    port inside it can be taken by a TCP self-connect: a peer that connects
    to it before the listener binds may get that very port as its own
    source port and connect to itself (simultaneous open), holding it so
    that the listener can never bind (issue 37). Outgoing connections take
    their source ports from the ephemeral range only, so a port outside it
    cannot be held that way."""
    lo, hi = ephemeral_range()
    spans = [(p, q) for p, q in ((10000, min(lo, 65536) - 1), (max(hi, 1023) + 1, 65535)) if q - p > 100]
    for _ in range(1000):
        a, b = _rng_ports.choice(spans)
        port = _rng_ports.randint(a, b)
        if port in _given_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _given_ports.add(port)
            return port
    raise TestFailure("no free port outside the ephemeral range %d-%d" % (lo, hi))


def wait_until(pred, timeout, what, interval=0.02):
    """Polls pred() until it returns a true value (returned) or timeout
    seconds pass (TestFailure naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TestFailure("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def sanitized():
    """True when the binaries are built with ASan (everything is slower)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return "SPECD_SANITIZE:BOOL=ON" in f.read()
    except OSError:
        return False


class Proc:
    def __init__(self, name, argv, logpath, popen):
        self.name, self.argv, self.logpath, self.popen = name, argv, logpath, popen

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def log_tail(self, n=60):
        try:
            with open(self.logpath, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"


class Harness:
    """Owns temp files and processes of one test; use as a context manager
    around the test body (it turns TestFailure into exit 1 with the logs)."""

    def __init__(self, name):
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix="specd-it-%s-" % name)
        self.procs = []
        self.cleanups = []
        self.zctx = zmq.Context() if zmq else None
        # backend switches (e.g. ["--cpu-weights", "f32"]) for every process
        # that loads a model: verifiers, model drafters, specd-generate,
        # tests/specd_logits
        self.engine_args = []

    # ---- binaries and models ----
    def bin(self, what):
        p = os.path.join(BUILD, BINARIES[what])
        check(os.access(p, os.X_OK), "%s is not built (%s missing)" % (what, p))
        return p

    def smollm(self):
        m = os.environ.get("SPECD_MODEL")
        if not m or not os.path.exists(m):
            try:
                m = subprocess.run([os.path.join(SOURCE, "tools", "fetch-model")],
                                   capture_output=True, text=True, timeout=600).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                m = ""
        if not m or not os.path.exists(m):
            skip("the demo model is not available (set SPECD_MODEL or run tools/fetch-model)")
        return m

    def gemma3(self):
        """The real Gemma 3 270M (Q4_K_M; Gemma terms: fetched by tools/fetch-model gemma3, never committed)."""
        try:
            m = subprocess.run([os.path.join(SOURCE, "tools", "fetch-model"), "gemma3"],
                               capture_output=True, text=True, timeout=900).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            m = ""
        if not m or not os.path.exists(m):
            skip("Gemma 3 270M is not available (run tools/fetch-model gemma3)")
        return m

    def tiny_models(self, seed=1, ctx=2048, arch=None):
        """A random 2-layer target and a random 1-layer draft model with the
        target's tokenizer; arch: one of TINY_ARCHS, both of that
        architecture (its shapes as test_model_arch.c's)."""
        target = os.path.join(self.tmp, "target.gguf")
        draft = os.path.join(self.tmp, "draft.gguf")
        t_args, d_args = TINY_ARCHS[arch] if arch else (
            "--dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --ctx %d" % ctx,
            "--dim 32 --layers 1 --heads 2 --kv-heads 1 --ff 64")
        subprocess.run([self.bin("mkmodel"), "-o", target, "--vocab", "512", "--seed", str(seed)] + t_args.split(),
                       check=True, capture_output=True)
        subprocess.run([self.bin("mkmodel"), "-o", draft, "--tokenizer-from", target, "--seed", str(seed + 100)]
                       + d_args.split(), check=True, capture_output=True)
        return target, draft

    # ---- processes ----
    def start(self, name, argv, netns=None, env=None):
        logpath = os.path.join(self.tmp, "%s-%d.log" % (name, len(self.procs)))
        full = (["ip", "netns", "exec", netns] if netns else []) + argv
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        if env:
            e.update(env)
        f = open(logpath, "wb")
        p = subprocess.Popen(full, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=_child_setup, env=e)
        f.close()
        proc = Proc(name, full, logpath, p)
        self.procs.append(proc)
        log("started %s (pid %d): %s" % (name, p.pid, " ".join(full)))
        return proc

    def stop(self, proc, sig=signal.SIGTERM, timeout=15):
        """Signals proc and waits (bounded) for it; SIGKILL after timeout.
        Returns the exit status."""
        if proc.alive():
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                return proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                log("%s did not exit within %d s of signal %d: SIGKILL" % (proc.name, timeout, sig))
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.popen.wait(10)
        return proc.popen.returncode

    def kill_all(self):
        for p in reversed(self.procs):
            if p.alive():
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.popen.kill()
                try:
                    p.popen.wait(10)
                except subprocess.TimeoutExpired:
                    pass

    def print_logs(self):
        for p in self.procs:
            print("---- log of %s (pid %d, %s) ----" % (p.name, p.pid,
                  "running" if p.alive() else "exit %s" % p.popen.returncode))
            print(p.log_tail())
            # SPECD_IT_GDB=1: stacks of the processes still running (hangs).
            if p.alive() and os.environ.get("SPECD_IT_GDB") and shutil.which("gdb"):
                r = subprocess.run(["gdb", "-batch", "-p", str(p.pid), "-ex", "thread apply all bt 12"],
                                   capture_output=True, text=True, timeout=60)
                print("\n".join(l for l in r.stdout.splitlines() if l.startswith(("#", "Thread"))))

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        failed = et is not None and not issubclass(et, SystemExit)
        if failed:
            traceback.print_exception(et, ev, tb)
            self.print_logs()
        self.kill_all()
        for c in reversed(self.cleanups):
            try:
                c()
            except Exception as e:  # cleanup must go on
                print("cleanup failed: %s" % e)
        if self.zctx:
            self.zctx.destroy(linger=0)
        if failed or os.environ.get("SPECD_KEEP_LOGS"):
            print("logs kept in %s" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if failed:
            print("FAILED: %s" % ev)
            sys.exit(1)
        return False

    # ---- CurveZMQ keys (specd-keygen; net/include/specd/curve.h) ----
    def enable_curve(self, extra_names=()):
        """Makes key pairs with specd-keygen (coordinator, verifier, drafter,
        client, and extra_names, which are on no allow-list) and the
        allow-lists (clients: client; workers: verifier, drafter). From then on
        every start_* and client() of this harness uses its role's key."""
        d = os.path.join(self.tmp, "keys")
        names = ["coordinator", "verifier", "drafter", "client"] + list(extra_names)
        r = subprocess.run([self.bin("keygen"), "--dir", d] + names, capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "specd-keygen failed (%d): %s" % (r.returncode, r.stderr[-1000:]))
        self.keys = {}
        for n in names:
            with open(os.path.join(d, n + ".pub"), "rb") as f:
                public = f.read().strip()
            with open(os.path.join(d, n + ".key"), "rb") as f:
                secret = f.read().strip()
            self.keys[n] = dict(key=os.path.join(d, n + ".key"), pub=os.path.join(d, n + ".pub"),
                                public=public, secret=secret)
        with open(os.path.join(d, "clients.allow"), "w") as f:
            f.write("%s client\n" % self.keys["client"]["public"].decode())
        with open(os.path.join(d, "workers.allow"), "w") as f:  # each worker key bound to its role
            f.writelines("%s role=%s\n" % (self.keys[m]["public"].decode(), m) for m in ("verifier", "drafter"))
        self.key_dir = d
        return self.keys

    def load_keys(self, d):
        """Uses the key pairs already in directory d (specd-launch --curve d):
        every NAME.key with its NAME.pub."""
        self.keys = {}
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".key") and os.path.exists(os.path.join(d, fn[:-4] + ".pub")):
                n = fn[:-4]
                with open(os.path.join(d, n + ".pub"), "rb") as f:
                    public = f.read().strip()
                with open(os.path.join(d, n + ".key"), "rb") as f:
                    secret = f.read().strip()
                self.keys[n] = dict(key=os.path.join(d, n + ".key"), pub=os.path.join(d, n + ".pub"),
                                    public=public, secret=secret)
        self.key_dir = d
        return self.keys

    def key_args(self, name):
        """--curve-secret/--curve-server for a process holding key `name`
        (None: no keys; [] when CURVE is off)."""
        if not getattr(self, "keys", None) or name is None:
            return []
        return ["--curve-secret", self.keys[name]["key"], "--curve-server", self.keys["coordinator"]["pub"]]

    # ---- the service, one process per role ----
    def start_coordinator(self, target, extra=(), netns=None, client_host="127.0.0.1", worker_host="127.0.0.1",
                          client_addr=None):
        cport, wport = free_port(), free_port()
        self.client_addr = client_addr or "tcp://%s:%d" % (client_host, cport)
        self.worker_addr = "tcp://%s:%d" % (worker_host, wport)
        self.target = target
        keys = []
        if getattr(self, "keys", None):
            keys = ["--curve-secret", self.keys["coordinator"]["key"],
                    "--client-keys", os.path.join(self.key_dir, "clients.allow"),
                    "--worker-keys", os.path.join(self.key_dir, "workers.allow")]
        return self.start("coordinator", [self.bin("coordinator"), "--model", target,
                                          "--client-addr", self.client_addr, "--worker-addr", self.worker_addr]
                          + keys + list(extra), netns=netns)

    def start_verifier(self, target=None, extra=(), netns=None, coordinator=None, key="verifier"):
        return self.start("verifier", [self.bin("verifier"), "--model", target or self.target,
                                       "--coordinator", coordinator or self.worker_addr]
                          + self.key_args(key) + self.engine_args + list(extra), netns=netns)

    def start_drafter(self, kind, target=None, draft=None, layers=1, extra=(), netns=None, coordinator=None,
                      key="drafter"):
        """kind: 'ngram', 'model' (draft file), 'layers' (self-draft) or 'eagle' (draft: an EAGLE-3 head
        directory for target, fed the verifier's features)."""
        target = target or self.target
        if kind == "ngram":
            how = ["--ngram", "--model", target]
        elif kind == "eagle":
            how = ["--eagle", draft, "--model", target]
        elif kind == "model":
            how = ["--model", draft]
        else:
            how = ["--draft-layers", str(layers), "--model", target]
        if kind != "ngram":
            how += self.engine_args
        return self.start("drafter", [self.bin("drafter")] + how +
                          ["--coordinator", coordinator or self.worker_addr] + self.key_args(key) + list(extra),
                          netns=netns)

    def start_service(self, target, drafter="layers", draft=None, coord_extra=(), verifier_extra=(),
                      drafter_extra=(), client_addr=None):
        coord = self.start_coordinator(target, coord_extra, client_addr=client_addr)
        ver = self.start_verifier(extra=verifier_extra)
        dr = self.start_drafter(drafter, draft=draft, extra=drafter_extra) if drafter else None
        self.wait_registered(verifier=True, drafter=bool(drafter))
        return coord, ver, dr

    def client(self, addr=None, key="client", opts=None):
        """A wire client; with enable_curve it holds key `key` (None: plaintext);
        opts: {zmq option: value} set before it connects."""
        return Client(self, addr or self.client_addr, key=key, opts=opts)

    def start_gateway(self, extra=(), env=None):
        """specd-gateway on a free loopback port in front of the coordinator;
        waits (bounded) until it prints that it listens. Sets self.http_url
        ("http://127.0.0.1:PORT") and self.http_port."""
        self.http_port = free_port()
        self.http_url = "http://127.0.0.1:%d" % self.http_port
        p = self.start("gateway", [self.bin("gateway"), "--listen", "127.0.0.1:%d" % self.http_port,
                                   "--coordinator", self.client_addr] + self.key_args("client") + list(extra),
                       env=env)
        wait_until(lambda: "listening http://" in p.log_tail(20) or not p.alive(), 60, "specd-gateway to listen")
        check(p.alive(), "specd-gateway exited with status %s" % p.popen.returncode)
        return p

    def http(self, method, path, body=None, headers=None, timeout=120):
        """One HTTP request to the gateway: (status, {header: value} lower-cased, body bytes). body: bytes,
        str, or an object sent as JSON."""
        import http.client
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def workers(self, timeout=10):
        st = self.client().stats(timeout=timeout)
        return st.get("workers", []) if st else []

    def wait_registered(self, verifier=True, drafter=True, timeout=None):
        timeout = timeout or (180 if sanitized() else 60)
        c = self.client()

        def ok():
            for role, needed in (("coordinator", True), ("verifier", verifier), ("drafter", drafter)):
                p = self._latest(role) if needed else None
                check(p is None or p.alive(), "%s exited with status %s before registering"
                      % (role, p and p.popen.returncode))
            st = c.stats(timeout=1.0)
            if not st:
                return False
            alive = [w for w in st.get("workers", []) if w.get("alive")]
            v = any(w.get("role") == pb.ROLE_VERIFIER for w in alive)
            d = any(w.get("role") == pb.ROLE_DRAFTER for w in alive)
            return (v or not verifier) and (d or not drafter)
        wait_until(ok, timeout, "the workers to register (verifier=%s drafter=%s)" % (verifier, drafter))
        c.close()

    def _latest(self, name):
        same = [p for p in self.procs if p.name == name]
        return same[-1] if same else None

    # ---- the single-process reference ----
    def reference(self, model, prompt, n, temp=0.0, seed=0, ignore_eos=False, chat=False, top_p=None, history=()):
        """specd-generate's JSON for prompt; history: chat turns before it
        ({"role", "content"} dicts, passed as --message)."""
        argv = [self.bin("generate"), "-m", model, "-p", prompt, "-n", str(n), "--json", "-t", "1"] + self.engine_args
        for m in history:
            argv += ["--message", "%s:%s" % (m["role"], m["content"])]
        if temp:
            argv += ["--temp", str(temp), "--seed", str(seed)]
        if top_p is not None:
            argv += ["--top-p", str(top_p)]
        if ignore_eos:
            argv.append("--ignore-eos")
        if chat:
            argv.append("--chat")
        r = subprocess.run(argv, capture_output=True, timeout=600)
        check(r.returncode == 0, "specd-generate failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
        # Random models emit arbitrary bytes: keep them (surrogateescape) so
        # text compares byte for byte.
        out = json.loads(r.stdout.decode("utf-8", "surrogateescape"))
        out["text_bytes"] = out["text"].encode("utf-8", "surrogateescape")
        return out

    def cli_stats(self, addr=None, pump=None):
        """`specd-client --stats --json`, parsed. pump() is called while it
        runs (clients of the test must keep heartbeating meanwhile)."""
        p = subprocess.Popen([self.bin("client"), "--coordinator", addr or self.client_addr, "--stats", "--json"]
                             + self.key_args("client"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            if pump:
                pump()
            else:
                time.sleep(0.02)
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            raise TestFailure("specd-client --stats --json did not answer within 30 s")
        check(p.returncode == 0, "specd-client --stats --json failed (%d): %s" % (p.returncode, err[-1000:]))
        return json.loads(out)


class Client:
    """A DEALER on the client link speaking pbwire envelopes. Sends a
    heartbeat every interval while waiting, as libspecd-client does."""

    HEARTBEAT_S = 0.25

    def __init__(self, h, addr, key="client", opts=None):
        self.h = h
        self.sock = h.zctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        for opt, value in (opts or {}).items():
            self.sock.setsockopt(opt, value)
        keys = getattr(h, "keys", None)
        if keys and key is not None:
            self.sock.curve_secretkey = keys[key]["secret"]
            self.sock.curve_publickey = keys[key]["public"]
            self.sock.curve_serverkey = keys["coordinator"]["public"]
        self.sock.connect(addr)
        self.last_send = 0.0
        self.tag = 0

    def close(self):
        self.sock.close(0)

    def send(self, env):
        self.send_raw(pb.encode(pb.CLIENT_TO_COORD, env))

    def send_raw(self, data):
        self.sock.send(data)
        self.last_send = time.monotonic()

    def recv(self, timeout):
        """One decoded CoordinatorToClient, or None after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # Heartbeat whenever nothing was sent for an interval, also
            # while messages keep arriving.
            if time.monotonic() - self.last_send >= self.HEARTBEAT_S:
                self.send({"heartbeat": {"sent_us": int(time.time() * 1e6)}})
            if self.sock.poll(int(min(left, self.HEARTBEAT_S) * 1000) + 1):
                return pb.decode(pb.COORD_TO_CLIENT, self.sock.recv())

    def stats(self, timeout=5.0):
        self.send({"stats": {"include_workers": True}})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.recv(deadline - time.monotonic())
            if m and "stats" in m:
                return m["stats"]
        return None

    def submit(self, **fields):
        self.tag += 1
        fields["client_tag"] = self.tag
        self.send({"submit": fields})
        return self.tag

    def run(self, jobs, timeout, on_event=None):
        """Submits every job (dicts of SubmitRequest fields) at once and
        collects until each is finished or errored. Returns one result per
        job: {ids, text, finished, error, request_id, prompt_tokens}.
        on_event(msg, results) is called for every message."""
        results = {}
        order = []
        for j in jobs:
            t = self.submit(**j)
            order.append(t)
            results[t] = {"ids": [], "text": b"", "finished": None, "error": None, "request_id": None}
        by_id = {}
        deadline = time.monotonic() + timeout
        pending = set(order)
        while pending:
            left = deadline - time.monotonic()
            check(left > 0, "timed out after %.0f s with %d of %d requests unfinished" % (timeout, len(pending),
                                                                                             len(order)))
            m = self.recv(left)
            if m is None:
                continue
            if "accepted" in m:
                a = m["accepted"]
                r = results.get(a.get("client_tag", 0))
                check(r is not None, "Accepted for unknown client_tag %s" % a)
                r["request_id"] = a.get("request_id", 0)
                r["prompt_tokens"] = a.get("prompt_tokens", 0)
                by_id[r["request_id"]] = r
            elif "tokens" in m:
                c = m["tokens"]
                r = by_id.get(c.get("request_id", 0))
                check(r is not None, "tokens for unknown request %s" % c.get("request_id"))
                r["ids"] += c.get("tokens", [])
                r["text"] += c.get("text", b"")
            elif "finished" in m:
                f = m["finished"]
                r = by_id.get(f.get("request_id", 0))
                check(r is not None, "Finished for unknown request %s" % f.get("request_id"))
                r["finished"] = f
                r["text"] += f.get("text_tail", b"")
                pending.discard(next(t for t in order if results[t] is r))
            elif "error" in m:
                e = m["error"]
                r = results.get(e.get("client_tag", 0)) or by_id.get(e.get("request_id", 0))
                check(r is not None, "Error for no request of ours: %s" % e)
                r["error"] = e
                pending.discard(next(t for t in order if results[t] is r))
            if on_event:
                on_event(m, results)
        return [results[t] for t in order]


def random_prompts(n, seed, words=None):
    rng = random.Random(seed)
    words = words or ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "far", "away", "blue", "sky",
                      "river", "stone", "light", "over", "under", "green", "hill", "11", "42", "x", "zebra"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) for _ in range(n)]


def expect_equal_ids(results, refs, what):
    bad = []
    for i, (r, ref) in enumerate(zip(results, refs)):
        if r["error"]:
            bad.append("request %d: error %s" % (i, r["error"]))
        elif r["ids"] != ref["ids"]:
            k = next((j for j, (a, b) in enumerate(zip(r["ids"], ref["ids"])) if a != b),
                     min(len(r["ids"]), len(ref["ids"])))
            bad.append("request %d: first difference at token %d: service %s... vs alone %s... (lengths %d/%d)"
                       % (i, k, r["ids"][k:k + 6], ref["ids"][k:k + 6], len(r["ids"]), len(ref["ids"])))
    check(not bad, "%s: %d of %d requests differ:\n  %s" % (what, len(bad), len(results), "\n  ".join(bad[:10])))


def _on_sigterm(signum, frame):
    raise TestFailure("terminated by signal %d (a CTest timeout?)" % signum)


def main(fn):
    """Runs fn(harness) under a Harness named after the script."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    if zmq is None:
        skip("pyzmq is not installed in the test venv (pip install -r tests/ref/requirements.txt)")
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    with Harness(name) as h:
        fn(h)
    log("PASSED")
