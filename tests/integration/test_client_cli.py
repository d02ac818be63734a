"""specd-client, the command line, against the real service (the other
integration tests speak the wire protocol from Python, so this is where
the CLI itself is checked):

- `-p PROMPT` streams: the first text reaches stdout while the request is
  still running (the process has not exited), statistics go to stderr;
- `-p PROMPT --json` gives exactly specd-generate's token ids, and its
  stats name the drafter kind that drafted it;
- `--stop S` ends the output before the stop string;
- `--jobs FILE.jsonl` writes one JSON result per input line, in input order,
  echoing each "id": greedy jobs give specd-generate's ids, a seeded
  target-only job (temp, top_p, seed, max_k -1) gives the seeded
  specd-generate's ids, a conversation ("messages") gives specd-generate
  --chat --message ...'s ids and prompt length, a line with a bad field gets its own BAD_JOB line
  and the others still run; a progress bar goes to stderr only when stderr
  is a terminal; against a coordinator that does not answer, the first job
  fails after --timeout and the rest are reported UNAVAILABLE without being
  submitted (not one --timeout each);
- every program of the service answers --help with its usage on stdout and
  exit status 0;
- `-n 0` is refused (exit 2), as OpenAI refuses max_tokens 0;
- `--special`: a plain prompt's special-token text ("<|im_start|>") becomes
  the control token, giving specd-generate --special's prompt and ids; without
  it the text stays text (more tokens); with --chat it is refused.

Tiny random models, self-draft drafter."""
import json
import os
import pty
import select
import subprocess
import time

import harness as H


def cli(h, *args, timeout=300, stderr=subprocess.PIPE):
    r = subprocess.run([h.bin("client"), "--coordinator", h.client_addr] + list(args), stdout=subprocess.PIPE,
                       stderr=stderr, timeout=timeout)
    return r


def check_help(h):
    for name in ("coordinator", "verifier", "drafter", "client", "launch", "generate", "mkmodel", "gateway"):
        r = subprocess.run([h.bin(name), "--help"], capture_output=True, timeout=60)
        out = r.stdout.decode("utf-8", "replace")
        H.check(r.returncode == 0, "%s --help exited %d" % (name, r.returncode))
        H.check("usage" in out.lower(), "%s --help printed no usage on stdout: %r" % (name, out[:200]))
    H.log("every program answers --help")


