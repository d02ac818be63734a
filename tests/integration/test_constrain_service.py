"""Structured output through the service (issue 35): a SubmitRequest's
constraint reaches the verifier, which masks the target's distribution at
every position it samples, plain and speculative steps alike.

On SmolLM2 (chat prompts), coordinator + verifier + n-gram drafter, K fixed:
  - greedy requests under two JSON Schemas, a regex, any JSON object and a
    GBNF grammar, all at once: each gives exactly specd-generate's tokens
    under the same constraint (--json-schema / --regex / --response-json /
    --grammar), and the JSON outputs parse and validate (jsonschema);
  - a seeded request under a schema gives seeded specd-generate's tokens,
    and one with top-k, top-p and min-p too;
  - the same requests again, their prompts' blocks adopted from the prefix
    cache (hits counted): the same tokens;
  - refusals before any work, BAD_REQUEST naming what is wrong: a schema
    keyword the engine does not handle (named), a regex with a
    back-reference, an unknown kind, a constraint with ignore_eos; and
    adversarial constraints under 64 KiB (nesting, a huge enum, a huge
    repetition count) refused naming the limit while a valid request in
    the same batch is served;
  - specd-client --json-schema FILE --json gives the same tokens as the
    wire request, and --regex too; two of --json-schema / --regex exit 2;
    --jobs lines with "json_schema" / "regex" / "grammar" too (two on one
    line: that line's BAD_JOB);
  - the verifier SIGKILLed mid-generation of a constrained request and
    replaced: the new one gets the whole prefix, replays the constraint
    over the generated tokens, and the output is still specd-generate's.
"""
import json
import os
import signal
import subprocess
import threading
import time

import harness as H

try:
    import jsonschema
except ImportError:
    jsonschema = None

KIND = {"json_object": 1, "json_schema": 2, "regex": 3, "grammar": 4}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                         "country": {"enum": ["France", "Spain", "Italy"]},
                                         "capital": {"type": "boolean"}},
        "required": ["city", "country", "capital"], "additionalProperties": False}
GRAMMAR = 'root ::= "The answer is " ("yes" | "no") "."\n'
REGEX = "[0-9]{1,3}( apples| pears)"


def reference(h, model, prompt, n, flag, value, temp=0.0, seed=0, extra=()):
    argv = [h.bin("generate"), "-m", model, "-p", prompt, "-n", str(n), "--json", "-t", "1", "--chat"]
    argv += [flag] + ([value] if value is not None else [])
    if temp:
        argv += ["--temp", str(temp), "--seed", str(seed)] + list(extra)
    r = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate %s failed (%d): %s" % (flag, r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout)


