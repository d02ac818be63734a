"""Penalties and the target's logprobs, on SmolLM2 (issue 16).

Single process (specd-generate), the greedy oracle with penalties:
- presence_penalty / frequency_penalty change the greedy output on a prompt
  that repeats (a control: otherwise the rest could not fail);
- speculative decoding with them (n-gram drafter K 4, self-draft K 3) gives
  plain decoding's tokens, greedy and seeded.

The live service (n-gram drafter, K fixed at 4, so drafts are verified)
through the official `openai` client:
- greedy chat and completions with penalties, and a seeded completion with
  them, equal specd-generate with the same penalties;
- chat with logprobs=true, top_logprobs=5 (streamed and not) and completions
  with logprobs=5 (streamed and not): one entry per generated token; under
  greedy the chosen token is the first of its top list; every logprob and
  top list equals specd-generate --logprobs 5 (plain decoding, the same
  distribution: after penalties, before temperature) within LP_TOL, and
  numpy's log-softmax of the engine's logits for the same ids
  (tests/specd_logits); the numpy reference model (tests/ref/llama_ref.py,
  reading the GGUF through `gguf`) agrees within REF_REL x max |logit|;
  streamed chunks carry the same entries as the whole response;
- logprobs with penalties equal specd-generate --logprobs with them."""
import concurrent.futures
import json
import math
import os
import subprocess
import sys

import harness as H

try:
    import openai
except ImportError:
    openai = None

REPEAT = "one two three one two three one two three one two three"
CHAT_Q = "What is the capital of France?"
TEXT_P = "The three primary colors are"
N = 12
TOP = 5
PEN = {"presence_penalty": 0.8, "frequency_penalty": 0.6}
PEN_ARGS = ["--presence-penalty", "0.8", "--frequency-penalty", "0.6"]
# The service and specd-generate compute the same logits (CPU batch
# invariance) and the same double log-softmax: only the float -> JSON ->
# float round trip differs.
LP_TOL = 1e-5
# The numpy reference model's logits are within ~3% of max |logit| of the
# engine's on SmolLM2 (test_forward_oracle.py); logprobs inherit that.
REF_REL = 0.05


def generate(h, model, prompt, n, extra=(), chat=False):
    argv = [h.bin("generate"), "-m", model, "-p", prompt, "-n", str(n), "--json", "-t", "1"]
    argv += (["--chat"] if chat else []) + list(extra)
    r = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate %s failed: %s" % (" ".join(extra), r.stderr[-800:]))
    return json.loads(r.stdout)


def single_process(h, model):
    plain = generate(h, model, REPEAT, N, ["--ignore-eos"])
    pen = generate(h, model, REPEAT, N, ["--ignore-eos"] + PEN_ARGS)
    H.check(plain["ids"] != pen["ids"], "penalties changed nothing on a repeating prompt: %s" % pen["ids"])
    for spec in (["--ngram", "-k", "4"], ["--draft-layers", "10", "-k", "3"]):
        s = generate(h, model, REPEAT, N, ["--ignore-eos"] + PEN_ARGS + spec)
        H.check(s["ids"] == pen["ids"], "speculative %s with penalties %s vs plain %s" % (spec, s["ids"], pen["ids"]))
    seeded = ["--ignore-eos", "--temp", "0.8", "--seed", "7"] + PEN_ARGS
    a = generate(h, model, REPEAT, N, seeded)
    b = generate(h, model, REPEAT, N, seeded + ["--ngram", "-k", "4"])
    H.check(a["ids"] == b["ids"], "seeded speculative with penalties %s vs plain %s" % (b["ids"], a["ids"]))
    H.log("single process: penalties change the output; speculative == plain (greedy, seeded)")
    return plain, pen


def log_softmax(row):
    import numpy as np
    m = np.max(row)
    return row - (m + np.log(np.sum(np.exp(row - m))))


