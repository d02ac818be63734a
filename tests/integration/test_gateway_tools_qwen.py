"""Tools through specd-gateway rendered by Qwen 2.5's chat template
(issue 35: Qwen2.5-Instruct's, tests/data/chat_templates/qwen2.5.jinja),
with the official `openai` client.

The service runs SmolLM2 with the coordinator's --chat-template qwen2.5
(SmolLM2's vocabulary has <|im_start|> and <|im_end|>, the rest is text).
Every chat request's prompt is also rendered here with jinja2 from the real
template and sent as a raw completion (parse_special): greedy, the two
prompts must be the same length and the answers the same text, so the
coordinator rendered the `# Tools` system block with <tools></tools>, the
calls as <tool_call> blocks and the `tool` turns as <tool_response> inside
one user turn byte for byte as the template does.

- forced (tool_choice naming the function): a call, finish_reason
  "tool_calls", unstreamed and streamed (the streamed arguments come in
  fragments that join into JSON equal to the unstreamed call's);
- auto, after a history of calls: SmolLM2 answers with
  <tool_call>\\n{...}\\n</tool_call> (the raw completion shows the tags),
  parsed into tool_calls, streamed alike;
- parallel: the history's turns each hold two calls; the answer holds two
  <tool_call> blocks, parsed into two tool_calls (streamed alike).
  tool_choice "required" cannot ask for two: a forced answer is one JSON
  object (the gateway's constraint, gateway/tools.c), as vLLM's is;
- the round trip: the calls and two `tool` messages answering them (one
  user turn, two <tool_response> blocks), an answer and a new question."""
import json

import harness as H
import tool_ref

try:
    import openai
except ImportError:
    openai = None

TOKENS = 80
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                           "parameters": CITY}}]


def render(msgs, tools):
    """transformers' apply_chat_template(msgs, tools=tools, add_generation_prompt=True) on Qwen 2.5's template."""
    return tool_ref.render("qwen2.5.jinja", msgs, tools, add_generation_prompt=True)


def history(cities, names):
    """Earlier turns each answered with calls of names (parallel when two)."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i, city in enumerate(cities):
        msgs += [{"role": "user", "content": "What is the %s in %s?" % (" and the ".join(n[4:] for n in names), city)},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call%d%d" % (i, k), "type": "function",
                      "function": {"name": n, "arguments": json.dumps({"city": city})}}
                     for k, n in enumerate(names)]}]
    return msgs


def streamed(cl, req):
    """The stream reassembled: (content, [(name, arguments)], finish, argument fragments)."""
    content, calls, finish, frags = tool_ref.streamed(cl, **req)
    H.check(sorted(calls) == list(range(len(calls))), "streamed call indexes %s" % sorted(calls))
    return content, [(calls[k]["name"], calls[k]["arguments"]) for k in sorted(calls)], finish, frags


def same_as_template(cl, greedy, msgs, tools):
    """The jinja2 rendering as a raw completion: (its text, its prompt tokens)."""
    prompt = render(msgs, tools)
    c = cl.completions.create(prompt=prompt, extra_body={"parse_special": True}, **greedy)
    return prompt, c.choices[0].text, c.usage.prompt_tokens


def check_calls(cl, greedy, msgs, req_extra, what, n_calls, tags):
    """A request answered with n_calls calls: unstreamed, streamed and the template's rendering agree."""
    req = dict(greedy, messages=msgs, tools=TOOLS, **req_extra)
    r = cl.chat.completions.create(**req)
    ch = r.choices[0]
    prompt, text, n_prompt = same_as_template(cl, greedy, msgs, TOOLS)
    H.check(ch.finish_reason == "tool_calls" and ch.message.tool_calls and len(ch.message.tool_calls) == n_calls,
            "%s: %s %r %s (the jinja2 rendering answered %r)" % (what, ch.finish_reason, ch.message.content,
                                                                 ch.message.tool_calls, text))
    want = [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls]
    H.check(all(isinstance(a, dict) for _, a in want), "%s: arguments not objects: %s" % (what, want))
    H.check(len({c.id for c in ch.message.tool_calls}) == n_calls, "%s: ids not distinct" % what)
    content, calls, finish, frags = streamed(cl, req)
    H.check(finish == "tool_calls" and len(calls) == n_calls, "%s: streamed %s %s" % (what, finish, calls))
    for k, (name, args) in enumerate(calls):
        try:
            parsed = json.loads(args)
        except ValueError as e:
            raise H.TestFailure("%s: call %d: streamed arguments %r are not JSON (%s)" % (what, k, args, e))
        H.check((name, parsed) == want[k], "%s: call %d streamed %s(%s), unstreamed %s" % (what, k, name, args,
                                                                                          want[k]))
    H.check(frags >= 2 * n_calls, "%s: the arguments came in %d fragments" % (what, frags))
    H.check("# Tools\n\nYou may call one or more functions" in prompt and
            "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) in prompt,
            "%s: the jinja2 rendering is not Qwen's tools form: %r" % (what, prompt[:400]))
    H.check(n_prompt == r.usage.prompt_tokens, "%s: chat prompt %d tokens, the jinja2 rendering %d"
            % (what, r.usage.prompt_tokens, n_prompt))
    if tags:  # the model wrote the calls in Qwen's tags: the raw text holds the same calls
        blocks = text.split("<tool_call>")[1:]
        H.check(len(blocks) == n_calls and all("</tool_call>" in b for b in blocks),
                "%s: the jinja2 rendering answered %r, not %d <tool_call> blocks" % (what, text, n_calls))
        raw = [json.loads(b.split("</tool_call>")[0]) for b in blocks]
        H.check([(c["name"], c["arguments"]) for c in raw] == want, "%s: the tags hold %s, tool_calls %s"
                % (what, raw, want))
    H.log("%s: %d call(s) (%d argument fragments streamed), prompt %d tokens as the template renders it: %s"
          % (what, n_calls, frags, n_prompt, ["%s(%s)" % c for c in calls]))
    return ch.message.tool_calls


