#!/usr/bin/env python3
"""The prefix cache through the HTTP API (issue 34): time to first token per
turn of multi-turn chats, and of requests sharing one long system prompt,
with and without the verifiers' prefix cache.

Usage:
  prefix_bench.py --url http://127.0.0.1:8000 [--label NAME]
      measures the service already running there;
  prefix_bench.py --launch build/deploy/specd-launch --target MODEL.gguf
                  [--cache 50,0] [--launch-arg ARG ...]
                  [--llama-server BIN] [--rounds R]
      starts one service per --cache value (specd-verifier --prefix-cache
      PCT; 0: no cache), measures it, stops it: the same workload with and
      without the cache in one run. With --llama-server (llama.cpp's
      server, scripts/setup --llama-tools builds it from the llama-cpp-python
      source), also llama-server on the same file and threads, once with its
      prompt cache (cache_prompt, its default) and once without: the peer.
      --rounds R repeats the whole set R times, interleaved (A B C D A B C D),
      and the summary takes medians over the rounds.
  prefix_bench.py --launch ... --paired [--fill chat] --workloads distinct --rounds R
      starts every --cache service at once (each on its own port; an idle
      one takes no CPU), optionally runs --fill workloads once on each (not
      counted: e.g. the chat workload, to fill the cache first), then
      measures the workloads R times, A B then B A alternately, with fresh
      conversations and distinct prompts each round (nothing a round sends
      was sent before): many paired rounds on services in the same state,
      for ratios within noise.

Workloads (greedy, EOS ignored, streaming, so every first text event is
timed):
  chat:   --conversations (4) conversations at once, --turns (8) turns each;
          turn t sends the whole history (every earlier user message and
          the assistant's answer, as a chat client does) plus a new user
          message of about --turn-words words; --answer tokens per answer.
  system: --requests (32) requests, --concurrency (4) at a time, each one
          shared system prompt of about --system-tokens (1000) tokens and a
          short distinct question.
  distinct: --distinct-requests (16) requests, --concurrency at a time, no
          two sharing a prefix beyond the chat template's first tokens
          (their own system line and --distinct-words (300) words): what
          the cache costs where it cannot help (throughput).

Reports per configuration: time to first token p50 per chat turn (turn 1
computes everything, later turns find their history cached), the system
workload's p50, completion tokens per second over each workload, and the
hit rate from the gateway's /metrics (specd_prefix_cache_*: hit tokens /
looked-up tokens over the run; for llama-server, its per-response
timings: cached prompt tokens / prompt tokens). Each measurement also
records the CPU time every process but this script took meanwhile (in
cores): the server under test is one of them, so about the thread count
means the machine held nothing else; more means other load (noisy)."""
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

WORDS = ("river mountain lantern copper orchard violet harbor meadow falcon quartz cedar tundra beacon velvet "
         "glacier saffron canyon ember willow prism marble thistle cobalt lagoon juniper").split()


def words(seed, n):
    """n pseudo-random words from seed (distinct text per seed)."""
    out, x = [], seed * 2654435761 % 4294967296 + 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        out.append(WORDS[x % len(WORDS)])
    return " ".join(out)


def chat(url, headers, messages, max_tokens, extra=None):
    """One streaming request: (time to first text event s, text, completion
    tokens, prompt tokens, cached prompt tokens or None). extra: more body
    fields (llama-server's cache_prompt). The cached count comes from
    llama-server's timings (cache_n), which specd does not send."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=1200)
    body = json.dumps({"model": "specd", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True},
                       **(extra or {})})
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    ttft, text, n_tokens, n_prompt, n_cached = None, [], 0, 0, None
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
        tm = ev.get("timings")
        if tm:  # llama-server: prompt_n computed, cache_n reused
            n_cached = int(tm.get("cache_n", 0))
            n_prompt = n_prompt or n_cached + int(tm.get("prompt_n", 0))
            n_tokens = n_tokens or int(tm.get("predicted_n", 0))
        for ch in ev.get("choices", []):
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.monotonic() - t0
                text.append(piece)
    c.close()
    return ttft if ttft is not None else float("nan"), "".join(text), n_tokens, n_prompt, n_cached


class Hits:
    """Prefix cache looked-up and hit tokens: from the responses where they
    say (llama-server), else from specd's /metrics, read before and after."""

    def __init__(self):
        self.lock, self.query, self.hit, self.from_responses = threading.Lock(), 0, 0, False

    def add(self, n_prompt, n_cached):
        if n_cached is not None:
            with self.lock:
                self.from_responses = True
                self.query += n_prompt
                self.hit += n_cached


