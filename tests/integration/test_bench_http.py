"""specd-bench http runs against a live gateway: on the tiny random models
(self-draft), one and two concurrent streams, two rounds per path; the
table has a row per path and concurrency, every stream produced events, no
round failed, and the gateway's added latency is given. Against a port where
no gateway listens the benchmark stops at the first HTTP round with exit
status 1 and says which round failed and through which path, with no rows
(figures from a service that does not answer are not figures).
Timings are not checked: speed is a benchmark's business, not a test's.

The gateway's own forwarding time (specd_gateway_forward_seconds): after
streamed requests (one and two choices) its response="stream" count moved
by exactly the number of SSE events that carry text, and after a
non-streamed one its response="whole" count by one; /metrics parses with
prometheus_client's text parser, the buckets are cumulative and end in
_count, the sum is positive. The bench's HTTP rows give its p50 / p99 with
a count that matches the events the bench itself received."""
import json
import os
import re
import subprocess

import harness as H

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    text_string_to_metric_families = None

FWD = "specd_gateway_forward_seconds"


def forward_histograms(h):
    """{response: (count, sum, [(le, cumulative count)...])} from /metrics."""
    st, _, body = h.http("GET", "/metrics")
    H.check(st == 200, "/metrics: HTTP %d" % st)
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name != FWD:
            continue
        H.check(fam.type == "histogram", "%s is a %s" % (FWD, fam.type))
        for s in fam.samples:
            kind = s.labels.get("response")
            count, total, buckets = out.get(kind, (None, None, []))
            if s.name == FWD + "_count":
                count = s.value
            elif s.name == FWD + "_sum":
                total = s.value
            elif s.name == FWD + "_bucket":
                buckets.append((float(s.labels["le"]), s.value))
            out[kind] = (count, total, buckets)
    H.check(set(out) == {"stream", "whole"}, "%s series: %s" % (FWD, sorted(map(str, out))))
    for kind, (count, total, buckets) in out.items():
        les = [b[0] for b in buckets]
        cums = [b[1] for b in buckets]
        H.check(les == sorted(les) and les[0] == 5e-6 and les[-1] == float("inf") and len(les) == 14,
                "%s %s: bounds %s" % (FWD, kind, les))
        H.check(cums == sorted(cums) and cums[-1] == count, "%s %s: buckets %s, count %s" % (FWD, kind, cums, count))
    return out


def text_events(body):
    """SSE events of a streamed response whose delta carries text, and whether it ended with [DONE]."""
    n, done = 0, False
    for ev in body.decode().split("\n\n"):
        if not ev.startswith("data: "):
            continue
        data = ev[6:]
        if data == "[DONE]":
            done = True
            continue
        j = json.loads(data)
        H.check("error" not in j, "error event: %s" % data)
        n += sum(1 for c in j.get("choices", []) if c.get("delta", {}).get("content"))
    return n, done


def check_forward_metric(h):
    if text_string_to_metric_families is None:
        H.log("prometheus_client is not installed in the test venv: the forwarding-metric checks are left out")
        return
    before = forward_histograms(h)
    events = 0
    for n in (1, 2, 1):
        st, _, body = h.http("POST", "/v1/chat/completions", {
            "model": "specd", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True, "stream": True, "n": n})
        H.check(st == 200, "streamed request: HTTP %d %r" % (st, body[:300]))
        k, done = text_events(body)
        H.check(done and k > 0, "stream without text events or [DONE]: %r" % body[:500])
        events += k
    st, _, body = h.http("POST", "/v1/chat/completions", {
        "model": "specd", "messages": [{"role": "user", "content": "What is two plus two?"}], "max_tokens": 4,
        "temperature": 0, "ignore_eos": True})
    H.check(st == 200, "non-streamed request: HTTP %d %r" % (st, body[:300]))
    # the whole response's time is recorded as it is queued: poll, bounded
    H.wait_until(lambda: forward_histograms(h)["whole"][0] == before["whole"][0] + 1, 10,
                 "the non-streamed response counted in %s" % FWD)
    after = forward_histograms(h)
    moved = after["stream"][0] - before["stream"][0]
    H.check(moved == events, "%s{response=\"stream\"} moved by %s, the streams carried %d text events"
            % (FWD, moved, events))
    H.check(after["stream"][1] > before["stream"][1], "the stream sum did not grow")
    H.log("forwarding: %d events, mean %.1f µs" % (events, (after["stream"][1] - before["stream"][1]) / events * 1e6))
    return events


def run_bench(h, url, prompts, want_rc=0):
    r = subprocess.run([h.bin("bench"), "http", "--gateway", url, "--coordinator", h.client_addr, "--prompts", prompts,
                        "--conc", "1,2", "--rounds", "2", "--warmup", "0", "-n", "6"],
                       capture_output=True, text=True, timeout=600)
    H.log(r.stdout + r.stderr[-2000:])
    H.check(r.returncode == want_rc, "specd-bench http exited %d" % r.returncode)
    return [l for l in r.stdout.splitlines() if re.match(r"^\| [0-9]+ \|", l)], r.stderr


def main():
    with H.Harness("bench_http") as h:
        target, _ = h.tiny_models()
        h.start_service(target, drafter="layers", coord_extra=H.FIXED_K)
        h.start_gateway()
        prompts = os.path.join(h.tmp, "prompts.txt")
        with open(prompts, "w") as f:
            f.write("Tell me a story.\nWhat is two plus two?\n")
        check_forward_metric(h)
        rows, _ = run_bench(h, h.http_url, prompts)
        H.check(len(rows) == 4, "expected 4 rows (2 concurrencies x 2 paths), got %d" % len(rows))
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            H.check(len(cells) == 11, "expected 11 cells: %s" % row)
            H.check(float(cells[6]) > 0, "no events per request: %s" % row)
            if "HTTP" not in row:
                H.check(cells[8] == "", "a forwarding figure on the direct row: %s" % row)
                continue
            # forwarding inside the gateway: p50 / p99 over the events of the kept rounds
            m = re.match(r"^>?([0-9.]+) / >?([0-9.]+) µs \(n = ([0-9]+)\)$", cells[8])
            H.check(m, "no forwarding figure on the HTTP row: %s" % row)
            p50, p99, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
            H.check(0 < p50 <= p99, "forwarding p50 %s, p99 %s" % (p50, p99))
            conc = int(cells[0])
            dirty, rounds = map(int, re.match(r"^([0-9]+) of ([0-9]+)", cells[10]).groups())
            kept = rounds - dirty if dirty < rounds else rounds
            received = float(cells[6]) * conc * kept  # events / request is printed to 0.1
            H.check(0 < n and abs(n - received) <= 0.05 * conc * kept + 1e-9,
                    "the gateway timed %d events, the bench received %.1f: %s" % (n, received, row))
        H.check(all("µs" in r for r in rows if "libspecd-client" in r), "no added-latency figure")
        bad, err = run_bench(h, "http://127.0.0.1:%d" % H.free_port(), prompts, want_rc=1)
        H.check(not bad, "rows from a run whose HTTP rounds failed: %s" % bad)
        H.check("concurrency 1: measured round 1 through HTTP (gateway) failed" in err and "stopped" in err,
                "the failed round is not named: %s" % err[-500:])


if __name__ == "__main__":
    main()
