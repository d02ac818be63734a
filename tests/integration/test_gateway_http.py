"""specd-gateway's HTTP behaviour, on the tiny random models (self-draft):

- /health is 503 while no verifier is registered and 200 once one is;
- the SSE framing of a streamed completion, byte for byte from a raw
  socket: HTTP/1.1 200, text/event-stream, chunked transfer encoding, each
  event exactly "data: " + compact JSON + "\\n\\n", chunks in order (text,
  then finish_reason, then the usage chunk), "data: [DONE]\\n\\n" last and
  nothing after; the streamed text and usage equal the non-streamed answer;
- bad input: each of malformed JSON, a body that is not an object, an
  oversized body (413), wrong field types, negative max_tokens, temperature
  NaN / negative, top_p > 1, empty messages, an unknown role, invalid UTF-8,
  a lone surrogate, an out-of-vocabulary token id, top_logprobs out of
  [0, 20] or without logprobs, max_tokens 0 without echo (or on chat),
  penalties outside
  [-2, 2], NaN or not numbers, a
  header over the cap (431), a wrong method (405), an unknown path (404)
  gets its own status and an
  OpenAI error object with a message (and the param where there is one),
  and the gateway keeps serving;
- --api-key and SPECD_API_KEY: missing or wrong keys get 401 on /v1/,
  the right one passes, /health stays open on the loopback;
- --timeout: a client that sends half a request is disconnected;
- SIGTERM twice with requests in flight (a drain cut short): exit status 0;
- overload: past --max-inflight, and when the coordinator's queue is full
  (--max-active 1 --max-queue 1), a request gets 429 with Retry-After at
  once; once the long requests' clients leave, requests pass again;
- CurveZMQ: with a key on the coordinator's --client-keys list (and the
  coordinator's public key) the gateway reaches a keyed coordinator
  (/health says no verifier is registered); with a key on no list, or
  without keys, the coordinator does not answer it."""
import json
import math
import os
import re
import signal
import socket
import time

import harness as H


