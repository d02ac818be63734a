"""Structured output through specd-gateway with the official `openai`
client (issue 35), on SmolLM2 with the n-gram drafter (K fixed at 4, so
drafts are verified under the constraint):

- chat with response_format json_schema, streaming and not: the content
  parses as JSON, validates against the schema (jsonschema), and equals
  specd-generate --chat --json-schema's text for the same prompt (greedy);
- completions with response_format json_schema (extra_body: the client's
  completions take no response_format), streaming and not: equal
  specd-generate --json-schema's text;
- chat with response_format json_object: specd-generate --response-json's
  text, a JSON object when it ends at EOS;
- the llama.cpp extension field `grammar` (GBNF, through extra_body) on
  completions: specd-generate --grammar's text;
- a schema keyword specd does not handle (patternProperties) is a 400 on
  param response_format whose message names the keyword; a malformed
  response_format is a 400 naming the sub-field;
- tools: tool_choice naming a function gives message.tool_calls with that
  name and arguments valid for its parameters (finish_reason tool_calls,
  content null); "required" and the named function streamed give a first
  delta with id, type and name, then the arguments in fragments as tokens
  arrive, which the client reassembles into one call with valid JSON
  arguments (named: equal to the unstreamed call's); "auto" answers with text or valid calls;
  a history with the assistant's tool_calls and a `tool` message is
  accepted and answered."""
import json
import os
import subprocess

import harness as H

try:
    import openai
except ImportError:
    openai = None
try:
    import jsonschema
except ImportError:
    jsonschema = None

TOKENS = 48
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                         "country": {"enum": ["France", "Spain", "Italy"]}},
        "required": ["city", "country"], "additionalProperties": False}
GRAMMAR = 'root ::= " " ("red" | "green" | "blue") ", " ("red" | "green" | "blue") "."\n'


def generate(h, model, prompt, flag, value, chat):
    argv = [h.bin("generate"), "-m", model, "-p", prompt, "-n", str(TOKENS), "--json", "-t", "1", flag]
    argv += [value] if value is not None else []
    argv += ["--chat"] if chat else []
    r = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate %s failed: %s" % (flag, r.stderr[-1000:]))
    return json.loads(r.stdout)


def validate(text, schema, what):
    try:
        v = json.loads(text)
    except ValueError as e:
        raise H.TestFailure("%s: not JSON (%s): %r" % (what, e, text))
    if jsonschema is not None:
        try:
            jsonschema.validate(v, schema)
        except jsonschema.ValidationError as e:
            raise H.TestFailure("%s: %r does not validate: %s" % (what, text, e.message))


def rf_schema(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    tmp = lambda name, text: (open(os.path.join(h.tmp, name), "w").write(text), os.path.join(h.tmp, name))[1]
    person, city, gram = (tmp("person.json", json.dumps(PERSON)), tmp("city.json", json.dumps(CITY)),
                          tmp("colors.gbnf", GRAMMAR))
    q_person, q_city, q_obj = "Give me a person as JSON.", "Describe Paris as JSON.", "Describe a cat as JSON."
    p_text, p_gram = "Here is a person in JSON:", "Two primary colors are"
    ref_person = generate(h, model, q_person, "--json-schema", person, True)
    ref_city = generate(h, model, q_city, "--json-schema", city, True)
    ref_obj = generate(h, model, q_obj, "--response-json", None, True)
    ref_text = generate(h, model, p_text, "--json-schema", person, False)
    ref_gram = generate(h, model, p_gram, "--grammar", gram, False)
    H.log("references: %r / %r / %r / %r / %r" % (ref_person["text"], ref_city["text"], ref_obj["text"],
                                                  ref_text["text"], ref_gram["text"]))
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)

    def chat(q, rf, stream=False):
        msgs = [{"role": "user", "content": q}]
        if not stream:
            r = cl.chat.completions.create(messages=msgs, response_format=rf, **greedy)
            return r.choices[0].message.content, r.choices[0].finish_reason
        text, finish = "", None
        for ch in cl.chat.completions.create(messages=msgs, response_format=rf, stream=True, **greedy):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        return text, finish

    for stream in (False, True):
        for q, schema, ref, name in ((q_person, PERSON, ref_person, "person"), (q_city, CITY, ref_city, "city")):
            text, finish = chat(q, rf_schema(name, schema), stream)
            what = "chat json_schema %s (stream %s)" % (name, stream)
            H.check(text == ref["text"], "%s: %r, specd-generate %r" % (what, text, ref["text"]))
            H.check(finish == "stop", "%s: finish_reason %s" % (what, finish))
            validate(text, schema, what)
        text, finish = chat(q_obj, {"type": "json_object"}, stream)
        H.check(text == ref_obj["text"], "chat json_object: %r, specd-generate %r" % (text, ref_obj["text"]))
        if finish == "stop":
            H.check(isinstance(json.loads(text), dict), "json_object: %r is not an object" % text)
        # completions
        if not stream:
            r = cl.completions.create(prompt=p_text, extra_body={"response_format": rf_schema("person", PERSON)},
                                     **greedy)
            text = r.choices[0].text
        else:
            text = "".join(c.choices[0].text for c in cl.completions.create(
                prompt=p_text, extra_body={"response_format": rf_schema("person", PERSON)}, stream=True, **greedy)
                if c.choices)
        H.check(text == ref_text["text"], "completion json_schema (stream %s): %r, specd-generate %r"
                % (stream, text, ref_text["text"]))
        validate(text, PERSON, "completion json_schema")
    H.log("json_schema / json_object through chat and completions, streamed or not: specd-generate's text")

    r = cl.completions.create(prompt=p_gram, extra_body={"grammar": GRAMMAR}, **greedy)
    H.check(r.choices[0].text == ref_gram["text"], "grammar: %r, specd-generate %r" % (r.choices[0].text,
                                                                                     ref_gram["text"]))

    # refusals
    bad = {"type": "object", "patternProperties": {"^a": {"type": "integer"}}}
    try:
        chat(q_person, rf_schema("bad", bad))
        H.check(False, "a schema with patternProperties was accepted")
    except openai.BadRequestError as e:
        H.check(e.status_code == 400 and e.param == "response_format" and "patternProperties" in str(e.message),
                "bad schema: %s param %s %r" % (e.status_code, e.param, e.message))
        H.log("bad schema refused: %s" % e.message)
    for rf, param in (({"type": "json_schema"}, "response_format.json_schema"),
                      ({"type": "yaml"}, "response_format.type"),
                      ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name")):
        try:
            chat(q_person, rf)
            H.check(False, "response_format %s was accepted" % rf)
        except openai.BadRequestError as e:
            H.check(e.status_code == 400 and e.param == param, "%s: %s param %s" % (rf, e.status_code, e.param))

    check_tools(cl, greedy)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 20}},
                                               "required": ["city"], "additionalProperties": False}}}]