def check_streaming(h, prompt):
    p = subprocess.Popen([h.bin("client"), "--coordinator", h.client_addr, "-p", prompt, "-n", "400",
                          "--ignore-eos"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        r, _, _ = select.select([p.stdout], [], [], 120)
        H.check(r, "specd-client -p printed nothing within 120 s")
        first = os.read(p.stdout.fileno(), 1 << 16)
        running = p.poll() is None
        rest, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    H.check(p.returncode == 0, "specd-client -p exited %d: %s" % (p.returncode, err[-500:]))
    H.check(first, "specd-client -p: stdout closed without text")
    H.check(running, "specd-client -p: the first text came only when the process ended (%d bytes then %d): "
            "not streamed" % (len(first), len(rest)))
    H.check(b"400 generated tokens" in err, "no statistics on stderr: %r" % err[-300:])
    H.log("-p streamed: %d bytes while running, %d after" % (len(first), len(rest)))


def check_jobs(h, target, prompts):
    ref_greedy = [h.reference(target, p, 20, ignore_eos=True) for p in prompts[:2]]
    ref_seeded = h.reference(target, prompts[2], 20, temp=0.8, seed=7, top_p=0.95, ignore_eos=True)
    history = [{"role": "user", "content": prompts[0]}, {"role": "assistant", "content": "ok"}]
    ref_conv = h.reference(target, prompts[1], 20, ignore_eos=True, chat=True, history=history)
    lines = [
        {"id": "first", "prompt": prompts[0], "n": 20, "ignore_eos": True},
        {"id": 2, "prompt": prompts[2], "n": 20, "ignore_eos": True, "temp": 0.8, "top_p": 0.95, "seed": 7,
         "max_k": -1},
        {"id": "bad", "prompt": prompts[1], "n": "twenty"},
        {"id": "last", "prompt": prompts[1], "n": 20, "ignore_eos": True},
        {"id": "conv", "messages": history + [{"role": "user", "content": prompts[1]}], "n": 20, "ignore_eos": True},
    ]
    path = os.path.join(h.tmp, "jobs.jsonl")
    with open(path, "w") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    r = cli(h, "--jobs", path)
    H.check(r.returncode != 0, "--jobs with a bad line exited 0")
    out = [json.loads(l) for l in r.stdout.decode().splitlines() if l.strip()]
    H.check([o.get("id") for o in out] == ["first", 2, "bad", "last", "conv"],
            "--jobs results out of order or ids not echoed: %s" % [o.get("id") for o in out])
    H.check(out[0].get("ids") == ref_greedy[0]["ids"], "job 'first' differs from specd-generate")
    H.check(out[3].get("ids") == ref_greedy[1]["ids"], "job 'last' differs from specd-generate")
    H.check(out[4].get("ids") == ref_conv["ids"] and out[4].get("prompt_tokens") == len(ref_conv["prompt_ids"]), "job 'conv' (messages) differs from specd-generate --chat --message: %s"
            % out[4])
    H.check(out[1].get("ids") == ref_seeded["ids"], "seeded target-only job differs from specd-generate "
            "--temp 0.8 --top-p 0.95 --seed 7: %s vs %s" % (out[1].get("ids"), ref_seeded["ids"]))
    H.check(out[2].get("error", {}).get("code") == "BAD_JOB" and "n" in out[2]["error"].get("message", ""),
            "bad job line: %s" % out[2])
    H.check(b"#" not in r.stderr, "progress bar printed although stderr is a pipe: %r" % r.stderr[-200:])
    # stderr on a terminal: the progress bar is drawn, up to 1/1
    ok = os.path.join(h.tmp, "one.jsonl")
    with open(ok, "w") as f:
        f.write(json.dumps(lines[0]) + "\n")
    master, slave = pty.openpty()
    try:
        r = cli(h, "--jobs", ok, stderr=slave)
        os.close(slave)
        slave = None
        tty = b""
        while select.select([master], [], [], 1)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            tty += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    H.check(r.returncode == 0, "--jobs (one good line) exited %d" % r.returncode)
    H.check(b"1/1" in tty and b"#" in tty, "no progress bar on a terminal stderr: %r" % tty[-200:])
    H.log("--jobs: order, ids, BAD_JOB line, seeded job and progress bar as expected")


def check_jobs_unreachable(h):
    port = H.free_port()  # a port nobody listens on
    path = os.path.join(h.tmp, "unreachable.jsonl")
    with open(path, "w") as f:
        for i in range(5):
            f.write(json.dumps({"id": i, "prompt": "hello", "n": 4}) + "\n")
    r = subprocess.run([h.bin("client"), "--coordinator", "tcp://127.0.0.1:%d" % port, "--timeout", "1",
                        "--jobs", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    H.check(r.returncode != 0, "--jobs against nobody exited 0")
    out = [json.loads(l) for l in r.stdout.decode().splitlines() if l.strip()]
    H.check([o.get("id") for o in out] == list(range(5)), "--jobs against nobody: %s" % out)
    H.check("unreachable" in out[0].get("error", {}).get("message", ""), "first job's error: %s" % out[0])
    H.check(all(o.get("error", {}).get("code") == "UNAVAILABLE" for o in out[1:]),
            "the jobs after the first were submitted (each waits --timeout): %s" % out[1:])
    H.check(b"not submitted" in r.stderr, "no message on stderr: %r" % r.stderr[-300:])
    H.log("--jobs against a coordinator that does not answer: one timeout, the rest UNAVAILABLE")


def check_special(h, target):
    text = "<|im_start|>user hello<|im_end|> and"
    plain = h.reference(target, text, 6, ignore_eos=True)
    r = subprocess.run([h.bin("generate"), "-m", target, "-p", text, "-n", "6", "--json", "-t", "1", "--ignore-eos",
                        "--special"], capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate --special failed: %s" % r.stderr[-500:])
    special = json.loads(r.stdout.decode("utf-8", "surrogateescape"))
    H.check(len(special["prompt_ids"]) < len(plain["prompt_ids"]),
            "--special did not read the control tokens: %d vs %d prompt tokens"
            % (len(special["prompt_ids"]), len(plain["prompt_ids"])))
    for flags, ref in (([], plain), (["--special"], special)):
        r = cli(h, "-p", text, "-n", "6", "--ignore-eos", "--json", *flags)
        H.check(r.returncode == 0, "specd-client %s exited %d: %s" % (flags, r.returncode, r.stderr[-300:]))
        res = json.loads(r.stdout)
        H.check(res.get("prompt_tokens") == len(ref["prompt_ids"]) and res.get("ids") == ref["ids"],
                "specd-client %s: %s prompt tokens, ids %s; specd-generate: %d, %s"
                % (flags, res.get("prompt_tokens"), res.get("ids"), len(ref["prompt_ids"]), ref["ids"]))
    r = cli(h, "-p", text, "-n", "6", "--chat", "--special")
    H.check(r.returncode != 0, "--special with --chat was not refused")
    r = cli(h, "-p", "x", "-n", "0")
    H.check(r.returncode == 2, "-n 0 exited %d, not refused" % r.returncode)
    H.log("--special: %d prompt tokens against %d as text, same ids as specd-generate; refused with --chat; -n 0 "
          "refused" % (len(special["prompt_ids"]), len(plain["prompt_ids"])))


def run(h):
    check_help(h)
    check_jobs_unreachable(h)
    target, _ = h.tiny_models(seed=23)
    prompts = H.random_prompts(3, seed=41)
    ref = h.reference(target, prompts[0], 24, ignore_eos=True)
    h.start_service(target, drafter="layers", coord_extra=list(H.FIXED_K))
    check_special(h, target)

    r = cli(h, "-p", prompts[0], "-n", "24", "--ignore-eos", "--json")
    H.check(r.returncode == 0, "specd-client --json exited %d: %s" % (r.returncode, r.stderr[-500:]))
    res = json.loads(r.stdout)
    H.check(res.get("ids") == ref["ids"], "specd-client --json: %s vs specd-generate %s" % (res.get("ids"),
                                                                                          ref["ids"]))
    H.check(res.get("stop_reason") == "LENGTH", "stop_reason %s" % res.get("stop_reason"))
    st = res.get("stats", {})
    H.check(st.get("drafted", 0) > 0 and st.get("drafter_kind") == "self",
            "specd-client --json: drafted %s tokens with the self-draft drafter, but drafter_kind %r"
            % (st.get("drafted"), st.get("drafter_kind")))
    H.log("specd-client --json: drafted %s, drafter_kind %r" % (st.get("drafted"), st.get("drafter_kind")))
    H.check(st.get("drafter_switches") == 0, "one drafter kind, yet drafter_switches %r" % st.get("drafter_switches"))

    # --stop: a stop string taken from the reference's own text ends the output before it
    text = ref["text_bytes"]
    stop = None
    for i in range(4, len(text) - 2):
        cand = text[i:i + 2]
        if all(32 <= b < 127 for b in cand) and cand not in text[:i + 1]:
            stop = cand.decode()
            cut = i
            break
    if stop:
        r = cli(h, "-p", prompts[0], "-n", "24", "--ignore-eos", "--json", "--stop", stop)
        res = json.loads(r.stdout)
        H.check(res.get("stop_reason") == "STOP_STRING", "--stop %r: stop_reason %s" % (stop, res.get("stop_reason")))
        got = res.get("text", "").encode("utf-8", "surrogateescape")
        H.check(stop.encode() not in got, "--stop %r: the stop string is in the output %r" % (stop, got))
        H.log("--stop %r ended the text at byte %d (reference cut %d)" % (stop, len(got), cut))

    check_streaming(h, prompts[1])
    check_jobs(h, target, prompts)


if __name__ == "__main__":
    H.main(run)
