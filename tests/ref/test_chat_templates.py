#!/usr/bin/env python3
"""Oracle: specd's chat-template formatter against jinja2, byte for byte.

Each real template in tests/data/chat_templates/ is rendered with jinja2 the
way transformers' apply_chat_template does (sandboxed environment,
trim_blocks, lstrip_blocks, loopcontrols, raise_exception) and formatted by
specd through tests/chat_cli, for conversations with and without system
prompts, multi-turn histories, whitespace and Unicode that trim/strip touch,
conversations a template refuses, each with and without
add_generation_prompt, and with the leading BOS left to the tokenizer
(drop_bos: specd leaves out the BOS the template writes first). Either both
refuse or the texts are equal.

Also checked: each file is recognised as its family, zephyr's template and
templates using features specd does not reproduce are refused, and a
family chosen by name (--chat-template) formats as the real template does.

Exit 0: all equal; 1: a mismatch (the first ones are printed); 77: skipped.
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # pragma: no cover
    print(f"SKIP: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))
DATA = os.path.join(SRC, "tests", "data", "chat_templates")
CLI = os.path.join(BUILD, "tests", "chat_cli")

# file -> (family, bos_token, eos_token) as the model's tokenizer has them
TEMPLATES = {
    "smollm2.jinja": ("chatml", "<|im_start|>", "<|im_end|>"),
    "chatml.jinja": ("chatml", "<s>", "<|im_end|>"),
    "qwen2.5.jinja": ("chatml", "<|endoftext|>", "<|im_end|>"),
    "llama3.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2.jinja": ("llama2", "<s>", "</s>"),
    "mistral-v0.1.jinja": ("mistral", "<s>", "</s>"),
    "mixtral.jinja": ("mistral", "<s>", "</s>"),
    "mistral-v0.3.jinja": ("mistral", "<s>", "</s>"),
    "mistral-nemo.jinja": ("mistral", "<s>", "</s>"),
    "gemma.jinja": ("gemma", "<bos>", "<eos>"),
    "gemma3.jinja": ("gemma", "<bos>", "<eos>"),
    "phi3.jinja": ("phi3", "<s>", "<|endoftext|>"),
    "phi3.5.jinja": ("phi3", "<s>", "<|endoftext|>"),
}
# name -> the fixture it must format exactly like
NAMED = {"chatml": "chatml.jinja", "qwen2.5": "qwen2.5.jinja", "llama3": "llama3.jinja", "llama3.1": "llama3.1.jinja", "llama3.2": "llama3.2.jinja", "llama2": "llama2.jinja",
         "mistral": "mixtral.jinja", "mistral-v3": "mistral-v0.3.jinja", "mistral-nemo": "mistral-nemo.jinja", "gemma": "gemma.jinja", "gemma3": "gemma3.jinja", "phi3": "phi3.jinja"}


BOS_MARK = "\x00bos\x00"


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


CONVERSATIONS = [
    msgs(("user", "Hello")),
    msgs(("system", "You are terse."), ("user", "Hi!")),
    msgs(("system", "You are a helpful assistant"), ("user", "Hello"), ("assistant", "Hi there"),
         ("user", "Who are you"), ("assistant", "   I am an assistant   "), ("user", "Another question")),
    msgs(("user", "2+2?"), ("assistant", "4"), ("user", "And 3+3?")),
    msgs(("user", "2+2?"), ("assistant", "4")),
    msgs(("user", "\u00a0 spaced\t\n"), ("assistant", " x \u3000"), ("user", "\u00dcn\u00efc\u00f6d\u00e9 \u2713 \U0001f642\n")),
    msgs(("user", "\x1c\u2028 edges \u205f\u2000")),
    msgs(("system", ""), ("user", "q")),
    msgs(("system", "  padded system  "), ("user", "  padded user  ")),
    msgs(("user", "{{ bos_token }} <|im_end|> [INST] <<SYS>> literal")),
    msgs(("user", "")),
    # refused by the families that demand alternation
    msgs(("user", "one"), ("user", "two")),
    msgs(("assistant", "first"), ("user", "then")),
    msgs(("user", "a"), ("system", "mid"), ("user", "b")),
    msgs(("system", "only a system prompt")),
]


def render(template, conv, gen, bos, eos):
    """What transformers' apply_chat_template(tokenize=False) returns, or None when it raises."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)  # as transformers defines it
    try:
        return env.from_string(template).render(messages=conv, add_generation_prompt=gen,
                                                bos_token=bos, eos_token=eos)
    except jinja2.exceptions.TemplateError:
        return None


