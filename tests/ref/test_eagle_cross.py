"""test_eagle_cross.py — the C head (tests/eagle_probe) against the training
tool's own JAX forward (tools/eagle/head.py: ttt_forward, EAGLE-3's
training-time test), an implementation written separately from the C one
and from eagle_ref.py: a head saved by tools/eagle's save_head for a random
target (specd-mkmodel --format hf), random features; the rows from target
features (step 0) and two chain steps fed the C head's own argmax drafts
must agree within |err| <= 1e-3 x max|ref| + 1e-4 (both f32).

tools/eagle comes from the training tool; without it (or without jax) the
test exits 77. SPECD_EAGLE_TOOLS overrides where tools/eagle is looked for.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SPECD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD_DIR = os.environ.get("SPECD_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
TOOLS = os.environ.get("SPECD_EAGLE_TOOLS", os.path.join(SOURCE_DIR, "tools"))
SKIP = 77
sys.path.insert(0, TOOLS)
try:
    import jax.numpy as jnp
    from safetensors.numpy import load_file, save_file
    from eagle import head as TH
except ImportError as e:  # pragma: no cover
    print(f"skip: the training tool's forward is not importable ({e})")
    sys.exit(SKIP)

DIM, LAYERS, VOCAB, DV, T = 64, 6, 512, 96, 10


def binary(sub, name):
    path = os.path.join(BUILD_DIR, sub, name)
    if not os.path.exists(path):
        print(f"skip: {path} not built")
        sys.exit(SKIP)
    return path


def main():
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "target")
        subprocess.run([binary("tools", "specd-mkmodel"), "-o", target, "--format", "hf", "--dim", str(DIM),
                        "--layers", str(LAYERS), "--heads", "4", "--kv-heads", "2", "--ff", "128", "--vocab",
                        str(VOCAB), "--seed", "4"], check=True, capture_output=True)
        tcfg = json.load(open(os.path.join(target, "config.json")))
        tw = load_file(os.path.join(target, "model.safetensors"))
        embed = tw["model.embed_tokens.weight"].astype(np.float32)
        cfg = TH.HeadConfig(DIM, 4, 2, DIM // 4, 128, tcfg.get("rms_norm_eps", 1e-5), tcfg.get("rope_theta", 1e4),
                            VOCAB, DV, [0, 2, 5])
        params = TH.init_params(cfg, 3)
        for k, v in params.items():  # larger than init's 0.02 so that the layer's every part shows in the logits
            params[k] = v * 8.0 if v.ndim == 2 else (1.0 + 0.2 * rng.standard_normal(v.shape)).astype(np.float32)
        hot = np.sort(rng.choice(VOCAB, DV, replace=False))
        t2d = np.zeros(VOCAB, bool)
        t2d[hot] = True
        head = os.path.join(tmp, "head")
        TH.save_head(head, cfg, params, hot - np.arange(DV), t2d, "float32")
        toks = rng.integers(0, VOCAB, T + 1)
        aux = (rng.standard_normal((T, 3 * DIM)) * 2.0).astype(np.float32)
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({"tokens": toks[1:].astype(np.int32), "aux": aux}, inp)
        r = subprocess.run([binary("tests", "eagle_probe"), target, head, inp, out, "2", "stored"], capture_output=True,
                           text=True)
        if r.returncode != 0:
            print(r.stderr)
            return 1
        c = load_file(out)
        ext = np.concatenate([toks, c["chain"]]).astype(np.int64)  # row T-1 reads T+1+k at step k >= 1
        ref = TH.ttt_forward({k: jnp.asarray(v) for k, v in params.items()}, cfg, jnp.asarray(aux[None]),
                             jnp.asarray(embed[ext][None]), 3)
        want = np.concatenate([np.asarray(ref[0][0]), np.asarray(ref[1][0][T - 1:T]), np.asarray(ref[2][0][T - 1:T])])
        err = np.max(np.abs(c["logits"] - want))
        tol = 1e-3 * np.max(np.abs(want)) + 1e-4
        print(f"C head vs the training tool's ttt_forward: {T} rows + 2 chain steps, max |err| {err:.3g} "
              f"(tolerance {tol:.3g}, max |logit| {np.max(np.abs(want)):.3g})")
        return 0 if err <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
