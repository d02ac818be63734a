"""Tools through specd-gateway rendered by Llama 3.1's chat template
(issue 35), with the official `openai` client.

The service runs SmolLM2 with the coordinator's --chat-template llama3.1
(the demo model's own template is ChatML; its vocabulary lacks Llama's
header tokens, so their text is encoded as text, which is all this test
needs). A conversation with tools, an assistant's tool call and the
`tool` message answering it goes through /v1/chat/completions; the same
conversation is rendered here with jinja2 from the real template
(tests/data/chat_templates/llama3.1.jinja, as transformers renders it) and
sent as a raw completion (parse_special: its BOS text is the control
token, as the template writes it). Greedy, the two answers must be the
same text: the coordinator rendered the tools, the call (as {"name",
"parameters"}) and the ipython turn byte for byte as Meta's template does.
A second request forces a call (tool_choice naming the function) and
checks the answer parses into tool_calls (the constraint admits Llama's
"parameters" key), streamed or not."""
import json

import harness as H
import tool_ref

try:
    import openai
except ImportError:
    openai = None

TOKENS = 24
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string", "maxLength": 12}},
                                                          "required": ["city"], "additionalProperties": False}}}]
MSGS = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2.0})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 21, "sky": "clear"})}]


def render(bos, tools):
    """transformers' apply_chat_template(MSGS, tools=TOOLS, add_generation_prompt=True) on Llama 3.1's template."""
    return tool_ref.render("llama3.1.jinja", MSGS, tools, call_ids=False, add_generation_prompt=True, bos_token=bos,
                           eos_token="<|im_end|>")


def run(h):
    if openai is None or tool_ref.jinja2 is None:
        H.skip("the openai or jinja2 package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K + ["--chat-template", "llama3.1"])
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)
    # SmolLM2's BOS is <|im_start|> and its tokenizer adds none: the template writes it
    for choice in ("auto", "none"):  # "none": the tools are not rendered (the history still is)
        r = cl.chat.completions.create(messages=MSGS, tools=TOOLS, tool_choice=choice, **greedy)
        msg = r.choices[0].message
        prompt = render("<|im_start|>", TOOLS if choice == "auto" else None)
        H.check("<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temperature\\\": 21" in prompt and
                '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2.0}}<|eot_id|>' in prompt and
                ("Environment: ipython" in prompt) == (choice == "auto"),
                "the jinja2 rendering is not the expected Llama 3.1 form: %r" % prompt)
        c = cl.completions.create(prompt=prompt, extra_body={"parse_special": True}, **greedy)
        text = c.choices[0].text
        H.check(c.usage.prompt_tokens == r.usage.prompt_tokens, "tool_choice %s: chat prompt %d tokens, the jinja2 "
                "rendering %d" % (choice, r.usage.prompt_tokens, c.usage.prompt_tokens))
        if msg.tool_calls:  # the same text, read as a call
            call = json.loads(text.replace("<|python_tag|>", "").strip())
            H.check(call["name"] == msg.tool_calls[0].function.name and
                    call.get("parameters", call.get("arguments")) == json.loads(msg.tool_calls[0].function.arguments),
                    "tool_choice %s: chat called %s, the jinja2 rendering answered %r" % (choice, msg.tool_calls, text))
        else:
            H.check(msg.content == text, "tool_choice %s: chat answered %r, the jinja2 rendering %r"
                    % (choice, msg.content, text))
        H.log("tool_choice %s: a tool round trip rendered as Llama 3.1's template does (%d prompt tokens): %r"
              % (choice, r.usage.prompt_tokens, msg.tool_calls or msg.content))
    # a forced call, in Llama's or Hermes' key, parsed into tool_calls (streamed too)
    named = {"type": "function", "function": {"name": "get_weather"}}
    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    r = cl.chat.completions.create(messages=ask, tools=TOOLS, tool_choice=named, **dict(greedy, max_tokens=40))
    ch = r.choices[0]
    H.check(ch.finish_reason == "tool_calls" and ch.message.tool_calls and
            ch.message.tool_calls[0].function.name == "get_weather",
            "forced call: %s %s" % (ch.finish_reason, ch.message))
    args = json.loads(ch.message.tool_calls[0].function.arguments)
    H.check(isinstance(args.get("city"), str), "forced call arguments %r" % args)
    streamed = ""
    for chunk in cl.chat.completions.create(messages=ask, tools=TOOLS, tool_choice=named, stream=True,
                                            **dict(greedy, max_tokens=40)):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed += (tc.function and tc.function.arguments) or ""
    H.check(json.loads(streamed) == args, "streamed arguments %r, unstreamed %r" % (streamed, args))
    H.log("forced call under the llama3.1 template: get_weather(%s)" % ch.message.tool_calls[0].function.arguments)


if __name__ == "__main__":
    H.main(run)