def raw_request(port, method, path, body, timeout=120):
    """Sends one HTTP/1.1 request (Connection: close) and returns every byte
    the server sent until it closed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    head = ("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n" % (method, path, len(body))).encode()
    s.sendall(head + body)
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    return data


def dechunk(raw):
    """Strict chunked transfer decoding; raises TestFailure on any framing error."""
    out, i = b"", 0
    while True:
        j = raw.index(b"\r\n", i)
        size = int(raw[i:j], 16)
        i = j + 2
        if size == 0:
            H.check(raw[i:] == b"\r\n", "bytes after the last chunk: %r" % raw[i:i + 80])
            return out
        out += raw[i:i + size]
        H.check(raw[i + size:i + size + 2] == b"\r\n", "a chunk does not end with CRLF")
        i += size + 2


def check_sse(h):
    req = {"model": "m", "prompt": "the cat sat on", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    st, _, body = h.http("POST", "/v1/completions", req)
    H.check(st == 200, "non-streamed completion: %d %s" % (st, body))
    plain = json.loads(body)
    raw = raw_request(h.http_port, "POST", "/v1/completions",
                      json.dumps(dict(req, stream=True, stream_options={"include_usage": True})).encode())
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    H.check(lines[0] == "HTTP/1.1 200 OK", "status line %r" % lines[0])
    hdrs = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
    H.check(hdrs.get("content-type") == "text/event-stream", "content-type %r" % hdrs.get("content-type"))
    H.check(hdrs.get("transfer-encoding") == "chunked", "transfer-encoding %r" % hdrs.get("transfer-encoding"))
    H.check(hdrs.get("cache-control") == "no-cache", "cache-control %r" % hdrs.get("cache-control"))
    sse = dechunk(rest)
    H.check(sse.endswith(b"data: [DONE]\n\n"), "the stream does not end with data: [DONE]: %r" % sse[-80:])
    H.check(re.fullmatch(rb"(data: [^\n]+\n\n)+", sse, re.S) is not None, "bad SSE framing: %r" % sse[:300])
    events = [e[len(b"data: "):] for e in sse.split(b"\n\n")[:-1]]
    H.check(events[-1] == b"[DONE]" and b"[DONE]" not in events[:-1], "[DONE] is not last and alone")
    chunks = []
    for e in events[:-1]:
        obj = json.loads(e)
        # Byte for byte: compact JSON, keys in OpenAI's order.
        again = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        H.check(again == e, "an event is not compact JSON:\n  %r\n  %r" % (e, again))
        H.check(list(obj)[:5] == ["id", "object", "created", "model", "choices"], "key order %s" % list(obj))
        chunks.append(obj)
    H.check(all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] and c["model"] == "specd"
                for c in chunks), "chunk envelopes differ: %s" % chunks[:2])
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    usage = [c for c in chunks if not c["choices"]]
    H.check(chunks == texts + fin + usage and len(fin) == 1 and len(usage) == 1,
            "chunk order: text chunks, one finish, one usage; got %d/%d/%d" % (len(texts), len(fin), len(usage)))
    H.check(all(c["usage"] is None for c in texts + fin), "text chunks must carry usage: null with include_usage")
    H.check(fin[0]["choices"][0]["finish_reason"] == "length" and fin[0]["choices"][0]["text"] == "",
            "finish chunk %s" % fin[0])
    text = "".join(c["choices"][0]["text"] for c in texts)
    H.check(text == plain["choices"][0]["text"], "streamed %r vs not %r" % (text, plain["choices"][0]["text"]))
    H.check(usage[0]["usage"] == plain["usage"] and plain["usage"]["completion_tokens"] == 12,
            "usage %s vs %s" % (usage[0]["usage"], plain["usage"]))
    H.log("SSE: %d events, framing exact, %d text chunks" % (len(events), len(texts)))


def expect_error(h, path, body, status, param=None, headers=None, what=""):
    st, hdrs, out = h.http("POST", path, body, headers=headers)
    H.check(st == status, "%s: status %d, expected %d: %s" % (what, st, status, out[:300]))
    H.check(hdrs.get("content-type") == "application/json", "%s: content-type %r" % (what, hdrs.get("content-type")))
    err = json.loads(out)["error"]
    H.check(set(err) == {"message", "type", "param", "code"} and err["message"],
            "%s: not an OpenAI error object: %s" % (what, err))
    if param is not None:
        H.check(err["param"] == param, "%s: param %r, expected %r (%s)" % (what, err["param"], param, err["message"]))
    H.log("%-28s -> %d %s" % (what, st, err["message"]))
    return hdrs


def check_bad_input(h):
    chat, comp = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "hi"}]
    cases = [
        (chat, b'{"messages": [', 400, None, "malformed JSON"),
        (chat, b'[1, 2]', 400, None, "not an object"),
        (chat, {"messages": "hi"}, 400, "messages", "messages not a list"),
        (chat, {"messages": user, "max_tokens": "ten"}, 400, "max_tokens", "max_tokens a string"),
        (chat, {"messages": user, "max_tokens": 2.5}, 400, "max_tokens", "max_tokens fractional"),
        (chat, {"messages": user, "stream": "yes"}, 400, "stream", "stream a string"),
        (comp, {"prompt": "x", "stop": 5}, 400, "stop", "stop a number"),
        (comp, {"prompt": 5}, 400, "prompt", "prompt a number"),
        (comp, {"prompt": "x", "n": 0}, 400, "n", "n zero"),
        (chat, {"messages": user, "max_tokens": -5}, 400, "max_tokens", "negative max_tokens"),
        (chat, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, None,
         "temperature NaN"),
        (chat, {"messages": user, "temperature": -0.5}, 400, "temperature", "negative temperature"),
        (chat, {"messages": user, "top_p": 1.5}, 400, "top_p", "top_p > 1"),
        (chat, {"messages": []}, 400, "messages", "empty messages"),
        (chat, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "unknown role"),
        (chat, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None, "invalid UTF-8"),
        (chat, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, None, "lone surrogate"),
        (comp, {"prompt": [999999]}, 400, None, "token id out of range"),
        (chat, {"messages": user, "top_logprobs": 2}, 400, "top_logprobs", "top_logprobs without logprobs"),
        (chat, {"messages": user, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "top_logprobs 21"),
        (chat, {"messages": user, "logprobs": 1}, 400, "logprobs", "chat logprobs a number"),
        (comp, {"prompt": "x", "logprobs": 21}, 400, "logprobs", "completion logprobs 21"),
        (comp, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "max_tokens 0 without echo"),
        (chat, {"messages": user, "max_tokens": 0}, 400, "max_tokens", "chat max_tokens 0"),
        (chat, {"messages": user, "presence_penalty": 2.5}, 400, "presence_penalty", "presence_penalty > 2"),
        (comp, {"prompt": "x", "frequency_penalty": -3}, 400, "frequency_penalty", "frequency_penalty < -2"),
        (comp, {"prompt": "x", "frequency_penalty": "1"}, 400, "frequency_penalty", "frequency_penalty a string"),
        (chat, b'{"messages": [{"role": "user", "content": "hi"}], "presence_penalty": NaN}', 400, None,
         "presence_penalty NaN"),
        (chat, {"messages": user + [{"role": "function", "content": "x"}, {"role": "user", "content": "y"}]},
         400, "messages[1].role", "a (legacy) function turn"),
        (chat, {"messages": user + [{"role": "assistant", "content": "x"}]}, 400, "messages",
         "ending with an assistant turn"),
    ]
    for path, body, status, param, what in cases:
        expect_error(h, path, body, status, param, what=what)
    # Oversized: a body over --max-body (1 MiB here) is read, dropped and refused.
    expect_error(h, comp, b'{"prompt": "' + b"a" * (2 << 20) + b'"}', 413, what="oversized body")
    # Headers are capped too (libmicrohttpd's per-connection memory).
    big = socket.create_connection(("127.0.0.1", h.http_port), timeout=30)
    big.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 << 10) + b"\r\n\r\n")
    line = big.recv(64).split(b"\r\n")[0]
    big.close()
    H.check(line.startswith(b"HTTP/1.1 431"), "a 200 KiB header: %r, expected 431" % line)
    H.log("%-28s -> %s" % ("oversized header", line.decode()))
    st, hdrs, out = h.http("GET", comp)
    H.check(st == 405 and hdrs.get("allow") == "POST", "GET %s: %d %s" % (comp, st, hdrs))
    st, _, out = h.http("GET", "/v1/models/specd")
    H.check(st == 200 and json.loads(out)["id"] == "specd", "GET /v1/models/specd: %d %s" % (st, out))
    st, _, out = h.http("GET", "/v1/models/other")
    H.check(st == 404 and json.loads(out)["error"]["code"] == "model_not_found", "an unknown model: %d %s"
            % (st, out))
    st, _, out = h.http("GET", "/v2/nothing")
    H.check(st == 404 and json.loads(out)["error"]["message"], "unknown path: %d %s" % (st, out))
    # Still serving.
    st, _, out = h.http("POST", comp, {"prompt": "still there", "max_tokens": 4, "temperature": 0,
                                       "ignore_eos": True})
    H.check(st == 200 and json.loads(out)["usage"]["completion_tokens"] == 4, "after bad input: %d %s" % (st, out))


def check_api_key(h):
    h.start_gateway(["--api-key", "s3cret"])
    v1 = {"prompt": "key", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    expect_error(h, "/v1/completions", v1, 401, what="no API key")
    hdrs = expect_error(h, "/v1/completions", v1, 401, headers={"Authorization": "Bearer wrong"},
                        what="wrong API key")
    H.check(hdrs.get("www-authenticate") == "Bearer", "401 without WWW-Authenticate: %s" % hdrs)
    expect_error(h, "/v1/completions", v1, 401, headers={"Authorization": "Bearer s3cret2"}, what="longer key")
    expect_error(h, "/v1/completions", v1, 401, headers={"Authorization": "Basic s3cret"}, what="not Bearer")
    st, _, out = h.http("POST", "/v1/completions", v1, headers={"Authorization": "Bearer s3cret"})
    H.check(st == 200, "the right key: %d %s" % (st, out))
    st, _, _ = h.http("GET", "/v1/models")
    H.check(st == 401, "GET /v1/models without a key: %d" % st)
    st, _, _ = h.http("GET", "/health")
    H.check(st == 200, "/health on the loopback needs no key: %d" % st)
    h.start_gateway(env={"SPECD_API_KEY": "from-env"})
    st, _, _ = h.http("GET", "/v1/models", headers={"Authorization": "Bearer from-env"})
    st2, _, _ = h.http("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
    H.check((st, st2) == (200, 401), "SPECD_API_KEY: right key %d, wrong key %d" % (st, st2))


def check_stalled_client(h):
    h.start_gateway(["--timeout", "1"])
    s = socket.create_connection(("127.0.0.1", h.http_port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    t0 = time.monotonic()
    try:
        got = s.recv(4096)
    except ConnectionResetError:
        got = b""
    waited = time.monotonic() - t0
    s.close()
    H.check(got == b"" and waited < 20, "a stalled client was not disconnected (%r after %.1f s)" % (got, waited))
    H.log("stalled client disconnected after %.1f s" % waited)


def open_stream(port, body):
    """A raw streaming completion; returns the socket once its first event arrived."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(dict(body, stream=True)).encode()
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % len(data)).encode() + data)
    got = b""
    while b"data: " not in got:
        b = s.recv(4096)
        H.check(b, "the stream closed before its first event: %r" % got)
        got += b
    return s


