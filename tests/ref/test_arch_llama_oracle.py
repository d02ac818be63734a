"""test_arch_llama_oracle.py — llama.cpp (llama-cpp-python) as an
independent oracle for every architecture specd loads, on random models.

For each architecture (llama; qwen2: Q/K/V biases, NeoX RoPE; qwen3: q/k
norms; gemma3: embedding scale, (1 + w) norms, post-norms, GeGLU, q/k norms,
windowed layers with their own RoPE base; mistral: llama with a sliding
window; phi3: fused QKV and gate/up matrices) specd-mkmodel writes a random
model of a small but real-ish shape (256-wide, 64-wide heads, GQA) in F16
and Q8_0; llama.cpp's own quantizer (llama_model_quantize) rewrites the F16
file as Q4_K_M (Q4_K / Q6_K, Q5_0 / Q8_0 where rows are not whole 256-element
super-blocks). On each file, with both programs on 2 threads:

  1. tokenization: specd-generate --json's prompt ids equal llama.cpp's
     (BOS where the file asks for one, specials not parsed) on every prompt;
  2. teacher-forced: a random id sequence of SEQ_LEN tokens (longer than the
     windows: gemma3's 8, mistral's 16) run by specd (tests/specd_logits) and
     by llama.cpp (logits_all); at every position the argmax agrees unless
     the two candidates are within a near-tie (llama.cpp's logit for specd's
     choice within 2 x TIE_TOL x max |logit| of its own), and
     max |diff| / max |logit| over all positions <= LOGIT_TOL[format];
     both programs against the exact forward (llama_ref.py: the file's
     weights dequantized, f64, activations not rounded): specd may be no
     farther from it than EXACT_SLACK x llama.cpp's distance, or the floor
     (the two round activations differently: llama.cpp to F16 for F16
     weights and to its 8-bit blocks for the others, specd to 8-bit blocks
     for the integer formats only, so neither is the other's reference);
  3. free-running greedy: specd-generate's GEN greedy tokens after each
     prompt equal llama.cpp's token for token, unless they part where
     llama.cpp's own logits make it a near-tie (reported, not a failure).

Phi-3 LongRoPE (the 128k models' per-frequency factors and attention
factor): a random phi3 of context 8192 over an original 512, run with a
context of 1024 by both (llama.cpp's n_ctx, specd's --max-ctx: the long
factors) and of 256 (the short ones); each row also checks that llama.cpp
is far from the exact forward with the other factor set (so both programs
chose the same set, and the choice is seen). Measured (2026-12-02, loaded
2-core machine, ASan build, llama-cpp-python 0.3.36): both LongRoPE rows ok,
teacher-forced max diff / max logit 0.0017-0.0020 (F16), 0.031-0.034
(Q8_0), 0.043-0.051 (Q4_K_M); llama.cpp 0.53-0.75 x max |logit| from the
other set's exact forward; --slow's phi3-mini-128k shape (context 8192,
long factors) 0.0011 / 0.018 / 0.025.

llama.cpp's `llama` architecture reads no sliding window (it serves Mistral
files with full attention): the mistral model here has a window of 64, past
every sequence of this test, so the two must agree; the window itself is
checked by test_arch_oracle against the numpy reference. Gemma 3's windows
(every 6th layer global) are llama.cpp's own and are crossed here.

--slow: the same at real models' widths, head counts and FFN sizes
(Qwen2.5-0.5B, Qwen3-0.6B, Gemma-3-270M, Phi-3-mini, a 1024-wide llama) with
fewer layers and a 4k vocabulary. Measured (2026-12-01, a loaded 2-core
machine, ASan build): every row ok; teacher-forced max diff / max logit
0.0013-0.0016 on F16, 0.022-0.029 on Q8_0, 0.025-0.043 on Q4_K_M, specd as
close to the exact forward as llama.cpp is; ~15 minutes. --only TEXT runs
the models whose label contains TEXT.

Needs llama-cpp-python (scripts/setup --llama). Exit 77 (skipped) when it or
a binary is missing, or llama.cpp cannot decode on this machine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
from test_forward_oracle import SKIP, binary, engine_logits  # noqa: E402

THREADS = 2
GEN = 16
SEQ_LEN = 40
# max |specd - llama.cpp| / max |logit|, any position
LOGIT_TOL = {"F16": 0.01, "Q8_0": 0.05, "Q4_K_M": 0.08}
# a near-tie: two candidates within 2 x TIE_TOL x max |logit| in llama.cpp's row (test_llama_oracle's values)
TIE_TOL = {"F16": 0.01, "Q8_0": 0.03, "Q4_K_M": 0.06}
# against the exact forward: specd's distance <= max(EXACT_SLACK x llama.cpp's, EXACT_FLOOR)
EXACT_SLACK = 1.5
EXACT_FLOOR = {"F16": 0.01, "Q8_0": 0.04, "Q4_K_M": 0.08}
PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return a + b\n",
    "once upon a time there was a fox that",
]
SMALL = ["--dim", "256", "--heads", "4", "--kv-heads", "2", "--ff", "512", "--layers", "3", "--vocab", "1024"]
ARCHS = [
    # (label, mkmodel args)
    ("llama", ["--arch", "llama"] + SMALL),
    ("qwen2 untied", ["--arch", "qwen2", "--rope-base", "1000000"] + SMALL),
    ("qwen2 tied", ["--arch", "qwen2", "--tied"] + SMALL),
    ("qwen3", ["--arch", "qwen3", "--head-dim", "128", "--tied"] + SMALL),
    ("gemma3 window 8", ["--arch", "gemma3", "--head-dim", "128", "--tied", "--window", "8", "--rope-base",
                         "1000000"] + SMALL + ["--kv-heads", "1", "--layers", "7"]),
    ("phi3", ["--arch", "phi3"] + SMALL),
    ("mistral window 64", ["--arch", "mistral", "--window", "64"] + SMALL),
    # (label, mkmodel args, context: llama.cpp's n_ctx and specd's --max-ctx)
    ("phi3 LongRoPE, long factors (context 1024 > original 512)", ["--arch", "phi3", "--ctx", "8192", "--longrope",
                                                                    "512"] + SMALL, 1024),
    ("phi3 LongRoPE, short factors (context 256 <= original 512)", ["--arch", "phi3", "--ctx", "8192", "--longrope",
                                                                     "512"] + SMALL, 256),
]
SLOW_ARCHS = [
    ("qwen2.5-0.5b shape, 4 layers", ["--shape", "qwen2.5-0.5b", "--layers", "4", "--vocab", "4096"]),
    ("qwen3-0.6b shape, 4 layers", ["--shape", "qwen3-0.6b", "--layers", "4", "--vocab", "4096"]),
    ("gemma3-270m shape, 7 layers", ["--shape", "gemma3-270m", "--layers", "7", "--vocab", "4096"]),
    ("phi3-mini shape (3072 wide, 96-wide heads), 1 layer", ["--shape", "phi3-mini", "--layers", "1",
                                                             "--vocab", "4096"]),
    ("phi3-mini-128k shape (LongRoPE, long factors at context 8192), 1 layer",
     ["--shape", "phi3-mini-128k", "--layers", "1", "--vocab", "4096"], 8192),
    # Llama 2's kind: the llama architecture with a SentencePiece vocabulary (Gemma 3's, 262,144 tokens, copied
    # from the real file when tools/fetch-model gemma3 has it; the row is skipped otherwise)
    ("llama + SentencePiece (Gemma 3's tokenizer)", ["--arch", "llama", "--tokenizer-from", "{gemma}"] + SMALL[:-2]),
    ("llama 1024 wide, 4 layers", ["--arch", "llama", "--dim", "1024", "--heads", "16", "--kv-heads", "4",
                                   "--ff", "2816", "--layers", "4", "--vocab", "4096"]),
]

PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_threads=2, n_ctx=256, verbose=False)
llm.eval([1, 2, 3])
"""


