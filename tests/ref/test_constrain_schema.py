#!/usr/bin/env python3
"""Oracle: JSON Schema constraints against the jsonschema package.

Without a model (always):
  - a corpus of schemas (hand-written: nested objects, arrays, anyOf, enums,
    patterns, $ref recursion; plus a few hundred generated at random) all
    compile (tests/constrain_cli);
  - completeness: random instances of each schema, serialized compact,
    with spaces and indented, are checked valid by jsonschema and must be
    accepted by specd's matcher;
  - soundness: mutations of them (a byte dropped or changed, a key renamed,
    a value of another type) that specd's matcher accepts must be valid for
    jsonschema.
With the demo model (SPECD_MODEL, specd-generate built):
  - greedy generation under a sample of the schemas: every finished output
    parses and validates; the n-gram drafter, the forced drafts alone and
    (on two schemas) the masked self-draft give the same tokens as plain
    decoding, bit for bit; seeded sampling
    with the n-gram drafter gives plain seeded sampling's tokens.
--full runs the model part on the whole corpus (the `slow` test).

Exit 0: all good; 1: a failure (printed); 77: skipped.
"""
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import jsonschema
except ImportError:
    print("SKIP: the jsonschema package is missing; run scripts/setup")
    sys.exit(SKIP)

SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))
CLI = os.path.join(BUILD, "tests", "constrain_cli")
GEN = os.path.join(BUILD, "tools", "specd-generate")

PATTERNS = {"^[a-z]{2,5}$": ["ab", "hello", "xyz"], "^[A-Z]{2}-\\d{3}$": ["AB-123", "ZZ-000"],
            "^(red|green|blue)$": ["red", "blue"], "^\\d+(\\.\\d+)?$": ["1", "3.14", "10"]}
SAFE = "abcdefghijklmnopqrstuvwxyz ABC019_-.,é\"\\\n"

HAND = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]},
                                      "confidence": {"type": "number"}}, "required": ["answer", "confidence"]},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                 "tag": {"type": "string", "pattern": "^[a-z]{2,5}$"}},
                                "required": ["id", "tag"]}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "integer"}, {"type": "null"}]},
    {"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                         "children": {"type": "array", "maxItems": 2,
                                                                      "items": {"$ref": "#/$defs/node"}}},
                        "required": ["value"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                      "country": {"const": "France"},
                                      "population": {"type": "integer"},
                                      "capital": {"type": "boolean"}},
     "required": ["city", "country", "population", "capital"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
                                      "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                 "maxItems": 3}},
     "required": ["code", "colors"]},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": ["string", "null"], "maxLength": 6},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}, "required": ["c"]}},
        "required": ["b"]}}, "required": ["a"]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
                "required": ["kind", "side"], "additionalProperties": False}]},
    {"definitions": {"leaf": {"type": "string", "maxLength": 4}},
     "type": "object", "properties": {"x": {"$ref": "#/definitions/leaf"}, "y": {"$ref": "#/definitions/leaf"}},
     "required": ["x"], "additionalProperties": False},
]


def random_schema(rng, depth=0):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 3:
        kinds += ["object", "object", "array", "anyOf"]
    k = rng.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        r = rng.random()
        if r < 0.3:
            s["maxLength"] = rng.randint(1, 12)
            if rng.random() < 0.5:
                s["minLength"] = rng.randint(0, s["maxLength"])
        elif r < 0.5:
            s["pattern"] = rng.choice(list(PATTERNS))
        else:
            s["maxLength"] = 12
        return s
    if k in ("integer", "number", "boolean", "null"):
        return {"type": k}
    if k == "enum":
        pool = ["alpha", "beta", "gamma", 1, 2.5, True, None, "x y", "é"]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if k == "const":
        return {"const": rng.choice(["fixed", 42, False, None, "a\"b"])}
    if k == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
        if rng.random() < 0.5:
            s["minItems"] = rng.randint(0, s["maxItems"])
        return s
    if k == "anyOf":  # branches of distinct types, so oneOf would hold too
        ts = rng.sample(["string", "integer", "boolean", "null"], 2)
        return {"anyOf": [random_schema_of(rng, t) for t in ts]}
    names = rng.sample(["id", "name", "kind", "tags", "value", "ok", "meta", "count"], rng.randint(1, 4))
    props = {n: random_schema(rng, depth + 1) for n in names}
    req = [n for n in names if rng.random() < 0.6]
    s = {"type": "object", "properties": props, "required": req}
    if rng.random() < 0.7:
        s["additionalProperties"] = False
    return s


