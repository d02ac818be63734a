"""One role of the service killed (SIGKILL) or hung (SIGSTOP for longer
than the liveness period) mid-generation, under specd-launch, with N
requests in flight through specd-client --jobs (libspecd-client): every
request finishes, greedy ones with exactly specd-generate's ids, seeded
sampled ones with exactly the undisturbed run's ids (and, at TP = 1, with
seeded specd-generate's: coupled verification makes seeded output a
function of (seed, prompt) alone).

  test_failover.py --role coordinator|drafter|verifier|rank [--signal kill|stop] [--n 32] [--tokens 96]
                   [--repeat R]
  test_failover.py --role coordinator --gateway   (a seeded SSE stream through specd-gateway instead)

Roles: the coordinator (restarted by the launcher on the same ports; the
client resubmits its requests as continuations, the workers register
again), the drafter, the verifier (TP = 1), a rank of a TP = 2 group (rank
1; the launcher restarts the group). For the coordinator the test also
measures the time from the signal to the first token the restarted (or
resumed) coordinator commits, printed as "first token after failover:
X.XX s", and with --repeat R (R disturbed runs) their median
(bench/results/chaos-cpu.md).

Tiny random models, self-draft drafter, K fixed at 4 so drafts are
verified. The stopped process gets SIGCONT after STOP_S (liveness is 2 s)."""
import argparse
import json
import os
import signal
import subprocess
import time

import harness as H
from harness import children, cmdline, running  # noqa: F401 (test_chaos uses them through test_failover)

STOP_S = 5.0
BINARY = {"coordinator": b"specd-coordinator", "drafter": b"specd-drafter", "verifier": b"specd-verifier",
          "rank": b"specd-verifier"}


def role_pid(launch_pid, role):
    """The pid of the launcher's child playing role (rank 1 for 'rank'), or None."""
    for k in children(launch_pid):
        argv = cmdline(k)
        if not argv or not argv[0].endswith(BINARY[role]) or not running(k):
            continue
        rank = int(argv[argv.index(b"--rank") + 1]) if b"--rank" in argv else 0
        if role == "rank" and rank != 1:
            continue
        if role == "verifier" and rank != 0:
            continue
        return k
    return None


def start_launch(h, target, tp, gateway=False, extra=()):
    """specd-launch of target with a 1-layer self-draft drafter and K fixed
    at 4; extra: more specd-launch arguments (later ones win)."""
    cport, wport, gport = H.free_port(), H.free_port(), H.free_port()
    h.client_addr = "tcp://127.0.0.1:%d" % cport
    argv = [h.bin("launch"), "--target", target, "--draft-layers", "1", "--tp", str(tp),
            "--client-addr", h.client_addr, "--worker-addr", "tcp://127.0.0.1:%d" % wport,
            "--group-addr", "tcp://127.0.0.1:%d" % gport, "--threads-verifier", "1", "--threads-drafter", "1",
            "--ready-timeout", "300"]
    if gateway:
        h.http_port = H.free_port()
        argv += ["--http", "127.0.0.1:%d" % h.http_port]
    else:
        argv.append("--no-gateway")
    for a in H.FIXED_K:
        argv += ["--coordinator-arg", a]
    argv += list(extra)
    launch = h.start("launch", argv)
    H.wait_until(lambda: ("ready %s" % h.client_addr) in launch.log_tail(400) or not launch.alive(), 300,
                 "specd-launch to print ready")
    H.check(launch.alive(), "specd-launch exited (%s) before ready" % launch.popen.returncode)
    return launch


def committed(h):
    """The coordinator's committed-token counter, or None when it does not answer."""
    c = h.client()
    try:
        st = c.stats(timeout=0.5)
        return int(st.get("committed_tokens", 0)) if st else None
    finally:
        c.close()


