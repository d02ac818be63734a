#!/usr/bin/env python3
"""The prefix cache through the HTTP API (issue 34): time to first token per
turn of multi-turn chats, and of requests sharing one long system prompt,
with and without the verifiers' prefix cache.

Usage:
  prefix_bench.py --url http://127.0.0.1:8000 [--label NAME]
      measures the service already running there;
  prefix_bench.py --launch build/deploy/specd-launch --target MODEL.gguf
                  [--cache 50,0] [--launch-arg ARG ...]
      starts one service per --cache value (specd-verifier --prefix-cache
      PCT; 0: no cache), measures it, stops it: the same workload with and
      without the cache in one run.

Workloads (greedy, EOS ignored, streaming, so every first text event is
timed):
  chat:   --conversations (4) conversations at once, --turns (8) turns each;
          turn t sends the whole history (every earlier user message and
          the assistant's answer, as a chat client does) plus a new user
          message of about --turn-words words; --answer tokens per answer.
  system: --requests (32) requests, --concurrency (4) at a time, each one
          shared system prompt of about --system-tokens (1000) tokens and a
          short distinct question.

Reports per configuration: time to first token p50 per chat turn (turn 1
computes everything, later turns find their history cached), the system
workload's p50, completion tokens per second over each workload, and the
hit rate from the gateway's /metrics (specd_prefix_cache_*: hit tokens /
looked-up tokens over the run). Figures on a loaded machine are noisy."""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

WORDS = ("river mountain lantern copper orchard violet harbor meadow falcon quartz cedar tundra beacon velvet "
         "glacier saffron canyon ember willow prism marble thistle cobalt lagoon juniper").split()


def words(seed, n):
    """n pseudo-random words from seed (distinct text per seed)."""
    out, x = [], seed * 2654435761 % 4294967296 + 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        out.append(WORDS[x % len(WORDS)])
    return " ".join(out)


def chat(url, headers, messages, max_tokens):
    """One streaming request: (time to first text event s, text, completion tokens, prompt tokens)."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=1200)
    body = json.dumps({"model": "specd", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    ttft, text, n_tokens, n_prompt = None, [], 0, 0
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            n_tokens = ev["usage"].get("completion_tokens", n_tokens)
            n_prompt = ev["usage"].get("prompt_tokens", n_prompt)
        for ch in ev.get("choices", []):
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.monotonic() - t0
                text.append(piece)
    c.close()
    return ttft if ttft is not None else float("nan"), "".join(text), n_tokens, n_prompt


def metrics(url, headers):
    """(looked-up tokens, hit tokens) summed over the verifier groups, from /metrics."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
    c.request("GET", "/metrics", headers=headers)
    text = c.getresponse().read().decode("utf-8", "replace")
    c.close()

    def total(name):
        return sum(float(m.group(1)) for m in re.finditer(r"^%s\{[^}]*\} (\S+)$" % name, text, re.M))

    return total("specd_prefix_cache_query_tokens_total"), total("specd_prefix_cache_hit_tokens_total")