def specd_generate(model, text, ctx=None):
    r = subprocess.run([binary("specd-generate", "tools"), "-m", model, "-p", text, "-n", str(GEN), "-t",
                        str(THREADS), "--json", "--temp", "0", "--ignore-eos"] + (["--max-ctx", str(ctx)] if ctx else []),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"specd-generate failed on {model}: {r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    return list(j["prompt_ids"]), list(j["ids"])


def llama_quantize(llama_cpp, f16, ftype):
    path = f16.replace("-f16.gguf", f"-{ftype.lower()}.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    rc = llama_cpp.llama_model_quantize(f16.encode(), path.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {ftype} failed ({rc})")
    return path


def make_files(llama_cpp, tmp, i, args):
    mk = binary("specd-mkmodel", "tools")
    files = {}
    for name, dt in (("F16", "f16"), ("Q8_0", "q8_0")):
        path = os.path.join(tmp, f"m{i}-{dt}.gguf")
        cmd = [mk, "-o", path, "--seed", str(900 + i), "--dtype", dt] + args
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"specd-mkmodel failed: {' '.join(cmd)}\n{r.stderr}")
        files[name] = path
    files["Q4_K_M"] = llama_quantize(llama_cpp, files["F16"], "Q4_K_M")
    return files


def tie(row, a, b, tol):
    return row[a] - row[b] <= 2.0 * tol * float(np.max(np.abs(row)))