def metrics(url, headers):
    """(looked-up tokens, hit tokens) summed over the verifier groups, from
    /metrics; (0, 0) where the server has none of them."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
    c.request("GET", "/metrics", headers=headers)
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace") if r.status == 200 else ""
    c.close()

    def total(name):
        return sum(float(m.group(1)) for m in re.finditer(r"^%s\{[^}]*\} (\S+)$" % name, text, re.M))

    return total("specd_prefix_cache_query_tokens_total"), total("specd_prefix_cache_hit_tokens_total")


def run_chat(a, headers, extra, hits):
    """ttft[turn] lists, completion tokens, wall s."""
    ttft = [[] for _ in range(a.turns)]
    prompt = [[] for _ in range(a.turns)]
    counts = [0] * a.conversations
    errors = []

    def conversation(ci):
        b = a.distinct_base  # a fresh conversation per round with --paired
        msgs = [{"role": "system", "content": "You are a helpful assistant. Conversation %d." % (b + ci)}]
        try:
            for t in range(a.turns):
                msgs.append({"role": "user", "content": words(100000 * b + 1000 * ci + t, a.turn_words)})
                first, text, n, n_prompt, n_cached = chat(a.url, headers, msgs, a.answer, extra)
                hits.add(n_prompt, n_cached)
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


def run_many(a, headers, extra, hits, n_requests, messages):
    """n_requests requests, --concurrency at a time, request i's messages
    from messages(i): (ttft list, prompt tokens list, completion tokens, wall s, errors)."""
    ttft, count, errors, lock, prompt = [], [0], [], threading.Lock(), []
    next_i = [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n_requests:
                return
            try:
                first, _, n, n_prompt, n_cached = chat(a.url, headers, messages(i), a.answer, extra)
                hits.add(n_prompt, n_cached)
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


def pct(x):
    return "-" if x != x else "%.1f%%" % x


def p50(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def system_messages(a):
    system = words(7, a.system_tokens)  # these words are about one token each
    return lambda i: [{"role": "system", "content": system},
                      {"role": "user", "content": "Question %d: %s?" % (i, words(50 + i, 8))}]


def distinct_messages(a):
    b = a.distinct_base  # a fresh set per round with --paired (the services stay up: nothing repeats)
    return lambda i: [{"role": "system", "content": "Reader %d of %s." % (i, words(9000 + b + i, 4))},
                      {"role": "user", "content": words(5000 + 97 * (b + i), a.distinct_words)}]


def measure(a, label, extra=None):
    """Runs the workloads against a.url; prints them; returns a dict of figures."""
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key
    out, errors = {"label": label}, []
    rate = lambda q, h: (100.0 * h / q) if q > 0 else float("nan")

    def hit_rate(hits, m0):
        if hits.from_responses:
            return rate(hits.query, hits.hit), hits.hit, hits.query
        q, h = metrics(a.url, headers)
        return rate(q - m0[0], h - m0[1]), h - m0[1], q - m0[0]

    print("\n## %s" % label)
    if "chat" in a.workloads:
        hits, m0 = Hits(), metrics(a.url, headers)
        with bc.Hyg() as hy:
            ttft, prompt, n, s, e = run_chat(a, headers, extra, hits)
        errors += e
        out["chat_ttft"], out["chat_prompt"] = [p50(x) for x in ttft], [p50(x) for x in prompt]
        out["chat_tps"], out["chat_hit"] = n / s if s else 0.0, hit_rate(hits, m0)
        print("| chat turn | " + " | ".join(str(t + 1) for t in range(a.turns)) + " |")
        print("|---|" + "---|" * a.turns)
        print("| prompt tokens, p50 | " + " | ".join("%.0f" % x for x in out["chat_prompt"]) + " |")
        print("| time to first token p50, ms | " + " | ".join("%.0f" % (1e3 * x) for x in out["chat_ttft"]) + " |")
        print("chat: %d completion tokens in %.1f s (%.1f tokens/s); prefix cache hit rate %s (%d of %d tokens);"
              " other load %.2f cores" % ((n, s, out["chat_tps"], pct(out["chat_hit"][0])) + out["chat_hit"][1:] + (hy.other,)))
    for name, n_req, msgs in (("system", a.requests, system_messages(a)),
                              ("distinct", a.distinct_requests, distinct_messages(a))):
        if name not in a.workloads:
            continue
        hits, m0 = Hits(), metrics(a.url, headers)
        with bc.Hyg() as hy:
            ttft, prompt, n, s, e = run_many(a, headers, extra, hits, n_req, msgs)
        errors += e
        out[name + "_ttft"], out[name + "_prompt"] = p50(ttft), p50(prompt)
        out[name + "_tps"], out[name + "_hit"] = n / s if s else 0.0, hit_rate(hits, m0)
        out[name + "_prompt_tps"] = sum(prompt) / s if s else 0.0
        print("%s (%.0f prompt tokens p50): time to first token p50 %.0f ms; %d completion tokens in %.1f s "
              "(%.1f tokens/s, %.0f prompt tokens/s); hit rate %s (%d of %d tokens); other load %.2f cores" %
              ((name, out[name + "_prompt"], 1e3 * out[name + "_ttft"], n, s, out[name + "_tps"],
                out[name + "_prompt_tps"], pct(out[name + "_hit"][0])) + out[name + "_hit"][1:] + (hy.other,)))
    for e in errors:
        print("  error:", e, file=sys.stderr)
    sys.stdout.flush()
    out["ok"] = not errors
    return out


def wait_ready(p, what, timeout=300):
    """Waits for a "http URL" line on p's stdout (specd-launch); returns URL."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("http "):
            return line.split()[1]
    stop(p)
    raise RuntimeError("%s did not become ready" % what)