def random_schema_of(rng, t):
    return {"type": t, "maxLength": 8} if t == "string" else {"type": t}


def resolve(root, s):
    while isinstance(s, dict) and "$ref" in s:
        ref = s["$ref"]
        if ref == "#":
            s = root
        else:
            _, kind, name = ref.split("/")
            s = root[kind][name]
    return s


def instance(rng, root, s, depth=0):
    """A random valid instance in the shape specd generates (declared key
    order, no extra keys unless additionalProperties is a schema/true)."""
    s = resolve(root, s)
    if s is True or s == {}:
        return rng.choice([1, "x", None, [1, 2], {"k": True}])
    if "const" in s:
        return copy.deepcopy(s["const"])
    if "enum" in s:
        return copy.deepcopy(rng.choice(s["enum"]))
    if "anyOf" in s or "oneOf" in s:
        return instance(rng, root, rng.choice(s.get("anyOf") or s.get("oneOf")), depth)
    t = s.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t is None:
        t = "object" if "properties" in s or "additionalProperties" in s else "array" if "items" in s else "string"
    if t == "string":
        if "pattern" in s:
            return rng.choice(PATTERNS[s["pattern"]])
        lo, hi = s.get("minLength", 0), s.get("maxLength", 10)
        return "".join(rng.choice(SAFE) for _ in range(rng.randint(lo, hi)))
    if t == "integer":
        return rng.randint(-10 ** rng.randint(0, 12), 10 ** rng.randint(0, 12))
    if t == "number":
        return rng.choice([0, -1, 2.5, 1e-05, 123.456, -0.25, 1e20, rng.randint(-99, 99)])
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    if t == "array":
        lo = s.get("minItems", 0)
        hi = s.get("maxItems", lo + 3)
        if depth > 4:
            hi = lo
        return [instance(rng, root, s.get("items", {}), depth + 1) for _ in range(rng.randint(lo, hi))]
    out = {}
    req = set(s.get("required", []))
    for k, v in s.get("properties", {}).items():
        if k in req or (rng.random() < 0.5 and depth < 4):
            out[k] = instance(rng, root, v, depth + 1)
    ap = s.get("additionalProperties")
    if (ap is not None and ap is not False) or ("properties" not in s and ap is None):
        for i in range(rng.randint(0, 2)):
            out["extra%d" % i] = instance(rng, root, ap if isinstance(ap, dict) else {}, depth + 1)
    return out


def serialize(rng, v):
    style = rng.randint(0, 2)
    if style == 0:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if style == 1:
        return json.dumps(v, ensure_ascii=False)  # enum and const values are written as cJSON writes them
    return json.dumps(v, ensure_ascii=False, indent=2)


def mutate(rng, text):
    i = rng.randrange(len(text)) if text else 0
    r = rng.random()
    if r < 0.3:
        return text[:i] + text[i + 1:]
    if r < 0.6:
        return text[:i] + rng.choice('{}[]",:0a -tnu\\') + text[i + 1:]
    if r < 0.8:
        return text.replace('"', "'", 1)
    return text[:i] + rng.choice(['"zz":1,', "null", "[", "1.", "e5"]) + text[i:]


def cli_match(path, texts):
    inp = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    out = subprocess.run([CLI, "schema", path], input=inp, capture_output=True, text=True, timeout=300)
    if out.returncode == 3:
        return out.stdout.strip()
    if out.returncode != 0:
        raise RuntimeError("constrain_cli failed: %s" % out.stderr[-500:])
    return [line == "1" for line in out.stdout.split("\n") if line]


