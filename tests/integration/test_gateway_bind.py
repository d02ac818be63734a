"""The gateway's exposure rule and HTTPS (issue 37).

- specd-gateway refuses (exit 2, before serving) a --listen address off the
  loopback without an API key, and so does specd-launch for its --http;
  --insecure, or an API key, lets it serve there.
- With --tls-cert/--tls-key (a self-signed pair made by openssl here; the
  check is skipped without openssl) it serves HTTPS: /v1/models answers
  over TLS with the certificate checked, and plain HTTP gets no answer.
- specd-coordinator given only --curve-secret exits 2, as its --help says.
No coordinator is needed: the gateway starts without one."""
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request

import harness as H


def start_gateway(h, listen, extra=(), env=None):
    e = dict(os.environ)
    e.pop("SPECD_API_KEY", None)
    e.update(env or {})
    return subprocess.Popen([h.bin("gateway"), "--listen", listen, "--coordinator",
                             "tcp://127.0.0.1:%d" % H.free_port()] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)


def expect_refused(h, listen, extra=(), env=None):
    p = start_gateway(h, listen, extra, env)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise H.TestFailure("specd-gateway --listen %s %s kept running: not refused" % (listen, extra))
    H.check(p.returncode == 2, "specd-gateway --listen %s %s exited %d, want 2: %s"
            % (listen, extra, p.returncode, err.decode(errors="replace")[-300:]))
    H.check(b"off the loopback" in err, "no reason given: %s" % err[-300:])


def expect_serving(h, listen, extra=(), env=None):
    p = start_gateway(h, listen, extra, env)
    try:
        line = p.stdout.readline().decode()
        H.check(line.startswith("listening "), "specd-gateway --listen %s %s did not serve: %r %s"
                % (listen, extra, line, p.stderr.read(2000) if p.poll() is not None else b""))
        return p, line.split()[1]
    except BaseException:
        p.kill()
        p.wait(10)
        raise


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def check_bind_rule(h):
    port = H.free_port()
    expect_refused(h, "0.0.0.0:%d" % port)
    expect_refused(h, "[::]:%d" % port)
    for extra, env in ((["--insecure"], None), (["--api-key", "k"], None), ([], {"SPECD_API_KEY": "k"})):
        p, url = expect_serving(h, "0.0.0.0:%d" % H.free_port(), extra, env)
        stop(p)
    p, url = expect_serving(h, "127.0.0.1:%d" % port)  # loopback: no key needed
    stop(p)
    H.log("gateway: off the loopback refused without a key, served with --insecure or a key")
    # specd-launch refuses the same before starting anything
    r = subprocess.run([h.bin("launch"), "--target", "/nonexistent.gguf", "--no-draft", "--http",
                        "0.0.0.0:%d" % port], capture_output=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "SPECD_API_KEY"})
    H.check(r.returncode == 2 and b"off the loopback" in r.stderr,
            "specd-launch --http 0.0.0.0 exited %d: %s" % (r.returncode, r.stderr[-300:]))
    H.log("specd-launch --http 0.0.0.0:PORT without a key: refused (exit 2)")


def check_tls(h):
    if not shutil.which("openssl"):
        H.log("openssl not found: the HTTPS check is skipped")
        return
    cert, key = os.path.join(h.tmp, "cert.pem"), os.path.join(h.tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=120)
    port = H.free_port()
    p, url = expect_serving(h, "127.0.0.1:%d" % port, ["--tls-cert", cert, "--tls-key", key])
    try:
        H.check(url.startswith("https://"), "with TLS it says %s" % url)
        ctx = ssl.create_default_context(cafile=cert)
        with urllib.request.urlopen("https://127.0.0.1:%d/v1/models" % port, context=ctx, timeout=30) as r:
            body = json.loads(r.read())
        H.check(body.get("object") == "list", "/v1/models over HTTPS: %s" % body)
        plain_ok = True
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=10).read()
        except Exception:
            plain_ok = False
        H.check(not plain_ok, "plain HTTP got an answer from the HTTPS gateway")
        H.log("HTTPS: /v1/models answered with a checked self-signed certificate; plain HTTP refused")
    finally:
        stop(p)
    bad = start_gateway(h, "127.0.0.1:%d" % H.free_port(), ["--tls-cert", cert])
    bad.communicate(timeout=60)
    H.check(bad.returncode == 2, "--tls-cert without --tls-key exited %d" % bad.returncode)


def check_coordinator_exit(h):
    target, _ = h.tiny_models(seed=3)
    key = os.path.join(h.tmp, "k.secret")
    with open(key, "w") as f:
        f.write("x")
    r = subprocess.run([h.bin("coordinator"), "--model", target, "--curve-secret", key],
                       capture_output=True, timeout=60)
    H.check(r.returncode == 2, "specd-coordinator with only --curve-secret exited %d (its help says 2): %s"
            % (r.returncode, r.stderr[-300:]))
    r = subprocess.run([h.bin("coordinator"), "--model", target, "--client-addr",
                        "tcp://0.0.0.0:%d" % H.free_port()], capture_output=True, timeout=60)
    H.check(r.returncode == 2, "specd-coordinator off the loopback without keys exited %d" % r.returncode)
    H.log("specd-coordinator: usage errors exit 2")


def run(h):
    check_bind_rule(h)
    check_tls(h)
    check_coordinator_exit(h)


if __name__ == "__main__":
    H.main(run)