def llama_greedy(llm, prompt):
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(GEN):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    return out


def check_teacher_forced(label, path, llm, tmp, fmt, rng, ctx=None):
    n_vocab = llm.n_vocab()
    seq = [int(t) for t in rng.integers(3, n_vocab, size=SEQ_LEN)]
    got = engine_logits(path, [seq], tmp, n_vocab, threads=THREADS, max_ctx=ctx or 0)
    llm.reset()
    llm.eval(seq)
    ref = np.array(llm.scores[:len(seq)], dtype=np.float64)
    tol = TIE_TOL[fmt]
    ok, worst, ties = True, 0.0, 0
    for p in range(len(seq)):
        r, g = ref[p], got[p]
        worst = max(worst, float(np.max(np.abs(g - r))) / float(np.max(np.abs(r))))
        a_ref, a_got = int(np.argmax(r)), int(np.argmax(g))
        if a_ref != a_got:
            if tie(r, a_ref, a_got, tol):
                ties += 1
            else:
                print(f"FAIL {label}: position {p}: specd argmax {a_got}, llama.cpp {a_ref} "
                      f"({r[a_ref]:.3f} vs {r[a_got]:.3f})")
                ok = False
    if worst > LOGIT_TOL[fmt]:
        print(f"FAIL {label}: max |diff| / max |logit| {worst:.4f} > {LOGIT_TOL[fmt]}")
        ok = False
    exact_ref = llama_ref.LlamaRef(path, act_quant=False, max_ctx=ctx or 0)
    exact = np.asarray(exact_ref.logits(seq))
    scale = float(np.max(np.abs(exact)))
    d_specd = float(np.max(np.abs(got - exact))) / scale
    d_llama = float(np.max(np.abs(ref - exact))) / scale
    if hasattr(exact_ref, "rope_factor_set"):
        # LongRoPE: llama.cpp must be far from the other factor set's exact forward (it chose the same set)
        other_ctx = 1 if exact_ref.rope_factor_set == "long" else 1 << 30
        other = np.asarray(llama_ref.LlamaRef(path, act_quant=False, max_ctx=other_ctx).logits(seq))
        d_other = float(np.max(np.abs(ref - other))) / scale
        print(f"     {label}: {exact_ref.rope_factor_set} factors; llama.cpp {d_llama:.4f} from that exact forward, "
              f"{d_other:.4f} from the other set's")
        if not d_other > max(10 * d_llama, 0.05):
            print(f"FAIL {label}: llama.cpp is not clearly closer to the {exact_ref.rope_factor_set} factors")
            ok = False
    if d_specd > max(EXACT_SLACK * d_llama, EXACT_FLOOR[fmt]):
        print(f"FAIL {label}: {d_specd:.4f} x max |logit| from the exact forward, llama.cpp {d_llama:.4f} "
              f"(allowed: {EXACT_SLACK} x llama.cpp's, or {EXACT_FLOOR[fmt]})")
        ok = False
    return ok, worst, ties, (d_specd, d_llama)


