"""test_gemma_oracle.py — the real Gemma 3 270M (Q4_K_M GGUF: Q4_K, Q5_0, Q6_K,
Q8_0 and F32 tensors) against the numpy oracle, on token ids (no tokenizer
needed: the prompts are spelled with ids of the file's own vocabulary).

The engine's logits (build/tests/specd_logits, one ragged batch) against
tests/ref/llama_ref.py in float64 with the engine's 8-bit activation
rounding, by test_forward_oracle.compare's rule for such models: no farther
from the reference than twice the jittered reference (activations x (1 +
1e-6 N(0, 1)) before rounding), at least as many rows within 1e-4 x
max|logit|, no argmax flip beyond the error. Measured (one run): over the
three prompts the engine's max |err| 1.49 and the jittered reference's 1.65
(max |logit| 28.5: the 8-bit activation rounding through 18 layers moves
logits by ~5% either way; no row is within 1e-4 for either); per row on
"<bos>The capital of France is" the engine's 0.23..1.02, the jittered
reference's 0.29..1.18. The engine's top tokens after that prompt are
" the", " a", " Paris", " one", " known".

And the answer must be sensible: " Paris" among the engine's five most
likely next tokens after "The capital of France is".

The model: SPECD_GEMMA_MODEL, else `tools/fetch-model gemma3` (when that
fetcher knows it); exit 77 (skipped) when neither gives a file.
Slow tier: the reference dequantizes the 262,144 x 640 embedding (1.3 GB in
float64).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_ref import LlamaRef  # noqa: E402
from test_forward_oracle import SKIP, SOURCE_DIR, binary, compare, engine_logits, jittered_rows  # noqa: E402


def find_gemma():
    path = os.environ.get("SPECD_GEMMA_MODEL")
    if path and os.path.exists(path):
        return path
    try:
        r = subprocess.run([os.path.join(SOURCE_DIR, "tools", "fetch-model"), "gemma3"], capture_output=True,
                           text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.strip().splitlines()
    return lines[-1] if r.returncode == 0 and lines and lines[-1].endswith(".gguf") and os.path.exists(lines[-1]) \
        else None


def vocab(path):
    import gguf
    f = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
    return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]


def main():
    if not binary("specd_logits", "tests"):
        print("skip: specd_logits not built")
        return SKIP
    path = find_gemma()
    if not path:
        print("skip: no Gemma 3 270M file (SPECD_GEMMA_MODEL unset, tools/fetch-model gemma3 gave none)")
        return SKIP
    toks = vocab(path)
    ids = {t: i for i, t in enumerate(toks)}
    bos = ids["<bos>"]

    def spell(words):
        return [bos] + [ids[w] for w in words]

    seqs = [spell(["The", "▁capital", "▁of", "▁France", "▁is"]),
            spell(["Once", "▁upon", "▁a", "▁time"]),
            spell(["def", "▁main", "():"]) if "():" in ids else spell(["def", "▁main"])]
    ref = LlamaRef(path, np.float64)
    with tempfile.TemporaryDirectory() as tmp:
        got = engine_logits(path, seqs, tmp, ref.n_vocab)
    want = np.concatenate([ref.logits(s) for s in seqs])
    jit = jittered_rows(path, seqs)
    ok = compare(f"Gemma 3 270M ragged batch lens {[len(s) for s in seqs]}", got, want, seqs, jit)
    last = got[len(seqs[0]) - 1]
    top = [toks[i] for i in np.argsort(-last)[:5]]
    sensible = "▁Paris" in top
    print(f"{'ok  ' if sensible else 'FAIL'} after 'The capital of France is' the engine's top 5: {top}")
    return 0 if ok and sensible else 1


if __name__ == "__main__":
    sys.exit(main())
