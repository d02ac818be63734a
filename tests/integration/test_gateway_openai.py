"""specd-gateway through the official `openai` Python client, on SmolLM2
with the n-gram drafter (K fixed at 4, so drafts are verified):

- greedy chat and completions, streaming and not, give specd-generate's
  text for the same prompt (--chat for chat), with its token counts in
  `usage` and its finish reason;
- a completion from token ids equals the one from the text they encode;
- `stop` ends the text before the stop string (finish_reason stop);
- `echo` puts the prompt before the text, streamed or not;
- `max_tokens` cuts at exactly that many tokens (finish_reason length);
- `n` greedy samples are all the reference, streamed too; `usage` counts
  the prompt once; a batch of prompts gets one choice per prompt;
- sampled requests with a `seed` (n = 3) are reproduced exactly by a second
  call, and the three samples are not all equal (a control: the seeds
  differ);
- streaming with include_usage ends with a usage-only chunk;
- a multi-turn conversation (system, user, assistant, user) gives the text
  and prompt token count of specd-generate --chat --system ... --message
  ROLE:TEXT ... with the same history (both use the model's chat template);
- /v1/models lists the served model;
- the legacy functions, and tool_choice required without tools, are 400s
  naming the field; response_format text is accepted (json_object,
  json_schema and tools are honoured: test_gateway_structured.py)."""
import concurrent.futures
import json
import subprocess

import harness as H

try:
    import openai
except ImportError:
    openai = None

CHAT_Q = "What is the capital of France?"
TEXT_P = "The three primary colors are"
TOKENS = 8


