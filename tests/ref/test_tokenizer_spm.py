#!/usr/bin/env python3
"""Oracle: specd's SentencePiece tokenizer on the real Gemma 3 270M vocabulary
(262,144 tokens) against Hugging Face `tokenizers` and, with --llama, against
llama.cpp (llama-cpp-python, the slow tier), id for id.

The GGUF (tools/fetch-model gemma3) holds no tokenizer.json, so the Hugging
Face tokenizer is built here from the GGUF's pieces, scores and token types
the way Hugging Face's own converter builds Gemma's tokenizer.json from the
SentencePiece model: a BPE model with byte_fallback whose merges are every
split of a piece into two pieces, ordered by the piece's score (transformers'
SentencePieceExtractor), normalizer Replace(" ", "▁"), decoder
Replace("▁", " ") + ByteFallback + Fuse; control tokens are special added
tokens, user-defined ones (Gemma's runs of newlines, spaces and tabs, HTML
tags) non-special added tokens matched on the raw text. The merge-rank order
of HF and the score order of llama.cpp coincide on this vocabulary; both
comparisons are made against the same specd ids.

Cases: tests/data/tokenizer_cases.jsonl, a prompt set (plain text, code,
non-Latin scripts, emoji, runs of spaces and newlines, special-token text),
every string of length 1..3 over a whitespace/punctuation alphabet and
seeded random mixtures. Checked: ids equal with parse_special on (HF with
its special tokens) and off (HF without them: control-token text stays
text), specd decode == input, HF decode == input. Also printed: the
tokenizer's build time and peak memory in tok_cli (not asserted).

Exit 0: all equal; 1: a mismatch (the first ones are printed); 77: skipped.
"""
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tokenizer_hf import SRC, BUILD, SKIP, skip, load_cases, run_specd, compare  # noqa: E402

try:
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
except ImportError as e:  # pragma: no cover
    skip(f"python packages missing ({e}); run scripts/setup")

PROMPTS = [
    "The capital of France is",
    "Hello, world! How are you today?",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "<b>bold</b> </i> > </p>x> </y",  # Gemma's ">▁</" piece spans a space
    "<html>\n  <body>\n    <div class=\"x\">text</div>\n  </body>\n</html>",
    "Le café est très bon, n'est-ce pas ? Ça va.",
    "Привет, как дела? Всё хорошо.",
    "日本語のテキストと中文文本，还有한국어도 있습니다。",
    "مرحبا بالعالم — שלום עולם — नमस्ते दुनिया — สวัสดีชาวโลก",
    "Emoji: 😀👍🏽 👩‍💻 🇫🇷 ❤️ 🫠",
    "     five spaces, then\n\n\nthree newlines\t\ttabs \r\n crlf",
    "   ",
    "\n",
    "a\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nb",
    " " * 40 + "x",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk><mask>[multimodal]<start_of_image><unused0>",
    "text <0x41> looks like a byte token, <unused12> like a control one",
    "x=1;y=22;z=333;w=4444;12345678901234567890",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, π ≈ 3.14159, √2",
    "\u00a0non-breaking\u3000ideographic space\u200bzero-width",
    "ﬁ ligature, Å vs A\u030a (decomposed), ǅ titlecase",
    "\U0001F600\U00010000\U0010FFFF private \ue000",
]

SPM_ALPHA = [" ", "  ", "\t", "\n", "\r", "a", "1", "'", ".", "é", "中", "😀", "<", ">"]


def read_vocab(path):
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    model = bytes(f["tokenizer.ggml.model"].parts[-1]).decode()
    flag = f.get("tokenizer.ggml.add_space_prefix")
    prefix = True if flag is None else bool(flag.parts[flag.data[0]][0])
    return {"tokens": tokens, "scores": scores, "types": types, "model": model, "add_space_prefix": prefix}


