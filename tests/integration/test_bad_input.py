"""Bad input on the client link: malformed bytes, unknown request ids, token
ids out of range, empty and over-long prompts, max_tokens over the context,
bad sampling parameters, bad stop strings, bad conversations (unknown
role, messages beside a prompt, too many turns or bytes, turns the model's
chat template refuses: the service's target carries Gemma's), oversized
messages. Each gets an
Error with the expected code and a readable message naming the field, the
limit and the value; meanwhile a long greedy request of another client runs
to the end with exactly specd-generate's tokens, and the service still
accepts new work afterwards. A message over the socket's maximum size
cannot be answered (libzmq drops that connection): the test checks that the
service carries on and that a fresh connection is served.

Tiny random models (vocabulary 512, context 2048)."""
import os
import subprocess
import sys

import harness as H
import pbwire as pb

VOCAB, CTX = 512, 2048
EITHER = ("BAD_REQUEST", "TOO_LARGE")  # the brief allows either for limits


def expect_error(c, env_or_bytes, code, words, what):
    if isinstance(env_or_bytes, bytes):
        c.send_raw(env_or_bytes)
    else:
        c.send(env_or_bytes)
    while True:
        m = c.recv(20)
        H.check(m is not None, "%s: no reply within 20 s" % what)
        if "error" in m:
            break
        H.check("accepted" not in m, "%s: accepted (%s) instead of an Error %s" % (what, m["accepted"], code))
    e = m["error"]
    got = pb.CODE.get(e.get("code"), e.get("code"))
    msg = e.get("message", "")
    codes = code if isinstance(code, tuple) else (code,)
    H.check(got in codes, "%s: code %s, expected %s (message: %r)" % (what, got, code, msg))
    missing = [w for w in words if w.lower() not in msg.lower()]
    H.check(not missing, "%s: message %r does not name %s" % (what, msg, missing))
    H.log("%-34s -> %s: %s" % (what, got, msg))
    return e