def generate_system(h, model, system, prompt, n, history=()):
    """specd-generate --chat --system [--message ROLE:TEXT ...]: the reference
    for a system message and a conversation's history."""
    argv = [h.bin("generate"), "-m", model, "-p", prompt, "-n", str(n), "--json", "-t", "1", "--chat", "--system",
            system]
    for m in history:
        argv += ["--message", "%s:%s" % (m["role"], m["content"])]
    out = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(out.returncode == 0, "specd-generate --system failed: %s" % out.stderr[-500:])
    return json.loads(out.stdout)


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    ref_chat = h.reference(model, CHAT_Q, TOKENS, chat=True)
    ref_text = h.reference(model, TEXT_P, TOKENS)
    sysmsg = "You are a pirate."
    ref_sys = generate_system(h, model, sysmsg, CHAT_Q, TOKENS)
    history = [{"role": "user", "content": CHAT_Q}, {"role": "assistant", "content": "Paris."}]
    follow_up = "And the capital of Italy?"
    ref_multi = generate_system(h, model, sysmsg, follow_up, TOKENS, history)
    H.log("references: chat %r (%s), completion %r (%s)" % (ref_chat["text"], ref_chat["stop_reason"],
                                                          ref_text["text"], ref_text["stop_reason"]))
    words = ref_text["text"].split()
    H.check(len(words) >= 3, "reference too short for a stop test: %r" % ref_text["text"])
    stop = " " + words[2]
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=120)

    def finish_of(ref):
        return "stop" if ref["stop_reason"] == "eos" else "length"

    user = [{"role": "user", "content": CHAT_Q}]
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)
    sampled = dict(model="smollm", prompt="Once upon a time", temperature=1.0, top_p=0.95, max_tokens=TOKENS, n=3,
                   seed=4242, extra_body={"ignore_eos": True})
    # Every call at once: they are independent, the service batches them,
    # and seeded and greedy outputs must not depend on the company they keep.
    calls = {
        "chat": lambda: cl.chat.completions.create(messages=user, **greedy),
        "chat_stream": lambda: list(cl.chat.completions.create(messages=user, stream=True,
                                                               stream_options={"include_usage": True}, **greedy)),
        "text": lambda: cl.completions.create(prompt=TEXT_P, **greedy),
        "text_stream": lambda: list(cl.completions.create(prompt=TEXT_P, stream=True, **greedy)),
        "text_ids": lambda: cl.completions.create(prompt=ref_text["prompt_ids"], **greedy),
        "stop_list": lambda: cl.completions.create(prompt=TEXT_P, stop=[stop, "zzzq"], **greedy),
        "stop_str": lambda: cl.completions.create(prompt=TEXT_P, stop=stop, **greedy),
        "max3": lambda: cl.completions.create(prompt=TEXT_P, **dict(greedy, max_tokens=3)),
        "n3": lambda: cl.completions.create(prompt=TEXT_P, n=3, **greedy),
        "n2_stream": lambda: list(cl.completions.create(prompt=TEXT_P, n=2, stream=True, **greedy)),
        "echo": lambda: cl.completions.create(prompt=TEXT_P, echo=True, **greedy),
        "echo_stream": lambda: list(cl.completions.create(prompt=TEXT_P, echo=True, stream=True, **greedy)),
        "batch": lambda: cl.completions.create(prompt=[TEXT_P, ref_text["prompt_ids"]], **greedy),
        "sampled_a": lambda: cl.completions.create(**sampled),
        "sampled_b": lambda: cl.completions.create(**sampled),
        "system": lambda: cl.chat.completions.create(messages=[{"role": "system", "content": sysmsg},
                                                               {"role": "user",
                                                                "content": [{"type": "text", "text": CHAT_Q}]}],
                                                     **greedy),
        "multi": lambda: cl.chat.completions.create(messages=[{"role": "system", "content": sysmsg}] + history +
                                                    [{"role": "user", "content": follow_up}], **greedy),
        "models": lambda: cl.models.list(),
    }
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = {k: pool.submit(f) for k, f in calls.items()}
        res = {k: f.result(timeout=300) for k, f in futures.items()}
    H.log("%d calls answered" % len(res))

    # ---- chat, not streaming
    r = res["chat"]
    H.check(r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "smollm",
            "chat envelope: %s" % r)
    H.check(len(r.choices) == 1 and r.choices[0].index == 0 and r.choices[0].message.role == "assistant",
            "chat choices: %s" % r.choices)
    H.check(r.choices[0].message.content == ref_chat["text"], "chat text %r vs specd-generate --chat %r"
            % (r.choices[0].message.content, ref_chat["text"]))
    H.check(r.choices[0].finish_reason == finish_of(ref_chat), "chat finish_reason %s, specd-generate stopped on %s"
            % (r.choices[0].finish_reason, ref_chat["stop_reason"]))
    u = r.usage
    H.check((u.prompt_tokens, u.completion_tokens, u.total_tokens) ==
            (len(ref_chat["prompt_ids"]), len(ref_chat["ids"]), len(ref_chat["prompt_ids"]) + len(ref_chat["ids"])),
            "chat usage %s vs specd-generate %d prompt + %d generated" % (u, len(ref_chat["prompt_ids"]),
                                                                         len(ref_chat["ids"])))

    # ---- chat, streaming with usage
    chunks = res["chat_stream"]
    H.check(chunks[0].choices[0].delta.role == "assistant", "first chunk has no role: %s" % chunks[0])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    H.check(text == ref_chat["text"], "streamed chat text %r vs %r" % (text, ref_chat["text"]))
    fins = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    H.check(fins == [finish_of(ref_chat)], "streamed finish reasons %s" % fins)
    H.check(not chunks[-1].choices and chunks[-1].usage and chunks[-1].usage.completion_tokens == len(ref_chat["ids"])
            and chunks[-1].usage.prompt_tokens == len(ref_chat["prompt_ids"]),
            "the last chunk is not the usage chunk: %s" % chunks[-1])
    H.check(len({c.id for c in chunks}) == 1, "chunks carry different ids")
    H.log("chat: %d chunks, text equal to specd-generate --chat" % len(chunks))

    # ---- completions, not streaming and streaming; token ids
    r = res["text"]
    H.check(r.object == "text_completion" and r.choices[0].text == ref_text["text"],
            "completion %r vs specd-generate %r" % (r.choices[0].text, ref_text["text"]))
    H.check(r.choices[0].finish_reason == finish_of(ref_text) and r.usage.completion_tokens == len(ref_text["ids"])
            and r.usage.prompt_tokens == len(ref_text["prompt_ids"]), "completion usage/finish: %s" % r)
    text = "".join(c.choices[0].text for c in res["text_stream"])
    H.check(text == ref_text["text"], "streamed completion %r vs %r" % (text, ref_text["text"]))
    r = res["text_ids"]
    H.check(r.choices[0].text == ref_text["text"], "completion from token ids %r vs %r"
            % (r.choices[0].text, ref_text["text"]))

    # ---- stop: a word from the middle of the greedy text
    want = ref_text["text"][:ref_text["text"].index(stop)]
    r = res["stop_list"]
    H.check(r.choices[0].text == want and r.choices[0].finish_reason == "stop",
            "stop %r: %r (%s), expected %r" % (stop, r.choices[0].text, r.choices[0].finish_reason, want))
    r = res["stop_str"]
    H.check(r.choices[0].text == want, "stop as a string: %r, expected %r" % (r.choices[0].text, want))

    # ---- max_tokens
    r = res["max3"]
    H.check(r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
            and ref_text["text"].startswith(r.choices[0].text), "max_tokens 3: %s" % r)

    # ---- n greedy
    r = res["n3"]
    H.check([c.index for c in r.choices] == [0, 1, 2] and all(c.text == ref_text["text"] for c in r.choices),
            "n=3 greedy: %s" % r.choices)
    H.check(r.usage.prompt_tokens == len(ref_text["prompt_ids"]) and
            r.usage.completion_tokens == 3 * len(ref_text["ids"]), "n=3 usage: %s" % r.usage)

    # ---- n streamed: interleaved chunks, one text per index
    texts = {}
    for c in res["n2_stream"]:
        texts[c.choices[0].index] = texts.get(c.choices[0].index, "") + c.choices[0].text
    H.check(texts == {0: ref_text["text"], 1: ref_text["text"]}, "n=2 streamed: %s" % texts)
    # ---- echo: the prompt, then the generated text
    r = res["echo"]
    H.check(r.choices[0].text == TEXT_P + ref_text["text"] and r.usage.completion_tokens == len(ref_text["ids"]),
            "echo: %r" % r.choices[0].text)
    text = "".join(c.choices[0].text for c in res["echo_stream"])
    H.check(text == TEXT_P + ref_text["text"], "echo streamed: %r" % text)
    # ---- a batch of prompts (text and token ids of the same prompt): one choice each
    r = res["batch"]
    H.check([c.index for c in r.choices] == [0, 1] and all(c.text == ref_text["text"] for c in r.choices) and
            r.usage.prompt_tokens == 2 * len(ref_text["prompt_ids"]), "a batch of two prompts: %s" % r)

    # ---- seeded sampling: reproducible, and the n samples differ
    a, b = ([c.text for c in res[k].choices] for k in ("sampled_a", "sampled_b"))
    for k in ("sampled_a", "sampled_b"):
        r = res[k]
        H.check(all(c.finish_reason == "length" for c in r.choices) and r.usage.completion_tokens == 3 * TOKENS,
                "sampled with ignore_eos: %s" % r)
    H.check(a == b, "seed 4242 not reproduced:\n  %s\n  %s" % (a, b))
    H.check(len(set(a)) > 1, "the n=3 samples are all equal (their seeds must differ): %s" % a)
    H.log("seeded samples reproduced: %s" % a)

    # ---- a system message: equals specd-generate --chat --system
    r = res["system"]
    H.check(r.choices[0].message.content == ref_sys["text"], "with a system message: %r vs specd-generate --system %r"
            % (r.choices[0].message.content, ref_sys["text"]))

    # ---- a multi-turn conversation: equals specd-generate --chat --message ...
    r = res["multi"]
    H.check(r.choices[0].message.content == ref_multi["text"] and
            r.usage.prompt_tokens == len(ref_multi["prompt_ids"]),
            "multi-turn: %r (%d prompt tokens) vs specd-generate --message %r (%d)"
            % (r.choices[0].message.content, r.usage.prompt_tokens, ref_multi["text"], len(ref_multi["prompt_ids"])))
    H.log("multi-turn: %r, as specd-generate --chat with the same history" % r.choices[0].message.content)

    # ---- models
    H.check([m.id for m in res["models"].data] == ["smollm"], "models: %s" % res["models"])

    # ---- fields that change the output and are not honoured: a 400 naming each, never free text
    refused = {
        "functions": dict(functions=[{"name": "f", "parameters": {"type": "object"}}]),
        "tool_choice": dict(tool_choice="required"),  # without tools
    }
    for param, kw in refused.items():
        try:
            cl.chat.completions.create(messages=user, **greedy, **kw)
            H.check(False, "%s was accepted (it must be a 400 until it is honoured)" % param)
        except openai.BadRequestError as e:
            H.check(e.status_code == 400 and e.param == param, "%s: %s param %s" % (param, e.status_code, e.param))
    r = cl.chat.completions.create(messages=user, response_format={"type": "text"}, **greedy)
    H.check(r.choices[0].message.content == ref_chat["text"], "response_format text: %r" % r.choices[0].message.content)


if __name__ == "__main__":
    H.main(run)