def sentencepiece_merges(tokens, scores):
    """transformers' SentencePieceExtractor.extract(vocab_scores): every
    (left, right) split of a piece into two pieces, by the piece's score."""
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merges = []
    for piece, i in vocab.items():
        local = [(piece[:k], piece[k:], scores[i]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    return vocab, [(a, b) for a, b, _ in merges]


def hf_tokenizer(v, vocab, merges, with_control, rstrip=False):
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tk = Tokenizer(bpe)
    steps = [normalizers.Replace(" ", "▁")]
    if v["add_space_prefix"]:
        steps.insert(0, normalizers.Prepend("▁"))
    tk.normalizer = normalizers.Sequence(steps)
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    added = []
    for i, ty in enumerate(v["types"]):
        if ty == 4:
            added.append(AddedToken(v["tokens"][i], special=False, normalized=False))
        elif ty == 3 and with_control:
            added.append(AddedToken(v["tokens"][i], special=True, normalized=False, rstrip=rstrip))
    tk.add_tokens([a for a in added if not a.special])
    tk.add_special_tokens([a for a in added if a.special])
    return tk


class LlamaTok:
    """llama.cpp's tokenizer on the same file, with compare()'s encode/decode."""

    def __init__(self, path, parse_special):
        import llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.special = parse_special

    def encode(self, s, add_special_tokens=False):
        class R:
            pass
        r = R()
        r.ids = self.llm.tokenize(s.encode("utf-8"), add_bos=False, special=self.special)
        return r

    def decode(self, ids, skip_special_tokens=False):
        return self.llm.detokenize(ids, special=True).decode("utf-8", errors="replace")


def check_tokenizer_json(cli, v, vocab, merges, cases, tmp):
    """specd reading tokenizer.json files of the SentencePiece-BPE form (as
    tokenizers saves them) against the same HF tokenizer: Gemma's own form,
    Llama 2's (Prepend + Replace normalizer, a space before every fragment)
    and the Metaspace pre-tokenizer with prepend_scheme "first" and "always"
    (no "▁" before a fragment that starts with a space already), and control
    tokens with rstrip (Phi-3's added tokens swallow the whitespace after them)."""
    bad = 0
    for form in ("gemma", "llama2", "metaspace-first", "metaspace-always", "rstrip"):
        tk = hf_tokenizer(v, vocab, merges, True, rstrip=form == "rstrip")
        if form == "llama2":
            tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        elif form.startswith("metaspace"):
            tk.normalizer = None
            tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=form.split("-")[1],
                                                        split=False)
        path = os.path.join(tmp, f"{form}.tokenizer.json")
        tk.save(path)
        got = run_specd(cli, path, cases, True, tmp)
        bad += compare(f"tokenizer.json {form}", cases, got, tk, v["tokens"], roundtrip=form == "gemma")
    return bad


def cases_for_spm():
    cases = PROMPTS + load_cases()
    short = [""]
    for _ in range(3):
        short = [s + c for s in short for c in SPM_ALPHA]
        cases += short
    rng = random.Random(20261201)
    for _ in range(300):
        cases.append("".join(rng.choice(PROMPTS + SPM_ALPHA) for _ in range(rng.randint(1, 6))))
    return cases


def main():
    use_llama = "--llama" in sys.argv
    if use_llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            skip("llama-cpp-python missing (scripts/setup --llama)")
    try:
        path = subprocess.run([os.path.join(SRC, "tools", "fetch-model"), "gemma3"], capture_output=True, text=True,
                              timeout=900).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        path = ""
    if not path or not os.path.exists(path):
        skip("Gemma 3 270M not available (tools/fetch-model gemma3; scripts/setup fetches it)")
    cli = os.path.join(BUILD, "tests", "tok_cli")
    if not os.path.exists(cli):
        print(f"FAIL: {cli} not built")
        return 1
    v = read_vocab(path)
    if v["model"] != "llama":
        print(f"FAIL: expected a SentencePiece ('llama') tokenizer, the file has {v['model']!r}")
        return 1
    cases = cases_for_spm()
    print(f"{len(cases)} cases, vocabulary of {len(v['tokens'])}, add_space_prefix {v['add_space_prefix']}")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        got_on = run_specd(cli, path, cases, True, tmp)
        got_off = run_specd(cli, path, cases, False, tmp)
        if use_llama:
            bad += compare("llama.cpp, special", cases, got_on, LlamaTok(path, True), v["tokens"], roundtrip=False)
            bad += compare("llama.cpp, special off", cases, got_off, LlamaTok(path, False), v["tokens"],
                           roundtrip=False)
        else:
            vocab, merges = sentencepiece_merges(v["tokens"], v["scores"])
            print(f"  {len(merges)} merges extracted")
            # Roundtrip: HF decode of control tokens gives their text, as specd does.
            bad += compare("HF, special", cases, got_on, hf_tokenizer(v, vocab, merges, True), v["tokens"],
                           roundtrip=not v["add_space_prefix"])
            bad += compare("HF, special off", cases, got_off, hf_tokenizer(v, vocab, merges, False), v["tokens"],
                           roundtrip=not v["add_space_prefix"])
            bad += check_tokenizer_json(cli, v, vocab, merges, cases, tmp)
    if bad:
        print(f"FAIL: {bad} mismatching cases")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
