"""Oracle: specd's GGUF reader and sd_dequantize against the gguf Python package.

For the demo model (SmolLM2-135M Q4_1: Q4_1, Q8_0 and F32 tensors), for a
model written by specd-mkmodel in each --dtype (the K-quants Q4_K, Q5_K and
Q6_K with 256-wide rows) and for that model's f32 file rewritten by
specd-quantize as q4_k_m and q5_k_m (Q4_K / Q5_K with Q6_K mixed in; with rows
that are not whole super-blocks, the Q5_0 / Q5_1 / Q8_0 fallbacks), compares
  * the key list and the tensor list (name, type, shape) printed by
    tests/gguf_dump with gguf.GGUFReader's, and
  * the f32 values that gguf_dump writes (sd_dequantize) with
    gguf.quants.dequantize, element by element: bit-exact is expected (the
    math is exact in float32), anything else must be within 1e-6 relative.
Exits 77 (skipped) when the build, the venv packages or the model are missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

BUILD = os.environ.get("SPECD_BUILD_DIR", "")
SOURCE = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DUMP = os.path.join(BUILD, "tests", "gguf_dump")
MKMODEL = os.path.join(BUILD, "tools", "specd-mkmodel")
QUANTIZE = os.path.join(BUILD, "tools", "specd-quantize")

SMOL_TENSORS = [
    "token_embd.weight",        # Q8_0
    "blk.0.ffn_down.weight",    # Q4_1
    "blk.7.attn_q.weight",      # Q4_1
    "blk.29.attn_v.weight",     # Q4_1
    "blk.13.ffn_gate.weight",   # Q4_1
    "blk.0.attn_norm.weight",   # F32
    "blk.29.ffn_norm.weight",   # F32
    "output_norm.weight",       # F32
]


def model_path():
    env = os.environ.get("SPECD_MODEL")
    if env:
        return env if os.path.exists(env) else None
    try:
        out = subprocess.run([os.path.join(SOURCE, "tools", "fetch-model")], capture_output=True, text=True,
                             timeout=600)
    except OSError:
        return None
    path = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    return path if path and os.path.exists(path) else None


def check_listing(path, reader):
    """gguf_dump's key and tensor lists must match GGUFReader's."""
    out = subprocess.run([DUMP, path], capture_output=True, text=True, check=True).stdout.splitlines()
    keys = [line.split(" ")[1] for line in out if line.startswith("kv ")]
    want_keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert keys == want_keys, f"{path}: keys differ:\n{keys}\n{want_keys}"
    tensors = []
    for line in out:
        if line.startswith("tensor "):
            _, name, typ, dims, _, _ = line.split(" ")
            tensors.append((name, typ, tuple(int(d) for d in dims.strip("[]").split(","))))
    want = [(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in reader.tensors]
    assert tensors == want, f"{path}: tensor lists differ"
    return len(keys), len(tensors)


def compare_tensor(t, out_file):
    mine = np.fromfile(out_file, dtype=np.float32)
    ref = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
    if mine.shape != ref.shape:
        return f"{t.name}: {mine.size} values, expected {ref.size}"
    exact = mine.view(np.uint32) == ref.view(np.uint32)
    if exact.all():
        return None
    rel = np.abs(mine.astype(np.float64) - ref) / np.maximum(np.abs(ref.astype(np.float64)), 1e-30)
    bad = np.nonzero(~exact & ~(rel <= 1e-6))[0]
    if bad.size:
        i = bad[0]
        return f"{t.name} ({t.tensor_type.name}): {bad.size} mismatches, first at {i}: {mine[i]!r} vs {ref[i]!r}"
    print(f"  {t.name}: {int((~exact).sum())} values within 1e-6 relative, not bit-exact")
    return None


def check_file(path, names, tmpdir):
    reader = gguf.GGUFReader(path)
    n_keys, n_tensors = check_listing(path, reader)
    failures = []
    types = set()
    dump_dir = os.path.join(tmpdir, "dump")
    os.makedirs(dump_dir, exist_ok=True)
    for old in os.listdir(dump_dir):
        os.unlink(os.path.join(dump_dir, old))
    # the i-th tensor of the file to dump_dir/i.f32
    subprocess.run([DUMP, path, "--to", dump_dir] + (sorted(names) if names else []), check=True)
    for i, t in enumerate(reader.tensors):
        if names is None or t.name in names:
            types.add(t.tensor_type.name)
            err = compare_tensor(t, os.path.join(dump_dir, f"{i}.f32"))
            if err:
                failures.append(err)
    print(f"{os.path.basename(path)}: {n_keys} keys, {n_tensors} tensors, compared types {sorted(types)}, "
          f"{len(failures)} failures")
    return failures, types


def main():
    if not all(os.access(p, os.X_OK) for p in (DUMP, MKMODEL, QUANTIZE)):
        print(f"skipped: {DUMP}, {MKMODEL} or {QUANTIZE} not built (SPECD_BUILD_DIR={BUILD!r})")
        return 77
    model = model_path()
    if model is None:
        print("skipped: demo model not available (set SPECD_MODEL or run tools/fetch-model)")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as tmpdir:
        f, types = check_file(model, set(SMOL_TENSORS), tmpdir)
        failures += f
        assert {"Q4_1", "Q8_0", "F32"} <= types, types
        for dtype in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]:
            path = os.path.join(tmpdir, f"mk_{dtype}.gguf")
            subprocess.run([MKMODEL, "-o", path, "--dtype", dtype, "--norm-dtype",
                            "f16" if dtype == "q8_0" else "f32", "--seed", "11", "--vocab", "300"], check=True)
            f, types = check_file(path, None, tmpdir)
            failures += f
            assert dtype.upper() in types, (dtype, types)
        # the K-quants: rows of whole 256-element super-blocks
        k_shape = ["--dim", "256", "--ff", "512", "--heads", "4", "--kv-heads", "2", "--layers", "8", "--vocab", "300"]
        for dtype in ["q4_k", "q5_k", "q6_k"]:
            path = os.path.join(tmpdir, f"mk_{dtype}.gguf")
            subprocess.run([MKMODEL, "-o", path, "--dtype", dtype, "--seed", "12"] + k_shape, check=True)
            f, types = check_file(path, None, tmpdir)
            failures += f
            assert dtype.upper() in types, (dtype, types)
        src_k = os.path.join(tmpdir, "mk_k_f32.gguf")
        subprocess.run([MKMODEL, "-o", src_k, "--dtype", "f32", "--seed", "13"] + k_shape, check=True)
        # 256-wide rows: the mixes' K types; 64-wide rows (mk_f32.gguf above):
        # llama.cpp's fallbacks for rows that are not whole super-blocks
        for src, mix, want in [(src_k, "q4_k_m", {"Q4_K", "Q6_K"}), (src_k, "q5_k_m", {"Q5_K", "Q6_K"}),
                               (os.path.join(tmpdir, "mk_f32.gguf"), "q4_k_m", {"Q5_0", "Q8_0"}),
                               (os.path.join(tmpdir, "mk_f32.gguf"), "q5_k_m", {"Q5_1", "Q8_0"})]:
            path = os.path.join(tmpdir, f"{mix}_{os.path.basename(src)}")
            subprocess.run([QUANTIZE, src, path, mix], check=True, capture_output=True)
            f, types = check_file(path, None, tmpdir)
            failures += f
            assert want <= types, (mix, src, types)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