def check_stop_in_flight(h, gw):
    """SIGTERM twice while a stream and a non-streamed request are in flight
    (the first starts a drain, the second cuts it short): the gateway
    cancels them, and exits 0 (the final callbacks that
    sd_client_close runs for them once used the freed janitor: SIGSEGV)."""
    long_req = {"prompt": "a long one", "max_tokens": 4000, "temperature": 0, "ignore_eos": True}
    s = open_stream(h.http_port, long_req)
    w = socket.create_connection(("127.0.0.1", h.http_port), timeout=60)
    data = json.dumps(long_req).encode()
    w.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % len(data)).encode() + data)
    time.sleep(0.5)  # the second one submitted and waiting
    H.check(gw.alive(), "the gateway died with two requests in flight")
    # The first SIGTERM drains (the requests would run to their end, test_drain.py);
    # the second stops at once, cancelling them.
    os.kill(gw.pid, signal.SIGTERM)
    time.sleep(0.3)
    H.check(gw.alive(), "the gateway did not drain: it exited at once with requests in flight")
    rc = h.stop(gw)
    H.check(rc == 0, "specd-gateway exited %s on SIGTERM with requests in flight" % rc)
    s.close()
    w.close()
    H.log("SIGTERM with a stream and a non-streamed request in flight: exit 0")