def check_greedy(label, path, llm, tol, ctx=None):
    ok, same, ties = True, 0, 0
    for text in PROMPTS:
        p_specd, g_specd = specd_generate(path, text, ctx)
        # add_bos: llama_tokenize's add_special, BOS only where the file asks for it (as specd)
        p_llama = list(llm.tokenize(text.encode(), add_bos=True, special=False))
        if p_specd != p_llama:
            print(f"FAIL {label}: tokenization differs on {text!r}:\n  specd {p_specd}\n  llama {p_llama}")
            ok = False
            continue
        mine = llama_greedy(llm, p_llama)
        k = next((i for i, (a, b) in enumerate(zip(mine, g_specd)) if a != b), GEN)
        if k == GEN:
            same += 1
            continue
        llm.reset()
        llm.eval(p_llama + mine[:k])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        if tie(row, mine[k], g_specd[k], tol):
            ties += 1
        else:
            print(f"FAIL {label}: greedy after {text!r} parts at token {k}: specd {g_specd[k]}, llama.cpp "
                  f"{mine[k]} (llama.cpp logits {row[mine[k]]:.3f} vs {row[g_specd[k]]:.3f})\n"
                  f"  specd {g_specd}\n  llama {mine}")
            ok = False
    return ok, same, ties


def main():
    ap = argparse.ArgumentParser(description="llama.cpp oracle per architecture")
    ap.add_argument("--slow", action="store_true", help="the larger shapes")
    ap.add_argument("--only", default="", help="only the models whose label contains this")
    args = ap.parse_args()
    try:
        import llama_cpp
        from llama_cpp import Llama
    except ImportError:
        print("SKIP: llama-cpp-python is not installed (scripts/setup --llama)")
        return SKIP
    for b, sub in (("specd-generate", "tools"), ("specd-mkmodel", "tools"), ("specd_logits", "tests")):
        if not binary(b, sub):
            print(f"SKIP: {b} is not built")
            return SKIP
    rng = np.random.default_rng(2027)
    ok = True
    print(f"llama-cpp-python {llama_cpp.__version__}; {THREADS} threads; teacher-forced {SEQ_LEN} random ids; "
          f"greedy {GEN} tokens after {len(PROMPTS)} prompts\n")
    print("| model | format | teacher-forced: max diff / max logit (near-ties) | from the exact forward, "
          "specd / llama.cpp | greedy equal (near-tie partings) | result |")
    print("|---|---|---|---|---|---|")
    probed = False
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, mkargs, *rest) in enumerate(SLOW_ARCHS if args.slow else ARCHS):
            ctx = rest[0] if rest else None  # llama.cpp's n_ctx and specd's --max-ctx (LongRoPE's factor set)
            if args.only not in label:
                continue
            if "{gemma}" in mkargs:
                from test_gemma_oracle import find_gemma
                gemma = find_gemma()
                if not gemma:
                    print(f"| {label} | | skipped: no Gemma 3 file (tools/fetch-model gemma3) | | | |")
                    continue
                mkargs = [gemma if a == "{gemma}" else a for a in mkargs]
            files = make_files(llama_cpp, tmp, i, mkargs)
            if not probed:
                probed = True
                probe = subprocess.run([sys.executable, "-c", PROBE, files["F16"]], capture_output=True, text=True,
                                       timeout=300)
                if probe.returncode != 0:
                    print(f"SKIP: llama.cpp cannot decode on this machine (exit {probe.returncode}): "
                          f"{probe.stderr.strip()[-300:]}")
                    return SKIP
            for fmt, path in files.items():
                llm = Llama(model_path=path, n_threads=THREADS, n_ctx=ctx or 256, n_batch=256, logits_all=True,
                            verbose=False)
                tol = TIE_TOL[fmt]
                ok1, worst, ties1, (ds, dl) = check_teacher_forced(f"{label} {fmt}", path, llm, tmp, fmt, rng, ctx)
                ok2, same, ties2 = check_greedy(f"{label} {fmt}", path, llm, tol, ctx)
                del llm
                print(f"| {label} | {fmt} | {worst:.4f} ({ties1}) | {ds:.4f} / {dl:.4f} | {same} / {len(PROMPTS)} ({ties2}) | "
                      f"{'ok' if ok1 and ok2 else 'FAIL'} |")
                ok &= ok1 and ok2
            for path in files.values():
                os.unlink(path)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
