"""test_hf_spm_writer.py — specd-mkmodel's tokenizer.json for a SentencePiece
vocabulary (Gemma / Mistral / Phi-3 / Llama 2 families) against independent
readers.

A random Gemma 3 model carrying the real Gemma 3 270M vocabulary (262,144
pieces; --tokenizer-from the file of tools/fetch-model gemma3) is written as
GGUF and as a Hugging Face directory. Checked:
  * the merge list in tokenizer.json equals the one transformers' converter
    derives from the pieces and scores (re-derived here in Python:
    test_tokenizer_spm.sentencepiece_merges), in order;
  * the normalizer, byte_fallback and added tokens are the family's form;
  * HF `tokenizers` loading that tokenizer.json gives specd's ids on the GGUF
    for the prompt set of test_tokenizer_spm (plain text, code, non-Latin
    scripts, emoji, runs of spaces, special-token text);
  * specd reading the directory gives the same ids as specd on the GGUF.

Environment: SPECD_BUILD_DIR, SPECD_SOURCE_DIR. Exit 77 (skipped) when a
package, a binary or the Gemma 3 file is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SKIP = 77
try:
    from tokenizers import Tokenizer
    from test_tokenizer_hf import compare, run_specd
    from test_tokenizer_spm import cases_for_spm, read_vocab, sentencepiece_merges
except ImportError as e:  # pragma: no cover
    print(f"skip: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))


def main():
    try:
        gemma = subprocess.run([os.path.join(SRC, "tools", "fetch-model"), "gemma3"], capture_output=True, text=True,
                               timeout=900).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gemma = ""
    if not gemma or not os.path.exists(gemma):
        print("skip: Gemma 3 270M not available (tools/fetch-model gemma3)")
        return SKIP
    mk, cli = os.path.join(BUILD, "tools", "specd-mkmodel"), os.path.join(BUILD, "tests", "tok_cli")
    if not (os.path.exists(mk) and os.path.exists(cli)):
        print("skip: specd-mkmodel or tok_cli not built")
        return SKIP
    v = read_vocab(gemma)
    cases = cases_for_spm()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        g, d = os.path.join(tmp, "m.gguf"), os.path.join(tmp, "m-hf")
        args = ["--arch", "gemma3", "--layers", "1", "--dim", "32", "--heads", "2", "--kv-heads", "1",
                "--head-dim", "16", "--ff", "32", "--tied", "--dtype", "bf16", "--tokenizer-from", gemma]
        for out, extra in ((g, []), (d, ["--format", "hf"])):
            r = subprocess.run([mk, "-o", out] + args + extra, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL: specd-mkmodel {' '.join(extra)}:\n{r.stderr}")
                return 1
        path = os.path.join(d, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        assert model["type"] == "BPE" and model["byte_fallback"] is True, model["type"]
        steps = [s["type"] for s in tj["normalizer"]["normalizers"]]
        assert steps == (["Prepend", "Replace"] if v["add_space_prefix"] else ["Replace"]), steps
        _, want = sentencepiece_merges(v["tokens"], v["scores"])
        got = [tuple(m) for m in model["merges"]]
        if got != want:
            k = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
            print(f"FAIL: merges differ from the converter's at {k} of {len(want)}: {got[k:k + 3]} vs {want[k:k + 3]}")
            return 1
        print(f"  {len(got)} merges equal to the converter's")
        specials = {a["content"] for a in tj["added_tokens"] if a["special"]}
        assert "<start_of_turn>" in specials and "<bos>" in specials, "control tokens not special added tokens"
        ref = run_specd(cli, g, cases, True, tmp)
        bad += compare("HF tokenizers on the written tokenizer.json", cases, ref, Tokenizer.from_file(path),
                       v["tokens"], roundtrip=False)
        got_dir = run_specd(cli, d, cases, True, tmp)
        diff = [i for i, (a, b) in enumerate(zip(ref, got_dir)) if a[0] != b[0]]
        print(f"  [specd on the directory] {len(cases) - len(diff)}/{len(cases)} cases equal to the GGUF's")
        bad += len(diff)
    if bad:
        print(f"FAIL: {bad} mismatching cases")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