def check_call(call, what):
    H.check(call.type == "function" and call.id, "%s: %s" % (what, call))
    params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
    validate(call.function.arguments, params, what)


def stream_call(cl, greedy, q, choice, same):
    calls, finish, frags, heads = {}, None, 0, 0
    for chunk in cl.chat.completions.create(messages=[{"role": "user", "content": q}], tools=TOOLS,
                                            tool_choice=choice, stream=True, **greedy):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        finish = chunk.choices[0].finish_reason or finish
        H.check(not d.content, "%s stream: content %r beside a forced call" % (choice, d.content))
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:  # the head: first, once, with the type and the whole name
                heads += 1
                H.check(not c["id"] and not c["arguments"] and tc.type == "function" and tc.function.name,
                        "%s stream: a second or late head %s" % (choice, tc))
            else:
                H.check(c["id"] and not (tc.function and tc.function.name), "%s stream: %s" % (choice, tc))
            c["id"] = tc.id or c["id"]
            c["name"] += (tc.function and tc.function.name) or ""
            c["arguments"] += (tc.function and tc.function.arguments) or ""
            frags += 1 if tc.function and tc.function.arguments else 0
    H.check(finish == "tool_calls" and len(calls) == 1 and heads == 1,
            "%s stream: finish %s calls %s" % (choice, finish, calls))
    c = calls[0]
    H.check(c["name"] in ("get_weather", "get_time") and c["id"], "%s stream: %s" % (choice, c))
    params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == c["name"])
    validate(c["arguments"], params, "%s stream" % choice)
    H.check(frags >= 3, "%s stream: the arguments came in %d fragments, not token by token: %r"
            % (choice, frags, c["arguments"]))
    if same is not None:
        H.check(c["name"] == same.function.name and json.loads(c["arguments"]) == json.loads(same.function.arguments),
                "%s stream: %s, unstreamed %s" % (choice, c, same.function))
    H.log("tool_choice %s, streamed in %d argument fragments: %s(%s)" % (choice, frags, c["name"], c["arguments"]))


def check_tools(cl, greedy):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = cl.chat.completions.create(messages=msgs, tools=TOOLS, tool_choice=named, **greedy)
    ch = r.choices[0]
    H.check(ch.finish_reason == "tool_calls" and ch.message.content is None and ch.message.tool_calls,
            "named tool: finish %s content %r calls %s" % (ch.finish_reason, ch.message.content,
                                                          ch.message.tool_calls))
    H.check(len(ch.message.tool_calls) == 1 and ch.message.tool_calls[0].function.name == "get_weather",
            "named tool: %s" % ch.message.tool_calls)
    check_call(ch.message.tool_calls[0], "named tool")
    H.log("tool_choice get_weather: %s(%s)" % (ch.message.tool_calls[0].function.name,
                                               ch.message.tool_calls[0].function.arguments))
    # streamed: the first delta carries id, type and name, then the
    # arguments come in fragments as tokens arrive; the openai client's
    # accumulation gives one call with valid arguments (named: the same as
    # unstreamed)
    for q, choice, same in (("What time is it in Rome?", "required", None),
                            (msgs[0]["content"], named, ch.message.tool_calls[0])):
        stream_call(cl, greedy, q, choice, same)
    # auto: text or valid calls
    r = cl.chat.completions.create(messages=msgs, tools=TOOLS, **greedy)
    ch = r.choices[0]
    if ch.message.tool_calls:
        H.check(ch.finish_reason == "tool_calls", "auto: calls with finish %s" % ch.finish_reason)
        for call in ch.message.tool_calls:
            check_call(call, "auto")
    else:
        H.check(isinstance(ch.message.content, str), "auto: neither text nor calls: %s" % ch.message)
    H.log("tool_choice auto: %s" % (ch.message.tool_calls or repr(ch.message.content)))
    # a round trip: the call and the tool's answer in the history
    hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    r = cl.chat.completions.create(messages=hist, tools=TOOLS, tool_choice="none", **greedy)
    H.check(isinstance(r.choices[0].message.content, str) and r.choices[0].message.content,
            "tool round trip: %s" % r.choices[0].message)
    H.check(not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls",
            "tool_choice none returned calls: %s, finish %s" % (r.choices[0].message, r.choices[0].finish_reason))
    H.log("after the tool's answer: %r" % r.choices[0].message.content)


if __name__ == "__main__":
    H.main(run)
