#!/usr/bin/env python3
"""The chat template is read from the model file, through specd-generate.

A tiny random model (specd-mkmodel) gets a template with gguf's
gguf_new_metadata; specd-generate --chat --json reports the formatted
prompt, which must equal jinja2's rendering of the same template
(tests/ref/test_chat_templates.py has the exhaustive comparison):

- a GGUF with Meta-Llama-3's template is formatted as Llama 3, for a
  conversation with a system prompt and history (--message);
- with tokenizer.ggml.add_bos_token set, the BOS the template writes is
  left to the tokenizer: the same ids, one BOS;
- the same model as a Hugging Face directory (specd-mkmodel --convert: the
  template in tokenizer_config.json) gives the same prompt and ids, and so
  do a list of named templates there and a chat_template.jinja file;
- an unrecognised template (zephyr's) is refused, naming --chat-template,
  by specd-generate and by specd-coordinator (which does not start);
  --chat-template NAME overrides it;
- a model with no template is formatted as ChatML, with a warning.

Exit 0: all as expected; 1: a mismatch; 77: skipped.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77
try:
    import gguf  # noqa: F401  (gguf_new_metadata below)
    from test_chat_templates import render
except ImportError as e:  # pragma: no cover
    print(f"SKIP: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))
DATA = os.path.join(SRC, "tests", "data", "chat_templates")
MKMODEL = os.path.join(BUILD, "tools", "specd-mkmodel")
GENERATE = os.path.join(BUILD, "tools", "specd-generate")
COORDINATOR = os.path.join(BUILD, "coordinator", "specd-coordinator")

CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello "}, {"role": "user", "content": "Again?"}]


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300, **kw)


def generate(model, *extra):
    """specd-generate --chat over CONV: (exit code, its JSON or None, stderr)."""
    argv = [GENERATE, "-m", model, "--chat", "--system", CONV[0]["content"], "-n", "1", "-t", "1", "--json"]
    for m in CONV[1:-1]:
        argv += ["--message", "%s:%s" % (m["role"], m["content"])]
    argv += ["-p", CONV[-1]["content"]] + list(extra)
    p = run(argv)
    return p.returncode, json.loads(p.stdout) if p.returncode == 0 else None, p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coordinator(model, *extra):
    """Starts specd-coordinator on model: (exit code or None when it is up, its log)."""
    argv = [COORDINATOR, "--model", model, "--client-addr", "tcp://127.0.0.1:%d" % free_port(),
            "--worker-addr", "tcp://127.0.0.1:%d" % free_port()] + list(extra)
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    log = []
    deadline = time.monotonic() + 120
    try:
        for line in p.stderr:  # ends when the process exits
            log.append(line)
            if "chat template" in line and " target " in line:
                return None, "".join(log)
            if time.monotonic() > deadline:
                break
        return p.wait(timeout=30), "".join(log)
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=30)
        p.stderr.close()


def with_template(src, template_file, dst):
    p = run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template-file", template_file, src, dst,
             "--force"])
    if p.returncode != 0:
        raise RuntimeError(f"gguf_new_metadata failed: {p.stderr[-1000:]}")


def main():
    for exe in (MKMODEL, GENERATE):
        if not os.path.exists(exe):
            print(f"SKIP: {exe} not built")
            return SKIP
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.gguf")
        p = run([MKMODEL, "-o", base, "--dim", "32", "--heads", "2", "--kv-heads", "1", "--ff", "64", "--layers", "1"])
        if p.returncode != 0:
            print(f"FAIL: specd-mkmodel: {p.stderr}")
            return 1
        reader = gguf.GGUFReader(base)
        f = reader.fields["tokenizer.ggml.tokens"]

        def token(key):
            fid = reader.fields[key]
            i = int(fid.parts[fid.data[0]][0])
            return bytes(f.parts[f.data[i]]).decode()

        bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")

        def expected(name):
            with open(os.path.join(DATA, name), encoding="utf-8") as t:
                return render(t.read(), CONV, True, bos, eos)

        # Llama 3 in a GGUF
        l3 = os.path.join(tmp, "llama3.gguf")
        with_template(base, os.path.join(DATA, "llama3.jinja"), l3)
        rc, out, err = generate(l3)
        want = expected("llama3.jinja")
        check(rc == 0 and out["prompt"] == want,
              "GGUF with Llama 3's template: %r" % (out["prompt"] if out else err[-300:]))
        check(out is not None and "<|start_header_id|>" in out["prompt"], "the prompt is in Llama 3's format")
        # a tokenizer that adds BOS itself: the template's BOS is not doubled
        l3_bos = os.path.join(tmp, "llama3-bos.gguf")
        shutil.copyfile(l3, l3_bos)
        p = run([sys.executable, "-m", "gguf.scripts.gguf_set_metadata", "--force", l3_bos,
                 "tokenizer.ggml.add_bos_token", "1"])
        check(p.returncode == 0, "gguf_set_metadata add_bos_token: %s" % p.stderr[-300:])
        rc, out_bos, err = generate(l3_bos)
        check(rc == 0 and out is not None and out_bos["prompt_ids"] == out["prompt_ids"] and
              out_bos["prompt"] == want[len(bos):] and out_bos["prompt_ids"][1] != out_bos["prompt_ids"][0],
              "add_bos_token: one BOS, the tokenizer's: %s" % (out_bos["prompt_ids"][:4] if out_bos else err[-300:]))
        # the same model as a Hugging Face directory: tokenizer_config.json
        hf = os.path.join(tmp, "llama3-hf")
        p = run([MKMODEL, "-o", hf, "--format", "hf", "--convert", l3])
        check(p.returncode == 0, "specd-mkmodel --convert: %s" % p.stderr[-300:])
        rc, out_hf, err = generate(hf)
        check(rc == 0 and out is not None and out_hf["prompt"] == want and out_hf["prompt_ids"] == out["prompt_ids"],
              "Hugging Face directory (tokenizer_config.json): %r" % (out_hf["prompt"] if out_hf else err[-300:]))
        # the other places a Hugging Face directory keeps it: a list of named
        # templates ("default" is used), and chat_template.jinja
        cfg_path = os.path.join(hf, "tokenizer_config.json")
        with open(cfg_path, encoding="utf-8") as cf:
            cfg = json.load(cf)
        template = cfg["chat_template"]
        cfg["chat_template"] = [{"name": "tool_use", "template": "{{ tools }}"},
                                {"name": "default", "template": template}]
        with open(cfg_path, "w", encoding="utf-8") as cf:
            json.dump(cfg, cf)
        rc, out_list, err = generate(hf)
        check(rc == 0 and out_list["prompt"] == want, "tokenizer_config.json with a list of named templates: %r"
              % (out_list["prompt"] if out_list else err[-300:]))
        del cfg["chat_template"]
        with open(cfg_path, "w", encoding="utf-8") as cf:
            json.dump(cfg, cf)
        with open(os.path.join(hf, "chat_template.jinja"), "w", encoding="utf-8") as cf:
            cf.write(template)
        rc, out_file, err = generate(hf)
        check(rc == 0 and out_file["prompt"] == want, "chat_template.jinja: %r"
              % (out_file["prompt"] if out_file else err[-300:]))
        # unrecognised: refused with the hint; the override works
        zephyr = os.path.join(tmp, "zephyr.gguf")
        with_template(base, os.path.join(DATA, "zephyr.jinja"), zephyr)
        rc, out, err = generate(zephyr)
        check(rc != 0 and "--chat-template NAME" in err, "zephyr's template refused naming --chat-template: %r"
              % err[-400:])
        rc, out, err = generate(zephyr, "--chat-template", "phi3")
        check(rc == 0 and out["prompt"] == expected("phi3.jinja"),
              "--chat-template phi3 overrides it: %r" % (out["prompt"] if out else err[-300:]))
        rc, out, err = generate(zephyr, "--chat-template", "vicuna")
        check(rc != 0 and "chatml, qwen2.5, llama3" in err, "--chat-template with an unknown name: %r" % err[-300:])
        # the coordinator: refuses to start on it, starts with the override
        if os.path.exists(COORDINATOR):
            rc, log = coordinator(zephyr)
            check(rc not in (None, 0) and "--chat-template NAME" in log,
                  "specd-coordinator refuses zephyr's template naming --chat-template: %s" % log[-400:])
            rc, log = coordinator(zephyr, "--chat-template", "llama2")
            check(rc is None and "chat template llama2" in log, "specd-coordinator --chat-template llama2: %s"
                  % log[-400:])
            rc, log = coordinator(l3)
            check(rc is None and "chat template llama3" in log, "specd-coordinator reads Llama 3's: %s" % log[-400:])
        # Gemma refuses a system turn, as its template does
        gemma = os.path.join(tmp, "gemma.gguf")
        with_template(base, os.path.join(DATA, "gemma.jinja"), gemma)
        rc, out, err = generate(gemma)
        check(rc != 0 and "no system role" in err, "Gemma refuses the system turn: %r" % err[-300:])
        # no template at all: ChatML, with a warning
        rc, out, err = generate(base)
        check(rc == 0 and out["prompt"] == expected("chatml.jinja") and "no chat template" in err,
              "no template: ChatML with a warning: %r" % (out["prompt"] if out else err[-300:]))
    if failures:
        print(f"FAIL: {len(failures)} checks failed")
        return 1
    print("OK: the chat template is read from GGUF and Hugging Face models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