def run(h):
    if openai is None or tool_ref.jinja2 is None:
        H.skip("the openai or jinja2 package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K + ["--chat-template", "qwen2.5"])
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)
    ask = lambda q: [{"role": "user", "content": q}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    check_calls(cl, greedy, ask("What is the weather in Rome?"), {"tool_choice": named}, "forced", 1, False)
    check_calls(cl, greedy, history(["Paris", "Rome"], ["get_weather"]) + ask("What is the weather in London?"),
                {}, "auto", 1, True)
    calls = check_calls(cl, greedy, history(["Paris", "Rome"], ["get_weather", "get_time"]) +
                        ask("What is the weather and the time in Oslo?"), {}, "auto, parallel", 2, True)
    # the round trip: both calls answered by tool turns, an answer, a new question
    hist = (history([], []) + ask("What is the weather in Oslo?") +
            [{"role": "assistant", "content": None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                              "arguments": c.function.arguments}} for c in calls]},
             {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temperature": 21})},
             {"role": "tool", "tool_call_id": calls[1].id, "content": "14:05"},
             {"role": "assistant", "content": "It is 21 degrees in Oslo at 14:05."},
             {"role": "user", "content": "Write a short poem about Oslo."}])
    for choice in ("auto", "none"):  # "none": the tools are not rendered (the history still is)
        r = cl.chat.completions.create(messages=hist, tools=TOOLS, tool_choice=choice, **greedy)
        msg = r.choices[0].message
        prompt, text, n_prompt = same_as_template(cl, greedy, hist, TOOLS if choice == "auto" else None)
        H.check(('<|im_start|>user\n<tool_response>\n{"temperature": 21}\n</tool_response>\n<tool_response>\n'
                 '14:05\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21') in prompt and
                '\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>' in prompt
                and ("<tools>" in prompt) == (choice == "auto"),
                "the jinja2 rendering is not the expected Qwen form: %r" % prompt)
        H.check(n_prompt == r.usage.prompt_tokens, "tool_choice %s: chat prompt %d tokens, the jinja2 rendering %d"
                % (choice, r.usage.prompt_tokens, n_prompt))
        H.check(not msg.tool_calls and msg.content == text and len(text) > 0,
                "tool_choice %s: chat answered %r %s, the jinja2 rendering %r" % (choice, msg.content,
                                                                                  msg.tool_calls, text))
        H.log("tool_choice %s: a tool round trip rendered as Qwen 2.5's template does (%d prompt tokens): %r"
              % (choice, n_prompt, text))


if __name__ == "__main__":
    H.main(run)