def run_jobs(h, path, out, disturb=None):
    """specd-client --jobs; disturb(proc) is called while it runs. Returns the results in input order."""
    p = subprocess.Popen([h.bin("client"), "--coordinator", h.client_addr, "--jobs", path, "--out", out,
                          "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if disturb:
            disturb(p)
        _, err = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    H.check(p.returncode == 0, "specd-client --jobs exited %d: %s" % (p.returncode, err[-3000:]))
    with open(out) as f:
        return [json.loads(l) for l in f if l.strip()]


def compare(res, refs, what):
    bad = []
    for i, (r, ref) in enumerate(zip(res, refs)):
        if r.get("ids") != ref:
            got = r.get("ids") or []
            k = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
            bad.append("job %d: %s; first difference at token %d (lengths %d/%d)"
                       % (i, r.get("error") or r.get("status") or "", k, len(got), len(ref)))
    H.check(len(res) == len(refs), "%s: %d results for %d jobs" % (what, len(res), len(refs)))
    H.check(not bad, "%s: %d of %d jobs differ:\n  %s" % (what, len(bad), len(refs), "\n  ".join(bad[:10])))


def run_gateway(h, args):
    """A seeded completion streamed (SSE) through specd-gateway while the
    coordinator is SIGKILLed: the stream goes on (the gateway is a
    libspecd-client) and its text equals the undisturbed answer."""
    import threading
    import test_gateway_http as G
    target, _ = h.tiny_models(seed=61)
    launch = start_launch(h, target, 1, gateway=True)
    H.wait_until(lambda: h.http("GET", "/health")[0] == 200, 60, "/health to say 200")
    req = {"model": "m", "prompt": "the cat sat on", "max_tokens": 1500, "temperature": 0.8, "top_p": 0.95,
           "seed": 5, "ignore_eos": True}
    st, _, body = h.http("POST", "/v1/completions", req)
    H.check(st == 200, "undisturbed completion: %d %s" % (st, body))
    plain = json.loads(body)["choices"][0]["text"]
    got = {}

    def stream():
        got["raw"] = G.raw_request(h.http_port, "POST", "/v1/completions", json.dumps(dict(req, stream=True)).encode(),
                                   timeout=300)
    t = threading.Thread(target=stream)
    base = committed(h) or 0
    t.start()
    H.wait_until(lambda: (committed(h) or 0) - base >= 200, 300, "200 tokens of the stream")
    pid = role_pid(launch.pid, "coordinator")
    os.kill(pid, signal.SIGKILL)
    H.log("SIGKILL sent to the coordinator (pid %d) mid-stream" % pid)
    t.join(600)
    H.check("raw" in got, "the stream did not end")
    head, _, rest = got["raw"].partition(b"\r\n\r\n")
    H.check(head.startswith(b"HTTP/1.1 200"), "status %r" % head[:40])
    sse = G.dechunk(rest)
    H.check(sse.endswith(b"data: [DONE]\n\n"), "the stream does not end with [DONE]: %r" % sse[-200:])
    chunks = [json.loads(e[len(b"data: "):]) for e in sse.split(b"\n\n")[:-2]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    fins = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    H.check(fins == ["length"], "finish reasons %s" % fins)
    H.check(text == plain, "the stream across the coordinator kill differs from the undisturbed answer "
            "(%d vs %d characters; first difference at %d)" % (len(text), len(plain),
                                                            next((i for i, (a, b) in enumerate(zip(text, plain))
                                                                  if a != b), min(len(text), len(plain)))))
    H.log("gateway stream across a coordinator kill: %d characters, equal to the undisturbed answer" % len(text))


def run(h, args):
    if args.gateway:
        return run_gateway(h, args)
    tp = 2 if args.role == "rank" else 1
    target, _ = h.tiny_models(seed=61)
    prompts = H.random_prompts(args.n, seed=67)
    jobs, refs = [], []
    for i, p in enumerate(prompts):
        job = {"id": i, "prompt": p, "n": args.tokens, "ignore_eos": True}
        if i % 2:
            job.update(temp=0.8, top_p=0.95, seed=1000 + i)
            refs.append(h.reference(target, p, args.tokens, temp=0.8, seed=1000 + i, ignore_eos=True,
                                    top_p=0.95)["ids"])
        else:
            refs.append(h.reference(target, p, args.tokens, ignore_eos=True)["ids"])
        jobs.append(job)
    path = os.path.join(h.tmp, "jobs.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps(j) + "\n" for j in jobs))
    launch = start_launch(h, target, tp)

    undisturbed = run_jobs(h, path, os.path.join(h.tmp, "out0.jsonl"))
    greedy = [i for i in range(args.n) if i % 2 == 0]
    compare([undisturbed[i] for i in greedy], [refs[i] for i in greedy], "undisturbed greedy jobs vs specd-generate")
    if tp == 1:
        compare(undisturbed, refs, "undisturbed jobs vs specd-generate (greedy and seeded)")
    H.log("undisturbed run: every job as expected")

    total = args.n * args.tokens
    state = {}

    def disturb(proc):
        base = committed(h) or 0
        H.wait_until(lambda: (committed(h) or 0) - base >= total // 4 or proc.poll() is not None, 600,
                     "a quarter of the tokens to be committed")
        H.check(proc.poll() is None, "the jobs finished before the %s could be signalled" % args.role)
        pid = role_pid(launch.pid, args.role)
        H.check(pid, "no running %s under the launcher" % args.role)
        state["workers"] = (role_pid(launch.pid, "drafter"), role_pid(launch.pid, "verifier"))
        sig = signal.SIGKILL if args.signal == "kill" else signal.SIGSTOP
        before = committed(h) or 0
        t0 = time.monotonic()
        os.kill(pid, sig)
        H.log("%s sent to the %s (pid %d) after %d of %d tokens" % (sig.name, args.role, pid, before - base, total))
        if sig == signal.SIGSTOP:
            time.sleep(STOP_S)
            os.kill(pid, signal.SIGCONT)
            H.log("SIGCONT to the %s after %.1f s" % (args.role, STOP_S))
        if args.role == "coordinator":
            # The first token the new (or resumed) coordinator commits: its
            # counter starts again from 0 after a restart, or moves past
            # `before` after a stop.
            def moved():
                n = committed(h)
                return n is not None and (n > before or (args.signal == "kill" and n > 0))
            H.wait_until(moved, 300, "a token committed after the failover", interval=0.01)
            state["first_token_s"] = time.monotonic() - t0
            H.log("first token after failover: %.2f s" % state["first_token_s"])

    times = []
    for rep in range(args.repeat):
        res = run_jobs(h, path, os.path.join(h.tmp, "out%d.jsonl" % (rep + 1)), disturb)
        compare([res[i] for i in greedy], [refs[i] for i in greedy],
                "greedy jobs across a %s %s vs specd-generate" % (args.role, args.signal))
        compare(res, [r.get("ids") for r in undisturbed],
                "jobs across a %s %s vs the undisturbed run" % (args.role, args.signal))
        if "first_token_s" in state:
            times.append(state.pop("first_token_s"))
        if args.role == "coordinator":
            # the workers registered with the new coordinator without a restart of their own
            now = (role_pid(launch.pid, "drafter"), role_pid(launch.pid, "verifier"))
            H.check(now == state["workers"], "the workers were restarted (pids %s, before %s)"
                    % (now, state["workers"]))
    if times:
        H.log("first token after failover over %d runs: median %.2f s (%s)"
              % (len(times), sorted(times)[len(times) // 2], ", ".join("%.2f" % t for t in times)))
    H.check(launch.alive(), "specd-launch exited (%s)" % launch.popen.returncode)
    if args.role == "coordinator" and args.signal == "kill":
        H.check("coordinator" in launch.log_tail(400) and "restarted" in launch.log_tail(400),
                "the launcher did not report restarting the coordinator")
    H.log("all %d jobs across a %s %s match (%d greedy vs specd-generate, all vs the undisturbed run)"
          % (args.n, args.role, args.signal, len(greedy)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=sorted(BINARY), required=True)
    ap.add_argument("--signal", choices=("kill", "stop"), default="kill")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--gateway", action="store_true", help="a stream through specd-gateway (coordinator kill)")
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