def write(h, name, text):
    p = os.path.join(h.tmp, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def check_json(text, schema, what):
    try:
        v = json.loads(text)
    except ValueError as e:
        raise H.TestFailure("%s: the output is not JSON (%s): %r" % (what, e, text))
    if schema is not None and jsonschema is not None:
        try:
            jsonschema.validate(v, schema)
        except jsonschema.ValidationError as e:
            raise H.TestFailure("%s: %r does not validate: %s" % (what, text, e.message))
    elif isinstance(schema, dict) is False and not isinstance(v, dict):
        raise H.TestFailure("%s: json_object gave %r, not an object" % (what, text))


def hit_tokens(c):
    st = c.stats(timeout=1.0) or {}
    return sum(int((w.get("stats") or {}).get("prefix_hit_tokens", 0)) for w in st.get("workers", []))


def run(h):
    model = h.smollm()
    n = 48
    person = write(h, "person.json", json.dumps(PERSON))
    city = write(h, "city.json", json.dumps(CITY))
    gram = write(h, "answer.gbnf", GRAMMAR)
    cases = [  # (prompt, kind, text, specd-generate flag, value, schema to validate)
        ("Give me a person as JSON.", "json_schema", json.dumps(PERSON), "--json-schema", person, PERSON),
        ("Describe Paris as JSON.", "json_schema", json.dumps(CITY), "--json-schema", city, CITY),
        ("How many fruits are in the basket?", "regex", REGEX, "--regex", REGEX, None),
        ("List two colors as a JSON object.", "json_object", "", "--response-json", None, "object"),
        ("Is the sky blue?", "grammar", GRAMMAR, "--grammar", gram, None),
    ]
    refs = [reference(h, model, p, n, flag, val) for p, _, _, flag, val, _ in cases]
    seeded_ref = reference(h, model, cases[0][0], n, "--json-schema", person, temp=0.8, seed=11)
    # the filters after the mask: top-k, top-p and min-p under a constraint
    filtered_ref = reference(h, model, cases[1][0], n, "--json-schema", city, temp=1.1, seed=5,
                             extra=("--top-k", "40", "--top-p", "0.9", "--min-p", "0.02"))
    H.log("computed %d references" % (len(refs) + 1))
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    c = h.client()
    jobs = [dict(prompt=p, chat=True, max_tokens=n, constraint={"kind": KIND[k], "text": t})
            for p, k, t, _, _, _ in cases]
    jobs.append(dict(prompt=cases[0][0], chat=True, max_tokens=n, sampling={"temperature": 0.8, "seed": 11},
                     constraint={"kind": KIND["json_schema"], "text": json.dumps(PERSON)}))
    jobs.append(dict(prompt=cases[1][0], chat=True, max_tokens=n,
                     sampling={"temperature": 1.1, "seed": 5, "top_k": 40, "top_p": 0.9, "min_p": 0.02},
                     constraint={"kind": KIND["json_schema"], "text": json.dumps(CITY)}))
    res = c.run(jobs, timeout=900)
    H.expect_equal_ids(res, refs + [seeded_ref, filtered_ref], "constrained requests through the service")
    for (p, kind, _, _, _, schema), r in zip(cases, res):
        text = bytes(r["text"]).decode("utf-8")
        H.log("%s: %r" % (kind, text))
        ended = r["finished"].get("reason") == 1  # EOS: the language's sentence is whole
        H.check(ended or kind == "json_object", "%s: did not end at EOS within %d tokens: %r" % (kind, n, text))
        if kind in ("json_schema", "json_object") and ended:
            check_json(text, schema, kind)
    H.check(res[4]["text"].decode() in ("The answer is yes.", "The answer is no."),
            "the grammar's output is not one of its two sentences: %r" % res[4]["text"])
    drafted = sum(r["finished"]["stats"].get("drafted", 0) for r in res)
    accepted = sum(r["finished"]["stats"].get("accepted", 0) for r in res)
    H.log("all %d equal to specd-generate; drafted %d, accepted %d" % (len(res), drafted, accepted))

    # the same requests again: their prompts' blocks are in the prefix cache
    # (the verifier's default), and the constraint state starts from the
    # adopted prefix; the output is unchanged
    hit0 = hit_tokens(c)
    res = c.run(jobs, timeout=900)
    H.expect_equal_ids(res, refs + [seeded_ref, filtered_ref], "constrained requests on cached prompt blocks")
    hit1 = hit_tokens(c)
    for _ in range(20):  # the workers' heartbeats carry the counts
        if hit1 > hit0:
            break
        time.sleep(0.25)
        hit1 = hit_tokens(c)
    H.check(hit1 > hit0, "no prefix-cache hit on the repeated constrained requests (%d -> %d)" % (hit0, hit1))
    H.log("repeated constrained requests equal, %d prompt tokens from the prefix cache" % (hit1 - hit0))

    # refusals, before any work
    bad = [({"kind": 2, "text": json.dumps({"type": "object", "patternProperties": {"a": {}}})},
            {}, "patternProperties"),
           ({"kind": 2, "text": "{not json"}, {}, "json_schema"),
           ({"kind": 3, "text": "(a)\\1"}, {}, "regex"),
           ({"kind": 9, "text": "x"}, {}, "kind"),
           ({"kind": 1, "text": ""}, {"ignore_eos": True}, "ignore_eos")]
    # adversarial ones, each within the 64 KiB a constraint may have: refused
    # by the compiler's limits, in bounded time, while a valid request in
    # the same batch is served as before
    deep = {"type": "integer"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    bad += [({"kind": 2, "text": json.dumps(deep)}, {}, "deeper"),
            ({"kind": 2, "text": json.dumps({"enum": ["v%d" % i for i in range(6000)]})}, {}, "'enum'"),
            ({"kind": 3, "text": "a{5000}"}, {}, "repetition"),
            ({"kind": 4, "text": "root ::= " + "(" * 200 + "\"a\"" + ")" * 200}, {}, "deeper")]
    t0 = time.time()
    res = c.run([dict(prompt="hi", max_tokens=4, constraint=con, **extra) for con, extra, _ in bad] + [jobs[0]],
                timeout=120)
    took = time.time() - t0
    H.expect_equal_ids(res[-1:], refs[:1], "a valid request beside the refused ones")
    H.check(took < 60, "refusing the constraints took %.1f s" % took)
    res = res[:-1]
    for (con, extra, word), r in zip(bad, res):
        e = r["error"]
        H.check(e is not None and e.get("code") == 2,
                "constraint %s %s: expected BAD_REQUEST, got %s" % (con, extra, e or r["finished"]))
        H.check(word in e.get("message", ""), "the refusal of %s does not name %r: %s" % (con, word, e))
    H.log("bad constraints refused: %s" % "; ".join(r["error"]["message"] for r in res))
    c.close()

    # specd-client
    for flag, val, ref in (("--json-schema", person, refs[0]), ("--regex", REGEX, refs[2])):
        r = subprocess.run([h.bin("client"), "--coordinator", h.client_addr, "-p", cases[0][0] if flag ==
                            "--json-schema" else cases[2][0], "--chat", "-n", str(n), "--json", flag, val],
                           capture_output=True, timeout=600)
        H.check(r.returncode == 0, "specd-client %s failed (%d): %s" % (flag, r.returncode, r.stderr[-2000:]))
        out = json.loads(r.stdout)
        H.check(out["ids"] == ref["ids"], "specd-client %s: ids %s, specd-generate %s" % (flag, out["ids"],
                                                                                            ref["ids"]))
    # --jobs lines with their own constraints
    jobs = os.path.join(h.tmp, "jobs.jsonl")
    with open(jobs, "w") as f:
        f.write(json.dumps({"id": "p", "prompt": cases[0][0], "chat": True, "n": n, "json_schema": PERSON}) + "\n")
        f.write(json.dumps({"id": "r", "prompt": cases[2][0], "chat": True, "n": n, "regex": REGEX}) + "\n")
        f.write(json.dumps({"id": "g", "prompt": cases[4][0], "chat": True, "n": n, "grammar": GRAMMAR}) + "\n")
        f.write(json.dumps({"id": "bad", "prompt": "x", "regex": "a", "grammar": GRAMMAR}) + "\n")
    r = subprocess.run([h.bin("client"), "--coordinator", h.client_addr, "--jobs", jobs], capture_output=True,
                       timeout=600)
    out = {o["id"]: o for o in map(json.loads, r.stdout.decode().splitlines())}
    for key, ref in (("p", refs[0]), ("r", refs[2]), ("g", refs[4])):
        H.check(out[key].get("ids") == ref["ids"], "--jobs line %s: %s, specd-generate %s" % (key, out[key],
                                                                                             ref["ids"]))
    H.check("exclude" in json.dumps(out["bad"]), "--jobs with regex and grammar: %s" % out["bad"])
    r = subprocess.run([h.bin("client"), "--coordinator", h.client_addr, "-p", "x", "--json-schema", person,
                        "--regex", "a"], capture_output=True, timeout=60)
    H.check(r.returncode == 2, "specd-client with --json-schema and --regex exited %d" % r.returncode)
    H.log("specd-client --json-schema / --regex give the same tokens")
    check_verifier_kill(h, model)


def check_verifier_kill(h, model):
    prompt, regex, n = "Write a short story.", "([a-z]+ ){60}", 64
    ref = reference(h, model, prompt, n, "--regex", regex)
    c = h.client()
    state, done = {}, threading.Event()

    def restart():
        try:
            old = h._latest("verifier")
            h.stop(old, signal.SIGKILL)
            w = h.client()
            H.wait_until(lambda: not any(x.get("alive") and x.get("role") == 3
                                         for x in (w.stats(timeout=1.0) or {"workers": [{"alive": 1, "role": 3}]})
                                         .get("workers", [])),
                         30, "the coordinator to declare the old verifier dead")
            w.close()
            h.start_verifier()
            h.wait_registered()
            H.log("verifier SIGKILLed mid-generation and replaced")
        except Exception as e:  # reported below
            state["error"] = e
        done.wait(600)  # PR_SET_PDEATHSIG: this thread must outlive the new verifier's use

    def on_event(m, results):
        if not state and any(len(r["ids"]) >= 8 for r in results.values()):
            state["thread"] = threading.Thread(target=restart)
            state["thread"].start()

    try:
        res = c.run([dict(prompt=prompt, chat=True, max_tokens=n, constraint={"kind": KIND["regex"], "text": regex})],
                    timeout=600, on_event=on_event)
        H.check(state, "the request finished before the verifier could be killed")
        H.check("error" not in state, "replacing the verifier failed: %s" % state.get("error"))
    finally:
        h.cleanups.append(done.set)
    H.expect_equal_ids(res, [ref], "a constrained request across a verifier SIGKILL + restart")
    H.log("across the verifier restart: %r" % bytes(res[0]["text"]).decode())
    c.close()


if __name__ == "__main__":
    H.main(run)
