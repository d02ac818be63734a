#!/usr/bin/env python3
"""Oracle: specd's rendering of tools, tool calls and tool turns against
jinja2 running the real Llama 3.1 / 3.2, Mistral v3 (mistral-v0.3.jinja:
ids, [TOOL_RESULTS]) and Qwen 2.5 templates (tests/data/chat_templates/),
byte for byte, as transformers' apply_chat_template does
(its tojson filter: json.dumps(ensure_ascii=False), keys in order).

specd gets the client's JSON text (tools, each call's arguments) and
re-serialises it as Python would (engine/formats/chat_tools.c); jinja2 gets
it parsed by json.loads. The cases cover integers, floats in every repr
form Python picks, escapes, non-ASCII and astral characters, nesting,
empty containers, a system prompt or none, calls and tool answers in the
history, with and without the generation prompt and the leading BOS; and
the refusals (two calls in one turn; tools and no user message) where
jinja2 raises. Exit 0: all equal; 1: a mismatch; 77: skipped."""
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_chat_templates import BOS_MARK, CLI, DATA, SKIP, run_cli  # noqa: E402

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # pragma: no cover
    print(f"SKIP: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

TOOLS = [
    '[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",'
    ' "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},'
    ' "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]',
    '[{"type":"function","function":{"name":"f","parameters":{"a":1.0,"b":2.5e-7,"c":1e20,"d":-0.0,"e":100,'
    '"f":0.0001,"g":123456789012345678,"h":1.5E+300,"i":[],"j":{},"k":[true,false,null],"l":-0,'
    '"m":0.1,"n":1e16,"o":12345.678}}},'
    ' {"type": "function", "function": {"name": "g", "description": "qu\\"ote \\\\ sl\\/ash \\n nl \\t tab'
    ' \\u0007 bel \\u00e9 \\ud83d\\ude00 caf\u00e9 \u2713", "parameters": {}}}]',
    '[]',
]


def call(name, args):
    return {"role": "assistant", "content": "", "tool_calls_json": json.dumps([{"name": name, "arguments": args}],
                                                                             separators=(",", ":"))}


def conversations():
    u = lambda c: {"role": "user", "content": c}
    s = lambda c: {"role": "system", "content": c}
    tool = lambda c: {"role": "tool", "content": c}
    hist = [u("What is the weather in Paris?"), call("get_weather", {"city": "Paris", "n": 2.0, "x": [1, {"y": None}]}),
            tool('{"temperature": 21, "sky": "clear"}'), {"role": "assistant", "content": "  It is 21 C.  "},
            u("And in Rome?")]
    return [
        [u("Hello")],
        [s("  You are terse.  "), u("  Hi!  ")],
        hist,
        [s("sys")] + hist,
        [u("q"), call("get_weather", {"city": "Z\u00fcrich \"q\" \n"}), tool("line1\nline2 \"quoted\" \u00e9 \x01"),
         tool("second answer")],
        [s("only a system prompt")],  # with tools: no first user message (jinja2 raises)
        [u("two calls"), {"role": "assistant", "content": "", "tool_calls_json":
                          '[{"name":"a","arguments":{}},{"name":"b","arguments":{}}]'}],  # refused
        [{"role": "assistant", "content": "first"}, u("then")],
    ]


def to_jinja(msgs):
    """The messages as an OpenAI client gives them to transformers: each
    call {"type": "function", "function": {its members but "id"}, "id"}."""
    out = []
    for m in msgs:
        m = dict(m)
        if "tool_calls_json" in m:
            m["tool_calls"] = [dict({"type": "function", "function": {k: v for k, v in c.items() if k != "id"}},
                                    **({"id": c["id"]} if "id" in c else {}))
                               for c in json.loads(m.pop("tool_calls_json"))]
        out.append(m)
    return out


def render(template, msgs, tools, gen, bos=BOS_MARK, eos="<|eot_id|>"):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)  # as transformers defines it
    env.filters["tojson"] = tojson
    kw = {"tools": tools} if tools is not None else {}
    try:
        return env.from_string(template).render(messages=to_jinja(msgs), add_generation_prompt=gen,
                                                bos_token=bos, eos_token=eos, **kw)
    except jinja2.exceptions.TemplateError:
        return None


