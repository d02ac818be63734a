"""`echo` for completions (issue 16): the prompt's tokens and their target
logprobs, and prompts of token ids, through the official `openai` client
against a live service on SmolLM2 (n-gram drafter, K fixed at 4).

- `echo=True, logprobs=3, max_tokens=0` ("score this text"): the text is
  the prompt, finish_reason "length", completion_tokens 0, one logprobs
  entry per prompt token; the first has a null logprob and null
  alternatives; every other one equals numpy's log-softmax of the engine's
  own logits for the prompt (tests/specd_logits, one forward of the whole
  prompt) within PROMPT_TOL: the service computes them in prefill chunks of
  at most 64 rows, so a 150-token prompt crosses chunk boundaries; the
  numpy reference model (tests/ref/llama_ref.py) agrees within REF_REL of
  the row's max |logit| where it is installed;
- the same with `max_tokens=5`: the prompt's entries, then the generated
  tokens' equal to specd-generate --logprobs 3 (plain decoding) and the text
  is the prompt then specd-generate's greedy text;
- a prompt of ids that continues greedily (the prompt's ids then
  specd-generate's greedy ids): at every generated position the echoed
  token is the top-1 of its alternatives and its logprob equals
  specd-generate's;
- streamed and not: the same text and entries;
- penalties do not touch prompt logprobs (they are the raw model's);
- echo of a prompt of ids gives the ids' text (specd-generate's detokenized
  text), with and without generation; ids that split a UTF-8 character
  give valid JSON (U+FFFD), checked on the raw bytes;
- max_tokens 0 without echo, and on chat, is a 400."""
import concurrent.futures
import json
import math
import os
import sys

import harness as H

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gateway_logprobs import engine_logits, generate, log_softmax  # noqa: E402

try:
    import openai
except ImportError:
    openai = None

TEXT_P = "The three primary colors are"
# ~150 tokens: crosses the verifier's 64-row prompt-logprob chunks twice
LONG_P = " ".join(["In the beginning of the story, the old sailor told the children about the sea,"
                   " the storms, the stars that guide ships at night, and the islands far away."] * 4)
TOP = 3
N = 5
# The service's prompt logprobs come from prefill chunks of up to 64 rows,
# specd_logits' from one forward of the whole prompt: CPU batch invariance
# makes them the same numbers; the float -> JSON -> float round trip and
# float32 log-softmax summation order leave ~1e-6.
PROMPT_TOL = 1e-4
LP_TOL = 1e-5  # generated tokens: the same path as test_gateway_logprobs
REF_REL = 0.05  # the numpy reference model: ~3% of max |logit| (test_forward_oracle.py)


def prompt_entries(lp, n_prompt):
    """(token_logprob, {token: logprob}) of the first n_prompt entries."""
    return list(zip(lp.token_logprobs[:n_prompt], lp.top_logprobs[:n_prompt]))


def check_shape(lp, n_entries, what):
    H.check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n_entries,
            "%s: logprobs lengths %d %d %d %d, expected %d" % (what, len(lp.tokens), len(lp.token_logprobs),
                                                              len(lp.top_logprobs), len(lp.text_offset), n_entries))
    H.check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None,
            "%s: the first prompt token has logprob %r / top %r, expected null" %
            (what, lp.token_logprobs[0], lp.top_logprobs[0]))
    H.check(lp.text_offset[0] == 0, "%s: text_offset starts at %d" % (what, lp.text_offset[0]))
    for i in range(1, n_entries):
        H.check(lp.text_offset[i] - lp.text_offset[i - 1] == len(lp.tokens[i - 1].encode()),
                "%s: text_offset %s does not follow the tokens %r" % (what, lp.text_offset, lp.tokens))
        v, d = lp.token_logprobs[i], lp.top_logprobs[i]
        H.check(v is not None and v <= 0 and isinstance(d, dict) and 1 <= len(d) <= TOP and
                max(d.values()) >= v - 1e-9, "%s: entry %d: %r %r" % (what, i, v, d))


