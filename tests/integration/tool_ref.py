"""What the gateway tools tests share (test_gateway_tools*.py): a chat
template of tests/data/chat_templates rendered as transformers'
apply_chat_template renders it, and a streamed chat completion's tool-call
deltas reassembled and checked as the OpenAI stream shapes them."""
import json
import os

import harness as H

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    jinja2 = None


def render(fixture, msgs, tools=None, call_ids=True, **kw):
    """apply_chat_template(msgs, tools=tools, **kw) on the fixture: jinja2's sandbox with trim_blocks and
    lstrip_blocks, loop controls, transformers' tojson and raise_exception; the calls' arguments parsed, as
    vLLM passes them (their ids kept when call_ids)."""
    with open(os.path.join(H.SOURCE, "tests", "data", "chat_templates", fixture), encoding="utf-8") as f:
        template = f.read()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    out = []
    for m in msgs:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict({"type": "function",
                                     "function": {"name": c["function"]["name"],
                                                  "arguments": json.loads(c["function"]["arguments"])}},
                                    **({"id": c["id"]} if call_ids else {}))
                               for c in m["tool_calls"]]
        out.append(m)
    if tools:
        kw["tools"] = tools
    return env.from_string(template).render(messages=out, **kw)


def streamed(cl, **req):
    """The stream of cl.chat.completions.create(stream=True, **req) reassembled: (content, {index: call},
    finish, argument fragments); a call's head (id, type, whole name) comes first and once, content never
    after a call."""
    content, calls, finish, frags = "", {}, None, 0
    for chunk in cl.chat.completions.create(stream=True, **req):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        finish = chunk.choices[0].finish_reason or finish
        if d.content:
            H.check(not calls, "a content delta %r after a tool_calls delta" % d.content)
            content += d.content
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:  # the head: first, once, with the type and the whole name
                H.check(not c["id"] and not c["arguments"] and tc.type == "function" and tc.function.name,
                        "a second or late head %s" % tc)
            else:
                H.check(c["id"] and not (tc.function and tc.function.name), "a delta without a head first: %s" % tc)
            c["id"] = tc.id or c["id"]
            c["name"] += (tc.function and tc.function.name) or ""
            c["arguments"] += (tc.function and tc.function.arguments) or ""
            frags += 1 if tc.function and tc.function.arguments else 0
    return content, calls, finish, frags
