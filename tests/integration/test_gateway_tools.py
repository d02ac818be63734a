"""Tool calls streamed under tool_choice "auto" through specd-gateway with
the official `openai` client (issue 35), on SmolLM2 with the n-gram drafter
(K fixed at 4, so several tokens can arrive in one chunk).

SmolLM2-135M does not call tools on its own; a history of earlier turns
answered with calls (rendered as <tool_call> blocks) makes it answer the
next question with one, greedily. For each request the streamed answer is
reassembled as the client would and compared with the same request
unstreamed (greedy: the same text):

- an answer that is a call: the first tool_calls delta carries id, type
  and name once; the arguments come in several fragments that join into
  valid JSON equal to the unstreamed call's; no content delta comes after
  the first tool_calls delta; finish_reason "tool_calls" in both;
- the same with the calls written in the history as two parallel calls
  (the answer then holds one or more calls, each checked alike);
- an answer that is plain text (no few-shot history): the streamed
  content equals the unstreamed content, no tool_calls delta, the same
  finish_reason."""
import json

import harness as H
import tool_ref

try:
    import openai
except ImportError:
    openai = None

TOKENS = 80
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def few_shot(cities, parallel):
    """Earlier turns each answered with a call (or two, parallel)."""
    msgs = []
    for i, city in enumerate(cities):
        names = ["get_weather", "get_time"] if parallel else ["get_weather"]
        msgs += [{"role": "user", "content": "What is the weather in %s?" % city},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "c%d_%d" % (i, k), "type": "function",
                      "function": {"name": n, "arguments": json.dumps({"city": city})}}
                     for k, n in enumerate(names)]}]
    return msgs


def streamed(cl, greedy, msgs):
    """The stream reassembled: (content, {index: call}, finish, argument fragments)."""
    return tool_ref.streamed(cl, messages=msgs, tools=TOOLS, **greedy)


def check_same(cl, greedy, msgs, what, want_calls):
    r = cl.chat.completions.create(messages=msgs, tools=TOOLS, **greedy)
    ch = r.choices[0]
    content, calls, finish, frags = streamed(cl, greedy, msgs)
    H.check(finish == ch.finish_reason, "%s: streamed finish %s, unstreamed %s" % (what, finish, ch.finish_reason))
    if not want_calls:
        H.check(not ch.message.tool_calls and not calls, "%s: calls %s / %s" % (what, ch.message.tool_calls, calls))
        H.check(content == ch.message.content, "%s: streamed %r, unstreamed %r" % (what, content, ch.message.content))
        H.log("%s: text %r streamed as content" % (what, content))
        return
    H.check(ch.message.tool_calls and finish == "tool_calls",
            "%s: no call (finish %s): %r" % (what, ch.finish_reason, ch.message.content))
    H.check(sorted(calls) == list(range(len(ch.message.tool_calls))),
            "%s: streamed calls %s, unstreamed %s" % (what, calls, ch.message.tool_calls))
    for k, want in enumerate(ch.message.tool_calls):
        got = calls[k]
        try:
            args = json.loads(got["arguments"])
        except ValueError as e:
            raise H.TestFailure("%s: call %d: streamed arguments %r are not JSON (%s)" % (what, k, got["arguments"], e))
        H.check(got["name"] == want.function.name and args == json.loads(want.function.arguments),
                "%s: call %d streamed %s, unstreamed %s" % (what, k, got, want.function))
    H.check(frags >= 2 * len(calls), "%s: the arguments came in %d fragments, not as tokens arrived" % (what, frags))
    H.log("%s: %d call(s) in %d argument fragments: %s" % (what, len(calls), frags,
                                                         ["%s(%s)" % (c["name"], c["arguments"]) for c in
                                                          calls.values()]))


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)
    ask = lambda q: [{"role": "user", "content": q}]
    check_same(cl, greedy, few_shot(["Paris", "Rome"], False) + ask("What is the weather in London?"),
               "auto, a call", True)
    check_same(cl, greedy, few_shot(["Paris", "Rome"], True) + ask("What is the weather in Oslo?"),
               "auto, parallel calls in the history", True)
    check_same(cl, greedy, ask("What is the weather in Paris?"), "auto, text", False)


if __name__ == "__main__":
    H.main(run)