def run_cli(args, cases):
    p = subprocess.run([CLI] + args, input="".join(json.dumps(c) + "\n" for c in cases),
                       capture_output=True, text=True, encoding="utf-8", timeout=300)
    lines = [x for x in p.stdout.split("\n") if x]  # not splitlines(): U+2028 is inside texts
    if not lines:
        raise RuntimeError(f"chat_cli {args} printed nothing (exit {p.returncode}): {p.stderr}")
    head = json.loads(lines[0])
    return p.returncode, head, [json.loads(x) for x in lines[1:]]


def cases_for(bos, eos):
    out = []
    for conv in CONVERSATIONS:
        for gen in (False, True):
            for drop in (False, True):
                out.append({"messages": conv, "add_generation_prompt": gen, "bos": bos, "eos": eos,
                            "drop_bos": drop})
    return out


def compare(label, template, cases, replies, failures):
    if len(replies) != len(cases):
        failures.append(f"{label}: {len(replies)} replies for {len(cases)} cases")
        return
    for c, r in zip(cases, replies):
        # a marker for bos_token tells the BOS the template writes first from
        # text that merely looks like it (SmolLM2's BOS is <|im_start|>)
        want = render(template, c["messages"], c["add_generation_prompt"], BOS_MARK, c["eos"])
        if want is not None:
            if c["drop_bos"] and want.startswith(BOS_MARK):
                want = want[len(BOS_MARK):]
            want = want.replace(BOS_MARK, c["bos"])
        got = r.get("text")
        if want is None and got is None:
            continue
        if want != got:
            failures.append(f"{label}: gen={c['add_generation_prompt']} drop_bos={c['drop_bos']} "
                            f"messages={json.dumps(c['messages'])}\n  jinja2: {want!r}\n  specd:  {got!r}"
                            f"{'  (' + r['refused'] + ')' if 'refused' in r else ''}")


def main():
    if not os.path.exists(CLI):
        print(f"SKIP: {CLI} not built")
        return SKIP
    failures = []
    n_cases = 0
    for name, (family, bos, eos) in TEMPLATES.items():
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            template = f.read()
        cases = cases_for(bos, eos)
        rc, head, replies = run_cli([os.path.join(DATA, name)], cases)
        if head.get("family") != family:
            failures.append(f"{name}: recognised as {head}, expected {family}")
            continue
        compare(name, template, cases, replies, failures)
        n_cases += len(cases)
    for name, fixture in NAMED.items():
        family, bos, eos = TEMPLATES[fixture]
        with open(os.path.join(DATA, fixture), encoding="utf-8") as f:
            template = f.read()
        cases = cases_for(bos, eos)
        rc, head, replies = run_cli(["--name", name], cases)
        compare(f"--name {name}", template, cases, replies, failures)
        n_cases += len(cases)
    # refused: a real template of another shape, and known families with
    # features specd does not reproduce
    with open(os.path.join(DATA, "llama3.jinja"), encoding="utf-8") as f:
        llama3 = f.read()
    with open(os.path.join(DATA, "chatml.jinja"), encoding="utf-8") as f:
        chatml = f.read()
    with open(os.path.join(DATA, "mistral-v0.3.jinja"), encoding="utf-8") as f:
        mistral3 = f.read()
    refused = {"zephyr.jinja": None,
               "mistral v3 tekken (no spaces)": mistral3.replace('"[INST] "', '"[INST]"').replace(
                   "[AVAILABLE_TOOLS] [", "[AVAILABLE_TOOLS]["),
               "llama3 + tools": "{% if tools is not none %}{{ tools }}{% endif %}" + llama3,
               "chatml + thinking": chatml + "{% if enable_thinking %}<think>{% endif %}",
               "two families": llama3 + chatml,
               "no template": "{{ messages[0]['content'] }}"}
    with tempfile.TemporaryDirectory() as tmp:
        for label, text in refused.items():
            path = os.path.join(DATA, label)
            if text is not None:
                path = os.path.join(tmp, "t.jinja")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            rc, head, _ = run_cli([path], [])
            if rc != 3 or "error" not in head:
                failures.append(f"{label}: accepted ({head}), expected a refusal")
    rc, head, _ = run_cli(["--name", "vicuna"], [])
    if rc != 3:
        failures.append(f"--name vicuna: accepted ({head})")
    if failures:
        print(f"FAIL: {len(failures)} mismatches; the first ones:")
        for f in failures[:10]:
            print(f)
        return 1
    print(f"OK: {n_cases} conversations formatted as jinja2 renders them, {len(TEMPLATES)} templates "
          f"recognised, {len(refused) + 1} refusals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