def run_chat(a, headers):
    """ttft[turn] lists, completion tokens, wall s."""
    ttft = [[] for _ in range(a.turns)]
    prompt = [[] for _ in range(a.turns)]
    counts = [0] * a.conversations
    errors = []

    def conversation(ci):
        msgs = [{"role": "system", "content": "You are a helpful assistant. Conversation %d." % ci}]
        try:
            for t in range(a.turns):
                msgs.append({"role": "user", "content": words(1000 * ci + t, a.turn_words)})
                first, text, n, n_prompt = chat(a.url, headers, msgs, a.answer)
                ttft[t].append(first)
                prompt[t].append(n_prompt)
                counts[ci] += n
                msgs.append({"role": "assistant", "content": text})
        except Exception as e:  # reported, the run goes on
            errors.append("conversation %d: %s" % (ci, e))

    t0 = time.monotonic()
    threads = [threading.Thread(target=conversation, args=(i,)) for i in range(a.conversations)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return ttft, prompt, sum(counts), time.monotonic() - t0, errors


def run_system(a, headers):
    system = words(7, a.system_tokens)  # these words are about one token each
    ttft, count, errors, lock, prompt = [], [0], [], threading.Lock(), []
    next_i = [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= a.requests:
                return
            msgs = [{"role": "system", "content": system},
                    {"role": "user", "content": "Question %d: %s?" % (i, words(50 + i, 8))}]
            try:
                first, _, n, n_prompt = chat(a.url, headers, msgs, a.answer)
                with lock:
                    ttft.append(first)
                    prompt.append(n_prompt)
                    count[0] += n
            except Exception as e:
                errors.append("request %d: %s" % (i, e))

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return ttft, prompt, count[0], time.monotonic() - t0, errors


def p50(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def measure(a, label):
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key
    q0, h0 = metrics(a.url, headers)
    ttft, prompt, n_chat, s_chat, e1 = run_chat(a, headers)
    q1, h1 = metrics(a.url, headers)
    sys_ttft, sys_prompt, n_sys, s_sys, e2 = run_system(a, headers)
    q2, h2 = metrics(a.url, headers)
    for e in e1 + e2:
        print("  error:", e, file=sys.stderr)
    rate = lambda q, h: (100.0 * h / q) if q > 0 else 0.0
    print("\n## %s" % label)
    print("| chat turn | " + " | ".join(str(t + 1) for t in range(a.turns)) + " |")
    print("|---|" + "---|" * a.turns)
    print("| prompt tokens, p50 | " + " | ".join("%.0f" % p50(x) for x in prompt) + " |")
    print("| time to first token p50, ms | " + " | ".join("%.0f" % (1e3 * p50(x)) for x in ttft) + " |")
    print("chat: %d completion tokens in %.1f s (%.1f tokens/s); prefix cache hit rate %.1f%% (%d of %d tokens)" %
          (n_chat, s_chat, n_chat / s_chat if s_chat else 0, rate(q1 - q0, h1 - h0), h1 - h0, q1 - q0))
    print("system prompt (%.0f prompt tokens p50): time to first token p50 %.0f ms; %d completion tokens in %.1f s (%.1f tokens/s); hit rate "
          "%.1f%% (%d of %d tokens)" % (p50(sys_prompt), 1e3 * p50(sys_ttft), n_sys, s_sys, n_sys / s_sys if s_sys else 0,
                                        rate(q2 - q1, h2 - h1), h2 - h1, q2 - q1))
    sys.stdout.flush()
    return not (e1 or e2)


def launch(a, pct):
    cmd = [a.launch, "--target", a.target, "--http", a.http, "--verifier-arg", "--prefix-cache=%d" % pct] + a.launch_arg
    log = open(a.launch_log, "a")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("http "):
            a.url = line.split()[1]
            return p
    stop(p)
    raise RuntimeError("specd-launch did not become ready: %s" % " ".join(cmd))


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    except Exception:
        os.killpg(p.pid, signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--label", default="service at --url")
    ap.add_argument("--api-key")
    ap.add_argument("--launch", help="specd-launch binary: start one service per --cache value")
    ap.add_argument("--target", help="the target model, with --launch")
    ap.add_argument("--cache", default="50,0", help="verifier --prefix-cache values to launch with (default 50,0)")
    ap.add_argument("--http", default="127.0.0.1:18090", help="gateway address for --launch")
    ap.add_argument("--launch-arg", action="append", default=[], help="extra specd-launch argument (repeatable)")
    ap.add_argument("--launch-log", default="/tmp/prefix_bench_launch.log", help="the service's logs (appended)")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-words", type=int, default=150)
    ap.add_argument("--answer", type=int, default=32, help="completion tokens per request")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1000)
    a = ap.parse_args()
    ok = True
    if not a.launch:
        ok = measure(a, a.label)
    else:
        if not a.target:
            ap.error("--launch needs --target")
        for pct in [int(x) for x in a.cache.split(",")]:
            p = launch(a, pct)
            try:
                ok = measure(a, "verifier --prefix-cache %d" % pct) and ok
            finally:
                stop(p)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
