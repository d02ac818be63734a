"""specd-gateway under load and when clients leave, on SmolLM2 with the
n-gram drafter (the coordinator's adaptive K):

- 16 concurrent streaming completion clients (the official openai client,
  one thread each) get exactly specd-generate's text and token counts
  (short prompts: under ASan a prompt token costs as much as a generated
  one, and chat prompts carry a 30-token system prompt);
- /metrics parses with prometheus_client's text parser, and its counters
  moved by what the 16 requests did: generation and prompt tokens equal the
  sum of their usage, drafted >= accepted,
  16 HTTP 200s on the completions route, the verifier and the drafter up;
- a client that disconnects mid-stream, and one that disconnects while
  waiting for a non-streamed answer, have their requests cancelled: the
  coordinator shows no request active and every KV block free again on
  verifier and drafter, and /metrics counts two cancelled requests;
- the service keeps serving afterwards."""
import concurrent.futures
import json
import socket
import time

import harness as H
from test_cancel import worker_blocks

try:
    import openai
except ImportError:
    openai = None
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    text_string_to_metric_families = None

PROMPTS = ["The capital of France is", "Three colors:", "1, 2, 3,", "The sea is"]
CLIENTS = 16
TOKENS = 8


def metrics(h):
    st, hdrs, body = h.http("GET", "/metrics")
    H.check(st == 200 and hdrs.get("content-type", "").startswith("text/plain; version=0.0.4"),
            "/metrics: %d %s" % (st, hdrs))
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def open_stream(h, body):
    """A raw streaming request; returns the socket once the first event arrived."""
    s = socket.create_connection(("127.0.0.1", h.http_port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % len(data)).encode() + data)
    got = b""
    while b"data: " not in got:
        b = s.recv(4096)
        H.check(b, "the stream closed before its first event: %r" % got)
        got += b
    return s


def run(h):
    if openai is None or text_string_to_metric_families is None:
        H.skip("openai or prometheus_client is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        refs = list(pool.map(lambda p: h.reference(model, p, TOKENS), PROMPTS))
    H.log("computed %d references" % len(refs))
    h.start_service(model, drafter="ngram")
    h.start_gateway()
    before = metrics(h)
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)

    def stream(i):
        chunks = list(cl.completions.create(
            model="specd", prompt=PROMPTS[i % len(PROMPTS)], temperature=0, max_tokens=TOKENS, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        return text, chunks[-1].usage
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        res = list(pool.map(stream, range(CLIENTS)))
    H.log("%d concurrent streams in %.1f s" % (CLIENTS, time.monotonic() - t0))
    bad = []
    for i, (text, usage) in enumerate(res):
        ref = refs[i % len(PROMPTS)]
        if text != ref["text"] or usage.completion_tokens != len(ref["ids"]) or \
                usage.prompt_tokens != len(ref["prompt_ids"]):
            bad.append("client %d: %r (%s) vs specd-generate %r (%d + %d tokens)"
                       % (i, text, usage, ref["text"], len(ref["prompt_ids"]), len(ref["ids"])))
    H.check(not bad, "%d of %d streams differ from specd-generate:\n  %s" % (len(bad), CLIENTS, "\n  ".join(bad)))

    after = metrics(h)
    d = lambda name, **kw: value(after, name, **kw) - value(before, name, **kw)
    gen = sum(u.completion_tokens for _, u in res)
    prompt = sum(u.prompt_tokens for _, u in res)
    H.check(d("specd_generation_tokens_total") == gen and d("specd_prompt_tokens_total") == prompt,
            "metrics: generation %s / prompt %s tokens, the responses say %d / %d"
            % (d("specd_generation_tokens_total"), d("specd_prompt_tokens_total"), gen, prompt))
    drafted, accepted = d("specd_spec_decode_num_draft_tokens_total"), d("specd_spec_decode_num_accepted_tokens_total")
    H.check(drafted >= accepted >= 0, "metrics: drafted %s, accepted %s" % (drafted, accepted))
    H.check(d("specd_gateway_http_requests_total", route="/v1/completions", code="200") == CLIENTS,
            "metrics: completions 200s %s" % d("specd_gateway_http_requests_total", route="/v1/completions",
                                               code="200"))
    finished = sum(d("specd_request_finished_total", finished_reason=r) for r in ("stop", "length"))
    H.check(finished == CLIENTS, "metrics: %s requests finished, expected %d" % (finished, CLIENTS))
    H.check(d("specd_time_to_first_token_seconds_count") == CLIENTS, "metrics: TTFT observations")
    up = {k[1]: v for k, v in after.items() if k[0] == "specd_worker_up"}
    H.check(sorted(dict(l)["role"] for l, v in up.items() if v == 1) == ["drafter", "verifier"],
            "metrics: workers up %s" % up)
    H.check(value(after, "specd_coordinator_up") == 1, "metrics: coordinator not up")
    H.log("metrics moved as expected: %d generated tokens, drafted %d, accepted %d" % (gen, drafted, accepted))

    # ---- clients that leave: a stream, and a non-streamed request
    all_free = lambda b: all(b[r][0] == b[r][1] and b[r][2] == 0 for r in ("verifier", "drafter"))
    idle = H.wait_until(lambda: (lambda b: b if all_free(b) else None)(worker_blocks(h)), 30,
                        "the workers to report every KV block free after the streams")
    long_req = {"model": "specd", "messages": [{"role": "user", "content": "Tell me a long story."}],
                "temperature": 0, "max_tokens": 4000, "ignore_eos": True}
    s1 = open_stream(h, dict(long_req, stream=True))
    s2 = socket.create_connection(("127.0.0.1", h.http_port), timeout=120)
    data = json.dumps(long_req).encode()
    s2.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n\r\n" % len(data)).encode() + data)
    H.wait_until(lambda: value(metrics(h), "specd_gateway_requests_running") == 2, 30,
                 "the gateway to have both long requests in flight")
    busy = H.wait_until(lambda: (lambda b: b if b["verifier"][2] >= 2 else None)(worker_blocks(h)), 60,
                        "both long requests to hold KV blocks on the verifier")
    H.log("busy: %s (idle %s)" % (busy, idle))
    s1.close()
    s2.close()
    H.wait_until(lambda: all_free(worker_blocks(h)), 30, "every KV block free again after the clients left")
    st = h.cli_stats()
    H.check(st.get("active_requests", 0) == 0 and st.get("queued_requests", 0) == 0,
            "the coordinator still has requests: %s" % {k: st.get(k) for k in ("active_requests", "queued_requests")})
    H.wait_until(lambda: value(metrics(h), "specd_request_finished_total", finished_reason="cancelled") == 2, 10,
                 "/metrics to count the two cancelled requests")
    H.log("both requests cancelled, blocks free: %s" % worker_blocks(h))
    r = cl.completions.create(model="specd", prompt=PROMPTS[0], temperature=0, max_tokens=TOKENS)
    H.check(r.choices[0].text == refs[0]["text"], "after the disconnects: %r" % r.choices[0].text)


if __name__ == "__main__":
    H.main(run)