def check_matcher(rng, schemas, tmp):
    bad = 0
    for n, s in enumerate(schemas):
        path = os.path.join(tmp, "s%d.json" % n)
        with open(path, "w") as f:
            json.dump(s, f)
        validator = jsonschema.Draft202012Validator(s)
        good = []
        for _ in range(12):
            v = instance(rng, s, s)
            if not validator.is_valid(v):
                print("generator bug: %s is not an instance of %s" % (json.dumps(v), json.dumps(s)))
                return 1
            good.append(serialize(rng, v))
        muts = [mutate(rng, t) for t in good for _ in range(4)]
        got = cli_match(path, good + muts)
        if isinstance(got, str):
            print("REFUSED schema %d %s: %s" % (n, json.dumps(s), got))
            bad += 1
            continue
        for t, ok in zip(good, got[:len(good)]):
            if not ok:
                bad += 1
                if bad <= 10:
                    print("INCOMPLETE: schema %s refuses its instance %r" % (json.dumps(s), t))
        for t, ok in zip(muts, got[len(good):]):
            if ok:
                try:
                    valid = validator.is_valid(json.loads(t))
                except ValueError:
                    valid = False
                if not valid:
                    bad += 1
                    if bad <= 10:
                        print("UNSOUND: schema %s accepts %r" % (json.dumps(s), t))
    print("matcher: %d schemas, %d problems" % (len(schemas), bad))
    return bad


def generate(model, schema_path, prompt, extra, n=96):
    argv = [GEN, "-m", model, "-p", prompt, "-n", str(n), "--json", "-t", "1", "--json-schema", schema_path] + extra
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError("specd-generate %s failed: %s" % (" ".join(extra), out.stderr[-800:]))
    return json.loads(out.stdout)


def check_model(rng, schemas, tmp, model):
    prompts = ["Describe a person as JSON: ", "Output JSON for a city.\n", "{\"data\": ", "Answer in JSON:"]
    bad = finished = 0
    for n, s in enumerate(schemas):
        path = os.path.join(tmp, "m%d.json" % n)
        with open(path, "w") as f:
            json.dump(s, f)
        prompt = prompts[n % len(prompts)]
        plain = generate(model, path, prompt, [])
        modes = [["--ngram", "-k", "4"], ["--forced-draft", "-k", "4"]]
        if n < 2:  # a model drafter, its distribution masked too (the self-draft: no second model file)
            modes.append(["--draft-layers", "10", "-k", "4"])
        for extra in modes:
            spec = generate(model, path, prompt, extra)
            if spec["ids"] != plain["ids"]:
                bad += 1
                print("SPEC MISMATCH (%s) schema %d: %r vs plain %r" % (extra[0], n, spec["text"], plain["text"]))
        if plain["stop_reason"] == "eos":
            finished += 1
            try:
                v = json.loads(plain["text"])
                jsonschema.validate(v, s)
            except Exception as e:  # noqa: BLE001 (either failure is the finding)
                bad += 1
                print("INVALID output for schema %d %s: %r (%s)" % (n, json.dumps(s), plain["text"], e))
        if n % 3 == 0:  # seeded sampling: speculative equals plain
            samp = ["--temp", "0.8", "--seed", str(1000 + n)]
            a = generate(model, path, prompt, samp)
            b = generate(model, path, prompt, samp + ["--ngram"])
            if a["ids"] != b["ids"]:
                bad += 1
                print("SEEDED MISMATCH schema %d" % n)
    print("model: %d schemas, %d finished within the token limit, %d problems" % (len(schemas), finished, bad))
    if finished < len(schemas) // 2:
        print("too few outputs finished to judge")
        bad += 1
    return bad


def main():
    if not os.path.exists(CLI):
        print("SKIP: %s not built" % CLI)
        return SKIP
    rng = random.Random(35)
    schemas = HAND + [random_schema(rng) for _ in range(300)]
    with tempfile.TemporaryDirectory() as tmp:
        bad = check_matcher(rng, schemas, tmp)
        model = os.environ.get("SPECD_MODEL")
        if model and os.path.exists(GEN):
            sample = schemas if "--full" in sys.argv else HAND[:5] + schemas[len(HAND):len(HAND) + 2]
            bad += check_model(rng, sample, tmp, model)
        else:
            print("model part skipped (no SPECD_MODEL or specd-generate)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
