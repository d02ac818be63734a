"""Tools through specd-gateway rendered by Mistral's v3 chat template
(issue 35: Mistral-7B-Instruct-v0.3's, tests/data/chat_templates/
mistral-v0.3.jinja), with the official `openai` client.

The service runs SmolLM2 with the coordinator's --chat-template mistral-v3
(its vocabulary lacks Mistral's control tokens, so [INST], [TOOL_CALLS] and
the rest are encoded as text, which is all this test needs). A call is
forced (tool_choice naming the function): its id must be 9 letters and
digits, the form Mistral's template demands. That call and a `tool`
message answering it (tool_call_id = the id) go back through
/v1/chat/completions, with an answer and a new question after them (the
system prompt goes into that last user turn, the tools before it); the
same conversation is rendered here with jinja2
from the real template and sent as a raw completion (parse_special).
Greedy, the two answers must be the same text and the prompts the same
length: the coordinator rendered [AVAILABLE_TOOLS], [TOOL_CALLS] with the
id and [TOOL_RESULTS] with the call_id byte for byte as the template does.
A tool message without tool_call_id is a 400 (the template raises).
test_gateway_tools_mistral_nemo.py runs the same with --chat-template
mistral-nemo against Mistral-Nemo-Instruct-2407's template (the same form
without the spaces after the tags)."""
import json
import re

import harness as H
import tool_ref

try:
    import openai
except ImportError:
    openai = None

TOKENS = 24
# form -> (its template fixture, what follows [INST], [AVAILABLE_TOOLS]... and comes before an answer)
FORMS = {"mistral-v3": ("mistral-v0.3.jinja", " "), "mistral-nemo": ("mistral-nemo.jinja", "")}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string", "maxLength": 12}},
                                                          "required": ["city"], "additionalProperties": False}}}]


def render(msgs, tools, bos, eos, fixture="mistral-v0.3.jinja"):
    """transformers' apply_chat_template(msgs, tools=tools) on Mistral's v3 template (or fixture)."""
    return tool_ref.render(fixture, msgs, tools, bos_token=bos, eos_token=eos)


def run(h, form="mistral-v3"):
    fixture, sp = FORMS[form]
    if openai is None or tool_ref.jinja2 is None:
        H.skip("the openai or jinja2 package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K + ["--chat-template", form])
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)
    ask = [{"role": "system", "content": "You are a helpful assistant."},
           {"role": "user", "content": "What is the weather in Rome?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = cl.chat.completions.create(messages=ask, tools=TOOLS, tool_choice=named, **dict(greedy, max_tokens=40))
    ch = r.choices[0]
    H.check(ch.finish_reason == "tool_calls" and ch.message.tool_calls and
            ch.message.tool_calls[0].function.name == "get_weather", "forced call: %s %s" % (ch.finish_reason,
                                                                                             ch.message))
    call = ch.message.tool_calls[0]
    H.check(re.fullmatch(r"[A-Za-z0-9]{9}", call.id) is not None, "the call's id %r is not 9 letters and digits"
            % call.id)
    # the call and its answer back in the history; SmolLM2's BOS is <|im_start|>, its EOS <|im_end|>
    hist = ask + [{"role": "assistant", "content": None, "tool_calls": [
                      {"id": call.id, "type": "function",
                       "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
                  {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})},
                  {"role": "assistant", "content": "It is 21 degrees in Rome."},
                  {"role": "user", "content": "Write a short poem about Rome."}]
    for choice in ("auto", "none"):  # "none": the tools are not rendered (the history still is)
        # SmolLM2 answers the unfamiliar form with its EOS at once: ignore_eos makes the comparison one of text
        r = cl.chat.completions.create(messages=hist, tools=TOOLS, tool_choice=choice, extra_body={"ignore_eos": True},
                                       **greedy)
        msg = r.choices[0].message
        prompt = render(hist, TOOLS if choice == "auto" else None, "<|im_start|>", "<|im_end|>", fixture)
        H.check(('[TOOL_CALLS]%s[{"name": "get_weather", "arguments": ' % sp) in prompt and
                ('"id": "%s"}]<|im_end|>[TOOL_RESULTS]%s{"content": {"temperature": 21}, "call_id": "%s"}'
                 "[/TOOL_RESULTS]%sIt is 21 degrees in Rome.<|im_end|>" % (call.id, sp, call.id, sp)) in prompt and
                prompt.endswith("[INST]%sYou are a helpful assistant.\n\nWrite a short poem about Rome.[/INST]" % sp)
                and ("[AVAILABLE_TOOLS]%s[" % sp in prompt) == (choice == "auto"),
                "the jinja2 rendering is not the expected %s form: %r" % (form, prompt))
        c = cl.completions.create(prompt=prompt, extra_body={"parse_special": True, "ignore_eos": True}, **greedy)
        text = c.choices[0].text
        H.check(c.usage.prompt_tokens == r.usage.prompt_tokens, "tool_choice %s: chat prompt %d tokens, the jinja2 "
                "rendering %d" % (choice, r.usage.prompt_tokens, c.usage.prompt_tokens))
        if msg.tool_calls:
            H.check(msg.tool_calls[0].function.name in text, "tool_choice %s: chat called %s, the jinja2 rendering "
                    "answered %r" % (choice, msg.tool_calls, text))
        else:
            H.check(msg.content == text and len(text) > 0, "tool_choice %s: chat answered %r, the jinja2 rendering %r"
                    % (choice, msg.content, text))
        H.log("tool_choice %s: a tool round trip rendered as %s's template does (%d prompt tokens): %r"
              % (choice, fixture, r.usage.prompt_tokens, msg.tool_calls or msg.content))
    # without the tool message's tool_call_id the template raises: a 400
    bad = hist[:3] + [{"role": "tool", "content": "21"}]
    try:
        cl.chat.completions.create(messages=bad, tools=TOOLS, **greedy)
        H.check(False, "a tool message without tool_call_id was accepted")
    except openai.BadRequestError as e:
        H.check("Tool call IDs" in str(e), "the 400 does not say why: %s" % e)
        H.log("a tool message without tool_call_id: 400 (%s)" % str(e)[:160])


if __name__ == "__main__":
    H.main(run)