def run(h):
    target, _ = h.tiny_models(seed=17)
    ref = h.reference(target, "a long and steady request", 400, ignore_eos=True)
    # The service's copy of the target carries Gemma's chat template (no
    # system role, alternating turns), so that the template's refusals are
    # seen on the wire too; the weights and tokens are the target's.
    gemma = os.path.join(h.tmp, "target-gemma.gguf")
    tmpl = os.path.join(H.SOURCE, "tests", "data", "chat_templates", "gemma.jinja")
    p = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template-file", tmpl, target,
                        gemma, "--force"], capture_output=True, text=True)
    H.check(p.returncode == 0, "gguf_new_metadata: %s" % p.stderr[-500:])
    h.start_service(gemma, drafter="layers")
    good = h.client()
    good.submit(prompt="a long and steady request", max_tokens=400, ignore_eos=True)

    c = h.client()
    s = lambda **kw: {"submit": dict({"client_tag": 99, "max_tokens": 8}, **kw)}
    expect_error(c, b"\xff\xff\xff\xff garbage", "MALFORMED", [], "malformed bytes")
    expect_error(c, b"\x12\x80\x80\x80", "MALFORMED", [], "truncated envelope")
    expect_error(c, {"cancel": {"request_id": 987654321}}, "UNKNOWN_REQUEST", ["987654321"], "cancel of unknown id")
    expect_error(c, s(prompt_ids=[1, 2, VOCAB + 7]), "BAD_REQUEST", ["prompt_ids", str(VOCAB), str(VOCAB + 7)],
                 "token id out of range")
    expect_error(c, s(prompt_ids=[1, -3]), "BAD_REQUEST", ["prompt_ids", "-3"], "negative token id")
    expect_error(c, s(prompt=""), "BAD_REQUEST", ["prompt"], "empty prompt")
    expect_error(c, s(prompt_ids=[5] * (CTX + 10)), EITHER, ["prompt", str(CTX), str(CTX + 10)],
                 "prompt over the context")
    expect_error(c, s(prompt="x" * ((1 << 20) + 5)), "TOO_LARGE", ["prompt", str(1 << 20)],
                 "prompt over SD_MAX_PROMPT_BYTES")
    expect_error(c, s(prompt="hi", max_tokens=CTX + 100), EITHER, ["max_tokens", str(CTX + 100)],
                 "max_tokens over the context")
    expect_error(c, s(prompt="hi", sampling={"temperature": -1.0}), "BAD_REQUEST", ["temperature", "-1"],
                 "negative temperature")
    expect_error(c, s(prompt="hi", sampling={"temperature": float("nan")}), "BAD_REQUEST", ["temperature"],
                 "NaN temperature")
    expect_error(c, s(prompt="hi", sampling={"temperature": 1.0, "top_p": 1.5}), "BAD_REQUEST",
                 ["top_p", "1.5"], "top_p over 1")
    expect_error(c, s(prompt="hi", sampling={"temperature": 1.0, "min_p": 1.0}), "BAD_REQUEST", ["min_p"],
                 "min_p = 1")
    expect_error(c, s(prompt="hi", sampling={"presence_penalty": 2.5}), "BAD_REQUEST", ["presence_penalty", "2.5"],
                 "presence_penalty over 2")
    expect_error(c, s(prompt="hi", sampling={"frequency_penalty": float("nan")}), "BAD_REQUEST",
                 ["frequency_penalty"], "NaN frequency_penalty")
    expect_error(c, s(prompt="hi", logprobs=True, top_logprobs=21), "BAD_REQUEST", ["top_logprobs", "21", "20"],
                 "top_logprobs over 20")
    expect_error(c, s(prompt="hi", top_logprobs=3), "BAD_REQUEST", ["top_logprobs", "without logprobs"],
                 "top_logprobs without logprobs")
    expect_error(c, s(prompt="hi", stop=["s%d" % i for i in range(17)]), EITHER, ["stop", "16", "17"],
                 "17 stop strings")
    expect_error(c, s(prompt="hi", stop=["y" * 300]), EITHER, ["stop", "256", "300"],
                 "stop string over 256 bytes")
    expect_error(c, s(prompt="hi", max_k=SD_MAX_K + 5), "BAD_REQUEST", ["max_k", "32", "37"],
                 "max_k over SD_MAX_K")

    # Conversations (SubmitRequest.messages): roles, exclusivity, bounds.
    user = {"role": 2, "content": "hi"}
    expect_error(c, s(messages=[user, {"role": 7, "content": "x"}]), "BAD_REQUEST", ["messages[1].role", "7"],
                 "unknown chat role")
    expect_error(c, s(messages=[{"role": 0, "content": "x"}]), "BAD_REQUEST", ["messages[0].role"],
                 "unspecified chat role")
    expect_error(c, s(messages=[user], prompt="also a prompt"), "BAD_REQUEST", ["messages", "prompt"],
                 "messages and a prompt")
    # tools (role 4 is a tool's answer): only with messages, calls only in an assistant's turn, JSON the
    # template can read
    expect_error(c, s(prompt="hi", tools="[]"), "BAD_REQUEST", ["submit.tools", "messages"], "tools without messages")
    expect_error(c, s(messages=[dict(user, tool_calls='[{"name":"f","arguments":{}}]')]), "BAD_REQUEST",
                 ["messages[0].tool_calls", "assistant"], "tool calls in a user turn")
    expect_error(c, s(messages=[user, {"role": 3, "content": "", "tool_calls": "[{"}, {"role": 4, "content": "x"}]),
                 "BAD_REQUEST", ["messages[1].tool_calls", "JSON"], "tool calls that are not JSON")
    # a tool turn's tool_call_id (Mistral's template writes it): a tool turn's only, at most 256 bytes
    expect_error(c, s(messages=[dict(user, tool_call_id="abcDEF123")]), "BAD_REQUEST",
                 ["messages[0].tool_call_id", "tool"], "a tool_call_id in a user turn")
    expect_error(c, s(messages=[user, {"role": 4, "content": "x", "tool_call_id": "i" * 257}]), "TOO_LARGE",
                 ["messages[1].tool_call_id", "257", "256"], "a tool_call_id over SD_MAX_CALL_ID_BYTES")
    expect_error(c, s(messages=[user] * 1025), "TOO_LARGE", ["messages", "1024", "1025"],
                 "1025 chat messages")
    expect_error(c, s(messages=[{"role": 2, "content": "z" * (600 << 10)}] * 2), "TOO_LARGE",
                 ["messages", str(1 << 20)], "conversation over SD_MAX_PROMPT_BYTES")

    # ... and what the model's template (Gemma's) refuses
    expect_error(c, s(messages=[{"role": 1, "content": "be brief"}, user]), "BAD_REQUEST",
                 ["chat template", "gemma", "system"], "a system turn for Gemma")
    expect_error(c, s(messages=[user, user]), "BAD_REQUEST", ["messages[1]", "alternate"],
                 "two user turns for Gemma")
    expect_error(c, s(prompt="hi", chat=True, system="be brief"), "BAD_REQUEST", ["gemma", "system"],
                 "chat with a system prompt for Gemma")

    # Oversized message: over ZMQ_MAXMSGSIZE on its own connection.
    big = h.client()
    big.send_raw(b"\x00" * ((4 << 20) + 1024))
    big.close()

    # The good request finished undisturbed, and a new client is served.
    out = {"ids": [], "finished": None}
    def pump():
        m = good.recv(0.5)
        if m and "tokens" in m:
            out["ids"] += m["tokens"].get("tokens", [])
        if m and "error" in m:
            raise H.TestFailure("the good request got an error: %s" % m["error"])
        if m and "finished" in m:
            out["finished"] = m["finished"]
        return out["finished"]
    H.wait_until(pump, 300, "the good request to finish", interval=0)
    H.check(out["ids"] == ref["ids"], "the good request's tokens differ from specd-generate's "
            "(%d vs %d tokens)" % (len(out["ids"]), len(ref["ids"])))
    r = h.client().run([dict(prompt="still serving?", max_tokens=6, ignore_eos=True)], timeout=120)[0]
    H.check(not r["error"] and len(r["ids"]) == 6, "a new request after the bad input failed: %s" % r)
    for p in h.procs:
        H.check(p.alive(), "%s died during the bad-input test (exit %s)" % (p.name, p.popen.returncode))


SD_MAX_K = 32

if __name__ == "__main__":
    H.main(run)
