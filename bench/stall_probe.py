#!/usr/bin/env python3
"""The longest stall of a running stream under a burst of new requests,
through the HTTP gateway.

Usage: stall_probe.py [--url http://127.0.0.1:8000] [-n 64] [--tokens 32]
                      [--prompts bench/prompts/chat.txt] [--api-key KEY] [--top 5]

Starts N streaming chat requests (greedy, EOS ignored), one Python thread
each, as fast as the threads come up: the first reach the coordinator a few
tens of milliseconds before the last, as requests from separate clients do,
unlike specd-bench http's, which one curl multi handle submits within a
millisecond. Every text event is timed on arrival. Prints the longest gaps
between two text events of one stream (stream, event index, when), and the
time to first token p50 / max. A scheduler that puts all waiting prompts'
prefill into one step shows here as a stall of the first streams as long as
that step (bench/results/http-cpu.md, session 30)."""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def stream(url, headers, prompt, tokens, out, i):
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = json.dumps({"model": "specd", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True})
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    if r.status != 200:
        out[i] = ("HTTP %d: %s" % (r.status, r.read()[:200]), t0, [])
        return
    events = []
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        j = json.loads(data)
        ch = j["choices"][0] if j.get("choices") else None
        if ch and ch.get("delta", {}).get("content"):
            events.append(time.monotonic())
    out[i] = (None, t0, events)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", type=int, default=64, help="concurrent streams")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", default="bench/prompts/chat.txt")
    ap.add_argument("--api-key")
    ap.add_argument("--top", type=int, default=5, help="longest gaps to list")
    a = ap.parse_args()
    prompts = [l.strip() for l in open(a.prompts) if l.strip()]
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key
    out = {}
    threads = [threading.Thread(target=stream, args=(a.url, headers, prompts[i % len(prompts)], a.tokens, out, i))
               for i in range(a.n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [(i, e) for i, (e, _, _) in out.items() if e]
    if errors:
        raise SystemExit("stall_probe: %d of %d requests failed, e.g. stream %d: %s" % (len(errors), a.n, *errors[0]))
    start = min(t0 for _, t0, _ in out.values())
    gaps, ttft = [], []
    for i, (_, t0, ev) in out.items():
        if ev:
            ttft.append(ev[0] - t0)
        gaps += [(ev[k] - ev[k - 1], i, k, ev[k - 1] - start) for k in range(1, len(ev))]
    gaps.sort(reverse=True)
    print("%d streams, %d text events; time to first token p50 %.3f s, max %.3f s"
          % (a.n, sum(len(ev) for _, _, ev in out.values()), statistics.median(ttft), max(ttft)))
    for g, i, k, at in gaps[:a.top]:
        print("longest stall %.3f s: stream %d, before its text event %d, from %.2f s after the first submit"
              % (g, i, k + 1, at))


if __name__ == "__main__":
    main()
