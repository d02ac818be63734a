"""test_hf_arch_tensors.py — specd-mkmodel's Hugging Face checkpoints of each
architecture against its GGUF, read by the reference packages only.

For qwen2, qwen3, gemma3, phi3 and mistral, one random model is written as
GGUF and as an HF directory from the same seed. The HF tensors are read with
the `safetensors` package, the GGUF ones with the `gguf` package, and every
GGUF tensor must equal its HF tensor after the transform llama.cpp's
convert_hf_to_gguf.py applies (written here independently of specd's C
table):
  * names: HF model.layers.N.* -> blk.N.* per architecture (Gemma's
    pre_feedforward_layernorm -> ffn_norm and post_attention_layernorm ->
    post_attention_norm; Phi-3's qkv_proj / gate_up_proj kept fused);
  * llama / mistral q_proj and k_proj: rows permuted from rotate-half to
    adjacent pairs within each head (the converter's `permute`);
  * Gemma 3 norm weights: GGUF = HF + 1 (Gemma3RMSNorm scales by 1 + w);
  * nothing else: Qwen, Gemma and Phi-3 use NeoX RoPE on the rows as stored.
config.json is checked for each family's own keys (architectures,
model_type, Gemma's query_pre_attn_scalar / layer_types /
rope_local_base_freq, Mistral's sliding_window). Every HF tensor must be
used (no stray names).

Environment: SPECD_BUILD_DIR. Exit 77 (skipped) when a package or the
binary is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    from gguf import GGUFReader
    import safetensors  # noqa: F401  (hf_ref reads the files through it)
except ImportError as e:  # pragma: no cover
    print(f"skip: python packages missing ({e}); run scripts/setup")
    sys.exit(SKIP)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_ref import load_tensors  # noqa: E402  (safe_open; BF16 widened from its raw bytes)

SOURCE_DIR = os.environ.get("SPECD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD_DIR = os.environ.get("SPECD_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
MKMODEL = os.path.join(BUILD_DIR, "tools", "specd-mkmodel")

COMMON = ["--vocab", "300", "--dim", "64", "--ff", "96"]
CASES = [
    ("qwen2", "Qwen2ForCausalLM", ["--arch", "qwen2", "--layers", "2", "--heads", "4", "--kv-heads", "2"]),
    ("qwen3", "Qwen3ForCausalLM", ["--arch", "qwen3", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                                   "--head-dim", "32"]),
    ("gemma3", "Gemma3ForCausalLM", ["--arch", "gemma3", "--layers", "7", "--heads", "2", "--kv-heads", "1",
                                     "--head-dim", "32", "--window", "5", "--tied"]),
    ("gemma3 bf16", "Gemma3ForCausalLM", ["--arch", "gemma3", "--layers", "6", "--heads", "4", "--kv-heads", "2",
                                          "--head-dim", "16", "--window", "3", "--dtype", "bf16",
                                          "--norm-dtype", "bf16"]),
    ("phi3", "Phi3ForCausalLM", ["--arch", "phi3", "--layers", "2", "--heads", "4", "--kv-heads", "2"]),
    ("mistral", "MistralForCausalLM", ["--arch", "mistral", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                                       "--window", "5"]),
]

# HF layer tensor (after "model.layers.N.") -> GGUF tensor (after "blk.N."), per family
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GEMMA_LAYER = dict(LAYER, **{
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
})
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}


def gguf_name(hf, gemma):
    if hf in GLOBAL:
        return GLOBAL[hf]
    parts = hf.split(".", 3)
    assert parts[0] == "model" and parts[1] == "layers", hf
    table = GEMMA_LAYER if gemma else LAYER
    return f"blk.{parts[2]}.{table[parts[3]]}"


def llama_permute(w, n_head):
    """convert_hf_to_gguf's permute: rotate-half rows -> adjacent pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(path):
    out = {}
    for t in GGUFReader(path).tensors:
        shape = [int(x) for x in reversed(t.shape)]  # GGUF ne is reversed numpy order
        data = np.asarray(t.data)
        if data.dtype == np.uint8 and t.tensor_type.name == "BF16":
            data = data.view(np.uint16)
        if t.tensor_type.name == "BF16":
            data = (data.astype(np.uint32) << 16).view(np.float32)
        out[t.name] = data.reshape(shape).astype(np.float32)
    return out


def check(label, cls, args, tmp):
    g = os.path.join(tmp, "m.gguf")
    d = os.path.join(tmp, "m-hf")
    for out, extra in ((g, []), (d, ["--format", "hf"])):
        subprocess.run([MKMODEL, "-o", out] + COMMON + args + extra, check=True, capture_output=True)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == [cls], (label, cfg["architectures"])
    gemma = cls.startswith("Gemma3")
    if gemma:
        assert cfg["model_type"] == "gemma3_text"
        assert cfg["query_pre_attn_scalar"] == cfg["head_dim"]
        assert cfg["hidden_activation"] == "gelu_pytorch_tanh"
        types = cfg["layer_types"]
        assert len(types) == cfg["num_hidden_layers"]
        assert all((t == "full_attention") == (i % 6 == 5) for i, t in enumerate(types)), types
        assert cfg["rope_local_base_freq"] == 10000.0 and cfg["sliding_window"] > 0
    if cls == "MistralForCausalLM":
        assert cfg["model_type"] == "mistral" and cfg["sliding_window"] == 5
    hf = {k: v.astype(np.float32) for k, v in load_tensors(d).items()}  # exact: stored as f32 / f16 / bf16
    gg = gguf_tensors(g)
    used = set()
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for name, w in hf.items():
        gname = gguf_name(name, gemma)
        assert gname in gg, f"{label}: {name} -> {gname} not in the GGUF"
        used.add(gname)
        ref = w
        if cls in ("LlamaForCausalLM", "MistralForCausalLM") and name.endswith(("q_proj.weight", "k_proj.weight")):
            ref = llama_permute(w, n_head if "q_proj" in name else n_kv)
        if gemma and name.endswith("norm.weight"):
            ref = w + np.float32(1.0)
        if ref.shape != gg[gname].shape or not np.array_equal(ref, gg[gname]):
            diff = np.max(np.abs(ref - gg[gname])) if ref.shape == gg[gname].shape else "shape"
            raise AssertionError(f"{label}: {name} != {gname} after the converter's transform ({diff})")
    missing = set(gg) - used - {"rope_freqs.weight"}
    assert not missing, f"{label}: GGUF tensors with no HF tensor: {sorted(missing)}"
    print(f"ok {label}: {len(hf)} tensors equal after the converter's transforms")


def main():
    if not os.path.exists(MKMODEL):
        print(f"skip: {MKMODEL} not built")
        return SKIP
    for label, cls, args in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            check(label, cls, args, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