MISTRAL_TOOLS = TOOLS + [
    '[{"type": "function", "function": {"name": "h", "description": "raw \\"quote\\" and \\\\ and \\u00e9",'
    ' "return": {"type": "string"}, "strict": true, "parameters": {"type": "object", "x": null}}},'
    ' {"type": "function", "function": {"return": 1}}]',
]


def mcall(calls, content=""):
    """An assistant turn with calls (name, arguments, id)."""
    return {"role": "assistant", "content": content, "tool_calls_json": json.dumps(
        [dict({"name": n, "arguments": a}, **({"id": i} if i is not None else {})) for n, a, i in calls])}


def id_conversations():
    """Conversations with call ids: Mistral's and Qwen's templates."""
    u = lambda c: {"role": "user", "content": c}
    s = lambda c: {"role": "system", "content": c}
    a = lambda c: {"role": "assistant", "content": c}
    tool = lambda c, i="abcDEF123": dict({"role": "tool", "content": c}, **({"tool_call_id": i} if i else {}))
    hist = [u("What is the weather in Paris?"), mcall([("get_weather", {"city": "Paris", "n": 2.0}, "abcDEF123")]),
            tool('{"temperature": 21, "sky": "clear"}'), a("  It is 21 C.  "), u("And in Rome?")]
    par = [u("Two cities"), mcall([("get_weather", {"city": "A"}, "aaaaaaaa1"), ("get_weather", {"city": "B\u00e9"},
                                                                                  "bbbbbbbb2")], "thinking "),
           tool("sunny", "aaaaaaaa1"), tool("line1\nline2 \"q\" \u00e9", "bbbbbbbb2")]
    return [
        [u("Hello")],
        [s("  You are terse.  "), u("  Hi!  ")],
        hist,
        [s("sys")] + hist,
        par,
        [s("S")] + par,  # ends with a tool turn: Mistral drops the system prompt
        [u("same"), a("x"), u("same")],  # Mistral: tools before both (equal to the last user message)
        [u("q"), mcall([("get_weather", {}, "\u00e9" * 9)]), tool("ok", "\u00e9" * 9)],  # 9 characters, 18 bytes
        [u("q"), mcall([("get_weather", {}, "call_1")]), tool("ok", "call_1")],  # Mistral refuses the ids
        [u("q"), mcall([("get_weather", {}, None)]), tool("ok", "abcDEF123")],  # no call id: Mistral refuses
        [u("q"), mcall([("get_weather", {}, "abcDEF123")]), tool("ok", None)],  # no tool_call_id: Mistral refuses
        [u("one"), u("two")],  # Mistral refuses
        [a("first"), u("then")],  # Mistral refuses
        [u("a"), s("mid"), u("b")],  # Mistral refuses; Qwen renders it as a turn
        [s("only a system prompt")],
    ]


def family_check(fixture, bos, eos, tools_list, source=None):
    """Each id conversation x tools, rendered by specd (the fixture's text,
    or source: chat_cli's arguments, a --name) and by jinja2 on the fixture:
    returns (failures, cases, refusals)."""
    with open(os.path.join(DATA, fixture), encoding="utf-8") as f:
        template = f.read()
    cases = []
    for conv in id_conversations():
        for tools in [None] + tools_list:
            for gen in (False, True):
                c = {"messages": conv, "add_generation_prompt": gen, "bos": bos, "eos": eos, "drop_bos": False,
                     "tools_api": True}
                if tools is not None:
                    c["tools_json"] = tools
                cases.append(c)
    source = source or [os.path.join(DATA, fixture)]
    rc, head, replies = run_cli(source, cases)
    if rc != 0 or len(replies) != len(cases):
        return [f"chat_cli {source[-1]}: exit {rc}, {head}, {len(replies)} replies for {len(cases)} cases"], 0, 0
    fails, refusals = [], 0
    for c, r in zip(cases, replies):
        tools = json.loads(c["tools_json"]) if "tools_json" in c else None
        want = render(template, c["messages"], tools, c["add_generation_prompt"], bos, eos)
        refusals += want is None
        if want != r.get("text"):
            fails.append(f"{source[-1]}: tools={c.get('tools_json', 'none')[:40]!r} gen={c['add_generation_prompt']} "
                         f"{c['messages']}\n  jinja2: {want!r}\n  specd:  {r.get('text')!r} {r.get('refused', '')}")
    return fails, len(cases), refusals


