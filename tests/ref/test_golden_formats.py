"""Every stored format of the demo model loads and answers.

tools/specd-quantize rewrites SmolLM2-135M-Instruct (Q4_1) as f16, bf16,
q8_0, q4_0, q4_1, q5_0, q4_k_m, q5_k_m and q6_k. For q4_k_m and q5_k_m the 576-wide
matrices are not whole 256-element super-blocks, so they fall back as
llama.cpp's do (Q5_0 / Q5_1, Q8_0 where the recipe says Q6_K); the 1536-wide
ffn_down matrices are Q4_K / Q5_K and Q6_K, and those run on the K-quant
kernels. (A pure q5_1 rewrite is not in the list: re-quantizing this Q4_1
file's 16 levels onto Q5_1's 32 moves the Germany answer to "Der Königin der
Bundesministerium" on the f32 path too, so the weights decide it, not the
kernels; q5_k_m runs Q5_1 in 166 of its matrices and answers.) Each file must
hold the tensor types its name promises and its tied LM head at the type
the quantizer's rule gives (gguf's reader), and greedy specd-generate must
answer:

  * the golden France question (tests/data/golden_france.json's prompt) with
    "Paris", on the f32 path (--cpu-weights f32) as test_golden.py runs
    it. This prompt's first token is a near-tie ("The" vs "L", 0.08 apart in
    f32 on the Q4_1 file, 0.013 with the 8-bit activations), so with the
    weights as stored the 8-bit activation rounding decides it: on the q8_0
    and q4_1 files it picks "L" (an answer in French about the Etoile), and
    llama.cpp picks the same on those files (llama-cpp-python 0.3.36,
    checked 2026-11-25). That path's logits are checked against a
    rounding-aware reference by tests/ref/test_forward_oracle.py, not here;
    On q4_k_m the tie goes the other way on the f32 path too ("L'Étoile de
    la Marseillaise"), and llama.cpp does the same on its own Q4_K_M of this
    model, whose tensors have the same types as specd's ("La femme de
    France, le Grand Croix", llama-cpp-python 0.3.36, 2026-11-29; specd on
    that file's f32 path gives those words too), so the France row is not
    asked of q4_k_m: tests/ref/test_llama_oracle.py compares specd with
    llama.cpp on llama.cpp's Q4_K_M file (slow tier);
  * "What is the capital of Germany?" with "Berlin" with the weights as
    stored (each format's own kernels), where there is no such tie.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77

# (specd-quantize TYPE, tensor types the file must hold, the tied LM head's
# type: Q6_K below 8 bits, Q8_0 in its place as the rows are 576 wide)
FORMATS = [("f16", {"F16"}, "F16"), ("bf16", {"BF16"}, "BF16"), ("q8_0", {"Q8_0"}, "Q8_0"),
           ("q4_0", {"Q4_0"}, "Q8_0"), ("q4_1", {"Q4_1"}, "Q8_0"), ("q5_0", {"Q5_0"}, "Q8_0"),
           ("q4_k_m", {"Q4_K", "Q6_K", "Q5_0"}, "Q8_0"), ("q5_k_m", {"Q5_K", "Q6_K", "Q5_1"}, "Q8_0"),
           ("q6_k", {"Q6_K"}, "Q8_0")]


def generate(exe, model, prompt, n, extra_args):
    cmd = [exe, "-m", model, "--chat", "-p", prompt, "-n", str(n), "--temp", "0", "--json"] + list(extra_args)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        print("specd-generate failed:", run.returncode, run.stderr)
        return None
    return json.loads(run.stdout)


def main() -> int:
    try:
        import gguf
    except ImportError as e:
        print(f"skipped: {e}")
        return SKIP
    src = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    build = os.environ.get("SPECD_BUILD_DIR", os.path.join(src, "build"))
    model = os.environ.get("SPECD_MODEL")
    if not model:
        try:
            model = subprocess.run([os.path.join(src, "tools", "fetch-model")], check=True,
                                   capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"skipped: demo model not available ({e})")
            return SKIP
    if not os.path.exists(model):
        print(f"skipped: demo model not found at {model}")
        return SKIP
    exe = os.path.join(build, "tools", "specd-generate")
    quantize = os.path.join(build, "tools", "specd-quantize")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, want, head in FORMATS:
            path = os.path.join(tmp, fmt + ".gguf")
            q = subprocess.run([quantize, model, path, fmt], capture_output=True, text=True)
            if q.returncode != 0:
                print(f"{fmt}: specd-quantize failed:", q.stderr)
                ok = False
                continue
            kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
            types = set(kinds.values())
            if not want <= types:
                print(f"{fmt}: the file lacks {sorted(want - types)} tensors:", sorted(types))
                ok = False
            if kinds.get("token_embd.weight") != head:
                print(f"{fmt}: the tied LM head is {kinds.get('token_embd.weight')}, want {head}")
                ok = False
            # (question, tokens, specd-generate's extra options, the word the answer must hold, what is run)
            questions = [("What is the capital of Germany?", 12, [], "Berlin", "as stored")]
            if fmt != "q4_k_m":  # the near-tie of the file comment
                questions.insert(0, ("What is the capital of France?", 12, ["--cpu-weights", "f32"], "Paris",
                                     "f32 path"))
            for q_text, n, extra, word, what in questions:
                out = generate(exe, path, q_text, n, extra)
                if out is None or word not in out["text"]:
                    print(f"{fmt}: {q_text} ({what}): the answer does not hold {word}:", out and repr(out["text"]))
                    ok = False
                else:
                    print(f"{fmt}: {q_text} ({what}):", repr(out["text"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