def launch(a, pct, http=None):
    cmd = [a.launch, "--target", a.target, "--http", http or a.http, "--verifier-arg", "--prefix-cache=%d" % pct]
    cmd += a.launch_arg
    if a.threads:
        cmd += ["--threads-verifier", str(a.threads)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(a.launch_log, "a"), text=True, start_new_session=True)
    a.url = wait_ready(p, " ".join(cmd))
    return p


def launch_llama(a):
    """llama-server on the same file and threads, with one slot per concurrent
    conversation and room for the longest chat in each."""
    host, port = a.llama_http.rsplit(":", 1)
    slots = max(a.conversations, a.concurrency)
    cmd = [a.llama_server, "-m", a.target, "-t", str(a.threads or os.cpu_count()), "-tb", str(a.threads or os.cpu_count()),
           "-c", str(slots * a.llama_slot_ctx), "-np", str(slots), "--host", host, "--port", port] + a.llama_arg
    p = subprocess.Popen(cmd, stdout=open(a.launch_log, "a"), stderr=subprocess.STDOUT, start_new_session=True)
    a.url = "http://%s" % a.llama_http
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if p.poll() is not None:
            break
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return p
        except OSError:
            pass
        time.sleep(0.5)
    stop(p)
    raise RuntimeError("llama-server did not become ready: %s" % " ".join(cmd))


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    except Exception:
        os.killpg(p.pid, signal.SIGKILL)