def malformed_check():
    """JSON the walkers must refuse, not misread (and not crash on, under
    ASan): broken or trailing-comma lists, a list that is an object, nesting
    past 64, a lone surrogate, a number Python prints as inf, text after the
    list. (What is valid JSON but odd, a call without arguments, renders as
    each template does: the oracle above.)"""
    deep = "[" * 100 + "]" * 100
    bad_tools = ["[{", "[1,]", '{"a": 1}', "[" + deep + "]", '[{"function": {}}] x', '["\\ud800"]', "[1e999]"]
    u = {"role": "user", "content": "q"}
    bad_calls = ["[{]", '[{"name": "f", "arguments": {}, "id": "abcDEF123"},]', '[{"name": "f", "arguments": {]',
                 '[{"name": "f", "arguments": ' + deep + ', "id": "abcDEF123"}]']
    fails = []
    for fixture in ("mistral-v0.3.jinja", "qwen2.5.jinja"):
        cases = [{"messages": [u], "tools_api": True, "tools_json": t, "bos": "<s>", "eos": "</s>"} for t in bad_tools]
        cases += [{"messages": [u, {"role": "assistant", "content": "", "tool_calls_json": c},
                                {"role": "tool", "content": "x", "tool_call_id": "abcDEF123"}],
                   "tools_api": True, "bos": "<s>", "eos": "</s>"} for c in bad_calls]
        rc, head, replies = run_cli([os.path.join(DATA, fixture)], cases)
        if rc != 0 or len(replies) != len(cases):
            fails.append(f"{fixture} malformed JSON: exit {rc}, {len(replies)} replies for {len(cases)} cases")
            continue
        for c, r in zip(cases, replies):
            if "refused" not in r:
                fails.append(f"{fixture}: accepted malformed {c.get('tools_json') or c['messages'][1]}: {r}")
    return fails


def hermes_check():
    """The other families get the Hermes text turns (Qwen 2.5's form with compact JSON: specd's own
    form, no template to compare with): checked on ChatML by construction."""
    tools = '[{"type":"function","function":{"name":"now","parameters":{"a":1}}}]'
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": "ok", "tool_calls_json": '[{"name":"now","arguments":{"tz":"UTC"}}]'},
            {"role": "tool", "content": "12:00"}]
    case = {"messages": conv, "add_generation_prompt": True, "bos": "", "eos": "", "tools_api": True,
            "tools_json": tools}
    bad = dict(case, messages=conv[:2] + [dict(conv[2], tool_calls_json="[{]")])
    rc, head, replies = run_cli(["--name", "chatml"], [case, dict(case, messages=conv[1:]), bad])
    desc = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
            "function signatures within <tools></tools> XML tags:\n<tools>\n" + tools[1:-1] + "\n</tools>\n\nFor "
            "each function call, return a json object with function name and arguments within <tool_call></tool_call>"
            " XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
    turns = ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nok\n<tool_call>\n{\"name\":\"now\",\"arguments\":"
             "{\"tz\":\"UTC\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n12:00\n</tool_response>"
             "<|im_end|>\n<|im_start|>assistant\n")
    want = ["<|im_start|>system\nS\n\n" + desc + "<|im_end|>\n" + turns,
            "<|im_start|>system\n" + desc + "<|im_end|>\n" + turns]
    fails = [f"chatml with tools: {r.get('text', r)!r}\n  expected {w!r}" for r, w in zip(replies, want)
             if r.get("text") != w]
    if rc != 0 or len(replies) != 3 or "refused" not in replies[2]:
        fails.append(f"chatml: exit {rc}, a malformed call gave {replies[2:]}")
    return fails


