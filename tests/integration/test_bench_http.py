"""specd-bench http runs against a live gateway: on the tiny random models
(self-draft), one and two concurrent streams, two rounds per path; the
table has a row per path and concurrency, every stream produced events, no
round failed, and the gateway's added latency is given. Against a port where
no gateway listens the HTTP rounds are marked as failures and the libspecd
rows still come out (the benchmark says what failed, it does not hide it).
Timings are not checked: speed is a benchmark's business, not a test's."""
import os
import re
import subprocess

import harness as H


def run_bench(h, url, prompts):
    r = subprocess.run([h.bin("bench"), "http", "--gateway", url, "--coordinator", h.client_addr, "--prompts", prompts,
                        "--conc", "1,2", "--rounds", "2", "--warmup", "0", "-n", "6"],
                       capture_output=True, text=True, timeout=600)
    H.log(r.stdout + r.stderr[-2000:])
    H.check(r.returncode == 0, "specd-bench http exited %d" % r.returncode)
    return [l for l in r.stdout.splitlines() if re.match(r"^\| [0-9]+ \|", l)]


def main():
    with H.Harness("bench_http") as h:
        target, _ = h.tiny_models()
        h.start_service(target, drafter="layers", coord_extra=H.FIXED_K)
        h.start_gateway()
        prompts = os.path.join(h.tmp, "prompts.txt")
        with open(prompts, "w") as f:
            f.write("Tell me a story.\nWhat is two plus two?\n")
        rows = run_bench(h, h.http_url, prompts)
        H.check(len(rows) == 4, "expected 4 rows (2 concurrencies x 2 paths), got %d" % len(rows))
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            H.check("(failures!)" not in row, "a round failed: %s" % row)
            H.check(float(cells[6]) > 0, "no events per request: %s" % row)
        H.check(all("µs" in r for r in rows if "libspecd-client" in r), "no added-latency figure")
        bad = run_bench(h, "http://127.0.0.1:%d" % H.free_port(), prompts)
        http_rows = [r for r in bad if "HTTP" in r]
        H.check(http_rows and all("(failures!)" in r for r in http_rows), "HTTP failures not reported: %s" % bad)
        H.check(all("(failures!)" not in r for r in bad if "libspecd-client" in r), "direct rows failed too")


if __name__ == "__main__":
    main()
