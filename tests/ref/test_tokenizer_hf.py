#!/usr/bin/env python3
"""Oracle: specd's tokenizer against Hugging Face `tokenizers`, id for id.

Both sides are built from the same GGUF. The Hugging Face tokenizer is
assembled here from the GGUF's vocabulary and merges (read with the `gguf`
package), with the pre-tokenizer that the GGUF's `tokenizer.ggml.pre` names:

  smollm : Sequence[Digits(individual_digits), ByteLevel(use_regex)]
  llama3 : Sequence[Split(llama3 regex, isolated), ByteLevel(use_regex=False)],
           BPE with ignore_merges (as Llama 3's tokenizer.json)

  qwen2  : Sequence[Split(qwen2 regex, isolated), ByteLevel(use_regex=False)]
           (Qwen2 / Qwen2.5 / Qwen3: Llama 3's regex with single digits)

The llama3 and qwen2 cases use SmolLM2's vocabulary with pre="llama-bpe" /
"qwen2": a tokenizer-only GGUF is written to a temporary folder.

specd is driven through tests/tok_cli (built next to this test): strings go
in length-prefixed, ids and decoded bytes come back. Checked for every case:
ids equal, specd decode == input, HF decode == input. With parse_special off,
specd is compared with an HF tokenizer that has no added tokens.

Exit 0: all equal; 1: a mismatch (the first ones are printed); 77: skipped.
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import unicodedata

SKIP = 77


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


try:
    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
except ImportError as e:  # pragma: no cover
    skip(f"python packages missing ({e}); run scripts/setup")

SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def find_model():
    path = os.environ.get("SPECD_MODEL")
    if not path:
        try:
            path = subprocess.run([os.path.join(SRC, "tools", "fetch-model")], capture_output=True, text=True,
                                  timeout=600).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            path = ""
    if not path or not os.path.exists(path):
        skip("demo model not available (tools/fetch-model or SPECD_MODEL)")
    return path


def field_scalar(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    return f.parts[f.data[0]][0]


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tt = r.fields["tokenizer.ggml.token_type"]
    v = {
        "tokens": strings("tokenizer.ggml.tokens"),
        "merges": strings("tokenizer.ggml.merges"),
        "types": [int(tt.parts[i][0]) for i in tt.data],
        "pre": bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode(),
    }
    for name in ("bos", "eos", "unknown", "padding"):
        x = field_scalar(r, f"tokenizer.ggml.{name}_token_id")
        v[name] = -1 if x is None else int(x)
    return v


def hf_tokenizer(v, flavor, with_specials):
    vocab = {}
    for i, t in enumerate(v["tokens"]):
        vocab.setdefault(t, i)
    merges = []
    for m in v["merges"]:
        k = m.index(" ", 1)
        merges.append((m[:k], m[k + 1:]))
    unk = v["tokens"][v["unknown"]] if v["unknown"] >= 0 else None
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=unk, ignore_merges=(flavor == "llama3"))
    tk = Tokenizer(bpe)
    if flavor == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE if flavor == "llama3" else QWEN2_RE), behavior="isolated",
                                 invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tk.decoder = decoders.ByteLevel()
    if with_specials:
        tk.add_special_tokens([AddedToken(v["tokens"][i], special=True, normalized=False)
                               for i, ty in enumerate(v["types"]) if ty in (3, 4)])
    return tk


def write_llama3_gguf(v, path, pre="llama-bpe"):
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    w.add_unk_token_id(v["unknown"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_cases():
    with open(os.path.join(SRC, "tests", "data", "tokenizer_cases.jsonl"), encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    # Every string of length 1..3 over a small alphabet: the whitespace and
    # digit boundary rules of the regexes, exhaustively.
    alpha = [" ", "\t", "\n", "\r", "a", "1", "'", "."]
    short = [""]
    for _ in range(3):
        short = [s + c for s in short for c in alpha]
        cases += short
    # Seeded random mixtures of fragments from every script and class.
    frags = ["the", " The", "DON'T", "'ll", "'s", " 42", "7", "3.14", "  ", "\t", "\n", "\r\n", "\u00a0",
             "\u3000", " !", "?!", "...", "{", "}", "()", "->", "café", "naïve", "中文", "日本", "한국",
             "😀", "👩‍💻", "🇫🇷", "مرحبا", "שלום", "ß", "İ", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
             "x" * 30, "0" * 12, "int", " main", "_", "__init__", "\\n", "\"", "'", "`", "#", "@"]
    rng = random.Random(20240521)
    for _ in range(200):
        cases.append("".join(rng.choice(frags) for _ in range(rng.randint(1, 25))))
    return cases


def run_specd(cli, model, cases, parse_special, tmp):
    inp, outp = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    with open(inp, "wb") as f:
        for s in cases:
            b = s.encode("utf-8")
            f.write(struct.pack("<BI", 1 if parse_special else 0, len(b)))
            f.write(b)
    p = subprocess.run([cli, model, inp, outp], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(f"FAIL: tok_cli exited {p.returncode}:\n{p.stderr}")
        sys.exit(1)
    print("  " + p.stderr.strip().splitlines()[-1])
    data = open(outp, "rb").read()
    res, at = [], 0
    for _ in cases:
        (n,) = struct.unpack_from("<I", data, at)
        at += 4
        ids = list(struct.unpack_from(f"<{n}i", data, at))
        at += 4 * n
        (m,) = struct.unpack_from("<I", data, at)
        at += 4
        res.append((ids, data[at:at + m]))
        at += m
    assert at == len(data), "trailing bytes in tok_cli output"
    return res


def compare(label, cases, got, tk, tokens, roundtrip=True):
    bad = 0
    for i, (s, (ids, dec)) in enumerate(zip(cases, got)):
        want = tk.encode(s, add_special_tokens=False).ids
        hf_dec = tk.decode(want, skip_special_tokens=False)
        problems = []
        if ids != want:
            k = next((j for j in range(min(len(ids), len(want))) if ids[j] != want[j]), min(len(ids), len(want)))
            problems.append(f"ids differ at {k}: specd {ids[max(0, k - 3):k + 5]} "
                            f"{[tokens[x] for x in ids[k:k + 5]]} vs HF {want[max(0, k - 3):k + 5]} "
                            f"{[tokens[x] for x in want[k:k + 5]]} (lengths {len(ids)} / {len(want)})")
        if roundtrip and dec != s.encode("utf-8"):
            problems.append(f"specd decode {dec[:80]!r} != input")
        if roundtrip and hf_dec != s:
            problems.append(f"HF decode {hf_dec[:80]!r} != input")
        if problems:
            bad += 1
            if bad <= 10:
                print(f"  [{label}] case {i} {s[:80]!r}:")
                for p in problems:
                    print(f"      {p}")
    print(f"  [{label}] {len(cases) - bad}/{len(cases)} cases equal")
    return bad


def main():
    model = find_model()
    cli = os.path.join(BUILD, "tests", "tok_cli")
    if not os.path.exists(cli):
        print(f"FAIL: {cli} not built")
        return 1
    v = read_vocab(model)
    if v["pre"] != "smollm":
        skip(f"demo model's pre-tokenizer is {v['pre']!r}, this test expects SmolLM2's 'smollm'")
    cases = load_cases()
    print(f"{len(cases)} cases, vocabulary of {len(v['tokens'])}, {len(v['merges'])} merges")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        print("smollm (the model's own pre-tokenizer):")
        bad += compare("smollm", cases, run_specd(cli, model, cases, True, tmp), hf_tokenizer(v, "smollm", True),
                       v["tokens"])
        bad += compare("smollm, parse_special off", cases, run_specd(cli, model, cases, False, tmp),
                       hf_tokenizer(v, "smollm", False), v["tokens"])
        # Bytes the vocabulary has no symbol for (SmolLM2 lacks 0x04, 0x06,
        # 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2...) encode as the unknown token on
        # both sides; these cannot round-trip, so only ids are compared.
        odd = ["\x04", "a\x06b", "\x13\x14 x", "\x16\x1d", "\U00040000", "x \U00080001 y", "\x04<|im_end|>\x04"]
        bad += compare("smollm, bytes without symbol", odd, run_specd(cli, model, odd, True, tmp),
                       hf_tokenizer(v, "smollm", True), v["tokens"], roundtrip=False)
        l3 = os.path.join(tmp, "llama3.gguf")
        write_llama3_gguf(v, l3)
        print("llama-bpe regex over the same vocabulary:")
        bad += compare("llama3", cases, run_specd(cli, l3, cases, True, tmp), hf_tokenizer(v, "llama3", True),
                       v["tokens"])
        q2 = os.path.join(tmp, "qwen2.gguf")
        write_llama3_gguf(v, q2, pre="qwen2")
        print("qwen2 regex over the same vocabulary:")
        bad += compare("qwen2", cases, run_specd(cli, q2, cases, True, tmp), hf_tokenizer(v, "qwen2", True),
                       v["tokens"])
        # The same as a tokenizer.json of Qwen2's form (its NFC normalizer
        # included: specd accepts it without applying it, the cases are NFC).
        tk = hf_tokenizer(v, "qwen2", True)
        tk.normalizer = normalizers.NFC()
        qj = os.path.join(tmp, "qwen2.tokenizer.json")
        tk.save(qj)
        print("qwen2 tokenizer.json over the same vocabulary:")
        nfc = [c for c in cases if unicodedata.normalize("NFC", c) == c]
        bad += compare("qwen2 tokenizer.json", nfc, run_specd(cli, qj, nfc, True, tmp), tk, v["tokens"])
    if bad:
        print(f"FAIL: {bad} mismatching cases")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