def summary(a, runs):
    """Medians over the rounds, per configuration, and the issue's ratios."""
    labels = list(dict.fromkeys(r["label"] for r in runs))
    med = {}
    for lb in labels:
        rs = [r for r in runs if r["label"] == lb]
        m = {}
        for k in rs[0]:
            if k.endswith("_hit"):
                m[k] = (statistics.median([r[k][0] for r in rs]),)
            elif isinstance(rs[0][k], list):
                m[k] = [statistics.median([r[k][i] for r in rs]) for i in range(len(rs[0][k]))]
            elif isinstance(rs[0][k], float):
                m[k] = statistics.median([r[k] for r in rs])
        med[lb] = m
    print("\n# Summary: medians over %d round(s), %s, %s threads" % (a.rounds, bc.cpu_name(), a.threads or os.cpu_count()))
    if "chat" in a.workloads:
        print("\n| time to first token, ms, chat turn | " + " | ".join(str(t + 1) for t in range(a.turns)) +
              " | turn %d / turn 1 | hit rate |" % a.turns)
        print("|---|" + "---|" * (a.turns + 2))
        for lb in labels:
            t = med[lb]["chat_ttft"]
            print("| %s | " % lb + " | ".join("%.0f" % (1e3 * x) for x in t) + " | %.2fx | %s |" %
                  (t[-1] / t[0], pct(med[lb]["chat_hit"][0])))
        print("| prompt tokens | " + " | ".join("%.0f" % x for x in med[labels[0]]["chat_prompt"]) + " | | |")
    print("\n| workload | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    rows = [("chat: completion tokens/s", "chat_tps", "%.1f"),
            ("system prompt: time to first token p50, ms", "system_ttft", "ms"),
            ("system prompt: completion tokens/s", "system_tps", "%.1f"),
            ("system prompt: hit rate", "system_hit", "%"),
            ("distinct prompts: time to first token p50, ms", "distinct_ttft", "ms"),
            ("distinct prompts: completion tokens/s", "distinct_tps", "%.2f"),
            ("distinct prompts: prompt tokens/s", "distinct_prompt_tps", "%.0f"),
            ("distinct prompts: hit rate", "distinct_hit", "%")]
    for title, k, f in rows:
        if k not in med[labels[0]]:
            continue
        cell = lambda v: ("%.0f" % (1e3 * v)) if f == "ms" else pct(v[0]) if f == "%" else (f % v)
        print("| %s | " % title + " | ".join(cell(med[lb][k]) for lb in labels) + " |")
    pairs = [(x, y) for x, y in zip(labels[0::2], labels[1::2])]
    for on, off in pairs:
        m1, m0 = med[on], med[off]
        if "chat_ttft" in m1:
            print("%s against %s: chat turn %d time to first token %.1fx lower; system prompt %.1fx lower" %
                  (on, off, a.turns, m0["chat_ttft"][-1] / m1["chat_ttft"][-1],
                   m0.get("system_ttft", float("nan")) / m1.get("system_ttft", float("nan"))))
        if "distinct_tps" in m1:
            print("%s against %s: distinct prompts throughput %.3fx" % (on, off, m1["distinct_tps"] / m0["distinct_tps"]))


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
    ap.add_argument("--launch-log", default="/tmp/prefix_bench_launch.log", help="the services' logs (appended)")
    ap.add_argument("--threads", type=int, default=0, help="verifier / llama-server threads (default: each one's own)")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: measure it too, with and without its cache")
    ap.add_argument("--llama-http", default="127.0.0.1:18091", help="llama-server's address")
    ap.add_argument("--llama-slot-ctx", type=int, default=4096, help="llama-server context per slot (default 4096)")
    ap.add_argument("--llama-arg", action="append", default=[], help="extra llama-server argument (repeatable)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every configuration R times, interleaved")
    ap.add_argument("--workloads", default="chat,system,distinct", help="comma-separated: chat, system, distinct")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-words", type=int, default=150)
    ap.add_argument("--answer", type=int, default=32, help="completion tokens per request")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--distinct-requests", type=int, default=16)
    ap.add_argument("--distinct-words", type=int, default=300)
    ap.add_argument("--paired", action="store_true",
                    help="with --launch: all --cache services up at once, rounds alternating A B / B A")
    ap.add_argument("--fill", default="", help="with --paired: workloads run once on each service first, not counted")
    a = ap.parse_args()
    a.distinct_base = 0
    a.workloads = set(a.workloads.split(","))
    if not a.launch:
        return 0 if measure(a, a.label)["ok"] else 1
    if not a.target:
        ap.error("--launch needs --target")
    configs = [("specd --prefix-cache %d" % pct, lambda pct=pct: launch(a, pct), None)
               for pct in [int(x) for x in a.cache.split(",")]]
    if a.llama_server:
        configs += [("llama-server cache_prompt", lambda: launch_llama(a), {"cache_prompt": True}),
                    ("llama-server no cache", lambda: launch_llama(a), {"cache_prompt": False})]
    print("# prefix_bench: %s, %s; %s" % (os.path.basename(a.target), bc.cpu_name(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    if a.paired:
        return paired(a)
    runs = []
    for r in range(a.rounds):
        for label, start, extra in configs:
            p = start()
            try:
                runs.append(measure(a, "%s" % label, extra))
            finally:
                stop(p)
    summary(a, runs)
    return 0 if all(r["ok"] for r in runs) else 1


def paired(a):
    """--paired: every --cache service up at once, rounds alternating A B / B A."""
    if a.llama_server:
        raise SystemExit("--paired measures specd's services only (no --llama-server)")
    host, port = a.http.rsplit(":", 1)
    pcts = [int(x) for x in a.cache.split(",")]
    procs, urls = [], []
    try:
        for i, pct in enumerate(pcts):
            procs.append(launch(a, pct, "%s:%d" % (host, int(port) + i)))
            urls.append(a.url)
        labels = ["specd --prefix-cache %d" % pct for pct in pcts]
        if a.fill:
            kept = a.workloads
            a.workloads = set(a.fill.split(","))
            for url, lb in zip(urls, labels):
                a.url = url
                measure(a, "fill (not counted): " + lb)
            a.workloads = kept
        runs, ratios = [], []
        for r in range(a.rounds):
            a.distinct_base = 1000 * (r + 1)
            order = list(range(len(pcts))) if r % 2 == 0 else list(reversed(range(len(pcts))))
            got = {}
            for i in order:
                a.url = urls[i]
                got[i] = measure(a, labels[i])
            runs += [got[i] for i in range(len(pcts))]
            if len(pcts) == 2 and "distinct_tps" in got[0] and got[1]["distinct_tps"] > 0:
                ratios.append(got[0]["distinct_tps"] / got[1]["distinct_tps"])
                print("round %d: distinct tokens/s %s / %s = %.3fx" % (r + 1, labels[0], labels[1], ratios[-1]))
    finally:
        for p in procs:
            stop(p)
    summary(a, runs)
    if ratios:
        print("\ndistinct prompts, per round %s / %s: %s; median %.3fx, mean %.3fx over %d rounds" %
              (labels[0], labels[1], ", ".join("%.3f" % x for x in ratios), statistics.median(ratios),
               statistics.mean(ratios), len(ratios)))
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