def main():
    if not os.access(CLI, os.X_OK):
        print(f"SKIP: {CLI} is not built")
        return SKIP
    cases = []
    for conv in conversations():
        for tools in [None] + TOOLS:
            for gen in (False, True):
                for drop in (False, True):
                    c = {"messages": conv, "add_generation_prompt": gen, "bos": "<|begin_of_text|>",
                         "eos": "<|eot_id|>", "drop_bos": drop, "tools_api": True}
                    if tools is not None:
                        c["tools_json"] = tools
                    cases.append(c)
    failures, refusals = [], 0
    sources = [(f, [os.path.join(DATA, f)]) for f in ("llama3.1.jinja", "llama3.2.jinja")]
    sources += [(f"llama3.{v}.jinja", ["--name", f"llama3.{v}"]) for v in (1, 2)]
    for fixture, source in sources:
        with open(os.path.join(DATA, fixture), encoding="utf-8") as f:
            template = f.read()
        rc, head, replies = run_cli(source, cases)
        if rc != 0 or head.get("family") != "llama3" or len(replies) != len(cases):
            print(f"FAIL: chat_cli {source}: exit {rc}, {head}, {len(replies)} replies for {len(cases)} cases")
            return 1
        for c, r in zip(cases, replies):
            tools = json.loads(c["tools_json"]) if "tools_json" in c else None
            want = render(template, c["messages"], tools, c["add_generation_prompt"])
            if want is not None:
                if c["drop_bos"] and want.startswith(BOS_MARK):
                    want = want[len(BOS_MARK):]
                want = want.replace(BOS_MARK, c["bos"])
            got = r.get("text")
            refusals += want is None
            if want != got:
                failures.append(f"{source[-1]}: tools={c.get('tools_json', 'none')[:40]!r} gen="
                                f"{c['add_generation_prompt']} drop_bos={c['drop_bos']} {c['messages']}\n"
                                f"  jinja2: {want!r}\n  specd:  {got!r} {r.get('refused', '')}")
    n_total = len(sources) * len(cases)
    more = []
    for fixture, bos, eos, tl, src in (("mistral-v0.3.jinja", "<s>", "</s>", MISTRAL_TOOLS, None),
                                       ("mistral-v0.3.jinja", "<s>", "</s>", MISTRAL_TOOLS, ["--name", "mistral-v3"]),
                                       ("mistral-nemo.jinja", "<s>", "</s>", MISTRAL_TOOLS, None),
                                       ("mistral-nemo.jinja", "<s>", "</s>", MISTRAL_TOOLS, ["--name", "mistral-nemo"]),
                                       ("qwen2.5.jinja", "<|endoftext|>", "<|im_end|>", TOOLS, None),
                                       ("qwen2.5.jinja", "<|endoftext|>", "<|im_end|>", TOOLS, ["--name", "qwen2.5"])):
        f, n, r = family_check(fixture, bos, eos, tl, src)
        failures += f
        n_total += n
        more.append(f"{src[-1] if src else fixture}: {n} ({r} refused by both)")
    failures += hermes_check() + malformed_check()
    if failures:
        print(f"FAIL: {len(failures)} of {n_total} differ")
        for x in failures[:6]:
            print(x)
        return 1
    print(f"OK: {len(sources) * len(cases)} conversations with tools formatted as jinja2 renders Llama 3.1's and "
          f"3.2's templates ({refusals} refused by both); {'; '.join(more)}; ChatML gets the Hermes text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
