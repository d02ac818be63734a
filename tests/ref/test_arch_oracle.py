"""test_arch_oracle.py — the architectures beyond Llama against the numpy oracle.

Random models from build/tools/specd-mkmodel --arch qwen2 | qwen3 | gemma3 |
phi3 | mistral (what each adds: engine/formats/model_config.c, tests/ref/llama_ref.py):
  * qwen2: Q/K/V biases, NeoX RoPE; tied and untied heads; f32 and q8_0;
  * qwen3: per-head q/k RMSNorm with heads wider than n_embd / n_heads;
  * gemma3: the embedding scale, q/k norms, post-norms, GeGLU, 7 layers so
    that layer 5 is global and the others windowed (window 8, each kind with
    its own RoPE base), f32 and q8_0;
  * phi3: Q/K/V in one attn_qkv matrix, gate and up in one ffn_up of
    2 x ff rows (the engine loads each part as a matrix of its own), NeoX
    RoPE; f32 and q8_0;
  * phi3 LongRoPE (the 128k models' per-frequency factors and attention
    factor; context 8192 over an original 512): the long factors as loaded
    by default (the file's context), the short ones with --max-ctx 512
    (sd_model_params.max_ctx), the reference told the same context; and the
    two sets' logits differ (the choice is seen);
  * mistral: llama with a window of 6 on every layer.
Sequences of up to 33 tokens (longer than the windows) in one ragged batch,
and cut into chunks of 5 (attention over K/V from earlier calls, across the
window's edge). The engine's logits (build/tests/specd_logits) against the
reference's in float64: max |err| <= 1e-4 x max |logit| (the 8-bit
activation models: test_forward_oracle.compare's jittered bound), no argmax
flip.

A second check: with the window removed from the reference, the windowed
models' logits differ from the engine's past the window (the test can fail:
it sees the mask).

Environment: SPECD_BUILD_DIR, SPECD_SOURCE_DIR. Exit 77 when not built.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_ref import LlamaRef  # noqa: E402
from test_forward_oracle import (JITTER_SEEDS, SKIP, binary, compare, engine_logits, jittered_rows,  # noqa: E402
                                 reference_rows)

ARCH_MODELS = [
    # (label, mkmodel args)
    ("qwen2 f32 tied GQA 4/2", ["--arch", "qwen2", "--dtype", "f32", "--dim", "64", "--heads", "4",
                                "--kv-heads", "2", "--ff", "128", "--tied"]),
    ("qwen2 q8_0 untied GQA 4/2", ["--arch", "qwen2", "--dtype", "q8_0", "--dim", "64", "--heads", "4",
                                   "--kv-heads", "2", "--ff", "128", "--rope-base", "1000000"]),
    ("qwen3 f32 head_dim 32 x 4 heads over dim 64", ["--arch", "qwen3", "--dtype", "f32", "--dim", "64",
                                                     "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                                                     "--ff", "128", "--tied"]),
    ("gemma3 f32 7 layers window 8", ["--arch", "gemma3", "--dtype", "f32", "--dim", "64", "--heads", "4",
                                      "--kv-heads", "1", "--head-dim", "32", "--ff", "128", "--layers", "7",
                                      "--window", "8", "--tied", "--rope-base", "1000000"]),
    ("gemma3 q8_0 6 layers window 5", ["--arch", "gemma3", "--dtype", "q8_0", "--dim", "64", "--heads", "2",
                                       "--kv-heads", "1", "--head-dim", "64", "--ff", "192", "--layers", "6",
                                       "--window", "5", "--tied"]),
    ("phi3 f32 fused QKV and gate/up", ["--arch", "phi3", "--dtype", "f32", "--dim", "64", "--heads", "4",
                                        "--kv-heads", "2", "--ff", "96"]),
    ("phi3 q8_0 MHA", ["--arch", "phi3", "--dtype", "q8_0", "--dim", "64", "--heads", "2", "--kv-heads", "2",
                       "--ff", "128", "--layers", "3"]),
    ("mistral f32 window 6", ["--arch", "mistral", "--dtype", "f32", "--dim", "64", "--heads", "4",
                              "--kv-heads", "2", "--ff", "128", "--window", "6"]),
]
# (label, mkmodel args, max_ctx: 0 = the file's context, 8192 > 512: the long factors)
LONGROPE = ["--arch", "phi3", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ff", "96", "--ctx", "8192",
            "--longrope", "512"]
LONGROPE_MODELS = [
    ("phi3 LongRoPE f32, long factors", ["--dtype", "f32"] + LONGROPE, 0),
    ("phi3 LongRoPE f32, short factors (max_ctx 512)", ["--dtype", "f32"] + LONGROPE, 512),
    ("phi3 LongRoPE q8_0, long factors (max_ctx 513)", ["--dtype", "q8_0"] + LONGROPE, 513),
    ("phi3 LongRoPE q8_0, short factors (max_ctx 100)", ["--dtype", "q8_0"] + LONGROPE, 100),
]


def check_longrope(mk, tmp, rng):
    """The LongRoPE rows: each factor set against the reference told the same
    context; then the other set's reference must be far (the choice matters)."""
    ok = True
    for i, (label, args, max_ctx) in enumerate(LONGROPE_MODELS):
        path = os.path.join(tmp, f"lr{i}.gguf")
        r = subprocess.run([mk, "-o", path, "--vocab", "320", "--seed", str(700 + i // 2)] + args, capture_output=True,
                           text=True)
        if r.returncode != 0:
            print(f"FAIL {label}: specd-mkmodel failed: {r.stderr}")
            ok = False
            continue
        ref = LlamaRef(path, np.float64, max_ctx=max_ctx)
        want_set = "short" if max_ctx and max_ctx <= 512 else "long"
        if ref.rope_factor_set != want_set:
            print(f"FAIL {label}: the reference took the {ref.rope_factor_set} factors")
            ok = False
        seqs = [[int(t) for t in rng.integers(0, ref.n_vocab, size=n)] for n in (40, 13, 1)]
        want = reference_rows(ref, seqs)
        jit = jittered_rows(path, seqs, JITTER_SEEDS, max_ctx=max_ctx)
        got = engine_logits(path, seqs, tmp, ref.n_vocab, max_ctx=max_ctx)
        ok &= compare(f"{label}", got, want, seqs, jit)
        got_c = engine_logits(path, seqs, tmp, ref.n_vocab, chunk=7, threads=1, max_ctx=max_ctx)
        ok &= compare(f"{label} chunks of 7", got_c, want, seqs, jit)
        other = reference_rows(LlamaRef(path, np.float64, max_ctx=100 if want_set == "long" else 0), seqs)
        gap, scale = float(np.abs(other - got).max()), float(np.abs(want).max())
        sees = gap > 1e-2 * scale
        print(f"{'ok  ' if sees else 'FAIL'} {label}: the other factor set's reference is {gap:.3g} away "
              f"(must be > {1e-2 * scale:.3g})")
        ok &= sees
    return ok


def main():
    mk = binary("specd-mkmodel", "tools")
    if not mk or not binary("specd_logits", "tests"):
        print("skip: specd-mkmodel or specd_logits not built")
        return SKIP
    rng = np.random.default_rng(4321)
    all_ok = True
    with tempfile.TemporaryDirectory() as tmp:
        all_ok &= check_longrope(mk, tmp, rng)
        for i, (label, args) in enumerate(ARCH_MODELS):
            path = os.path.join(tmp, f"a{i}.gguf")
            cmd = [mk, "-o", path, "--vocab", "320", "--seed", str(500 + i)] + args
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {label}: specd-mkmodel failed: {' '.join(cmd)}\n{r.stderr}")
                all_ok = False
                continue
            ref = LlamaRef(path, np.float64)
            lens = [33, 20, 1, 9]
            seqs = [[int(t) for t in rng.integers(0, ref.n_vocab, size=n)] for n in lens]
            want = reference_rows(ref, seqs)
            jit = jittered_rows(path, seqs, JITTER_SEEDS)
            got = engine_logits(path, seqs, tmp, ref.n_vocab)
            all_ok &= compare(f"{label} lens {lens}", got, want, seqs, jit)
            got = engine_logits(path, seqs, tmp, ref.n_vocab, chunk=5, threads=1)
            all_ok &= compare(f"{label} lens {lens} chunks of 5", got, want, seqs, jit)
            if ref.window:
                # the mask matters: without it the reference parts from the engine past the window
                ref.window = 0
                full = reference_rows(ref, seqs)
                gap = float(np.abs(full - got).max())
                scale = float(np.abs(full).max())
                sees = gap > 1e-3 * scale
                print(f"{'ok  ' if sees else 'FAIL'} {label}: a reference without the window is {gap:.3g} away "
                      f"(must be > {1e-3 * scale:.3g})")
                all_ok &= sees
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
