"""test_hf_oracle.py — Hugging Face checkpoints against independent references.

  --random   random models from specd-mkmodel --format hf (f32 / f16 / bf16,
             tied and untied, GQA / MHA / MQA, single file and shards, llama3
             and linear rope scaling written into config.json):
               * logits of specd_logits -m DIR against hf_ref.HFLlamaRef (the
                 files read by the `safetensors` package, Hugging Face's
                 rotate-half RoPE) in float64: max |err| <= 1e-4 x max |logit|;
               * the same model written as GGUF gives bit-identical logits,
                 and specd-generate the same greedy tokens from either (also
                 with the directory as the draft model);
               * tokenizer.json loaded by HF `tokenizers` and by specd
                 (tests/tok_cli on the directory) give the same ids;
               * st_check (specd's safetensors reader) and the reference
                 reader accept and refuse the same crafted files.
  --smollm2  the demo model's tokenizer written into tokenizer.json (with its
             own pre-tokenizer and with Llama 3's split): HF `tokenizers`
             and specd agree on every case of tests/data/tokenizer_cases.jsonl.

Environment: SPECD_BUILD_DIR, SPECD_SOURCE_DIR, SPECD_MODEL. Exit 77 (skipped)
when a binary, a package or the demo model is missing.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SKIP = 77
try:
    import safetensors  # noqa: F401
    from tokenizers import Tokenizer
    from hf_ref import HFLlamaRef
    from test_forward_oracle import compare, engine_logits, find_model, reference_rows
    from test_tokenizer_hf import load_cases, run_specd
except ImportError as e:  # pragma: no cover
    print(f"skip: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

SOURCE_DIR = os.environ.get("SPECD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD_DIR = os.environ.get("SPECD_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))


def binary(sub, name):
    path = os.path.join(BUILD_DIR, sub, name)
    return path if os.path.exists(path) else None


def mkmodel(args):
    r = subprocess.run([binary("tools", "specd-mkmodel")] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"specd-mkmodel {' '.join(args)} failed:\n{r.stderr}")


MODELS = [
    ("f32 GQA 4/2 untied", ["--dim", "64", "--heads", "4", "--kv-heads", "2", "--ff", "128"], [], None),
    ("f16 tied MHA 4/4, 3 shards", ["--dtype", "f16", "--dim", "64", "--heads", "4", "--kv-heads", "4", "--ff", "96",
                                    "--tied"], ["--shards", "3"], None),
    ("bf16 MQA 4/1, 3 layers, 2 shards", ["--dtype", "bf16", "--norm-dtype", "bf16", "--dim", "64", "--heads", "4",
                                          "--kv-heads", "1", "--ff", "128", "--layers", "3"], ["--shards", "2"], None),
    ("f32 GQA 8/2 hd16, llama3 rope scaling", ["--dim", "128", "--heads", "8", "--kv-heads", "2", "--ff", "256",
                                               "--rope-base", "500000"], [],
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}),
    ("f32 MHA 2/2, linear rope scaling", ["--dim", "32", "--heads", "2", "--kv-heads", "2", "--ff", "64"], [],
     {"rope_type": "linear", "factor": 4.0}),
]


def set_rope_scaling(d, scaling):
    path = os.path.join(d, "config.json")
    with open(path) as f:
        c = json.load(f)
    c["rope_scaling"] = scaling
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def check_tokenizer(label, d, cases, tmp):
    """HF tokenizers on d/tokenizer.json vs tok_cli on d: ids equal."""
    tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    got = run_specd(binary("tests", "tok_cli"), d, cases, True, tmp)
    bad = 0
    for s, (ids, _) in zip(cases, got):
        want = tk.encode(s, add_special_tokens=False).ids
        if ids != want:
            bad += 1
            if bad <= 5:
                print(f"  [{label}] {s[:60]!r}: specd {ids[:12]} HF {want[:12]}")
    print(f"{'ok  ' if not bad else 'FAIL'} {label}: {len(cases) - bad}/{len(cases)} tokenizations equal")
    return bad == 0


def generate_ids(args):
    r = subprocess.run([binary("tools", "specd-generate")] + args + ["-p", "the rest of it", "-n", "8", "--json",
                                                                     "--threads", "2"],
                       capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"specd-generate {' '.join(args)} failed:\n{r.stderr.decode(errors='replace')}")
    return json.loads(r.stdout.decode("utf-8", errors="replace"))["ids"]  # a random model's text need not be UTF-8


def check_generate(d, g):
    """specd-generate takes the directory wherever it takes the GGUF: target and draft model."""
    plain_g, plain_d = generate_ids(["-m", g]), generate_ids(["-m", d])
    spec = generate_ids(["-m", g, "--draft", d, "-k", "3"])
    same = plain_g == plain_d == spec
    print(f"{'ok  ' if same else 'FAIL'} specd-generate greedy ids: GGUF {plain_g}, HF directory {plain_d}, "
          f"GGUF target + HF draft {spec}")
    return same


# ---- safetensors header rules: specd's reader vs the reference reader ----

def st_file(header, data_len, declared=None):
    h = header.encode("utf-8") if isinstance(header, str) else header
    n = len(h) if declared is None else declared
    return struct.pack("<Q", n) + h + bytes((i * 13 + 1) & 255 for i in range(data_len))


def t(name, dtype, shape, b, e):
    return f'"{name}":{{"dtype":"{dtype}","shape":{json.dumps(shape)},"data_offsets":[{b},{e}]}}'


# (label, bytes, the reference's verdict differs by design?)
ST_CASES = [
    ("valid", st_file("{" + t("a", "F32", [2, 3], 0, 24) + "," + t("b", "BF16", [4], 24, 32) + "}", 32), False),
    ("empty", st_file("{}", 0), False),
    ("padded", st_file("{}      ", 0), False),
    ("metadata", st_file('{"__metadata__":{"format":"pt"},' + t("a", "U8", [1], 0, 1) + "}", 1), False),
    ("null metadata", st_file('{"__metadata__":null}', 0), False),
    ("scalar", st_file("{" + t("s", "F64", [], 0, 8) + "}", 8), False),
    ("zero-size", st_file("{" + t("z", "F32", [0, 4], 0, 0) + "}", 0), False),
    ("unknown field", st_file('{"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2],"x":1}}', 2), False),
    ("short file", struct.pack("<Q", 2)[:7], False),
    ("header too large", st_file("{}", 0, declared=100000001), False),
    ("header past the end", st_file("{}", 0, declared=3), False),
    ("bad utf-8", st_file(b'{"a\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1), False),
    ("leading space", st_file(" {}", 0), False),
    ("array header", st_file("[]", 0), False),
    ("empty header", st_file("", 0), False),
    ("broken json", st_file('{"a":', 0), False),
    ("trailing garbage", st_file("{}x", 0), False),
    ("metadata not strings", st_file('{"__metadata__":{"k":1}}', 0), False),
    ("no dtype", st_file('{"a":{"shape":[1],"data_offsets":[0,1]}}', 1), False),
    ("negative dim", st_file('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', 1), False),
    ("three offsets", st_file('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', 1), False),
    ("unknown dtype", st_file("{" + t("a", "F31", [1], 0, 4) + "}", 4), False),
    ("duplicate name", st_file("{" + t("a", "U8", [1], 0, 1) + "," + t("a", "U8", [1], 1, 2) + "}", 2), False),
    # the reference keeps the last of two identical entries and accepts; specd refuses every duplicate
    ("duplicate identical", st_file("{" + t("a", "U8", [1], 0, 1) + "," + t("a", "U8", [1], 0, 1) + "}", 1), True),
    ("end before begin", st_file("{" + t("a", "U8", [1], 0, 1) + "," + t("b", "U8", [0], 2, 1) + "}", 2), False),
    ("hole at 0", st_file("{" + t("a", "U8", [1], 1, 2) + "}", 2), False),
    ("hole", st_file("{" + t("a", "U8", [1], 0, 1) + "," + t("b", "U8", [1], 2, 3) + "}", 3), False),
    ("overlap", st_file("{" + t("a", "U8", [2], 0, 2) + "," + t("b", "U8", [2], 1, 3) + "}", 3), False),
    ("element overflow", st_file("{" + t("a", "U8", [4294967296, 4294967296], 0, 1) + "}", 1), False),
    ("size mismatch", st_file("{" + t("a", "F32", [2, 3], 0, 20) + "}", 20), False),
    ("trailing data", st_file("{" + t("a", "U8", [4], 0, 4) + "}", 5), False),
    ("truncated data", st_file("{" + t("a", "U8", [4], 0, 4) + "}", 3), False),
]


def reference_accepts(path):
    from safetensors import safe_open
    try:
        with safe_open(path, framework="numpy") as f:
            list(f.keys())
        return True
    except Exception:  # SafetensorError, or a deserialization error
        return False


def check_safetensors_rules(tmp):
    paths = []
    for i, (_, data, _) in enumerate(ST_CASES):
        p = os.path.join(tmp, f"case{i}.safetensors")
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    out = subprocess.run([binary("tests", "st_check")] + paths, capture_output=True, text=True, check=True)
    verdicts = out.stdout.split("\n")
    ok = True
    for (label, _, differs), p, v in zip(ST_CASES, paths, verdicts):
        ours, ref = v.startswith("ok"), reference_accepts(p)
        agree = (ours == ref) != differs
        ok &= agree
        print(f"{'ok  ' if agree else 'FAIL'} safetensors '{label}': specd {v.strip()}, reference "
              f"{'accepts' if ref else 'refuses'}{' (differs by design)' if differs else ''}")
    return ok


def run_random():
    for sub, name in (("tools", "specd-mkmodel"), ("tools", "specd-generate"), ("tests", "specd_logits"),
                      ("tests", "tok_cli"), ("tests", "st_check")):
        if not binary(sub, name):
            print(f"skip: {name} not built in {BUILD_DIR}")
            return SKIP
    rng = np.random.default_rng(4321)
    ok = True
    cases = ["Hello world", "the rest of it, then more", " x  y\n\nz", "<|im_start|>user\nhi<|im_end|>",
             "12345 678", "caf\u00e9 \u4e2d\u6587 \U0001F600", "theretheirthey're"]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, args, hf_args, scaling) in enumerate(MODELS):
            d, g = os.path.join(tmp, f"m{i}"), os.path.join(tmp, f"m{i}.gguf")
            common = ["--vocab", "384", "--seed", str(200 + i)] + args
            mkmodel(["-o", d, "--format", "hf"] + hf_args + common)
            if scaling:
                set_rope_scaling(d, scaling)
            ref = HFLlamaRef(d, np.float64)
            lens = [int(x) for x in rng.choice([1, 3, 9, 17], size=3)] + [70 if scaling else 20]
            seqs = [[int(x) for x in rng.integers(0, ref.n_vocab, size=n)] for n in lens]
            got = engine_logits(d, seqs, tmp, ref.n_vocab)
            ok &= compare(f"{label} lens {lens} vs the HF-convention reference", got, reference_rows(ref, seqs), seqs)
            if not scaling:  # the GGUF twin (mkmodel writes no rope scaling keys)
                mkmodel(["-o", g] + common)
                twin = engine_logits(g, seqs, tmp, ref.n_vocab)
                same = np.array_equal(got.view(np.uint32), twin.view(np.uint32))
                ok &= same
                print(f"{'ok  ' if same else 'FAIL'} {label}: GGUF and HF directory logits bit-identical")
            if i < 2:
                ok &= check_tokenizer(f"{label} tokenizer.json", d, cases, tmp)
            if i == 0:
                ok &= check_generate(d, g)
        ok &= check_safetensors_rules(tmp)
    return 0 if ok else 1


def run_smollm2():
    if not binary("tools", "specd-mkmodel") or not binary("tests", "tok_cli"):
        print(f"skip: specd-mkmodel or tok_cli not built in {BUILD_DIR}")
        return SKIP
    model = os.environ.get("SPECD_MODEL")
    if not model or not os.path.exists(model):
        model = find_model()
    if not model:
        print("skip: SmolLM2 model not available (SPECD_MODEL unset, tools/fetch-model failed)")
        return SKIP
    cases = load_cases()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "smol-tok")
        mkmodel(["-o", d, "--format", "hf", "--tokenizer-from", model, "--dim", "32", "--heads", "2",
                 "--kv-heads", "1", "--ff", "32", "--layers", "1", "--tied"])
        ok &= check_tokenizer("SmolLM2 tokenizer.json (smollm pre-tokenizer)", d, cases, tmp)
        # Llama 3's split over the same vocabulary, as Llama 3's tokenizer.json writes it
        path = os.path.join(d, "tokenizer.json")
        with open(path) as f:
            tj = json.load(f)
        tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                                   "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                                   "\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        tj["model"]["ignore_merges"] = True
        with open(path, "w") as f:
            json.dump(tj, f)
        ok &= check_tokenizer("SmolLM2 vocabulary with the Llama 3 split", d, cases, tmp)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description="Hugging Face checkpoint oracle test")
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--smollm2", action="store_true")
    a = ap.parse_args()
    if not (a.random or a.smollm2):
        ap.error("give --random and/or --smollm2")
    rc = 0
    for flag, fn in ((a.random, run_random), (a.smollm2, run_smollm2)):
        if flag:
            r = fn()
            if r == 1 or (r == SKIP and rc == 0):
                rc = r
    return rc


if __name__ == "__main__":
    sys.exit(main())