def engine_logits(h, model, seq, n_vocab):
    """The engine's logits for every position of seq (tests/specd_logits)."""
    import numpy as np
    exe = os.path.join(H.BUILD, "tests", "specd_logits")
    if not os.access(exe, os.X_OK):
        return None
    out = os.path.join(h.tmp, "logits.bin")
    r = subprocess.run([exe, "-m", model, "--out", out, "--threads", "1", "--seq", ",".join(map(str, seq))]
                       + h.engine_args, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd_logits failed: %s" % r.stderr[-500:])
    return np.fromfile(out, dtype="<f4").reshape(len(seq), n_vocab)


def check_reference(h, model, ref, entries, what):
    """entries: (logprob, [top logprobs]) per generated token, against
    numpy's log-softmax (float64) of (1) the engine's own logits for prompt +
    generated ids: the same numbers, so within LP_TOL; (2) the numpy
    reference model's logits (tests/ref/llama_ref.py), which agree with the
    engine's on SmolLM2 to about 3% of max |logit| (test_forward_oracle.py
    measures it): within REF_REL of the row's max |logit|, which catches a
    wrong normalization or a temperature, not rounding."""
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
        import numpy as np
        from llama_ref import LlamaRef
    except ImportError as e:
        H.log("numpy reference not available (%s): %s not compared with it" % (e, what))
        return
    seq = list(ref["prompt_ids"]) + list(ref["ids"])
    n_prompt = len(ref["prompt_ids"])
    llama = LlamaRef(model)
    sources = [("numpy reference", llama.logits(seq[:-1]), REF_REL)]
    eng = engine_logits(h, model, seq[:-1], llama.n_vocab)
    if eng is not None:
        sources.insert(0, ("engine logits", eng, None))
    for name, logits, rel in sources:
        worst = 0.0
        for i, (lp, tops) in enumerate(entries):
            raw = np.asarray(logits[n_prompt - 1 + i], dtype=np.float64)
            tol = LP_TOL * 10 if rel is None else rel * float(np.max(np.abs(raw)))
            row = log_softmax(raw)
            want = float(row[ref["ids"][i]])
            want_top = sorted(row.tolist(), reverse=True)[:len(tops)]
            d = max([abs(lp - want)] + [abs(a - b) for a, b in zip(tops, want_top)])
            worst = max(worst, d / tol)
            H.check(d <= tol, "%s token %d: logprob %.5f top %s; log-softmax of the %s %.5f top %s (limit %.4g)" %
                    (what, i, lp, tops, name, want, want_top, tol))
        H.log("%s: %d tokens agree with the log-softmax of the %s (worst %.2f of the limit)" %
              (what, len(entries), name, worst))


def close(a, b):
    return abs(a - b) <= LP_TOL


def check_against_generate(entries, ref, what):
    """entries: (logprob, [top logprobs]) per token against specd-generate --logprobs."""
    H.check(len(entries) == len(ref["logprobs"]), "%s: %d entries, specd-generate %d" %
            (what, len(entries), len(ref["logprobs"])))
    for i, ((lp, tops), r) in enumerate(zip(entries, ref["logprobs"])):
        rt = [t[1] for t in r["top"]]
        H.check(close(lp, r["logprob"]) and len(tops) == len(rt) and all(close(a, b) for a, b in zip(tops, rt)),
                "%s token %d: logprob %r top %r, specd-generate %r top %r" % (what, i, lp, tops, r["logprob"], rt))


def chat_entries(content):
    return [(e.logprob, [t.logprob for t in e.top_logprobs]) for e in content]


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()
    plain, pen = single_process(h, model)
    ref_chat = generate(h, model, CHAT_Q, N, ["--logprobs", str(TOP)], chat=True)
    ref_text = generate(h, model, TEXT_P, N, ["--logprobs", str(TOP)])
    ref_chat_pen = generate(h, model, CHAT_Q, N, PEN_ARGS, chat=True)
    ref_seeded = generate(h, model, REPEAT, N, ["--ignore-eos", "--temp", "0.8", "--seed", "7"] + PEN_ARGS)
    ref_pen_lp = generate(h, model, REPEAT, N, ["--ignore-eos", "--logprobs", "3"] + PEN_ARGS)

    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=120)
    greedy = dict(model="smollm", temperature=0, max_tokens=N)
    user = [{"role": "user", "content": CHAT_Q}]
    repeat = dict(greedy, prompt=REPEAT, extra_body={"ignore_eos": True})
    calls = {
        "pen_text": lambda: cl.completions.create(**repeat, **PEN),
        "pen_chat": lambda: cl.chat.completions.create(messages=user, **greedy, **PEN),
        "pen_seeded": lambda: cl.completions.create(**dict(repeat, temperature=0.8, seed=7), **PEN),
        "lp_chat": lambda: cl.chat.completions.create(messages=user, logprobs=True, top_logprobs=TOP, **greedy),
        "lp_chat_stream": lambda: list(cl.chat.completions.create(messages=user, logprobs=True, top_logprobs=TOP,
                                                                  stream=True, **greedy)),
        "lp_text": lambda: cl.completions.create(prompt=TEXT_P, logprobs=TOP, **greedy),
        "lp_text_stream": lambda: list(cl.completions.create(prompt=TEXT_P, logprobs=TOP, stream=True, **greedy)),
        "lp_pen": lambda: cl.completions.create(**repeat, logprobs=3, **PEN),
        "no_lp": lambda: cl.completions.create(prompt=TEXT_P, **greedy),
    }
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = {k: pool.submit(f) for k, f in calls.items()}
        res = {k: f.result(timeout=300) for k, f in futures.items()}

    # ---- penalties through the service
    H.check(res["pen_text"].choices[0].text == pen["text"], "penalized completion %r vs specd-generate %r" %
            (res["pen_text"].choices[0].text, pen["text"]))
    H.check(res["pen_text"].choices[0].text != plain["text"], "the penalized completion is the unpenalized one")
    H.check(res["pen_chat"].choices[0].message.content == ref_chat_pen["text"], "penalized chat %r vs %r" %
            (res["pen_chat"].choices[0].message.content, ref_chat_pen["text"]))
    H.check(res["pen_seeded"].choices[0].text == ref_seeded["text"], "penalized seeded completion %r vs %r" %
            (res["pen_seeded"].choices[0].text, ref_seeded["text"]))
    H.log("penalties: greedy chat and completion, seeded completion equal specd-generate")

    # ---- chat logprobs, whole
    r = res["lp_chat"]
    H.check(r.choices[0].message.content == ref_chat["text"], "chat text with logprobs %r vs %r" %
            (r.choices[0].message.content, ref_chat["text"]))
    content = r.choices[0].logprobs.content
    H.check(len(content) == len(ref_chat["ids"]) == r.usage.completion_tokens,
            "chat logprobs: %d entries for %d tokens" % (len(content), len(ref_chat["ids"])))
    joined = b"".join(bytes(e.bytes) for e in content)
    H.check(joined.startswith(ref_chat["text"].encode()), "chat logprob tokens %r do not spell the text %r" %
            (joined, ref_chat["text"]))
    for i, e in enumerate(content):
        H.check(len(e.top_logprobs) == TOP, "chat token %d: %d alternatives" % (i, len(e.top_logprobs)))
        H.check(e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob and
                all(e.logprob >= t.logprob for t in e.top_logprobs) and e.logprob <= 0,
                "greedy chat token %d (%r, %r) is not the first of its top list %s" % (i, e.token, e.logprob,
                                                                                      e.top_logprobs))
    check_against_generate(chat_entries(content), ref_chat, "chat logprobs")
    check_reference(h, model, ref_chat, chat_entries(content), "chat logprobs")

    # ---- chat logprobs, streamed: the same entries over the chunks
    streamed = [e for c in res["lp_chat_stream"] if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    H.check([(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in streamed] ==
            [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in content],
            "streamed chat logprobs differ from the whole response's")
    H.log("chat logprobs: %d tokens, streamed and not, equal specd-generate --logprobs" % len(content))

    # ---- completions logprobs (legacy shape), whole and streamed
    r = res["lp_text"]
    lp = r.choices[0].logprobs
    H.check(r.choices[0].text == ref_text["text"], "completion text with logprobs %r" % r.choices[0].text)
    H.check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) ==
            len(ref_text["ids"]), "completion logprobs lengths %d %d %d %d for %d tokens" %
            (len(lp.tokens), len(lp.token_logprobs), len(lp.top_logprobs), len(lp.text_offset), len(ref_text["ids"])))
    H.check("".join(lp.tokens).startswith(ref_text["text"]), "completion tokens %r vs text %r" %
            (lp.tokens, ref_text["text"]))
    H.check(lp.text_offset[0] == 0 and all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:])),
            "text_offset %s" % lp.text_offset)
    for i, d in enumerate(lp.top_logprobs):
        H.check(1 <= len(d) <= TOP and lp.tokens[i] in d and math.isclose(d[lp.tokens[i]], lp.token_logprobs[i])
                and lp.token_logprobs[i] >= max(d.values()) - 1e-9,
                "greedy completion token %d %r (%r) is not the top of %s" % (i, lp.tokens[i], lp.token_logprobs[i], d))
    entries = [(v, sorted(d.values(), reverse=True)) for v, d in zip(lp.token_logprobs, lp.top_logprobs)]
    for i, ((v, tops), r_) in enumerate(zip(entries, ref_text["logprobs"])):
        H.check(close(v, r_["logprob"]), "completion token %d: %r vs specd-generate %r" % (i, v, r_["logprob"]))
    check_reference(h, model, ref_text, [(v, []) for v, _ in entries], "completion logprobs")
    s_tokens, s_lps = [], []
    for c in res["lp_text_stream"]:
        if c.choices and c.choices[0].logprobs:
            s_tokens += c.choices[0].logprobs.tokens
            s_lps += c.choices[0].logprobs.token_logprobs
    H.check(s_tokens == lp.tokens and s_lps == lp.token_logprobs, "streamed completion logprobs %r %r vs %r %r" %
            (s_tokens, s_lps, lp.tokens, lp.token_logprobs))
    H.check(res["no_lp"].choices[0].logprobs is None, "logprobs without asking: %s" % res["no_lp"].choices[0])
    H.log("completion logprobs: %d tokens, streamed and not" % len(lp.tokens))

    # ---- logprobs under penalties: the penalized distribution, as plain decoding reports it
    lp = res["lp_pen"].choices[0].logprobs
    H.check(res["lp_pen"].choices[0].text == pen["text"], "penalized text with logprobs %r" %
            res["lp_pen"].choices[0].text)
    H.check(len(lp.token_logprobs) == len(ref_pen_lp["logprobs"]), "penalized logprobs: %d entries, %d tokens" %
            (len(lp.token_logprobs), len(ref_pen_lp["logprobs"])))
    for i, (v, d, r_) in enumerate(zip(lp.token_logprobs, lp.top_logprobs, ref_pen_lp["logprobs"])):
        rt = [t[1] for t in r_["top"]]
        # tokens with the same text share a dict key: compare what is there
        H.check(close(v, r_["logprob"]) and 1 <= len(d) <= 3 and all(any(close(x, y) for y in rt) for x in d.values()),
                "penalized token %d: %r %s vs specd-generate %r %s" % (i, v, d, r_["logprob"], rt))
    H.log("penalized logprobs equal specd-generate --logprobs with the same penalties")


if __name__ == "__main__":
    H.main(run)
