"""specd-gateway under load and when clients leave, on SmolLM2 with the
n-gram drafter (the coordinator's adaptive K):

- 16 concurrent streaming completion clients (the official openai client,
  one thread each) get exactly specd-generate's text and token counts
  (short prompts: under ASan a prompt token costs as much as a generated
  one, and chat prompts carry a 30-token system prompt);
- /metrics parses with prometheus_client's text parser, and its counters
  moved by what the 16 requests did: generation and prompt tokens equal the
  sum of their usage, drafted >= accepted (the gateway's sums over its
  finished requests equal the coordinator's counters),
  16 HTTP 200s on the completions route, the verifier and the drafter up;
  the coordinator's speculation series agree with each other and with
  specd-client --stats (check_spec_metrics: per-position acceptance
  non-increasing and adding up to the totals, goodput in [1, K + 1]);
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
MAX_K = 8  # the coordinator's default --max-k


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


def labelled(m, name, label):
    """{label value: sample value} of the series of name."""
    return {dict(k[1]).get(label): v for k, v in m.items() if k[0] == name}


def check_spec_metrics(h, m, max_k, need_drafts):
    """The coordinator's speculative-decoding series on one scrape m (counted
    since it started, so they must agree with each other exactly):
    per-position accepted counts are non-increasing and at most the drafts
    at that position, they add up to the totals, every drafted step offers
    position 0, committed tokens per verify step lie in [1, max_k + 1], the
    two gauges are the ratios of the counters, and specd-client --stats
    shows the same numbers. need_drafts: some drafts must have been made."""
    pd = labelled(m, "specd_spec_decode_num_draft_tokens_per_pos_total", "position")
    pa = labelled(m, "specd_spec_decode_num_accepted_tokens_per_pos_total", "position")
    want = {str(i) for i in range(max_k)}
    H.check(set(pd) == want and set(pa) == want, "metrics: positions %s / %s, expected 0..%d"
            % (sorted(pd), sorted(pa), max_k - 1))
    pd = [pd[str(i)] for i in range(max_k)]
    pa = [pa[str(i)] for i in range(max_k)]
    drafted = value(m, "specd_spec_decode_num_draft_tokens_total")
    accepted = value(m, "specd_spec_decode_num_accepted_tokens_total")
    drafts = value(m, "specd_spec_decode_num_drafts_total")
    steps = value(m, "specd_spec_decode_verify_steps_total")
    batches = value(m, "specd_verify_batches_total")
    committed = value(m, "specd_coordinator_committed_tokens_total")
    what = ("drafted %s accepted %s per position, totals %s / %s, %s drafted steps of %s verify steps in %s batches, "
            "%s tokens committed" % (pd, pa, drafted, accepted, drafts, steps, batches, committed))
    H.check(all(pa[i] >= pa[i + 1] for i in range(max_k - 1)), "metrics: accepted per position increases: " + what)
    H.check(all(a <= d for a, d in zip(pa, pd)), "metrics: more accepted than drafted at a position: " + what)
    H.check(sum(pa) == accepted and sum(pd) == drafted, "metrics: positions do not add up to the totals: " + what)
    H.check(drafted >= accepted and pd[0] == drafts <= steps and drafted <= drafts * max_k,
            "metrics: drafts inconsistent: " + what)
    H.check(steps > 0 and 0 < batches <= steps and 1 <= committed / steps <= max_k + 1,
            "metrics: committed tokens per verify step out of [1, %d]: %s" % (max_k + 1, what))
    if need_drafts:
        H.check(drafted > 0 and drafts > 0, "metrics: no drafts were verified: " + what)
    near = lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b))
    H.check(near(value(m, "specd_spec_decode_goodput"), committed / steps) and
            near(value(m, "specd_spec_decode_mean_accepted_length"), accepted / drafts if drafts else 0.0),
            "metrics: gauges goodput %s, mean accepted length %s for %s"
            % (value(m, "specd_spec_decode_goodput"), value(m, "specd_spec_decode_mean_accepted_length"), what))
    st = h.cli_stats()
    cli = (st.get("draft_tokens_per_pos"), st.get("accepted_tokens_per_pos"), st.get("draft_tokens"),
           st.get("accepted_tokens"), st.get("drafts"), st.get("seq_verify_steps"), st.get("committed_tokens"))
    H.check(cli == (pd, pa, drafted, accepted, drafts, steps, committed),
            "specd-client --stats says %s, /metrics %s" % (cli, what))
    H.log("speculation metrics consistent: " + what)
    return drafted, accepted


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
    drafted, accepted = d("specd_gateway_draft_tokens_total"), d("specd_gateway_accepted_tokens_total")
    H.check(drafted >= accepted >= 0, "metrics: drafted %s, accepted %s" % (drafted, accepted))
    H.check(drafted == d("specd_spec_decode_num_draft_tokens_total") and
            accepted == d("specd_spec_decode_num_accepted_tokens_total"),
            "metrics: the gateway's finished requests drafted %s, accepted %s; the coordinator counted %s, %s"
            % (drafted, accepted, d("specd_spec_decode_num_draft_tokens_total"),
               d("specd_spec_decode_num_accepted_tokens_total")))
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
    check_spec_metrics(h, after, MAX_K, need_drafts=False)  # adaptive K may choose not to draft at all
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