def expect_429(h, what):
    t0 = time.monotonic()
    hdrs = expect_error(h, "/v1/completions", {"prompt": "one more", "max_tokens": 2}, 429, what=what)
    H.check(hdrs.get("retry-after") == "1", "%s: Retry-After %r" % (what, hdrs.get("retry-after")))
    H.check(time.monotonic() - t0 < 5, "%s: the 429 took %.1f s" % (what, time.monotonic() - t0))


def check_overload(h, target):
    long_req = {"prompt": "a long one", "max_tokens": 4000, "temperature": 0, "ignore_eos": True}
    small = {"prompt": "small", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    h.start_gateway(["--max-inflight", "1"])
    s = open_stream(h.http_port, long_req)
    expect_429(h, "over --max-inflight")
    s.close()
    H.wait_until(lambda: h.http("POST", "/v1/completions", small)[0] == 200, 30,
                 "a request to pass once the long stream's client left")
    # The coordinator's own limit: one active, one queued, the third refused.
    h.start_coordinator(target, ["--max-active", "1", "--max-queue", "1"])
    h.start_verifier()
    h.wait_registered(drafter=False)
    h.start_gateway()
    s1 = open_stream(h.http_port, long_req)
    s2 = socket.create_connection(("127.0.0.1", h.http_port), timeout=60)
    data = json.dumps(dict(long_req, stream=True)).encode()
    s2.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n\r\n" % len(data)).encode() + data)
    H.check(s2.recv(12).startswith(b"HTTP/1.1 200"), "the queued request was not accepted")
    expect_429(h, "coordinator queue full")
    s1.close()
    s2.close()
    H.wait_until(lambda: h.http("POST", "/v1/completions", small)[0] == 200, 30,
                 "a request to pass once the queue emptied")


def check_curve(h, target):
    keys = h.enable_curve(extra_names=["rogue"])  # from here on every process holds its key
    h.start_coordinator(target)
    h.start_gateway()  # the client key, on the coordinator's --client-keys list
    st, _, out = h.http("GET", "/health")
    H.check(st == 503 and json.loads(out).get("reason") == "no verifier is registered",
            "with an allowed key: %d %s" % (st, out))
    h.start_gateway(["--curve-secret", keys["rogue"]["key"]])  # a key on no list
    st, _, out = h.http("GET", "/health")
    H.check(st == 503 and json.loads(out).get("reason") != "no verifier is registered",
            "with a key on no list: %d %s" % (st, out))
    h.keys = {}  # no keys at all: plaintext against a CURVE coordinator
    h.start_gateway()
    st, _, out = h.http("GET", "/health")
    H.check(st == 503 and json.loads(out).get("reason") != "no verifier is registered",
            "without keys: %d %s" % (st, out))
    h.keys = keys
    H.log("CurveZMQ: answered with an allowed key, not with another key or none")


def run(h):
    target, _ = h.tiny_models(seed=5, ctx=4096)  # room for long requests (overload)
    h.start_coordinator(target, H.FIXED_K)
    h.start_gateway(["--max-body", str(1 << 20)])
    st, _, out = h.http("GET", "/health")
    H.check(st == 503 and json.loads(out)["status"] == "unavailable", "/health without a verifier: %d %s"
            % (st, out))
    h.start_verifier()
    h.start_drafter("layers")
    h.wait_registered()
    H.wait_until(lambda: h.http("GET", "/health")[0] == 200, 30, "/health to say 200 with a verifier")
    check_sse(h)
    check_bad_input(h)
    gw = next(p for p in h.procs if p.name == "gateway")
    H.check(gw.alive(), "the gateway died")
    check_stop_in_flight(h, gw)
    h.start_gateway(["--max-body", str(1 << 20)])
    check_api_key(h)
    check_stalled_client(h)
    check_overload(h, target)
    check_curve(h, target)
    for p in h.procs:
        if p.name == "gateway":
            rc = h.stop(p)
            H.check(rc == 0, "specd-gateway exited %s on SIGTERM (ASan reports leaks with a non-zero status)" % rc)


if __name__ == "__main__":
    H.main(run)