def check_prompt_against_engine(h, model, ids, entries, what):
    """entries[i] for i >= 1: log p(ids[i] | ids[:i]) and the top TOP values,
    against numpy's log-softmax of the engine's logits at row i - 1."""
    import numpy as np
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
        from llama_ref import LlamaRef
        llama = LlamaRef(model)
    except ImportError as e:
        llama = None
        H.log("numpy reference not available (%s): only the engine's logits" % e)
    sources = []
    eng = engine_logits(h, model, ids, -1)  # [len(ids), n_vocab]
    H.check(eng is not None, "tests/specd_logits is not built: the prompt logprobs cannot be checked")
    sources.append(("engine logits", eng, None))
    if llama is not None:
        sources.append(("numpy reference", llama.logits(ids), REF_REL))
    for name, logits, rel in sources:
        worst = 0.0
        for i in range(1, len(ids)):
            v, d = entries[i]
            raw = np.asarray(logits[i - 1], dtype=np.float64)
            row = log_softmax(raw)
            tol = PROMPT_TOL if rel is None else rel * float(np.max(np.abs(raw)))
            want = float(row[ids[i]])
            want_top = sorted(row.tolist(), reverse=True)[:TOP]
            got_top = sorted(d.values(), reverse=True)
            # tokens with the same text share a key: compare what is there
            err = max([abs(v - want)] + [min(abs(x - y) for y in want_top) for x in got_top])
            worst = max(worst, err / tol)
            H.check(err <= tol, "%s position %d (id %d): logprob %.6f top %s; %s log-softmax %.6f top %s (limit %.3g)"
                    % (what, i, ids[i], v, got_top, name, want, want_top, tol))
        H.log("%s: %d prompt positions agree with the log-softmax of the %s (worst %.2f of the limit)" %
              (what, len(ids) - 1, name, worst))


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    ref = generate(h, model, TEXT_P, N, ["--logprobs", str(TOP)])
    ref_long = generate(h, model, LONG_P, 1)
    ref_cont = generate(h, model, TEXT_P, 8, ["--logprobs", str(TOP)])
    emoji = generate(h, model, "caf\u00e9 \U0001F99C", 1)  # the parrot: three byte-level tokens
    ids_p = list(ref["prompt_ids"])
    n_prompt = len(ids_p)
    H.check(len(ref_long["prompt_ids"]) > 128, "the long prompt has %d tokens, want > 128" %
            len(ref_long["prompt_ids"]))
    cont_ids = list(ref_cont["prompt_ids"]) + list(ref_cont["ids"])  # the prompt continued greedily

    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=120)
    g = dict(model="smollm", temperature=0)
    score = dict(g, echo=True, logprobs=TOP, max_tokens=0)
    calls = {
        "score": lambda: cl.completions.create(prompt=TEXT_P, **score),
        "score_stream": lambda: list(cl.completions.create(prompt=TEXT_P, stream=True, **score)),
        "score_long": lambda: cl.completions.create(prompt=LONG_P, **score),
        "score_pen": lambda: cl.completions.create(prompt=TEXT_P, presence_penalty=1.5, frequency_penalty=1.0,
                                                   **score),
        "gen": lambda: cl.completions.create(prompt=TEXT_P, **dict(score, max_tokens=N)),
        "gen_stream": lambda: list(cl.completions.create(prompt=TEXT_P, stream=True, **dict(score, max_tokens=N))),
        "cont": lambda: cl.completions.create(prompt=cont_ids, **score),
        "cont_stream": lambda: list(cl.completions.create(prompt=cont_ids, stream=True, **score)),
        "ids_echo": lambda: cl.completions.create(prompt=ids_p, echo=True, max_tokens=0, **g),
        "ids_echo_gen": lambda: cl.completions.create(prompt=ids_p, echo=True, max_tokens=N, **g),
        "ids_echo_stream": lambda: list(cl.completions.create(prompt=ids_p, echo=True, max_tokens=N, stream=True,
                                                              **g)),
        "ids_gen_lp": lambda: cl.completions.create(prompt=ids_p, **dict(score, max_tokens=N)),
    }
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = {k: pool.submit(f) for k, f in calls.items()}
        res = {k: f.result(timeout=300) for k, f in futures.items()}

    # ---- score this text: max_tokens 0
    r = res["score"]
    c = r.choices[0]
    H.check(c.text == TEXT_P, "echo, max_tokens 0: text %r" % c.text)
    H.check(c.finish_reason == "length", "max_tokens 0: finish_reason %r" % c.finish_reason)
    H.check(r.usage.completion_tokens == 0 and r.usage.prompt_tokens == n_prompt and
            r.usage.total_tokens == n_prompt, "max_tokens 0: usage %s (prompt %d tokens)" % (r.usage, n_prompt))
    check_shape(c.logprobs, n_prompt, "score")
    H.check("".join(c.logprobs.tokens).encode() == TEXT_P.encode() or "".join(c.logprobs.tokens).endswith(TEXT_P),
            "the prompt's tokens %r do not spell it" % c.logprobs.tokens)
    check_prompt_against_engine(h, model, ids_p, prompt_entries(c.logprobs, n_prompt), "score")
    whole = (c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs, c.logprobs.text_offset)

    # streamed: the same text and entries over the chunks
    text, toks, lps, tops, offs, fin = "", [], [], [], [], None
    for ch in res["score_stream"]:
        if not ch.choices:
            continue
        text += ch.choices[0].text
        fin = ch.choices[0].finish_reason or fin
        if ch.choices[0].logprobs:
            toks += ch.choices[0].logprobs.tokens
            lps += ch.choices[0].logprobs.token_logprobs
            tops += ch.choices[0].logprobs.top_logprobs
            offs += ch.choices[0].logprobs.text_offset
    H.check(text == TEXT_P and fin == "length", "streamed score: %r, %r" % (text, fin))
    H.check((toks, lps, tops, offs) == whole, "streamed prompt logprobs differ: %r vs %r" % ((toks, lps), whole[:2]))
    H.log("score (max_tokens 0, echo, logprobs %d): %d prompt tokens, first null, streamed and not" % (TOP, n_prompt))

    # a long prompt: several prefill chunks
    lp = res["score_long"].choices[0].logprobs
    long_ids = list(ref_long["prompt_ids"])
    check_shape(lp, len(long_ids), "score_long")
    check_prompt_against_engine(h, model, long_ids, prompt_entries(lp, len(long_ids)), "score_long")

    # penalties leave the prompt's logprobs alone
    lp_pen = res["score_pen"].choices[0].logprobs
    H.check(lp_pen.token_logprobs == whole[1] and lp_pen.top_logprobs == whole[2],
            "penalties changed the prompt's logprobs: %r vs %r" % (lp_pen.token_logprobs, whole[1]))
    H.log("prompt logprobs are the raw model's: penalties change nothing")

    # ---- echo + logprobs + generation
    r = res["gen"]
    c = r.choices[0]
    H.check(c.text == TEXT_P + ref["text"], "echo, max_tokens %d: %r vs %r" % (N, c.text, TEXT_P + ref["text"]))
    H.check(r.usage.completion_tokens == len(ref["ids"]), "usage %s" % r.usage)
    check_shape(c.logprobs, n_prompt + len(ref["ids"]), "gen")
    H.check((c.logprobs.tokens[:n_prompt], c.logprobs.token_logprobs[:n_prompt], c.logprobs.top_logprobs[:n_prompt])
            == whole[:3], "with generation the prompt's entries differ from max_tokens 0's")
    for i, (v, rr) in enumerate(zip(c.logprobs.token_logprobs[n_prompt:], ref["logprobs"])):
        H.check(abs(v - rr["logprob"]) <= LP_TOL, "generated token %d: %r vs specd-generate %r" % (i, v, rr["logprob"]))
    H.check(c.logprobs.text_offset[n_prompt] == len("".join(c.logprobs.tokens[:n_prompt]).encode()),
            "generated text_offset %s" % c.logprobs.text_offset)
    text, toks, lps = "", [], []
    for ch in res["gen_stream"]:
        if ch.choices:
            text += ch.choices[0].text
            if ch.choices[0].logprobs:
                toks += ch.choices[0].logprobs.tokens
                lps += ch.choices[0].logprobs.token_logprobs
    H.check(text == c.text and toks == c.logprobs.tokens and lps == c.logprobs.token_logprobs,
            "streamed echo with generation differs: %r %r" % (text, lps))
    H.log("echo + logprobs + %d tokens: prompt entries then specd-generate's, streamed and not" % N)

    # ---- a prompt of ids that continues greedily: top-1 at each generated position
    n_cp = len(ref_cont["prompt_ids"])
    lp = res["cont"].choices[0].logprobs
    check_shape(lp, len(cont_ids), "cont")
    for i in range(n_cp, len(cont_ids)):
        v, d = lp.token_logprobs[i], lp.top_logprobs[i]
        best = max(d, key=d.get)
        H.check(best == lp.tokens[i] and math.isclose(d[best], v, abs_tol=1e-9),
                "position %d: the greedy token %r (%r) is not the top-1 of %s" % (i, lp.tokens[i], v, d))
        want = ref_cont["logprobs"][i - n_cp]["logprob"]
        H.check(abs(v - want) <= PROMPT_TOL, "position %d: prompt logprob %r, specd-generate's %r" % (i, v, want))
    H.check(res["cont"].choices[0].text == TEXT_P + ref_cont["text"], "ids echo: %r" % res["cont"].choices[0].text)
    s_lps = [x for ch in res["cont_stream"] if ch.choices and ch.choices[0].logprobs
             for x in ch.choices[0].logprobs.token_logprobs]
    H.check(s_lps == lp.token_logprobs, "streamed ids prompt logprobs differ")
    H.log("ids prompt continued greedily: top-1 = the token at %d positions, logprobs = specd-generate's" %
          (len(cont_ids) - n_cp))

    # ---- echo of ids: the ids' text
    r = res["ids_echo"].choices[0]
    H.check(r.text == TEXT_P and r.finish_reason == "length" and res["ids_echo"].usage.completion_tokens == 0,
            "echo of ids, max_tokens 0: %r %r" % (r.text, r.finish_reason))
    H.check(res["ids_echo_gen"].choices[0].text == TEXT_P + ref["text"],
            "echo of ids + generation: %r" % res["ids_echo_gen"].choices[0].text)
    text = "".join(ch.choices[0].text for ch in res["ids_echo_stream"] if ch.choices)
    H.check(text == TEXT_P + ref["text"], "echo of ids streamed: %r" % text)
    H.check(res["ids_gen_lp"].choices[0].logprobs.token_logprobs[:n_prompt] == whole[1],
            "ids prompt logprobs differ from the text prompt's")
    H.log("echo of a prompt of ids: its text, with and without generation, streamed and not")

    # ---- ids that split a UTF-8 character: exact bytes, valid JSON
    e_ids = list(emoji["prompt_ids"])
    split = None
    for k in range(1, len(e_ids) + 1):  # the shortest prefix whose text is not whole UTF-8
        st, _, body = h.http("POST", "/v1/completions", {"model": "smollm", "prompt": e_ids[:k], "echo": True,
                                                          "max_tokens": 0})
        H.check(st == 200, "echo of ids %s: %d %s" % (e_ids[:k], st, body[:300]))
        t = json.loads(body)["choices"][0]["text"]  # json.loads: the body is valid JSON
        if "\ufffd" in t:
            split = (e_ids[:k], t)
            break
    H.check(split is not None, "no prefix of %s splits a UTF-8 character: the check could not fail" % e_ids)
    st, _, body = h.http("POST", "/v1/completions", {"model": "smollm", "prompt": e_ids, "echo": True,
                                                      "max_tokens": 0})
    H.check(st == 200 and json.loads(body)["choices"][0]["text"] == "caf\u00e9 \U0001F99C",
            "echo of the whole ids: %s" % body[:300])
    H.log("ids %s that split a character echo as %r (valid JSON); the whole ids echo exactly" % split)

    # ---- max_tokens 0 needs echo; chat never takes it
    st, _, body = h.http("POST", "/v1/completions", {"model": "smollm", "prompt": TEXT_P, "max_tokens": 0})
    H.check(st == 400 and json.loads(body)["error"]["param"] == "max_tokens", "max_tokens 0 without echo: %d %s" %
            (st, body[:300]))
    st, _, body = h.http("POST", "/v1/chat/completions", {"model": "smollm", "max_tokens": 0,
                                                           "messages": [{"role": "user", "content": "hi"}]})
    H.check(st == 400 and json.loads(body)["error"]["param"] == "max_tokens", "chat max_tokens 0: %d %s" %
            (st, body[:300]))
    H.log("max_tokens 0 without echo, and on chat: 400")


if __name__ == "__main__":
    H.main(run)
