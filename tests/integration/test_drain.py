"""SIGTERM drains (issue 37): a rolling restart loses nothing.

- specd-gateway, SIGTERM with streams in flight: every stream runs to its
  end (all its tokens, finish_reason "length", [DONE]); a request that
  arrives meanwhile gets 503 with Retry-After; the gateway then exits 0.
- specd-gateway killed (SIGKILL) with streams in flight: the coordinator
  cancels its requests (the gateway's connection falls silent for the
  liveness period, 2 s), freeing their KV: none stays active.
- specd-coordinator, SIGTERM with requests in flight: each finishes
  (Finished, all its tokens); a submit that arrives meanwhile is refused
  OVERLOADED ("draining ... retry"); the coordinator then exits 0.
Tiny random target, no drafter."""
import http.client
import json
import os
import signal
import time

import harness as H

N_TOKENS = 1200


def open_stream(h, prompt):
    conn = http.client.HTTPConnection("127.0.0.1", h.http_port, timeout=300)
    body = {"model": "m", "prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    H.check(r.status == 200, "stream: HTTP %d" % r.status)
    return conn, r


def next_event(r):
    data = b""
    while True:
        line = r.readline()
        H.check(line != b"", "the stream ended without [DONE]")
        if line in (b"\n", b"\r\n"):
            if data:
                return data
            continue
        if line.startswith(b"data: "):
            data += line[6:].rstrip(b"\r\n")


def check_gateway_drain(h):
    gw = h.start_gateway(["--drain-timeout", "120"])
    streams = [open_stream(h, p) for p in H.random_prompts(4, seed=61)]
    for _, r in streams:
        json.loads(next_event(r))  # running
    os.kill(gw.pid, signal.SIGTERM)
    time.sleep(0.5)
    st, hdrs, body = h.http("POST", "/v1/completions", {"model": "m", "prompt": "late", "max_tokens": 2})
    H.check(st == 503 and hdrs.get("retry-after"), "a request during the drain: %d %s %s" % (st, hdrs, body[:200]))
    H.check(gw.alive(), "the gateway exited with streams in flight")
    for i, (conn, r) in enumerate(streams):
        usage, finish = None, None
        while True:
            e = next_event(r)
            if e == b"[DONE]":
                break
            obj = json.loads(e)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices", []):
                finish = ch.get("finish_reason") or finish
        H.check(finish == "length" and usage and usage.get("completion_tokens") == N_TOKENS,
                "stream %d after SIGTERM: finish %s, usage %s" % (i, finish, usage))
        conn.close()
    rc = gw.popen.wait(60)
    H.check(rc == 0, "the gateway exited %s after draining" % rc)
    H.log("gateway SIGTERM: %d streams ran to their %d tokens, a new request got 503 + Retry-After, exit 0"
          % (len(streams), N_TOKENS))


def check_gateway_kill(h):
    gw = h.start_gateway()
    streams = [open_stream(h, p) for p in H.random_prompts(2, seed=67)]
    for _, r in streams:
        json.loads(next_event(r))
    c = h.client()
    st = c.stats()
    H.check(st and st.get("active_requests", 0) >= 2, "the streams are not running: %s" % st)
    os.kill(gw.pid, signal.SIGKILL)
    gw.popen.wait(10)
    t0 = time.monotonic()

    def idle():
        s = c.stats()
        return s is not None and s.get("active_requests", 0) == 0 and s.get("queued_requests", 0) == 0
    H.wait_until(idle, 30, "the dead gateway's requests to be cancelled")
    for conn, _ in streams:
        conn.close()
    c.close()
    H.log("gateway killed with 2 streams: the coordinator cancelled them in %.1f s" % (time.monotonic() - t0))


def check_coordinator_drain(h, coord):
    c = h.client()
    tags = [c.submit(prompt=p, max_tokens=N_TOKENS, ignore_eos=True) for p in H.random_prompts(3, seed=71)]
    ids, got, done = {}, {}, set()
    while len(got) < len(tags) or min(got.values()) == 0:
        m = c.recv(60)
        H.check(m is not None, "no progress before the SIGTERM")
        if "accepted" in m:
            ids[m["accepted"]["request_id"]] = m["accepted"]["client_tag"]
            got[m["accepted"]["request_id"]] = 0
        elif "tokens" in m:
            got[m["tokens"]["request_id"]] += len(m["tokens"].get("tokens", []))
    os.kill(coord.pid, signal.SIGTERM)
    # A submit the coordinator reads before it has handled the signal is
    # still accepted, and runs: that one is sent again once it finishes (the
    # drain has begun by then); one read after must be refused.
    late_tags = {c.submit(prompt="late", max_tokens=2)}
    late_ids = set()
    refused = None
    deadline = time.monotonic() + 300
    while len(done) < len(tags) or (refused is None and len(late_tags) < 5):
        H.check(time.monotonic() < deadline, "the requests did not finish during the drain")
        m = c.recv(10)
        if m is None:
            continue
        if "accepted" in m:
            H.check(m["accepted"]["client_tag"] in late_tags, "an unexpected accept: %s" % m)
            late_ids.add(m["accepted"]["request_id"])
        elif "tokens" in m:
            if m["tokens"]["request_id"] not in late_ids:
                got[m["tokens"]["request_id"]] += len(m["tokens"].get("tokens", []))
        elif "finished" in m:
            if m["finished"]["request_id"] in late_ids:
                late_tags.add(c.submit(prompt="late", max_tokens=2))
            else:
                done.add(m["finished"]["request_id"])
        elif "error" in m:
            e = m["error"]
            H.check(e.get("client_tag") in late_tags, "a request failed during the drain: %s" % e)
            refused = e
    if refused is None:
        refused = (c.recv(5) or {}).get("error")
    H.check(refused is not None, "no late submit was refused during the drain (%d sent)" % len(late_tags))
    H.check("draining" in refused.get("message", ""), "late submit: %s" % refused)
    H.check(all(v == N_TOKENS for v in got.values()), "tokens per request after SIGTERM: %s" % got)
    rc = coord.popen.wait(60)
    H.check(rc == 0, "the coordinator exited %s after draining" % rc)
    H.log("coordinator SIGTERM: %d requests ran to their %d tokens, a new submit was refused OVERLOADED "
          "(draining), exit 0" % (len(tags), N_TOKENS))


def run(h):
    target, _ = h.tiny_models(seed=29)
    coord, _, _ = h.start_service(target, drafter=None, coord_extra=["--drain-timeout-ms", "120000"])
    check_gateway_drain(h)
    check_gateway_kill(h)
    check_coordinator_drain(h, coord)


if __name__ == "__main__":
    H.main(run)
