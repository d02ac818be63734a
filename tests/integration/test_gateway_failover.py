"""The gateway fails over (issue 37): specd-gateway SIGKILLed under
specd-launch with non-streaming completions in flight through the official
`openai` client. The launcher restarts the gateway on its port; the client
retries each request its connection error cut (max_retries), and every
answer, greedy and seeded alike, equals the undisturbed run's. Tiny random
models, self-draft drafter (test_failover.start_launch)."""
import os
import signal
import threading
import time

import harness as H
import test_failover as F

try:
    import openai
except ImportError:
    openai = None

N = 8
TOKENS = 300


def ask_all(client, prompts):
    out, errors = [None] * len(prompts), []

    def one(i):
        kw = {"seed": 100 + i, "temperature": 0.8, "top_p": 0.95} if i % 2 else {"temperature": 0}
        try:
            r = client.completions.create(model="m", prompt=prompts[i], max_tokens=TOKENS,
                                          extra_body={"ignore_eos": True}, **kw)
            out[i] = r.choices[0].text
        except Exception as e:  # reported below
            errors.append("request %d: %r" % (i, e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    return threads, out, errors


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv")
    F.BINARY["gateway"] = b"specd-gateway"
    target, _ = h.tiny_models(seed=83)
    launch = F.start_launch(h, target, 1, gateway=True)
    h.http_url = "http://127.0.0.1:%d" % h.http_port
    H.wait_until(lambda: h.http("GET", "/health")[0] == 200, 60, "/health to say 200")
    client = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=10, timeout=300)
    prompts = H.random_prompts(N, seed=89)
    threads, plain, errors = ask_all(client, prompts)
    for t in threads:
        t.join(900)
    H.check(not errors and all(p is not None for p in plain), "undisturbed run: %s" % errors)
    base = F.committed(h) or 0
    threads, got, errors = ask_all(client, prompts)
    H.wait_until(lambda: (F.committed(h) or 0) - base >= N * TOKENS // 4, 600, "a quarter of the tokens")
    pid = F.role_pid(launch.pid, "gateway")
    H.check(pid, "no gateway under the launcher")
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    H.log("SIGKILL sent to the gateway (pid %d) with %d requests in flight" % (pid, N))
    for t in threads:
        t.join(900)
    H.check(not errors, "requests failed across the gateway kill: %s" % errors)
    new = F.role_pid(launch.pid, "gateway")
    H.check(new and new != pid, "the launcher did not restart the gateway")
    diff = [i for i in range(N) if got[i] != plain[i]]
    H.check(not diff, "answers across the gateway kill differ from the undisturbed run's: requests %s" % diff)
    H.log("gateway killed and restarted: %d retried answers (greedy and seeded) equal the undisturbed run's "
          "(%.1f s after the kill)" % (N, time.monotonic() - t0))


if __name__ == "__main__":
    H.main(run)
