"""64 concurrent streaming clients through specd-gateway, under
specd-launch on SmolLM2 with a self-draft drafter (its first layer) and K
fixed (4 by default), so every step drafts:

- every stream (the official openai client, one thread each) ends with
  exactly specd-generate's greedy text for its prompt (each distinct
  prompt's reference computed once), finish_reason "length", and usage
  counts equal to specd-generate's prompt and generated tokens;
- with --kill-drafter, the drafter is SIGKILLed once a quarter of the
  tokens are committed; nothing is lost (the same checks), the launcher
  restarts it, and /metrics shows the killed drafter down
  (specd_worker_up 0 under its worker id) and a new one up;
- /metrics: 64 HTTP 200s and 64 requests finished by length more than
  before, generated tokens equal to the usage sums, and the coordinator's
  speculation series consistent (test_gateway_load.check_spec_metrics,
  drafts required).

  test_gateway_streams.py [--kill-drafter] [--clients 64] [--tokens 12] [--k 4] [--prompts 8]

Prompts and max_tokens are short (ignore_eos, so each stream generates
exactly max_tokens): under ASan a prompt token costs about what a generated
one does."""
import argparse
import concurrent.futures
import os
import signal
import time

import harness as H
from test_failover import committed, role_pid, start_launch
from test_gateway_load import check_spec_metrics, labelled, metrics, value

try:
    import openai
except ImportError:
    openai = None
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    text_string_to_metric_families = None

PROMPTS = ["The capital of France is", "Three colors:", "1, 2, 3,", "The sea is", "My favourite food is",
           "Once upon a time", "Water boils at", "The best way to learn is"]
MAX_K = 8  # the coordinator's default --max-k (K is fixed below it)


def drafters_up(m):
    """{worker id: up} of the drafters /metrics lists."""
    return {dict(k[1])["worker"]: v for k, v in m.items()
            if k[0] == "specd_worker_up" and dict(k[1]).get("role") == "drafter"}


def run(h, args):
    if openai is None or text_string_to_metric_families is None:
        H.skip("openai or prometheus_client is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    prompts = PROMPTS[:args.prompts]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        refs = list(pool.map(lambda p: h.reference(model, p, args.tokens, ignore_eos=True), prompts))
    H.log("computed %d references" % len(refs))
    launch = start_launch(h, model, 1, gateway=True,
                          extra=["--coordinator-arg", "--default-k", "--coordinator-arg", str(args.k)])
    h.http_url = "http://127.0.0.1:%d" % h.http_port
    H.wait_until(lambda: h.http("GET", "/health")[0] == 200, 60, "/health to say 200")
    before = metrics(h)
    up0 = {w for w, v in drafters_up(before).items() if v == 1}
    H.check(len(up0) == 1, "metrics: drafters up before the run: %s" % drafters_up(before))
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=600)

    def stream(i):
        chunks = list(cl.completions.create(
            model="specd", prompt=prompts[i % len(prompts)], temperature=0, max_tokens=args.tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        fins = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return text, fins, chunks[-1].usage

    total = args.clients * args.tokens
    base = committed(h) or 0
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        futs = [pool.submit(stream, i) for i in range(args.clients)]
        if args.kill_drafter:
            H.wait_until(lambda: (committed(h) or 0) - base >= total // 4 or all(f.done() for f in futs), 600,
                         "a quarter of the tokens to be committed")
            H.check(not all(f.done() for f in futs), "the streams finished before the drafter could be killed")
            pid = role_pid(launch.pid, "drafter")
            H.check(pid, "no running drafter under the launcher")
            done = (committed(h) or 0) - base
            os.kill(pid, signal.SIGKILL)
            H.log("SIGKILL sent to the drafter (pid %d) after %d of %d tokens" % (pid, done, total))
        res = [f.result() for f in futs]
    H.log("%d concurrent streams in %.1f s" % (args.clients, time.monotonic() - t0))

    bad = []
    for i, (text, fins, usage) in enumerate(res):
        ref = refs[i % len(prompts)]
        if text != ref["text"] or fins != ["length"] or usage is None or \
                usage.completion_tokens != len(ref["ids"]) or usage.prompt_tokens != len(ref["prompt_ids"]) or \
                usage.total_tokens != len(ref["ids"]) + len(ref["prompt_ids"]):
            bad.append("client %d: %r %s (%s) vs specd-generate %r (%d + %d tokens)"
                       % (i, text, fins, usage, ref["text"], len(ref["prompt_ids"]), len(ref["ids"])))
    H.check(not bad, "%d of %d streams differ from specd-generate:\n  %s"
            % (len(bad), args.clients, "\n  ".join(bad[:16])))
    H.log("all %d streams equal specd-generate's greedy text and usage" % args.clients)

    if args.kill_drafter:
        # the killed drafter's entry stays, down; the launcher's new one registers
        def replaced():
            m = metrics(h)
            up = drafters_up(m)
            return m if all(up.get(w) == 0 for w in up0) and any(v == 1 for w, v in up.items() if w not in up0) \
                else None
        after = H.wait_until(replaced, 120, "/metrics to show the killed drafter down and a new one up")
        H.log("drafters in /metrics after the kill: %s (before: up %s)" % (drafters_up(after), sorted(up0)))
    else:
        after = metrics(h)
        H.check(drafters_up(after) == drafters_up(before), "metrics: drafters %s, before %s"
                % (drafters_up(after), drafters_up(before)))
    d = lambda name, **kw: value(after, name, **kw) - value(before, name, **kw)
    H.check(d("specd_gateway_http_requests_total", route="/v1/completions", code="200") == args.clients,
            "metrics: completions 200s %s" % labelled(after, "specd_gateway_http_requests_total", "code"))
    H.check(d("specd_request_finished_total", finished_reason="length") == args.clients,
            "metrics: %s requests finished by length, expected %d"
            % (d("specd_request_finished_total", finished_reason="length"), args.clients))
    gen = sum(u.completion_tokens for _, _, u in res)
    H.check(d("specd_generation_tokens_total") == gen, "metrics: %s generated tokens, the responses say %d"
            % (d("specd_generation_tokens_total"), gen))
    check_spec_metrics(h, after, MAX_K, need_drafts=True)
    H.check(launch.alive(), "specd-launch exited (%s)" % launch.popen.returncode)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-drafter", action="store_true")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--k", type=int, default=4, choices=range(1, MAX_K + 1), help="the coordinator's fixed K")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1),
                    help="distinct prompts")
    a = ap.parse_args()
    H.main(lambda h: run(h, a))
